//! A Mosquitto of a test's own on a free loopback port, started from the installed binary,
//! killed, frozen or restarted on the same port by the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use hoptrace_publisher::Endpoint;

use super::{closed_port, tempdir, wait_for};

const MOSQUITTO: &str = "/usr/sbin/mosquitto";

/// Fails the test clearly when Mosquitto is not installed.
pub fn require_mosquitto() {
    assert!(
        Path::new(MOSQUITTO).exists(),
        "{MOSQUITTO} is missing: run infra/setup.sh (or infra/test.sh, which runs these tests)"
    );
}

pub struct Mosquitto {
    pub dir: PathBuf,
    conf: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts a broker with `settings` (configuration lines; `{dir}` stands for the
    /// broker's own directory) beside a listener on a free port and a log in its directory.
    pub fn start(tag: &str, settings: &str) -> Self {
        require_mosquitto();
        let dir = tempdir(tag);
        let mut b = Self {
            conf: dir.join("mosquitto.conf"),
            dir,
            port: 0,
            child: None,
        };
        // A free port can be taken by another socket before Mosquitto binds it: try a few.
        for _ in 0..3 {
            b.port = closed_port();
            std::fs::write(
                &b.conf,
                format!(
                    "user root\nlistener {} 127.0.0.1\nallow_anonymous true\n\
                     log_dest file {}\nlog_type error\nlog_type warning\nlog_type notice\n\
                     log_type information\nlog_timestamp true\n{}\n",
                    b.port,
                    b.log().display(),
                    settings.replace("{dir}", &b.dir.display().to_string())
                ),
            )
            .unwrap();
            if b.try_spawn() {
                return b;
            }
        }
        panic!("Mosquitto did not start:\n{}", b.log_tail());
    }

    fn log(&self) -> PathBuf {
        self.dir.join("mosquitto.log")
    }

    /// The end of the broker's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// How many times the log says a Mosquitto started with its listener bound.
    fn starts_logged(&self) -> usize {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("mosquitto version") && l.ends_with(" running"))
            .count()
    }

    /// Starts the broker process and waits until it listens; `false` if it exited.
    ///
    /// A connection that succeeds does not prove the broker is this one: another test's
    /// Mosquitto may hold the port, and this one is then about to exit on "Address already
    /// in use". Mosquitto logs "… running" only once its listeners are bound.
    fn try_spawn(&mut self) -> bool {
        let before = self.starts_logged();
        let mut child = Command::new(MOSQUITTO)
            .arg("-c")
            .arg(&self.conf)
            .spawn()
            .unwrap();
        let mut exited = false;
        wait_for("the private Mosquitto to listen", || {
            exited = child.try_wait().unwrap().is_some();
            exited
                || (self.starts_logged() > before
                    && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok())
        });
        if !exited {
            self.child = Some(child);
        }
        !exited
    }

    /// Starts the broker again on its port.
    pub fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "Mosquitto did not restart:\n{}",
            self.log_tail()
        );
    }

    /// SIGSTOP: the broker hangs, reading and answering nothing.
    pub fn freeze(&self) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -STOP {pid}");
    }

    /// SIGKILL: the broker keeps nothing it had not saved.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `mqtt://` to this broker, followed by `rest` (a path and query).
    pub fn url(&self, rest: &str) -> Endpoint {
        Endpoint::parse(&format!("mqtt://127.0.0.1:{}{rest}", self.port)).unwrap()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            std::fs::remove_dir_all(&self.dir).ok();
        }
    }
}
