/**
 * The ONNX Runtime model runner (CPU, WebGPU): an ONNX decoder (decoder-model.ts) driven step by step
 * over a paged KV pool in host memory (kv-pool.ts).
 *
 * Within a step the batch decodes first, all running sequences one token together, their contexts
 * gathered from the block pool into the past tensors as the decoder's layout places them
 * (right-aligned and masked, or left-aligned in a buffer with room to grow: decoder-model.ts); then
 * newly admitted sequences are prefilled. Decoding first means a prefix hit on a block completed by
 * this step's decode finds its KV written. Newcomers without cached tokens prefill together, right-
 * padded to the longest of a group, where the model's graph takes that (DecoderModel.paddedPrefill:
 * each row's mask covers its own tokens, its logits are its last real token's); the others prefill
 * one a run, after them (their lengths differ, and GroupQueryAttention takes rows of several lengths
 * only without past tokens).
 *
 * While the batch holds, a decode step takes the last step's present KV as its past (no gather). Where
 * the provider keeps present KV on the device (WebGPU), the pool is then written back lazily: the new
 * tokens' KV stays on the device until blocks are about to change hands (a sequence finishes, the
 * scheduler may admit or preempt, a prefill follows) and is downloaded and scattered only then. Per
 * steady decode step the host sends token ids, positions and the mask, and receives the logits, and
 * samples the next tokens on the host.
 */
import { Engine, type EngineBlockManager } from '../../generate/engine.js';
import { metered } from '../../runtime/run-meter.js';
import { presentData, type KvTensor, type OrtDecoder } from './forward.js';
import { KvCachePool, type GatherRow } from './kv-pool.js';
import type { KvPoolInfo, ModelRunner, RunnerStats, RunnerStep, SampleExtras, StepSink } from '../../generate/model-runner.js';
import { tokenLogprobs } from '../../generate/logprobs.js';
import { plainGreedy, sampleNext } from '../../generate/sampler.js';
import { Pacer } from '../../runtime/pacer.js';
import type { BlockCopy, SchedulerLimits } from '../../generate/scheduler.js';
import type { Sequence } from '../../generate/sequence.js';

export interface OrtRunnerOptions {
  numBlocks: number;
  blockSize: number;
  /**
   * When new tokens' KV reaches the pool: 'eager' after every run, 'lazy' only when blocks are about to
   * change hands. Default: lazy where the model keeps present KV on the device (a write-back is a
   * download), eager where it is host memory anyway. Tests run 'lazy' on the CPU.
   */
  kvWriteBack?: 'eager' | 'lazy';
  /** Longest stretch of a step's main-thread work between two turns of the event loop, ms (pacer.ts; default 8; tests 0). */
  paceSliceMs?: number;
}

/**
 * How much longer than its own prompt a row of a padded prefill may run: a group takes rows (longest
 * first) while its padded tokens stay within PAD_LIMIT times its real ones. A padded run costs its
 * padded tokens, and the memory guard reserves for each request a prefill of its own length (plus each
 * run's fixed overhead, which a group pays once): a bound keeps both near what a run per row costs.
 * bench:gguf's chat prompts (20-30 tokens) pad by 20 % in one group of 8.
 */
export const PAD_LIMIT = 1.25;

/** The ONNX Runtime runner's counters (model-runner.ts RunnerStats). */
export type OrtRunnerStats = RunnerStats;

/**
 * The last run's batch and its present KV (`width` positions, placed as the decoder's layout places rows), the next step's past
 * while the batch holds. `synced[r]`: leading tokens of row r's sequence already in the pool.
 */
interface Carry {
  seqs: readonly Sequence[];
  lengths: number[];
  width: number;
  present: KvTensor[];
  synced: number[];
}

export class OrtModelRunner implements ModelRunner {
  readonly kv: KvCachePool;
  readonly hostSampling = true;
  get stats(): OrtRunnerStats {
    return { ...this.counts, paced: this.pacer.yields };
  }
  private readonly counts = { pastReused: 0, writeBacks: 0, spareTaken: 0, paddedPrefills: 0, paddedPrefillRows: 0 };
  /** Model runs of the current step; the barrier awaits them all. */
  private readonly inflight = new Set<Promise<unknown>>();
  /** Tensors the current step is done with, released at the barrier (unless the carry holds them). */
  private readonly outputs: KvTensor[] = [];
  private carry: Carry | undefined;
  private readonly lazy: boolean;
  /**
   * Slices the main-thread work between two model runs (sampling, releasing, allocating, gathering):
   * for a batch of 32 it was one stretch of 50-110 ms that held probes and 503s (pacer.ts).
   */
  private readonly pacer: Pacer;

