'use strict';
// End to end, every part real: `hoptrace collect`, Mosquitto, a Node-RED runtime started
// from this package's node_modules with the package installed in its userDir as the README
// says, running the README's example flow, `hoptrace publish` (MQTT v5, context in a user
// property) and `hoptrace tap` on the flow's output.
//
//   hoptrace publish -> mqtt in (v5) -> hoptrace flow_in -> function -> hoptrace flow_out
//     -> mqtt out (v5) -> hoptrace tap (delivered)
//
// Checked: run.json adds up, every message sent is complete, records by hop are exact,
// Node-RED's own time is a stage of its own (flow_in -> flow_out) with no negative delta,
// the Node-RED probe said Goodbye with counters that add up and sent its clock status,
// and the stamps each message carried in-band when it left Node-RED are the ones the
// collector stored.
//
// Skipped unless HOPTRACE_INTEGRATION=1; then a missing HOPTRACE_BIN or Mosquitto
// (HOPTRACE_MQTT, default 127.0.0.1:11883) is a failure.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const net = require('node:net');
const crypto = require('node:crypto');
const { spawn, execFileSync } = require('node:child_process');

const { parse: parseExact } = require('./exact-json');
const ctxmod = require('../lib/context');

const INTEGRATION = process.env.HOPTRACE_INTEGRATION === '1';
const PKG = path.resolve(__dirname, '..');
const NODE_RED = path.join(PKG, 'node_modules', 'node-red', 'red.js');
const PORTS = [11890, 11899]; // Node-RED's HTTP port, the first free one
const MESSAGES = 600;
const RATE = 200; // messages per second

const PIPELINE = `
name = "node-red-e2e"

[[hops]]
name = "publish"
id = 0
description = "hoptrace publish hands the message to its MQTT client."

[[hops]]
name = "flow_in"
id = 1
description = "The hoptrace node right after Node-RED's mqtt in node."

[[hops]]
name = "flow_out"
id = 2
description = "The hoptrace node right before Node-RED's mqtt out node."

[[hops]]
name = "delivered"
id = 3
description = "hoptrace tap receives the message from the output topic."

[[stages]]
name = "Broker In"
from = "publish"
to = "flow_in"
definition = "Publish, through Mosquitto, to the first node after mqtt in."

[[stages]]
name = "Node-RED"
from = "flow_in"
to = "flow_out"
definition = "Node-RED's own time: from the hoptrace in node, through the function node, to the hoptrace out node."

[[stages]]
name = "Broker Out"
from = "flow_out"
to = "delivered"
definition = "From the hoptrace out node, through mqtt out and Mosquitto, to the tap."

[[stages]]
name = "Total"
from = "publish"
to = "delivered"
definition = "Publish to delivery on the output topic."
headline = true

[join]
window_ms = 10000
max_pending = 100000
`;

/** Fails (not skips) when a needed part is missing. */
function need(cond, what) {
  if (!cond) assert.fail(`HOPTRACE_INTEGRATION=1 but ${what}`);
}

function canConnect(host, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    s.setTimeout(2000);
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
    s.once('timeout', () => { s.destroy(); resolve(false); });
  });
}

async function freePortInRange([lo, hi]) {
  for (let p = lo; p <= hi; p++) {
    const ok = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(p, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (ok) return p;
  }
  assert.fail(`no free port in ${lo}-${hi}`);
}

/** A child process with its output kept in a log file and in memory. */
function run(name, cmd, args, dir, opts = {}) {
  const log = path.join(dir, `${name}.log`);
  const out = fs.openSync(log, 'w');
  const child = spawn(cmd, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], detached: true, ...opts });
  const p = { name, child, log, text: '', exited: null };
  const keep = (chunk) => {
    p.text += chunk.toString();
    fs.writeSync(out, chunk);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  p.done = new Promise((resolve) => child.on('exit', (code, signal) => {
    p.exited = { code, signal };
    fs.closeSync(out);
    resolve(p.exited);
  }));
  return p;
}

