'use strict';
// The measuring side of the outage host (outage-host.sh): the message generator and the
// sink of the flow in flow.js, and the lines the host prints. settings.js creates one Host
// from the environment the launcher sets and hands it to the flow's function nodes as the
// global context value `hoptraceOutage`; the function nodes only call it.
//
// Generator: open-loop, --rate messages/s over --streams streams, round robin. Every
// message carries a fresh trace context in the MQTT v5 user property `hoptrace` (text
// form), as Node-RED's `mqtt in` node delivers a message that `hoptrace publish` sent, and
// its send time on the monotonic clock (`send_mono_ns`). At most one second of messages
// is in flight: what is due beyond that is not generated and counted as `shed`.
//
// Sink: each message's time from the generator's send to the end of the flow goes into a
// fixed histogram (bucket floor(128 * log2(ns)), 128 per octave, each 0.54 % wide) that
// is emptied every second.
//
// Lines on stdout (Node-RED's log shares it; these are single-line JSON starting with `{`):
//   {"ready":true,"pid":P}            the first message reached the sink
//   {"t":S,"n":N,"max_ns":M,"h":[[idx,count],...],"loop_p999_ns":L,
//    "sent":G,"shed":D,"gen_lag_max_ns":A,"in_flight":F,"probe":{...}}   every second
//   {"end":true,"t":S,"sent":G,"received":R,"shed":D,"probe":{...}}   at exit
// `t` is seconds since the generator started; `n`, `max_ns` and `h` the messages that
// reached the sink in that second; `loop_p999_ns` the P99.9 of that second's event loop
// delay as perf_hooks' monitorEventLoopDelay (1 ms resolution) records it: the time
// between runs of a 1 ms timer, so an idle loop reads just above 1 ms; `sent` and `shed`
// the messages generated and not generated (too many in flight) in that second,
// `gen_lag_max_ns` the most a message was sent after its intended time, `in_flight` the
// messages sent and not yet at the sink; `probe` (probed flow only) the hoptrace
// exporter's counters and footprint, at exit its final counters after Goodbye (with
// `clean` and `unacknowledged`).
//
// After --duration the generator stops; once every message reached the sink (or 5 s
// later) the host stops Node-RED as SIGTERM does (the hoptrace node flushes and says
// Goodbye) and prints the end line as the process exits.

const fs = require('node:fs');
const path = require('node:path');
const { monitorEventLoopDelay } = require('node:perf_hooks');

const ctxmod = require('../lib/context');

const BUCKETS_PER_OCTAVE = 128;
const BUCKETS = BUCKETS_PER_OCTAVE * 64;
const PUBLISHER = 1;
const DRAIN_TIMEOUT_NS = 5_000_000_000n;
const EXIT_TIMEOUT_MS = 20_000;

/** The bucket of a duration: floor(128 * log2(max(ns, 1))). */
function bucketOf(ns) {
  return Math.floor(BUCKETS_PER_OCTAVE * Math.log2(ns > 1 ? ns : 1));
}

/**
 * The exporter of the hoptrace node package installed at `pkgDir`, once a hoptrace
 * collector config node has taken one: every config node gets its exporter from the
 * package's lib/shared.js, whose acquire() is followed here (the module is the one the
 * node loads: Node caches modules by their real path).
 * @returns {() => object|null}
 */
function followExporter(pkgDir) {
  const shared = require(path.join(pkgDir, 'lib', 'shared'));
  const acquire = shared.acquire;
  let current = null;
  shared.acquire = function acquireFollowed(...args) {
    const entry = acquire.apply(this, args);
    current = entry.exporter;
    return entry;
  };
  return () => current;
}

/** The counters and footprint of `exporter`, in the Python host's shape. */
function probeState(exporter) {
  const fp = exporter.footprint();
  return {
    ...exporter.snapshot(),
    queued: fp.queued,
    retained_bytes: fp.retainedBytes,
    evicted_entries: fp.evictedEntries,
    connected: exporter.status().state === 'connected',
  };
}

