//! The options of `hoptrace clock`, its readings of this host's clock status (text and
//! JSON), and the preflight's verdict that every command starting a part of a run shares.
//!
//! Reads what keeps the clock on time (chronyd, ptp4l through pmc, or the kernel): the
//! source, whether it is synchronised, the offset, the error bound, the leap state and
//! the source's detail. With `--max-clock-error` it is a preflight: the command fails
//! when the clock is unsynchronised or the bound exceeds the threshold (a warning with
//! `--force-clock`).

use std::path::PathBuf;

use anyhow::Context as _;
use hoptrace_clock::{
    ChronyStatus, ClockStatus, ClockStatusSource, KernelClockStatus, Leap, PreflightError,
    PtpStatus,
};
use hoptrace_format::units;
use serde::Serialize;

/// Where `hoptrace clock` reads the clock status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// chronyd if chronyc answers, else ptp4l if pmc answers, else the kernel.
    Auto,
    /// chronyd's tracking report (`chronyc -c tracking`).
    Chrony,
    /// ptp4l's state through its management socket (`pmc -u`).
    Ptp,
    /// adjtimex: the kernel's NTP state; its bound is the kernel's maxerror.
    Kernel,
}

/// Options of `hoptrace clock`.
#[derive(Debug, clap::Args)]
pub struct ClockArgs {
    /// Where to read the status: auto (chrony, else ptp4l, else the kernel), chrony, ptp,
    /// kernel.
    #[arg(long, value_enum, default_value_t = Source::Auto)]
    pub source: Source,
    /// Print JSON (one object per line) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Preflight: fail when the clock is unsynchronised or its error bound exceeds this
    /// (e.g. 100us, 1ms), as the commands that start a run do with the same option.
    #[arg(long = "max-clock-error", alias = "max-error", value_name = "DURATION", value_parser = units::parse_duration_ns)]
    pub max_error: Option<u64>,
    /// With --max-clock-error: only warn when the preflight fails (as elsewhere).
    #[arg(long = "force-clock", alias = "force", requires = "max_error")]
    pub force: bool,
    /// Read again every DURATION (e.g. 1s), one line per reading, until interrupted.
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration_ns)]
    pub watch: Option<u64>,
    /// With --watch: stop after this many readings.
    #[arg(long, requires = "watch")]
    pub count: Option<u64>,
    /// chronyd's command socket or host (chronyc -h); default: the local chronyd.
    #[arg(long, value_name = "SOCKET|HOST")]
    pub chrony_host: Option<String>,
    /// ptp4l's management socket (its uds_address).
    #[arg(long, value_name = "PATH", default_value = "/var/run/ptp4l")]
    pub ptp_socket: PathBuf,
    /// PTP domain (ptp4l's domainNumber).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub ptp_domain: u8,
}

/// What reads the status: an explicit daemon reports its errors, auto-detection does not.
#[allow(missing_debug_implementations)]
pub enum Reader {
    /// chronyd, chosen with `--source chrony`.
    Chrony(ChronyStatus),
    /// ptp4l, chosen with `--source ptp`.
    Ptp(PtpStatus),
    /// Auto-detected, or the kernel.
    Other(Box<dyn ClockStatusSource>),
}

impl Reader {
    pub fn new(args: &ClockArgs) -> Self {
        let mut chrony = ChronyStatus::new();
        if let Some(host) = &args.chrony_host {
            chrony = chrony.with_host(host.clone());
        }
        let ptp = PtpStatus::new()
            .with_socket(args.ptp_socket.clone())
            .with_domain(args.ptp_domain);
        match args.source {
            Source::Auto => Self::Other(hoptrace_clock::auto_detect_with(chrony, ptp)),
            Source::Chrony => Self::Chrony(chrony),
            Source::Ptp => Self::Ptp(ptp),
            Source::Kernel => Self::Other(Box::new(KernelClockStatus)),
        }
    }

