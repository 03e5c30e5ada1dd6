//! Scale-out over Kafka: a [`Relay`] takes probe connections (the collector protocol,
//! with the same checks as a collector) and writes their records to a Kafka topic, each
//! record in the partition of its trace key; [`run_member`] is one collector of a
//! consumer group reading that topic, joining its partitions ([`crate::partition`]) and
//! writing its own files under `runs/<run-id>/members/<member>/`.
//!
//! Records go to `TOPIC` as protocol Records frames, one Kafka message per frame and
//! partition (the message key is the trace key of its first record). Everything else a
//! probe says (hello, clock, counters, sent, goodbye) goes to `TOPIC.control`, one
//! partition, which every member reads whole.

use std::collections::{BTreeMap, hash_map::DefaultHasher};
use std::hash::{Hash as _, Hasher as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_protocol::{
    self as protocol, CountersFrame, Frame, Hello, MAX_FRAME_LEN, MAX_RECORDS_PER_FRAME,
    PROTOCOL_VERSION, counter_id,
};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::join::JoinedTrace;
use crate::partition::{self, Checkpoint, PartitionJoin};
use crate::run::{Control, host_info};
use crate::server::{self, ConnectionCounters, Event, ServerConfig};
use crate::writer::{TraceWriter, TraceWriterConfig};
use hoptrace_format::group::{self, Ownership, Segment};
use hoptrace_format::run::{GroupInfo, PartFile, RunSummary};
use hoptrace_format::spec::{PipelineSpec, ResolvedSpec};

/// Header naming the probe connection a control message came from.
const SOURCE_HEADER: &str = "hoptrace-source";
/// Header with the probe's address, on hello messages.
const PEER_HEADER: &str = "hoptrace-peer";
/// Header on goodbye messages: "1" when the probe said goodbye, "0" when it vanished.
const CLEAN_HEADER: &str = "hoptrace-clean";
/// Header ("1") on the relay's Counters frames that count, per hop wire id (the counter
/// id), the records it forwarded from the connection named by the source header.
const FORWARDED_HEADER: &str = "hoptrace-forwarded";

/// A Kafka address `kafka://HOST:PORT[,HOST:PORT...]/TOPIC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaTarget {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// The records topic; control messages go to `<topic>.control`.
    pub topic: String,
}

impl KafkaTarget {
    /// Parses `kafka://brokers/topic`.
    ///
    /// # Errors
    /// A message naming what is missing.
    pub fn parse(url: &str) -> Result<Self, KafkaError> {
        let rest = url.strip_prefix("kafka://").ok_or_else(|| {
            KafkaError::Config(format!("{url:?}: expected kafka://HOST:PORT[,...]/TOPIC"))
        })?;
        let (brokers, topic) = rest.split_once('/').ok_or_else(|| {
            KafkaError::Config(format!("{url:?}: no topic (kafka://HOST:PORT/TOPIC)"))
        })?;
        if brokers.is_empty() || topic.is_empty() || topic.contains('/') {
            return Err(KafkaError::Config(format!(
                "{url:?}: expected kafka://HOST:PORT[,...]/TOPIC"
            )));
        }
        Ok(Self {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
        })
    }

    /// The control topic.
    #[must_use]
    pub fn control_topic(&self) -> String {
        format!("{}.control", self.topic)
    }
}

