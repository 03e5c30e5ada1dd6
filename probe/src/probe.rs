//! [`Probe`]: stamps contexts at one hop and reports the stamps to the collector.
//!
//! The hot path ([`Probe::stamp`], [`Probe::report`], [`Probe::record`]) reads the clock,
//! writes into the caller's context and pushes one `Copy` record into a bounded lock-free
//! queue. It never allocates, never takes a lock and never blocks; a full queue is counted
//! and the record dropped. The counts reach the collector, so the usual calls
//! ([`Probe::record`], [`Probe::record_at`], [`Probe::report_stamp`]) return no error to
//! handle; their `try_` forms say whether the record was queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crossbeam_queue::ArrayQueue;

use crate::carrier::CarrierError;
use crate::clock::{Clock, SystemClock};
use crate::context::{HopId, Stamp, TraceContext};
use crate::counters::{AsExtracted, Counters};
use hoptrace_protocol::Record;

/// State shared by an exporter and all its probes.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) queue: ArrayQueue<Record>,
    pub(crate) counters: Counters,
    pub(crate) shutdown: AtomicBool,
}

impl Shared {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            queue: ArrayQueue::new(capacity.max(1)),
            counters: Counters::default(),
            shutdown: AtomicBool::new(false),
        }
    }
}

/// Why a report did not reach the queue. Small and `Copy`: the hot path never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The exporter's queue is full (the collector is slow or unreachable). The record is
    /// dropped and counted as `queue_full`; raise the queue capacity or the collector's
    /// capacity.
    #[error("probe queue full: record dropped and counted")]
    QueueFull,
    /// The context holds no stamp of this probe's hop (not counted): call [`Probe::stamp`]
    /// first, or use [`Probe::record`].
    #[error("context holds no stamp of this hop")]
    NoStamp,
}

/// A probe for one named hop. Cheap to clone; clones share the exporter.
#[derive(Debug, Clone)]
pub struct Probe<C: Clock = SystemClock> {
    hop: HopId,
    clock: C,
    shared: Arc<Shared>,
}

impl<C: Clock> Probe<C> {
    pub(crate) fn new(hop: HopId, clock: C, shared: Arc<Shared>) -> Self {
        Self { hop, clock, shared }
    }

    /// This probe's hop.
    #[must_use]
    pub fn hop(&self) -> HopId {
        self.hop
    }

    /// This probe's clock, now.
    #[inline]
    #[must_use]
    pub fn now_ns(&self) -> i64 {
        self.clock.now_ns()
    }

    /// Appends this hop's stamp to `ctx` (in-band) and returns it.
    ///
    /// A context that already holds 16 stamps is left unchanged and `stamps_full` is
    /// counted; the returned stamp can still be reported with [`Probe::report_stamp`].
    #[inline]
    pub fn stamp(&self, ctx: &mut TraceContext) -> Stamp {
        self.stamp_at(ctx, self.clock.now_ns())
    }

    #[inline]
    fn stamp_at(&self, ctx: &mut TraceContext, ns: i64) -> Stamp {
        let stamp = Stamp { hop: self.hop, ns };
        if ctx.push_stamp(stamp).is_err() {
            self.shared.counters.stamps_full.0.fetch_add(1, Relaxed);
        }
        stamp
    }

    /// Hands this hop's most recent stamp in `ctx` to the collector (out of band).
    ///
    /// # Errors
    /// [`ReportError::QueueFull`] (counted) or [`ReportError::NoStamp`].
    #[inline]
    pub fn report(&self, ctx: &TraceContext) -> Result<(), ReportError> {
        let stamp = ctx.stamp_of(self.hop).ok_or(ReportError::NoStamp)?;
        self.try_report_stamp(ctx, stamp.ns)
    }

    /// Hands a stamp of this hop taken at `stamp_ns` for `ctx` to the collector, whether or
    /// not it is in the context (a tap, or a context that was full). A record that finds
    /// the queue full is dropped and counted as `queue_full`.
    #[inline]
    pub fn report_stamp(&self, ctx: &TraceContext, stamp_ns: i64) {
        let _ = self.try_report_stamp(ctx, stamp_ns);
    }

