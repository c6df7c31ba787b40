/**
 * What each caller of the operator's routes may see of other tenants (auth.ts decides who may call them):
 *
 *   GET /healthz        the store's document and chunk counts only for an admin key (every collection's
 *                       for one that keeps every collection, its collections' for a scoped one); an
 *                       anonymous prober, or a key without admin, gets liveness without them;
 *   GET /metrics        an admin key scoped to collections gets the per-key series (`key` label) only of
 *                       its own keys: those whose collections are all its own (itself included); the
 *                       server's own figures (queue, KV, memory, latencies) stay, they are no tenant's;
 *   GET /debug/memory   a scoped admin key gets its collections' documents and chunks in `tenant`, and
 *                       none of the store-wide figures (the index's bytes, the documents' predicted
 *                       bytes and the leak checks that subtract them, the adapters loaded for other
 *                       requests).
 * Keys that keep every collection (RAGGUARD_ADMIN_KEY, admin keys with "*", or no key configured) see all.
 */
import type { TenantKey } from '../config/keys-file.js';
import type { RagService } from '../service/rag.js';
import type { MemorySnapshot } from './debug-memory.js';
import type { Tenant } from './tenant.js';

const seesAll = (t: Tenant) => t.collections === '*';

/** The names of the keys whose per-key series `t` may read: every one for a key of every collection, else its own keys'. */
export function visibleKeyNames(t: Tenant, keys: readonly TenantKey[]): ReadonlySet<string> | '*' {
  if (seesAll(t)) return '*';
  const mine = t.collections as readonly string[];
  const names = new Set([t.name]);
  for (const k of keys) if (k.collections !== '*' && k.collections.every((c) => mine.includes(c))) names.add(k.name);
  return names;
}

const KEY_LABEL = /[{,]key="((?:[^"\\]|\\.)*)"/;

/** Prometheus text less the per-key samples of keys `visible` does not name. */
export function scopedMetrics(text: string, visible: ReadonlySet<string> | '*'): string {
  if (visible === '*') return text;
  return text.split('\n').filter((line) => {
    if (line.startsWith('#')) return true;
    const m = KEY_LABEL.exec(line);
    return !m || visible.has(m[1]!.replace(/\\(.)/g, '$1'));
  }).join('\n');
}

/** /healthz's counts for this caller: the whole store's, its collections' summed, or none. */
export async function healthCounts(service: RagService, caller: Tenant | undefined): Promise<Record<string, unknown>> {
  if (!caller?.admin) return {};
  const read = seesAll(caller)
    ? service.store.counts()
    : Promise.all((caller.collections as readonly string[]).map((c) => service.store.counts(c)))
      .then((cs) => cs.reduce((a, c) => ({ documents: a.documents + c.documents, chunks: a.chunks + c.chunks }), { documents: 0, chunks: 0 }));
  // A store that does not answer (Postgres down) is said, not a failed probe: the process itself is alive.
  return read.then((c) => ({ documents: c.documents, chunks: c.chunks }), (e: Error) => ({ documents: null, chunks: null, store_error: e.message }));
}

/** /debug/memory for a caller: as it is for a key of every collection; for a scoped one, its collections' figures and not the store's. */
export async function scopedMemory(snapshot: MemorySnapshot, service: RagService, t: Tenant): Promise<MemorySnapshot | Record<string, unknown>> {
  if (seesAll(t)) return snapshot;
  const collections = await Promise.all((t.collections as readonly string[]).map(async (collection) => {
    const c = await service.store.counts(collection);
    return { collection, documents: c.documents, chunks: c.chunks };
  }));
  const { faiss_index_bytes: _f, store_predicted_bytes: _p, expected_growth_bytes: _e, ...native } = snapshot.native;
  const { loaded: _l, ...adapters } = snapshot.adapters;
  // The leak checks subtract the store's predicted growth: the operator's, like the store's bytes.
  const { trend: _t, growth: _g, ...rest } = snapshot;
  const components = snapshot.components.filter((c) => c.name !== 'faiss_index');
  return {
    ...rest,
    tenant: { key: t.name, collections },
    components,
    components_total_bytes: components.reduce((s, c) => s + c.bytes, 0),
    native,
    adapters,
  };
}
