/**
 * /debug/memory as a page: a live chart of memory by component over time (weights, KV pool and the
 * part of it in use, workspace reserved, adapter slots, the index, GPU used, resident memory, ONNX
 * Runtime's accounted bytes). Served for `GET /debug/memory` when the client prefers HTML (a browser)
 * and always at `/debug/memory.html`; everything else gets the JSON snapshot as before.
 *
 * One self-contained page: inline SVG drawn by inline script, no CDN, no build. It polls the JSON
 * snapshot (every `?interval=` ms, default 1000) and keeps the last `?points=` samples (default 300),
 * on a log scale (components span MiB to GiB; `?scale=linear` for a linear one).
 * Where the server has an admin or API key, the page sends the key given in its URL's fragment
 * (`/debug/memory.html#key=...`): a fragment never leaves the browser, so it is in no log.
 */
import type { NextFunction, Request, Response } from 'express';

export function dashboardIfHtml(req: Request, res: Response, next: NextFunction): void {
  if (req.path === '/debug/memory.html' || req.accepts(['application/json', 'text/html']) === 'text/html') {
    res.type('html').setHeader('Content-Security-Policy', "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:");
    res.send(PAGE);
    return;
  }
  next();
}

const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ragguard memory</title>
<style>
body{font:13px system-ui,sans-serif;margin:16px;background:#fff;color:#222}
h1{font-size:16px;margin:0 0 8px}
#status{color:#666;margin-bottom:8px}
#chart{border:1px solid #ccc;background:#fafafa}
#legend{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:2px 16px;margin-top:8px}
.sw{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-2px}
.grid{stroke:#e2e2e2}
.axis{fill:#555;font-size:11px}
</style></head>
<body>
<h1>ragguard memory by component</h1>
<div id="status">waiting for the first sample&hellip;</div>
<svg id="chart" width="960" height="420" viewBox="0 0 960 420" role="img" aria-label="memory by component over time"></svg>
<div id="legend"></div>
<script>
(() => {
  const params = new URLSearchParams(location.search);
  const interval = Math.max(50, Number(params.get('interval')) || 1000);
  const keep = Math.max(2, Number(params.get('points')) || 300);
  // Log by default: components span from a few MiB (adapters, index) to the budget's GiB.
  const log = params.get('scale') !== 'linear';
  const FLOOR = 1048576;
  const key = new URLSearchParams(location.hash.slice(1)).get('key');
  const url = new URL('memory', location.href);
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const comp = (s, n) => (s.components.find((c) => c.name === n) || { bytes: 0 }).bytes;
  const SERIES = [
    ['weights', '#1f77b4', (s) => comp(s, 'embedder') + comp(s, 'reranker') + comp(s, 'decoder')],
    ['kv_pool', '#ff7f0e', (s) => s.budget.kv_pool_bytes],
    ['kv_used', '#d62728', (s) => s.kv.total_blocks ? s.budget.kv_pool_bytes * s.kv.used_blocks / s.kv.total_blocks : 0],
    ['workspace_reserved', '#2ca02c', (s) => s.budget.workspace_reserved_bytes],
    ['workspace_budget', '#98df8a', (s) => s.budget.workspace_bytes],
    ['adapters', '#9467bd', (s) => comp(s, 'adapter_slots')],
    ['faiss_index', '#8c564b', (s) => comp(s, 'faiss_index')],
    ['gpu_used', '#e377c2', (s) => s.gpu ? sum(s.gpu.gpus.map((g) => g.used_bytes)) : null],
    ['process_rss', '#7f7f7f', (s) => s.process.rss],
    ['onnxruntime_host', '#17becf', (s) => s.onnxruntime_host.accounted ? s.onnxruntime_host.live_bytes : null],
  ];
  const samples = [];
  const svg = document.getElementById('chart');
  const NS = 'http://www.w3.org/2000/svg';
  const W = 960, H = 420, L = 70, R = 10, T = 10, B = 30;
  const mib = (b) => (b / 1048576).toFixed(1) + ' MiB';
  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  }
  function draw() {
    svg.textContent = '';
    const t0 = samples[0].t, t1 = Math.max(samples[samples.length - 1].t, t0 + 1);
    let max = 2 * FLOOR;
    for (const s of samples) for (const v of s.v) if (v !== null && v > max) max = v;
    const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
    // Log scale: values under 1 MiB (zeros included) sit on the floor line.
    const f = log ? (v) => Math.log10(Math.max(v, FLOOR) / FLOOR) : (v) => v;
    const y = (v) => H - B - (H - T - B) * f(v) / f(max);
    const ticks = [];
    if (log) for (let v = FLOOR; v <= max; v *= 10) ticks.push(v);
    else for (let i = 0; i <= 4; i++) ticks.push(max * i / 4);
    for (const v of ticks) {
      el('line', { class: 'grid', x1: L, x2: W - R, y1: y(v), y2: y(v) });
      el('text', { class: 'axis', x: 4, y: y(v) + 4 }, mib(v));
    }
    el('text', { class: 'axis', x: L, y: H - 8 }, ((t1 - t0) / 1000).toFixed(0) + ' s shown, newest right; ' + (log ? 'log' : 'linear') + ' scale (?scale=' + (log ? 'linear' : 'log') + ')');
    SERIES.forEach(([name, color], i) => {
      const pts = samples.filter((s) => s.v[i] !== null).map((s) => x(s.t).toFixed(1) + ',' + y(s.v[i]).toFixed(1));
      el('polyline', { class: 'series', 'data-name': name, 'data-points': pts.length, fill: 'none', stroke: color, 'stroke-width': 2, points: pts.join(' ') });
    });
  }
  function legend() {
    const last = samples[samples.length - 1];
    document.getElementById('legend').innerHTML = SERIES.map(([name, color], i) =>
      '<div><span class="sw" style="background:' + color + '"></span>' + name + ': ' +
      (last.v[i] === null ? 'n/a' : mib(last.v[i])) + '</div>').join('');
  }
  async function poll() {
    try {
      const headers = { Accept: 'application/json' };
      if (key) headers.Authorization = 'Bearer ' + key;
      const r = await fetch(url, { headers });
      if (!r.ok) throw new Error('HTTP ' + r.status);
      const s = await r.json();
      samples.push({ t: performance.now(), v: SERIES.map(([, , f]) => f(s)) });
      if (samples.length > keep) samples.shift();
      draw();
      legend();
      document.getElementById('status').textContent = samples.length + ' samples, every ' + interval + ' ms; budget ' + mib(s.budget.bytes);
      document.body.dataset.samples = String(samples.length);
    } catch (e) {
      document.getElementById('status').textContent = 'poll failed: ' + e.message;
    }
    setTimeout(poll, interval);
  }
  poll();
})();
</script>
</body></html>`;
