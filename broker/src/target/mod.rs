//! Transports: one module per broker kind behind the [`Target`] (send) and [`Source`]
//! (receive) traits. [`open_target`] and [`open_source`] pick the module from an
//! [`Endpoint`].
//!
//! - [`mqtt`]: rumqttc, MQTT 3.1.1 and 5, QoS 0/1/2, several connections, TCP_NODELAY.
//! - [`kafka`]: rdkafka, acks, linger, batch size, compression, partitions, keys.

pub mod kafka;
pub mod mqtt;

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use hoptrace_probe::carrier::{envelope, kafka_header, mqtt_property};
use hoptrace_probe::{CarrierError, Extracted, TraceContext};
use rdkafka::message::OwnedHeaders;

use crate::url::{Carrier, Endpoint, UrlError, join_host_port};

/// Why a broker connection failed or broke. Each variant says what to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The address or the carrier is invalid.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// Nothing answers at the address: is the broker running, and is the port right?
    /// (`infra/services.sh up` starts the local ones.)
    #[error("broker {addr} is unreachable: {detail} (is it running? is the port right?)")]
    Unreachable {
        /// The address tried.
        addr: String,
        /// What the connection attempt said.
        detail: String,
    },
    /// The broker refused the credentials: check the user name and password (`user=`,
    /// `password=` in the address) and that this listener allows that user.
    #[error(
        "broker {addr} refused the credentials ({detail}): check user= and password= in the address"
    )]
    AuthRefused {
        /// The broker address.
        addr: String,
        /// The broker's reason code.
        detail: String,
    },
    /// The broker refused the connection for another reason (protocol version, client id,
    /// server busy): see the detail.
    #[error("broker {addr} refused the connection: {detail}")]
    Refused {
        /// The broker address.
        addr: String,
        /// The broker's reason.
        detail: String,
    },
    /// The Kafka topic does not exist and the cluster does not create topics on use:
    /// create it (`infra/kafka/kafka.sh create-topic NAME`) or fix its name.
    #[error(
        "Kafka topic {topic:?} does not exist on {bootstrap}: create it (infra/kafka/kafka.sh create-topic {topic}) or fix the name"
    )]
    TopicMissing {
        /// The topic.
        topic: String,
        /// The cluster.
        bootstrap: String,
    },
    /// `partitions=` asks for more partitions than the topic has: lower it, or add
    /// partitions to the topic.
    #[error("Kafka topic {topic:?} has {has} partitions, but partitions={wanted} was asked for")]
    TooFewPartitions {
        /// The topic.
        topic: String,
        /// Partitions it has.
        has: u32,
        /// Partitions asked for.
        wanted: u32,
    },
    /// A Kafka address without a topic, or a send target with several: write
    /// `kafka://host:port/topic`.
    #[error("{0}")]
    Topic(String),
    /// The client library refused its configuration or failed: see the detail.
    #[error("{0}")]
    Client(String),
    /// The connection was lost and the client stopped; the messages it still held are
    /// not confirmed. See the detail for the broker's last error.
    #[error("connection to {addr} closed: {detail}")]
    Closed {
        /// The broker address.
        addr: String,
        /// The last error.
        detail: String,
    },
}

/// Why a message was not taken by the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The client's queue is full (broker back-pressure: MQTT in-flight window or request
    /// channel, rdkafka's producer queue). Wait and try again; the caller counts it.
    #[error("client queue full")]
    Full,
    /// The client cannot send any more.
    #[error(transparent)]
    Failed(#[from] TargetError),
}

/// One message to send.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Stream index; messages of one stream always use the same connection or key.
    pub stream: u32,
    /// MQTT topic; for Kafka, the record key (records go to the address's topic).
    pub topic: &'a str,
    /// The payload, without the trace context.
    pub payload: &'a [u8],
    /// The trace context, already stamped; `None` sends the message bare, carrying
    /// nothing of hoptrace (the baseline of `hoptrace bench publisher --bare`).
    pub context: Option<&'a TraceContext>,
    /// Extra MQTT 5 user properties or Kafka headers (a replayed message's own).
    pub headers: &'a [(String, Vec<u8>)],
}

