//! # hoptrace-clock
//!
//! How well this host's clock is synchronised, and the preflight before a run.
//!
//! A cross-host latency is only as good as the two clocks behind it, so every probe host
//! reports how well its `CLOCK_REALTIME` is synchronised. This crate reads that from
//! whatever keeps the clock on time, as a [`ClockStatusSource`]:
//!
//! - [`ChronyStatus`]: chronyd's tracking report (`chronyc -c tracking`), with the error
//!   bound computed as AWS ClockBound does: `|system time offset| + root dispersion +
//!   root delay / 2`.
//! - [`PtpStatus`]: ptp4l's view through its management socket (`pmc -u`): offset from the
//!   grandmaster, mean path delay, port state.
//! - [`KernelClockStatus`]: the kernel's own NTP state (`ntp_adjtime`), when neither
//!   daemon answers.
//!
//! [`auto_detect`] picks the first that answers, in that order. [`preflight`] turns a
//! status into a go/no-go: a run should not start on a host whose clock is unsynchronised
//! or whose error bound is larger than the latencies to be measured. `hoptrace clock`
//! prints all of it; the collector checks every probe host's reports with
//! [`preflight_host`]; the probe's exporter reads a source on a thread of its own when
//! its configuration asks for the daemons (`ClockReporting::Detect`).
//!
//! The parsers of the programs' output are pure functions
//! ([`parse_chronyc_tracking_csv`], [`parse_pmc_reading`], [`parse_ptp4l_offset_line`]),
//! tested on output captured from the real programs (`probe/testdata/clock/`, where the
//! probes in other languages read it too).
//!
//! Reading chronyd or ptp4l runs `chronyc` or `pmc` as a child process and waits for it:
//! nothing here belongs on a hot path. This crate must never depend on the probe, the
//! collector or any hoptrace crate but `hoptrace-protocol` (for the status it reports).
//! Linux only: it reads `/proc`, `ntp_adjtime` and the Linux daemons' programs.
//!
//! ```no_run
//! use hoptrace_clock::{self as clock, ChronyStatus, ClockStatusSource};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // What keeps this host's clock, and how well.
//! let mut source = clock::auto_detect();
//! let status = source.read();
//! println!("{} synced={} bound={} ns", status.source.name(), status.synced, status.error_bound_ns);
//!
//! // Refuse to run with more than 1 ms of clock uncertainty.
//! clock::preflight(&status, 1_000_000)?;
//!
//! // Or ask a chronyd on a non-default command socket.
//! let tracking = ChronyStatus::new().with_host("/run/chrony/chronyd.sock").query()?;
//! println!("stratum {}, bound {} ns", tracking.stratum, tracking.error_bound_ns());
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

#[cfg(not(target_os = "linux"))]
compile_error!(
    "hoptrace-clock reads the clock's state through Linux interfaces (ntp_adjtime, /proc, chronyc, pmc): Linux is the only supported platform"
);

mod chrony;
mod command;
mod kernel;
mod preflight;
mod ptp;

pub use chrony::{ChronyLeap, ChronyStatus, ChronyTracking, parse_chronyc_tracking_csv};
pub use hoptrace_protocol::{ClockSource, ClockStatus, Leap};
pub use kernel::{KernelClockStatus, kernel_status};
pub use preflight::{PreflightError, preflight, preflight_host};
pub use ptp::{
    CurrentDataSet, PmcResponse, PortDataSet, PortState, Ptp4lOffsetLine, PtpReading, PtpStatus,
    TimePropertiesDataSet, TimeStatusNp, parse_pmc_reading, parse_pmc_responses,
    parse_ptp4l_offset_line,
};

/// Something that can tell the host's clock status; a probe's exporter reads one
/// periodically on a thread of its own.
pub trait ClockStatusSource: Send {
    /// The status now. May take as long as the program behind it (up to its timeout):
    /// never call it on a hot path.
    fn read(&mut self) -> ClockStatus;
}

/// A fixed status, for tests, simulations and hosts whose status is known from elsewhere;
/// each reading is stamped with the time it was read.
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

