//! The open-loop schedule: when each message is meant to be sent.
//!
//! Every message's intended send time is computed from the rate alone, never from when
//! the previous send finished, so a publisher that falls behind sends late (and says by how
//! much) instead of quietly sending less (coordinated omission).
//!
//! Each stream `i` sends at its own rate `r_i` (uniform, or Zipf-distributed with the
//! rates summing to the total), at *work times* `u = (n + i/S) / r_i` for its `n`-th
//! message (`S` streams, so uniform streams interleave evenly). A [`Profile`] maps work
//! time to real time: a linear ramp-up from 0 to the full rate, then optional periodic
//! bursts at a multiple of the rate. The streams are merged in time order with a heap.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Why a load shape is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// A rate, stream count or metric count of zero, or not finite: give a positive value.
    #[error("{0}")]
    Invalid(String),
}

/// Periodic bursts after the ramp-up: for `length` at the start of every `every`, the rate
/// is `factor` times the target rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    /// Period of the bursts.
    pub every: Duration,
    /// Length of each burst (shorter than `every`).
    pub length: Duration,
    /// Rate multiplier during a burst (greater than 0).
    pub factor: f64,
}

/// The load to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadShape {
    /// Target rate in metrics per second, summed over all streams.
    pub rate_metrics_per_s: f64,
    /// Metrics carried by each message.
    pub metrics_per_message: u32,
    /// Number of streams (topics, series).
    pub streams: u32,
    /// Zipf exponent of the per-stream rates: 0 is uniform; at 1.1 the first stream sends
    /// most. The rates always sum to the target rate.
    pub zipf_exponent: f64,
    /// Time over which the rate rises linearly from 0 to the target.
    pub ramp_up: Duration,
    /// Stop after this long (real time, ramp-up included); `None` runs until stopped or
    /// `max_messages`.
    pub duration: Option<Duration>,
    /// Stop after this many messages.
    pub max_messages: Option<u64>,
    /// Periodic bursts after the ramp-up.
    pub burst: Option<Burst>,
}

impl LoadShape {
    /// A uniform shape: `rate_metrics_per_s` over `streams`, one metric per message, no
    /// ramp-up, no bursts, unbounded.
    #[must_use]
    pub fn uniform(rate_metrics_per_s: f64, streams: u32) -> Self {
        Self {
            rate_metrics_per_s,
            metrics_per_message: 1,
            streams,
            zipf_exponent: 0.0,
            ramp_up: Duration::ZERO,
            duration: None,
            max_messages: None,
            burst: None,
        }
    }

