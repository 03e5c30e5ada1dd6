'use strict';
// The hoptrace nodes in a real Node-RED runtime (node-red-node-test-helper), reporting to
// an in-process collector.

const test = require('node:test');
const assert = require('node:assert/strict');
const helper = require('node-red-node-test-helper');

const hoptraceNode = require('../nodes/hoptrace.js');
const functionNode = require('@node-red/nodes/core/function/10-function.js');
const ctxmod = require('../lib/context');
const { FakeCollector, until } = require('./fake-collector');

helper.init(require.resolve('node-red'));

function ctx(sequence) {
  return {
    publisher: 4, stream: 2, sequence: BigInt(sequence), metricCount: 1,
    intendedNs: 1700000000000000000n, otelTraceId: null,
    stamps: [{ hop: 0, ns: 1700000000000000100n }],
  };
}

/** Collects what the helper node receives. */
function collect(node) {
  const got = [];
  node.on('input', (msg) => got.push(msg));
  return got;
}

test.before(() => new Promise((resolve) => helper.startServer(resolve)));
test.after(() => new Promise((resolve) => helper.stopServer(resolve)));
test.afterEach(() => helper.unload());

function flow(address, { carrier = 'property', extra = {}, fn = 'msg.payload = msg.payload * 2; return msg;' } = {}) {
  return [
    { id: 'c1', type: 'hoptrace-collector', collector: address, process: 'nr-test', queueCapacity: 1000 },
    { id: 'n_in', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier, ...extra, wires: [['fn']] },
    { id: 'fn', type: 'function', func: fn, wires: [['n_out']] },
    { id: 'n_out', type: 'hoptrace', collector: 'c1', hop: 'flow_out', hopId: 2, mode: 'out', carrier, ...extra, wires: [['h']] },
    { id: 'h', type: 'helper' },
  ];
}

test('in -> function -> out: stamps in-band, reports the same stamps, one hello, goodbye on stop', async () => {
  const col = await new FakeCollector().listen();
  await helper.load([hoptraceNode, functionNode], flow(col.address), { c1: { token: '' } });
  const got = collect(helper.getNode('h'));
  const N = 200;
  for (let i = 0; i < N; i++) {
    helper.getNode('n_in').receive({ payload: i, userProperties: { hoptrace: ctxmod.encodeText(ctx(i)), site: 'p7' } });
  }
  await until(() => got.length === N, 5000, 'messages through the flow');
  await until(() => col.records().length === 2 * N, 5000, 'records at the collector');
  const stampsOf = new Map();
  for (const msg of got) {
    const c = ctxmod.decodeText(msg.userProperties.hoptrace);
    assert.equal(msg.hoptrace, msg.userProperties.hoptrace);
    assert.equal(msg.userProperties.site, 'p7');
    assert.equal(msg.payload, Number(c.sequence) * 2);
    assert.deepEqual(c.stamps.map((s) => s.hop), [0, 1, 2]);
    assert.ok(c.stamps[2].ns >= c.stamps[1].ns, 'flow_out after flow_in on one clock');
    const wall = BigInt(Date.now()) * 1000000n;
    assert.ok(c.stamps[1].ns > wall - 10000000000n && c.stamps[1].ns <= wall + 1000000n, 'a CLOCK_REALTIME stamp');
    stampsOf.set(c.sequence, c.stamps);
  }
  for (const r of col.records()) {
    const inBand = stampsOf.get(r.context.sequence).find((s) => s.hop === r.hop);
    assert.equal(r.stampNs, inBand.ns, 'the reported stamp is the in-band stamp');
    assert.equal(r.context.publisher, 4);
  }
  assert.equal(col.connections.length, 1);
  assert.deepEqual(col.connections[0].hello.hops, [[1, 'flow_in'], [2, 'flow_out']]);
  assert.equal(col.connections[0].hello.process, 'nr-test');
  await until(() => col.frames('clock').length >= 1, 3000, 'clock status sent on connect');
  await helper.unload();
  await until(() => col.connections[0].goodbye, 5000, 'goodbye on flow stop');
  const c = col.lastCounters();
  assert.equal(c.reported, BigInt(2 * N));
  assert.equal(c.sent, BigInt(2 * N));
  assert.equal(c.queue_full, 0n);
  assert.equal(c.not_traced, 0n);
  await col.close();
});

