'use strict';
// The probe never holds up Node-RED, whatever the collector does: against collectors that
// refuse, accept and never answer, send garbage, close after Hello, stop reading, answer
// Welcome late, restart every 200 ms or never acknowledge, what the node's input handler
// does (lib/hop.js: stamp and report) and exporter.sendFrame() return at once, the event
// loop is never held long, everything the exporter holds stays within its configured
// bounds, and what is dropped is counted and reaches the collector once one behaves.
//
// The time asserted (MAX_CALL_MS) bounds blocking, not speed. On a machine busy with other
// work a call can also take long because the process waited for a CPU; where the slowest
// call of a batch passes half the bound, the time the main thread spent waiting for a CPU
// during that batch (Linux's schedstat run delay) is taken off it, so that the test
// measures the probe, not the machine's load.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const { monitorEventLoopDelay } = require('node:perf_hooks');

const { Exporter } = require('../lib/exporter');
const { ControlFrames } = require('../lib/control');
const { HopStamper } = require('../lib/hop');
const ctxmod = require('../lib/context');
const protocol = require('../lib/protocol');
const { FakeCollector, until } = require('./fake-collector');
const { HostileCollector, MODES } = require('./hostile-collector');

const MAX_CALL_MS = 50;
// The event loop's longest stall: the load's own bursts (a few ms) plus whatever the
// exporter does between them. Looser than a call (timers and GC run there too), far
// below any network timeout.
const MAX_LOOP_STALL_MS = 250;
const QUEUE = 2000;
const RETENTION = 64 << 10;
const CONTROL = 8;
const STREAMS = 3;
const TAP_IDS = [64, 65];

const clock = { nowNs: () => BigInt(Date.now()) * 1000000n };
const clockStatus = {
  read: async () => ({
    atNs: clock.nowNs(), source: 4, synced: true, leap: 0, offsetNs: 0n, errorBoundNs: 1n, detail: 'injected',
  }),
};

/** An exporter whose warnings are kept in `ex.warnings`. */
function exporter(address, extra = {}) {
  const warnings = [];
  const ex = new Exporter({
    collector: address, clock, clockStatus, process: 'hostile-test', backoffMinMs: 10, backoffMaxMs: 100,
    connectTimeoutMs: 300, writeTimeoutMs: 300, countersIntervalMs: 50, queueCapacity: QUEUE,
    retentionBytes: RETENTION, maxControlFrames: CONTROL, log: { warn: (m) => warnings.push(m) }, ...extra,
  });
  ex.warnings = warnings;
  ex.setHops([[1, 'flow_in'], [2, 'flow_out']]);
  ex.start();
  return ex;
}

async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

/** Milliseconds the main thread has waited for a CPU (0 where unknown). */
function runDelayMs() {
  try {
    return Number(fs.readFileSync('/proc/self/schedstat', 'utf8').split(' ')[1]) / 1e6;
  } catch (_) {
    return 0;
  }
}

const sentEntry = (stream, messages) => ({
  stream, messages: BigInt(messages), metrics: BigInt(messages), firstSequence: 0n, lastSequence: BigInt(messages - 1),
});

/**
 * What a flow does for `ms`: each message through an `in` and an `out` node's handler
 * (stamp, report), and now and then the exporter's sendFrame() with a publisher's
 * cumulative Sent frame, tap-like counters, a clock status, and a Records frame; every
 * call timed, the exporter's footprint sampled, the event loop's stalls measured.
 */
