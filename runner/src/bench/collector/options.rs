//! What the collector benchmark is told and shows while it runs, and the constants of its synthetic traffic.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// Streams the traces are spread over.
pub const STREAMS: u32 = 3000;
/// Publisher id of every trace.
pub const PUBLISHER: u16 = 1;
/// Metrics each trace carries.
pub const METRICS_PER_TRACE: u32 = 10;
/// Records each exporter's probe queue holds.
pub const PROBE_QUEUE_RECORDS: usize = 1 << 21;
/// Spacing of the synthetic stamps, traces/s, when the run has no rate.
pub const NOMINAL_RATE: u64 = 1_000_000;
/// Bytes each exporter keeps until the collector acknowledges them, with durability on.
/// The closed loop keeps up to a channel of 256 frames of 8,192 records in the collector
/// and a sync interval unacknowledged: with the default 64 MiB the exporters evicted at
/// 5M records/s, and the run was then not durable throughout. Its records are kept while
/// in flight only, so the memory is what the run needs.
pub const RETENTION_BYTES: usize = 256 << 20;

/// Traces a generator produces between two looks at the clock or its exporter.
pub(super) const CHUNK: u64 = 1024;
/// How far (traces) a closed-loop generator may run ahead of the slowest one.
pub(super) const LEAD_TRACES: u64 = 65_536;
/// Records a closed-loop generator lets its exporter hold unsent. Small next to the
/// queue, so exporters stay close to each other and the records of one trace reach the
/// collector within a fraction of a second of each other, as in a pipeline.
pub(super) const MAX_IN_FLIGHT_RECORDS: u64 = 131_072;
/// A run in which nothing moves for this long is abandoned.
pub(super) const STALL: Duration = Duration::from_secs(30);
/// How often the calling thread samples threads and the collector.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchOptions {
    /// Traces (messages) to generate; each produces `hops` records.
    pub traces: u64,
    /// Traces per second, open loop; `None` sends as fast as the collector absorbs them.
    pub rate: Option<u64>,
    /// Hops of the pipeline (2 to 16).
    pub hops: usize,
    /// Simulated probe processes: separate exporters, each owning a contiguous run of
    /// hops (1 to `hops`).
    pub exporters: usize,
    /// Directory under which the run directory `bench-<unix ms>/` is written.
    pub out_dir: PathBuf,
    /// The collector's join window, milliseconds.
    pub window_ms: u64,
    /// Run the collector with its write-ahead log and acknowledgements (the default of
    /// `hoptrace collect`); false measures it without (`--no-log`).
    pub durable: bool,
    /// Least time between the collector's checkpoints (`None`: its default).
    pub checkpoint_interval: Option<Duration>,
    /// With `durable`: once every record is in, copy the run directory as a killed
    /// collector would have left it, and after the run start a second collector on the
    /// copy, which takes up the last checkpoint and replays the log after it
    /// ([`BenchReport::restart`](super::BenchReport::restart)).
    pub restart: bool,
}

impl Default for BenchOptions {
    /// 20M traces as fast as possible, 4 hops, 2 exporters, a 10 s window, under `runs`.
    fn default() -> Self {
        Self {
            traces: 20_000_000,
            rate: None,
            hops: 4,
            exporters: 2,
            out_dir: PathBuf::from("runs"),
            window_ms: 10_000,
            durable: true,
            checkpoint_interval: None,
            restart: false,
        }
    }
}

/// A live view of a run, passed to the progress callback about once a second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchProgress {
    /// Seconds since traffic started.
    pub elapsed_s: f64,
    /// Traces every generator has produced (the slowest generator's count).
    pub traces_generated: u64,
    /// Traces the collector has written (complete + incomplete).
    pub traces_done: u64,
    /// Hop records the collector has received.
    pub records: u64,
    /// Hop records received per second over the last interval.
    pub records_per_s: f64,
    /// Traces waiting in the join for more hops.
    pub pending: u64,
    /// Records the exporters dropped so far (queue full + send failed).
    pub lost_by_probes: u64,
    /// `VmRSS` of this process (collector and generators).
    pub rss_bytes: u64,
    /// The join's memory estimated from its pending traces and the emitted keys it
    /// remembers for one window, with the per-trace sizes documented in [`hoptrace_collector::join`].
    pub join_memory_estimate_bytes: u64,
    /// Seconds until every trace is written, at the average rate so far; `None` before
    /// the first trace is written.
    pub eta_s: Option<f64>,
}
