//! [`Probe`]: stamps contexts at one hop and reports the stamps to the collector.
//!
//! A hop calls [`Probe::record`] for each message: it reads the clock, appends the stamp to
//! the caller's context and pushes one `Copy` record into a bounded lock-free queue. It
//! never allocates, never takes a lock and never blocks; a full queue is counted and the
//! record dropped. The counts reach the collector, so there is no error to handle; the
//! returned [`Recorded`] says whether the record was queued. [`Probe::record_at`] takes a
//! time read earlier; [`Probe::stamp`] and [`Probe::report_stamp`] are its two halves, for
//! hops that do only one of them.

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

/// What [`Probe::record`] (and its kin) did: the stamp taken, and whether its record
/// reached the exporter's queue. A record that found the queue full is dropped and counted
/// as `queue_full` (the count reaches the collector), so most callers ignore `queued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The stamp: this probe's hop and the instant it stands for.
    pub stamp: Stamp,
    /// Whether the record was queued for the collector (`false`: the queue was full).
    pub queued: bool,
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

    /// Appends this hop's stamp to `ctx` (in-band) and returns it, without reporting it:
    /// for a hop whose stamps the collector learns otherwise (the publisher's own).
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

    /// Stamps `ctx` and reports the stamp: the one call a hop makes for a message. The
    /// context is stamped whether or not the record finds room in the queue.
    #[inline]
    pub fn record(&self, ctx: &mut TraceContext) -> Recorded {
        self.record_at(ctx, self.clock.now_ns())
    }

    /// As [`Probe::record`], with a time read earlier (one reading for a whole batch of
    /// messages).
    #[inline]
    pub fn record_at(&self, ctx: &mut TraceContext, stamp_ns: i64) -> Recorded {
        self.stamp_at(ctx, stamp_ns);
        self.report_stamp(ctx, stamp_ns)
    }

    /// Reports a stamp of this hop taken at `stamp_ns` for `ctx`, without adding it to the
    /// context: a hop that cannot forward the context (a store tap, a sink), or a context
    /// already holding 16 stamps.
    #[inline]
    pub fn report_stamp(&self, ctx: &TraceContext, stamp_ns: i64) -> Recorded {
        let record = Record {
            key: ctx.key,
            hop: self.hop,
            stamp_ns,
            metric_count: ctx.metric_count,
            intended_ns: ctx.intended_ns,
            otel_trace_id: ctx.otel_trace_id,
        };
        let queued = self.shared.queue.push(record).is_ok();
        if !queued {
            self.shared.counters.queue_full.0.fetch_add(1, Relaxed);
        }
        Recorded {
            stamp: Stamp {
                hop: self.hop,
                ns: stamp_ns,
            },
            queued,
        }
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
    use crate::context::TraceKey;
    use crate::testing::ManualClock;

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
        let r = p.record(&mut c);
        let s = Stamp {
            hop: HopId(3),
            ns: 1_000,
        };
        assert_eq!(
            r,
            Recorded {
                stamp: s,
                queued: true
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
    fn a_full_queue_is_counted_never_silent_and_the_context_is_stamped_either_way() {
        let q = LocalQueue::new(2);
        let clock = ManualClock::new(5);
        let p = q.probe_with_clock(HopId(2), clock);
        let mut c = ctx();
        assert!(p.record(&mut c).queued);
        assert!(p.record_at(&mut c, 6).queued);
        // The queue is full: the stamp is still taken and returned, the record counted.
        let r = p.record(&mut c);
        assert_eq!((r.stamp.ns, r.queued), (5, false));
        assert_eq!(
            p.record_at(&mut c, 8),
            Recorded {
                stamp: Stamp {
                    hop: HopId(2),
                    ns: 8
                },
                queued: false
            }
        );
        assert!(!p.report_stamp(&c, 9).queued);
        assert_eq!(c.stamps().len(), 4, "stamped in-band either way");
        let s = q.counters();
        assert_eq!((s.reported, s.queue_full, s.sent), (5, 3, 0));
        q.drain(usize::MAX, |_| {});
        let s = q.counters();
        assert_eq!((s.reported, s.queue_full, s.sent), (5, 3, 2));
    }

    #[test]
    fn stamp_does_not_report_and_report_stamp_does_not_stamp() {
        let q = LocalQueue::new(4);
        let p = q.probe_with_clock(HopId(1), ManualClock::new(7));
        let mut c = ctx();
        assert_eq!(p.stamp(&mut c).ns, 7);
        assert!(q.is_empty());
        assert!(p.report_stamp(&c, 3).queued);
        assert_eq!(c.stamps().len(), 1);
        let mut got = Vec::new();
        q.drain(10, |r| got.push(r.stamp_ns));
        assert_eq!(got, [3]);
    }

    #[test]
    fn stamps_full_is_counted_and_stamp_still_reportable() {
        let q = LocalQueue::new(64);
        let p = q.probe(HopId(1));
        let mut c = ctx();
        for _ in 0..crate::context::MAX_STAMPS {
            p.stamp(&mut c);
        }
        let extra = p.record(&mut c);
        assert_eq!(q.counters().stamps_full, 1);
        assert!(extra.queued, "reported though the context had no room");
    }
}
