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

// ---------------------------------------------------------------------------------------
// ptp4l through pmc (as the Rust probe's PtpStatus)

const PMC_REQUESTS = ['GET TIME_STATUS_NP', 'GET PORT_DATA_SET', 'GET CURRENT_DATA_SET', 'GET TIME_PROPERTIES_DATA_SET'];
const PORT_STATES = new Set(['INITIALIZING', 'FAULTY', 'DISABLED', 'LISTENING', 'PRE_MASTER', 'MASTER',
  'PASSIVE', 'UNCALIBRATED', 'SLAVE', 'GRAND_MASTER']);

/** Everything pmc printed, as answers { id, kind, fields: Map }; throws on a malformed line. */
function parsePmcAnswers(output) {
  const answers = [];
  for (const raw of String(output).split('\n')) {
    if (!raw.trim()) continue;
    if (raw.startsWith('\t\t')) {
      if (!answers.length) throw new Error(`pmc: field before any answer: ${JSON.stringify(raw)}`);
      const m = /^(\S+)\s*(.*)$/.exec(raw.trim());
      answers[answers.length - 1].fields.push([m[1], m[2].trim()]);
    } else if (raw.startsWith('\t')) {
      const t = raw.trim().split(/\s+/);
      if (t.length < 5 || t[1] !== 'seq' || !/^\d+$/.test(t[2])) throw new Error(`pmc: cannot read line ${JSON.stringify(raw)}`);
      answers.push({ port: t[0], action: t[3], kind: t[4], id: t[5] || '', fields: [] });
    }
    // Anything else is pmc talking about what it sends.
  }
  return answers;
}

function field(a, name) {
  const f = a.fields.find(([n]) => n === name);
  if (!f) throw new Error(`pmc: ${a.id} has no field ${name}`);
  return f[1];
}

function intField(a, name) {
  const v = field(a, name);
  if (!/^[-+]?\d+$/.test(v)) throw new Error(`pmc: field ${name} is ${JSON.stringify(v)}, expected an integer`);
  return BigInt(v);
}

function flagField(a, name) {
  const v = field(a, name);
  if (v !== '0' && v !== '1') throw new Error(`pmc: field ${name} is ${JSON.stringify(v)}, expected 0 or 1`);
  return v === '1';
}

/**
 * Parses what pmc printed for the four requests into a clock status (without atNs), as
 * the Rust probe does: offset from the grandmaster; bound |master_offset| + mean path
 * delay; synchronised when a grandmaster is present and a port is SLAVE (gmPresent alone
 * when no port answered). Throws when there is no TIME_STATUS_NP answer (`noAnswer` set:
 * ptp4l is not there) or a field is malformed.
 */