async function hostLoad(ex, ms) {
  const stampIn = new HopStamper({ exporter: ex, clock, hopId: 1, mode: 'in', carrier: 'property' });
  const stampOut = new HopStamper({ exporter: ex, clock, hopId: 2, mode: 'out', carrier: 'property' });
  const load = {
    calls: 0, records: 0, refused: 0, frameRecords: 0, slowestMs: 0, peakQueued: 0, peakRetained: 0, peakEvicted: 0,
    peakControl: [0, 0, 0, 0], sent: new Map(),
  };
  const loop = monitorEventLoopDelay({ resolution: 5 });
  loop.enable();
  let seq = 0;
  const end = Date.now() + ms;
  const timed = (fn) => {
    const t0 = process.hrtime.bigint();
    const r = fn();
    const took = Number(process.hrtime.bigint() - t0) / 1e6;
    load.calls += 1;
    return [r, took];
  };
  while (Date.now() < end) {
    let batchSlowest = 0;
    const waited0 = runDelayMs();
    for (let i = 0; i < 200; i++) {
      const ctx = {
        publisher: 1, stream: seq % STREAMS, sequence: BigInt(Math.floor(seq / STREAMS)), metricCount: 1,
        intendedNs: 1700000000000000000n, otelTraceId: null, stamps: [],
      };
      seq += 1;
      const msg = { payload: seq, userProperties: { hoptrace: ctxmod.encodeText(ctx) } };
      const [, a] = timed(() => stampIn.process(msg));
      const [, b] = timed(() => stampOut.process(msg));
      batchSlowest = Math.max(batchSlowest, a, b);
      load.records += 2;
      if (seq % 100 === 0) {
        const s = (seq / 100) % STREAMS;
        const m = (load.sent.get(s) || 0) + 100;
        load.sent.set(s, m);
        const frames = [
          protocol.encodeSent({ publisher: 9, entries: [sentEntry(s, m)] }),
          protocol.encodeCounters({ atNs: clock.nowNs(), values: TAP_IDS.map((id) => [id, BigInt(seq)]) }),
          protocol.encodeClock({
            atNs: clock.nowNs(), source: 4, synced: true, leap: 0, offsetNs: 0n, errorBoundNs: 5n, detail: 'host',
          }),
        ];
        if (seq % 1000 === 0) {
          // One record, handed over as a frame: counted as one reported.
          frames.push(protocol.encodeRecords([{
            hop: 1, stampNs: 5n, context: { ...ctx, sequence: BigInt(1e9 + seq) },
          }]));
          load.records += 1;
          load.frameRecords += 1;
        }
        for (const f of frames) {
          const [ok, took] = timed(() => ex.sendFrame(f));
          batchSlowest = Math.max(batchSlowest, took);
          if (!ok) load.refused += 1;
        }
      }
    }
    if (batchSlowest > MAX_CALL_MS / 2) batchSlowest -= runDelayMs() - waited0;
    load.slowestMs = Math.max(load.slowestMs, batchSlowest);
    const fp = ex.footprint();
    load.peakQueued = Math.max(load.peakQueued, fp.queued);
    load.peakRetained = Math.max(load.peakRetained, fp.retainedBytes);
    load.peakEvicted = Math.max(load.peakEvicted, fp.evictedEntries);
    load.peakControl = load.peakControl.map((v, i) => Math.max(v, fp.control[i]));
    // Pacing: a flow that also does other work; the event loop runs the exporter between.
    await new Promise((r) => setTimeout(r, 1));
  }
  loop.disable();
  load.loopStallMs = loop.max / 1e6;
  load.lastSent = [...load.sent].sort((a, b) => a[0] - b[0]).map(([s, m]) => sentEntry(s, m));
  return load;
}

function assertBounded(load, ex, t) {
  t.diagnostic(`${load.calls} calls, slowest ${load.slowestMs.toFixed(2)} ms, event loop stalled at most ` +
    `${load.loopStallMs.toFixed(1)} ms; peak queued ${load.peakQueued}, retained ${load.peakRetained} B, ` +
    `evicted entries ${load.peakEvicted}, control ${load.peakControl}`);
  assert.ok(load.slowestMs < MAX_CALL_MS, `a host call took ${load.slowestMs.toFixed(1)} ms`);
  assert.ok(load.loopStallMs < MAX_LOOP_STALL_MS, `the event loop stalled ${load.loopStallMs.toFixed(1)} ms`);
  assert.ok(load.calls > 5000, `thousands of calls measured (${load.calls})`);
  assert.ok(load.peakQueued <= ex.opts.queueCapacity, `queued ${load.peakQueued}`);
  // One frame larger than the rest may pass the bound while it is being written.
  assert.ok(load.peakRetained <= ex.opts.retentionBytes + (1 << 20), `retained ${load.peakRetained}`);
  assert.ok(load.peakEvicted <= ex.opts.maxEvictedFrames + 1, `evicted entries ${load.peakEvicted}`);
  const [sent, ids, clockStatuses, other] = load.peakControl;
  assert.ok(sent <= STREAMS && ids <= TAP_IDS.length + 0 && clockStatuses <= 1 && other <= CONTROL,
    `control frames ${load.peakControl}`);
}

