//! CPU time and memory of processes and threads, read from Linux's `/proc`: for the
//! collector benchmark, the publisher benchmark and the soak's resource table.

/// `/proc` clock ticks per second (`USER_HZ`, fixed at 100 by the Linux ABI).
pub const USER_HZ: f64 = 100.0;

/// Which process's `/proc` directory: this one, or another by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    /// `/proc/self`.
    This,
    /// `/proc/<pid>`.
    Other(u32),
}

impl Pid {
    fn dir(self) -> String {
        match self {
            Self::This => "/proc/self".to_owned(),
            Self::Other(p) => format!("/proc/{p}"),
        }
    }
}

/// The name and `utime + stime` (clock ticks) of a `/proc/.../stat` line.
#[must_use]
pub fn parse_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    // After the name: field 3 (state) is index 0, utime (14) index 11, stime (15) 12.
    let mut fields = text.get(close + 1..)?.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

/// CPU ticks of a whole process, exited threads included; `None` when it is gone.
#[must_use]
pub fn process_ticks(pid: Pid) -> Option<u64> {
    std::fs::read_to_string(format!("{}/stat", pid.dir()))
        .ok()
        .and_then(|t| parse_stat(&t))
        .map(|(_, t)| t)
}

/// CPU ticks of the calling thread.
#[must_use]
pub fn thread_ticks() -> u64 {
    std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|t| parse_stat(&t))
        .map_or(0, |(_, t)| t)
}

/// `(tid, name, utime + stime)` of every thread of a process.
#[must_use]
pub fn task_stats(pid: Pid) -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("{}/task", pid.dir())) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let text = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (comm, ticks) = parse_stat(&text)?;
            Some((tid, comm, ticks))
        })
        .collect()
}

/// A `kB` field of a process's `status` (`VmRSS:`, `VmHWM:`) in bytes; `None` when the
/// process or the field is absent.
#[must_use]
pub fn status_bytes(pid: Pid, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("{}/status", pid.dir()))
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
}

/// A process's command name (`comm`).
#[must_use]
pub fn command_name(pid: Pid) -> Option<String> {
    std::fs::read_to_string(format!("{}/comm", pid.dir()))
        .ok()
        .map(|s| s.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names() {
        let line = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 200 67 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some(("a (b) c".to_owned(), 267)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_readable() {
        assert!(process_ticks(Pid::This).is_some());
        assert!(status_bytes(Pid::This, "VmRSS:").unwrap() > 0);
        assert!(!task_stats(Pid::This).is_empty());
        assert_eq!(process_ticks(Pid::Other(u32::MAX)), None);
    }
}
