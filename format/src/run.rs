//! `run.json`: what one run was and what it measured, as the collector writes it and every
//! reader reads it. Field by field in `docs/dataset.md`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::hist::{Figures, Percentile};
use crate::spec::PipelineSpec;

/// What `run.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    /// Run id.
    pub run_id: String,
    /// The pipeline spec.
    pub pipeline: PipelineSpec,
    /// Start, Unix ns.
    pub started_unix_ns: i64,
    /// End, Unix ns.
    pub ended_unix_ns: i64,
    /// The collector's host.
    pub collector_host: HostInfo,
    /// Every probe connection.
    pub probes: Vec<ProbeInfo>,
    /// Clock statuses received (host, status), in arrival order.
    pub clock: Vec<ClockRow>,
    /// Probe hosts whose clock failed the preflight (`max_clock_error_ns`), one line per
    /// host and reason.
    #[serde(default)]
    pub clock_alerts: Vec<String>,
    /// Files written.
    pub files: Vec<PartFile>,
    /// Per-stage statistics over the whole run.
    pub stages: Vec<StageStats>,
    /// What an earlier, interrupted collector left in this run directory (its files are
    /// not in `files` nor in the accounting).
    pub recovered: Option<Recovered>,
    /// Accounting.
    pub accounting: Accounting,
    /// Connection outcomes.
    pub connections: BTreeMap<String, u64>,
    /// What the OTLP receiver did (`collect --otlp`): requests by answer, spans by what
    /// became of them; empty without it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub otlp: BTreeMap<String, u64>,
    /// When collected by a Kafka consumer group: its members and partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupInfo>,
    /// The run was cut short (Ctrl-C during `hoptrace demo` or `hoptrace soak`): its
    /// figures cover less load than was planned.
    #[serde(default)]
    pub interrupted: bool,
    /// Every time a collector started again on this run (after it was killed) and
    /// replayed the run's log, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<Restart>,
}

impl RunSummary {
    /// Writes this summary as `path` (a `run.json`) whole or not at all: into a temporary
    /// file beside it, synced, then renamed over it, so a reader or a crash never sees a
    /// half-written file and a failure leaves the previous one as it was. Every writer of
    /// `run.json` goes through here.
    ///
    /// # Errors
    /// When the temporary file cannot be written or synced, or the rename fails.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write as _;
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp_name);
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&json)?;
            f.sync_all()
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        if let Some(dir) = path.parent().and_then(|d| std::fs::File::open(d).ok()) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

/// A collector started again on an unfinished run: it took up the run's last checkpoint,
/// replayed the run's log after it and went on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restart {
    /// When it started again, Unix ns.
    pub at_unix_ns: i64,
    /// Log entries it replayed (after the checkpoint, when there was one).
    pub log_entries: u64,
    /// Bytes of log it replayed (after the checkpoint, when there was one).
    pub log_bytes: u64,
    /// Bytes after the last whole entry (written when the collector was killed), skipped:
    /// probes speaking version 2 sent their content again.
    pub torn_bytes: u64,
    /// Hop records the run held at this restart, from its checkpoint and the log after it
    /// (every record of the run so far that a probe was told is durable, and possibly
    /// more).
    #[serde(default)]
    pub records_replayed: u64,
    /// When the checkpoint it started from was taken, Unix ns; `None`: there was none, the
    /// whole log since the run started was replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_unix_ns: Option<i64>,
    /// Milliseconds from reading the checkpoint to the end of the replay: how long
    /// probes waited for this collector's Welcome.
    #[serde(default)]
    pub replay_ms: u64,
    /// Hop records in the log it replayed (after the checkpoint, when there was one).
    #[serde(default)]
    pub log_records: u64,
    /// Records probes sent again after this restart that the log already held: dropped,
    /// not counted as the pipeline's duplicates.
    #[serde(default)]
    pub resent_records_dropped: u64,
}

