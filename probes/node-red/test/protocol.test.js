'use strict';
// Frames against the tables of docs/collector-protocol.md. The expected bytes were laid
// out field by field from the tables (little-endian, u16-prefixed strings), not produced
// by the encoder under test.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const p = require('../lib/protocol');
const { RecordRing } = require('../lib/ring');

const HELLO_HEX =
  '3f000000' + '01' + // len 63, type Hello
  '484f5054524143 45'.replace(' ', '') + // magic HOPTRACE
  '0100' + // version 1
  '0807060504030201' + // instance id
  '0200' + '6831' + // host "h1"
  '0800' + '6e6f64652d726564' + // process "node-red"
  '0400' + '73772031' + // software "sw 1"
  '0000' + // token ""
  '02' + // 2 hops
  '01' + '0700' + '666c6f775f696e' + // 1 flow_in
  '02' + '0800' + '666c6f775f6f7574'; // 2 flow_out

const RECORDS_HEX =
  '5d000000' + '02' + '02000000' +
  // record 1: no trace id, hop 1, publisher 7, stream 3, sequence u64 max
  '00' + '01' + '0700' + '03000000' + 'ffffffffffffffff' +
  'e8032a36fe9c9717' + // stamp 1700000000000001000
  '32000000' + // metric count 50
  '00002a36fe9c9717' + // intended 1700000000000000000
  // record 2: trace id, hop 2, publisher 65535, stream u32 max, sequence 5
  '01' + '02' + 'ffff' + 'ffffffff' + '0500000000000000' +
  'ffffffffffffffff' + // stamp -1
  '00000000' + // metric count 0
  '0000000000000080' + // intended i64 min
  '4bf92f3577b34da6a3ce929d0e0e4736';

const CLOCK_HEX =
  '21000000' + '03' + '00002a36fe9c9717' + '02' + '01' + '00' +
  '2cf8ffffffffffff' + // offset -2004
  'd316000000000000' + // bound 5843
  '0300' + '726566';

const COUNTERS_HEX =
  '1e000000' + '04' + '00002a36fe9c9717' + '02' +
  '0100' + '0a00000000000000' +
  '0200' + 'ffffffffffffffff';

const SENT_HEX =
  '2b000000' + '05' + '0700' + '01000000' +
  '03000000' + '6400000000000000' + '8813000000000000' + '0000000000000000' + '6300000000000000';

const CTX1 = {
  publisher: 7, stream: 3, sequence: 18446744073709551615n, metricCount: 50,
  intendedNs: 1700000000000000000n, otelTraceId: null, stamps: [],
};
const CTX2 = {
  publisher: 65535, stream: 4294967295, sequence: 5n, metricCount: 0,
  intendedNs: -9223372036854775808n, otelTraceId: Buffer.from('4bf92f3577b34da6a3ce929d0e0e4736', 'hex'), stamps: [],
};

test('Hello', () => {
  const hello = {
    instanceId: 0x0102030405060708n, host: 'h1', process: 'node-red', software: 'sw 1', token: '',
    hops: [[1, 'flow_in'], [2, 'flow_out']],
  };
  const b = p.encodeHello({ version: 1, ...hello });
  assert.equal(b.toString('hex'), HELLO_HEX);
  const f = p.decodeFrame(b[4], b.subarray(5));
  assert.deepEqual(f, { type: 'hello', version: 1, ...hello });
  // Version 2 (the default) differs in the version field only.
  const b2 = p.encodeHello(hello);
  assert.equal(b2.toString('hex'), HELLO_HEX.replace('484f505452414345' + '0100', '484f505452414345' + '0200'));
  assert.equal(p.decodeFrame(b2[4], b2.subarray(5)).version, 2);
  assert.throws(() => p.encodeHello({ ...hello, hops: [] }), RangeError);
  assert.throws(() => p.encodeHello({ ...hello, hops: Array.from({ length: 17 }, (_, i) => [i, `h${i}`]) }), RangeError);
});

