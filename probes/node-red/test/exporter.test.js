'use strict';
// The exporter against an in-process collector: the conversation, the bounded queue
// that never blocks, reconnects, and the counters adding up.

const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');

const { Exporter } = require('../lib/exporter');
const { FakeCollector, until } = require('./fake-collector');

const clock = { nowNs: () => BigInt(Date.now()) * 1000000n };
const clockStatus = {
  read: async () => ({
    atNs: clock.nowNs(), source: 4, synced: true, leap: 0, offsetNs: 0n, errorBoundNs: 1234n, detail: 'injected',
  }),
};

function ctx(sequence) {
  return {
    publisher: 9, stream: 1, sequence: BigInt(sequence), metricCount: 1, intendedNs: 1700000000000000000n,
    otelTraceId: null, stamps: [],
  };
}

function exporter(address, extra = {}) {
  return new Exporter({
    collector: address, clock, clockStatus, process: 'test', backoffMinMs: 20, backoffMaxMs: 100,
    connectTimeoutMs: 500, ...extra,
  });
}

async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

/** reported = sent + queue_full + send_failed, once nothing is queued. */
function assertAddsUp(c) {
  assert.equal(c.reported, c.sent + c.queue_full + c.send_failed, JSON.stringify(c));
}

test('hello, clock, records and a clean goodbye with the final counters', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address, { host: 'probe-host' });
  ex.setHops([[1, 'flow_in'], [2, 'flow_out']]);
  ex.start();
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  assert.equal(ex.status().runId, 'test-run');
  for (let i = 0; i < 1000; i++) ex.report(ctx(i), 1 + (i % 2), 1700000000000000000n + BigInt(i));
  const summary = await ex.shutdown(3000);
  assert.equal(summary.clean, true);
  await until(() => col.connections[0].closed, 3000, 'close');
  const conn = col.connections[0];
  assert.equal(conn.error, null);
  assert.deepEqual(conn.hello.hops, [[1, 'flow_in'], [2, 'flow_out']]);
  assert.equal(conn.hello.host, 'probe-host');
  assert.equal(conn.hello.process, 'test');
  assert.match(conn.hello.software, /^node-red-contrib-hoptrace \d/);
  assert.equal(typeof conn.hello.instanceId, 'bigint');
  const clocks = col.frames('clock');
  assert.ok(clocks.length >= 1);
  assert.equal(clocks[0].errorBoundNs, 1234n);
  const recs = col.records();
  assert.equal(recs.length, 1000);
  recs.forEach((r, i) => {
    assert.equal(r.context.sequence, BigInt(i));
    assert.equal(r.hop, 1 + (i % 2));
    assert.equal(r.stampNs, 1700000000000000000n + BigInt(i));
  });
  // The last two frames: final Counters, then Goodbye.
  const types = conn.frames.map((f) => f.type);
  assert.deepEqual(types.slice(-2), ['counters', 'goodbye']);
  const c = col.lastCounters();
  assert.equal(c.reported, 1000n);
  assert.equal(c.sent, 1000n);
  assert.equal(c.queue_full, 0n);
  assert.equal(c.send_failed, 0n);
  assertAddsUp(summary.counters);
  await col.close();
});

test('an unreachable collector: report() never waits, overflow is counted and reported later', async () => {
  const port = await freePort();
  const ex = exporter(`127.0.0.1:${port}`, { queueCapacity: 100 });
  ex.setHops([[3, 'store_in']]);
  ex.start();
  const t0 = process.hrtime.bigint();
  let dropped = 0;
  for (let i = 0; i < 10000; i++) if (!ex.report(ctx(i), 3, BigInt(i))) dropped++;
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  assert.ok(ms < 500, `10,000 reports took ${ms} ms`);
  assert.equal(dropped, 9900);
  assert.equal(ex.snapshot().queue_full, 9900);
  await new Promise((r) => setTimeout(r, 150));
  assert.notEqual(ex.status().state, 'connected');
  assert.ok(ex.status().lastError);
  const col = await new FakeCollector().listen(port);
  await until(() => col.records().length === 100, 5000, 'queued records after the collector came up');
  await ex.shutdown(3000);
  const c = col.lastCounters();
  assert.equal(c.queue_full, 9900n);
  assert.equal(c.reported, 10000n);
  assert.equal(c.sent, 100n);
  assert.equal(c.reconnects, 0n, 'the first successful connection is not a reconnect');
  assertAddsUp(ex.snapshot());
  await col.close();
});

test('a stalled collector: the queue fills, nothing blocks, every record is accounted for', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address, { queueCapacity: 2000, maxBatch: 500 });
  ex.setHops([[1, 'flow_in']]);
  ex.start();
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  col.stall();
  // Enough to fill the socket buffers on both sides, then the ring.
  const N = 400000;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < N; i++) {
    ex.report(ctx(i), 1, BigInt(i));
    if (i % 5000 === 0) await new Promise((r) => setImmediate(r));
  }
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  const stalled = ex.snapshot();
  assert.ok(stalled.queue_full > 0, 'the stall filled the queue');
  assert.ok(ms < 20000, `reports took ${ms} ms`);
  col.resume();
  const summary = await ex.shutdown(10000);
  assert.equal(summary.clean, true);
  await until(() => col.connections[0].goodbye, 3000, 'goodbye');
  const c = col.lastCounters();
  assert.equal(c.reported, BigInt(N));
  assert.equal(c.send_failed, 0n);
  assert.equal(Number(c.sent), col.records().length, 'sent is what the collector received');
  assert.equal(c.sent + c.queue_full, BigInt(N));
  await col.close();
});

