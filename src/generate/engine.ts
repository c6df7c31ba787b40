/**
 * The generation engine: continuous batching on the paged KV cache.
 *
 * A loop of steps. Between steps sits the one step barrier (the runner's `barrier()`): every in-flight
 * model run has completed and its output buffers are released; only then may the scheduler change the
 * batch (admit, finish, preempt). Within a step the batch shape is fixed. The engine owns the
 * sequences' lifecycle (requests, the scheduler, end-of-sequence and length limits, replies); a
 * ModelRunner (model-runner.ts) executes each scheduled step on its backend (ONNX Runtime on the CPU or
 * WebGPU, or the native CUDA decoder) and reports each sequence's next token. Which runner runs is
 * invisible here, to the scheduler, the block manager and the guards.
 *
 * Traced (runtime/tracing.ts, where it is on): each sequence's `prefill` span, from its first scheduled
 * step to its first token, and its `decode` span, from there to its end (the tokens it generated), both
 * children of the context its generate() was called in. Off, the engine keeps no trace state.
 */
import type { FinishReason, Generation } from './generation.js';
import type { ModelRunner, KvPoolInfo, RunnerStats, RunnerStep, SampleExtras, StepSink, TokenDecoder } from './model-runner.js';
import type { TokenLogprobs } from './logprobs.js';
import { OutputText } from './output-text.js';
import { Scheduler, type KvBlockSpace, type SchedulerLimits } from './scheduler.js';
import { Sequence, type SamplingParams } from './sequence.js';
import type { EngineObserver } from './engine-observer.js';
import { activeContext, endSpan, startSpan, type Context, type Span } from '../runtime/tracing.js';

export interface BlockTableView {
  /** Physical block ids in logical order. */
  ids(): ArrayLike<number>;
}

/** The block manager as the engine needs it: the scheduler's interface plus each sequence's table. */
export interface EngineBlockManager extends KvBlockSpace {
  blockTable(seqId: number): BlockTableView;
  /** The child shares every block of the parent (parallel samples: OpenAI's n); writes copy on write. */
  fork(parentId: number, childId: number): void;
}

/**
 * The scheduler's limits; `numBlocks` and `blockSize`, where given, are the pool the block manager
 * manages, checked against the one the runner holds (a mismatch would let the scheduler hand out
 * blocks the runner has no room for).
 */
export interface EngineOptions extends SchedulerLimits {
  numBlocks?: number;
  blockSize?: number;
}

export class PromptNeverFitsError extends Error {}
/** The runner cannot generate as the request asks (rather than generating something else). */
export class UnsupportedSamplingError extends Error {}

/** A traced sequence's spans, and the context they are children of (its generate() call's). */
interface SeqTrace {
  parent: Context;
  prefill?: Span;
  decode?: Span;
}

interface Pending {
  resolve(g: Generation): void;
  reject(e: Error): void;
  hooks: GenerateHooks;
}

/** One generated token as it comes: `text` is what it makes final (often empty); tokenId null for the last flush. */
export interface TokenEvent {
  tokenId: number | null;
  text: string;
  /** The token's logprobs, where the request asked. */
  logprobs?: TokenLogprobs;
}

export interface GenerateHooks {
  /** Called in the step loop for each token (it must not throw, nor block). */
  onToken?: (e: TokenEvent) => void;
  /** Aborted: the sequence is finished at the next step barrier, its blocks freed, and the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** The engine's counters, and its runner's (RunnerStats: zero for a runner that keeps none). */
export interface EngineStats extends RunnerStats {
  steps: number;
  prefills: number;
  decodeRows: number;
  preemptions: number;
  /** Wall time spent in scheduling and block bookkeeping (not the model), microseconds. */
  schedulerMicros: number;
  /** Sequences dropped because their requests were abandoned. */
  cancelled: number;
}

export class Engine {
  readonly runner: ModelRunner;
  readonly scheduler: Scheduler;
  private readonly counters = { steps: 0, preemptions: 0, schedulerMicros: 0, prefills: 0, decodeRows: 0, cancelled: 0 };
  private readonly pending = new Map<Sequence, Pending>();
  /** Traced sequences' spans (empty where tracing is off). */
  private readonly traces = new Map<Sequence, SeqTrace>();
  private nextId = 0;
  private loop: Promise<void> | undefined;
  private readonly sink: StepSink = {
    accept: (seq, fed, next, extras) => this.advance(seq, fed, next, extras),
    finish: (seq, reason) => this.finishSeq(seq, reason),
  };
  private readonly blocksOf: RunnerStep['blocks'];
  /** Forks adopted since the pool was last synced: their copy-on-write copies read blocks the runner may hold only on its side. */
  private forked = false;
  /** Told of every sampled token and every request's end (metrics.ts); none by default. */
  observer: EngineObserver | undefined;

