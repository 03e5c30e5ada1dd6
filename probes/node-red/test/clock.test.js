'use strict';
// The realtime clock built on hrtime, and the clock status sent in Clock frames.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const os = require('node:os');

const { RealtimeClock, ClockStatusReader, parseChronyTracking, secondsToNs } = require('../lib/clock');
const { findEdge, measureAnchor } = require('../lib/anchor');
const { CLOCK_SOURCE, LEAP } = require('../lib/protocol');

const MS = 1000000n;
const TESTDATA = path.resolve(__dirname, '../../../probe/testdata/clock');

test('an anchor brackets a Date.now() millisecond edge', () => {
  const e = findEdge(process.hrtime.bigint() + 100n * MS);
  assert.ok(e, 'no edge within 100 ms');
  assert.equal(e.realNs % MS, 0n);
  const a = measureAnchor(3, 50);
  assert.ok(a.halfWidthNs > 0n);
  // On a loaded machine a bracket can stretch, but the narrowest of three stays small.
  assert.ok(a.halfWidthNs < 2n * MS, `half width ${a.halfWidthNs} ns`);
});

test('nowNs() agrees with Date.now() to within the anchor error', () => {
  const clock = new RealtimeClock();
  const tol = clock.halfWidthNs + 50000n; // + 50 µs for the reads between the two clocks
  let worst = 0n;
  for (let i = 0; i < 20000; i++) {
    const before = clock.nowNs();
    const d = BigInt(Date.now());
    const after = clock.nowNs();
    // Date.now() floors: the realtime instant of its read lies in [d ms, d+1 ms).
    assert.ok(after >= d * MS - tol, `after ${after} < ${d * MS} - ${tol}`);
    assert.ok(before < (d + 1n) * MS + tol, `before ${before} >= ${(d + 1n) * MS} + ${tol}`);
    if (d * MS - after > worst) worst = d * MS - after;
  }
  assert.ok(clock.consistent());
});

test('nowNs() has nanosecond resolution and does not go backwards', () => {
  const clock = new RealtimeClock();
  const seen = new Set();
  let prev = clock.nowNs();
  for (let i = 0; i < 10000; i++) {
    const t = clock.nowNs();
    assert.ok(t >= prev);
    seen.add(t % 1000n);
    prev = t;
  }
  assert.ok(seen.size > 100, 'sub-microsecond digits vary');
});

test('the worker re-anchors without moving the clock by more than the anchor errors', async () => {
  const clock = new RealtimeClock({ reanchorMs: 3600000, checkMs: 3600000 });
  clock.start();
  try {
    const before = clock.anchors;
    clock.reanchor();
    const end = Date.now() + 5000;
    while (clock.anchors === before && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
    assert.equal(clock.anchors, before + 1, 'the worker answered');
    assert.ok(clock.lastShiftNs < MS, `re-anchor moved the clock by ${clock.lastShiftNs} ns`);
    assert.ok(clock.anchorErrorNs() >= clock.halfWidthNs);
    assert.ok(clock.consistent());
  } finally {
    clock.stop();
  }
});

test('a stepped clock is detected', () => {
  const clock = new RealtimeClock();
  assert.ok(clock.consistent());
  clock.baseRealNs += 5n * MS; // as if CLOCK_REALTIME had been stepped back 5 ms
  assert.equal(clock.consistent(), false);
});

test('chronyc -c tracking, as captured from the real program', () => {
  const synced = parseChronyTracking(fs.readFileSync(path.join(TESTDATA, 'chronyc-tracking-synced.csv'), 'utf8'));
  assert.equal(synced.source, CLOCK_SOURCE.chrony);
  assert.equal(synced.synced, true);
  assert.equal(synced.leap, LEAP.none);
  assert.equal(synced.offsetNs, 2004n); // "System time" -2004 ns: the clock is 2004 ns fast
  assert.equal(synced.errorBoundNs, 2004n + 1670n + 6488n / 2n);
  const unsync = parseChronyTracking(fs.readFileSync(path.join(TESTDATA, 'chronyc-tracking-unsynchronised.csv'), 'utf8'));
  assert.equal(unsync.synced, false);
  assert.equal(unsync.leap, LEAP.unsynchronised);
  const local = parseChronyTracking(fs.readFileSync(path.join(TESTDATA, 'chronyc-tracking-local-stratum8.csv'), 'utf8'));
  assert.equal(local.synced, true);
  assert.equal(parseChronyTracking('506 Cannot talk to daemon'), null);
  assert.equal(parseChronyTracking(''), null);
});

test('seconds with 9 decimals convert exactly', () => {
  assert.equal(secondsToNs('-0.000002004'), -2004n);
  assert.equal(secondsToNs('1795335480.242007074'), 1795335480242007074n);
  assert.equal(secondsToNs('0.5'), 500000000n);
  assert.equal(secondsToNs('1e3'), null);
});

test('the status adds the anchor error to the bound; unknown without a daemon', async () => {
  const clock = new RealtimeClock();
  const none = new ClockStatusReader(clock, { chronyc: path.join(os.tmpdir(), 'no-such-chronyc') });
  const s = await none.read();
  assert.equal(s.source, CLOCK_SOURCE.unknown);
  assert.equal(s.synced, false);
  assert.equal(s.errorBoundNs, clock.anchorErrorNs());
  assert.match(s.detail, /anchor ±\d+ ns/);
  // A chronyc that answers (a script printing a captured report).
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-chronyc-'));
  const fake = path.join(dir, 'chronyc');
  fs.writeFileSync(fake, `#!/bin/sh\ncat '${path.join(TESTDATA, 'chronyc-tracking-synced.csv')}'\n`, { mode: 0o755 });
  const chrony = await new ClockStatusReader(clock, { chronyc: fake }).read();
  assert.equal(chrony.source, CLOCK_SOURCE.chrony);
  assert.equal(chrony.errorBoundNs, 2004n + 1670n + 3244n + clock.anchorErrorNs());
  fs.rmSync(dir, { recursive: true });
});