    /// Messages per second at full rate.
    #[must_use]
    pub fn message_rate(&self) -> f64 {
        self.rate_metrics_per_s / f64::from(self.metrics_per_message.max(1))
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`ShapeError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let bad = |s: &str| Err(ShapeError::Invalid(s.to_owned()));
        if !(self.rate_metrics_per_s.is_finite() && self.rate_metrics_per_s > 0.0) {
            return bad("the rate must be a positive number of metrics per second");
        }
        if self.metrics_per_message == 0 {
            return bad("metrics per message must be at least 1");
        }
        if self.streams == 0 {
            return bad("at least one stream is needed");
        }
        if !(self.zipf_exponent.is_finite() && self.zipf_exponent >= 0.0) {
            return bad("the Zipf exponent must be 0 (uniform) or positive");
        }
        if let Some(b) = self.burst {
            if b.every.is_zero() || b.length.is_zero() || b.length >= b.every {
                return bad("a burst needs 0 < length < every");
            }
            if !(b.factor.is_finite() && b.factor > 0.0) {
                return bad("the burst factor must be a positive number");
            }
        }
        Ok(())
    }
}

/// Per-stream message rates (messages per second) for `streams` streams sharing
/// `total` messages per second: stream `i` gets a share proportional to `1/(i+1)^s`
/// (`s = 0` is uniform). The rates sum to `total`.
#[must_use]
pub fn zipf_rates(total: f64, streams: u32, exponent: f64) -> Vec<f64> {
    let weights: Vec<f64> = (0..streams)
        .map(|i| (f64::from(i) + 1.0).powf(-exponent))
        .collect();
    let sum: f64 = weights.iter().sum();
    weights.into_iter().map(|w| total * w / sum).collect()
}

/// Maps work time (the time at which a message is due at the full rate) to real time
/// offsets from the start of the run: the ramp-up and the bursts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    ramp_ns: f64,
    burst: Option<(f64, f64, f64)>,
}

impl Profile {
    /// The profile of `shape`.
    #[must_use]
    pub fn new(shape: &LoadShape) -> Self {
        Self {
            ramp_ns: shape.ramp_up.as_nanos() as f64,
            burst: shape.burst.map(|b| {
                (
                    b.every.as_nanos() as f64,
                    b.length.as_nanos() as f64,
                    b.factor,
                )
            }),
        }
    }

    /// Real offset (ns since the start) at which work time `u_ns` is reached.
    #[must_use]
    pub fn real_ns(&self, u_ns: f64) -> f64 {
        let t_ramp = self.ramp_ns;
        if t_ramp > 0.0 && u_ns < t_ramp / 2.0 {
            // Rate rises as t/T: work done by t is t²/(2T).
            return (2.0 * t_ramp * u_ns).sqrt();
        }
        let v = u_ns - t_ramp / 2.0;
        let Some((every, length, factor)) = self.burst else {
            return t_ramp + v;
        };
        let per_period = factor * length + (every - length);
        let n = (v / per_period).floor();
        let rem = v - n * per_period;
        let within = if rem < factor * length {
            rem / factor
        } else {
            length + (rem - factor * length)
        };
        t_ramp + n * every + within
    }

    /// Rate multiplier (0 to the burst factor) at real offset `t_ns`.
    #[must_use]
    pub fn factor_at(&self, t_ns: f64) -> f64 {
        if t_ns < self.ramp_ns {
            return t_ns.max(0.0) / self.ramp_ns;
        }
        match self.burst {
            Some((every, length, factor)) if (t_ns - self.ramp_ns) % every < length => factor,
            _ => 1.0,
        }
    }
}

/// One message of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Stream index.
    pub stream: u32,
    /// Sequence number within the stream, from 0.
    pub sequence: u64,
    /// Intended send time, ns after the start of the run.
    pub offset_ns: u64,
}

/// The open-loop schedule of a [`LoadShape`]: an iterator of [`Slot`]s in time order.
#[derive(Debug, Clone)]
pub struct Schedule {
    periods_ns: Vec<f64>,
    phases: Vec<f64>,
    next_seq: Vec<u64>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    profile: Profile,
    end_ns: Option<u64>,
    max_messages: Option<u64>,
    emitted: u64,
    message_rate: f64,
}

impl Schedule {
    /// The schedule of `shape`.
    ///
    /// # Errors
    /// [`ShapeError`] when the shape is invalid.
    pub fn new(shape: &LoadShape) -> Result<Self, ShapeError> {
        shape.validate()?;
        let rates = zipf_rates(shape.message_rate(), shape.streams, shape.zipf_exponent);
        let s = f64::from(shape.streams);
        let periods_ns: Vec<f64> = rates.iter().map(|r| 1e9 / r).collect();
        let phases: Vec<f64> = (0..shape.streams).map(|i| f64::from(i) / s).collect();
        let profile = Profile::new(shape);
        let mut sched = Self {
            heap: BinaryHeap::with_capacity(shape.streams as usize),
            next_seq: vec![0; shape.streams as usize],
            periods_ns,
            phases,
            profile,
            end_ns: shape
                .duration
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            max_messages: shape.max_messages,
            emitted: 0,
            message_rate: shape.message_rate(),
        };
        for i in 0..shape.streams {
            let t = sched.offset_of(i, 0);
            sched.heap.push(Reverse((t, i)));
        }
        Ok(sched)
    }

    fn offset_of(&self, stream: u32, n: u64) -> u64 {
        let i = stream as usize;
        let u = (n as f64 + self.phases[i]) * self.periods_ns[i];
        let t = self.profile.real_ns(u).round();
        if t.is_finite() && t >= 0.0 {
            t as u64
        } else {
            u64::MAX
        }
    }

    /// The next message, or `None` when the duration or message limit is reached.
    #[inline]
    pub fn next_slot(&mut self) -> Option<Slot> {
        if self.max_messages.is_some_and(|m| self.emitted >= m) {
            return None;
        }
        let Reverse((offset_ns, stream)) = *self.heap.peek()?;
        if self.end_ns.is_some_and(|end| offset_ns >= end) {
            return None;
        }
        let i = stream as usize;
        let sequence = self.next_seq[i];
        self.next_seq[i] += 1;
        let next = self.offset_of(stream, sequence + 1);
        let _ = self.heap.pop();
        self.heap.push(Reverse((next, stream)));
        self.emitted += 1;
        Some(Slot {
            stream,
            sequence,
            offset_ns,
        })
    }

    /// Messages emitted so far.
    #[must_use]
    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    /// Target message rate at real offset `t_ns` (ramp-up and bursts included).
    #[must_use]
    pub fn target_message_rate_at(&self, t_ns: u64) -> f64 {
        self.message_rate * self.profile.factor_at(t_ns as f64)
    }

    /// The profile mapping work time to real time.
    #[must_use]
    pub fn profile(&self) -> Profile {
        self.profile
    }
}

impl Iterator for Schedule {
    type Item = Slot;
    fn next(&mut self) -> Option<Slot> {
        self.next_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// round(k * 1e9 * m / rate) with exact integer arithmetic.
    fn exact_offset(k: u64, rate_metrics: u64, m: u64) -> u64 {
        let num = u128::from(k) * 1_000_000_000 * u128::from(m);
        ((2 * num + u128::from(rate_metrics)) / (2 * u128::from(rate_metrics))) as u64
    }

    #[test]
    fn uniform_intended_times_are_exact() {
        for (rate, m, streams) in [
            (1000u64, 1u32, 1u32),
            (3000, 1, 3),
            (7, 1, 1),
            (100_000, 20, 7),
        ] {
            let mut shape = LoadShape::uniform(rate as f64, streams);
            shape.metrics_per_message = m;
            shape.max_messages = Some(20_000);
            let slots: Vec<Slot> = Schedule::new(&shape).unwrap().collect();
            assert_eq!(slots.len(), 20_000);
            for (k, s) in slots.iter().enumerate() {
                assert_eq!(
                    s.offset_ns,
                    exact_offset(k as u64, rate, u64::from(m)),
                    "rate {rate} m {m} streams {streams} message {k}"
                );
                assert_eq!(s.stream, k as u32 % streams, "round robin");
                assert_eq!(s.sequence, k as u64 / u64::from(streams));
            }
        }
    }

    #[test]
    fn intended_times_never_depend_on_the_caller() {
        // Pulling slots late changes nothing: the schedule is a pure function of the shape.
        let shape = LoadShape::uniform(50_000.0, 10);
        let a: Vec<Slot> = Schedule::new(&shape).unwrap().take(1000).collect();
        let mut s = Schedule::new(&shape).unwrap();
        let mut b = Vec::new();
        for _ in 0..1000 {
            std::hint::black_box(vec![0u8; 1000]);
            b.push(s.next_slot().unwrap());
        }
        assert_eq!(a, b);
    }

    #[test]
    fn zipf_rates_sum_to_the_total_and_decrease() {
        for s in [0.0, 0.5, 1.1, 2.0] {
            let rates = zipf_rates(100_000.0, 3000, s);
            let sum: f64 = rates.iter().sum();
            assert!((sum - 100_000.0).abs() < 1e-6, "exponent {s}: sum {sum}");
            assert!(rates.windows(2).all(|w| w[0] >= w[1]));
        }
        let r = zipf_rates(10.0, 2, 1.0);
        assert!((r[0] - 20.0 / 3.0).abs() < 1e-12 && (r[1] - 10.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn zipf_schedule_sends_each_stream_at_its_rate() {
        let mut shape = LoadShape::uniform(10_000.0, 50);
        shape.zipf_exponent = 1.1;
        shape.duration = Some(Duration::from_secs(10));
        let rates = zipf_rates(10_000.0, 50, 1.1);
        let mut counts = [0u64; 50];
        let mut last = 0;
        for s in Schedule::new(&shape).unwrap() {
            assert!(s.offset_ns >= last, "time order");
            last = s.offset_ns;
            assert_eq!(s.sequence, counts[s.stream as usize]);
            counts[s.stream as usize] += 1;
        }
        for (i, c) in counts.iter().enumerate() {
            let expected = rates[i] * 10.0;
            assert!(
                (*c as f64 - expected).abs() <= 1.0,
                "stream {i}: {c} messages, expected {expected}"
            );
        }
        let total: u64 = counts.iter().sum();
        assert!((total as i64 - 100_000).abs() <= 50, "{total}");
    }

    #[test]
    fn ramp_up_sends_half_the_messages_of_full_rate() {
        // Linear ramp over 2 s at 1000 msg/s: 1000 messages in the ramp, 1000 per s after.
        let mut shape = LoadShape::uniform(1000.0, 1);
        shape.ramp_up = Duration::from_secs(2);
        shape.duration = Some(Duration::from_secs(3));
        let slots: Vec<Slot> = Schedule::new(&shape).unwrap().collect();
        let in_ramp = slots.iter().filter(|s| s.offset_ns < 2_000_000_000).count();
        assert_eq!(in_ramp, 1000);
        assert_eq!(slots.len(), 2000);
        // After the ramp the spacing is exactly the period.
        let after: Vec<u64> = slots
            .iter()
            .filter(|s| s.offset_ns >= 2_000_000_000)
            .map(|s| s.offset_ns)
            .collect();
        assert!(after.windows(2).all(|w| w[1] - w[0] == 1_000_000));
        // Message k of the ramp is due at sqrt(2 T k / r).
        assert_eq!(slots[250].offset_ns, 1_000_000_000);
    }

    #[test]
    fn bursts_multiply_the_rate_in_their_window() {
        let mut shape = LoadShape::uniform(1000.0, 1);
        shape.burst = Some(Burst {
            every: Duration::from_secs(1),
            length: Duration::from_millis(100),
            factor: 5.0,
        });
        shape.duration = Some(Duration::from_secs(2));
        let slots: Vec<Slot> = Schedule::new(&shape).unwrap().collect();
        let in_burst = slots
            .iter()
            .filter(|s| s.offset_ns % 1_000_000_000 < 100_000_000)
            .count();
        // Per second: 100 ms at 5000/s + 900 ms at 1000/s.
        assert_eq!(in_burst, 1000);
        assert_eq!(slots.len(), 2 * 1400);
        let s = Schedule::new(&shape).unwrap();
        assert_eq!(s.target_message_rate_at(50_000_000), 5000.0);
        assert_eq!(s.target_message_rate_at(500_000_000), 1000.0);
    }

    #[test]
    fn invalid_shapes_are_refused() {
        assert!(Schedule::new(&LoadShape::uniform(0.0, 1)).is_err());
        assert!(Schedule::new(&LoadShape::uniform(f64::NAN, 1)).is_err());
        assert!(Schedule::new(&LoadShape::uniform(1.0, 0)).is_err());
        let mut s = LoadShape::uniform(1.0, 1);
        s.burst = Some(Burst {
            every: Duration::from_secs(1),
            length: Duration::from_secs(1),
            factor: 2.0,
        });
        assert!(Schedule::new(&s).is_err());
    }
}
