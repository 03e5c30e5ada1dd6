use rustc_hash::FxHashSet;

use super::*;

/// A row time after its response, or before its publish stamp beyond the row time's
/// resolution, is counted with how far; the first one ends the row times' use as a
/// lower bound.
#[test]
fn row_times_off_the_taps_clock_are_counted_and_no_longer_trusted() {
    let mut d = StoreTimeDisagrees::default();
    // Within [publish - resolution, response]: agrees.
    assert_eq!(d.check(1_000, 2_000, Some(900), 0), None);
    assert_eq!(
        d.check(899, 2_000, Some(900), 1),
        None,
        "within the resolution"
    );
    assert_eq!(
        d.check(500, 2_000, None, 0),
        None,
        "no publish stamp to compare"
    );
    assert!(d.trusted());
    let why = d.check(5_000_000, 2_000_000, Some(900), 0).unwrap();
    assert!(why.contains("3.0 ms after the response"), "{why}");
    assert!(!d.trusted());
    d.check(1_000_000, 2_000_000, Some(31_000_000), 1_000)
        .unwrap();
    d.check(1_000_000, 2_000_000, Some(3_000_000), 1_000)
        .unwrap();
    assert_eq!(
        d,
        StoreTimeDisagrees {
            ahead: 1,
            ahead_max_ns: 3_000_000,
            behind: 2,
            behind_max_ns: 30_000_000,
        }
    );
}

fn key(sequence: u64) -> TraceKey {
    TraceKey {
        publisher: 1,
        stream: 2,
        sequence,
    }
}

#[test]
fn seen_forgets_old_keys_and_stays_bounded() {
    let mut s: Seen<TraceKey> = Seen::new(3);
    assert!(s.insert(key(1), 10));
    assert!(!s.insert(key(1), 10));
    assert!(s.insert(key(2), 20));
    s.forget_before(15);
    assert!(s.insert(key(1), 30), "forgotten once older than the window");
    assert!(s.insert(key(3), 40));
    assert!(s.insert(key(4), 50));
    assert_eq!(s.set.len(), 3);
    assert_eq!(s.evicted_early, 1);
}

#[test]
fn counter_names_are_unique() {
    let names: FxHashSet<&str> = (64..=113).filter_map(counter_id::name).collect();
    assert_eq!(names.len(), 50);
    assert_eq!(counter_id::name(114), None);
    assert_eq!(counter_id::name(63), None);
}

#[test]
fn spreads() {
    let mut h = Hist::new();
    for v in [1_000, 2_000, 3_000, 1_000_000] {
        h.record(v);
    }
    let s = h.spread();
    assert_eq!(s.count, 4);
    assert_eq!(s.max_ns, 1_000_000);
    assert!((s.mean_ns - 251_500.0).abs() < 1.0);
    assert!(s.p99_ns >= 999_000, "{s:?}");
}

#[test]
fn polls_look_back_twice_the_lateness_seen_within_a_limit() {
    let ms = 1_000_000;
    // Rows on time or within half the overlap: the overlap as configured.
    assert_eq!(widening(200 * ms, 0), 0);
    assert_eq!(widening(200 * ms, 100 * ms), 0);
    // A row 300 ms late: 600 ms back in all.
    assert_eq!(widening(200 * ms, 300 * ms), 400 * ms);
    // Never more than a minute beyond the overlap, whatever was seen.
    assert_eq!(widening(200 * ms, i64::MAX), 60_000 * ms);
}
