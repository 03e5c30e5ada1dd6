'use strict';
// Stamps in CLOCK_REALTIME nanoseconds, and the host's clock status for Clock frames.
//
// RealtimeClock.nowNs() = anchor.realNs + (process.hrtime.bigint() - anchor.monoNs):
// nanosecond resolution from CLOCK_MONOTONIC, placed on CLOCK_REALTIME by an anchor taken
// at a Date.now() millisecond edge (lib/anchor.js). Linux slews CLOCK_MONOTONIC with the
// same frequency corrections as CLOCK_REALTIME, so the two only part when the realtime
// clock is stepped; a check every second compares the prediction with Date.now() and
// re-anchors when they disagree, and a worker thread re-anchors every minute regardless.
// The anchor's error (half its bracket, plus how far the previous anchor had drifted when
// it was replaced) is added to the error bound sent in Clock frames.

const { execFile } = require('node:child_process');
const { measureAnchor } = require('./anchor');
const { CLOCK_SOURCE, LEAP } = require('./protocol');

const hr = process.hrtime.bigint;
const MS = 1000000n;

function abs(v) {
  return v < 0n ? -v : v;
}

class RealtimeClock {
  /**
   * @param {object} [opts]
   * @param {number} [opts.reanchorMs] how often the worker re-anchors (default 60 s)
   * @param {number} [opts.checkMs] how often the prediction is checked against Date.now()
   * @param {bigint} [opts.stepToleranceNs] disagreement beyond the anchor error that counts
   *   as a clock step (default 200 µs)
   */
  constructor(opts = {}) {
    this.reanchorMs = opts.reanchorMs ?? 60000;
    this.checkMs = opts.checkMs ?? 1000;
    this.stepToleranceNs = opts.stepToleranceNs ?? 200000n;
    this.anchors = 0;
    this.steps = 0;
    this.lastShiftNs = 0n;
    this.users = 0;
    this.worker = null;
    this.timers = [];
    this.pending = false;
    const a = measureAnchor(3, 20);
    if (a) {
      this._apply(a, true);
    } else {
      // No clean edge within 20 ms (a starved core): Date.now() itself, ±0.5 ms.
      this._apply({ realNs: BigInt(Date.now()) * MS + MS / 2n, monoNs: hr(), halfWidthNs: MS / 2n }, true);
    }
  }

  /** CLOCK_REALTIME now, nanoseconds since the Unix epoch (bigint). */
  nowNs() {
    return this.baseRealNs + (hr() - this.baseMonoNs);
  }

  /** Bound on the error this clock adds to the system clock's own, ns (bigint). */
  anchorErrorNs() {
    return this.halfWidthNs + this.lastShiftNs;
  }

  /** A text for the Clock frame's detail. */
  describe() {
    return `hrtime anchored to Date.now() ms edges: anchor ±${this.halfWidthNs} ns, ` +
      `last re-anchor moved ${this.lastShiftNs} ns, ${this.anchors} anchors, ${this.steps} steps seen`;
  }

  _apply(a, first = false) {
    if (!first) {
      const predicted = this.baseRealNs + (a.monoNs - this.baseMonoNs);
      this.lastShiftNs = abs(a.realNs - predicted);
    }
    this.baseRealNs = a.realNs;
    this.baseMonoNs = a.monoNs;
    this.halfWidthNs = a.halfWidthNs;
    this.anchors += 1;
  }

  /**
   * Whether the prediction agrees with Date.now() (to the anchor error and the step
   * tolerance). A disagreement means the realtime clock was stepped.
   */
  consistent() {
    const before = this.nowNs();
    const d = BigInt(Date.now());
    const after = this.nowNs();
    const tol = this.halfWidthNs + this.stepToleranceNs;
    return after >= d * MS - tol && before < (d + 1n) * MS + tol;
  }

  /** Starts the periodic check and the re-anchoring worker (shared, reference counted). */
  start() {
    this.users += 1;
    if (this.users > 1) return;
    const check = setInterval(() => {
      if (!this.consistent()) {
        this.steps += 1;
        this.reanchor();
      }
    }, this.checkMs);
    check.unref();
    const periodic = setInterval(() => this.reanchor(), this.reanchorMs);
    periodic.unref();
    this.timers = [check, periodic];
  }

  /** Stops the timers and the worker once the last user has stopped. */
  stop() {
    if (this.users === 0) return;
    this.users -= 1;
    if (this.users > 0) return;
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
    if (this.worker) {
      this.worker.terminate().catch(() => {});
      this.worker = null;
    }
    this.pending = false;
  }

