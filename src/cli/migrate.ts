/**
 * `ragguard migrate`: the Postgres store's schema (RAGGUARD_STORE, or --store) brought to this build's
 * version by the library's `migrateStore` (library/migrate.ts says how), and what it applied printed.
 * --status only prints the database's version and this build's (`storeSchema`). --grant ROLE then gives
 * ROLE what a server needs and no more.
 */
import { parseArgs } from 'node:util';
import { InvalidRequestError, migrateStore, storeSchema } from '../index.js';

export class MigrateUsageError extends Error {}

export async function migrateCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args, allowPositionals: true,
    options: { store: { type: 'string' }, dimension: { type: 'string' }, json: { type: 'boolean' }, status: { type: 'boolean' }, grant: { type: 'string' } },
  });
  if (positionals.length > 0) throw new MigrateUsageError('migrate takes no arguments besides its options');
  const opts = { env: process.env, ...(values.store === undefined ? {} : { store: values.store }), ...(values.dimension === undefined ? {} : { dimension: values.dimension }) };
  try {
    if (values.status) {
      const { store, version, latest } = await storeSchema(opts);
      process.stdout.write(values.json
        ? `${JSON.stringify({ store, version, latest })}\n`
        : `${store}: schema version ${version}, this build's ${latest}${version < latest ? ' (ragguard migrate brings it forward)' : ''}\n`);
      return 0;
    }
    const r = await migrateStore({ ...opts, ...(values.grant === undefined ? {} : { grant: values.grant }) });
    if (values.json) {
      process.stdout.write(`${JSON.stringify(r)}\n`);
    } else if (r.applied.length === 0) {
      process.stdout.write(`${r.store}: schema at version ${r.to}, nothing to do\n`);
    } else {
      process.stdout.write(`${r.store}: schema migrated from version ${r.from} to ${r.to}:\n${r.applied.map((a) => `  ${a}`).join('\n')}\n`);
    }
    if (!values.json && r.indexed.length > 0) {
      process.stdout.write(`${r.store}: built the HNSW index of ${r.indexed.length} collection(s): ${r.indexed.join(', ')}\n`);
    }
    return 0;
  } catch (e) {
    // A store that is not Postgres, or a --dimension out of range or not the database's, is a usage error (exit 2), as a bad option is.
    if (e instanceof InvalidRequestError) throw new MigrateUsageError(e.message);
    throw e;
  }
}
