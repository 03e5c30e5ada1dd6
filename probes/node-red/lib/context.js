'use strict';
// The hoptrace trace context, version 1 (docs/trace-format.md): the binary form, the text
// form (`ht1.` + base64url) and the envelope form (magic, length, context, payload).
//
// A context is a plain object:
//   { publisher: number (u16), stream: number (u32), sequence: bigint (u64),
//     metricCount: number (u32), intendedNs: bigint (i64),
//     otelTraceId: Buffer(16) | null, stamps: [{ hop: number (u8), ns: bigint (i64) }] }
// 64-bit fields are BigInt so no value is ever rounded.
//
// Decoders throw a DecodeError whose `code` is the error name of the document
// (`truncated`, `unsupported_version`, ...); encoders throw TypeError/RangeError for
// values the format cannot hold (a programming error, never a wire error).

const VERSION = 0x01;
const MAX_STAMPS = 16;
const HEADER_LEN = 28;
const TRACE_ID_LEN = 16;
const STAMP_LEN = 9;
const MAX_BINARY_LEN = HEADER_LEN + TRACE_ID_LEN + MAX_STAMPS * STAMP_LEN; // 188
const TEXT_PREFIX = 'ht1.';
const MAGIC = Buffer.from([0xff, 0x48, 0x54, 0x31]); // 0xFF "HT1"
const ENVELOPE_PREFIX_LEN = MAGIC.length + 1;

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;

/** A context that does not decode; `code` names the rule it broke. */
class DecodeError extends Error {
  constructor(code, detail) {
    super(detail ? `${code}: ${detail}` : code);
    this.name = 'DecodeError';
    this.code = code;
  }
}

function checkInt(name, v, max) {
  if (!Number.isInteger(v) || v < 0 || v > max) {
    throw new RangeError(`${name} must be an integer 0..${max}, got ${v}`);
  }
}

function checkBig(name, v, min, max) {
  if (typeof v !== 'bigint') throw new TypeError(`${name} must be a BigInt, got ${typeof v}`);
  if (v < min || v > max) throw new RangeError(`${name} ${v} is outside ${min}..${max}`);
}

/** Checks every field of `ctx` against the format; throws on a value it cannot hold. */
function validate(ctx) {
  checkInt('publisher', ctx.publisher, 0xffff);
  checkInt('stream', ctx.stream, 0xffffffff);
  checkBig('sequence', ctx.sequence, 0n, U64_MAX);
  checkInt('metricCount', ctx.metricCount, 0xffffffff);
  checkBig('intendedNs', ctx.intendedNs, I64_MIN, I64_MAX);
  const id = ctx.otelTraceId;
  if (id !== null && id !== undefined) {
    if (!(id instanceof Uint8Array) || id.length !== TRACE_ID_LEN) {
      throw new TypeError('otelTraceId must be 16 bytes or null');
    }
    if (id.every((b) => b === 0)) throw new RangeError('otelTraceId must not be all zeros');
  }
  if (!Array.isArray(ctx.stamps)) throw new TypeError('stamps must be an array');
  if (ctx.stamps.length > MAX_STAMPS) {
    throw new RangeError(`at most ${MAX_STAMPS} stamps, got ${ctx.stamps.length}`);
  }
  for (const s of ctx.stamps) {
    checkInt('stamp hop', s.hop, 0xff);
    checkBig('stamp ns', s.ns, I64_MIN, I64_MAX);
  }
}

/** Encoded length of `ctx`'s binary form. */
function binaryLength(ctx) {
  return HEADER_LEN + (ctx.otelTraceId ? TRACE_ID_LEN : 0) + STAMP_LEN * ctx.stamps.length;
}

/** Writes the binary form of `ctx` into `out` at `at`; returns the end offset. */
function encodeInto(ctx, out, at) {
  validate(ctx);
  const hasId = Boolean(ctx.otelTraceId);
  out[at] = VERSION;
  out[at + 1] = ctx.stamps.length | (hasId ? 0x80 : 0);
  out.writeUInt16LE(ctx.publisher, at + 2);
  out.writeUInt32LE(ctx.stream, at + 4);
  out.writeBigUInt64LE(ctx.sequence, at + 8);
  out.writeUInt32LE(ctx.metricCount, at + 16);
  out.writeBigInt64LE(ctx.intendedNs, at + 20);
  let p = at + HEADER_LEN;
  if (hasId) {
    out.set(ctx.otelTraceId, p);
    p += TRACE_ID_LEN;
  }
  for (const s of ctx.stamps) {
    out[p] = s.hop;
    out.writeBigInt64LE(s.ns, p + 1);
    p += STAMP_LEN;
  }
  return p;
}

