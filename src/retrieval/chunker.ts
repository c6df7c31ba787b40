/**
 * Token-based chunking with overlap.
 *
 * The embedder's pre-tokenizer splits on whitespace (and punctuation), so a text's token count is the
 * sum of its words' counts: chunks are windows of whole words holding at most `chunkTokens` tokens,
 * each starting so that it repeats at least `overlapTokens` tokens of the previous one. A chunk's text
 * is the original slice (formatting kept), from its first word to its last.
 */

export interface ChunkSpan {
  /** Character offsets into the source text. */
  start: number;
  end: number;
  text: string;
  tokens: number;
}

export interface ChunkOptions {
  chunkTokens: number;
  overlapTokens: number;
}

interface Word {
  start: number;
  end: number;
  tokens: number;
}

export function chunkText(text: string, countTokens: (word: string) => number, opts: ChunkOptions): ChunkSpan[] {
  if (opts.overlapTokens >= opts.chunkTokens) throw new Error('overlap must be smaller than the chunk size');
  const words: Word[] = [];
  const cache = new Map<string, number>();
  for (const m of text.matchAll(/\S+/g)) {
    const w = m[0];
    let n = cache.get(w);
    if (n === undefined) cache.set(w, (n = countTokens(w)));
    // A single word longer than a chunk still has to go somewhere: it becomes its own chunk.
    words.push({ start: m.index, end: m.index + w.length, tokens: n });
  }
  const chunks: ChunkSpan[] = [];
  let first = 0;
  while (first < words.length) {
    let last = first;
    let tokens = words[first]!.tokens;
    while (last + 1 < words.length && tokens + words[last + 1]!.tokens <= opts.chunkTokens) tokens += words[++last]!.tokens;
    const start = words[first]!.start;
    const end = words[last]!.end;
    chunks.push({ start, end, text: text.slice(start, end), tokens });
    if (last + 1 >= words.length) break;
    // Next chunk starts far enough back to repeat overlapTokens, but always moves forward.
    let next = last + 1;
    let back = 0;
    while (next - 1 > first && back < opts.overlapTokens) back += words[--next]!.tokens;
    first = next;
  }
  return chunks;
}

/** A stretch of a document under one reference: a PDF's page, the text under a heading. */
export interface Section {
  /** "page 3", "section: Install > Linux"; absent where the source has no pages or headings. */
  locator?: string;
  text: string;
}

export type LocatedSpan = ChunkSpan & { locator?: string };

/**
 * Chunks each section on its own, so that no chunk straddles two references and each carries the one
 * it came from (a citation can then say where). Offsets are into the section's text.
 */
export function chunkSections(sections: readonly Section[], countTokens: (word: string) => number, opts: ChunkOptions): LocatedSpan[] {
  return sections.flatMap((s) => chunkText(s.text, countTokens, opts).map((c) => (s.locator === undefined ? c : { ...c, locator: s.locator })));
}
