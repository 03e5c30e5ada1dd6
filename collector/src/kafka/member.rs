//! One collector of a consumer group: reads its partitions of the records topic and the
//! whole control topic, joins ([`crate::partition`]) and writes its own files under
//! `runs/<run-id>/members/<member>/`.

use std::collections::{BTreeMap, hash_map::DefaultHasher};
use std::hash::{Hash as _, Hasher as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_protocol::{self as protocol, CountersFrame, Frame, MAX_FRAME_LEN, counter_id};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::control::Control;
use crate::join::JoinedTrace;
use crate::partition::{Checkpoint, PartitionJoin};
use crate::run::host_info;
use crate::server::Event;
use crate::writer::{TraceWriter, TraceWriterConfig};
use hoptrace_format::group::{self, Ownership, Segment};
use hoptrace_format::run::{GroupInfo, PartFile, RunSummary};
use hoptrace_format::spec::{PipelineSpec, ResolvedSpec};

use hoptrace_broker::kafka::{BROKER_WAIT, Leaving, QuietContext, check_topics, quiet};

use super::topic::{
    CLEAN_HEADER, FORWARDED_HEADER, KafkaError, PEER_HEADER, RecordsTopic, SOURCE_HEADER, io_err,
};

/// How a group member runs: [`MemberConfig::new`], then set what differs from its
/// defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemberConfig {
    /// Where the records are.
    pub target: RecordsTopic,
    /// Consumer group.
    pub group: String,
    /// This member's name (its directory under `members/`); unique in the group.
    pub member: String,
    /// The pipeline.
    pub spec: PipelineSpec,
    /// Directory under which `<run-id>/members/<member>/` is written.
    pub out_dir: PathBuf,
    /// Run id (shared by the group's members).
    pub run_id: String,
    /// Time between checkpoints (files closed, offsets committed).
    pub commit_interval: Duration,
    /// On stop, how long to keep reading to reach the end of the assigned partitions.
    pub stop_timeout: Duration,
}

impl MemberConfig {
    /// Member `member` of consumer group `group`, reading `target` for the run `run_id`
    /// of `spec` and writing under `out_dir`: a checkpoint every 5 s, up to 60 s on stop
    /// to read to the end of its partitions.
    #[must_use]
    pub fn new(
        target: RecordsTopic,
        group: impl Into<String>,
        member: impl Into<String>,
        spec: PipelineSpec,
        out_dir: impl Into<PathBuf>,
        run_id: impl Into<String>,
    ) -> Self {
        Self {
            target,
            group: group.into(),
            member: member.into(),
            spec,
            out_dir: out_dir.into(),
            run_id: run_id.into(),
            commit_interval: Duration::from_secs(5),
            stop_timeout: Duration::from_secs(60),
        }
    }
}

/// Live figures of a member.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MemberProgress {
    /// Partitions assigned now.
    pub partitions: Vec<i32>,
    /// Kafka messages read (records topic).
    pub messages: u64,
    /// Hop records read.
    pub records: u64,
    /// Traces written.
    pub traces: u64,
    /// Traces waiting in open buckets.
    pub pending: u64,
    /// Checkpoints committed.
    pub commits: u64,
    /// Checkpoints Kafka refused (their segments are set aside when the partition moves).
    pub commit_failures: u64,
    /// Records-topic messages that are not hoptrace records frames (counted, skipped).
    pub bad_messages: u64,
    /// Control-topic messages that are not hoptrace frames with a source header
    /// (counted, skipped).
    pub bad_control_messages: u64,
    /// Rebalances seen.
    pub rebalances: u64,
}

struct Owned {
    join: PartitionJoin,
    writer: Option<TraceWriter>,
    /// Position at the last checkpoint.
    seg_from: i64,
}

/// A partition as assigned: where to read from and where its owner's stretch starts.
struct Assigned {
    /// The offset reading starts at: the partition's origin (a replay of the previous
    /// owner's stretch), the checkpoint's position (this member's own state, kept), or
    /// the committed offset.
    resume: i64,
    /// The previous owner's checkpoint, if any.
    checkpoint: Option<Checkpoint>,
    /// This member's own state of the partition, when it gets back a partition it just
    /// had and nobody moved it on.
    kept: Option<PartitionJoin>,
    /// The start logged in `ownership.jsonl`.
    start: i64,
}