    /// One reading. An explicitly chosen daemon that cannot be read is an error on the
    /// first reading; later (with --watch) it reads as unsynchronised, with the reason.
    pub fn read(&mut self, first: bool) -> anyhow::Result<ClockStatus> {
        match self {
            Self::Chrony(c) if first => c
                .try_read()
                .context("cannot read chronyd's tracking (chronyc -c tracking); is chronyd running? (--chrony-host for another socket)"),
            Self::Ptp(p) if first => p
                .try_read()
                .context("cannot read ptp4l's status (pmc -u); is ptp4l running? (--ptp-socket, --ptp-domain)"),
            Self::Chrony(c) => Ok(c.read()),
            Self::Ptp(p) => Ok(p.read()),
            Self::Other(s) => Ok(s.read()),
        }
    }
}

/// One reading of this host's clock as `hoptrace clock` shows it, with the preflight's
/// verdict when a threshold was given. Its JSON form is one line of `--json`.
#[derive(Debug, Serialize)]
pub struct Reading {
    /// Host name.
    pub host: String,
    /// When it was read, Unix epoch ns.
    pub at_ns: i64,
    /// chrony, ptp, kernel.
    pub source: &'static str,
    /// Synchronised.
    pub synced: bool,
    /// Leap second state.
    pub leap: &'static str,
    /// Offset from the reference, ns (positive: this clock ahead).
    pub offset_ns: i64,
    /// Error bound, ns.
    pub error_bound_ns: u64,
    /// The source's detail.
    pub detail: String,
    /// The preflight, with `--max-clock-error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightVerdict>,
    #[serde(skip)]
    check: Option<Result<(), PreflightError>>,
}

/// The preflight of one reading.
#[derive(Debug, Serialize)]
pub struct PreflightVerdict {
    /// The threshold, ns.
    pub max_error_bound_ns: u64,
    /// The clock passed.
    pub ok: bool,
    /// Why it did not.
    pub error: Option<String>,
}

impl Reading {
    /// The reading of `status` on `host`, checked against `max` (ns) when given.
    #[must_use]
    pub fn new(host: &str, status: &ClockStatus, max: Option<u64>) -> Self {
        let check = max.map(|max| hoptrace_clock::preflight_host(host, status, max));
        Self {
            host: host.to_owned(),
            at_ns: status.at_ns,
            source: status.source.name(),
            synced: status.synced,
            leap: leap_name(status.leap),
            offset_ns: status.offset_ns,
            error_bound_ns: status.error_bound_ns,
            detail: status.detail.clone(),
            preflight: max.zip(check.as_ref()).map(|(max, c)| PreflightVerdict {
                max_error_bound_ns: max,
                ok: c.is_ok(),
                error: c.as_ref().err().map(ToString::to_string),
            }),
            check,
        }
    }

    /// The preflight's error, when it failed.
    #[must_use]
    pub fn failure(&self) -> Option<&PreflightError> {
        self.check.as_ref().and_then(|c| c.as_ref().err())
    }

    /// The preflight's result, taken for [`conclude`].
    #[must_use]
    pub fn into_check(self) -> Option<Result<(), PreflightError>> {
        self.check
    }

    /// One line of JSON.
    #[must_use]
    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("a clock reading serialises")
    }

    /// The reading as a table, one line per field.
    #[must_use]
    pub fn table(&self) -> Vec<String> {
        let mut lines = vec![
            format!("host         {}", self.host),
            format!("source       {}", self.source),
            format!("synced       {}", if self.synced { "yes" } else { "no" }),
            format!(
                "offset       {}{}",
                signed(self.offset_ns),
                offset_words(self.offset_ns)
            ),
            format!("error bound  {}", unsigned(self.error_bound_ns)),
            format!("leap         {}", self.leap),
            format!("detail       {}", self.detail),
        ];
        if let (Some(p), Some(check)) = (&self.preflight, &self.check) {
            lines.push(format!(
                "preflight    {}",
                check_text(p.max_error_bound_ns, check)
            ));
        }
        lines
    }

    /// The reading as one line (`--watch`).
    #[must_use]
    pub fn line(&self) -> String {
        let mut line = format!(
            "{} {} {} offset {} bound {} leap {}",
            units::utc_iso(self.at_ns),
            self.source,
            if self.synced { "synced" } else { "UNSYNCED" },
            signed(self.offset_ns),
            unsigned(self.error_bound_ns),
            self.leap,
        );
        match &self.check {
            Some(Ok(())) => line.push_str(" preflight ok"),
            Some(Err(_)) => line.push_str(" preflight FAILED"),
            None => {}
        }
        line
    }
}

