/**
 * POST /query with `stream: true`: server-sent events, the citations first (as soon as the prompt is
 * assembled), then the answer's text as it is generated, and last the rest of the reply (answer,
 * finish_reason, usage, retrieval, timings, guard). Events:
 *
 *   event: citations   data: {"citations": [...]}
 *   event: token       data: {"text": "..."}            (text made final by each token; never half a character)
 *   event: done        data: {"answer", "finish_reason", "usage", "retrieval", "timings_ms", "guard", "adapter"?, "steered_to_close"?}
 *   event: error       data: {"error": {"code", "message"}}   (a failure after the stream started)
 *
 * The concatenated token texts equal `answer`. A client that closes the stream cancels the request: its
 * sequence is finished at the engine's next step barrier and its KV blocks freed.
 */
import type { Response } from 'express';
import type { Admission } from '../guards/admission.js';
import { guardedQuery } from '../service/guarded-run.js';
import type { QueryInput, RagService } from '../service/rag.js';
import { toHttpError } from './errors.js';
import { runOptions } from './guarded.js';
import { SseStream } from './sse.js';
import { chargeTokens } from './rate-limits.js';

export async function streamQuery(service: RagService, admission: Admission, q: QueryInput, res: Response): Promise<void> {
  const sse = new SseStream(res);
  const opts = runOptions(res, sse);
  try {
    const { result, guard } = await guardedQuery(service, admission, {
      ...q,
      hooks: {
        signal: opts.signal,
        onCitations: (citations) => sse.send({ citations }, 'citations'),
        onToken: (t) => {
          if (t.text) sse.send({ text: t.text }, 'token');
        },
      },
    }, opts);
    const { shape: _s, answer, citations: _c, ...rest } = result;
    chargeTokens(res, rest.usage.prompt_tokens + rest.usage.completion_tokens);
    sse.send({ answer, ...rest, guard }, 'done');
  } catch (e) {
    if (sse.closed) return; // the client is gone: nobody to tell
    if (!sse.started) throw e; // nothing sent yet (the guard's refusal, a full queue): an ordinary error reply
    const err = toHttpError(e);
    if (err.status >= 500) console.error('stream failed:', e);
    sse.send(err.body(), 'error');
  } finally {
    sse.end();
  }
}