function parsePmcReading(output) {
  const answers = parsePmcAnswers(output).filter((a) => a.kind === 'MANAGEMENT');
  const ts = answers.find((a) => a.id === 'TIME_STATUS_NP');
  if (!ts) {
    const e = new Error('pmc printed no TIME_STATUS_NP answer (is ptp4l running on that socket and domain?)');
    e.noAnswer = true;
    throw e;
  }
  const masterOffset = intField(ts, 'master_offset');
  const gm = field(ts, 'gmPresent');
  if (gm !== 'true' && gm !== 'false') throw new Error(`pmc: field gmPresent is ${JSON.stringify(gm)}, expected true or false`);
  const gmPresent = gm === 'true';
  const gmIdentity = field(ts, 'gmIdentity');
  const ports = answers.filter((a) => a.id === 'PORT_DATA_SET').map((a) => {
    const state = field(a, 'portState');
    if (!PORT_STATES.has(state)) throw new Error(`pmc: field portState is ${JSON.stringify(state)}, expected a port state such as SLAVE`);
    return { state, peerDelay: intField(a, 'peerMeanPathDelay') };
  });
  const cur = answers.find((a) => a.id === 'CURRENT_DATA_SET');
  let meanPathDelay = null;
  let stepsRemoved = null;
  if (cur) {
    const v = field(cur, 'meanPathDelay');
    const m = /^([-+]?\d+)(?:\.\d*)?$/.exec(v);
    if (!m) throw new Error(`pmc: field meanPathDelay is ${JSON.stringify(v)}, expected nanoseconds`);
    meanPathDelay = BigInt(m[1]);
    stepsRemoved = intField(cur, 'stepsRemoved');
  }
  const tp = answers.find((a) => a.id === 'TIME_PROPERTIES_DATA_SET');
  let leap61 = false;
  let leap59 = false;
  let timeSource = null;
  let traceable = null;
  if (tp) {
    leap61 = flagField(tp, 'leap61');
    leap59 = flagField(tp, 'leap59');
    traceable = flagField(tp, 'timeTraceable');
    const src = field(tp, 'timeSource');
    if (!/^0x[0-9a-fA-F]{1,2}$/.test(src)) throw new Error(`pmc: field timeSource is ${JSON.stringify(src)}, expected a hex byte such as 0xa0`);
    timeSource = parseInt(src.slice(2), 16);
  }
  let delay = meanPathDelay !== null && meanPathDelay !== 0n ? meanPathDelay : null;
  if (delay === null) {
    const slave = ports.find((p) => p.state === 'SLAVE' && p.peerDelay !== 0n);
    if (slave) delay = slave.peerDelay;
  }
  const portState = (ports.find((p) => p.state === 'SLAVE' || p.state === 'UNCALIBRATED') || ports[0] || {}).state || null;
  const synced = gmPresent && (ports.length === 0 || ports.some((p) => p.state === 'SLAVE'));
  const leap = !synced ? LEAP.unsynchronised : leap61 ? LEAP.insert : leap59 ? LEAP.delete : LEAP.none;
  let detail = `gm=${gmIdentity} gm_present=${gmPresent} port=${portState || 'unknown'} master_offset_ns=${masterOffset}` +
    ` mean_path_delay_ns=${delay === null ? 'unknown' : delay}`;
  if (stepsRemoved !== null) detail += ` steps_removed=${stepsRemoved}`;
  if (timeSource !== null) detail += ` time_source=0x${timeSource.toString(16).padStart(2, '0')} traceable=${traceable}`;
  if (!gmPresent && portState === 'MASTER') detail += ' (this host is the grandmaster)';
  return {
    source: CLOCK_SOURCE.ptp,
    synced,
    leap,
    offsetNs: masterOffset,
    errorBoundNs: abs(masterOffset) + (delay === null ? 0n : abs(delay)),
    detail,
  };
}

// ---------------------------------------------------------------------------------------
// Detection: chronyd, else ptp4l, else unknown (the kernel needs native code)

const EXTRA_DIRS = ['/usr/sbin', '/sbin', '/usr/local/sbin'];

/** `name` on PATH or in the sbin directories (as the Rust probe looks); `name` when not found. */
function findProgram(name) {
  const fs = require('node:fs');
  const path = require('node:path');
  const dirs = (process.env.PATH || '').split(path.delimiter).filter(Boolean).concat(EXTRA_DIRS);
  for (const d of dirs) {
    const p = path.join(d, name);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      if (fs.statSync(p).isFile()) return p;
    } catch (_) {
      // not here
    }
  }
  return name;
}

/** Runs a program; resolves { out } on exit 0, else { why }. */
function runProgram(file, args, timeoutMs) {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: timeoutMs }, (err, stdout, stderr) => {
      if (!err) {
        resolve({ out: stdout });
        return;
      }
      let why;
      if (err.code === 'ENOENT') why = `not installed (${file})`;
      else if (err.killed) why = `no answer within ${timeoutMs} ms`;
      else why = `exit ${err.code}: ${String(stderr || stdout || err.message).trim().split('\n')[0]}`;
      resolve({ why });
    });
  });
}

let pmcQueries = 0;

/** The sources a host may have, each read(): { status } or { why }. */
class Sources {
  constructor(opts = {}) {
    this.chronyc = opts.chronyc ?? findProgram('chronyc');
    this.pmc = opts.pmc ?? findProgram('pmc');
    this.ptpSocket = opts.ptpSocket ?? '/var/run/ptp4l';
    this.ptpDomain = opts.ptpDomain ?? 0;
    this.timeoutMs = opts.timeoutMs ?? 2000;
  }

  async chrony() {
    const r = await runProgram(this.chronyc, ['-n', '-c', 'tracking'], this.timeoutMs);
    if (r.why) return { why: `chronyc -c tracking: ${r.why}` };
    const status = parseChronyTracking(r.out);
    return status ? { status } : { why: 'chronyc -c tracking: an unreadable line' };
  }