async function waitFor(p, pattern, ms) {
  const end = Date.now() + ms;
  for (;;) {
    const m = p.text.match(pattern);
    if (m) return m;
    if (p.exited) assert.fail(`${p.name} exited (${JSON.stringify(p.exited)}) before printing ${pattern}:\n${p.text.slice(-3000)}`);
    if (Date.now() > end) assert.fail(`${p.name} did not print ${pattern} within ${ms} ms:\n${p.text.slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `promise`, or a failure naming `what` after `ms`. */
async function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms); });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** SIGTERM to the process group, SIGKILL after `ms`. */
async function stop(p, ms = 20000) {
  if (!p || p.exited) return p && p.exited;
  try {
    process.kill(-p.child.pid, 'SIGTERM');
  } catch (_) {
    // already gone
  }
  const timer = setTimeout(() => {
    try {
      process.kill(-p.child.pid, 'SIGKILL');
    } catch (_) {
      // already gone
    }
  }, ms);
  const r = await p.done;
  clearTimeout(timer);
  return r;
}

/**
 * The README's example flow (examples/mqtt-flow.json), pointed at this test's collector,
 * broker and topics.
 */
function flowFor(tag, collector, mqtt) {
  const [host, port] = mqtt.split(':');
  const nodes = JSON.parse(fs.readFileSync(path.join(PKG, 'examples', 'mqtt-flow.json'), 'utf8'));
  const one = (type) => {
    const found = nodes.filter((n) => n.type === type);
    assert.equal(found.length, 1, `one ${type} node in the example flow`);
    return found[0];
  };
  Object.assign(one('mqtt-broker'), { broker: host, port });
  Object.assign(one('hoptrace-collector'), { collector, process: 'node-red-e2e' });
  one('mqtt in').topic = `nodered-probe/${tag}/in/#`;
  one('mqtt out').topic = `nodered-probe/${tag}/out`;
  return nodes;
}

test('publish -> Mosquitto -> Node-RED (hoptrace in/out) -> Mosquitto -> tap, through the real collector',
  { skip: !INTEGRATION && 'set HOPTRACE_INTEGRATION=1 (needs HOPTRACE_BIN and Mosquitto)', timeout: 240000 },
  async () => {
    const bin = process.env.HOPTRACE_BIN;
    need(bin, 'HOPTRACE_BIN is not set');
    need(fs.existsSync(bin), `HOPTRACE_BIN ${bin} does not exist`);
    const mqtt = process.env.HOPTRACE_MQTT || '127.0.0.1:11883';
    const [mqttHost, mqttPort] = mqtt.split(':');
    need(await canConnect(mqttHost, Number(mqttPort)), `Mosquitto is not reachable at ${mqtt} (infra/services.sh up)`);
    need(fs.existsSync(NODE_RED), `Node-RED is not installed at ${NODE_RED} (npm ci in probes/node-red)`);

    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-nodered-e2e-'));
    const tag = crypto.randomBytes(4).toString('hex');
    const procs = [];
    try {
      fs.writeFileSync(path.join(dir, 'pipeline.toml'), PIPELINE);
      const collector = run('collector', bin, ['collect', '--listen', '127.0.0.1:0', '--pipeline', 'pipeline.toml',
        '--out', 'runs', '--run-id', 'nodered-e2e'], dir);
      procs.push(collector);
      const address = (await waitFor(collector, /collecting on (\S+)/, 30000))[1];

      // Node-RED with this package installed in its userDir, as a user would.
      const userDir = path.join(dir, 'userdir');
      fs.mkdirSync(userDir);
      fs.writeFileSync(path.join(userDir, 'package.json'), JSON.stringify({ name: 'node-red-project', private: true }));
      execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', '--no-save', PKG], { cwd: userDir, stdio: 'pipe' });
      const port = await freePortInRange(PORTS);
      fs.writeFileSync(path.join(userDir, 'flows.json'), JSON.stringify(flowFor(tag, address, mqtt), null, 1));
      fs.writeFileSync(path.join(userDir, 'settings.js'), `module.exports = {
  uiHost: '127.0.0.1',
  uiPort: ${port},
  flowFile: 'flows.json',
  credentialSecret: false,
  logging: { console: { level: 'info', metrics: false, audit: false } },
};
`);
      const nodeRed = run('node-red', process.execPath, [NODE_RED, '--userDir', userDir, '--settings', path.join(userDir, 'settings.js')], dir);
      procs.push(nodeRed);
      await waitFor(nodeRed, /Started flows/, 60000);
      assert.doesNotMatch(nodeRed.text, /Waiting for missing types/);
      await waitFor(nodeRed, /Connected to broker/, 30000);
      await waitFor(nodeRed, /connected to the collector/, 30000);

      // A subscriber of our own on the output topic keeps the contexts as they left
      // Node-RED (MQTT v5 user property), to compare with what the collector stored.
      const mqttLib = require('mqtt');
      const sub = await mqttLib.connectAsync(`mqtt://${mqtt}`, { protocolVersion: 5, clean: true });
      const leaving = new Map();
      sub.on('message', (topic, payload, packet) => {
        const up = packet.properties && packet.properties.userProperties;
        const v = up && up.hoptrace;
        const c = ctxmod.decodeText(Array.isArray(v) ? v[v.length - 1] : v);
        leaving.set(`${c.stream}/${c.sequence}`, { c, payload: payload.toString() });
      });
      await sub.subscribeAsync(`nodered-probe/${tag}/out`, { qos: 1 });

      const tap = run('tap', bin, ['tap', '--from', `mqtt://${mqtt}?version=5&qos=1`, '--topics', `nodered-probe/${tag}/out`,
        '--hop', 'delivered', '--messages', String(MESSAGES), '--duration', '120s',
        '--collector', address, '--pipeline', 'pipeline.toml'], dir);
      procs.push(tap);
      await waitFor(tap, /tapping/, 30000);

      const publish = run('publish', bin, ['publish', '--to', `mqtt://${mqtt}/nodered-probe/${tag}/in?qos=1&version=5`,
        '--topics', 'flat', '--topic-root', 'hoptrace', '--streams', '4', '--rate', String(RATE), '--duration', '30s',
        '--messages', String(MESSAGES), '--publisher-id', '31', '--summary-json', 'publish.json',
        '--collector', address, '--pipeline', 'pipeline.toml'], dir);
      procs.push(publish);
      const pubExit = await publish.done;
      assert.deepEqual(pubExit, { code: 0, signal: null }, publish.text.slice(-3000));
      const published = JSON.parse(fs.readFileSync(path.join(dir, 'publish.json'), 'utf8'));
      assert.equal(published.messages, MESSAGES);

      let tapTimer;
      const tapExit = await Promise.race([tap.done, new Promise((r) => { tapTimer = setTimeout(() => r('timeout'), 60000); })]);
      clearTimeout(tapTimer);
      assert.deepEqual(tapExit, { code: 0, signal: null }, `tap: ${tap.text.slice(-3000)}`);

      await new Promise((r) => setTimeout(r, 500));
      await sub.endAsync();
      assert.equal(leaving.size, MESSAGES, 'every message left Node-RED with its context');

      // Stopping Node-RED closes the flows: the probe flushes, sends its final counters
      // and Goodbye.
      const nrExit = await stop(nodeRed);
      assert.ok(nrExit.code === 0 || nrExit.signal === 'SIGTERM', JSON.stringify(nrExit));
      await stop(collector, 60000);
      assert.equal(collector.exited.code, 0, collector.text.slice(-3000));

      const runDir = path.join(dir, 'runs', 'nodered-e2e');
      const summary = parseExact(fs.readFileSync(path.join(runDir, 'run.json'), 'utf8'));
      const acc = summary.accounting;
      const N = BigInt(MESSAGES);
      assert.equal(acc.adds_up, true, JSON.stringify(acc, (k, v) => (typeof v === 'bigint' ? Number(v) : v)));
      assert.equal(acc.publishers.length, 1);
      const pub = acc.publishers[0];
      assert.equal(pub.publisher, 31n);
      assert.equal(pub.sent, N);
      assert.equal(pub.complete, N, 'every message sent is complete');
      assert.equal(pub.incomplete, 0n);
      assert.equal(pub.unseen, 0n);
      assert.deepEqual(acc.records_by_hop, { publish: N, flow_in: N, flow_out: N, delivered: N });
      assert.equal(acc.records_lost_by_probes, 0n);
      assert.equal(acc.duplicate_traces, 0n);
      assert.equal(acc.in_flight, 0n);

      const stage = summary.stages.find((s) => s.name === 'Node-RED');
      assert.ok(stage, 'the Node-RED stage is in run.json');
      assert.equal(stage.from, 'flow_in');
      assert.equal(stage.to, 'flow_out');
      assert.equal(stage.count, N, "Node-RED's time is measured for every message");
      assert.equal(stage.negative, 0n, 'flow_in and flow_out stamp from one clock');
      assert.ok(stage.min_ns >= 0n && stage.max_ns < 5000000000n, `Node-RED stage ${stage.min_ns}..${stage.max_ns} ns`);
      for (const name of ['Broker In', 'Broker Out', 'Total']) {
        assert.equal(summary.stages.find((s) => s.name === name).count, N, name);
      }

      const probe = summary.probes.find((p) => p.process === 'node-red-e2e');
      assert.ok(probe, 'the Node-RED probe is in run.json');
      assert.deepEqual(probe.hops, ['flow_in', 'flow_out']);
      assert.equal(probe.clean_close, true, 'Goodbye on flow stop');
      assert.match(probe.software, /^node-red-contrib-hoptrace /);
      const c = probe.counters;
      assert.equal(c.reported, 2n * N);
      assert.equal(c.sent, 2n * N);
      assert.equal(c.queue_full, 0n);
      assert.equal(c.send_failed, 0n);
      assert.equal(c.not_traced, 0n);
      assert.equal(c.bad_context, 0n);
      assert.equal(summary.probes.filter((p) => p.process === 'node-red-e2e').length, 1, 'one connection');
      const clocks = summary.clock.filter((r) => r.instance_id === probe.instance_id);
      assert.ok(clocks.length >= 1, 'the Node-RED probe sent its clock status');
      assert.match(clocks[0].detail, /anchor ±\d+ ns/);

      // The stamps that left Node-RED in-band are the stamps the collector stored out of
      // band, for every message.
      const csv = execFileSync(bin, ['sql', runDir, 'SELECT stream, sequence, CAST(publish_ns AS BIGINT) AS p, ' +
        'CAST(flow_in_ns AS BIGINT) AS fi, CAST(flow_out_ns AS BIGINT) AS fo FROM traces', '--format', 'csv'],
      { encoding: 'utf8', maxBuffer: 64 << 20 });
      const lines = csv.trim().split('\n');
      assert.deepEqual(lines[0].split(','), ['stream', 'sequence', 'p', 'fi', 'fo']);
      assert.equal(lines.length - 1, MESSAGES);
      for (const line of lines.slice(1)) {
        const [stream, sequence, p, fi, fo] = line.split(',').map((x) => BigInt(x));
        const left = leaving.get(`${stream}/${sequence}`);
        assert.ok(left, `message ${stream}/${sequence} was not seen leaving Node-RED`);
        assert.deepEqual(left.c.stamps.map((s) => [s.hop, s.ns]), [[0, p], [1, fi], [2, fo]]);
        assert.match(left.payload, /"site":"plant-7"/, 'the function node ran');
      }
    } finally {
      for (const p of procs.reverse()) await stop(p, 10000);
      if (process.env.HOPTRACE_KEEP_E2E) {
        console.log(`kept ${dir}`);
      } else {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    }
  });

test('the exporter speaks TLS to the real collector (hoptrace collect --tls-cert)',
  { skip: !INTEGRATION && 'set HOPTRACE_INTEGRATION=1 (needs HOPTRACE_BIN)', timeout: 60000 },
  async () => {
    const bin = process.env.HOPTRACE_BIN;
    need(bin, 'HOPTRACE_BIN is not set');
    need(fs.existsSync(bin), `HOPTRACE_BIN ${bin} does not exist`);
    const { selfSignedCert } = require('./fake-collector');
    const { Exporter } = require('../lib/exporter');
    const { RealtimeClock, ClockStatusReader } = require('../lib/clock');
    const cert = selfSignedCert();
    need(cert, 'openssl is not installed');
    const dir = cert.dir;
    let collector;
    try {
      fs.writeFileSync(path.join(dir, 'pipeline.toml'), PIPELINE);
      collector = run('collector', bin, ['collect', '--listen', '127.0.0.1:0', '--pipeline', 'pipeline.toml',
        '--out', 'runs', '--run-id', 'tls', '--tls-cert', cert.certFile, '--tls-key', cert.keyFile], dir);
      const address = (await waitFor(collector, /collecting on (\S+) \(TLS\)/, 30000))[1];
      const clock = new RealtimeClock();
      const ex = new Exporter({ collector: address, clock, clockStatus: new ClockStatusReader(clock), tlsCa: cert.cert,
        tlsServerName: 'collector.test', process: 'tls-check' });
      ex.setHops([[1, 'flow_in']]);
      ex.start();
      const end = Date.now() + 10000;
      while (ex.status().state !== 'connected' && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      assert.equal(ex.status().state, 'connected', String(ex.status().lastError));
      assert.equal(ex.status().runId, 'tls');
      const ctx = { publisher: 2, stream: 1, sequence: 1n, metricCount: 1, intendedNs: clock.nowNs(), otelTraceId: null, stamps: [] };
      ex.report(ctx, 1, clock.nowNs());
      assert.equal((await ex.shutdown(5000)).clean, true);
      await stop(collector, 30000);
      assert.equal(collector.exited.code, 0, collector.text.slice(-2000));
      const summary = parseExact(fs.readFileSync(path.join(dir, 'runs', 'tls', 'run.json'), 'utf8'));
      const probe = summary.probes.find((p) => p.process === 'tls-check');
      assert.ok(probe);
      assert.equal(probe.clean_close, true);
      assert.equal(probe.counters.sent, 1n);
      assert.equal(summary.accounting.records_by_hop.flow_in, 1n);
    } finally {
      await stop(collector, 10000);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

test('the collector node\'s Token against the real collector (hoptrace collect --token): right delivers, wrong or missing is refused and counted',
  { skip: !INTEGRATION && 'set HOPTRACE_INTEGRATION=1 (needs HOPTRACE_BIN)', timeout: 90000 },
  async () => {
    const bin = process.env.HOPTRACE_BIN;
    need(bin, 'HOPTRACE_BIN is not set');
    need(fs.existsSync(bin), `HOPTRACE_BIN ${bin} does not exist`);
    need(fs.existsSync(NODE_RED), `Node-RED is not installed at ${NODE_RED} (npm ci in probes/node-red)`);
    const helper = require('node-red-node-test-helper');
    const hoptraceNode = require('../nodes/hoptrace.js');
    helper.init(require.resolve('node-red'));
    await new Promise((resolve) => helper.startServer(resolve));
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-nodered-token-'));
    let collector;
    try {
      fs.writeFileSync(path.join(dir, 'pipeline.toml'), PIPELINE);
      collector = run('collector', bin, ['collect', '--listen', '127.0.0.1:0', '--pipeline', 'pipeline.toml',
        '--out', 'runs', '--run-id', 'token', '--token', 's3cret-token'], dir);
      const address = (await waitFor(collector, /collecting on (\S+)/, 30000))[1];
      // Three collector config nodes, three processes: the right token, a wrong one, none.
      const nodes = [];
      const creds = {};
      for (const [name, token] of [['good', 's3cret-token'], ['wrong', 'guess'], ['missing', '']]) {
        nodes.push({ id: `c_${name}`, type: 'hoptrace-collector', collector: address, process: `nr-token-${name}`, queueCapacity: 1000 });
        nodes.push({ id: `n_${name}`, type: 'hoptrace', collector: `c_${name}`, hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [[]] });
        creds[`c_${name}`] = { token };
      }
      await helper.load([hoptraceNode], nodes, creds);
      const N = 50;
      for (const name of ['good', 'wrong', 'missing']) {
        for (let i = 0; i < N; i++) {
          const c = { publisher: 5, stream: 0, sequence: BigInt(i), metricCount: 1, intendedNs: 1n, otelTraceId: null, stamps: [] };
          helper.getNode(`n_${name}`).receive({ payload: i, userProperties: { hoptrace: ctxmod.encodeText(c) } });
        }
      }
      const ex = (name) => helper.getNode(`c_${name}`).entry.exporter;
      const end = Date.now() + 20000;
      while ((ex('good').counters.sent < N || ex('wrong').rejected < 2 || ex('missing').rejected < 2) && Date.now() < end) {
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(ex('good').counters.sent, N, `right token: ${ex('good').status().lastError}`);
      assert.equal(ex('good').rejected, 0);
      for (const name of ['wrong', 'missing']) {
        const s = ex(name).status();
        assert.notEqual(s.state, 'connected');
        assert.ok(s.rejected >= 2, `${name}: refusals counted (${s.rejected})`);
        assert.deepEqual(Object.keys(ex(name).rejections), ['2']);
        assert.match(s.lastError, /rejected this probe \(code 2\).*token/);
      }
      const wrongEx = ex('wrong');
      const missingEx = ex('missing');
      await helper.unload();
      for (const e of [wrongEx, missingEx]) {
        assert.equal(e.counters.reported, N);
        assert.equal(e.counters.sent, 0);
        assert.equal(e.counters.send_failed, N, 'what a refused probe held is send_failed at shutdown');
      }
      await stop(collector, 30000);
      assert.equal(collector.exited.code, 0, collector.text.slice(-2000));
      const summary = parseExact(fs.readFileSync(path.join(dir, 'runs', 'token', 'run.json'), 'utf8'));
      assert.deepEqual(summary.probes.map((p) => p.process), ['nr-token-good']);
      assert.equal(summary.probes[0].clean_close, true);
      assert.ok(summary.connections.bad_token >= 4n, JSON.stringify(summary.connections, (k, v) => (typeof v === 'bigint' ? Number(v) : v)));
      assert.equal(summary.accounting.records_by_hop.flow_in, BigInt(N));
    } finally {
      await helper.unload().catch(() => {});
      await new Promise((resolve) => helper.stopServer(resolve));
      await stop(collector, 10000);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

const PIPELINE_DURABLE = `
name = "node-red-durable"

[[hops]]
name = "publish"
id = 0
description = "The test's publisher."

[[hops]]
name = "flow_in"
id = 1
description = "The first hop of the test's processor."

[[hops]]
name = "flow_out"
id = 2
description = "The second hop of the test's processor."

[[stages]]
name = "Flow"
from = "flow_in"
to = "flow_out"
definition = "Inside the processor."

[join]
window_ms = 60000
`;

test('protocol version 2: the real collector killed and restarted twice mid-run, every record stored once',
  { skip: !INTEGRATION && 'set HOPTRACE_INTEGRATION=1 (needs HOPTRACE_BIN)', timeout: 180000 },
  async () => {
    const bin = process.env.HOPTRACE_BIN;
    need(bin, 'HOPTRACE_BIN is not set');
    need(fs.existsSync(bin), `HOPTRACE_BIN ${bin} does not exist`);
    const { Exporter } = require('../lib/exporter');
    const protocol = require('../lib/protocol');
    const { RealtimeClock, ClockStatusReader } = require('../lib/clock');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-nodered-durable-'));
    fs.writeFileSync(path.join(dir, 'pipeline.toml'), PIPELINE_DURABLE);
    const port = await freePortInRange([20000, 40000]);
    const address = `127.0.0.1:${port}`;
    const args = ['collect', '--listen', address, '--pipeline', 'pipeline.toml', '--out', 'runs', '--run-id', 'durable'];
    let starts = 0;
    let collector;
    const startCollector = async () => {
      starts += 1;
      collector = run(`collector-${starts}`, bin, args, dir);
      await waitFor(collector, /collecting on (\S+)/, 30000);
    };
    const kill = async () => {
      process.kill(-collector.child.pid, 'SIGKILL');
      await collector.done;
    };
    const alive = setInterval(() => {}, 1000);
    try {
      await startCollector();
      const clock = new RealtimeClock();
      const opts = { collector: address, clock, clockStatus: new ClockStatusReader(clock), backoffMinMs: 20, backoffMaxMs: 200 };
      const pub = new Exporter({ ...opts, process: 'durable-publisher' });
      pub.setHops([[0, 'publish']]);
      const proc = new Exporter({ ...opts, process: 'durable-processor' });
      proc.setHops([[1, 'flow_in'], [2, 'flow_out']]);
      // Both exporters on the first collector before its kill: an exporter whose first
      // connection is to the second collector would count no reconnection at all.
      const first = Promise.all([pub, proc].map((e) => new Promise((r) => e.once('connected', r))));
      pub.start();
      proc.start();
      await within(first, 30000, 'the exporters did not connect to the first collector');
      const N = 4000;
      const STREAMS = 4;
      const killsAt = new Set([1200, 2600]);
      const one = (i) => {
        const c = { publisher: 33, stream: i % STREAMS, sequence: BigInt(Math.floor(i / STREAMS)), metricCount: 1,
          intendedNs: clock.nowNs(), otelTraceId: null, stamps: [] };
        pub.report(c, 0, clock.nowNs());
        proc.report(c, 1, clock.nowNs());
        proc.report(c, 2, clock.nowNs());
      };
      const tick = () => new Promise((r) => setImmediate(r));
      for (let i = 0; i < N;) {
        if (killsAt.has(i)) {
          await kill();
          // Away for a while: the exporters retain what they stamp meanwhile.
          for (let j = 0; j < 200; j++, i++) {
            one(i);
            if (j % 20 === 0) await new Promise((r) => setTimeout(r, 5));
          }
          await startCollector();
          // Both exporters back on the new collector before the next kill: otherwise one
          // still in its backoff from this break would see the two as one.
          const deadline = Date.now() + 30000;
          while (![pub, proc].every((e) => e.snapshot().reconnects === starts - 1)) {
            assert.ok(Date.now() < deadline, `exporters did not reconnect: ${JSON.stringify([pub.snapshot(), proc.snapshot()])}`);
            await new Promise((r) => setTimeout(r, 10));
          }
          continue;
        }
        one(i);
        i += 1;
        if (i % 50 === 0) await tick();
      }
      // What the publisher sent, per stream (a snapshot), before Goodbye.
      pub.sendFrame(protocol.encodeSent({
        publisher: 33,
        entries: Array.from({ length: STREAMS }, (_, s) => ({
          stream: s, messages: BigInt(N / STREAMS), metrics: BigInt(N / STREAMS), firstSequence: 0n, lastSequence: BigInt(N / STREAMS - 1),
        })),
      }));
      const [ps, qs] = [await pub.shutdown(15000), await proc.shutdown(15000)];
      for (const [s, n] of [[ps, N], [qs, 2 * N]]) {
        assert.equal(s.clean, true);
        assert.equal(s.unacknowledged, 0);
        const c = s.counters;
        assert.deepEqual([c.reported, c.sent, c.queue_full, c.send_failed, c.evicted, c.lost_unacked, c.reconnects],
          [n, n, 0, 0, 0, 0, 2], JSON.stringify(c));
      }
      await stop(collector, 60000);
      assert.equal(collector.exited.code, 0, collector.text.slice(-3000));
      const summary = parseExact(fs.readFileSync(path.join(dir, 'runs', 'durable', 'run.json'), 'utf8'));
      const acc = summary.accounting;
      const show = JSON.stringify(acc, (k, v) => (typeof v === 'bigint' ? Number(v) : v));
      assert.equal(acc.adds_up, true, show);
      const p = acc.publishers[0];
      assert.deepEqual([p.sent, p.complete, p.incomplete, p.unseen], [BigInt(N), BigInt(N), 0n, 0n], show);
      assert.deepEqual(acc.records_by_hop, { publish: BigInt(N), flow_in: BigInt(N), flow_out: BigInt(N) }, show);
      assert.deepEqual([acc.duplicate_traces, acc.late_records, acc.records_lost_by_probes], [0n, 0n, 0n], show);
      assert.equal(summary.restarts.length, 2);
      const csv = execFileSync(bin, ['sql', path.join(dir, 'runs', 'durable'),
        'SELECT count(*) AS n, count(DISTINCT stream * 100000 + sequence) AS keys FROM traces', '--format', 'csv'], { encoding: 'utf8' });
      assert.deepEqual(csv.trim().split('\n')[1].split(','), [String(N), String(N)], 'every message once');
    } finally {
      clearInterval(alive);
      if (collector) await stop(collector, 10000);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
