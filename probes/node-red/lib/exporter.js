'use strict';
// The exporter: one TCP connection to the collector (docs/collector-protocol.md) that
// carries the records of every hop of this process, the host's clock status and the
// counters; reconnects with backoff; flushes and says Goodbye on shutdown.
//
// report() only writes into a bounded ring (lib/ring.js) and schedules a flush on the
// event loop; it never waits for the network. When the ring is full the record is
// dropped and counted (`queue_full`); the counters reach the collector in Counters
// frames. Socket writes are asynchronous: while the socket does not take more (the
// collector is slow), no new frame is written and records wait in the ring.
//
// Counters are plain numbers (exact to 2^53, centuries of records at any rate); they are
// written as u64 on the wire.
//
// Protocol version 2 (a collector with its log, the default): records frames are numbered
// (SeqRecords, from 1 per exporter, across reconnections) and kept in a retention buffer
// (lib/retention.js, 64 MiB by default) until the collector acknowledges them as durable;
// a frame counts as `sent` when handed to the socket. After a reconnection (a collector
// killed and started again with the same run id) Welcome's `resume_seq` says what it
// holds: the rest is sent again, in order, before anything new (`resent`). While no
// collector is reachable the ring's records go on into numbered frames in the buffer;
// when it is full the oldest go (`evicted`), and those the collector never stored are
// `lost_unacked`. A collector that speaks only version 1 refuses the version 2 Hello
// (Reject code 1): the exporter says Hello again in version 1.
//
// Protocol version 1 has no acknowledgement: a Records frame counts as `sent` once the
// socket has taken it (its write callback), and its ring slots are released then; a frame
// the socket had not taken when the connection failed is `send_failed`.

const net = require('node:net');
const tls = require('node:tls');
const os = require('node:os');
const crypto = require('node:crypto');
const { EventEmitter } = require('node:events');

const protocol = require('./protocol');
const { RecordRing } = require('./ring');
const { Retention } = require('./retention');
const { ControlFrames } = require('./control');

const COUNTER_NAMES = Object.keys(protocol.COUNTER_ID);
const SOFTWARE = `node-red-contrib-hoptrace ${require('../package.json').version}`;
// How long a connection must have lasted for its loss to look like a collector restart.
const HEALTHY_CONNECTION_MS = 1000;

/** Splits `host:port` (or `[v6]:port`). */
function parseAddress(addr) {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(addr) || /^([^:]+):(\d+)$/.exec(addr);
  if (!m) throw new RangeError(`collector address ${JSON.stringify(addr)}: expected host:port`);
  const port = Number(m[2]);
  if (!(port > 0 && port < 65536)) throw new RangeError(`collector port ${m[2]} out of range`);
  return { host: m[1], port };
}

const DEFAULTS = {
  token: '',
  process: 'node-red',
  queueCapacity: 65536,
  maxBatch: 8192,
  clockIntervalMs: 5000,
  countersIntervalMs: 1000,
  connectTimeoutMs: 2000,
  writeTimeoutMs: 10000,
  backoffMinMs: 50,
  backoffMaxMs: 5000,
  tickMs: 50,
  retentionBytes: 64 << 20,
  // Version 2: entries kept about frames evicted after they were written, until the
  // collector acknowledges or (after a reconnection) says what it holds; past this many
  // the exporter connects again to learn it.
  maxEvictedFrames: 65536,
  // Records frames given to sendFrame() that wait for the collector at most.
  maxControlFrames: 64,
  protocolVersion: protocol.PROTOCOL_VERSION,
};