/// Reads `CLOCK_REALTIME` in nanoseconds since the Unix epoch (`clock_gettime`, through
/// the vDSO: no system call).
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

/// This host's name, from the kernel (`unknown` when it cannot be read).
#[must_use]
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Why the output of `chronyc` or `pmc` could not be read.
///
/// Seen with a version of chrony or linuxptp whose output differs from the ones hoptrace
/// was tested with (chrony 4.3, linuxptp 3.1.1), or when the program printed an error
/// instead of an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The program printed nothing: check that the daemon runs and answers.
    #[error("{program} printed nothing")]
    Empty {
        /// The command whose output was empty.
        program: &'static str,
    },
    /// A CSV line had the wrong number of fields: the chrony version prints another layout.
    #[error("{program}: expected {expected} comma-separated fields, found {found} in {line:?}")]
    FieldCount {
        /// The command whose output was read.
        program: &'static str,
        /// Fields expected.
        expected: usize,
        /// Fields found.
        found: usize,
        /// The offending line.
        line: String,
    },
    /// A field's value has the wrong form.
    #[error("{program}: field {field:?} is {value:?}, expected {expected}")]
    Field {
        /// The command whose output was read.
        program: &'static str,
        /// The field's name, as the program calls it.
        field: &'static str,
        /// The value found.
        value: String,
        /// What the value should look like.
        expected: &'static str,
    },
    /// An answer lacks a field it always has: the linuxptp version prints another layout.
    #[error("{program}: {answer} has no field {field:?}")]
    MissingField {
        /// The command whose output was read.
        program: &'static str,
        /// The answer (management id) missing the field.
        answer: &'static str,
        /// The field's name.
        field: &'static str,
    },
    /// pmc printed no answer of this kind: ptp4l is not running on that socket, or it uses
    /// another `domainNumber` than asked for.
    #[error("pmc printed no {answer} answer (is ptp4l running on that socket and domain?)")]
    NoAnswer {
        /// The management id that got no answer.
        answer: &'static str,
    },
    /// A line of pmc's output is neither an answer header nor a field.
    #[error("pmc: cannot read line {line:?}")]
    Line {
        /// The offending line.
        line: String,
    },
}

/// Why a clock status source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The program could not be started: install it (`apt-get install chrony linuxptp`) or
    /// give its path.
    #[error("cannot run {program}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// What the system said.
        error: std::io::Error,
    },
    /// The program did not finish in time (it was killed): the daemon may be hung, or the
    /// host given to `chronyc -h` does not answer.
    #[error("{program} did not answer within {timeout_ms} ms")]
    Timeout {
        /// The program.
        program: String,
        /// The time allowed, ms.
        timeout_ms: u64,
    },
    /// The program ran and failed: usually the daemon is not running, or its command socket
    /// is elsewhere than asked (`chronyc -h`, `pmc -s`), or needs root.
    #[error("{program} failed ({status}): {message}")]
    Failed {
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// What it printed (standard error, else standard output), trimmed.
        message: String,
    },
    /// The program answered with something hoptrace cannot read.
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// The clock status source of this host: chronyd if `chronyc` answers, else ptp4l if
/// `pmc` answers on the default socket (`/var/run/ptp4l`, domain 0), else the kernel.
///
/// Each candidate is asked once (a few milliseconds when a daemon is absent).
#[must_use]
pub fn auto_detect() -> Box<dyn ClockStatusSource> {
    auto_detect_with(ChronyStatus::new(), PtpStatus::new())
}

/// As [`auto_detect`], asking the given chronyd and ptp4l (for non-default sockets).
#[must_use]
pub fn auto_detect_with(chrony: ChronyStatus, ptp: PtpStatus) -> Box<dyn ClockStatusSource> {
    match chrony.query() {
        Ok(_) => return Box::new(chrony),
        Err(e) => tracing::debug!("clock status: chrony not used: {e}"),
    }
    match ptp.query() {
        Ok(_) => return Box::new(ptp),
        Err(e) => tracing::debug!("clock status: ptp4l not used: {e}"),
    }
    Box::new(KernelClockStatus)
}

