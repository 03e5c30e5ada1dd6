use super::*;
use proptest::prelude::*;

fn arb_string() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _.\u{e9}-]{0,40}"
}

fn arb_record() -> impl Strategy<Value = Record> {
    (
        any::<(u8, u16, u32, u64, i64, u32, i64)>(),
        proptest::option::of(any::<[u8; 16]>()),
    )
        .prop_map(|((h, p, s, q, t, m, i), id)| Record {
            key: TraceKey {
                publisher: p,
                stream: s,
                sequence: q,
            },
            hop: HopId(h),
            stamp_ns: t,
            metric_count: m,
            intended_ns: i,
            otel_trace_id: id.map(OtelTraceId),
        })
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<u64>(),
            arb_string(),
            arb_string(),
            arb_string(),
            arb_string(),
            proptest::collection::vec((any::<u8>(), arb_string()), 1..=16)
        )
            .prop_map(|(instance_id, host, process, software, token, hops)| {
                Frame::Hello(Hello {
                    version: PROTOCOL_VERSION,
                    instance_id,
                    host,
                    process,
                    software,
                    token,
                    hops: hops.into_iter().map(|(i, n)| (HopId(i), n)).collect(),
                })
            }),
        proptest::collection::vec(arb_record(), 1..50).prop_map(Frame::Records),
        (any::<(i64, bool, i64, u64)>(), 0u8..5, 0u8..4, arb_string()).prop_map(
            |((at_ns, synced, offset_ns, error_bound_ns), s, l, detail)| {
                Frame::Clock(ClockStatus {
                    at_ns,
                    source: ClockSource::from_code(s),
                    synced,
                    leap: Leap::from_code(l),
                    offset_ns,
                    error_bound_ns,
                    detail,
                })
            }
        ),
        (
            any::<i64>(),
            proptest::collection::vec(any::<(u16, u64)>(), 0..20)
        )
            .prop_map(|(at_ns, values)| Frame::Counters(CountersFrame { at_ns, values })),
        (
            any::<u16>(),
            proptest::collection::vec(any::<(u32, u64, u64, u64, u64)>(), 0..20)
        )
            .prop_map(|(publisher, e)| Frame::Sent(SentFrame {
                publisher,
                entries: e
                    .into_iter()
                    .map(
                        |(stream, messages, metrics, first_sequence, last_sequence)| {
                            SentEntry {
                                stream,
                                messages,
                                metrics,
                                first_sequence,
                                last_sequence,
                            }
                        }
                    )
                    .collect()
            })),
        Just(Frame::Goodbye),
        (arb_string(), any::<u64>()).prop_map(|(run_id, resume_seq)| Frame::Welcome {
            version: PROTOCOL_VERSION,
            run_id,
            resume_seq,
        }),
        arb_string().prop_map(|run_id| Frame::Welcome {
            version: 1,
            run_id,
            resume_seq: 0,
        }),
        any::<u64>().prop_map(|seq| Frame::Ack { seq }),
        (any::<u64>(), proptest::collection::vec(arb_record(), 1..20))
            .prop_map(|(seq, records)| Frame::SeqRecords { seq, records }),
        (any::<u16>(), arb_string()).prop_map(|(code, reason)| Frame::Reject { code, reason }),
    ]
}

