/**
 * Continuous-batching scheduler (FCFS), modelled on vLLM's: sequences join and leave between steps.
 *
 * Each step: every running sequence gets a KV slot for the token it feeds next; when the pool is out
 * of blocks the most recently admitted running sequence is preempted (its blocks freed, to be
 * recomputed later from its prompt and the tokens it already produced) until the others fit. Only
 * when nothing was preempted are waiting sequences admitted, in arrival order, while the block
 * manager says 'ok' (free blocks stay above the watermark, so admission does not thrash) and the
 * step's token budget and max_num_seqs allow.
 */
import type { AllocStatus, BlockCopy, KvSequence } from './block-manager.js';
import type { Sequence } from './sequence.js';

export type { AllocStatus, BlockCopy };

/** The slice of the block manager the scheduler drives. */
export interface KvBlockSpace {
  canAllocate(seq: KvSequence): AllocStatus;
  /** Builds the sequence's block table; returns how many leading tokens are already computed (prefix hit). */
  allocate(seq: KvSequence): number;
  canAppendSlots(seqId: number, n: number): boolean;
  canAppendEach(seqIds: readonly number[]): boolean;
  /** Reserves slots for the tokens; returns block copies the KV storage must make (copy-on-write). */
  appendSlots(seqId: number, tokenIds: readonly number[]): BlockCopy[];
  /** Unknown ids are ignored. discardPrefix: the blocks' KV is not trustworthy (a failed run); do not keep them for prefix hits. */
  free(seqId: number, opts?: { discardPrefix?: boolean }): void;
}

export interface SchedulerLimits {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
}

export interface StepPlan {
  /** Newly admitted (or resumed after preemption): feed their pending tokens. */
  prefills: Sequence[];
  /** Running: feed one token each, batched. */
  decodes: Sequence[];
  preempted: Sequence[];
  /** Can never fit the pool: to be failed. */
  rejected: Sequence[];
  copies: BlockCopy[];
}

export class Scheduler {
  readonly waiting: Sequence[] = [];
  /** In admission order: the last is the first preemption victim. */
  readonly running: Sequence[] = [];

  constructor(
    private readonly blocks: KvBlockSpace,
    private readonly limits: SchedulerLimits,
  ) {}

  add(seq: Sequence): void {
    seq.status = 'waiting';
    this.waiting.push(seq);
  }

  /** A sequence whose blocks the caller already made (a fork of a running one: engine.ts) joins the running batch. */
  adopt(seq: Sequence): void {
    seq.status = 'running';
    this.running.push(seq);
  }

  get hasWork(): boolean {
    return this.waiting.length > 0 || this.running.length > 0;
  }

  /**
   * Whether the next schedule() may move blocks between sequences: it admits (a prefix hit takes
   * blocks other sequences filled) or preempts (frees a running sequence's blocks). Otherwise it only
   * hands each running sequence a slot for its next token.
   */
  get mayMoveBlocks(): boolean {
    return this.waiting.length > 0 || !this.blocks.canAppendEach(this.running.map((s) => s.id));
  }

  /** Removes a finished (or failed) sequence and frees its blocks (none, for one rejected unallocated). */
  finish(seq: Sequence, opts: { failed?: boolean } = {}): void {
    const i = this.running.indexOf(seq);
    if (i >= 0) this.running.splice(i, 1);
    // A cancelled request may still wait (never admitted, or preempted).
    const w = this.waiting.indexOf(seq);
    if (w >= 0) this.waiting.splice(w, 1);
    this.blocks.free(seq.id, { discardPrefix: opts.failed });
    seq.status = 'finished';
  }

  schedule(): StepPlan {
    const plan: StepPlan = { prefills: [], decodes: [], preempted: [], rejected: [], copies: [] };
    // 1. Running sequences: one new slot each, preempting from the back when the pool is full.
    for (let i = 0; i < this.running.length; i++) {
      const seq = this.running[i]!;
      let fits = this.blocks.canAppendSlots(seq.id, 1);
      while (!fits) {
        const victim = this.running.pop()!;
        this.preempt(victim, plan);
        if (victim === seq) break;
        fits = this.blocks.canAppendSlots(seq.id, 1);
      }
      if (!fits) break;
      plan.copies.push(...this.blocks.appendSlots(seq.id, [seq.lastToken]));
      plan.decodes.push(seq);
    }
    if (plan.preempted.length > 0) {
      // Resume order is arrival order: preempted sequences go back to the front of the queue.
      this.waiting.unshift(...plan.preempted.sort((a, b) => a.arrival - b.arrival));
      return plan;
    }
    // 2. Admit waiting sequences, FCFS, within the step's token budget.
    let tokens = plan.decodes.length;
    while (this.waiting.length > 0 && this.running.length < this.limits.maxNumSeqs) {
      const seq = this.waiting[0]!;
      const status = this.blocks.canAllocate(seq);
      if (status === 'never') {
        this.waiting.shift();
        seq.status = 'finished';
        plan.rejected.push(seq);
        continue;
      }
      if (status === 'later') break;
      // Its forks (OpenAI's n) join the batch at its prefill: they count against max_num_seqs now
      // (a group wider than the limit still runs, alone, rather than never).
      const rows = 1 + (seq.forks?.length ?? 0);
      if (this.running.length + rows > this.limits.maxNumSeqs && this.running.length > 0) break;
      const need = seq.length;
      // A prompt longer than the budget still runs, alone, rather than never.
      if (tokens + need > this.limits.maxNumBatchedTokens && tokens > 0) break;
      this.waiting.shift();
      seq.numComputed = this.blocks.allocate(seq);
      seq.status = 'running';
      this.running.push(seq);
      plan.prefills.push(seq);
      tokens += need - seq.numComputed;
    }
    return plan;
  }

  private preempt(seq: Sequence, plan: StepPlan): void {
    this.blocks.free(seq.id);
    seq.numComputed = 0;
    seq.preemptions++;
    seq.status = 'waiting';
    plan.preempted.push(seq);
  }
}

