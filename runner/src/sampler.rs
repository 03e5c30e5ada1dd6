//! CPU and memory of a run's processes, sampled about once a second from `/proc`: the
//! soak's resource table and charts.

use std::collections::BTreeMap;
use std::time::Instant;

use hoptrace_analysis::resources::Sample;

use crate::procfs::{self, Pid, USER_HZ};

/// A process to sample: its role in the run (`collector`, `broker (mosquitto)`) and pid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The role, as the report names it.
    pub role: String,
    /// The process id.
    pub pid: u32,
}

/// A watched process that was read at least once and then was gone: a part of the
/// pipeline under test that died during the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Exited {
    /// Its role.
    pub role: String,
    /// Its process id.
    pub pid: u32,
    /// Seconds after the start when it was first found gone.
    pub t_s: f64,
}

impl std::fmt::Display for Exited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (pid {}) was gone at {:.0} s",
            self.role, self.pid, self.t_s
        )
    }
}

/// Samples CPU and RSS of a set of processes.
#[derive(Debug)]
pub struct Sampler {
    started: Instant,
    procs: Vec<Watched>,
    last: BTreeMap<u32, (Instant, u64)>,
    samples: Vec<Sample>,
    exited: Vec<Exited>,
}

impl Sampler {
    /// A sampler of `procs`, its sample times counted from `started`.
    #[must_use]
    pub fn new(started: Instant, procs: Vec<Watched>) -> Self {
        Self {
            started,
            procs,
            last: BTreeMap::new(),
            samples: Vec::new(),
            exited: Vec::new(),
        }
    }

    /// The processes sampled.
    #[must_use]
    pub fn watched(&self) -> &[Watched] {
        &self.procs
    }

    /// Reads every process once. A process's first reading only sets its baseline (CPU
    /// is a difference); a process that is gone is skipped, and one that was read before
    /// is recorded as exited ([`Sampler::exited`]). Returns this round's samples.
    pub fn sample(&mut self) -> &[Sample] {
        let now = Instant::now();
        let first_new = self.samples.len();
        for w in &self.procs {
            let Some(ticks) = procfs::process_ticks(Pid::Other(w.pid)) else {
                if self.last.contains_key(&w.pid) && self.exited.iter().all(|e| e.pid != w.pid) {
                    self.exited.push(Exited {
                        role: w.role.clone(),
                        pid: w.pid,
                        t_s: now.duration_since(self.started).as_secs_f64(),
                    });
                }
                continue;
            };
            let rss = procfs::status_bytes(Pid::Other(w.pid), "VmRSS:").unwrap_or(0);
            let Some((then, before)) = self.last.insert(w.pid, (now, ticks)) else {
                continue;
            };
            let secs = now.duration_since(then).as_secs_f64();
            if secs <= 0.0 {
                continue;
            }
            self.samples.push(Sample {
                t_s: now.duration_since(self.started).as_secs_f64(),
                process: w.role.clone(),
                pid: w.pid,
                cpu_cores: ticks.saturating_sub(before) as f64 / USER_HZ / secs,
                rss_bytes: rss,
            });
        }
        &self.samples[first_new..]
    }

    /// Every sample so far.
    #[must_use]
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Stops sampling `pid` (a part that finished its work and exited, as it should):
    /// its samples so far are kept, its going is not an exit.
    pub fn unwatch(&mut self, pid: u32) {
        self.procs.retain(|w| w.pid != pid);
    }

    /// The processes that were read and then were gone, in the order found.
    #[must_use]
    pub fn exited(&self) -> &[Exited] {
        &self.exited
    }

    /// Every sample, the sampler used up.
    #[must_use]
    pub fn into_samples(self) -> Vec<Sample> {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::time::Duration;

    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }

    #[test]
    fn a_busy_and_an_idle_process_read_as_such() {
        let busy = Killed(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        );
        let idle = Killed(Command::new("sleep").arg("30").spawn().unwrap());
        let mut s = Sampler::new(
            Instant::now(),
            vec![
                Watched {
                    role: "busy".into(),
                    pid: busy.0.id(),
                },
                Watched {
                    role: "idle".into(),
                    pid: idle.0.id(),
                },
                Watched {
                    role: "gone".into(),
                    pid: u32::MAX,
                },
            ],
        );
        assert!(s.sample().is_empty(), "the first reading is a baseline");
        std::thread::sleep(Duration::from_millis(1500));
        let round = s.sample().to_vec();
        assert_eq!(round.len(), 2, "{round:?}");
        let (b, i) = (&round[0], &round[1]);
        assert_eq!((b.process.as_str(), b.pid), ("busy", busy.0.id()));
        // A spinning shell is on a core most of the time, even on a shared machine.
        assert!(b.cpu_cores > 0.3 && b.cpu_cores < 1.5, "{b:?}");
        assert!(i.cpu_cores < 0.1, "{i:?}");
        assert!(b.rss_bytes > 0 && i.rss_bytes > 0, "{round:?}");
        assert!(b.t_s >= 1.4, "{b:?}");
        assert_eq!(s.samples().len(), 2);
        // Never read: not an exit. Read, then killed: an exit, found once.
        assert!(s.exited().is_empty(), "{:?}", s.exited());
        let pid = busy.0.id();
        drop(busy);
        s.sample();
        s.sample();
        assert_eq!(s.exited().len(), 1, "{:?}", s.exited());
        assert_eq!(
            (s.exited()[0].role.as_str(), s.exited()[0].pid),
            ("busy", pid)
        );
        assert!(
            s.exited()[0]
                .to_string()
                .starts_with(&format!("busy (pid {pid}) was gone at "))
        );
        // A part that finished as it should is unwatched before it goes.
        s.unwatch(idle.0.id());
        drop(idle);
        s.sample();
        assert_eq!(s.exited().len(), 1, "{:?}", s.exited());
    }
}
