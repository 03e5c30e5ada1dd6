//! The probe's counters: one place per event kind, sent to the collector in Counters
//! frames (`docs/collector-protocol.md`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::carrier::{CarrierError, Extracted};
use hoptrace_protocol::counter_id;

/// Counters shared by every probe of one exporter.
///
/// Producers (the hot path) only touch `queue_full` and `stamps_full`, each on its own
/// cache line; `reported` is derived (dequeued + queue_full + still queued) so that a
/// successful `report()` touches no counter at all.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) queue_full: Padded,
    pub(crate) stamps_full: Padded,
    pub(crate) dequeued: AtomicU64,
    pub(crate) sent: AtomicU64,
    pub(crate) send_failed: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) resent: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) lost_unacked: AtomicU64,
    not_traced: AtomicU64,
    bad_context: AtomicU64,
    bad_traceparent: AtomicU64,
}

/// An atomic counter alone on its cache line, so producers do not contend with the
/// exporter's counters.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded(pub(crate) AtomicU64);

/// A point-in-time copy of [`Counters`]: what happened to every record reported, and to
/// every message a carrier was asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CounterSnapshot {
    /// Records handed to `report()`.
    pub reported: u64,
    /// Records that could not be queued: lost, counted.
    pub queue_full: u64,
    /// Records written to the collector.
    pub sent: u64,
    /// Records in frames that failed to write: lost, counted.
    pub send_failed: u64,
    /// Reconnections after the first connection.
    pub reconnects: u64,
    /// Messages seen without a trace context.
    pub not_traced: u64,
    /// Contexts that failed to decode.
    pub bad_context: u64,
    /// Stamps not appended in-band (context full).
    pub stamps_full: u64,
    /// `traceparent` values ignored.
    pub bad_traceparent: u64,
    /// Records sent again after a reconnection, not yet acknowledged before it.
    pub resent: u64,
    /// Records dropped from the retention buffer before an acknowledgement.
    pub evicted: u64,
    /// Of `evicted`, the records the collector did not hold: lost, counted.
    pub lost_unacked: u64,
}

impl CounterSnapshot {
    /// (id, value) pairs for a Counters frame.
    #[must_use]
    pub(crate) fn to_wire(self) -> Vec<(u16, u64)> {
        vec![
            (counter_id::REPORTED, self.reported),
            (counter_id::QUEUE_FULL, self.queue_full),
            (counter_id::SENT, self.sent),
            (counter_id::SEND_FAILED, self.send_failed),
            (counter_id::RECONNECTS, self.reconnects),
            (counter_id::NOT_TRACED, self.not_traced),
            (counter_id::BAD_CONTEXT, self.bad_context),
            (counter_id::STAMPS_FULL, self.stamps_full),
            (counter_id::BAD_TRACEPARENT, self.bad_traceparent),
            (counter_id::RESENT, self.resent),
            (counter_id::EVICTED, self.evicted),
            (counter_id::LOST_UNACKED, self.lost_unacked),
        ]
    }

    /// Records lost by this exporter: not queued, in a frame that failed to write with
    /// no retention to send it again, or evicted unacknowledged and not held by the
    /// collector.
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.queue_full + self.send_failed + self.lost_unacked
    }
}

impl Counters {
    /// Counts the outcome of a carrier extraction: a message without a context, a
    /// context that did not decode, or an ignored `traceparent`.
    pub fn count_extract<T>(&self, outcome: &Result<T, CarrierError>)
    where
        T: AsExtracted,
    {
        match outcome {
            Ok(e) => {
                if e.as_extracted().bad_traceparent.is_some() {
                    self.bad_traceparent.fetch_add(1, Relaxed);
                }
            }
            Err(CarrierError::NotTraced) => {
                self.not_traced.fetch_add(1, Relaxed);
            }
            Err(CarrierError::BadContext(_)) => {
                self.bad_context.fetch_add(1, Relaxed);
            }
        }
    }

    /// Reads every counter; `queued` is the number of records still in the queue.
    #[must_use]
    pub fn snapshot(&self, queued: u64) -> CounterSnapshot {
        let queue_full = self.queue_full.0.load(Relaxed);
        CounterSnapshot {
            reported: self.dequeued.load(Relaxed) + queue_full + queued,
            queue_full,
            sent: self.sent.load(Relaxed),
            send_failed: self.send_failed.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            not_traced: self.not_traced.load(Relaxed),
            bad_context: self.bad_context.load(Relaxed),
            stamps_full: self.stamps_full.0.load(Relaxed),
            bad_traceparent: self.bad_traceparent.load(Relaxed),
            resent: self.resent.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
            lost_unacked: self.lost_unacked.load(Relaxed),
        }
    }
}

/// Results that hold an [`Extracted`] (plain, or with the payload of an envelope).
pub trait AsExtracted {
    /// The extracted context.
    fn as_extracted(&self) -> &Extracted;
}

impl AsExtracted for Extracted {
    fn as_extracted(&self) -> &Extracted {
        self
    }
}

impl<T> AsExtracted for (Extracted, T) {
    fn as_extracted(&self) -> &Extracted {
        &self.0
    }
}
