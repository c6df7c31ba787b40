/**
 * Markdown to sections: each ATX or setext heading starts one, under its heading path. marked's lexer
 * (maintained, pure JS, CommonMark/GFM) finds the headings, so that '#' lines inside code fences or
 * HTML blocks are not taken for them; the text kept is the Markdown source itself (what the embedder
 * and the reader of a citation see). YAML front matter (the `yaml` package: maintained, YAML 1.2) gives
 * the title and metadata and is left out of the text; a block that is not valid YAML stays text.
 */
import { Lexer, type Token } from 'marked';
import { parse as parseYaml } from 'yaml';
import type { Section } from '../chunker.js';
import { enterHeading, putMeta, sectionLocator, type ParsedFile } from './parsed-file.js';

const FRONT = /^---[ \t]*\r?\n([\s\S]*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|$)/;

function frontMatter(md: string): { data: Record<string, unknown>; body: string } | undefined {
  const m = FRONT.exec(md);
  if (!m) return undefined;
  try {
    const data: unknown = parseYaml(m[1]!);
    if (data === null || typeof data !== 'object' || Array.isArray(data)) return undefined;
    return { data: data as Record<string, unknown>, body: md.slice(m[0].length) };
  } catch {
    return undefined;
  }
}

/** A heading's words without their inline markup (emphasis, links, code). */
function plain(tokens: readonly Token[] | undefined, fallback: string): string {
  if (!tokens || tokens.length === 0) return fallback;
  return tokens.map((t) => ('tokens' in t && t.tokens ? plain(t.tokens, '') : 'text' in t ? String(t.text) : '')).join('');
}

export function parseMarkdownText(source: string): Omit<ParsedFile, 'kind'> {
  const fm = frontMatter(source);
  const metadata: Record<string, string> = {};
  let title: string | undefined;
  if (fm) {
    for (const [k, v] of Object.entries(fm.data)) {
      if (k.toLowerCase() === 'title' && typeof v === 'string' && v.trim() !== '') title = v.trim();
      else if (v === null || ['string', 'number', 'boolean'].includes(typeof v) || v instanceof Date) putMeta(metadata, k, v);
      else if (Array.isArray(v) && v.every((x) => ['string', 'number', 'boolean'].includes(typeof x))) putMeta(metadata, k, v);
    }
  }
  const sections: Section[] = [];
  const path: { level: number; text: string }[] = [];
  let text = '';
  let body = false; // anything but headings since the last section began
  const flush = () => {
    // A heading with nothing under it but the next heading goes into the next section, not a chunk of its own.
    if (!body) return;
    const t = text.trim();
    if (t !== '') sections.push({ locator: sectionLocator(path.map((h) => h.text)), text: t });
    text = '';
    body = false;
  };
  for (const tok of new Lexer({ gfm: true }).lex(fm ? fm.body : source)) {
    if (tok.type === 'heading') {
      flush();
      const h = plain((tok as { tokens?: Token[] }).tokens, String(tok['text'])).replace(/\s+/g, ' ').trim();
      if (h !== '') {
        enterHeading(path, Number(tok['depth']), h);
        title ??= h;
      }
    }
    else if (tok.type !== 'space') body = true;
    text += tok.raw;
  }
  body ||= text.trim() !== '';
  flush();
  return { title, metadata, sections };
}
