//! The soak starts its parts with flags they take: each child's command line parses
//! into that command's own options, with the values the soak means.

use std::ffi::OsString;

use hoptrace_cli::argv;
use hoptrace_cli::collect::CollectArgs;
use hoptrace_cli::publish::PublishArgs;
use hoptrace_cli::refpipe::{ProcessorArgs, StoreArgs};
use hoptrace_cli::soak::SoakArgs;
use hoptrace_cli::tap::TapArgs;

use super::{Addresses, PartCommands, Plan, SoakOptions};

/// An external pipeline's spec.
const SPEC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tap/testdata/nodered-influxdb.toml"
);

/// The plan of run `id`, its publisher `publisher_id`, under `out/`.
fn plan(id: &str, topic_root: Option<&str>, publisher_id: u16) -> Plan {
    Plan {
        run_id: id.into(),
        run_dir: format!("runs/{id}").into(),
        out: "out".into(),
        logs: "out/logs".into(),
        topic_root: topic_root.map(Into::into),
        publisher_json: "out/publisher.json".into(),
        publisher_id,
    }
}

/// The parts' addresses: the collector on 7401, its metrics on 7402, the store on 7403.
fn addresses(ui: Option<&str>) -> Addresses {
    Addresses {
        collector: "127.0.0.1:7401".into(),
        metrics: "127.0.0.1:7402".parse().unwrap(),
        store: "127.0.0.1:7403".into(),
        ui: ui.map(Into::into),
    }
}