test('a dropped connection: reconnect with backoff, counted; later records delivered', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address);
  ex.setHops([[1, 'flow_in']]);
  ex.start();
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  for (let i = 0; i < 10; i++) ex.report(ctx(i), 1, BigInt(i));
  await until(() => col.records().length === 10, 3000, 'first records');
  col.kill();
  await until(() => col.connections.length === 2 && ex.status().state === 'connected', 3000, 'reconnect');
  for (let i = 10; i < 20; i++) ex.report(ctx(i), 1, BigInt(i));
  await ex.shutdown(3000);
  await until(() => col.connections[1].goodbye, 3000, 'goodbye');
  assert.deepEqual(col.records().map((r) => Number(r.context.sequence)), [...Array(20).keys()]);
  const c = col.lastCounters();
  assert.equal(c.reconnects, 1n);
  assert.equal(c.sent, 20n);
  assertAddsUp(ex.snapshot());
  await col.close();
});

test('a rejecting collector: the reason is kept, connections are retried with backoff', async () => {
  const col = await new FakeCollector({ reject: { code: 3, reason: 'hop "x" is not declared' } }).listen();
  const ex = exporter(col.address, { backoffMinMs: 20, backoffMaxMs: 80 });
  ex.setHops([[9, 'x']]);
  ex.start();
  await until(() => col.connections.length >= 3, 3000, 'retries');
  assert.match(ex.status().lastError, /rejected this probe \(code 3\): hop "x" is not declared/);
  ex.report(ctx(1), 9, 1n);
  const s = await ex.shutdown(200);
  assert.equal(s.clean, false);
  assert.equal(s.counters.send_failed, 1);
  assertAddsUp(s.counters);
  await col.close();
});

test('a hop added while connected: flush, goodbye, and a new hello listing it', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address);
  ex.setHops([[1, 'flow_in']]);
  ex.start();
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  ex.report(ctx(1), 1, 1n);
  ex.setHops([[1, 'flow_in'], [2, 'flow_out']]);
  await until(() => col.connections.length === 2 && ex.status().state === 'connected', 3000, 'second hello');
  ex.report(ctx(1), 2, 2n);
  await ex.shutdown(3000);
  await until(() => col.connections[1].goodbye, 3000, 'goodbye');
  assert.equal(col.connections[0].goodbye, true);
  assert.deepEqual(col.connections[0].hello.hops, [[1, 'flow_in']]);
  assert.deepEqual(col.connections[1].hello.hops, [[1, 'flow_in'], [2, 'flow_out']]);
  assert.equal(col.connections[1].hello.instanceId, col.connections[0].hello.instanceId);
  assert.deepEqual(col.records().map((r) => r.hop), [1, 2]);
  // A hop that goes away changes nothing until the next connection.
  await col.close();
});

test('reports after shutdown are counted as send_failed', async () => {
  const col = await new FakeCollector().listen();
  const ex = exporter(col.address);
  ex.setHops([[1, 'flow_in']]);
  ex.start();
  await until(() => ex.status().state === 'connected', 3000, 'welcome');
  await ex.shutdown(3000);
  assert.equal(ex.report(ctx(1), 1, 1n), false);
  assert.deepEqual([ex.snapshot().reported, ex.snapshot().send_failed], [1, 1]);
  await col.close();
});

test('TLS: records reach a TLS collector; a wrong name or plain TCP does not connect', async (t) => {
  const { selfSignedCert } = require('./fake-collector');
  const cert = selfSignedCert();
  if (!cert) {
    t.skip('openssl is not installed');
    return;
  }
  const col = await new FakeCollector({ tls: cert }).listen();
  const ex = exporter(col.address, { tlsCa: cert.cert });
  ex.setHops([[1, 'flow_in']]);
  ex.start();
  await until(() => ex.status().state === 'connected', 3000, 'welcome over TLS');
  ex.report(ctx(5), 1, 5n);
  assert.equal((await ex.shutdown(3000)).clean, true);
  assert.deepEqual(col.records().map((r) => r.context.sequence), [5n]);
  // The certificate names collector.test, not collector.example.
  const wrongName = exporter(col.address, { tlsCa: cert.cert, tlsServerName: 'collector.example' });
  wrongName.setHops([[1, 'flow_in']]);
  wrongName.start();
  await until(() => wrongName.status().lastError, 3000, 'a TLS error');
  assert.match(wrongName.status().lastError, /collector\.example/);
  const named = exporter(col.address, { tlsCa: cert.cert, tlsServerName: 'collector.test' });
  named.setHops([[1, 'flow_in']]);
  named.start();
  await until(() => named.status().state === 'connected', 3000, 'welcome with the right name');
  const plain = exporter(col.address);
  plain.setHops([[1, 'flow_in']]);
  plain.start();
  await new Promise((r) => setTimeout(r, 300));
  assert.notEqual(plain.status().state, 'connected');
  await Promise.all([wrongName.shutdown(100), named.shutdown(1000), plain.shutdown(100)]);
  await col.close();
  require('node:fs').rmSync(cert.dir, { recursive: true });
});