  async ptp() {
    const os = require('node:os');
    const path = require('node:path');
    const fs = require('node:fs');
    const client = path.join(os.tmpdir(), `hoptrace-pmc.${process.pid}.${pmcQueries++}`);
    const r = await runProgram(this.pmc, ['-u', '-b', '0', '-d', String(this.ptpDomain), '-s', this.ptpSocket,
      '-i', client, ...PMC_REQUESTS], this.timeoutMs);
    // pmc removes its socket on exit; not when killed on a timeout.
    fs.rm(client, { force: true }, () => {});
    const where = `uds=${this.ptpSocket} domain=${this.ptpDomain}`;
    if (r.why) return { why: `pmc: ${r.why} (${where})` };
    try {
      const status = parsePmcReading(r.out);
      status.detail += ` ${where}`;
      return { status };
    } catch (e) {
      return { why: `pmc: ${e.message} (${where})` };
    }
  }
}

const KERNEL_WHY = 'kernel: adjtimex needs native code (a C addon), which this package does not use';

/**
 * Finds what keeps this host's clock, in the Rust probe's order: chronyd if chronyc
 * answers, else ptp4l if pmc gets an answer on its default socket, else nothing this
 * package can read (the kernel's adjtimex is not reachable from JavaScript without a
 * native addon).
 * @returns {Promise<{ name: string, passedOver: object }>} name: chrony, ptp or unknown
 */
async function detect(sources) {
  const passedOver = {};
  const c = await sources.chrony();
  if (c.status) return { name: 'chrony', passedOver };
  passedOver.chrony = c.why;
  const p = await sources.ptp();
  if (p.status) return { name: 'ptp', passedOver };
  passedOver.ptp = p.why;
  passedOver.kernel = KERNEL_WHY;
  return { name: 'unknown', passedOver };
}

let detectedOnce = null;

/**
 * Reads the host's clock status from the source detect() found (once per process, on the
 * first read); the anchor's error is added to the bound either way. A source that stops
 * answering later is reported as that source, not synchronised, with the error.
 */
class ClockStatusReader {
  /**
   * @param {object} clock a RealtimeClock
   * @param {object} [opts] chronyc, pmc (program paths), ptpSocket, ptpDomain, timeoutMs;
   *   with any of them set, detection is this reader's own instead of the process's
   */
  constructor(clock, opts = {}) {
    this.clock = clock;
    this.sources = new Sources(opts);
    this.own = Object.keys(opts).length > 0;
    this.detected = null;
  }

  /** The detection result (runs it on first use). */
  async detection() {
    if (!this.detected) {
      if (this.own) {
        this.detected = detect(this.sources);
      } else {
        if (!detectedOnce) detectedOnce = detect(this.sources);
        this.detected = detectedOnce;
      }
    }
    return this.detected;
  }

  /** The status now, as a Clock frame's fields. */
  async read() {
    const d = await this.detection();
    let s;
    if (d.name === 'unknown') {
      s = {
        source: CLOCK_SOURCE.unknown,
        synced: false,
        leap: LEAP.unsynchronised,
        offsetNs: 0n,
        errorBoundNs: 0n,
        detail: `no clock status source: ${Object.values(d.passedOver).join('; ')}; the bound covers the anchor only`,
      };
    } else {
      const r = d.name === 'chrony' ? await this.sources.chrony() : await this.sources.ptp();
      s = r.status || {
        source: d.name === 'chrony' ? CLOCK_SOURCE.chrony : CLOCK_SOURCE.ptp,
        synced: false,
        leap: LEAP.unsynchronised,
        offsetNs: 0n,
        errorBoundNs: 0n,
        detail: r.why,
      };
    }
    const anchor = this.clock.anchorErrorNs();
    return {
      atNs: this.clock.nowNs(),
      source: s.source,
      synced: s.synced,
      leap: s.leap,
      offsetNs: s.offsetNs,
      errorBoundNs: s.errorBoundNs + anchor,
      detail: `${s.detail}; ${this.clock.describe()}`.slice(0, 1000),
    };
  }
}

module.exports = {
  RealtimeClock, sharedClock, ClockStatusReader, Sources, detect, findProgram, parseChronyTracking,
  parsePmcReading, secondsToNs, KERNEL_WHY,
};
