//! Randomized checks of the join against a naive oracle.
//!
//! Scenarios are event lists (insert a record at an arrival time, expire at a time), fed
//! both to [`Joiner`] and to an oracle that keeps every record of a pending key in a
//! plain `HashMap<TraceKey, Vec<Record>>` in arrival order and applies the rules of
//! `collector::join` directly, recomputing each trace from its raw records and deciding
//! lateness by a plain set of every key emitted. After every event the outcome, the
//! traces emitted, the pending count, the written keys and all counters must be equal,
//! and no key may ever be emitted twice, however late its records come (scenarios re-send
//! records at random delays of up to fifty windows).
//!
//! Scenarios come from a seeded generator (several thousand, deterministic) and from
//! proptest strategies (shrinkable).

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;

use hoptrace_collector::join::{InsertOutcome, JoinStats, JoinedTrace, Joiner, flags};
use hoptrace_format::spec::{HopSpec, JoinSpec, OutputSpec, PipelineSpec, ResolvedSpec, StageSpec};
use hoptrace_probe::{HopId, OtelTraceId, TraceKey};
use hoptrace_protocol::{MAX_HOPS, Record};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Scenarios

#[derive(Debug, Clone, Copy)]
enum Event {
    /// A record arriving at a time (ns, collector clock).
    Insert(Record, u64),
    /// `Joiner::expire` at a time.
    Expire(u64),
}

#[derive(Debug, Clone)]
struct Scenario {
    spec: ResolvedSpec,
    /// The joiner's plausibility window, when set.
    plausible: Option<RangeInclusive<i64>>,
    events: Vec<Event>,
}

/// A spec with hops `h0..`, the given wire ids, expected hops and stages (by index).
fn make_spec(
    ids: &[u8],
    expected: Option<Vec<usize>>,
    stages: &[(usize, usize)],
    window_ms: u64,
) -> ResolvedSpec {
    let name = |i: usize| format!("h{i}");
    PipelineSpec {
        name: "oracle".into(),
        expected: expected.map(|e| e.into_iter().map(name).collect()),
        hops: ids
            .iter()
            .enumerate()
            .map(|(i, &id)| HopSpec {
                name: name(i),
                id: Some(id),
                description: String::new(),
                earliest: None,
                span: None,
            })
            .collect(),
        stages: stages
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| StageSpec {
                name: format!("s{i}"),
                from: name(from),
                to: name(to),
                definition: String::new(),
                headline: false,
            })
            .collect(),
        join: JoinSpec {
            window_ms,
            max_pending: 1_000_000,
            ..JoinSpec::default()
        },
        output: OutputSpec::default(),
    }
    .resolve()
    .expect("generated specs are valid")
}

/// splitmix64: small, seedable, good enough to drive a generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// True with probability `num / den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
}

/// A random scenario: random spec, traces with random hop subsets, duplicates,
/// conflicting metadata, unknown hops and extreme stamps, shuffled across traces, with
/// monotonic arrivals whose gaps cluster around the window and its exact boundaries.
fn scenario(seed: u64) -> Scenario {
    scenario_sized(seed, None)
}

