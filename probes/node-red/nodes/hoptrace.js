'use strict';
// Node-RED nodes of hoptrace:
// - `hoptrace-collector` (config node): where the collector listens. All hoptrace nodes
//   naming the same collector share one connection per Node-RED runtime.
// - `hoptrace`: stamps each message passing it as one hop of the pipeline, reports the
//   stamp to the collector and passes the context on (lib/hop.js says how).

const fs = require('node:fs');

const shared = require('../lib/shared');
const { HopStamper } = require('../lib/hop');

const SHUTDOWN_TIMEOUT_MS = 5000;
const STATUS_INTERVAL_MS = 1000;

module.exports = function register(RED) {
  function CollectorNode(config) {
    RED.nodes.createNode(this, config);
    const node = this;
    node.collector = String(config.collector || '').trim();
    node.settings = {
      collector: node.collector,
      token: (node.credentials && node.credentials.token) || '',
      process: String(config.process || 'node-red').trim() || 'node-red',
      queueCapacity: Number(config.queueCapacity) > 0 ? Math.floor(Number(config.queueCapacity)) : 65536,
      retentionBytes: Number(config.retentionMiB) > 0 ? Math.floor(Number(config.retentionMiB) * 1048576) : 64 << 20,
      tlsCaFile: String(config.tlsCa || '').trim(),
      tlsServerName: String(config.tlsName || '').trim(),
    };
    try {
      if (node.settings.tlsCaFile) node.settings.tlsCa = fs.readFileSync(node.settings.tlsCaFile);
      node.entry = shared.acquire(node.id, node.settings, {
        info: (m) => node.log(m),
        warn: (m) => node.warn(m),
        error: (m) => node.error(m),
      });
    } catch (e) {
      node.entry = null;
      node.error(`hoptrace collector: ${e.message}`);
      return;
    }
    // Connect once every node of the deployed flows has announced its hop, so the
    // Hello lists them all; a node added later makes the exporter say Hello again.
    const startNow = () => node.entry && node.entry.start();
    RED.events.once('flows:started', startNow);
    const fallback = setTimeout(startNow, 2000);
    fallback.unref();

    node.on('close', (removed, done) => {
      RED.events.removeListener('flows:started', startNow);
      clearTimeout(fallback);
      if (!node.entry) {
        done();
        return;
      }
      const entry = node.entry;
      node.entry = null;
      shared.release(node.id, entry, SHUTDOWN_TIMEOUT_MS).then((summary) => {
        if (summary && !summary.clean) {
          node.warn(`hoptrace: the collector did not get the final counters (${JSON.stringify(summary.counters)})`);
        }
        done();
      }, (e) => {
        node.error(`hoptrace: shutdown failed: ${e.message}`);
        done();
      });
    });
  }

  RED.nodes.registerType('hoptrace-collector', CollectorNode, {
    credentials: { token: { type: 'password' } },
  });

  function HoptraceNode(config) {
    RED.nodes.createNode(this, config);
    const node = this;
    const collector = RED.nodes.getNode(config.collector);
    const hopName = String(config.hop || '').trim();
    const hopId = Number(config.hopId);
    let stamper = null;
    let lastStatus = '';
    let failures = 0;

    const fail = (why) => {
      node.error(`hoptrace: ${why}`);
      node.status({ fill: 'red', shape: 'ring', text: why });
    };

    if (!collector || !collector.entry) {
      fail('no collector configured');
    } else {
      const why = collector.entry.addHop(node.id, hopId, hopName);
      if (why) {
        fail(why);
      } else {
        try {
          stamper = new HopStamper({
            exporter: collector.entry.exporter,
            clock: collector.entry.clock,
            hopId,
            mode: config.mode || 'in',
            carrier: config.carrier || 'property',
            headersPath: config.headers || 'headers',
            payloadAs: config.payloadAs || 'buffer',
          });
        } catch (e) {
          collector.entry.removeHop(node.id);
          fail(e.message);
        }
      }
    }

    const showStatus = () => {
      if (!stamper || !collector.entry) return;
      const ex = collector.entry.exporter;
      const s = ex.status();
      const c = ex.counters;
      const lost = c.queue_full + c.send_failed + c.lost_unacked;
      let status;
      if (failures > 0) {
        status = { fill: 'red', shape: 'dot', text: `${hopName}: ${failures} messages not stamped (see the log)` };
      } else if (s.state === 'connected' || s.state === 'closing') {
        status = lost > 0
          ? { fill: 'yellow', shape: 'dot', text: `${hopName}: ${stamper.stamped} stamped, ${lost} records lost` }
          : { fill: 'green', shape: 'dot', text: `${hopName}: ${stamper.stamped} stamped` };
      } else if (s.lastError) {
        status = { fill: 'red', shape: 'ring', text: `${hopName}: ${s.lastError}`.slice(0, 80) };
      } else {
        status = { fill: 'grey', shape: 'ring', text: `${hopName}: connecting` };
      }
      const key = JSON.stringify(status);
      if (key !== lastStatus) {
        lastStatus = key;
        node.status(status);
      }
    };
    const statusTimer = setInterval(showStatus, STATUS_INTERVAL_MS);
    statusTimer.unref();
    showStatus();

    node.on('input', (msg, send, done) => {
      if (stamper) {
        try {
          stamper.process(msg);
        } catch (e) {
          // Never lose the flow's message to the probe: pass it on as it is, and say so
          // (once; the count is in the node's status).
          failures += 1;
          if (failures === 1) node.error(`hoptrace: could not stamp a message (${e.message}); it is passed on unstamped`, msg);
        }
      }
      send(msg);
      done();
    });

    node.on('close', (done) => {
      clearInterval(statusTimer);
      if (stamper && collector && collector.entry) collector.entry.removeHop(node.id);
      done();
    });
  }

  RED.nodes.registerType('hoptrace', HoptraceNode);
};
