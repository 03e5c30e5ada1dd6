'use strict';
// What a hoptrace node does to one message, apart from Node-RED: take the context,
// stamp it (in-band), report the stamp (out of band), and put the context back.
//
// Modes:
// - `in`  (the message just arrived from a broker): the context is read from the
//   carrier. The stamped context is written back to the carrier (user property or
//   header); an envelope is taken off the payload so the flow sees the original payload.
// - `out` (the message is about to leave): the context is read from `msg.hoptrace` (left
//   by an `in` node upstream), or from the carrier when that is absent, and the stamped
//   context is written to the carrier: the user property, the header, or an envelope
//   put around the payload.
// Both leave the stamped context's text form in `msg.hoptrace`, a string, so it survives
// the nodes between them (function, change, JSON, debug, context stores).

const ctxmod = require('./context');
const { carrier: makeCarrier } = require('./carriers');

const MSG_FIELD = 'hoptrace';

class HopStamper {
  /**
   * @param {object} o
   * @param {object} o.exporter report(ctx, hop, ns), count(name)
   * @param {object} o.clock nowNs()
   * @param {number} o.hopId
   * @param {'in'|'out'} o.mode
   * @param {'property'|'header'|'envelope'} o.carrier
   * @param {string} [o.headersPath] message property of the Kafka headers
   * @param {'buffer'|'utf8'|'json'} [o.payloadAs] the payload after an envelope is taken off
   */
  constructor(o) {
    if (o.mode !== 'in' && o.mode !== 'out') throw new RangeError(`mode must be in or out, got ${JSON.stringify(o.mode)}`);
    this.exporter = o.exporter;
    this.clock = o.clock;
    this.hopId = o.hopId;
    this.mode = o.mode;
    this.carrier = makeCarrier(o.carrier, { headersPath: o.headersPath });
    this.payloadAs = o.payloadAs || 'buffer';
    this.stamped = 0;
  }

  _fromField(msg) {
    try {
      return { kind: 'ok', binary: ctxmod.textToBinary(msg[MSG_FIELD]), badTraceparent: null };
    } catch (e) {
      if (e instanceof ctxmod.DecodeError) return { kind: 'bad_context', error: e };
      throw e;
    }
  }

  _unwrapped(rest) {
    switch (this.payloadAs) {
      case 'utf8':
        return rest.toString('utf8');
      case 'json': {
        const s = rest.toString('utf8');
        try {
          return JSON.parse(s);
        } catch (_) {
          return s;
        }
      }
      default:
        return Buffer.from(rest); // a copy: the envelope's bytes are not kept alive
    }
  }

  /**
   * Stamps and reports `msg` in place.
   * @returns {'stamped'|'not_traced'|'bad_context'} what happened (counted already)
   */
  process(msg) {
    const ns = this.clock.nowNs();
    const useField = this.mode === 'out' && typeof msg[MSG_FIELD] === 'string';
    const got = useField ? this._fromField(msg) : this.carrier.extract(msg);
    if (got.kind !== 'ok') {
      this.exporter.count(got.kind);
      return got.kind;
    }
    if (got.badTraceparent) this.exporter.count('bad_traceparent');
    // The context stays in its binary form: 9 bytes appended, the record copied from it.
    let bin = ctxmod.appendStamp(got.binary, this.hopId, ns);
    if (!bin) {
      this.exporter.count('stamps_full');
      bin = got.binary;
    }
    this.exporter.reportBinary(bin, this.hopId, ns);
    const text = ctxmod.binaryToText(bin);
    if (this.carrier.name === 'envelope') {
      if (this.mode === 'in') {
        msg.payload = this._unwrapped(got.payload);
      } else {
        if (useField) this._stripEnvelope(msg);
        else msg.payload = got.payload;
        this.carrier.inject(msg, bin);
      }
    } else if (this.carrier.name === 'property') {
      this.carrier.inject(msg, bin, text);
    } else {
      this.carrier.inject(msg, bin);
    }
    msg[MSG_FIELD] = text;
    this.stamped += 1;
    return 'stamped';
  }

  /** An envelope already on the payload is replaced, never nested. */
  _stripEnvelope(msg) {
    const p = msg.payload;
    if (!(p instanceof Uint8Array)) return;
    const got = this.carrier.extract(msg);
    if (got.kind === 'ok') msg.payload = got.payload;
  }
}

module.exports = { HopStamper, MSG_FIELD };
