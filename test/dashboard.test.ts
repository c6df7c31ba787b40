/**
 * /debug/memory as a page, in headless Chromium (Debian's chromium driven by playwright-core): the
 * chart fills with samples, its series carry points, a screenshot shows the drawn lines; content
 * negotiation; the page's key from its URL fragment where the server has an admin key.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import type { Server } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { chromium, type Browser, type Page } from 'playwright-core';
import request from 'supertest';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

const CHROMIUM = process.env['RAGGUARD_CHROMIUM'] ?? '/usr/bin/chromium';
const NO_BROWSER = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM}: apt-get install -y --no-install-recommends chromium (or set RAGGUARD_CHROMIUM)`;
const ADMIN = 'admin-key-for-dashboard';
let models: Models;
let service: RagService;
let browser: Browser | undefined;
const servers: Server[] = [];
let url: string;
let keyedUrl: string;

function listen(s: RagService): Promise<string> {
  return new Promise((resolve) => {
    const server = createApp(s, { logger: createLogger('silent') }).listen(0, '127.0.0.1', () => {
      const a = server.address();
      resolve(`http://127.0.0.1:${typeof a === 'object' && a ? a.port : 0}`);
    });
    servers.push(server);
  });
}

before(async () => {
  const env = { RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas', 'syslog']), RAGGUARD_PROFILE_RUN: 'false' };
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), ...env });
  models = await loadModels(cfg);
  service = await RagService.start(cfg, models);
  url = await listen(service);
  keyedUrl = await listen(await RagService.start(testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), ...env, RAGGUARD_ADMIN_KEY: ADMIN }), models));
  if (!NO_BROWSER) browser = await chromium.launch({ executablePath: CHROMIUM });
});

after(async () => {
  await browser?.close();
  for (const s of servers) s.close();
});

interface PixelCounts {
  total: number;
  nonBackground: number;
  weights: number;
  kvPool: number;
  width: number;
  height: number;
}

/** Waits (the page opened with bypassCSP: its CSP forbids evaluating strings; no deadline of its own: the poll is event-driven) until the page has `n` samples. */
async function samples(page: Page, n: number): Promise<void> {
  await page.waitForFunction(`Number(document.body.dataset.samples ?? 0) >= ${n}`, undefined, { timeout: 0 });
}