/** A collector that behaves, on the same port: what was counted reaches it. */
async function recover(ex, port) {
  const col = await new FakeCollector().listen(port);
  await until(() => ex.status().state === 'connected', 10000, 'a connection to the collector that behaves');
  const queueFull = BigInt(ex.snapshot().queue_full);
  await until(() => col.connections.some((c) => { const l = col.lastCounters(c); return l && l.queue_full >= queueFull; }),
    5000, 'the counters at the collector that behaves');
  return col;
}

/**
 * After shutdown: the final counters at the collector are the exporter's; the newest of
 * the host's own Sent entries arrived: kept while no collector took them, or, where a
 * collector took them and lost them (`sendAgain`), sent again as a publisher does.
 */
async function checkDeliveredAfterRecovery(ex, col, load, sendAgain = false) {
  if (sendAgain) ex.sendFrame(protocol.encodeSent({ publisher: 9, entries: load.lastSent }));
  const summary = await ex.shutdown(5000);
  assert.equal(summary.clean, true);
  await until(() => col.connections.at(-1).goodbye, 3000, 'goodbye');
  const c = col.lastCounters();
  const s = summary.counters;
  assert.equal(c.queue_full, BigInt(s.queue_full));
  assert.equal(c.reported, BigInt(s.reported));
  assert.equal(s.reported, load.records);
  assert.equal(c.evicted, BigInt(s.evicted));
  assert.ok(s.queue_full >= load.refused, 'refused Records frames are counted as queue_full');
  const got = new Map();
  for (const f of col.frames('sent')) if (f.publisher === 9) for (const e of f.entries) got.set(e.stream, e);
  assert.deepEqual([...got.values()].sort((a, b) => a.stream - b.stream), load.lastSent);
  await col.close();
}

for (const mode of ['refused', MODES.silent, MODES.garbage, MODES.closeAfterHello]) {
  test(`a collector that never welcomes (${mode}) costs the flow nothing`, async (t) => {
    let server = null;
    let port;
    if (mode === 'refused') {
      port = await freePort();
    } else {
      server = await new HostileCollector(mode).listen();
      port = server.port;
    }
    const ex = exporter(`127.0.0.1:${port}`);
    const load = await hostLoad(ex, 1500);
    assert.notEqual(ex.status().state, 'connected');
    assert.ok(ex.status().lastError);
    assertBounded(load, ex, t);
    const c = ex.snapshot();
    assert.equal(c.reported, load.records);
    assert.ok(c.queue_full >= load.records - QUEUE - CONTROL, 'beyond the queues every record is counted');
    assert.ok(load.refused > 0, 'Records frames beyond maxControlFrames are refused');
    if (server) {
      assert.ok(server.accepted > 0);
      await server.close();
    }
    await checkDeliveredAfterRecovery(ex, await recover(ex, port), load);
  });
}

for (const mode of [MODES.welcomeThenDeaf, MODES.welcomeThenGarbage]) {
  test(`a collector that welcomes then misbehaves (${mode}) costs the flow nothing`, async (t) => {
    const server = await new HostileCollector(mode).listen();
    const ex = exporter(server.address);
    const load = await hostLoad(ex, 2000);
    assertBounded(load, ex, t);
    assert.ok(server.hellos >= 2, 'the exporter gave up on the connection and tried again');
    const c = ex.snapshot();
    assert.equal(c.reported, load.records);
    if (mode === MODES.welcomeThenDeaf) {
      // Writes back up, the queue fills, the retention buffer overflows.
      assert.ok(c.queue_full > 0 && c.evicted > 0, JSON.stringify(c));
      assert.ok(ex.warnings.some((m) => /took nothing for 300 ms/.test(m)), ex.warnings.join('\n'));
    }
    // A connection lost soon after its Welcome backs off like a failed attempt: no tight
    // loop of reconnections, each sending the retention buffer again.
    assert.ok(c.reconnects <= 30, JSON.stringify(c));
    await server.close();
    await checkDeliveredAfterRecovery(ex, await recover(ex, server.port), load, true);
  });
}

test('a late Welcome costs the flow nothing', async (t) => {
  const server = await new HostileCollector(MODES.slowWelcome, { delayMs: 2500 }).listen();
  const ex = exporter(server.address, { connectTimeoutMs: 5000 });
  const t0 = Date.now();
  const load = await hostLoad(ex, 3500);
  assertBounded(load, ex, t);
  await until(() => ex.status().state === 'connected', 5000, 'the late Welcome');
  assert.ok(Date.now() - t0 >= 2500);
  assert.equal(server.hellos, 1, 'one attempt waited for the late Welcome');
  await ex.shutdown(500);
  await server.close();
});