/// The run's record of one probe connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeInfo {
    /// Exporter instance id.
    pub instance_id: u64,
    /// Host name the probe gave.
    pub host: String,
    /// Process name.
    pub process: String,
    /// Software and version.
    pub software: String,
    /// Hops it reports.
    pub hops: Vec<String>,
    /// Peer address.
    pub peer: String,
    /// Whether it said Goodbye.
    pub clean_close: bool,
    /// Its last counters, by name.
    pub counters: BTreeMap<String, u64>,
    /// Stamps of this connection the run used (stored in a trace), by hop. A probe that
    /// stamped nothing does not count as a host of any stage: its clock does not enter a
    /// stage's uncertainty. Absent in runs of older collectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamps_by_hop: Option<BTreeMap<String, u64>>,
    /// The collector protocol version the connection ran at (the Welcome's). Absent in
    /// runs of older collectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<u16>,
    /// Whether the collector acknowledged the connection's records once its log held
    /// them, so that the probe kept them to send again after a collector restart (version
    /// 2 with the log). `false`: a version 1 probe, a probe with no retention, or a
    /// collector run with `--no-log`; what such a probe sent after the collector's last
    /// write was lost with a killed collector, as unseen or incomplete messages. Absent in
    /// runs of older collectors and of collector groups (Kafka keeps their records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// When the collector took the connection's Hello, Unix ns (the collector's clock).
    /// Absent in runs of older collectors and of collector groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected_unix_ns: Option<i64>,
    /// When the connection ended, Unix ns (the collector's clock): after Goodbye
    /// (`clean_close`), or when it broke. A connection a killed collector held ends at the
    /// last entry of its log. Absent while open and in runs of older collectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_unix_ns: Option<i64>,
}

/// Per publisher: what was sent and what became of it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PublisherAccount {
    /// Publisher id.
    pub publisher: u16,
    /// Messages the publisher says it sent (Sent frames).
    pub sent: u64,
    /// Metrics in them.
    pub sent_metrics: u64,
    /// Traces with every expected hop.
    pub complete: u64,
    /// Traces missing at least one expected hop.
    pub incomplete: u64,
    /// Messages whose keys are in part files an earlier collector of this run left (a
    /// continued run): seen and written before, not by this collector, so neither in
    /// `complete` nor in `incomplete`.
    #[serde(default)]
    pub recovered: u64,
    /// Messages of which no stamp at all reached the collector: `sent` less the distinct
    /// keys written within the sequences the publisher reported (kept ones included).
    pub unseen: u64,
    /// Traces written whose keys lie outside the sequences the publisher reported sending.
    #[serde(default)]
    pub not_sent: u64,
}

/// The run's accounting: every message sent is complete, incomplete or unseen, and
/// records the probes could not deliver are counted beside it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Accounting {
    /// Per publisher.
    pub publishers: Vec<PublisherAccount>,
    /// Incomplete traces by the expected hop they miss.
    pub missing_by_hop: BTreeMap<String, u64>,
    /// Hop records received, by hop.
    pub records_by_hop: BTreeMap<String, u64>,
    /// Records lost by probes (queue full + send failed), from their final counters.
    pub records_lost_by_probes: u64,
    /// Traces flagged with a duplicate stamp.
    pub duplicate_traces: u64,
    /// Traces flagged with a negative stage delta.
    pub negative_delta_traces: u64,
    /// Records for traces already written, however late: counted, never a second row.
    pub late_records: u64,
    /// Records of hops the spec does not declare.
    pub unknown_hop_records: u64,
    /// Records of a hop their connection did not announce in its Hello: dropped, counted.
    #[serde(default)]
    pub unannounced_hop_records: u64,
    /// Records of numbered frames sent again after a collector restart that the run
    /// already held (protocol version 2): dropped, never counted twice.
    #[serde(default)]
    pub resent_records_dropped: u64,
    /// Records whose stamp lay outside the plausibility window (`join.plausible_window_s`):
    /// dropped, counted.
    #[serde(default)]
    pub implausible_records: u64,
    /// Traces whose intended send time lay outside the plausibility window: written,
    /// flagged, and kept out of the run's span.
    #[serde(default)]
    pub implausible_traces: u64,
    /// Traces still in the join at the end (0 after a clean stop).
    pub in_flight: u64,
    /// Times the join filled up (`join.max_pending`) and the collector pushed back on
    /// probes through TCP.
    pub backpressure_episodes: u64,
    /// `sent = complete + incomplete + recovered + unseen` for every publisher, each figure
    /// counted independently (rows as written, unseen from the distinct keys written), no
    /// key written twice or outside what was sent, and nothing in flight.
    pub adds_up: bool,
    /// Why the counts do not add up, one line per finding (empty when they do).
    #[serde(default)]
    pub discrepancies: Vec<String>,
}