test('Records: 36 bytes a record, 52 with a trace id', () => {
  const b = p.encodeRecords([
    { context: CTX1, hop: 1, stampNs: 1700000000000001000n },
    { context: CTX2, hop: 2, stampNs: -1n },
  ]);
  assert.equal(b.toString('hex'), RECORDS_HEX);
  assert.equal(b.length, 4 + 1 + 4 + 36 + 52);
  const f = p.decodeFrame(b[4], b.subarray(5));
  assert.equal(f.records.length, 2);
  assert.equal(f.records[0].context.sequence, 18446744073709551615n);
  assert.deepEqual(f.records[1].context.otelTraceId, CTX2.otelTraceId);
  assert.equal(f.records[1].stampNs, -1n);
  // Version 2: SeqRecords, the same records after the frame's number.
  const seqHex = '65000000' + '07' + '0300000000000000' + RECORDS_HEX.slice(10);
  const s = p.encodeRecords([
    { context: CTX1, hop: 1, stampNs: 1700000000000001000n },
    { context: CTX2, hop: 2, stampNs: -1n },
  ], 3);
  assert.equal(s.toString('hex'), seqHex);
  const g = p.decodeFrame(s[4], s.subarray(5));
  assert.equal(g.type, 'seq_records');
  assert.equal(g.seq, 3n);
  assert.deepEqual(g.records, f.records);
});

test('the record ring lays records out exactly as the Records frame', () => {
  const ring = new RecordRing(4);
  assert.ok(ring.push(CTX1, 1, 1700000000000001000n));
  assert.ok(ring.push(CTX2, 2, -1n));
  const f = ring.takeFrame(100);
  assert.equal(f.count, 2);
  assert.equal(f.frame.toString('hex'), RECORDS_HEX);
  assert.equal(ring.takeFrame(100), null);
  ring.rewind();
  const s = ring.takeFrame(100, 3);
  assert.equal(s.frame.toString('hex'), p.encodeRecords([
    { context: CTX1, hop: 1, stampNs: 1700000000000001000n },
    { context: CTX2, hop: 2, stampNs: -1n },
  ], 3).toString('hex'));
});

test('a record copied from a binary context equals one written from the decoded context', () => {
  const ctxmod = require('../lib/context');
  for (const c of [CTX1, CTX2, { ...CTX2, stamps: [{ hop: 1, ns: 5n }, { hop: 2, ns: -7n }] }]) {
    const a = Buffer.alloc(52);
    const b = Buffer.alloc(52);
    const la = p.writeRecord(a, 0, c, 9, 1234567890123456789n);
    const lb = p.writeRecordFromBinary(b, 0, ctxmod.encode(c), 9, 1234567890123456789n);
    assert.equal(la, lb);
    assert.deepEqual(a, b);
  }
  const ring = new RecordRing(2);
  ring.pushBinary(ctxmod.encode(CTX1), 1, 1700000000000001000n);
  ring.pushBinary(ctxmod.encode(CTX2), 2, -1n);
  assert.equal(ring.takeFrame(10).frame.toString('hex'), RECORDS_HEX);
});

test('the record ring is bounded by what it holds, sent or not', () => {
  const ring = new RecordRing(3);
  assert.ok(ring.push(CTX1, 1, 1n));
  assert.ok(ring.push(CTX1, 1, 2n));
  assert.ok(ring.push(CTX1, 1, 3n));
  assert.equal(ring.push(CTX1, 1, 4n), false);
  const f = ring.takeFrame(2);
  assert.equal(f.count, 2);
  assert.equal(ring.push(CTX1, 1, 4n), false, 'sent but not released still holds a slot');
  ring.release(f.end);
  assert.ok(ring.push(CTX1, 1, 4n));
  assert.ok(ring.push(CTX1, 1, 5n));
  assert.equal(ring.queued, 3);
  // Wrapping around keeps the order.
  const g = ring.takeFrame(10);
  const stamps = p.decodeFrame(g.frame[4], g.frame.subarray(5)).records.map((r) => r.stampNs);
  assert.deepEqual(stamps, [3n, 4n, 5n]);
  // A reconnect under durable acks sends the unreleased records again.
  ring.rewind();
  assert.equal(ring.queued, 3);
  assert.equal(ring.clear(), 3);
  assert.equal(ring.held, 0);
});

test('Clock', () => {
  const c = {
    atNs: 1700000000000000000n, source: p.CLOCK_SOURCE.chrony, synced: true, leap: p.LEAP.none,
    offsetNs: -2004n, errorBoundNs: 5843n, detail: 'ref',
  };
  const b = p.encodeClock(c);
  assert.equal(b.toString('hex'), CLOCK_HEX);
  assert.deepEqual(p.decodeFrame(b[4], b.subarray(5)), { type: 'clock', ...c });
});

