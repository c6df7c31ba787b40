/**
 * The generation engine: continuous batching on the paged KV cache.
 *
 * A loop of steps. Between steps sits the one step barrier (the "stream sync"): it awaits every
 * in-flight model run, releases the runs' output buffers, and only then lets the scheduler change the
 * batch (admit, finish, preempt). Within a step the batch shape is fixed: all running sequences decode
 * one token together, their contexts gathered from the block pool into the past tensors as the
 * decoder's layout places them (right-aligned and masked, or left-aligned in a buffer with room to
 * grow: decoder-model.ts); then newly admitted sequences are prefilled (each alone: their lengths
 * differ). Decoding first means a prefix hit on a block completed by this step's decode finds its KV
 * written.
 *
 * While the batch holds, a decode step takes the last step's present KV as its past (no gather). Where
 * the provider keeps present KV on the device (WebGPU), the pool is then written back lazily: the new
 * tokens' KV stays on the device until blocks are about to change hands (a sequence finishes, the
 * scheduler may admit or preempt, a prefill follows) and is downloaded and scattered only then. Per
 * steady decode step the host sends token ids, positions and the mask, and receives the logits.
 */
import * as ort from 'onnxruntime-node';
import { metered } from '../runtime/run-meter.js';
import { presentData, type DecoderModel, type KvTensor } from './decoder-model.js';
import type { FinishReason, Generation } from './generator.js';
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
  /**
   * When new tokens' KV reaches the pool: 'eager' after every run, 'lazy' only when blocks are about to
   * change hands. Default: lazy where the model keeps present KV on the device (a write-back is a
   * download), eager where it is host memory anyway. Tests run 'lazy' on the CPU.
   */
  kvWriteBack?: 'eager' | 'lazy';
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
  /** Lazy write-backs of the carried batch's new KV into the pool (0 when every run stores its own). */
  writeBacks: number;
  /** Wall time spent in scheduling and block bookkeeping (not the model), microseconds. */
  schedulerMicros: number;
  /** Sequences dropped because their requests were abandoned. */
  cancelled: number;
}

/**
 * The last run's batch and its present KV (`width` positions, placed as the decoder's layout places rows), the next step's past
 * while the batch holds. `synced[r]`: leading tokens of row r's sequence already in the pool.
 */
interface Carry {
  seqs: Sequence[];
  lengths: number[];
  width: number;
  present: KvTensor[];
  synced: number[];
}

export class Engine {
  readonly pool: KvCachePool;
  readonly scheduler: Scheduler;
  readonly stats: EngineStats = { steps: 0, prefills: 0, decodeRows: 0, preemptions: 0, pastReused: 0, writeBacks: 0, schedulerMicros: 0, cancelled: 0 };
  private readonly pending = new Map<Sequence, Pending>();
  private nextId = 0;
  private loop: Promise<void> | undefined;
  /** Model runs of the current step; the barrier awaits them all. */
  private readonly inflight = new Set<Promise<unknown>>();
  /** Tensors the current step is done with, released at the barrier (unless the carry holds them). */
  private readonly outputs: KvTensor[] = [];
  private carry: Carry | undefined;
  private readonly lazy: boolean;
  /** Sequences whose requests were abandoned (their signal aborted): dropped at the next step barrier. */
  private readonly cancelled = new Set<Sequence>();
  private readonly reasons = new WeakMap<Sequence, Error>();

  constructor(
    readonly model: DecoderModel,
    readonly blocks: EngineBlockManager,
    opts: EngineOptions,
  ) {
    this.lazy = (opts.kvWriteBack ?? (model.presentOnDevice ? 'lazy' : 'eager')) === 'lazy';
    this.pool = new KvCachePool(model.shape, opts.numBlocks, opts.blockSize);
    this.scheduler = new Scheduler(blocks, opts);
  }

  /**
   * Generates for the prompt. An abort of `signal` (the client went away) takes the sequence out at
   * the next step barrier, waiting or running, its blocks freed; the promise rejects with the signal's reason.
   */
  generate(promptIds: readonly number[], params: SamplingParams, signal?: AbortSignal): Promise<Generation> {
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    const seq = new Sequence(this.nextId++, promptIds, params, performance.now());
    const done = new Promise<Generation>((resolve, reject) => this.pending.set(seq, { resolve, reject }));
    this.scheduler.add(seq);
    if (signal) {
      const abandon = () => {
        this.cancelled.add(seq);
        this.reasons.set(seq, signal.reason as Error);
      };
      signal.addEventListener('abort', abandon, { once: true });
      const forget = () => signal.removeEventListener('abort', abandon);
      done.then(forget, forget);
    }
    this.loop ??= this.run().finally(() => (this.loop = undefined));
    return done;
  }

  /**
   * Resolves when the step loop has stopped: every request settled and the last barrier passed (KV
   * buffers released). A request's reply comes a few awaits before that.
   */
  idle(): Promise<void> {
    return this.loop ?? Promise.resolve();
  }