  /** `runner` executes the steps on its backend (backends/ort/ort-runner.ts, backends/cuda/cuda-runner.ts). */
  constructor(runner: ModelRunner, readonly blocks: EngineBlockManager, opts: EngineOptions) {
    this.runner = runner;
    const { numBlocks, blockSize } = runner.pool;
    if ((opts.numBlocks !== undefined && opts.numBlocks !== numBlocks) || (opts.blockSize !== undefined && opts.blockSize !== blockSize)) {
      throw new Error(`the engine's pool (${opts.numBlocks} blocks of ${opts.blockSize}) is not the runner's (${numBlocks} of ${blockSize})`);
    }
    this.scheduler = new Scheduler(blocks, opts);
    this.blocksOf = (seq) => this.blocks.blockTable(seq.id).ids();
  }

  /** The KV pool as the runner holds it (host or device bytes). */
  get pool(): KvPoolInfo {
    return this.runner.pool;
  }

  get stats(): EngineStats {
    const r = this.runner.stats;
    return { ...this.counters, pastReused: r?.pastReused ?? 0, writeBacks: r?.writeBacks ?? 0, paced: r?.paced ?? 0, spareTaken: r?.spareTaken ?? 0,
      paddedPrefills: r?.paddedPrefills ?? 0, paddedPrefillRows: r?.paddedPrefillRows ?? 0 };
  }

  generate(promptIds: readonly number[], params: SamplingParams, hooks: GenerateHooks = {}): Promise<Generation> {
    return this.generateMany(promptIds, params, 1, { signal: hooks.signal, onToken: hooks.onToken && ((_, e) => hooks.onToken!(e)) }).then((g) => g[0]!);
  }

  /**
   * `n` samples of one prompt (OpenAI's `n`): the prompt is prefilled once, as one sequence; at that
   * prefill the others take their first tokens from the same logits and fork its blocks (shared by
   * reference count, copied on write: block-manager.ts), then decode as sequences of their own. With a
   * seed, sample i is seeded seed + i (sample 0 is what n = 1 gives). One failing fails them all.
   */
  generateMany(promptIds: readonly number[], params: SamplingParams, n: number,
    hooks: { signal?: AbortSignal | undefined; onToken?: ((index: number, e: TokenEvent) => void) | undefined } = {}): Promise<Generation[]> {
    if (hooks.signal?.aborted) return Promise.reject(abortReason(hooks.signal));
    if (!(Number.isInteger(n) && n >= 1)) return Promise.reject(new RangeError(`n must be a positive integer, got ${n}`));
    if ((n > 1 || params.logprobs !== undefined) && !this.runner.hostSampling) {
      return Promise.reject(new UnsupportedSamplingError(`this backend samples on the device: ${n > 1 ? 'n > 1' : 'logprobs'} is not supported`));
    }
    const refused = this.runner.refuse?.(params);
    if (refused) return Promise.reject(new UnsupportedSamplingError(refused));
    // One failure stops the siblings: a request gets all its samples or an error. (A single sequence
    // needs no such signal: without one of its own it stays one the runner cannot stop, as it was.)
    const stop = n > 1 ? new AbortController() : undefined;
    const signal = stop ? (hooks.signal ? AbortSignal.any([hooks.signal, stop.signal]) : stop.signal) : hooks.signal;
    const seqs = Array.from({ length: n }, (_, i) => {
      const p = params.seed === undefined || i === 0 ? params : { ...params, seed: params.seed + i };
      const seq = new Sequence(this.nextId++, promptIds, p, performance.now());
      // Text as generated costs two small decodes per token: only where a stop sequence or a listener needs it
      // (otherwise the whole output is decoded once at the end, to the same text).
      if (params.stop?.length || hooks.onToken) seq.text = new OutputText(this.decoderOf(seq), params.stop);
      return seq;
    });
    const done = seqs.map((seq, i) => new Promise<Generation>((resolve, reject) => this.pending.set(seq, {
      resolve, reject: (e) => { stop?.abort(e); reject(e); },
      hooks: { signal, onToken: hooks.onToken && ((e) => hooks.onToken!(i, e)) },
    })));
    if (n > 1) seqs[0]!.forks = seqs.slice(1);
    const parent = activeContext();
    if (parent) for (const seq of seqs) this.traces.set(seq, { parent });
    this.scheduler.add(seqs[0]!);
    this.loop ??= this.run();
    const all = Promise.all(done);
    // The siblings' rejections are the same failure: handled here, so none is left unhandled.
    for (const d of done.slice(1)) d.catch(() => {});
    return all;
  }