/// A scenario; with `long = Some(traces)` it has that many traces (otherwise up to 150).
fn scenario_sized(seed: u64, long: Option<usize>) -> Scenario {
    let mut rng = Rng(seed);
    let hop_count = if rng.chance(1, 8) {
        1 + rng.index(MAX_HOPS)
    } else {
        1 + rng.index(6)
    };
    let ids: Vec<u8> = if rng.chance(1, 2) {
        (0..hop_count as u8).collect()
    } else {
        let mut ids = Vec::new();
        while ids.len() < hop_count {
            let id = rng.below(256) as u8;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    };
    let expected = if rng.chance(1, 2) {
        None
    } else {
        let mut e: Vec<usize> = (0..hop_count).filter(|_| rng.chance(2, 3)).collect();
        if e.is_empty() {
            e.push(rng.index(hop_count));
        }
        Some(e)
    };
    let mut stages = Vec::new();
    if hop_count >= 2 {
        for _ in 0..rng.index(6) {
            let from = rng.index(hop_count);
            let to = (from + 1 + rng.index(hop_count - 1)) % hop_count;
            stages.push((from, to));
        }
    }
    let window_ms = 1 + rng.below(3);
    let window = window_ms * 1_000_000;
    let spec = make_spec(&ids, expected, &stages, window_ms);
    let plausible = rng
        .chance(1, 3)
        .then(|| rng.range_i64(-2_000_000, 0)..=rng.range_i64(500_000_000, 1_000_000_000));

    // Records, trace by trace.
    let presence = [1u64, 2, 3, 4][rng.index(4)]; // chance a hop stamps is presence/4
    let mut records: Vec<(usize, Record)> = Vec::new();
    let mut traces = if rng.chance(1, 5) {
        1 + rng.index(150)
    } else {
        1 + rng.index(30)
    };
    if let Some(t) = long {
        traces = t;
    }
    let mut keys: Vec<TraceKey> = Vec::new();
    for t in 0..traces {
        let key = if !keys.is_empty() && rng.chance(1, 10) {
            keys[rng.index(keys.len())]
        } else {
            TraceKey {
                publisher: rng.below(3) as u16,
                stream: rng.below(3) as u32,
                sequence: t as u64,
            }
        };
        keys.push(key);
        let base = Record {
            key,
            hop: HopId(0),
            stamp_ns: rng.range_i64(-1_000_000, 1_000_000_000),
            metric_count: 1 + rng.below(100) as u32,
            intended_ns: if rng.chance(1, 30) {
                rng.next() as i64
            } else {
                rng.range_i64(0, 1_000)
            },
            otel_trace_id: rng
                .chance(1, 2)
                .then(|| OtelTraceId([1 + rng.below(200) as u8; 16])),
        };
        let stamp = |rng: &mut Rng, hop: u8| {
            let mut r = base;
            r.hop = HopId(hop);
            r.stamp_ns = match rng.below(50) {
                0 => i64::MIN,
                1 => i64::MAX,
                _ => base.stamp_ns.saturating_add(rng.range_i64(-5_000, 20_000)),
            };
            match rng.below(40) {
                0 => r.metric_count += 1,
                1 => r.intended_ns -= 1,
                2 => r.otel_trace_id = Some(OtelTraceId([250; 16])),
                3..=12 => r.otel_trace_id = None,
                _ => {}
            }
            r
        };
        for &id in &ids {
            if rng.chance(presence, 4) {
                records.push((t, stamp(&mut rng, id)));
                while rng.chance(1, 8) {
                    records.push((t, stamp(&mut rng, id)));
                }
            }
        }
        if rng.chance(1, 10) {
            let unknown = loop {
                let id = rng.below(256) as u8;
                if !ids.contains(&id) {
                    break id;
                }
            };
            records.push((t, stamp(&mut rng, unknown)));
        }
    }
    // Order: fully shuffled, or by trace with local jitter (records of one message
    // usually arrive close together).
    let n = records.len();
    for i in (1..n).rev() {
        records.swap(i, rng.index(i + 1));
    }
    if rng.chance(1, 2) {
        let jitter = 1 + rng.below(8);
        let sort_keys: Vec<u64> = records
            .iter()
            .map(|(t, _)| *t as u64 * 4 + rng.below(jitter * 4))
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| sort_keys[i]);
        records = order.iter().map(|&i| records[i]).collect();
    }

    // Arrivals and expiry calls.
    let gaps = [
        0,
        1,
        1_000,
        window / 10,
        window / 2,
        window - 1,
        window,
        window + 1,
        2 * window,
    ];
    let busy = rng.below(4); // higher: smaller gaps
    let expire_every = [2, 3, 10, 50][rng.index(4)];
    let mut now = rng.below(1 << 40);
    let mut times = vec![now];
    let mut events = Vec::new();
    for (_, r) in records {
        now += if rng.chance(busy, 4) {
            rng.below(100)
        } else {
            gaps[rng.index(gaps.len())]
        };
        if rng.chance(1, 6) {
            // Land exactly on, or one past, a window after some earlier time.
            let earlier = times[rng.index(times.len())];
            now = now.max(earlier + window + rng.below(2));
        }
        if rng.chance(1, expire_every) {
            events.push(Event::Expire(now));
            times.push(now);
            now += gaps[rng.index(3)];
        }
        events.push(Event::Insert(r, now));
        times.push(now);
    }
    // Late duplicates: records re-sent after random delays, up to fifty windows, with
    // expiry in between, as a probe that re-sends or a slow path would.
    let sent: Vec<Record> = events
        .iter()
        .filter_map(|e| match e {
            Event::Insert(r, _) => Some(*r),
            Event::Expire(_) => None,
        })
        .collect();
    if !sent.is_empty() && rng.chance(2, 3) {
        for _ in 0..=rng.index(sent.len().min(40)) {
            now += rng.below(50 * window);
            if rng.chance(1, 2) {
                events.push(Event::Expire(now));
            }
            events.push(Event::Insert(sent[rng.index(sent.len())], now));
        }
    }
    if rng.chance(1, 2) {
        events.push(Event::Expire(now + rng.below(3 * window)));
    }
    Scenario {
        spec,
        plausible,
        events,
    }
}