  private async run(): Promise<void> {
    while (this.scheduler.hasWork) {
      await this.streamSync();
      if (this.cancelled.size > 0) await this.dropCancelled();
      // Admission may hit blocks the carried batch filled, preemption frees them: the pool first.
      if (this.scheduler.mayMoveBlocks) {
        try {
          await this.writeBack();
        } catch (e) {
          // The carried sequences' newest KV never reached the pool: they cannot go on.
          const lost = this.carry?.seqs.filter((s) => s.status === 'running') ?? [];
          this.dropCarry();
          for (const seq of lost) this.settle(seq, e as Error);
        }
      }
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
        if (plan.decodes.length > 0) await this.track(metered('decode', () => this.decode(plan.decodes)));
        if (plan.prefills.length > 0) await this.writeBack();
        for (const seq of plan.prefills) await this.track(metered('prefill', () => this.prefill(seq)));
      } catch (e) {
        // A failed run leaves the step's sequences without KV for their tokens: fail them, keep serving.
        this.dropCarry();
        for (const seq of [...plan.prefills, ...plan.decodes]) if (seq.status === 'running') this.settle(seq, e as Error);
      }
    }
    await this.streamSync();
    this.dropCarry();
  }

  /** The step barrier: every in-flight run has completed and its buffers are released. */
  private async streamSync(): Promise<void> {
    await Promise.allSettled([...this.inflight]);
    // A run that writes in place returns its past tensors as its present: the carry may hold them still.
    const kept = new Set<KvTensor>(this.carry?.present ?? []);
    for (const t of this.outputs.splice(0)) if (!kept.has(t)) t.dispose();
  }

  /**
   * At the barrier: abandoned sequences leave the queue or the batch and their blocks go back. The
   * carried batch's newest KV reaches the pool first, as before any change of hands.
   */
  private async dropCancelled(): Promise<void> {
    const seqs = [...this.cancelled].filter((s) => this.pending.has(s));
    this.cancelled.clear();
    if (seqs.length === 0) return;
    try {
      await this.writeBack();
    } catch (e) {
      const lost = this.carry?.seqs.filter((s) => s.status === 'running') ?? [];
      this.dropCarry();
      for (const seq of lost) if (!seqs.includes(seq)) this.settle(seq, e as Error);
    }
    for (const seq of seqs) {
      const w = this.scheduler.waiting.indexOf(seq);
      if (w >= 0) this.scheduler.waiting.splice(w, 1);
      this.stats.cancelled++;
      this.settle(seq, this.reasons.get(seq) ?? new Error('generation abandoned'));
    }
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inflight.add(p);
    return p.finally(() => this.inflight.delete(p));
  }

  private dropCarry(): void {
    if (this.carry) for (const t of this.carry.present) t.dispose();
    this.carry = undefined;
  }

  /** Stores the carried batch's KV that only the model's side holds into the pool. */
  private async writeBack(): Promise<void> {
    const c = this.carry;
    if (!c) return;
    if (c.lengths.every((len, r) => len === c.synced[r])) return;
    await this.store(c.present, c.width, c.seqs.map((s) => this.blocks.blockTable(s.id).ids()), c.lengths, c.synced);
    c.synced = [...c.lengths];
    this.stats.writeBacks++;
  }

  /**
   * Stores tokens from..len-1 of each row of a run's present KV (of `width` positions) into the rows'
   * blocks. Host tensors are read in place; device ones (right-aligned rows: every row's unstored
   * tokens are among the last n positions) come back through kvTail, only that tail, itself a present
   * of n positions.
   */
  private async store(present: readonly KvTensor[], width: number, tables: readonly ArrayLike<number>[],
    lengths: readonly number[], from: readonly number[]): Promise<void> {
    const onHost = present[0]!.location === 'cpu';
    const n = onHost ? width : Math.max(...lengths.map((len, r) => len - from[r]!));
    const data = onHost ? presentData(present) : await this.model.kvTail(present, n);
    lengths.forEach((len, r) => {
      const start = from[r]!;
      if (start < len) this.pool.scatter(data, lengths.length, n, r, this.model.slot(n, len, start), tables[r]!, start, len - start);
    });
  }

  private async prefill(seq: Sequence): Promise<void> {
    const tokens = seq.pending;
    const past = seq.numComputed;
    seq.cachedPrefix ??= past;
    const rows: GatherRow[] = [{ blocks: this.blocks.blockTable(seq.id).ids(), length: past }];
    const { logits, present, width } = await this.forward([seq], rows, [tokens]);
    this.stats.prefills++;
    const length = past + tokens.length;
    if (this.carry?.seqs.every((s) => s.status === 'finished')) {
      // The last batch has ended (its KV is in the pool): release it at the barrier.
      this.outputs.push(...this.carry.present);
      this.carry = undefined;
    }
    if (this.lazy && this.carry === undefined && this.scheduler.running.length === 1) {
      // Alone (no batch running, nobody else admitted): its present KV is exactly the next decode
      // step's past, so it becomes the carry, and its KV reaches the pool with the next write-back.
      this.carry = { seqs: [seq], lengths: [length], width, present, synced: [past] };
    } else {
      // It joins a batch by gathering from the pool: its new KV goes there now.
      if (this.lazy) await this.store(present, width, [rows[0]!.blocks], [length], [past]);
      this.outputs.push(...present);
    }
    const reason = this.advance(seq, tokens.length, logits, 0);
    if (reason) {
      await this.writeBack(); // its blocks go to the prefix cache: their KV first
      this.finishSeq(seq, reason);
    }
  }

  private async decode(seqs: Sequence[]): Promise<void> {
    const rows = seqs.map((s) => ({ blocks: this.blocks.blockTable(s.id).ids(), length: s.numComputed }));
    const lengths = rows.map((r) => r.length);
    // The same batch as last step's decode: its present KV already is this step's past (placed as the
    // layout wants it, with room for the new token), so the gather from the pool is skipped. Any change
    // of the batch (a sequence joined, finished or was preempted) falls back to gathering, from a pool
    // that writeBack brought up to date.
    let carry = this.carry;
    const same = carry !== undefined && carry.seqs.length === seqs.length &&
      carry.seqs.every((q, i) => q === seqs[i] && carry!.lengths[i] === q.numComputed);
    if (same && carry && !this.model.canExtend(carry.width, lengths, 1)) {
      // The batch outgrew its buffer (genai layout): the same rows, copied into a wider one.
      const width = this.model.pastWidth(lengths, 1);
      this.outputs.push(...carry.present);
      carry = this.carry = { ...carry, present: this.model.widen(carry.present, carry.width, width), width };
    }
    const reuse = same; // widened above where it had to be
    // Not reused: the rows are gathered from the pool, which must hold every token first.
    if (!reuse) await this.writeBack();
    this.carry = undefined;
    // The old carry is released at the step barrier, after this run has used it (or failed).
    if (carry) this.outputs.push(...carry.present);
    if (reuse) this.stats.pastReused++;
    const { logits, present, width } = await this.forward(seqs, rows, seqs.map((s) => [s.lastToken]), reuse ? carry : undefined);
    this.stats.decodeRows += seqs.length;
    const synced = seqs.map((s, r) => (!this.lazy ? s.numComputed + 1 : reuse ? carry!.synced[r]! : s.numComputed));
    const finished = seqs.map((s, r) => this.advance(s, 1, logits, r));
    this.carry = { seqs, lengths: seqs.map((q) => q.numComputed), width, present, synced };
    if (finished.some((f) => f !== undefined)) {
      // Finishing frees blocks into the prefix cache: their KV must be in the pool before.
      await this.writeBack();
      seqs.forEach((s, r) => finished[r] && this.finishSeq(s, finished[r]));
    }
  }

  /**
   * One model run over `tokens[r]` new tokens per row (equal counts) on top of each row's cached
   * context: the carried batch's present KV when `carry` is given, else gathered from the pool. With
   * eager write-back the new tokens' KV is stored into the rows' slots here; with lazy write-back it
   * stays in the present tensors (the caller writes back). Returns the last logits and the present KV
   * tensors (the caller releases them) with their width.
   */
  private async forward(seqs: readonly Sequence[], rows: GatherRow[], tokens: number[][], carry?: Carry): Promise<{ logits: Float32Array; present: KvTensor[]; width: number }> {
    const s = tokens[0]!.length;
    const lengths = rows.map((r) => r.length);
    const width = carry?.width ?? this.model.pastWidth(lengths, s);
    let past = carry?.present;
    if (!past) {
      past = this.model.allocPast(rows.length, width);
      this.pool.gatherInto(rows, width, this.model.kvPlacement, presentData(past));
    }
    // Released at the barrier (unless the run wrote in place and they became the present).
    if (!carry) this.outputs.push(...past);
    const adapters = seqs.some((q) => q.params.adapter) ? seqs.map((q) => q.params.adapter) : undefined;
    const out = await this.model.forward({ tokens, lengths, past, width, adapters });
    if (!this.lazy) {
      await this.store(out.present, out.width, rows.map((r) => r.blocks), lengths.map((len) => len + s), lengths);
    }
    return { logits: out.lastLogits, present: out.present, width: out.width };
  }

  /** After a run: the fed tokens are computed; samples the next token; says why the sequence ends, if it does. */
  private advance(seq: Sequence, fed: number, logits: Float32Array, row: number): FinishReason | undefined {
    // A resumed (preempted) sequence has just recomputed every token it had; it samples on from there.
    seq.numComputed += fed;
    const V = this.model.shape.vocabSize;
    const next = sampleToken(logits.subarray(row * V, (row + 1) * V), seq.params.temperature, seq.random);
    if (this.model.eosIds.has(next) && !seq.params.ignoreEos) return 'stop';
    seq.outputIds.push(next);
    if (seq.outputIds.length >= seq.params.maxNewTokens || seq.length >= this.model.shape.maxPositions) return 'length';
    return undefined;
  }

  private finishSeq(seq: Sequence, reason: FinishReason): void {
    seq.finishReason = reason;
    this.settle(seq);
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