  /**
   * Resolves when the step loop has stopped: every request settled and the last barrier passed (KV
   * buffers released). A request's reply comes a few awaits before that.
   */
  idle(): Promise<void> {
    return this.loop ?? Promise.resolve();
  }

  /**
   * The step loop, while any sequence waits or runs. It decides to stop in the same synchronous stretch
   * that clears `loop`, so a request added by a reply's continuation (a microtask after the last step)
   * either is seen here or starts a new loop: never stranded in the queue.
   */
  private async run(): Promise<void> {
    try {
      for (;;) {
        await this.steps();
        await this.runner.barrier();
        this.runner.abandon();
        if (!this.scheduler.hasWork) return;
      }
    } finally {
      this.loop = undefined;
    }
  }

  private async steps(): Promise<void> {
    while (this.scheduler.hasWork) {
      await this.runner.barrier();
      await this.dropAborted();
      if (!this.scheduler.hasWork) break;
      // Admission may hit blocks the runner's side filled, preemption frees them, a fork's first write
      // copies a block the prefill filled: the pool first.
      if (this.scheduler.mayMoveBlocks || this.forked) {
        this.forked = false;
        try {
          await this.runner.syncPool(this.blocksOf);
        } catch (e) {
          // Those sequences' newest KV never reached the pool: they cannot go on.
          for (const seq of this.runner.abandon()) this.settle(seq, e as Error);
        }
      }
      const t0 = performance.now();
      const plan = this.scheduler.schedule();
      this.runner.copyBlocks(plan.copies);
      this.counters.schedulerMicros += (performance.now() - t0) * 1000;
      this.counters.steps++;
      this.counters.preemptions += plan.preempted.length;
      for (const seq of plan.rejected) {
        this.settle(seq, new PromptNeverFitsError(`a prompt of ${seq.length} tokens needs more KV blocks than the pool has`));
      }
      if (plan.decodes.length === 0 && plan.prefills.length === 0) continue;
      for (const seq of plan.prefills) seq.cachedPrefix ??= seq.numComputed;
      if (this.traces.size > 0) for (const seq of plan.prefills) this.tracePrefill(seq);
      this.counters.prefills += plan.prefills.length;
      this.counters.decodeRows += plan.decodes.length;
      const stepSeqs = [...plan.prefills, ...plan.decodes];
      // Made when the runner first asks for it (a runner whose steps take milliseconds never does): its
      // listeners on every request's signal are a cost a step should not pay for nothing.
      let abandoned: ReturnType<Engine['abandonedTogether']>;
      let asked = false;
      const watch = () => this.abandonedTogether(stepSeqs);
      const step: RunnerStep = {
        decodes: plan.decodes, prefills: plan.prefills, blocks: this.blocksOf,
        get signal() {
          if (!asked) abandoned = watch();
          asked = true;
          return abandoned?.signal;
        },
      };
      try {
        await this.runner.execute(step, this.sink);
      } catch (e) {
        // A failed run leaves the step's sequences without KV for their tokens: fail them, keep serving.
        // A stopped one (every sequence abandoned) the same, each with its own abort as the reason.
        this.runner.abandon();
        const stopped = abandoned?.signal.aborted === true;
        for (const seq of stepSeqs) {
          if (seq.status !== 'running') continue;
          if (stopped) this.counters.cancelled++;
          this.settle(seq, stopped ? abortReason(this.pending.get(seq)!.hooks.signal!) : e as Error);
        }
      } finally {
        abandoned?.dispose();
      }
    }
  }