    /// As [`Probe::report_stamp`], saying whether the record was queued.
    ///
    /// # Errors
    /// [`ReportError::QueueFull`], counted as `queue_full`.
    #[inline]
    pub fn try_report_stamp(&self, ctx: &TraceContext, stamp_ns: i64) -> Result<(), ReportError> {
        let record = Record {
            key: ctx.key,
            hop: self.hop,
            stamp_ns,
            metric_count: ctx.metric_count,
            intended_ns: ctx.intended_ns,
            otel_trace_id: ctx.otel_trace_id,
        };
        match self.shared.queue.push(record) {
            Ok(()) => Ok(()),
            Err(_) => {
                self.shared.counters.queue_full.0.fetch_add(1, Relaxed);
                Err(ReportError::QueueFull)
            }
        }
    }

    /// Stamps `ctx` with a time read earlier (one reading for a whole batch of messages),
    /// reports it, and returns the stamp. A record that finds the queue full is dropped and
    /// counted as `queue_full`; the context is stamped either way.
    #[inline]
    pub fn record_at(&self, ctx: &mut TraceContext, stamp_ns: i64) -> Stamp {
        let stamp = self.stamp_at(ctx, stamp_ns);
        self.report_stamp(ctx, stamp_ns);
        stamp
    }

    /// As [`Probe::record_at`], saying whether the record was queued.
    ///
    /// # Errors
    /// [`ReportError::QueueFull`], counted; the context is stamped either way.
    #[inline]
    pub fn try_record_at(
        &self,
        ctx: &mut TraceContext,
        stamp_ns: i64,
    ) -> Result<Stamp, ReportError> {
        let stamp = self.stamp_at(ctx, stamp_ns);
        self.try_report_stamp(ctx, stamp_ns).map(|()| stamp)
    }

    /// Stamps `ctx` and reports the stamp, and returns it: the usual call at a hop. A
    /// record that finds the queue full is dropped and counted as `queue_full` (the count
    /// reaches the collector); the context is stamped either way.
    #[inline]
    pub fn record(&self, ctx: &mut TraceContext) -> Stamp {
        let stamp = self.stamp(ctx);
        self.report_stamp(ctx, stamp.ns);
        stamp
    }

    /// As [`Probe::record`], saying whether the record was queued.
    ///
    /// # Errors
    /// [`ReportError::QueueFull`], counted; the context is stamped either way.
    #[inline]
    pub fn try_record(&self, ctx: &mut TraceContext) -> Result<Stamp, ReportError> {
        let stamp = self.stamp(ctx);
        self.try_report_stamp(ctx, stamp.ns).map(|()| stamp)
    }

    /// The exporter's counters, e.g. to count carrier outcomes with
    /// [`Counters::count_extract`].
    #[must_use]
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Counts a carrier extraction's outcome and returns it unchanged, so a hop can write
    /// `let ctx = probe.counted(envelope::unwrap(payload))`.
    pub fn counted<T: AsExtracted>(
        &self,
        outcome: Result<T, CarrierError>,
    ) -> Result<T, CarrierError> {
        self.shared.counters.count_extract(&outcome);
        outcome
    }

    /// Whether the exporter is shutting down (reports may no longer be sent).
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutdown.load(Relaxed)
    }
}

/// Probes whose records stay in this process: the consumer pops them itself. For an
/// in-process collector (the demo), and for measuring the probe without a network.
#[derive(Debug, Clone)]
pub struct LocalQueue {
    shared: Arc<Shared>,
}

