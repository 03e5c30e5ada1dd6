'use strict';
// The realtime clock built on hrtime, and the clock status sent in Clock frames.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const os = require('node:os');

const {
  RealtimeClock, ClockStatusReader, findProgram, parseChronyTracking, parsePmcReading, secondsToNs,
} = require('../lib/clock');
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

// ---------------------------------------------------------------------------------------
// Detection, with stub chronyc and pmc programs

function stubs() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-clock-'));
  const make = (name, body) => {
    const p = path.join(dir, name);
    fs.writeFileSync(p, `#!/bin/sh\n${body}`, { mode: 0o755 });
    return p;
  };
  return { dir, make };
}
const CHRONY_DOWN = 'echo "506 Cannot talk to daemon" >&2; exit 1\n';
const PMC_NOBODY = 'for r in "$@"; do case $r in GET*) echo "sending: $r";; esac; done\n';
const catFile = (name) => `cat '${path.join(TESTDATA, name)}'\n`;

test('pmc output of a free-running slave and of a grandmaster, as captured from ptp4l', () => {
  const slave = fs.readFileSync(path.join(TESTDATA, 'pmc-slave-free-running.txt'), 'utf8');
  const s = parsePmcReading(slave);
  assert.equal(s.source, CLOCK_SOURCE.ptp);
  assert.equal(s.synced, false, 'free_running: measured, never locked');
  assert.equal(s.leap, LEAP.unsynchronised);
  assert.equal(s.offsetNs, -105n);
  assert.equal(s.errorBoundNs, 105n + 2899n);
  assert.match(s.detail, /gm=02c9c1\.fffe\.736ac7 gm_present=true port=UNCALIBRATED/);
  const locked = parsePmcReading(slave.replace('UNCALIBRATED', 'SLAVE').replace('leap61                0', 'leap61                1'));
  assert.equal(locked.synced, true);
  assert.equal(locked.leap, LEAP.insert);
  const gm = parsePmcReading(fs.readFileSync(path.join(TESTDATA, 'pmc-grandmaster.txt'), 'utf8'));
  assert.equal(gm.synced, false);
  assert.match(gm.detail, /this host is the grandmaster/);
  assert.throws(() => parsePmcReading(fs.readFileSync(path.join(TESTDATA, 'pmc-no-answer.txt'), 'utf8')),
    (e) => e.noAnswer === true);
  assert.throws(() => parsePmcReading(slave.replace('UNCALIBRATED', 'DAYDREAMING')), /portState/);
  assert.throws(() => parsePmcReading('\t\tmaster_offset -105\n'), /before any answer/);
});

