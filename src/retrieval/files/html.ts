/**
 * HTML (and the HTML mammoth makes of a Word file) to sections of text. htmlparser2 (fb55's, the parser
 * under cheerio: maintained, pure JS, forgiving of real-world markup, entities decoded per the spec)
 * replaces the regular expressions this used to be: comments inside scripts, '>' in attributes and
 * unclosed tags no longer leak markup into the text. What a reader sees is kept: scripts, styles,
 * templates, SVG and the <head> go; block elements become line breaks; each heading (h1-h6) starts a
 * section whose reference is its heading path. The title is <title>, else og:title, else the first
 * heading; <meta> name/property description, author, keywords and <html lang> become metadata.
 */
import { Parser } from 'htmlparser2';
import type { Section } from '../chunker.js';
import { enterHeading, putMeta, sectionLocator, type ParsedFile } from './parsed-file.js';

const HIDDEN = new Set(['script', 'style', 'template', 'noscript', 'svg', 'head', 'iframe', 'object']);
const BLOCK = new Set(['p', 'div', 'br', 'hr', 'li', 'ul', 'ol', 'dl', 'dt', 'dd', 'tr', 'table', 'thead', 'tbody', 'section', 'article',
  'header', 'footer', 'nav', 'main', 'aside', 'blockquote', 'pre', 'figure', 'figcaption', 'form', 'fieldset', 'address', 'details',
  'summary', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'caption', 'td', 'th']);
const META: Record<string, string> = { description: 'description', author: 'author', keywords: 'keywords', 'og:description': 'description', 'article:author': 'author' };

/** Lines with runs of blanks folded, at most one empty line in a row, trimmed. */
export function tidyText(s: string): string {
  return s.split('\n').map((l) => l.replace(/[ \t\u00a0\r\f\v]+/g, ' ').trim()).join('\n').replace(/\n{3,}/g, '\n\n').trim();
}

export function parseHtmlText(html: string): Omit<ParsedFile, 'kind'> {
  const sections: Section[] = [];
  const path: { level: number; text: string }[] = [];
  const metadata: Record<string, string> = {};
  let titleTag: string | undefined;
  let ogTitle: string | undefined;
  let firstHeading: string | undefined;
  let hidden = 0; // depth inside elements whose text no reader sees
  let inTitle = false;
  let titleText = '';
  let heading: { level: number; text: string } | undefined;
  let text = '';
  let body = false; // text other than headings since the last section began
  const flush = () => {
    // A heading with nothing under it but the next heading goes into the next section, not a chunk of its own.
    if (!body) return;
    const t = tidyText(text);
    if (t !== '') sections.push({ locator: sectionLocator(path.map((h) => h.text)), text: t });
    text = '';
    body = false;
  };
  const parser = new Parser({
    onopentag(name, attrs) {
      if (name === 'html' && attrs['lang']) putMeta(metadata, 'language', attrs['lang']);
      if (name === 'meta') {
        const key = (attrs['name'] ?? attrs['property'] ?? '').toLowerCase();
        if (key === 'og:title') ogTitle = attrs['content']?.trim() || ogTitle;
        else if (META[key] && metadata[META[key]] === undefined) putMeta(metadata, META[key], attrs['content']);
      }
      if (name === 'title' && titleTag === undefined) { inTitle = true; titleText = ''; }
      if (HIDDEN.has(name)) { hidden++; return; }
      if (hidden > 0) return;
      const h = /^h([1-6])$/.exec(name);
      if (h) {
        flush();
        heading = { level: Number(h[1]), text: '' };
      }
      if (BLOCK.has(name)) text += '\n';
    },
    ontext(data) {
      if (inTitle) titleText += data;
      if (hidden > 0) return;
      if (heading) heading.text += data;
      else if (data.trim() !== '') body = true;
      text += data;
    },
    onclosetag(name) {
      if (name === 'title' && inTitle) { inTitle = false; titleTag = titleText.replace(/\s+/g, ' ').trim() || undefined; }
      if (HIDDEN.has(name)) { hidden = Math.max(0, hidden - 1); return; }
      if (hidden > 0) return;
      if (heading && name === `h${heading.level}`) {
        const t = heading.text.replace(/\s+/g, ' ').trim();
        if (t !== '') {
          enterHeading(path, heading.level, t);
          firstHeading ??= t;
        }
        heading = undefined;
      }
      // Void elements (br, hr) are closed as they open: one line break, not two.
      if (BLOCK.has(name) && name !== 'br' && name !== 'hr') text += '\n';
    },
  }, { decodeEntities: true, lowerCaseTags: true });
  parser.write(html);
  parser.end();
  body ||= text.trim() !== '';
  flush();
  return { title: titleTag ?? ogTitle ?? firstHeading, metadata, sections };
}
