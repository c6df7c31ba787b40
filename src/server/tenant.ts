/**
 * The tenant a request speaks for, decided by its key (auth.ts): the collections it may read and write,
 * its limits, and the salt that keeps its prefix-cache blocks its own.
 *
 * A named collection the key may not use is 403 for a search, a chat's retrieval, a listing and a
 * write; a document read or delete in one is the same 404 as a missing document, so that a key cannot
 * learn which ids exist elsewhere. A request that names no collection gets the key's default (its first).
 * The search itself runs inside the one collection decided here (retrieval-store.ts SearchFilter), so
 * no other tenant's chunk reaches a prompt, a citation or a stream.
 *
 * A key may be held to a list of LoRA adapters (`adapters` in the keys file): naming another one (/query's
 * `adapter`, an OpenAI `model`) is 403 adapter_forbidden, decided before the adapter's files are looked at,
 * so that a key learns nothing of the adapters outside its list; /v1/models lists only its own.
 */
import type { Response } from 'express';
import type { TenantKey } from '../config/keys-file.js';
import { DEFAULT_COLLECTION } from '../retrieval/retrieval-store.js';
import { HttpError } from './errors.js';

export interface Tenant {
  /** The key's name (logs, metrics); never the key. */
  name: string;
  collections: readonly string[] | '*';
  admin: boolean;
  ratePerMinute: number | undefined;
  tokensPerMinute: number | undefined;
  /** The LoRA adapters it may generate with; '*' = every one. */
  adapters: readonly string[] | '*';
  /**
   * Mixed into the prefix cache's block hashes (prefix-hash.ts): blocks cached for one tenant are never
   * found by another's identical prompt (vLLM's cache_salt). Undefined for the keys that see everything
   * (no key configured, RAGGUARD_API_KEY, RAGGUARD_ADMIN_KEY): one operator, one shared cache.
   */
  cacheSalt: string | undefined;
}

/** Every route open (no key configured), or an open route. */
export const OPEN_TENANT: Tenant = Object.freeze({
  name: 'open', collections: '*', admin: true, ratePerMinute: undefined, tokensPerMinute: undefined, adapters: '*', cacheSalt: undefined,
});

/** RAGGUARD_API_KEY ('api') or RAGGUARD_ADMIN_KEY ('admin'): every collection, no limits. */
export const operatorTenant = (name: string, admin: boolean): Tenant =>
  Object.freeze({ name, collections: '*', admin, ratePerMinute: undefined, tokensPerMinute: undefined, adapters: '*', cacheSalt: undefined });

export const keyTenant = (k: TenantKey, admin: boolean): Tenant => Object.freeze({
  name: k.name, collections: k.collections, admin, ratePerMinute: k.ratePerMinute, tokensPerMinute: k.tokensPerMinute,
  adapters: k.adapters ?? '*',
  // The name is unique in the file; the prefix keeps it apart from any other use of a salt.
  cacheSalt: `key:${k.name}`,
});

export function setTenant(res: Response, t: Tenant): void {
  res.locals['tenant'] = t;
}

/** The tenant authenticate() found for this request (the open one where none ran). */
export function tenantOf(res: Response): Tenant {
  return (res.locals['tenant'] as Tenant | undefined) ?? OPEN_TENANT;
}

export function mayUse(t: Tenant, collection: string): boolean {
  return t.collections === '*' || t.collections.includes(collection);
}

/**
 * The collection a request works in: the one it names, when the key may use it (403 otherwise), or the
 * key's default. `param` names the field at fault in the 403.
 */
export function collectionFor(t: Tenant, named: string | undefined, param = 'collection'): string {
  if (named === undefined) return t.collections === '*' ? DEFAULT_COLLECTION : t.collections[0]!;
  if (!mayUse(t, named)) {
    throw new HttpError(403, 'collection_forbidden', `the key '${t.name}' may not use the collection '${named}'`, { collection: named, param });
  }
  return named;
}

export function mayUseAdapter(t: Tenant, adapter: string): boolean {
  return t.adapters === '*' || t.adapters.includes(adapter);
}

/** 403 adapter_forbidden unless the key may generate with `adapter`; `param` names the field at fault. */
export function checkAdapter(t: Tenant, adapter: string, param = 'adapter'): void {
  if (!mayUseAdapter(t, adapter)) {
    throw new HttpError(403, 'adapter_forbidden', `the key '${t.name}' may not use the adapter '${adapter}'`, { adapter, param });
  }
}
