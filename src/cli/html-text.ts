/**
 * HTML to plain text for ingestion: what a reader sees, not markup. Scripts, styles, templates and
 * comments go; block elements become line breaks; entities are decoded. The title is the document's
 * <title>, else its first heading. Not a full HTML parser: enough for documentation pages.
 */

const NAMED: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'", nbsp: ' ', mdash: '\u2014', ndash: '\u2013', hellip: '\u2026', copy: '\u00a9', rsquo: '\u2019', lsquo: '\u2018', rdquo: '\u201d', ldquo: '\u201c' };

export function decodeEntities(s: string): string {
  return s.replace(/&(#x[0-9a-f]+|#\d+|[a-z]+);/gi, (m, e: string) => {
    if (e[0] === '#') {
      const cp = e[1] === 'x' || e[1] === 'X' ? parseInt(e.slice(2), 16) : parseInt(e.slice(1), 10);
      return cp > 0 && cp <= 0x10ffff ? String.fromCodePoint(cp) : m;
    }
    return NAMED[e.toLowerCase()] ?? m;
  });
}

const BLOCK = /<\/?(p|div|br|hr|h[1-6]|li|ul|ol|dl|dt|dd|tr|table|thead|tbody|section|article|header|footer|nav|main|aside|blockquote|pre|figure|figcaption|form|fieldset|address|details|summary)\b[^>]*>/gi;

const inline = (s: string) => decodeEntities(s.replace(/<[^>]*>/g, '')).replace(/\s+/g, ' ').trim();

export function htmlToText(html: string): { title: string | undefined; text: string } {
  const noise = html
    .replace(/<!--[\s\S]*?-->/g, '')
    .replace(/<(script|style|template|noscript|svg)\b[\s\S]*?<\/\1\s*>/gi, '');
  const titleTag = /<title\b[^>]*>([\s\S]*?)<\/title\s*>/i.exec(noise);
  const heading = /<h[1-6]\b[^>]*>([\s\S]*?)<\/h[1-6]\s*>/i.exec(noise);
  const title = [titleTag?.[1], heading?.[1]].map((t) => (t === undefined ? '' : inline(t))).find((t) => t !== '');
  const body = noise.replace(/<head\b[\s\S]*?<\/head\s*>/i, '');
  const text = decodeEntities(body.replace(BLOCK, '\n').replace(/<[^>]*>/g, ''))
    .split('\n')
    .map((l) => l.replace(/[ \t\u00a0]+/g, ' ').trim())
    .join('\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim();
  return { title, text };
}

/** A Markdown document's title: its first ATX (`# Title`) or setext (`Title\n=====`) heading. */
export function markdownTitle(md: string): string | undefined {
  const lines = md.split(/\r?\n/);
  let fence = false;
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i]!;
    if (/^\s*(```|~~~)/.test(l)) fence = !fence;
    if (fence) continue;
    const atx = /^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(l);
    if (atx && atx[1]) return atx[1];
    if (l.trim() && i + 1 < lines.length && /^ {0,3}(=+|-+)\s*$/.test(lines[i + 1]!)) return l.trim();
  }
  return undefined;
}
