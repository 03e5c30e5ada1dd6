//! The collector options of every subcommand that reports stamps (`publish`, `tap`,
//! `refpipe store|processor`): one clap group, turned into the probe's one link
//! configuration, [`ExporterConfig`]; and the one group of what probes must present to a
//! command that takes them (`collect`, `relay`): [`ListenerArgs`].

use std::path::PathBuf;

use hoptrace_format::units;
use hoptrace_probe::{ClockReporting, CounterSnapshot, ExporterConfig};

use crate::argv::{Argv, ToArgs};

/// What probes must present to a command that takes their connections (`collect`,
/// `relay`): a token, and TLS.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct ListenerArgs {
    /// Token probes must present.
    #[arg(long, env = "HOPTRACE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve TLS with this certificate chain (PEM); every probe must then connect with
    /// --collector-ca. Needs --tls-key.
    #[arg(
        long,
        env = "HOPTRACE_TLS_CERT",
        hide_env_values = true,
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        env = "HOPTRACE_TLS_KEY",
        hide_env_values = true,
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
}

impl ListenerArgs {
    /// Sets the token and TLS files of a collector's or relay's configuration, whose
    /// fields these are.
    pub fn apply(
        &self,
        token: &mut Option<String>,
        tls_cert: &mut Option<PathBuf>,
        tls_key: &mut Option<PathBuf>,
    ) {
        token.clone_from(&self.token);
        tls_cert.clone_from(&self.tls_cert);
        tls_key.clone_from(&self.tls_key);
    }
}

/// Where and how to report to the collector.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CollectorArgs {
    /// Collector address (`hoptrace collect --listen`); without it, nothing is reported.
    #[arg(long)]
    pub collector: Option<String>,
    /// Token the collector requires.
    #[arg(long, env = "HOPTRACE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Speak TLS to the collector, trusting the CA certificates of this PEM file.
    #[arg(long, env = "HOPTRACE_COLLECTOR_CA", hide_env_values = true)]
    pub collector_ca: Option<PathBuf>,
    /// The name the collector's certificate carries (default: the host of --collector).
    #[arg(long, requires = "collector_ca")]
    pub collector_tls_name: Option<String>,
    /// Records kept until the collector says they are on its disk: sent again after it
    /// restarts, and held while it is unreachable (`64MiB`, `512KiB`). When full, the
    /// oldest are dropped, counted, and lost if the collector never got them. `0`: none;
    /// records are sent once and not kept (protocol version 1), so a collector killed
    /// loses what it had not written, and nothing counts as evicted.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = units::parse_bytes)]
    pub collector_retention: u64,
}

impl CollectorArgs {
    /// The link to the collector these options describe, announcing `process`, or `None`
    /// without `--collector`. The command's own probes report the clock status of the
    /// daemon that keeps this host's clock (chronyd, ptp4l, else the kernel).
    pub fn exporter_config(&self, process: &str) -> Option<ExporterConfig> {
        let addr = self.collector.as_ref()?;
        let mut c = ExporterConfig::new(addr, process);
        c.token.clone_from(&self.token);
        c.tls_ca.clone_from(&self.collector_ca);
        c.tls_server_name.clone_from(&self.collector_tls_name);
        c.retention_bytes = usize::try_from(self.collector_retention).unwrap_or(usize::MAX);
        c.clock = ClockReporting::Detect;
        Some(c)
    }
}

/// An exporter's losses as the summaries print them, the parts adding up to the total:
/// `lost N (queue full Q, send failed F, evicted and never acknowledged E)`.
pub fn lost_line(c: &CounterSnapshot) -> String {
    format!(
        "lost {} (queue full {}, send failed {}, evicted and never acknowledged {})",
        c.lost(),
        c.queue_full,
        c.send_failed,
        c.lost_unacked
    )
}

impl ToArgs for ListenerArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            token: _,
            tls_cert,
            tls_key,
        } = self;
        argv.path("--tls-cert", tls_cert.as_deref());
        argv.path("--tls-key", tls_key.as_deref());
    }
}

impl ToArgs for CollectorArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            collector,
            token: _,
            collector_ca,
            collector_tls_name,
            collector_retention,
        } = self;
        argv.opt("--collector", collector.as_deref());
        argv.path("--collector-ca", collector_ca.as_deref());
        argv.opt("--collector-tls-name", collector_tls_name.as_deref());
        argv.value("--collector-retention", collector_retention.to_string());
    }
}

/// A `CollectorArgs` with every option set (the token excepted: it is never written), for
/// the round-trip tests of the structs that flatten it.
#[cfg(test)]
pub(crate) fn every_collector_option() -> CollectorArgs {
    CollectorArgs {
        collector: Some("127.0.0.1:7401".into()),
        token: None,
        collector_ca: Some(PathBuf::from("/etc/ca.pem")),
        collector_tls_name: Some("collector.lab".into()),
        collector_retention: 12_345,
    }
}

#[cfg(test)]
mod lost_tests {
    use super::*;

    #[test]
    fn the_lost_line_names_every_part_of_the_total() {
        let mut c = CounterSnapshot::default();
        c.queue_full = 1;
        c.send_failed = 5_910;
        c.lost_unacked = 20_508;
        let line = lost_line(&c);
        assert_eq!(
            line,
            "lost 26419 (queue full 1, send failed 5910, evicted and never acknowledged 20508)"
        );
    }
}