  /**
   * A signal aborted once every one of `seqs` has been abandoned (each request's own signal fired);
   * undefined where one of them has no signal. dispose() removes its listeners after the step.
   */
  private abandonedTogether(seqs: readonly Sequence[]): { signal: AbortSignal; dispose(): void } | undefined {
    const signals = seqs.map((s) => this.pending.get(s)?.hooks.signal);
    if (signals.length === 0 || signals.some((s) => s === undefined)) return undefined;
    const all = new AbortController();
    const stop = () => all.abort(new DOMException('every request of the step was abandoned', 'AbortError'));
    let left = signals.filter((s) => !s!.aborted).length;
    const one = () => {
      if (--left === 0) stop();
    };
    if (left === 0) stop();
    for (const s of signals) if (!s!.aborted) s!.addEventListener('abort', one, { once: true });
    return { signal: all.signal, dispose: () => { for (const s of signals) s!.removeEventListener('abort', one); } };
  }

  /** At the barrier: sequences whose signal fired are finished (blocks freed) and their promises rejected. */
  private async dropAborted(): Promise<void> {
    const aborted = [...this.pending].filter(([, p]) => p.hooks.signal?.aborted).map(([seq]) => seq);
    if (aborted.length === 0) return;
    this.counters.cancelled += aborted.length;
    // The runner's newest KV goes to the pool before any of its rows' blocks are freed.
    try {
      await this.runner.syncPool(this.blocksOf);
    } catch (e) {
      for (const seq of this.runner.abandon()) if (!aborted.includes(seq)) this.settle(seq, e as Error);
      this.settleAborted(aborted, false);
      return;
    }
    this.settleAborted(aborted, true);
  }

  /** Settled with their signals' reasons; a fork still waiting was settled with the sequence it forks from. */
  private settleAborted(seqs: readonly Sequence[], kvIntact: boolean): void {
    for (const seq of seqs) {
      const p = this.pending.get(seq);
      if (p) this.settle(seq, abortReason(p.hooks.signal!), kvIntact);
    }
  }

  /** After a run: the fed tokens are computed and `next` was sampled; says why the sequence ends, if it does. */
  private advance(seq: Sequence, fed: number, next: number, extras?: SampleExtras): FinishReason | undefined {
    // A resumed (preempted) sequence has just recomputed every token it had; it samples on from there.
    seq.numComputed += fed;
    if (seq.forks) {
      seq.forks = undefined;
      for (const f of extras?.forks ?? []) this.adopt(seq, f.seq, f.next, f.logprobs);
    }
    this.observer?.token(seq, performance.now());
    if (this.traces.size > 0) this.traceFirstToken(seq);
    if (this.runner.eosIds.has(next) && !seq.params.ignoreEos) return 'stop';
    seq.outputIds.push(next);
    if (extras?.logprobs) seq.logprobs.push(extras.logprobs);
    seq.guide?.accept(next);
    const text = seq.text?.push(next) ?? '';
    this.pending.get(seq)?.hooks.onToken?.({ tokenId: next, text, logprobs: extras?.logprobs });
    if (seq.text?.stopped !== undefined || seq.guide?.done) return 'stop';
    if (seq.outputIds.length >= seq.params.maxNewTokens || seq.length >= this.runner.shape.maxPositions) return 'length';
    return undefined;
  }

  /**
   * A constrained sequence's text is its tokens' texts as the grammar read them: a tokenizer's decoder
   * may clean up spaces (" ," to ",") and so change the JSON the grammar checked.
   */
  private decoderOf(seq: Sequence): TokenDecoder {
    return seq.guide?.grammar.vocab ?? this.runner.tokenizer;
  }

