'use strict';
// An in-process stand-in for the collector, for unit tests of the exporter and the node:
// it answers Hello with Welcome (or Reject), keeps every frame per connection, and can
// stop reading to stall a probe. End-to-end tests use the real `hoptrace collect`.
//
// `version` is the highest protocol version it speaks (default 2): a version 2 Hello gets
// a version 2 Welcome whose resume_seq is `held` of that instance (the highest SeqRecords
// number it received, unless a test sets it), and every SeqRecords frame is acknowledged
// at once unless `ack` is false; with version 1 a version 2 Hello is refused (Reject
// code 1), as a collector knowing only version 1 does.

const net = require('node:net');
const tls = require('node:tls');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { once } = require('node:events');
const protocol = require('../lib/protocol');

class FakeCollector {
  constructor(opts = {}) {
    this.runId = opts.runId || 'test-run';
    this.reject = opts.reject || null; // { code, reason } to reject every Hello
    this.version = opts.version ?? 2;
    this.ack = opts.ack ?? true;
    this.held = new Map(); // instance id -> highest SeqRecords number received (bigint)
    this.connections = [];
    this.server = opts.tls
      ? tls.createServer({ key: opts.tls.key, cert: opts.tls.cert }, (sock) => this._accept(sock))
      : net.createServer((sock) => this._accept(sock));
    if (opts.tls) this.server.on('tlsClientError', () => { this.tlsErrors = (this.tlsErrors || 0) + 1; });
  }

  async listen(port = 0) {
    this.server.listen(port, '127.0.0.1');
    await once(this.server, 'listening');
    this.port = this.server.address().port;
    this.address = `127.0.0.1:${this.port}`;
    return this;
  }

  _accept(sock) {
    const conn = { sock, frames: [], hello: null, closed: false, goodbye: false, error: null };
    this.connections.push(conn);
    const reader = new protocol.FrameReader();
    sock.on('data', (chunk) => {
      reader.push(chunk);
      try {
        for (let f = reader.next(); f; f = reader.next()) {
          conn.frames.push(f);
          if (f.type === 'hello') {
            conn.hello = f;
            if (this.reject) {
              sock.end(protocol.encodeReject(this.reject.code, this.reject.reason));
            } else if (f.version > this.version) {
              sock.end(protocol.encodeReject(protocol.REJECT_CODE.version, `unsupported version ${f.version}`));
            } else {
              conn.version = Math.min(f.version, this.version);
              sock.write(protocol.encodeWelcome(conn.version, this.runId, this.held.get(f.instanceId) || 0n));
            }
          } else if (f.type === 'seq_records') {
            const id = conn.hello.instanceId;
            if (!this.held.has(id) || this.held.get(id) < f.seq) this.held.set(id, f.seq);
            if (this.ack) sock.write(protocol.encodeAck(this.held.get(id)));
          } else if (f.type === 'goodbye') {
            // As the collector does: Goodbye ends the conversation (version 2: after a
            // last Ack).
            conn.goodbye = true;
            if (conn.version >= 2 && this.ack) sock.write(protocol.encodeAck(this.held.get(conn.hello.instanceId) || 0n));
            sock.end();
          }
        }
      } catch (e) {
        conn.error = e;
        sock.destroy();
      }
    });
    sock.on('error', () => {});
    sock.on('close', () => { conn.closed = true; });
  }

  /** Every frame of `type` over all connections. */
  frames(type) {
    return this.connections.flatMap((c) => c.frames.filter((f) => f.type === type));
  }

  records() {
    return this.connections.flatMap((c) => c.frames.filter((f) => f.type === 'records' || f.type === 'seq_records'))
      .flatMap((f) => f.records);
  }

  /** The SeqRecords numbers a connection received, in order (numbers). */
  seqs(conn = this.connections.at(-1)) {
    return conn.frames.filter((f) => f.type === 'seq_records').map((f) => Number(f.seq));
  }

  /** The last Counters frame of a connection, as { name: bigint }. */
  lastCounters(conn = this.connections.at(-1)) {
    const f = conn.frames.filter((x) => x.type === 'counters').at(-1);
    if (!f) return null;
    const names = Object.fromEntries(Object.entries(protocol.COUNTER_ID).map(([n, id]) => [id, n]));
    return Object.fromEntries(f.values.map(([id, v]) => [names[id], v]));
  }

  /** Stops reading from every connection (TCP pushes back on the probe). */
  stall() {
    for (const c of this.connections) c.sock.pause();
  }

  resume() {
    for (const c of this.connections) c.sock.resume();
  }

  /** Drops every open connection. */
  kill() {
    for (const c of this.connections) c.sock.destroy();
  }

  async close() {
    this.kill();
    await new Promise((r) => this.server.close(r));
  }
}

/**
 * A self-signed certificate for `collector.test` and 127.0.0.1 (openssl), as PEM files in
 * a new temporary directory: { dir, key, cert, keyFile, certFile }. Null without openssl.
 */
function selfSignedCert() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-tls-'));
  const keyFile = path.join(dir, 'key.pem');
  const certFile = path.join(dir, 'cert.pem');
  try {
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-keyout', keyFile, '-out', certFile, '-days', '2', '-subj', '/CN=collector.test',
      '-addext', 'subjectAltName=DNS:collector.test,IP:127.0.0.1'], { stdio: 'pipe' });
  } catch (e) {
    if (e.code === 'ENOENT') return null;
    throw e;
  }
  return { dir, keyFile, certFile, key: fs.readFileSync(keyFile), cert: fs.readFileSync(certFile) };
}

/** Polls `pred` every 10 ms until true, or fails after `ms`. */
async function until(pred, ms = 5000, what = 'condition') {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

module.exports = { FakeCollector, until, selfSignedCert };
