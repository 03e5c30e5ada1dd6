//! Broker addresses: `mqtt://[user:password@]host[:port][/prefix][?options]` and
//! `kafka://host[:port][,host[:port]...][/topic[,topic...]][?options]`.
//!
//! Options are `key=value` pairs after `?`, joined by `&`; values may be percent-encoded.
//! Unknown options are errors, never ignored.
//!
//! | scheme | option | meaning | default |
//! | --- | --- | --- | --- |
//! | mqtt | `version` | `5` or `3.1.1` (`3`, `311`, `v5`, `v3` accepted) | `5` |
//! | mqtt | `qos` | 0, 1 or 2 | 0 |
//! | mqtt | `connections` | client connections; a stream always uses the same one | 1 |
//! | mqtt | `user`, `password` | credentials (also from `user:password@`) | none |
//! | mqtt | `client_id` | client id prefix; `-<n>` is appended per connection | `hoptrace-<pid>` |
//! | mqtt | `inflight` | unacknowledged QoS 1/2 publishes per connection | 100 |
//! | mqtt | `request_capacity` | publishes the client queues before back-pressure | 1000 |
//! | mqtt | `keep_alive_s` | keep-alive interval, seconds | 30 |
//! | mqtt | `retain` | publish with the retain flag | false |
//! | mqtt | `clean` | `false`: a tap or recorder asks the broker to keep its session (needs `client_id`) | true |
//! | mqtt | `session_expiry_s` | MQTT 5, with `clean=false`: how long the broker keeps that session | 300 |
//! | both | `carrier` | `property` (MQTT 5), `header` (Kafka) or `envelope` | per transport |
//! | both | `connect_timeout_ms` | how long to wait for the broker to answer | 5000 |
//! | kafka | `acks` | `0`, `1` or `all` | `all` |
//! | kafka | `linger_ms` | producer linger, milliseconds | librdkafka's (5) |
//! | kafka | `batch_size` | producer batch size, bytes | librdkafka's |
//! | kafka | `batch_messages` | most messages per batch | librdkafka's |
//! | kafka | `compression` | `none`, `gzip`, `snappy`, `lz4`, `zstd` | `none` |
//! | kafka | `partitions` | send stream `s` to partition `s % partitions` | by key |
//! | kafka | `key` | `stream` (the stream's topic name) or `none` | `stream` |
//! | kafka | `queue_messages` | producer queue size, messages | librdkafka's (100000) |
//! | kafka | `group` | consumer group of a tap or recorder | none (partitions assigned) |
//! | kafka | `offset` | where a tap or recorder starts: `end` or `beginning` | `end` |
//! | kafka | `rdkafka.<name>` | any librdkafka property, passed through | |

use std::fmt;
use std::time::Duration;

/// Default MQTT port.
pub const MQTT_DEFAULT_PORT: u16 = 1883;
/// Default Kafka port.
pub const KAFKA_DEFAULT_PORT: u16 = 9092;

/// Why an address could not be parsed. Each variant says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The address does not start with `mqtt://` or `kafka://`.
    #[error("{0:?}: the address must start with mqtt:// or kafka://")]
    UnknownScheme(String),
    /// No host after the scheme: write `mqtt://127.0.0.1:1883`.
    #[error("{0:?}: no host after the scheme (example: mqtt://127.0.0.1:1883)")]
    MissingHost(String),
    /// The port is not a number from 1 to 65535.
    #[error("{url:?}: port {port:?} is not a number from 1 to 65535")]
    BadPort {
        /// The address.
        url: String,
        /// The port as written.
        port: String,
    },
    /// An option this scheme does not know; the module documentation lists them.
    #[error("{scheme}:// has no option {key:?} (known: {known})")]
    UnknownOption {
        /// `mqtt` or `kafka`.
        scheme: &'static str,
        /// The option as written.
        key: String,
        /// The options the scheme knows.
        known: &'static str,
    },
    /// An option's value is not one it accepts.
    #[error("option {key}={value:?}: expected {expected}")]
    BadValue {
        /// The option.
        key: String,
        /// The value as written.
        value: String,
        /// What it accepts.
        expected: &'static str,
    },
    /// Options that contradict each other, or a missing part.
    #[error("{0}")]
    Invalid(String),
}

