'use strict';
// W3C `traceparent` (version 00 only), read so that a context without a trace id of its
// own borrows the OpenTelemetry trace id that travelled beside it (docs/trace-format.md,
// "Carriers").

const TRACEPARENT = 'traceparent';

function hexNibble(c) {
  if (c >= 0x30 && c <= 0x39) return c - 0x30; // 0-9
  if (c >= 0x61 && c <= 0x66) return c - 0x61 + 10; // a-f
  return -1;
}

/**
 * Parses a traceparent value (string or bytes).
 * @returns {{traceId: Buffer} | {error: 'malformed'|'unsupported_version'|'zero_id'}}
 */
function parse(value) {
  let s;
  if (typeof value === 'string') s = value;
  else if (value instanceof Uint8Array) s = Buffer.from(value.buffer, value.byteOffset, value.length).toString('latin1');
  else return { error: 'malformed' };
  if (s.length !== 55 || s[2] !== '-' || s[35] !== '-' || s[52] !== '-') return { error: 'malformed' };
  const bytes = Buffer.alloc(27); // version 1, trace id 16, parent id 8, flags 1
  const fields = [[0, 2], [3, 35], [36, 52], [53, 55]];
  let o = 0;
  for (const [from, to] of fields) {
    for (let i = from; i < to; i += 2) {
      const hi = hexNibble(s.charCodeAt(i));
      const lo = hexNibble(s.charCodeAt(i + 1));
      if (hi < 0 || lo < 0) return { error: 'malformed' };
      bytes[o++] = (hi << 4) | lo;
    }
  }
  if (bytes[0] !== 0) return { error: 'unsupported_version' };
  const traceId = bytes.subarray(1, 17);
  const parentId = bytes.subarray(17, 25);
  if (traceId.every((b) => b === 0) || parentId.every((b) => b === 0)) return { error: 'zero_id' };
  return { traceId: Buffer.from(traceId) };
}

module.exports = { TRACEPARENT, parse };
