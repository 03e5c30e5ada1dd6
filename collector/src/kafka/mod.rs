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
//! This module holds what both sides share (the address, the errors, the headers);
//! [`relay`] and [`member`] are the two sides. Topic administration and the summarised
//! client logs are `hoptrace-broker`'s ([`hoptrace_broker::kafka`]).

pub mod member;
pub mod relay;

pub use member::{MemberConfig, MemberProgress, run_member};
pub use relay::{Relay, RelayConfig, RelayStats};

use std::path::{Path, PathBuf};

use hoptrace_broker::url::{Endpoint, UrlError};

/// Header naming the probe connection a control message came from.
const SOURCE_HEADER: &str = "hoptrace-source";
/// Header with the probe's address, on hello messages.
const PEER_HEADER: &str = "hoptrace-peer";
/// Header on goodbye messages: "1" when the probe said goodbye, "0" when it vanished.
const CLEAN_HEADER: &str = "hoptrace-clean";
/// Header ("1") on the relay's Counters frames that count, per hop wire id (the counter
/// id), the records it forwarded from the connection named by the source header.
const FORWARDED_HEADER: &str = "hoptrace-forwarded";

/// The Kafka topic of a scale-out run, `kafka://HOST:PORT[,HOST:PORT...]/TOPIC`: the relay
/// writes the probes' records to it and the group's members read them from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordsTopic {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// The records topic; control messages go to `<topic>.control`.
    pub topic: String,
    /// librdkafka properties given as `?rdkafka.NAME=VALUE`, set on the clients this
    /// address creates (the relay's producer, a member's consumers) after their own
    /// settings, so they override them.
    pub client: Vec<(String, String)>,
}

impl RecordsTopic {
    /// Parses `kafka://brokers/topic[?rdkafka.NAME=VALUE&...]`: one topic, and no options
    /// but librdkafka properties (the relay and the members choose their clients' other
    /// settings themselves).
    ///
    /// # Errors
    /// A message naming the address and what is missing or too much.
    pub fn parse(url: &str) -> Result<Self, KafkaError> {
        const FORM: &str = "expected kafka://HOST:PORT[,...]/TOPIC";
        let bad = |why: &str| KafkaError::Config(format!("{url:?}: {why}"));
        if let Some((_, query)) = url.split_once('?') {
            let other = query
                .split('&')
                .find(|kv| !kv.starts_with("rdkafka.") || !kv.contains('='));
            if let Some(kv) = other {
                return Err(bad(&format!(
                    "{kv:?}: takes no options but librdkafka properties (?rdkafka.NAME=VALUE)"
                )));
            }
        }
        let k = match Endpoint::parse(url) {
            Ok(Endpoint::Kafka(k)) => k,
            Ok(Endpoint::Mqtt(_)) | Err(UrlError::UnknownScheme(_)) => return Err(bad(FORM)),
            Err(UrlError::MissingHost(_)) => return Err(bad(&format!("no host, {FORM}"))),
            Err(e) => return Err(KafkaError::Config(e.to_string())),
        };
        match k.topics.as_slice() {
            [] => Err(bad("no topic (kafka://HOST:PORT/TOPIC)")),
            [t] if !t.contains('/') => Ok(Self {
                brokers: k.bootstrap_servers(),
                topic: t.clone(),
                client: k.extra,
            }),
            _ => Err(bad("one topic, without '/' (kafka://HOST:PORT/TOPIC)")),
        }
    }

    /// The control topic.
    #[must_use]
    pub fn control_topic(&self) -> String {
        format!("{}.control", self.topic)
    }

    /// Sets the address's librdkafka properties on `config`.
    pub fn apply_client(&self, config: &mut rdkafka::ClientConfig) {
        for (k, v) in &self.client {
            config.set(k, v);
        }
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
    /// A topic could not be checked or created.
    #[error(transparent)]
    Admin(#[from] hoptrace_broker::kafka::AdminError),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_targets_parse_and_name_what_is_wrong() {
        let t = RecordsTopic::parse("kafka://127.0.0.1:29092,127.0.0.1:29093/hoptrace.records")
            .unwrap();
        assert_eq!(t.brokers, "127.0.0.1:29092,127.0.0.1:29093");
        assert_eq!(t.topic, "hoptrace.records");
        assert_eq!(t.control_topic(), "hoptrace.records.control");
        assert!(t.client.is_empty());
        let t = RecordsTopic::parse("kafka://h:1/t?rdkafka.max.in.flight=1&rdkafka.linger.ms=20")
            .unwrap();
        assert_eq!(
            t.client,
            [
                ("max.in.flight".to_owned(), "1".to_owned()),
                ("linger.ms".to_owned(), "20".to_owned())
            ]
        );
        for bad in [
            "kafka://h:1/t?acks=all",
            "kafka://h:1/t?rdkafka.linger.ms=5&partitions=3",
            "kafka://h:1/t?rdkafka.linger.ms",
            "127.0.0.1:9092/t",
            "kafka://127.0.0.1:9092",
            "kafka:///t",
            "kafka://h:1/",
            "kafka://h:1/a/b",
        ] {
            let e = RecordsTopic::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
