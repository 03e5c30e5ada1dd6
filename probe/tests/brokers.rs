//! Carriers through real brokers: the MQTT v5 user property through Mosquitto to a v5
//! subscriber, the envelope to an MQTT 3.1.1 subscriber, and the Kafka header through a
//! KRaft broker to a consumer. `infra/test.sh` starts the brokers and sets
//! `HOPTRACE_MQTT` / `HOPTRACE_KAFKA`. The tests are ignored by a plain `cargo test`; run
//! (`--ignored`) without those variables set, they fail saying what to start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hoptrace_probe::carrier::{envelope, kafka_header, mqtt_property};
use hoptrace_probe::traceparent::TRACEPARENT;
use hoptrace_probe::{HopId, Stamp, TraceContext, TraceKey};
use hoptrace_testkit::broker_host_port as broker;

const TRACEPARENT_VALUE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const MESSAGES: u64 = 200;

/// A publisher id unlikely to collide with earlier runs on the same topics.
fn unique_publisher() -> u16 {
    (std::process::id() as u16) ^ (hoptrace_probe::clock::realtime_ns() as u16)
}

fn context(publisher: u16, seq: u64) -> TraceContext {
    let mut c = TraceContext::new(
        TraceKey {
            publisher,
            stream: 7,
            sequence: seq,
        },
        25,
        1_700_000_000_000_000_000 + seq as i64,
    );
    c.push_stamp(Stamp {
        hop: HopId(0),
        ns: 1_700_000_000_000_000_500 + seq as i64,
    })
    .unwrap();
    c
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn mqtt_v5_user_property_reaches_a_v5_subscriber() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
    use rumqttc::v5::{Client, Event, MqttOptions};

    let (host, port) = broker("HOPTRACE_MQTT");
    let publisher = unique_publisher();
    let topic = format!("hoptrace/test/v5/{publisher}");

    let (sub, mut sub_conn) = Client::new(
        MqttOptions::new(format!("sub-v5-{publisher}"), &host, port),
        1000,
    );
    sub.subscribe(&topic, QoS::AtLeastOnce).unwrap();
    wait_until(
        &mut || {
            matches!(
                next_v5(&mut sub_conn),
                Some(Event::Incoming(Packet::SubAck(_)))
            )
        },
        "v5 suback",
    );

    let (pubc, mut pub_conn) = Client::new(
        MqttOptions::new(format!("pub-v5-{publisher}"), &host, port),
        1000,
    );
    let pub_thread = std::thread::spawn(move || {
        for ev in pub_conn.iter() {
            if ev.is_err() {
                break;
            }
        }
    });
    for seq in 0..MESSAGES {
        let mut props = PublishProperties::default();
        props
            .user_properties
            .push((TRACEPARENT.into(), TRACEPARENT_VALUE.into()));
        mqtt_property::inject(&context(publisher, seq), &mut props);
        pubc.publish_with_properties(
            &topic,
            QoS::AtLeastOnce,
            false,
            format!("{{\"v\":{seq}}}"),
            props,
        )
        .unwrap();
    }

    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < MESSAGES as usize && Instant::now() < deadline {
        if let Some(Event::Incoming(Packet::Publish(p))) = next_v5(&mut sub_conn) {
            let e = mqtt_property::extract(p.properties.as_ref()).expect("a context");
            assert!(e.bad_traceparent.is_none());
            got.insert(e.context.key.sequence, (e.context, p.payload.clone()));
        }
    }
    assert_eq!(got.len(), MESSAGES as usize, "every traced message arrives");
    for (seq, (ctx, payload)) in &got {
        let mut expected = context(publisher, *seq);
        expected.otel_trace_id = ctx.otel_trace_id;
        assert_eq!(*ctx, expected);
        assert_eq!(
            ctx.otel_trace_id.unwrap().to_hex(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            &payload[..],
            format!("{{\"v\":{seq}}}").as_bytes(),
            "payload untouched"
        );
    }
    pubc.disconnect().unwrap();
    pub_thread.join().unwrap();
}

fn next_v5(conn: &mut rumqttc::v5::Connection) -> Option<rumqttc::v5::Event> {
    match conn.recv_timeout(Duration::from_millis(200)) {
        Ok(Ok(ev)) => Some(ev),
        Ok(Err(e)) => panic!("MQTT v5 connection failed: {e}"),
        Err(_) => None,
    }
}

fn wait_until(f: &mut dyn FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
    }
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn mqtt_envelope_reaches_a_3_1_1_subscriber() {
    use rumqttc::{Client, Event, MqttOptions, Packet, QoS};

    let (host, port) = broker("HOPTRACE_MQTT");
    let publisher = unique_publisher();
    let topic = format!("hoptrace/test/v311/{publisher}");
    let next = |conn: &mut rumqttc::Connection| match conn.recv_timeout(Duration::from_millis(200))
    {
        Ok(Ok(ev)) => Some(ev),
        Ok(Err(e)) => panic!("MQTT 3.1.1 connection failed: {e}"),
        Err(_) => None,
    };

    let (sub, mut sub_conn) = Client::new(
        MqttOptions::new(format!("sub-311-{publisher}"), &host, port),
        1000,
    );
    sub.subscribe(&topic, QoS::AtLeastOnce).unwrap();
    wait_until(
        &mut || {
            matches!(
                next(&mut sub_conn),
                Some(Event::Incoming(Packet::SubAck(_)))
            )
        },
        "suback",
    );

    let (pubc, mut pub_conn) = Client::new(
        MqttOptions::new(format!("pub-311-{publisher}"), &host, port),
        1000,
    );
    let pub_thread =
        std::thread::spawn(move || for _ in pub_conn.iter().take_while(Result::is_ok) {});
    for seq in 0..MESSAGES {
        let payload = if seq % 2 == 0 {
            vec![0xFF, 0x00, seq as u8]
        } else {
            b"21.5".to_vec()
        };
        pubc.publish(
            &topic,
            QoS::AtLeastOnce,
            false,
            envelope::wrap(&context(publisher, seq), &payload),
        )
        .unwrap();
    }
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < MESSAGES as usize && Instant::now() < deadline {
        if let Some(Event::Incoming(Packet::Publish(p))) = next(&mut sub_conn) {
            let (e, payload) = envelope::unwrap(&p.payload).expect("an envelope");
            got.insert(e.context.key.sequence, (e.context, payload.to_vec()));
        }
    }
    assert_eq!(got.len(), MESSAGES as usize);
    for (seq, (ctx, payload)) in got {
        assert_eq!(ctx, context(publisher, seq));
        let expected = if seq % 2 == 0 {
            vec![0xFF, 0x00, seq as u8]
        } else {
            b"21.5".to_vec()
        };
        assert_eq!(
            payload, expected,
            "the original payload comes out unchanged"
        );
    }
    pubc.disconnect().unwrap();
    pub_thread.join().unwrap();
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn kafka_header_reaches_a_consumer_and_log_append_time_is_the_brokers() {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let (host, port) = broker("HOPTRACE_KAFKA");
    let bootstrap = format!("{host}:{port}");
    let publisher = unique_publisher();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "1")
        .create()
        .unwrap();
    // Where every partition ends before this test sends: the topics keep earlier runs'
    // messages (possibly millions), so reading starts here, each partition assigned
    // directly (no consumer group, no wait on a fresh broker's group coordinator).
    let mut starts = BTreeMap::new();
    for topic in ["hoptrace-test", "hoptrace-lat"] {
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .unwrap();
        let mut assignment = rdkafka::TopicPartitionList::new();
        for p in metadata.topics()[0].partitions() {
            let (_, high) = producer
                .client()
                .fetch_watermarks(topic, p.id(), Duration::from_secs(30))
                .unwrap();
            assignment
                .add_partition_offset(topic, p.id(), rdkafka::Offset::Offset(high))
                .unwrap();
        }
        assert!(assignment.count() > 0, "{topic} has no partitions");
        starts.insert(topic, assignment);
    }
    let before_ms = hoptrace_probe::clock::realtime_ns() / 1_000_000;
    for topic in ["hoptrace-test", "hoptrace-lat"] {
        for seq in 0..MESSAGES {
            let headers = kafka_header::inject(
                &context(publisher, seq),
                OwnedHeaders::new().insert(Header {
                    key: TRACEPARENT,
                    value: Some(TRACEPARENT_VALUE),
                }),
            );
            let key = format!("{publisher}/{seq}");
            producer
                .send(
                    BaseRecord::to(topic)
                        .key(&key)
                        .payload("payload")
                        .headers(headers),
                )
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    for topic in ["hoptrace-test", "hoptrace-lat"] {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", format!("hoptrace-test-{publisher}-{topic}"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.assign(&starts[topic]).unwrap();
        let mut got = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.len() < MESSAGES as usize && Instant::now() < deadline {
            let Some(m) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let m = m.unwrap();
            let Some(headers) = m.headers() else { continue };
            let e = kafka_header::extract(headers).expect("a context");
            if e.context.key.publisher != publisher {
                continue; // an earlier run's message
            }
            assert_eq!(headers.count(), 2);
            if topic == "hoptrace-lat" {
                let rdkafka::Timestamp::LogAppendTime(ms) = m.timestamp() else {
                    panic!("{topic} must carry LogAppendTime, got {:?}", m.timestamp());
                };
                assert!(
                    ms >= before_ms - 1000,
                    "broker stamp {ms} before the send at {before_ms}"
                );
            }
            got.insert(e.context.key.sequence, e.context);
        }
        assert_eq!(
            got.len(),
            MESSAGES as usize,
            "{topic}: every message consumed"
        );
        for (seq, ctx) in got {
            let mut expected = context(publisher, seq);
            expected.otel_trace_id = ctx.otel_trace_id;
            assert_eq!(ctx, expected);
            assert_eq!(
                ctx.otel_trace_id.unwrap().to_hex(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
        }
    }
}
