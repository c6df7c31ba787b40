/**
 * Cluster: PostgreSQL + BENCH_CLUSTER_REPLICAS (3) replicas + HAProxy on loopback, started by
 * scripts/cluster.sh as an operator would, under a mixed load of ingests and queries.
 *
 * 1. Prefix cache: BENCH_CLUSTER_GROUPS (6) groups, each one new document (PUT /documents/:id) then
 *    BENCH_CLUSTER_ASKS (6) asks of its question (/query), the groups' chains run by BENCH_CLUSTER_CLIENTS (3)
 *    clients at once; first behind round robin, then (the router restarted, the replicas and their caches
 *    kept; new groups, so no run profits from the other's blocks) behind prefix hashing. Hit rate: the
 *    replies' cached_prompt_tokens over prompt_tokens.
 * 2. Failure: for BENCH_CLUSTER_KILL_LOAD_S (60) seconds, and on until the restarted replica serves again, the
 *    clients send queries and ingests (every third request a PUT of a new document); at a third of it replica 2
 *    gets kill -9; the router's stats page is
 *    read every 200 ms (when does it mark the replica DOWN); at two thirds the replica is restarted
 *    (scripts/cluster.sh replica 2): when is it ready, when UP in the router, does it serve again. A client
 *    retries a connection error or a 502/503/504 (after Retry-After) up to 6 times; every reply is counted by
 *    class. After the load every acknowledged (200/201) document is read back through the router: lost = the
 *    acknowledged ones not there.
 * 3. The database failing: the same load for BENCH_CLUSTER_PG_OUTAGE_S x 3 (20 x 3) seconds; after the first
 *    third PostgreSQL is stopped as a crash stops it (scripts/postgres.sh crash: pg_ctl stop -m immediate)
 *    and started again (restart) BENCH_CLUSTER_PG_OUTAGE_S later. Every reply is counted by window (before,
 *    during, after the outage) and by status and error code (503 store_unavailable is the answer wanted
 *    during it; a 500 is a bug), with the slowest reply of the outage (no request may hang past the
 *    timeouts); seconds from the database's return to the first query answered 200; acknowledged ingests
 *    read back after it (lost: goal 0). Only when the cluster started its own PostgreSQL.
 *
 * 4. The router restarted: the same load; after BENCH_CLUSTER_ROUTER_S (10) seconds HAProxy is reloaded
 *    gracefully (haproxy -sf: the new process takes the listener, the old one finishes what it holds), then
 *    BENCH_CLUSTER_ROUTER_S later stopped hard (SIGTERM: HAProxy's hard stop, its connections cut) and
 *    started again BENCH_CLUSTER_ROUTER_DOWN_S (5) seconds later from the same haproxy.cfg, as a crashed or
 *    redeployed router comes back; the load goes on BENCH_CLUSTER_ROUTER_S after it. Every reply by window
 *    (before, reload, down, after) and status, the slowest, seconds from the start to the first query
 *    answered 200 and to every replica UP in the new router's checks, acknowledged ingests read back (lost:
 *    goal 0). A client sees connection errors while no router listens, and retries them (PUT is idempotent).
 *
 * BENCH_CLUSTER_PHASES (cache,kill,outage,router): which of the four run.
 *
 * Models: the small test models (test/helpers.ts TEST_ENV) by default, to fit a 2-core machine;
 * BENCH_CLUSTER_DEFAULT_MODELS=1 for the configuration's defaults. Bounded: every request has a timeout
 * (BENCH_CLUSTER_REQUEST_TIMEOUT_S, 120) and the run its deadline (BENCH_CLUSTER_DEADLINE_S, 1200). The
 * cluster is stopped at the end whatever happens. Last line: JSON.
 */
