use hoptrace_protocol::{self as protocol, MAX_FRAME_LEN, SentEntry};

use super::worker::{HEALTHY_CONNECTION, Retry};
use super::*;

#[test]
fn a_connection_lost_soon_after_welcome_backs_off_and_one_that_lasted_does_not() {
    let (min, max) = (Duration::from_millis(10), Duration::from_millis(40));
    let t0 = Instant::now();
    let mut r = Retry::new(min, max);
    r.failed(t0);
    r.failed(t0);
    r.failed(t0);
    assert_eq!((r.next - t0, r.delay), (Duration::from_millis(40), max));
    // Welcomed, then lost within the second: a failed attempt, the delay kept.
    r.connected(t0);
    r.lost(t0 + Duration::from_millis(5));
    assert_eq!(r.next, t0 + Duration::from_millis(45));
    // Welcomed, lost after a healthy while: at once, and the delay starts over.
    r.connected(t0);
    r.lost(t0 + HEALTHY_CONNECTION);
    assert_eq!((r.next, r.delay), (t0 + HEALTHY_CONNECTION, min));
    // A reconnection asked for keeps the delay it has.
    r.failed(t0);
    r.at_once(t0);
    assert_eq!((r.next, r.delay), (t0, Duration::from_millis(20)));
}

fn entry(stream: u32, messages: u64) -> SentEntry {
    SentEntry {
        stream,
        messages,
        metrics: messages * 10,
        first_sequence: 0,
        last_sequence: messages.saturating_sub(1),
    }
}

fn decode(buf: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    let used = protocol::decode_frames(buf, MAX_FRAME_LEN, |f| frames.push(f)).unwrap();
    assert_eq!(used, buf.len());
    frames
}

/// An hour of a 3,000-stream publisher's Sent frames (one a second) while the
/// collector is away: what waits is one entry per stream, and what is sent on
/// reconnection is each stream's newest snapshot, as the collector would have kept.
#[test]
fn pending_sent_frames_keep_the_newest_entry_per_stream_whatever_the_outage() {
    let mut p = PendingControl::default();
    for second in 1..=3_600u64 {
        p.add_sent(SentFrame {
            publisher: 7,
            entries: (0..3_000).map(|s| entry(s, second * 10)).collect(),
        });
        assert_eq!(p.len(), 3_000, "after {second} s");
    }
    let mut buf = Vec::new();
    std::mem::take(&mut p).encode(&mut buf);
    assert_eq!(p.len(), 0);
    let frames = decode(&buf);
    assert_eq!(frames.len(), 1);
    let Frame::Sent(s) = &frames[0] else {
        panic!("{frames:?}")
    };
    assert_eq!(s.publisher, 7);
    assert_eq!(
        s.entries,
        (0..3_000).map(|s| entry(s, 36_000)).collect::<Vec<_>>()
    );
    // Nothing is sent twice.
    let mut again = Vec::new();
    std::mem::take(&mut p).encode(&mut again);
    assert!(again.is_empty());
}

#[test]
fn pending_sent_entries_split_per_publisher_and_per_frame_limit() {
    let mut p = PendingControl::default();
    let many = MAX_SENT_PER_FRAME as u32 + 5;
    p.add_sent(SentFrame {
        publisher: 2,
        entries: (0..MAX_SENT_PER_FRAME as u32)
            .map(|s| entry(s, 1))
            .collect(),
    });
    p.add_sent(SentFrame {
        publisher: 2,
        entries: (MAX_SENT_PER_FRAME as u32..many)
            .map(|s| entry(s, 1))
            .collect(),
    });
    p.add_sent(SentFrame {
        publisher: 1,
        entries: vec![entry(0, 3)],
    });
    p.add_sent(SentFrame {
        publisher: 9,
        entries: Vec::new(),
    });
    let mut buf = Vec::new();
    std::mem::take(&mut p).encode(&mut buf);
    let sizes: Vec<(u16, usize)> = decode(&buf)
        .iter()
        .map(|f| match f {
            Frame::Sent(s) => (s.publisher, s.entries.len()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sizes, [(1, 1), (2, MAX_SENT_PER_FRAME), (2, 5), (9, 0)]);
}

#[test]
fn pending_counters_keep_the_newest_value_per_id() {
    let mut p = PendingControl::default();
    for i in 0..10_000u64 {
        p.add_counters(CountersFrame {
            at_ns: i64::try_from(i).unwrap(),
            values: vec![(64, i), (65, 2 * i)],
        });
    }
    p.add_counters(CountersFrame {
        at_ns: 5,
        values: vec![(70, 1)],
    });
    assert_eq!(p.len(), 3);
    let mut buf = Vec::new();
    std::mem::take(&mut p).encode(&mut buf);
    assert_eq!(
        decode(&buf),
        [Frame::Counters(CountersFrame {
            at_ns: 9_999,
            values: vec![(64, 9_999), (65, 19_998), (70, 1)],
        })]
    );
}

/// A write that fails gives back what it took: each stream's entry and each counter
/// waits again, unless the caller reported a newer one meanwhile, which wins.
#[test]
fn pending_control_taken_for_a_failed_write_is_given_back_under_newer_reports() {
    let mut p = PendingControl::default();
    p.add_sent(SentFrame {
        publisher: 3,
        entries: vec![entry(0, 10), entry(1, 10)],
    });
    p.add_counters(CountersFrame {
        at_ns: 100,
        values: vec![(64, 1), (65, 1)],
    });
    let taken = std::mem::take(&mut p);
    let mut lost = Vec::new();
    taken.encode(&mut lost);
    assert_eq!(p.len(), 0);
    // Reported while the write was under way.
    p.add_sent(SentFrame {
        publisher: 3,
        entries: vec![entry(1, 20)],
    });
    p.add_counters(CountersFrame {
        at_ns: 200,
        values: vec![(65, 2)],
    });
    p.restore(taken);
    let mut buf = Vec::new();
    std::mem::take(&mut p).encode(&mut buf);
    assert_eq!(
        decode(&buf),
        [
            Frame::Sent(SentFrame {
                publisher: 3,
                entries: vec![entry(0, 10), entry(1, 20)],
            }),
            Frame::Counters(CountersFrame {
                at_ns: 200,
                values: vec![(64, 1), (65, 2)],
            }),
        ]
    );
}
