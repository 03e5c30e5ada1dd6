'use strict';
// One exporter per collector per process: every config node that names the same
// collector (address, token, process name and TLS settings) shares one connection, and every hoptrace
// node using any of them adds its hop to that connection's Hello.

const { Exporter } = require('./exporter');
const { sharedClock, ClockStatusReader } = require('./clock');

const HOP_NAME = /^[a-z0-9_]+$/;

const entries = new Map();

class SharedExporter {
  constructor(key, settings, log) {
    this.key = key;
    this.users = new Set();
    this.hopOwners = new Map(); // owner id -> [hop id, hop name]
    this.clock = sharedClock();
    this.clock.start();
    this.exporter = new Exporter({
      ...settings,
      clock: this.clock,
      clockStatus: new ClockStatusReader(this.clock),
      log,
    });
    this.started = false;
  }

  /** Starts connecting (once the hops of the deployed flows are known). */
  start() {
    if (this.started) return;
    this.started = true;
    this.exporter.start();
  }

  /**
   * Announces hop `id` named `name` for the node `owner`.
   * @returns {string|null} why the hop cannot be used, or null
   */
  addHop(owner, id, name) {
    if (!Number.isInteger(id) || id < 0 || id > 255) return `hop id ${id} is not an integer 0..255`;
    if (typeof name !== 'string' || !HOP_NAME.test(name)) {
      return `hop name ${JSON.stringify(name)} must be lower-case letters, digits and _`;
    }
    for (const [o, [i, n]] of this.hopOwners) {
      if (o === owner) continue;
      if (i === id && n !== name) return `hop id ${id} is already announced as ${JSON.stringify(n)}`;
      if (n === name && i !== id) return `hop ${JSON.stringify(name)} is already announced with id ${i}`;
    }
    const ids = new Set([...this.hopOwners.values()].map(([i]) => i));
    ids.add(id);
    if (ids.size > 16) return 'one collector connection announces at most 16 hops';
    this.hopOwners.set(owner, [id, name]);
    this._announce();
    return null;
  }

  removeHop(owner) {
    if (this.hopOwners.delete(owner)) this._announce();
  }

  _announce() {
    const hops = new Map();
    for (const [id, name] of this.hopOwners.values()) hops.set(id, name);
    this.exporter.setHops(hops);
  }
}

function keyOf(settings) {
  return JSON.stringify([settings.collector, settings.token || '', settings.process || '',
    settings.tlsCaFile || '', settings.tlsServerName || '']);
}

/**
 * The shared exporter for `settings`, created on first use; `user` names the config node
 * holding it.
 */
function acquire(user, settings, log) {
  const key = keyOf(settings);
  let e = entries.get(key);
  if (!e) {
    e = new SharedExporter(key, settings, log);
    entries.set(key, e);
  }
  e.users.add(user);
  return e;
}

/**
 * Gives the exporter back; the last user shuts it down (final Counters, Goodbye).
 * @returns {Promise<{clean: boolean, counters: object} | null>}
 */
function release(user, e, timeoutMs) {
  e.users.delete(user);
  if (e.users.size > 0) return Promise.resolve(null);
  entries.delete(e.key);
  return e.exporter.shutdown(timeoutMs).finally(() => e.clock.stop());
}

module.exports = { acquire, release, HOP_NAME };