struct MemberState {
    cfg: MemberConfig,
    spec: Arc<ResolvedSpec>,
    dir: PathBuf,
    partitions: BTreeMap<i32, Owned>,
    /// Partitions of the records topic (the relay placed records by it).
    partition_count: i32,
    /// Assigned partitions waiting for their first message.
    assigned: BTreeMap<i32, Assigned>,
    /// The state of partitions revoked at the last rebalance, in case they come back.
    parked: BTreeMap<i32, PartitionJoin>,
    segments: Vec<Segment>,
    owners: Vec<Ownership>,
    progress: MemberProgress,
    out: Vec<JoinedTrace>,
    error: Option<KafkaError>,
}

impl MemberState {
    fn part_dir(&self, p: i32) -> PathBuf {
        self.dir.join("traces").join(format!("p{p:04}"))
    }

    fn owned(&mut self, p: i32, offset: i64) -> &mut Owned {
        if !self.partitions.contains_key(&p) {
            let a = self.assigned.remove(&p).unwrap_or(Assigned {
                resume: offset,
                checkpoint: None,
                kept: None,
                start: 0,
            });
            let join = a.kept.unwrap_or_else(|| {
                PartitionJoin::new(
                    Arc::clone(&self.spec),
                    p,
                    self.partition_count,
                    offset,
                    a.checkpoint,
                )
            });
            if join.replaying() {
                tracing::info!(
                    partition = p,
                    from = join.start_offset(),
                    "replaying the partition to the previous owner's checkpoint"
                );
            }
            self.partitions.insert(
                p,
                Owned {
                    join,
                    writer: None,
                    seg_from: a.start,
                },
            );
        }
        self.partitions.get_mut(&p).expect("inserted above")
    }

    fn message(
        &mut self,
        p: i32,
        offset: i64,
        timestamp_ns: Option<i64>,
        payload: Option<&[u8]>,
    ) -> Result<(), KafkaError> {
        self.progress.messages += 1;
        let frame = payload.and_then(one_frame);
        let mut out = std::mem::take(&mut self.out);
        let owned = self.owned(p, offset);
        match frame {
            Some(Frame::Records(recs)) => {
                owned.join.message(offset, timestamp_ns, &recs, &mut out);
                self.progress.records += recs.len() as u64;
            }
            _ => {
                owned.join.skip(offset);
                self.progress.bad_messages += 1;
                tracing::warn!(
                    partition = p,
                    offset,
                    "skipped a message that is not a hoptrace records frame"
                );
            }
        }
        self.write(p, &mut out)?;
        self.out = out;
        Ok(())
    }

    fn write(&mut self, p: i32, out: &mut Vec<JoinedTrace>) -> Result<(), KafkaError> {
        if out.is_empty() {
            return Ok(());
        }
        let dir = self.part_dir(p);
        let (run_id, hops, o) = (
            self.cfg.run_id.clone(),
            self.spec.hop_names().to_vec(),
            self.cfg.spec.output,
        );
        let owned = self.partitions.get_mut(&p).expect("a partition that emits");
        if owned.writer.is_none() {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            owned.writer = Some(TraceWriter::new(TraceWriterConfig {
                dir,
                run_id,
                hop_names: hops,
                row_group_rows: o.row_group_rows,
                roll_rows: o.roll_rows,
                roll_seconds: u64::MAX,
                zstd_level: o.zstd_level,
            })?);
        }
        let w = owned.writer.as_mut().expect("created above");
        for t in out.drain(..) {
            w.push(&t)?;
            self.progress.traces += 1;
        }
        Ok(())
    }

