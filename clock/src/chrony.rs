//! chronyd's tracking report, read with `chronyc -c tracking`.

use std::path::PathBuf;
use std::time::Duration;

use hoptrace_protocol::{ClockSource, ClockStatus, Leap};

use crate::command::{find_program, run};
use crate::{ClockStatusSource, ParseError, SourceError, parse_fixed, realtime_ns};

const PROGRAM: &str = "chronyc -c tracking";
/// Fields of one `chronyc -c tracking` line (chrony 3.x and 4.x).
const FIELDS: usize = 14;
/// The reference id chronyd shows when it serves its own clock (`local` directive):
/// 127.127.1.1.
const LOCAL_REF_ID: u32 = 0x7F7F_0101;

/// chronyd's leap status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChronyLeap {
    /// No leap second pending.
    Normal,
    /// A second will be inserted at the end of the day.
    InsertSecond,
    /// A second will be deleted at the end of the day.
    DeleteSecond,
    /// chronyd is not synchronised to any source.
    NotSynchronised,
}

impl ChronyLeap {
    /// As chronyc prints it: `Normal`, `Insert second`, `Delete second`, `Not synchronised`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::InsertSecond => "Insert second",
            Self::DeleteSecond => "Delete second",
            Self::NotSynchronised => "Not synchronised",
        }
    }

    /// The same state as carried in a [`ClockStatus`].
    #[must_use]
    pub fn to_leap(self) -> Leap {
        match self {
            Self::Normal => Leap::None,
            Self::InsertSecond => Leap::Insert,
            Self::DeleteSecond => Leap::Delete,
            Self::NotSynchronised => Leap::Unsynchronised,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Normal,
            Self::InsertSecond,
            Self::DeleteSecond,
            Self::NotSynchronised,
        ]
        .into_iter()
        .find(|l| l.as_str() == s)
    }
}

/// One tracking report of chronyd (`chronyc -c tracking`), times in nanoseconds.
///
/// chronyc prints seconds with 9 decimals; they are converted exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct ChronyTracking {
    /// Reference ID: the IPv4 address of the selected server, a hash of an IPv6 address,
    /// or a refclock's name in ASCII (`PHC0`); 0 when unsynchronised.
    pub ref_id: u32,
    /// The reference's address or name as chronyc prints it (may be empty).
    pub ref_name: String,
    /// Stratum: hops to a reference clock (1: a refclock on this host; 16 or 0: none).
    pub stratum: u8,
    /// When the last measurement from the reference was processed (UTC, Unix epoch ns).
    pub ref_time_ns: i64,
    /// chronyc's "System time" field, signed as chronyc's CSV prints it: the correction
    /// chronyd is slewing into the system clock. **Positive: the system clock is slow**
    /// (behind NTP time); negative: fast. See [`ChronyTracking::offset_ns`] for the usual
    /// sign.
    pub system_time_offset_ns: i64,
    /// "Last offset": the estimated local offset at the last clock update (positive: the
    /// local clock was ahead of the sources).
    pub last_offset_ns: i64,
    /// "RMS offset": long-term average of the offset.
    pub rms_offset_ns: u64,
    /// "Frequency": how fast the system clock would run uncorrected, ppm (negative: slow).
    pub frequency_ppm: f64,
    /// "Residual freq": frequency of the reference minus what chronyd uses, ppm.
    pub residual_freq_ppm: f64,
    /// "Skew": estimated error bound of the frequency, ppm.
    pub skew_ppm: f64,
    /// "Root delay": total round-trip delay to the stratum-1 reference.
    pub root_delay_ns: u64,
    /// "Root dispersion": accumulated dispersion to the stratum-1 reference, grown since
    /// the last update.
    pub root_dispersion_ns: u64,
    /// "Update interval": between the last two clock updates (printed with 0.1 s precision).
    pub update_interval_ns: u64,
    /// "Leap status".
    pub leap: ChronyLeap,
}