test('messages without a context, or with a bad one, pass unchanged and the counts reach the collector', async () => {
  const col = await new FakeCollector().listen();
  await helper.load([hoptraceNode, functionNode], flow(col.address, { fn: 'return msg;' }), { c1: { token: '' } });
  const got = collect(helper.getNode('h'));
  helper.getNode('n_in').receive({ payload: 'plain' });
  helper.getNode('n_in').receive({ payload: 'bad', userProperties: { hoptrace: 'ht1.####' } });
  helper.getNode('n_in').receive({ payload: 'tp', userProperties: { hoptrace: ctxmod.encodeText(ctx(1)), traceparent: 'bogus' } });
  await until(() => got.length === 3, 5000, 'messages');
  assert.deepEqual(got[0].userProperties, undefined);
  assert.equal(got[1].userProperties.hoptrace, 'ht1.####');
  assert.equal(got[1].hoptrace, undefined);
  await helper.unload();
  await until(() => col.connections[0] && col.connections[0].goodbye, 5000, 'goodbye');
  const c = col.lastCounters();
  // plain: not traced at in and at out; bad: bad at in, and still bad (carrier) at out.
  assert.equal(c.not_traced, 2n);
  assert.equal(c.bad_context, 2n);
  assert.equal(c.bad_traceparent, 1n);
  assert.equal(c.reported, 2n);
  await col.close();
});

test('envelope: taken off for the flow, put back with both stamps', async () => {
  const col = await new FakeCollector().listen();
  const nodes = flow(col.address, {
    carrier: 'envelope',
    extra: { payloadAs: 'json' },
    fn: 'msg.payload = { v: msg.payload.v + 1 }; return msg;',
  });
  await helper.load([hoptraceNode, functionNode], nodes, { c1: { token: '' } });
  const got = collect(helper.getNode('h'));
  helper.getNode('n_in').receive({ payload: ctxmod.wrapEnvelope(ctx(7), Buffer.from('{"v":41}')) });
  await until(() => got.length === 1, 5000, 'message');
  const { context, payload } = ctxmod.unwrapEnvelope(got[0].payload);
  assert.equal(payload.toString(), '{"v":42}');
  assert.deepEqual(context.stamps.map((s) => s.hop), [0, 1, 2]);
  await until(() => col.records().length === 2, 5000, 'records');
  await col.close();
});

test('Kafka headers at msg.payload.headers (KafkaJS-style nodes) out to msg.headers', async () => {
  const col = await new FakeCollector().listen();
  const nodes = [
    { id: 'c1', type: 'hoptrace-collector', collector: col.address },
    { id: 'n_in', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'header', headers: 'payload.headers', wires: [['n_out']] },
    { id: 'n_out', type: 'hoptrace', collector: 'c1', hop: 'flow_out', hopId: 2, mode: 'out', carrier: 'header', headers: 'headers', wires: [['h']] },
    { id: 'h', type: 'helper' },
  ];
  await helper.load([hoptraceNode], nodes, { c1: { token: '' } });
  const got = collect(helper.getNode('h'));
  helper.getNode('n_in').receive({ payload: { value: 'x', headers: { hoptrace: ctxmod.encode(ctx(3)) } } });
  await until(() => got.length === 1, 5000, 'message');
  const inPlace = ctxmod.decode(got[0].payload.headers.hoptrace);
  const out = ctxmod.decode(got[0].headers.hoptrace);
  assert.deepEqual(inPlace.stamps.map((s) => s.hop), [0, 1]);
  assert.deepEqual(out.stamps.map((s) => s.hop), [0, 1, 2]);
  await col.close();
});

test('two config nodes for one collector share one connection', async () => {
  const col = await new FakeCollector().listen();
  const nodes = [
    { id: 'c1', type: 'hoptrace-collector', collector: col.address },
    { id: 'c2', type: 'hoptrace-collector', collector: col.address },
    { id: 'a', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [['h']] },
    { id: 'b', type: 'hoptrace', collector: 'c2', hop: 'flow_out', hopId: 2, mode: 'out', carrier: 'property', wires: [['h']] },
    { id: 'h', type: 'helper' },
  ];
  await helper.load([hoptraceNode], nodes, { c1: { token: '' }, c2: { token: '' } });
  await until(() => col.connections.length === 1 && col.connections[0].hello, 5000, 'hello');
  helper.getNode('a').receive({ userProperties: { hoptrace: ctxmod.encodeText(ctx(1)) } });
  helper.getNode('b').receive({ userProperties: { hoptrace: ctxmod.encodeText(ctx(2)) } });
  await until(() => col.records().length === 2, 5000, 'records');
  assert.equal(col.connections.length, 1);
  assert.deepEqual(col.connections[0].hello.hops, [[1, 'flow_in'], [2, 'flow_out']]);
  await helper.unload();
  await until(() => col.connections[0].goodbye, 5000, 'goodbye');
  assert.equal(col.connections.length, 1);
  await col.close();
});