    /// Closes the files of `partitions`, logs their segments and commits their offsets
    /// with their checkpoints.
    fn checkpoint(
        &mut self,
        consumer: &BaseConsumer<MemberContext>,
        partitions: &[i32],
    ) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            let dir = self.part_dir(*p);
            let Some(owned) = self.partitions.get_mut(p) else {
                continue;
            };
            let mut files = Vec::new();
            if let Some(w) = owned.writer.take() {
                for f in w.finish()? {
                    let path = dir.join(&f.name);
                    std::fs::File::open(&path)
                        .and_then(|f| f.sync_all())
                        .map_err(io_err(&path))?;
                    files.push(PartFile {
                        name: format!("traces/p{p:04}/{}", f.name),
                        ..f
                    });
                }
                if let Ok(d) = std::fs::File::open(&dir) {
                    let _ = d.sync_all();
                }
            }
            let tally = owned.join.take_tally();
            let to = owned.join.position();
            if !files.is_empty() || !tally.is_empty() || to > owned.seg_from {
                let seg = Segment {
                    member: self.cfg.member.clone(),
                    partition: *p,
                    from: owned.seg_from,
                    to,
                    files,
                    tally,
                };
                let log = self.dir.join(group::SEGMENTS_FILE);
                group::append_line(&log, &seg).map_err(io_err(&log))?;
                self.segments.push(seg);
                owned.seg_from = to;
            }
            let cp = owned.join.checkpoint();
            tpl.add_partition_offset(&self.cfg.target.topic, *p, Offset::Offset(cp.position))?;
            if let Some(mut e) = tpl.find_partition(&self.cfg.target.topic, *p) {
                e.set_metadata(cp.to_metadata());
            }
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => self.progress.commits += 1,
            Err(e) => {
                // Not fatal: the segments since the last commit are set aside if the
                // partition moves, and its next owner repeats them.
                self.progress.commit_failures += 1;
                tracing::warn!("commit failed: {e}");
            }
        }
        Ok(())
    }

    /// Logs the ownership of each newly assigned partition and decides where its reading
    /// starts; returns the assignment with those offsets.
    fn assigned(
        &mut self,
        consumer: &BaseConsumer<MemberContext>,
        tpl: &TopicPartitionList,
    ) -> TopicPartitionList {
        let committed = consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .unwrap_or_else(|e| {
                tracing::warn!("reading committed offsets failed: {e}");
                tpl.clone()
            });
        let mut parked = std::mem::take(&mut self.parked);
        let mut out = tpl.clone();
        let now = hoptrace_clock::realtime_ns();
        for e in committed.elements_for_topic(&self.cfg.target.topic) {
            let p = e.partition();
            let cp = Checkpoint::from_metadata(e.metadata());
            // Our own state, when the partition comes back as we left it.
            let kept = parked
                .remove(&p)
                .filter(|j| cp.as_ref() == Some(&j.checkpoint()));
            let resume = match (&kept, &cp, e.offset()) {
                (Some(j), _, _) => Some(j.start_offset()),
                (None, Some(c), _) => Some(c.origin),
                (None, None, Offset::Offset(o)) => Some(o),
                (None, None, _) => None,
            };
            if let Some(o) = resume
                && let Err(err) =
                    out.set_partition_offset(&self.cfg.target.topic, p, Offset::Offset(o))
            {
                self.error.get_or_insert(err.into());
            }
            let own = Ownership {
                member: self.cfg.member.clone(),
                partition: p,
                start: cp.as_ref().map_or(0, |c| c.position),
                assigned_unix_ns: now,
            };
            let log = self.dir.join(group::OWNERSHIP_FILE);
            if let Err(e) = group::append_line(&log, &own) {
                self.error.get_or_insert(io_err(&log)(e));
            }
            tracing::info!(
                partition = p,
                resume,
                start = own.start,
                kept = kept.is_some(),
                "assigned a partition"
            );
            self.assigned.insert(
                p,
                Assigned {
                    resume: resume.unwrap_or(0),
                    checkpoint: cp,
                    kept,
                    start: own.start,
                },
            );
            self.owners.push(own);
        }
        out
    }

    fn revoked(&mut self, consumer: &BaseConsumer<MemberContext>, tpl: &TopicPartitionList) {
        let ps: Vec<i32> = tpl
            .elements_for_topic(&self.cfg.target.topic)
            .iter()
            .map(rdkafka::topic_partition_list::TopicPartitionListElem::partition)
            .collect();
        if let Err(e) = self.checkpoint(consumer, &ps) {
            self.error.get_or_insert(e);
        }
        for p in &ps {
            if let Some(o) = self.partitions.remove(p) {
                self.parked.insert(*p, o.join);
            }
            self.assigned.remove(p);
            tracing::info!(partition = p, "revoked a partition");
        }
    }
}

struct MemberContext {
    state: Arc<Mutex<MemberState>>,
}

impl ClientContext for MemberContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        quiet().client_log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        quiet().client_error(&error, reason);
    }
}

