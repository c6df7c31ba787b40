/**
 * The deployment files (deploy/): the Helm chart rendered by a real `helm template` and every object checked by a
 * real kubeconform -strict against Kubernetes' own schemas (scripts/fetch-k8s-tools.sh builds both tools, pinned,
 * from the Go module proxy into ~/.cache/ragguard/k8s-tools, once a machine, and makes the schemas from the
 * Kubernetes OpenAPI document; the first build takes minutes). The chart's variants (router on or off, HPA on or off, a chart-made Secret, the CUDA
 * settings) are each validated; the router's haproxy.cfg is checked by the HAProxy that setup installs; the
 * chart is tied to the code (its env names are settings of src/config/config.ts, its HPA metric a gauge of
 * src/server/metrics.ts, its probes the open health routes). The Dockerfiles cannot be built here (no container
 * registry is reachable for their base images): what can be checked without building them is, i.e. that the
 * runtime stage installs what the native addons built by setup load, and that the command is `npm start`'s.
 *
 * The tools failing to build fails this file; only a Go module proxy that cannot be reached skips it.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { VARIABLES } from '../src/config/config.js';
import { ROOT } from './helpers.js';

const CHART = path.join(ROOT, 'deploy', 'helm', 'ragguard');
const tools: Record<string, string> = {};
let unavailable = '';
const work = mkdtempSync(path.join(tmpdir(), 'ragguard-deploy-'));
after(() => rmSync(work, { recursive: true, force: true }));

function sh(cmd: string, args: string[], input?: string): { status: number; stdout: string; stderr: string } {
  const r = spawnSync(cmd, args, { cwd: ROOT, input, encoding: 'utf8', maxBuffer: 1 << 26, timeout: 300_000 });
  if (r.error) throw r.error;
  return { status: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

/** helm template with --set pairs; fails the test on a rendering error. */
function render(sets: string[] = []): string {
  const r = sh(tools.HELM!, ['template', 'rg', CHART, '--namespace', 'rag', '--kube-version', tools.KUBERNETES_VERSION!, ...sets.flatMap((s) => ['--set', s])]);
  assert.equal(r.status, 0, `helm template ${sets.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

/** kubeconform -strict on rendered manifests: every object must have a schema and pass it. */
function kubeconform(manifests: string): { status: number; out: string; summary: any } {
  const r = sh(tools.KUBECONFORM!, [
    '-strict', '-summary', '-output', 'json',
    '-schema-location', `${tools.SCHEMAS}/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json`,
    '-kubernetes-version', 'master', '-',
  ], manifests);
  let summary: any = {};
  try {
    summary = JSON.parse(r.stdout).summary ?? {};
  } catch {
    // reported below through out
  }
  return { status: r.status, out: r.stdout + r.stderr, summary };
}

function objects(manifests: string): any[] {
  return parseAllDocuments(manifests).map((d) => d.toJS()).filter((o) => o && typeof o === 'object');
}

const kinds = (objs: any[]) => objs.map((o) => `${o.kind}/${o.metadata.name}`).sort();

before(() => {
  const r = spawnSync('bash', ['scripts/fetch-k8s-tools.sh'], { cwd: ROOT, encoding: 'utf8', timeout: 40 * 60_000 });
  if (r.error) throw r.error;
  if (r.status === 3) {
    unavailable = `the Go module proxy cannot be reached, helm and kubeconform cannot be built: ${r.stderr.trim().split('\n').slice(-1)[0]}`;
    return;
  }
  assert.equal(r.status, 0, `scripts/fetch-k8s-tools.sh failed (exit ${r.status}):\n${r.stderr.slice(-4000)}`);
  for (const line of r.stdout.trim().split('\n')) {
    const [k, v] = line.split('=');
    if (k && v) tools[k] = v;
  }
  for (const k of ['HELM', 'KUBECONFORM', 'SCHEMAS']) assert.ok(tools[k] && existsSync(tools[k]!), `${k} missing: ${r.stdout}`);
  assert.match(tools.KUBERNETES_VERSION ?? '', /^1\.\d+\.\d+$/);
}, { timeout: 45 * 60_000 });

describe('the Helm chart, rendered and validated', () => {
  test('helm lint --strict', (t) => {
    if (unavailable) return t.skip(unavailable);
    const r = sh(tools.HELM!, ['lint', '--strict', CHART]);
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });

  const variants: { name: string; sets: string[]; expect: string[] }[] = [
    {
      name: 'defaults: Deployment, Services, PDB, HPA, HAProxy router',
      sets: [],
      expect: ['ConfigMap/rg-ragguard-router', 'Deployment/rg-ragguard', 'Deployment/rg-ragguard-router',
        'HorizontalPodAutoscaler/rg-ragguard', 'PodDisruptionBudget/rg-ragguard', 'Service/rg-ragguard',
        'Service/rg-ragguard-replicas', 'Service/rg-ragguard-router'],
    },
    {
      name: 'a plain Service, fixed replicas, the chart making the Postgres Secret',
      sets: ['router.enabled=false', 'autoscaling.enabled=false', 'postgres.url=postgres://u:p@db:5432/rag', 'podDisruptionBudget.enabled=false'],
      expect: ['Deployment/rg-ragguard', 'Secret/rg-ragguard-pg', 'Service/rg-ragguard', 'Service/rg-ragguard-replicas'],
    },
    {
      name: 'the CUDA image on GPU nodes, keys from a Secret, a claim for the index',
      sets: ['image.tag=0.1.0-cuda', 'resources.limits.nvidia\\.com/gpu=1', 'extraEnv[0].name=RAGGUARD_DECODER_EP',
        'extraEnv[0].value=cuda', 'nodeSelector.gpu=h100', 'auth.existingSecret=ragguard-keys', 'indexVolume.existingClaim=ragguard-index',
        'postgres.migrate=never', 'postgres.poolSize=20', 'router.hashBalanceFactor=0'],
      expect: ['ConfigMap/rg-ragguard-router', 'Deployment/rg-ragguard', 'Deployment/rg-ragguard-router',
        'HorizontalPodAutoscaler/rg-ragguard', 'PodDisruptionBudget/rg-ragguard', 'Service/rg-ragguard',
        'Service/rg-ragguard-replicas', 'Service/rg-ragguard-router'],
    },
  ];
  for (const v of variants) {
    test(`kubeconform -strict: ${v.name}`, (t) => {
      if (unavailable) return t.skip(unavailable);
      const manifests = render(v.sets);
      const objs = objects(manifests);
      assert.deepEqual(kinds(objs), v.expect.sort());
      const k = kubeconform(manifests);
      assert.equal(k.status, 0, k.out);
      assert.deepEqual(
        { valid: k.summary.valid, invalid: k.summary.invalid, errors: k.summary.errors, skipped: k.summary.skipped },
        { valid: v.expect.length, invalid: 0, errors: 0, skipped: 0 }, k.out);
    });
  }

  test('the schemas are strict: a misspelt field and a wrong type are caught', (t) => {
    if (unavailable) return t.skip(unavailable);
    const good = render();
    const typo = kubeconform(good.replace('readinessProbe:', 'readinesProbe:'));
    assert.notEqual(typo.status, 0, 'a misspelt readinessProbe passed');
    assert.match(typo.out, /readinesProbe/);
    const type = kubeconform(good.replace(/minReplicas: \d+/, 'minReplicas: two'));
    assert.notEqual(type.status, 0, 'a string minReplicas passed');
  });

  test('a missing Postgres Secret is refused at render time', (t) => {
    if (unavailable) return t.skip(unavailable);
    const r = sh(tools.HELM!, ['template', 'rg', CHART, '--kube-version', tools.KUBERNETES_VERSION!, '--set', 'postgres.existingSecret=']);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /postgres\.existingSecret/);
  });

  test('the chart matches the server: probes, settings, the HPA metric, the Postgres Secret', (t) => {
    if (unavailable) return t.skip(unavailable);
    const objs = objects(render(['auth.existingSecret=keys', 'postgres.migrate=never']));
    const dep = objs.find((o) => o.kind === 'Deployment' && o.metadata.name === 'rg-ragguard');
    const c = dep.spec.template.spec.containers[0];
    assert.equal(c.startupProbe.httpGet.path, '/healthz');
    assert.equal(c.livenessProbe.httpGet.path, '/healthz');
    assert.equal(c.readinessProbe.httpGet.path, '/readyz');
    // The probes need no key: they are the open routes of src/server/auth.ts.
    const auth = readFileSync(path.join(ROOT, 'src/server/auth.ts'), 'utf8');
    assert.match(auth, /OPEN = new Set\(\[[^\]]*'\/healthz'[^\]]*'\/readyz'/);
    const store = c.env.find((e: any) => e.name === 'RAGGUARD_STORE');
    assert.deepEqual(store.valueFrom.secretKeyRef, { name: 'ragguard-pg', key: 'url' });
    // Every RAGGUARD_* variable the chart sets is a setting the server knows.
    // From the typed table itself (src/config/variables/), not its source text: a move cannot break it.
    const known = new Set(VARIABLES.map((v) => v.name));
    for (const e of c.env) {
      if (e.name.startsWith('RAGGUARD_') || e.name === 'HOST' || e.name === 'PORT') {
        assert.ok(known.has(e.name), `${e.name} is not a setting of src/config/config.ts`);
      }
    }
    assert.equal(dep.spec.template.spec.securityContext.runAsNonRoot, true);
    assert.ok(dep.spec.template.spec.terminationGracePeriodSeconds * 1000 > 10_000 + 5_000, 'grace period <= preStop + shutdown grace');
    // The HPA: autoscaling/v2, a Pods metric that is one of the server's gauges (renamed ':' -> '_' by the adapter).
    const hpa = objs.find((o) => o.kind === 'HorizontalPodAutoscaler');
    assert.equal(hpa.apiVersion, 'autoscaling/v2');
    const m = hpa.spec.metrics[0];
    assert.equal(m.type, 'Pods');
    const metric = m.pods.metric.name as string;
    assert.match(metric, /^ragguard_/);
    const metrics = readFileSync(path.join(ROOT, 'src/server/metrics.ts'), 'utf8');
    assert.match(metrics, new RegExp(`new Gauge\\(\\{ name: name\\('${metric.slice('ragguard_'.length)}'\\)[^\\n]*labelNames: \\['state'\\]`));
    assert.match(metrics, /this\.labels\('waiting'\)/);
    assert.deepEqual(m.pods.metric.selector.matchLabels, { state: 'waiting' });
    const pdb = objs.find((o) => o.kind === 'PodDisruptionBudget');
    assert.deepEqual(pdb.spec.selector.matchLabels, dep.spec.selector.matchLabels);
  });

  test("the router's haproxy.cfg: accepted by HAProxy, bounded-load consistent hashing on the prefix key", (t) => {
    if (unavailable) return t.skip(unavailable);
    const haproxy = spawnSync('sh', ['-c', 'command -v haproxy'], { encoding: 'utf8' }).stdout.trim();
    assert.ok(haproxy, 'haproxy not found (npm run setup installs it)');
    for (const [sets, factor] of [[[], 150], [['router.hashBalanceFactor=0'], 0]] as const) {
      const cm = objects(render([...sets])).find((o) => o.kind === 'ConfigMap');
      const cfg: string = cm.data['haproxy.cfg'];
      assert.match(cfg, /balance hash var\(txn\.prefix_key\)\n\s+hash-type consistent\n/);
      if (factor) assert.match(cfg, new RegExp(`\\n\\s+hash-balance-factor ${factor}\\n`));
      else assert.doesNotMatch(cfg, /^\s*hash-balance-factor/m);
      assert.match(cfg, /server-template r 1-16 rg-ragguard-replicas\.rag\.svc\.cluster\.local:8080 check resolvers k8s init-addr none/);
      const file = path.join(work, `haproxy-${factor}.cfg`);
      writeFileSync(file, cfg);
      const r = sh(haproxy, ['-c', '-f', file]);
      assert.equal(r.status, 0, `haproxy -c: ${r.stdout}${r.stderr}`);
    }
    // The same router settings as scripts/cluster.sh's on one machine.
    const cluster = readFileSync(path.join(ROOT, 'scripts/cluster.sh'), 'utf8');
    assert.match(cluster, /hash-balance-factor \$HASH_BALANCE_FACTOR/);
    assert.match(cluster, /HASH_BALANCE_FACTOR=150/);
  });
});

describe('the Dockerfiles (not built here: no container registry for their bases)', () => {
  const dockerfiles = ['deploy/Dockerfile', 'deploy/Dockerfile.cuda'];
  // Libraries every Node.js image has (glibc, libstdc++, libgcc).
  const BASE = /^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so/;
  // The Debian 12 package that brings each library the native parts load (libquadmath comes with libgfortran5).
  const PROVIDER: Record<string, string> = {
    'libblas.so.3': 'libblas3', 'liblapack.so.3': 'liblapack3', 'libgomp.so.1': 'libgomp1',
    'libgfortran.so.5': 'libgfortran5', 'libquadmath.so.0': 'libgfortran5',
  };

  /** The packages the last (runtime) stage installs with apt-get. */
  function runtimePackages(text: string): string[] {
    const last = text.slice(text.lastIndexOf('\nFROM '));
    const m = /apt-get install -y -q --no-install-recommends ([^\\&\n]+)/.exec(last);
    assert.ok(m, 'no apt-get install in the runtime stage');
    return m[1]!.trim().split(/\s+/);
  }

  test('the runtime stage installs every library the native addons built by setup load', () => {
    const natives = [
      path.join(ROOT, 'node_modules/faiss-node/build/Release/faiss-node.node'),
      ...readdirSync(path.join(ROOT, 'build/native')).filter((f) => f.endsWith('.so') && !f.includes('cuda') && !f.includes('encoder'))
        .map((f) => path.join(ROOT, 'build/native', f)),
    ];
    assert.ok(existsSync(natives[0]!), 'faiss-node is not built (npm run setup)');
    const needed = new Set<string>();
    for (const f of natives) {
      const r = sh('ldd', [f]);
      assert.equal(r.status, 0, r.stderr);
      for (const line of r.stdout.split('\n')) {
        const so = line.trim().split(/\s+/)[0];
        if (!so || BASE.test(so) || so.startsWith('/')) continue;
        assert.doesNotMatch(line, /not found/, `${f}: ${line}`);
        needed.add(so);
      }
    }
    assert.ok(needed.has('libblas.so.3'), `faiss-node links BLAS: ${[...needed]}`);
    for (const file of dockerfiles) {
      const pkgs = runtimePackages(readFileSync(path.join(ROOT, file), 'utf8'));
      for (const so of needed) {
        assert.ok(PROVIDER[so], `${so} (loaded by a native addon) has no package in this test's list: add it here and to ${file}`);
        assert.ok(pkgs.includes(PROVIDER[so]!), `${file}'s runtime stage lacks ${PROVIDER[so]} (${so})`);
      }
      // And the library really comes from that package on this Debian machine.
      for (const so of needed) {
        const lib = sh('sh', ['-c', `ldconfig -p | awk '$1 == "${so}" && /x86-64|x86_64/ { print $NF; exit }'`]).stdout.trim();
        if (!lib) continue;
        const owner = sh('dpkg', ['-S', realpathSync(lib)]);
        if (owner.status === 0 && so !== 'libquadmath.so.0') assert.match(owner.stdout, new RegExp(`^${PROVIDER[so]}(:|\\s)`), `${so}: ${owner.stdout}`);
      }
    }
  });

  test('non-root, port 8080, HEALTHCHECK on /healthz, and the command is what npm start runs', () => {
    const start = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')).scripts.start as string;
    const argv = start.replace(/^exec /, '').split(/\s+/);
    for (const file of dockerfiles) {
      const text = readFileSync(path.join(ROOT, file), 'utf8');
      assert.match(text, /^USER node$/m, file);
      assert.match(text, /^EXPOSE 8080$/m, file);
      assert.match(text, /^HEALTHCHECK [^\n]*\\\n\s+CMD [^\n]*\/healthz/m, file);
      assert.match(text, /RUN apt-get update -q \\\n(?:[^\n]*\\\n)*? && npm run setup \\/, `${file}: the build runs npm run setup`);
      const cmd = /^CMD (\[.*\])$/m.exec(text);
      assert.ok(cmd, file);
      assert.deepEqual(JSON.parse(cmd[1]!), argv, `${file}'s CMD is not npm start's (${start})`);
    }
  });
});