  constructor(readonly model: OrtDecoder, opts: OrtRunnerOptions) {
    this.lazy = (opts.kvWriteBack ?? (model.presentOnDevice ? 'lazy' : 'eager')) === 'lazy';
    this.kv = new KvCachePool(model.shape, opts.numBlocks, opts.blockSize);
    this.pacer = new Pacer(opts.paceSliceMs);
  }

  get shape(): OrtDecoder['shape'] {
    return this.model.shape;
  }

  get eosIds(): ReadonlySet<number> {
    return this.model.eosIds;
  }

  get tokenizer(): OrtDecoder['tokenizer'] {
    return this.model.tokenizer;
  }

  get pool(): KvPoolInfo {
    const p = this.kv;
    return { bytes: p.bytes, numBlocks: p.numBlocks, blockSize: p.blockSize, bytesPerSlot: p.bytesPerSlot, location: 'host' };
  }

  barrier(): Promise<void> {
    return this.streamSync();
  }

  syncPool(blocks: RunnerStep['blocks']): Promise<void> {
    return this.writeBack(blocks);
  }

  copyBlocks(copies: readonly BlockCopy[]): void {
    for (const c of copies) this.kv.copyBlock(c.src, c.dst);
  }

  async execute(step: RunnerStep, sink: StepSink): Promise<void> {
    if (step.decodes.length > 0) await this.track(metered('decode', () => this.decode(step, sink)));
    if (step.prefills.length > 0) await this.writeBack(step.blocks);
    for (const group of this.prefillGroups(step.prefills)) await this.track(metered('prefill', () => this.prefill(group, step, sink)));
  }

  /**
   * The step's prefills as runs: sequences with no cached tokens in groups right-padded to their
   * longest (within PAD_LIMIT), where the graph takes padded rows, each group in the step's order (a
   * group that is the whole batch is then the next decode step's rows as they come); then the ones
   * with cached tokens, alone, in the step's order. Those may read blocks that an earlier prefill of
   * this step fills (a prefix hit): none of a sequence without cached tokens does, so running those
   * first keeps every such block filled before it is read.
   */
  private prefillGroups(prefills: readonly Sequence[]): Sequence[][] {
    if (!this.model.paddedPrefill) return prefills.map((s) => [s]);
    const fresh = prefills.filter((s) => s.numComputed === 0);
    const groups: Sequence[][] = [];
    const left = [...fresh].sort((a, b) => b.pending.length - a.pending.length);
    while (left.length > 0) {
      const longest = left[0]!.pending.length;
      let real = 0;
      let n = 0;
      while (n < left.length && (n + 1) * longest <= PAD_LIMIT * (real + left[n]!.pending.length)) real += left[n++]!.pending.length;
      const members = new Set(left.splice(0, Math.max(1, n)));
      groups.push(fresh.filter((s) => members.has(s)));
    }
    return [...groups, ...prefills.filter((s) => s.numComputed > 0).map((s) => [s])];
  }

  abandon(): Sequence[] {
    const lost = this.carry?.seqs.filter((s) => s.status === 'running') ?? [];
    this.dropCarry();
    return lost;
  }

  /** The step barrier: every in-flight run has completed and its buffers are released. */
  private async streamSync(): Promise<void> {
    await Promise.allSettled([...this.inflight]);
    // A run that writes in place returns its past tensors as its present: the carry may hold them still.
    const kept = new Set<KvTensor>(this.carry?.present ?? []);
    // Releasing a batch's 48 past buffers (each its own mapping) took ~15 ms: paced with the rest.
    for (const t of this.outputs.splice(0)) {
      if (kept.has(t)) continue;
      await this.pacer.pace();
      t.dispose();
    }
  }

