//! Clocks: where stamps come from, and how sure the host is of them.
//!
//! [`SystemClock`] reads `CLOCK_REALTIME`. Tests inject the clocks of
//! [`crate::testing`]: a [`ManualClock`](crate::testing::ManualClock), or an
//! [`OffsetClock`](crate::testing::OffsetClock) to simulate a host whose clock is off by a
//! fixed amount.
//! [`ClockStatus`] describes how well the host's clock is synchronised; the exporter sends
//! it to the collector every few seconds.

use std::sync::Arc;

pub use hoptrace_clock::realtime_ns;
pub use hoptrace_protocol::{ClockSource, ClockStatus, Leap};

/// A source of wall-clock timestamps: nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// Now, in CLOCK_REALTIME nanoseconds (or what this clock simulates).
    fn now_ns(&self) -> i64;
}

/// `CLOCK_REALTIME`, read with `clock_gettime` (vDSO: no system call).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> i64 {
        realtime_ns()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ns(&self) -> i64 {
        (**self).now_ns()
    }
}