impl ChronyTracking {
    /// Offset of the system clock from the reference, ns: **positive when the system clock
    /// is ahead** (the sign of [`ClockStatus::offset_ns`]); the negation of chronyc's
    /// "System time".
    #[must_use]
    pub fn offset_ns(&self) -> i64 {
        self.system_time_offset_ns.saturating_neg()
    }

    /// Bound on the error of a reading of the system clock, ns, as AWS ClockBound computes
    /// it from the same report: `|system time offset| + root dispersion + root delay / 2`.
    ///
    /// Half the root delay bounds the error an asymmetric path can cause; the root
    /// dispersion covers everything else chronyd knows of up to the reference, including
    /// the drift since the last update.
    #[must_use]
    pub fn error_bound_ns(&self) -> u64 {
        self.system_time_offset_ns
            .unsigned_abs()
            .saturating_add(self.root_dispersion_ns)
            .saturating_add(self.root_delay_ns / 2)
    }

    /// Whether chronyd is synchronised: leap status not "Not synchronised", stratum below
    /// 16 and a reference selected (ref id not 0).
    #[must_use]
    pub fn synced(&self) -> bool {
        self.leap != ChronyLeap::NotSynchronised && self.stratum < 16 && self.ref_id != 0
    }

    /// Whether chronyd serves its own clock (the `local` directive) rather than following
    /// a source.
    #[must_use]
    pub fn is_local_reference(&self) -> bool {
        self.ref_id == LOCAL_REF_ID
    }

    /// The report as a [`ClockStatus`] taken at `at_ns`.
    #[must_use]
    pub fn to_status(&self, at_ns: i64) -> ClockStatus {
        let synced = self.synced();
        let leap = if synced {
            self.leap.to_leap()
        } else {
            Leap::Unsynchronised
        };
        let name = if self.ref_name.is_empty() {
            if self.is_local_reference() {
                "local clock".to_owned()
            } else {
                "-".to_owned()
            }
        } else {
            self.ref_name.clone()
        };
        ClockStatus {
            at_ns,
            source: ClockSource::Chrony,
            synced,
            leap,
            offset_ns: self.offset_ns(),
            error_bound_ns: self.error_bound_ns(),
            detail: format!(
                "ref={:08X} ({name}) stratum={} root_delay_ns={} root_dispersion_ns={} \
                 rms_offset_ns={} freq_ppm={:.3} skew_ppm={:.3} update_interval_ns={} leap={:?}",
                self.ref_id,
                self.stratum,
                self.root_delay_ns,
                self.root_dispersion_ns,
                self.rms_offset_ns,
                self.frequency_ppm,
                self.skew_ppm,
                self.update_interval_ns,
                self.leap.as_str(),
            ),
        }
    }
}

