//! The reference pipeline end to end: publisher → broker → processor → store, every hop
//! reporting to a real collector, through the embedded broker (MQTT 5 and 3.1.1) and
//! through the real Mosquitto and Kafka that the test command starts. Every message must
//! come out complete, with all five stages measured.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use hoptrace_broker::url::Endpoint;
use hoptrace_collector::{Collector, CollectorConfig, RunSummary};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::ExporterConfig;
use hoptrace_publisher::publish::{PublishConfig, Publisher};
use hoptrace_publisher::schedule::LoadShape;
use hoptrace_publisher::uns::TopicScheme;
use hoptrace_refpipe::Probes;
use hoptrace_refpipe::broker::EmbeddedBroker;
use hoptrace_refpipe::processor::{Processor, ProcessorConfig};
use hoptrace_refpipe::server::{StoreServer, StoreServerConfig};

use hoptrace_testkit::broker;

struct Outcome {
    published: u64,
    run: RunSummary,
}

/// Runs the whole pipeline for about a second at `metrics_per_s` through `url`.
fn run_pipeline(tag: &str, url: &str, metrics_per_s: f64) -> Outcome {
    let dir = std::env::temp_dir().join(format!("hoptrace-refpipe-{tag}-{}", std::process::id()));
    let mut cfg = CollectorConfig::new("127.0.0.1:0", PipelineSpec::default_pipeline(), &dir);
    cfg.run_id = Some(tag.into());
    let collector = Collector::start(cfg).unwrap();
    let link = Probes::new(ExporterConfig::new(
        collector.local_addr().to_string(),
        "refpipe-test",
    ));

    let mut store = StoreServerConfig::new("127.0.0.1:0");
    store.probes = Some(link.clone());
    let store = StoreServer::start(store).unwrap();
    let endpoint = Endpoint::parse(url).unwrap();
    let root = format!(
        "refpipe-test/{tag}-{}",
        hoptrace_probe::clock::realtime_ns()
    );
    let mut flow = ProcessorConfig::new(endpoint.clone(), store.local_addr().to_string());
    if matches!(endpoint, Endpoint::Mqtt(_)) {
        flow.topics = vec![format!("{root}/#")];
    }
    flow.probes = Some(link.clone());
    let flow = Processor::start(flow).unwrap();

    let mut shape = LoadShape::uniform(metrics_per_s, 40);
    shape.metrics_per_message = 10;
    shape.duration = Some(Duration::from_secs(1));
    let mut pc = PublishConfig::new(endpoint, shape);
    pc.topics = TopicScheme::Uns {
        root: Some(root),
        seed: 7,
    };
    pc.collector = Some(link.exporter.clone());
    let published = Publisher::new(pc)
        .unwrap()
        .run(&Arc::new(AtomicBool::new(false)))
        .unwrap();
    assert!(published.messages > 0);

    hoptrace_testkit::wait_for(
        "the processor to get every message",
        Duration::from_secs(30),
        || {
            flow.stats()
                .messages
                .load(std::sync::atomic::Ordering::Relaxed)
                >= published.messages
        },
    );
    let f = flow.stop(Duration::from_secs(10));
    assert_eq!(f.error, None);
    assert_eq!(
        (f.messages, f.traced, f.bad_payloads),
        (published.messages, published.messages, 0)
    );
    assert_eq!(f.rows, published.metrics);
    assert_eq!(f.acked, f.writes);
    assert_eq!(f.visible, f.writes);
    let s = store.stop();
    assert_eq!(
        (s.rows, s.contexts, s.invisible_writes),
        (published.metrics, published.messages, 0)
    );
    let run = collector.stop().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Outcome {
        published: published.messages,
        run,
    }
}

fn assert_every_message_complete(o: &Outcome) {
    let a = &o.run.accounting;
    assert!(a.adds_up, "{a:?}");
    let [p] = a.publishers.as_slice() else {
        panic!("one publisher expected: {a:?}")
    };
    assert_eq!(
        (p.sent, p.complete, p.incomplete, p.unseen),
        (o.published, o.published, 0, 0),
        "{a:?}"
    );
    assert_eq!(a.records_lost_by_probes, 0);
    let names: Vec<&str> = o.run.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "Broker Time",
            "Flow Internal",
            "Transmission",
            "Total Ingestion",
            "Query Duration"
        ]
    );
    for st in &o.run.stages {
        assert_eq!(st.figures.count, o.published, "{}", st.name);
        assert_eq!(
            st.figures.negative, 0,
            "{}: a negative delta on one host's clock",
            st.name
        );
    }
}

#[test]
fn through_the_embedded_broker_with_mqtt5_and_311() {
    let b = EmbeddedBroker::start(1 << 20).unwrap();
    assert_every_message_complete(&run_pipeline("embedded-v5", &b.url_v5(), 20_000.0));
    assert_every_message_complete(&run_pipeline("embedded-v311", &b.url_v311(), 20_000.0));
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn through_mosquitto() {
    let addr = broker("HOPTRACE_MQTT");
    assert_every_message_complete(&run_pipeline(
        "mosquitto",
        &format!("mqtt://{addr}?qos=1"),
        50_000.0,
    ));
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn through_kafka() {
    let addr = broker("HOPTRACE_KAFKA");
    assert_every_message_complete(&run_pipeline(
        "kafka",
        &format!("kafka://{addr}/hoptrace-demo"),
        50_000.0,
    ));
}