class Host {
  /**
   * @param {object} o
   * @param {number} o.rate messages per second
   * @param {number} o.streams
   * @param {number} o.durationS seconds the generator runs
   * @param {string} [o.probePkg] the hoptrace node package in the userDir (probed flow)
   * @param {string} [o.removeDir] a directory to remove at exit (the launcher's userDir)
   * @param {(line: string) => void} [o.print] where lines go (console.log)
   * @param {() => bigint} [o.monoNs] the monotonic clock (process.hrtime.bigint)
   * @param {() => number} [o.realtimeMs] the realtime clock (Date.now)
   * @param {() => void} [o.onDrained] called once the generator has stopped and the flow
   *   has drained (default: SIGTERM to this process, which Node-RED stops on; exit at the
   *   latest 20 s later)
   * @param {boolean} [o.atExit] print the end line and remove `removeDir` at exit (true)
   */
  constructor(o) {
    this.rate = o.rate;
    this.streams = o.streams;
    this.durationNs = BigInt(Math.round(o.durationS * 1e9));
    this.periodNs = 1e9 / o.rate;
    this.total = Math.round(o.durationS * o.rate);
    this.maxInFlight = Math.max(1000, o.rate);
    this.removeDir = o.removeDir || null;
    this.print = o.print || ((line) => console.log(line));
    this.monoNs = o.monoNs || process.hrtime.bigint;
    this.realtimeMs = o.realtimeMs || Date.now;
    this.onDrained = o.onDrained || (() => this._stopProcess());
    this.atExit = o.atExit !== false;
    this.exporter = o.probePkg ? followExporter(o.probePkg) : null;

    this.sequences = new Float64Array(o.streams);
    this.hist = new Uint32Array(BUCKETS);
    this.touched = new Int32Array(BUCKETS);
    this.touchedCount = 0;

    this.startMonoNs = null;
    this.realtimeOffsetNs = 0n; // realtime = monotonic + offset, read once at start
    this.generating = false;
    this.stoppedMonoNs = null;
    this.ended = false;
    this.exiting = false;
    this.sent = 0;
    this.received = 0;
    this.shed = 0;
    this.ready = false;
    this.thisSecond = { n: 0, maxNs: 0, sent: 0, shed: 0, lagMaxNs: 0 };
    this.loop = null;
  }

  /** Starts the generator's clock (once; the flow's inject node fires at deploy). */
  start() {
    if (this.startMonoNs !== null) return false;
    this.startMonoNs = this.monoNs();
    this.realtimeOffsetNs = BigInt(this.realtimeMs()) * 1_000_000n - this.startMonoNs;
    this.generating = true;
    this.loop = monitorEventLoopDelay({ resolution: 1 });
    this.loop.enable();
    if (this.atExit) process.once('exit', () => this._exit());
    return true;
  }

  /** Sends, with `send`, every message due by now; false once the generator has stopped. */
  tick(send) {
    if (!this.generating) return false;
    const now = this.monoNs();
    let elapsed = now - this.startMonoNs;
    if (elapsed >= this.durationNs) {
      elapsed = this.durationNs;
      this.generating = false;
      this.stoppedMonoNs = now;
    }
    // Message k is due k periods after the start.
    const next = this.sent + this.shed;
    const due = Math.min(this.total, Math.floor(Number(elapsed) / this.periodNs) + 1) - next;
    if (due > 0) {
      // How late the oldest message due is sent: the schedule lag that the generator-to-sink
      // time, which starts at the send, does not see.
      const lag = Number(now - this.startMonoNs) - next * this.periodNs;
      if (lag > this.thisSecond.lagMaxNs) this.thisSecond.lagMaxNs = lag;
    }
    for (let i = 0; i < due; i++) {
      const k = this.sent + this.shed;
      if (this.sent - this.received >= this.maxInFlight) {
        this.shed += 1;
        this.thisSecond.shed += 1;
        continue;
      }
      send(this._message(k));
      this.sent += 1;
      this.thisSecond.sent += 1;
    }
    return this.generating;
  }

  _message(k) {
    const stream = k % this.streams;
    const sequence = this.sequences[stream];
    this.sequences[stream] = sequence + 1;
    const intendedNs = this.realtimeOffsetNs + this.startMonoNs + BigInt(Math.round(k * this.periodNs));
    const text = ctxmod.encodeText({
      publisher: PUBLISHER,
      stream,
      sequence: BigInt(sequence),
      metricCount: 1,
      intendedNs,
      otelTraceId: null,
      stamps: [],
    });
    return {
      topic: `outage/${stream}`,
      payload: { stream, value: k },
      userProperties: { hoptrace: text },
      send_mono_ns: this.monoNs(),
    };
  }