class Exporter extends EventEmitter {
  /**
   * @param {object} opts
   * @param {string} opts.collector `host:port`
   * @param {object} opts.clock a RealtimeClock (lib/clock.js): nowNs()
   * @param {object} [opts.clockStatus] reader with async read() returning Clock fields
   * @param {object} [opts.log] { info, warn, error } (strings)
   * @param {string|Buffer} [opts.tlsCa] speak TLS, trusting these PEM CA certificates
   * @param {string} [opts.tlsServerName] the name the collector's certificate must carry
   *   (default: the host of `collector`)
   */
  constructor(opts) {
    super();
    this.opts = { ...DEFAULTS, ...opts };
    this.address = parseAddress(this.opts.collector);
    this.clock = this.opts.clock;
    this.clockStatus = this.opts.clockStatus || null;
    const noop = () => {};
    this.log = { info: noop, warn: noop, error: noop, ...(this.opts.log || {}) };
    this.instanceId = this.opts.instanceId ?? crypto.randomBytes(8).readBigUInt64LE(0);
    this.host = this.opts.host || os.hostname();
    this.ring = new RecordRing(this.opts.queueCapacity);
    if (!protocol.VERSIONS.includes(this.opts.protocolVersion)) {
      throw new RangeError(`protocolVersion ${this.opts.protocolVersion}: 1 or 2`);
    }
    this.helloVersion = this.opts.protocolVersion;
    this.durable = false; // the current (or last) connection speaks version 2
    this.nextSeq = 1; // the next SeqRecords number
    this.resumeSeq = 0;
    this.retention = new Retention(this.opts.retentionBytes);
    this.unacknowledged = 0;
    this.counters = Object.fromEntries(COUNTER_NAMES.map((n) => [n, 0]));
    this.hops = new Map(); // id -> name
    this.announced = null; // Map id -> name of the current connection's Hello
    // Encoded frames other than records (Sent, Clock, ...), sent before records; bounded
    // (lib/control.js).
    this.control = new ControlFrames(this.opts.maxControlFrames);
    this.state = 'idle'; // idle | connecting | handshake | connected | closing | stopped
    this.sock = null;
    this.reader = null;
    this.blocked = false;
    this.blockedSince = 0;
    this.inflight = []; // [{ seq, end, count, done }] records frames handed to the socket
    this.frameSeq = 0; // frames written on this connection (what a durable ack would name)
    this.connectedOnce = false;
    this.backoffMs = this.opts.backoffMinMs;
    this.connectedAt = null;
    this.nextAttempt = 0;
    this.lastClock = -Infinity;
    this.lastCounters = -Infinity;
    this.clockReading = false;
    this.flushScheduled = false;
    this.stopping = null; // { deadline, resolve } while shutting down
    this.rehello = false;
    this.goodbyeWritten = false;
    this.runId = null;
    this.lastError = null;
    this.rejected = 0; // Hellos the collector refused (any code); not sent anywhere: no collector accepted us
    this.rejections = {}; // by Reject code
    this.rejectReasons = new Set();
    this.timer = null;
    this.flush = () => {
      this.flushScheduled = false;
      this._guard(() => this._pump());
    };
    this.closingSince = 0;
    this.connectStarted = 0;
  }

  // -------------------------------------------------------------------------------------
  // The API the nodes use

  /**
   * Sets the hops announced in Hello. A hop the current connection did not announce
   * makes the exporter flush, say Goodbye and connect again with a new Hello; a hop
   * that went away changes nothing until the next connection (announcing a hop that
   * sends nothing is harmless).
   */
  setHops(hops) {
    this.hops = new Map(hops);
    if (this.state === 'connected' && this.announced) {
      const missing = [...this.hops].some(([id, name]) => this.announced.get(id) !== name);
      if (missing) {
        this.rehello = true;
        this._schedule();
      }
    }
    if (this.state === 'idle' && this.hops.size > 0 && this.timer) this._tick();
  }

  /** Starts connecting in the background. */
  start() {
    if (this.timer || this.state === 'stopped') return;
    this.timer = setInterval(() => this._guard(() => this._tick()), this.opts.tickMs);
    this.timer.unref();
    this._tick();
  }

  /**
   * Runs `fn` from a timer or an I/O callback: an exception (a bug) must not take the
   * Node-RED process down; it is logged and the connection is started afresh.
   */
  _guard(fn) {
    try {
      fn();
    } catch (e) {
      this.log.error(`hoptrace exporter: ${e.stack || e}`);
      this._drop(e);
    }
  }