// ---------------------------------------------------------------------------------------
// The oracle

struct Group {
    /// Creation order of the trace.
    order: u64,
    first_arrival_ns: u64,
    /// Every record of the trace, in arrival order.
    records: Vec<Record>,
}

struct Oracle<'a> {
    spec: &'a ResolvedSpec,
    window_ns: u64,
    plausible: RangeInclusive<i64>,
    clock_ns: u64,
    pending: HashMap<TraceKey, Group>,
    next_order: u64,
    /// Every key emitted.
    emitted: HashSet<TraceKey>,
    stats: JoinStats,
}

impl<'a> Oracle<'a> {
    fn new(spec: &'a ResolvedSpec, plausible: Option<RangeInclusive<i64>>) -> Self {
        Self {
            spec,
            window_ns: spec.window_ns(),
            plausible: plausible.unwrap_or(i64::MIN..=i64::MAX),
            clock_ns: 0,
            pending: HashMap::new(),
            next_order: 0,
            emitted: HashSet::new(),
            stats: JoinStats::default(),
        }
    }

    fn insert(&mut self, rec: &Record, arrival: u64, out: &mut Vec<JoinedTrace>) -> InsertOutcome {
        self.clock_ns = self.clock_ns.max(arrival);
        let now = self.clock_ns;
        self.stats.records += 1;
        let Some(hop) = self.spec.hop_index(rec.hop) else {
            self.stats.unknown_hop += 1;
            return InsertOutcome::UnknownHop;
        };
        self.stats.records_by_hop[hop] += 1;
        if !self.plausible.contains(&rec.stamp_ns) {
            self.stats.implausible += 1;
            return InsertOutcome::Implausible;
        }
        if !self.pending.contains_key(&rec.key) {
            if self.emitted.contains(&rec.key) {
                self.stats.late += 1;
                return InsertOutcome::Late;
            }
            self.pending.insert(
                rec.key,
                Group {
                    order: self.next_order,
                    first_arrival_ns: now,
                    records: Vec::new(),
                },
            );
            self.next_order += 1;
            self.stats.traces += 1;
            self.stats.peak_pending = self.stats.peak_pending.max(self.pending.len() as u64);
        }
        let group = self.pending.get_mut(&rec.key).unwrap();
        let first = group.records.first().copied().unwrap_or(*rec);
        let kept_id = group.records.iter().find_map(|r| r.otel_trace_id);
        let id_conflict = matches!((kept_id, rec.otel_trace_id), (Some(a), Some(b)) if a != b);
        if rec.metric_count != first.metric_count
            || rec.intended_ns != first.intended_ns
            || id_conflict
        {
            self.stats.conflicts += 1;
        }
        if !self.plausible.contains(&rec.intended_ns) {
            self.stats.implausible_intended += 1;
        }
        let duplicate = group
            .records
            .iter()
            .any(|r| self.spec.hop_index(r.hop) == Some(hop));
        group.records.push(*rec);
        if duplicate {
            self.stats.duplicates += 1;
            return InsertOutcome::Duplicate;
        }
        self.stats.stored += 1;
        self.stats.stored_by_hop[hop] += 1;
        let present = self.present(&self.pending[&rec.key].records);
        let expected = self.spec.expected_mask();
        if present & expected == expected {
            let group = self.pending.remove(&rec.key).unwrap();
            self.emit(rec.key, &group.records, true, out);
            self.stats.completed += 1;
            InsertOutcome::Completed
        } else {
            InsertOutcome::Pending
        }
    }

