/**
 * Retrieved-looking contexts for the RAG-shaped requests of bench/llama-server.ts: the sample corpus
 * (data/corpus/*.txt: a title line, then paragraphs separated by blank lines) cut into chunks of whole
 * paragraphs (a paragraph longer than a chunk is cut at whitespace), and a picker that hands out each
 * chunk at most once, so that no two contexts it builds share a chunk (no context is sent twice, and no
 * server's prefix cache can serve one from another). Deterministic: the same seed gives the same contexts.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { seededRandom } from '../src/generate/sampler.js';

export interface Chunk {
  doc: string;
  text: string;
  /** Tokens of `text` (filled by the caller's tokenizer; 0 until then). */
  tokens: number;
}

/** Each document's paragraphs packed into chunks of at most `maxChars` characters. */
export function corpusChunks(dir: string, maxChars = 900): Chunk[] {
  const out: Chunk[] = [];
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.txt')).sort()) {
    const doc = file.slice(0, -4);
    const paras = readFileSync(path.join(dir, file), 'utf8').split(/\n\s*\n/).slice(1).map((p) => p.trim()).filter((p) => p.length > 0);
    const pieces: string[] = [];
    for (let p of paras) {
      while (p.length > maxChars) {
        const cut = p.lastIndexOf(' ', maxChars);
        const at = cut > maxChars / 2 ? cut : maxChars;
        pieces.push(p.slice(0, at).trim());
        p = p.slice(at).trim();
      }
      if (p.length > 0) pieces.push(p);
    }
    let cur = '';
    for (const p of pieces) {
      if (cur.length > 0 && cur.length + 2 + p.length > maxChars) {
        out.push({ doc, text: cur, tokens: 0 });
        cur = '';
      }
      cur = cur.length > 0 ? `${cur}\n\n${p}` : p;
    }
    if (cur.length > 0) out.push({ doc, text: cur, tokens: 0 });
  }
  return out;
}

/** A small seeded generator (mulberry32), uniform in [0, 1): the sampler's. */
export const rng = seededRandom;

/** Hands out chunks, each at most once: the asked document's first, then the others in a seeded order. */
export class ContextPicker {
  private readonly order: Chunk[];
  private readonly used = new Set<Chunk>();

  constructor(chunks: readonly Chunk[], seed = 1) {
    const r = rng(seed);
    this.order = [...chunks];
    for (let i = this.order.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [this.order[i], this.order[j]] = [this.order[j]!, this.order[i]!];
    }
  }

  get left(): number {
    return this.order.length - this.used.size;
  }

  /**
   * Unused chunks totalling at least `minTokens` and at most `maxTokens` tokens (a chunk that would pass
   * `maxTokens` is passed over), those of `doc` first (as a retriever would rank the question's own
   * document first). Throws when the unused chunks cannot make `minTokens`.
   */
  take(minTokens: number, maxTokens: number, doc?: string): Chunk[] {
    const picked: Chunk[] = [];
    let tokens = 0;
    const candidates = doc === undefined ? this.order : [...this.order.filter((c) => c.doc === doc), ...this.order.filter((c) => c.doc !== doc)];
    for (const c of candidates) {
      if (tokens >= minTokens) break;
      if (this.used.has(c) || tokens + c.tokens > maxTokens) continue;
      picked.push(c);
      tokens += c.tokens;
    }
    if (tokens < minTokens) throw new Error(`the corpus has too few unused chunks for another context of ${minTokens} tokens (${this.left} left)`);
    for (const c of picked) this.used.add(c);
    return picked;
  }
}

/** Nearest-rank percentile (p in [0, 100]) of xs; NaN when empty. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

/** The chat messages of one RAG-shaped request: numbered sources, then the question. */
export function ragMessages(chunks: readonly Chunk[], question: string): { role: 'system' | 'user'; content: string }[] {
  const sources = chunks.map((c, i) => `[${i + 1}] (${c.doc})\n${c.text}`).join('\n\n');
  return [
    { role: 'system', content: 'Answer the question using only the numbered sources below. Cite the sources you use as [n].' },
    { role: 'user', content: `Sources:\n\n${sources}\n\nQuestion: ${question}` },
  ];
}
