'use strict';
// The records frames an exporter keeps until the collector acknowledges them as durable
// (collector protocol version 2, docs/collector-protocol.md "0x07 SeqRecords"): bounded in
// bytes, oldest dropped first, and every dropped record accounted for once the exporter
// learns what the collector holds. The bookkeeping of the Rust probe's
// probe/src/retention.rs, case for case (test/retention.test.js runs its tests).
//
// Frame numbers are plain numbers (exact to 2^53 frames).

class Retention {
  /** @param {number} maxBytes most bytes of frames kept */
  constructor(maxBytes) {
    this.maxBytes = maxBytes;
    this.frames = []; // [{ seq, records, data: Buffer, written }], oldest first
    this.first = 0; // index of the oldest kept frame in `frames` (shifted lazily)
    this.bytes = 0;
    // Frames dropped unacknowledged, [seq, records, written], oldest first: whether a
    // written one is lost is known only when the collector says what it holds. Only the
    // newest may be unwritten here (it can still be marked written).
    this.evicted = [];
    // Records of older frames dropped before they were ever written: no collector holds
    // them. A sum, so that a long outage costs no memory beyond the bound.
    this.evictedUnwritten = 0;
    this.acked = 0;
  }

  get length() {
    return this.frames.length - this.first;
  }

  _front() {
    return this.frames[this.first];
  }

  _shift() {
    const f = this.frames[this.first];
    this.frames[this.first] = undefined;
    this.first += 1;
    if (this.first > 1024 && this.first * 2 > this.frames.length) {
      this.frames = this.frames.slice(this.first);
      this.first = 0;
    }
    return f;
  }

  _settleEvictedUnwritten() {
    const last = this.evicted[this.evicted.length - 1];
    if (last && !last[2]) {
      this.evicted.pop();
      this.evictedUnwritten += last[1];
    }
  }

  /** Keeps a frame; returns the records of older frames dropped to make room (`evicted`). */
  push(frame) {
    this._settleEvictedUnwritten();
    this.bytes += frame.data.length;
    this.frames.push(frame);
    let dropped = 0;
    while (this.bytes > this.maxBytes && this.length > 0) {
      const old = this._shift();
      this.bytes -= old.data.length;
      dropped += old.records;
      this.evicted.push([old.seq, old.records, old.written]);
      // An unwritten frame that is not the newest will never be written.
      if (this.length > 0 && this.frames[this.frames.length - 1].seq > old.seq) this._settleEvictedUnwritten();
    }
    return dropped;
  }

  /** The collector holds every frame up to `seq` durably. */
  ack(seq) {
    if (seq <= this.acked) return;
    this.acked = seq;
    while (this.length > 0 && this._front().seq <= seq) this.bytes -= this._shift().data.length;
    while (this.evicted.length && this.evicted[0][0] <= seq) this.evicted.shift();
  }

  /**
   * After a (re)connection the collector holds frames up to `resumeSeq`: forgets those and
   * returns the records of evicted frames above it, which are lost. The frames kept are
   * then to be sent again (kept()).
   */
  resume(resumeSeq) {
    this.ack(resumeSeq);
    this.acked = resumeSeq; // a restarted collector may hold less than it acknowledged
    const lost = this.evicted.reduce((a, e) => a + e[1], 0) + this.evictedUnwritten;
    this.evicted = [];
    this.evictedUnwritten = 0;
    return lost;
  }

  /** The frames kept, oldest first. */
  kept() {
    return this.frames.slice(this.first);
  }

  /** The newest frame, number `seq`, was handed to a connection. */
  markWritten(seq) {
    const last = this.frames[this.frames.length - 1];
    if (this.length > 0 && last.seq === seq) {
      last.written = true;
      return;
    }
    const e = this.evicted[this.evicted.length - 1];
    if (e && e[0] === seq) e[2] = true;
  }

  /** Records of evicted frames whose fate no collector told: [written, never written]. */
  evictedUnresolved() {
    let written = 0;
    let unwritten = this.evictedUnwritten;
    for (const [, n, w] of this.evicted) {
      if (w) written += n;
      else unwritten += n;
    }
    return [written, unwritten];
  }

  /** Records kept that were never handed to a connection. */
  unwrittenRecords() {
    return this.kept().reduce((a, f) => a + (f.written ? 0 : f.records), 0);
  }

  /** Records kept, not yet acknowledged. */
  unackedRecords() {
    return this.kept().reduce((a, f) => a + f.records, 0);
  }

  /** [bytes of frames kept, entries kept about evicted frames]. */
  footprint() {
    return [this.bytes, this.evicted.length];
  }
}

module.exports = { Retention };