impl ConsumerContext for MemberContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka::types::RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        use rdkafka::types::RDKafkaRespErr as E;
        let mut s = self.state.lock().expect("member state poisoned");
        s.progress.rebalances += 1;
        match err {
            E::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                // Each partition starts where its state is rebuilt from: the origin for a
                // replay, the position for a state this member kept.
                let assignment = s.assigned(consumer, tpl);
                drop(s);
                if let Err(e) = consumer.assign(&assignment) {
                    quiet().log(
                        tracing::Level::ERROR,
                        &format!("kafka: assigning partitions: {e}"),
                    );
                }
            }
            E::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                s.revoked(consumer, tpl);
                drop(s);
                if let Err(e) = consumer.unassign() {
                    quiet().log(
                        tracing::Level::ERROR,
                        &format!("kafka: revoking partitions: {e}"),
                    );
                }
            }
            other => {
                let code: RDKafkaErrorCode = other.into();
                quiet().log(
                    tracing::Level::ERROR,
                    &format!("kafka: rebalance failed: {code}"),
                );
            }
        }
    }
}

/// A stable id for a control message's source.
fn source_id(source: &str) -> u64 {
    let mut h = DefaultHasher::new();
    source.hash(&mut h);
    h.finish()
}

fn header<'a>(m: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a str> {
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// The one protocol frame a Kafka message holds; `None` for anything else.
fn one_frame(payload: &[u8]) -> Option<Frame> {
    let (ty, body, len) = protocol::split_frame(payload, MAX_FRAME_LEN).ok()??;
    (len == payload.len())
        .then(|| Frame::decode(ty, &payload[body]).ok())
        .flatten()
}

/// What a control message says.
enum ControlMessage {
    /// What a TCP collector would have seen from a probe.
    Event(Event),
    /// The relay's count of the records it forwarded from a connection, by hop wire id.
    Forwarded(u64, CountersFrame),
}

/// Reads a control message.
fn control_message(m: &BorrowedMessage<'_>) -> Option<ControlMessage> {
    let id = source_id(header(m, SOURCE_HEADER)?);
    let frame = one_frame(m.payload()?)?;
    if header(m, FORWARDED_HEADER) == Some("1") {
        return match frame {
            Frame::Counters(c) => Some(ControlMessage::Forwarded(id, c)),
            _ => None,
        };
    }
    control_event(id, m, frame).map(ControlMessage::Event)
}

/// Turns a control frame into the event a TCP collector would have seen.
fn control_event(id: u64, m: &BorrowedMessage<'_>, frame: Frame) -> Option<Event> {
    match frame {
        Frame::Hello(h) => {
            let peer = header(m, PEER_HEADER)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            Some(Event::Connected(id, peer, h))
        }
        Frame::Goodbye => Some(Event::Closed(id, header(m, CLEAN_HEADER) == Some("1"))),
        f => Some(Event::Frame(id, f)),
    }
}