/// How the trace context travels with a message (`docs/trace-format.md`, Carriers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Carrier {
    /// MQTT 5 user property `hoptrace`, text form.
    Property,
    /// Kafka record header `hoptrace`, binary form.
    Header,
    /// Envelope in front of the payload.
    Envelope,
}

impl Carrier {
    /// Parses `property`, `header` or `envelope`.
    ///
    /// # Errors
    /// [`UrlError::BadValue`] for anything else.
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        match s {
            "property" | "user-property" | "user_property" => Ok(Self::Property),
            "header" => Ok(Self::Header),
            "envelope" => Ok(Self::Envelope),
            _ => Err(UrlError::BadValue {
                key: "carrier".into(),
                value: s.into(),
                expected: "property, header or envelope",
            }),
        }
    }

    /// The name as written in options.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Property => "property",
            Self::Header => "header",
            Self::Envelope => "envelope",
        }
    }
}

impl fmt::Display for Carrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// MQTT protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MqttVersion {
    /// MQTT 3.1.1 (no properties: the context travels in an envelope).
    V311,
    /// MQTT 5.
    V5,
}

/// An MQTT broker and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttEndpoint {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Protocol version.
    pub version: MqttVersion,
    /// QoS of publishes and subscriptions (0, 1 or 2).
    pub qos: u8,
    /// Client connections a publisher opens.
    pub connections: usize,
    /// User name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Client id prefix.
    pub client_id: Option<String>,
    /// Unacknowledged QoS 1/2 publishes per connection.
    pub inflight: u16,
    /// Requests the client queues before refusing more (back-pressure).
    pub request_capacity: usize,
    /// Keep-alive interval.
    pub keep_alive_s: u64,
    /// Publish with the retain flag.
    pub retain: bool,
    /// Topic prefix (the URL path), without leading or trailing `/`.
    pub prefix: Option<String>,
    /// Carrier chosen in the URL.
    pub carrier: Option<Carrier>,
    /// How long to wait for the broker to accept a connection.
    pub connect_timeout_ms: u64,
    /// Start a clean session (the default). `false` (taps and recorders only) asks the
    /// broker to keep the subscriber's session, under the fixed `client_id`, while it is
    /// disconnected: QoS 1/2 messages that arrive meanwhile are queued and delivered on
    /// reconnection. A broker that restarts without persistence forgets the session anyway.
    pub clean: bool,
    /// MQTT 5, with `clean=false`: seconds the broker keeps the session after a
    /// disconnection (MQTT 3.1.1 sessions have no expiry).
    pub session_expiry_s: u32,
}

/// Compression codec of a Kafka producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    None,
    /// gzip.
    Gzip,
    /// Snappy.
    Snappy,
    /// LZ4.
    Lz4,
    /// Zstandard (needs librdkafka built with zstd).
    Zstd,
}

impl Compression {
    /// The librdkafka name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

/// What a Kafka record's key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// The stream's topic name (records of one stream share a partition).
    Stream,
    /// No key.
    None,
}

/// Where a Kafka tap or recorder starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOffset {
    /// Only records produced after it starts.
    End,
    /// From the oldest record kept.
    Beginning,
}

/// A Kafka cluster and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaEndpoint {
    /// Bootstrap brokers.
    pub bootstrap: Vec<(String, u16)>,
    /// Topics (the URL path, comma-separated).
    pub topics: Vec<String>,
    /// Producer acks: `0`, `1` or `all`.
    pub acks: String,
    /// Producer linger.
    pub linger_ms: Option<u64>,
    /// Producer batch size, bytes.
    pub batch_size: Option<u64>,
    /// Most messages per batch.
    pub batch_messages: Option<u64>,
    /// Compression codec.
    pub compression: Compression,
    /// Send stream `s` to partition `s % partitions`.
    pub partitions: Option<u32>,
    /// What the record key is.
    pub key: KeyMode,
    /// Producer queue size, messages.
    pub queue_messages: Option<u64>,
    /// Consumer group of a tap or recorder; `None` assigns every partition directly.
    pub group: Option<String>,
    /// Where a tap or recorder starts.
    pub offset: StartOffset,
    /// Carrier chosen in the URL.
    pub carrier: Option<Carrier>,
    /// How long to wait for the cluster to answer.
    pub connect_timeout_ms: u64,
    /// librdkafka properties passed through (`rdkafka.<name>=<value>`).
    pub extra: Vec<(String, String)>,
}

