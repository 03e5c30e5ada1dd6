'use strict';
// Carriers as Node-RED messages hold them, and one hop's stamp/report/pass-on.

const test = require('node:test');
const assert = require('node:assert/strict');

const ctxmod = require('../lib/context');
const carriers = require('../lib/carriers');
const traceparent = require('../lib/traceparent');
const { HopStamper } = require('../lib/hop');

const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const TP_ID = '4bf92f3577b34da6a3ce929d0e0e4736';

function ctx(sequence = 3n, stamps = [{ hop: 0, ns: 1700000000000001000n }]) {
  return {
    publisher: 1, stream: 2, sequence, metricCount: 50, intendedNs: 1700000000000000000n,
    otelTraceId: null, stamps,
  };
}

/** An exporter that keeps what it is given. */
function recorder() {
  const r = { records: [], counts: {} };
  r.reportBinary = (bin, hop, ns) => {
    r.records.push({ ctx: ctxmod.decode(bin), hop, ns });
    return true;
  };
  r.count = (name) => { r.counts[name] = (r.counts[name] || 0) + 1; };
  return r;
}

function fixedClock(ns) {
  return { nowNs: () => ns };
}

test('traceparent: version 00 only, lower-case hex, no zero ids', () => {
  assert.equal(traceparent.parse(TP).traceId.toString('hex'), TP_ID);
  assert.equal(traceparent.parse(Buffer.from(TP)).traceId.toString('hex'), TP_ID);
  assert.equal(traceparent.parse(TP.toUpperCase()).error, 'malformed');
  assert.equal(traceparent.parse(TP + ' ').error, 'malformed');
  assert.equal(traceparent.parse('01' + TP.slice(2)).error, 'unsupported_version');
  assert.equal(traceparent.parse('00-' + '0'.repeat(32) + TP.slice(35)).error, 'zero_id');
  assert.equal(traceparent.parse(TP.slice(0, 36) + '0'.repeat(16) + '-01').error, 'zero_id');
  assert.equal(traceparent.parse(TP.slice(0, 53) + 'ff').traceId.toString('hex'), TP_ID);
  assert.equal(traceparent.parse(42).error, 'malformed');
});

test('user property: the last value wins, as MQTT.js and mqtt-in give repeated ones', () => {
  const a = ctxmod.encodeText(ctx(1n));
  const b = ctxmod.encodeText(ctx(2n));
  const p = carriers.property;
  assert.equal(p.extract({ userProperties: { hoptrace: b } }).context.sequence, 2n);
  assert.equal(p.extract({ userProperties: { hoptrace: [a, b] } }).context.sequence, 2n);
  // Node-RED's mqtt in turns a repeated property into the JSON text of the array.
  assert.equal(p.extract({ userProperties: { hoptrace: JSON.stringify([a, b]) } }).context.sequence, 2n);
  // A last value that fails is an error: no falling back to an earlier one.
  const r = p.extract({ userProperties: { hoptrace: [a, 'ht1.AAAA'] } });
  assert.equal(r.kind, 'bad_context');
  assert.equal(r.error.code, 'truncated');
  assert.equal(p.extract({ userProperties: { hoptrace: 'ht2.AAAA' } }).error.code, 'bad_text_prefix');
  assert.equal(p.extract({ userProperties: { Hoptrace: a } }).kind, 'not_traced');
  assert.equal(p.extract({ userProperties: { other: 'x' } }).kind, 'not_traced');
  assert.equal(p.extract({}).kind, 'not_traced');
  assert.equal(p.extract({ userProperties: { hoptrace: 5 } }).kind, 'bad_context');
});

test('user property: a traceparent lends its trace id, and a bad one is reported', () => {
  const p = carriers.property;
  const text = ctxmod.encodeText(ctx());
  const ok = p.extract({ userProperties: { hoptrace: text, traceparent: TP } });
  assert.equal(ok.context.otelTraceId.toString('hex'), TP_ID);
  assert.equal(ok.badTraceparent, null);
  const last = p.extract({ userProperties: { hoptrace: text, traceparent: ['00-x', TP] } });
  assert.equal(last.context.otelTraceId.toString('hex'), TP_ID);
  const bad = p.extract({ userProperties: { hoptrace: text, traceparent: 'nonsense' } });
  assert.equal(bad.badTraceparent, 'malformed');
  assert.equal(bad.context.otelTraceId, null);
  // A context with its own trace id keeps it, and a bad traceparent is still reported.
  const own = ctx();
  own.otelTraceId = Buffer.alloc(16, 7);
  const kept = p.extract({ userProperties: { hoptrace: ctxmod.encodeText(own), traceparent: TP } });
  assert.equal(kept.context.otelTraceId.toString('hex'), '07'.repeat(16));
  const keptBad = p.extract({ userProperties: { hoptrace: ctxmod.encodeText(own), traceparent: '01' + TP.slice(2) } });
  assert.equal(keptBad.badTraceparent, 'unsupported_version');
});

