use super::*;
use hoptrace_format::spec::PipelineSpec;
use hoptrace_protocol::HopId;

/// Hops a(0), b(1), c(2) expected; tap (wire id 9) optional; stages a→b, b→c;
/// window 1 ms.
fn spec() -> ResolvedSpec {
    PipelineSpec::from_toml_str(
        r#"
        name = "t"
        expected = ["a", "b", "c"]
        [[hops]]
        name = "a"
        [[hops]]
        name = "b"
        [[hops]]
        name = "c"
        [[hops]]
        name = "tap"
        id = 9
        [[stages]]
        name = "ab"
        from = "a"
        to = "b"
        definition = ""
        [[stages]]
        name = "bc"
        from = "b"
        to = "c"
        definition = ""
        [join]
        window_ms = 1
        max_pending = 4
        "#,
    )
    .unwrap()
    .resolve()
    .unwrap()
}

const WINDOW: u64 = 1_000_000;

fn key(sequence: u64) -> TraceKey {
    TraceKey {
        publisher: 7,
        stream: 3,
        sequence,
    }
}

fn rec(sequence: u64, hop: u8, stamp_ns: i64) -> Record {
    Record {
        key: key(sequence),
        hop: HopId(hop),
        stamp_ns,
        metric_count: 10,
        intended_ns: 5,
        otel_trace_id: None,
    }
}

fn accounted(j: &Joiner) {
    let s = j.stats();
    assert_eq!(
        s.records,
        s.stored + s.duplicates + s.late + s.unknown_hop + s.implausible
    );
    assert_eq!(
        s.traces,
        s.completed + s.expired + s.drained + j.pending() as u64
    );
}

#[test]
fn layout_sizes_match_the_documented_footprint() {
    assert_eq!(std::mem::size_of::<Slot>(), 56);
    assert_eq!(std::mem::size_of::<FifoEntry>(), 16);
}

#[test]
fn completes_once_every_expected_hop_stamped_in_any_order() {
    let s = spec();
    let mut j = Joiner::new(&s);
    let mut out = Vec::new();
    assert_eq!(
        j.insert(&rec(1, 2, 300), 0, &mut out),
        InsertOutcome::Pending
    );
    assert_eq!(
        j.insert(&rec(1, 0, 100), 1, &mut out),
        InsertOutcome::Pending
    );
    assert_eq!(j.pending(), 1);
    assert_eq!(
        j.insert(&rec(1, 1, 250), 2, &mut out),
        InsertOutcome::Completed
    );
    assert_eq!(j.pending(), 0);
    assert_eq!(out.len(), 1);
    let t = out[0];
    assert!(t.complete);
    assert_eq!(t.key, key(1));
    assert_eq!((t.metric_count, t.intended_ns), (10, 5));
    assert_eq!(t.missing_mask, 0);
    assert_eq!(t.present_mask, 0b111);
    assert_eq!(t.flags, 0);
    assert_eq!(
        [t.stamp(0), t.stamp(1), t.stamp(2), t.stamp(3)],
        [Some(100), Some(250), Some(300), None]
    );
    assert_eq!(t.stage_ns(&s.stages()[0]), Some(150));
    assert_eq!(t.stage_ns(&s.stages()[1]), Some(50));
    assert_eq!(j.stats().completed, 1);
    accounted(&j);
}

#[test]
fn optional_hop_joins_before_completion_and_is_late_after() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    j.insert(&rec(1, 9, 150), 0, &mut out);
    for h in 0..3 {
        j.insert(&rec(1, h, 100 + i64::from(h)), 0, &mut out);
    }
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].stamp(3), Some(150));
    assert!(out[0].has_flag(flags::UNEXPECTED_HOP));
    assert!(out[0].complete);

    for h in 0..3 {
        j.insert(&rec(2, h, 100), 0, &mut out);
    }
    assert_eq!(j.insert(&rec(2, 9, 150), 1, &mut out), InsertOutcome::Late);
    assert_eq!(j.insert(&rec(2, 0, 150), 1, &mut out), InsertOutcome::Late);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].flags, 0);
    assert_eq!(j.stats().late, 2);
    assert_eq!(j.pending(), 0);
    accounted(&j);
}