  /**
   * Hands the record of `hop` stamping `ctx` at `stampNs` (bigint) to the exporter.
   * @returns {boolean} false when it was dropped (counted as `queue_full`, or
   *   `send_failed` after shutdown)
   */
  report(ctx, hop, stampNs) {
    this.counters.reported += 1;
    if (this.state === 'stopped') {
      this.counters.send_failed += 1;
      return false;
    }
    if (!this.ring.push(ctx, hop, stampNs)) {
      this.counters.queue_full += 1;
      return false;
    }
    if (!this.flushScheduled && this.state === 'connected') {
      this.flushScheduled = true;
      setImmediate(this.flush);
    }
    return true;
  }

  /** As report(), from a checked binary context (lib/context.js check()). */
  reportBinary(bin, hop, stampNs) {
    this.counters.reported += 1;
    if (this.state === 'stopped') {
      this.counters.send_failed += 1;
      return false;
    }
    if (!this.ring.pushBinary(bin, hop, stampNs)) {
      this.counters.queue_full += 1;
      return false;
    }
    if (!this.flushScheduled && this.state === 'connected') {
      this.flushScheduled = true;
      setImmediate(this.flush);
    }
    return true;
  }

  /** Counts an event of the carriers: not_traced, bad_context, stamps_full, bad_traceparent. */
  count(name) {
    if (!(name in this.counters)) throw new RangeError(`unknown counter ${name}`);
    this.counters[name] += 1;
  }

  /**
   * Queues an encoded Sent, Counters, Clock or Records frame for the collector; never
   * waits. What waits is bounded however long the collector is away: a Sent entry replaces
   * the one of the same publisher and stream, a counter's value the one of the same id, a
   * Clock status the one before (all cumulative, so nothing is lost). Records frames wait
   * up to `maxControlFrames`; beyond it the frame is refused, its records counted as
   * `queue_full`, and false returned. Their records count as `reported`, and as `sent` or
   * `send_failed` as their write goes. Other kinds throw a RangeError.
   * @returns {boolean}
   */
  sendFrame(frame) {
    const records = frame[4] === protocol.TYPE.RECORDS && frame.length >= 9 ? frame.readUInt32LE(5) : 0;
    if (!this.control.push(frame)) {
      this.counters.reported += records;
      this.counters.queue_full += records;
      if (this.control.refused === 1) {
        this.log.warn(`${this.opts.maxControlFrames} Records frames given to sendFrame wait for the collector already: ` +
          'refusing more (their records are counted as queue_full)');
      }
      return false;
    }
    this.counters.reported += records;
    this._schedule();
    return true;
  }

  /**
   * What the exporter holds in memory now, each within its bound: records in the ring
   * (queueCapacity), bytes of frames retained for the collector's Ack (retentionBytes),
   * entries about frames evicted after they were written (maxEvictedFrames), and control
   * frames waiting ([Sent entries, counter ids, clock statuses, Records frames]).
   */
  footprint() {
    const [retainedBytes, evictedEntries] = this.retention.footprint();
    return { queued: this.ring.held, retainedBytes, evictedEntries, control: this.control.footprint() };
  }

  /** The counters now. */
  snapshot() {
    return { ...this.counters };
  }

  /** A short status for people: state, run id, last error, refused Hellos. */
  status() {
    return {
      state: this.state, runId: this.runId, lastError: this.lastError, queued: this.ring.queued, rejected: this.rejected,
    };
  }

  /**
   * Flushes what is queued, sends the final Counters and Goodbye, and closes. Records not
   * delivered within `timeoutMs` are counted as `send_failed`.
   * @returns {Promise<{clean: boolean, counters: object}>}
   */
  shutdown(timeoutMs = 5000) {
    if (this.state === 'stopped') {
      return Promise.resolve({ clean: this.clean === true, counters: this.snapshot(), unacknowledged: this.unacknowledged });
    }
    if (this.stopping) return this.stopping.promise;
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    this.stopping = { deadline: Date.now() + timeoutMs, resolve, promise };
    if (!this.timer) {
      this.timer = setInterval(() => this._guard(() => this._tick()), this.opts.tickMs);
      this.timer.unref();
    }
    this._tick();
    return promise;
  }

  // -------------------------------------------------------------------------------------
  // Connection