test('Counters: ids of the table, u64 values', () => {
  assert.deepEqual(p.COUNTER_ID, {
    reported: 1, queue_full: 2, sent: 3, send_failed: 4, reconnects: 5,
    not_traced: 6, bad_context: 7, stamps_full: 8, bad_traceparent: 9, resent: 10, evicted: 11, lost_unacked: 12,
  });
  const c = { atNs: 1700000000000000000n, values: [[1, 10n], [2, 18446744073709551615n]] };
  const b = p.encodeCounters(c);
  assert.equal(b.toString('hex'), COUNTERS_HEX);
  assert.deepEqual(p.decodeFrame(b[4], b.subarray(5)), { type: 'counters', ...c });
});

test('Sent', () => {
  const s = { publisher: 7, entries: [{ stream: 3, messages: 100n, metrics: 5000n, firstSequence: 0n, lastSequence: 99n }] };
  const b = p.encodeSent(s);
  assert.equal(b.toString('hex'), SENT_HEX);
  assert.deepEqual(p.decodeFrame(b[4], b.subarray(5)), { type: 'sent', ...s });
  // 0 to 29,126 entries: as many as fit in a 1 MiB frame; an empty one changes nothing.
  const entry = s.entries[0];
  const none = p.encodeSent({ publisher: 7, entries: [] });
  assert.deepEqual(p.decodeFrame(none[4], none.subarray(5)), { type: 'sent', publisher: 7, entries: [] });
  const full = p.encodeSent({ publisher: 7, entries: Array(p.MAX_SENT_PER_FRAME).fill(entry) });
  assert.ok(full.length - 4 <= p.MAX_FRAME_LEN);
  assert.throws(() => p.encodeSent({ publisher: 7, entries: Array(p.MAX_SENT_PER_FRAME + 1).fill(entry) }), RangeError);
  const empty = Buffer.from('0700' + '00000000', 'hex');
  assert.deepEqual(p.decodeFrame(p.TYPE.SENT, empty), { type: 'sent', publisher: 7, entries: [] });
  const over = Buffer.alloc(6);
  over.writeUInt16LE(7, 0);
  over.writeUInt32LE(p.MAX_SENT_PER_FRAME + 1, 2);
  assert.throws(() => p.decodeFrame(p.TYPE.SENT, over), /bad_count/);
});

test('the fullest Sent frame is within the frame limit the collector applies', () => {
  // The count the protocol document gives for a Sent frame is the one encoded here.
  const doc = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'docs', 'collector-protocol.md'), 'utf8');
  const stated = /\| count S \| u32, \d+ to ([\d,]+) /.exec(doc);
  assert.ok(stated, 'docs/collector-protocol.md states the entries of a Sent frame');
  assert.equal(p.MAX_SENT_PER_FRAME, Number(stated[1].replace(/,/g, '')));
  const entry = { stream: 1, messages: 1n, metrics: 1n, firstSequence: 0n, lastSequence: 0n };
  const entries = Array.from({ length: p.MAX_SENT_PER_FRAME }, (_, i) => ({ ...entry, stream: i }));
  const b = p.encodeSent({ publisher: 1, entries });
  assert.ok(b.length - 4 <= p.MAX_FRAME_LEN, `${b.length - 4} bytes`);
  assert.ok(b.length - 4 + p.SENT_ENTRY_LEN > p.MAX_FRAME_LEN, 'one entry more would not fit');
  const r = new p.FrameReader();
  r.push(b);
  assert.equal(r.next().entries.length, p.MAX_SENT_PER_FRAME);
  assert.throws(() => p.encodeSent({ publisher: 1, entries: [...entries, entry] }), RangeError);
});