/// What a target's client did with the messages it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetStats {
    /// Messages the client took.
    pub handed: u64,
    /// MQTT: publishes written to the socket (those written again after a reconnection
    /// count again); Kafka: records the broker acknowledged.
    pub written: u64,
    /// Acknowledgements: MQTT PUBACK (QoS 1) or PUBCOMP (QoS 2), the broker's promise to
    /// deliver the message; Kafka delivery reports.
    pub acked: u64,
    /// Kafka records whose delivery failed (reported by librdkafka): lost, counted.
    pub failed: u64,
    /// Messages still unconfirmed when the target closed: MQTT not acknowledged (QoS
    /// 1/2) or not written (QoS 0); Kafka not delivered.
    pub unconfirmed: u64,
    /// Reconnections after the first connection.
    pub reconnects: u64,
    /// Connection errors seen (each one is logged).
    pub connection_errors: u64,
    /// MQTT: publishes that were in flight (written, not acknowledged) when a connection
    /// broke and were written again after the reconnection. A broker that had received
    /// one before the break delivers it twice (QoS 1 is at-least-once).
    pub retransmitted: u64,
    /// MQTT: publishes that were still queued in the client when a connection broke and
    /// were written after the reconnection.
    pub requeued: u64,
    /// MQTT, part of `unconfirmed`: publishes written but never acknowledged (no
    /// acknowledgement before the flush timeout, or the connection broke and did not come
    /// back before it).
    pub abandoned_unacked: u64,
    /// MQTT, part of `unconfirmed`: publishes never written (still queued in the client
    /// when the flush timeout ended).
    pub abandoned_unwritten: u64,
    /// MQTT: connections that were down (broker unreachable) when the target closed.
    pub down_at_close: u64,
    /// MQTT: the QoS of the publishes (at QoS 0 the broker acknowledges nothing, so
    /// `written` is all a publisher can know); `None` for Kafka.
    pub mqtt_qos: Option<u8>,
}

/// A broker to send to.
pub trait Target: Send {
    /// Hands one message to the client without blocking. The context is encoded into the
    /// target's carrier here, so the stamp in it is taken just before.
    ///
    /// # Errors
    /// [`SendError::Full`] under back-pressure (retry), [`SendError::Failed`] when the
    /// client cannot send any more.
    fn try_send(&mut self, msg: &Outgoing<'_>) -> Result<(), SendError>;

    /// Waits a little (at most `max`) for the client to take messages again after
    /// [`SendError::Full`].
    fn wait_for_capacity(&mut self, max: Duration) {
        std::thread::sleep(max.min(Duration::from_micros(100)));
    }

    /// Counts so far.
    fn stats(&self) -> TargetStats;

    /// Waits up to `timeout` for every message to be confirmed (written, acknowledged or
    /// delivered), then disconnects. Idempotent.
    fn close(&mut self, timeout: Duration) -> TargetStats;

    /// The carrier the context travels in.
    fn carrier(&self) -> Carrier;

    /// The address, without credentials.
    fn describe(&self) -> String;
}

/// Broker-side timestamp of a received Kafka record, milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerTime {
    /// Set by the producer (`CreateTime`).
    CreateTimeMs(i64),
    /// Set by the broker when it appended the record (`LogAppendTime`): the broker's own
    /// stamp, with millisecond resolution.
    LogAppendTimeMs(i64),
}

/// Transport metadata of a received message.
#[derive(Debug, Clone, Default)]
pub enum Meta {
    /// None (MQTT 3.1.1, or a message without properties or headers).
    #[default]
    None,
    /// MQTT 5 user properties.
    UserProperties(Vec<(String, String)>),
    /// Kafka record headers.
    Headers(OwnedHeaders),
}

impl Meta {
    /// The properties or headers as `(key, value)` pairs, in order.
    #[must_use]
    pub fn pairs(&self) -> Vec<(String, Vec<u8>)> {
        use rdkafka::message::Headers as _;
        match self {
            Self::None => Vec::new(),
            Self::UserProperties(p) => p
                .iter()
                .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
                .collect(),
            Self::Headers(h) => h
                .iter()
                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                .collect(),
        }
    }
}

/// A message taken from a broker.
#[derive(Debug, Clone)]
pub struct Received {
    /// MQTT topic or Kafka topic.
    pub topic: String,
    /// Kafka record key.
    pub key: Option<Vec<u8>>,
    /// The payload as received (an envelope, if any, still in front).
    pub payload: Vec<u8>,
    /// User properties or headers.
    pub meta: Meta,
    /// CLOCK_REALTIME when the client handed the message over, ns since the Unix epoch.
    pub arrival_ns: i64,
    /// Kafka's record timestamp.
    pub broker_time: Option<BrokerTime>,
}

