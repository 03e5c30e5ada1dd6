//! Monitoring the collector benchmark: progress, and the CPU of the generator and exporter
//! threads taken off the process's.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use hoptrace_probe::Exporter;

use crate::procfs::{Pid, status_bytes, task_stats};
use hoptrace_collector::run::Collector;

use super::options::{BenchOptions, BenchProgress, POLL, STALL};

pub(super) struct Monitor<'a, F> {
    pub(super) opts: &'a BenchOptions,
    pub(super) max_pending: u64,
    pub(super) progress: F,
    pub(super) t0: Instant,
    pub(super) cpu: ThreadCpu,
    pub(super) last_report: Instant,
    pub(super) last_records: u64,
    /// (seconds since t0, traces done), one per report, for the remembered-keys estimate.
    pub(super) history: VecDeque<(f64, u64)>,
    pub(super) peak_join_estimate: u64,
    pub(super) last_state: (u64, u64, u64),
    pub(super) last_change: Instant,
    pub(super) last_lost: u64,
}

impl<'a, F: FnMut(&BenchProgress)> Monitor<'a, F> {
    pub(super) fn new(opts: &'a BenchOptions, max_pending: u64, progress: F, t0: Instant) -> Self {
        Self {
            opts,
            max_pending,
            progress,
            t0,
            cpu: ThreadCpu::new(),
            last_report: t0,
            last_records: 0,
            history: VecDeque::new(),
            peak_join_estimate: 0,
            last_state: (0, 0, 0),
            last_change: t0,
            last_lost: 0,
        }
    }

    /// Waits one poll interval, samples thread CPU, reports progress when a second has
    /// passed, and returns whether the run has stalled.
    pub(super) fn step(
        &mut self,
        collector: &Collector,
        exporters: &[Exporter],
        generated: u64,
    ) -> bool {
        std::thread::sleep(POLL);
        self.cpu.sample();
        let p = collector.progress();
        let (sent, lost) = exporters.iter().fold((0, 0), |acc, x| {
            let c = x.counters();
            (acc.0 + c.sent, acc.1 + c.lost())
        });
        // After the exporters shut down their loss is final: keep the last figure.
        self.last_lost = self.last_lost.max(lost);
        let state = (p.records, sent, generated);
        if state != self.last_state {
            self.last_state = state;
            self.last_change = Instant::now();
        }
        let since = self.last_report.elapsed();
        if since >= Duration::from_secs(1) {
            let elapsed_s = self.t0.elapsed().as_secs_f64();
            let traces_done = p.complete + p.incomplete;
            self.history.push_back((elapsed_s, traces_done));
            let window_s = self.opts.window_ms as f64 / 1e3;
            while self
                .history
                .get(1)
                .is_some_and(|(at, _)| *at <= elapsed_s - window_s)
            {
                self.history.pop_front();
            }
            let window_start = self
                .history
                .front()
                .filter(|(at, _)| *at <= elapsed_s - window_s)
                .map_or(0, |(_, n)| *n);
            let remembered = (traces_done - window_start).min(self.max_pending);
            let per_pending = (56 + 8 * self.opts.hops as u64 + 24 + 11) * 5 / 4;
            let join_estimate = p.pending * per_pending + remembered * 41;
            self.peak_join_estimate = self.peak_join_estimate.max(join_estimate);
            let eta_s = (traces_done > 0).then(|| {
                self.opts.traces.saturating_sub(traces_done) as f64
                    / (traces_done as f64 / elapsed_s)
            });
            (self.progress)(&BenchProgress {
                elapsed_s,
                traces_generated: generated,
                traces_done,
                records: p.records,
                records_per_s: (p.records - self.last_records) as f64 / since.as_secs_f64(),
                pending: p.pending,
                lost_by_probes: self.last_lost,
                rss_bytes: status_bytes(Pid::This, "VmRSS:").unwrap_or(0),
                join_memory_estimate_bytes: join_estimate,
                eta_s,
            });
            self.last_report = Instant::now();
            self.last_records = p.records;
        }
        self.last_change.elapsed() >= STALL
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ThreadKind {
    Reader,
    Accept,
    Exporter,
    Other,
}

impl ThreadKind {
    /// From the thread name as `/proc` shows it (15 bytes at most).
    pub(super) fn of(comm: &str) -> Self {
        if comm.starts_with("collector-conn") {
            Self::Reader
        } else if comm.starts_with("collector-acce") {
            Self::Accept
        } else if comm.starts_with("hoptrace-expor") {
            Self::Exporter
        } else {
            Self::Other
        }
    }
}

/// CPU ticks of this process's threads, sampled from `/proc/self/task`; the last value
/// seen of each thread is kept after it exits. Threads alive at creation count from then.
pub(super) struct ThreadCpu {
    pub(super) base: HashMap<u32, u64>,
    pub(super) last: HashMap<u32, (ThreadKind, u64)>,
}

impl ThreadCpu {
    pub(super) fn new() -> Self {
        let base = task_stats(Pid::This)
            .into_iter()
            .map(|(tid, _, t)| (tid, t))
            .collect();
        Self {
            base,
            last: HashMap::new(),
        }
    }

    pub(super) fn sample(&mut self) {
        for (tid, comm, ticks) in task_stats(Pid::This) {
            let ticks = ticks.saturating_sub(self.base.get(&tid).copied().unwrap_or(0));
            self.last.insert(tid, (ThreadKind::of(&comm), ticks));
        }
    }

    pub(super) fn ticks(&self, kind: ThreadKind) -> u64 {
        self.last
            .values()
            .filter(|(k, _)| *k == kind)
            .map(|(_, t)| t)
            .sum()
    }
}
