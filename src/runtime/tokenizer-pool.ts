/**
 * Tokenization on worker threads, for encoders whose model runs on the GPU (the CUDA encoder): there the
 * tokenizer, pure JavaScript on the main thread, was what bounded ingest (2864 chunks of the sample
 * corpus took 0.85-0.96 s to encode on one core, where the model's runs take tens of milliseconds on an
 * H200), and the CPU's cores are free. A call's inputs are cut into one contiguous slice per thread;
 * the answers come back in order. The threads hold each a copy of the tokenizer: they are started when
 * the encoder loads, so that its load measures them. On the CPU path the cores run the model: no pool.
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { PairEncoding } from './tokenizer.js';
import type { PoolReply, PoolWork } from './tokenizer-worker.js';

interface Pending {
  resolve(r: { flat: Int32Array; types?: Int32Array; offsets: Int32Array }): void;
  reject(e: Error): void;
}

/** Threads for RAGGUARD_TOKENIZER_THREADS=auto: the cores but two (the event loop, the runs' thread), at most 8. */
export function autoTokenizerThreads(): number {
  return Math.max(0, Math.min(8, availableParallelism() - 2));
}

/** Under tsx the sources are .ts; built, .js. */
const TYPESCRIPT = import.meta.url.endsWith('.ts');
const WORKER = new URL(`./tokenizer-worker${TYPESCRIPT ? '.ts' : '.js'}`, import.meta.url);

/**
 * A thread running the worker module. Under tsx a worker's entry is not transformed (its loader is not
 * registered there, whatever execArgv says): a small script registers it first, then imports the module.
 */
function startThread(dir: string): Worker {
  if (!TYPESCRIPT) return new Worker(WORKER, { workerData: { dir } });
  const boot = "const { workerData } = require('node:worker_threads');\n" +
    'import(workerData.tsx).then((api) => { api.register(); return import(workerData.entry); });';
  return new Worker(boot, { eval: true, workerData: { dir, entry: WORKER.href, tsx: import.meta.resolve('tsx/esm/api') } });
}

class PoolThread {
  private readonly pending = new Map<number, Pending>();
  private next = 0;
  private dead: Error | undefined;

  constructor(readonly worker: Worker) {
    worker.on('message', (m: PoolReply) => {
      if (!('id' in m)) return;
      const p = this.pending.get(m.id);
      this.pending.delete(m.id);
      if ('error' in m) p?.reject(new Error(`tokenizer thread: ${m.error}`));
      else p?.resolve(m);
    });
    const fail = (e: Error) => {
      this.dead = e;
      for (const p of this.pending.values()) p.reject(e);
      this.pending.clear();
    };
    worker.on('error', fail);
    worker.on('exit', (code) => fail(new Error(`tokenizer thread exited (${code})`)));
  }

  ask(req: PoolWork): Promise<{ flat: Int32Array; types?: Int32Array; offsets: Int32Array }> {
    if (this.dead) return Promise.reject(this.dead);
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, ...req });
    });
  }
}

const rows = (flat: Int32Array, offsets: Int32Array) => Array.from({ length: offsets.length - 1 }, (_, i) => Array.from(flat.subarray(offsets[i]!, offsets[i + 1]!)));

export class TokenizerPool {
  private closed = false;

  private constructor(private readonly threads: PoolThread[]) {}

  /** `size` threads, each with the tokenizer of `dir` loaded (resolves once all are ready). */
  static async start(dir: string, size: number): Promise<TokenizerPool> {
    const workers = Array.from({ length: size }, () => startThread(dir));
    try {
      await Promise.all(workers.map((w) => new Promise<void>((resolve, reject) => {
        const onMessage = (m: PoolReply) => {
          if ('ready' in m) resolve();
          else if ('failed' in m) reject(new Error(`tokenizer thread: ${m.failed}`));
          else return;
          w.off('message', onMessage);
        };
        w.on('message', onMessage);
        w.once('error', reject);
      })));
    } catch (e) {
      await Promise.all(workers.map((w) => w.terminate()));
      throw e;
    }
    // A pool never keeps the process alive.
    for (const w of workers) w.unref();
    return new TokenizerPool(workers.map((w) => new PoolThread(w)));
  }

  get size(): number {
    return this.threads.length;
  }

  /** Token ids of each text, special tokens added (TextTokenizer.encode(text, true)), in order. */
  async encode(texts: readonly string[]): Promise<number[][]> {
    const parts = await this.spread(texts, (slice) => ({ texts: slice }));
    return parts.flatMap((p) => rows(p.flat, p.offsets));
  }

  /** Each pair through the post-processor's pair template with token types (TextTokenizer.encodePair), in order. */
  async encodePairs(pairs: readonly (readonly [string, string])[]): Promise<PairEncoding[]> {
    const parts = await this.spread(pairs, (slice) => ({ pairs: slice.map(([a, b]) => [a, b] as [string, string]) }));
    return parts.flatMap((p) => {
      const ids = rows(p.flat, p.offsets), types = rows(p.types!, p.offsets);
      return ids.map((r, i) => ({ ids: r, typeIds: types[i]! }));
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all(this.threads.map((t) => t.worker.terminate()));
  }

  private spread<T>(items: readonly T[], request: (slice: T[]) => PoolWork) {
    if (this.closed) return Promise.reject(new Error('the tokenizer pool is closed'));
    const n = Math.min(this.threads.length, items.length);
    const per = Math.ceil(items.length / Math.max(1, n));
    return Promise.all(Array.from({ length: n }, (_, k) => this.threads[k]!.ask(request(items.slice(k * per, (k + 1) * per)))));
  }
}
