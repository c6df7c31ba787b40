/**
 * The API keys file (RAGGUARD_KEYS_FILE): one entry per key, each scoped to collections and with its own
 * limits. A JSON array:
 *
 *   [{"name": "acme", "key_sha256": "<64 hex>", "collections": ["acme", "shared"], "rate_per_minute": 60,
 *     "tokens_per_minute": 20000},
 *    {"name": "ops", "key": "<the key itself>", "collections": "*", "admin": true}]
 *
 * `key` or `key_sha256` (the hex SHA-256 of the key, so the file need not hold the secret); `collections`
 * a list (the first is the key's default) or "*" (every collection; its default is 'default'); the limits
 * per minute are optional (absent: none); `adapters` optional, the LoRA adapters (names under
 * RAGGUARD_ADAPTER_DIR) the key may generate with, a list ([] = the base decoder only) or "*" (absent: every
 * one); `admin` keys may write documents (in their collections) and read /debug/* and /metrics. Parsed and checked here, at start-up: a bad entry stops the start naming it.
 * Read again on SIGHUP or when the file changes (server/key-reload.ts, readKeysFile below): a bad file
 * then keeps the keys in force and says why.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';

/** A collection name (as schemas.ts takes them); kept here too so that config stays below the server. */
const COLLECTION = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const HEX64 = /^[0-9a-f]{64}$/i;
/** An adapter's name (as generate/adapters.ts takes them). */
const ADAPTER = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const FIELDS = new Set(['name', 'key', 'key_sha256', 'collections', 'rate_per_minute', 'tokens_per_minute', 'admin', 'adapters']);

export interface TenantKey {
  /** Names the key in logs and metrics (never the key itself), and its tenant's prefix-cache salt. */
  name: string;
  /** Hex SHA-256 of the key. */
  sha256: string;
  /** The collections it may read and write, the first its default; '*' = every one. */
  collections: readonly string[] | '*';
  /** Requests per minute; undefined = no limit. */
  ratePerMinute: number | undefined;
  /** Prompt plus generated tokens per minute; undefined = no limit. */
  tokensPerMinute: number | undefined;
  admin: boolean;
  /** The LoRA adapters it may generate with; '*' or undefined (the field absent) = every one, [] = none. */
  adapters?: readonly string[] | '*';
}

function limit(v: unknown, field: string): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 1e9) throw new Error(`${field} must be an integer in [1, 1e9]`);
  return v;
}

function entry(e: unknown, at: string, sha256: (key: string) => string): TenantKey {
  if (typeof e !== 'object' || e === null || Array.isArray(e)) throw new Error(`${at}: expected an object`);
  const o = e as Record<string, unknown>;
  const name = o['name'];
  if (typeof name !== 'string' || !NAME.test(name)) throw new Error(`${at}: name must match ${NAME.source}`);
  const where = `${at} ('${name}')`;
  try {
    const unknown = Object.keys(o).filter((k) => !FIELDS.has(k));
    if (unknown.length) throw new Error(`unknown field${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}`);
    const key = o['key'];
    const hashed = o['key_sha256'];
    if ((key === undefined) === (hashed === undefined)) throw new Error('needs exactly one of key and key_sha256');
    if (key !== undefined && (typeof key !== 'string' || key.length < 8 || /\s/.test(key))) throw new Error('key must have at least 8 characters and no whitespace');
    if (hashed !== undefined && (typeof hashed !== 'string' || !HEX64.test(hashed))) throw new Error('key_sha256 must be 64 hex digits');
    const c = o['collections'];
    let collections: readonly string[] | '*';
    if (c === '*') collections = '*';
    else if (Array.isArray(c) && c.length > 0 && c.every((x) => typeof x === 'string' && COLLECTION.test(x))) collections = [...new Set(c as string[])];
    else throw new Error(`collections must be "*" or a non-empty list of names matching ${COLLECTION.source}`);
    const admin = o['admin'] ?? false;
    if (typeof admin !== 'boolean') throw new Error('admin must be true or false');
    const a = o['adapters'];
    let adapters: readonly string[] | '*' | undefined;
    if (a === undefined || a === '*') adapters = a;
    else if (Array.isArray(a) && a.every((x) => typeof x === 'string' && ADAPTER.test(x))) adapters = [...new Set(a as string[])];
    else throw new Error(`adapters must be "*" or a list (possibly empty) of names matching ${ADAPTER.source}`);
    return {
      name, sha256: typeof key === 'string' ? sha256(key) : (hashed as string).toLowerCase(), collections,
      ratePerMinute: limit(o['rate_per_minute'], 'rate_per_minute'), tokensPerMinute: limit(o['tokens_per_minute'], 'tokens_per_minute'), admin,
      ...(adapters === undefined ? {} : { adapters }),
    };
  } catch (err) {
    throw new Error(`${where}: ${(err as Error).message}`);
  }
}

/** The keys of a keys file's text; throws naming the first bad entry, or a name or key given twice. */
export function parseKeysFile(text: string, sha256: (key: string) => string): TenantKey[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON: ${(e as Error).message}`);
  }
  if (!Array.isArray(doc)) throw new Error('expected a JSON array of keys');
  const keys = doc.map((e, i) => entry(e, `entry ${i}`, sha256));
  const names = new Set<string>();
  const hashes = new Map<string, string>();
  keys.forEach((k, i) => {
    if (names.has(k.name)) throw new Error(`entry ${i} ('${k.name}'): the name is given twice`);
    names.add(k.name);
    const other = hashes.get(k.sha256);
    if (other !== undefined) throw new Error(`entry ${i} ('${k.name}'): the same key as '${other}'`);
    hashes.set(k.sha256, k.name);
  });
  return keys;
}

/** The keys of the keys file at `file` (read and parsed now); throws naming the file and what is wrong. */
export function readKeysFile(file: string): TenantKey[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new Error(`cannot read ${file}: ${(e as Error).message}`);
  }
  try {
    return parseKeysFile(text, (k) => createHash('sha256').update(k).digest('hex'));
  } catch (e) {
    throw new Error(`${file}: ${(e as Error).message}`);
  }
}