test('a hop id announced twice under two names is refused; its messages pass untouched', async () => {
  const col = await new FakeCollector().listen();
  const nodes = [
    { id: 'c1', type: 'hoptrace-collector', collector: col.address },
    { id: 'a', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [['h']] },
    { id: 'b', type: 'hoptrace', collector: 'c1', hop: 'other', hopId: 1, mode: 'in', carrier: 'property', wires: [['h']] },
    { id: 'h', type: 'helper' },
  ];
  await helper.load([hoptraceNode], nodes, { c1: { token: '' } });
  const got = collect(helper.getNode('h'));
  const text = ctxmod.encodeText(ctx(1));
  helper.getNode('b').receive({ userProperties: { hoptrace: text } });
  await until(() => got.length === 1, 5000, 'message');
  assert.equal(got[0].userProperties.hoptrace, text);
  await until(() => col.connections.length === 1 && col.connections[0].hello, 5000, 'hello');
  assert.deepEqual(col.connections[0].hello.hops, [[1, 'flow_in']]);
  await col.close();
});

test('a message the probe cannot write to still passes on', async () => {
  const col = await new FakeCollector().listen();
  const nodes = [
    { id: 'c1', type: 'hoptrace-collector', collector: col.address },
    { id: 'a', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [['h']] },
    { id: 'h', type: 'helper' },
  ];
  await helper.load([hoptraceNode], nodes, { c1: { token: '' } });
  const got = collect(helper.getNode('h'));
  const text = ctxmod.encodeText(ctx(1));
  // Writing the stamped context into a frozen object throws: the message must go on
  // unchanged (the helper hands it to the node as it is, without a clone).
  helper.getNode('a').receive({ payload: 1, userProperties: Object.freeze({ hoptrace: text }) });
  helper.getNode('a').receive({ payload: 2, userProperties: { hoptrace: text } });
  await until(() => got.length === 2, 5000, 'messages');
  assert.equal(got[0].payload, 1);
  assert.equal(got[0].userProperties.hoptrace, text);
  assert.equal(ctxmod.decodeText(got[1].userProperties.hoptrace).stamps.length, 2);
  await col.close();
});

test('a redeploy says Goodbye with the final counters; a node-only deploy keeps the connection', async () => {
  const col = await new FakeCollector().listen();
  const base = [
    { id: 'c1', type: 'hoptrace-collector', collector: col.address },
    { id: 'a', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [['h']] },
    { id: 'h', type: 'helper' },
  ];
  await helper.load([hoptraceNode], base, { c1: { token: '' } });
  await until(() => col.connections.length === 1 && col.connections[0].hello, 5000, 'hello');
  helper.getNode('a').receive({ userProperties: { hoptrace: ctxmod.encodeText(ctx(1)) } });
  await until(() => col.records().length === 1, 5000, 'record');
  // A node-only deploy of a changed hoptrace node with a hop the connection announced:
  // the config node stays, so does the connection.
  const renamed = base.map((n) => (n.id === 'a' ? { ...n, name: 'renamed' } : n));
  await helper.setFlows(renamed, 'nodes', { c1: { token: '' } });
  helper.getNode('a').receive({ userProperties: { hoptrace: ctxmod.encodeText(ctx(2)) } });
  await until(() => col.records().length === 2, 5000, 'record after the node deploy');
  assert.equal(col.connections.length, 1);
  // A full deploy restarts everything: Goodbye, then a new connection.
  await helper.setFlows(renamed, 'full', { c1: { token: '' } });
  await until(() => col.connections[0].goodbye, 5000, 'goodbye on redeploy');
  const c = col.lastCounters(col.connections[0]);
  assert.equal(c.reported, 2n);
  assert.equal(c.sent, 2n);
  await until(() => col.connections.length === 2 && col.connections[1].hello, 5000, 'a new hello');
  assert.notEqual(col.connections[1].hello.instanceId, col.connections[0].hello.instanceId);
  await col.close();
});

test('the collector node passes its Queue and Retention bounds to the exporter', async () => {
  const col = await new FakeCollector().listen();
  const nodes = (extra) => [
    { id: 'c1', type: 'hoptrace-collector', collector: col.address, ...extra },
    { id: 'a', type: 'hoptrace', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [[]] },
  ];
  await helper.load([hoptraceNode], nodes({ queueCapacity: 500, retentionMiB: 2 }), { c1: { token: '' } });
  let ex = helper.getNode('c1').entry.exporter;
  assert.deepEqual([ex.ring.capacity, ex.retention.maxBytes], [500, 2 << 20]);
  await helper.unload();
  // A flow saved before the setting existed gets the defaults.
  await helper.load([hoptraceNode], nodes({}), { c1: { token: '' } });
  ex = helper.getNode('c1').entry.exporter;
  assert.deepEqual([ex.ring.capacity, ex.retention.maxBytes], [65536, 64 << 20]);
  await col.close();
});
