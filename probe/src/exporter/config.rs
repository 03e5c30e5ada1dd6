//! What an exporter is told (its one configuration of a link to the collector), how it
//! reports its clock, and why it may fail.

use std::path::PathBuf;
use std::time::Duration;

use crate::clock::ClockStatus;
use crate::context::HopId;
use hoptrace_protocol::{EncodeError, reject_code};

/// How an exporter reaches the collector and paces itself: the one configuration of a
/// link to the collector. [`ExporterConfig::new`] gives every setting its default; set
/// the fields that differ.
///
/// ```
/// use std::time::Duration;
/// use hoptrace_probe::{ClockReporting, ExporterConfig};
///
/// let mut config = ExporterConfig::new("collector.lab:7400", "my-processor");
/// config.token = Some("s3cret".into());
/// config.clock = ClockReporting::Detect; // ask chronyd or ptp4l
/// config.welcome_timeout = Duration::from_secs(10);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExporterConfig {
    /// Collector address, `host:port`.
    pub collector: String,
    /// Token the collector requires on non-loopback listeners.
    pub token: Option<String>,
    /// Speak TLS to the collector, trusting the CA certificates of this PEM file (needs
    /// the `tls` feature).
    pub tls_ca: Option<PathBuf>,
    /// The name the collector's certificate must carry (default: the host part of
    /// `collector`).
    pub tls_server_name: Option<String>,
    /// Host name sent in Hello (default: this host's name).
    pub host: String,
    /// Process or component name sent in Hello.
    pub process: String,
    /// Which clock status is reported to the collector (default: the kernel's, see
    /// [`ClockReporting`]).
    pub clock: ClockReporting,
    /// Records the queue holds before `report()` starts dropping (and counting). The
    /// queue is a ring of 64-byte slots allocated and written in full when the exporter
    /// starts: the default, 1,048,576 records, is 64 MiB of the host's memory from the
    /// first second, whatever the rate.
    pub queue_capacity: usize,
    /// Most records per Records frame.
    pub max_batch: usize,
    /// Sleep when the queue is empty.
    pub idle_wait: Duration,
    /// How often the clock status is read and sent.
    pub clock_interval: Duration,
    /// How often the counters are sent.
    pub counters_interval: Duration,
    /// Timeout of one connection attempt (and of waiting for Welcome on it).
    pub connect_timeout: Duration,
    /// How long [`Exporter::connect`](super::Exporter::connect) waits for the collector's Welcome, over as many
    /// attempts as fit, before it gives up ([`Exporter::start`](super::Exporter::start) does not wait).
    pub welcome_timeout: Duration,
    /// A write blocked longer than this (collector stalled) drops the connection.
    pub write_timeout: Duration,
    /// First retry delay after a failed connection; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Bytes of sent records frames kept until the collector acknowledges them as durable
    /// (collector protocol version 2), to send again after a reconnection; when full,
    /// the oldest are dropped and counted (`evicted`, and `lost_unacked` for those the
    /// collector turns out not to hold). 0: none; the exporter then speaks protocol
    /// version 1, sends each record once and keeps nothing (nothing is evicted; a
    /// collector killed loses what it had not written).
    pub retention_bytes: usize,
}

impl ExporterConfig {
    /// [`ExporterConfig::retention_bytes`] unless set: 64 MiB.
    pub const DEFAULT_RETENTION_BYTES: usize = 64 << 20;

    /// Defaults for a collector at `collector` (`host:port`).
    #[must_use]
    pub fn new(collector: impl Into<String>, process: impl Into<String>) -> Self {
        Self {
            collector: collector.into(),
            token: None,
            tls_ca: None,
            tls_server_name: None,
            host: hoptrace_clock::hostname(),
            process: process.into(),
            clock: ClockReporting::default(),
            queue_capacity: 1 << 20,
            max_batch: 8192,
            idle_wait: Duration::from_millis(1),
            clock_interval: Duration::from_secs(5),
            counters_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            welcome_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            retention_bytes: Self::DEFAULT_RETENTION_BYTES,
        }
    }
}