#[test]
fn duplicate_stamp_keeps_the_first_and_is_flagged() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    j.insert(&rec(1, 0, 100), 0, &mut out);
    assert_eq!(
        j.insert(&rec(1, 0, 90), 0, &mut out),
        InsertOutcome::Duplicate
    );
    j.insert(&rec(1, 1, 200), 0, &mut out);
    j.insert(&rec(1, 2, 300), 0, &mut out);
    assert_eq!(out[0].stamp(0), Some(100));
    assert_eq!(out[0].flags, flags::DUPLICATE);
    assert_eq!(j.stats().duplicates, 1);
    assert_eq!(j.stats().stored, 3);
    accounted(&j);
}

#[test]
fn conflicting_metadata_keeps_the_first_and_is_flagged() {
    let id = |b| Some(OtelTraceId([b; 16]));
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    // No id first, then an id: adopted, no conflict.
    j.insert(&rec(1, 0, 1), 0, &mut out);
    j.insert(
        &Record {
            otel_trace_id: id(1),
            ..rec(1, 1, 2)
        },
        0,
        &mut out,
    );
    j.insert(&rec(1, 2, 3), 0, &mut out);
    assert_eq!(out[0].otel_trace_id, id(1));
    assert_eq!(out[0].flags, 0);
    // Different id, metric count, intended time: each conflicts.
    let variants = [
        Record {
            otel_trace_id: id(2),
            ..rec(2, 1, 2)
        },
        Record {
            metric_count: 11,
            ..rec(2, 1, 2)
        },
        Record {
            intended_ns: 6,
            ..rec(2, 1, 2)
        },
    ];
    for (n, bad) in variants.into_iter().enumerate() {
        let seq = 10 + n as u64;
        out.clear();
        j.insert(
            &Record {
                otel_trace_id: id(1),
                ..rec(seq, 0, 1)
            },
            0,
            &mut out,
        );
        j.insert(
            &Record {
                key: key(seq),
                ..bad
            },
            0,
            &mut out,
        );
        j.insert(&rec(seq, 2, 3), 0, &mut out);
        let t = out[0];
        assert_eq!(t.flags, flags::CONFLICT, "variant {n}");
        assert_eq!(
            (t.metric_count, t.intended_ns, t.otel_trace_id),
            (10, 5, id(1))
        );
    }
    assert_eq!(j.stats().conflicts, 3);
    accounted(&j);
}

#[test]
fn negative_delta_needs_both_hops_of_a_stage() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    for (h, ns) in [(0, 100), (1, 50), (2, 60)] {
        j.insert(&rec(1, h, ns), 0, &mut out);
    }
    assert_eq!(out[0].flags, flags::NEGATIVE_DELTA);
    assert_eq!(out[0].stage_ns(&spec().stages()[0]), Some(-50));
    // a after c, but no stage a→c; b missing: no stage has both hops.
    j.insert(&rec(2, 0, 100), 0, &mut out);
    j.insert(&rec(2, 2, 50), 0, &mut out);
    j.drain(&mut out);
    assert_eq!(out[1].flags, 0);
    assert!(!out[1].complete);
    assert_eq!(out[1].missing_mask, 0b010);
}

#[test]
fn unknown_hops_are_counted_and_start_nothing() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    assert_eq!(
        j.insert(&rec(1, 3, 1), 0, &mut out),
        InsertOutcome::UnknownHop
    );
    assert_eq!(
        j.insert(&rec(1, 255, 1), 0, &mut out),
        InsertOutcome::UnknownHop
    );
    assert_eq!(j.pending(), 0);
    assert_eq!(j.stats().unknown_hop, 2);
    assert_eq!(j.stats().traces, 0);
    accounted(&j);
}

