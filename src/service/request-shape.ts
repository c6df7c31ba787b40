/**
 * Shape limits checked before any model runs: a query whose own tokens cannot fit the decoder's
 * prompt (next to the answer it asks for) can never be served, so it is refused at once (TooLargeError).
 */
import type { QueryInput, RagService } from './rag.js';
import { TooLargeError } from '../runtime/errors.js';

export function checkQueryShape(q: QueryInput, service: RagService): void {
  const { cfg } = service;
  const { decoder } = service.models;
  const tokens = decoder.tokenizer.encode(q.query).length;
  if (tokens > cfg.maxQueryTokens) {
    throw new TooLargeError('query_too_long', `query has ${tokens} tokens; the limit is ${cfg.maxQueryTokens} (RAGGUARD_MAX_QUERY_TOKENS)`,
      { query_tokens: tokens, limit: cfg.maxQueryTokens });
  }
  const positions = decoder.shape.maxPositions;
  if (q.maxNewTokens + tokens + 16 > positions) {
    throw new TooLargeError('context_too_long', `max_new_tokens ${q.maxNewTokens} plus the query exceed the decoder's ${positions} positions`);
  }
}