impl KafkaEndpoint {
    /// `host:port,host:port`, as librdkafka's `bootstrap.servers`.
    #[must_use]
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap
            .iter()
            .map(|(h, p)| join_host_port(h, *p))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A parsed broker address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `mqtt://`.
    Mqtt(MqttEndpoint),
    /// `kafka://`.
    Kafka(KafkaEndpoint),
}

const MQTT_OPTIONS: &str = "version, qos, connections, user, password, client_id, inflight, \
                            request_capacity, keep_alive_s, retain, clean, session_expiry_s, \
                            carrier, connect_timeout_ms";
const KAFKA_OPTIONS: &str = "acks, linger_ms, batch_size, batch_messages, compression, \
                             partitions, key, queue_messages, group, offset, carrier, \
                             connect_timeout_ms, rdkafka.<property>";

impl Endpoint {
    /// Parses an address.
    ///
    /// # Errors
    /// A [`UrlError`] naming what is wrong and what to write instead.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let url = url.trim();
        match scheme_and_rest(url)? {
            ("mqtt", rest) => parse_mqtt(url, rest).map(Self::Mqtt),
            (_, rest) => parse_kafka(url, rest).map(Self::Kafka),
        }
    }

    /// The carrier: `requested` if given, else the URL's, else the transport's default
    /// (MQTT 5 user property, envelope on MQTT 3.1.1, Kafka header).
    ///
    /// # Errors
    /// [`UrlError::Invalid`] for a carrier the transport cannot carry (a user property on
    /// MQTT 3.1.1 or Kafka, a header on MQTT).
    pub fn carrier(&self, requested: Option<Carrier>) -> Result<Carrier, UrlError> {
        match self {
            Self::Mqtt(m) => {
                let c = requested.or(m.carrier).unwrap_or(match m.version {
                    MqttVersion::V5 => Carrier::Property,
                    MqttVersion::V311 => Carrier::Envelope,
                });
                match (c, m.version) {
                    (Carrier::Header, _) => Err(UrlError::Invalid(
                        "MQTT has no record headers: use carrier=property (MQTT 5) or carrier=envelope"
                            .into(),
                    )),
                    (Carrier::Property, MqttVersion::V311) => Err(UrlError::Invalid(
                        "MQTT 3.1.1 has no user properties: use carrier=envelope or version=5"
                            .into(),
                    )),
                    _ => Ok(c),
                }
            }
            Self::Kafka(k) => {
                let c = requested.or(k.carrier).unwrap_or(Carrier::Header);
                if c == Carrier::Property {
                    return Err(UrlError::Invalid(
                        "Kafka has no user properties: use carrier=header or carrier=envelope"
                            .into(),
                    ));
                }
                Ok(c)
            }
        }
    }

    /// How long to wait for the broker when connecting.
    #[must_use]
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(match self {
            Self::Mqtt(m) => m.connect_timeout_ms,
            Self::Kafka(k) => k.connect_timeout_ms,
        })
    }

    /// The address without credentials, for logs and summaries.
    #[must_use]
    pub fn display(&self) -> String {
        match self {
            Self::Mqtt(m) => format!(
                "mqtt://{}{} (MQTT {}, QoS {}{})",
                join_host_port(&m.host, m.port),
                m.prefix
                    .as_ref()
                    .map(|p| format!("/{p}"))
                    .unwrap_or_default(),
                match m.version {
                    MqttVersion::V5 => "5",
                    MqttVersion::V311 => "3.1.1",
                },
                m.qos,
                if m.clean {
                    String::new()
                } else {
                    format!(
                        ", persistent session {}",
                        m.client_id.as_deref().unwrap_or_default()
                    )
                }
            ),
            Self::Kafka(k) => format!("kafka://{}/{}", k.bootstrap_servers(), k.topics.join(",")),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<Self, UrlError> {
        Self::parse(s)
    }
}

/// `host:port`, with brackets around an IPv6 host.
#[must_use]
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `url` with its path replaced by `path`: a Kafka address's topics (`topic[,topic...]`)
/// or an MQTT address's topic prefix. The scheme, hosts, credentials and options stay as
/// written.
///
/// # Errors
/// [`UrlError`] when `url`, or the address with the new path, does not parse.
pub fn with_path(url: &str, path: &str) -> Result<String, UrlError> {
    let (scheme, rest) = scheme_and_rest(url)?;
    let (authority, _, query) = split(rest);
    let path = path.trim_matches('/');
    let mut out = format!("{scheme}://{authority}");
    if !path.is_empty() {
        out.push('/');
        out.push_str(path);
    }
    if !query.is_empty() {
        out.push('?');
        out.push_str(query);
    }
    Endpoint::parse(&out)?;
    Ok(out)
}

/// `url` with the option `key` set to `value`: an earlier value of `key` is replaced,
/// every other option kept in its place, and `value` percent-encoded where it must be.
///
/// # Errors
/// [`UrlError`] when `url` does not parse, or the option is unknown to its scheme or its
/// value is not one the option takes.
pub fn with_option(url: &str, key: &str, value: &str) -> Result<String, UrlError> {
    let (scheme, rest) = scheme_and_rest(url)?;
    let (head, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut pairs: Vec<String> = Vec::new();
    let mut replaced = false;
    let encoded = format!("{}={}", percent_encode(key), percent_encode(value));
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let k = pair.split_once('=').map_or(pair, |(k, _)| k);
        if percent_decode(k)? == key {
            if !replaced {
                pairs.push(encoded.clone());
                replaced = true;
            }
        } else {
            pairs.push(pair.to_owned());
        }
    }
    if !replaced {
        pairs.push(encoded);
    }
    let out = format!("{scheme}://{head}?{}", pairs.join("&"));
    Endpoint::parse(&out)?;
    Ok(out)
}

/// `mqtt` or `kafka`, and what follows `://` (of `url`, trimmed).
fn scheme_and_rest(url: &str) -> Result<(&'static str, &str), UrlError> {
    let url = url.trim();
    if let Some(rest) = url.strip_prefix("mqtt://") {
        Ok(("mqtt", rest))
    } else if let Some(rest) = url.strip_prefix("kafka://") {
        Ok(("kafka", rest))
    } else {
        Err(UrlError::UnknownScheme(url.to_owned()))
    }
}

/// `s` with the characters that mean something in an address's query (`%&=?#/` and
/// space) percent-encoded.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' | '&' | '=' | '?' | '#' | '/' | ' ' => out.push_str(&format!("%{:02X}", c as u32)),
            _ => out.push(c),
        }
    }
    out
}