  _tick() {
    const now = Date.now();
    if (this.stopping && now >= this.stopping.deadline) {
      this._finish(false);
      return;
    }
    if (this.state === 'idle') {
      // Away from the collector (version 2): the ring's records wait, numbered, in the
      // retention buffer, whose bound drops the oldest first.
      if (this.durable) this._retainQueued();
      if (this.hops.size === 0) {
        if (this.stopping) this._finish(this.ring.held === 0 && this.control.empty);
        return;
      }
      if (now >= this.nextAttempt) this._connect();
      return;
    }
    if ((this.state === 'connecting' || this.state === 'handshake') && now - this.connectStarted > this.opts.connectTimeoutMs) {
      // The socket's timeout counts idle time only: a collector that trickles bytes, or
      // answers Welcome late, is given connectTimeoutMs in all.
      this._drop(new Error('no welcome in time'));
      return;
    }
    if (this.state === 'closing' && now - this.closingSince > this.opts.connectTimeoutMs + 5000) {
      // The collector never closed after Goodbye (nor after our end): give up on it.
      this.sock.destroy();
      return;
    }
    if (this.state === 'connected') {
      if (this.blocked && now - this.blockedSince > this.opts.writeTimeoutMs) {
        this._drop(new Error(`the collector took nothing for ${this.opts.writeTimeoutMs} ms`));
        return;
      }
      this._pump();
    }
  }

  _connect() {
    const hops = [...this.hops.entries()].sort((a, b) => a[0] - b[0]);
    this.announced = new Map(hops);
    this.state = 'connecting';
    this.connectStarted = Date.now();
    const { host, port } = this.address;
    let sock;
    if (this.opts.tlsCa) {
      const name = this.opts.tlsServerName;
      const o = { host, port, ca: this.opts.tlsCa };
      // The certificate must carry the given name, else the collector's host (an IP
      // address is checked against the certificate's IP addresses).
      if (name) {
        o.servername = name;
        o.checkServerIdentity = (_, cert) => tls.checkServerIdentity(name, cert);
      } else if (!net.isIP(host)) {
        o.servername = host;
      }
      sock = tls.connect(o);
    } else {
      sock = net.connect({ host, port });
    }
    this.sock = sock;
    this.reader = new protocol.FrameReader();
    sock.setNoDelay(true);
    sock.setTimeout(this.opts.connectTimeoutMs);
    sock.on('timeout', () => {
      if (this.sock === sock && this.state !== 'connected') this._drop(new Error('no welcome in time'));
    });
    sock.on(this.opts.tlsCa ? 'secureConnect' : 'connect', () => {
      if (this.sock !== sock) return;
      this.state = 'handshake';
      sock.write(protocol.encodeHello({
        version: this.helloVersion,
        instanceId: this.instanceId,
        host: this.host,
        process: this.opts.process,
        software: SOFTWARE,
        token: this.opts.token,
        hops,
      }));
    });
    sock.on('data', (chunk) => this._guard(() => this._onData(sock, chunk)));
    sock.on('drain', () => {
      if (this.sock !== sock) return;
      this.blocked = false;
      this._guard(() => this._pump());
    });
    sock.on('error', (e) => this._lost(sock, e));
    sock.on('close', () => this._lost(sock, null));
  }

  _onData(sock, chunk) {
    if (this.sock !== sock) return;
    this.reader.push(chunk);
    let f;
    for (;;) {
      try {
        f = this.reader.next();
      } catch (e) {
        this._drop(new Error(`the collector sent a bad frame: ${e.message}`));
        return;
      }
      if (!f) return;
      if (f.type === 'ack') {
        this.retention.ack(Number(f.seq));
      } else if (f.type === 'welcome' && this.state === 'handshake') {
        if (f.version > this.helloVersion) {
          this._drop(new Error(`the collector welcomed a version ${this.helloVersion} hello in version ${f.version}`));
          return;
        }
        sock.setTimeout(0);
        this.state = 'connected';
        this.runId = f.runId;
        this.durable = f.version >= 2;
        if (this.durable) this._resume(sock, Number(f.resumeSeq));
        this.lastError = null;
        this.frameSeq = 0;
        if (this.connectedOnce) this.counters.reconnects += 1;
        this.connectedOnce = true;
        this.connectedAt = Date.now();
        // A hop added while this Hello was on its way: say Hello again.
        if ([...this.hops].some(([id, name]) => this.announced.get(id) !== name)) this.rehello = true;
        this.lastClock = -Infinity;
        this.lastCounters = -Infinity;
        this.log.info(`connected to the collector ${this.opts.collector}, run ${f.runId}`);
        this.emit('connected', f.runId);
        this._pump();
      } else if (f.type === 'reject') {
        const e = new Error(`the collector rejected this probe (code ${f.code}): ${f.reason}`);
        if (this.state === 'handshake' && f.code === protocol.REJECT_CODE.version && this.helloVersion > 1) {
          // A collector that speaks only version 1: say Hello again in version 1, at once.
          this.log.warn(`the collector ${this.opts.collector} speaks only protocol version 1 (${f.reason}): ` +
            'connecting again without durable acknowledgements');
          this.helloVersion = 1;
          this.durable = false;
          this.sock = null;
          sock.destroy();
          this.state = 'idle';
          this.nextAttempt = 0;
          this._tick();
          return;
        }
        if (this.state === 'handshake') this._countReject(f.code, e.message);
        this._drop(e);
        return;
      } else {
        this._drop(new Error(`unexpected ${f.type} frame from the collector`));
        return;
      }
    }
  }

