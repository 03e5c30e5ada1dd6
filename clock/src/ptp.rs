//! ptp4l's view of the clock, read with `pmc` over ptp4l's Unix management socket, and
//! ptp4l's / phc2sys's offset log lines.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hoptrace_protocol::{ClockSource, ClockStatus, Leap};

use crate::command::{find_program, run};
use crate::{ClockStatusSource, ParseError, SourceError, parse_fixed, realtime_ns};

const PROGRAM: &str = "pmc";

/// The management requests [`PtpStatus`] sends, in one `pmc` run.
const REQUESTS: [&str; 4] = [
    "GET TIME_STATUS_NP",
    "GET PORT_DATA_SET",
    "GET CURRENT_DATA_SET",
    "GET TIME_PROPERTIES_DATA_SET",
];

/// One answer printed by `pmc`: a header line
/// (`<port identity> seq <n> RESPONSE MANAGEMENT <ID>`) and its `name value` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmcResponse {
    /// Port identity of the answering port (`72da0c.fffe.780cea-1`).
    pub port_identity: String,
    /// Sequence number of the request answered.
    pub sequence: u16,
    /// `RESPONSE` (or `ACKNOWLEDGE`).
    pub action: String,
    /// `MANAGEMENT`, or `MANAGEMENT_ERROR_STATUS` when ptp4l refused the request.
    pub kind: String,
    /// Management id (`TIME_STATUS_NP`); empty when pmc printed none.
    pub id: String,
    /// The fields in order, values as printed (a value may be empty).
    pub fields: Vec<(String, String)>,
}

impl PmcResponse {
    /// The value of field `name`.
    #[must_use]
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn is(&self, id: &str) -> bool {
        self.kind == "MANAGEMENT" && self.id == id
    }
}

/// Parses everything `pmc` printed into its answers, in order. `sending: ...` lines, and
/// pmc's own remarks (`sorry, ... not supported yet`), are skipped.
///
/// # Errors
/// [`ParseError::Line`] for a field line before any header, or a malformed header.
pub fn parse_pmc_responses(output: &str) -> Result<Vec<PmcResponse>, ParseError> {
    let mut answers: Vec<PmcResponse> = Vec::new();
    for raw in output.lines() {
        if raw.trim().is_empty() {
            continue;
        }
        if raw.starts_with("\t\t") {
            let Some(current) = answers.last_mut() else {
                return Err(ParseError::Line {
                    line: raw.to_owned(),
                });
            };
            let text = raw.trim();
            let (name, value) = text
                .split_once(char::is_whitespace)
                .map_or((text, ""), |(n, v)| (n, v.trim()));
            current.fields.push((name.to_owned(), value.to_owned()));
        } else if raw.starts_with('\t') {
            answers.push(parse_header(raw)?);
        }
        // Anything else is pmc talking about what it sends.
    }
    Ok(answers)
}

fn parse_header(raw: &str) -> Result<PmcResponse, ParseError> {
    let t: Vec<&str> = raw.split_whitespace().collect();
    let bad = || ParseError::Line {
        line: raw.to_owned(),
    };
    if t.len() < 5 || t[1] != "seq" {
        return Err(bad());
    }
    Ok(PmcResponse {
        port_identity: t[0].to_owned(),
        sequence: t[2].parse().map_err(|_| bad())?,
        action: t[3].to_owned(),
        kind: t[4].to_owned(),
        id: t.get(5).map_or_else(String::new, |s| (*s).to_owned()),
        fields: Vec::new(),
    })
}

/// The `TIME_STATUS_NP` answer: linuxptp's own summary of the slave's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeStatusNp {
    /// Offset of this clock from the grandmaster, ns (positive: this clock is ahead).
    /// With hardware timestamping this is the NIC's PTP hardware clock, not the system
    /// clock (phc2sys carries it over); 0 on the grandmaster.
    pub master_offset_ns: i64,
    /// When the last Sync message arrived, ns, in the timescale of the timestamping clock
    /// (the PHC, often TAI, with hardware timestamping; CLOCK_REALTIME with software); 0
    /// when none has arrived.
    pub ingress_time_ns: i64,
    /// Whether a grandmaster other than this clock is known.
    pub gm_present: bool,
    /// The grandmaster's clock identity (this clock's own when it is the grandmaster).
    pub gm_identity: String,
}

