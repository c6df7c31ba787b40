/** A directory of documents as the server ingests it at start-up, and the text the embedder sees for a chunk. */
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';

export interface CorpusDocument {
  docId: string;
  title: string;
  text: string;
}

/** *.txt files of a directory as documents: id = file name, title = first line, text = the rest. */
export async function readCorpus(dir: string): Promise<CorpusDocument[]> {
  const names = (await readdir(dir)).filter((n) => n.endsWith('.txt')).sort();
  return Promise.all(
    names.map(async (n) => {
      const raw = await readFile(path.join(dir, n), 'utf8');
      const nl = raw.indexOf('\n');
      const title = (nl < 0 ? raw : raw.slice(0, nl)).trim();
      return { docId: path.basename(n, '.txt'), title, text: nl < 0 ? '' : raw.slice(nl + 1) };
    }),
  );
}

/** The embedder was trained on "title\nchunk": the title disambiguates short chunks. */
export function embeddingText(title: string, chunk: string): string {
  return `${title}\n${chunk}`;
}
