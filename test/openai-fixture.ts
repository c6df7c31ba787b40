/**
 * A real server on loopback for the OpenAI-compatible route tests: the service on the test models over a
 * small slice of the corpus, its app listening on a free port, and the official `openai` client pointed at it.
 * Call it from `before` and register `close` with `after` in the test file itself (an `after` registered
 * inside a `before` hook runs as soon as that hook ends).
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import type { Config } from '../src/config/config.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

export interface OpenAiFixture {
  cfg: Config;
  service: RagService;
  server: Server;
  /** http://127.0.0.1:<port> */
  base: string;
  client: OpenAI;
  /** POSTs a JSON body to a path of the server. */
  post: (path: string, body: unknown, signal?: AbortSignal) => Promise<Response>;
  close: () => Promise<void>;
}

export async function openaiFixture(docs: string[], env: Record<string, string> = {}): Promise<OpenAiFixture> {
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, docs), ...env });
  const service = await RagService.start(cfg, await loadModels(cfg));
  const server = createApp(service).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    cfg,
    service,
    server,
    base,
    client: new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 }),
    post: (path, body, signal) =>
      fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), ...(signal ? { signal } : {}) }),
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
      await service.close();
    },
  };
}
