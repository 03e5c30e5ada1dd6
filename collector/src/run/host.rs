//! What the collector records of its own host.

use hoptrace_format::run::HostInfo;

/// This host's CPU, memory and kernel, from `/proc`.
#[must_use]
pub fn host_info() -> HostInfo {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory_bytes = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    HostInfo {
        host: hoptrace_clock::hostname(),
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        memory_bytes,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
    }
}
