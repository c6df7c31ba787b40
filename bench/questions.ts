/** data/questions.json: parsed and checked (bench:rag, bench:retrieval's fields, and the test of the file itself). */
export type Split = 'tune' | 'heldout';

export interface Question {
  id: string;
  question: string;
  doc_id: string;
  /** The short gold answer. */
  answer: string;
  /** Accepted variants of the gold fact (any one in a generated answer makes it correct). */
  accept: string[];
  /** tune: seen while tuning (models, retrieval settings); heldout: reported, never tuned on. */
  split: Split;
}

export function parseQuestions(raw: unknown): Question[] {
  if (!Array.isArray(raw)) throw new Error('questions.json: expected an array');
  return raw.map((q: unknown, i) => {
    const o = (q ?? {}) as Record<string, unknown>;
    for (const key of ['id', 'question', 'doc_id', 'answer'] as const) {
      if (typeof o[key] !== 'string' || o[key] === '') throw new Error(`questions.json[${i}]: '${key}' must be a non-empty string`);
    }
    const accept = o['accept'];
    if (!Array.isArray(accept) || accept.length === 0 || !accept.every((a) => typeof a === 'string' && a.trim() !== '')) {
      throw new Error(`questions.json[${i}]: 'accept' must be a non-empty array of strings`);
    }
    if (o['split'] !== 'tune' && o['split'] !== 'heldout') throw new Error(`questions.json[${i}]: 'split' must be 'tune' or 'heldout'`);
    return {
      id: o['id'] as string, question: o['question'] as string, doc_id: o['doc_id'] as string, answer: o['answer'] as string,
      accept: accept as string[], split: o['split'],
    };
  });
}
