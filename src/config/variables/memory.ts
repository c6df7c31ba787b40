/** Memory: the KV cache, the budget and its guards (profile run, headroom, reshape), batching, and the leak checks (config.ts: VARIABLES, in the README's order). */
import { RESHAPE_STEPS, type ReshapeStep } from '../settings.js';
import { int, num, bool, intList, oneOf, type Variable } from './parse.js';

export const MEMORY_VARIABLES: readonly Variable[] = [
  {
    name: 'RAGGUARD_KV_BLOCK_SIZE', default: '16', doc: 'Tokens per KV-cache block.',
    apply: int(1, 1024, (c, v) => (c.kvBlockSize = v)),
  },
  {
    name: 'RAGGUARD_KV_CACHE_BYTES', default: '0',
    doc: 'Bytes of the KV block pool; 0 = RAGGUARD_KV_FRACTION of what the budget leaves after weights and index (capped at what max_num_seqs full-length sequences need).',
    apply: int(0, Number.MAX_SAFE_INTEGER, (c, v) => (c.kvCacheBytes = v)),
  },
  {
    name: 'RAGGUARD_MEMORY_BUDGET', default: '0.5',
    doc: "Memory the server may use: bytes (e.g. '2000000000'), or a fraction in (0, 1] of the GPU's memory (NVML), else of the host's.",
    apply: (c, raw) => {
      const v = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(v) || v <= 0) throw new Error(`expected bytes or a fraction in (0, 1], got '${raw}'`);
      if (v <= 1) c.memoryBudget = { fraction: v };
      else if (Number.isInteger(v) && v >= 1 << 20) c.memoryBudget = { bytes: v };
      else throw new Error(`expected a fraction in (0, 1] or at least 1 MiB as an integer byte count, got '${raw}'`);
    },
  },
  {
    name: 'RAGGUARD_KV_FRACTION', default: '0.5', doc: 'Share of the budget left after weights and index that goes to the KV pool; the rest is run workspace.',
    apply: num(0.01, 0.99, (c, v) => (c.kvFraction = v)),
  },
  {
    name: 'RAGGUARD_GUARDS', default: 'true',
    doc: 'Memory guards: predict each request, reshape, reserve its workspace, 413/503. false admits everything as asked (for measuring what the guards prevent).',
    apply: bool((c, v) => (c.guards = v)),
  },
  {
    name: 'RAGGUARD_PROFILE_RUN', default: 'true',
    doc: 'At start-up, run each model at the largest allowed shapes, measure their peaks and calibrate the memory model (host memory; kept analytic on a GPU).',
    apply: bool((c, v) => (c.profileRun = v)),
  },
  {
    name: 'RAGGUARD_CALIBRATION_CACHE', default: 'true',
    doc: 'Keep the profile run\'s calibration in RAGGUARD_INDEX_DIR/calibration.json, keyed by everything it depends on (the models\' bytes, ragguard\'s code and native libraries, ONNX Runtime\'s version, CPU and GPUs, the settings that shape a run), and restore it at the next start while none of that changed: a restart skips the 30-140 s run. A changed input or a damaged file: the profile runs again (the log says why) and the file is rewritten. false: profile at every start.',
    apply: bool((c, v) => (c.calibrationCache = v)),
  },
  {
    name: 'RAGGUARD_HOST_METER', default: 'accounted',
    doc: 'What the profile run measures of a model run on the host. accounted: the bytes ONNX Runtime allocates, counted by the counting allocator that npm run setup builds (build/native; exact, run after run; resident where it is not built). resident: the process\'s resident high-water mark (VmHWM; includes the allocator\'s own scatter).',
    apply: oneOf(['accounted', 'resident'] as const, (c, v) => (c.hostMeter = v)),
  },
  {
    name: 'RAGGUARD_ALLOCATOR_WARM_BYTES', default: String(256 * 2 ** 20),
    doc: 'Bytes of freed large buffers (2 MiB and up: a batch\'s activations) the counting allocator keeps resident for the next run of the same shapes, instead of giving their pages back and faulting them in again (the reranker at 32 pairs a run: 2.2x the pairs/s). Counted in the budget as the weights are. 0: every freed buffer goes back at once.',
    apply: int(0, Number.MAX_SAFE_INTEGER, (c, v) => (c.allocatorWarmBytes = v)),
  },
  {
    name: 'RAGGUARD_MIN_HEADROOM', default: '0.5',
    doc: 'The guard reserves predicted bytes x (1 + headroom): the headroom is at least this, more where the profile run saw a larger scatter (up to 1). It covers what no prediction sees: allocator fragmentation across concurrent runs, the requests\' own buffers.',
    apply: num(0, 1, (c, v) => (c.minHeadroom = v)),
  },
  {
    name: 'RAGGUARD_RESHAPE_ORDER', default: 'batch,rerank,context,new_tokens',
    doc: 'How a request that can never fit is shrunk, in order: batch (fewer pairs per reranker run: same answer, slower), rerank (fewer reranked candidates), context (shorter prompt), new_tokens.',
    apply: (c, raw) => {
      const steps = raw.split(',').map((x) => x.trim()).filter(Boolean);
      const bad = steps.filter((x) => !(RESHAPE_STEPS as readonly string[]).includes(x));
      if (bad.length || new Set(steps).size !== steps.length) throw new Error(`expected distinct steps of ${RESHAPE_STEPS.join(', ')}, got '${raw}'`);
      c.reshapeOrder = steps as ReshapeStep[];
    },
  },
  {
    name: 'RAGGUARD_MIN_PROMPT_TOKENS', default: '64', doc: 'Shortest prompt a reshape may cut to.',
    apply: int(8, 1 << 20, (c, v) => (c.minPromptTokens = v)),
  },
  {
    name: 'RAGGUARD_MIN_NEW_TOKENS', default: '16', doc: 'Fewest new tokens a reshape may cut to.',
    apply: int(1, 1 << 20, (c, v) => (c.minNewTokens = v)),
  },
  {
    name: 'RAGGUARD_KV_WATERMARK', default: '0.01', doc: 'Fraction of KV blocks kept free when admitting, so that running sequences can grow.',
    apply: num(0, 0.5, (c, v) => (c.kvWatermark = v)),
  },
  {
    name: 'RAGGUARD_BLOCK_TABLE_BUCKETS', default: '4,16,64,256,1024,4096',
    doc: 'Capacities (in blocks) through which a block table grows; past the last it doubles.',
    apply: intList((c, v) => (c.blockTableBuckets = v)),
  },
  {
    name: 'RAGGUARD_PREFIX_CACHING', default: 'true', doc: 'Share full KV blocks across sequences with the same prefix.',
    apply: bool((c, v) => (c.prefixCaching = v)),
  },
  {
    name: 'RAGGUARD_ROUTE_KEY_BLOCKS', default: '0',
    doc: "POST /v1/route-key's cap on the router's prefix key, in KV blocks of the prompt, when the request gives no ?max_blocks: 0 = up to the end of the first user message (docs/deploy-cluster.md).",
    apply: int(0, 1 << 20, (c, v) => (c.routeKeyBlocks = v)),
  },
  {
    name: 'RAGGUARD_MAX_NUM_SEQS', default: '32', doc: 'Sequences decoding together in one batch at most.',
    apply: int(1, 4096, (c, v) => (c.maxNumSeqs = v)),
  },
  {
    name: 'RAGGUARD_MAX_BATCHED_TOKENS', default: '4096', doc: 'Tokens fed to the decoder in one step at most (a longer prompt runs alone).',
    apply: int(1, 1 << 20, (c, v) => (c.maxNumBatchedTokens = v)),
  },
  {
    name: 'RAGGUARD_LEAK_WINDOW', default: '50', doc: 'Requests over which /debug/memory measures memory growth.',
    apply: int(4, 100000, (c, v) => (c.leakWindow = v)),
  },
  {
    name: 'RAGGUARD_LEAK_THRESHOLD_BYTES', default: '67108864', doc: 'Growth across the window that /debug/memory flags as a leak.',
    apply: int(1, Number.MAX_SAFE_INTEGER, (c, v) => (c.leakThresholdBytes = v)),
  },
  {
    name: 'RAGGUARD_LEAK_SAMPLE_MS', default: '10000', doc: 'Period of the slow-leak check\'s memory samples (resident, heap, expected growth of the store).',
    apply: int(10, 3600000, (c, v) => (c.leakSampleMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_WARMUP_MS', default: '300000', doc: 'Samples of the first ms after start that the slow-leak check leaves out (first runs, V8 sizing its heap).',
    apply: int(0, 86400000, (c, v) => (c.leakWarmupMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_HORIZON_MS', default: '3600000', doc: 'How far back the slow-leak check fits its slope.',
    apply: int(1000, 7 * 86400000, (c, v) => (c.leakHorizonMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_MIN_SPAN_MS', default: '600000', doc: 'Shortest span of samples (after the warm-up) before the slow-leak check gives a verdict.',
    apply: int(100, 7 * 86400000, (c, v) => (c.leakMinSpanMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_SLOPE_BYTES_PER_MIN', default: '1048576',
    doc: 'Growth of resident memory (less the stored documents\' predicted bytes) per minute that /debug/memory and /metrics flag as a slow leak.',
    apply: int(1, Number.MAX_SAFE_INTEGER, (c, v) => (c.leakSlopeBytesPerMin = v)),
  },
  {
    name: 'RAGGUARD_GPU_SAMPLE_MS', default: '1000', doc: 'Period of NVML GPU memory sampling (where a GPU is present).',
    apply: int(10, 3600000, (c, v) => (c.gpuSampleMs = v)),
  },
];