/// One port's `PORT_DATA_SET` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortDataSet {
    /// The port's identity.
    pub port_identity: String,
    /// Its state.
    pub port_state: PortState,
    /// Mean one-way delay to the peer, ns, measured by the peer-delay mechanism (0 with
    /// end-to-end delay requests).
    pub peer_mean_path_delay_ns: i64,
    /// 1: end-to-end (delay requests), 2: peer-to-peer.
    pub delay_mechanism: u8,
    /// Sync interval, log2 seconds (`-3`: 8 per second).
    pub log_sync_interval: i8,
}

/// The `CURRENT_DATA_SET` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentDataSet {
    /// Boundary clocks between this clock and the grandmaster, plus one.
    pub steps_removed: u16,
    /// Offset from the master, ns (as `TIME_STATUS_NP`'s `master_offset`).
    pub offset_from_master_ns: i64,
    /// Mean one-way path delay to the master, ns: half the measured round trip.
    pub mean_path_delay_ns: i64,
}

/// The `TIME_PROPERTIES_DATA_SET` answer: what the grandmaster says about its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimePropertiesDataSet {
    /// TAI - UTC announced, seconds.
    pub current_utc_offset_s: i16,
    /// Whether `current_utc_offset_s` is valid.
    pub current_utc_offset_valid: bool,
    /// The last minute of the day will have 61 seconds.
    pub leap61: bool,
    /// The last minute of the day will have 59 seconds.
    pub leap59: bool,
    /// The grandmaster's timescale is PTP (TAI) rather than arbitrary.
    pub ptp_timescale: bool,
    /// The grandmaster's time is traceable to a primary reference.
    pub time_traceable: bool,
    /// The grandmaster's time source (0x20 GNSS, 0x40 PTP, 0x50 NTP, 0xa0 internal
    /// oscillator).
    pub time_source: u8,
}

/// A PTP port state (IEEE 1588).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Starting up.
    Initializing,
    /// Failed.
    Faulty,
    /// Disabled.
    Disabled,
    /// Waiting for announce messages.
    Listening,
    /// About to become master.
    PreMaster,
    /// Serving time.
    Master,
    /// Another port serves this segment.
    Passive,
    /// A master was chosen; the servo has not locked yet (or, with `free_running 1`,
    /// never will: the clock is measured, not adjusted).
    Uncalibrated,
    /// Following the master, servo locked.
    Slave,
    /// linuxptp's grandmaster state (`GRAND_MASTER`).
    GrandMaster,
}

impl PortState {
    /// As pmc prints it (`SLAVE`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initializing => "INITIALIZING",
            Self::Faulty => "FAULTY",
            Self::Disabled => "DISABLED",
            Self::Listening => "LISTENING",
            Self::PreMaster => "PRE_MASTER",
            Self::Master => "MASTER",
            Self::Passive => "PASSIVE",
            Self::Uncalibrated => "UNCALIBRATED",
            Self::Slave => "SLAVE",
            Self::GrandMaster => "GRAND_MASTER",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Initializing,
            Self::Faulty,
            Self::Disabled,
            Self::Listening,
            Self::PreMaster,
            Self::Master,
            Self::Passive,
            Self::Uncalibrated,
            Self::Slave,
            Self::GrandMaster,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

/// What [`PtpStatus`] learns from ptp4l in one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtpReading {
    /// `TIME_STATUS_NP`.
    pub time_status: TimeStatusNp,
    /// `PORT_DATA_SET` of every port that answered.
    pub ports: Vec<PortDataSet>,
    /// `CURRENT_DATA_SET`, when answered.
    pub current: Option<CurrentDataSet>,
    /// `TIME_PROPERTIES_DATA_SET`, when answered.
    pub time_properties: Option<TimePropertiesDataSet>,
}

