//! Kafka plumbing every hoptrace client shares: librdkafka's logs summarised
//! ([`QuietLogs`], [`QuietContext`]), and topic administration: checking that topics exist
//! before a consumer joins ([`check_topics`]), creating a topic with a layout
//! ([`ensure_topic`]), and reading a topic's layout back ([`topic_layout`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;

/// Why a topic could not be checked, created or described.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No broker answered, the topic is missing or was refused: the message says which,
    /// with the address, and what to do.
    #[error("{0}")]
    Config(String),
    /// The client failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
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

    /// A line of librdkafka's log ([`ClientContext::log`]), at the matching level.
    pub fn client_log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let level = match level {
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::Level::ERROR,
            L::Warning => tracing::Level::WARN,
            L::Notice | L::Info => tracing::Level::INFO,
            L::Debug => tracing::Level::DEBUG,
        };
        self.log(level, &format!("kafka: {fac} {message}"));
    }

    /// An error librdkafka reports ([`ClientContext::error`]).
    pub fn client_error(&self, error: &rdkafka::error::KafkaError, reason: &str) {
        self.log(tracing::Level::ERROR, &format!("kafka: {error}: {reason}"));
    }
}

/// The summariser every Kafka client of this process logs through.
pub fn quiet() -> &'static QuietLogs {
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
        quiet().client_error(&error, reason);
    }
}

impl ConsumerContext for QuietContext {}

/// How long a [`Leaving`] consumer waits, when dropped, to leave its group.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// A group consumer that leaves its group within [`CLOSE_WAIT`] when dropped. A
/// `BaseConsumer` dropped as it is waits for librdkafka's close without limit, and a close
/// can wait on a rebalance that never settles (seen with a collector-group member the
/// coordinator no longer knew, its last commit refused with `UnknownMemberId`): it would
/// never exit. Past the wait the consumer is left to the process's exit, and the group drops the
/// member after its session timeout.
pub struct Leaving<C: ConsumerContext>(Option<BaseConsumer<C>>);

impl<C: ConsumerContext> Leaving<C> {
    /// Takes `consumer` over.
    #[must_use]
    pub fn new(consumer: BaseConsumer<C>) -> Self {
        Self(Some(consumer))
    }
}

impl<C: ConsumerContext> std::fmt::Debug for Leaving<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaving").finish_non_exhaustive()
    }
}

impl<C: ConsumerContext> std::ops::Deref for Leaving<C> {
    type Target = BaseConsumer<C>;

    fn deref(&self) -> &BaseConsumer<C> {
        self.0.as_ref().expect("taken only when dropped")
    }
}

impl<C: ConsumerContext> Drop for Leaving<C> {
    fn drop(&mut self) {
        let Some(c) = self.0.take() else {
            return;
        };
        if c.close_queue().is_ok() {
            let until = Instant::now() + CLOSE_WAIT;
            while !c.closed() && Instant::now() < until {
                // Serves the close's rebalance events.
                let _ = c.poll(Duration::from_millis(100));
            }
        }
        if !c.closed() {
            std::mem::forget(c);
            tracing::warn!(
                wait = ?CLOSE_WAIT,
                "a Kafka consumer did not leave its group in time: left to the process's exit (the group drops it after its session timeout)"
            );
        }
    }
}

/// How long [`check_topics`] waits for a broker to answer.
pub const BROKER_WAIT: Duration = Duration::from_secs(6);

/// Checks, before a consumer joins, that a broker at `brokers` answers and that every
/// topic of `topics` exists: a consumer would otherwise wait forever, logging. Gives up
/// after `within`, or as soon as `stop` is set. Returns the partition count of the first
/// topic.
///
/// # Errors
/// [`AdminError::Config`] naming the brokers ("no Kafka broker reachable at ..."), the
/// missing topic and how to create it, or the interruption.
pub fn check_topics(
    brokers: &str,
    topics: &[&str],
    stop: &AtomicBool,
    within: Duration,
) -> Result<i32, AdminError> {
    let client: BaseConsumer<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let deadline = Instant::now() + within;
    let metadata = loop {
        if stop.load(Relaxed) {
            return Err(AdminError::Config(format!(
                "interrupted while waiting for a Kafka broker at {brokers}"
            )));
        }
        match client.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(md) if !md.brokers().is_empty() => break md,
            Ok(_) => {}
            Err(e) if Instant::now() >= deadline => {
                return Err(AdminError::Config(format!(
                    "no Kafka broker reachable at {brokers} within {}s ({e}): check the address, and that Kafka runs",
                    within.as_secs()
                )));
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(AdminError::Config(format!(
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
            return Err(AdminError::Config(format!(
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
) -> Result<i32, AdminError> {
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
            Err((t, e)) => return Err(AdminError::Config(format!("creating topic {t}: {e}"))),
        }
    }
    wait_led(topic, led)
}

/// Deletes `topic`; a topic that does not exist is no error.
///
/// # Errors
/// When Kafka refuses the deletion for another reason.
pub fn delete_topic(brokers: &str, topic: &str) -> Result<(), AdminError> {
    let admin: AdminClient<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in block_on(admin.delete_topics(&[topic], &opts))? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, e)) => return Err(AdminError::Config(format!("deleting topic {t}: {e}"))),
        }
    }
    Ok(())
}

/// How long a topic may take to reach every broker's metadata with a leader for each
/// partition.
const METADATA_WAIT: Duration = Duration::from_secs(30);

/// Asks `led` until it answers, for up to [`METADATA_WAIT`].
fn wait_led<T>(
    topic: &str,
    led: impl Fn() -> Result<Option<T>, AdminError>,
) -> Result<T, AdminError> {
    let deadline = Instant::now() + METADATA_WAIT;
    loop {
        if let Some(n) = led()? {
            return Ok(n);
        }
        if Instant::now() >= deadline {
            return Err(AdminError::Config(format!(
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
) -> Result<Option<(i32, i32)>, AdminError> {
    let md = client
        .fetch_metadata(Some(topic), BROKER_WAIT)
        .map_err(|e| {
            AdminError::Config(format!(
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
/// broker asked), `min.insync.replicas` from the topic's configuration (asked again until
/// the broker answering knows the topic, at most as long).
///
/// # Errors
/// No broker reachable, the topic missing, or the configuration not readable.
pub fn topic_layout(brokers: &str, topic: &str) -> Result<TopicLayout, AdminError> {
    let client: BaseConsumer<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let (partitions, replication) = wait_led(topic, || led_topic(&client, brokers, topic))?;
    let admin: AdminClient<QuietContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(QuietContext)?;
    let opts = AdminOptions::new().request_timeout(Some(BROKER_WAIT));
    // A broker that has not yet learned of a just-created topic answers without its
    // configuration (or with an unknown-topic error): ask again until the entry is there,
    // as long as the metadata wait.
    let deadline = Instant::now() + METADATA_WAIT;
    let min_insync_replicas = loop {
        let described =
            block_on(admin.describe_configs([&ResourceSpecifier::Topic(topic)], &opts))?;
        let mut found = None;
        let mut error = None;
        for r in described {
            match r {
                Ok(r) => {
                    found = r
                        .get("min.insync.replicas")
                        .and_then(|e| e.value.as_deref())
                        .and_then(|v| v.parse().ok());
                }
                Err(e) => error = Some(e),
            }
        }
        match (found, error) {
            (Some(v), _) => break Some(v),
            (None, Some(e)) if Instant::now() >= deadline => {
                return Err(AdminError::Config(format!(
                    "reading the configuration of topic {topic}: {e}"
                )));
            }
            (None, None) if Instant::now() >= deadline => break None,
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
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
}
