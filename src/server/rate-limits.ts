/**
 * Per-key limits: requests per minute and tokens per minute (prompt plus generated, and the input
 * tokens of embeddings, rerank and score), counted in fixed one-minute windows. The decision is made
 * here; the counts live in a UsageStore (limit-store.ts): this process's memory with the embedded faiss
 * store, the database with the Postgres store, so that N replicas give a key its limit once.
 *
 * A request is counted in its key's window, or refused (429 rate_limited) while the window holds the
 * key's requests per minute, with Retry-After the seconds until the window ends. Tokens are known only
 * once a generation has run, so a generation is let in while its key's window holds fewer tokens than
 * its allowance (as read when its request was counted) and its usage is added afterwards; once the
 * window holds the allowance, generations and embeddings are refused (429 token_limit) until it ends.
 *
 * A cancelled generation (its client gone, a stream closed) is charged what it generated: its sequence
 * leaving the engine unfinished is seen by the engine's observer (metrics.ts), which names the tenant by
 * the prefix-cache salt that is its own (tenant.ts), and its prompt (once prefilled) plus its generated
 * tokens are added. A failed generation is charged alike: the work was done.
 *
 * Keys without limits (RAGGUARD_API_KEY, RAGGUARD_ADMIN_KEY, keys of the file with none) are never
 * counted in the store: their requests cost no round trip to the database.
 */
import type { NextFunction, Request, Response } from 'express';
import type { Sequence } from '../generate/sequence.js';
import type { RagService } from '../service/rag.js';
import { routeClass } from './auth.js';
import { HttpError } from './errors.js';
import { MemoryUsageStore, PostgresUsageStore, type LimitEvents, type UsageStore } from './limit-store.js';
import { metricsFor } from './metrics.js';
import { tenantOf, type Tenant } from './tenant.js';

export type { LimitCode, LimitEvents } from './limit-store.js';

const seconds = (ms: number) => Math.max(1, Math.ceil(ms / 1000));

/** What a request's count found: the key's tokens in its window then, and when that window ends. */
interface Admitted {
  tokens: number;
  resetMs: number;
}

export class KeyLimits {
  /** Tenants seen, by their prefix-cache salt: who a cancelled sequence's tokens are charged to. */
  private readonly bySalt = new Map<string, Tenant>();
  /** Each key's charges in flight: a request of the key counts after them (this process's order kept). */
  private readonly pending = new Map<string, Promise<void>>();

  constructor(readonly store: UsageStore = new MemoryUsageStore(), private readonly events: LimitEvents = {},
    private readonly log: (m: string) => void = (m) => console.warn(`[rate-limits] ${m}`)) {}

  /**
   * Counts a request of the tenant's key: the 429 rate_limited when its window is full, else what a
   * generation of it checks against (checkGeneration).
   */
  async admitRequest(t: Tenant): Promise<HttpError | Admitted | undefined> {
    if (t.cacheSalt !== undefined) this.bySalt.set(t.cacheSalt, t);
    if (t.ratePerMinute === undefined && t.tokensPerMinute === undefined) {
      this.events.request?.(t.name);
      return undefined;
    }
    await this.pending.get(t.name);
    const w = await this.store.countRequest(t.name, t.ratePerMinute);
    if (w.counted) {
      this.events.request?.(t.name);
      return { tokens: w.tokens ?? 0, resetMs: w.resetMs };
    }
    this.events.limited?.(t.name, 'rate_limited');
    const wait = seconds(w.resetMs);
    return new HttpError(429, 'rate_limited', `the key '${t.name}' is over its ${t.ratePerMinute} requests per minute: retry in ${wait} s`,
      { retry_after_seconds: wait }, { 'Retry-After': String(wait) });
  }

  /** The 429 token_limit for a generation (or embedding, rerank, score) while the key's tokens are used up; undefined when it may run. */
  checkGeneration(t: Tenant, admitted: Admitted | undefined): HttpError | undefined {
    if (t.tokensPerMinute === undefined || admitted === undefined || admitted.tokens < t.tokensPerMinute) return undefined;
    this.events.limited?.(t.name, 'token_limit');
    const wait = seconds(admitted.resetMs);
    return new HttpError(429, 'token_limit', `the key '${t.name}' has used its ${t.tokensPerMinute} tokens per minute: retry in ${wait} s`,
      { retry_after_seconds: wait }, { 'Retry-After': String(wait) });
  }

