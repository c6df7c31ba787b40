/**
 * KV-cache memory benchmark (bookkeeping only, no model): how much of a fixed KV pool holds real
 * tokens, and how many sequences run at once, with the paged block manager versus reserving
 * max_model_len slots per sequence up front, on the same workload in one run.
 *
 * Workload: REQUESTS requests, prompt and output lengths lognormal (long-tailed; seeded), clipped to
 * [1, max_model_len] with prompt + output <= max_model_len, all queued at t=0 and served FCFS.
 * Each step every running sequence decodes one token (a KV slot for the token it feeds); a sequence
 * that cannot get a slot preempts the most recently admitted one (freed, recomputed later, as
 * the scheduler does); then, if nothing was preempted, waiting requests are admitted while
 * canAllocate says 'ok'. Prefill samples a request's first output token; it finishes (and frees) at
 * its output length.
 *
 * utilization = sum over steps of used slots / sum over steps of allocated (or reserved) slots, i.e.
 * the time-averaged fraction of held KV memory that holds a token.
 *
 * Prints a table, then one JSON object as the last line of stdout.
 */
import { BlockManager } from '../src/generate/block-manager.js';
import { seededRandom } from '../src/generate/sampler.js';

const MAX_MODEL_LEN = 4096;
const BLOCK_SIZE = 16;
const POOL_SLOTS = 16384;
const MAX_NUM_SEQS = 256;
const WATERMARK = 0.01;
const REQUESTS = Number(process.env['BENCH_KV_REQUESTS'] ?? 1000);
const SEED = 1234;
const VOCAB = 32000;
/** Lognormal medians and shape (sigma of the log): most requests short, a few near max_model_len. */
const PROMPT_MEDIAN = 512;
const PROMPT_SIGMA = 0.9;
const OUTPUT_MEDIAN = 150;
const OUTPUT_SIGMA = 1.1;

interface Request {
  id: number;
  promptIds: number[];
  outputLen: number;
}

const random = seededRandom(SEED);
function normal(): number {
  // Box-Muller; 1 - u keeps the log away from 0.
  return Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
}
const clip = (x: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, Math.round(x)));

const requests: Request[] = Array.from({ length: REQUESTS }, (_, id) => {
  const promptLen = clip(PROMPT_MEDIAN * Math.exp(PROMPT_SIGMA * normal()), 1, MAX_MODEL_LEN - 1);
  const outputLen = clip(OUTPUT_MEDIAN * Math.exp(OUTPUT_SIGMA * normal()), 1, MAX_MODEL_LEN - promptLen);
  return { id, promptIds: Array.from({ length: promptLen }, () => Math.floor(random() * VOCAB)), outputLen };
});
// Generated tokens are drawn up front so both runs (and reruns) see the same ids.
const outputs = requests.map((r) => Array.from({ length: r.outputLen }, () => Math.floor(random() * VOCAB)));

/** A request being served; also the sequence the block manager sees (one object per request, as the engine's). */
class Running {
  /** Output tokens sampled so far; all but the last have a KV slot. */
  generated = 0;
  constructor(readonly req: Request) {}
  get id(): number {
    return this.req.id;
  }
  /** Prompt and generated tokens: what a resumed (preempted) request must get back into the cache. */
  get tokenIds(): number[] {
    return [...this.req.promptIds, ...outputs[this.req.id]!.slice(0, this.generated)];
  }
}

function paged() {
  const blocks = new BlockManager({ numBlocks: POOL_SLOTS / BLOCK_SIZE, blockSize: BLOCK_SIZE, watermark: WATERMARK, enablePrefixCaching: true });
  const waiting: Running[] = requests.map((req) => new Running(req));
  const running: Running[] = [];
  let steps = 0, used = 0, allocated = 0, maxConcurrent = 0, preemptions = 0, rejected = 0, cachedTokens = 0, micros = 0, decodeMicros = 0;
  const peakByBucket: Record<number, number> = {};

  const finish = (r: Running) => {
    blocks.free(r.req.id);
    running.splice(running.indexOf(r), 1);
  };

  while (waiting.length > 0 || running.length > 0) {
    const t0 = performance.now();
    // Decode: one slot per running sequence, preempting from the back when the pool is full.
    let preempted = false;
    for (let i = 0; i < running.length; i++) {
      const r = running[i]!;
      while (!blocks.canAppendSlots(r.req.id, 1)) {
        const victim = running.pop()!;
        blocks.free(victim.req.id);
        waiting.unshift(victim);
        preemptions++;
        preempted = true;
        if (victim === r) break;
      }
      if (running[i] !== r) break;
      blocks.appendSlots(r.req.id, [outputs[r.req.id]![r.generated - 1]!]);
      if (++r.generated >= r.req.outputLen) {
        finish(r);
        i--;
      }
    }
    decodeMicros += (performance.now() - t0) * 1000;
    // Admit FCFS while the block manager says 'ok' (and not in a step that had to preempt).
    while (!preempted && waiting.length > 0 && running.length < MAX_NUM_SEQS) {
      const r = waiting[0]!;
      const status = blocks.canAllocate(r);
      if (status === 'never') {
        waiting.shift();
        rejected++;
        continue;
      }
      if (status === 'later') break;
      waiting.shift();
      cachedTokens += blocks.allocate(r);
      running.push(r);
      // Prefill samples the next token; a request of one output token is done at once.
      if (++r.generated >= r.req.outputLen) finish(r);
    }
    micros += (performance.now() - t0) * 1000;
    steps++;
    const s = blocks.stats();
    used += s.usedSlots;
    allocated += s.allocatedSlots;
    maxConcurrent = Math.max(maxConcurrent, running.length);
    for (const [b, n] of Object.entries(s.tablesByBucket)) peakByBucket[Number(b)] = Math.max(peakByBucket[Number(b)] ?? 0, n);
  }
  const end = blocks.stats();
  if (end.usedBlocks !== 0 || end.usedSlots !== 0) throw new Error('blocks leaked');
  return { utilization: used / allocated, maxConcurrent, steps, preemptions, rejected, cachedTokens, usPerStep: micros / steps, decodeUsPerStep: decodeMicros / steps, peakByBucket };
}

