/**
 * The generation engine: continuous batching on the paged KV cache.
 *
 * A loop of steps. Between steps sits the one step barrier (the "stream sync"): it awaits every
 * in-flight model run, releases the runs' output buffers, and only then lets the scheduler change the
 * batch (admit, finish, preempt). Within a step the batch shape is fixed: newly admitted sequences are
 * prefilled (each alone: their lengths differ), then all running sequences decode one token together,
 * their contexts gathered from the block pool into right-aligned, masked past tensors.
 */
import * as ort from 'onnxruntime-node';
import type { DecoderModel } from './decoder-model.js';
import type { FinishReason, Generation } from './generator.js';
import { metered } from '../runtime/run-meter.js';
import { KvCachePool, type GatherRow } from './kv-pool.js';
import { sampleToken } from './sampler.js';
import { Scheduler, type KvBlockSpace, type SchedulerLimits } from './scheduler.js';
import { Sequence, type SamplingParams } from './sequence.js';

export interface BlockTableView {
  /** Physical block ids in logical order. */
  ids(): ArrayLike<number>;
}

/** The block manager as the engine needs it: the scheduler's interface plus each sequence's table. */
export interface EngineBlockManager extends KvBlockSpace {
  blockTable(seqId: number): BlockTableView;
}

export interface EngineOptions extends SchedulerLimits {
  numBlocks: number;
  blockSize: number;
}

export class PromptNeverFitsError extends Error {}

interface Pending {
  resolve(g: Generation): void;
  reject(e: Error): void;
}

export interface EngineStats {
  steps: number;
  prefills: number;
  decodeRows: number;
  preemptions: number;
  /** Decode steps whose past was last step's present (no gather from the pool). */
  pastReused: number;
  /** Wall time spent in scheduling and block bookkeeping (not the model), microseconds. */
  schedulerMicros: number;
}

export class Engine {
  readonly pool: KvCachePool;
  readonly scheduler: Scheduler;
  readonly stats: EngineStats = { steps: 0, prefills: 0, decodeRows: 0, preemptions: 0, pastReused: 0, schedulerMicros: 0 };
  private readonly pending = new Map<Sequence, Pending>();
  private nextId = 0;
  private loop: Promise<void> | undefined;
  /** Model runs of the current step; the barrier awaits them all. */
  private readonly inflight = new Set<Promise<unknown>>();
  /** Output tensors of the current step, released at the barrier. */
  private readonly outputs: ort.Tensor[] = [];
  /** Last decode step's batch and its present KV, reused as the next step's past while the batch holds. */
  private carry: { seqs: Sequence[]; lengths: number[]; width: number; present: ort.Tensor[] } | undefined;

  constructor(
    readonly model: DecoderModel,
    readonly blocks: EngineBlockManager,
    opts: EngineOptions,
  ) {
    this.pool = new KvCachePool(model.shape, opts.numBlocks, opts.blockSize);
    this.scheduler = new Scheduler(blocks, opts);
  }

  generate(promptIds: readonly number[], params: SamplingParams): Promise<Generation> {
    const seq = new Sequence(this.nextId++, promptIds, params, performance.now());
    const done = new Promise<Generation>((resolve, reject) => this.pending.set(seq, { resolve, reject }));
    this.scheduler.add(seq);
    this.loop ??= this.run().finally(() => (this.loop = undefined));
    return done;
  }

  private async run(): Promise<void> {
    while (this.scheduler.hasWork) {
      await this.streamSync();
      const t0 = performance.now();
      const plan = this.scheduler.schedule();
      for (const c of plan.copies) this.pool.copyBlock(c.src, c.dst);
      this.stats.schedulerMicros += (performance.now() - t0) * 1000;
      this.stats.steps++;
      this.stats.preemptions += plan.preempted.length;
      for (const seq of plan.rejected) {
        this.settle(seq, new PromptNeverFitsError(`a prompt of ${seq.length} tokens needs more KV blocks than the pool has`));
      }
      try {
        for (const seq of plan.prefills) await this.track(metered('prefill', () => this.prefill(seq)));
        if (plan.decodes.length > 0) await this.track(metered('decode', () => this.decode(plan.decodes)));
      } catch (e) {
        // A failed run leaves the step's sequences without KV for their tokens: fail them, keep serving.
        for (const seq of [...plan.prefills, ...plan.decodes]) if (seq.status === 'running') this.settle(seq, e as Error);
      }
    }
    await this.streamSync();
    if (this.carry) for (const t of this.carry.present) t.dispose();
    this.carry = undefined;
  }

  /** The step barrier: every in-flight run has completed and its buffers are released. */
  private async streamSync(): Promise<void> {
    await Promise.allSettled([...this.inflight]);
    for (const t of this.outputs.splice(0)) t.dispose();
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inflight.add(p);
    return p.finally(() => this.inflight.delete(p));
  }

