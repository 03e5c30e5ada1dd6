//! Clock status sources against the real daemons: a pair of chronyd serving and tracking on
//! loopback (`infra/clock/chrony-test.sh`), and ptp4l master and slave in two network
//! namespaces joined by a veth pair (`infra/clock/ptp-test.sh`). Neither touches the system
//! clock: chronyd runs with `-x`, the ptp4l slave with `free_running 1`.
//!
//! The two daemon tests need chrony, linuxptp and iproute2 installed and root (network
//! namespaces), so a plain `cargo test` lists them as ignored; `infra/test.sh` runs them, and
//! there anything missing is a failure that says what to install.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hoptrace_clock::{
    self as clock, ChronyLeap, ChronyStatus, ClockSource, ClockStatusSource, Leap, PortState,
    PreflightError, PtpStatus, parse_ptp4l_offset_line, realtime_ns,
};

/// Longest wait for a daemon to synchronise or measure.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Fails the test with `why` and how to get what is missing.
fn unavailable(why: &str) -> ! {
    panic!("{why}: run infra/setup.sh (as root), or infra/test.sh, which runs this test");
}

/// Fails the test unless all `programs` are installed (on `PATH` or in the sbin directories).
fn require(programs: &[&str], package: &str) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .collect();
    for p in programs {
        if !dirs.iter().any(|d| d.join(p).is_file()) {
            unavailable(&format!("{p} is not installed (apt-get install {package})"));
        }
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infra/clock")
        .join(name)
}

