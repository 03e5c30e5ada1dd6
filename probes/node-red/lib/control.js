'use strict';
// Frames other than records that wait for the collector (exporter.sendFrame() and the
// exporter's own Clock frames), bounded however long the collector is away. The cumulative
// kinds keep only what the collector would keep (docs/collector-protocol.md):
//
// - Sent: one entry per (publisher, stream), the newest; an entry is a snapshot of the
//   stream's totals, so a newer one replaces an older one and nothing is lost.
// - Counters: one value per counter id, the newest (each value is cumulative and the
//   collector keeps the latest value of each id); the frame's at_ns is the newest.
// - Clock: the newest status only.
//
// Records frames wait in a first-in first-out list of at most `maxOther` frames; beyond it
// the new frame is refused (the exporter counts its records as `queue_full`). Frames only
// the exporter sends (Hello, SeqRecords, Goodbye) or only a collector sends are refused
// with a RangeError.
//
// Frames come and go encoded, as the exporter writes them.

const protocol = require('./protocol');

const { TYPE } = protocol;
const MAX_COUNTERS_PER_FRAME = 255; // the count is a u8

class ControlFrames {
  /** @param {number} maxOther most Records frames waiting */
  constructor(maxOther) {
    if (!Number.isInteger(maxOther) || maxOther < 0) throw new RangeError('maxControlFrames must be an integer >= 0');
    this.maxOther = maxOther;
    this.sent = new Map(); // `${publisher}:${stream}` -> [publisher, entry]
    this.counters = new Map(); // id -> bigint value
    this.countersAt = null; // bigint at_ns of the newest Counters frame
    this.clock = null; // the newest Clock frame, encoded
    this.other = []; // Records frames, encoded, oldest first
    this.otherRecords = 0; // records in them
    this.refused = 0; // Records frames refused because maxOther waited
    this.refusedRecords = 0; // records in them
  }

  /** Whether nothing waits. */
  get empty() {
    return this.sent.size === 0 && this.counters.size === 0 && this.clock === null && this.other.length === 0;
  }

  /** [Sent entries, counter ids, clock statuses (0 or 1), Records frames] waiting. */
  footprint() {
    return [this.sent.size, this.counters.size, this.clock === null ? 0 : 1, this.other.length];
  }

  /**
   * Keeps the encoded `frame` until take(); returns false when it was a Records frame and
   * `maxOther` of them waited already (counted in `refused` and `refusedRecords`).
   */
  push(frame) {
    if (!Buffer.isBuffer(frame) || frame.length < 5 || frame.readUInt32LE(0) !== frame.length - 4) {
      throw new RangeError('sendFrame takes one encoded frame (a Buffer from lib/protocol.js)');
    }
    const type = frame[4];
    switch (type) {
      case TYPE.SENT: {
        const f = protocol.decodeFrame(type, frame.subarray(5));
        for (const e of f.entries) this.sent.set(`${f.publisher}:${e.stream}`, [f.publisher, e]);
        return true;
      }
      case TYPE.COUNTERS: {
        const f = protocol.decodeFrame(type, frame.subarray(5));
        for (const [id, v] of f.values) this.counters.set(id, v);
        if (this.countersAt === null || f.atNs > this.countersAt) this.countersAt = f.atNs;
        return true;
      }
      case TYPE.CLOCK:
        protocol.decodeFrame(type, frame.subarray(5)); // a malformed frame is refused here
        this.clock = frame;
        return true;
      case TYPE.RECORDS: {
        const records = frame.readUInt32LE(5);
        if (this.other.length < this.maxOther) {
          this.other.push(frame);
          this.otherRecords += records;
          return true;
        }
        this.refused += 1;
        this.refusedRecords += records;
        return false;
      }
      default:
        throw new RangeError(`frames of type 0x${type.toString(16).padStart(2, '0')} are the exporter's own or the ` +
          "collector's: sendFrame takes Sent, Counters, Clock and Records");
    }
  }

  /**
   * Everything waiting, encoded, in this order: Clock, Sent (per publisher, at most
   * MAX_SENT_PER_FRAME entries each), Counters, then the Records frames in the order they
   * came, with the number of records in those; nothing waits afterwards.
   * @returns {{frames: Buffer[], records: number}}
   */
  take() {
    const frames = [];
    if (this.clock) frames.push(this.clock);
    const byPublisher = new Map();
    for (const [publisher, e] of this.sent.values()) {
      if (!byPublisher.has(publisher)) byPublisher.set(publisher, []);
      byPublisher.get(publisher).push(e);
    }
    for (const [publisher, entries] of byPublisher) {
      entries.sort((a, b) => a.stream - b.stream);
      for (let i = 0; i < entries.length; i += protocol.MAX_SENT_PER_FRAME) {
        frames.push(protocol.encodeSent({ publisher, entries: entries.slice(i, i + protocol.MAX_SENT_PER_FRAME) }));
      }
    }
    const values = [...this.counters].sort((a, b) => a[0] - b[0]);
    for (let i = 0; i < values.length; i += MAX_COUNTERS_PER_FRAME) {
      frames.push(protocol.encodeCounters({ atNs: this.countersAt, values: values.slice(i, i + MAX_COUNTERS_PER_FRAME) }));
    }
    frames.push(...this.other);
    const records = this.otherRecords;
    this.sent = new Map();
    this.counters = new Map();
    this.countersAt = null;
    this.clock = null;
    this.other = [];
    this.otherRecords = 0;
    return { frames, records };
  }
}

module.exports = { ControlFrames, MAX_COUNTERS_PER_FRAME };