impl PtpReading {
    /// Mean one-way path delay to the master, ns: `CURRENT_DATA_SET`'s `meanPathDelay`,
    /// else the slave port's `peerMeanPathDelay`; `None` when neither is known (non-zero).
    #[must_use]
    pub fn mean_path_delay_ns(&self) -> Option<i64> {
        self.current
            .as_ref()
            .map(|c| c.mean_path_delay_ns)
            .filter(|d| *d != 0)
            .or_else(|| {
                self.ports
                    .iter()
                    .filter(|p| p.port_state == PortState::Slave)
                    .map(|p| p.peer_mean_path_delay_ns)
                    .find(|d| *d != 0)
            })
    }

    /// Bound on the error of this clock against the grandmaster, ns:
    /// `|master_offset| + mean path delay` (only `|master_offset|` when the delay is
    /// unknown).
    ///
    /// The choice mirrors chrony's `root delay / 2`: PTP computes the offset assuming the
    /// path is symmetric, and an asymmetric path shifts it by at most the one-way delay
    /// (all of the round trip one way, none the other). linuxptp's `meanPathDelay` is
    /// already half the round trip, so it is added whole. Two things the bound does not
    /// cover: the grandmaster's own error, and, with hardware timestamping, the step from
    /// the NIC's clock to the system clock that phc2sys makes (typically tens of ns; see
    /// `phc2sys -m`'s `offset` lines).
    #[must_use]
    pub fn error_bound_ns(&self) -> u64 {
        self.time_status
            .master_offset_ns
            .unsigned_abs()
            .saturating_add(self.mean_path_delay_ns().map_or(0, i64::unsigned_abs))
    }

    /// The state of the port following the master: the first port in `SLAVE` or
    /// `UNCALIBRATED`, else the first port.
    #[must_use]
    pub fn port_state(&self) -> Option<PortState> {
        self.ports
            .iter()
            .map(|p| p.port_state)
            .find(|s| matches!(s, PortState::Slave | PortState::Uncalibrated))
            .or_else(|| self.ports.first().map(|p| p.port_state))
    }

    /// Whether the clock follows a grandmaster with a locked servo: `gmPresent` and a port
    /// in state `SLAVE` (when the port states are unknown, `gmPresent` alone).
    ///
    /// A grandmaster host is not synchronised by PTP (`gmPresent` is false there): its
    /// time comes from elsewhere, which a chrony or GNSS status must vouch for. A slave
    /// with `free_running 1` stays `UNCALIBRATED`: it measures without adjusting, so it is
    /// not synchronised either, though its offset and bound are real measurements.
    #[must_use]
    pub fn synced(&self) -> bool {
        self.time_status.gm_present
            && (self.ports.is_empty()
                || self.ports.iter().any(|p| p.port_state == PortState::Slave))
    }

    /// The reading as a [`ClockStatus`] taken at `at_ns`.
    #[must_use]
    pub fn to_status(&self, at_ns: i64) -> ClockStatus {
        let synced = self.synced();
        let leap = match &self.time_properties {
            _ if !synced => Leap::Unsynchronised,
            Some(tp) if tp.leap61 => Leap::Insert,
            Some(tp) if tp.leap59 => Leap::Delete,
            _ => Leap::None,
        };
        let ts = &self.time_status;
        let mut detail = format!(
            "gm={} gm_present={} port={} master_offset_ns={}",
            ts.gm_identity,
            ts.gm_present,
            self.port_state().map_or("unknown", PortState::as_str),
            ts.master_offset_ns,
        );
        match self.mean_path_delay_ns() {
            Some(d) => detail.push_str(&format!(" mean_path_delay_ns={d}")),
            None => detail.push_str(" mean_path_delay_ns=unknown"),
        }
        if let Some(c) = &self.current {
            detail.push_str(&format!(" steps_removed={}", c.steps_removed));
        }
        if let Some(tp) = &self.time_properties {
            detail.push_str(&format!(
                " time_source={:#04x} traceable={}",
                tp.time_source, tp.time_traceable
            ));
        }
        if !ts.gm_present && self.port_state() == Some(PortState::Master) {
            detail.push_str(" (this host is the grandmaster)");
        }
        ClockStatus {
            at_ns,
            source: ClockSource::Ptp,
            synced,
            leap,
            offset_ns: ts.master_offset_ns,
            error_bound_ns: self.error_bound_ns(),
            detail,
        }
    }
}