#[test]
fn expiry_is_strictly_after_one_window_from_the_first_record() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    j.insert(&rec(1, 1, 1), 1_000, &mut out);
    j.insert(&rec(2, 0, 1), 2_000, &mut out);
    // A record one window after the first still joins: expiry needs more than that.
    j.insert(&rec(1, 2, 2), 1_000 + WINDOW, &mut out);
    j.expire(1_000 + WINDOW, &mut out);
    assert_eq!(j.pending(), 2);
    j.expire(1_001 + WINDOW, &mut out);
    assert_eq!(j.pending(), 1);
    assert_eq!(out.len(), 1);
    let t = out[0];
    assert_eq!(t.key, key(1));
    assert!(!t.complete);
    assert_eq!(t.missing_mask, 0b001);
    assert_eq!(t.present_mask, 0b110);
    j.expire(2_001 + WINDOW, &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].key, key(2));
    assert_eq!(j.stats().expired, 2);
    accounted(&j);
}

#[test]
fn drain_emits_everything_incomplete_in_first_arrival_order() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    for seq in [5, 3, 9, 1] {
        j.insert(&rec(seq, 0, 1), seq, &mut out);
    }
    // 3 completes: its FIFO entry goes stale.
    j.insert(&rec(3, 1, 1), 20, &mut out);
    j.insert(&rec(3, 2, 1), 20, &mut out);
    out.clear();
    j.drain(&mut out);
    let keys: Vec<u64> = out.iter().map(|t| t.key.sequence).collect();
    assert_eq!(keys, [5, 9, 1]);
    assert!(out.iter().all(|t| !t.complete && t.missing_mask == 0b110));
    assert_eq!(j.pending(), 0);
    assert_eq!(j.stats().drained, 3);
    assert_eq!(j.written().len(), 4);
    accounted(&j);
}

/// A joiner restored from another's pending traces, counters, clock and written keys
/// goes on exactly as the original does: same traces out, same counters.
#[test]
fn a_restored_joiner_goes_on_as_the_original() {
    let s = spec();
    let mut a = Joiner::new(&s);
    let mut out = Vec::new();
    // Pending: 1 (a), 2 (a, b, tap), 4 (c); written: 3; a duplicate stamp on 2.
    a.insert(&rec(1, 0, 10), 100, &mut out);
    a.insert(
        &Record {
            otel_trace_id: Some(OtelTraceId([7; 16])),
            ..rec(2, 0, 20)
        },
        110,
        &mut out,
    );
    a.insert(&rec(2, 1, 25), 120, &mut out);
    a.insert(&rec(2, 1, 26), 121, &mut out);
    a.insert(&rec(2, 9, 27), 122, &mut out);
    for h in 0..3 {
        a.insert(&rec(3, h, 30), 130, &mut out);
    }
    a.insert(&rec(4, 2, 40), 140, &mut out);
    let mut b = Joiner::new(&s);
    b.restore(
        a.stats(),
        a.clock_ns(),
        a.written().clone(),
        &a.pending_traces(),
    );
    assert_eq!(b.pending_traces(), a.pending_traces());
    let go = |j: &mut Joiner| {
        let mut out = Vec::new();
        j.insert(&rec(2, 2, 28), 150, &mut out);
        j.insert(&rec(3, 0, 31), 151, &mut out);
        j.insert(&rec(4, 0, 41), 152, &mut out);
        j.expire(150 + WINDOW + 1, &mut out);
        j.drain(&mut out);
        out
    };
    let (oa, ob) = (go(&mut a), go(&mut b));
    assert_eq!(oa, ob);
    assert_eq!(a.stats(), b.stats());
    assert_eq!(oa.len(), 3);
    assert_eq!(oa[0].otel_trace_id, Some(OtelTraceId([7; 16])));
    assert!(oa[0].has_flag(flags::DUPLICATE) && oa[0].has_flag(flags::UNEXPECTED_HOP));
    accounted(&b);
}

