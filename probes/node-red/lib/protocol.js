'use strict';
// The collector protocol, versions 1 and 2 (docs/collector-protocol.md): length-prefixed frames
// between a probe and the collector. Encoders build whole frames (length prefix
// included); decodeFrame() reads one frame body; FrameReader cuts a byte stream into
// frames. Errors carry the document's names in `code`.

const PROTOCOL_VERSION = 2; // the highest spoken; a version 1 peer is spoken to in version 1
const VERSIONS = Object.freeze([1, 2]);
const MAX_FRAME_LEN = 1 << 20; // type byte and body
const HELLO_MAGIC = Buffer.from('HOPTRACE', 'ascii');
const MAX_STRING_LEN = 1024;
const MAX_RECORDS_PER_FRAME = 20000;
const SENT_ENTRY_LEN = 36;
// As many entries as fit in MAX_FRAME_LEN after the type byte, the publisher and the count
// (29,126).
const MAX_SENT_PER_FRAME = Math.floor((MAX_FRAME_LEN - 7) / SENT_ENTRY_LEN);
const MAX_HOPS = 16;
const RECORD_LEN = 36;
const RECORD_LEN_WITH_ID = 52;

const TYPE = Object.freeze({
  HELLO: 0x01,
  RECORDS: 0x02,
  CLOCK: 0x03,
  COUNTERS: 0x04,
  SENT: 0x05,
  GOODBYE: 0x06,
  SEQ_RECORDS: 0x07,
  WELCOME: 0x81,
  REJECT: 0x82,
  ACK: 0x83,
});

/** Counter ids of the Counters frame, by name. */
const COUNTER_ID = Object.freeze({
  reported: 1,
  queue_full: 2,
  sent: 3,
  send_failed: 4,
  reconnects: 5,
  not_traced: 6,
  bad_context: 7,
  stamps_full: 8,
  bad_traceparent: 9,
  resent: 10,
  evicted: 11,
  lost_unacked: 12,
});

const CLOCK_SOURCE = Object.freeze({ unknown: 0, kernel: 1, chrony: 2, ptp: 3, injected: 4 });
const LEAP = Object.freeze({ none: 0, insert: 1, delete: 2, unsynchronised: 3 });
const REJECT_CODE = Object.freeze({ version: 1, token: 2, unknown_hop: 3, malformed: 4, overloaded: 5 });

/** Bytes that are not a valid frame; `code` names the error of the document. */
class ProtocolError extends Error {
  constructor(code, detail) {
    super(detail ? `${code}: ${detail}` : code);
    this.name = 'ProtocolError';
    this.code = code;
  }
}

// ---------------------------------------------------------------------------------------
// Encoding

/** A growable little-endian writer. */
class Writer {
  constructor(size = 256) {
    this.buf = Buffer.allocUnsafe(size);
    this.len = 0;
  }
  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.len + n));
    this.buf.copy(next, 0, 0, this.len);
    this.buf = next;
  }
  u8(v) { this.reserve(1); this.buf[this.len++] = v; }
  u16(v) { this.reserve(2); this.buf.writeUInt16LE(v, this.len); this.len += 2; }
  u32(v) { this.reserve(4); this.buf.writeUInt32LE(v, this.len); this.len += 4; }
  u64(v) { this.reserve(8); this.buf.writeBigUInt64LE(BigInt(v), this.len); this.len += 8; }
  i64(v) { this.reserve(8); this.buf.writeBigInt64LE(BigInt(v), this.len); this.len += 8; }
  bytes(b) { this.reserve(b.length); this.buf.set(b, this.len); this.len += b.length; }
  /** A string: u16 length and UTF-8; longer than 1024 bytes is cut at a character boundary. */
  str(s) {
    let b = Buffer.from(String(s), 'utf8');
    if (b.length > MAX_STRING_LEN) {
      let end = MAX_STRING_LEN;
      while (end > 0 && (b[end] & 0xc0) === 0x80) end--;
      b = b.subarray(0, end);
    }
    this.u16(b.length);
    this.bytes(b);
  }
  /** Starts a frame of `type`; returns where its length goes. */
  begin(type) {
    const at = this.len;
    this.u32(0);
    this.u8(type);
    return at;
  }
  /** Writes the length of the frame started at `at`. */
  end(at) {
    const len = this.len - at - 4;
    if (len > MAX_FRAME_LEN) throw new RangeError(`frame of ${len} bytes exceeds ${MAX_FRAME_LEN}`);
    this.buf.writeUInt32LE(len, at);
  }
  result() {
    return this.buf.subarray(0, this.len);
  }
}

