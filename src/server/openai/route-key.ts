/**
 * POST /v1/route-key: the router's prefix key (service/route-key.ts) for a chat completion's body (its
 * `messages`, rendered through the chat template as /v1/chat/completions renders them) or a completion's
 * (`prompt`). The body is the one the client is about to send; nothing runs on the model. The reply:
 * `{key, header, blocks, tokens, prompt_tokens, block_size}`, and the key in the header
 * `x-ragguard-prefix-key`, which the client sends with the conversation's requests (HAProxy hashes it).
 * A chat's key covers the prompt up to the end of its first user message, so it is the same at every
 * turn: ask once per conversation. `?max_blocks=N` (or RAGGUARD_ROUTE_KEY_BLOCKS) caps it at the first
 * N KV blocks.
 */
import type { RequestHandler } from 'express';
import { HttpError } from '../errors.js';
import { parseBody } from '../schemas.js';
import { schemasFor } from '../validate.js';
import { planChat } from '../structured.js';
import { tenantOf } from '../tenant.js';
import { commonPrefix, ROUTE_KEY_HEADER, routeKey } from '../../service/route-key.js';
import type { OpenAiContext } from './common.js';

function maxBlocksOf(q: unknown, configured: number): number {
  if (typeof q !== 'string') return configured;
  const raw = q;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new HttpError(400, 'invalid_body', `max_blocks must be a non-negative integer, not '${raw}'`, { param: 'max_blocks' });
  return n;
}

export function routeKeyHandler(ctx: OpenAiContext): RequestHandler {
  const { service, chat, outputs, generationModel } = ctx;
  const { cfg } = service;
  return async (req, res) => {
    const maxBlocks = maxBlocksOf(req.query['max_blocks'], cfg.routeKeyBlocks);
    let ids: number[];
    let stableEnd: number;
    let model: string;
    if (req.body && typeof req.body === 'object' && 'messages' in req.body) {
      const b = parseBody(schemasFor(cfg).chatCompletion, req.body);
      model = b.model;
      const plan = await planChat(b, chat, outputs);
      ids = chat.encode(plan.messages, true, plan.extras);
      const firstUser = plan.messages.findIndex((m) => m.role === 'user');
      // Through the first user message, without the generation prompt: where later turns still agree.
      stableEnd = firstUser < 0 ? ids.length : commonPrefix(chat.encode(plan.messages.slice(0, firstUser + 1), false, plan.extras), ids);
    } else {
      const b = parseBody(schemasFor(cfg).completion, req.body);
      model = b.model;
      ids = chat.encodeText(typeof b.prompt === 'string' ? b.prompt : b.prompt[0]!);
      stableEnd = ids.length;
    }
    // As the generation routes decide it: an adapter outside the key's list is 403 here too.
    const tenant = tenantOf(res);
    const adapter = await generationModel(model, tenant);
    const salt = tenant.cacheSalt;
    const k = routeKey(ids, stableEnd, {
      blockSize: cfg.kvBlockSize, maxBlocks, ...(adapter === undefined ? {} : { adapter }), ...(salt === undefined ? {} : { salt }),
    });
    res.set(ROUTE_KEY_HEADER, k.key).json({
      key: k.key, header: ROUTE_KEY_HEADER, blocks: k.blocks, tokens: k.tokens, prompt_tokens: ids.length, block_size: cfg.kvBlockSize,
    });
  };
}