impl Received {
    /// Takes the trace context out of the message through `carrier`.
    ///
    /// # Errors
    /// [`CarrierError::NotTraced`] without a context in that carrier,
    /// [`CarrierError::BadContext`] when it does not decode.
    pub fn extract(&self, carrier: Carrier) -> Result<Extracted, CarrierError> {
        match carrier {
            Carrier::Envelope => envelope::unwrap(&self.payload).map(|(e, _)| e),
            Carrier::Property => match &self.meta {
                Meta::UserProperties(p) => mqtt_property::extract_user_properties(p),
                _ => Err(CarrierError::NotTraced),
            },
            Carrier::Header => match &self.meta {
                Meta::Headers(h) => kafka_header::extract(h),
                _ => Err(CarrierError::NotTraced),
            },
        }
    }
}

/// A broker to receive from (taps and recorders).
pub trait Source: Send {
    /// Waits up to `timeout` for the next message; `Ok(None)` when none came.
    ///
    /// # Errors
    /// A [`TargetError`] when the connection is lost for good.
    fn recv(&mut self, timeout: Duration) -> Result<Option<Received>, TargetError>;

    /// The address, without credentials.
    fn describe(&self) -> String;

    /// Reconnections so far.
    fn reconnects(&self) -> u64 {
        0
    }

    /// MQTT: reconnections the broker answered with a new session (no subscriptions, no
    /// queued messages): what was published from the break until the subscriptions were
    /// made again was not delivered to this subscriber.
    fn new_sessions(&self) -> u64 {
        0
    }

    /// Disconnects.
    fn close(&mut self) {}
}

/// Connects to the broker of `endpoint` to send with `carrier`; `name` becomes part of
/// the client id.
///
/// # Errors
/// [`TargetError`]: unreachable broker, refused credentials, missing topic, bad options.
pub fn open_target(
    endpoint: &Endpoint,
    carrier: Carrier,
    name: &str,
) -> Result<Box<dyn Target>, TargetError> {
    Ok(match endpoint {
        Endpoint::Mqtt(m) => Box::new(mqtt::MqttTarget::connect(m, carrier, name)?),
        Endpoint::Kafka(k) => Box::new(kafka::KafkaTarget::connect(k, carrier, name)?),
    })
}

/// Connects to the broker of `endpoint` and subscribes to `topics` (MQTT filters, or
/// Kafka topics; empty: the address's Kafka topics, or `#` on MQTT). Returns once
/// subscribed: every message published afterwards is received.
///
/// # Errors
/// [`TargetError`]: unreachable broker, refused credentials, missing topic.
pub fn open_source(
    endpoint: &Endpoint,
    topics: &[String],
    name: &str,
) -> Result<Box<dyn Source>, TargetError> {
    Ok(match endpoint {
        Endpoint::Mqtt(m) => Box::new(mqtt::MqttSource::connect(m, topics, name)?),
        Endpoint::Kafka(k) => Box::new(kafka::KafkaSource::connect(k, topics, name)?),
    })
}

/// Opens and closes a TCP connection to one of `addrs`, so an unreachable broker is
/// reported at once and plainly, before a client library retries in the background.
pub(crate) fn check_reachable(
    addrs: &[(String, u16)],
    timeout: Duration,
) -> Result<(), TargetError> {
    let mut last = String::from("no address given");
    let mut tried = Vec::new();
    for (host, port) in addrs {
        let hp = join_host_port(host, *port);
        tried.push(hp.clone());
        let resolved = match (host.as_str(), *port).to_socket_addrs() {
            Ok(r) => r,
            Err(e) => {
                last = format!("cannot resolve {hp}: {e}");
                continue;
            }
        };
        for addr in resolved {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(());
                }
                Err(e) => last = format!("connect to {addr}: {e}"),
            }
        }
    }
    Err(TargetError::Unreachable {
        addr: tried.join(","),
        detail: last,
    })
}

/// The process-unique part of client ids.
pub(crate) fn client_tag(name: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let r = std::hash::RandomState::new().build_hasher().finish() as u16;
    format!("hoptrace-{name}-{}-{r:04x}", std::process::id())
}
