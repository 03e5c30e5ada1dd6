'use strict';
// The outage host's flow and its generator/sink (outage/), with an injected clock: the
// flow with and without the hoptrace node, the open-loop schedule, the contexts the
// hoptrace node reads, the per-second lines and the bound on messages in flight.

const test = require('node:test');
const assert = require('node:assert/strict');

const ctxmod = require('../lib/context');
const carriers = require('../lib/carriers');
const { flow } = require('../outage/flow');
const { Host, bucketOf } = require('../outage/host');

const START_NS = 5_000_000_000n;
const REALTIME_MS = 1_700_000_000_000;

/** A Host on a clock the test moves; its lines in `lines`. */
function host(rate, streams, durationS) {
  const clock = { ns: START_NS };
  const lines = [];
  let drained = 0;
  const h = new Host({
    rate,
    streams,
    durationS,
    print: (line) => lines.push(JSON.parse(line)),
    monoNs: () => clock.ns,
    realtimeMs: () => REALTIME_MS,
    onDrained: () => { drained += 1; },
    atExit: false,
  });
  return { h, clock, lines, drained: () => drained };
}

test('the flow differs only by the hoptrace node and its collector', () => {
  const probed = flow('127.0.0.1:7400');
  const plain = flow(null);
  const byId = (nodes) => Object.fromEntries(nodes.map((n) => [n.id, n]));
  const p = byId(probed);
  const hop = probed.find((n) => n.type === 'hoptrace');
  const config = probed.find((n) => n.type === 'hoptrace-collector');
  assert.deepEqual(
    { hop: hop.hop, hopId: hop.hopId, mode: hop.mode, carrier: hop.carrier, collector: hop.collector },
    { hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', collector: config.id },
  );
  assert.equal(config.collector, '127.0.0.1:7400');
  const generator = probed.find((n) => n.name === 'generator');
  const sink = probed.find((n) => n.name === 'sink');
  assert.deepEqual(generator.wires, [[hop.id]]);
  assert.deepEqual(hop.wires, [[sink.id]]);
  assert.deepEqual(p[probed.find((n) => n.type === 'inject').id].wires, [[generator.id]]);

  assert.ok(!plain.some((n) => n.type.startsWith('hoptrace')));
  const plainGenerator = plain.find((n) => n.name === 'generator');
  assert.deepEqual(plainGenerator.wires, [[sink.id]]);
  const rest = (nodes) => nodes.filter((n) => !n.type.startsWith('hoptrace'))
    .map((n) => (n.name === 'generator' ? { ...n, wires: null } : n));
  assert.deepEqual(rest(plain), rest(probed));
});

test('bucket index: floor(128 * log2(max(ns, 1)))', () => {
  assert.equal(bucketOf(0), 0);
  assert.equal(bucketOf(1), 0);
  assert.equal(bucketOf(2), 128);
  assert.equal(bucketOf(1024), 1280);
  assert.equal(bucketOf(1500), Math.floor(128 * Math.log2(1500)));
});

test('open-loop schedule, fresh contexts the hoptrace node reads, lines, drain', () => {
  const { h, clock, lines, drained } = host(1000, 3, 0.01);
  const sent = [];
  const send = (m) => sent.push(m);
  assert.equal(h.start(), true);
  assert.equal(h.start(), false, 'started once');
  assert.equal(h.tick(send), true);
  assert.equal(sent.length, 1, 'message 0 is due at the start');
  clock.ns += 5_500_000n;
  h.tick(send);
  assert.equal(sent.length, 6);
  clock.ns += 100_000_000n;
  assert.equal(h.tick(send), false, 'the generator stops after the duration');
  assert.equal(sent.length, 10, 'rate x duration messages');
  assert.equal(h.tick(send), false);
  assert.equal(sent.length, 10);

  const seen = new Set();
  sent.forEach((m, k) => {
    const got = carriers.property.extract(m);
    assert.equal(got.kind, 'ok');
    const c = got.context;
    assert.equal(c.publisher, 1);
    assert.equal(c.stream, k % 3);
    assert.equal(c.sequence, BigInt(Math.floor(k / 3)));
    assert.equal(c.intendedNs, BigInt(REALTIME_MS) * 1_000_000n + BigInt(k) * 1_000_000n);
    assert.deepEqual(c.stamps, []);
    seen.add(m.userProperties.hoptrace);
    assert.equal(typeof m.send_mono_ns, 'bigint');
  });
  assert.equal(seen.size, 10, 'a context per message');
  assert.ok(ctxmod.decodeText(sent[0].userProperties.hoptrace));

  // Eight arrive 1500 ns after their send, one 3000 ns after.
  clock.ns += 1500n;
  for (const m of sent.slice(0, 8)) h.arrive({ ...m, send_mono_ns: clock.ns - 1500n });
  h.arrive({ ...sent[8], send_mono_ns: clock.ns - 3000n });
  assert.deepEqual(lines[0], { ready: true, pid: process.pid });
  assert.equal(h.second(), true, 'one message still in flight');
  assert.equal(drained(), 0);
  const line = lines[1];
  assert.equal(line.n, 9);
  assert.equal(line.max_ns, 3000);
  assert.deepEqual(line.h, [[bucketOf(1500), 8], [bucketOf(3000), 1]]);
  assert.equal(line.sent, 10);
  assert.equal(line.shed, 0);
  assert.equal(line.in_flight, 1);
  assert.equal(typeof line.loop_p999_ns, 'number');
  assert.equal(line.probe, undefined, 'no probe field without the hoptrace node');

  h.arrive({ ...sent[9], send_mono_ns: clock.ns - 2000n });
  assert.equal(h.second(), false, 'drained: done');
  assert.equal(drained(), 1);
  assert.deepEqual(lines[2].h, [[bucketOf(2000), 1]], 'the histogram is emptied every second');
  assert.equal(h.second(), false);
  assert.equal(lines.length, 3);
  h.endLine();
  h.endLine();
  assert.equal(lines.length, 4, 'one end line');
  assert.equal(lines[3].end, true);
  assert.equal(lines[3].sent, 10);
  assert.equal(lines[3].received, 10);
  assert.equal(lines[3].shed, 0);
});

test('at most one second of messages in flight; the rest is counted as shed', () => {
  const { h, clock, lines, drained } = host(1000, 2, 5);
  let sent = 0;
  h.start();
  clock.ns += 1_999_000_000n;
  h.tick(() => { sent += 1; });
  assert.equal(sent, 1000);
  assert.equal(h.shed, 1000);
  h.second();
  assert.equal(lines[0].shed, 1000);
  assert.equal(lines[0].gen_lag_max_ns, 1_999_000_000);
  // Nothing arrives; after the duration and 5 s more the host gives up waiting.
  clock.ns += 10_000_000_000n;
  h.tick(() => { sent += 1; });
  assert.equal(h.second(), true);
  clock.ns += 5_000_000_000n;
  assert.equal(h.second(), false);
  assert.equal(drained(), 1);
  h.endLine();
  assert.deepEqual(lines.at(-1), { end: true, t: 16.999, sent: 1000, received: 0, shed: 4000 });
});