/** Every sequence reserves max_model_len slots at admission: the contiguous-cache way. */
function preallocated() {
  const maxConcurrent = Math.floor(POOL_SLOTS / MAX_MODEL_LEN);
  const waiting: Running[] = requests.map((req) => new Running(req));
  let running: Running[] = [];
  let steps = 0, used = 0, reserved = 0;
  while (waiting.length > 0 || running.length > 0) {
    for (const r of running) r.generated++;
    running = running.filter((r) => r.generated < r.req.outputLen);
    while (waiting.length > 0 && running.length < maxConcurrent) {
      const r = waiting.shift()!;
      if (++r.generated < r.req.outputLen) running.push(r);
    }
    steps++;
    // the same count as the paged run's usedSlots: prompt + every sampled token but the last
    used += running.reduce((s, r) => s + r.req.promptIds.length + r.generated - 1, 0);
    reserved += running.length * MAX_MODEL_LEN;
  }
  return { utilization: reserved === 0 ? 1 : used / reserved, maxConcurrent, steps };
}

const p = paged();
const b = preallocated();
const promptLens = requests.map((r) => r.promptIds.length).sort((x, y) => x - y);
const outLens = requests.map((r) => r.outputLen).sort((x, y) => x - y);
const pct = (a: number[], q: number) => a[Math.min(a.length - 1, Math.floor(q * a.length))]!;
const round = (x: number, d = 4) => Number(x.toFixed(d));

console.log(`${REQUESTS} requests, max_model_len ${MAX_MODEL_LEN}, pool ${POOL_SLOTS} slots (${POOL_SLOTS / BLOCK_SIZE} blocks of ${BLOCK_SIZE})`);
console.log(`prompt tokens p50/p90/p99/max ${pct(promptLens, 0.5)}/${pct(promptLens, 0.9)}/${pct(promptLens, 0.99)}/${promptLens.at(-1)}; ` +
  `output tokens ${pct(outLens, 0.5)}/${pct(outLens, 0.9)}/${pct(outLens, 0.99)}/${outLens.at(-1)}`);
console.log('');
console.log('| KV allocation | utilization | max concurrent | steps | preemptions |');
console.log('| --- | --- | --- | --- | --- |');
console.log(`| paged blocks of ${BLOCK_SIZE} | ${p.utilization.toFixed(4)} | ${p.maxConcurrent} | ${p.steps} | ${p.preemptions} |`);
console.log(`| preallocate ${MAX_MODEL_LEN} (baseline) | ${b.utilization.toFixed(4)} | ${b.maxConcurrent} | ${b.steps} | 0 |`);
console.log('');
console.log(`block manager: ${p.usPerStep.toFixed(1)} us per step (${p.decodeUsPerStep.toFixed(1)} of them appending slots); block tables per bucket (peak): ${JSON.stringify(p.peakByBucket)}`);
console.log(JSON.stringify({
  utilization: round(p.utilization),
  max_concurrent: p.maxConcurrent,
  baseline_utilization: round(b.utilization),
  baseline_max_concurrent: b.maxConcurrent,
  steps: p.steps,
  baseline_steps: b.steps,
  preemptions: p.preemptions,
  rejected: p.rejected,
  prefix_cached_tokens: p.cachedTokens,
  block_manager_us_per_step: round(p.usPerStep, 2),
  decode_us_per_step: round(p.decodeUsPerStep, 2),
  block_table_buckets: p.peakByBucket,
  block_size: BLOCK_SIZE,
  pool_slots: POOL_SLOTS,
  max_model_len: MAX_MODEL_LEN,
  requests: REQUESTS,
  max_num_seqs: MAX_NUM_SEQS,
  watermark: WATERMARK,
  seed: SEED,
  where: 'cpu',
}));
