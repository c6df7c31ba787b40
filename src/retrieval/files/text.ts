/**
 * Bytes of a text file (plain text, Markdown, HTML) to a string: the charset its content type names,
 * else UTF-8 (a BOM is dropped). Decoding is strict: bytes that are not valid in that charset, or NUL
 * bytes (a binary file under a text name), make the file unreadable rather than silently mangled.
 */
import { TextDecoder } from 'node:util';
import { UnreadableFileError, UnsupportedFileError } from './parsed-file.js';

export function decodeText(bytes: Uint8Array, filename: string, charset = 'utf-8'): string {
  let decoder: TextDecoder;
  try {
    decoder = new TextDecoder(charset, { fatal: true, ignoreBOM: false });
  } catch {
    throw new UnsupportedFileError(filename, `unknown charset '${charset}'`);
  }
  if (bytes.includes(0)) throw new UnreadableFileError(filename, 'binary content (NUL bytes) in a text file');
  try {
    return decoder.decode(bytes);
  } catch {
    throw new UnreadableFileError(filename, `not valid ${decoder.encoding.toUpperCase()} text`);
  }
}
