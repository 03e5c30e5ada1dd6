'use strict';
// probe/testdata/protocol-vectors.json, the example frames of collector protocol versions 1
// and 2 the Rust probe is checked against: every frame built from its fields encodes to
// exactly the bytes listed, and the bytes decode to the same fields. Read with the exact
// parser (its 64-bit integers do not survive JSON.parse).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const p = require('../lib/protocol');
const { parse } = require('./exact-json');

const VECTORS = parse(fs.readFileSync(path.resolve(__dirname, '../../../probe/testdata/protocol-vectors.json'), 'utf8')).frames;

/** "chrony (2)" -> 2: the vectors name enumerations beside their code. */
const code = (v) => (typeof v === 'string' ? Number(/\((\d+)\)$/.exec(v)[1]) : Number(v));

function record(r) {
  return {
    hop: Number(r.hop),
    stampNs: r.stamp_ns,
    context: {
      publisher: Number(r.publisher), stream: Number(r.stream), sequence: r.sequence,
      metricCount: Number(r.metric_count), intendedNs: r.intended_ns,
      otelTraceId: r.otel_trace_id === null ? null : Buffer.from(r.otel_trace_id, 'hex'),
    },
  };
}

/** The frame's bytes built from its fields, and the decoded frame expected. */
function build(v) {
  const f = v.fields;
  switch (parseInt(v.type, 16)) {
    case p.TYPE.HELLO: {
      const h = {
        version: Number(f.version), instanceId: BigInt(f.instance_id), host: f.host, process: f.process,
        software: f.software, token: f.token, hops: f.hops.map(([id, name]) => [Number(id), name]),
      };
      return [p.encodeHello(h), { type: 'hello', ...h }];
    }
    case p.TYPE.RECORDS: {
      const records = f.records.map(record);
      return [p.encodeRecords(records), { type: 'records', records }];
    }
    case p.TYPE.SEQ_RECORDS: {
      const records = f.records.map(record);
      return [p.encodeRecords(records, f.seq), { type: 'seq_records', seq: f.seq, records }];
    }
    case p.TYPE.CLOCK: {
      const c = {
        atNs: f.at_ns, source: code(f.source), synced: f.synced, leap: code(f.leap), offsetNs: f.offset_ns,
        errorBoundNs: f.error_bound_ns, detail: f.detail,
      };
      return [p.encodeClock(c), { type: 'clock', ...c }];
    }
    case p.TYPE.COUNTERS: {
      for (const [name, id] of f.values) assert.equal(p.COUNTER_ID[name], Number(id), name);
      const c = { atNs: f.at_ns, values: f.values.map(([, id, value]) => [Number(id), value]) };
      return [p.encodeCounters(c), { type: 'counters', ...c }];
    }
    case p.TYPE.SENT: {
      const s = {
        publisher: Number(f.publisher),
        entries: f.entries.map((e) => ({
          stream: Number(e.stream), messages: e.messages, metrics: e.metrics,
          firstSequence: e.first_sequence, lastSequence: e.last_sequence,
        })),
      };
      return [p.encodeSent(s), { type: 'sent', ...s }];
    }
    case p.TYPE.GOODBYE:
      return [p.encodeGoodbye(), { type: 'goodbye' }];
    case p.TYPE.WELCOME: {
      const resumeSeq = f.resume_seq ?? 0n;
      return [p.encodeWelcome(Number(f.version), f.run_id, resumeSeq),
        { type: 'welcome', version: Number(f.version), runId: f.run_id, resumeSeq }];
    }
    case p.TYPE.ACK:
      return [p.encodeAck(f.seq), { type: 'ack', seq: f.seq }];
    case p.TYPE.REJECT:
      return [p.encodeReject(Number(f.code), f.reason), { type: 'reject', code: Number(f.code), reason: f.reason }];
    default:
      throw new Error(`a frame type this test does not know: ${v.type}`);
  }
}

test('the vectors cover every frame type of both versions', () => {
  assert.deepEqual(new Set(VECTORS.map((v) => parseInt(v.type, 16))), new Set(Object.values(p.TYPE)));
  assert.deepEqual(new Set(VECTORS.map((v) => v.versions)), new Set(['1', '2', '1, 2']));
});

for (const v of VECTORS) {
  test(`vector: ${v.name}`, () => {
    const [bytes, want] = build(v);
    assert.equal(bytes.toString('hex'), v.hex);
    const r = new p.FrameReader();
    r.push(Buffer.from(v.hex, 'hex'));
    assert.deepEqual(r.next(), want);
    assert.equal(r.next(), null);
  });
}
