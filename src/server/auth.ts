/**
 * Who may call what, and from which web origins.
 *
 * Three classes of route:
 *   open    health and readiness (GET /healthz, /readyz): a load balancer probes them without a key
 *           (/healthz gives the store's counts only to an admin key: healthCaller below);
 *           and the memory page's shell (GET /debug/memory.html), which holds no data;
 *   admin   document writes (POST, PUT, DELETE under /documents), GET /metrics and everything under
 *           /debug/ (a collection-scoped admin key sees its own figures there: tenant-views.ts);
 *   api     everything else.
 * With RAGGUARD_API_KEY set, api routes need `Authorization: Bearer <key>` (the admin key also
 * passes). With RAGGUARD_ADMIN_KEY set, admin routes need the admin key: the API key there is 403
 * (known, not allowed); without an admin key they take the API key. RAGGUARD_KEYS_FILE adds keys
 * scoped to collections, each with its limits (tenant.ts); its `admin` keys open admin routes too.
 * None set: all open (the default host is loopback). A missing or unknown key is 401 with
 * `WWW-Authenticate: Bearer`. The keys file's keys are read from `cfg.keys` as it is at each request:
 * a reload (key-reload.ts: SIGHUP, or the file changing) replaces it and the next request sees it.
 *
 * CORS is off (no CORS headers at all, so browsers keep other origins out) unless
 * RAGGUARD_CORS_ORIGINS names origins (or `*`). A preflight is answered before authentication:
 * browsers send it without credentials.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';
import type { TenantKey } from '../config/keys-file.js';
import { HttpError } from './errors.js';
import { keyTenant, OPEN_TENANT, operatorTenant, setTenant, type Tenant } from './tenant.js';

export type RouteClass = 'open' | 'admin' | 'api';

export interface AuthConfig {
  apiKey: string;
  adminKey: string;
  /** Keys of RAGGUARD_KEYS_FILE, scoped to collections (config/keys-file.ts). */
  keys?: readonly TenantKey[];
  /** Allowed origins; ['*'] = any; [] = CORS off. */
  corsOrigins: readonly string[];
}

const OPEN = new Set(['/healthz', '/readyz', '/health', '/ready']);
const WRITES = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

export function routeClass(method: string, path: string): RouteClass {
  if ((method === 'GET' || method === 'HEAD') && OPEN.has(path)) return 'open';
  // The memory page's shell holds no data (it fetches /debug/memory with the key in its URL's
  // fragment): a browser cannot send a bearer key when it navigates.
  if ((method === 'GET' || method === 'HEAD') && path === '/debug/memory.html') return 'open';
  if (path === '/debug' || path.startsWith('/debug/')) return 'admin';
  // Every key's name and usage, the server's load and memory: an operator's, not a tenant's.
  if (path === '/metrics') return 'admin';
  if ((path === '/documents' || path.startsWith('/documents/')) && WRITES.has(method)) return 'admin';
  return 'api';
}

const digest = (s: string): Buffer => createHash('sha256').update(s).digest();

/** The key in an Authorization header: undefined without one, '' when it is not a bearer key. */
function bearer(h: string | undefined): string | undefined {
  if (h === undefined) return undefined;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  return m ? m[1] : '';
}

const unauthorized = (code: string, message: string) => new HttpError(401, code, message, {}, { 'WWW-Authenticate': 'Bearer realm="ragguard"' });

interface KnownKey {
  digest: Buffer;
  tenant: Tenant;
}

/** Every configured key with the tenant it speaks for: RAGGUARD_API_KEY and RAGGUARD_ADMIN_KEY keep every collection. */
function knownKeys(cfg: AuthConfig): KnownKey[] {
  const keys: KnownKey[] = [];
  const file = cfg.keys ?? [];
  // Without any admin key, admin routes take every key (as they took the API key before keys files).
  const anyAdmin = cfg.adminKey !== '' || file.some((k) => k.admin);
  if (cfg.adminKey) keys.push({ digest: digest(cfg.adminKey), tenant: operatorTenant('admin', true) });
  if (cfg.apiKey) keys.push({ digest: digest(cfg.apiKey), tenant: operatorTenant('api', !anyAdmin) });
  for (const k of file) keys.push({ digest: Buffer.from(k.sha256, 'hex'), tenant: keyTenant(k, k.admin || !anyAdmin) });
  return keys;
}

/**
 * Who is calling `method path` with the Authorization header given: its tenant, or the refusal (401,
 * 403). Pure, for the middleware below and for the front door (front-door.ts). Open routes, and every
 * route when no key is configured, go on as the open tenant (every collection).
 */
