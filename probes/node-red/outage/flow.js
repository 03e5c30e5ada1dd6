#!/usr/bin/env node
'use strict';
// Prints the outage host's Node-RED flow (flows.json) on stdout:
//
//   node flow.js [--collector HOST:PORT]
//
//   inject (once, at deploy) -> generator (function) -> hoptrace flow_in -> sink (function)
//
// With --collector the hoptrace node (hop flow_in, id 1, mode in, MQTT v5 user property,
// the node's defaults) sits between generator and sink, its collector config node at
// HOST:PORT with every other setting at its default; without it the generator is wired
// straight to the sink and the flow is otherwise the same. The function nodes call the
// Host of host.js (global context `hoptraceOutage`, set by settings.js).

const TAB = '0a7a6e0000000001';
const IDS = {
  inject: '0a7a6e0000000002',
  generator: '0a7a6e0000000003',
  hoptrace: '0a7a6e0000000004',
  sink: '0a7a6e0000000005',
  collector: '0a7a6e0000000006',
};

// The generator sends every message on its own, as an input node does (node.send(msg,
// false): no copy), from a 1 ms timer; the per-second lines come from a second timer.
// Node-RED clears both when the flow stops.
const GENERATOR = `const host = global.get('hoptraceOutage');
if (!host.start()) return null;
const send = (m) => node.send(m, false);
const tick = setInterval(() => {
    if (!host.tick(send)) clearInterval(tick);
}, 1);
const report = setInterval(() => {
    if (!host.second()) clearInterval(report);
}, 1000);
return null;`;

const SINK = `global.get('hoptraceOutage').arrive(msg);
return null;`;

function fn(id, name, func, wires, x) {
  return {
    id, type: 'function', z: TAB, name, func, outputs: 1, timeout: 0, noerr: 0,
    initialize: '', finalize: '', libs: [], x, y: 80, wires,
  };
}

function flow(collector) {
  const nodes = [
    { id: TAB, type: 'tab', label: 'hoptrace outage host', disabled: false, info: '' },
    {
      id: IDS.inject, type: 'inject', z: TAB, name: 'start', props: [{ p: 'payload' }],
      repeat: '', crontab: '', once: true, onceDelay: 0.1, topic: '', payload: '', payloadType: 'str',
      x: 110, y: 80, wires: [[IDS.generator]],
    },
    fn(IDS.generator, 'generator', GENERATOR, [[collector ? IDS.hoptrace : IDS.sink]], 280),
  ];
  if (collector) {
    nodes.push(
      {
        id: IDS.hoptrace, type: 'hoptrace', z: TAB, name: '', collector: IDS.collector,
        hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', headers: 'headers',
        payloadAs: 'buffer', x: 460, y: 80, wires: [[IDS.sink]],
      },
      {
        id: IDS.collector, type: 'hoptrace-collector', name: '', collector,
        process: 'node-red', queueCapacity: 65536, retentionMiB: 64, tlsCa: '', tlsName: '',
      },
    );
  }
  nodes.push(fn(IDS.sink, 'sink', SINK, [], 640));
  return nodes;
}

function main(argv) {
  let collector = null;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--collector' && i + 1 < argv.length) {
      collector = argv[++i];
    } else {
      process.stderr.write('usage: node flow.js [--collector HOST:PORT]\n');
      return 2;
    }
  }
  process.stdout.write(`${JSON.stringify(flow(collector), null, 1)}\n`);
  return 0;
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));

module.exports = { flow };
