'use strict';
// Collector protocol version 2 in the exporter, against the in-process collector: numbered
// frames and Acks, re-sending what the collector does not hold after a reconnection, the
// bounded retention buffer while the collector is away (evictions counted), speaking
// version 1 to a collector that knows only version 1; and the retention buffer's
// bookkeeping, case for case the Rust probe's tests (probe/src/retention.rs). The end-to-end
// check against the real collector, killed and restarted, is in e2e.test.js.

const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');

const { Exporter } = require('../lib/exporter');
const { Retention } = require('../lib/retention');
const { FakeCollector, until } = require('./fake-collector');

const clock = { nowNs: () => BigInt(Date.now()) * 1000000n };
const clockStatus = {
  read: async () => ({
    atNs: clock.nowNs(), source: 4, synced: true, leap: 0, offsetNs: 0n, errorBoundNs: 1n, detail: 'injected',
  }),
};

function ctx(sequence) {
  return {
    publisher: 9, stream: 1, sequence: BigInt(sequence), metricCount: 1, intendedNs: 1700000000000000000n,
    otelTraceId: null, stamps: [],
  };
}

function exporter(address, extra = {}) {
  const ex = new Exporter({
    collector: address, clock, clockStatus, process: 'durable-test', backoffMinMs: 10, backoffMaxMs: 50,
    connectTimeoutMs: 500, ...extra,
  });
  ex.setHops([[0, 'publish']]);
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

/** Reports `frames` batches of `perFrame` records, each taken by the exporter before the next. */
async function reportInFrames(ex, frames, perFrame, start = 0) {
  let seq = start;
  for (let f = 0; f < frames; f++) {
    for (let i = 0; i < perFrame; i++) ex.report(ctx(seq++), 0, 1700000000000000000n);
    await until(() => ex.ring.queued === 0, 5000, 'the exporter took the batch');
  }
  return seq;
}

const sequences = (col) => col.records().map((r) => Number(r.context.sequence));

test('a collector that speaks only version 1 is spoken to in version 1', async () => {
  const col = await new FakeCollector({ version: 1 }).listen();
  const ex = exporter(col.address);
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  for (let i = 0; i < 50; i++) ex.report(ctx(i), 0, 1n);
  const s = await ex.shutdown(3000);
  assert.equal(s.clean, true);
  assert.deepEqual(col.connections.map((c) => c.hello.version), [2, 1], 'refused in 2, welcomed in 1');
  assert.equal(s.counters.sent, 50);
  assert.equal(s.counters.reconnects, 0);
  assert.equal(ex.rejected, 0, 'a version refusal is not counted as a rejection');
  assert.equal(col.connections[1].frames.filter((f) => f.type === 'seq_records').length, 0);
  assert.equal(col.records().length, 50);
  await col.close();
});

test('protocolVersion 1 offers version 1 only', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address, { protocolVersion: 1 });
  ex.report(ctx(0), 0, 1n);
  assert.equal((await ex.shutdown(3000)).clean, true);
  assert.equal(col.connections.length, 1);
  assert.equal(col.connections[0].hello.version, 1);
  assert.equal(col.connections[0].frames.filter((f) => f.type === 'records').length, 1);
  await col.close();
});

test('frames not acknowledged are sent again, in order, after a reconnection', async () => {
  const col = await new FakeCollector({ ack: false }).listen();
  const ex = exporter(col.address);
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  await reportInFrames(ex, 3, 10);
  await until(() => col.records().length === 30, 3000, '30 records');
  assert.deepEqual(col.seqs(col.connections[0]), [1, 2, 3]);
  // The collector dies having made frame 1 durable and lost 2 and 3; it comes back
  // acknowledging again.
  col.held.set(col.connections[0].hello.instanceId, 1n);
  col.ack = true;
  col.kill();
  await until(() => col.connections.length === 2 && ex.status().state === 'connected', 5000, 'reconnected');
  await reportInFrames(ex, 1, 5, 30);
  const s = await ex.shutdown(3000);
  const c = s.counters;
  assert.equal(s.clean, true);
  assert.equal(s.unacknowledged, 0);
  assert.deepEqual([c.reported, c.sent, c.resent, c.evicted, c.lost_unacked, c.send_failed], [35, 35, 20, 0, 0, 0]);
  assert.deepEqual(col.seqs(col.connections[1]), [2, 3, 4], 'frames 2 and 3 again, before any new one');
  assert.deepEqual([...new Set(sequences(col))].sort((a, b) => a - b), Array.from({ length: 35 }, (_, i) => i));
  await col.close();
});

test('shutdown reports what the collector has not acknowledged', async () => {
  const col = await new FakeCollector({ ack: false }).listen();
  const ex = exporter(col.address);
  for (let i = 0; i < 20; i++) ex.report(ctx(i), 0, 1n);
  const s = await ex.shutdown(500);
  assert.equal(s.clean, true, 'Goodbye reached the collector');
  assert.equal(s.unacknowledged, 20);
  assert.equal(s.counters.sent, 20);
  assert.equal(s.counters.send_failed + s.counters.lost_unacked + s.counters.queue_full, 0, 'not lost: it may hold them');
  await col.close();
});