/// Parses the output of `chronyc -c tracking`: one line of 14 comma-separated fields.
///
/// ```
/// use hoptrace_clock::parse_chronyc_tracking_csv;
///
/// let t = parse_chronyc_tracking_csv(
///     "7F000001,127.0.0.1,9,1795335480.242007074,-0.000002004,0.000000007,0.000000029,\
///      -0.066,0.008,0.511,0.000006488,0.000001670,0.0,Normal\n",
/// )?;
/// assert_eq!(t.stratum, 9);
/// assert_eq!(t.offset_ns(), 2_004); // "System time" -2004 ns: the clock is 2004 ns fast
/// assert_eq!(t.error_bound_ns(), 2_004 + 1_670 + 6_488 / 2);
/// # Ok::<(), hoptrace_clock::ParseError>(())
/// ```
///
/// # Errors
/// [`ParseError`] naming the field that is missing or malformed.
pub fn parse_chronyc_tracking_csv(output: &str) -> Result<ChronyTracking, ParseError> {
    let line = output
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or(ParseError::Empty { program: PROGRAM })?;
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != FIELDS {
        return Err(ParseError::FieldCount {
            program: PROGRAM,
            expected: FIELDS,
            found: f.len(),
            line: line.to_owned(),
        });
    }
    let bad = |field: &'static str, value: &str, expected: &'static str| ParseError::Field {
        program: PROGRAM,
        field,
        value: value.to_owned(),
        expected,
    };
    let ref_id = u32::from_str_radix(f[0], 16)
        .ok()
        .filter(|_| f[0].len() == 8)
        .ok_or_else(|| bad("Reference ID", f[0], "8 hex digits"))?;
    let stratum = f[2]
        .parse::<u8>()
        .map_err(|_| bad("Stratum", f[2], "an integer 0..=255"))?;
    let seconds = |i: usize, field: &'static str| {
        parse_fixed(f[i], 9).ok_or_else(|| bad(field, f[i], "seconds, e.g. -0.000001625"))
    };
    let unsigned = |i: usize, field: &'static str| {
        parse_fixed(f[i], 9)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| bad(field, f[i], "non-negative seconds, e.g. 0.000005788"))
    };
    let ppm = |i: usize, field: &'static str| {
        f[i].parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| bad(field, f[i], "ppm, e.g. -0.110"))
    };
    Ok(ChronyTracking {
        ref_id,
        ref_name: f[1].to_owned(),
        stratum,
        ref_time_ns: seconds(3, "Ref time")?,
        system_time_offset_ns: seconds(4, "System time")?,
        last_offset_ns: seconds(5, "Last offset")?,
        rms_offset_ns: unsigned(6, "RMS offset")?,
        frequency_ppm: ppm(7, "Frequency")?,
        residual_freq_ppm: ppm(8, "Residual freq")?,
        skew_ppm: ppm(9, "Skew")?,
        root_delay_ns: unsigned(10, "Root delay")?,
        root_dispersion_ns: unsigned(11, "Root dispersion")?,
        update_interval_ns: unsigned(12, "Update interval")?,
        leap: ChronyLeap::parse(f[13]).ok_or_else(|| {
            bad(
                "Leap status",
                f[13],
                "Normal, Insert second, Delete second or Not synchronised",
            )
        })?,
    })
}

/// chronyd's view of the system clock, read by running `chronyc -n -c tracking`.
///
/// By default chronyc talks to the local chronyd (its Unix socket, else UDP port 323 on
/// localhost); [`ChronyStatus::with_host`] names another command socket path or host.
/// The error bound is [`ChronyTracking::error_bound_ns`].
#[derive(Debug, Clone)]
pub struct ChronyStatus {
    chronyc: PathBuf,
    host: Option<String>,
    timeout: Duration,
}

impl Default for ChronyStatus {
    fn default() -> Self {
        Self::new()
    }
}

impl ChronyStatus {
    /// Asks the local chronyd, with `chronyc` from `PATH`, allowing 2 s per query.
    #[must_use]
    pub fn new() -> Self {
        Self {
            chronyc: find_program("chronyc"),
            host: None,
            timeout: Duration::from_secs(2),
        }
    }

    /// Asks the chronyd at `host` (`chronyc -h`): a command socket path such as
    /// `/run/chrony/chronyd.sock`, or a host name or address (with `cmdallow` there).
    #[must_use]
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Runs this `chronyc` instead of the one on `PATH`.
    #[must_use]
    pub fn with_program(mut self, chronyc: impl Into<PathBuf>) -> Self {
        self.chronyc = chronyc.into();
        self
    }

    /// Gives up on a query after `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The tracking report now.
    ///
    /// # Errors
    /// [`SourceError`]: chronyc missing, chronyd not answering, or output not understood.
    pub fn query(&self) -> Result<ChronyTracking, SourceError> {
        let mut args: Vec<&str> = Vec::with_capacity(5);
        if let Some(host) = &self.host {
            args.extend(["-h", host.as_str()]);
        }
        // -n: no DNS lookups; -c: CSV.
        args.extend(["-n", "-c", "tracking"]);
        let out = run(&self.chronyc, &args, self.timeout)?;
        Ok(parse_chronyc_tracking_csv(&out)?)
    }

