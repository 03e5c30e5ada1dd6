//! Helpers of the store taps' integration tests: the real stores of `infra/stores`, the
//! real `hoptrace collect` (`HOPTRACE_BIN`), and reading what it wrote.
//!
//! The tests are ignored by a plain `cargo test`; run (`--ignored`, as `infra/test.sh`
//! does), a missing binary or a store that does not start is a failure. A store that is
//! not running is started with
//! `infra/stores/stores.sh up NAME` and stopped again when the last test that uses it ends;
//! a store that was running is left running.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The hoptrace binary under test: `HOPTRACE_BIN`, or the one `cargo test --workspace`
/// built beside this test (`target/debug/hoptrace`).
pub fn bin() -> PathBuf {
    if let Ok(b) = std::env::var("HOPTRACE_BIN") {
        let p = PathBuf::from(b);
        assert!(p.is_file(), "HOPTRACE_BIN={} does not exist", p.display());
        return p;
    }
    // target/debug/deps/<test> -> target/debug/hoptrace
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("hoptrace"))
        .unwrap();
    assert!(
        p.is_file(),
        "no hoptrace binary at {}: build it (cargo build, or cargo test --workspace) or set HOPTRACE_BIN",
        p.display()
    );
    p
}

#[allow(unused_imports)] // not every test file uses it
pub use hoptrace_testkit::tempdir;

/// A short random hex id.
pub fn unique() -> String {
    format!("{:012x}", hoptrace_testkit::unique() & 0xffff_ffff_ffff)
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Users of each store in this test process, and whether this process started it.
static STORES: Mutex<BTreeMap<String, (usize, bool)>> = Mutex::new(BTreeMap::new());

/// Keeps a store running while alive; the last guard of a store this process started
/// stops it.
#[derive(Debug)]
pub struct StoreGuard(String);

fn script(name: &str) -> PathBuf {
    root().join("infra/stores").join(format!("{name}.sh"))
}

/// Makes sure the store `name` runs (`influxdb`, `postgres`, `clickhouse`,
/// `victoriametrics`).
pub fn store(name: &str) -> StoreGuard {
    let mut s = STORES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let e = s.entry(name.to_owned()).or_insert((0, false));
    let running = Command::new(script(name))
        .arg("status")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    if !running {
        let out = Command::new(root().join("infra/stores/stores.sh"))
            .args(["up", name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "infra/stores/stores.sh up {name} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        e.1 = true;
    }
    e.0 += 1;
    StoreGuard(name.to_owned())
}

impl Drop for StoreGuard {
    fn drop(&mut self) {
        let mut s = STORES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = s.get_mut(&self.0).expect("registered");
        e.0 -= 1;
        if e.0 == 0 && e.1 {
            let _ = Command::new(script(&self.0)).arg("stop").output();
            e.1 = false;
        }
    }
}

/// A `hoptrace collect` process.
#[derive(Debug)]
pub struct Collector {
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Where it serves its live view (`--ui`), `127.0.0.1:port`.
    pub ui: String,
    /// The run directory.
    pub run_dir: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Collector {
    /// Starts `hoptrace collect` with the spec at `pipeline`, writing run `t` under `dir`.
    pub fn start(dir: &Path, pipeline: &Path) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let ui = format!("127.0.0.1:{}", free_port());
        let mut child = Command::new(bin())
            .arg("collect")
            .args(["--listen", &addr, "--run-id", "t", "--ui", &ui])
            .arg("--pipeline")
            .arg(pipeline)
            .arg("--out")
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("hoptrace collect did not start");
            if line.starts_with("collecting on") {
                break;
            }
        }
        Self {
            child,
            addr,
            ui,
            run_dir: dir.join("t"),
            lines: rx,
        }
    }

    /// Its `/live.json`.
    pub fn live(&self) -> Value {
        let body = ureq::get(&format!("http://{}/live.json", self.ui))
            .timeout(Duration::from_secs(10))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        serde_json::from_str(&body).unwrap()
    }

    /// Stops it with SIGINT and returns its `run.json`.
    pub fn stop(mut self) -> Value {
        interrupt(&self.child);
        let status = self.child.wait().unwrap();
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut o, &mut out).unwrap();
        }
        let err: Vec<String> = self.lines.try_iter().collect();
        assert!(
            status.success(),
            "hoptrace collect failed: {out}\n{}",
            err.join("\n")
        );
        serde_json::from_slice(&std::fs::read(self.run_dir.join("run.json")).unwrap()).unwrap()
    }
}

/// Sends SIGINT to `child`.
pub fn interrupt(child: &Child) {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT {}", child.id());
}

/// `hoptrace sql RUN QUERY` as JSON rows.
pub fn sql(run_dir: &Path, query: &str) -> Vec<Value> {
    let out = Command::new(bin())
        .arg("sql")
        .args(["-f", "json"])
        .arg(run_dir)
        .arg(query)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hoptrace sql {query}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits up to `secs` for `cond`.
pub fn wait_for(what: &str, secs: u64, cond: impl FnMut() -> bool) {
    hoptrace_testkit::wait_for(what, Duration::from_secs(secs), cond);
}

/// A pipeline spec with `hops` (name, id) and the stages `stages` (name, from, to).
pub fn write_spec(dir: &Path, hops: &[(&str, u8)], stages: &[(&str, &str, &str)]) -> PathBuf {
    let mut s = String::from("name = \"storetap-test\"\n");
    for (name, id) in hops {
        s.push_str(&format!("\n[[hops]]\nname = \"{name}\"\nid = {id}\n"));
    }
    for (name, from, to) in stages {
        s.push_str(&format!(
            "\n[[stages]]\nname = \"{name}\"\nfrom = \"{from}\"\nto = \"{to}\"\ndefinition = \"{name}\"\n"
        ));
    }
    let p = dir.join("pipeline.toml");
    std::fs::write(&p, s).unwrap();
    p
}