#[test]
fn a_key_is_written_once_however_late_its_records_come() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    for h in 0..3 {
        j.insert(&rec(1, h, 1), 0, &mut out);
    }
    // Windows later, a duplicate stamp and the optional tap: late, never a new trace.
    for (hop, t) in [(1, 5 * WINDOW), (9, 50 * WINDOW), (0, 1_000 * WINDOW)] {
        assert_eq!(j.insert(&rec(1, hop, 1), t, &mut out), InsertOutcome::Late);
        j.expire(t + 2 * WINDOW, &mut out);
    }
    // An incomplete trace's missing hop, after it expired: late too.
    j.insert(&rec(2, 0, 1), 0, &mut out);
    j.expire(2_000 * WINDOW, &mut out);
    assert_eq!(
        j.insert(&rec(2, 1, 1), 3_000 * WINDOW, &mut out),
        InsertOutcome::Late
    );
    j.drain(&mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(j.stats().traces, 2);
    assert_eq!(j.stats().late, 4);
    assert_eq!(j.written().len(), 2);
    accounted(&j);
}

#[test]
fn implausible_stamps_are_dropped_and_intended_times_flagged() {
    let mut j = Joiner::new(&spec());
    j.set_plausible_window(1_000..=2_000);
    let mut out = Vec::new();
    assert_eq!(
        j.insert(&rec(1, 0, 1), 0, &mut out),
        InsertOutcome::Implausible
    );
    assert_eq!(
        j.insert(&rec(1, 0, 2_001), 0, &mut out),
        InsertOutcome::Implausible
    );
    for h in 0..3 {
        j.insert(
            &Record {
                intended_ns: 1,
                ..rec(1, h, 1_500)
            },
            0,
            &mut out,
        );
    }
    assert_eq!(out.len(), 1);
    assert!(out[0].has_flag(flags::IMPLAUSIBLE_TIME));
    let s = j.stats();
    assert_eq!((s.implausible, s.implausible_intended), (2, 3));
    assert_eq!((s.implausible_traces, s.records_by_hop[0]), (1, 3));
    assert_eq!(s.stored_by_hop[..3], [1, 1, 1]);
    accounted(&j);
}

#[test]
fn is_full_at_max_pending() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    for seq in 0..4 {
        assert!(!j.is_full());
        j.insert(&rec(seq, 0, 1), 0, &mut out);
    }
    assert!(j.is_full());
    // Inserting past the limit still works; the caller is expected to stop reading.
    j.insert(&rec(9, 0, 1), 0, &mut out);
    assert_eq!(j.pending(), 5);
    assert_eq!(j.stats().peak_pending, 5);
    j.insert(&rec(9, 1, 1), 0, &mut out);
    j.insert(&rec(9, 2, 1), 0, &mut out);
    assert!(j.is_full());
    j.expire(WINDOW + 1, &mut out);
    assert!(!j.is_full());
    assert_eq!(j.pending(), 0);
}

#[test]
fn time_going_backwards_is_clamped() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    j.insert(&rec(1, 0, 1), 5 * WINDOW, &mut out);
    // Arrives "earlier": treated as 5 windows, so it does not expire with 1 window.
    j.insert(&rec(2, 0, 1), 0, &mut out);
    j.expire(6 * WINDOW + 1, &mut out);
    assert_eq!(out.len(), 2);
    j.insert(&rec(3, 0, 1), 0, &mut out);
    j.expire(0, &mut out);
    assert_eq!(j.pending(), 1);
}

#[test]
fn stage_deltas_saturate_and_absent_hops_give_none() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    j.insert(&rec(1, 0, i64::MAX), 0, &mut out);
    j.insert(&rec(1, 1, i64::MIN), 0, &mut out);
    j.drain(&mut out);
    let t = out[0];
    assert_eq!(t.delta_ns(0, 1), Some(i64::MIN));
    assert_eq!(t.delta_ns(1, 0), Some(i64::MAX));
    assert_eq!(t.delta_ns(1, 2), None);
    assert_eq!(t.stamp(16), None);
    assert_eq!(t.stamps_ns[2], 0);
}