/// What went wrong talking to Kafka or writing a member's files.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A setting is wrong.
    #[error("{0}")]
    Config(String),
    /// Kafka refused or failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The collector side failed (spec, listen, files).
    #[error(transparent)]
    Collector(#[from] crate::CollectorError),
    /// Writing Parquet failed.
    #[error(transparent)]
    Write(#[from] crate::writer::WriteError),
    /// A file or directory cannot be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KafkaError + '_ {
    move |source| KafkaError::Io {
        path: path.to_owned(),
        source,
    }
}

/// librdkafka's log lines and errors, summarised: a client that cannot reach its brokers
/// says so every few milliseconds, each line with new counters in it. The first line of a
/// kind is logged; its repeats are counted and told once every [`QuietLogs::EVERY`].
#[derive(Debug, Default)]
pub struct QuietLogs {
    seen: Mutex<BTreeMap<String, (u64, Instant)>>,
}

impl QuietLogs {
    /// How often repeats are summarised.
    pub const EVERY: Duration = Duration::from_secs(30);

    /// Logs `message` at `level`, or counts it when a line of its kind was logged
    /// within [`Self::EVERY`]; returns whether it was logged.
    pub fn log(&self, level: tracing::Level, message: &str) -> bool {
        // Lines of a kind differ in numbers (times, counts, ports of new connections).
        let mut kind = String::new();
        for c in message.chars().take(160) {
            if !c.is_ascii_digit() {
                kind.push(c);
            } else if !kind.ends_with('#') {
                kind.push('#');
            }
        }
        let repeats = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let entry = seen
                .entry(kind)
                .or_insert((0, Instant::now() - Self::EVERY));
            if entry.1.elapsed() < Self::EVERY {
                entry.0 += 1;
                return false;
            }
            let repeats = entry.0;
            *entry = (0, Instant::now());
            repeats
        };
        let also = if repeats > 0 {
            format!(
                " (and {repeats} more like it in the last {}s)",
                Self::EVERY.as_secs()
            )
        } else {
            String::new()
        };
        match level {
            tracing::Level::ERROR => tracing::error!("{message}{also}"),
            tracing::Level::WARN => tracing::warn!("{message}{also}"),
            tracing::Level::INFO => tracing::info!("{message}{also}"),
            _ => tracing::debug!("{message}{also}"),
        }
        true
    }

    /// For [`ClientContext::log`].
    fn client_log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let level = match level {
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::Level::ERROR,
            L::Warning => tracing::Level::WARN,
            L::Notice | L::Info => tracing::Level::INFO,
            L::Debug => tracing::Level::DEBUG,
        };
        self.log(level, &format!("kafka: {fac} {message}"));
    }
}

/// The summariser every Kafka client of this process logs through.
fn quiet() -> &'static QuietLogs {
    static QUIET: std::sync::OnceLock<QuietLogs> = std::sync::OnceLock::new();
    QUIET.get_or_init(QuietLogs::default)
}

/// A client context with nothing but summarised logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuietContext;

impl ClientContext for QuietContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        quiet().client_log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        quiet().log(tracing::Level::ERROR, &format!("kafka: {error}: {reason}"));
    }
}

impl ConsumerContext for QuietContext {}

/// How long [`check_topics`] waits for a broker to answer.
pub const BROKER_WAIT: Duration = Duration::from_secs(6);