  /**
   * A past of `rows` rows and `width` positions, made where it fits in the memory of a tensor of this
   * step's runs that nothing uses any more (the outputs less the carry's present; allocPast), else new.
   * The ones taken leave the outputs: they are released with the tensor made in them. Runs are
   * sequential within a step, so none of the outputs is in a run now.
   */
  private async allocPast(rows: number, width: number): Promise<KvTensor[]> {
    const kept = new Set<KvTensor>(this.carry?.present ?? []);
    const spare = [...new Set(this.outputs)].filter((t) => !kept.has(t));
    const taken = new Set(spare);
    const past = await this.model.allocPastPaced(rows, width, spare, () => this.pacer.pace());
    for (const t of spare) taken.delete(t); // allocPast removed the ones it took from `spare`
    if (taken.size > 0) {
      this.counts.spareTaken += taken.size;
      const stay = this.outputs.filter((t) => !taken.has(t));
      this.outputs.splice(0, this.outputs.length, ...stay);
    }
    return past;
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
  private async writeBack(blocks: RunnerStep['blocks']): Promise<void> {
    const c = this.carry;
    if (!c) return;
    if (c.lengths.every((len, r) => len === c.synced[r])) return;
    await this.store(c.present, c.width, c.seqs.map(blocks), c.lengths, c.synced);
    c.synced = [...c.lengths];
    this.counts.writeBacks++;
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
      if (start < len) this.kv.scatter(data, lengths.length, n, r, this.model.slot(n, len, start), tables[r]!, start, len - start);
    });
  }

  /**
   * One prefill run: a sequence alone, or a group (prefillGroups) whose rows are right-padded to the
   * longest with their last token (any id would do: the pads' mask is 0, their logits are not taken,
   * their KV is neither stored nor read: a row's decode writes its next token over its first pad).
   */
  private async prefill(group: readonly Sequence[], step: RunnerStep, sink: StepSink): Promise<void> {
    const tokens = group.map((seq) => seq.pending);
    const counts = tokens.map((t) => t.length);
    const rows: GatherRow[] = group.map((seq) => ({ blocks: step.blocks(seq), length: seq.numComputed }));
    const padded = group.length > 1;
    const longest = Math.max(...counts);
    const fed = padded ? tokens.map((t) => t.concat(new Array<number>(longest - t.length).fill(t.at(-1)!))) : tokens;
    if (padded) {
      this.counts.paddedPrefills++;
      this.counts.paddedPrefillRows += group.length;
    }
    const { logits, greedyIds, present, width } = await this.forward(group, rows, fed, undefined, step.signal, padded ? counts : undefined);
    const past = rows.map((r) => r.length);
    const lengths = past.map((p, r) => p + counts[r]!);
    if (this.carry?.seqs.every((s) => s.status === 'finished')) {
      // The last batch has ended (its KV is in the pool): release it at the barrier.
      this.outputs.push(...this.carry.present);
      this.carry = undefined;
    }
    const running = [...step.decodes, ...step.prefills].filter((s) => s.status === 'running').length;
    if (this.lazy && this.carry === undefined && running === group.length) {
      // Alone (no batch running, nobody else admitted): its present KV is exactly the next decode
      // step's past (a group's rows left-aligned in the step's order, as the next step lists them), so
      // it becomes the carry, and its KV reaches the pool with the next write-back.
      this.carry = { seqs: group, lengths, width, present, synced: past };
    } else {
      // It joins a batch by gathering from the pool: its new KV goes there now.
      if (this.lazy) await this.store(present, width, rows.map((r) => r.blocks), lengths, past);
      this.outputs.push(...present);
    }
    const finished = group.map((seq, r) => sink.accept(seq, counts[r]!, ...this.sample(seq, logits, greedyIds, r)));
    if (finished.some((f) => f !== undefined)) {
      await this.writeBack(step.blocks); // their blocks go to the prefix cache: their KV first
      group.forEach((seq, r) => finished[r] && sink.finish(seq, finished[r]));
    }
  }

  private async decode(step: RunnerStep, sink: StepSink): Promise<void> {
    const seqs = step.decodes;
    const rows = seqs.map((s) => ({ blocks: step.blocks(s), length: s.numComputed }));
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
    if (!reuse) await this.writeBack(step.blocks);
    this.carry = undefined;
    // The old carry is released at the step barrier, after this run has used it (or failed).
    if (carry) this.outputs.push(...carry.present);
    if (reuse) this.counts.pastReused++;
    const { logits, greedyIds, present, width } = await this.forward(seqs, rows, seqs.map((s) => [s.lastToken]), reuse ? carry : undefined, step.signal);
    const synced = seqs.map((s, r) => (!this.lazy ? s.numComputed + 1 : reuse ? carry!.synced[r]! : s.numComputed));
    // A row's sampling on the host reads 152k logits (about half a millisecond here): 32 rows are paced.
    const finished: ReturnType<StepSink['accept']>[] = [];
    for (let r = 0; r < seqs.length; r++) {
      await this.pacer.pace();
      finished.push(sink.accept(seqs[r]!, 1, ...this.sample(seqs[r]!, logits, greedyIds, r)));
    }
    this.carry = { seqs, lengths: seqs.map((q) => q.numComputed), width, present, synced };
    if (finished.some((f) => f !== undefined)) {
      // Finishing frees blocks into the prefix cache: their KV must be in the pool before.
      await this.writeBack(step.blocks);
      seqs.forEach((s, r) => finished[r] && sink.finish(s, finished[r]));
    }
  }

  /**
   * One model run over `tokens[r]` new tokens per row (equal counts) on top of each row's cached
   * context: the carried batch's present KV when `carry` is given, else gathered from the pool. With
   * eager write-back the new tokens' KV is stored into the rows' slots here; with lazy write-back it
   * stays in the present tensors (the caller writes back). Returns the last logits and the present KV
   * tensors (the caller releases them) with their width.
   */
  /**
   * `signal`: the step's (RunnerStep.signal), which stops the run once every sequence of the step was
   * abandoned. `counts`: a padded prefill's real tokens per row (ForwardInput.counts); only those are stored.
   */
  private async forward(seqs: readonly Sequence[], rows: GatherRow[], tokens: number[][], carry?: Carry, signal?: AbortSignal,
    counts?: readonly number[]): Promise<{ logits: Float32Array; greedyIds?: readonly number[]; present: KvTensor[]; width: number }> {
    const s = tokens[0]!.length;
    const lengths = rows.map((r) => r.length);
    const width = carry?.width ?? this.model.pastWidth(lengths, s);
    let past = carry?.present;
    if (!past) {
      past = await this.allocPast(rows.length, width);
      // Paced: a large batch's gather would hold the event loop (health probes, 503s) for up to a second.
      await this.kv.gatherIntoPaced(rows, width, this.model.kvPlacement, presentData(past), this.pacer);
    }
    // Released at the barrier (unless the run wrote in place and they became the present).
    if (!carry) this.outputs.push(...past);
    const adapters = seqs.some((q) => q.params.adapter) ? seqs.map((q) => q.params.adapter) : undefined;
    const out = await this.model.forward({ tokens, lengths, counts, past, width, adapters, signal });
    this.pacer.start(); // the run's completion: a new stretch of main-thread work begins
    if (!this.lazy) {
      await this.store(out.present, out.width, rows.map((r) => r.blocks), lengths.map((len, r) => len + (counts?.[r] ?? s)), lengths);
    }
    return { logits: out.lastLogits, greedyIds: out.greedyIds, present: out.present, width: out.width };
  }

  /**
   * The next token of row `row` of a run's last logits (the graph's greedy id where that is the answer),
   * with its logprobs and the first tokens of the sequence's forks where asked (SampleExtras).
   */
  private sample(seq: Sequence, logits: Float32Array, greedyIds: readonly number[] | undefined, row: number): [number, SampleExtras?] {
    const V = this.model.shape.vocabSize;
    const l = logits.subarray(row * V, (row + 1) * V);
    const pick = (q: Sequence) => {
      const guide = q.guide;
      // A constrained greedy row keeps the graph's argmax where the grammar takes it (then it is the masked argmax too).
      if (greedyIds && plainGreedy(q.params) && (!guide || guide.allows(greedyIds[row]!))) return greedyIds[row]!;
      return sampleNext(l, q.params, q.random, q.promptIds, q.outputIds, guide?.mask());
    };
    const lp = (q: Sequence, next: number) => (q.params.logprobs === undefined ? undefined : tokenLogprobs(l, next, q.params.logprobs));
    const next = pick(seq);
    if (seq.params.logprobs === undefined && !seq.forks) return [next];
    const extras: SampleExtras = { logprobs: lp(seq, next) };
    if (seq.forks) extras.forks = seq.forks.map((f) => { const n = pick(f); return { seq: f, next: n, logprobs: lp(f, n) }; });
    return [next, extras];
  }
}

/** An engine over an ONNX Runtime decoder: its runner made for the block pool the options describe. */
export function ortEngine(model: OrtDecoder, blocks: EngineBlockManager, opts: SchedulerLimits & OrtRunnerOptions): Engine {
  return new Engine(new OrtModelRunner(model, opts), blocks, opts);
}
