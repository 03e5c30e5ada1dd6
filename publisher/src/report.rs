//! The end summary of a publish run as a file: what `hoptrace publish --summary-json`
//! writes and what `hoptrace soak` and `hoptrace sweep` read back, as one type on both
//! sides of the process boundary.
//!
//! [`PublishSummary`] is the in-process result (with the whole lag distribution and the
//! exporter's counters); [`PublishReport`] is its serialisable form, with the achieved
//! rates measured over a stated window and the lag as a few quantiles.
//!
//! ```
//! use hoptrace_publisher::report::PublishReport;
//!
//! let json = r#"{"messages": 10, "metrics": 500, "metrics_per_s": 50.0}"#;
//! let report: PublishReport = serde_json::from_str(json).unwrap();
//! assert_eq!(report.messages, 10);
//! assert_eq!(report.lag_p99_ns, None);
//! ```

use serde::{Deserialize, Serialize};

use crate::publish::PublishSummary;
use hoptrace_broker::target::TargetStats;

/// A publish run's end summary, as written to `--summary-json`.
///
/// The fields are in alphabetical order, the order of the file's keys since it was first
/// written. A field missing from a file reads as its default (0, `false`, `None`), so a
/// file from an older hoptrace still reads.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PublishReport {
    /// Time spent waiting for the broker client, ns.
    pub backpressure_wait_ns: u64,
    /// Messages whose send waited for the broker client at least once.
    pub backpressure_waits: u64,
    /// What the broker client did with the messages.
    pub broker: BrokerReport,
    /// From the schedule's start to the last message handed over, ns (monotonic).
    pub elapsed_ns: u64,
    /// Send errors (the run stops at the first one).
    pub errors: u64,
    /// Whether the collector got everything (final counters and Goodbye); `None`
    /// without a collector.
    pub exporter_clean: Option<bool>,
    /// Stamps the exporter lost (queue full, send failed, or evicted from its retention
    /// buffer before the collector held them); `None` without a collector.
    pub exporter_lost: Option<u64>,
    /// How well the publisher kept up with its schedule (1.0: every message on time).
    pub keep_up_ratio: f64,
    /// Largest schedule lag, ns.
    pub lag_max_ns: u64,
    /// Schedule lag (egress stamp minus intended send time) p50, ns; `None` when no
    /// message was sent.
    pub lag_p50_ns: Option<u64>,
    /// Schedule lag p99.9, ns.
    pub lag_p999_ns: Option<u64>,
    /// Schedule lag p99, ns.
    pub lag_p99_ns: Option<u64>,
    /// Messages handed to the broker client (and reported as sent).
    pub messages: u64,
    /// Messages per second over the measured window.
    pub messages_per_s: f64,
    /// Metrics in the messages.
    pub metrics: u64,
    /// Metrics per second over the measured window.
    pub metrics_per_s: f64,
    /// Publisher id in the trace keys.
    pub publisher_id: u16,
    /// Run id the collector announced.
    pub run_id: Option<String>,
    /// Intended send time of the last message sent, ns after the start.
    pub schedule_span_ns: u64,
    /// The run was stopped (shutdown) before its schedule ended.
    pub stopped_early: bool,
    /// Streams that sent at least one message.
    pub streams: usize,
    /// The broker, without credentials.
    pub target: String,
    /// Target rate at full speed, metrics per second (`None` for a replay).
    pub target_metrics_per_s: Option<f64>,
}

/// What the broker client did with the messages (see [`TargetStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BrokerReport {
    /// MQTT: the unconfirmed publishes, by why they were abandoned.
    pub abandoned: AbandonedReport,
    /// Acknowledgements: MQTT PUBACK (QoS 1) or PUBCOMP (QoS 2), the broker's promise to
    /// deliver the message; Kafka delivery reports.
    pub acked: u64,
    /// Connection errors seen.
    pub connection_errors: u64,
    /// Kafka records whose delivery failed.
    pub failed: u64,
    /// Messages the client took.
    pub handed: u64,
    /// Reconnections after the first connection.
    pub reconnects: u64,
    /// MQTT: publishes still queued in the client when a connection broke, written after
    /// the reconnection.
    pub requeued: u64,
    /// MQTT: publishes in flight when a connection broke, written again after the
    /// reconnection (a broker that already had one delivers it twice).
    pub retransmitted: u64,
    /// Messages still unconfirmed when the target closed.
    pub unconfirmed: u64,
    /// MQTT: publishes written to the socket (those written again after a reconnection
    /// count again); Kafka: records the broker acknowledged.
    pub written: u64,
}

/// MQTT: why publishes were abandoned, unacknowledged, at close (the parts of
/// [`BrokerReport::unconfirmed`]; see [`TargetStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AbandonedReport {
    /// Connections that were down (broker unreachable) when the target closed.
    pub connections_down_at_close: u64,
    /// Publishes never written (still queued in the client when the flush timeout ended).
    pub never_written: u64,
    /// Publishes written but never acknowledged.
    pub written_unacknowledged: u64,
}