/// Parses the output of `pmc` asked for `TIME_STATUS_NP` and, optionally,
/// `PORT_DATA_SET`, `CURRENT_DATA_SET` and `TIME_PROPERTIES_DATA_SET`.
///
/// ```
/// use hoptrace_clock::parse_pmc_reading;
///
/// let out = "sending: GET TIME_STATUS_NP
/// \t72da0c.fffe.780cea-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP
/// \t\tmaster_offset              -105
/// \t\tingress_time               1795335739143625239
/// \t\tgmPresent                  true
/// \t\tgmIdentity                 02c9c1.fffe.736ac7
/// ";
/// let r = parse_pmc_reading(out)?;
/// assert_eq!(r.time_status.master_offset_ns, -105);
/// assert!(r.synced()); // port states not asked: gmPresent decides
/// # Ok::<(), hoptrace_clock::ParseError>(())
/// ```
///
/// # Errors
/// [`ParseError::NoAnswer`] when there is no `TIME_STATUS_NP` answer (ptp4l is not
/// there, or uses another domain); other [`ParseError`]s name the malformed field.
pub fn parse_pmc_reading(output: &str) -> Result<PtpReading, ParseError> {
    let answers = parse_pmc_responses(output)?;
    let ts = answers
        .iter()
        .find(|a| a.is("TIME_STATUS_NP"))
        .ok_or(ParseError::NoAnswer {
            answer: "TIME_STATUS_NP",
        })?;
    let time_status = TimeStatusNp {
        master_offset_ns: int(ts, "TIME_STATUS_NP", "master_offset")?,
        ingress_time_ns: int(ts, "TIME_STATUS_NP", "ingress_time")?,
        gm_present: boolean(ts, "TIME_STATUS_NP", "gmPresent")?,
        gm_identity: text(ts, "TIME_STATUS_NP", "gmIdentity")?.to_owned(),
    };
    let mut ports = Vec::new();
    for a in answers.iter().filter(|a| a.is("PORT_DATA_SET")) {
        const ID: &str = "PORT_DATA_SET";
        let state = text(a, ID, "portState")?;
        ports.push(PortDataSet {
            port_identity: text(a, ID, "portIdentity")?.to_owned(),
            port_state: PortState::parse(state).ok_or_else(|| ParseError::Field {
                program: PROGRAM,
                field: "portState",
                value: state.to_owned(),
                expected: "a port state such as SLAVE",
            })?,
            peer_mean_path_delay_ns: int(a, ID, "peerMeanPathDelay")?,
            delay_mechanism: small(a, ID, "delayMechanism")?,
            log_sync_interval: small(a, ID, "logSyncInterval")?,
        });
    }
    let current = answers
        .iter()
        .find(|a| a.is("CURRENT_DATA_SET"))
        .map(|a| {
            const ID: &str = "CURRENT_DATA_SET";
            Ok::<_, ParseError>(CurrentDataSet {
                steps_removed: small(a, ID, "stepsRemoved")?,
                offset_from_master_ns: fixed_ns(a, ID, "offsetFromMaster")?,
                mean_path_delay_ns: fixed_ns(a, ID, "meanPathDelay")?,
            })
        })
        .transpose()?;
    let time_properties = answers
        .iter()
        .find(|a| a.is("TIME_PROPERTIES_DATA_SET"))
        .map(|a| {
            const ID: &str = "TIME_PROPERTIES_DATA_SET";
            let source = text(a, ID, "timeSource")?;
            Ok::<_, ParseError>(TimePropertiesDataSet {
                current_utc_offset_s: small(a, ID, "currentUtcOffset")?,
                current_utc_offset_valid: flag(a, ID, "currentUtcOffsetValid")?,
                leap61: flag(a, ID, "leap61")?,
                leap59: flag(a, ID, "leap59")?,
                ptp_timescale: flag(a, ID, "ptpTimescale")?,
                time_traceable: flag(a, ID, "timeTraceable")?,
                time_source: source
                    .strip_prefix("0x")
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| ParseError::Field {
                        program: PROGRAM,
                        field: "timeSource",
                        value: source.to_owned(),
                        expected: "a hex byte such as 0xa0",
                    })?,
            })
        })
        .transpose()?;
    Ok(PtpReading {
        time_status,
        ports,
        current,
        time_properties,
    })
}

