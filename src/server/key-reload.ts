/**
 * RAGGUARD_KEYS_FILE read again while the server runs: on SIGHUP, and when the file changes (its
 * directory watched, so that an editor's rename-over and a Kubernetes Secret's symlink swap are seen as
 * well as a write in place). The new keys replace `cfg.keys` whole; authentication reads it at every
 * request (auth.ts), so the next request is judged by the new file: a key added works, a key removed is
 * 401, a changed scope or limit holds from then on. A file that no longer reads or parses keeps the keys
 * in force, and the log says why; a reload that changes nothing is not logged.
 */
import { watch, type FSWatcher } from 'node:fs';
import path from 'node:path';
import { readKeysFile, type TenantKey } from '../config/keys-file.js';

export interface ReloadableKeys {
  keysFile: string;
  keys: TenantKey[];
}

export interface KeyReloader {
  /** Reads the file now; whether the keys changed. Throws (keeping the keys) where the file is bad. */
  reload(): boolean;
  close(): void;
}

const reloaders = new WeakMap<ReloadableKeys, KeyReloader>();

/** A comparable form of the keys (what authentication depends on). */
const fingerprint = (keys: readonly TenantKey[]) => JSON.stringify(keys);

/**
 * Reloads `cfg.keys` from `cfg.keysFile` on SIGHUP and on changes of the file (`watch: false`: on SIGHUP
 * only); once per configuration, however many apps are made over it. `log` says what a reload did. No
 * keys file: nothing to watch.
 */
export function reloadKeysOnChange(cfg: ReloadableKeys, log: (message: string, error?: boolean) => void = (m, e) => (e ? console.error : console.log)(`[keys] ${m}`),
  opts: { watch?: boolean } = {}): KeyReloader | undefined {
  if (cfg.keysFile === '') return undefined;
  const existing = reloaders.get(cfg);
  if (existing) return existing;
  const reload = (): boolean => {
    const keys = readKeysFile(cfg.keysFile);
    if (fingerprint(keys) === fingerprint(cfg.keys)) return false;
    cfg.keys = keys;
    log(`reloaded ${cfg.keysFile}: ${keys.length} key${keys.length === 1 ? '' : 's'} (${keys.map((k) => k.name).join(', ')})`);
    return true;
  };
  const quietly = (why: string) => {
    try {
      reload();
    } catch (e) {
      log(`${why}: kept the keys in force: ${(e as Error).message}`, true);
    }
  };
  const onHup = () => quietly('SIGHUP');
  process.on('SIGHUP', onHup);
  // Changes come in bursts (a write is truncate + write; a rename-over is two events): read once they settle.
  let timer: NodeJS.Timeout | undefined;
  let watcher: FSWatcher | undefined;
  if (opts.watch !== false) try {
    const base = path.basename(cfg.keysFile);
    watcher = watch(path.dirname(cfg.keysFile), { persistent: false }, (_event, name) => {
      // A Secret volume swaps its ..data link, not the file's name: any change of the directory is looked at.
      if (name !== null && name !== base && !name.startsWith('..')) return;
      clearTimeout(timer);
      timer = setTimeout(() => quietly('the keys file changed'), 100);
      timer.unref();
    });
    watcher.on('error', () => undefined);
  } catch (e) {
    log(`cannot watch ${cfg.keysFile} (${(e as Error).message}): it is read again on SIGHUP only`, true);
  }
  const r: KeyReloader = {
    reload,
    close() {
      process.off('SIGHUP', onHup);
      clearTimeout(timer);
      watcher?.close();
      reloaders.delete(cfg);
    },
  };
  reloaders.set(cfg, r);
  return r;
}
