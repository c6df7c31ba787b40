/**
 * One thread of the tokenizer pool (tokenizer-pool.ts): loads a model directory's tokenizer, then encodes
 * what it is sent (texts with special tokens, or pairs with token types), answering with flat Int32Arrays
 * (transferred, not copied).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { TextTokenizer } from './tokenizer.js';

export type PoolWork = { texts: string[] } | { pairs: [string, string][] };
export type PoolRequest = PoolWork & { id: number };
export type PoolReply = { id: number; flat: Int32Array; types?: Int32Array; offsets: Int32Array } | { id: number; error: string } | { ready: true } | { failed: string };

const port = parentPort!;

/** Rows as one flat array and their offsets (rows + 1 of them). */
function pack(rows: readonly (readonly number[])[]): { flat: Int32Array; offsets: Int32Array } {
  const offsets = new Int32Array(rows.length + 1);
  for (let i = 0; i < rows.length; i++) offsets[i + 1] = offsets[i]! + rows[i]!.length;
  const flat = new Int32Array(offsets[rows.length]!);
  rows.forEach((r, i) => flat.set(r, offsets[i]!));
  return { flat, offsets };
}

try {
  const tok = await TextTokenizer.load((workerData as { dir: string }).dir);
  port.on('message', (m: PoolRequest) => {
    try {
      let reply: PoolReply;
      if ('texts' in m) {
        reply = { id: m.id, ...pack(m.texts.map((t) => tok.encode(t, true))) };
      } else {
        const enc = m.pairs.map(([a, b]) => tok.encodePair(a, b));
        const ids = pack(enc.map((e) => e.ids));
        reply = { id: m.id, ...ids, types: pack(enc.map((e) => e.typeIds)).flat };
      }
      const transfer = [reply.flat.buffer, reply.offsets.buffer, ...(reply.types ? [reply.types.buffer] : [])] as ArrayBuffer[];
      port.postMessage(reply, transfer);
    } catch (e) {
      port.postMessage({ id: m.id, error: (e as Error).message } satisfies PoolReply);
    }
  });
  port.postMessage({ ready: true } satisfies PoolReply);
} catch (e) {
  port.postMessage({ failed: (e as Error).message } satisfies PoolReply);
}
