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
import type { QueryInput, RagService } from '../service/rag.js';
import { toHttpError } from './errors.js';
import { decideOrReject, guardReport, runGuarded, workSignal } from './guarded.js';
import { SseStream } from './sse.js';
import { chargeTokens } from './rate-limits.js';

export async function streamQuery(service: RagService, admission: Admission, q: QueryInput, res: Response): Promise<void> {
  const decision = decideOrReject(service, service.requestShape(q));
  const shaped: QueryInput = decision
    ? { ...q, topK: decision.shape.topK, maxNewTokens: decision.shape.maxNewTokens, promptBudget: decision.shape.promptTokens, rerankBatch: decision.shape.rerankBatch }
    : q;
  const sse = new SseStream(res);
  const signal = workSignal(res, sse);
  try {
    const { shape, answer, citations: _c, ...rest } = await runGuarded(service, admission, decision, () => service.query({
      ...shaped,
      hooks: {
        signal,
        onCitations: (citations) => sse.send({ citations }, 'citations'),
        onToken: (t) => {
          if (t.text) sse.send({ text: t.text }, 'token');
        },
      },
    }), { signal, ticket: res.locals['admission'] as { release(): void } | undefined });
    chargeTokens(res, rest.usage.prompt_tokens + rest.usage.completion_tokens);
    sse.send({ answer, ...rest, guard: guardReport(service, decision, shape) }, 'done');
  } catch (e) {
    if (sse.closed) return; // the client is gone: nobody to tell
    if (!sse.started) throw e; // nothing sent yet: an ordinary error reply
    const err = toHttpError(e);
    if (err.status >= 500) console.error('stream failed:', e);
    sse.send(err.body(), 'error');
  } finally {
    sse.end();
  }
}
