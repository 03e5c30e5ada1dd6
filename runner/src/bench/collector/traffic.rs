//! The synthetic traffic of the collector benchmark: generators that stamp each trace at
//! the hops their exporter owns, open or closed loop (see the parent module).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hoptrace_probe::{Probe, TraceContext, TraceKey};

use crate::procfs::thread_ticks;

use super::options::{CHUNK, LEAD_TRACES, METRICS_PER_TRACE, PUBLISHER, STREAMS};

pub(super) struct GenPlan {
    pub(super) me: usize,
    pub(super) traces: u64,
    pub(super) hops: Range<usize>,
    pub(super) rate: Option<u64>,
    pub(super) t0: Instant,
    pub(super) start_ns: i64,
    pub(super) stamp_period_ns: f64,
    pub(super) lag_ns: f64,
    pub(super) max_in_flight: u64,
}

pub(super) struct GenResult {
    pub(super) generated: u64,
    pub(super) cpu_ticks: u64,
    pub(super) max_behind_ns: f64,
}

pub(super) fn generate(
    plan: &GenPlan,
    probes: &[Probe],
    done: &[AtomicU64],
    abort: &AtomicBool,
) -> GenResult {
    let counters = probes[0].counters();
    let per_trace = plan.hops.len() as u64;
    let mut t = 0u64;
    let mut pushed = 0u64;
    let mut max_behind_ns = 0f64;
    while t < plan.traces && !abort.load(Relaxed) {
        let end = if let Some(rate) = plan.rate {
            let period_ns = 1e9 / rate as f64;
            let now_ns = plan.t0.elapsed().as_nanos() as f64 - plan.lag_ns;
            let due = if now_ns < 0.0 {
                0
            } else {
                ((now_ns / period_ns) as u64 + 1).min(plan.traces)
            };
            if due <= t {
                let wait_ns = (t as f64 * period_ns - now_ns).clamp(20_000.0, 1_000_000.0);
                std::thread::sleep(Duration::from_nanos(wait_ns as u64));
                continue;
            }
            max_behind_ns = max_behind_ns.max(now_ns - t as f64 * period_ns);
            due.min(t + CHUNK)
        } else {
            let c = counters.snapshot(0);
            let in_flight = pushed.saturating_sub(c.sent + c.queue_full + c.send_failed);
            let slowest = done
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != plan.me)
                .map(|(_, d)| d.load(Relaxed))
                .min()
                .unwrap_or(u64::MAX);
            if in_flight > plan.max_in_flight || t > slowest.saturating_add(LEAD_TRACES) {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            (t + CHUNK).min(plan.traces)
        };
        for i in t..end {
            emit(plan, probes, i);
        }
        pushed += (end - t) * per_trace;
        t = end;
        done[plan.me].store(t, Relaxed);
    }
    GenResult {
        generated: t,
        cpu_ticks: thread_ticks(),
        max_behind_ns,
    }
}

/// Reports trace `t`'s stamps of the plan's hops. A full queue is counted by the
/// exporter (`queue_full`) and shows in the report; it is not retried.
#[inline]
pub(super) fn emit(plan: &GenPlan, probes: &[Probe], t: u64) {
    let streams = u64::from(STREAMS);
    let key = TraceKey {
        publisher: PUBLISHER,
        stream: (t % streams) as u32,
        sequence: t / streams,
    };
    let intended_ns = plan.start_ns + (t as f64 * plan.stamp_period_ns) as i64;
    let ctx = TraceContext::new(key, METRICS_PER_TRACE, intended_ns);
    let mut stamp_ns = intended_ns + egress_ns(t);
    for h in 0..plan.hops.end {
        if h > 0 {
            stamp_ns += hop_delay_ns(t, h);
        }
        if h >= plan.hops.start {
            probes[h - plan.hops.start].report_stamp(&ctx, stamp_ns);
        }
    }
}

/// SplitMix64's finaliser: a well-mixed 64-bit value of `(t, h, salt)`.
#[inline]
pub(super) fn mix(t: u64, h: usize, salt: u64) -> u64 {
    let mut z = t
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((h as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `h0`'s stamp after the intended time: 150 ns to 2 µs.
#[inline]
pub(super) fn egress_ns(t: u64) -> i64 {
    150 + (mix(t, 0, 1) % 1_850) as i64
}

/// Hop `h`'s stamp after hop `h - 1`'s: 3 µs plus an exponential delay whose mean cycles
/// through 400 µs, 60 µs and 1.2 ms, capped at 20 ms.
#[inline]
pub(super) fn hop_delay_ns(t: u64, h: usize) -> i64 {
    const MEAN_NS: [f64; 3] = [400_000.0, 60_000.0, 1_200_000.0];
    // Uniform in (0, 1].
    let u = ((mix(t, h, 2) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let jitter = (-u.ln() * MEAN_NS[(h - 1) % 3]).min(20_000_000.0);
    3_000 + jitter as i64
}