/// Runs one member of the group until `stop` is set, then reads its partitions to their
/// end (at most `stop_timeout`), closes every bucket, commits, and writes the member's
/// `run.json`, `clock.parquet` and `probes.parquet`. `progress` is called about once a
/// second.
///
/// # Errors
/// A bad setting, a Kafka error on joining, a file that cannot be written.
pub fn run_member(
    cfg: &MemberConfig,
    stop: &AtomicBool,
    mut progress: impl FnMut(&MemberProgress),
) -> Result<RunSummary, KafkaError> {
    let spec = Arc::new(ResolvedSpec::new(&cfg.spec).map_err(crate::CollectorError::from)?);
    if cfg.member.is_empty() || cfg.member.contains(['/', '\\']) || cfg.member.starts_with('.') {
        return Err(KafkaError::Config(format!(
            "member name {:?}: give a plain directory name",
            cfg.member
        )));
    }
    let started_unix_ns = hoptrace_clock::realtime_ns();
    let dir = cfg
        .out_dir
        .join(&cfg.run_id)
        .join(group::MEMBERS_DIR)
        .join(&cfg.member);
    if dir.join("run.json").exists() {
        return Err(KafkaError::Config(format!(
            "{} already holds a finished member: use another --member or --run-id",
            dir.display()
        )));
    }
    let control_topic = cfg.target.control_topic();
    let partition_count = check_topics(
        &cfg.target.brokers,
        &[&cfg.target.topic, &control_topic],
        stop,
        BROKER_WAIT,
    )?;
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let state = Arc::new(Mutex::new(MemberState {
        cfg: cfg.clone(),
        spec: Arc::clone(&spec),
        dir: dir.clone(),
        partitions: BTreeMap::new(),
        partition_count,
        assigned: BTreeMap::new(),
        parked: BTreeMap::new(),
        segments: Vec::new(),
        owners: Vec::new(),
        progress: MemberProgress::default(),
        out: Vec::new(),
        error: None,
    }));
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &cfg.target.brokers)
        .set("group.id", &cfg.group)
        .set("client.id", format!("hoptrace-{}", cfg.member))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("partition.assignment.strategy", "roundrobin")
        .set("isolation.level", "read_committed");
    cfg.target.apply_client(&mut client);
    let consumer = Leaving::new(client.create_with_context(MemberContext {
        state: Arc::clone(&state),
    })?);
    consumer.subscribe(&[&cfg.target.topic])?;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &cfg.target.brokers)
        .set("group.id", format!("{}.control.{}", cfg.group, cfg.member))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    cfg.target.apply_client(&mut client);
    let control_consumer: Leaving<QuietContext> =
        Leaving::new(client.create_with_context(QuietContext)?);
    let mut ctl_tpl = TopicPartitionList::new();
    ctl_tpl.add_partition_offset(&control_topic, 0, Offset::Beginning)?;
    control_consumer.assign(&ctl_tpl)?;
    let mut control = Control::default();
    let mut control_position = 0i64;

    let mut last_commit = Instant::now();
    let mut last_progress = Instant::now();
    let mut stopping: Option<Instant> = None;
    let mut unreachable_since: Option<Instant> = None;
    loop {
        if stop.load(Relaxed) && stopping.is_none() {
            tracing::info!("stopping: reading the assigned partitions to their end");
            stopping = Some(Instant::now());
        }
        let polled = consumer.poll(Duration::from_millis(50));
        {
            let mut s = state.lock().expect("member state poisoned");
            if let Some(e) = s.error.take() {
                return Err(e);
            }
            match polled {
                Some(Ok(m)) => {
                    let ts = m
                        .timestamp()
                        .to_millis()
                        .map(|ms| ms.saturating_mul(1_000_000));
                    s.message(m.partition(), m.offset(), ts, m.payload())?;
                }
                Some(Err(e)) => {
                    quiet().log(tracing::Level::WARN, &format!("kafka: {e}"));
                }
                None => {}
            }
            if last_commit.elapsed() >= cfg.commit_interval {
                last_commit = Instant::now();
                let ps: Vec<i32> = s.partitions.keys().copied().collect();
                s.checkpoint(&consumer, &ps)?;
            }
            if last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                s.progress.pending = s.partitions.values().map(|o| o.join.pending() as u64).sum();
                s.progress.partitions = s
                    .assigned
                    .keys()
                    .chain(s.partitions.keys())
                    .copied()
                    .collect();
                progress(&s.progress);
            }
        }
        while let Some(r) = control_consumer.poll(Duration::ZERO) {
            match r {
                Ok(m) => {
                    control_position = m.offset() + 1;
                    match control_message(&m) {
                        Some(ControlMessage::Event(ev)) => control.handle(ev)?,
                        Some(ControlMessage::Forwarded(id, c)) => control.forwarded(id, &c, &spec),
                        None => {
                            state
                                .lock()
                                .expect("member state poisoned")
                                .progress
                                .bad_control_messages += 1;
                            tracing::warn!(
                                offset = m.offset(),
                                "skipped a control message that is not a hoptrace frame"
                            );
                        }
                    }
                }
                Err(e) => {
                    quiet().log(tracing::Level::WARN, &format!("kafka (control): {e}"));
                }
            }
        }
        if let Some(since) = stopping {
            let done = match caught_up(
                &consumer,
                &state,
                &cfg.target.topic,
                &control_consumer,
                &control_topic,
                control_position,
            ) {
                Some(done) => {
                    unreachable_since = None;
                    done
                }
                None => {
                    // Kafka does not answer: waiting for the partitions' end would only
                    // delay the stop the user asked for.
                    let first = *unreachable_since.get_or_insert_with(Instant::now);
                    if first.elapsed() >= BROKER_WAIT {
                        tracing::warn!(
                            brokers = %cfg.target.brokers,
                            "Kafka does not answer: stopping with what was read"
                        );
                        break;
                    }
                    false
                }
            };
            if done || since.elapsed() >= cfg.stop_timeout {
                if !done {
                    tracing::warn!(
                        timeout = ?cfg.stop_timeout,
                        "stopping before reaching the end of every partition"
                    );
                }
                break;
            }
        }
    }
    let mut s = state.lock().expect("member state poisoned");
    let ps: Vec<i32> = s.partitions.keys().copied().collect();
    for p in &ps {
        let mut out = std::mem::take(&mut s.out);
        if let Some(o) = s.partitions.get_mut(p) {
            o.join.drain(&mut out);
        }
        s.write(*p, &mut out)?;
        s.out = out;
    }
    s.checkpoint(&consumer, &ps)?;
    let summary = member_summary(&s, &mut control, started_unix_ns)?;
    control.write_tables(&dir)?;
    let path = dir.join("run.json");
    summary.write(&path).map_err(io_err(&path))?;
    progress(&s.progress);
    drop(s);
    consumer.unsubscribe();
    Ok(summary)
}