test('while the collector is away records wait numbered, and the bound evicts the oldest', async () => {
  const port = await freePort();
  const col = await new FakeCollector().listen(port);
  // 10 records a frame: 4 + 1 + 8 + 4 + 360 = 377 bytes; the buffer holds two.
  const ex = exporter(col.address, { retentionBytes: 800 });
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  await col.close();
  await until(() => ex.status().state !== 'connected', 3000, 'disconnected');
  await reportInFrames(ex, 6, 10);
  assert.deepEqual([ex.counters.evicted, ex.counters.sent, ex.counters.lost_unacked], [40, 0, 0]);
  assert.ok(ex.retention.footprint()[0] <= 800);
  // A collector holding nothing of this instance: the evicted frames are lost, counted;
  // the two kept are sent.
  const col2 = await new FakeCollector().listen(port);
  await until(() => ex.status().state === 'connected', 5000, 'reconnected');
  const s = await ex.shutdown(3000);
  const c = s.counters;
  assert.equal(s.clean, true);
  assert.deepEqual([c.reported, c.sent, c.resent, c.evicted, c.lost_unacked, c.send_failed], [60, 20, 0, 40, 40, 0]);
  assert.deepEqual(col2.seqs(col2.connections[0]), [5, 6]);
  assert.deepEqual(sequences(col2).sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => 40 + i));
  await col2.close();
});

test('records numbered while away and never sent are send_failed at shutdown', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address);
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  await col.close();
  await until(() => ex.status().state !== 'connected', 3000, 'disconnected');
  await reportInFrames(ex, 2, 10);
  // The exporter's timers do not keep a process alive (Node-RED's own do): this one does.
  const alive = setInterval(() => {}, 1000);
  const s = await ex.shutdown(100);
  clearInterval(alive);
  const c = s.counters;
  assert.equal(s.clean, false);
  assert.deepEqual([c.reported, c.sent, c.send_failed, c.lost_unacked], [20, 0, 20, 0]);
});

// ---------------------------------------------------------------------------------------
// The retention buffer

const frame = (seq, records, size = 100, written = true) => ({ seq, records, data: Buffer.alloc(size), written });

test('retention: acks release frames and the bound evicts the oldest', () => {
  const r = new Retention(250);
  assert.equal(r.push(frame(1, 10)), 0);
  assert.equal(r.push(frame(2, 20)), 0);
  assert.equal(r.push(frame(3, 30)), 10);
  assert.equal(r.unackedRecords(), 50);
  r.ack(2);
  assert.equal(r.unackedRecords(), 30);
  assert.deepEqual(r.kept().map((f) => f.seq), [3]);
  assert.equal(r.resume(3), 0, 'frame 1 was acknowledged after all: not lost');
  assert.equal(r.unackedRecords(), 0);
});

test('retention: evicted frames the collector never held are lost exactly', () => {
  const r = new Retention(250);
  for (let seq = 1; seq <= 6; seq++) r.push(frame(seq, seq * 10));
  assert.equal(r.resume(2), 30 + 40);
  assert.deepEqual(r.kept().map((f) => f.seq), [5, 6]);
  assert.equal(r.acked, 2);
  assert.equal(r.resume(2), 0);
});

test('retention: a long outage stays within the bound and counts every record', () => {
  const bound = 64 * 1024;
  const r = new Retention(bound);
  let dropped = 0;
  let pushed = 0;
  let most = 0;
  for (let seq = 1; seq <= 200000; seq++) {
    dropped += r.push(frame(seq, 3, seq % 1000 === 0 ? bound + 1 : 200, false));
    pushed += 3;
    const [bytes, entries] = r.footprint();
    assert.ok(bytes <= bound);
    most = Math.max(most, entries);
  }
  assert.ok(most <= 1, `${most} entries about evicted frames`);
  const kept = r.unackedRecords();
  assert.equal(dropped + kept, pushed);
  assert.deepEqual(r.evictedUnresolved(), [0, dropped]);
  assert.equal(r.resume(0), dropped);
  assert.deepEqual(r.evictedUnresolved(), [0, 0]);
  assert.equal(r.unackedRecords(), kept);
});

test('retention: an oversized frame written after eviction is not lost if held', () => {
  const r = new Retention(100);
  assert.equal(r.push(frame(1, 5, 500, false)), 5);
  r.markWritten(1);
  assert.deepEqual(r.evictedUnresolved(), [5, 0]);
  assert.equal(r.resume(1), 0);
  assert.equal(r.push(frame(2, 7, 500, false)), 7);
  assert.equal(r.push(frame(3, 1, 10, false)), 0);
  assert.deepEqual(r.evictedUnresolved(), [0, 7]);
  assert.equal(r.resume(1), 7);
});

test('retention: resume below what was acknowledged keeps the lower mark', () => {
  const r = new Retention(1000);
  r.push(frame(1, 1));
  r.ack(1);
  r.push(frame(2, 2));
  assert.equal(r.resume(0), 0);
  assert.deepEqual(r.kept().map((f) => f.seq), [2]);
});