  /**
   * Counts a refused Hello. The first refusal of each reason is an error in the log: until
   * it is fixed nothing reaches the collector, so no Counters frame can tell it.
   */
  _countReject(code, message) {
    this.rejected += 1;
    this.rejections[code] = (this.rejections[code] || 0) + 1;
    if (!this.rejectReasons.has(message)) {
      this.rejectReasons.add(message);
      const hint = code === protocol.REJECT_CODE.token ? ' (set the collector node\'s Token to the collector\'s --token)'
        : code === protocol.REJECT_CODE.unknown_hop ? ' (the collector\'s pipeline spec must declare every hop with the same id and name)' : '';
      this.log.error(`${message}${hint}; nothing is delivered until the collector accepts this probe: records wait in ` +
        'the queue, beyond it they are counted as queue_full, and at shutdown as send_failed; retrying with backoff');
    }
  }

  /**
   * On a version 2 connection: forgets what the collector holds, counts what it lost of
   * the evicted frames, and sends the kept frames again, in order, before anything new.
   */
  _resume(sock, resumeSeq) {
    const lost = this.retention.resume(resumeSeq);
    if (lost > 0) {
      this.counters.lost_unacked += lost;
      this.log.error(`${lost} records evicted before the collector acknowledged them were not stored by it: ` +
        'lost, counted as lost_unacked');
    }
    let resent = 0;
    for (const f of this.retention.kept()) {
      this._write(f.data);
      if (f.written) {
        resent += f.records;
      } else {
        this.counters.sent += f.records;
        f.written = true;
      }
    }
    if (resent > 0) {
      this.counters.resent += resent;
      this.log.info(`sent ${resent} records the collector had not acknowledged again`);
    }
  }

  /** Moves what the ring holds into numbered frames in the retention buffer, unwritten. */
  _retainQueued() {
    const max = Math.min(this.opts.maxBatch, protocol.MAX_RECORDS_PER_FRAME);
    for (;;) {
      const seq = this.nextSeq;
      const f = this.ring.takeFrame(max, seq);
      if (!f) return;
      this.nextSeq += 1;
      this.ring.release(f.end);
      this._countEvicted(this.retention.push({ seq, records: f.count, data: f.frame, written: false }));
    }
  }

  _countEvicted(n) {
    if (n === 0) return;
    if (this.counters.evicted === 0) {
      this.log.warn(`the retention buffer (${this.opts.retentionBytes} bytes) is full: dropped the oldest unacknowledged ` +
        'records (counted as evicted; lost if the collector never stored them)');
    }
    this.counters.evicted += n;
  }

  /** Closes the connection after an error; lost() does the accounting. */
  _drop(err) {
    const sock = this.sock;
    if (!sock) return;
    this._lost(sock, err);
    sock.destroy();
  }

