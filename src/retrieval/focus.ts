/**
 * Query-focused chunk text for the prompt (RAGGUARD_CONTEXT_SENTENCES): a chunk is cut into sentences and
 * only the `keep` sentences that share the most of the question's content words stay, in their own order.
 * Prefill time grows with prompt tokens, and on a CPU it is most of a /query's latency: three 128-token
 * chunks are most of a ~600-token prompt, while the fact a question asks for sits in one or two of their
 * sentences, most often one that names what the question names.
 *
 * Words are compared lowercased, stop words left out, on their first five letters (a crude stem:
 * "packages" meets "package", "configured" meets "configuration"). A sentence's score is the number of
 * distinct question stems it holds; ties go to the earlier sentence. A chosen sentence ending in ':' keeps
 * the one after it as well. A chunk of `keep` sentences or fewer, or one with no sentence matching at all,
 * is left whole.
 */

const STOP = new Set(('a an the and or of to in on for with by from at as is are was were be been being it its this that these ' +
  'those which what who whom whose when where why how do does did can could should would will shall may might must i you ' +
  'he she we they my your our their me us them one some any all each every other another than then so such not no only ' +
  'into onto about over under after before between through during without within there here if else also just use used ' +
  'using make made get gets give gives name named').split(' '));

const stem = (w: string) => w.slice(0, 5);

/** The question's content stems. */
export function queryStems(query: string): Set<string> {
  return new Set(query.toLowerCase().split(/[^a-z0-9]+/).filter((w) => w.length > 1 && !STOP.has(w)).map(stem));
}

/** Sentences of a chunk: split after . ! or ? followed by white space, and at line breaks ("/etc/x.conf" stays whole). */
export function sentences(text: string): string[] {
  return text.split(/(?<=[.!?])\s+|\n+/).map((s) => s.trim()).filter((s) => s !== '');
}

export function focusText(query: string | ReadonlySet<string>, text: string, keep: number): string {
  const parts = sentences(text);
  if (keep <= 0 || parts.length <= keep) return text;
  const stems = typeof query === 'string' ? queryStems(query) : query;
  const scored = parts.map((s, i) => {
    const seen = new Set<string>();
    for (const w of s.toLowerCase().split(/[^a-z0-9]+/)) if (w.length > 1 && stems.has(stem(w))) seen.add(stem(w));
    return { i, score: seen.size };
  });
  if (scored.every((s) => s.score === 0)) return text;
  const chosen = new Set([...scored].sort((a, b) => b.score - a.score || a.i - b.i).slice(0, keep).map((s) => s.i));
  // A sentence that introduces what follows ("... with the following command:") brings that along: the
  // command, path or list item is most often the fact, and it seldom repeats the question's words.
  for (const i of [...chosen]) if (parts[i]!.endsWith(':') && i + 1 < parts.length) chosen.add(i + 1);
  return parts.filter((_, i) => chosen.has(i)).join('\n');
}