test('Kafka headers: object, record list and one-key list shapes; last wins', () => {
  const h = carriers.header('headers');
  const a = ctxmod.encode(ctx(1n));
  const b = ctxmod.encode(ctx(2n));
  assert.equal(h.extract({ headers: { hoptrace: b } }).context.sequence, 2n);
  assert.equal(h.extract({ headers: { hoptrace: [a, b] } }).context.sequence, 2n);
  assert.equal(h.extract({ headers: [{ key: 'hoptrace', value: a }, { key: 'x', value: 'y' }, { key: 'hoptrace', value: b }] }).context.sequence, 2n);
  assert.equal(h.extract({ headers: [{ hoptrace: a }, { hoptrace: b }] }).context.sequence, 2n);
  assert.equal(h.extract({ headers: { hoptrace: { type: 'Buffer', data: [...b] } } }).context.sequence, 2n);
  assert.equal(h.extract({ headers: { hoptrace: new Uint8Array(b) } }).context.sequence, 2n);
  // A binary header turned into text by a Kafka node has lost bytes: refused, counted.
  const text = h.extract({ headers: { hoptrace: b.toString('utf8') } });
  assert.equal(text.kind, 'bad_context');
  // A text form in a Kafka header is decoded by the binary rules and fails them.
  assert.equal(h.extract({ headers: { hoptrace: ctxmod.encodeText(ctx()) } }).kind, 'bad_context');
  assert.equal(h.extract({ headers: { hoptrace: null } }).error.code, 'truncated');
  assert.equal(h.extract({ headers: {} }).kind, 'not_traced');
  assert.equal(h.extract({}).kind, 'not_traced');
  // Records as some Kafka nodes deliver them: the whole record in the payload.
  const nested = carriers.header('msg.payload.headers');
  assert.equal(nested.extract({ payload: { headers: { hoptrace: b, traceparent: Buffer.from(TP) } } }).context.otelTraceId.toString('hex'), TP_ID);
});

test('Kafka headers: inject replaces the header in the shape found', () => {
  const h = carriers.header();
  const c = ctx(9n);
  const bin = ctxmod.encode(c);
  const m1 = {};
  h.inject(m1, c);
  assert.deepEqual(m1.headers, { hoptrace: bin });
  const m2 = { headers: { a: 'b', hoptrace: [Buffer.from('x')] } };
  h.inject(m2, c);
  assert.deepEqual(m2.headers, { a: 'b', hoptrace: bin });
  const m3 = { headers: [{ key: 'hoptrace', value: 'old' }, { key: 'a', value: 'b' }] };
  h.inject(m3, c);
  assert.deepEqual(m3.headers, [{ key: 'a', value: 'b' }, { key: 'hoptrace', value: bin }]);
  const m4 = { headers: [{ hoptrace: 'old' }, { a: 'b' }] };
  h.inject(m4, c);
  assert.deepEqual(m4.headers, [{ a: 'b' }, { hoptrace: bin }]);
});

test('envelope: only a Buffer payload starting with the magic', () => {
  const e = carriers.envelope;
  const env = ctxmod.wrapEnvelope(ctx(), Buffer.from('{"v":1}'));
  const got = e.extract({ payload: env });
  assert.equal(got.kind, 'ok');
  assert.equal(got.payload.toString(), '{"v":1}');
  assert.equal(e.extract({ payload: '{"v":1}' }).kind, 'not_traced');
  assert.equal(e.extract({ payload: Buffer.from([0xff, 0x48]) }).kind, 'not_traced');
  assert.equal(e.extract({ payload: Buffer.from([0xff, 0x48, 0x54, 0x31]) }).error.code, 'truncated');
  assert.equal(e.extract({ payload: { v: 1 } }).kind, 'not_traced');
  const m = { payload: { v: 1 } };
  e.inject(m, ctx());
  const back = ctxmod.unwrapEnvelope(m.payload);
  assert.equal(back.payload.toString(), '{"v":1}');
});

test('hop in (property): stamps in-band, reports the same stamp, leaves msg.hoptrace', () => {
  const ex = recorder();
  const hop = new HopStamper({ exporter: ex, clock: fixedClock(1700000000000005000n), hopId: 1, mode: 'in', carrier: 'property' });
  const msg = { payload: 'x', userProperties: { site: 'a', hoptrace: ctxmod.encodeText(ctx()) } };
  assert.equal(hop.process(msg), 'stamped');
  const after = ctxmod.decodeText(msg.userProperties.hoptrace);
  assert.deepEqual(after.stamps.map((s) => [s.hop, s.ns]), [[0, 1700000000000001000n], [1, 1700000000000005000n]]);
  assert.equal(msg.hoptrace, msg.userProperties.hoptrace);
  assert.equal(msg.userProperties.site, 'a');
  assert.equal(ex.records.length, 1);
  assert.equal(ex.records[0].hop, 1);
  assert.equal(ex.records[0].ns, 1700000000000005000n);
  assert.equal(ex.records[0].ctx.sequence, 3n);
});

