//! `hoptrace clock`: this host's clock status, and the preflight before a run.
//!
//! Reads what keeps the clock on time (chronyd, ptp4l through pmc, or the kernel), prints
//! the source, whether it is synchronised, the offset, the error bound, the leap state and
//! the source's detail. With `--max-clock-error` it is a preflight: the command fails when the
//! clock is unsynchronised or the bound exceeds the threshold (a warning with `--force-clock`).

pub use hoptrace_cli::preflight::PreflightArgs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hoptrace_clock::{
    ChronyStatus, ClockStatus, ClockStatusSource, KernelClockStatus, Leap, PtpStatus, hostname,
};

use hoptrace_format::units;

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
pub struct Args {
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
enum Reader {
    Chrony(ChronyStatus),
    Ptp(PtpStatus),
    Other(Box<dyn ClockStatusSource>),
}

impl Reader {
    fn new(args: &Args) -> Self {
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
    fn read(&mut self, first: bool) -> anyhow::Result<ClockStatus> {
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

/// Runs `hoptrace clock`.
///
/// # Errors
/// The source cannot be read (an explicit `--source chrony|ptp`), or the preflight fails
/// without `--force-clock`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let host = hostname();
    let mut reader = Reader::new(args);
    let Some(interval_ns) = args.watch else {
        let status = reader.read(true)?;
        let check = args
            .max_error
            .map(|max| hoptrace_clock::preflight_host(&host, &status, max));
        if args.json {
            println!(
                "{}",
                to_json(&host, &status, args.max_error, check.as_ref())
            );
        } else {
            print_status(&host, &status, args.max_error, check.as_ref());
        }
        return conclude(check, args.force, "--force-clock to only warn");
    };
    let interval = Duration::from_nanos(interval_ns.max(1));
    let mut failed = 0_u64;
    let mut readings = 0_u64;
    loop {
        let status = reader.read(readings == 0)?;
        readings += 1;
        let check = args
            .max_error
            .map(|max| hoptrace_clock::preflight_host(&host, &status, max));
        if args.json {
            println!(
                "{}",
                to_json(&host, &status, args.max_error, check.as_ref())
            );
        } else {
            println!("{}", status_line(&status, check.as_ref()));
        }
        if let Some(Err(e)) = &check {
            failed += 1;
            if args.force {
                eprintln!("warning: {e} (--force-clock: continuing)");
            }
        }
        if args.count.is_some_and(|n| readings >= n) {
            break;
        }
        std::thread::sleep(interval);
    }
    if failed > 0 && !args.force {
        bail!("{failed} of {readings} readings failed the clock preflight");
    }
    Ok(())
}

/// The preflight a command runs before it starts.
pub trait Preflight {
    /// Checks this host's clock when `--max-clock-error` is given.
    ///
    /// # Errors
    /// The clock fails the check and `--force-clock` is not given.
    fn check(&self) -> anyhow::Result<()>;
}

impl Preflight for PreflightArgs {
    fn check(&self) -> anyhow::Result<()> {
        let Some(max) = self.max_clock_error else {
            return Ok(());
        };
        let status = hoptrace_clock::this_host().read();
        conclude(
            Some(hoptrace_clock::preflight_host(&hostname(), &status, max)),
            self.force_clock,
            "--force-clock to run anyway (the run still records every host's clock status)",
        )
    }
}

/// The exit of a single reading: the preflight error with how to fix it, or a warning
/// with `force` (`force_hint`: the option that forces, and what it does).
fn conclude(
    check: Option<Result<(), hoptrace_clock::PreflightError>>,
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

fn check_text(max: u64, check: &Result<(), hoptrace_clock::PreflightError>) -> String {
    match check {
        Ok(()) => format!("ok (bound within {})", unsigned(max)),
        Err(e) => format!("FAILED: {e}"),
    }
}

fn print_status(
    host: &str,
    s: &ClockStatus,
    max: Option<u64>,
    check: Option<&Result<(), hoptrace_clock::PreflightError>>,
) {
    println!("host         {host}");
    println!("source       {}", s.source.name());
    println!("synced       {}", if s.synced { "yes" } else { "no" });
    println!(
        "offset       {}{}",
        signed(s.offset_ns),
        offset_words(s.offset_ns)
    );
    println!("error bound  {}", unsigned(s.error_bound_ns));
    println!("leap         {}", leap_name(s.leap));
    println!("detail       {}", s.detail);
    if let (Some(max), Some(check)) = (max, check) {
        println!("preflight    {}", check_text(max, check));
    }
}

fn status_line(
    s: &ClockStatus,
    check: Option<&Result<(), hoptrace_clock::PreflightError>>,
) -> String {
    let mut line = format!(
        "{} {} {} offset {} bound {} leap {}",
        utc(s.at_ns),
        s.source.name(),
        if s.synced { "synced" } else { "UNSYNCED" },
        signed(s.offset_ns),
        unsigned(s.error_bound_ns),
        leap_name(s.leap),
    );
    match check {
        Some(Ok(())) => line.push_str(" preflight ok"),
        Some(Err(_)) => line.push_str(" preflight FAILED"),
        None => {}
    }
    line
}

fn to_json(
    host: &str,
    s: &ClockStatus,
    max: Option<u64>,
    check: Option<&Result<(), hoptrace_clock::PreflightError>>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "host": host,
        "at_ns": s.at_ns,
        "source": s.source.name(),
        "synced": s.synced,
        "leap": leap_name(s.leap),
        "offset_ns": s.offset_ns,
        "error_bound_ns": s.error_bound_ns,
        "detail": s.detail,
    });
    if let (Some(max), Some(check)) = (max, check) {
        v["preflight"] = serde_json::json!({
            "max_error_bound_ns": max,
            "ok": check.is_ok(),
            "error": check.as_ref().err().map(ToString::to_string),
        });
    }
    v
}

/// `2026-11-22T08:21:23.123Z` from Unix epoch nanoseconds.
fn utc(ns: i64) -> String {
    hoptrace_format::units::utc_iso(ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_clock::ClockSource;

    #[test]
    fn utc_formatting() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_795_335_480_242_007_074), "2026-11-22T08:18:00.242Z");
        assert_eq!(utc(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
    }

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
        let check = hoptrace_clock::preflight_host("h", &s, 1_000_000);
        assert_eq!(
            status_line(&s, Some(&check)),
            "2026-11-22T08:18:00.242Z chrony synced offset +2.0µs bound 6.9µs leap none preflight ok"
        );
        let v = to_json("h", &s, Some(1_000_000), Some(&check));
        assert_eq!(v["source"], "chrony");
        assert_eq!(v["error_bound_ns"], 6_918);
        assert_eq!(v["offset_ns"], 2_004);
        assert_eq!(v["preflight"]["ok"], true);
        assert!(v["preflight"]["error"].is_null());

        let bad = status(false, 1_500_000_000);
        let check = hoptrace_clock::preflight_host("h", &bad, 1_000_000);
        let v = to_json("h", &bad, Some(1_000_000), Some(&check));
        assert_eq!(v["preflight"]["ok"], false);
        assert!(
            v["preflight"]["error"]
                .as_str()
                .unwrap()
                .contains("not synchronised according to chrony")
        );
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