export function identifier(cfg: AuthConfig): (method: string, path: string, authorization: string | undefined) => HttpError | Tenant {
  const current = currentKeys(cfg);
  return (method, path, authorization) => {
    const cls = routeClass(method, path);
    const keys = current();
    if (cls === 'open' || keys.length === 0) return OPEN_TENANT;
    const token = bearer(authorization);
    if (token === undefined) return unauthorized('unauthorized', `${method} ${path} needs an API key: send 'Authorization: Bearer <key>'`);
    const found = match(keys, token);
    if (!found) return unauthorized('invalid_api_key', 'the key sent is not a valid key for this server');
    if (cls === 'admin' && !found.admin) {
      return new HttpError(403, 'forbidden', `${method} ${path} needs an admin key (RAGGUARD_ADMIN_KEY, or admin in RAGGUARD_KEYS_FILE); the key '${found.name}' is not one`);
    }
    return found;
  };
}

/** The configured keys as they are now: recomputed when a reload replaced `cfg.keys` (compared by identity, per request). */
function currentKeys(cfg: AuthConfig): () => KnownKey[] {
  let seen = cfg.keys;
  let keys = knownKeys(cfg);
  return () => {
    if (cfg.keys !== seen) {
      seen = cfg.keys;
      keys = knownKeys(cfg);
    }
    return keys;
  };
}

/** The tenant whose key `token` is; every key compared, in constant time each, so that the time taken does not say which one matched. */
function match(keys: readonly KnownKey[], token: string): Tenant | undefined {
  const presented = digest(token);
  let found: Tenant | undefined;
  for (const k of keys) if (timingSafeEqual(presented, k.digest) && found === undefined) found = k.tenant;
  return found;
}

/**
 * Who calls an open route (GET /healthz) with the Authorization header given: the key's tenant, the
 * open tenant where no key is configured (everyone is the operator then), undefined for an anonymous
 * caller or a key that is not one (an open route never refuses).
 */
export function healthCaller(cfg: AuthConfig): (authorization: string | undefined) => Tenant | undefined {
  const current = currentKeys(cfg);
  return (authorization) => {
    const keys = current();
    if (keys.length === 0) return OPEN_TENANT;
    const token = bearer(authorization);
    return token ? match(keys, token) : undefined;
  };
}

/** The refusal (401, 403) of `method path` with the Authorization header given, or undefined when it may go on. */
export function authorizer(cfg: AuthConfig): (method: string, path: string, authorization: string | undefined) => HttpError | undefined {
  const identify = identifier(cfg);
  return (method, path, authorization) => {
    const t = identify(method, path, authorization);
    return t instanceof HttpError ? t : undefined;
  };
}

/** Refuses what the key may not call; puts the caller's tenant in `res.locals.tenant` (tenant.ts reads it). */
export function authenticate(cfg: AuthConfig) {
  const identify = identifier(cfg);
  return (req: Request, res: Response, next: NextFunction): void => {
    const t = identify(req.method, req.path, req.get('authorization'));
    if (t instanceof HttpError) return next(t);
    setTenant(res, t);
    next();
  };
}

/**
 * The CORS headers of a reply to a request from `origin` (Vary: Origin whenever CORS is on, the
 * allow and expose headers when the origin is allowed), set on `res`; whether the origin is allowed.
 */
export function corsHeaders(cfg: AuthConfig): (res: ServerResponse, origin: string | undefined) => boolean {
  const any = cfg.corsOrigins.includes('*');
  const allowed = new Set(cfg.corsOrigins);
  return (res, origin) => {
    if (cfg.corsOrigins.length === 0) return false;
    const vary = res.getHeader('Vary');
    if (vary === undefined) res.setHeader('Vary', 'Origin');
    else if (!/(^|,)\s*(origin|\*)\s*(,|$)/i.test(String(vary))) res.setHeader('Vary', `${String(vary)}, Origin`);
    if (origin === undefined || !(any || allowed.has(origin))) return false;
    res.setHeader('Access-Control-Allow-Origin', any ? '*' : origin);
    res.setHeader('Access-Control-Expose-Headers', 'X-Request-Id, Retry-After');
    return true;
  };
}

export function cors(cfg: AuthConfig) {
  const headers = corsHeaders(cfg);
  return (req: Request, res: Response, next: NextFunction): void => {
    if (!headers(res, req.get('origin'))) return next();
    if (req.method === 'OPTIONS' && req.get('access-control-request-method') !== undefined) {
      res.setHeader('Access-Control-Allow-Methods', 'GET, HEAD, POST, PUT, DELETE, OPTIONS');
      res.setHeader('Access-Control-Allow-Headers', 'Authorization, Content-Type, X-Request-Id, Accept');
      res.setHeader('Access-Control-Max-Age', '600');
      res.status(204).end();
      return;
    }
    next();
  };
}
