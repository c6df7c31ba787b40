/**
 * A grounded prompt in a model's own chat format: the ranked chunks go into a system message ahead of
 * the conversation ([1] title: text, as the plain RAG prompt numbers them), as many as the token budget
 * holds (rank order; a chunk that does not fit gives way to a smaller one further down). Used by the
 * chat route's `rag` field and by /query for decoders that bring a chat template (an instruct model
 * answers from a system message of context; the plain `Question: ... Answer:` prompt is for the small
 * self-trained decoder, which has no template). The system message opens with the template's
 * instruction (prompt.ts: GROUNDED_SYSTEM by default): on the first 30 tuning questions it took
 * Qwen2.5-Coder-0.5B-Instruct from 20 to 17 wrong of 30 (asking it to cite [n] as well made it copy
 * the numbered passages instead: 22 wrong). Then the template's worked example (GROUNDED_EXAMPLE), as a
 * user and an assistant turn ahead of the conversation: it shows the answer's shape, the fact first.
 */
import type { ChatMessage, ChatTemplate } from './chat-template.js';
import type { AssembledPrompt, ContextChunk, PromptTemplate } from './prompt.js';

/**
 * `between`: awaited between two encodings (the server gives the event loop a turn there: each is a
 * whole prompt through the tokenizer, several milliseconds of the main thread for a long context).
 * Most often every chunk fits: that is tried first, in one encoding; the chunk-by-chunk search that
 * follows only where they do not (before, it always ran: 1 + k encodings of ever longer prompts).
 */
export async function chatContextPrompt(chat: ChatTemplate, t: PromptTemplate, messages: readonly ChatMessage[],
  chunks: readonly ContextChunk[], budget: number, between: () => Promise<void> = async () => {}): Promise<AssembledPrompt> {
  const shot: ChatMessage[] = t.example ? [{ role: 'user', content: t.example.question }, { role: 'assistant', content: t.example.answer }] : [];
  // Replacement functions: a chunk's own text may hold `$&` and the like.
  const withContext = (ks: readonly number[]) => {
    const context = (t.system ? `${t.system}\n\n` : '') + t.head + ks.map((k, i) => t.marker.replace('{i}', () => String(i + 1)) +
      t.body.replace('{title}', () => chunks[k]!.title).replace('{text}', () => chunks[k]!.text)).join('');
    return chat.encode([{ role: 'system', content: context.trimEnd() }, ...shot, ...messages]);
  };
  if (chunks.length > 0) {
    const all = chunks.map((_, k) => k);
    const ids = withContext(all);
    if (ids.length <= budget) return { ids, included: all, truncated: [] };
    await between();
  }
  const included: number[] = [];
  let ids = chat.encode(messages);
  for (let c = 0; c < chunks.length; c++) {
    await between();
    const tried = withContext([...included, c]);
    if (tried.length <= budget) {
      included.push(c);
      ids = tried;
    }
  }
  return { ids, included, truncated: [] };
}
