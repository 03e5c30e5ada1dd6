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
//!
//! This module holds what both sides share (the address, the errors, the headers, the
//! client logging) and the topic administration ([`admin`]); [`relay`] and [`member`]
//! are the two sides.

pub mod admin;
pub mod member;
pub mod relay;

pub use admin::{BROKER_WAIT, TopicLayout, check_topics, ensure_topic, topic_layout};
pub use member::{MemberConfig, MemberProgress, run_member};
pub use relay::{Relay, RelayConfig, RelayStats};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::consumer::ConsumerContext;

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
