'use strict';
// node-red-contrib-hoptrace: a hoptrace probe for Node-RED flows, and the pieces it is
// made of, usable without Node-RED:
// - context: the trace context's binary, text and envelope forms (docs/trace-format.md)
// - carriers: MQTT v5 user property, Kafka headers, envelope, as Node-RED messages hold them
// - protocol: the collector protocol's frames (docs/collector-protocol.md)
// - exporter: the background connection to the collector, with its bounded queue
// - clock: CLOCK_REALTIME nanoseconds from hrtime, and the host's clock status
// - hop: stamp + report + pass on, for one message

module.exports = {
  context: require('./context'),
  traceparent: require('./traceparent'),
  carriers: require('./carriers'),
  protocol: require('./protocol'),
  exporter: require('./exporter'),
  clock: require('./clock'),
  hop: require('./hop'),
};