/** The binary form of `ctx`. */
function encode(ctx) {
  const out = Buffer.allocUnsafe(binaryLength(ctx));
  encodeInto(ctx, out, 0);
  return out;
}

/** `bytes` as a Buffer (a view, not a copy). */
function asBuffer(bytes) {
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
}

/**
 * Checks a binary form against every rule of the document, in the document's order,
 * without building the context. Throws a DecodeError; returns the buffer.
 * @param {Uint8Array} bytes
 */
function check(bytes) {
  const b = asBuffer(bytes);
  if (b.length < HEADER_LEN) throw new DecodeError('truncated', `${b.length} bytes, at least 28 needed`);
  if (b[0] !== VERSION) throw new DecodeError('unsupported_version', `version byte ${b[0]}`);
  const info = b[1];
  const n = info & 0x1f;
  if (n > MAX_STAMPS) throw new DecodeError('too_many_stamps', `${n} stamps`);
  if (info & 0x60) throw new DecodeError('reserved_bits', `info byte 0x${info.toString(16)}`);
  const hasId = (info & 0x80) !== 0;
  const len = HEADER_LEN + (hasId ? TRACE_ID_LEN : 0) + STAMP_LEN * n;
  if (b.length < len) throw new DecodeError('truncated', `${b.length} bytes, ${len} declared`);
  if (b.length > len) throw new DecodeError('trailing_bytes', `${b.length} bytes, ${len} declared`);
  if (hasId) {
    let zero = true;
    for (let i = HEADER_LEN; i < HEADER_LEN + TRACE_ID_LEN; i++) {
      if (b[i] !== 0) {
        zero = false;
        break;
      }
    }
    if (zero) throw new DecodeError('invalid_trace_id', 'all zeros');
  }
  return b;
}

/**
 * Decodes a binary form, checking the document's rules in the document's order.
 * @param {Uint8Array} bytes
 */
function decode(bytes) {
  const b = check(bytes);
  const n = b[1] & 0x1f;
  const hasId = (b[1] & 0x80) !== 0;
  let otelTraceId = null;
  let p = HEADER_LEN;
  if (hasId) {
    otelTraceId = Buffer.from(b.subarray(p, p + TRACE_ID_LEN));
    p += TRACE_ID_LEN;
  }
  const stamps = new Array(n);
  for (let i = 0; i < n; i++) {
    stamps[i] = { hop: b[p], ns: b.readBigInt64LE(p + 1) };
    p += STAMP_LEN;
  }
  return {
    publisher: b.readUInt16LE(2),
    stream: b.readUInt32LE(4),
    sequence: b.readBigUInt64LE(8),
    metricCount: b.readUInt32LE(16),
    intendedNs: b.readBigInt64LE(20),
    otelTraceId,
    stamps,
  };
}

/**
 * A checked binary form with one more stamp: 9 bytes appended and N incremented, as the
 * document's stamping rule says; null (nothing changed) when it already holds 16.
 * @param {Buffer} b a binary form that passed check()
 */
function appendStamp(b, hop, ns) {
  if ((b[1] & 0x1f) >= MAX_STAMPS) return null;
  const out = Buffer.allocUnsafe(b.length + STAMP_LEN);
  b.copy(out, 0);
  out[1] = b[1] + 1;
  out[b.length] = hop;
  out.writeBigInt64LE(ns, b.length + 1);
  return out;
}

/** Whether a checked binary form carries a trace id. */
function hasTraceId(b) {
  return (b[1] & 0x80) !== 0;
}

/** A checked binary form given the trace id `id` (16 bytes); unchanged when it has one. */
function withTraceId(b, id) {
  if (hasTraceId(b)) return b;
  const out = Buffer.allocUnsafe(b.length + TRACE_ID_LEN);
  b.copy(out, 0, 0, HEADER_LEN);
  out[1] = b[1] | 0x80;
  out.set(id, HEADER_LEN);
  b.copy(out, HEADER_LEN + TRACE_ID_LEN, HEADER_LEN);
  return out;
}

// base64url value of each character code, -1 when outside the alphabet.
const B64URL = new Int8Array(128).fill(-1);
'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  .split('')
  .forEach((c, i) => { B64URL[c.charCodeAt(0)] = i; });

/** The text form of `ctx`: `ht1.` + base64url without padding. */
function encodeText(ctx) {
  return TEXT_PREFIX + encode(ctx).toString('base64url');
}

/**
 * The binary form inside a text form, checked: the prefix, canonical base64url, then the
 * binary rules.
 * @param {string} text
 */