  /** Asks the worker for a fresh anchor (never blocks the event loop). */
  reanchor() {
    if (this.pending) return;
    try {
      if (!this.worker) {
        const { Worker } = require('node:worker_threads');
        this.worker = new Worker(require.resolve('./anchor.js'), { workerData: { hoptraceAnchor: true } });
        this.worker.unref();
        this.worker.on('message', (a) => {
          this.pending = false;
          if (a) this._apply(a);
        });
        this.worker.on('error', () => {
          this.pending = false;
          this.worker = null;
        });
        this.worker.on('exit', () => {
          this.pending = false;
          this.worker = null;
        });
      }
      this.pending = true;
      this.worker.postMessage({ measure: true, edges: 3, budgetMs: 20 });
    } catch (_) {
      this.pending = false;
    }
  }
}

let shared = null;

/** The process's clock, anchored once. */
function sharedClock() {
  if (!shared) shared = new RealtimeClock();
  return shared;
}

// ---------------------------------------------------------------------------------------
// Clock status

/** "-0.000002004" (seconds, up to 9 decimals) as bigint ns; null when malformed. */
function secondsToNs(s) {
  const m = /^(-?)(\d+)(?:\.(\d{1,9}))?$/.exec(s);
  if (!m) return null;
  const ns = BigInt(m[2]) * 1000000000n + BigInt((m[3] || '').padEnd(9, '0'));
  return m[1] ? -ns : ns;
}

/**
 * Parses one line of `chronyc -c tracking` (14 fields). The error bound is computed as
 * hoptrace's Rust probe does: |system time offset| + root dispersion + root delay / 2.
 * @returns {object|null} a clock status without `atNs`, or null when unreadable
 */
function parseChronyTracking(output) {
  const line = String(output).split('\n').map((l) => l.trim()).find((l) => l);
  if (!line) return null;
  const f = line.split(',');
  if (f.length !== 14 || !/^[0-9A-Fa-f]{8}$/.test(f[0])) return null;
  const refId = parseInt(f[0], 16);
  const stratum = Number(f[2]);
  const systemTime = secondsToNs(f[4]);
  const rootDelay = secondsToNs(f[10]);
  const rootDispersion = secondsToNs(f[11]);
  if (!Number.isInteger(stratum) || systemTime === null || rootDelay === null || rootDispersion === null) return null;
  const leapName = f[13];
  const synced = leapName !== 'Not synchronised' && stratum < 16 && refId !== 0;
  const leap = !synced ? LEAP.unsynchronised
    : leapName === 'Insert second' ? LEAP.insert
      : leapName === 'Delete second' ? LEAP.delete : LEAP.none;
  return {
    source: CLOCK_SOURCE.chrony,
    synced,
    leap,
    // chronyc's "System time" is positive when the clock is slow; offset_ns is positive
    // when the clock is ahead.
    offsetNs: -systemTime,
    errorBoundNs: abs(systemTime) + rootDispersion + rootDelay / 2n,
    detail: `chrony ref=${f[0].toUpperCase()} (${f[1] || '-'}) stratum=${stratum} ` +
      `root_delay_ns=${rootDelay} root_dispersion_ns=${rootDispersion} leap=${leapName}`,
  };
}

/**
 * Reads the host's clock status: chronyd through `chronyc -c tracking` when it answers,
 * else "unknown". The anchor's error is added to the bound either way.
 */
class ClockStatusReader {
  constructor(clock, opts = {}) {
    this.clock = clock;
    this.chronyc = opts.chronyc ?? 'chronyc';
    this.timeoutMs = opts.timeoutMs ?? 1000;
    this.chronyMissing = false;
  }

  _chrony() {
    if (this.chronyMissing) return Promise.resolve({ status: null, why: 'chronyc not installed' });
    return new Promise((resolve) => {
      execFile(this.chronyc, ['-c', 'tracking'], { timeout: this.timeoutMs }, (err, stdout, stderr) => {
        if (err) {
          if (err.code === 'ENOENT') this.chronyMissing = true;
          resolve({ status: null, why: `chronyc: ${String(stderr || err.message).trim().split('\n')[0]}` });
          return;
        }
        const status = parseChronyTracking(stdout);
        resolve({ status, why: status ? '' : 'chronyc printed an unreadable line' });
      });
    });
  }

  /** The status now, as a Clock frame's fields. */
  async read() {
    const { status, why } = await this._chrony();
    const anchor = this.clock.anchorErrorNs();
    const s = status || {
      source: CLOCK_SOURCE.unknown,
      synced: false,
      leap: LEAP.none,
      offsetNs: 0n,
      errorBoundNs: 0n,
      detail: `no sync daemon answered (${why}); the bound covers the anchor only`,
    };
    return {
      atNs: this.clock.nowNs(),
      source: s.source,
      synced: s.synced,
      leap: s.leap,
      offsetNs: s.offsetNs,
      errorBoundNs: s.errorBoundNs + anchor,
      detail: `${s.detail}; ${this.clock.describe()}`,
    };
  }
}

module.exports = { RealtimeClock, sharedClock, ClockStatusReader, parseChronyTracking, secondsToNs };
