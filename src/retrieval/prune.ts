/**
 * Hit pruning and de-duplication before the (expensive) cross-encoder sees them.
 *
 * Prune: a hit far below the best one (best - margin, in cosine) is noise for the reranker.
 * Dedupe: corpora repeat themselves (mirrored pages, boilerplate, re-ingested text); two hits whose
 * word 3-shingle sets overlap at or above the Jaccard threshold are one hit, and the better-scored
 * copy stays. Overlapping neighbours from chunking share far less than that and both stay.
 */
import type { Hit } from './retrieval-store.js';

export function prune(hits: readonly Hit[], margin: number): Hit[] {
  if (hits.length === 0) return [];
  const best = Math.max(...hits.map((h) => h.score));
  return hits.filter((h) => h.score >= best - margin);
}

function shingles(text: string): Set<string> {
  const words = text.toLowerCase().split(/\W+/).filter(Boolean);
  const out = new Set<string>();
  if (words.length < 3) out.add(words.join(' '));
  for (let i = 0; i + 3 <= words.length; i++) out.add(`${words[i]} ${words[i + 1]} ${words[i + 2]}`);
  return out;
}

export function jaccard(a: ReadonlySet<string>, b: ReadonlySet<string>): number {
  let inter = 0;
  for (const x of a) if (b.has(x)) inter++;
  const union = a.size + b.size - inter;
  return union === 0 ? 1 : inter / union;
}

/** Keeps the first (best-scored) of each group of near-identical hits; input order is preserved. */
export function dedupe(hits: readonly Hit[], threshold: number): Hit[] {
  const kept: { hit: Hit; sh: Set<string> }[] = [];
  const sorted = [...hits].sort((a, b) => b.score - a.score);
  for (const hit of sorted) {
    const sh = shingles(hit.chunk.text);
    if (kept.some((k) => k.hit.chunk.id === hit.chunk.id || jaccard(k.sh, sh) >= threshold)) continue;
    kept.push({ hit, sh });
  }
  const keep = new Set(kept.map((k) => k.hit));
  return hits.filter((h) => keep.has(h));
}