/**
 * Hello: { version?, instanceId: bigint, host, process, software, token, hops: [[id, name]] }
 */
function encodeHello(h) {
  if (!Array.isArray(h.hops) || h.hops.length < 1 || h.hops.length > MAX_HOPS) {
    throw new RangeError(`a hello announces 1 to ${MAX_HOPS} hops`);
  }
  const w = new Writer(128);
  const at = w.begin(TYPE.HELLO);
  w.bytes(HELLO_MAGIC);
  w.u16(h.version === undefined ? PROTOCOL_VERSION : h.version);
  w.u64(h.instanceId);
  w.str(h.host);
  w.str(h.process);
  w.str(h.software);
  w.str(h.token || '');
  w.u8(h.hops.length);
  for (const [id, name] of h.hops) {
    w.u8(id);
    w.str(name);
  }
  w.end(at);
  return w.result();
}

/**
 * Writes one record (36 or 52 bytes) at `at` of `out`; returns its length.
 * `ctx` is a trace context (lib/context.js), `hop` the hop id, `stampNs` a bigint.
 */
function writeRecord(out, at, ctx, hop, stampNs) {
  const id = ctx.otelTraceId;
  out[at] = id ? 1 : 0;
  out[at + 1] = hop;
  out.writeUInt16LE(ctx.publisher, at + 2);
  out.writeUInt32LE(ctx.stream, at + 4);
  out.writeBigUInt64LE(ctx.sequence, at + 8);
  out.writeBigInt64LE(stampNs, at + 16);
  out.writeUInt32LE(ctx.metricCount, at + 24);
  out.writeBigInt64LE(ctx.intendedNs, at + 28);
  if (id) {
    out.set(id, at + 36);
    return RECORD_LEN_WITH_ID;
  }
  return RECORD_LEN;
}

/**
 * Writes the record of `hop` stamping a checked binary context at `stampNs` (bigint) at
 * `at` of `out`, copying the fields straight from the context's bytes (the binary form
 * and the record share their field order); returns its length.
 */
function writeRecordFromBinary(out, at, bin, hop, stampNs) {
  const hasId = (bin[1] & 0x80) !== 0;
  out[at] = hasId ? 1 : 0;
  out[at + 1] = hop;
  bin.copy(out, at + 2, 2, 16); // publisher, stream, sequence
  out.writeBigInt64LE(stampNs, at + 16);
  bin.copy(out, at + 24, 16, 28); // metric count, intended
  if (hasId) {
    bin.copy(out, at + 36, 28, 44);
    return RECORD_LEN_WITH_ID;
  }
  return RECORD_LEN;
}

/**
 * Records frame of [{ context, hop, stampNs }]; with `seq` a SeqRecords frame (version 2).
 */
function encodeRecords(records, seq = null) {
  if (records.length < 1 || records.length > MAX_RECORDS_PER_FRAME) {
    throw new RangeError(`a records frame holds 1 to ${MAX_RECORDS_PER_FRAME} records`);
  }
  const head = seq === null ? 9 : 17;
  let size = head;
  for (const r of records) size += r.context.otelTraceId ? RECORD_LEN_WITH_ID : RECORD_LEN;
  const out = Buffer.allocUnsafe(size);
  out.writeUInt32LE(size - 4, 0);
  out[4] = seq === null ? TYPE.RECORDS : TYPE.SEQ_RECORDS;
  if (seq !== null) out.writeBigUInt64LE(BigInt(seq), 5);
  out.writeUInt32LE(records.length, head - 4);
  let p = head;
  for (const r of records) p += writeRecord(out, p, r.context, r.hop, r.stampNs);
  return out;
}

/**
 * Clock: { atNs, source, synced, leap, offsetNs, errorBoundNs, detail }
 */
function encodeClock(c) {
  const w = new Writer(96);
  const at = w.begin(TYPE.CLOCK);
  w.i64(c.atNs);
  w.u8(c.source);
  w.u8(c.synced ? 1 : 0);
  w.u8(c.leap);
  w.i64(c.offsetNs);
  w.u64(c.errorBoundNs);
  w.str(c.detail || '');
  w.end(at);
  return w.result();
}

/**
 * Counters: { atNs, values: [[id, value]] } (values bigint or number).
 */
