//! The publisher and the tap against the real brokers `infra/services.sh up` starts
//! (Mosquitto on `HOPTRACE_MQTT` and `HOPTRACE_MQTT_AUTH`, Kafka on `HOPTRACE_KAFKA`),
//! with a real in-process collector: every message sent is accounted for.
//! Ignored by a plain `cargo test`; run (`--ignored`) without the brokers' variables set,
//! they fail saying what to start.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::mosquitto::Mosquitto;
use common::{broker, closed_port, collector, flag, link, tempdir, unique_id, wait_for};
use hoptrace_broker::target::{self, Meta, TargetError};
use hoptrace_collector::RunSummary;
use hoptrace_probe::carrier::HEADER;
use hoptrace_probe::{ExporterConfig, ExporterError, HopId};
use hoptrace_publisher::capture::{self, RecordConfig};
use hoptrace_publisher::publish::{self, PublishConfig, PublishError, PublishSummary};
use hoptrace_publisher::schedule::LoadShape;
use hoptrace_publisher::tap::{Tap, TapConfig, TapSummary};
use hoptrace_publisher::{Carrier, Endpoint, ReplayConfig};

struct Outcome {
    publish: PublishSummary,
    tap: TapSummary,
    run: RunSummary,
}

/// Runs a collector, a tap on `tap_from` and a publisher to `target`, and returns what
/// each of them saw once the tap has seen every message.
fn publish_through_tap(
    target: &str,
    tap_from: &str,
    tap_topics: Vec<String>,
    shape: LoadShape,
    id: u16,
) -> Outcome {
    let dir = tempdir("run");
    let collector = collector(&dir);
    let mut tc = TapConfig::new(Endpoint::parse(tap_from).unwrap());
    tc.topics = tap_topics;
    tc.collector = Some(link(&collector));
    tc.publishers = Some(vec![id]);
    let tap = Tap::start(tc).unwrap();
    let live = tap.live();
    let stop = flag();
    let tap_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || tap.run(&stop))
    };
    let mut pc = PublishConfig::new(Endpoint::parse(target).unwrap(), shape);
    pc.publisher_id = id;
    pc.collector = Some(link(&collector));
    let publish = publish::run(pc, flag()).unwrap();
    wait_for("the tap to see every message", || {
        live.traced.load(Relaxed) >= publish.messages
    });
    stop.store(true, Relaxed);
    let tap = tap_thread.join().unwrap().unwrap();
    let run = collector.stop().unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("test").join("run.json")).unwrap()).unwrap();
    assert_eq!(
        json["accounting"]["adds_up"], true,
        "run.json says the counts add up"
    );
    std::fs::remove_dir_all(&dir).ok();
    Outcome { publish, tap, run }
}

/// Every message sent is complete (publish and broker stamps joined), per publisher, and
/// the stage between them is measured for each.
fn assert_accounted(o: &Outcome, id: u16, n: u64, metrics_per_message: u64) {
    let p = &o.publish;
    assert_eq!(p.messages, n, "messages handed to the client");
    assert_eq!(p.metrics, n * metrics_per_message);
    assert_eq!(p.errors, 0);
    assert_eq!(p.broker.unconfirmed, 0, "{:?}", p.broker);
    assert_eq!(p.lag.count, n, "every message's schedule lag is measured");
    assert_eq!(p.exporter.unwrap().lost(), 0);
    assert_eq!(p.exporter_clean, Some(true));
    assert_eq!(p.run_id.as_deref(), Some("test"));

    assert_eq!(o.tap.traced, n, "the tap saw every message");
    assert_eq!((o.tap.not_traced, o.tap.bad_context), (0, 0));
    assert_eq!(o.tap.exporter.unwrap().lost(), 0);

    let a = &o.run.accounting;
    let mine = a
        .publishers
        .iter()
        .find(|x| x.publisher == id)
        .expect("the collector knows this publisher");
    assert_eq!(mine.sent, n, "Sent frames add up to what was sent");
    assert_eq!(mine.sent_metrics, n * metrics_per_message);
    assert_eq!(
        mine.sent,
        mine.complete + mine.incomplete + mine.unseen,
        "sent = complete + incomplete + unseen"
    );
    assert_eq!((mine.complete, mine.incomplete, mine.unseen), (n, 0, 0));
    assert!(a.adds_up);
    assert_eq!(a.records_by_hop.get("publish"), Some(&n));
    assert_eq!(a.records_by_hop.get("broker"), Some(&n));
    let stage = o
        .run
        .stages
        .iter()
        .find(|s| s.name == "publish -> broker")
        .unwrap();
    assert_eq!(
        stage.figures.count, n,
        "a delta for every message, negative ones included"
    );
}