  /**
   * A fork joins the running batch right after its parent's prefill: the parent's blocks (the prompt's
   * KV) shared, its first token sampled from the same logits. Before the parent takes its own first
   * token's slot, so the fork's table is the prompt's alone.
   */
  private adopt(parent: Sequence, child: Sequence, next: number, logprobs: TokenLogprobs | undefined): void {
    if (!this.pending.has(child)) return; // abandoned while it waited
    this.blocks.fork(parent.id, child.id);
    this.forked = true;
    child.numComputed = parent.numComputed;
    child.cachedPrefix = parent.cachedPrefix;
    this.scheduler.adopt(child);
    const reason = this.advance(child, 0, next, logprobs && { logprobs });
    // Its blocks are its parent's too (the parent is still running): freeing them only drops a reference.
    if (reason) this.finishSeq(child, reason);
  }

  private finishSeq(seq: Sequence, reason: FinishReason): void {
    seq.finishReason = reason;
    this.settle(seq);
  }

  private settle(seq: Sequence, error?: Error, aborted = false): void {
    // Forks still waiting for this prefill share its fate when it fails before they were made.
    const forks = seq.forks;
    seq.forks = undefined;
    for (const f of forks ?? []) if (this.pending.has(f)) this.settle(f, error ?? new Error('the sequence they fork from ended before its prefill'), aborted);
    // A failed run may have left the sequence's blocks without their KV: they must not serve prefix hits.
    this.scheduler.finish(seq, { failed: error !== undefined && !aborted });
    this.observer?.finished(seq, performance.now(), error !== undefined);
    if (this.traces.size > 0) this.traceEnd(seq, error);
    const p = this.pending.get(seq);
    this.pending.delete(seq);
    if (!p) return;
    if (error) {
      p.reject(error);
      return;
    }
    // Whatever goes wrong making the reply (decoding its text, a listener) settles the request with it:
    // a promise left unsettled would hang its client and hold its reservation for good.
    try {
      const tail = seq.text?.finish() ?? '';
      if (tail) p.hooks.onToken?.({ tokenId: null, text: tail });
      p.resolve({
        ids: seq.outputIds, text: seq.text?.text ?? this.decoderOf(seq).decode(seq.outputIds).trim(), finishReason: seq.finishReason ?? 'length',
        cachedTokens: seq.cachedPrefix ?? 0,
        ...(seq.params.logprobs !== undefined ? { logprobs: seq.logprobs } : {}),
        ...(seq.guide?.steered ? { steered: true } : {}),
      });
    } catch (e) {
      p.reject(e instanceof Error ? e : new Error(String(e)));
    }
  }

  /** Scheduled to prefill: its prefill span starts (a preempted one's recompute is an event of its decode). */
  private tracePrefill(seq: Sequence): void {
    const t = this.traces.get(seq);
    if (!t) return;
    if (t.decode) t.decode.addEvent('recompute', { 'ragguard.preemptions': seq.preemptions });
    else t.prefill ??= startSpan('prefill', { 'gen_ai.usage.input_tokens': seq.promptIds.length, 'ragguard.cached_prompt_tokens': seq.cachedPrefix ?? 0 }, t.parent);
  }

  /** Its first token: prefill ends, decode begins (a fork, sampled at its parent's prefill, has decode alone). */
  private traceFirstToken(seq: Sequence): void {
    const t = this.traces.get(seq);
    if (!t || t.decode) return;
    endSpan(t.prefill);
    t.decode = startSpan('decode', {}, t.parent);
  }

  /** It left the engine: its open spans end, decode with the tokens it generated and why it stopped. */
  private traceEnd(seq: Sequence, error: Error | undefined): void {
    const t = this.traces.get(seq);
    if (!t) return;
    this.traces.delete(seq);
    endSpan(t.prefill, t.decode ? undefined : error);
    endSpan(t.decode, error, {
      'gen_ai.usage.output_tokens': seq.outputIds.length,
      ...(seq.finishReason ? { 'gen_ai.response.finish_reasons': [seq.finishReason] } : {}),
      'ragguard.preemptions': seq.preemptions,
    });
  }
}

function abortReason(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new DOMException('the request was aborted', 'AbortError');
}