    fn expire(&mut self, at: u64, out: &mut Vec<JoinedTrace>) {
        self.clock_ns = self.clock_ns.max(at);
        let now = self.clock_ns;
        let mut due: Vec<(u64, TraceKey)> = self
            .pending
            .iter()
            .filter(|(_, g)| now - g.first_arrival_ns > self.window_ns)
            .map(|(k, g)| (g.order, *k))
            .collect();
        due.sort_unstable_by_key(|(order, _)| *order);
        for (_, key) in due {
            let group = self.pending.remove(&key).unwrap();
            self.emit(key, &group.records, false, out);
            self.stats.expired += 1;
        }
    }

    fn drain(&mut self, out: &mut Vec<JoinedTrace>) {
        let mut all: Vec<(u64, TraceKey)> =
            self.pending.iter().map(|(k, g)| (g.order, *k)).collect();
        all.sort_unstable_by_key(|(order, _)| *order);
        for (_, key) in all {
            let group = self.pending.remove(&key).unwrap();
            self.emit(key, &group.records, false, out);
            self.stats.drained += 1;
        }
    }

    fn present(&self, records: &[Record]) -> u16 {
        records
            .iter()
            .map(|r| 1u16 << self.spec.hop_index(r.hop).unwrap())
            .fold(0, |a, b| a | b)
    }

    /// Builds the trace from its raw records and logs the emission.
    fn emit(
        &mut self,
        key: TraceKey,
        records: &[Record],
        complete: bool,
        out: &mut Vec<JoinedTrace>,
    ) {
        let first = records[0];
        let expected = self.spec.expected_mask();
        let mut t = JoinedTrace {
            key,
            metric_count: first.metric_count,
            intended_ns: first.intended_ns,
            otel_trace_id: records.iter().find_map(|r| r.otel_trace_id),
            present_mask: 0,
            stamps_ns: [0; MAX_HOPS],
            complete,
            missing_mask: 0,
            flags: 0,
        };
        for r in records {
            let h = self.spec.hop_index(r.hop).unwrap();
            if t.present_mask & (1 << h) != 0 {
                t.flags |= flags::DUPLICATE;
            } else {
                t.present_mask |= 1 << h;
                t.stamps_ns[h] = r.stamp_ns;
            }
            let id_conflict =
                matches!((t.otel_trace_id, r.otel_trace_id), (Some(a), Some(b)) if a != b);
            if r.metric_count != first.metric_count
                || r.intended_ns != first.intended_ns
                || id_conflict
            {
                t.flags |= flags::CONFLICT;
            }
            if !self.plausible.contains(&r.intended_ns) {
                t.flags |= flags::IMPLAUSIBLE_TIME;
            }
        }
        assert_eq!(complete, t.present_mask & expected == expected);
        t.missing_mask = expected & !t.present_mask;
        if t.present_mask & !expected != 0 {
            t.flags |= flags::UNEXPECTED_HOP;
        }
        for s in self.spec.stages() {
            if let (Some(from), Some(to)) = (t.stamp(s.from_index), t.stamp(s.to_index))
                && to < from
            {
                t.flags |= flags::NEGATIVE_DELTA;
            }
        }
        if !complete {
            for h in 0..MAX_HOPS {
                self.stats.missing_by_hop[h] += u64::from(t.missing_mask >> h & 1);
            }
        }
        self.stats.duplicate_traces += u64::from(t.has_flag(flags::DUPLICATE));
        self.stats.negative_delta_traces += u64::from(t.has_flag(flags::NEGATIVE_DELTA));
        self.stats.conflict_traces += u64::from(t.has_flag(flags::CONFLICT));
        self.stats.unexpected_hop_traces += u64::from(t.has_flag(flags::UNEXPECTED_HOP));
        self.stats.implausible_traces += u64::from(t.has_flag(flags::IMPLAUSIBLE_TIME));
        assert!(self.emitted.insert(key), "the oracle emits a key once");
        out.push(t);
    }