fn shape(rate_metrics: f64, streams: u32, metrics_per_message: u32, n: u64) -> LoadShape {
    let mut s = LoadShape::uniform(rate_metrics, streams);
    s.metrics_per_message = metrics_per_message;
    s.zipf_exponent = 1.1;
    s.max_messages = Some(n);
    s.duration = Some(Duration::from_secs(20));
    s
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn mqtt_v5_every_message_is_accounted_for() {
    let mqtt = broker("HOPTRACE_MQTT");
    let id = unique_id();
    let prefix = format!("hoptrace-test/pub-v5-{id}");
    let n = 3000;
    let o = publish_through_tap(
        &format!("mqtt://{mqtt}/{prefix}?qos=1&connections=2"),
        &format!("mqtt://{mqtt}?qos=1"),
        vec![format!("{prefix}/#")],
        shape(50_000.0, 200, 10, n),
        id,
    );
    assert_accounted(&o, id, n, 10);
    assert_eq!(o.publish.carrier, Carrier::Property);
    assert_eq!(o.publish.broker.acked, n, "every PUBACK came");
    assert_eq!(o.tap.arrival_stamps, n);
    assert_eq!(o.tap.stamp_resolution_ns, None);
    assert_eq!(o.tap.publish_to_arrival.count, n);
    let stage = o
        .run
        .stages
        .iter()
        .find(|s| s.name == "publish -> broker")
        .unwrap();
    assert_eq!(
        stage.figures.negative, 0,
        "one host, one clock: delivery is never negative"
    );
}

/// Publishes `n` messages bare to `target` while a tap (no collector) reads `tap_from`,
/// and returns both summaries once the tap has received them all.
fn publish_bare_through_tap(
    target: &str,
    tap_from: &str,
    tap_topics: Vec<String>,
    n: u64,
) -> (PublishSummary, TapSummary) {
    let mut tc = TapConfig::new(Endpoint::parse(tap_from).unwrap());
    tc.topics = tap_topics;
    let tap = Tap::start(tc).unwrap();
    let live = tap.live();
    let stop = flag();
    let tap_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || tap.run(&stop))
    };
    let mut pc = PublishConfig::new(Endpoint::parse(target).unwrap(), shape(20_000.0, 50, 5, n));
    pc.bare = true;
    let publish = publish::run(pc, flag()).unwrap();
    wait_for("the tap to receive every message", || {
        live.received.load(Relaxed) >= n
    });
    stop.store(true, Relaxed);
    (publish, tap_thread.join().unwrap().unwrap())
}