test('Goodbye, Welcome, Reject', () => {
  assert.equal(p.encodeGoodbye().toString('hex'), '0100000006');
  assert.equal(p.encodeWelcome(1, 'run-1').toString('hex'), '0a000000' + '81' + '0100' + '0500' + '72756e2d31');
  assert.equal(p.encodeReject(3, 'unknown hop').toString('hex'),
    '10000000' + '82' + '0300' + '0b00' + Buffer.from('unknown hop').toString('hex'));
  const r = new p.FrameReader();
  r.push(Buffer.from('0a000000810100050072756e2d31100000008203000b00756e6b6e6f776e20686f70', 'hex'));
  assert.deepEqual(r.next(), { type: 'welcome', version: 1, runId: 'run-1', resumeSeq: 0n });
  assert.deepEqual(r.next(), { type: 'reject', code: 3, reason: 'unknown hop' });
  assert.equal(r.next(), null);
  // Version 2: Welcome carries resume_seq; Ack its u64.
  const w2 = p.encodeWelcome(2, 'run-1', 7n);
  assert.equal(w2.toString('hex'), '12000000' + '81' + '0200' + '0500' + '72756e2d31' + '0700000000000000');
  assert.deepEqual(p.decodeFrame(w2[4], w2.subarray(5)), { type: 'welcome', version: 2, runId: 'run-1', resumeSeq: 7n });
  const ack = p.encodeAck(18446744073709551615n);
  assert.equal(ack.toString('hex'), '09000000' + '83' + 'ffffffffffffffff');
  assert.deepEqual(p.decodeFrame(ack[4], ack.subarray(5)), { type: 'ack', seq: 18446744073709551615n });
});

test('strings longer than 1024 bytes are cut at a character boundary', () => {
  const w = new p.Writer();
  w.str('é'.repeat(600)); // 1200 bytes
  const b = w.result();
  assert.equal(b.readUInt16LE(0), 1024);
  assert.equal(b.subarray(2).toString('utf8'), 'é'.repeat(512));
  const w2 = new p.Writer();
  w2.str('a' + 'é'.repeat(600)); // the 1024th byte would split a character
  assert.equal(w2.result().readUInt16LE(0), 1023);
});

test('a stream cut anywhere gives the same frames', () => {
  const all = Buffer.concat([
    p.encodeWelcome(1, 'r'),
    p.encodeRecords([{ context: CTX2, hop: 2, stampNs: 5n }]),
    p.encodeGoodbye(),
  ]);
  for (let cut = 0; cut <= all.length; cut++) {
    const r = new p.FrameReader();
    const got = [];
    for (const part of [all.subarray(0, cut), all.subarray(cut)]) {
      r.push(part);
      for (let f = r.next(); f; f = r.next()) got.push(f.type);
    }
    assert.deepEqual(got, ['welcome', 'records', 'goodbye']);
  }
});

test('decoder errors carry the names of the document', () => {
  const dec = (hex) => () => {
    const r = new p.FrameReader();
    r.push(Buffer.from(hex, 'hex'));
    return r.next();
  };
  const code = (c) => (e) => e instanceof p.ProtocolError && e.code === c;
  assert.throws(dec('00000000'), code('empty_frame'));
  assert.throws(dec('01001000' + '02'), code('frame_too_large'));
  assert.throws(dec('010000007f'), code('unknown_type'));
  assert.throws(dec('020000000600'), code('trailing_bytes'));
  assert.throws(dec('0300000081' + '0100'), code('truncated'));
  assert.throws(dec('0500000081' + '0100' + '0104'), code('bad_string'));
  assert.throws(dec('0500000081' + '0100' + '0100'), code('truncated'));
  assert.throws(dec('0600000081' + '0100' + '0100' + 'ff'), code('bad_string'));
  assert.throws(dec('0500000081' + '0300' + '0000'), code('unsupported_version'));
  assert.throws(dec('0500000081' + '0200' + '0000'), code('truncated')); // version 2 without resume_seq
  assert.throws(dec('0a00000083' + '010000000000000000'), code('trailing_bytes'));
  assert.throws(dec('0d00000007' + '0100000000000000' + '00000000'), code('bad_count'));
  assert.throws(dec('0900000001' + '484f5054524143 46'.replace(' ', '')), code('bad_magic'));
  assert.throws(dec('0500000002' + '00000000'), code('bad_count'));
  assert.throws(dec('0500000002' + '214e0000'), code('bad_count'));
  const rec = Buffer.from(RECORDS_HEX, 'hex');
  rec[9] = 0x02; // a reserved flag bit
  assert.throws(dec(rec.toString('hex')), code('reserved_bits'));
  // a length exactly at the limit is read (and waits for its body)
  assert.equal(dec('00001000' + '02')(), null);
});
