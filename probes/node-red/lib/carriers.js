'use strict';
// Carriers: where a Node-RED message holds the trace context (docs/trace-format.md,
// "Carriers"). One carrier per node, chosen by configuration, never by guessing:
//
// - `property`: MQTT v5 user property `hoptrace` (text form) in `msg.userProperties`, as
//   Node-RED's `mqtt in` node (MQTT v5) delivers it and `mqtt out` sends it;
// - `header`: Kafka record header `hoptrace` (binary form) in a message property that
//   holds the record's headers (`msg.headers` by default);
// - `envelope`: the envelope form at the start of a Buffer `msg.payload`.
//
// extract() returns an outcome and never throws on what a message holds:
//   { kind: 'ok', binary, badTraceparent, payload?, context }
//     binary: the context's checked binary form (a trace id lent by a traceparent
//     included); context: the same, decoded (computed when read); payload: the rest of
//     an enveloped payload
//   { kind: 'not_traced' }
//   { kind: 'bad_context', error }                      (error: a DecodeError)
// inject() takes a binary form (Buffer) or a context object.

const ctxmod = require('./context');
const traceparent = require('./traceparent');

const KEY = 'hoptrace';

/** A context taken from a message. */
class Extracted {
  constructor(binary, badTraceparent, payload) {
    this.kind = 'ok';
    this.binary = binary;
    this.badTraceparent = badTraceparent;
    if (payload !== undefined) this.payload = payload;
  }

  /** The context, decoded. */
  get context() {
    return ctxmod.decode(this.binary);
  }
}

function notTraced() {
  return { kind: 'not_traced' };
}

function bad(error) {
  return { kind: 'bad_context', error };
}

/** A binary form of `ctx`, which is one already (Buffer) or a context object. */
function binaryOf(ctx) {
  return Buffer.isBuffer(ctx) ? ctx : ctxmod.encode(ctx);
}

/**
 * Combines the last `hoptrace` value (checked by `checkLast`, which returns its binary
 * form) with the last `traceparent`.
 */
function combine(checkLast, tpValue) {
  let binary;
  try {
    binary = checkLast();
  } catch (e) {
    if (e instanceof ctxmod.DecodeError) return bad(e);
    throw e;
  }
  let badTraceparent = null;
  if (tpValue !== undefined) {
    const tp = traceparent.parse(tpValue);
    if (tp.error) badTraceparent = tp.error;
    else binary = ctxmod.withTraceId(binary, tp.traceId);
  }
  return new Extracted(binary, badTraceparent);
}

// ---------------------------------------------------------------------------------------
// MQTT v5 user property

/**
 * The last value of a user property. MQTT.js gives a repeated property as an array;
 * Node-RED's `mqtt in` turns every non-string value into JSON text, so a repeated
 * property arrives as the JSON of that array (`["ht1.…","ht1.…"]`). Both read as their
 * last element; no value of that shape can be a text form, so nothing is misread.
 */
function lastPropertyValue(v) {
  if (Array.isArray(v)) return v.length ? v[v.length - 1] : undefined;
  if (typeof v === 'string' && v.charCodeAt(0) === 0x5b /* [ */) {
    try {
      const a = JSON.parse(v);
      if (Array.isArray(a) && a.length && a.every((x) => typeof x === 'string')) return a[a.length - 1];
    } catch (_) {
      // not JSON: decoded as it is, and fails the prefix rule
    }
  }
  return v;
}

const property = {
  name: 'property',
  extract(msg) {
    const up = msg.userProperties;
    if (!up || typeof up !== 'object' || !Object.prototype.hasOwnProperty.call(up, KEY)) return notTraced();
    const value = lastPropertyValue(up[KEY]);
    const tp = Object.prototype.hasOwnProperty.call(up, traceparent.TRACEPARENT)
      ? lastPropertyValue(up[traceparent.TRACEPARENT])
      : undefined;
    return combine(() => ctxmod.textToBinary(value), tp);
  },
  /**
   * Sets the user property to the context's text form, replacing any earlier value.
   * `text`, when given, is that text form already.
   */
  inject(msg, ctx, text) {
    if (!msg.userProperties || typeof msg.userProperties !== 'object' || Array.isArray(msg.userProperties)) {
      msg.userProperties = {};
    }
    msg.userProperties[KEY] = text === undefined ? ctxmod.binaryToText(binaryOf(ctx)) : text;
  },
};

// ---------------------------------------------------------------------------------------
// Kafka record headers

/** Reads `msg.a.b.c` for the path `a.b.c`. */
function getPath(msg, path) {
  let v = msg;
  for (const part of path) {
    if (v === null || typeof v !== 'object') return undefined;
    v = v[part];
  }
  return v;
}

/** Sets `msg.a.b.c`, creating plain objects on the way. */
function setPath(msg, path, value) {
  let v = msg;
  for (let i = 0; i < path.length - 1; i++) {
    if (v[path[i]] === null || typeof v[path[i]] !== 'object') v[path[i]] = {};
    v = v[path[i]];
  }
  v[path[path.length - 1]] = value;
}

/**
 * A header value as bytes: a Buffer or Uint8Array as it is, a string as its UTF-8 bytes
 * (a Kafka node that turned a binary header into text has already lost bytes; the
 * binary rules then refuse it), a Buffer that went through JSON (`{type:'Buffer',
 * data:[…]}`) as its bytes. `null` (a header without value) reads as no bytes.
 */