    /// The tracking report now, as a [`ClockStatus`].
    ///
    /// # Errors
    /// As [`ChronyStatus::query`].
    pub fn try_read(&self) -> Result<ClockStatus, SourceError> {
        let tracking = self.query()?;
        Ok(tracking.to_status(realtime_ns()))
    }
}

impl ClockStatusSource for ChronyStatus {
    /// The status now; when chronyd cannot be read, an unsynchronised status whose detail
    /// says why.
    fn read(&mut self) -> ClockStatus {
        self.try_read().unwrap_or_else(|e| ClockStatus {
            at_ns: realtime_ns(),
            source: ClockSource::Chrony,
            synced: false,
            leap: Leap::Unsynchronised,
            detail: e.to_string(),
            ..ClockStatus::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SYNCED: &str = include_str!("../../probe/testdata/clock/chronyc-tracking-synced.csv");
    const LOCAL: &str =
        include_str!("../../probe/testdata/clock/chronyc-tracking-local-stratum8.csv");
    const UNSYNCED: &str =
        include_str!("../../probe/testdata/clock/chronyc-tracking-unsynchronised.csv");

    #[test]
    fn synced_client_of_a_loopback_server() {
        // Captured from a chronyd -x tracking a `local stratum 8` chronyd on 127.0.0.1.
        let t = parse_chronyc_tracking_csv(SYNCED).unwrap();
        assert_eq!(t.ref_id, 0x7F00_0001);
        assert_eq!(t.ref_name, "127.0.0.1");
        assert_eq!(t.stratum, 9);
        assert_eq!(t.ref_time_ns, 1_795_335_480_242_007_074);
        assert_eq!(t.system_time_offset_ns, -2_004);
        assert_eq!(
            t.offset_ns(),
            2_004,
            "chronyc said the clock is fast: ahead"
        );
        assert_eq!(t.last_offset_ns, 7);
        assert_eq!(t.rms_offset_ns, 29);
        assert!((t.frequency_ppm - -0.066).abs() < 1e-12);
        assert!((t.residual_freq_ppm - 0.008).abs() < 1e-12);
        assert!((t.skew_ppm - 0.511).abs() < 1e-12);
        assert_eq!(t.root_delay_ns, 6_488);
        assert_eq!(t.root_dispersion_ns, 1_670);
        assert_eq!(t.update_interval_ns, 0);
        assert_eq!(t.leap, ChronyLeap::Normal);
        assert!(t.synced());
        assert!(!t.is_local_reference());
        assert_eq!(t.error_bound_ns(), 2_004 + 1_670 + 3_244);

        let s = t.to_status(42);
        assert_eq!(s.at_ns, 42);
        assert_eq!(s.source, ClockSource::Chrony);
        assert!(s.synced);
        assert_eq!(s.leap, Leap::None);
        assert_eq!(s.offset_ns, 2_004);
        assert_eq!(s.error_bound_ns, 6_918);
        assert!(
            s.detail.contains("ref=7F000001 (127.0.0.1) stratum=9"),
            "{}",
            s.detail
        );
    }

    #[test]
    fn server_serving_its_own_clock() {
        let t = parse_chronyc_tracking_csv(LOCAL).unwrap();
        assert_eq!(t.ref_id, LOCAL_REF_ID);
        assert!(t.is_local_reference());
        assert_eq!(t.ref_name, "");
        assert_eq!(t.stratum, 8);
        assert!(t.synced());
        assert_eq!(t.error_bound_ns(), 0);
        assert!(t.to_status(0).detail.contains("(local clock)"));
    }

    #[test]
    fn unsynchronised_client() {
        // Captured from a chronyd -x whose only server does not answer.
        let t = parse_chronyc_tracking_csv(UNSYNCED).unwrap();
        assert_eq!(t.ref_id, 0);
        assert_eq!(t.stratum, 0);
        assert_eq!(t.leap, ChronyLeap::NotSynchronised);
        assert!(!t.synced());
        assert_eq!(t.root_delay_ns, 1_000_000_000);
        assert_eq!(t.root_dispersion_ns, 1_000_000_000);
        assert_eq!(t.error_bound_ns(), 1_500_000_000);
        let s = t.to_status(1);
        assert!(!s.synced);
        assert_eq!(s.leap, Leap::Unsynchronised);
    }

    #[test]
    fn stratum_16_or_no_reference_is_not_synced() {
        let line = |ref_id: &str, stratum: u8, leap: &str| {
            format!("{ref_id},x,{stratum},1.0,0.0,0.0,0.0,0.000,0.000,0.000,0.0,0.0,16.0,{leap}")
        };
        let t = parse_chronyc_tracking_csv(&line("0A000001", 16, "Normal")).unwrap();
        assert!(!t.synced());
        let t = parse_chronyc_tracking_csv(&line("00000000", 3, "Normal")).unwrap();
        assert!(!t.synced());
        let t = parse_chronyc_tracking_csv(&line("50484330", 1, "Insert second")).unwrap();
        assert!(t.synced(), "PHC0 refclock, stratum 1");
        assert_eq!(t.leap, ChronyLeap::InsertSecond);
        assert_eq!(t.to_status(0).leap, Leap::Insert);
        assert_eq!(t.update_interval_ns, 16_000_000_000);
        let t = parse_chronyc_tracking_csv(&line("50484330", 1, "Delete second")).unwrap();
        assert_eq!(t.to_status(0).leap, Leap::Delete);
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert_eq!(
            parse_chronyc_tracking_csv("\n  \n"),
            Err(ParseError::Empty { program: PROGRAM })
        );
        let e = parse_chronyc_tracking_csv("506 Cannot talk to daemon").unwrap_err();
        assert!(matches!(e, ParseError::FieldCount { found: 1, .. }), "{e}");
        let bad_offset = SYNCED.replace("-0.000002004", "-2.004e-6");
        let e = parse_chronyc_tracking_csv(&bad_offset).unwrap_err();
        assert!(
            matches!(&e, ParseError::Field { field: "System time", value, .. } if value == "-2.004e-6"),
            "{e}"
        );
        assert!(e.to_string().contains("System time"), "{e}");
        let e = parse_chronyc_tracking_csv(&SYNCED.replace("Normal", "Leaping")).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Field {
                    field: "Leap status",
                    ..
                }
            ),
            "{e}"
        );
        let e =
            parse_chronyc_tracking_csv(&SYNCED.replace("0.000006488", "-0.000006488")).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Field {
                    field: "Root delay",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_chronyc_tracking_csv(&SYNCED.replace("7F000001", "7F00001")).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Field {
                    field: "Reference ID",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_chronyc_reads_as_unsynchronised() {
        let mut s = ChronyStatus::new().with_program("/nonexistent/chronyc");
        assert!(matches!(s.query(), Err(SourceError::Spawn { .. })));
        let st = s.read();
        assert_eq!(st.source, ClockSource::Chrony);
        assert!(!st.synced);
        assert_eq!(st.leap, Leap::Unsynchronised);
        assert!(st.detail.contains("/nonexistent/chronyc"), "{}", st.detail);
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,200}") {
            let _ = parse_chronyc_tracking_csv(&s);
        }

        #[test]
        fn never_panics_on_near_misses(fields in proptest::collection::vec("[-+0-9A-Fa-f. ]{0,12}", 14)) {
            let _ = parse_chronyc_tracking_csv(&fields.join(","));
        }
    }
}