    fn stats(&self) -> JoinStats {
        self.stats
    }
}

// ---------------------------------------------------------------------------------------
// The check

/// Runs the scenario through the joiner and the oracle and compares them after every
/// event. Returns the joiner's final stats.
fn check(sc: &Scenario) -> Result<JoinStats, TestCaseError> {
    let mut joiner = Joiner::new(&sc.spec);
    if let Some(p) = &sc.plausible {
        joiner.set_plausible_window(p.clone());
    }
    let mut oracle = Oracle::new(&sc.spec, sc.plausible.clone());
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let mut emitted_per_key: HashMap<TraceKey, u64> = HashMap::new();
    for (step, event) in sc.events.iter().enumerate() {
        match *event {
            Event::Insert(rec, at) => {
                let g = joiner.insert(&rec, at, &mut got);
                let w = oracle.insert(&rec, at, &mut want);
                prop_assert_eq!(g, w, "outcome of event {}: {:?}", step, event);
            }
            Event::Expire(at) => {
                joiner.expire(at, &mut got);
                oracle.expire(at, &mut want);
            }
        }
        prop_assert_eq!(&got, &want, "traces after event {}: {:?}", step, event);
        prop_assert_eq!(
            joiner.pending(),
            oracle.pending.len(),
            "pending after event {}",
            step
        );
        prop_assert_eq!(
            joiner.written().len(),
            oracle.emitted.len() as u64,
            "written keys after event {}",
            step
        );
        prop_assert_eq!(joiner.stats(), oracle.stats(), "stats after event {}", step);
        prop_assert_eq!(joiner.is_full(), joiner.pending() >= sc.spec.max_pending());
        for t in got.drain(..) {
            *emitted_per_key.entry(t.key).or_default() += 1;
        }
        want.clear();
    }
    joiner.drain(&mut got);
    oracle.drain(&mut want);
    prop_assert_eq!(&got, &want, "drained traces");
    for t in got.drain(..) {
        *emitted_per_key.entry(t.key).or_default() += 1;
    }
    let s = joiner.stats();
    prop_assert_eq!(s, oracle.stats());
    prop_assert_eq!(joiner.pending(), 0);

    // Every key with a plausible record of a declared hop is emitted exactly once, however
    // late and often its records came; the written keys are exactly those.
    for event in &sc.events {
        if let Event::Insert(rec, _) = event
            && sc.spec.hop_index(rec.hop).is_some()
            && oracle.plausible.contains(&rec.stamp_ns)
        {
            prop_assert_eq!(emitted_per_key.get(&rec.key).copied(), Some(1));
            prop_assert!(joiner.written().contains(&rec.key));
        }
    }
    prop_assert_eq!(emitted_per_key.values().sum::<u64>(), s.traces);
    prop_assert_eq!(joiner.written().len(), s.traces);
    // Everything is accounted for.
    prop_assert_eq!(
        s.records,
        s.stored + s.duplicates + s.late + s.unknown_hop + s.implausible
    );
    prop_assert_eq!(s.traces, s.completed + s.expired + s.drained);
    prop_assert_eq!(
        s.records_by_hop.iter().sum::<u64>(),
        s.records - s.unknown_hop
    );
    let inserts = sc
        .events
        .iter()
        .filter(|e| matches!(e, Event::Insert(..)))
        .count();
    prop_assert_eq!(s.records, inserts as u64);
    Ok(s)
}

