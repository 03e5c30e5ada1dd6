//! Kafka through rdkafka: a producer whose delivery reports are counted, and a consumer
//! assigned to every partition of the tapped topics.
//!
//! Back-pressure: when librdkafka's producer queue is full, `send` gives the record back
//! (`QueueFull`); the caller gets [`SendError::Full`], waits and retries.
//!
//! Delivery reports are served by the sending thread itself (every `POLL_EVERY` records,
//! while it waits for capacity, and when counting or closing), not by a polling thread of
//! their own: a report frees the record and its header list, which librdkafka allocated on
//! the sending thread, and frees on another thread contend with that thread's allocations
//! for the allocator's arena lock. With a polling thread, records carrying the
//! trace-context header (three more allocations each) fell behind at 700k records/s on
//! 2 cores (377k-632k achieved, 1.26-1.43 cores) where the same records with the context in
//! the payload passed at 0.8-0.9 cores (`reports/publisher-bench.md`).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hoptrace_probe::carrier::{HEADER, envelope, kafka_header};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers as _, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _, ProducerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use super::{
    BrokerTime, Meta, Outgoing, Received, SendError, Source, Target, TargetError, TargetStats,
};
use crate::url::{Carrier, KafkaEndpoint, KeyMode, StartOffset};

/// Delivery reports and client errors of a producer.
#[derive(Debug, Default)]
struct Reports {
    delivered: AtomicU64,
    failed: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Reports {
    fn note(&self, e: String) {
        *self.last_error.lock().expect("poisoned") = Some(e);
    }
}

#[derive(Debug, Clone, Default)]
struct Ctx(Arc<Reports>);

impl ClientContext for Ctx {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0.errors.fetch_add(1, Relaxed);
        tracing::warn!("Kafka client error: {error}: {reason}");
        self.0.note(format!("{error}: {reason}"));
    }
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        match result {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Relaxed);
            }
            Err((e, _)) => {
                // ERROR: this record is lost; it is counted and the accounting shows it.
                if self.0.failed.fetch_add(1, Relaxed) == 0 {
                    tracing::error!("Kafka delivery failed: {e} (further failures are counted)");
                }
                self.0.note(e.to_string());
            }
        }
    }
}

fn base_config(k: &KafkaEndpoint, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", k.bootstrap_servers())
        .set("client.id", client_id)
        .set("socket.nagle.disable", "true")
        .set(
            "socket.connection.setup.timeout.ms",
            k.connect_timeout_ms.max(1000).to_string(),
        );
    c
}

/// Fetches the partition count of `topic`.
fn partitions_of(
    client: &rdkafka::client::Client<impl ClientContext>,
    k: &KafkaEndpoint,
    topic: &str,
) -> Result<u32, TargetError> {
    let timeout = Duration::from_millis(k.connect_timeout_ms);
    let md = client
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| TargetError::Unreachable {
            addr: k.bootstrap_servers(),
            detail: format!("no metadata within {} ms: {e}", timeout.as_millis()),
        })?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Err(TargetError::TopicMissing {
            topic: topic.to_owned(),
            bootstrap: k.bootstrap_servers(),
        });
    };
    match t.error() {
        None if !t.partitions().is_empty() => Ok(t.partitions().len() as u32),
        None | Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
            Err(TargetError::TopicMissing {
                topic: topic.to_owned(),
                bootstrap: k.bootstrap_servers(),
            })
        }
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) => {
            Err(TargetError::AuthRefused {
                addr: k.bootstrap_servers(),
                detail: format!("not authorized for topic {topic:?}"),
            })
        }
        Some(e) => Err(TargetError::Client(format!(
            "Kafka metadata for topic {topic:?}: {e:?}"
        ))),
    }
}

/// Records sent between two polls for delivery reports on the sending thread.
const POLL_EVERY: u32 = 32;