/// A bare publisher (the baseline of `bench publisher --bare`) sends every message through
/// the same client, and none of them carries a trace context in any carrier.
#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn bare_messages_carry_no_trace_context() {
    let n = 2000;
    let mqtt = broker("HOPTRACE_MQTT");
    let prefix = format!("hoptrace-test/bare-{}", unique_id());
    let (p, t) = publish_bare_through_tap(
        &format!("mqtt://{mqtt}/{prefix}?qos=1"),
        &format!("mqtt://{mqtt}?qos=1"),
        vec![format!("{prefix}/#")],
        n,
    );
    assert_eq!((p.messages, p.broker.acked, p.errors), (n, n, 0));
    assert!(p.exporter.is_none(), "no collector");
    // JSON batches of 5 metrics: tens of bytes a metric, whatever the values.
    assert!(
        (100..2000).contains(&(p.payload_bytes / n)),
        "{} payload bytes a message",
        p.payload_bytes / n
    );
    assert_eq!((t.received, t.traced, t.not_traced), (n, 0, n));

    let kafka = broker("HOPTRACE_KAFKA");
    let topic = format!("hoptrace-pub-bare-{}-{}", unique_id(), std::process::id());
    kafka_admin::create_topic(&kafka, &topic, 3, false);
    for carrier in ["header", "envelope"] {
        let (p, t) = publish_bare_through_tap(
            &format!("kafka://{kafka}/{topic}?acks=all&linger_ms=1&carrier={carrier}"),
            &format!("kafka://{kafka}/{topic}?carrier={carrier}"),
            vec![],
            n,
        );
        assert_eq!(
            (p.messages, p.broker.acked, p.errors),
            (n, n, 0),
            "{carrier}"
        );
        assert_eq!(
            (t.traced, t.not_traced, t.bad_context),
            (0, n, 0),
            "{carrier}"
        );
    }
    kafka_admin::delete_topic(&kafka, &topic);

    let mut pc = PublishConfig::new(
        Endpoint::parse(&format!("mqtt://{mqtt}")).unwrap(),
        shape(1000.0, 1, 1, 1),
    );
    pc.bare = true;
    pc.context_in_payload = true;
    let err = publish::run(pc, flag()).unwrap_err().to_string();
    assert!(err.contains("a bare publisher traces nothing"), "{err}");
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn mqtt_3_1_1_envelope_through_the_auth_listener() {
    let auth = broker("HOPTRACE_MQTT_AUTH");
    let id = unique_id();
    let prefix = format!("hoptrace-test/pub-v3-{id}");
    let n = 2000;
    let creds = "user=hoptrace&password=hoptrace-test&version=3.1.1&qos=1";
    let o = publish_through_tap(
        &format!("mqtt://{auth}/{prefix}?{creds}"),
        &format!("mqtt://{auth}?{creds}"),
        vec![format!("{prefix}/#")],
        shape(2000.0, 30, 1, n),
        id,
    );
    assert_accounted(&o, id, n, 1);
    assert_eq!(o.publish.carrier, Carrier::Envelope);
    assert_eq!(o.tap.carrier, Carrier::Envelope);
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn kafka_every_message_is_accounted_for_and_log_append_time_is_the_brokers_stamp() {
    let kafka = broker("HOPTRACE_KAFKA");
    let id = unique_id();
    let topic = format!("hoptrace-pub-test-{id}-{}", std::process::id());
    kafka_admin::create_topic(&kafka, &topic, 3, true);
    let n = 3000;
    let o = publish_through_tap(
        &format!("kafka://{kafka}/{topic}?acks=all&linger_ms=1&partitions=3&compression=lz4"),
        &format!("kafka://{kafka}/{topic}"),
        vec![],
        shape(60_000.0, 100, 20, n),
        id,
    );
    kafka_admin::delete_topic(&kafka, &topic);
    assert_accounted(&o, id, n, 20);
    assert_eq!(o.publish.carrier, Carrier::Header);
    assert_eq!(
        o.publish.broker.acked, n,
        "a delivery report for every record"
    );
    assert_eq!(
        (o.tap.log_append_time_stamps, o.tap.arrival_stamps),
        (n, 0),
        "the topic uses LogAppendTime: the broker's own stamp is reported"
    );
    assert_eq!(o.tap.stamp_resolution_ns, Some(1_000_000));
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn kafka_envelope_carrier_on_a_create_time_topic_uses_arrival_stamps() {
    let kafka = broker("HOPTRACE_KAFKA");
    let id = unique_id();
    let topic = format!("hoptrace-pub-env-{id}-{}", std::process::id());
    kafka_admin::create_topic(&kafka, &topic, 1, false);
    let n = 1000;
    let o = publish_through_tap(
        &format!("kafka://{kafka}/{topic}?carrier=envelope&key=none"),
        &format!("kafka://{kafka}/{topic}?carrier=envelope"),
        vec![],
        shape(5000.0, 10, 1, n),
        id,
    );
    kafka_admin::delete_topic(&kafka, &topic);
    assert_accounted(&o, id, n, 1);
    assert_eq!(o.publish.carrier, Carrier::Envelope);
    assert_eq!((o.tap.log_append_time_stamps, o.tap.arrival_stamps), (0, n));
}

/// A client window of one message against a schedule far faster than a broker round
/// trip: sends wait for the client (counted), and still every message is accounted for.
#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn backpressure_is_waited_on_and_counted_never_dropped() {
    let (mqtt, kafka) = (broker("HOPTRACE_MQTT"), broker("HOPTRACE_KAFKA"));
    let id = unique_id();
    let prefix = format!("hoptrace-test/bp-{id}");
    let n = 2000;
    let o = publish_through_tap(
        &format!("mqtt://{mqtt}/{prefix}?qos=1&inflight=1&request_capacity=1"),
        &format!("mqtt://{mqtt}?qos=1"),
        vec![format!("{prefix}/#")],
        shape(1e6, 10, 1, n),
        id,
    );
    assert_accounted(&o, id, n, 1);
    assert!(
        o.publish.backpressure_waits > 0,
        "MQTT: {:?}",
        o.publish.broker
    );
    assert!(o.publish.lag.max_ns > 0);

    let id = unique_id().wrapping_add(7).max(1);
    let topic = format!("hoptrace-pub-bp-{id}-{}", std::process::id());
    kafka_admin::create_topic(&kafka, &topic, 1, false);
    let o = publish_through_tap(
        &format!("kafka://{kafka}/{topic}?queue_messages=5&linger_ms=1"),
        &format!("kafka://{kafka}/{topic}"),
        vec![],
        shape(1e6, 10, 1, n),
        id,
    );
    kafka_admin::delete_topic(&kafka, &topic);
    assert_accounted(&o, id, n, 1);
    assert!(
        o.publish.backpressure_waits > 0,
        "Kafka: {:?}",
        o.publish.broker
    );
}

fn publish_error(target: &str) -> PublishError {
    let cfg = PublishConfig::new(Endpoint::parse(target).unwrap(), shape(100.0, 1, 1, 1));
    publish::run(cfg, flag()).expect_err("must fail")
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn a_wrong_password_is_refused_clearly() {
    let auth = broker("HOPTRACE_MQTT_AUTH");
    for version in ["5", "3.1.1"] {
        for creds in ["user=hoptrace&password=wrong", "user=nobody&password=x", ""] {
            let e = publish_error(&format!("mqtt://{auth}?version={version}&{creds}"));
            assert!(
                matches!(e, PublishError::Target(TargetError::AuthRefused { .. })),
                "MQTT {version} {creds:?}: {e:?}"
            );
            assert!(
                e.to_string().contains("refused the credentials")
                    && e.to_string().contains("user= and password="),
                "{e}"
            );
        }
    }
    // The tap reports it the same way.
    let e = Tap::start(TapConfig::new(
        Endpoint::parse(&format!("mqtt://hoptrace:wrong@{auth}")).unwrap(),
    ))
    .expect_err("must fail");
    assert!(e.to_string().contains("refused the credentials"), "{e}");
}

#[test]
fn an_unreachable_broker_is_reported_at_once() {
    let port = closed_port();
    for url in [
        format!("mqtt://127.0.0.1:{port}"),
        format!("mqtt://127.0.0.1:{port}?version=3.1.1"),
        format!("kafka://127.0.0.1:{port}/t"),
    ] {
        let e = publish_error(&url);
        assert!(
            matches!(e, PublishError::Target(TargetError::Unreachable { .. })),
            "{url}: {e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains(&format!("127.0.0.1:{port} is unreachable"))
                && text.contains("is it running?"),
            "{text}"
        );
    }
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn a_missing_kafka_topic_is_named() {
    let kafka = broker("HOPTRACE_KAFKA");
    let topic = format!("hoptrace-no-such-topic-{}", unique_id());
    let e = publish_error(&format!("kafka://{kafka}/{topic}"));
    assert!(
        matches!(&e, PublishError::Target(TargetError::TopicMissing { topic: t, .. }) if *t == topic),
        "{e:?}"
    );
    assert!(e.to_string().contains("create-topic"), "{e}");
    let e = publish_error(&format!("kafka://{kafka}/hoptrace-test?partitions=99"));
    assert!(
        matches!(
            e,
            PublishError::Target(TargetError::TooFewPartitions { wanted: 99, .. })
        ),
        "{e:?}"
    );
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn a_collector_that_is_not_there_is_reported() {
    let mqtt = broker("HOPTRACE_MQTT");
    let mut cfg = PublishConfig::new(
        Endpoint::parse(&format!("mqtt://{mqtt}")).unwrap(),
        shape(100.0, 1, 1, 1),
    );
    let mut l = ExporterConfig::new(format!("127.0.0.1:{}", closed_port()), "publisher-test");
    l.welcome_timeout = Duration::from_millis(300);
    cfg.collector = Some(l);
    let e = publish::run(cfg, flag()).expect_err("must fail");
    assert!(
        matches!(e, PublishError::Exporter(ExporterError::NotWelcomed { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("is hoptrace collect running"), "{e}");
}

/// Records live traffic, replays it twice as fast with a fanout of 2, and checks that
/// every copy arrives in capture order with its payload unchanged, a fresh context, and
/// an intended time exactly the captured inter-arrival time halved.
#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn record_and_replay_keep_order_payloads_and_scaled_timing() {
    let mqtt = broker("HOPTRACE_MQTT");
    let id = unique_id();
    let prefix = format!("hoptrace-test/rec-{id}");
    let n = 400u64;
    let dir = tempdir("replay");
    let capture_path = dir.join("capture.parquet");

    // Record while a publisher sends.
    let src_ep = Endpoint::parse(&format!("mqtt://{mqtt}?qos=1")).unwrap();
    let mut src = target::open_source(&src_ep, &[format!("{prefix}/#")], "test").unwrap();
    let mut rc = RecordConfig::new(src_ep.clone(), capture_path.clone());
    rc.duration = Some(Duration::from_secs(30));
    rc.max_messages = Some(n);
    let recorder =
        std::thread::spawn(move || capture::record_from(src.as_mut(), &rc, &flag()).unwrap());
    let mut pc = PublishConfig::new(
        Endpoint::parse(&format!("mqtt://{mqtt}/{prefix}?qos=1")).unwrap(),
        shape(2000.0, 5, 1, n),
    );
    pc.publisher_id = id;
    let sent = publish::run(pc, flag()).unwrap();
    assert_eq!(sent.messages, n);
    let recorded = recorder.join().unwrap();
    assert_eq!(recorded.messages, n);
    let captured = capture::read_capture(&capture_path).unwrap();
    assert_eq!(captured.len() as u64, n);
    assert!(
        captured
            .iter()
            .all(|m| m.headers.iter().any(|(k, _)| k == HEADER))
    );

    // Replay, and receive the copies.
    let mut rx = target::open_source(&src_ep, &[format!("{prefix}/#")], "test").unwrap();
    let replay_id = id.wrapping_add(1).max(1);
    let mut rc = PublishConfig::new(
        Endpoint::parse(&format!("mqtt://{mqtt}?qos=1")).unwrap(),
        LoadShape::uniform(1.0, 1),
    );
    rc.publisher_id = replay_id;
    let mut replay = ReplayConfig::new(capture_path);
    replay.speed = 2.0;
    replay.fanout = 2;
    rc.replay = Some(replay);
    let replayed = publish::run(rc, flag()).unwrap();
    assert_eq!(replayed.messages, 2 * n);
    assert_eq!(replayed.streams, 2 * 5);
    let mut got = Vec::new();
    while (got.len() as u64) < 2 * n {
        let m = rx
            .recv(Duration::from_secs(10))
            .unwrap()
            .expect("every replayed copy arrives");
        got.push(m);
    }

    let a0 = captured.iter().map(|m| m.arrival_ns).min().unwrap();
    let mut by_topic: BTreeMap<&str, Vec<&capture::CapturedMessage>> = BTreeMap::new();
    for m in &captured {
        by_topic.entry(&m.topic).or_default().push(m);
    }
    let mut next_seq: BTreeMap<String, u64> = BTreeMap::new();
    for m in &got {
        let Meta::UserProperties(props) = &m.meta else {
            panic!("a replayed MQTT 5 message carries properties")
        };
        assert_eq!(
            props.iter().filter(|(k, _)| k == HEADER).count(),
            1,
            "the captured context is replaced, not duplicated"
        );
        let ctx = m.extract(Carrier::Property).unwrap().context;
        assert_eq!(ctx.key.publisher, replay_id);
        let (orig, copy) = m.topic.rsplit_once('/').unwrap();
        assert!(copy == "f0" || copy == "f1", "{}", m.topic);
        let seq = next_seq.entry(m.topic.clone()).or_default();
        assert_eq!(ctx.key.sequence, *seq, "order kept within {}", m.topic);
        *seq += 1;
        let source = by_topic[orig][ctx.key.sequence as usize];
        let mut payload_ctx_stripped = source.payload.clone();
        if let Ok((_, inner)) = hoptrace_probe::carrier::envelope::unwrap(&source.payload) {
            payload_ctx_stripped = inner.to_vec();
        }
        assert_eq!(m.payload, payload_ctx_stripped, "payload unchanged");
        let expected_offset = ((source.arrival_ns - a0) as f64 / 2.0).round() as i64;
        assert_eq!(
            ctx.intended_ns - replayed.started_unix_ns,
            expected_offset,
            "intended time = captured inter-arrival time / speed"
        );
        assert!(ctx.stamp_of(HopId(0)).is_some(), "stamped at egress");
    }
    assert_eq!(replayed.lag.count, 2 * n);
    std::fs::remove_dir_all(&dir).ok();
}

/// Kafka topics for the tests.
mod kafka_admin {
    use hoptrace_broker::kafka;

    /// Creates `name` and waits until every partition has a leader.
    pub fn create_topic(bootstrap: &str, name: &str, partitions: i32, log_append_time: bool) {
        let config: &[(&str, &str)] = if log_append_time {
            &[("message.timestamp.type", "LogAppendTime")]
        } else {
            &[]
        };
        let n = kafka::ensure_topic(bootstrap, name, partitions, 1, config).unwrap();
        assert_eq!(n, partitions, "topic {name} existed with another layout");
    }

    pub fn delete_topic(bootstrap: &str, name: &str) {
        kafka::delete_topic(bootstrap, name).unwrap();
    }
}

/// A Mosquitto of its own with a tight queue for each subscriber (one message in flight,
/// ten queued): QoS 1 publishes are all acknowledged by the broker, which then drops what
/// does not fit in a slow subscriber's queue without telling anyone. The accounting must
/// show every drop as an incomplete trace missing its broker stamp.
#[test]
#[ignore = "needs Mosquitto installed (infra/setup.sh): infra/test.sh runs it"]
fn qos1_losses_under_a_broker_queue_limit_show_in_the_accounting() {
    let broker = Mosquitto::start(
        "lossy",
        "set_tcp_nodelay true\npersistence false\nmax_inflight_messages 1\nmax_queued_messages 10",
    );
    let port = broker.port;

    let id = unique_id();
    let n = 5_000;
    let prefix = format!("hoptrace-test/lossy-{id}");
    let run_dir = tempdir("lossy-run");
    let collector = collector(&run_dir);
    // MQTT 3.1.1 on both sides: over MQTT 5 the broker's in-flight window of one is also
    // its Receive Maximum, which holds the publisher to the subscriber's pace, and the
    // queue then overflows only when the publisher happens to run ahead.
    let mut tc = TapConfig::new(
        Endpoint::parse(&format!("mqtt://127.0.0.1:{port}?version=3.1.1&qos=1")).unwrap(),
    );
    tc.topics = vec![format!("{prefix}/#")];
    tc.collector = Some(link(&collector));
    let tap = Tap::start(tc).unwrap();
    let live = tap.live();
    let stop = flag();
    let tap_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || tap.run(&stop))
    };
    let mut pc = PublishConfig::new(
        Endpoint::parse(&format!(
            "mqtt://127.0.0.1:{port}/{prefix}?version=3.1.1&qos=1"
        ))
        .unwrap(),
        shape(1e6, 10, 1, n),
    );
    pc.publisher_id = id;
    pc.collector = Some(link(&collector));
    let publish = publish::run(pc, flag()).unwrap();
    // The broker acknowledged every publish: the publisher cannot see the losses.
    assert_eq!(
        (
            publish.messages,
            publish.broker.acked,
            publish.broker.unconfirmed
        ),
        (n, n, 0)
    );
    // Wait until the tap has seen all it will: nothing new for a second.
    let mut seen = (u64::MAX, std::time::Instant::now());
    wait_for("the tap to settle", || {
        let now = live.traced.load(Relaxed);
        if now != seen.0 {
            seen = (now, std::time::Instant::now());
        }
        now == n || seen.1.elapsed() > Duration::from_secs(1)
    });
    stop.store(true, Relaxed);
    let tap = tap_thread.join().unwrap().unwrap();
    let run = collector.stop().unwrap();
    std::fs::remove_dir_all(&run_dir).ok();

    let delivered = tap.traced;
    assert!(
        delivered < n,
        "the queue limit dropped nothing ({delivered} of {n}): the test proves nothing"
    );
    let a = &run.accounting;
    let mine = a.publishers.iter().find(|x| x.publisher == id).unwrap();
    assert!(a.adds_up);
    assert_eq!(mine.sent, n);
    assert_eq!(
        (mine.complete, mine.incomplete, mine.unseen),
        (delivered, n - delivered, 0)
    );
    assert_eq!(a.missing_by_hop.get("broker"), Some(&(n - delivered)));
}