  /** The flow's end: records the message's time since the generator sent it. */
  arrive(msg) {
    const ns = Number(this.monoNs() - msg.send_mono_ns);
    const i = bucketOf(ns);
    if (this.hist[i] === 0) this.touched[this.touchedCount++] = i;
    this.hist[i] += 1;
    const s = this.thisSecond;
    s.n += 1;
    if (ns > s.maxNs) s.maxNs = ns;
    this.received += 1;
    if (!this.ready) {
      this.ready = true;
      this.print(JSON.stringify({ ready: true, pid: process.pid }));
    }
  }

  _t(now) {
    return Math.round(Number(now - this.startMonoNs) / 1e6) / 1e3;
  }

  _probe() {
    if (!this.exporter) return undefined;
    const ex = this.exporter();
    return ex ? probeState(ex) : null;
  }

  /**
   * Prints the line of the second just past and empties the histograms; once the
   * generator has stopped and the flow has drained, stops Node-RED. False when done.
   */
  second() {
    if (this.ended) return false;
    const now = this.monoNs();
    const h = [];
    const idx = this.touched.subarray(0, this.touchedCount).sort();
    for (const i of idx) {
      h.push([i, this.hist[i]]);
      this.hist[i] = 0;
    }
    this.touchedCount = 0;
    const s = this.thisSecond;
    this.print(JSON.stringify({
      t: this._t(now),
      n: s.n,
      max_ns: s.maxNs,
      h,
      loop_p999_ns: Math.round(this.loop.percentile(99.9)),
      sent: s.sent,
      shed: s.shed,
      gen_lag_max_ns: Math.round(s.lagMaxNs),
      in_flight: this.sent - this.received,
      probe: this._probe(),
    }));
    this.loop.reset();
    this.thisSecond = { n: 0, maxNs: 0, sent: 0, shed: 0, lagMaxNs: 0 };
    if (!this.generating && (this.received >= this.sent || now - this.stoppedMonoNs >= DRAIN_TIMEOUT_NS)) {
      this.ended = true;
      this.loop.disable();
      this.onDrained();
      return false;
    }
    return true;
  }

  /** Stops Node-RED as SIGTERM does; the end line follows at exit. */
  _stopProcess() {
    process.kill(process.pid, 'SIGTERM');
    setTimeout(() => {
      this.endLine();
      process.exit(0);
    }, EXIT_TIMEOUT_MS).unref();
  }

  /** The end line (once). */
  endLine() {
    if (this.exiting) return;
    this.exiting = true;
    let probe;
    if (this.exporter) {
      const ex = this.exporter();
      probe = ex ? { ...probeState(ex), clean: ex.clean === true, unacknowledged: ex.unacknowledged } : null;
    }
    this.print(JSON.stringify({
      end: true,
      t: this._t(this.monoNs()),
      sent: this.sent,
      received: this.received,
      shed: this.shed,
      probe,
    }));
  }

  _exit() {
    this.endLine();
    if (this.removeDir) fs.rmSync(this.removeDir, { recursive: true, force: true });
  }
}

/** A positive number from the environment variable `name`. */
function positive(env, name, integer) {
  const v = Number(env[name]);
  if (!(v > 0) || (integer && !Number.isInteger(v))) {
    throw new RangeError(`${name} must be a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(env[name])}`);
  }
  return v;
}

/** The Host the launcher's environment describes (see outage-host.sh). */
function fromEnv(env) {
  return new Host({
    rate: positive(env, 'HOPTRACE_OUTAGE_RATE', true),
    streams: positive(env, 'HOPTRACE_OUTAGE_STREAMS', true),
    durationS: positive(env, 'HOPTRACE_OUTAGE_DURATION', false),
    probePkg: env.HOPTRACE_OUTAGE_PROBE_PKG || undefined,
    removeDir: env.HOPTRACE_OUTAGE_REMOVE_USERDIR || undefined,
  });
}

module.exports = { Host, fromEnv, bucketOf, BUCKETS_PER_OCTAVE };
