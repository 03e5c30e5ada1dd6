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
mod topic;

pub use member::{MemberConfig, MemberProgress, run_member};
pub use relay::{Relay, RelayConfig, RelayStats};
pub use topic::{KafkaError, RecordsTopic};

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
