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

/// Socket inodes listening on TCP `port` (any address, IPv4 or IPv6), from
/// `/proc/net/tcp{,6}`.
#[must_use]
pub fn listening_inodes(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        out.extend(listening_in_table(&text, port));
    }
    out
}

/// Inodes of the sockets in a `/proc/net/tcp` table that listen on `port`.
fn listening_in_table(text: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let local_port = f.get(1)?.rsplit(':').next()?;
            let ok = u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == LISTEN;
            ok.then(|| f.get(9)?.parse().ok()).flatten()
        })
        .collect()
}

/// The process that listens on TCP `port` (the first found whose open files hold the
/// listening socket), e.g. a broker started elsewhere. Needs the right to read other
/// processes' `fd/` (root, or the same user).
#[must_use]
pub fn listener_pid(port: u16) -> Option<u32> {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.filter_map(Result::ok).any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|l| wanted.iter().any(|w| l.as_os_str() == w.as_str()))
            })
        })
    })
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

    #[test]
    fn the_listener_of_a_port_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
        drop(l);
        assert_eq!(listener_pid(port), None);
    }

    #[test]
    fn tcp_tables_are_parsed() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:2E4B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:2E4B 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 999 1\ngarbage\n";
        assert_eq!(listening_in_table(t, 0x2E4B), vec![12345]);
        assert!(listening_in_table(t, 1).is_empty());
    }
}