/// Produces to one Kafka topic.
pub struct KafkaTarget {
    producer: BaseProducer<Ctx>,
    since_poll: u32,
    reports: Arc<Reports>,
    topic: String,
    partitions: Option<u32>,
    key: KeyMode,
    carrier: Carrier,
    describe: String,
    handed: u64,
    closed: Option<TargetStats>,
}

impl std::fmt::Debug for KafkaTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTarget")
            .field("target", &self.describe)
            .field("carrier", &self.carrier)
            .finish_non_exhaustive()
    }
}

impl KafkaTarget {
    /// Creates the producer and checks that the cluster answers and the topic exists
    /// (with enough partitions for `partitions=`).
    ///
    /// # Errors
    /// [`TargetError::Unreachable`], [`TargetError::TopicMissing`],
    /// [`TargetError::TooFewPartitions`], [`TargetError::Topic`] without exactly one topic,
    /// [`TargetError::Client`] for a configuration librdkafka refuses.
    pub fn connect(k: &KafkaEndpoint, carrier: Carrier, name: &str) -> Result<Self, TargetError> {
        let [topic] = k.topics.as_slice() else {
            return Err(TargetError::Topic(format!(
                "a Kafka target needs exactly one topic in its address (kafka://host:port/topic), got {:?}",
                k.topics
            )));
        };
        if carrier == Carrier::Property {
            return Err(TargetError::Client(
                "Kafka cannot carry the context in a user property".into(),
            ));
        }
        super::check_reachable(&k.bootstrap, Duration::from_millis(k.connect_timeout_ms))?;
        let mut c = base_config(k, &super::client_tag(name));
        c.set("acks", &k.acks)
            .set("compression.type", k.compression.name());
        if let Some(v) = k.linger_ms {
            c.set("linger.ms", v.to_string());
        }
        if let Some(v) = k.batch_size {
            c.set("batch.size", v.to_string());
        }
        if let Some(v) = k.batch_messages {
            c.set("batch.num.messages", v.to_string());
        }
        if let Some(v) = k.queue_messages {
            c.set("queue.buffering.max.messages", v.to_string());
        }
        for (key, v) in &k.extra {
            c.set(key, v);
        }
        let ctx = Ctx::default();
        let reports = Arc::clone(&ctx.0);
        let producer: BaseProducer<Ctx> = c
            .create_with_context(ctx)
            .map_err(|e| TargetError::Client(format!("Kafka producer configuration: {e}")))?;
        let has = partitions_of(producer.client(), k, topic)?;
        if let Some(wanted) = k.partitions
            && wanted > has
        {
            return Err(TargetError::TooFewPartitions {
                topic: topic.clone(),
                has,
                wanted,
            });
        }
        let describe = format!(
            "kafka://{}/{topic} (acks={}, compression={}, {} partitions)",
            k.bootstrap_servers(),
            k.acks,
            k.compression.name(),
            has
        );
        tracing::info!(target = %describe, %carrier, "producer ready");
        Ok(Self {
            producer,
            since_poll: 0,
            reports,
            topic: topic.clone(),
            partitions: k.partitions,
            key: k.key,
            carrier,
            describe,
            handed: 0,
            closed: None,
        })
    }
}