/// Checks, before a consumer joins, that a broker at `brokers` answers and that every
/// topic of `topics` exists: a consumer would otherwise wait forever, logging. Gives up
/// after `within`, or as soon as `stop` is set. Returns the partition count of the first
/// topic.
///
/// # Errors
/// [`KafkaError::Config`] naming the brokers ("no Kafka broker reachable at ..."), the
/// missing topic and how to create it, or the interruption.
pub fn check_topics(
    brokers: &str,
    topics: &[&str],
    stop: &AtomicBool,
    within: Duration,
) -> Result<i32, KafkaError> {
    let client: BaseConsumer<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let deadline = Instant::now() + within;
    let metadata = loop {
        if stop.load(Relaxed) {
            return Err(KafkaError::Config(format!(
                "interrupted while waiting for a Kafka broker at {brokers}"
            )));
        }
        match client.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(md) if !md.brokers().is_empty() => break md,
            Ok(_) => {}
            Err(e) if Instant::now() >= deadline => {
                return Err(KafkaError::Config(format!(
                    "no Kafka broker reachable at {brokers} within {}s ({e}): check the address, and that Kafka runs",
                    within.as_secs()
                )));
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(KafkaError::Config(format!(
                "no Kafka broker reachable at {brokers} within {}s: check the address, and that Kafka runs",
                within.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for topic in topics {
        let exists = metadata
            .topics()
            .iter()
            .any(|t| t.name() == *topic && t.error().is_none());
        if !exists {
            return Err(KafkaError::Config(format!(
                "topic {topic} does not exist at {brokers}: create it, e.g. by starting `hoptrace relay --to kafka://{brokers}/{}` (which creates the records and control topics), or with kafka-topics.sh --create --topic {topic}",
                topic.strip_suffix(".control").unwrap_or(topic)
            )));
        }
    }
    Ok(topics
        .first()
        .and_then(|first| metadata.topics().iter().find(|t| t.name() == *first))
        .map_or(1, |t| {
            i32::try_from(t.partitions().len()).unwrap_or(i32::MAX)
        }))
}

/// Creates `topic` with `partitions` partitions, `replication` replicas and the topic
/// settings `config` (`("min.insync.replicas", "2")`) unless it exists, and returns its
/// partition count once every partition has a leader (an existing topic keeps its own
/// count and settings: [`topic_layout`] tells them). A just-created topic reaches every
/// broker's metadata some time after the controller accepts it, so this waits up to
/// `METADATA_WAIT` for it.
///
/// # Errors
/// When Kafka refuses the topic for another reason than its existing, or it has no
/// leader for every partition in time.
pub fn ensure_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    replication: i32,
    config: &[(&str, &str)],
) -> Result<i32, KafkaError> {
    let client: BaseConsumer<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let led = || led_topic(&client, brokers, topic).map(|t| t.map(|(n, _)| n));
    if let Some(n) = led()? {
        return Ok(n);
    }
    let admin: AdminClient<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let new = config.iter().fold(
        NewTopic::new(topic, partitions, TopicReplication::Fixed(replication)),
        |t, (k, v)| t.set(k, v),
    );
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in block_on(admin.create_topics([&new], &opts))? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(KafkaError::Config(format!("creating topic {t}: {e}"))),
        }
    }
    wait_led(topic, led)
}

/// How long a topic may take to reach every broker's metadata with a leader for each
/// partition.
const METADATA_WAIT: Duration = Duration::from_secs(30);

/// Asks `led` until it answers, for up to [`METADATA_WAIT`].
fn wait_led<T>(
    topic: &str,
    led: impl Fn() -> Result<Option<T>, KafkaError>,
) -> Result<T, KafkaError> {
    let deadline = Instant::now() + METADATA_WAIT;
    loop {
        if let Some(n) = led()? {
            return Ok(n);
        }
        if Instant::now() >= deadline {
            return Err(KafkaError::Config(format!(
                "topic {topic} does not exist or has no leader for every partition after {}s",
                METADATA_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `topic`'s partitions and the replicas of its least replicated partition, once the
/// broker asked knows it with a leader for every partition (`None` before).
fn led_topic(
    client: &BaseConsumer<QuietContext>,
    brokers: &str,
    topic: &str,
) -> Result<Option<(i32, i32)>, KafkaError> {
    let md = client
        .fetch_metadata(Some(topic), BROKER_WAIT)
        .map_err(|e| {
            KafkaError::Config(format!(
                "no Kafka broker reachable at {brokers} within {}s ({e}): check the address, and that Kafka runs",
                BROKER_WAIT.as_secs()
            ))
        })?;
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    Ok(md.topics().first().and_then(|t| {
        let parts = t.partitions();
        let all_led = t.error().is_none()
            && !parts.is_empty()
            && parts.iter().all(|p| p.error().is_none() && p.leader() >= 0);
        all_led.then(|| {
            let replicas = parts.iter().map(|p| p.replicas().len()).min().unwrap_or(0);
            (count(parts.len()), count(replicas))
        })
    }))
}

/// How an existing topic is laid out: what a benchmark of durability modes must state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLayout {
    /// Partitions.
    pub partitions: i32,
    /// Replicas of its least replicated partition.
    pub replication: i32,
    /// Its `min.insync.replicas` (the topic's own or the broker's default).
    pub min_insync_replicas: Option<i32>,
}

/// The layout of `topic` as the cluster reports it: partitions and replicas from the
/// metadata (waiting, as [`ensure_topic`] does, for a just-created topic to reach the
/// broker asked), `min.insync.replicas` from the topic's configuration.
///
/// # Errors
/// No broker reachable, the topic missing, or the configuration not readable.
pub fn topic_layout(brokers: &str, topic: &str) -> Result<TopicLayout, KafkaError> {
    let client: BaseConsumer<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let (partitions, replication) = wait_led(topic, || led_topic(&client, brokers, topic))?;
    let admin: AdminClient<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let opts = AdminOptions::new().request_timeout(Some(BROKER_WAIT));
    let described = block_on(admin.describe_configs([&ResourceSpecifier::Topic(topic)], &opts))?;
    let mut min_insync_replicas = None;
    for r in described {
        let r = r.map_err(|e| {
            KafkaError::Config(format!("reading the configuration of topic {topic}: {e}"))
        })?;
        min_insync_replicas = r
            .get("min.insync.replicas")
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse().ok());
    }
    Ok(TopicLayout {
        partitions,
        replication,
        min_insync_replicas,
    })
}

/// Runs a future to completion on a small runtime (the admin API is async).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

// ---------------------------------------------------------------------------------------
// Relay

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Address probes connect to.
    pub listen: String,
    /// The pipeline (hops probes may report).
    pub spec: PipelineSpec,
    /// Where records go.
    pub target: KafkaTarget,
    /// Partitions and replication of the topics when the relay creates them.
    pub partitions: i32,
    /// Replication factor of created topics.
    pub replication: i32,
    /// Token probes must present; required on non-loopback addresses.
    pub token: Option<String>,
    /// TLS: the relay's certificate chain (PEM); with `tls_key`, every probe must speak
    /// TLS.
    pub tls_cert: Option<PathBuf>,
    /// TLS: the private key (PEM) of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Run id told to probes.
    pub run_id: String,
}

/// Live and final figures of a relay.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RelayStats {
    /// Probe connections open.
    pub connections: u64,
    /// Hop records received.
    pub records: u64,
    /// Kafka messages produced (records and control).
    pub messages: u64,
    /// Records Kafka acknowledged.
    pub delivered_records: u64,
    /// Records Kafka could not take (delivery failed after retries).
    pub failed_records: u64,
    /// Records by partition.
    pub records_by_partition: BTreeMap<i32, u64>,
    /// Connections closed, by reason.
    pub closed_connections: BTreeMap<String, u64>,
}

/// Counts deliveries; a message's opaque is the number of records it carries.
struct RelayContext {
    delivered: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for RelayContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        quiet().client_log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        quiet().log(tracing::Level::ERROR, &format!("kafka: {error}: {reason}"));
    }
}

impl ProducerContext for RelayContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, records: usize) {
        match result {
            Ok(_) => self.delivered.fetch_add(records as u64, Relaxed),
            Err((e, _)) => {
                quiet().log(tracing::Level::WARN, &format!("kafka delivery failed: {e}"));
                self.failed.fetch_add(records as u64, Relaxed)
            }
        };
    }
}

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    stats: Arc<Mutex<RelayStats>>,
    /// The accept thread and the pump that produces to Kafka.
    service: server::Service<Result<RelayStats, KafkaError>>,
}

