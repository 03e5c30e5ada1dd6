//! What a publisher sent, per stream, for the collector's accounting (Sent frames), the
//! schedule lag histogram, and the counters of its own a publisher or a broker tap sends
//! the collector (late sends, broker reconnections).

use hdrhistogram::Histogram;
use hoptrace_format::hist::Percentile;
use hoptrace_protocol::{MAX_SENT_PER_FRAME, SentEntry, SentFrame};

/// Most entries per Sent frame: as many as fit in one frame.
pub const SENT_ENTRIES_PER_FRAME: usize = MAX_SENT_PER_FRAME;

/// Per-stream counts of what was handed to the broker client.
#[derive(Debug, Clone)]
pub struct SentLedger {
    publisher: u16,
    entries: Vec<SentEntry>,
    messages: u64,
    metrics: u64,
}

impl SentLedger {
    /// An empty ledger for `streams` streams of `publisher`.
    #[must_use]
    pub fn new(publisher: u16, streams: u32) -> Self {
        Self {
            publisher,
            entries: (0..streams)
                .map(|stream| SentEntry {
                    stream,
                    ..SentEntry::default()
                })
                .collect(),
            messages: 0,
            metrics: 0,
        }
    }

    /// Counts message `sequence` of `stream`, carrying `metrics` metrics.
    ///
    /// # Panics
    /// If `stream` is not below the stream count given to [`SentLedger::new`].
    #[inline]
    pub fn record(&mut self, stream: u32, sequence: u64, metrics: u32) {
        let e = &mut self.entries[stream as usize];
        if e.messages == 0 {
            e.first_sequence = sequence;
        }
        e.messages += 1;
        e.metrics += u64::from(metrics);
        e.last_sequence = sequence;
        self.messages += 1;
        self.metrics += u64::from(metrics);
    }

    /// Messages counted.
    #[must_use]
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Metrics counted.
    #[must_use]
    pub fn metrics(&self) -> u64 {
        self.metrics
    }

    /// Streams that sent at least one message.
    #[must_use]
    pub fn streams_used(&self) -> usize {
        self.entries.iter().filter(|e| e.messages > 0).count()
    }

    /// The entry of `stream`.
    #[must_use]
    pub fn entry(&self, stream: u32) -> Option<&SentEntry> {
        self.entries.get(stream as usize)
    }

    /// Sent frames (cumulative) for every stream that sent something, each within the
    /// protocol's frame size.
    #[must_use]
    pub fn frames(&self) -> Vec<SentFrame> {
        let used: Vec<SentEntry> = self
            .entries
            .iter()
            .filter(|e| e.messages > 0)
            .copied()
            .collect();
        used.chunks(SENT_ENTRIES_PER_FRAME)
            .map(|c| SentFrame {
                publisher: self.publisher,
                entries: c.to_vec(),
            })
            .collect()
    }
}

/// Schedule lag statistics: egress stamp minus intended send time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LagSummary {
    /// Messages measured.
    pub count: u64,
    /// p50, p90, p99, p99.9 (HDR, 3 significant digits).
    pub quantiles: Vec<Percentile>,
    /// Largest lag, ns (exact up to the histogram's precision).
    pub max_ns: u64,
    /// Mean lag, ns.
    pub mean_ns: f64,
    /// Messages stamped before their intended time (clock stepped back): recorded as 0.
    pub negative: u64,
}

impl LagSummary {
    /// The value at `quantile`, when listed.
    #[must_use]
    pub fn at(&self, quantile: f64) -> Option<Percentile> {
        self.quantiles
            .iter()
            .copied()
            .find(|q| (q.quantile - quantile).abs() < 1e-9)
    }
}

/// The lag histogram: 1 ns to 1 hour at 3 significant digits.
#[derive(Debug, Clone)]
pub struct LagHistogram {
    hist: Histogram<u64>,
    negative: u64,
    /// The exact smallest and largest lag recorded (as recorded: negatives as 0).
    min_ns: u64,
    max_ns: u64,
}

impl Default for LagHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LagHistogram {
    /// Longest lag recorded as itself; longer lags are recorded as this.
    pub const MAX_NS: u64 = 3_600_000_000_000;

    /// An empty histogram.
    #[must_use]
    pub fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, Self::MAX_NS, 3).expect("valid bounds"),
            negative: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }

    /// Records a lag (`egress - intended`, ns).
    #[inline]
    pub fn record(&mut self, lag_ns: i64) {
        let v = if lag_ns < 0 {
            self.negative += 1;
            0
        } else {
            (lag_ns as u64).min(Self::MAX_NS)
        };
        self.min_ns = self.min_ns.min(v);
        self.max_ns = self.max_ns.max(v);
        self.hist.saturating_record(v);
    }

    /// Empties the histogram.
    pub fn reset(&mut self) {
        self.hist.reset();
        self.negative = 0;
        self.min_ns = u64::MAX;
        self.max_ns = 0;
    }

    /// Lags recorded.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Whether nothing was recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The value at `quantile` (0 when empty): the middle of the bucket holding it, kept
    /// within the exact minimum and maximum, as every hoptrace percentile is reported
    /// (`hoptrace_format::hist`).
    #[must_use]
    pub fn value_at(&self, quantile: f64) -> u64 {
        if self.hist.is_empty() {
            0
        } else {
            self.hist
                .median_equivalent(self.hist.value_at_quantile(quantile))
                .clamp(self.min_ns, self.max_ns)
        }
    }

    /// p50, p90, p99, p99.9, max and mean.
    #[must_use]
    pub fn summary(&self) -> LagSummary {
        let h = &self.hist;
        LagSummary {
            count: h.len(),
            quantiles: [0.5, 0.9, 0.99, 0.999]
                .into_iter()
                .map(|q| {
                    let v = self.value_at(q);
                    Percentile {
                        quantile: q,
                        value_ns: i64::try_from(v).unwrap_or(i64::MAX),
                        precision_ns: h.equivalent_range(v) / 2,
                    }
                })
                .collect(),
            max_ns: if h.is_empty() { 0 } else { self.max_ns },
            mean_ns: if h.is_empty() { 0.0 } else { h.mean() },
            negative: self.negative,
        }
    }
}

