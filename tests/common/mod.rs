//! Helpers shared by the command-line tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

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

/// A `hoptrace` started in the background in a directory, its output drained while it
/// runs (so a full pipe never stalls it).
pub struct Running {
    child: Child,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: std::thread::JoinHandle<Vec<u8>>,
    what: String,
}

/// Starts `hoptrace ARGS` in `dir`, stdin closed.
pub fn spawn_in(dir: &Path, args: &[&str]) -> Running {
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
    Running {
        child,
        out,
        err,
        what: format!("hoptrace {}", args.join(" ")),
    }
}

impl Running {
    /// Sends it SIGINT.
    pub fn interrupt(&self) {
        interrupt(&self.child);
    }

    /// Sends it signal `sig` (SIGINT, SIGTERM).
    pub fn signal(&self, sig: i32) {
        // SAFETY: a plain kill(2) of our own child process.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) },
            0
        );
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for its end and what it printed; a command still running after `within` (a
    /// hang) is killed and fails the test.
    pub fn finish_within(mut self, within: Duration) -> Output {
        let status = wait_within(&mut self.child, within, &self.what);
        Output {
            status,
            stdout: self.out.join().unwrap(),
            stderr: self.err.join().unwrap(),
        }
    }
}

/// `hoptrace ARGS` run in `dir` to its end; a command still running after three minutes
/// (a hang) is killed and fails the test.
pub fn hoptrace_in(dir: &Path, args: &[&str]) -> Output {
    spawn_in(dir, args).finish_within(Duration::from_secs(180))
}

/// `collect` on an ephemeral port for one second as run `run_id` in `dir`, with `extra`
/// options.
pub fn collect_briefly(dir: &Path, run_id: &str, extra: &[&str]) -> Output {
    let args = [
        &[
            "collect",
            "--listen",
            "127.0.0.1:0",
            "--duration",
            "1s",
            "--run-id",
            run_id,
        ][..],
        extra,
    ]
    .concat();
    hoptrace_in(dir, &args)
}

/// The stderr of a command that must have failed (the test fails if it succeeded).
pub fn failure(o: &Output) -> String {
    assert!(!o.status.success(), "it should have failed: {}", text(o));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A pipeline spec other than the default one: hops `a` and `b`, one stage.
pub const OTHER_PIPELINE: &str = "name = \"other\"\n[[hops]]\nname = \"a\"\n[[hops]]\nname = \"b\"\n\
     [[stages]]\nname = \"A to B\"\nfrom = \"a\"\nto = \"b\"\ndefinition = \"x\"\n";

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
    if let Some(s) = hoptrace_testkit::exit_within(child, within) {
        return s;
    }
    child.kill().ok();
    child.wait().ok();
    panic!("{what} still ran after {within:?}");
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