function encodeCounters(c) {
  if (c.values.length > 255) throw new RangeError('at most 255 counters');
  const w = new Writer(16 + 10 * c.values.length);
  const at = w.begin(TYPE.COUNTERS);
  w.i64(c.atNs);
  w.u8(c.values.length);
  for (const [id, v] of c.values) {
    w.u16(id);
    w.u64(v);
  }
  w.end(at);
  return w.result();
}

/**
 * Sent: { publisher, entries: [{ stream, messages, metrics, firstSequence, lastSequence }] }
 */
function encodeSent(s) {
  if (s.entries.length > MAX_SENT_PER_FRAME) throw new RangeError(`at most ${MAX_SENT_PER_FRAME} entries`);
  const w = new Writer(11 + SENT_ENTRY_LEN * s.entries.length);
  const at = w.begin(TYPE.SENT);
  w.u16(s.publisher);
  w.u32(s.entries.length);
  for (const e of s.entries) {
    w.u32(e.stream);
    w.u64(e.messages);
    w.u64(e.metrics);
    w.u64(e.firstSequence);
    w.u64(e.lastSequence);
  }
  w.end(at);
  return w.result();
}

function encodeGoodbye() {
  return Buffer.from([1, 0, 0, 0, TYPE.GOODBYE]);
}

/** Welcome; in version 2 with `resumeSeq` (bigint or number), the highest frame held. */
function encodeWelcome(version, runId, resumeSeq = 0n) {
  const w = new Writer(40);
  const at = w.begin(TYPE.WELCOME);
  w.u16(version);
  w.str(runId);
  if (version >= 2) w.u64(resumeSeq);
  w.end(at);
  return w.result();
}

/** Ack (version 2): every SeqRecords frame up to `seq` (bigint or number) is durable. */
function encodeAck(seq) {
  const w = new Writer(16);
  const at = w.begin(TYPE.ACK);
  w.u64(seq);
  w.end(at);
  return w.result();
}

function encodeReject(code, reason) {
  const w = new Writer(32);
  const at = w.begin(TYPE.REJECT);
  w.u16(code);
  w.str(reason);
  w.end(at);
  return w.result();
}

// ---------------------------------------------------------------------------------------
// Decoding

class Cursor {
  constructor(b) {
    this.b = b;
    this.p = 0;
  }
  take(n) {
    if (this.b.length - this.p < n) throw new ProtocolError('truncated');
    const s = this.b.subarray(this.p, this.p + n);
    this.p += n;
    return s;
  }
  u8() { return this.take(1)[0]; }
  u16() { return this.take(2).readUInt16LE(0); }
  u32() { return this.take(4).readUInt32LE(0); }
  u64() { return this.take(8).readBigUInt64LE(0); }
  i64() { return this.take(8).readBigInt64LE(0); }
  str() {
    const n = this.u16();
    if (n > MAX_STRING_LEN) throw new ProtocolError('bad_string', `${n} bytes`);
    const b = this.take(n);
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(b);
    } catch (_) {
      throw new ProtocolError('bad_string', 'not UTF-8');
    }
  }
  end() {
    if (this.p !== this.b.length) throw new ProtocolError('trailing_bytes', `${this.b.length - this.p} bytes`);
  }
}

function decodeRecord(c) {
  const flags = c.u8();
  if (flags & ~1) throw new ProtocolError('reserved_bits', `flags 0x${flags.toString(16)}`);
  const hop = c.u8();
  const publisher = c.u16();
  const stream = c.u32();
  const sequence = c.u64();
  const stampNs = c.i64();
  const metricCount = c.u32();
  const intendedNs = c.i64();
  const otelTraceId = flags & 1 ? Buffer.from(c.take(16)) : null;
  return { hop, stampNs, context: { publisher, stream, sequence, metricCount, intendedNs, otelTraceId } };
}

/**
 * Decodes a frame from its type byte and body.
 * @returns {{type: string, ...}}
 */