fn text<'a>(
    a: &'a PmcResponse,
    answer: &'static str,
    field: &'static str,
) -> Result<&'a str, ParseError> {
    a.field(field).ok_or(ParseError::MissingField {
        program: PROGRAM,
        answer,
        field,
    })
}

fn bad(field: &'static str, value: &str, expected: &'static str) -> ParseError {
    ParseError::Field {
        program: PROGRAM,
        field,
        value: value.to_owned(),
        expected,
    }
}

fn int(a: &PmcResponse, answer: &'static str, field: &'static str) -> Result<i64, ParseError> {
    let v = text(a, answer, field)?;
    v.parse().map_err(|_| bad(field, v, "an integer"))
}

fn small<T: std::str::FromStr>(
    a: &PmcResponse,
    answer: &'static str,
    field: &'static str,
) -> Result<T, ParseError> {
    let v = text(a, answer, field)?;
    v.parse().map_err(|_| bad(field, v, "a small integer"))
}

fn fixed_ns(a: &PmcResponse, answer: &'static str, field: &'static str) -> Result<i64, ParseError> {
    let v = text(a, answer, field)?;
    parse_fixed(v, 0).ok_or_else(|| bad(field, v, "nanoseconds, e.g. 2899.0"))
}

fn boolean(a: &PmcResponse, answer: &'static str, field: &'static str) -> Result<bool, ParseError> {
    match text(a, answer, field)? {
        "true" => Ok(true),
        "false" => Ok(false),
        v => Err(bad(field, v, "true or false")),
    }
}

fn flag(a: &PmcResponse, answer: &'static str, field: &'static str) -> Result<bool, ParseError> {
    match text(a, answer, field)? {
        "1" => Ok(true),
        "0" => Ok(false),
        v => Err(bad(field, v, "0 or 1")),
    }
}

/// One offset line of ptp4l or phc2sys, e.g.
/// `ptp4l[17642.069]: master offset        -98 s0 freq    +579 path delay      2645` or
/// `phc2sys[...]: CLOCK_REALTIME phc offset   -24 s2 freq  +1234 delay    567`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ptp4lOffsetLine {
    /// What was measured: the words before `offset` after the program's prefix
    /// (`master`, or `CLOCK_REALTIME phc` for phc2sys).
    pub what: String,
    /// Offset, ns (ptp4l: this clock minus the master; positive: ahead).
    pub offset_ns: i64,
    /// Servo state: 0 unlocked (always, with `free_running 1`), 1 clock stepped,
    /// 2 locked, 3 locked and stable.
    pub servo_state: u8,
    /// Frequency adjustment, ppb (with `free_running 1`: the measured frequency
    /// difference, nothing applied).
    pub freq_ppb: f64,
    /// Path delay (ptp4l) or reading delay (phc2sys), ns, when printed.
    pub delay_ns: Option<i64>,
}

/// Parses one log line of ptp4l or phc2sys when it reports an offset
/// (`... offset <ns> s<state> freq <ppb> [path] delay <ns>`); `None` for any other line
/// (state changes, summary statistics, or a malformed offset line).
#[must_use]
pub fn parse_ptp4l_offset_line(line: &str) -> Option<Ptp4lOffsetLine> {
    // Drop a "ptp4l[17642.069]: " or "phc2sys[...]: " prefix.
    let body = match line.find("]: ") {
        Some(i) => &line[i + 3..],
        None => line,
    };
    let tokens: Vec<&str> = body.split_whitespace().collect();
    let at = tokens.iter().position(|t| *t == "offset")?;
    let what = tokens[..at].join(" ");
    let rest = &tokens[at + 1..];
    let offset_ns = rest.first()?.parse().ok()?;
    let servo_state = rest.get(1)?.strip_prefix('s')?.parse().ok()?;
    if *rest.get(2)? != "freq" {
        return None;
    }
    let freq_ppb = rest.get(3)?.parse::<f64>().ok().filter(|f| f.is_finite())?;
    let delay_ns = rest
        .iter()
        .position(|t| *t == "delay")
        .and_then(|i| rest.get(i + 1))
        .and_then(|d| d.parse().ok());
    Some(Ptp4lOffsetLine {
        what,
        offset_ns,
        servo_state,
        freq_ppb,
        delay_ns,
    })
}