proptest! {
    #[test]
    fn frames_round_trip(frames in proptest::collection::vec(arb_frame(), 1..8)) {
        let mut buf = Vec::new();
        for f in &frames {
            f.encode(&mut buf).unwrap();
        }
        let mut got = Vec::new();
        let used = decode_frames(&buf, MAX_FRAME_LEN, |f| got.push(f)).unwrap();
        prop_assert_eq!(used, buf.len());
        prop_assert_eq!(&got, &frames);
        let mut r = &buf[..];
        for f in &frames {
            prop_assert_eq!(&read_frame(&mut r, MAX_FRAME_LEN).unwrap(), f);
        }
    }

    #[test]
    fn split_points_never_lose_frames(frames in proptest::collection::vec(arb_frame(), 1..5), cut in any::<usize>()) {
        let mut buf = Vec::new();
        for f in &frames {
            f.encode(&mut buf).unwrap();
        }
        let cut = cut % (buf.len() + 1);
        let mut got = Vec::new();
        let used = decode_frames(&buf[..cut], MAX_FRAME_LEN, |f| got.push(f)).unwrap();
        let rest = decode_frames(&buf[used..], MAX_FRAME_LEN, |f| got.push(f)).unwrap();
        prop_assert_eq!(used + rest, buf.len());
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn garbage_never_panics(ty in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Frame::decode(ty, &body);
        let _ = decode_frames(&body, MAX_FRAME_LEN, |_| {});
    }
}

#[test]
fn oversized_and_empty_frames_are_refused_before_the_body() {
    let mut buf = u32::try_from(MAX_FRAME_LEN + 1)
        .unwrap()
        .to_le_bytes()
        .to_vec();
    assert_eq!(
        split_frame(&buf, MAX_FRAME_LEN),
        Err(ProtocolError::FrameTooLarge(
            MAX_FRAME_LEN as u32 + 1,
            MAX_FRAME_LEN as u32
        ))
    );
    buf = vec![0, 0, 0, 0];
    assert_eq!(
        split_frame(&buf, MAX_FRAME_LEN),
        Err(ProtocolError::EmptyFrame)
    );
}

#[test]
fn wrong_version_and_magic_are_named() {
    let mut hello = Frame::Hello(Hello {
        version: 3,
        hops: vec![(HopId(0), "publish".into())],
        ..Hello::default()
    })
    .to_bytes()
    .unwrap();
    assert_eq!(
        Frame::decode(hello[4], &hello[5..]),
        Err(ProtocolError::UnsupportedVersion(3))
    );
    for version in [0, 3, u16::MAX] {
        let welcome = Frame::Welcome {
            version,
            run_id: "r".into(),
            resume_seq: 0,
        }
        .to_bytes()
        .unwrap();
        assert_eq!(
            Frame::decode(welcome[4], &welcome[5..]),
            Err(ProtocolError::UnsupportedVersion(version))
        );
    }
    hello[5] = b'X';
    assert_eq!(
        Frame::decode(hello[4], &hello[5..]),
        Err(ProtocolError::BadMagic)
    );
    assert_eq!(
        Frame::decode(0x7f, &[]),
        Err(ProtocolError::UnknownType(0x7f))
    );
}

#[test]
fn records_frame_size_is_documented() {
    let r = Record {
        key: TraceKey::default(),
        hop: HopId(1),
        stamp_ns: 1,
        metric_count: 1,
        intended_ns: 1,
        otel_trace_id: None,
    };
    assert_eq!(
        Frame::Records(vec![r; 3]).to_bytes().unwrap().len(),
        4 + 1 + 4 + 3 * RECORD_LEN
    );
    let too_many = MAX_RECORDS_PER_FRAME * (RECORD_LEN + 16) + 9;
    assert!(
        too_many <= MAX_FRAME_LEN,
        "a full frame with trace ids fits"
    );
}

/// A full writer refuses the next record with an error (it panicked) and the frame it
/// built stays whole.
#[test]
fn a_full_records_writer_refuses_the_next_record() {
    let r = Record {
        key: TraceKey::default(),
        hop: HopId(1),
        stamp_ns: 1,
        metric_count: 1,
        intended_ns: 1,
        otel_trace_id: None,
    };
    let mut out = Vec::new();
    let mut w = RecordsWriter::numbered(&mut out, 7);
    for _ in 0..MAX_RECORDS_PER_FRAME {
        w.push(&r).unwrap();
    }
    assert!(w.is_full());
    assert_eq!(
        w.push(&r),
        Err(EncodeError::TooManyRecords(MAX_RECORDS_PER_FRAME + 1))
    );
    assert_eq!(w.finish(), MAX_RECORDS_PER_FRAME);
    let Frame::SeqRecords { seq, records } = read_frame(&mut &out[..], MAX_FRAME_LEN).unwrap()
    else {
        panic!("not a SeqRecords frame")
    };
    assert_eq!((seq, records.len()), (7, MAX_RECORDS_PER_FRAME));
}

#[test]
fn the_limits_agree_with_the_frame_size() {
    // The fullest Sent frame fits, and is read back.
    let full = Frame::Sent(SentFrame {
        publisher: 1,
        entries: vec![SentEntry::default(); MAX_SENT_PER_FRAME],
    });
    let bytes = full.to_bytes().unwrap();
    assert!(bytes.len() - 4 <= MAX_FRAME_LEN);
    assert_eq!(read_frame(&mut &bytes[..], MAX_FRAME_LEN).unwrap(), full);
    assert_eq!(MAX_SENT_PER_FRAME, 29_126);
    // The largest Hello is exactly MAX_HELLO_LEN.
    let long = "x".repeat(MAX_STRING_LEN);
    let hello = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        host: long.clone(),
        process: long.clone(),
        software: long.clone(),
        token: long.clone(),
        hops: (0..16).map(|i| (HopId(i), long.clone())).collect(),
        ..Hello::default()
    });
    let bytes = hello.to_bytes().unwrap();
    assert_eq!(bytes.len() - 4, MAX_HELLO_LEN);
    assert_eq!(read_frame(&mut &bytes[..], MAX_HELLO_LEN).unwrap(), hello);
}

#[test]
fn caller_data_beyond_the_limits_is_an_error_not_a_panic() {
    let cases = [
        (
            Frame::Sent(SentFrame {
                publisher: 1,
                entries: vec![SentEntry::default(); MAX_SENT_PER_FRAME + 1],
            }),
            EncodeError::TooManySentEntries(MAX_SENT_PER_FRAME + 1),
        ),
        (
            Frame::Hello(Hello {
                hops: (0..17).map(|i| (HopId(i), "h".into())).collect(),
                ..Hello::default()
            }),
            EncodeError::TooManyHops(17),
        ),
        (
            Frame::Hello(Hello {
                host: "é".repeat(600),
                ..Hello::default()
            }),
            EncodeError::StringTooLong(1200),
        ),
        (
            Frame::Counters(CountersFrame {
                at_ns: 0,
                values: vec![(1, 1); 256],
            }),
            EncodeError::TooManyCounters(256),
        ),
    ];
    for (frame, want) in cases {
        let mut out = vec![7];
        assert_eq!(frame.encode(&mut out), Err(want));
        assert_eq!(out, [7], "nothing written on error");
    }
}
