'use strict';
// Finding where CLOCK_REALTIME is, in CLOCK_MONOTONIC nanoseconds, from JavaScript.
//
// Node has no nanosecond CLOCK_REALTIME: Date.now() is CLOCK_REALTIME floored to whole
// milliseconds, and process.hrtime.bigint() is CLOCK_MONOTONIC in nanoseconds. The
// moment Date.now() steps from D-1 to D, CLOCK_REALTIME reads exactly D ms. Spinning on
// Date.now() between two hrtime readings brackets that moment: the step happened after
// the monotonic reading taken before the last read that still returned D-1, and before
// the reading taken after the first read that returned D. The anchor is the middle of
// that bracket; half its width bounds the anchor's error (about 65 ns on an idle core,
// ~40 ns per Date.now() and per hrtime call). A bracket stretched by preemption is
// discarded; of several edges the narrowest is kept.
//
// Used by lib/clock.js on the main thread once at start (a few ms), and in a worker
// thread afterwards so that re-anchoring never stalls the event loop.

const hr = process.hrtime.bigint;

/**
 * Brackets one millisecond edge of Date.now().
 * @param {bigint} deadline monotonic ns after which to give up
 * @returns {{realNs: bigint, monoNs: bigint, halfWidthNs: bigint} | null}
 */
function findEdge(deadline) {
  let prevA = hr();
  let prevD = Date.now();
  for (;;) {
    const a = hr();
    const d = Date.now();
    const b = hr();
    if (d !== prevD) {
      // A step of exactly 1 ms is a clean edge; more means preemption or a clock step.
      if (d === prevD + 1) {
        return { realNs: BigInt(d) * 1000000n, monoNs: (prevA + b) / 2n, halfWidthNs: (b - prevA + 1n) / 2n };
      }
    }
    prevA = a;
    prevD = d;
    if (b > deadline) return null;
  }
}

/**
 * Brackets up to `edges` edges within `budgetMs` and returns the narrowest.
 * @returns {{realNs: bigint, monoNs: bigint, halfWidthNs: bigint} | null}
 */
function measureAnchor(edges = 3, budgetMs = 20) {
  const deadline = hr() + BigInt(budgetMs) * 1000000n;
  let best = null;
  for (let i = 0; i < edges; i++) {
    const e = findEdge(deadline);
    if (!e) break;
    if (!best || e.halfWidthNs < best.halfWidthNs) best = e;
  }
  return best;
}

module.exports = { findEdge, measureAnchor };

// As a worker thread: measure on request, post the anchor back.
const { isMainThread, parentPort, workerData } = require('node:worker_threads');

if (!isMainThread && parentPort && workerData && workerData.hoptraceAnchor) {
  parentPort.on('message', (m) => {
    if (m && m.measure) {
      const a = measureAnchor(m.edges, m.budgetMs);
      parentPort.postMessage(a && { realNs: a.realNs, monoNs: a.monoNs, halfWidthNs: a.halfWidthNs });
    }
  });
}
