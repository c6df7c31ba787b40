/**
 * Per-key limits, in memory, per process: requests per minute and tokens (prompt plus generated) per
 * minute, each a token bucket that holds a minute's allowance and refills continuously.
 *
 * A request takes one from its key's request bucket, or is refused (429 rate_limited) with Retry-After
 * the seconds until one is back. Tokens are known only once a generation has run, so a generation is let
 * in while its key's token bucket is above zero and its usage is taken afterwards (the bucket may go
 * below zero: that debt is paid by waiting); while the bucket is empty, generations are refused (429
 * token_limit) with Retry-After the seconds until it is above zero again. Behind several replicas each
 * process keeps its own buckets: a key's allowance is per replica.
 */
import type { NextFunction, Request, Response } from 'express';
import { routeClass } from './auth.js';
import { HttpError } from './errors.js';
import { tenantOf, type Tenant } from './tenant.js';

/** A bucket of `capacity` that refills `capacity` per minute; `now` in milliseconds. */
export class TokenBucket {
  private level: number;
  private at: number;

  constructor(readonly capacity: number, now: number) {
    this.level = capacity;
    this.at = now;
  }

  private refill(now: number): void {
    if (now > this.at) this.level = Math.min(this.capacity, this.level + ((now - this.at) * this.capacity) / 60_000);
    this.at = Math.max(this.at, now);
  }

  /** The level now (may be negative: a debt). */
  available(now: number): number {
    this.refill(now);
    return this.level;
  }

  /** Takes `n` when the level holds it; false (nothing taken) otherwise. */
  tryTake(n: number, now: number): boolean {
    this.refill(now);
    if (this.level < n) return false;
    this.level -= n;
    return true;
  }

  /** Takes `n` whatever the level (the bucket may go below zero). */
  charge(n: number, now: number): void {
    this.refill(now);
    this.level -= n;
  }

  /** Whole seconds (at least 1) until the level reaches `n`. */
  secondsUntil(n: number, now: number): number {
    const missing = n - this.available(now);
    return Math.max(1, Math.ceil((missing * 60) / this.capacity));
  }
}

export type LimitCode = 'rate_limited' | 'token_limit';

export interface LimitEvents {
  /** A request let in, and tokens charged, by key name. */
  request?(key: string): void;
  tokens?(key: string, n: number): void;
  limited?(key: string, code: LimitCode): void;
}

export class KeyLimits {
  private readonly requests = new Map<string, TokenBucket>();
  private readonly tokens = new Map<string, TokenBucket>();

  constructor(private readonly events: LimitEvents = {}, private readonly clock: () => number = Date.now) {}

  private bucket(map: Map<string, TokenBucket>, name: string, capacity: number): TokenBucket {
    let b = map.get(name);
    if (!b || b.capacity !== capacity) map.set(name, (b = new TokenBucket(capacity, this.clock())));
    return b;
  }

  /** Counts a request of the tenant's key; the 429 when its request bucket is empty. */
  admitRequest(t: Tenant): HttpError | undefined {
    if (t.ratePerMinute === undefined) {
      this.events.request?.(t.name);
      return undefined;
    }
    const now = this.clock();
    const b = this.bucket(this.requests, t.name, t.ratePerMinute);
    if (b.tryTake(1, now)) {
      this.events.request?.(t.name);
      return undefined;
    }
    this.events.limited?.(t.name, 'rate_limited');
    const wait = b.secondsUntil(1, now);
    return new HttpError(429, 'rate_limited', `the key '${t.name}' is over its ${t.ratePerMinute} requests per minute: retry in ${wait} s`,
      { retry_after_seconds: wait }, { 'Retry-After': String(wait) });
  }

  /** The 429 for a generation while the key's token bucket is empty; undefined when it may run. */
  admitGeneration(t: Tenant): HttpError | undefined {
    if (t.tokensPerMinute === undefined) return undefined;
    const now = this.clock();
    const b = this.bucket(this.tokens, t.name, t.tokensPerMinute);
    if (b.available(now) > 0) return undefined;
    this.events.limited?.(t.name, 'token_limit');
    // Until the level is above zero: a bucket exactly at zero has nothing to give.
    const wait = b.secondsUntil(Number.MIN_VALUE, now);
    return new HttpError(429, 'token_limit', `the key '${t.name}' has used its ${t.tokensPerMinute} tokens per minute: retry in ${wait} s`,
      { retry_after_seconds: wait }, { 'Retry-After': String(wait) });
  }

  /** Takes a generation's prompt and generated tokens from the key's token bucket. */
  chargeTokens(t: Tenant, n: number): void {
    if (n <= 0) return;
    this.events.tokens?.(t.name, n);
    if (t.tokensPerMinute === undefined) return;
    this.bucket(this.tokens, t.name, t.tokensPerMinute).charge(n, this.clock());
  }
}

/** Refuses requests over their key's request limit; leaves the limits where the generation routes find them. */
export function limitKeys(limits: KeyLimits) {
  return (req: Request, res: Response, next: NextFunction): void => {
    res.locals['limits'] = limits;
    if (routeClass(req.method, req.path) === 'open') return next();
    next(limits.admitRequest(tenantOf(res)));
  };
}

/** Throws the 429 token_limit when this request's key has no tokens left this minute (before a generation). */
export function checkTokenBudget(res: Response): void {
  const refusal = (res.locals['limits'] as KeyLimits | undefined)?.admitGeneration(tenantOf(res));
  if (refusal) throw refusal;
}

/** Charges a generation's prompt and generated tokens to this request's key. */
export function chargeTokens(res: Response, tokens: number): void {
  (res.locals['limits'] as KeyLimits | undefined)?.chargeTokens(tenantOf(res), tokens);
}
