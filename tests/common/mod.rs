//! Helpers shared by the command-line tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // not every test file uses it
pub use hoptrace_testkit::broker;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hoptrace")
}

/// A fresh, empty scratch directory for one test.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hoptrace-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `hoptrace ARGS` run in `dir` to its end; a command still running after three minutes
/// (a hang) is killed and fails the test.
pub fn hoptrace_in(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let status = wait_within(
        &mut child,
        Duration::from_secs(180),
        &format!("hoptrace {}", args.join(" ")),
    );
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// What a finished command printed, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits for `child` at most `within`; kills it and fails the test when it runs longer.
pub fn wait_within(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("{what} still ran after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends SIGINT to our own child.
pub fn interrupt(child: &Child) {
    // SAFETY: a plain kill(2) of our own child process.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
}

/// Makes a small run with `hoptrace roundtrip` under `runs` (hops as given) and returns
/// its directory.
pub fn roundtrip_run(runs: &Path, hops: &str) -> PathBuf {
    let before: Vec<PathBuf> = list(runs);
    let o = Command::new(bin())
        .args([
            "roundtrip",
            "--messages",
            "2k",
            "--rate",
            "20k",
            "--hops",
            hops,
        ])
        .arg("--runs")
        .arg(runs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let after = list(runs);
    let new: Vec<&PathBuf> = after.iter().filter(|p| !before.contains(p)).collect();
    assert_eq!(new.len(), 1, "{new:?}");
    new[0].clone()
}

/// The entries of a directory, sorted (none when it does not exist).
pub fn list(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}
