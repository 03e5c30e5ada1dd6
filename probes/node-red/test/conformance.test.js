'use strict';
// Every vector of probe/testdata/trace-vectors.json: each valid context encodes to its
// binary, text and envelope forms and decodes back from each; each invalid input is
// refused with exactly the error the vector names.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const ctxmod = require('../lib/context');
const { parse } = require('./exact-json');

const VECTORS = path.resolve(__dirname, '../../../probe/testdata/trace-vectors.json');
const vectors = parse(fs.readFileSync(VECTORS, 'utf8'));

/** A vector's context (integers as BigInt) in the shape lib/context.js uses. */
function contextOf(v) {
  return {
    publisher: Number(v.publisher),
    stream: Number(v.stream),
    sequence: v.sequence,
    metricCount: Number(v.metric_count),
    intendedNs: v.intended_ns,
    otelTraceId: v.otel_trace_id === null ? null : Buffer.from(v.otel_trace_id, 'hex'),
    stamps: v.stamps.map((s) => ({ hop: Number(s.hop), ns: s.ns })),
  };
}

test('the vectors hold 64-bit values that JSON.parse would round', () => {
  const big = vectors.valid.some((v) => v.context.sequence > BigInt(Number.MAX_SAFE_INTEGER));
  assert.ok(big, 'expected a sequence above 2^53 in the vectors');
  const extreme = vectors.valid.find((v) => v.name === 'extreme_max');
  assert.equal(extreme.context.sequence, 18446744073709551615n);
  assert.equal(extreme.context.intended_ns, 9223372036854775807n);
  assert.notEqual(JSON.parse('18446744073709551615'), 18446744073709551615n);
});

test('there are valid and invalid vectors of every form', () => {
  assert.ok(vectors.valid.length >= 10);
  const forms = new Set(vectors.invalid.map((v) => v.form));
  assert.deepEqual([...forms].sort(), ['binary', 'envelope', 'text']);
});

for (const v of vectors.valid) {
  test(`valid ${v.name}: encodes to every form`, () => {
    const ctx = contextOf(v.context);
    assert.equal(ctxmod.encode(ctx).toString('hex'), v.binary_hex);
    assert.equal(ctxmod.binaryLength(ctx), v.binary_hex.length / 2);
    assert.equal(ctxmod.encodeText(ctx), v.text);
    const env = ctxmod.wrapEnvelope(ctx, Buffer.from(v.envelope_payload_hex, 'hex'));
    assert.equal(env.toString('hex'), v.envelope_hex);
  });

  test(`valid ${v.name}: decodes from every form`, () => {
    const ctx = contextOf(v.context);
    assert.deepEqual(ctxmod.decode(Buffer.from(v.binary_hex, 'hex')), ctx);
    assert.deepEqual(ctxmod.decodeText(v.text), ctx);
    const { context, payload } = ctxmod.unwrapEnvelope(Buffer.from(v.envelope_hex, 'hex'));
    assert.deepEqual(context, ctx);
    assert.equal(payload.toString('hex'), v.envelope_payload_hex);
  });
}

for (const v of vectors.invalid) {
  test(`invalid ${v.form} ${v.name}: ${v.error}`, () => {
    let decodeIt;
    if (v.form === 'binary') decodeIt = () => ctxmod.decode(Buffer.from(v.input_hex, 'hex'));
    else if (v.form === 'text') decodeIt = () => ctxmod.decodeText(v.input_text);
    else if (v.form === 'envelope') decodeIt = () => ctxmod.unwrapEnvelope(Buffer.from(v.input_hex, 'hex'));
    else assert.fail(`unknown form ${v.form}`);
    assert.throws(decodeIt, (e) => {
      assert.ok(e instanceof ctxmod.DecodeError, `not a DecodeError: ${e}`);
      assert.equal(e.code, v.error);
      return true;
    });
  });
}

