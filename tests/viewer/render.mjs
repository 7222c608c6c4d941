// Loads a Chrome trace in speedscope (from the npm registry, served locally: no network) in
// headless Chromium, checks that it rendered a profile (not speedscope's import error), and
// writes a screenshot.
//   node render.mjs TRACE.json SCREENSHOT.png
// Prints one JSON line: {"ok": bool, "title": ..., "error": ...}; exit 0 only when ok.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const [tracePath, shot] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, 'node_modules/speedscope/dist/release');
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css',
  '.json': 'application/json', '.wasm': 'application/wasm', '.png': 'image/png',
  '.woff2': 'font/woff2', '.ico': 'image/x-icon' };
const server = http.createServer((req, res) => {
  const url = decodeURIComponent(req.url.split('?')[0].split('#')[0]);
  const file = url === '/trace.json' ? tracePath : path.join(root, url === '/' ? 'index.html' : url);
  fs.readFile(file, (err, data) => {
    if (err) { res.writeHead(404); res.end(); return; }
    res.writeHead(200, { 'Content-Type': types[path.extname(file)] || 'application/octet-stream' });
    res.end(data);
  });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const port = server.address().port;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--headless=new'],
});
let result = { ok: false };
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`http://127.0.0.1:${port}/index.html#profileURL=/trace.json`);
  // speedscope replaces its landing page with the profile view (canvas + toolbar) once the
  // import succeeds; an import failure shows an error message instead.
  await page.waitForFunction(() => document.querySelectorAll('canvas').length > 0
    || /error|could not|unrecognized/i.test(document.body.innerText), null, { timeout: 30000 });
  await page.waitForTimeout(1500);
  // PROFILE=a,b,…: show those threads' tracks (speedscope shows one at a time; its profile
  // picker filters by name) and stack their top strips into one screenshot.
  const strips = [];
  for (const want of (process.env.PROFILE || '').split(',').filter(Boolean)) {
    await page.click('text=/\\(\\d+\\/\\d+\\)/');
    await page.fill('input[placeholder="Filter..."]', want);
    await page.waitForTimeout(300);
    await page.getByText(want, { exact: false }).last().click();
    await page.waitForTimeout(1000);
    const title = await page.evaluate(() => document.body.innerText.split('\n')[1] || '');
    const png = await page.screenshot({ clip: { x: 0, y: 0, width: 1600, height: 190 } });
    strips.push({ title, png: png.toString('base64') });
  }
  const text = await page.evaluate(() => document.body.innerText);
  const canvases = await page.evaluate(() => document.querySelectorAll('canvas').length);
  const failed = /Something went wrong|could not|unrecognized format/i.test(text);
  if (strips.length > 0) {
    const html = strips.map((s) => `<div style="font:14px monospace;padding:4px;background:#eee">${s.title.replace(/</g, '&lt;')}</div><img src="data:image/png;base64,${s.png}" style="display:block">`).join('');
    const composite = await browser.newPage({ viewport: { width: 1600, height: 230 * strips.length } });
    await composite.setContent(`<body style="margin:0">${html}</body>`);
    await composite.screenshot({ path: shot, fullPage: true });
  } else {
    await page.screenshot({ path: shot });
  }
  result = { ok: canvases > 0 && !failed, canvases, title: await page.title(),
    text: text.slice(0, 300), errors };
} catch (e) {
  result = { ok: false, error: String(e) };
} finally {
  await browser.close();
  server.close();
}
console.log(JSON.stringify(result));
process.exit(result.ok ? 0 : 1);
