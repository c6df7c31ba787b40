/**
 * Content hashes of full KV blocks, for the prefix cache.
 *
 * A block's KV depends on every token before it, not only its own, so its hash chains the previous
 * block's hash with its token ids; and on the LoRA adapter, which changes K and V projections, so the
 * adapter name is part of the hash too. SHA-256 rather than a fast non-cryptographic hash: a collision
 * would silently hand one request another's KV, and prompts are chosen by clients, who could search for
 * collisions of a 64-bit hash. At one hash per block_size tokens the cost is small (1 to 2
 * microseconds per block).
 *
 * A tenant's salt (vLLM's cache_salt) goes into the first block's hash only: every later block chains
 * from it, so the whole prefix is the tenant's own. Without a salt the encoding is the one it always was.
 */
import { hash } from 'node:crypto';

/** Hex SHA-256 digest: a Map key, and the parent of the next block's hash. */
export type BlockHash = string;

/** Marks "no adapter" apart from every adapter name, the empty one included. */
const NO_ADAPTER = 0xffffffff;

/**
 * Hash of one full block over one buffer: a flag (0: first block, 1: a parent follows, 2: first block
 * with a salt), then the parent's 32-byte digest or the salt's byte length and bytes, the adapter
 * name's byte length (NO_ADAPTER when none) and the name, then the token ids as little-endian uint32.
 * Lengths before variable fields keep the encoding unambiguous. One-shot crypto.hash: about twice as
 * fast as a streaming Hash at this size.
 */
export function hashBlock(parent: BlockHash | undefined, tokens: ArrayLike<number>, adapter?: string, salt?: string): BlockHash {
  const adapterBytes = adapter === undefined ? 0 : Buffer.byteLength(adapter, 'utf8');
  const salted = parent === undefined && salt !== undefined;
  const saltBytes = salted ? Buffer.byteLength(salt, 'utf8') : 0;
  const buf = Buffer.allocUnsafe(1 + 32 + 4 + saltBytes + 4 + adapterBytes + 4 * tokens.length);
  let o = 0;
  buf[o++] = parent !== undefined ? 1 : salted ? 2 : 0;
  if (parent !== undefined) o += buf.write(parent, o, 'hex');
  if (salted) {
    o = buf.writeUInt32LE(saltBytes, o);
    o += buf.write(salt, o, 'utf8');
  }
  o = buf.writeUInt32LE(adapter === undefined ? NO_ADAPTER : adapterBytes, o);
  if (adapter !== undefined) o += buf.write(adapter, o, 'utf8');
  // writeUInt32LE throws on an id outside uint32 rather than wrapping it into another id's bytes.
  for (let i = 0; i < tokens.length; i++) o = buf.writeUInt32LE(tokens[i]!, o);
  return hash('sha256', buf.subarray(0, o), 'hex');
}