test('hop: messages without a context, or with a bad one, pass unchanged and are counted', () => {
  const ex = recorder();
  const hop = new HopStamper({ exporter: ex, clock: fixedClock(1n), hopId: 1, mode: 'in', carrier: 'property' });
  const plain = { payload: 'x' };
  assert.equal(hop.process(plain), 'not_traced');
  assert.deepEqual(plain, { payload: 'x' });
  const broken = { payload: 'x', userProperties: { hoptrace: 'ht1.A' } };
  assert.equal(hop.process(broken), 'bad_context');
  assert.deepEqual(broken, { payload: 'x', userProperties: { hoptrace: 'ht1.A' } });
  assert.deepEqual(ex.counts, { not_traced: 1, bad_context: 1 });
  assert.equal(ex.records.length, 0);
});

test('hop: a full context is reported but not stamped in-band (stamps_full)', () => {
  const ex = recorder();
  const hop = new HopStamper({ exporter: ex, clock: fixedClock(99n), hopId: 5, mode: 'in', carrier: 'property' });
  const full = ctx(3n, Array.from({ length: 16 }, (_, i) => ({ hop: 0, ns: BigInt(i) })));
  const text = ctxmod.encodeText(full);
  const msg = { userProperties: { hoptrace: text } };
  assert.equal(hop.process(msg), 'stamped');
  assert.equal(msg.userProperties.hoptrace, text);
  assert.deepEqual(ex.counts, { stamps_full: 1 });
  assert.equal(ex.records[0].ns, 99n);
  assert.equal(ex.records[0].hop, 5);
});

test('hop: a lent trace id travels on (bit 7 set) and a bad traceparent is counted', () => {
  const ex = recorder();
  const hop = new HopStamper({ exporter: ex, clock: fixedClock(7n), hopId: 1, mode: 'in', carrier: 'property' });
  const msg = { userProperties: { hoptrace: ctxmod.encodeText(ctx()), traceparent: TP } };
  hop.process(msg);
  const bin = Buffer.from(msg.hoptrace.slice(4), 'base64url');
  assert.equal(bin[1] & 0x80, 0x80);
  assert.equal(ex.records[0].ctx.otelTraceId.toString('hex'), TP_ID);
  hop.process({ userProperties: { hoptrace: ctxmod.encodeText(ctx()), traceparent: 'x' } });
  assert.deepEqual(ex.counts, { bad_traceparent: 1 });
});

test('hop envelope in -> function -> out: the payload is unwrapped, then wrapped again', () => {
  const ex = recorder();
  let now = 100n;
  const clock = { nowNs: () => now };
  const hin = new HopStamper({ exporter: ex, clock, hopId: 1, mode: 'in', carrier: 'envelope', payloadAs: 'json' });
  const hout = new HopStamper({ exporter: ex, clock, hopId: 2, mode: 'out', carrier: 'envelope' });
  const msg = { payload: ctxmod.wrapEnvelope(ctx(), Buffer.from('{"v":21.5}')) };
  hin.process(msg);
  assert.deepEqual(msg.payload, { v: 21.5 });
  msg.payload = { v: msg.payload.v * 2 }; // what a function node does
  now = 250n;
  hout.process(msg);
  const { context, payload } = ctxmod.unwrapEnvelope(msg.payload);
  assert.equal(payload.toString(), '{"v":43}');
  assert.deepEqual(context.stamps.map((s) => [s.hop, s.ns]), [[0, 1700000000000001000n], [1, 100n], [2, 250n]]);
  assert.deepEqual(ex.records.map((r) => [r.hop, r.ns]), [[1, 100n], [2, 250n]]);
});

test('hop out without an in node: reads the carrier; an envelope is replaced, never nested', () => {
  const ex = recorder();
  const out = new HopStamper({ exporter: ex, clock: fixedClock(5n), hopId: 2, mode: 'out', carrier: 'envelope' });
  const msg = { payload: ctxmod.wrapEnvelope(ctx(), Buffer.from('abc')) };
  out.process(msg);
  const u = ctxmod.unwrapEnvelope(msg.payload);
  assert.equal(u.payload.toString(), 'abc');
  assert.equal(u.context.stamps.length, 2);
  // msg.hoptrace set by an in node and the envelope still on the payload: one envelope.
  const msg2 = { payload: ctxmod.wrapEnvelope(ctx(), Buffer.from('abc')), hoptrace: ctxmod.encodeText(ctx(8n)) };
  out.process(msg2);
  const u2 = ctxmod.unwrapEnvelope(msg2.payload);
  assert.equal(u2.payload.toString(), 'abc');
  assert.equal(u2.context.sequence, 8n);
});

test('hop header out: msg.hoptrace from upstream goes into the Kafka headers', () => {
  const ex = recorder();
  const out = new HopStamper({ exporter: ex, clock: fixedClock(5n), hopId: 2, mode: 'out', carrier: 'header' });
  const msg = { payload: 'p', hoptrace: ctxmod.encodeText(ctx(4n)) };
  out.process(msg);
  const c = ctxmod.decode(msg.headers.hoptrace);
  assert.equal(c.sequence, 4n);
  assert.deepEqual(c.stamps.at(-1), { hop: 2, ns: 5n });
  const bad = { hoptrace: 'nonsense' };
  assert.equal(out.process(bad), 'bad_context');
});