/// ptp4l's view of this host's clock, read by running
/// `pmc -u -b 0 -d <domain> -s <socket> 'GET TIME_STATUS_NP' 'GET PORT_DATA_SET'
/// 'GET CURRENT_DATA_SET' 'GET TIME_PROPERTIES_DATA_SET'`.
///
/// Synchronised and error bound as [`PtpReading::synced`] and
/// [`PtpReading::error_bound_ns`] describe. With hardware timestamping the figures are
/// those of the NIC's PTP hardware clock, which phc2sys copies to the system clock.
#[derive(Debug, Clone)]
pub struct PtpStatus {
    pmc: PathBuf,
    socket: PathBuf,
    domain: u8,
    timeout: Duration,
}

impl Default for PtpStatus {
    fn default() -> Self {
        Self::new()
    }
}

impl PtpStatus {
    /// Asks the ptp4l on `/var/run/ptp4l` (ptp4l's default `uds_address`), domain 0,
    /// allowing 2 s per query.
    #[must_use]
    pub fn new() -> Self {
        Self {
            pmc: find_program("pmc"),
            socket: PathBuf::from("/var/run/ptp4l"),
            domain: 0,
            timeout: Duration::from_secs(2),
        }
    }

    /// Asks the ptp4l whose `uds_address` is `socket`.
    #[must_use]
    pub fn with_socket(mut self, socket: impl Into<PathBuf>) -> Self {
        self.socket = socket.into();
        self
    }

    /// Asks in PTP domain `domain` (ptp4l's `domainNumber`).
    #[must_use]
    pub fn with_domain(mut self, domain: u8) -> Self {
        self.domain = domain;
        self
    }

    /// Runs this `pmc` instead of the one found on `PATH` or in `/usr/sbin`.
    #[must_use]
    pub fn with_program(mut self, pmc: impl Into<PathBuf>) -> Self {
        self.pmc = pmc.into();
        self
    }

    /// Gives up on a query after `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What ptp4l reports now.
    ///
    /// pmc's own client socket goes to the temporary directory (not `/var/run`), so a
    /// user allowed on ptp4l's socket needs no other rights.
    ///
    /// # Errors
    /// [`SourceError`]: pmc missing or failing, or [`ParseError::NoAnswer`] when nothing
    /// answers on the socket in that domain.
    pub fn query(&self) -> Result<PtpReading, SourceError> {
        static QUERIES: AtomicU32 = AtomicU32::new(0);
        let client = std::env::temp_dir().join(format!(
            "hoptrace-pmc.{}.{}",
            std::process::id(),
            QUERIES.fetch_add(1, Ordering::Relaxed)
        ));
        let mut args: Vec<std::ffi::OsString> = vec![
            "-u".into(),
            "-b".into(),
            "0".into(),
            "-d".into(),
            self.domain.to_string().into(),
            "-s".into(),
            self.socket.clone().into_os_string(),
            "-i".into(),
            client.clone().into_os_string(),
        ];
        args.extend(REQUESTS.iter().map(Into::into));
        let out = run(&self.pmc, &args, self.timeout);
        // pmc removes its socket on exit; not when killed on a timeout.
        let _ = std::fs::remove_file(&client);
        Ok(parse_pmc_reading(&out?)?)
    }

    /// What ptp4l reports now, as a [`ClockStatus`].
    ///
    /// # Errors
    /// As [`PtpStatus::query`].
    pub fn try_read(&self) -> Result<ClockStatus, SourceError> {
        let reading = self.query()?;
        let mut status = reading.to_status(realtime_ns());
        status.detail.push_str(&format!(
            " uds={} domain={}",
            self.socket.display(),
            self.domain
        ));
        Ok(status)
    }
}

