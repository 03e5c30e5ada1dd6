'use strict';
// Collectors that misbehave, for the tests that the probe never holds up Node-RED: each
// listens on 127.0.0.1 and does one wrong thing to every connection. The in-process
// collector that behaves is fake-collector.js.

const net = require('node:net');
const { once } = require('node:events');
const protocol = require('../lib/protocol');

const MODES = Object.freeze({
  silent: 'silent', // accepts, never reads, never answers
  welcomeThenDeaf: 'welcome_then_deaf', // answers Welcome, then never reads: the buffers fill
  garbage: 'garbage', // answers Hello with bytes that are no frame
  welcomeThenGarbage: 'welcome_then_garbage', // Welcome, then bytes that are no frame
  closeAfterHello: 'close_after_hello', // reads Hello and closes
  slowWelcome: 'slow_welcome', // answers Welcome `delayMs` after Hello, then reads and acknowledges nothing
});

// A frame header that claims the largest frame, then junk: no decoder may take it as a frame.
const GARBAGE = Buffer.concat([Buffer.from([0xff, 0xff, 0xff, 0x7f]), Buffer.alloc(1024, 0xa5)]);

class HostileCollector {
  constructor(mode, { delayMs = 0 } = {}) {
    if (!Object.values(MODES).includes(mode)) throw new RangeError(`unknown mode ${mode}`);
    this.mode = mode;
    this.delayMs = delayMs;
    this.accepted = 0;
    this.hellos = 0;
    this.sockets = new Set();
    this.timers = new Set();
    this.server = net.createServer((sock) => this._accept(sock));
  }

  async listen(port = 0) {
    this.server.listen(port, '127.0.0.1');
    await once(this.server, 'listening');
    this.port = this.server.address().port;
    this.address = `127.0.0.1:${this.port}`;
    return this;
  }

  _accept(sock) {
    this.accepted += 1;
    this.sockets.add(sock);
    sock.on('error', () => {});
    sock.on('close', () => this.sockets.delete(sock));
    if (this.mode === MODES.silent) {
      sock.pause();
      return;
    }
    const reader = new protocol.FrameReader();
    const onData = (chunk) => {
      reader.push(chunk);
      let hello;
      try {
        hello = reader.next();
      } catch (_) {
        sock.destroy();
        return;
      }
      if (!hello) return;
      sock.removeListener('data', onData);
      this.hellos += 1;
      const welcome = protocol.encodeWelcome(hello.version, 'hostile-run', 0n);
      switch (this.mode) {
        case MODES.closeAfterHello:
          sock.destroy();
          break;
        case MODES.garbage:
          sock.write(GARBAGE);
          sock.pause();
          break;
        case MODES.welcomeThenGarbage:
          sock.write(Buffer.concat([welcome, GARBAGE]));
          sock.pause();
          break;
        case MODES.welcomeThenDeaf:
          sock.write(welcome);
          sock.pause();
          break;
        case MODES.slowWelcome: {
          sock.pause();
          const t = setTimeout(() => {
            this.timers.delete(t);
            if (sock.destroyed) return;
            sock.write(welcome);
            sock.on('data', () => {}); // reads everything, acknowledges nothing
            sock.resume();
          }, this.delayMs);
          this.timers.add(t);
          break;
        }
        default:
          break;
      }
    };
    sock.on('data', onData);
  }

  /** Stops listening and closes every connection; the port is free again. */
  async close() {
    for (const t of this.timers) clearTimeout(t);
    for (const s of this.sockets) s.destroy();
    await new Promise((r) => this.server.close(r));
  }
}

module.exports = { HostileCollector, MODES };