/// A fresh private directory for one daemon pair.
fn scratch_dir(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hoptrace-{kind}-{}-{}",
        std::process::id(),
        realtime_ns() % 1_000_000_007
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `script cmd dir args...`, returning its exit code and what it printed.
fn run_script(name: &str, cmd: &str, dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(script(name))
        .arg(cmd)
        .arg(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Stops the daemons of a helper script (and removes what it created) when dropped, even
/// when the test fails.
struct Daemons {
    script: &'static str,
    dir: PathBuf,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        let (code, out) = run_script(self.script, "stop", &self.dir, &[]);
        if code != Some(0) {
            eprintln!("{} stop failed: {out}", self.script);
        }
    }
}

/// Polls `f` until it returns `Some`, at most [`SYNC_TIMEOUT`].
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Result<Option<T>, String>) -> T {
    let (mut last, mut got) = (String::new(), None);
    hoptrace_testkit::poll_until(SYNC_TIMEOUT, || {
        match f() {
            Ok(v) => got = v,
            Err(e) => last = e,
        }
        got.is_some()
    });
    got.unwrap_or_else(|| panic!("{what}: nothing after {SYNC_TIMEOUT:?}; last error: {last}"))
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
#[ignore = "needs chrony and root: infra/test.sh runs it"]
fn chronyd_pair_on_loopback_is_read_by_chrony_status() {
    require(&["chronyd", "chronyc"], "chrony");
    let dir = scratch_dir("chrony");
    let port = free_udp_port().to_string();
    let daemons = Daemons {
        script: "chrony-test.sh",
        dir: dir.clone(),
    };
    let (code, out) = run_script("chrony-test.sh", "start", &dir, &[&port]);
    assert_eq!(code, Some(0), "chrony-test.sh start failed:\n{out}");
    let client = ChronyStatus::new().with_host(dir.join("client.sock").display().to_string());

    let started = Instant::now();
    // Right after the first update the skew, hence the root dispersion, is still huge (the
    // bound is about 0.5 s); it shrinks within a few updates at 1/64 s polling.
    let t = wait_for("chronyd client synchronised, bound below 1 ms", || {
        client
            .query()
            .map(|t| (t.synced() && t.error_bound_ns() < 1_000_000).then_some(t))
            .map_err(|e| e.to_string())
    });
    eprintln!("synchronised after {:?}: {t:?}", started.elapsed());

    // The client follows the loopback server (stratum 8) at stratum 9.
    assert_eq!(t.stratum, 9);
    assert_eq!(t.ref_id, 0x7F00_0001);
    assert_eq!(t.ref_name, "127.0.0.1");
    assert_eq!(t.leap, ChronyLeap::Normal);
    assert!(!t.is_local_reference());
    assert!(
        (realtime_ns() - t.ref_time_ns).abs() < 60_000_000_000,
        "ref time {} ns is not recent",
        t.ref_time_ns
    );
    // Both daemons read the same clock: the measured offset is only the measurement's noise.
    assert!(
        t.offset_ns().abs() < 1_000_000,
        "offset {} ns on one clock",
        t.offset_ns()
    );
    assert!(t.root_delay_ns > 0 && t.root_delay_ns < 10_000_000, "{t:?}");
    assert!(t.root_dispersion_ns < 1_000_000, "{t:?}");
    assert!(
        t.skew_ppm >= 0.0 && t.frequency_ppm.abs() < 1_000.0,
        "{t:?}"
    );
    let bound = t.error_bound_ns();
    assert_eq!(
        bound,
        t.system_time_offset_ns.unsigned_abs() + t.root_dispersion_ns + t.root_delay_ns / 2
    );
    assert!(bound > 0 && bound < 1_000_000, "bound {bound} ns");

    // Through the ClockStatusSource the exporter polls.
    let mut source = client.clone();
    let status = source.read();
    assert_eq!(status.source, ClockSource::Chrony);
    assert!(status.synced, "{status:?}");
    assert_eq!(status.leap, Leap::None);
    assert!(status.error_bound_ns > 0 && status.error_bound_ns < 100_000_000);
    assert!(status.detail.contains("stratum=9"), "{}", status.detail);
    assert!((status.at_ns - realtime_ns()).abs() < 5_000_000_000);

    // The preflight passes a loose threshold and refuses a tight one, naming the figure.
    clock::preflight(&status, 100_000_000).unwrap();
    match clock::preflight(&status, 0) {
        Err(PreflightError::ErrorBoundTooLarge {
            clock_source,
            error_bound_ns,
            ..
        }) => {
            assert_eq!(clock_source, ClockSource::Chrony);
            assert_eq!(error_bound_ns, status.error_bound_ns);
        }
        other => panic!("expected ErrorBoundTooLarge, got {other:?}"),
    }

    // The server serves its own clock.
    let server = ChronyStatus::new()
        .with_host(dir.join("server.sock").display().to_string())
        .query()
        .unwrap();
    assert_eq!(server.stratum, 8);
    assert!(server.is_local_reference() && server.synced(), "{server:?}");

    // Detection prefers the chronyd that answers.
    let mut detected = clock::auto_detect_with(
        client,
        PtpStatus::new().with_socket(dir.join("no-ptp4l-here")),
    );
    assert_eq!(detected.read().source, ClockSource::Chrony);

    drop(daemons);
    let (code, out) = run_script("chrony-test.sh", "status", &dir, &[]);
    assert_eq!(code, Some(3), "daemons still running after stop:\n{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs linuxptp, iproute2 and root (network namespaces): infra/test.sh runs it"]
fn ptp4l_in_two_namespaces_is_read_by_ptp_status() {
    require(&["ptp4l", "pmc", "ip"], "linuxptp iproute2");
    let dir = scratch_dir("ptp");
    let daemons = Daemons {
        script: "ptp-test.sh",
        dir: dir.clone(),
    };
    let (code, out) = run_script("ptp-test.sh", "start", &dir, &[]);
    if code == Some(77) {
        unavailable(&format!(
            "network namespaces or veth pairs cannot be created here (needs root / CAP_SYS_ADMIN):\n{out}"
        ));
    }
    assert_eq!(code, Some(0), "ptp-test.sh start failed:\n{out}");
    let slave = PtpStatus::new().with_socket(dir.join("slave.sock"));
    let log = dir.join("slave.log");

    let started = Instant::now();
    let (reading, lines) = wait_for("ptp4l slave measuring the grandmaster", || {
        let r = slave.query().map_err(|e| e.to_string())?;
        let lines: Vec<_> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(parse_ptp4l_offset_line)
            .collect();
        Ok((r.time_status.gm_present && lines.len() >= 2).then_some((r, lines)))
    });
    eprintln!(
        "measuring after {:?}: {reading:?}\n{lines:?}",
        started.elapsed()
    );

    // The slave's log: "master offset <ns> s0 freq <ppb> path delay <ns>" once a second.
    for l in &lines {
        assert_eq!(l.what, "master");
        assert_eq!(l.servo_state, 0, "free_running: the servo never locks");
        assert!(l.offset_ns.abs() < 5_000_000, "{l:?}");
        let d = l.delay_ns.expect("path delay printed");
        assert!(d > 0 && d < 5_000_000, "{l:?}");
    }

    // pmc's answers.
    let ts = &reading.time_status;
    assert!(ts.gm_present);
    assert_eq!(ts.gm_identity.len(), "02c9c1.fffe.736ac7".len(), "{ts:?}");
    assert!(ts.master_offset_ns.abs() < 5_000_000, "{ts:?}");
    assert!(ts.ingress_time_ns > 0, "a Sync message arrived: {ts:?}");
    assert_eq!(reading.port_state(), Some(PortState::Uncalibrated));
    assert!(
        !reading.ports[0].port_identity.starts_with(&ts.gm_identity),
        "the slave is not its own grandmaster"
    );
    let current = reading.current.as_ref().expect("CURRENT_DATA_SET answered");
    assert_eq!(current.steps_removed, 1);
    assert!(current.mean_path_delay_ns > 0 && current.mean_path_delay_ns < 5_000_000);
    assert!(reading.time_properties.is_some());
    assert_eq!(
        reading.error_bound_ns(),
        ts.master_offset_ns.unsigned_abs() + current.mean_path_delay_ns.unsigned_abs()
    );
    // Measured, but never adjusted: not synchronised.
    assert!(!reading.synced());

    // Through the ClockStatusSource the exporter polls.
    let mut source = slave.clone();
    let status = source.read();
    assert_eq!(status.source, ClockSource::Ptp);
    assert!(!status.synced);
    assert_eq!(status.leap, Leap::Unsynchronised);
    assert!(status.error_bound_ns > 0 && status.error_bound_ns < 10_000_000);
    assert!(
        status.detail.contains("port=UNCALIBRATED"),
        "{}",
        status.detail
    );
    assert!(status.detail.contains(&ts.gm_identity), "{}", status.detail);
    match clock::preflight(&status, u64::MAX) {
        Err(PreflightError::Unsynchronised { clock_source, .. }) => {
            assert_eq!(clock_source, ClockSource::Ptp);
        }
        other => panic!("expected Unsynchronised, got {other:?}"),
    }

    // The grandmaster's own view.
    let gm = PtpStatus::new()
        .with_socket(dir.join("master.sock"))
        .query()
        .unwrap();
    assert!(!gm.time_status.gm_present);
    assert_eq!(gm.time_status.gm_identity, ts.gm_identity);
    assert_eq!(gm.port_state(), Some(PortState::Master));

    // Another domain gets no answer.
    let other_domain = PtpStatus::new()
        .with_socket(dir.join("slave.sock"))
        .with_domain(7)
        .query();
    assert!(other_domain.is_err(), "{other_domain:?}");

    // Detection falls through a missing chronyd to the ptp4l that answers.
    let mut detected = clock::auto_detect_with(
        ChronyStatus::new().with_host(dir.join("no-chronyd-here").display().to_string()),
        slave,
    );
    assert_eq!(detected.read().source, ClockSource::Ptp);

    let names = std::fs::read_to_string(dir.join("names")).unwrap();
    drop(daemons);
    let (code, out) = run_script("ptp-test.sh", "status", &dir, &[]);
    assert_eq!(code, Some(3), "ptp4l still running after stop:\n{out}");
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let namespaces = String::from_utf8_lossy(&namespaces.stdout);
    for ns in names.lines().filter_map(|l| l.strip_prefix("NS_")) {
        let name = &ns[2..];
        assert!(!namespaces.contains(name), "namespace {name} left behind");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn detection_falls_back_to_the_kernel() {
    let dir = scratch_dir("nothing");
    let mut detected = clock::auto_detect_with(
        ChronyStatus::new().with_host(dir.join("no-chronyd").display().to_string()),
        PtpStatus::new().with_socket(dir.join("no-ptp4l")),
    );
    assert_eq!(detected.read().source, ClockSource::Kernel);
    let _ = std::fs::remove_dir_all(&dir);
}