impl LocalQueue {
    /// A queue holding at most `capacity` records.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            shared: Arc::new(Shared::new(capacity)),
        }
    }

    /// A probe for `hop` reading CLOCK_REALTIME.
    #[must_use]
    pub fn probe(&self, hop: HopId) -> Probe {
        self.probe_with_clock(hop, SystemClock)
    }

    /// A probe for `hop` reading `clock`.
    #[must_use]
    pub fn probe_with_clock<C: Clock>(&self, hop: HopId, clock: C) -> Probe<C> {
        Probe::new(hop, clock, Arc::clone(&self.shared))
    }

    /// Pops up to `max` records into `f`; returns how many.
    pub fn drain(&self, max: usize, mut f: impl FnMut(Record)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(r) = self.shared.queue.pop() else {
                break;
            };
            f(r);
            n += 1;
        }
        self.shared.counters.dequeued.fetch_add(n as u64, Relaxed);
        n
    }

    /// Records waiting.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.queue.len()
    }

    /// Whether no record is waiting.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shared.queue.is_empty()
    }

    /// The counters; records popped by [`LocalQueue::drain`] count as sent.
    #[must_use]
    pub fn counters(&self) -> crate::counters::CounterSnapshot {
        let mut s = self.shared.counters.snapshot(self.len() as u64);
        s.sent = self.shared.counters.dequeued.load(Relaxed);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::context::TraceKey;

    fn ctx() -> TraceContext {
        TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 7,
                sequence: 42,
            },
            10,
            100,
        )
    }

    #[test]
    fn record_stamps_in_band_and_reports_out_of_band() {
        let q = LocalQueue::new(4);
        let clock = ManualClock::new(1_000);
        let p = q.probe_with_clock(HopId(3), clock.clone());
        let mut c = ctx();
        let s = p.record(&mut c);
        assert_eq!(
            s,
            Stamp {
                hop: HopId(3),
                ns: 1_000
            }
        );
        assert_eq!(c.stamps(), &[s]);
        let mut got = Vec::new();
        assert_eq!(q.drain(10, |r| got.push(r)), 1);
        assert_eq!(got[0].stamp_ns, 1_000);
        assert_eq!(got[0].key, c.key);
        assert_eq!(got[0].hop, HopId(3));
    }

    #[test]
    fn full_queue_is_counted_never_silent() {
        let q = LocalQueue::new(2);
        let p = q.probe(HopId(0));
        let mut c = ctx();
        p.stamp(&mut c);
        assert!(p.report(&c).is_ok());
        assert!(p.report(&c).is_ok());
        assert_eq!(p.report(&c), Err(ReportError::QueueFull));
        let s = q.counters();
        assert_eq!((s.reported, s.queue_full, s.sent), (3, 1, 0));
        q.drain(usize::MAX, |_| {});
        let s = q.counters();
        assert_eq!((s.reported, s.queue_full, s.sent), (3, 1, 2));
    }

    #[test]
    fn record_counts_a_full_queue_and_try_record_says_so() {
        let q = LocalQueue::new(1);
        let clock = ManualClock::new(5);
        let p = q.probe_with_clock(HopId(2), clock);
        let mut c = ctx();
        assert_eq!(
            p.try_record(&mut c),
            Ok(Stamp {
                hop: HopId(2),
                ns: 5
            })
        );
        // The queue is full: the stamp is still taken and returned, the record counted.
        assert_eq!(
            p.record(&mut c),
            Stamp {
                hop: HopId(2),
                ns: 5
            }
        );
        assert_eq!(p.try_record(&mut c), Err(ReportError::QueueFull));
        assert_eq!(p.try_record_at(&mut c, 7), Err(ReportError::QueueFull));
        assert_eq!(p.record_at(&mut c, 8).ns, 8);
        p.report_stamp(&c, 9);
        assert_eq!(c.stamps().len(), 5, "stamped in-band either way");
        let s = q.counters();
        assert_eq!((s.reported, s.queue_full), (6, 5));
    }

    #[test]
    fn report_without_stamp_is_an_error() {
        let q = LocalQueue::new(2);
        assert_eq!(q.probe(HopId(0)).report(&ctx()), Err(ReportError::NoStamp));
    }

    #[test]
    fn stamps_full_is_counted_and_stamp_still_reportable() {
        let q = LocalQueue::new(64);
        let p = q.probe(HopId(1));
        let mut c = ctx();
        for _ in 0..crate::context::MAX_STAMPS {
            p.stamp(&mut c);
        }
        let extra = p.stamp(&mut c);
        assert_eq!(q.counters().stamps_full, 1);
        assert!(p.try_report_stamp(&c, extra.ns).is_ok());
    }
}