/// Which daemon keeps this host's clock, found once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detected {
    Chrony,
    Ptp,
    Kernel,
}

/// [`auto_detect`] with the default sockets, asked once per process: every exporter of a
/// process reports the same host's clock, and asking costs up to ~100 ms (pmc waits for
/// an answer that never comes when ptp4l is absent).
#[must_use]
pub fn this_host() -> Box<dyn ClockStatusSource> {
    static DETECTED: std::sync::OnceLock<Detected> = std::sync::OnceLock::new();
    let detected = *DETECTED.get_or_init(|| {
        if ChronyStatus::new().query().is_ok() {
            Detected::Chrony
        } else if PtpStatus::new().query().is_ok() {
            Detected::Ptp
        } else {
            Detected::Kernel
        }
    });
    match detected {
        Detected::Chrony => Box::new(ChronyStatus::new()),
        Detected::Ptp => Box::new(PtpStatus::new()),
        Detected::Kernel => Box::new(KernelClockStatus),
    }
}

/// Parses a fixed-point decimal (`-0.000001625`, `+12`, `2899.0`) into an integer scaled by
/// `10^scale` (scale 9: seconds to nanoseconds). Digits beyond `scale` are truncated.
/// `None` when the text is not such a number or does not fit an `i64`.
pub(crate) fn parse_fixed(s: &str, scale: u32) -> Option<i64> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut value: i64 = 0;
    for b in int.bytes() {
        value = value.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
    }
    let mut frac_digits = frac.bytes();
    for _ in 0..scale {
        let d = frac_digits.next().map_or(0, |b| i64::from(b - b'0'));
        value = value.checked_mul(10)?.checked_add(d)?;
    }
    Some(if negative { -value } else { value })
}

/// Formats nanoseconds for people: `850ns`, `12.3µs`, `1.50ms`, `2.00s`.
pub(crate) fn human_ns(ns: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", v / 1e6)
    } else {
        format!("{:.2}s", v / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn fixed_point() {
        assert_eq!(parse_fixed("-0.000001625", 9), Some(-1_625));
        assert_eq!(
            parse_fixed("1795335480.242007074", 9),
            Some(1_795_335_480_242_007_074)
        );
        assert_eq!(parse_fixed("+0.000000014", 9), Some(14));
        assert_eq!(parse_fixed("64.2", 9), Some(64_200_000_000));
        assert_eq!(parse_fixed("2899.0", 0), Some(2899));
        assert_eq!(parse_fixed("-105.9", 0), Some(-105));
        assert_eq!(parse_fixed("1.0000000019", 9), Some(1_000_000_001));
        assert_eq!(parse_fixed(".5", 9), Some(500_000_000));
        assert_eq!(parse_fixed("7", 9), Some(7_000_000_000));
        for bad in ["", "-", ".", "1e3", "0x10", " 1", "1.2.3", "nan", "--1"] {
            assert_eq!(parse_fixed(bad, 9), None, "{bad:?}");
        }
        assert_eq!(parse_fixed("99999999999", 9), None, "overflows i64");
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(850), "850ns");
        assert_eq!(human_ns(12_345), "12.3µs");
        assert_eq!(human_ns(1_500_000), "1.50ms");
        assert_eq!(human_ns(2_000_000_000), "2.00s");
    }

    proptest! {
        #[test]
        fn fixed_point_round_trips(ns in -4_000_000_000_000_000_000_i64..4_000_000_000_000_000_000) {
            let text = format!("{}{}.{:09}", if ns < 0 { "-" } else { "" }, ns.unsigned_abs() / 1_000_000_000, ns.unsigned_abs() % 1_000_000_000);
            prop_assert_eq!(parse_fixed(&text, 9), Some(ns));
        }

        #[test]
        fn fixed_point_never_panics(s in "\\PC{0,40}") {
            let _ = parse_fixed(&s, 9);
        }
    }
}