/// Counters of a publisher's or a broker tap's own (`docs/collector-protocol.md`: late
/// sends, broker reconnections), cumulative, sent to the collector in Counters frames of
/// their own when they change, so that a report can place each change on its time axis.
#[derive(Debug, Clone, Default)]
pub struct OwnCounters {
    values: Vec<(u16, u64)>,
    sent: Vec<(u16, u64)>,
}

impl OwnCounters {
    /// Sets counter `id` to `value`.
    pub fn set(&mut self, id: u16, value: u64) {
        match self.values.iter_mut().find(|(i, _)| *i == id) {
            Some(slot) => slot.1 = value,
            None => self.values.push((id, value)),
        }
    }

    /// Whether a value differs from the last ones sent.
    #[must_use]
    pub fn changed(&self) -> bool {
        self.values != self.sent
    }

    /// Sends the values to the collector through `exporter` when they changed since the
    /// last frame (a frame that cannot be queued is logged: these counters are
    /// cumulative, the next frame carries them).
    pub fn send_if_changed(&mut self, exporter: Option<&hoptrace_probe::Exporter>) {
        let Some(e) = exporter else { return };
        if !self.changed() {
            return;
        }
        self.sent.clone_from(&self.values);
        if let Err(err) = e.send_counters_frame(hoptrace_protocol::CountersFrame {
            at_ns: hoptrace_probe::clock::realtime_ns(),
            values: self.values.clone(),
        }) {
            tracing::warn!("cannot send this process's own counters: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_counters_are_sent_only_when_they_change() {
        let mut c = OwnCounters::default();
        assert!(!c.changed());
        c.set(34, 1);
        assert!(c.changed());
        c.send_if_changed(None);
        assert!(c.changed(), "nothing was sent without an exporter");
        c.sent.clone_from(&c.values);
        c.set(34, 1);
        assert!(!c.changed());
        c.set(35, 12_000_000);
        assert!(c.changed());
    }

    #[test]
    fn lag_percentiles_stay_within_the_exact_extremes() {
        let mut l = LagHistogram::new();
        for v in [400_000, 900_000, 1_190_968] {
            l.record(v);
        }
        let s = l.summary();
        assert_eq!(s.max_ns, 1_190_968);
        assert_eq!(s.at(0.999).unwrap().value_ns, 1_190_968);
        l.reset();
        l.record(1_190_001);
        assert_eq!(l.value_at(0.5), 1_190_001);
    }

    #[test]
    fn ledger_counts_per_stream_and_frames_fit() {
        let mut l = SentLedger::new(9, 70_000);
        for s in 0..70_000u32 {
            l.record(s, 5, 20);
            l.record(s, 6, 20);
        }
        assert_eq!((l.messages(), l.metrics()), (140_000, 2_800_000));
        let frames = l.frames();
        assert_eq!(frames.len(), 70_000usize.div_ceil(SENT_ENTRIES_PER_FRAME));
        let mut n = 0;
        for f in &frames {
            assert_eq!(f.publisher, 9);
            let bytes = hoptrace_protocol::Frame::Sent(f.clone())
                .to_bytes()
                .unwrap();
            assert!(
                bytes.len() - 4 <= hoptrace_protocol::MAX_FRAME_LEN,
                "{} bytes",
                bytes.len()
            );
            for e in &f.entries {
                assert_eq!(
                    (e.messages, e.metrics, e.first_sequence, e.last_sequence),
                    (2, 40, 5, 6)
                );
                n += 1;
            }
        }
        assert_eq!(n, 70_000);
        assert_eq!(
            SentLedger::new(1, 5).frames().len(),
            0,
            "idle streams are left out"
        );
    }

    #[test]
    fn lag_quantiles_against_sorted_values() {
        let mut h = LagHistogram::new();
        let mut values: Vec<i64> = (0..10_000).map(|i| (i * 7919) % 1_000_003).collect();
        for v in &values {
            h.record(*v);
        }
        h.record(-5);
        values.push(0);
        values.sort_unstable();
        let s = h.summary();
        assert_eq!(s.count, 10_001);
        assert_eq!(s.negative, 1);
        for q in &s.quantiles {
            let idx = ((q.quantile * values.len() as f64).ceil() as usize).max(1) - 1;
            let exact = values[idx];
            assert!(
                q.value_ns.abs_diff(exact) <= q.precision_ns,
                "q {} hdr {} exact {}",
                q.quantile,
                q.value_ns,
                exact
            );
        }
        assert!(s.max_ns.abs_diff(*values.last().unwrap() as u64) <= 1000);
    }
}