impl Relay {
    /// Creates the topics if needed, binds and starts relaying.
    ///
    /// # Errors
    /// A bad spec, a non-loopback address without a token, a bind or Kafka error.
    pub fn start(cfg: RelayConfig) -> Result<Self, KafkaError> {
        let spec = Arc::new(ResolvedSpec::new(&cfg.spec).map_err(crate::CollectorError::from)?);
        let brokers = &cfg.target.brokers;
        let partitions = ensure_topic(
            brokers,
            &cfg.target.topic,
            cfg.partitions,
            cfg.replication,
            &[],
        )?;
        ensure_topic(
            brokers,
            &cfg.target.control_topic(),
            1,
            cfg.replication,
            &[],
        )?;
        let (listener, addr, tls) = server::bind(
            &cfg.listen,
            cfg.token.as_deref(),
            cfg.tls_cert.as_deref(),
            cfg.tls_key.as_deref(),
        )?;
        let producer: ThreadedProducer<RelayContext> = ClientConfig::new()
            .set("bootstrap.servers", &cfg.target.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .set("message.max.bytes", "2000000")
            .create_with_context(RelayContext {
                delivered: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            })?;
        let counters = Arc::new(ConnectionCounters::default());
        let stats = Arc::new(Mutex::new(RelayStats::default()));
        let server_cfg = ServerConfig {
            token: cfg.token.clone(),
            run_id: cfg.run_id.clone(),
            max_connections: 256,
            hello_timeout: Duration::from_secs(5),
            tls,
            durable: None,
            first_conn_id: 1,
        };
        let service = {
            let mut pump = Pump {
                producer,
                target: cfg.target.clone(),
                control: cfg.target.control_topic(),
                partitions,
                relay_id: format!("{:016x}", random_u64()),
                hops: spec
                    .hop_ids()
                    .iter()
                    .copied()
                    .zip(spec.hop_names().iter().cloned())
                    .collect(),
                stats: Arc::clone(&stats),
                counters: Arc::clone(&counters),
                records: 0,
                messages: 0,
                by_partition: BTreeMap::new(),
                batches: BTreeMap::new(),
                forwarded: BTreeMap::new(),
                forwarded_changed: std::collections::BTreeSet::new(),
            };
            server::Service::spawn(
                ("relay", "pump"),
                listener,
                server_cfg,
                &spec,
                &counters,
                256,
                move |rx, draining| pump.run(rx, draining),
            )
            .map_err(io_err(Path::new("relay threads")))?
        };
        tracing::info!(%addr, topic = %cfg.target.topic, partitions, "relay listening");
        Ok(Self {
            addr,
            stats,
            service,
        })
    }

    /// The bound address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Live figures.
    #[must_use]
    pub fn stats(&self) -> RelayStats {
        self.stats.lock().expect("stats poisoned").clone()
    }

    /// Stops accepting, relays what connected probes still send until they close (at
    /// most 10 s), flushes the producer and returns the final figures.
    ///
    /// # Errors
    /// A Kafka error of the last flush, or a panicked thread.
    pub fn stop(self) -> Result<RelayStats, KafkaError> {
        self.service
            .stop()
            .map_err(|_| KafkaError::Config("the relay thread panicked".into()))?
    }
}

struct Pump {
    producer: ThreadedProducer<RelayContext>,
    target: KafkaTarget,
    control: String,
    partitions: i32,
    relay_id: String,
    hops: Vec<(hoptrace_protocol::HopId, String)>,
    stats: Arc<Mutex<RelayStats>>,
    counters: Arc<ConnectionCounters>,
    records: u64,
    messages: u64,
    by_partition: BTreeMap<i32, u64>,
    batches: BTreeMap<i32, Vec<protocol::Record>>,
    /// Records forwarded per connection, by hop wire id.
    forwarded: BTreeMap<u64, BTreeMap<u8, u64>>,
    /// Connections whose forwarded counts changed since they were last published.
    forwarded_changed: std::collections::BTreeSet<u64>,
}

impl Pump {
    fn run(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        draining: &AtomicBool,
    ) -> Result<RelayStats, KafkaError> {
        let mut open: BTreeMap<u64, bool> = BTreeMap::new();
        let mut drain_deadline: Option<Instant> = None;
        let mut last_stats = Instant::now();
        // The relay is itself a source of counters: records it could not deliver.
        let me = Hello {
            version: PROTOCOL_VERSION,
            instance_id: random_u64(),
            host: hoptrace_clock::hostname(),
            process: "hoptrace relay".into(),
            software: concat!("hoptrace ", env!("CARGO_PKG_VERSION")).into(),
            token: String::new(),
            // The relay carries every hop's records (a Hello names at least one hop).
            hops: self.hops.clone(),
        };
        self.control_message(0, &Frame::Hello(me), &[(PEER_HEADER, "relay")]);
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(ev) => self.event(ev, &mut open),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if last_stats.elapsed() >= Duration::from_millis(500) {
                last_stats = Instant::now();
                self.publish_stats(&open);
                self.publish_forwarded();
                self.relay_counters();
            }
            if draining.load(Relaxed) {
                let deadline =
                    *drain_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(10));
                if open.values().all(|o| !o) || Instant::now() >= deadline {
                    while let Ok(ev) = rx.try_recv() {
                        self.event(ev, &mut open);
                    }
                    break;
                }
            }
        }
        self.producer.flush(Duration::from_secs(30))?;
        // The relay's final counters, after every delivery is known.
        self.publish_forwarded();
        self.relay_counters();
        self.control_message(0, &Frame::Goodbye, &[(CLEAN_HEADER, "1")]);
        self.producer.flush(Duration::from_secs(30))?;
        self.publish_stats(&open);
        Ok(self.stats.lock().expect("stats poisoned").clone())
    }

    /// Relays one connection event; `open` tracks which connections are open.
    fn event(&mut self, ev: Event, open: &mut BTreeMap<u64, bool>) {
        match ev {
            // The relay keeps no log: a frame's bytes as received are not needed.
            Event::FrameWithBytes(id, f, _) => self.event(Event::Frame(id, f), open),
            Event::Connected(id, peer, hello) => {
                open.insert(id, true);
                let peer = peer.to_string();
                self.control_message(id, &Frame::Hello(hello), &[(PEER_HEADER, &peer)]);
            }
            Event::Frame(id, Frame::Records(recs)) => {
                let by_hop = self.forwarded.entry(id).or_default();
                for r in &recs {
                    *by_hop.entry(r.hop.0).or_default() += 1;
                }
                self.forwarded_changed.insert(id);
                self.records(&recs);
            }
            Event::Frame(id, f) => self.control_message(id, &f, &[]),
            Event::Closed(id, clean) => {
                open.insert(id, false);
                // The connection's last forwarded counts go before its goodbye.
                self.publish_forwarded();
                let clean = if clean { "1" } else { "0" };
                self.control_message(id, &Frame::Goodbye, &[(CLEAN_HEADER, clean)]);
            }
        }
    }

    fn relay_counters(&mut self) {
        let ctx = self.producer.context();
        let frame = Frame::Counters(CountersFrame {
            at_ns: hoptrace_clock::realtime_ns(),
            values: vec![
                (counter_id::REPORTED, self.records),
                (counter_id::SENT, ctx.delivered.load(Relaxed)),
                (counter_id::SEND_FAILED, ctx.failed.load(Relaxed)),
                (
                    counter_id::UNANNOUNCED_HOP,
                    self.counters.unannounced_hop_records.load(Relaxed),
                ),
            ],
        });
        self.control_message(0, &frame, &[]);
    }

    /// Publishes, for each connection whose counts changed, the records forwarded from it
    /// by hop: members tell from them which probes stamped (a probe that stamped nothing
    /// is no host of any stage's clock uncertainty).
    fn publish_forwarded(&mut self) {
        for id in std::mem::take(&mut self.forwarded_changed) {
            let Some(by_hop) = self.forwarded.get(&id) else {
                continue;
            };
            let frame = Frame::Counters(CountersFrame {
                at_ns: hoptrace_clock::realtime_ns(),
                values: by_hop.iter().map(|(h, n)| (u16::from(*h), *n)).collect(),
            });
            self.control_message(id, &frame, &[(FORWARDED_HEADER, "1")]);
        }
    }

    fn publish_stats(&self, open: &BTreeMap<u64, bool>) {
        let ctx = self.producer.context();
        let mut s = self.stats.lock().expect("stats poisoned");
        s.connections = open.values().filter(|o| **o).count() as u64;
        s.records = self.records;
        s.messages = self.messages;
        s.delivered_records = ctx.delivered.load(Relaxed);
        s.failed_records = ctx.failed.load(Relaxed);
        s.records_by_partition.clone_from(&self.by_partition);
        s.closed_connections = crate::run::connection_counts(&self.counters);
        s.closed_connections.remove("accepted");
    }

    fn records(&mut self, recs: &[protocol::Record]) {
        self.records += recs.len() as u64;
        for r in recs {
            let p = partition::partition_of(&r.key, self.partitions);
            self.batches.entry(p).or_default().push(*r);
        }
        let batches = std::mem::take(&mut self.batches);
        for (p, batch) in batches {
            *self.by_partition.entry(p).or_default() += batch.len() as u64;
            for chunk in batch.chunks(MAX_RECORDS_PER_FRAME) {
                let key = chunk[0].key.to_le_bytes();
                let payload = Frame::Records(chunk.to_vec())
                    .to_bytes()
                    .expect("at most MAX_RECORDS_PER_FRAME records encode");
                let record = BaseRecord::with_opaque_to(&self.target.topic, chunk.len())
                    .partition(p)
                    .key(&key[..])
                    .payload(&payload[..]);
                send(&self.producer, &mut self.messages, record);
            }
        }
    }

    fn control_message(&mut self, id: u64, f: &Frame, extra: &[(&str, &str)]) {
        let source = format!("{}:{id}", self.relay_id);
        let mut headers = OwnedHeaders::new().insert(Header {
            key: SOURCE_HEADER,
            value: Some(source.as_bytes()),
        });
        for (key, value) in extra {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_bytes()),
            });
        }
        // A frame a connection's reader decoded is within the limits, so it encodes again.
        let payload = f.to_bytes().expect("a decoded frame encodes again");
        let record = BaseRecord::with_opaque_to(&self.control, 0)
            .partition(0)
            .key(source.as_bytes())
            .payload(&payload[..])
            .headers(headers);
        send(&self.producer, &mut self.messages, record);
    }
}

