//! Clocks for tests and simulations: a [`ManualClock`] that moves only when told to, and an
//! [`OffsetClock`] that simulates a host whose clock is off by a fixed amount. Give either
//! to [`Exporter::probe_with_clock`](crate::Exporter::probe_with_clock) or
//! [`LocalQueue::probe_with_clock`](crate::LocalQueue::probe_with_clock).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::clock::Clock;

/// A clock that reads another clock and adds a fixed offset: a skewed host.
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock<C> {
    inner: C,
    offset_ns: i64,
}

impl<C: Clock> OffsetClock<C> {
    /// `inner` shifted by `offset_ns` (positive: this host's clock runs ahead).
    pub const fn new(inner: C, offset_ns: i64) -> Self {
        Self { inner, offset_ns }
    }
}

impl<C: Clock> Clock for OffsetClock<C> {
    #[inline]
    fn now_ns(&self) -> i64 {
        self.inner.now_ns() + self.offset_ns
    }
}

/// A clock that only moves when told to; clones share the time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock reading `ns`.
    #[must_use]
    pub fn new(ns: i64) -> Self {
        Self(Arc::new(AtomicI64::new(ns)))
    }
    /// Sets the time.
    pub fn set(&self, ns: i64) {
        self.0.store(ns, Ordering::Relaxed);
    }
    /// Moves the time forward by `ns`.
    pub fn advance(&self, ns: i64) {
        self.0.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_clock_is_skewed_by_exactly_its_offset() {
        let m = ManualClock::new(1_000);
        let skewed = OffsetClock::new(m.clone(), -250);
        assert_eq!(skewed.now_ns(), 750);
        m.advance(10);
        assert_eq!(skewed.now_ns(), 760);
    }
}