  _lost(sock, err) {
    if (this.sock !== sock) return;
    const wasClosing = this.state === 'closing';
    if (!err && (this.state === 'connecting' || this.state === 'handshake')) {
      err = new Error('the collector closed the connection before Welcome');
    }
    this.sock = null;
    this.blocked = false;
    // Protocol v1: a frame the socket had not taken when the connection died is lost.
    let failed = 0;
    for (const f of this.inflight) {
      if (!f.done) {
        f.done = true;
        failed += f.count;
      }
    }
    this.inflight = [];
    this.ring.release(this.ring.sendPos);
    if (failed > 0) {
      this.counters.send_failed += failed;
      this.log.error(`lost ${failed} records: the connection to the collector failed; counted as send_failed`);
    }
    // Closing, the Goodbye taken by the socket: a reset now is the collector closing
    // with bytes of ours unread (a TLS close_notify), after our Goodbye.
    const closedAfterGoodbye = wasClosing && this.goodbyeWritten &&
      (!err || err.code === 'ECONNRESET' || err.code === 'EPIPE');
    if (wasClosing && this.stopping) {
      this._finish(closedAfterGoodbye);
      return;
    }
    if (closedAfterGoodbye) {
      // A new hop list: connect again at once with a new Hello.
      this.state = 'idle';
      this.nextAttempt = 0;
      this._tick();
      return;
    }
    this.state = 'idle';
    if (err) {
      const msg = err.message || String(err);
      if (msg !== this.lastError) this.log.warn(`collector ${this.opts.collector}: ${msg}; retrying in ${this.backoffMs} ms`);
      this.lastError = msg;
      this.emit('disconnected', msg);
    }
    // A connection that lasted looks like a collector restart: at once, and the delay
    // starts over. One lost soon after Welcome (or never welcomed) counts as a failed
    // attempt, so a collector that welcomes and then fails is not reconnected to (and sent
    // the whole retention buffer again) in a tight loop.
    const now = Date.now();
    const lasted = this.connectedAt !== null && now - this.connectedAt >= HEALTHY_CONNECTION_MS;
    this.connectedAt = null;
    if (lasted) {
      this.backoffMs = this.opts.backoffMinMs;
      this.nextAttempt = now;
    } else {
      this.nextAttempt = now + this.backoffMs;
      this.backoffMs = Math.min(this.backoffMs * 2, this.opts.backoffMaxMs);
    }
  }

  // -------------------------------------------------------------------------------------
  // Sending

  _schedule() {
    if (!this.flushScheduled && this.state === 'connected') {
      this.flushScheduled = true;
      setImmediate(this.flush);
    }
  }

  _write(frame, onDone) {
    this.frameSeq += 1;
    if (!this.sock.write(frame, onDone)) {
      if (!this.blocked) this.blockedSince = Date.now();
      this.blocked = true;
    }
  }

  _counterValues() {
    return COUNTER_NAMES.map((n) => [protocol.COUNTER_ID[n], BigInt(this.counters[n])]);
  }

  _pump() {
    if (this.state !== 'connected' || this.blocked) return;
    const now = Date.now();
    const sock = this.sock;
    const finishing = this.stopping || this.rehello;
    sock.cork();
    try {
      if (this.clockStatus && now - this.lastClock >= this.opts.clockIntervalMs && !this.clockReading) {
        this.lastClock = now;
        this.clockReading = true;
        this.clockStatus.read().then((c) => {
          this.clockReading = false;
          if (this.sock === sock && this.state === 'connected') {
            this.control.push(protocol.encodeClock(c));
            this._schedule();
          }
        }).catch((e) => {
          this.clockReading = false;
          this.log.warn(`hoptrace exporter: no clock status: ${e.message}`);
          this._schedule();
        });
      }
      if (!this.control.empty) {
        // All at once: what waits is bounded (lib/control.js), blocked socket or not.
        const { frames, records } = this.control.take();
        for (const f of frames) this._write(f);
        this.counters.sent += records;
      }
      // At most a few frames per turn of the event loop, unless flushing for good.
      const max = Math.min(this.opts.maxBatch, protocol.MAX_RECORDS_PER_FRAME);
      for (let i = 0; (finishing || i < 4) && !this.blocked; i++) {
        if (this.durable) {
          // Version 2: numbered, kept until acknowledged; the ring's slots are free at once.
          const seq = this.nextSeq;
          const f = this.ring.takeFrame(max, seq);
          if (!f) break;
          this.nextSeq += 1;
          this.ring.release(f.end);
          this._countEvicted(this.retention.push({ seq, records: f.count, data: f.frame, written: false }));
          this._write(f.frame);
          this.retention.markWritten(seq);
          this.counters.sent += f.count;
          const evicted = this.retention.footprint()[1];
          if (evicted > this.opts.maxEvictedFrames) {
            // Only a new Welcome tells what became of them: connect again.
            this._drop(new Error(`the collector acknowledged none of the ${evicted} frames evicted since they were ` +
              'written: connecting again to learn which it holds'));
            return;
          }
          continue;
        }
        const f = this.ring.takeFrame(max);
        if (!f) break;
        const entry = { seq: this.frameSeq + 1, end: f.end, count: f.count, done: false };
        this.inflight.push(entry);
        this._write(f.frame, (err) => this._written(sock, entry, err));
      }
      if (!finishing && now - this.lastCounters >= this.opts.countersIntervalMs) {
        this.lastCounters = now;
        this._write(protocol.encodeCounters({ atNs: this.clock.nowNs(), values: this._counterValues() }));
      }
    } finally {
      sock.uncork();
    }
    if (this.ring.queued > 0 && !this.blocked) this._schedule();
    if (finishing) this._maybeGoodbye();
  }