  private async prefill(seq: Sequence): Promise<void> {
    const tokens = seq.pending;
    const past = seq.numComputed;
    seq.cachedPrefix ??= past;
    const rows: GatherRow[] = [{ blocks: this.blocks.blockTable(seq.id).ids(), length: past }];
    const { logits, present } = await this.forward(rows, past, [tokens], [past]);
    this.outputs.push(...present);
    this.stats.prefills++;
    this.advance(seq, tokens.length, logits, 0);
  }

  private async decode(seqs: Sequence[]): Promise<void> {
    const width = Math.max(...seqs.map((s) => s.numComputed));
    const rows = seqs.map((s) => ({ blocks: this.blocks.blockTable(s.id).ids(), length: s.numComputed }));
    // The same batch as last step's decode: its present KV already is this step's past, right-aligned,
    // so the gather from the pool is skipped. Any change of the batch (a sequence joined, finished or
    // was preempted) falls back to gathering.
    const carry = this.carry;
    this.carry = undefined;
    const reuse = carry !== undefined && carry.width === width && carry.seqs.length === seqs.length &&
      carry.seqs.every((q, i) => q === seqs[i] && carry.lengths[i] === q.numComputed);
    // The old carry is released at the step barrier, after this run has used it (or failed).
    if (carry) this.outputs.push(...carry.present);
    if (reuse) this.stats.pastReused++;
    const { logits, present } = await this.forward(rows, width, seqs.map((s) => [s.lastToken]), seqs.map((s) => s.numComputed),
      reuse ? carry.present : undefined);
    this.stats.decodeRows += seqs.length;
    seqs.forEach((s, r) => this.advance(s, 1, logits, r));
    this.carry = { seqs, lengths: seqs.map((q) => q.numComputed), width: width + 1, present };
  }

  /**
   * One model run over `tokens[r]` new tokens per row (equal counts) on top of each row's cached
   * context, right-aligned to `width` (gathered from the pool unless `past` is given); stores the new
   * KV into the rows' slots; returns the last logits and the present KV tensors (the caller releases them).
   */
  private async forward(rows: GatherRow[], width: number, tokens: number[][], starts: number[],
    given?: ort.Tensor[]): Promise<{ logits: Float32Array; present: ort.Tensor[] }> {
    const { numKvHeads: H, headDim: D } = this.model.shape;
    const B = rows.length;
    const s = tokens[0]!.length;
    const past = given ?? this.pool.gather(rows, width).map((data) => new ort.Tensor('float32', data, [B, H, width, D]));
    const mask = new BigInt64Array(B * (width + s));
    rows.forEach((row, r) => mask.fill(1n, r * (width + s) + width - row.length, (r + 1) * (width + s)));
    const out = await this.model.forward({
      batch: B,
      seq: s,
      inputIds: BigInt64Array.from(tokens.flat(), BigInt),
      positionIds: BigInt64Array.from(rows.flatMap((_, r) => tokens[r]!.map((_t, k) => BigInt(starts[r]! + k)))),
      attentionMask: mask,
      pastLen: width,
      past,
    });
    const present = out.present.map((t) => t.data as Float32Array);
    rows.forEach((row, r) => this.pool.scatter(present, B, width + s, r, width, row.blocks, starts[r]!, s));
    return { logits: out.lastLogits, present: out.present };
  }

  /** After a run: the fed tokens are computed; sample the next token; finish when done. */
  private advance(seq: Sequence, fed: number, logits: Float32Array, row: number): void {
    // A resumed (preempted) sequence has just recomputed every token it had; it samples on from there.
    seq.numComputed += fed;
    const V = this.model.shape.vocabSize;
    const next = sampleToken(logits.subarray(row * V, (row + 1) * V), seq.params.temperature, seq.random);
    let reason: FinishReason | undefined;
    if (this.model.eosIds.has(next) && !seq.params.ignoreEos) reason = 'stop';
    else {
      seq.outputIds.push(next);
      if (seq.outputIds.length >= seq.params.maxNewTokens || seq.length >= this.model.shape.maxPositions) reason = 'length';
    }
    if (reason) {
      seq.finishReason = reason;
      this.settle(seq);
    }
  }

  private settle(seq: Sequence, error?: Error): void {
    // A failed run may have left the sequence's blocks without their KV: they must not serve prefix hits.
    this.scheduler.finish(seq, { failed: error !== undefined });
    const p = this.pending.get(seq);
    this.pending.delete(seq);
    if (!p) return;
    if (error) p.reject(error);
    else {
      p.resolve({
        ids: seq.outputIds, text: this.model.tokenizer.decode(seq.outputIds).trim(), finishReason: seq.finishReason ?? 'length',
        cachedTokens: seq.cachedPrefix ?? 0,
      });
    }
  }
}