/// Splits `authority/path?query`.
fn split(rest: &str) -> (&str, &str, &str) {
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    (authority, path, query)
}

fn parse_host_port(url: &str, s: &str, default_port: u16) -> Result<(String, u16), UrlError> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| UrlError::MissingHost(url.to_owned()))?;
        (h, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::MissingHost(url.to_owned()));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(UrlError::BadPort {
                    url: url.to_owned(),
                    port: p.to_owned(),
                });
            }
        },
    };
    Ok((host.to_owned(), port))
}

fn query_pairs(query: &str) -> Result<Vec<(String, String)>, UrlError> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, UrlError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(v) = hex else {
                return Err(UrlError::Invalid(format!(
                    "{s:?}: '%' must be followed by two hex digits"
                )));
            };
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::Invalid(format!("{s:?} is not UTF-8")))
}

fn num<T: std::str::FromStr>(
    key: &str,
    value: &str,
    expected: &'static str,
) -> Result<T, UrlError> {
    value.parse().map_err(|_| UrlError::BadValue {
        key: key.to_owned(),
        value: value.to_owned(),
        expected,
    })
}

fn boolean(key: &str, value: &str) -> Result<bool, UrlError> {
    match value {
        "true" | "1" | "yes" | "" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(UrlError::BadValue {
            key: key.to_owned(),
            value: value.to_owned(),
            expected: "true or false",
        }),
    }
}