function decodeFrame(type, body) {
  const c = new Cursor(body);
  let f;
  switch (type) {
    case TYPE.HELLO: {
      let magic;
      try {
        magic = c.take(8);
      } catch (_) {
        throw new ProtocolError('bad_magic');
      }
      if (!magic.equals(HELLO_MAGIC)) throw new ProtocolError('bad_magic');
      const version = c.u16();
      if (!VERSIONS.includes(version)) throw new ProtocolError('unsupported_version', `${version}`);
      const instanceId = c.u64();
      const host = c.str();
      const process = c.str();
      const software = c.str();
      const token = c.str();
      const n = c.u8();
      if (n < 1 || n > MAX_HOPS) throw new ProtocolError('bad_count', `${n} hops`);
      const hops = [];
      for (let i = 0; i < n; i++) hops.push([c.u8(), c.str()]);
      f = { type: 'hello', version, instanceId, host, process, software, token, hops };
      break;
    }
    case TYPE.RECORDS:
    case TYPE.SEQ_RECORDS: {
      const seq = type === TYPE.SEQ_RECORDS ? c.u64() : null;
      const n = c.u32();
      if (n < 1 || n > MAX_RECORDS_PER_FRAME) throw new ProtocolError('bad_count', `${n} records`);
      const records = [];
      for (let i = 0; i < n; i++) records.push(decodeRecord(c));
      f = seq === null ? { type: 'records', records } : { type: 'seq_records', seq, records };
      break;
    }
    case TYPE.CLOCK:
      f = {
        type: 'clock',
        atNs: c.i64(),
        source: c.u8(),
        synced: c.u8() !== 0,
        leap: c.u8(),
        offsetNs: c.i64(),
        errorBoundNs: c.u64(),
        detail: c.str(),
      };
      break;
    case TYPE.COUNTERS: {
      const atNs = c.i64();
      const n = c.u8();
      const values = [];
      for (let i = 0; i < n; i++) values.push([c.u16(), c.u64()]);
      f = { type: 'counters', atNs, values };
      break;
    }
    case TYPE.SENT: {
      const publisher = c.u16();
      const n = c.u32();
      if (n > MAX_SENT_PER_FRAME) throw new ProtocolError('bad_count', `${n} entries`); // 0 is valid
      const entries = [];
      for (let i = 0; i < n; i++) {
        entries.push({
          stream: c.u32(),
          messages: c.u64(),
          metrics: c.u64(),
          firstSequence: c.u64(),
          lastSequence: c.u64(),
        });
      }
      f = { type: 'sent', publisher, entries };
      break;
    }
    case TYPE.GOODBYE:
      f = { type: 'goodbye' };
      break;
    case TYPE.WELCOME: {
      const version = c.u16();
      if (!VERSIONS.includes(version)) throw new ProtocolError('unsupported_version', `${version}`);
      const runId = c.str();
      f = { type: 'welcome', version, runId, resumeSeq: version >= 2 ? c.u64() : 0n };
      break;
    }
    case TYPE.ACK:
      f = { type: 'ack', seq: c.u64() };
      break;
    case TYPE.REJECT:
      f = { type: 'reject', code: c.u16(), reason: c.str() };
      break;
    default:
      throw new ProtocolError('unknown_type', `0x${type.toString(16).padStart(2, '0')}`);
  }
  c.end();
  return f;
}

/**
 * Cuts a byte stream into frames: push() chunks, then next() until it returns null.
 * Throws `frame_too_large` (without waiting for the body) and `empty_frame`.
 */
class FrameReader {
  constructor(maxLen = MAX_FRAME_LEN) {
    this.maxLen = maxLen;
    this.chunks = [];
    this.size = 0;
  }
  push(chunk) {
    this.chunks.push(chunk);
    this.size += chunk.length;
  }
  next() {
    if (this.size < 4) return null;
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks, this.size)];
    const b = this.chunks[0];
    const len = b.readUInt32LE(0);
    if (len === 0) throw new ProtocolError('empty_frame');
    if (len > this.maxLen) throw new ProtocolError('frame_too_large', `${len} bytes`);
    if (this.size < 4 + len) return null;
    const type = b[4];
    const body = b.subarray(5, 4 + len);
    const rest = b.subarray(4 + len);
    this.chunks = rest.length ? [rest] : [];
    this.size = rest.length;
    return decodeFrame(type, body);
  }
}

module.exports = {
  PROTOCOL_VERSION,
  VERSIONS,
  MAX_FRAME_LEN,
  HELLO_MAGIC,
  MAX_STRING_LEN,
  MAX_RECORDS_PER_FRAME,
  MAX_SENT_PER_FRAME,
  SENT_ENTRY_LEN,
  MAX_HOPS,
  RECORD_LEN,
  RECORD_LEN_WITH_ID,
  TYPE,
  COUNTER_ID,
  CLOCK_SOURCE,
  LEAP,
  REJECT_CODE,
  ProtocolError,
  Writer,
  encodeHello,
  writeRecord,
  writeRecordFromBinary,
  encodeRecords,
  encodeClock,
  encodeCounters,
  encodeSent,
  encodeGoodbye,
  encodeWelcome,
  encodeAck,
  encodeReject,
  decodeFrame,
  FrameReader,
};