impl ClockStatusSource for PtpStatus {
    /// The status now; when ptp4l cannot be read, an unsynchronised status whose detail
    /// says why.
    fn read(&mut self) -> ClockStatus {
        self.try_read().unwrap_or_else(|e| ClockStatus {
            at_ns: realtime_ns(),
            source: ClockSource::Ptp,
            synced: false,
            leap: Leap::Unsynchronised,
            detail: format!("{e} (uds={} domain={})", self.socket.display(), self.domain),
            ..ClockStatus::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SLAVE: &str = include_str!("../../probe/testdata/clock/pmc-slave-free-running.txt");
    const GM: &str = include_str!("../../probe/testdata/clock/pmc-grandmaster.txt");
    const NO_ANSWER: &str = include_str!("../../probe/testdata/clock/pmc-no-answer.txt");
    const LOG: &str = include_str!("../../probe/testdata/clock/ptp4l-slave-free-running.log");

    #[test]
    fn free_running_slave() {
        // Captured from a ptp4l slave (software timestamps, free_running 1) in one network
        // namespace following a ptp4l grandmaster in another over a veth pair.
        let r = parse_pmc_reading(SLAVE).unwrap();
        assert_eq!(
            r.time_status,
            TimeStatusNp {
                master_offset_ns: -105,
                ingress_time_ns: 1_795_335_739_143_625_239,
                gm_present: true,
                gm_identity: "02c9c1.fffe.736ac7".into(),
            }
        );
        assert_eq!(
            r.ports,
            vec![PortDataSet {
                port_identity: "72da0c.fffe.780cea-1".into(),
                port_state: PortState::Uncalibrated,
                peer_mean_path_delay_ns: 0,
                delay_mechanism: 1,
                log_sync_interval: -3,
            }]
        );
        assert_eq!(
            r.current,
            Some(CurrentDataSet {
                steps_removed: 1,
                offset_from_master_ns: -105,
                mean_path_delay_ns: 2899,
            })
        );
        let tp = r.time_properties.clone().unwrap();
        assert_eq!(tp.current_utc_offset_s, 37);
        assert!(!tp.leap61 && !tp.leap59 && !tp.ptp_timescale && !tp.current_utc_offset_valid);
        assert_eq!(tp.time_source, 0xa0);
        assert_eq!(r.mean_path_delay_ns(), Some(2899));
        assert_eq!(r.error_bound_ns(), 105 + 2899);
        assert_eq!(r.port_state(), Some(PortState::Uncalibrated));
        assert!(!r.synced(), "free_running: measured, never locked");

        let s = r.to_status(7);
        assert_eq!(s.source, ClockSource::Ptp);
        assert!(!s.synced);
        assert_eq!(s.leap, Leap::Unsynchronised);
        assert_eq!(s.offset_ns, -105);
        assert_eq!(s.error_bound_ns, 3004);
        assert!(s.detail.contains("gm=02c9c1.fffe.736ac7"), "{}", s.detail);
        assert!(s.detail.contains("port=UNCALIBRATED"), "{}", s.detail);
    }

    #[test]
    fn locked_slave_is_synced() {
        let locked = SLAVE
            .replace("UNCALIBRATED", "SLAVE")
            .replace("leap61                0", "leap61                1");
        let r = parse_pmc_reading(&locked).unwrap();
        assert!(r.synced());
        let s = r.to_status(0);
        assert!(s.synced);
        assert_eq!(s.leap, Leap::Insert);
    }

    #[test]
    fn grandmaster() {
        let r = parse_pmc_reading(GM).unwrap();
        assert!(!r.time_status.gm_present);
        assert_eq!(r.time_status.master_offset_ns, 0);
        assert_eq!(r.port_state(), Some(PortState::Master));
        assert_eq!(r.mean_path_delay_ns(), None);
        assert!(!r.synced());
        let s = r.to_status(0);
        assert!(
            s.detail.contains("this host is the grandmaster"),
            "{}",
            s.detail
        );
        assert!(
            s.detail.contains("mean_path_delay_ns=unknown"),
            "{}",
            s.detail
        );
    }

    #[test]
    fn no_answer() {
        assert_eq!(parse_pmc_responses(NO_ANSWER).unwrap(), vec![]);
        assert_eq!(
            parse_pmc_reading(NO_ANSWER),
            Err(ParseError::NoAnswer {
                answer: "TIME_STATUS_NP"
            })
        );
    }

    #[test]
    fn generic_answers_and_errors() {
        let out = "sending: GET USER_DESCRIPTION\n\
                   sorry, FAULT_LOG not supported yet\n\
                   \tae3c0a.fffe.21fc28-0 seq 0 RESPONSE MANAGEMENT USER_DESCRIPTION \n\
                   \t\tuserDescription  \n\
                   \tae3c0a.fffe.21fc28-1 seq 1 RESPONSE MANAGEMENT_ERROR_STATUS \n";
        let a = parse_pmc_responses(out).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].id, "USER_DESCRIPTION");
        assert_eq!(a[0].field("userDescription"), Some(""));
        assert_eq!(a[1].kind, "MANAGEMENT_ERROR_STATUS");
        assert_eq!(a[1].id, "");

        let e = parse_pmc_responses("\t\tmaster_offset 5\n").unwrap_err();
        assert!(matches!(e, ParseError::Line { .. }), "{e}");
        let e = parse_pmc_responses("\tnot a header\n").unwrap_err();
        assert!(matches!(e, ParseError::Line { .. }), "{e}");
    }

    #[test]
    fn malformed_fields_are_named() {
        let e =
            parse_pmc_reading(&SLAVE.replace("gmPresent                  true", "gmPresent maybe"))
                .unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Field {
                    field: "gmPresent",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_pmc_reading(&SLAVE.replace("master_offset ", "masterOffset ")).unwrap_err();
        assert_eq!(
            e,
            ParseError::MissingField {
                program: PROGRAM,
                answer: "TIME_STATUS_NP",
                field: "master_offset"
            }
        );
        assert!(e.to_string().contains("master_offset"));
        let e = parse_pmc_reading(&SLAVE.replace("UNCALIBRATED", "CONFUSED")).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Field {
                    field: "portState",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_pmc_reading(&SLAVE.replace("2899.0", "2.9us")).unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Field {
                    field: "meanPathDelay",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn log_lines() {
        let offsets: Vec<Ptp4lOffsetLine> =
            LOG.lines().filter_map(parse_ptp4l_offset_line).collect();
        assert_eq!(offsets.len(), 6, "six offset lines among the state changes");
        assert_eq!(
            offsets[0],
            Ptp4lOffsetLine {
                what: "master".into(),
                offset_ns: -98,
                servo_state: 0,
                freq_ppb: 579.0,
                delay_ns: Some(2645),
            }
        );
        assert_eq!(offsets[5].offset_ns, 606);
        assert!((offsets[5].freq_ppb - 1043.0).abs() < 1e-9);

        let phc = parse_ptp4l_offset_line(
            "phc2sys[1234.567]: CLOCK_REALTIME phc offset       -24 s2 freq   +1234 delay    567",
        )
        .unwrap();
        assert_eq!(phc.what, "CLOCK_REALTIME phc");
        assert_eq!(
            (phc.offset_ns, phc.servo_state, phc.delay_ns),
            (-24, 2, Some(567))
        );

        for other in [
            "ptp4l[17641.061]: port 1: LISTENING to UNCALIBRATED on RS_SLAVE",
            "ptp4l[1.0]: rms   12 max   30 freq   +512 +/-  40 delay  2600 +/-  20",
            "ptp4l[1.0]: master offset lots s0 freq +1",
            "",
        ] {
            assert_eq!(parse_ptp4l_offset_line(other), None, "{other:?}");
        }
    }

    #[test]
    fn missing_pmc_reads_as_unsynchronised() {
        let mut p = PtpStatus::new().with_program("/nonexistent/pmc");
        assert!(matches!(p.query(), Err(SourceError::Spawn { .. })));
        let s = p.read();
        assert_eq!(s.source, ClockSource::Ptp);
        assert!(!s.synced);
        assert!(s.detail.contains("uds=/var/run/ptp4l"), "{}", s.detail);
    }

    proptest! {
        #[test]
        fn never_panics(s in "[\\t a-zA-Z0-9_.:+-]{0,40}(\\n[\\t a-zA-Z0-9_.:+-]{0,40}){0,8}") {
            let _ = parse_pmc_reading(&s);
            for line in s.lines() {
                let _ = parse_ptp4l_offset_line(line);
            }
        }

        #[test]
        fn never_panics_on_anything(s in "\\PC{0,200}") {
            let _ = parse_pmc_reading(&s);
            let _ = parse_ptp4l_offset_line(&s);
        }
    }
}