test('stamping appends 9 bytes and increments N, and refuses a 17th stamp', () => {
  const v = vectors.valid.find((x) => x.name === 'doc_example');
  const ctx = ctxmod.decode(Buffer.from(v.binary_hex, 'hex'));
  assert.ok(ctxmod.pushStamp(ctx, 4, 1700000000000002000n));
  const bin = ctxmod.encode(ctx);
  assert.equal(bin.length, 37 + 9);
  assert.equal(bin[1], 2);
  assert.equal(bin.subarray(0, 37).subarray(2).toString('hex'), v.binary_hex.slice(4));
  assert.equal(bin.subarray(37).toString('hex'), '04' + 'd0072a36fe9c9717');
  const full = contextOf(vectors.valid.find((x) => x.name === 'sixteen_stamps').context);
  const before = ctxmod.encode(full).toString('hex');
  assert.equal(ctxmod.pushStamp(full, 1, 1n), false);
  assert.equal(ctxmod.encode(full).toString('hex'), before);
});

test('the encoder refuses what the format cannot hold', () => {
  const ok = contextOf(vectors.valid[0].context);
  const bad = [
    { ...ok, publisher: 65536 },
    { ...ok, stream: -1 },
    { ...ok, sequence: 1n << 64n },
    { ...ok, sequence: 3 },
    { ...ok, intendedNs: 1n << 63n },
    { ...ok, metricCount: 2 ** 32 },
    { ...ok, otelTraceId: Buffer.alloc(16) },
    { ...ok, otelTraceId: Buffer.alloc(15, 1) },
    { ...ok, stamps: Array.from({ length: 17 }, () => ({ hop: 0, ns: 0n })) },
    { ...ok, stamps: [{ hop: 256, ns: 0n }] },
  ];
  for (const c of bad) assert.throws(() => ctxmod.encode(c), (e) => e instanceof RangeError || e instanceof TypeError);
});

test('random contexts round-trip through every form', () => {
  let seed = 0x2545f491;
  const rnd = () => {
    seed ^= seed << 13; seed >>>= 0;
    seed ^= seed >>> 17;
    seed ^= seed << 5; seed >>>= 0;
    return seed;
  };
  const big = () => (BigInt(rnd()) << 32n) | BigInt(rnd());
  for (let i = 0; i < 500; i++) {
    const ctx = {
      publisher: rnd() & 0xffff,
      stream: rnd(),
      sequence: big(),
      metricCount: rnd(),
      intendedNs: BigInt.asIntN(64, big()),
      otelTraceId: rnd() & 1 ? Buffer.from(Array.from({ length: 16 }, (_, k) => (k === 0 ? 1 : rnd() & 0xff))) : null,
      stamps: Array.from({ length: rnd() % 17 }, () => ({ hop: rnd() & 0xff, ns: BigInt.asIntN(64, big()) })),
    };
    const payload = Buffer.from(Array.from({ length: rnd() % 20 }, () => rnd() & 0xff));
    // The binary stamping path gives the bytes of the decoded path.
    const bin = ctxmod.check(ctxmod.encode(ctx));
    const hop = rnd() & 0xff;
    const ns = BigInt.asIntN(64, big());
    const appended = ctxmod.appendStamp(bin, hop, ns);
    const viaObject = structuredClone(ctx);
    if (ctx.otelTraceId) viaObject.otelTraceId = ctx.otelTraceId;
    if (ctxmod.pushStamp(viaObject, hop, ns)) assert.deepEqual(appended, ctxmod.encode(viaObject));
    else assert.equal(appended, null);
    if (!ctx.otelTraceId) {
      const id = Buffer.from(Array.from({ length: 16 }, (_, k) => (k === 15 ? 1 : rnd() & 0xff)));
      assert.deepEqual(ctxmod.withTraceId(bin, id), ctxmod.encode({ ...ctx, otelTraceId: id }));
    }
    assert.equal(ctxmod.binaryToText(bin), ctxmod.encodeText(ctx));
    assert.deepEqual(ctxmod.textToBinary(ctxmod.encodeText(ctx)), bin);
    assert.deepEqual(ctxmod.decode(ctxmod.encode(ctx)), ctx);
    assert.deepEqual(ctxmod.decodeText(ctxmod.encodeText(ctx)), ctx);
    const u = ctxmod.unwrapEnvelope(ctxmod.wrapEnvelope(ctx, payload));
    assert.deepEqual(u.context, ctx);
    assert.deepEqual(Buffer.from(u.payload), payload);
  }
});