fn parse_mqtt(url: &str, rest: &str) -> Result<MqttEndpoint, UrlError> {
    let (authority, path, query) = split(rest);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, port) = parse_host_port(url, hostport, MQTT_DEFAULT_PORT)?;
    let mut m = MqttEndpoint {
        host,
        port,
        version: MqttVersion::V5,
        qos: 0,
        connections: 1,
        username: None,
        password: None,
        client_id: None,
        inflight: 100,
        request_capacity: 1000,
        keep_alive_s: 30,
        retain: false,
        prefix: None,
        carrier: None,
        connect_timeout_ms: 5000,
        clean: true,
        session_expiry_s: 300,
    };
    if let Some(u) = userinfo {
        let (user, pass) = u.split_once(':').unwrap_or((u, ""));
        m.username = Some(percent_decode(user)?);
        if !pass.is_empty() {
            m.password = Some(percent_decode(pass)?);
        }
    }
    let path = path.trim_matches('/');
    if !path.is_empty() {
        m.prefix = Some(percent_decode(path)?);
    }
    for (k, v) in query_pairs(query)? {
        match k.as_str() {
            "version" | "protocol" => {
                m.version = match v.as_str() {
                    "5" | "5.0" | "v5" => MqttVersion::V5,
                    "3.1.1" | "311" | "3" | "v3" | "v311" | "4" => MqttVersion::V311,
                    _ => {
                        return Err(UrlError::BadValue {
                            key: k,
                            value: v,
                            expected: "5 or 3.1.1",
                        });
                    }
                }
            }
            "qos" => {
                m.qos = match v.as_str() {
                    "0" => 0,
                    "1" => 1,
                    "2" => 2,
                    _ => {
                        return Err(UrlError::BadValue {
                            key: k,
                            value: v,
                            expected: "0, 1 or 2",
                        });
                    }
                }
            }
            "connections" => {
                m.connections = num(&k, &v, "a number of connections from 1 to 1024")?;
                if !(1..=1024).contains(&m.connections) {
                    return Err(UrlError::BadValue {
                        key: k,
                        value: v,
                        expected: "a number of connections from 1 to 1024",
                    });
                }
            }
            "user" | "username" => m.username = Some(v),
            "password" => m.password = Some(v),
            "client_id" => m.client_id = Some(v),
            "inflight" => {
                m.inflight = num(&k, &v, "a number from 1 to 65535")?;
                if m.inflight == 0 {
                    return Err(UrlError::BadValue {
                        key: k,
                        value: v,
                        expected: "a number from 1 to 65535",
                    });
                }
            }
            "request_capacity" => {
                m.request_capacity = num(&k, &v, "a positive number of requests")?;
                m.request_capacity = m.request_capacity.max(1);
            }
            "keep_alive_s" => m.keep_alive_s = num(&k, &v, "seconds")?,
            "retain" => m.retain = boolean(&k, &v)?,
            "clean" => m.clean = boolean(&k, &v)?,
            "session_expiry_s" => m.session_expiry_s = num(&k, &v, "seconds")?,
            "carrier" => m.carrier = Some(Carrier::parse(&v)?),
            "connect_timeout_ms" => m.connect_timeout_ms = num(&k, &v, "milliseconds")?,
            _ => {
                return Err(UrlError::UnknownOption {
                    scheme: "mqtt",
                    key: k,
                    known: MQTT_OPTIONS,
                });
            }
        }
    }
    if m.password.is_some() && m.username.is_none() {
        return Err(UrlError::Invalid(
            "a password needs a user name: add user=<name>".into(),
        ));
    }
    if !m.clean && m.client_id.is_none() {
        return Err(UrlError::Invalid(
            "clean=false needs a fixed client_id=<name>: the broker keeps the session under that id"
                .into(),
        ));
    }
    Ok(m)
}