impl Target for KafkaTarget {
    fn try_send(&mut self, msg: &Outgoing<'_>) -> Result<(), SendError> {
        // A record without headers gets no header list: librdkafka allocates one per record
        // and frees it after delivery, which a bare record (the baseline) must not pay.
        let in_header = msg.context.is_some() && self.carrier != Carrier::Envelope;
        let mut headers = (in_header || !msg.headers.is_empty()).then(|| {
            msg.headers.iter().filter(|(k, _)| k != HEADER).fold(
                OwnedHeaders::new_with_capacity(msg.headers.len() + 1),
                |h, (k, v)| {
                    h.insert(Header {
                        key: k,
                        value: Some(v),
                    })
                },
            )
        });
        let enveloped;
        let payload: &[u8] = match msg.context {
            None => msg.payload,
            Some(context) if self.carrier == Carrier::Envelope => {
                enveloped = envelope::wrap(context, msg.payload);
                &enveloped
            }
            Some(context) => {
                headers = headers.map(|h| kafka_header::inject(context, h));
                msg.payload
            }
        };
        let mut record: BaseRecord<'_, str, [u8]> = BaseRecord::to(&self.topic).payload(payload);
        if let Some(h) = headers {
            record = record.headers(h);
        }
        if self.key == KeyMode::Stream {
            record = record.key(msg.topic);
        }
        if let Some(n) = self.partitions {
            record = record.partition((msg.stream % n) as i32);
        }
        match self.producer.send(record) {
            Ok(()) => {
                self.handed += 1;
                self.since_poll += 1;
                if self.since_poll >= POLL_EVERY {
                    self.since_poll = 0;
                    self.producer.poll(Duration::ZERO);
                }
                Ok(())
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(SendError::Full)
            }
            Err((e, _)) => Err(SendError::Failed(TargetError::Client(format!(
                "Kafka producer refused a record for {}: {e}",
                self.topic
            )))),
        }
    }

    fn wait_for_capacity(&mut self, max: Duration) {
        // Serving delivery reports frees queue space.
        self.since_poll = 0;
        self.producer.poll(max.min(Duration::from_micros(200)));
    }

    fn stats(&self) -> TargetStats {
        if let Some(s) = self.closed {
            return s;
        }
        self.producer.poll(Duration::ZERO);
        let delivered = self.reports.delivered.load(Relaxed);
        TargetStats {
            handed: self.handed,
            written: delivered,
            acked: delivered,
            failed: self.reports.failed.load(Relaxed),
            unconfirmed: 0,
            reconnects: 0,
            connection_errors: self.reports.errors.load(Relaxed),
            ..TargetStats::default()
        }
    }

    fn close(&mut self, timeout: Duration) -> TargetStats {
        if let Some(s) = self.closed {
            return s;
        }
        if let Err(e) = self.producer.flush(timeout) {
            tracing::error!(
                topic = %self.topic,
                in_flight = self.producer.in_flight_count(),
                "Kafka flush did not finish within {timeout:?}: {e}"
            );
        }
        let mut s = self.stats();
        s.unconfirmed = self.handed.saturating_sub(s.acked + s.failed);
        self.closed = Some(s);
        s
    }