/// The exit of a single reading: the preflight error with how to fix it, or a warning
/// with `force` (`force_hint`: the option that forces, and what it does).
pub fn conclude(
    check: Option<Result<(), PreflightError>>,
    force: bool,
    force_hint: &str,
) -> anyhow::Result<()> {
    match check {
        Some(Err(e)) if force => {
            eprintln!("warning: {e} (forced: continuing)");
            Ok(())
        }
        Some(Err(e)) => Err(anyhow::anyhow!(
            "clock preflight failed: {e}. To fix it, synchronise this host's clock: `hoptrace clock` and `chronyc tracking` show its state, infra/clock/README.md sets up chrony (NTP or a PTP hardware clock) or ptp4l; or pass {force_hint}"
        )),
        _ => Ok(()),
    }
}

fn leap_name(leap: Leap) -> &'static str {
    match leap {
        Leap::None => "none",
        Leap::Insert => "insert second",
        Leap::Delete => "delete second",
        Leap::Unsynchronised => "unsynchronised",
    }
}

#[allow(clippy::cast_precision_loss)]
fn signed(ns: i64) -> String {
    let s = units::duration_f64(ns as f64);
    if ns > 0 { format!("+{s}") } else { s }
}

#[allow(clippy::cast_precision_loss)]
fn unsigned(ns: u64) -> String {
    units::duration_f64(ns as f64)
}

fn offset_words(ns: i64) -> &'static str {
    match ns {
        0 => "",
        n if n > 0 => " (this clock ahead of its reference)",
        _ => " (this clock behind its reference)",
    }
}

fn check_text(max: u64, check: &Result<(), PreflightError>) -> String {
    match check {
        Ok(()) => format!("ok (bound within {})", unsigned(max)),
        Err(e) => format!("FAILED: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_clock::ClockSource;

    fn status(synced: bool, bound: u64) -> ClockStatus {
        ClockStatus {
            at_ns: 1_795_335_480_242_007_074,
            source: ClockSource::Chrony,
            synced,
            leap: if synced {
                Leap::None
            } else {
                Leap::Unsynchronised
            },
            offset_ns: 2_004,
            error_bound_ns: bound,
            detail: "ref=7F000001 (127.0.0.1) stratum=9".into(),
        }
    }

    #[test]
    fn line_and_json() {
        let s = status(true, 6_918);
        let r = Reading::new("h", &s, Some(1_000_000));
        assert_eq!(
            r.line(),
            "2026-11-22T08:18:00.242Z chrony synced offset +2.0µs bound 6.9µs leap none preflight ok"
        );
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["source"], "chrony");
        assert_eq!(v["error_bound_ns"], 6_918);
        assert_eq!(v["offset_ns"], 2_004);
        assert_eq!(v["preflight"]["ok"], true);
        assert!(v["preflight"]["error"].is_null());

        let bad = status(false, 1_500_000_000);
        let r = Reading::new("h", &bad, Some(1_000_000));
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["preflight"]["ok"], false);
        assert!(
            v["preflight"]["error"]
                .as_str()
                .unwrap()
                .contains("not synchronised according to chrony")
        );
        let check = r.into_check().unwrap();
        assert!(conclude(Some(check.clone()), true, "--force").is_ok());
        let e = conclude(Some(check), false, "--force-clock to run anyway").unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("h: clock not synchronised"), "{text}");
        assert!(
            text.contains("--force-clock") && text.contains("infra/clock/README.md"),
            "{text}"
        );
    }
}
