'use strict';
// The exporter's bounded record queue: a ring of fixed 52-byte slots holding records
// already encoded as the Records frame lays them out (docs/collector-protocol.md), so
// report() copies a few fields and allocates nothing.
//
// Three positions split the ring (all counting up, a slot is position % capacity):
//
//   head ........ sendPos ........ tail
//   | held, sent,  | queued, not   |
//   | not released | sent yet      |
//
// A record is released (its slot reused) when the protocol no longer needs it. Protocol
// version 1 releases a frame's records once the socket has taken them. Version 2 releases
// them as soon as the frame is built: the frame's bytes then live in the retention buffer
// (lib/retention.js) until the collector acknowledges them, bounded on its own, oldest
// dropped first, as the protocol requires. The capacity bounds held and queued records
// together, so the memory bound and the `queue_full` count keep their meaning in both.

const { writeRecord, writeRecordFromBinary, TYPE, RECORD_LEN_WITH_ID } = require('./protocol');

const SLOT = RECORD_LEN_WITH_ID;

class RecordRing {
  /** @param {number} capacity most records held at once */
  constructor(capacity) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError('queue capacity must be a positive integer');
    this.capacity = capacity;
    this.slots = Buffer.alloc(capacity * SLOT);
    this.lens = new Uint8Array(capacity);
    this.head = 0;
    this.sendPos = 0;
    this.tail = 0;
  }

  /** Records waiting to be sent. */
  get queued() {
    return this.tail - this.sendPos;
  }

  /** Records in the ring (sent but not released, and queued). */
  get held() {
    return this.tail - this.head;
  }

  /**
   * Appends the record of `hop` stamping `ctx` at `stampNs`; false when the ring is full.
   */
  push(ctx, hop, stampNs) {
    if (this.tail - this.head >= this.capacity) return false;
    const i = this.tail % this.capacity;
    this.lens[i] = writeRecord(this.slots, i * SLOT, ctx, hop, stampNs);
    this.tail += 1;
    return true;
  }

  /** As push(), from a checked binary context. */
  pushBinary(bin, hop, stampNs) {
    if (this.tail - this.head >= this.capacity) return false;
    const i = this.tail % this.capacity;
    this.lens[i] = writeRecordFromBinary(this.slots, i * SLOT, bin, hop, stampNs);
    this.tail += 1;
    return true;
  }

  /**
   * A Records frame of up to `max` queued records, from sendPos on (a copy: the slots can
   * be released at once); advances sendPos. With `seq` (version 2) a SeqRecords frame of
   * that number.
   * @returns {{frame: Buffer, count: number, end: number} | null}
   */
  takeFrame(max, seq = null) {
    const count = Math.min(max, this.queued);
    if (count === 0) return null;
    const head = seq === null ? 9 : 17;
    let size = head;
    for (let p = this.sendPos; p < this.sendPos + count; p++) size += this.lens[p % this.capacity];
    const frame = Buffer.allocUnsafe(size);
    frame.writeUInt32LE(size - 4, 0);
    frame[4] = seq === null ? TYPE.RECORDS : TYPE.SEQ_RECORDS;
    if (seq !== null) frame.writeBigUInt64LE(BigInt(seq), 5);
    frame.writeUInt32LE(count, head - 4);
    let o = head;
    for (let p = this.sendPos; p < this.sendPos + count; p++) {
      const i = p % this.capacity;
      const len = this.lens[i];
      this.slots.copy(frame, o, i * SLOT, i * SLOT + len);
      o += len;
    }
    this.sendPos += count;
    return { frame, count, end: this.sendPos };
  }

  /** Releases every record before position `upTo` (never past sendPos). */
  release(upTo) {
    const to = Math.min(upTo, this.sendPos);
    if (to > this.head) this.head = to;
  }

  /** Sends the held records again from the oldest (a reconnect under durable acks). */
  rewind() {
    this.sendPos = this.head;
  }

  /** Drops every record not yet released; returns how many. */
  clear() {
    const n = this.held;
    this.head = this.tail;
    this.sendPos = this.tail;
    return n;
  }
}

module.exports = { RecordRing, SLOT };