test('a Welcome that never completes is given connectTimeoutMs in all', async () => {
  const server = await new HostileCollector(MODES.slowWelcome, { delayMs: 60000 }).listen();
  const ex = exporter(server.address, { connectTimeoutMs: 300 });
  await until(() => server.hellos >= 3, 5000, 'attempts after the connect timeout');
  assert.match(ex.status().lastError, /no welcome in time/);
  await ex.shutdown(100);
  await server.close();
});

test('a collector that restarts every 200 ms costs the flow nothing', async (t) => {
  const col = await new FakeCollector().listen();
  // The period is what is tested: a restart every 200 ms.
  let drops = 0;
  const restarts = setInterval(() => { col.kill(); drops += 1; }, 200);
  const ex = exporter(col.address);
  let shut = false;
  // A failed assertion must not leave the collector listening or the exporter reconnecting:
  // either keeps the test process alive, and the suite waits on it.
  try {
    const load = await hostLoad(ex, 2000);
    clearInterval(restarts);
    assert.ok(drops >= 5);
    assertBounded(load, ex, t);
    // The last kill may not have reached the exporter yet, which then still calls its
    // dropped connection connected: wait for the pair of a live collector connection.
    const live = () => {
      const c = col.connections.at(-1);
      return ex.status().state === 'connected' && ex.sock !== null && c !== undefined && !c.sock.destroyed
        && c.sock.remotePort === ex.sock.localPort;
    };
    await until(live, 5000, 'the connection after the last restart');
    const summary = await ex.shutdown(5000);
    shut = true;
    assert.equal(summary.clean, true, JSON.stringify(summary));
    const s = summary.counters;
    assert.ok(s.reconnects >= 3, JSON.stringify(s));
    assert.equal(s.reported, load.records);
    // The collector holds every frame it received (it restarts keeping its log): every record
    // is delivered or counted. (Records frames given to sendFrame are not kept for re-sending.)
    const delivered = new Set(col.records().filter((r) => r.context.sequence < 1000000000n)
      .map((r) => `${r.hop}:${r.context.stream}:${r.context.sequence}`));
    assert.ok(delivered.size + s.queue_full + s.lost_unacked + s.send_failed >= load.records - load.frameRecords,
      `${delivered.size} delivered, ${JSON.stringify(s)}`);
    await until(() => col.connections.at(-1).goodbye, 3000, 'goodbye');
    assert.equal(col.lastCounters().queue_full, BigInt(s.queue_full));
  } finally {
    clearInterval(restarts);
    if (!shut) await ex.shutdown(100).catch(() => {});
    await col.close();
  }
});

test('shutdown is bounded with a collector that stopped reading', async () => {
  const server = await new HostileCollector(MODES.welcomeThenDeaf).listen();
  const ex = exporter(server.address, { writeTimeoutMs: 10000 });
  await until(() => ex.status().state === 'connected', 5000, 'welcome');
  let i = 0;
  while (!ex.blocked) {
    for (let k = 0; k < 1000; k++) ex.report({ publisher: 1, stream: 1, sequence: BigInt(i++), metricCount: 1, intendedNs: 1n, otelTraceId: null, stamps: [] }, 1, 1n);
    await new Promise((r) => setImmediate(r));
    assert.ok(i < 5000000, 'the socket never pushed back');
  }
  const t0 = Date.now();
  const summary = await ex.shutdown(500);
  const took = Date.now() - t0;
  // Cut to the shutdown's time, not the 10 s write timeout.
  assert.ok(took < 1500, `shutdown took ${took} ms`);
  assert.equal(summary.clean, false);
  assert.equal(summary.counters.reported, i);
  await server.close();
});

test('a collector that never acknowledges cannot grow the eviction bookkeeping', async () => {
  const col = await new FakeCollector({ ack: false }).listen();
  const ex = exporter(col.address, { retentionBytes: 4096, maxEvictedFrames: 16, maxBatch: 10 });
  await until(() => ex.status().state === 'connected', 5000, 'welcome');
  let peak = 0;
  for (let i = 0; i < 3000; i++) {
    ex.report({ publisher: 1, stream: 1, sequence: BigInt(i), metricCount: 1, intendedNs: 1n, otelTraceId: null, stamps: [] }, 1, 1n);
    if (i % 10 === 9) {
      await until(() => ex.ring.queued === 0 && ex.status().state === 'connected', 5000, 'the exporter taking records');
      peak = Math.max(peak, ex.footprint().evictedEntries);
    }
  }
  assert.ok(peak <= 17, `${peak} entries`);
  const c = ex.snapshot();
  assert.ok(c.evicted > 0 && c.reconnects >= 1, `past maxEvictedFrames the exporter connected again: ${JSON.stringify(c)}`);
  col.ack = true;
  const summary = await ex.shutdown(5000);
  // The collector received (and holds) every frame: nothing evicted was lost.
  assert.equal(summary.clean, true);
  assert.equal(summary.counters.lost_unacked, 0);
  assert.deepEqual(new Set(col.records().map((r) => Number(r.context.sequence))), new Set([...Array(3000).keys()]));
  await col.close();
});

