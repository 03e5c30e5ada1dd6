//! The clock check before a run: refuse a host whose clock is unsynchronised or whose error
//! bound is too large for the latencies to be measured.

use hoptrace_protocol::{ClockSource, ClockStatus};

use crate::human_ns;

/// Why a host's clock is not fit for a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    /// The clock is not synchronised: start (or fix) chronyd or ptp4l + phc2sys on the
    /// host and wait until it reports synchronised (`hoptrace clock`), or run anyway with
    /// `--force` and read cross-host stages with care.
    #[error("{host}: clock not synchronised according to {} ({detail})", clock_source.name())]
    Unsynchronised {
        /// The host.
        host: String,
        /// What reported the status.
        clock_source: ClockSource,
        /// The source's detail.
        detail: String,
    },
    /// The clock's error bound exceeds the threshold: use a better time source (a PTP
    /// hardware clock, a closer NTP server), wait for the daemon to settle, or raise the
    /// threshold if the stages to be measured are long enough.
    #[error(
        "{host}: clock error bound {} ({} ns) from {} exceeds the allowed {} ({} ns)",
        human_ns(*error_bound_ns),
        error_bound_ns,
        clock_source.name(),
        human_ns(*max_error_bound_ns),
        max_error_bound_ns
    )]
    ErrorBoundTooLarge {
        /// The host.
        host: String,
        /// What reported the status.
        clock_source: ClockSource,
        /// The bound reported, ns.
        error_bound_ns: u64,
        /// The largest bound allowed, ns.
        max_error_bound_ns: u64,
    },
}

/// Checks this host's clock `status` before a run: it must be synchronised, with an error
/// bound of at most `max_error_bound_ns`. The error names this host (its host name).
///
/// ```
/// use hoptrace_protocol::{ClockSource, ClockStatus};
/// use hoptrace_clock::preflight_host;
///
/// let status = ClockStatus {
///     source: ClockSource::Chrony,
///     synced: true,
///     error_bound_ns: 40_000,
///     ..ClockStatus::default()
/// };
/// assert!(preflight_host("probe-1", &status, 1_000_000).is_ok());
/// let e = preflight_host("probe-1", &status, 10_000).unwrap_err();
/// assert_eq!(
///     e.to_string(),
///     "probe-1: clock error bound 40.0µs (40000 ns) from chrony exceeds the allowed 10.0µs (10000 ns)"
/// );
/// ```
///
/// # Errors
/// [`PreflightError::Unsynchronised`] or [`PreflightError::ErrorBoundTooLarge`].
pub fn preflight(status: &ClockStatus, max_error_bound_ns: u64) -> Result<(), PreflightError> {
    preflight_host(&crate::hostname(), status, max_error_bound_ns)
}

/// As [`preflight`], for the status of host `host` (as a collector sees the probe hosts).
///
/// # Errors
/// As [`preflight`].
pub fn preflight_host(
    host: &str,
    status: &ClockStatus,
    max_error_bound_ns: u64,
) -> Result<(), PreflightError> {
    if !status.synced {
        return Err(PreflightError::Unsynchronised {
            host: host.to_owned(),
            clock_source: status.source,
            detail: status.detail.clone(),
        });
    }
    if status.error_bound_ns > max_error_bound_ns {
        return Err(PreflightError::ErrorBoundTooLarge {
            host: host.to_owned(),
            clock_source: status.source,
            error_bound_ns: status.error_bound_ns,
            max_error_bound_ns,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_protocol::Leap;

    fn status(synced: bool, error_bound_ns: u64) -> ClockStatus {
        ClockStatus {
            source: ClockSource::Ptp,
            synced,
            leap: if synced {
                Leap::None
            } else {
                Leap::Unsynchronised
            },
            error_bound_ns,
            detail: "gm=02c9c1.fffe.736ac7 port=UNCALIBRATED".into(),
            ..ClockStatus::default()
        }
    }

    #[test]
    fn passes_within_the_bound() {
        assert_eq!(preflight_host("h", &status(true, 1_000), 1_000), Ok(()));
        assert_eq!(preflight_host("h", &status(true, 0), 0), Ok(()));
    }

    #[test]
    fn refuses_unsynchronised_first() {
        let e = preflight_host("probe-7", &status(false, 5), 1_000).unwrap_err();
        assert!(matches!(e, PreflightError::Unsynchronised { .. }));
        assert_eq!(
            e.to_string(),
            "probe-7: clock not synchronised according to ptp (gm=02c9c1.fffe.736ac7 port=UNCALIBRATED)"
        );
    }

    #[test]
    fn refuses_a_large_bound_with_the_figures() {
        let e = preflight_host("probe-7", &status(true, 2_500_000), 1_000_000).unwrap_err();
        assert_eq!(
            e,
            PreflightError::ErrorBoundTooLarge {
                host: "probe-7".into(),
                clock_source: ClockSource::Ptp,
                error_bound_ns: 2_500_000,
                max_error_bound_ns: 1_000_000,
            }
        );
        assert_eq!(
            e.to_string(),
            "probe-7: clock error bound 2.50ms (2500000 ns) from ptp exceeds the allowed 1.00ms (1000000 ns)"
        );
    }

    #[test]
    fn names_this_host() {
        let e = preflight(&status(false, 0), 1).unwrap_err();
        assert!(e.to_string().starts_with(&crate::hostname()), "{e}");
    }
}