/// One clock status of one probe host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClockRow {
    /// Probe host.
    pub host: String,
    /// Exporter instance.
    pub instance_id: u64,
    /// When it was read (Unix ns).
    pub at_ns: i64,
    /// Source name.
    pub source: String,
    /// Synchronised.
    pub synced: bool,
    /// Offset, ns.
    pub offset_ns: i64,
    /// Error bound, ns.
    pub error_bound_ns: u64,
    /// Leap second state: `none`, `insert` or `delete` (pending at the end of the UTC
    /// day), or `unsynchronised`.
    #[serde(default = "leap_unknown")]
    pub leap: String,
    /// Detail text.
    pub detail: String,
}

fn leap_unknown() -> String {
    "unknown".into()
}

/// CPU, memory and kernel of a host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostInfo {
    /// Host name.
    pub host: String,
    /// CPU model.
    pub cpu_model: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Kernel release.
    pub kernel: String,
}

/// What a stage measured over a run, as `run.json` states it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageStats {
    /// Stage name.
    pub name: String,
    /// From hop name.
    pub from: String,
    /// To hop name.
    pub to: String,
    /// The definition the report prints.
    pub definition: String,
    /// Shown in the highlights.
    pub headline: bool,
    /// Its figures over every known delta (traces with both hops).
    #[serde(flatten)]
    pub figures: Figures,
    /// The interval log of the deltas >= 0, relative to the run directory.
    pub hdr_log: String,
    /// The interval log of the magnitudes of the deltas < 0, when there were any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hdr_negative_log: Option<String>,
}

/// A closed part file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartFile {
    /// File name within `traces/`.
    pub name: String,
    /// Rows in it.
    pub rows: u64,
    /// Bytes on disk.
    pub bytes: u64,
}

/// What a restarted collector found in a run directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// Complete part files kept.
    pub files: u64,
    /// Rows in them.
    pub rows: u64,
    /// Unfinished files (no footer: the open row group of a killed collector), renamed
    /// to `*.unfinished` and not read: (name, bytes).
    pub unfinished: Vec<(String, u64)>,
    /// Part files whose footer does not read, renamed to `*.corrupt`: (name, error).
    pub corrupt: Vec<(String, String)>,
}

/// What a group run holds: members, their logs and their summaries.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The consumer group.
    pub group: String,
    /// Members that wrote into the run, and whether each finished.
    pub members: BTreeMap<String, bool>,
    /// Segments counted.
    pub segments: u64,
    /// Segments set aside (repeated by a later owner after a member stopped without
    /// committing them).
    pub segments_set_aside: u64,
    /// Rows in the set-aside segments' files.
    pub rows_set_aside: u64,
    /// Partitions and, for each, the members that owned it in order.
    pub owners: BTreeMap<i32, Vec<String>>,
    /// Records-topic messages that were not hoptrace records frames, skipped: summed
    /// over members (a message re-read by a partition's next owner counts again).
    #[serde(default)]
    pub bad_messages: u64,
    /// Control-topic messages that were not hoptrace frames, skipped: every member reads
    /// the whole control topic, so the largest member count.
    #[serde(default)]
    pub bad_control_messages: u64,
}