import { execFile } from 'node:child_process';
import { copyFileSync, existsSync, readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';

const ROOT = path.resolve(import.meta.dirname, '..');
// test/helpers.ts TEST_ENV's models (not imported: that module registers node:test hooks, whose report
// would follow the JSON line).
const TEST_MODELS = { RAGGUARD_EMBEDDER: 'models/embedder', RAGGUARD_DECODER: 'models/decoder-gqa', RAGGUARD_RERANK: 'true' };
const num = (name: string, dflt: number) => Number(process.env[name] ?? dflt);
const REPLICAS = num('BENCH_CLUSTER_REPLICAS', 3);
const GROUPS = num('BENCH_CLUSTER_GROUPS', 6);
const ASKS = num('BENCH_CLUSTER_ASKS', 6);
const CLIENTS = num('BENCH_CLUSTER_CLIENTS', 3);
const KILL_LOAD_S = num('BENCH_CLUSTER_KILL_LOAD_S', 60);
const NEW_TOKENS = num('BENCH_CLUSTER_NEW_TOKENS', 8);
const REQUEST_TIMEOUT_MS = num('BENCH_CLUSTER_REQUEST_TIMEOUT_S', 120) * 1000;
const DEADLINE = Date.now() + num('BENCH_CLUSTER_DEADLINE_S', 1200) * 1000;
const DEFAULT_MODELS = process.env['BENCH_CLUSTER_DEFAULT_MODELS'] === '1';
const VICTIM = 2;
const PG_OUTAGE_S = num('BENCH_CLUSTER_PG_OUTAGE_S', 20);
const ROUTER_S = num('BENCH_CLUSTER_ROUTER_S', 10);
const ROUTER_DOWN_S = num('BENCH_CLUSTER_ROUTER_DOWN_S', 5);
const PHASES = new Set((process.env['BENCH_CLUSTER_PHASES'] ?? 'cache,kill,outage,router').split(',').map((x) => x.trim()));
const RETRIES = 6;

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const log = (s: string) => console.log(`[bench:cluster] ${s}`);
const now = () => performance.now() / 1000;

const dir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-cluster-'));
const clusterEnv: NodeJS.ProcessEnv = {
  ...process.env, ...(DEFAULT_MODELS ? {} : TEST_MODELS), RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false',
};
const cluster = (...args: string[]) => run('bash', ['scripts/cluster.sh', ...args, '--dir', dir], { cwd: ROOT, env: clusterEnv, maxBuffer: 1 << 24 });

// ---------------------------------------------------------------------------------------------------- client
type Outcome = 'ok' | 'retryable' | 'connection' | 'other';
const outcomes: Record<Outcome, number> = { ok: 0, retryable: 0, connection: 0, other: 0 };
const others: string[] = [];
/** Raw replies (every attempt) by window and "status code", while a window is set (the outage phase). */
let window: string | undefined;
let byWindow: Record<string, Record<string, number>> = {};
let slowest: Record<string, number> = {};
function tally(status: string, seconds: number): void {
  if (!window) return;
  const w = (byWindow[window] ??= {});
  w[status] = (w[status] ?? 0) + 1;
  slowest[window] = Math.max(slowest[window] ?? 0, seconds);
}

interface Reply { status: number; body: any }

/** One logical request: retried on a connection error or a 502/503/504 (after its Retry-After). */
async function call(base: string, method: string, p: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply | undefined> {
  for (let attempt = 0; attempt <= RETRIES; attempt++) {
    let res: Response;
    const sent = now();
    try {
      res = await fetch(base + p, {
        method, headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
        body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
    } catch (e) {
      // The cause's code (ECONNREFUSED: nothing listens; UND_ERR_SOCKET: the connection closed under the request).
      const cause = (e as { cause?: { code?: string } }).cause?.code;
      tally(`connection error${cause ? ` ${cause}` : ''}`, now() - sent);
      outcomes.connection++;
      await sleep(500);
      continue;
    }
    const text = await res.text().catch(() => '');
    let code = '';
    try { code = String(JSON.parse(text)?.error?.code ?? ''); } catch { /* not JSON */ }
    tally(`${res.status}${code ? ` ${code}` : ''}`, now() - sent);
    if (res.status >= 502 && res.status <= 504) {
      const after = Number(res.headers.get('retry-after'));
      if (Number.isFinite(after) && after >= 0 && res.headers.has('retry-after')) outcomes.retryable++;
      else { outcomes.other++; others.push(`${method} ${p}: ${res.status} without Retry-After`); }
      await sleep(Math.min(5, Number.isFinite(after) ? after : 1) * 1000);
      continue;
    }
    if (res.status >= 200 && res.status < 300) outcomes.ok++;
    else { outcomes.other++; others.push(`${method} ${p}: ${res.status} ${text.slice(0, 200)}`); }
    let parsed: any;
    try { parsed = JSON.parse(text); } catch { parsed = text; }
    return { status: res.status, body: parsed };
  }
  return undefined;
}

// A document whose codename makes its chunk the best match of its own question, so each group's prompt
// carries its own document first: one prefix per group.
const words = ['amber', 'basalt', 'cobalt', 'dune', 'ember', 'fjord', 'garnet', 'heron', 'indigo', 'juniper', 'krypton', 'lichen'];
function codename(tag: string, i: number): string {
  return `${words[i % words.length]}${tag}${i}`;
}
function documentText(name: string, i: number): string {
  return `The ${name} daemon listens on TCP port ${4000 + i} and writes its journal to /var/log/${name}.log. ` +
    `Restart ${name} with systemctl restart ${name} after changing /etc/${name}.conf; ${name} rotates its journal daily ` +
    `and keeps ${i % 9 + 2} old journals. The ${name} daemon refuses to start when its port is taken.`;
}
const question = (name: string) => `Which TCP port does the ${name} daemon listen on?`;

interface Usage { prompt: number; cached: number; asks: number; failed: number }

/** One query about `name`'s port, counted in `usage`; true when it was answered (200 with its guard report). */
async function ask(base: string, name: string, usage: Usage): Promise<boolean> {
  const r = await call(base, 'POST', '/query', { query: question(name), max_new_tokens: NEW_TOKENS });
  usage.asks++;
  const run = r?.status === 200 ? r.body?.guard?.as_run : undefined;
  if (!run) { usage.failed++; return false; }
  usage.prompt += Number(run.prompt_tokens ?? 0);
  usage.cached += Number(run.cached_prompt_tokens ?? 0);
  return true;
}

/**
 * The fault phases' load: CLIENTS clients until stop() or the deadline; every third request
 * ingests a new document named from `tag` (acknowledged: 200 or 201), the others ask a group's question.
 * `servedFrom` (seconds on now()'s clock, 0 until a phase sets it): the first query sent at or after it that
 * is answered sets `servingAgainS`, the seconds from servedFrom to that answer.
 */
function faultLoad(base: string, tag: string) {
  const load = {
    acked: [] as string[], unacked: 0, usage: { prompt: 0, cached: 0, asks: 0, failed: 0 } as Usage,
    servedFrom: 0, servingAgainS: undefined as number | undefined, stopped: false,
  };
  let n = 0;
  const done = Promise.all(Array.from({ length: CLIENTS }, async () => {
    while (!load.stopped && Date.now() < DEADLINE) {
      const i = n++;
      if (i % 3 === 0) {
        const name = codename(tag, i);
        const r = await call(base, 'PUT', `/documents/${name}`, { text: documentText(name, i), title: name });
        if (r && (r.status === 200 || r.status === 201)) load.acked.push(name); else load.unacked++;
      } else {
        const t = now();
        const from = load.servedFrom;
        if ((await ask(base, codename('p', i % GROUPS), load.usage)) && from > 0 && t >= from && load.servingAgainS === undefined) {
          load.servingAgainS = now() - from;
        }
      }
    }
  }));
  return Object.assign(load, { done, stop: async () => { load.stopped = true; await done; } });
}

/** How many acknowledged documents the cluster no longer has. */
async function lostOf(base: string, acked: readonly string[]): Promise<number> {
  let missing = 0;
  for (const id of acked) if ((await call(base, 'GET', `/documents/${id}`))?.status !== 200) missing++;
  return missing;
}

/** Groups' chains (ingest, then its asks) spread over the clients. */
async function cachePhase(base: string, tag: string): Promise<Usage & { hit_rate: number; seconds: number }> {
  const usage: Usage = { prompt: 0, cached: 0, asks: 0, failed: 0 };
  const chains = Array.from({ length: GROUPS }, (_, g) => g);
  const t0 = now();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    for (let k = c; k < chains.length; k += CLIENTS) {
      const name = codename(tag, chains[k]!);
      const put = await call(base, 'PUT', `/documents/${name}`, { text: documentText(name, chains[k]!), title: name });
      if (!put || put.status >= 300) { usage.failed++; continue; }
      for (let a = 0; a < ASKS && Date.now() < DEADLINE; a++) await ask(base, name, usage);
    }
  }));
  return { ...usage, hit_rate: usage.prompt ? usage.cached / usage.prompt : 0, seconds: now() - t0 };
}

// ------------------------------------------------------------------------------------------- router stats
async function serverStates(statsPort: number): Promise<Map<string, { status: string; sent: number }>> {
  const csv = await (await fetch(`http://127.0.0.1:${statsPort}/stats;csv`, { signal: AbortSignal.timeout(5000) })).text();
  const m = new Map<string, { status: string; sent: number }>();
  for (const line of csv.split('\n')) {
    const f = line.split(',');
    if (f[0] === 'replicas' && f[1] !== 'BACKEND' && f[1] !== 'FRONTEND') m.set(f[1]!, { status: f[17] ?? '', sent: Number(f[7]) });
  }
  return m;
}

// -------------------------------------------------------------------------------------------------- run
const result: Record<string, unknown> = {
  bench: 'cluster', replicas: REPLICAS, router: 'haproxy', models: DEFAULT_MODELS ? 'default' : 'test',
  groups: GROUPS, asks_per_group: ASKS, clients: CLIENTS, new_tokens: NEW_TOKENS,
};
let failure: string | undefined;
try {
  const haproxy = (await run('haproxy', ['-v'])).stdout.split('\n')[0];
  result['haproxy'] = haproxy;
  log(`starting PostgreSQL + ${REPLICAS} replicas + HAProxy in ${dir}`);
  let t = now();
  const base = (await cluster('start', '--replicas', String(REPLICAS), '--policy', 'roundrobin')).stdout.trim().split('\n').pop()!;
  result['cluster_start_s'] = +(now() - t).toFixed(1);
  const statsPort = Number(readFileSync(path.join(dir, 'stats_port'), 'utf8'));
  log(`router ${base} (round robin), ready in ${result['cluster_start_s']} s`);

  if (PHASES.has('cache')) {
    const rr = await cachePhase(base, 'r');
    log(`round robin: hit rate ${rr.hit_rate.toFixed(3)} (${rr.cached}/${rr.prompt} prompt tokens, ${rr.asks} asks, ${rr.failed} failed)`);
    await cluster('router', '--policy', 'prefix');
    // The new router's first health checks: every replica UP before the load.
    while (Date.now() < DEADLINE && [...(await serverStates(statsPort)).values()].some((s) => s.status !== 'UP')) await sleep(200);
    const px = await cachePhase(base, 'p');
    log(`prefix hash: hit rate ${px.hit_rate.toFixed(3)} (${px.cached}/${px.prompt} prompt tokens, ${px.asks} asks, ${px.failed} failed)`);
    result['prefix_cache'] = {
      round_robin: { hit_rate: +rr.hit_rate.toFixed(4), cached_prompt_tokens: rr.cached, prompt_tokens: rr.prompt, asks: rr.asks, failed: rr.failed },
      prefix_hash: { hit_rate: +px.hit_rate.toFixed(4), cached_prompt_tokens: px.cached, prompt_tokens: px.prompt, asks: px.asks, failed: px.failed },
    };

  }

  // ------------------------------------------------------------------------------ kill -9 under load
  if (PHASES.has('kill')) {
    const before = { ...outcomes };
    const victim = `r${VICTIM}`;
    const victimPid = Number(readFileSync(path.join(dir, `replica-${VICTIM}`, 'pid'), 'utf8'));
    const loadEnd = Date.now() + KILL_LOAD_S * 1000;
    const events: Record<string, number> = {};
    let killedAt = 0;
    const load = faultLoad(base, 'k');
    const { acked, usage } = load;
    const watch = (async () => {
      await sleep((KILL_LOAD_S * 1000) / 3);
      process.kill(victimPid, 'SIGKILL');
      killedAt = now();
      log(`kill -9 replica ${VICTIM} (pid ${victimPid})`);
      let sentAtDown = -1;
      while (Date.now() < DEADLINE) {
        const s = (await serverStates(statsPort)).get(victim);
        if (s && s.status.startsWith('DOWN')) { events['marked_down_s'] = now() - killedAt; sentAtDown = s.sent; break; }
        await sleep(200);
      }
      log(`router marked replica ${VICTIM} DOWN after ${events['marked_down_s']?.toFixed(1)} s`);
      await sleep(Math.max(0, loadEnd - (KILL_LOAD_S * 1000) / 3 - Date.now()));
      const restartAt = now();
      const restarted = cluster('replica', String(VICTIM)).then(() => (events['restart_ready_s'] = now() - restartAt));
      while (Date.now() < DEADLINE) {
        const s = (await serverStates(statsPort)).get(victim);
        if (s?.status === 'UP' && events['marked_up_s'] === undefined) events['marked_up_s'] = now() - restartAt;
        if (s?.status === 'UP' && s.sent > sentAtDown) { events['serving_again_s'] = now() - restartAt; break; }
        await sleep(200);
      }
      await restarted;
      log(`replica ${VICTIM} ready ${events['restart_ready_s']?.toFixed(1)} s after restart, UP ${events['marked_up_s']?.toFixed(1)} s, serving ${events['serving_again_s']?.toFixed(1)} s`);
    })();
    // The load runs at least until the replica serves again (or the deadline), so its return is under load.
    await watch;
    await load.stop();
    const during = Object.fromEntries((Object.keys(outcomes) as Outcome[]).map((k) => [k, outcomes[k] - before[k]]));
    const unacked = load.unacked;
    const missing = await lostOf(base, acked);
    const round = (x: number | undefined) => (x === undefined ? null : +x.toFixed(2));
    result['failure'] = {
      load_s: KILL_LOAD_S, acknowledged_ingests: acked.length, unacknowledged_ingests: unacked, lost_acknowledged: missing,
      asks: usage.asks, failed_asks: usage.failed, replies: during,
      marked_down_s: round(events['marked_down_s']), restart_ready_s: round(events['restart_ready_s']),
      marked_up_after_restart_s: round(events['marked_up_s']), serving_again_after_restart_s: round(events['serving_again_s']),
    };
    result['replies_other'] = others.slice(0, 10);
    log(`acknowledged ingests ${acked.length}, lost ${missing}; replies during the failure ${JSON.stringify(during)}`);
  }

  // ------------------------------------------------------------------------------ the database stopped under load
  if (PHASES.has('outage') && existsSync(path.join(dir, 'pg', 'port'))) {
    const pg = (cmd: string) => run('bash', ['scripts/postgres.sh', cmd, path.join(dir, 'pg')], { cwd: ROOT });
    window = 'before';
    const load = faultLoad(base, 'o');
    const { acked, usage } = load;
    await sleep(PG_OUTAGE_S * 1000);
    await pg('crash');
    window = 'outage';
    log(`PostgreSQL stopped (immediate) for ${PG_OUTAGE_S} s under load`);
    await sleep(PG_OUTAGE_S * 1000);
    await pg('restart');
    load.servedFrom = now();
    window = 'after';
    log('PostgreSQL started again');
    await sleep(PG_OUTAGE_S * 1000);
    await load.stop();
    window = undefined;
    const missing = await lostOf(base, acked);
    const servingAgainS = load.servingAgainS;
    result['database_outage'] = {
      outage_s: PG_OUTAGE_S, acknowledged_ingests: acked.length, unacknowledged_ingests: load.unacked, lost_acknowledged: missing,
      asks: usage.asks, failed_asks: usage.failed, replies: byWindow,
      slowest_reply_s: Object.fromEntries(Object.entries(slowest).map(([k, v]) => [k, +v.toFixed(2)])),
      serving_again_after_return_s: servingAgainS === undefined ? null : +servingAgainS.toFixed(2),
    };
    log(`database outage: replies ${JSON.stringify(byWindow)}; acknowledged ingests ${acked.length}, lost ${missing}; ` +
      `serving again ${servingAgainS?.toFixed(1)} s after its return`);
  }

  // ------------------------------------------------------------------------------ the router restarted under load
  if (PHASES.has('router')) {
    byWindow = {};
    slowest = {};
    const events: Record<string, number> = {};
    const cfg = path.join(dir, 'haproxy.cfg');
    const pidOf = () => Number(readFileSync(path.join(dir, 'haproxy.pid'), 'utf8').trim().split('\n').pop());
    // Until the process has exited: a zombie (a daemon reparented to a reaper that has not reaped it yet)
    // answers kill(pid, 0) but is gone, as scripts/cluster.sh's alive() reads it.
    const gone = async (pid: number) => {
      for (let i = 0; i < 100; i++) {
        try { process.kill(pid, 0); } catch { return; }
        try { if (readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('Z')) return; } catch { return; }
        await sleep(100);
      }
    };
    window = 'before';
    const load = faultLoad(base, 'h');
    const { acked, usage } = load;
    await sleep(ROUTER_S * 1000);
    // Graceful reload: a new process on the same listener, the old one (-sf) finishes its requests and exits.
    const old = pidOf();
    window = 'reload';
    let t = now();
    await run('haproxy', ['-D', '-f', cfg, '-sf', String(old)]);
    await gone(old);
    events['reload_old_exited_s'] = now() - t;
    log(`HAProxy reloaded (haproxy -sf ${old}); the old process exited after ${events['reload_old_exited_s'].toFixed(1)} s`);
    await sleep(ROUTER_S * 1000);
    // Hard stop, down for ROUTER_DOWN_S, started again (its replies, the requests it cut included: 'down').
    const pid = pidOf();
    window = 'down';
    process.kill(pid, 'SIGTERM');
    await gone(pid);
    log(`HAProxy stopped (SIGTERM, pid ${pid}) for ${ROUTER_DOWN_S} s under load`);
    await sleep(ROUTER_DOWN_S * 1000);
    t = now();
    await run('haproxy', ['-D', '-f', cfg]);
    load.servedFrom = t;
    window = 'after';
    log('HAProxy started again');
    while (Date.now() < DEADLINE && events['all_up_s'] === undefined) {
      const states = await serverStates(statsPort).catch(() => new Map<string, { status: string; sent: number }>());
      if (states.size === REPLICAS && [...states.values()].every((s) => s.status === 'UP')) events['all_up_s'] = now() - t;
      else await sleep(100);
    }
    await sleep(ROUTER_S * 1000);
    await load.stop();
    window = undefined;
    if (load.servingAgainS !== undefined) events['serving_again_s'] = load.servingAgainS;
    const missing = await lostOf(base, acked);
    const round = (x: number | undefined) => (x === undefined ? null : +x.toFixed(2));
    result['router_restart'] = {
      window_s: ROUTER_S, down_s: ROUTER_DOWN_S, acknowledged_ingests: acked.length, unacknowledged_ingests: load.unacked, lost_acknowledged: missing,
      asks: usage.asks, failed_asks: usage.failed, replies: byWindow,
      slowest_reply_s: Object.fromEntries(Object.entries(slowest).map(([k, v]) => [k, +v.toFixed(2)])),
      reload_old_exited_s: round(events['reload_old_exited_s']),
      all_replicas_up_after_start_s: round(events['all_up_s']), serving_again_after_start_s: round(events['serving_again_s']),
    };
    log(`router restart: replies ${JSON.stringify(byWindow)}; acknowledged ingests ${acked.length}, lost ${missing}; ` +
      `every replica UP ${events['all_up_s']?.toFixed(1)} s and a query answered ${events['serving_again_s']?.toFixed(1)} s after the start`);
  }
} catch (e) {
  failure = (e as Error).message;
  log(`failed: ${failure}`);
} finally {
  // The replicas' logs outlive the cluster: where a reply was not what it should be, they say why.
  const logs = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-cluster-logs-'));
  for (let i = 1; i <= REPLICAS; i++) {
    try { copyFileSync(path.join(dir, `replica-${i}`, 'log'), path.join(logs, `replica-${i}.log`)); } catch { /* never started */ }
  }
  result['logs'] = logs;
  await cluster('stop').catch((e: Error) => log(`stop: ${e.message}`));
}
result['loadavg_1m'] = +(readFileSync('/proc/loadavg', 'utf8').split(' ')[0] ?? 0);
if (failure) result['error'] = failure;
console.log(JSON.stringify(result));
if (failure) process.exitCode = 1;