test('detection prefers chronyd; the status adds the anchor error to the bound', async () => {
  const { dir, make } = stubs();
  try {
    const clock = new RealtimeClock();
    const r = new ClockStatusReader(clock, { chronyc: make('chronyc', catFile('chronyc-tracking-synced.csv')),
      pmc: make('pmc', catFile('pmc-slave-free-running.txt')) });
    assert.deepEqual(await r.detection(), { name: 'chrony', passedOver: {} });
    const s = await r.read();
    assert.equal(s.source, CLOCK_SOURCE.chrony);
    assert.equal(s.errorBoundNs, 2004n + 1670n + 3244n + clock.anchorErrorNs());
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('detection falls back to ptp4l, asked as the Rust probe asks it', async () => {
  const { dir, make } = stubs();
  try {
    const clock = new RealtimeClock();
    const argv = path.join(dir, 'argv');
    const r = new ClockStatusReader(clock, { chronyc: make('chronyc', CHRONY_DOWN),
      pmc: make('pmc', `printf '%s\\n' "$@" > '${argv}'\n${catFile('pmc-slave-free-running.txt')}`) });
    const d = await r.detection();
    assert.equal(d.name, 'ptp');
    assert.deepEqual(d.passedOver, { chrony: 'chronyc -c tracking: exit 1: 506 Cannot talk to daemon' });
    const s = await r.read();
    assert.equal(s.source, CLOCK_SOURCE.ptp);
    assert.equal(s.offsetNs, -105n);
    assert.equal(s.errorBoundNs, 3004n + clock.anchorErrorNs());
    assert.match(s.detail, /uds=\/var\/run\/ptp4l domain=0;/);
    const args = fs.readFileSync(argv, 'utf8').trim().split('\n');
    assert.deepEqual(args.slice(0, 7), ['-u', '-b', '0', '-d', '0', '-s', '/var/run/ptp4l']);
    assert.equal(args[7], '-i');
    assert.deepEqual(args.slice(9), ['GET TIME_STATUS_NP', 'GET PORT_DATA_SET', 'GET CURRENT_DATA_SET',
      'GET TIME_PROPERTIES_DATA_SET']);
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('without chronyd or ptp4l the source is unknown, naming every reason, the kernel\'s included', async () => {
  const { dir, make } = stubs();
  try {
    const clock = new RealtimeClock();
    const r = new ClockStatusReader(clock, { chronyc: make('chronyc', CHRONY_DOWN), pmc: make('pmc', PMC_NOBODY) });
    const s = await r.read();
    assert.equal(s.source, CLOCK_SOURCE.unknown);
    assert.equal(s.synced, false);
    assert.equal(s.leap, LEAP.unsynchronised);
    assert.equal(s.errorBoundNs, clock.anchorErrorNs(), 'the bound covers the anchor only');
    assert.match(s.detail, /Cannot talk to daemon/);
    assert.match(s.detail, /no TIME_STATUS_NP answer/);
    assert.match(s.detail, /adjtimex needs native code/);
    assert.match(s.detail, /anchor ±\d+ ns/);
    const missing = await new ClockStatusReader(clock, { chronyc: path.join(dir, 'none'), pmc: path.join(dir, 'none') }).read();
    assert.match(missing.detail, /chronyc -c tracking: not installed/);
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('a chronyd that stops after detection is reported as chrony, not synchronised', async () => {
  const { dir, make } = stubs();
  try {
    const chronyc = make('chronyc', catFile('chronyc-tracking-synced.csv'));
    const r = new ClockStatusReader(new RealtimeClock(), { chronyc, pmc: make('pmc', PMC_NOBODY) });
    assert.equal((await r.read()).synced, true);
    fs.writeFileSync(chronyc, `#!/bin/sh\n${CHRONY_DOWN}`);
    const s = await r.read();
    assert.equal(s.source, CLOCK_SOURCE.chrony);
    assert.equal(s.synced, false);
    assert.match(s.detail, /Cannot talk to daemon/);
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('programs are found on PATH, then in the sbin directories', () => {
  const { dir, make } = stubs();
  const saved = process.env.PATH;
  try {
    const p = make('chronyc', 'exit 0\n');
    process.env.PATH = `${dir}:/usr/bin`;
    assert.equal(findProgram('chronyc'), p);
    process.env.PATH = '/nonexistent';
    assert.equal(findProgram('no-such-program-here'), 'no-such-program-here');
  } finally {
    process.env.PATH = saved;
    fs.rmSync(dir, { recursive: true });
  }
});

test('this host, as documented: chronyd if chronyc answers, else ptp4l if pmc does, else unknown', async () => {
  const chronyc = findProgram('chronyc');
  assert.ok(path.isAbsolute(chronyc), 'chronyc is not installed (infra/setup.sh installs chrony)');
  const { spawnSync } = require('node:child_process');
  const answered = spawnSync(chronyc, ['-n', '-c', 'tracking'], { timeout: 5000 }).status === 0;
  const clock = new RealtimeClock();
  const r = new ClockStatusReader(clock, { timeoutMs: 2000 });
  const d = await r.detection();
  if (answered) {
    assert.equal(d.name, 'chrony', JSON.stringify(d.passedOver));
    return;
  }
  assert.ok(d.passedOver.chrony, 'why chronyd was not used');
  const pmc = findProgram('pmc');
  const pmcOut = path.isAbsolute(pmc)
    ? String(spawnSync(pmc, ['-u', '-b', '0', 'GET TIME_STATUS_NP'], { timeout: 5000 }).stdout) : '';
  if (/RESPONSE MANAGEMENT TIME_STATUS_NP/.test(pmcOut)) {
    assert.equal(d.name, 'ptp', JSON.stringify(d.passedOver));
    return;
  }
  assert.equal(d.name, 'unknown', JSON.stringify(d.passedOver));
  const s = await r.read();
  assert.equal(s.source, CLOCK_SOURCE.unknown);
  assert.match(s.detail, /adjtimex needs native code/);
});