  _written(sock, entry, err) {
    if (entry.done) return;
    entry.done = true;
    if (err) {
      this.counters.send_failed += entry.count;
    } else {
      this.counters.sent += entry.count;
    }
    // v1: released once written. Frames complete in order; release up to the last done.
    while (this.inflight.length && this.inflight[0].done) {
      this.ring.release(this.inflight.shift().end);
    }
    if (this.sock === sock && (this.stopping || this.rehello)) this._maybeGoodbye();
  }

  /** Final Counters and Goodbye once everything queued has been taken by the socket. */
  _maybeGoodbye() {
    if (this.state !== 'connected' || this.blocked) return;
    if (this.ring.queued > 0 || !this.control.empty || this.inflight.length > 0 || this.clockReading) return;
    const sock = this.sock;
    this.state = 'closing';
    this.closingSince = Date.now();
    this.rehello = false;
    this.goodbyeWritten = false;
    sock.write(protocol.encodeCounters({ atNs: this.clock.nowNs(), values: this._counterValues() }));
    sock.write(protocol.encodeGoodbye(), (err) => {
      if (!err) this.goodbyeWritten = true;
    });
    // The collector closes after Goodbye; close our side when it has (Node answers its
    // end with ours), or after a while. Closing first would leave a TLS close_notify
    // unread on its side, which resets the connection.
    const t = setTimeout(() => {
      if (this.sock === sock) sock.end();
    }, 2000);
    t.unref();
  }

  _finish(clean) {
    if (this.state === 'stopped') return;
    // Version 2: frames numbered while away and never handed to a connection are
    // undelivered too; evicted ones never written are lost.
    const unwritten = this.retention.unwrittenRecords();
    const leftover = this.control.take().records + this.ring.queued + this.inflight.filter((f) => !f.done).reduce((a, f) => a + f.count, 0) + unwritten;
    this.inflight = [];
    this.ring.clear();
    if (leftover > 0) {
      this.counters.send_failed += leftover;
      this.log.error(`stopped with ${leftover} undelivered records; counted as send_failed`);
    }
    const [evictedWritten, evictedUnwritten] = this.retention.evictedUnresolved();
    this.counters.lost_unacked += evictedUnwritten;
    this.unacknowledged = this.retention.unackedRecords() - unwritten + evictedWritten;
    if (this.unacknowledged > 0) {
      this.log.warn(`stopped with ${this.unacknowledged} records the collector had not acknowledged as durable`);
    }
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.sock) {
      const s = this.sock;
      this.sock = null;
      s.destroy();
    }
    this.state = 'stopped';
    this.clean = clean;
    const stopping = this.stopping;
    this.emit('stopped', clean);
    if (stopping) stopping.resolve({ clean, counters: this.snapshot(), unacknowledged: this.unacknowledged });
  }
}

module.exports = { Exporter, parseAddress, SOFTWARE, COUNTER_NAMES };
