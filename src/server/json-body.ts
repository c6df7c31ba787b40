/**
 * Request bodies as JSON (express.json), with one check body-parser leaves out: a body read as UTF-8
 * must be UTF-8. body-parser decodes malformed bytes to U+FFFD and parses on, so a query or a document
 * whose bytes were not what the client meant was served with its text silently changed; here it gets
 * 400 invalid_json naming the first bad byte's offset instead. Every JSON route reads its body
 * through this parser (app.ts for all of them, document-intake.ts for the document routes' larger limit);
 * the front door never reads a body (front-door.ts), so a query it lets in is read here too.
 */
import { isUtf8 } from 'node:buffer';
import express, { type RequestHandler } from 'express';

/** body-parser's verify error for a body that is not UTF-8 (errors.ts turns it into 400 invalid_json). */
export class InvalidUtf8Error extends Error {
  readonly status = 400;
  readonly type = 'entity.utf8.invalid';
  constructor(readonly offset: number) {
    super(`request body is not valid UTF-8: the bytes at offset ${offset} are not a UTF-8 character`);
    this.name = 'InvalidUtf8Error';
  }
}

/** The JSON body parser, at most `limit` bytes, refusing a UTF-8 body whose bytes are not UTF-8. */
export function jsonBody(limit: number): RequestHandler {
  return express.json({
    limit,
    verify: (_req, _res, buf, encoding) => {
      if (encoding !== 'utf-8' && encoding !== 'utf8') return; // a body in UTF-16 or UTF-32 (as its charset says) is decoded as such
      if (isUtf8(buf)) return;
      throw new InvalidUtf8Error(invalidUtf8Offset(buf));
    },
  });
}

/**
 * Where `b` stops being UTF-8: the offset at which its first malformed sequence starts (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF, no sequence cut short), or -1 where it is UTF-8.
 */
export function invalidUtf8Offset(b: Uint8Array): number {
  let i = 0;
  while (i < b.length) {
    const c = b[i]!;
    if (c < 0x80) {
      i++;
      continue;
    }
    let n: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c === 0xe0) lo = 0xa0; // overlong
      if (c === 0xed) hi = 0x9f; // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c === 0xf0) lo = 0x90; // overlong
      if (c === 0xf4) hi = 0x8f; // past U+10FFFF
    } else return i;
    for (let k = 1; k <= n; k++) {
      const d = b[i + k];
      if (d === undefined || d < (k === 1 ? lo : 0x80) || d > (k === 1 ? hi : 0xbf)) return i;
    }
    i += n + 1;
  }
  return -1;
}
