// Renders Vega-Lite specs to SVG without a browser, for report.md's static images.
// Usage: node render.mjs IN.vl.json OUT.svg [IN2.vl.json OUT2.svg ...]
import { readFileSync, writeFileSync } from 'node:fs';
import * as vega from 'vega';
import * as vl from 'vega-lite';

const args = process.argv.slice(2);
if (args.length === 0 || args.length % 2 !== 0) {
  console.error('usage: node render.mjs IN.vl.json OUT.svg [...]');
  process.exit(2);
}
let failed = 0;
for (let i = 0; i < args.length; i += 2) {
  const [input, output] = [args[i], args[i + 1]];
  try {
    const spec = JSON.parse(readFileSync(input, 'utf8'));
    const compiled = vl.compile(spec).spec;
    const view = new vega.View(vega.parse(compiled), { renderer: 'none' });
    const svg = await view.toSVG();
    view.finalize();
    writeFileSync(output, svg);
  } catch (e) {
    console.error(`${input}: ${e.message}`);
    failed += 1;
  }
}
process.exit(failed === 0 ? 0 : 1);
