/**
 * A generation without retrieval, guarded, as one reply or as a stream of chunks: what /v1/completions
 * and a chat without `rag` share.
 */
import type { Response } from 'express';
import type { Generation } from '../../generate/generation.js';
import { generationShape, guardedRun } from '../../service/guarded-run.js';
import { runOptions } from '../guarded.js';
import { SseStream } from '../sse.js';
import type { SamplingParams } from '../../generate/sequence.js';
import type { TokenLogprobs } from '../../generate/logprobs.js';
import { chargeTokens } from '../rate-limits.js';
import { tenantOf } from '../tenant.js';
import { failStream, finishStream, usage, type ClosingShapes, type OpenAiContext, type Usage } from './common.js';

export interface ReplyShapes extends ClosingShapes {
  /** Choice `index`'s next text, and the logprobs of the tokens it completes (where asked). */
  chunk(index: number, text: string, first: boolean, logprobs?: readonly TokenLogprobs[]): object;
  reply(gens: readonly Generation[], u: Usage, guard: Record<string, unknown>): object;
  /** Choice `index`'s chunks for generated text (null: its end) where they are not one content chunk each (tool calls). */
  chunks?(index: number, text: string | null, first: boolean): object[];
}

/**
 * A generation without retrieval, guarded, as one reply or as a stream of chunks: `n` samples of the
 * prompt (engine.generateMany), the prompt counted once in the usage (as OpenAI counts it). The guard
 * predicts n decode rows and the KV of n samples' new tokens besides the one prompt (RequestShape.samples).
 */
export async function generateReply(ctx: OpenAiContext, res: Response, ids: number[], p: SamplingParams, n: number, adapter: string | undefined, stream: boolean,
  includeUsage: boolean, shapes: ReplyShapes): Promise<void> {
  const { service, admission } = ctx;
  const salt = tenantOf(res).cacheSalt;
  const sse = stream ? new SseStream(res) : undefined;
  const opts = runOptions(res, sse);
  const signal = opts.signal;
  const first = new Array<boolean>(n).fill(true);
  // A token's logprobs go out with the chunk that carries its text (some tokens make no text yet).
  const held: TokenLogprobs[][] = Array.from({ length: n }, () => []);
  const send = (index: number, text: string | null) => {
    if (shapes.chunks) {
      for (const c of shapes.chunks(index, text, first[index]!)) {
        sse!.send(c);
        first[index] = false;
      }
      return;
    }
    if (text === null) return;
    const lps = held[index]!.splice(0);
    sse!.send(shapes.chunk(index, text, first[index]!, p.logprobs === undefined ? undefined : lps));
    first[index] = false;
  };
  try {
    const asked = generationShape(ids.length, p.maxNewTokens, n);
    const { result: gens, guard } = await guardedRun(service, admission, {
      shape: () => asked,
      // The prompt is the client's own: a reshape cannot shorten it.
      floor: { promptTokens: ids.length, message: `a prompt of ${ids.length} tokens with ${p.maxNewTokens} new tokens can never fit the memory budget` },
      work: async (shape) => {
        // The adapter loads for this generation (or shares a running one's slot) and is released after.
        const lease = adapter === undefined ? undefined : await service.adapters.acquire(adapter, signal);
        try {
          return await service.engine.generateMany(ids, { ...p, maxNewTokens: shape?.maxNewTokens ?? p.maxNewTokens, adapter: lease?.adapter, ...(salt === undefined ? {} : { cacheSalt: salt }) }, n, {
            signal,
            onToken: sse && ((index, t) => {
              if (t.logprobs) held[index]!.push(t.logprobs);
              if (t.text) send(index, t.text);
            }),
          });
        } finally {
          lease?.release();
        }
      },
      asRun: (g, decided) => ({ ...decided, cachedTokens: g[0]!.cachedTokens ?? 0 }),
    }, opts);
    const u = usage(ids.length, gens.reduce((a, g) => a + g.ids.length, 0));
    chargeTokens(res, u.total_tokens);
    if (!sse) {
      res.json(shapes.reply(gens, u, guard));
      return;
    }
    // An empty answer still announces the role; logprobs of tokens that made no text go out here.
    for (let i = 0; i < n; i++) send(i, null);
    for (let i = 0; i < n; i++) {
      if (!first[i] && held[i]!.length === 0) continue;
      sse.send(shapes.chunk(i, '', first[i]!, p.logprobs === undefined ? undefined : held[i]!.splice(0)));
      first[i] = false;
    }
    finishStream(sse, shapes, gens, u, includeUsage);
  } catch (e) {
    failStream(sse, e);
  } finally {
    sse?.end();
  }
}