/// Produces, waiting while the producer's queue is full (back-pressure: the channel
/// fills, connection readers stop, TCP pushes back on probes).
fn send(
    producer: &ThreadedProducer<RelayContext>,
    messages: &mut u64,
    mut record: BaseRecord<'_, [u8], [u8], usize>,
) {
    loop {
        match producer.send(record) {
            Ok(()) => {
                *messages += 1;
                return;
            }
            Err((
                rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                r,
            )) => {
                record = r;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((e, r)) => {
                tracing::warn!("kafka refused a message: {e}");
                producer
                    .context()
                    .failed
                    .fetch_add(r.delivery_opaque as u64, Relaxed);
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Group member

/// How a group member runs.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// Where the records are.
    pub target: KafkaTarget,
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
        quiet().log(tracing::Level::ERROR, &format!("kafka: {error}: {reason}"));
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

/// A random id (for instance ids).
fn random_u64() -> u64 {
    use std::hash::BuildHasher as _;
    std::hash::RandomState::new().build_hasher().finish()
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
    let consumer: BaseConsumer<MemberContext> = ClientConfig::new()
        .set("bootstrap.servers", &cfg.target.brokers)
        .set("group.id", &cfg.group)
        .set("client.id", format!("hoptrace-{}", cfg.member))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("partition.assignment.strategy", "roundrobin")
        .set("isolation.level", "read_committed")
        .create_with_context(MemberContext {
            state: Arc::clone(&state),
        })?;
    consumer.subscribe(&[&cfg.target.topic])?;
    let control_consumer: BaseConsumer<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", &cfg.target.brokers)
        .set("group.id", format!("{}.control.{}", cfg.group, cfg.member))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create_with_context(QuietContext)?;
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
                        Some(ControlMessage::Event(ev)) => control.handle(ev),
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
    let summary = member_summary(&s, &control, started_unix_ns);
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

fn member_summary(s: &MemberState, control: &Control, started_unix_ns: i64) -> RunSummary {
    let mut total = group::Tally::default();
    let mut files = Vec::new();
    for seg in &s.segments {
        total.add(&seg.tally);
        files.extend(seg.files.iter().cloned());
    }
    let (publishers, discrepancies) =
        group::publishers_by_keys(&control.sent_by_publisher(), &total.rows(), &total.keys);
    let (clock, alerts) = control.clock();
    let mut owners: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for o in &s.owners {
        owners
            .entry(o.partition)
            .or_default()
            .push(o.member.clone());
    }
    RunSummary {
        run_id: s.cfg.run_id.clone(),
        pipeline: s.cfg.spec.clone(),
        started_unix_ns,
        ended_unix_ns: hoptrace_clock::realtime_ns(),
        collector_host: host_info(),
        probes: control.probe_infos(Some(s.spec.hop_names()), None),
        clock: clock.to_vec(),
        clock_alerts: alerts.to_vec(),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_client_logs_are_counted_not_printed() {
        let q = QuietLogs::default();
        let line = |port: u16| format!("127.0.0.1:{port}/bootstrap: Connect failed: refused");
        assert!(q.log(tracing::Level::ERROR, &line(1)));
        // The same kind of line, other numbers: counted.
        for port in 2..100 {
            assert!(!q.log(tracing::Level::ERROR, &line(port)));
        }
        // Another kind: logged.
        assert!(q.log(tracing::Level::ERROR, "topic t: unknown topic"));
        let seen = q.seen.lock().unwrap();
        assert_eq!(seen.values().map(|(n, _)| n).sum::<u64>(), 98);
    }

    #[test]
    fn kafka_targets_parse_and_name_what_is_wrong() {
        let t =
            KafkaTarget::parse("kafka://127.0.0.1:29092,127.0.0.1:29093/hoptrace.records").unwrap();
        assert_eq!(t.brokers, "127.0.0.1:29092,127.0.0.1:29093");
        assert_eq!(t.topic, "hoptrace.records");
        assert_eq!(t.control_topic(), "hoptrace.records.control");
        for bad in [
            "127.0.0.1:9092/t",
            "kafka://127.0.0.1:9092",
            "kafka:///t",
            "kafka://h:1/",
            "kafka://h:1/a/b",
        ] {
            let e = KafkaTarget::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
