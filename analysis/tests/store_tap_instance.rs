//! A store tap's counters (ids 64–85, `docs/collector-protocol.md`) from an exporter
//! instance whose random id is above `i64::MAX` (half of all ids): the summary must read
//! them and give the stage ending at the polled hop its poll bracket. `CAST(instance_id AS
//! BIGINT)` made the report fail on such runs ("Can't cast value … to type Int64").

use std::io::{Read, Write};
use std::net::TcpStream;

use hoptrace_analysis::RunSet;
use hoptrace_analysis::summary;
use hoptrace_collector::{Collector, CollectorConfig};
use hoptrace_format::spec::PipelineSpec;
use hoptrace_probe::HopId;
use hoptrace_protocol::{CountersFrame, Frame, Hello};

#[test]
fn a_store_tap_whose_instance_id_is_above_i64_max_gets_its_poll_bracket() {
    let dir = std::env::temp_dir().join(format!(
        "hoptrace-store-tap-instance-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = PipelineSpec::default_pipeline();
    let queryable = spec
        .hops
        .iter()
        .enumerate()
        .find(|(_, h)| h.name == "queryable")
        .map(|(i, h)| h.id.unwrap_or(i as u8))
        .expect("the default pipeline has a queryable hop");
    let mut cfg = CollectorConfig::new("127.0.0.1:0", spec, &dir);
    cfg.run_id = Some("store-tap-instance".into());
    let collector = Collector::start(cfg).unwrap();

    let instance_id = 0xF000_0000_0000_0001_u64;
    let mut s = TcpStream::connect(collector.local_addr()).unwrap();
    let hello = Frame::Hello(Hello {
        version: 1,
        instance_id,
        host: "tap-host".into(),
        process: "store-tap".into(),
        software: "test".into(),
        token: String::new(),
        hops: vec![(HopId(queryable), "queryable".into())],
    });
    s.write_all(&hello.to_bytes().unwrap()).unwrap();
    let mut head = [0u8; 5];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[4], 0x81, "welcome");
    let mut rest = vec![0u8; u32::from_le_bytes(head[..4].try_into().unwrap()) as usize - 1];
    s.read_exact(&mut rest).unwrap();
    // polls, poll_errors, keys_found, bracket sum, max, p50, p99, poll interval, bracket hop.
    let values = vec![
        (64, 500),
        (65, 2),
        (66, 100),
        (73, 100 * 6_000_000),
        (74, 12_000_000),
        (75, 5_000_000),
        (76, 11_000_000),
        (82, 10_000_000),
        (83, u64::from(queryable)),
    ];
    let counters = Frame::Counters(CountersFrame {
        at_ns: 1_800_000_000_000_000_000,
        values,
    });
    s.write_all(&counters.to_bytes().unwrap()).unwrap();
    s.write_all(&Frame::Goodbye.to_bytes().unwrap()).unwrap();
    let _ = s.read_to_end(&mut Vec::new());
    collector.stop().unwrap();

    let runs = RunSet::open(&[dir.join("store-tap-instance")]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let polled = rt.block_on(async {
        let ctx = runs.session().await.unwrap();
        summary::polled_hops(&runs, &ctx).await.unwrap()
    });
    assert_eq!(polled.len(), 1, "{polled:?}");
    assert_eq!(
        polled[0].same_poll,
        vec!["queryable".to_owned()],
        "the tap's announced hops, found by its instance id"
    );
    let b = summary::poll_bracket(&polled, "publish", "queryable", Some(200_000_000)).unwrap();
    assert_eq!(b.hop, "queryable");
    assert_eq!((b.keys, b.polls, b.poll_errors), (100, 500, 2));
    assert_eq!(
        (b.max_ns, b.p99_ns, b.poll_interval_ns),
        (12_000_000, 11_000_000, 10_000_000)
    );
    assert!((b.mean_ns - 6_000_000.0).abs() < 1e-6);
    let _ = std::fs::remove_dir_all(&dir);
}