test('control frames keep the newest of what supersedes and bound the rest', () => {
  const cf = new ControlFrames(2);
  for (let n = 1; n <= 1000; n++) {
    cf.push(protocol.encodeSent({ publisher: 1, entries: [sentEntry(0, n), sentEntry(5, 2 * n)] }));
    cf.push(protocol.encodeSent({ publisher: 2, entries: [sentEntry(0, 3 * n)] }));
    cf.push(protocol.encodeCounters({ atNs: BigInt(n), values: [[64, BigInt(n)], [65, BigInt(2 * n)]] }));
    cf.push(protocol.encodeCounters({ atNs: BigInt(n), values: [[66, BigInt(3 * n)]] }));
    cf.push(protocol.encodeClock({ atNs: BigInt(n), source: 2, synced: true, leap: 0, offsetNs: BigInt(n), errorBoundNs: 10n, detail: 'chrony' }));
  }
  assert.deepEqual(cf.footprint(), [3, 3, 1, 0]);
  const rec = protocol.encodeRecords([{ hop: 1, stampNs: 5n, context: { publisher: 1, stream: 0, sequence: 1n, metricCount: 1, intendedNs: 1n, otelTraceId: null } }]);
  assert.deepEqual([cf.push(rec), cf.push(rec), cf.push(rec)], [true, true, false]);
  assert.deepEqual([cf.refused, cf.refusedRecords], [1, 1]);
  assert.throws(() => cf.push(protocol.encodeGoodbye()), RangeError);
  assert.throws(() => cf.push(Buffer.from('nope')), RangeError);
  const { frames, records } = cf.take();
  assert.equal(records, 2);
  const decoded = frames.map((f) => protocol.decodeFrame(f[4], f.subarray(5)));
  assert.deepEqual(decoded.map((f) => f.type), ['clock', 'sent', 'sent', 'counters', 'records', 'records']);
  assert.equal(decoded[0].offsetNs, 1000n);
  assert.deepEqual(decoded[1], { type: 'sent', publisher: 1, entries: [sentEntry(0, 1000), sentEntry(5, 2000)] });
  assert.deepEqual(decoded[2], { type: 'sent', publisher: 2, entries: [sentEntry(0, 3000)] });
  assert.deepEqual(decoded[3], { type: 'counters', atNs: 1000n, values: [[64, 1000n], [65, 2000n], [66, 3000n]] });
  assert.equal(cf.empty, true);
  assert.deepEqual(cf.take(), { frames: [], records: 0 });
});

test('control frames split what one frame cannot hold', () => {
  const cf = new ControlFrames(0);
  const streams = protocol.MAX_SENT_PER_FRAME + 3;
  const entries = [...Array(streams).keys()].map((s) => sentEntry(s, 1));
  // More entries than one frame holds arrive in two frames, and leave in two.
  cf.push(protocol.encodeSent({ publisher: 4, entries: entries.slice(0, protocol.MAX_SENT_PER_FRAME) }));
  cf.push(protocol.encodeSent({ publisher: 4, entries: entries.slice(protocol.MAX_SENT_PER_FRAME) }));
  cf.push(protocol.encodeCounters({ atNs: 1n, values: [...Array(255).keys()].map((i) => [i, 1n]) }));
  cf.push(protocol.encodeCounters({ atNs: 1n, values: [...Array(45).keys()].map((i) => [255 + i, 1n]) }));
  const decoded = cf.take().frames.map((f) => protocol.decodeFrame(f[4], f.subarray(5)));
  assert.deepEqual(decoded.map((f) => f.type), ['sent', 'sent', 'counters', 'counters']);
  assert.equal(decoded[0].entries.length + decoded[1].entries.length, streams);
  assert.equal(decoded[2].values.length + decoded[3].values.length, 300);
});
