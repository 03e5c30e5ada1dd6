//! The store server over real loopback TCP: writes become visible, queries answer from
//! what was written, and garbage closes only the connection that sent it.

use std::io::{BufReader, Write as _};
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;

use arrow::array::{Float64Array, Int64Array, StringArray};
use hoptrace_probe::{TraceContext, TraceKey};
use hoptrace_refpipe::server::{StoreServer, StoreServerConfig};
use hoptrace_refpipe::wire::{self, Frame, Query, rows_batch};

fn connect(server: &StoreServer) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn send(s: &mut TcpStream, r: &mut BufReader<TcpStream>, f: &Frame) -> Frame {
    let mut buf = Vec::new();
    wire::write_frame(s, f, &mut buf).unwrap();
    s.flush().unwrap();
    wire::read_frame(r, &mut buf).unwrap()
}

fn write(id: u64, series: &[&str], ts: &[i64], values: &[f64]) -> Frame {
    Frame::Write {
        id,
        contexts: vec![TraceContext::new(
            TraceKey {
                publisher: 1,
                stream: 0,
                sequence: id,
            },
            series.len() as u32,
            0,
        )],
        rows: rows_batch(
            StringArray::from_iter_values(series.iter().copied()),
            Int64Array::from(ts.to_vec()),
            Float64Array::from(values.to_vec()),
        )
        .unwrap(),
    }
}

#[test]
fn writes_are_acknowledged_visible_and_queryable() {
    let server = StoreServer::start(StoreServerConfig::new("127.0.0.1:0")).unwrap();
    let (mut s, mut r) = connect(&server);
    let ack = send(
        &mut s,
        &mut r,
        &write(
            1,
            &["a/t1", "a/t2", "a/t1"],
            &[100, 101, 102],
            &[1.0, 2.0, 3.0],
        ),
    );
    assert!(
        matches!(
            ack,
            Frame::WriteAck {
                id: 1,
                rows: 3,
                visible: true
            }
        ),
        "{ack:?}"
    );
    let ack = send(&mut s, &mut r, &write(2, &["b/t1"], &[200], &[10.0]));
    assert!(
        matches!(
            ack,
            Frame::WriteAck {
                id: 2,
                rows: 1,
                visible: true
            }
        ),
        "{ack:?}"
    );

    // A second client sees what the first wrote.
    let (mut s2, mut r2) = connect(&server);
    let q = Frame::Query {
        id: 9,
        query: Query {
            series: vec!["a/t1".into()],
            from_ms: 0,
            to_ms: 1000,
        },
    };
    let Frame::QueryResult { id, result } = send(&mut s2, &mut r2, &q) else {
        panic!("no result")
    };
    assert_eq!(
        (
            id,
            result.rows,
            result.sum,
            result.min_ts_ms,
            result.max_ts_ms
        ),
        (9, 2, 4.0, 100, 102)
    );
    let all = Frame::Query {
        id: 10,
        query: Query {
            series: vec![],
            from_ms: 101,
            to_ms: 200,
        },
    };
    let Frame::QueryResult { result, .. } = send(&mut s2, &mut r2, &all) else {
        panic!("no result")
    };
    assert_eq!((result.rows, result.sum), (3, 15.0));

    drop((s, r, s2, r2));
    let summary = server.stop();
    assert_eq!(
        (
            summary.writes,
            summary.rows,
            summary.contexts,
            summary.queries
        ),
        (2, 4, 2, 2)
    );
    assert_eq!((summary.invisible_writes, summary.bad_frames), (0, 0));
    assert_eq!(summary.store.series, 3);
}

#[test]
fn garbage_closes_only_its_connection_and_is_counted() {
    let server = StoreServer::start(StoreServerConfig::new("127.0.0.1:0")).unwrap();
    let (mut good, mut good_r) = connect(&server);
    let (mut bad, mut bad_r) = connect(&server);

    // A frame kind nobody sends.
    bad.write_all(&[3, 0, 0, 0, 0x55, 1, 2]).unwrap();
    let mut buf = Vec::new();
    let Frame::Error { message, .. } = wire::read_frame(&mut bad_r, &mut buf).unwrap() else {
        panic!("no error frame")
    };
    assert_eq!(message, "unknown frame kind 0x55");
    // ...and the connection is closed after it.
    assert!(matches!(
        wire::read_frame(&mut bad_r, &mut buf),
        Err(wire::WireError::Io(_))
    ));

    // An oversized length prefix.
    let (mut big, mut big_r) = connect(&server);
    big.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let Frame::Error { message, .. } = wire::read_frame(&mut big_r, &mut buf).unwrap() else {
        panic!("no error frame")
    };
    assert!(message.contains("outside"), "{message}");

    // The good connection goes on.
    let ack = send(&mut good, &mut good_r, &write(5, &["x"], &[1], &[1.0]));
    assert!(
        matches!(
            ack,
            Frame::WriteAck {
                id: 5,
                visible: true,
                ..
            }
        ),
        "{ack:?}"
    );
    assert_eq!(server.stats().bad_frames.load(Relaxed), 2);
    drop(bad);
    let summary = server.stop();
    assert_eq!((summary.writes, summary.bad_frames), (1, 2));
}
