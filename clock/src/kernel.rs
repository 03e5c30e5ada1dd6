//! The kernel's own view of the clock: its NTP state, read with `ntp_adjtime`.

use hoptrace_protocol::{ClockSource, ClockStatus, Leap};

use crate::{ClockStatusSource, realtime_ns};

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

#[cfg(test)]
mod tests {
    use super::*;

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