describe('content negotiation', () => {
  test('JSON for API clients, the page for browsers and at /debug/memory.html', async () => {
    const json = await request(url).get('/debug/memory').expect(200);
    assert.match(json.headers['content-type'] ?? '', /application\/json/);
    assert.equal(typeof json.body.budget.bytes, 'number');
    const viaAccept = await request(url).get('/debug/memory').set('Accept', 'text/html,application/xhtml+xml,*/*;q=0.8').expect(200);
    assert.match(viaAccept.headers['content-type'] ?? '', /text\/html/);
    const page = await request(url).get('/debug/memory.html').expect(200);
    assert.match(page.text, /<svg id="chart"/);
    // Self-contained: no external script, style or font.
    assert.ok(!/(src|href)=["']?https?:/.test(page.text));
    assert.match(page.headers['content-security-policy'] ?? '', /default-src 'none'/);
  });
});

describe('the memory page in headless Chromium', { skip: NO_BROWSER }, () => {
  test('the chart fills with samples of every component; the screenshot shows the lines', async () => {
    const page = await browser!.newPage({ viewport: { width: 1000, height: 600 }, bypassCSP: true });
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    // The chart keeps the last 6 samples.
    await page.goto(`${url}/debug/memory?interval=100&points=6`);
    await samples(page, 2);
    // A query in between: the KV pool is used, the samples change.
    await request(url).post('/query').send({ query: 'disk quotas for users', max_new_tokens: 4 }).expect(200);
    // Then 7 more polls, so that the chart shows only samples taken after the query: while it ran, its
    // workspace reservation (82 MiB here) lay on the weights' line and was drawn over it, across the
    // whole chart when the query outlasted the window on a loaded machine.
    for (let i = 0; i < 7; i++) await page.waitForResponse((r) => new URL(r.url()).pathname === '/debug/memory', { timeout: 0 });
    await samples(page, 6);
    const series = await page.$$eval('#chart polyline.series', (els) => els.map((e) => ({ name: e.getAttribute('data-name'), points: Number(e.getAttribute('data-points')) })));
    const byName = Object.fromEntries(series.map((s) => [s.name, s.points]));
    for (const n of ['weights', 'kv_pool', 'kv_used', 'workspace_reserved', 'adapters', 'process_rss']) assert.ok(byName[n]! >= 4, `${n}: ${byName[n]} points`);
    // No GPU here: the GPU series has no points (the legend says n/a), rather than zeros.
    assert.equal(byName['gpu_used'], 0);
    assert.match(await page.textContent('#legend') ?? '', /gpu_used: n\/a/);
    assert.match(await page.textContent('#legend') ?? '', /kv_pool: [\d.]+ MiB/);
    assert.deepEqual(errors, []);

    const png = await page.locator('#chart').screenshot();
    if (process.env['RAGGUARD_SCREENSHOT']) await page.screenshot({ path: process.env['RAGGUARD_SCREENSHOT'] });
    assert.equal(png.subarray(1, 4).toString(), 'PNG');
    // The screenshot decoded by the browser itself (a blank page, no CSP): count the lines' colours.
    const check = await browser!.newPage();
    // A string, not a function: it runs in the browser, untouched by the TypeScript transform.
    const counts = await check.evaluate<PixelCounts>(`(async (b64) => {
      const img = new Image();
      img.src = 'data:image/png;base64,' + b64;
      await img.decode();
      const c = document.createElement('canvas');
      c.width = img.width;
      c.height = img.height;
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, c.width, c.height).data;
      const near = (i, rgb) => Math.abs(d[i] - rgb[0]) + Math.abs(d[i + 1] - rgb[1]) + Math.abs(d[i + 2] - rgb[2]) < 60;
      let total = 0, nonBackground = 0;
      const weights = new Set(), kvPool = new Set(); // the columns where each line's colour shows
      for (let i = 0; i < d.length; i += 4) {
        total++;
        if (!near(i, [250, 250, 250]) && !near(i, [255, 255, 255])) nonBackground++;
        if (near(i, [0x1f, 0x77, 0xb4])) weights.add((i / 4) % c.width);
        if (near(i, [0xff, 0x7f, 0x0e])) kvPool.add((i / 4) % c.width);
      }
      return { total, nonBackground, weights: weights.size, kvPool: kvPool.size, width: c.width, height: c.height };
    })(${JSON.stringify(png.toString('base64'))})`);
    await check.close();
    assert.equal(counts.width, 962); // 960 and its 1-pixel border
    assert.equal(counts.height, 422);
    assert.ok(counts.nonBackground > counts.total * 0.005, `drawn pixels: ${JSON.stringify(counts)}`);
    // Each line runs across the chart (its points span the width) and is drawn: its colour shows in a tenth
    // of the columns at least. Not more: a flat line may be drawn over by another series at a nearby value
    // (its own colour was seen in 492 of 960 pixels once, in 310 another time).
    const spans = await page.$$eval('#chart polyline.series', (els) => els.map((e) => {
      const xs = (e.getAttribute('points') ?? '').trim().split(/\s+/).filter(Boolean).map((p: string) => Number(p.split(',')[0]));
      return { name: e.getAttribute('data-name'), span: xs.length > 1 ? Math.max(...xs) - Math.min(...xs) : 0 };
    }));
    const chartWidth = await page.$eval('#chart', (el) => el.getBoundingClientRect().width);
    for (const n of ['weights', 'kv_pool']) {
      const span = spans.find((x) => x.name === n)?.span ?? 0;
      assert.ok(span > chartWidth * 0.8, `${n} spans ${span} of ${chartWidth} px`);
    }
    // Unless a series drawn after it lies on it at every sample (within 2 px: on a clean clone the host's
    // accounted bytes once sat on the weights' figure): then it is drawn and covered, as it should be.
    const lines = await page.$$eval('#chart polyline.series', (els) => els.map((e) => ({
      name: e.getAttribute('data-name') ?? '',
      ys: (e.getAttribute('points') ?? '').trim().split(/\s+/).filter(Boolean).map((p: string) => Number(p.split(',')[1])),
    })));
    const w = lines.findIndex((l) => l.name === 'weights');
    const cover = lines.slice(w + 1).find((l) => l.ys.length === lines[w]!.ys.length && l.ys.every((y: number, i: number) => Math.abs(y - lines[w]!.ys[i]!) <= 2));
    const legend = await page.textContent('#legend');
    assert.ok(counts.weights > counts.width / 10 || cover !== undefined, `weights line: ${JSON.stringify(counts)}; legend: ${legend}`);
    assert.ok(counts.kvPool > counts.width / 10, `kv_pool line: ${JSON.stringify(counts)}; legend: ${legend}`);
    await page.close();
  });

  test('with an admin key: the shell opens, the data needs the key from the fragment', async () => {
    const page = await browser!.newPage({ bypassCSP: true }); // the waits below evaluate strings: the page's CSP forbids eval
    await page.goto(`${keyedUrl}/debug/memory.html?interval=100`);
    await page.waitForFunction("/poll failed: HTTP 401/.test(document.getElementById('status').textContent)", undefined, { timeout: 0 });
    await page.goto(`${keyedUrl}/debug/memory.html?interval=100#key=${ADMIN}`);
    await page.reload();
    await samples(page, 2);
    await page.close();
    // The data route itself stays closed without the key.
    await request(keyedUrl).get('/debug/memory').expect(401);
  });
});
