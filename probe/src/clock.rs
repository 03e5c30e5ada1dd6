//! Clocks: where stamps come from, and how sure the host is of them.
//!
//! [`SystemClock`] reads `CLOCK_REALTIME`. Tests inject [`ManualClock`] or wrap a clock in
//! [`OffsetClock`] to simulate a host whose clock is off by a fixed amount.
//! [`ClockStatus`] describes how well the host's clock is synchronised; the exporter sends
//! it to the collector every few seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

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

/// Reads `CLOCK_REALTIME` in nanoseconds.
#[inline]
#[must_use]
pub fn realtime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

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

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ns(&self) -> i64 {
        (**self).now_ns()
    }
}

/// Something that can tell the host's clock status; the exporter polls it.
pub trait ClockStatusSource: Send {
    /// The status now.
    fn read(&mut self) -> ClockStatus;
}

/// The kernel's NTP state through `ntp_adjtime` (read only, changes nothing).
///
/// The error bound is the kernel's `maxerror`, which a sync daemon (chronyd, ntpd,
/// phc2sys) keeps current and the kernel grows by 500 ppm while nothing does.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelClockStatus;

impl ClockStatusSource for KernelClockStatus {
    fn read(&mut self) -> ClockStatus {
        kernel_status()
    }
}

/// Reads the kernel's NTP state.
#[must_use]
pub fn kernel_status() -> ClockStatus {
    // SAFETY: a zeroed timex with modes = 0 asks ntp_adjtime to only read.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `tx` is valid and writable.
    let state = unsafe { libc::ntp_adjtime(&raw mut tx) };
    let at_ns = realtime_ns();
    if state < 0 {
        return ClockStatus {
            at_ns,
            source: ClockSource::Kernel,
            detail: format!("ntp_adjtime failed: {}", std::io::Error::last_os_error()),
            leap: Leap::Unsynchronised,
            ..ClockStatus::default()
        };
    }
    let unsync = tx.status & libc::STA_UNSYNC != 0 || state == libc::TIME_ERROR;
    let nano = tx.status & libc::STA_NANO != 0;
    let offset_ns = if nano { tx.offset } else { tx.offset * 1000 };
    let leap = match state {
        _ if unsync => Leap::Unsynchronised,
        libc::TIME_INS => Leap::Insert,
        libc::TIME_DEL => Leap::Delete,
        _ => Leap::None,
    };
    ClockStatus {
        at_ns,
        source: ClockSource::Kernel,
        synced: !unsync,
        leap,
        offset_ns,
        error_bound_ns: u64::try_from(tx.maxerror).unwrap_or(0) * 1000,
        detail: format!(
            "state={state} status={:#x} maxerror_us={} esterror_us={}",
            tx.status, tx.maxerror, tx.esterror
        ),
    }
}

/// A fixed status, for tests and for hosts whose status is known from elsewhere.
#[derive(Debug, Clone)]
pub struct StaticClockStatus(pub ClockStatus);

impl ClockStatusSource for StaticClockStatus {
    fn read(&mut self) -> ClockStatus {
        ClockStatus {
            at_ns: realtime_ns(),
            ..self.0.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realtime_agrees_with_system_time() {
        let a = realtime_ns();
        let b = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        assert!((b - a).abs() < 1_000_000_000, "{a} vs {b}");
    }

    #[test]
    fn offset_clock_is_skewed_by_exactly_its_offset() {
        let m = ManualClock::new(1_000);
        let skewed = OffsetClock::new(m.clone(), -250);
        assert_eq!(skewed.now_ns(), 750);
        m.advance(10);
        assert_eq!(skewed.now_ns(), 760);
    }

    #[test]
    fn kernel_status_reads() {
        let s = kernel_status();
        assert_eq!(s.source, ClockSource::Kernel);
        assert!(s.at_ns > 0);
        assert!(!s.detail.is_empty());
        if s.synced {
            assert_ne!(s.leap, Leap::Unsynchronised);
        }
    }
}