/// Which clock status an exporter reports to the collector, read on a thread of the
/// exporter's own every [`ExporterConfig::clock_interval`] (never on the thread that
/// drains the probes' queue). The collector prints it per host beside the stages it
/// bounds, and warns where it is not small against them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClockReporting {
    /// None: the collector shows this host's clock as unknown and cannot bound the clock
    /// error of stages that cross it.
    Off,
    /// The kernel's NTP state (`ntp_adjtime`: one system call, no other program asked).
    /// Its bound is the kernel's `maxerror`, which a sync daemon keeps current.
    #[default]
    Kernel,
    /// The daemon that keeps this host's clock: chronyd if `chronyc` answers, else ptp4l
    /// if `pmc` answers on its default socket, else the kernel. Found once per process;
    /// every reading runs `chronyc` or `pmc` as a child process of the embedding
    /// application (on the exporter's clock thread). The `hoptrace` command's own probes
    /// report this.
    Detect,
    /// A status known from elsewhere (or a simulated host's), stamped with the time of
    /// each reading.
    Fixed(ClockStatus),
    /// A status the embedder computes at each reading (a simulated host whose clock
    /// steps, a source of its own); called on the exporter's clock thread.
    Custom(ClockStatusFn),
}

/// The function of [`ClockReporting::Custom`]: the clock status now. Two are equal when
/// they are the same function (clones of one).
#[derive(Clone)]
pub struct ClockStatusFn(pub std::sync::Arc<dyn Fn() -> ClockStatus + Send + Sync>);

impl std::fmt::Debug for ClockStatusFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClockStatusFn(..)")
    }
}

impl PartialEq for ClockStatusFn {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ClockStatusFn {}

/// Why an exporter could not start, or a probe could not be had from it. Each variant
/// says what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExporterError {
    /// No hops, more than 16, or a hop id used twice: fix the hop list.
    #[error("invalid hop list: {0}")]
    Hops(String),
    /// A probe was asked for a hop the exporter did not announce.
    #[error("hop {0:?} was not declared when the exporter started")]
    UnknownHop(HopId),
    /// The TLS setting cannot be used (unreadable CA file, bad server name, or a build
    /// without the `tls` feature).
    #[error("TLS: {0}")]
    Tls(String),
    /// A name is too long for the protocol (host, process, token or a hop name over
    /// 1024 bytes): shorten it.
    #[error("hello: {0}")]
    Hello(#[from] EncodeError),
    /// A background thread (the exporter's, or its clock reader's) could not be spawned:
    /// the process is out of threads or memory.
    #[error("cannot spawn the exporter thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// [`Exporter::connect`](super::Exporter::connect): the collector did not welcome the exporter in time. Is
    /// `hoptrace collect` running at that address, does its pipeline declare these hops
    /// with these ids, does it want the same token (and TLS)? `detail` is the last
    /// connection error.
    #[error(
        "collector {collector} did not accept {process} (hops {hops}) within {waited_ms} ms: {detail} (is hoptrace collect running there? does its pipeline declare these hops? same --token?)"
    )]
    NotWelcomed {
        /// The collector's address.
        collector: String,
        /// The process name announced.
        process: String,
        /// The hops announced, by name.
        hops: String,
        /// How long it was waited for, ms.
        waited_ms: u64,
        /// The last connection error (`no answer` when there was none).
        detail: String,
    },
    /// [`Exporter::connect`](super::Exporter::connect): the collector refused the probe for good (a hop its
    /// pipeline does not declare, a wrong token, a protocol it does not speak): trying
    /// again cannot help. Start the collector with the probe's pipeline spec (or the probe
    /// with the collector's), give the same `--token`.
    #[error("collector {collector} refused {process} for good: {reason}")]
    Rejected {
        /// The collector's address.
        collector: String,
        /// The process name announced.
        process: String,
        /// The collector's code and reason.
        reason: String,
    },
}

/// Whether a Reject with `code` is for good: trying again sends the same Hello to the same
/// collector (a hop it does not declare, a wrong token, a protocol version it does not
/// speak, a Hello it cannot read). Only an overloaded collector may say yes later.
pub(super) fn permanent(code: u16) -> bool {
    code != reject_code::OVERLOADED
}