#[test]
fn seeded_scenarios_match_the_oracle() {
    let mut total = JoinStats::default();
    let mut late_after_windows = 0;
    for seed in 0..4_000u64 {
        let sc = scenario(seed);
        let s = check(&sc).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        total.records += s.records;
        total.late += s.late;
        total.duplicates += s.duplicates;
        total.unknown_hop += s.unknown_hop;
        total.conflicts += s.conflicts;
        total.completed += s.completed;
        total.expired += s.expired;
        total.drained += s.drained;
        total.implausible += s.implausible;
        total.implausible_traces += s.implausible_traces;
        total.negative_delta_traces += s.negative_delta_traces;
        total.unexpected_hop_traces += s.unexpected_hop_traces;
        late_after_windows += u64::from(s.late > 0 && sc_resends(&sc));
    }
    // The generator reaches every rule, so the comparison above means something.
    let reached = [
        ("late", total.late),
        ("duplicates", total.duplicates),
        ("unknown_hop", total.unknown_hop),
        ("conflicts", total.conflicts),
        ("completed", total.completed),
        ("expired", total.expired),
        ("drained", total.drained),
        ("implausible", total.implausible),
        ("implausible_traces", total.implausible_traces),
        ("negative_delta_traces", total.negative_delta_traces),
        ("unexpected_hop_traces", total.unexpected_hop_traces),
        (
            "scenarios with late records after many windows",
            late_after_windows,
        ),
    ];
    for (what, n) in reached {
        assert!(n > 50, "{what}: only {n} in all scenarios ({total:?})");
    }
}

/// Whether the scenario re-sends a record more than ten windows after its first send.
fn sc_resends(sc: &Scenario) -> bool {
    let window = sc.spec.window_ns();
    let mut first: HashMap<(TraceKey, u8), u64> = HashMap::new();
    sc.events.iter().any(|e| match e {
        Event::Insert(r, at) => {
            let t = *first.entry((r.key, r.hop.0)).or_insert(*at);
            *at > t + 10 * window
        }
        Event::Expire(_) => false,
    })
}

/// Thousands of traces with late re-sends: the written keys grow and fill their gaps
/// while the table grows and shrinks.
#[test]
fn long_scenarios_match_the_oracle() {
    let mut emitted = 0;
    for seed in 0..12u64 {
        let sc = scenario_sized(10_000 + seed, Some(6_000));
        let s = check(&sc).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        emitted += s.completed + s.expired + s.drained;
    }
    assert!(emitted > 30_000, "only {emitted} traces emitted");
}

#[test]
fn the_generator_is_deterministic() {
    let a = scenario(42);
    let b = scenario(42);
    assert_eq!(format!("{:?}", a.events), format!("{:?}", b.events));
}

// ---------------------------------------------------------------------------------------
// Shrinkable scenarios

/// Four hops: h0..h2 expected, h3 optional; wire ids 0..=3, id 200 undeclared; stages
/// h0→h1, h1→h2, h0→h3; window 1 ms.
fn small_spec() -> ResolvedSpec {
    make_spec(
        &[0, 1, 2, 3],
        Some(vec![0, 1, 2]),
        &[(0, 1), (1, 2), (0, 3)],
        1,
    )
}