function headerBytes(v) {
  if (Buffer.isBuffer(v)) return v;
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.length);
  if (typeof v === 'string') return Buffer.from(v, 'utf8');
  if (v && typeof v === 'object' && v.type === 'Buffer' && Array.isArray(v.data)) return Buffer.from(v.data);
  return Buffer.alloc(0);
}

/**
 * The shapes Kafka nodes give headers in:
 * - an object `{ key: value | [values] }` (KafkaJS `IHeaders`: a repeated key becomes an
 *   array, in record order);
 * - an array of `{ key, value }` records;
 * - an array of one-key objects `[{ key: value }, …]` (node-rdkafka).
 * Returns the last `hoptrace` and the last `traceparent` value.
 */
function lastHeaders(headers) {
  let ctx;
  let tp;
  if (Array.isArray(headers)) {
    for (const h of headers) {
      if (!h || typeof h !== 'object') continue;
      if (Object.prototype.hasOwnProperty.call(h, 'key') && Object.prototype.hasOwnProperty.call(h, 'value')) {
        if (h.key === KEY) ctx = { v: h.value };
        else if (h.key === traceparent.TRACEPARENT) tp = { v: h.value };
      } else {
        for (const k of Object.keys(h)) {
          if (k === KEY) ctx = { v: h[k] };
          else if (k === traceparent.TRACEPARENT) tp = { v: h[k] };
        }
      }
    }
  } else {
    const last = (v) => (Array.isArray(v) ? (v.length ? { v: v[v.length - 1] } : undefined) : { v });
    if (Object.prototype.hasOwnProperty.call(headers, KEY)) ctx = last(headers[KEY]);
    if (Object.prototype.hasOwnProperty.call(headers, traceparent.TRACEPARENT)) tp = last(headers[traceparent.TRACEPARENT]);
  }
  return { ctx, tp };
}

/**
 * The Kafka header carrier reading the headers at `path` of the message (`headers`, or
 * `payload.headers` for Kafka nodes that put the whole record in the payload).
 * @param {string} [path]
 */
function header(path = 'headers') {
  const parts = String(path).replace(/^msg\./, '').split('.').filter(Boolean);
  if (parts.length === 0) throw new RangeError('the headers property must name a message property');
  return {
    name: 'header',
    path: parts.join('.'),
    extract(msg) {
      const headers = getPath(msg, parts);
      if (!headers || typeof headers !== 'object') return notTraced();
      const { ctx, tp } = lastHeaders(headers);
      if (!ctx) return notTraced();
      return combine(() => ctxmod.check(headerBytes(ctx.v)), tp ? tp.v : undefined);
    },
    /** Sets the header `hoptrace` to the binary form, replacing earlier values, in the
     * shape the headers already have (an object when there are none). */
    inject(msg, ctx) {
      const bin = binaryOf(ctx);
      const headers = getPath(msg, parts);
      if (Array.isArray(headers)) {
        const recordShape = headers.length > 0 && headers.every((h) => h && typeof h === 'object' && 'key' in h && 'value' in h);
        const kept = headers.filter((h) => {
          if (!h || typeof h !== 'object') return true;
          if ('key' in h && 'value' in h) return h.key !== KEY;
          return !Object.prototype.hasOwnProperty.call(h, KEY);
        });
        kept.push(recordShape || headers.length === 0 ? { key: KEY, value: bin } : { [KEY]: bin });
        setPath(msg, parts, kept);
      } else if (headers && typeof headers === 'object') {
        headers[KEY] = bin;
      } else {
        setPath(msg, parts, { [KEY]: bin });
      }
    },
  };
}

// ---------------------------------------------------------------------------------------
// Envelope

/** A payload as bytes, as `mqtt out` would send it. */
function payloadBytes(p) {
  if (Buffer.isBuffer(p)) return p;
  if (p instanceof Uint8Array) return Buffer.from(p.buffer, p.byteOffset, p.length);
  if (p === undefined || p === null) return Buffer.alloc(0);
  if (typeof p === 'object') return Buffer.from(JSON.stringify(p), 'utf8');
  return Buffer.from(String(p), 'utf8');
}

const envelope = {
  name: 'envelope',
  /** Only a Buffer payload can hold an envelope (its first byte, 0xFF, is never UTF-8). */
  extract(msg) {
    const p = msg.payload;
    if (!(p instanceof Uint8Array)) return notTraced();
    const bytes = Buffer.isBuffer(p) ? p : Buffer.from(p.buffer, p.byteOffset, p.length);
    if (!ctxmod.isEnveloped(bytes)) return notTraced();
    try {
      const { binary, payload } = ctxmod.splitEnvelope(bytes);
      return new Extracted(binary, null, payload);
    } catch (e) {
      if (e instanceof ctxmod.DecodeError) return bad(e);
      throw e;
    }
  },
  /** Puts the envelope of the context in front of the payload (as bytes). */
  inject(msg, ctx) {
    msg.payload = ctxmod.wrapBinary(binaryOf(ctx), payloadBytes(msg.payload));
  },
};

/** The carrier named `name` (`property`, `header`, `envelope`). */
function carrier(name, options = {}) {
  switch (name) {
    case 'property':
      return property;
    case 'header':
      return header(options.headersPath || 'headers');
    case 'envelope':
      return envelope;
    default:
      throw new RangeError(`unknown carrier ${JSON.stringify(name)}: property, header or envelope`);
  }
}

module.exports = { KEY, carrier, property, header, envelope, payloadBytes, lastPropertyValue };