    fn carrier(&self) -> Carrier {
        self.carrier
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

/// Consumes Kafka topics: every partition assigned directly (or a consumer group when
/// the address names one), starting at the end (or the beginning).
pub struct KafkaSource {
    consumer: crate::kafka::Leaving<rdkafka::consumer::DefaultConsumerContext>,
    describe: String,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("source", &self.describe)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Creates the consumer. Without a group, every partition of `topics` (default: the
    /// address's) is assigned at its current end (or beginning), so every record
    /// produced after this returns is received.
    ///
    /// # Errors
    /// [`TargetError::Unreachable`], [`TargetError::TopicMissing`], [`TargetError::Topic`]
    /// without any topic.
    pub fn connect(k: &KafkaEndpoint, topics: &[String], name: &str) -> Result<Self, TargetError> {
        let topics: Vec<String> = if topics.is_empty() {
            k.topics.clone()
        } else {
            topics.to_vec()
        };
        if topics.is_empty() {
            return Err(TargetError::Topic(
                "no Kafka topic to read: give --topics or kafka://host:port/topic".into(),
            ));
        }
        super::check_reachable(&k.bootstrap, Duration::from_millis(k.connect_timeout_ms))?;
        let tag = super::client_tag(name);
        let mut c = base_config(k, &tag);
        c.set("group.id", k.group.clone().unwrap_or_else(|| tag.clone()))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "100")
            .set(
                "auto.offset.reset",
                match k.offset {
                    StartOffset::End => "latest",
                    StartOffset::Beginning => "earliest",
                },
            );
        for (key, v) in &k.extra {
            c.set(key, v);
        }
        let consumer: BaseConsumer = c
            .create()
            .map_err(|e| TargetError::Client(format!("Kafka consumer configuration: {e}")))?;
        let consumer = crate::kafka::Leaving::new(consumer);
        let timeout = Duration::from_millis(k.connect_timeout_ms);
        if k.group.is_some() {
            for t in &topics {
                partitions_of(consumer.client(), k, t)?;
            }
            let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
            consumer
                .subscribe(&refs)
                .map_err(|e| TargetError::Client(format!("Kafka subscribe: {e}")))?;
        } else {
            let mut tpl = TopicPartitionList::new();
            for t in &topics {
                let n = partitions_of(consumer.client(), k, t)?;
                for p in 0..n as i32 {
                    let offset = match k.offset {
                        StartOffset::Beginning => Offset::Beginning,
                        StartOffset::End => {
                            let high = end_offset(&consumer, t, p, timeout).map_err(|e| {
                                TargetError::Unreachable {
                                    addr: k.bootstrap_servers(),
                                    detail: format!("offsets of {t}/{p}: {e}"),
                                }
                            })?;
                            Offset::Offset(high)
                        }
                    };
                    tpl.add_partition_offset(t, p, offset)
                        .map_err(|e| TargetError::Client(format!("assignment: {e}")))?;
                }
            }
            consumer
                .assign(&tpl)
                .map_err(|e| TargetError::Client(format!("Kafka assign: {e}")))?;
        }
        let describe = format!("kafka://{}/{}", k.bootstrap_servers(), topics.join(","));
        tracing::info!(source = %describe, "consuming");
        Ok(Self { consumer, describe })
    }
}

impl Source for KafkaSource {
    fn recv(&mut self, timeout: Duration) -> Result<Option<Received>, TargetError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(r) = self.consumer.poll(left) else {
                return Ok(None);
            };
            let arrival_ns = hoptrace_probe::clock::realtime_ns();
            match r {
                Ok(m) => {
                    return Ok(Some(Received {
                        topic: m.topic().to_owned(),
                        key: m.key().map(<[u8]>::to_vec),
                        payload: m.payload().unwrap_or_default().to_vec(),
                        meta: m
                            .headers()
                            .filter(|h| h.count() > 0)
                            .map_or(Meta::None, |h| Meta::Headers(h.detach())),
                        arrival_ns,
                        broker_time: match m.timestamp() {
                            rdkafka::Timestamp::LogAppendTime(ms) => {
                                Some(BrokerTime::LogAppendTimeMs(ms))
                            }
                            rdkafka::Timestamp::CreateTime(ms) => {
                                Some(BrokerTime::CreateTimeMs(ms))
                            }
                            rdkafka::Timestamp::NotAvailable => None,
                        },
                    }));
                }
                Err(e) => {
                    tracing::warn!(source = %self.describe, "Kafka consumer error: {e}");
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn close(&mut self) {
        self.consumer.unassign().ok();
    }
}

/// The high watermark of `topic`/`partition`. A topic created a moment ago may have no
/// leader yet (NotLeaderForPartition, LeaderNotAvailable): retried until `timeout`.
fn end_offset(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<i64, rdkafka::error::KafkaError> {
    use rdkafka::types::RDKafkaErrorCode as Code;
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, partition, left) {
            Ok((_, high)) => return Ok(high),
            Err(e)
                if matches!(
                    e.rdkafka_error_code(),
                    Some(
                        Code::NotLeaderForPartition
                            | Code::LeaderNotAvailable
                            | Code::UnknownTopicOrPartition
                    )
                ) && Instant::now() + Duration::from_millis(100) < deadline =>
            {
                tracing::debug!("waiting for a leader of {topic}/{partition}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}
