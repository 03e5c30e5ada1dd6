//! What the relay and the group members share: the records topic, the headers of its
//! records, and the errors of both.

use std::path::{Path, PathBuf};

use hoptrace_broker::url::{Endpoint, UrlError};

/// Header naming the probe connection a control message came from.
pub(super) const SOURCE_HEADER: &str = "hoptrace-source";
/// Header with the probe's address, on hello messages.
pub(super) const PEER_HEADER: &str = "hoptrace-peer";
/// Header on goodbye messages: "1" when the probe said goodbye, "0" when it vanished.
pub(super) const CLEAN_HEADER: &str = "hoptrace-clean";
/// Header ("1") on the relay's Counters frames that count, per hop wire id (the counter
/// id), the records it forwarded from the connection named by the source header.
pub(super) const FORWARDED_HEADER: &str = "hoptrace-forwarded";

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

pub(super) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KafkaError + '_ {
    move |source| KafkaError::Io {
        path: path.to_owned(),
        source,
    }
}