  /** Adds tokens to the key's window (in the background: a reply never waits on it; the key's next request does). */
  chargeTokens(t: Tenant, n: number): void {
    if (n <= 0) return;
    this.events.tokens?.(t.name, n);
    if (t.tokensPerMinute === undefined) return;
    const before = this.pending.get(t.name) ?? Promise.resolve();
    const done: Promise<void> = before.then(() => this.store.addTokens(t.name, n)).catch((e: Error) => {
      this.log(`could not charge ${n} tokens to the key '${t.name}': ${e.message}`);
    }).finally(() => {
      if (this.pending.get(t.name) === done) this.pending.delete(t.name);
    });
    this.pending.set(t.name, done);
  }

  /** The key's charges in flight, settled (tests). */
  async settled(name: string): Promise<void> {
    while (this.pending.has(name)) await this.pending.get(name);
  }

  /**
   * A sequence left the engine: one that did not finish (cancelled, failed) is charged to its tenant
   * what it computed, its prompt once prefilled and its generated tokens; a finished one is charged by
   * its route, with the usage it replies.
   */
  sequenceEnded(seq: Sequence, failed: boolean): void {
    if (!failed) return;
    const salt = seq.cacheSalt;
    const t = salt === undefined ? undefined : this.bySalt.get(salt);
    if (!t) return;
    const prompt = seq.numComputed > 0 || seq.outputIds.length > 0 ? seq.promptIds.length : 0;
    this.chargeTokens(t, prompt + seq.outputIds.length);
  }
}

const perService = new WeakMap<RagService, KeyLimits>();

/** How a service's limits are made (tests): `clock` the milliseconds the memory store's windows are cut by (Date.now). */
export interface LimitsOptions {
  clock?: () => number;
}

/**
 * One set of limits per service (every app over it counts into it), counting in the Postgres store's
 * database when the service's store is Postgres, else in this process. The engine's observer
 * (metrics.ts) tells it of sequences that ended unfinished. `opts` apply where the limits are made, at
 * the service's first call (createApp's): a test gives its clock before it makes the app; options given
 * once the limits exist are an error, not ignored. The Postgres store counts by the database's clock.
 */
export function limitsFor(service: RagService, opts?: LimitsOptions): KeyLimits {
  let l = perService.get(service);
  if (l) {
    if (opts) throw new Error('limitsFor: the service\'s limits are made already; give their options before createApp');
    return l;
  }
  const { cfg } = service;
  const store: UsageStore = service.store.kind === 'postgres'
    ? new PostgresUsageStore(cfg.store, { connectTimeoutMs: cfg.pgConnectTimeoutMs, statementTimeoutMs: cfg.pgStatementTimeoutMs })
    : new MemoryUsageStore(opts?.clock);
  const metrics = metricsFor(service);
  l = new KeyLimits(store, metrics.keyEvents);
  metrics.onSequenceEnded = (seq, failed) => l!.sequenceEnded(seq, failed);
  perService.set(service, l);
  return l;
}

/** Refuses requests over their key's request limit; leaves the limits where the generation routes find them. */
export function limitKeys(limits: KeyLimits) {
  return (req: Request, res: Response, next: NextFunction): void => {
    res.locals['limits'] = limits;
    if (routeClass(req.method, req.path) === 'open') return next();
    limits.admitRequest(tenantOf(res)).then((r) => {
      if (r instanceof HttpError) return next(r);
      res.locals['limitWindow'] = r;
      next();
    }, next);
  };
}

/** Throws the 429 token_limit when this request's key has no tokens left this minute (before a generation, an embedding, a rerank). */
export function checkTokenBudget(res: Response): void {
  const limits = res.locals['limits'] as KeyLimits | undefined;
  const refusal = limits?.checkGeneration(tenantOf(res), res.locals['limitWindow'] as Admitted | undefined);
  if (refusal) throw refusal;
}

/** Charges a generation's prompt and generated tokens (or an embedding's, a rerank's input tokens) to this request's key. */
export function chargeTokens(res: Response, tokens: number): void {
  (res.locals['limits'] as KeyLimits | undefined)?.chargeTokens(tenantOf(res), tokens);
}
