//! Child processes of a run (the soak's collector, store, processor and publisher; the
//! sweep's soaks, the taps of an external pipeline): each logs its stderr to a file of its
//! own, says `ready` on stdout (or, for a tap, a line on stderr) when it serves, and is
//! stopped with SIGTERM and a deadline, or killed when dropped.

use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// A child process: its stderr goes to `<logs>/<role>.log`, its stdout lines are kept.
#[derive(Debug)]
pub struct Part {
    role: String,
    child: Child,
    stdout: Option<mpsc::Receiver<String>>,
    log: PathBuf,
    terminated: bool,
}

impl Part {
    /// Starts `cmd` as the part `role`, its stderr into `<logs>/<role>.log`.
    ///
    /// # Errors
    /// The log cannot be created or the program cannot start.
    pub fn spawn(role: &str, cmd: &mut Command, logs: &Path) -> anyhow::Result<Self> {
        let path = logs.join(format!("{role}.log"));
        let log = std::fs::File::create(&path)
            .with_context(|| format!("creating the log of the {role}"))?;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the {role}"))?;
        let stdout = child.stdout.take().map(lines_of);
        Ok(Self {
            role: role.to_owned(),
            child,
            stdout,
            log: path,
            terminated: false,
        })
    }

    /// The part's name.
    #[must_use]
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, once the process has exited.
    ///
    /// # Errors
    /// The status cannot be read.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits for the child's `ready` line, at most `within`.
    ///
    /// # Errors
    /// The child exits first, or does not say `ready` in time.
    pub fn ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let rx = self.stdout.take().context("no stdout")?;
        let r = self.wait_until(within, || {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.starts_with("ready") => return true,
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Its stdout closed: it is exiting; wait for the status.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            false
        });
        self.stdout = Some(rx);
        r
    }

    /// Waits until the child's log (its stderr) has a line starting with one of
    /// `prefixes`, at most `within`: how `hoptrace tap` says it serves (`tapping ...`,
    /// `polling ...`), keeping its stdout for its summary.
    ///
    /// # Errors
    /// The child exits first, or does not log such a line in time.
    pub fn logged(&mut self, prefixes: &[&str], within: Duration) -> anyhow::Result<()> {
        let log = self.log.clone();
        self.wait_until(within, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text
                .lines()
                .any(|l| prefixes.iter().any(|p| l.starts_with(p)))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
            false
        })
    }

    /// Calls `done` (which waits a little itself) until it says yes, the child exits, or
    /// `within` has passed.
    fn wait_until(
        &mut self,
        within: Duration,
        mut done: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if done() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "the {} exited ({status}) before it was ready: {}",
                    self.role,
                    tail.join(" | ")
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "the {} was not ready within {within:?} (see {})",
                    self.role,
                    self.log.display()
                );
            }
        }
    }

    /// Sends SIGTERM (once), asking the child to stop cleanly.
    ///
    /// # Errors
    /// The process id does not fit a `pid_t`.
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        if self.terminated || self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.pid()).context("pid")?;
        // SAFETY: a plain kill(2) of our own child, which has not been waited for.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.terminated = true;
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit, at most `within` (then kills it); returns
    /// what it printed on stdout.
    ///
    /// # Errors
    /// The child does not stop in time, or exits unsuccessfully.
    pub fn stop(self, within: Duration) -> anyhow::Result<Vec<String>> {
        self.stop_allowing(within, &[])
    }

    /// [`Part::stop`], taking exit codes in `fine` as success too: a soak that measured
    /// and reported its run but missed a target (exit 3) has done its part of a sweep.
    ///
    /// # Errors
    /// As [`Part::stop`], for an exit status neither success nor in `fine`.
    pub fn stop_allowing(mut self, within: Duration, fine: &[i32]) -> anyhow::Result<Vec<String>> {
        self.terminate()?;
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                self.child.kill().ok();
                bail!("the {} did not stop within {within:?}; killed", self.role);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out: Vec<String> = self
            .stdout
            .take()
            .map(|rx| rx.iter().collect())
            .unwrap_or_default();
        if !status.success() && !status.code().is_some_and(|c| fine.contains(&c)) {
            bail!("the {} failed ({status}): {}", self.role, out.join("; "));
        }
        Ok(out)
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a child to listen on.
///
/// # Errors
/// No port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` different TCP ports on 127.0.0.1 that were free a moment ago: each is held until
/// all are picked, so the system cannot hand out one of them twice (separate
/// [`free_port`] calls can, once the first listener has closed).
///
/// # Errors
/// No port can be bound.
pub fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let held = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0u16; N];
    for (port, l) in ports.iter_mut().zip(&held) {
        *port = l.local_addr()?.port();
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_different() {
        for _ in 0..50 {
            let [a, b, c] = free_ports::<3>().unwrap();
            assert!(a != b && b != c && a != c, "{a} {b} {c}");
        }
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    fn logs(tag: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("hoptrace-supervisor-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_part_is_ready_then_stops_with_its_output() {
        let dir = logs("ok");
        let mut p = Part::spawn(
            "store",
            // The trap is set before `ready`, so the SIGTERM that follows finds it.
            &mut sh("trap 'echo bye; exit 0' TERM; echo to the log >&2; echo ready 1; while :; do sleep 0.05; done"),
            &dir,
        )
        .unwrap();
        assert_eq!(p.role(), "store");
        p.ready(Duration::from_secs(10)).unwrap();
        let out = p.stop(Duration::from_secs(10)).unwrap();
        assert_eq!(out, ["bye"]);
        let log = std::fs::read_to_string(dir.join("store.log")).unwrap();
        assert_eq!(log, "to the log\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_part_that_exits_first_or_fails_is_an_error() {
        let dir = logs("bad");
        let mut p = Part::spawn("processor", &mut sh("exit 3"), &dir).unwrap();
        let e = p.ready(Duration::from_secs(10)).unwrap_err().to_string();
        assert!(e.contains("processor exited"), "{e}");
        let p = Part::spawn("publisher", &mut sh("echo oops; exit 2"), &dir).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let e = p.stop(Duration::from_secs(10)).unwrap_err().to_string();
        assert!(e.contains("publisher failed") && e.contains("oops"), "{e}");
        let mut p = Part::spawn("collector", &mut sh("sleep 30"), &dir).unwrap();
        let e = p.ready(Duration::from_millis(300)).unwrap_err().to_string();
        assert!(e.contains("not ready"), "{e}");
        drop(p); // killed, not left behind
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_tap_is_ready_once_its_log_says_so_and_keeps_its_stdout() {
        let dir = logs("tap");
        let mut p = Part::spawn(
            "tap-1",
            &mut sh("trap 'echo keys: 3 found; exit 0' TERM; sleep 0.2; echo polling influxdb >&2; while :; do sleep 0.05; done"),
            &dir,
        )
        .unwrap();
        p.logged(&["tapping", "polling"], Duration::from_secs(10))
            .unwrap();
        assert_eq!(p.stop(Duration::from_secs(10)).unwrap(), ["keys: 3 found"]);
        let mut p = Part::spawn(
            "tap-2",
            &mut sh("echo 'error: no such database' >&2; exit 1"),
            &dir,
        )
        .unwrap();
        let e = p
            .logged(&["polling"], Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tap-2 exited") && e.contains("no such database"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