/// A child's command line as its options: `words` is how many words name its command
/// (`collect`: 1, `refpipe store`: 2).
fn parse<T: clap::Args + clap::FromArgMatches>(line: &[OsString], words: usize) -> T {
    argv::parse(line[words..].iter().cloned()).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// The soak's children are this program's own commands: the flags the soak gives
/// them are flags they take, with the values the soak means.
#[test]
fn the_soak_starts_its_parts_with_flags_they_take() {
    let args: SoakArgs = argv::parse([
        "--broker",
        "mqtt://127.0.0.1:1883",
        "--rate",
        "2k",
        "--duration",
        "90s",
        "--linger",
        "2ms",
        "--tick",
        "250us",
        "--zipf",
        "1.1",
        "--max-clock-error",
        "1ms",
    ])
    .unwrap();
    let opts = SoakOptions::from_args(&args).unwrap();
    let plan = plan("s1", Some("hoptrace-soak/s1"), 77);
    let at = addresses(Some("127.0.0.1:7404"));
    let cmds = PartCommands::new(&opts, &plan, &at, true).unwrap();
    let c: CollectArgs = parse(&cmds.collector, 1);
    assert_eq!(c.listen.as_deref(), Some("127.0.0.1:7401"));
    assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:7402"));
    // The live view, with the soak's rate as its target.
    assert_eq!(c.ui.as_deref(), Some("127.0.0.1:7404"));
    assert_eq!(c.target_rate, Some(opts.rate as f64));
    assert_eq!(c.run_id.as_deref(), Some("s1"));
    assert_eq!(c.runs, opts.runs);
    assert_eq!(c.preflight.max_clock_error, Some(1_000_000));
    assert!(c.preflight.force_clock);
    assert!(cmds.taps.is_empty());
    let s: StoreArgs = parse(cmds.store.as_ref().unwrap(), 2);
    assert_eq!(s.listen, "127.0.0.1:7403");
    assert_eq!(s.collector.collector.as_deref(), Some("127.0.0.1:7401"));
    let p: ProcessorArgs = parse(cmds.processor.as_ref().unwrap(), 2);
    assert_eq!(p.from, "mqtt://127.0.0.1:1883");
    assert_eq!(p.store, "127.0.0.1:7403");
    assert_eq!(p.topics, ["hoptrace-soak/s1/#"]);
    assert_eq!((p.batch_rows, p.linger), (opts.batch_rows, opts.linger));
    let p: PublishArgs = parse(&cmds.publisher, 1);
    assert_eq!(p.to, "mqtt://127.0.0.1:1883");
    assert_eq!(p.rate, 2000.0);
    assert_eq!(
        (p.duration, p.tick, p.zipf),
        (opts.duration, opts.tick, 1.1)
    );
    assert_eq!(
        (p.streams, p.metrics_per_message),
        (opts.streams, opts.metrics_per_message)
    );
    assert_eq!(p.topic_root.as_deref(), Some("hoptrace-soak/s1"));
    assert_eq!(p.summary_json, Some(plan.publisher_json));
    assert_eq!(p.collector.collector.as_deref(), Some("127.0.0.1:7401"));
    assert_eq!(p.publisher_id, Some(77));
    assert!(!p.payload_context);
}

/// A topic path in the broker's address is a prefix of every part's topics: the
/// processor subscribes under it, where the publisher publishes.
#[test]
fn the_address_path_is_every_parts_topic_prefix() {
    let args: SoakArgs = argv::parse([
        "--broker",
        "mqtt://127.0.0.1:11883/hoptrace/soak1m",
        "--rate",
        "1M",
        "--metrics-per-message",
        "100",
    ])
    .unwrap();
    let opts = SoakOptions::from_args(&args).unwrap();
    let plan = plan("s3", Some("hoptrace-soak/s3"), 5);
    let at = addresses(None);
    let cmds = PartCommands::new(&opts, &plan, &at, true).unwrap();
    let p: ProcessorArgs = parse(cmds.processor.as_ref().unwrap(), 2);
    assert_eq!(p.topics, ["hoptrace/soak1m/hoptrace-soak/s3/#"]);
    let p: PublishArgs = parse(&cmds.publisher, 1);
    // The publisher's topics: the address's prefix, then the root.
    let prefix = match hoptrace_broker::url::Endpoint::parse(&p.to).unwrap() {
        hoptrace_broker::url::Endpoint::Mqtt(m) => m.prefix,
        hoptrace_broker::url::Endpoint::Kafka(_) => None,
    };
    assert_eq!(prefix.as_deref(), Some("hoptrace/soak1m"));
    assert_eq!(p.topic_root.as_deref(), Some("hoptrace-soak/s3"));
}

/// An external pipeline: no reference processor or store; the taps as given plus
/// the collector, the spec and the publisher id; the publisher with the spec, the
/// payload context and the address's topic.
#[test]
fn an_external_pipeline_soak_runs_its_taps_with_flags_they_take() {
    let args: SoakArgs = argv::parse([
        "--broker",
        "mqtt://127.0.0.1:11883/hoptrace/nr/in/soak?version=5",
        "--pipeline",
        SPEC,
        "--tap",
        "--from mqtt://127.0.0.1:11883?version=5 --topics 'hoptrace/nr/in/#' --hop broker",
        "--tap",
        "--from influxdb://127.0.0.1:18086/hoptrace?measurement=nodered --poll-interval 20ms",
        "--watch-port",
        "11880",
        "--payload-context",
    ])
    .unwrap();
    let opts = SoakOptions::from_args(&args).unwrap();
    let x = opts.external.as_ref().unwrap();
    assert_eq!(x.watch_ports, [11880]);
    assert_eq!(x.taps[0][3], "hoptrace/nr/in/#");
    let plan = plan("s2", None, 9);
    let at = addresses(None);
    let cmds = PartCommands::new(&opts, &plan, &at, true).unwrap();
    assert!(cmds.store.is_none() && cmds.processor.is_none());
    let spec = std::path::PathBuf::from(SPEC);
    let c: CollectArgs = parse(&cmds.collector, 1);
    assert_eq!(c.pipeline.as_ref(), Some(&spec));
    assert_eq!(cmds.taps.len(), 2);
    let t: TapArgs = parse(&cmds.taps[0], 1);
    assert_eq!(t.from, "mqtt://127.0.0.1:11883?version=5");
    assert_eq!(
        (t.topics.as_slice(), t.hop.as_str()),
        (&["hoptrace/nr/in/#".to_owned()][..], "broker")
    );
    assert_eq!(t.publishers, [9]);
    assert_eq!(t.collector.collector.as_deref(), Some("127.0.0.1:7401"));
    assert_eq!(t.hop_spec.pipeline.as_ref(), Some(&spec));
    let t: TapArgs = parse(&cmds.taps[1], 1);
    assert_eq!(
        t.from,
        "influxdb://127.0.0.1:18086/hoptrace?measurement=nodered"
    );
    assert_eq!(t.store.poll_interval, std::time::Duration::from_millis(20));
    let p: PublishArgs = parse(&cmds.publisher, 1);
    assert_eq!(p.to, "mqtt://127.0.0.1:11883/hoptrace/nr/in/soak?version=5");
    assert_eq!(p.topic_root, None);
    assert!(p.payload_context);
    assert_eq!(p.publisher_id, Some(9));
    assert_eq!(p.hop_spec.pipeline.as_ref(), Some(&spec));
}

#[test]
fn an_external_pipeline_soak_refuses_taps_that_cannot_work() {
    let soak = |extra: &[&str]| {
        let line = ["--broker", "mqtt://127.0.0.1:11883"].iter().chain(extra);
        let args: SoakArgs = argv::parse(line)?;
        Ok::<_, clap::Error>(SoakOptions::from_args(&args).and_then(|o| o.check().map(|_| ())))
    };
    let spec = SPEC;
    // A tap without a pipeline spec is refused by the command line.
    assert!(soak(&["--tap", "--from mqtt://h:1"]).is_err());
    let e = soak(&["--pipeline", spec])
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least one --tap"), "{e}");
    let e = soak(&["--pipeline", spec, "--tap", "--hop broker"])
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("no --from"), "{e}");
    let e = soak(&[
        "--pipeline",
        spec,
        "--tap",
        "--from mqtt://h:1 --collector 1.2.3.4:5",
    ])
    .unwrap()
    .unwrap_err()
    .to_string();
    assert!(e.contains("--collector is the soak's to set"), "{e}");
    let e = soak(&["--pipeline", spec, "--tap", "--from 'mqtt://h:1"])
        .unwrap()
        .unwrap_err();
    assert!(format!("{e:#}").contains("unclosed '"), "{e:#}");
    let e = soak(&["--pipeline", "no/such.toml", "--tap", "--from mqtt://h:1"])
        .unwrap()
        .unwrap_err();
    assert!(format!("{e:#}").contains("no/such.toml"), "{e:#}");
}