fn arb_events() -> impl Strategy<Value = Vec<Event>> {
    let step = (
        0u64..5,       // key
        0u8..5,        // hop (4 = undeclared)
        -3i64..4,      // stamp
        0u8..6,        // metadata variant
        0usize..5,     // gap
        any::<bool>(), // expire first
    );
    proptest::collection::vec(step, 0..60).prop_map(|steps| {
        const W: u64 = 1_000_000;
        let gaps = [0, 1, W - 1, W, W + 1];
        let mut now = 0;
        let mut events = Vec::new();
        for (key, hop, stamp, meta, gap, expire) in steps {
            now += gaps[gap];
            if expire {
                events.push(Event::Expire(now));
            }
            let rec = Record {
                key: TraceKey {
                    publisher: 0,
                    stream: 0,
                    sequence: key,
                },
                hop: HopId(if hop == 4 { 200 } else { hop }),
                stamp_ns: stamp,
                metric_count: if meta == 1 { 2 } else { 1 },
                intended_ns: if meta == 2 { 9 } else { 0 },
                otel_trace_id: match meta {
                    3 => Some(OtelTraceId([3; 16])),
                    4 => Some(OtelTraceId([4; 16])),
                    _ => None,
                },
            };
            events.push(Event::Insert(rec, now));
        }
        events
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn shrinkable_scenarios_match_the_oracle(events in arb_events(), plausible in any::<bool>()) {
        let plausible = plausible.then_some(-2..=2);
        check(&Scenario { spec: small_spec(), plausible, events })?;
    }
}

// ---------------------------------------------------------------------------------------
// Bounds

/// With `expire(now)` before every insert, every pending trace started within the last
/// window, so pending never exceeds the traces (nor the records) that arrived within it.
#[test]
fn pending_never_exceeds_what_arrived_within_the_window() {
    let spec = make_spec(&[0, 1, 2, 3, 4, 5], None, &[(0, 5)], 1);
    let window = spec.window_ns();
    let mut rng = Rng(7);
    let mut joiner = Joiner::new(&spec);
    let mut out = Vec::new();
    // (arrival, started a trace) of every record, for a sliding-window count.
    let mut arrivals: std::collections::VecDeque<(u64, bool)> = Default::default();
    let (mut in_window_records, mut in_window_starts) = (0usize, 0usize);
    let mut now = 0u64;
    let mut peak = 0;
    for i in 0..300_000u64 {
        now += rng.below(40);
        joiner.expire(now, &mut out);
        // Messages 0..: most stamp every hop close together, some lose hops.
        let seq = i / 6 + if rng.chance(1, 20) { rng.below(50) } else { 0 };
        let hop = (i % 6) as u8;
        if rng.chance(1, 10) {
            continue;
        }
        let rec = Record {
            key: TraceKey {
                publisher: 1,
                stream: 1,
                sequence: seq,
            },
            hop: HopId(hop),
            stamp_ns: i as i64,
            metric_count: 1,
            intended_ns: 0,
            otel_trace_id: None,
        };
        let before = joiner.stats().traces;
        joiner.insert(&rec, now, &mut out);
        let started = joiner.stats().traces > before;
        arrivals.push_back((now, started));
        in_window_records += 1;
        in_window_starts += usize::from(started);
        while let Some(&(t, s)) = arrivals.front() {
            if now - t <= window {
                break;
            }
            arrivals.pop_front();
            in_window_records -= 1;
            in_window_starts -= usize::from(s);
        }
        assert!(joiner.pending() <= in_window_starts, "step {i}");
        assert!(in_window_starts <= in_window_records);
        peak = peak.max(joiner.pending());
        out.clear();
    }
    assert!(peak > 10, "the test exercised little: peak pending {peak}");
    let s = joiner.stats();
    assert!(
        s.expired > 1_000 && s.completed > 1_000 && s.late > 100,
        "{s:?}"
    );
}
