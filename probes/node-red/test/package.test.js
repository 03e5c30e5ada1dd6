'use strict';
// The package as the npm registry would get it: `npm pack` makes the tarball, which
// installs (offline: it has no dependencies) into a new Node-RED user directory; Node-RED,
// started from this package's node_modules with that user directory, loads both node
// types from it without a missing type, and offers its example flow under Import >
// Examples (what the editor asks for: `library/examples/flows/<module>`).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const http = require('node:http');
const net = require('node:net');
const { spawn, execFileSync } = require('node:child_process');

const PKG = path.resolve(__dirname, '..');
const NODE_RED = path.join(PKG, 'node_modules', 'node-red', 'red.js');
const pkg = require('../package.json');

async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

function getJson(url) {
  return new Promise((resolve, reject) => {
    http.get(url, { headers: { Accept: 'application/json' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => {
        if (res.statusCode !== 200) reject(new Error(`${url}: HTTP ${res.statusCode}: ${body}`));
        else resolve(JSON.parse(body));
      });
    }).on('error', reject);
  });
}

test('package.json is ready for the registry: public, Apache-2.0, the files it needs', () => {
  assert.equal(pkg.private, undefined);
  assert.equal(pkg.license, 'Apache-2.0');
  assert.match(fs.readFileSync(path.join(PKG, 'LICENSE'), 'utf8'), /Apache License\s+Version 2\.0/);
  assert.ok(pkg.keywords.includes('node-red'), 'the flow library lists packages with the node-red keyword');
  assert.deepEqual(Object.keys(pkg.dependencies || {}), [], 'no runtime dependency');
});

test('npm pack, installed into a new user directory, loads in Node-RED with its example', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hoptrace-pack-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const packed = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', dir], { cwd: PKG, encoding: 'utf8' }));
  const files = packed[0].files.map((f) => f.path).sort();
  assert.ok(files.includes('examples/mqtt-flow.json') && files.includes('LICENSE') && files.includes('nodes/hoptrace.js'));
  assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('node_modules/')), files.join(' '));
  const tarball = path.join(dir, packed[0].filename);

  const userDir = path.join(dir, 'userdir');
  fs.mkdirSync(userDir);
  fs.writeFileSync(path.join(userDir, 'package.json'), JSON.stringify({ name: 'node-red-project', private: true }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', tarball], { cwd: userDir, stdio: 'pipe' });
  const installed = path.join(userDir, 'node_modules', pkg.name);
  assert.ok(fs.existsSync(path.join(installed, 'examples', 'mqtt-flow.json')));
  assert.ok(!fs.lstatSync(installed).isSymbolicLink(), 'installed from the tarball, not linked');

  // A collector node and a hoptrace node; no collector listens (the flow still starts).
  const flows = [
    { id: 't1', type: 'tab', label: 'pack test' },
    { id: 'c1', type: 'hoptrace-collector', collector: `127.0.0.1:${await freePort()}`, process: 'pack-test' },
    { id: 'h1', type: 'hoptrace', z: 't1', collector: 'c1', hop: 'flow_in', hopId: 1, mode: 'in', carrier: 'property', wires: [[]] },
  ];
  fs.writeFileSync(path.join(userDir, 'flows.json'), JSON.stringify(flows));
  const port = await freePort();
  fs.writeFileSync(path.join(userDir, 'settings.js'), `module.exports = {
  uiHost: '127.0.0.1',
  uiPort: ${port},
  flowFile: 'flows.json',
  credentialSecret: false,
  logging: { console: { level: 'info', metrics: false, audit: false } },
};
`);
  const child = spawn(process.execPath, [NODE_RED, '--userDir', userDir, '--settings', path.join(userDir, 'settings.js')],
    { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (c) => { out += c; });
  child.stderr.on('data', (c) => { out += c; });
  const exited = new Promise((r) => child.on('exit', r));
  t.after(async () => {
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  });
  const end = Date.now() + 60000;
  while (!/Started flows/.test(out)) {
    assert.ok(Date.now() < end && child.exitCode === null, `Node-RED did not start the flows:\n${out}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.doesNotMatch(out, /Waiting for missing types/);

  const nodes = await getJson(`http://127.0.0.1:${port}/nodes`);
  const ours = nodes.filter((n) => n.module === pkg.name);
  assert.deepEqual(ours.flatMap((n) => n.types).sort(), ['hoptrace', 'hoptrace-collector']);
  assert.ok(ours.every((n) => n.enabled && !n.err), JSON.stringify(ours));
  assert.equal(ours[0].version, pkg.version);

  // Import > Examples lists the module's examples/ folder, and imports the flow from it.
  const library = `http://127.0.0.1:${port}/library/examples/flows`;
  assert.ok((await getJson(`${library}/`)).includes(pkg.name));
  assert.deepEqual(await getJson(`${library}/${pkg.name}`), [{ fn: 'mqtt-flow' }]);
  const flow = await getJson(`${library}/${pkg.name}/mqtt-flow`);
  assert.deepEqual(flow, JSON.parse(fs.readFileSync(path.join(PKG, 'examples', 'mqtt-flow.json'), 'utf8')));
  assert.ok(flow.some((n) => n.type === 'hoptrace') && flow.some((n) => n.type === 'hoptrace-collector'));
});
