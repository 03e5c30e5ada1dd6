'use strict';
// Micro-benchmark of the Node-RED probe's per-message work, outside Node-RED:
//
//   node bench.js [--messages N] [--runs R]
//
// - clock reads: Date.now(), process.hrtime.bigint(), RealtimeClock.nowNs();
// - reportBinary() / report(): one record into the exporter's ring (no socket), from the
//   context's bytes (what the node does) or from a decoded context;
// - stamp+report, per carrier: what a hoptrace node does to one message (read the
//   context, stamp it, report the record, write the context back), no socket;
// - stamp+report with the exporter connected to a local collector stand-in that reads
//   and discards (the flush to the socket included, on the same event loop).
// Each figure is the median of R runs of N messages, in ns per message.
// Also prints how far `performance.timeOrigin + performance.now()` is from the anchored
// clock, the other sub-millisecond wall clock Node offers.

const net = require('node:net');
const os = require('node:os');

const ctxmod = require('./lib/context');
const protocol = require('./lib/protocol');
const { Exporter } = require('./lib/exporter');
const { RealtimeClock } = require('./lib/clock');
const { HopStamper } = require('./lib/hop');

function arg(name, dflt) {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
}

const N = arg('--messages', 200000);
const RUNS = arg('--runs', 5);
const hr = process.hrtime.bigint;

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** ns per call of fn(i), median over RUNS runs of N calls (after one warm-up run). */
function perCall(fn, setup = () => {}) {
  const runs = [];
  for (let r = 0; r <= RUNS; r++) {
    setup();
    const t0 = hr();
    for (let i = 0; i < N; i++) fn(i);
    const ns = Number(hr() - t0) / N;
    if (r > 0) runs.push(ns);
  }
  return median(runs);
}

function context(i) {
  return {
    publisher: 3, stream: i & 1023, sequence: BigInt(i), metricCount: 50,
    intendedNs: 1700000000000000000n, otelTraceId: null, stamps: [{ hop: 0, ns: 1700000000000000100n }],
  };
}

/** An exporter whose socket is never opened: report() fills the ring only. */
function offlineExporter(clock) {
  return new Exporter({ collector: '127.0.0.1:9', clock, queueCapacity: N + 1 });
}

/** A collector stand-in: answers Hello with Welcome, then reads and discards. */
function sink() {
  return new Promise((resolve) => {
    const stats = { bytes: 0 };
    const server = net.createServer((sock) => {
      let welcomed = false;
      sock.setNoDelay(true);
      sock.on('data', (chunk) => {
        stats.bytes += chunk.length;
        if (!welcomed) {
          welcomed = true;
          sock.write(protocol.encodeWelcome(1, 'bench'));
        }
      });
      sock.on('error', () => {});
    });
    server.listen(0, '127.0.0.1', () => resolve({ server, stats, address: `127.0.0.1:${server.address().port}` }));
  });
}

async function connectedRun(clock, carrier) {
  const s = await sink();
  const ex = new Exporter({ collector: s.address, clock, queueCapacity: 1 << 16 });
  ex.setHops([[1, 'flow_in']]);
  ex.start();
  while (ex.status().state !== 'connected') await new Promise((r) => setTimeout(r, 5));
  const hop = new HopStamper({ exporter: ex, clock, hopId: 1, mode: 'in', carrier });
  const msgs = makeMessages(carrier, N);
  const runs = [];
  for (let r = 0; r <= RUNS; r++) {
    const fresh = msgs.map(cloneMsg);
    const before = ex.snapshot();
    const t0 = hr();
    // Batches of 1000 messages per turn of the event loop, as a busy flow delivers them,
    // so the exporter's flushes run in between and are part of the time.
    for (let i = 0; i < N; i += 1000) {
      const end = Math.min(N, i + 1000);
      for (let k = i; k < end; k++) hop.process(fresh[k]);
      await new Promise((res) => setImmediate(res));
    }
    while (ex.snapshot().sent + ex.snapshot().queue_full < before.sent + before.queue_full + N) {
      await new Promise((res) => setImmediate(res));
    }
    const ns = Number(hr() - t0) / N;
    if (r > 0) runs.push(ns);
  }
  const c = ex.snapshot();
  await ex.shutdown(5000);
  s.server.close();
  return { ns: median(runs), queueFull: c.queue_full, sent: c.sent };
}

function makeMessages(carrier, n) {
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    const c = context(i);
    if (carrier === 'property') out[i] = { payload: '21.5', userProperties: { hoptrace: ctxmod.encodeText(c) } };
    else if (carrier === 'header') out[i] = { payload: '21.5', headers: { hoptrace: ctxmod.encode(c) } };
    else out[i] = { payload: ctxmod.wrapEnvelope(c, Buffer.from('{"v":21.5}')) };
  }
  return out;
}

function cloneMsg(m) {
  if (m.userProperties) return { payload: m.payload, userProperties: { ...m.userProperties } };
  if (m.headers) return { payload: m.payload, headers: { ...m.headers } };
  return { payload: m.payload };
}

async function main() {
  const clock = new RealtimeClock();
  const results = [];
  const row = (what, ns, note = '') => {
    results.push([what, ns, note]);
    console.log(`${what.padEnd(58)} ${ns.toFixed(1).padStart(8)} ns${note ? `  ${note}` : ''}`);
  };

  console.log(`node ${process.version}, ${os.cpus()[0].model}, ${os.cpus().length} cpus; N=${N}, median of ${RUNS} runs`);
  let sink0 = 0n;
  let sinkN = 0;
  row('Date.now()', perCall(() => { sinkN += Date.now(); }));
  row('process.hrtime.bigint()', perCall(() => { sink0 ^= hr(); }));
  row('RealtimeClock.nowNs()', perCall(() => { sink0 ^= clock.nowNs(); }));

  const c0 = context(1);
  const b0 = ctxmod.encode(c0);
  let ex = offlineExporter(clock);
  row('exporter.reportBinary() into the ring', perCall((i) => ex.reportBinary(b0, 1, BigInt(i)), () => { ex = offlineExporter(clock); }));
  row('exporter.report() (decoded context) into the ring', perCall((i) => ex.report(c0, 1, BigInt(i)), () => { ex = offlineExporter(clock); }));

  for (const carrier of ['property', 'header', 'envelope']) {
    const msgs = makeMessages(carrier, N);
    let fresh;
    let hop;
    const ns = perCall((i) => hop.process(fresh[i]), () => {
      fresh = msgs.map(cloneMsg);
      hop = new HopStamper({ exporter: offlineExporter(clock), clock, hopId: 1, mode: 'in', carrier });
    });
    row(`stamp+report, ${carrier} (in mode, no socket)`, ns);
  }

  for (const carrier of ['property', 'header']) {
    const r = await connectedRun(clock, carrier);
    row(`stamp+report+send, ${carrier}, to a local collector`, r.ns, `(queue_full ${r.queueFull})`);
  }

  // performance.timeOrigin + performance.now(): monotonic since start, placed once.
  const diffs = [];
  for (let i = 0; i < 1000; i++) {
    const a = clock.nowNs();
    const p = performance.timeOrigin + performance.now();
    const b = clock.nowNs();
    diffs.push(Number((a + b) / 2n - BigInt(Math.round(p * 1e6))));
  }
  console.log(`anchor: ±${clock.halfWidthNs} ns; performance.timeOrigin + performance.now() - nowNs(): ` +
    `${(-median(diffs) / 1e3).toFixed(1)} µs`);
  if (sink0 === 42n && sinkN === 42) console.log('');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
