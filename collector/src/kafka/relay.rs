//! The relay: takes probe connections (the collector protocol, with a collector's checks)
//! and writes their records to the Kafka topic, each in the partition of its trace key,
//! and everything else a probe says to the control topic.

use std::collections::BTreeMap;
use std::hash::Hasher as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_protocol::{
    self as protocol, CountersFrame, Frame, Hello, MAX_RECORDS_PER_FRAME, PROTOCOL_VERSION,
    counter_id,
};
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use crate::partition;
use crate::server::{self, ConnectionCounters, Event, ServerConfig};
use hoptrace_format::spec::{PipelineSpec, ResolvedSpec};

use hoptrace_broker::kafka::{ensure_topic, quiet};

use super::topic::{
    CLEAN_HEADER, FORWARDED_HEADER, KafkaError, PEER_HEADER, RecordsTopic, SOURCE_HEADER, io_err,
};

/// How a relay runs: [`RelayConfig::new`], then set what differs from its defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Address probes connect to.
    pub listen: String,
    /// The pipeline (hops probes may report).
    pub spec: PipelineSpec,
    /// Where records go.
    pub target: RecordsTopic,
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

impl RelayConfig {
    /// A relay on `listen` for the hops of `spec`, writing to `target` for the run
    /// `run_id`: topics it creates get 3 partitions and replication 1; no token, no TLS.
    #[must_use]
    pub fn new(
        listen: impl Into<String>,
        spec: PipelineSpec,
        target: RecordsTopic,
        run_id: impl Into<String>,
    ) -> Self {
        Self {
            listen: listen.into(),
            spec,
            target,
            partitions: 3,
            replication: 1,
            token: None,
            tls_cert: None,
            tls_key: None,
            run_id: run_id.into(),
        }
    }
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
        quiet().client_error(&error, reason);
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
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &cfg.target.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // One produce request in flight per broker: with idempotence and the default
            // of 5, librdkafka's broker threads polled without sleeping while acks=all
            // waited for followers on a replicated cluster (55 µs of relay CPU per record
            // at 20k records/s, 6.6 µs with 1); on one node it costs nothing at 150k
            // records/s (reports/relay-bench.md).
            .set("max.in.flight.requests.per.connection", "1")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .set("message.max.bytes", "2000000");
        cfg.target.apply_client(&mut client);
        let producer: ThreadedProducer<RelayContext> =
            client.create_with_context(RelayContext {
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
            conn_ids: Arc::new(std::sync::atomic::AtomicU64::new(0)),
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
                (listener, server_cfg),
                &spec,
                &counters,
                256,
                Vec::new(),
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
    target: RecordsTopic,
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

/// A random id (for instance ids).
fn random_u64() -> u64 {
    use std::hash::BuildHasher as _;
    std::hash::RandomState::new().build_hasher().finish()
}
