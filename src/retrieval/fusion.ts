/**
 * Reciprocal-rank fusion (Cormack, Clarke and Buettcher, SIGIR 2009): each ranked list gives an item
 * weight / (k + rank), rank 1-based, and the sums order the fused list. Ranks only, so a cosine and a
 * BM25 score never need a common scale; k (60 in the paper) damps the head of each list.
 */

export interface RankedList<T> {
  items: readonly T[];
  weight: number;
}

export interface Fused<T> {
  item: T;
  score: number;
  /** 1-based rank in each input list, 0 where the item is absent. */
  ranks: number[];
}

/** Fuses lists of items identified by key(item); the first list an item appears in supplies it. */
export function reciprocalRankFusion<T>(lists: readonly RankedList<T>[], key: (item: T) => number | string, k: number): Fused<T>[] {
  const out = new Map<number | string, Fused<T>>();
  lists.forEach((list, li) => {
    list.items.forEach((item, i) => {
      const id = key(item);
      let f = out.get(id);
      if (!f) out.set(id, (f = { item, score: 0, ranks: lists.map(() => 0) }));
      if (f.ranks[li] !== 0) return; // a repeated item counts at its best rank only
      f.ranks[li] = i + 1;
      f.score += list.weight / (k + i + 1);
    });
  });
  // Ties (same score) go to the item with the best rank in an earlier list: deterministic.
  const tieRank = (f: Fused<T>) => f.ranks.map((r) => (r === 0 ? Infinity : r));
  return [...out.values()].sort((a, b) => {
    if (b.score !== a.score) return b.score - a.score;
    const ra = tieRank(a);
    const rb = tieRank(b);
    for (let i = 0; i < ra.length; i++) if (ra[i] !== rb[i]) return ra[i]! - rb[i]!;
    return 0;
  });
}