impl From<&TargetStats> for BrokerReport {
    fn from(b: &TargetStats) -> Self {
        Self {
            abandoned: AbandonedReport {
                connections_down_at_close: b.down_at_close,
                never_written: b.abandoned_unwritten,
                written_unacknowledged: b.abandoned_unacked,
            },
            acked: b.acked,
            connection_errors: b.connection_errors,
            failed: b.failed,
            handed: b.handed,
            reconnects: b.reconnects,
            requeued: b.requeued,
            retransmitted: b.retransmitted,
            unconfirmed: b.unconfirmed,
            written: b.written,
        }
    }
}

impl PublishReport {
    /// The report of `s`, its achieved rates measured over `window_s` seconds (the time
    /// the run took, or its planned duration when a schedule ran to its end: at a low rate
    /// the last message leaves long before the end).
    #[must_use]
    pub fn new(s: &PublishSummary, window_s: f64) -> Self {
        let per_s = |n: u64| {
            if window_s > 0.0 {
                n as f64 / window_s
            } else {
                0.0
            }
        };
        let q = |x: f64| s.lag.at(x).map(|q| q.value_ns.unsigned_abs());
        Self {
            backpressure_wait_ns: s.backpressure_wait_ns,
            backpressure_waits: s.backpressure_waits,
            broker: BrokerReport::from(&s.broker),
            errors: s.errors,
            elapsed_ns: s.elapsed_ns,
            exporter_clean: s.exporter_clean,
            exporter_lost: s.exporter.as_ref().map(|c| c.lost()),
            lag_p50_ns: q(0.5),
            lag_p99_ns: q(0.99),
            lag_p999_ns: q(0.999),
            lag_max_ns: s.lag.max_ns,
            keep_up_ratio: s.keep_up_ratio(),
            messages: s.messages,
            messages_per_s: per_s(s.messages),
            metrics: s.metrics,
            metrics_per_s: per_s(s.metrics),
            publisher_id: s.publisher_id,
            run_id: s.run_id.clone(),
            schedule_span_ns: s.schedule_span_ns,
            stopped_early: s.stopped_early,
            streams: s.streams,
            target: s.target.clone(),
            target_metrics_per_s: s.target_metrics_per_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::LagSummary;
    use hoptrace_broker::url::Carrier;
    use hoptrace_format::hist::Percentile;

    fn summary() -> PublishSummary {
        PublishSummary {
            publisher_id: 7,
            target: "mqtt://127.0.0.1:1883".into(),
            carrier: Carrier::Property,
            run_id: Some("run-1".into()),
            started_unix_ns: 1,
            elapsed_ns: 2_000_000_000,
            confirmed_ns: 2_010_000_000,
            schedule_span_ns: 1_900_000_000,
            messages: 1000,
            metrics: 50_000,
            payload_bytes: 1_400_000,
            streams: 10,
            target_metrics_per_s: Some(25_000.0),
            backpressure_waits: 3,
            backpressure_wait_ns: 4_000,
            errors: 0,
            stopped_early: false,
            lag: LagSummary {
                count: 1000,
                quantiles: [(0.5, 10), (0.9, 20), (0.99, 30), (0.999, 40)]
                    .map(|(quantile, value_ns)| Percentile {
                        quantile,
                        value_ns,
                        precision_ns: 1,
                    })
                    .to_vec(),
                max_ns: 55,
                mean_ns: 12.5,
                negative: 0,
            },
            broker: TargetStats {
                handed: 1000,
                written: 1000,
                reconnects: 1,
                retransmitted: 2,
                unconfirmed: 5,
                abandoned_unacked: 3,
                abandoned_unwritten: 2,
                ..TargetStats::default()
            },
            exporter: None,
            exporter_clean: None,
            collector_refused: None,
        }
    }

    #[test]
    fn a_report_survives_the_file_round_trip() {
        let r = PublishReport::new(&summary(), 2.5);
        assert_eq!(r.metrics_per_s, 20_000.0);
        assert_eq!(r.messages_per_s, 400.0);
        assert_eq!(
            (r.lag_p50_ns, r.lag_p99_ns, r.lag_p999_ns),
            (Some(10), Some(30), Some(40))
        );
        assert!((r.keep_up_ratio - 0.95).abs() < 1e-12);
        let text = serde_json::to_string_pretty(&r).unwrap();
        let back: PublishReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_file_keeps_its_keys_and_their_order() {
        let r = PublishReport::new(&summary(), 2.0);
        // A JSON map orders its keys: the text is the one the file always had.
        let as_map = serde_json::to_value(&r).unwrap();
        assert_eq!(
            serde_json::to_string_pretty(&r).unwrap(),
            serde_json::to_string_pretty(&as_map).unwrap()
        );
        let keys: Vec<&str> = as_map
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for key in [
            "messages",
            "metrics_per_s",
            "elapsed_ns",
            "lag_p99_ns",
            "broker",
        ] {
            assert!(keys.contains(&key), "{key}");
        }
        assert_eq!(keys.len(), 23);
        assert_eq!(as_map["broker"]["reconnects"], 1);
        assert_eq!(as_map["broker"]["retransmitted"], 2);
        assert_eq!(as_map["broker"]["abandoned"]["written_unacknowledged"], 3);
        assert_eq!(as_map["broker"]["abandoned"]["never_written"], 2);
        assert_eq!(
            as_map["broker"]["abandoned"]["connections_down_at_close"],
            0
        );
        assert!(as_map["exporter_lost"].is_null());
    }
}