#[test]
fn fifo_stays_bounded_when_traces_complete() {
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    // One trace stays pending the whole time; 100k others complete.
    j.insert(&rec(0, 0, 1), 0, &mut out);
    for seq in 1..100_000 {
        for h in 0..3 {
            j.insert(&rec(seq, h, 1), 0, &mut out);
        }
        assert!(j.fifo.len() <= 1 + 16 + 1);
    }
    assert_eq!(j.pending(), 1);
    assert!(j.slots.len() <= 2, "slots are reused");
    j.drain(&mut out);
    assert_eq!(out.last().unwrap().key, key(0));
    accounted(&j);
}

/// Measures the bytes per pending trace with 8 hops at several sizes, including
/// right after the table and slab have grown.
#[test]
fn bytes_per_pending_trace_with_8_hops_is_at_most_200() {
    let mut text = String::from("name = \"m\"\nstages = []\n[join]\nwindow_ms = 1000\n");
    for h in 0..8 {
        text.push_str(&format!("[[hops]]\nname = \"h{h}\"\n"));
    }
    let s = PipelineSpec::from_toml_str(&text)
        .unwrap()
        .resolve()
        .unwrap();
    let mut j = Joiner::new(&s);
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    let mut seq = 0;
    for target in [1_000u64, 7_169, 57_345, 100_000, 229_377, 300_000] {
        while seq < target {
            j.insert(&rec(seq, (seq % 8) as u8, 1), 0, &mut out);
            seq += 1;
        }
        let per = j.memory_bytes() as f64 / j.pending() as f64;
        worst = worst.max(per);
        assert!(per <= 200.0, "{per:.1} bytes per pending trace at {target}");
    }
    assert!(worst > 8.0 * 8.0 + 56.0);
}

#[test]
fn a_stamp_without_the_messages_figures_takes_them_from_the_message_s_other_records() {
    let id = Some(OtelTraceId::of_key(&key(1)));
    let span = |seq, hop, stamp_ns| Record {
        metric_count: 0,
        intended_ns: 0,
        otel_trace_id: id,
        ..rec(seq, hop, stamp_ns)
    };
    let mut j = Joiner::new(&spec());
    j.set_plausible_window(1..=2_000);
    let mut out = Vec::new();
    // A span first: the publisher's record brings the figures, and nothing conflicts.
    j.insert(&span(1, 1, 20), 0, &mut out);
    j.insert(&rec(1, 0, 10), 0, &mut out);
    j.insert(&span(1, 2, 30), 0, &mut out);
    assert_eq!(out.len(), 1);
    let t = out[0];
    assert_eq!((t.metric_count, t.intended_ns, t.flags), (10, 5, 0));
    assert_eq!(t.otel_trace_id, id);
    assert_eq!(t.stamp(1), Some(20));
    // Only spans: emitted with no figures, flagged so readers keep it out of the run's span.
    out.clear();
    j.insert(&span(2, 1, 20), 0, &mut out);
    j.drain(&mut out);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].metric_count, out[0].intended_ns), (0, 0));
    assert!(out[0].has_flag(flags::IMPLAUSIBLE_TIME));
    let s = j.stats();
    assert_eq!((s.conflicts, s.implausible_intended), (0, 0));
    accounted(&j);
}

#[test]
fn a_restored_trace_started_by_a_span_still_takes_the_message_s_figures() {
    let span = Record {
        metric_count: 0,
        intended_ns: 0,
        ..rec(1, 1, 20)
    };
    let mut j = Joiner::new(&spec());
    let mut out = Vec::new();
    j.insert(&span, 0, &mut out);
    let mut k = Joiner::new(&spec());
    k.restore(
        j.stats(),
        j.clock_ns(),
        j.written().clone(),
        &j.pending_traces(),
    );
    k.insert(&rec(1, 0, 10), 0, &mut out);
    k.insert(&rec(1, 2, 30), 0, &mut out);
    assert_eq!(
        (out[0].metric_count, out[0].intended_ns, out[0].flags),
        (10, 5, 0)
    );
}