function textToBinary(text) {
  if (typeof text !== 'string' || !text.startsWith(TEXT_PREFIX)) {
    throw new DecodeError('bad_text_prefix');
  }
  const len = text.length - TEXT_PREFIX.length;
  let last = 0;
  for (let i = TEXT_PREFIX.length; i < text.length; i++) {
    const c = text.charCodeAt(i);
    last = c < 128 ? B64URL[c] : -1;
    if (last < 0) throw new DecodeError('bad_base64', `character ${JSON.stringify(text[i])} at ${i}`);
  }
  if (len % 4 === 1) throw new DecodeError('bad_base64', 'length is 1 modulo 4');
  // The last character of a 2- or 3-character group carries 4 or 2 unused low bits.
  if ((len % 4 === 2 && (last & 0x0f)) || (len % 4 === 3 && (last & 0x03))) {
    throw new DecodeError('bad_base64', 'non-zero unused bits (not canonical)');
  }
  return check(Buffer.from(text.slice(TEXT_PREFIX.length), 'base64url'));
}

/** The text form of a binary form. */
function binaryToText(b) {
  return TEXT_PREFIX + asBuffer(b).toString('base64url');
}

/**
 * Decodes a text form: prefix, canonical base64url, then the binary rules.
 * @param {string} text
 */
function decodeText(text) {
  return decode(textToBinary(text));
}

/**
 * The envelope of `ctx` around `payload` (bytes).
 * @param {object} ctx
 * @param {Uint8Array} payload
 */
function wrapEnvelope(ctx, payload) {
  const n = binaryLength(ctx);
  const out = Buffer.allocUnsafe(ENVELOPE_PREFIX_LEN + n + payload.length);
  MAGIC.copy(out, 0);
  out[4] = n;
  encodeInto(ctx, out, ENVELOPE_PREFIX_LEN);
  out.set(payload, ENVELOPE_PREFIX_LEN + n);
  return out;
}

/** Whether `bytes` starts with the four magic bytes. */
function isEnveloped(bytes) {
  return bytes.length >= 4 && bytes[0] === 0xff && bytes[1] === 0x48 && bytes[2] === 0x54 && bytes[3] === 0x31;
}

/**
 * Splits an enveloped message into its checked binary context and the original payload
 * (views of `bytes`, not copies).
 * @param {Buffer} bytes
 * @returns {{binary: Buffer, payload: Buffer}}
 */
function splitEnvelope(bytes) {
  if (!isEnveloped(bytes)) throw new DecodeError('not_enveloped');
  if (bytes.length < ENVELOPE_PREFIX_LEN) throw new DecodeError('truncated', 'no length byte');
  const l = bytes[4];
  const end = ENVELOPE_PREFIX_LEN + l;
  if (bytes.length < end) throw new DecodeError('truncated', `length byte ${l}, ${bytes.length - 5} bytes follow`);
  return { binary: check(bytes.subarray(ENVELOPE_PREFIX_LEN, end)), payload: bytes.subarray(end) };
}

/**
 * Splits an enveloped message into its context and the original payload (a view of
 * `bytes`, not a copy).
 * @param {Buffer} bytes
 * @returns {{context: object, payload: Buffer}}
 */
function unwrapEnvelope(bytes) {
  const { binary, payload } = splitEnvelope(bytes);
  return { context: decode(binary), payload };
}

/** The envelope of a binary form around `payload`. */
function wrapBinary(binary, payload) {
  const out = Buffer.allocUnsafe(ENVELOPE_PREFIX_LEN + binary.length + payload.length);
  MAGIC.copy(out, 0);
  out[4] = binary.length;
  out.set(binary, ENVELOPE_PREFIX_LEN);
  out.set(payload, ENVELOPE_PREFIX_LEN + binary.length);
  return out;
}

/** Appends a stamp; returns false (context unchanged) when it already holds 16. */
function pushStamp(ctx, hop, ns) {
  if (ctx.stamps.length >= MAX_STAMPS) return false;
  ctx.stamps.push({ hop, ns });
  return true;
}

module.exports = {
  VERSION,
  MAX_STAMPS,
  HEADER_LEN,
  TRACE_ID_LEN,
  STAMP_LEN,
  MAX_BINARY_LEN,
  TEXT_PREFIX,
  MAGIC,
  DecodeError,
  validate,
  binaryLength,
  encode,
  encodeInto,
  check,
  decode,
  appendStamp,
  hasTraceId,
  withTraceId,
  encodeText,
  textToBinary,
  binaryToText,
  decodeText,
  wrapEnvelope,
  wrapBinary,
  splitEnvelope,
  unwrapEnvelope,
  isEnveloped,
  pushStamp,
};