fn parse_kafka(url: &str, rest: &str) -> Result<KafkaEndpoint, UrlError> {
    let (authority, path, query) = split(rest);
    if authority.is_empty() {
        return Err(UrlError::MissingHost(url.to_owned()));
    }
    let bootstrap = authority
        .split(',')
        .map(|hp| parse_host_port(url, hp, KAFKA_DEFAULT_PORT))
        .collect::<Result<Vec<_>, _>>()?;
    let topics = path
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(percent_decode)
        .collect::<Result<Vec<_>, _>>()?;
    let mut k = KafkaEndpoint {
        bootstrap,
        topics,
        acks: "all".into(),
        linger_ms: None,
        batch_size: None,
        batch_messages: None,
        compression: Compression::None,
        partitions: None,
        key: KeyMode::Stream,
        queue_messages: None,
        group: None,
        offset: StartOffset::End,
        carrier: None,
        connect_timeout_ms: 5000,
        extra: Vec::new(),
    };
    for (key, v) in query_pairs(query)? {
        match key.as_str() {
            "acks" => {
                k.acks = match v.as_str() {
                    "0" | "1" | "all" => v.clone(),
                    "-1" => "all".into(),
                    _ => {
                        return Err(UrlError::BadValue {
                            key,
                            value: v,
                            expected: "0, 1 or all",
                        });
                    }
                }
            }
            "linger_ms" => k.linger_ms = Some(num(&key, &v, "milliseconds")?),
            "batch_size" => k.batch_size = Some(num(&key, &v, "bytes")?),
            "batch_messages" => k.batch_messages = Some(num(&key, &v, "a number of messages")?),
            "compression" => {
                k.compression = match v.as_str() {
                    "none" => Compression::None,
                    "gzip" => Compression::Gzip,
                    "snappy" => Compression::Snappy,
                    "lz4" => Compression::Lz4,
                    "zstd" => Compression::Zstd,
                    _ => {
                        return Err(UrlError::BadValue {
                            key,
                            value: v,
                            expected: "none, gzip, snappy, lz4 or zstd",
                        });
                    }
                }
            }
            "partitions" => {
                let n: u32 = num(&key, &v, "a positive number of partitions")?;
                if n == 0 {
                    return Err(UrlError::BadValue {
                        key,
                        value: v,
                        expected: "a positive number of partitions",
                    });
                }
                k.partitions = Some(n);
            }
            "key" => {
                k.key = match v.as_str() {
                    "stream" => KeyMode::Stream,
                    "none" => KeyMode::None,
                    _ => {
                        return Err(UrlError::BadValue {
                            key,
                            value: v,
                            expected: "stream or none",
                        });
                    }
                }
            }
            "queue_messages" => k.queue_messages = Some(num(&key, &v, "a number of messages")?),
            "group" => k.group = Some(v),
            "offset" => {
                k.offset = match v.as_str() {
                    "end" | "latest" => StartOffset::End,
                    "beginning" | "earliest" => StartOffset::Beginning,
                    _ => {
                        return Err(UrlError::BadValue {
                            key,
                            value: v,
                            expected: "end or beginning",
                        });
                    }
                }
            }
            "carrier" => k.carrier = Some(Carrier::parse(&v)?),
            "connect_timeout_ms" => k.connect_timeout_ms = num(&key, &v, "milliseconds")?,
            other => match other.strip_prefix("rdkafka.") {
                Some(prop) if !prop.is_empty() => k.extra.push((prop.to_owned(), v)),
                _ => {
                    return Err(UrlError::UnknownOption {
                        scheme: "kafka",
                        key,
                        known: KAFKA_OPTIONS,
                    });
                }
            },
        }
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_a_new_path_and_keeps_the_rest() {
        assert_eq!(
            with_path("kafka://h:1,h:2/a?acks=1&linger_ms=5", "b-p3").unwrap(),
            "kafka://h:1,h:2/b-p3?acks=1&linger_ms=5"
        );
        assert_eq!(with_path("kafka://h:1", "x").unwrap(), "kafka://h:1/x");
        assert_eq!(
            with_path("mqtt://u:p@h:1883/old?qos=1", "/new/").unwrap(),
            "mqtt://u:p@h:1883/new?qos=1"
        );
        assert!(matches!(
            with_path("amqp://h/x", "y"),
            Err(UrlError::UnknownScheme(_))
        ));
    }

    #[test]
    fn an_option_is_set_once_and_checked() {
        assert_eq!(
            with_option("kafka://h:1/t", "acks", "all").unwrap(),
            "kafka://h:1/t?acks=all"
        );
        // An earlier value is replaced in its place, not followed by a second one.
        assert_eq!(
            with_option("kafka://h:1/t?acks=1&linger_ms=5&acks=0", "acks", "all").unwrap(),
            "kafka://h:1/t?acks=all&linger_ms=5"
        );
        assert_eq!(
            with_option("mqtt://h:1?qos=0", "connections", "4").unwrap(),
            "mqtt://h:1?qos=0&connections=4"
        );
        let group = with_option("kafka://h:1/t", "group", "a&b=c").unwrap();
        assert_eq!(group, "kafka://h:1/t?group=a%26b%3Dc");
        match Endpoint::parse(&group).unwrap() {
            Endpoint::Kafka(k) => assert_eq!(k.group.as_deref(), Some("a&b=c")),
            Endpoint::Mqtt(_) => unreachable!(),
        }
        // What the scheme does not take is refused, naming it.
        assert!(matches!(
            with_option("mqtt://h:1", "acks", "all"),
            Err(UrlError::UnknownOption { .. })
        ));
        assert!(matches!(
            with_option("mqtt://h:1", "qos", "7"),
            Err(UrlError::BadValue { .. })
        ));
    }

    fn mqtt(s: &str) -> MqttEndpoint {
        match Endpoint::parse(s).unwrap() {
            Endpoint::Mqtt(m) => m,
            Endpoint::Kafka(_) => panic!("not mqtt"),
        }
    }

    fn kafka(s: &str) -> KafkaEndpoint {
        match Endpoint::parse(s).unwrap() {
            Endpoint::Kafka(k) => k,
            Endpoint::Mqtt(_) => panic!("not kafka"),
        }
    }

    #[test]
    fn mqtt_defaults_and_options() {
        let m = mqtt("mqtt://127.0.0.1:11883");
        assert_eq!((m.host.as_str(), m.port), ("127.0.0.1", 11883));
        assert_eq!((m.version, m.qos, m.connections), (MqttVersion::V5, 0, 1));
        assert_eq!(mqtt("mqtt://localhost").port, MQTT_DEFAULT_PORT);

        let m = mqtt(
            "mqtt://u%40x:p%26w@127.0.0.1:11884/plant/a?version=3.1.1&qos=2&connections=4&inflight=20&retain=true",
        );
        assert_eq!(m.username.as_deref(), Some("u@x"));
        assert_eq!(m.password.as_deref(), Some("p&w"));
        assert_eq!(m.prefix.as_deref(), Some("plant/a"));
        assert_eq!(
            (m.version, m.qos, m.connections, m.inflight, m.retain),
            (MqttVersion::V311, 2, 4, 20, true)
        );
        assert!(m.clean, "clean sessions by default");
        let m = mqtt("mqtt://h?qos=1&clean=false&client_id=tap-a&session_expiry_s=60");
        assert_eq!(
            (m.clean, m.session_expiry_s, m.client_id.as_deref()),
            (false, 60, Some("tap-a"))
        );
        let m = mqtt("mqtt://[::1]:1884?user=hoptrace&password=x");
        assert_eq!((m.host.as_str(), m.port), ("::1", 1884));
        assert_eq!(m.username.as_deref(), Some("hoptrace"));
    }

    #[test]
    fn kafka_options() {
        let k = kafka(
            "kafka://127.0.0.1:19092,127.0.0.1/t1?acks=1&linger_ms=5&batch_size=65536&compression=lz4&partitions=3&key=none&rdkafka.socket.nagle.disable=true",
        );
        assert_eq!(k.bootstrap_servers(), "127.0.0.1:19092,127.0.0.1:9092");
        assert_eq!(k.topics, vec!["t1".to_owned()]);
        assert_eq!(k.acks, "1");
        assert_eq!(k.linger_ms, Some(5));
        assert_eq!(k.batch_size, Some(65536));
        assert_eq!(k.compression, Compression::Lz4);
        assert_eq!(k.partitions, Some(3));
        assert_eq!(k.key, KeyMode::None);
        assert_eq!(
            k.extra,
            vec![("socket.nagle.disable".to_owned(), "true".to_owned())]
        );
        assert_eq!(kafka("kafka://h/a,b").topics, vec!["a", "b"]);
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(matches!(
            Endpoint::parse("http://x"),
            Err(UrlError::UnknownScheme(_))
        ));
        assert!(matches!(
            Endpoint::parse("mqtt://"),
            Err(UrlError::MissingHost(_))
        ));
        assert!(matches!(
            Endpoint::parse("mqtt://h:0"),
            Err(UrlError::BadPort { .. })
        ));
        assert!(matches!(
            Endpoint::parse("mqtt://h:99999"),
            Err(UrlError::BadPort { .. })
        ));
        let e = Endpoint::parse("mqtt://h?qos=3").unwrap_err();
        assert_eq!(e.to_string(), "option qos=\"3\": expected 0, 1 or 2");
        let e = Endpoint::parse("mqtt://h?linger_ms=3").unwrap_err();
        assert!(
            matches!(&e, UrlError::UnknownOption { scheme: "mqtt", key, .. } if key == "linger_ms"),
            "{e}"
        );
        assert!(matches!(
            Endpoint::parse("kafka://h/t?acks=2"),
            Err(UrlError::BadValue { .. })
        ));
        assert!(matches!(
            Endpoint::parse("kafka://h/t?partitions=0"),
            Err(UrlError::BadValue { .. })
        ));
        assert!(matches!(
            Endpoint::parse("mqtt://h?password=x"),
            Err(UrlError::Invalid(_))
        ));
        assert!(matches!(
            Endpoint::parse("mqtt://h?user=%zz"),
            Err(UrlError::Invalid(_))
        ));
        let e = Endpoint::parse("mqtt://h?qos=1&clean=false").unwrap_err();
        assert!(e.to_string().contains("client_id"), "{e}");
    }

    #[test]
    fn carrier_per_transport_and_overrides() {
        let v5 = Endpoint::parse("mqtt://h").unwrap();
        let v3 = Endpoint::parse("mqtt://h?version=3.1.1").unwrap();
        let k = Endpoint::parse("kafka://h/t").unwrap();
        assert_eq!(v5.carrier(None), Ok(Carrier::Property));
        assert_eq!(v3.carrier(None), Ok(Carrier::Envelope));
        assert_eq!(k.carrier(None), Ok(Carrier::Header));
        assert_eq!(v5.carrier(Some(Carrier::Envelope)), Ok(Carrier::Envelope));
        assert_eq!(k.carrier(Some(Carrier::Envelope)), Ok(Carrier::Envelope));
        assert!(v3.carrier(Some(Carrier::Property)).is_err());
        assert!(v5.carrier(Some(Carrier::Header)).is_err());
        assert!(k.carrier(Some(Carrier::Property)).is_err());
        let url_env = Endpoint::parse("kafka://h/t?carrier=envelope").unwrap();
        assert_eq!(url_env.carrier(None), Ok(Carrier::Envelope));
        assert_eq!(url_env.carrier(Some(Carrier::Header)), Ok(Carrier::Header));
    }
}