/// Whether every assigned partition and the control topic have been read to their end;
/// `None` when Kafka does not answer.
fn caught_up(
    consumer: &BaseConsumer<MemberContext>,
    state: &Mutex<MemberState>,
    topic: &str,
    control: &BaseConsumer<QuietContext>,
    control_topic: &str,
    control_position: i64,
) -> Option<bool> {
    let t = Duration::from_secs(1);
    let (_, high) = control.fetch_watermarks(control_topic, 0, t).ok()?;
    if control_position < high {
        return Some(false);
    }
    let Ok(assignment) = consumer.assignment() else {
        return Some(false);
    };
    let s = state.lock().expect("member state poisoned");
    let mut done = true;
    for e in assignment.elements_for_topic(topic) {
        let p = e.partition();
        let pos = s
            .partitions
            .get(&p)
            .map(|o| o.join.position())
            .or_else(|| s.assigned.get(&p).map(|a| a.resume));
        let (low, high) = consumer.fetch_watermarks(topic, p, t).ok()?;
        done &= match pos {
            Some(pos) => pos >= high,
            None => low == high,
        };
    }
    Some(done)
}

fn member_summary(
    s: &MemberState,
    control: &mut Control,
    started_unix_ns: i64,
) -> Result<RunSummary, KafkaError> {
    let mut total = group::Tally::default();
    let mut files = Vec::new();
    for seg in &s.segments {
        total.add(&seg.tally);
        files.extend(seg.files.iter().cloned());
    }
    let (publishers, discrepancies) =
        group::publishers_by_keys(&control.sent_by_publisher(), &total.rows(), &total.keys);
    let (clock, alerts) = control.clock()?;
    let alerts = alerts.to_vec();
    let mut owners: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for o in &s.owners {
        owners
            .entry(o.partition)
            .or_default()
            .push(o.member.clone());
    }
    Ok(RunSummary {
        run_id: s.cfg.run_id.clone(),
        pipeline: s.cfg.spec.clone(),
        started_unix_ns,
        ended_unix_ns: hoptrace_clock::realtime_ns(),
        collector_host: host_info(),
        probes: control.probe_infos(Some(s.spec.hop_names()), None),
        clock,
        clock_alerts: alerts,
        files,
        stages: Vec::new(),
        recovered: None,
        accounting: total.accounting(
            s.spec.hop_names(),
            publishers,
            control.records_lost(),
            control.latest_counter_sum(counter_id::UNANNOUNCED_HOP),
            discrepancies,
        ),
        connections: BTreeMap::new(),
        otlp: BTreeMap::new(),
        group: Some(GroupInfo {
            group: s.cfg.group.clone(),
            members: [(s.cfg.member.clone(), true)].into(),
            segments: s.segments.len() as u64,
            segments_set_aside: 0,
            bad_messages: s.progress.bad_messages,
            bad_control_messages: s.progress.bad_control_messages,
            rows_set_aside: 0,
            owners,
        }),
        interrupted: false,
        restarts: Vec::new(),
    })
}
