/**
 * GET /debug/memory: where every byte is. Components with how each figure was obtained (measured at
 * load, or exact from the structure's size), the KV pool and its block tables, adapters, the queue,
 * the GPU as NVML reads it (or why there is no reading), the process's counters, and the leak check.
 */
import { tokenMaskMemory } from '../generate/structured/token-mask.js';
import { totalmem } from 'node:os';
import type { Admission } from '../guards/admission.js';
import type { GpuReading } from '../guards/nvml.js';
import { processMemory, type ProcessMemory } from '../guards/process-memory.js';
import type { ProfileReport } from '../guards/profile.js';
import type { AdapterStats } from '../generate/adapters.js';
import type { RagService } from '../service/rag.js';
import { allocatorTuned, mallocStats } from '../runtime/malloc.js';
import type { TrendReport } from '../guards/growth.js';
import { accountingUnavailable, countingAllocator } from '../backends/ort/ort-allocator.js';

export interface Component {
  name: string;
  bytes: number;
  /** 'measured': resident bytes added when it loaded; 'exact': computed from the structure's size. */
  how: 'measured' | 'exact';
  detail?: string;
}

export interface MemorySnapshot {
  budget: {
    bytes: number;
    source: 'bytes' | 'gpu' | 'host';
    host_total_bytes: number;
    gpu_total_bytes: number | null;
    kv_pool_bytes: number;
    workspace_bytes: number;
    workspace_reserved_bytes: number;
    requests_waiting_for_memory: number;
  };
  components: Component[];
  components_total_bytes: number;
  kv: {
    block_size: number;
    total_blocks: number;
    free_blocks: number;
    cached_blocks: number;
    used_blocks: number;
    used_slots: number;
    allocated_slots: number;
    utilization: number;
    pool_bytes: number;
    bytes_per_token: number;
    block_tables_by_bucket: Record<number, number>;
  };
  /** How predictions are made: guards on or off, and the profile run's calibration per stage. */
  memory_model: {
    guards: boolean;
    /** glibc tuned at start (scripts/tuned.sh): freed run buffers leave the process, so rss tracks live memory. */
    allocator_tuned: boolean;
    calibration: 'profile' | 'analytic';
    /** Per stage: predicted bytes = scale x analytic bytes + offset_bytes. */
    fits: Record<string, { scale: number; offset_bytes: number }>;
    /** What the profile run measured host runs by: ONNX Runtime's accounted bytes, or resident memory. */
    host_meter: 'accounted' | 'resident';
    /** Reservations are predictions x (1 + headroom): the profile's worst run-to-run scatter. */
    headroom: number;
    /** The profile run's points (shape, analytic and measured peak bytes), or why there was none. */
    profile: ProfileReport;
  };
  /** LoRA adapter slots, the adapters loaded now (each with the requests holding it), waits, and loads/unloads so far. */
  adapters: AdapterStats;
  queue: { running: number; waiting: number; max_concurrent: number; max_waiting: number };
  gpu: { source: 'nvml'; gpus: { index: number; name: string; total_bytes: number; used_bytes: number; free_bytes: number }[] } | null;
  gpu_unavailable_reason?: string;
  process: { rss: number; heap_total: number; heap_used: number; external: number; array_buffers: number };
  /**
   * ONNX Runtime's host bytes as the counting allocator accounts them (every CPU session's
   * allocations: weights it copied, run buffers): live now, and the highest since the last profile or
   * measurement window; the warm cache (freed run buffers kept for reuse): bytes held, how many of them
   * are resident (pages present and this process's own), and its limit; or why they are not accounted.
   */
  onnxruntime_host: {
    accounted: true; live_bytes: number; peak_bytes: number; allocations: number;
    warm_bytes: number; warm_resident_bytes: number; warm_limit_bytes: number;
  } | { accounted: false; reason: string };
  /**
   * Native memory by who holds it, as far as each can be read: glibc's allocator (mallinfo2: every
   * malloc, its arenas), ONNX Runtime's accounted bytes, faiss's vectors, V8's heap and external memory,
   * and what none of them explains (code, thread stacks, ONNX Runtime's own start-up, fragmentation),
   * whose growth is what a leak outside every accountant looks like.
   */
  native: {
    malloc: { arena_bytes: number; mmapped_bytes: number; in_use_bytes: number; free_bytes: number; arenas: number } | { unavailable: string };
    onnxruntime_live_bytes: number | null;
    /**
     * Where ONNX Runtime's live bytes lie: malloc's blocks (inside malloc.in_use_bytes too) and the
     * allocator's reserved regions (large blocks, outside malloc: the live ones by length, a block not
     * yet written in full holding fewer pages, and the warm cache's by its resident pages). Null without
     * the counting allocator.
     */
    onnxruntime_in_malloc_bytes: number | null;
    onnxruntime_regions_bytes: number | null;
    faiss_index_bytes: number;
    /** The store's documents as predicted (vectors exact; texts, postings and objects estimated): the growth the leak check expects. */
    store_predicted_bytes: number;
    /** What the leak check subtracts: the store's predicted bytes, a host KV pool's blocks used at least once (their pages written) and the allocator's warm cache. */
    expected_growth_bytes: number;
    v8_heap_total_bytes: number;
    v8_external_bytes: number;
    /**
     * rss less the V8 heap, less malloc's heap (in use and free: it holds ONNX Runtime's small blocks,
     * faiss's and V8's external buffers), less ONNX Runtime's region blocks.
     */
    unattributed_bytes: number;
  };
  /** The slow-leak check: resident memory over time less the store's predicted growth (guards/growth.ts). */
  trend: TrendReport;
  growth: {
    window: number;
    samples: number;
    rss_growth_bytes: number;
    heap_growth_bytes: number;
    external_growth_bytes: number;
    threshold_bytes: number;
    flagged: boolean;
  };
}

function snake(m: ProcessMemory): MemorySnapshot['process'] {
  return { rss: m.rss, heap_total: m.heapTotal, heap_used: m.heapUsed, external: m.external, array_buffers: m.arrayBuffers };
}

/**
 * The decoder's bytes, as its backend says (DecoderBackend.memoryDetail): measured at load on ONNX
 * Runtime; on the CUDA backend the native accountant's figures (what it allocated, by part), exact.
 */
function decoderComponent(service: RagService): Component {
  const { models, loads } = service;
  const loaded = `${loads.decoder.hostBytes} bytes resident on the host and ${loads.decoder.deviceBytes} on the GPU (NVML) added by its load`;
  return { name: 'decoder', bytes: loads.decoder.bytes, ...models.decoder.memoryDetail(service.engine.runner, loaded) };
}

/**
 * An encoder's bytes: measured at load on ONNX Runtime; on the CUDA encoder its device bytes as the
 * native accountant allocated them (weights, every run's activations, cuBLAS workspace: exact) with what
 * its load added on the host.
 */
function encoderComponent(service: RagService, name: 'embedder' | 'reranker'): Component {
  const model = service.models[name];
  const load = service.loads[name];
  const loaded = `${load.hostBytes} bytes resident on the host and ${load.deviceBytes} on the GPU (NVML) added by its load`;
  const onnx = `onnx weights ${model.files.onnxBytes} bytes on disk`;
  const device = model.device;
  if (!device) {
    const first = name === 'embedder' ? "; loaded first, so it includes ONNX Runtime's own start-up" : '';
    return { name, bytes: load.bytes, how: 'measured', detail: `${loaded}; ${onnx}${first}` };
  }
  const host = `${load.hostBytes} bytes resident on the host added by its load (tokenizer, CUDA libraries, staging); ${onnx}`;
  return { name, bytes: load.bytes, how: 'measured', detail: device.memoryDetail(host) };
}

/** Constrained decoding's host memory: cached token masks (at most 32 MiB) and the tokenizer's sorted texts. */
function tokenMasksComponent(): Component {
  const m = tokenMaskMemory();
  return {
    name: 'token_masks', bytes: m.maskCacheBytes + m.vocabularyBytes, how: 'exact',
    detail: `${m.masks} cached masks (${m.maskCacheBytes} bytes) and the vocabulary's arrays (${m.vocabularyBytes} bytes); its ${m.vocabularyChars} characters of token texts are JS strings, not counted`,
  };
}

export function memorySnapshot(service: RagService, admission: Admission, gpu: GpuReading): MemorySnapshot {
  const { store, engine, blocks, cfg } = service;
  const kv = blocks.stats();
  const pool = engine.pool;
  const tableBytes = Object.entries(kv.tablesByBucket).reduce((s, [cap, n]) => s + Number(cap) * 4 * n, 0);
  const adapters = service.adapters.stats();
  // The warm cache's resident pages are read once a snapshot: each read is a pagemap pass over its blocks.
  const ort = countingAllocator();
  const warm = ort ? { held: ort.warm(), resident: ort.warmResident() } : { held: 0, resident: 0 };
  // The live bytes read once too, with where they lie (malloc's blocks, the allocator's regions plus the warm
  // cache's resident pages), so that every figure below agrees.
  const live = ort ? (() => {
    const total = ort.live();
    const inMalloc = ort.heapLive();
    return { total, inMalloc, inRegions: total - inMalloc + warm.resident };
  })() : undefined;
  // One reading of the process too: rss and unattributed_bytes come from the same moment.
  const proc = processMemory();
  const m = mallocStats();
  const components: Component[] = [
    encoderComponent(service, 'embedder'),
    encoderComponent(service, 'reranker'),
    decoderComponent(service),
    { name: 'kv_pool', bytes: pool.bytes, how: 'exact', detail: `${pool.numBlocks} blocks x ${pool.blockSize} tokens x ${pool.bytesPerSlot} bytes` },
    { name: 'block_tables', bytes: tableBytes, how: 'exact' },
    { name: 'faiss_index', bytes: store.indexBytes, how: 'exact', detail: store.indexDetail },
    {
      name: 'adapter_slots', bytes: adapters.slots.bytes, how: 'exact',
      detail: `${adapters.slots.max_loras} LoRA adapters x rank ${adapters.slots.max_rank} per module, allocated at start-up; ${adapters.loaded.length} loaded now`,
    },
    tokenMasksComponent(),
    ...(service.allocatorWarmBytes > 0 ? [{
      name: 'allocator_warm', bytes: service.allocatorWarmBytes, how: 'exact' as const,
      detail: `freed run buffers of 2 MiB and up kept resident for the next run, at most this (RAGGUARD_ALLOCATOR_WARM_BYTES; ${warm.held} bytes held now, ${warm.resident} of them resident), counted in the budget up front`,
    }] : []),
  ];
  const gpuTotal = gpu.source === 'nvml' ? gpu.gpus.reduce((s, g) => s + g.totalBytes, 0) : null;
  return {
    budget: {
      bytes: service.budget.budgetBytes,
      source: service.budget.source,
      host_total_bytes: totalmem(),
      gpu_total_bytes: gpuTotal,
      kv_pool_bytes: pool.bytes,
      workspace_bytes: service.workspaceBytes,
      workspace_reserved_bytes: service.guard.reserved,
      requests_waiting_for_memory: service.guard.waiting,
    },
    components,
    components_total_bytes: components.reduce((s, c) => s + c.bytes, 0),
    kv: {
      block_size: kv.blockSize,
      total_blocks: kv.totalBlocks,
      free_blocks: kv.freeBlocks,
      cached_blocks: kv.cachedBlocks,
      used_blocks: kv.usedBlocks,
      used_slots: kv.usedSlots,
      allocated_slots: kv.allocatedSlots,
      utilization: kv.utilization,
      pool_bytes: pool.bytes,
      bytes_per_token: pool.bytesPerSlot,
      block_tables_by_bucket: kv.tablesByBucket,
    },
    memory_model: {
      guards: cfg.guards,
      allocator_tuned: allocatorTuned(),
      calibration: service.profile.source,
      fits: Object.fromEntries(Object.entries(service.guard.model.calibration).map(([st, f]) => [st, { scale: f.scale, offset_bytes: f.offsetBytes }])),
      host_meter: cfg.hostMeter === 'accounted' && ort ? 'accounted' : 'resident',
      headroom: service.guard.model.headroom,
      profile: service.profile,
    },
    adapters,
    queue: { running: admission.running, waiting: admission.waiting, max_concurrent: cfg.maxConcurrentQueries, max_waiting: cfg.maxQueueLength },
    gpu: gpu.source === 'nvml'
      ? { source: 'nvml', gpus: gpu.gpus.map((g) => ({ index: g.index, name: g.name, total_bytes: g.totalBytes, used_bytes: g.usedBytes, free_bytes: g.freeBytes })) }
      : null,
    ...(gpu.source === 'none' ? { gpu_unavailable_reason: gpu.reason } : {}),
    process: snake(proc),
    onnxruntime_host: ort && live
      ? { accounted: true as const, live_bytes: live.total, peak_bytes: ort.peak(), allocations: ort.allocations(), warm_bytes: warm.held, warm_resident_bytes: warm.resident, warm_limit_bytes: ort.warmLimit() }
      : { accounted: false as const, reason: accountingUnavailable() },
    native: {
      malloc: m ? { arena_bytes: m.arenaBytes, mmapped_bytes: m.mmappedBytes, in_use_bytes: m.inUseBytes, free_bytes: m.freeBytes, arenas: m.arenas }
        : { unavailable: 'not glibc (mallinfo2 needs glibc 2.33 or later)' },
      onnxruntime_live_bytes: live ? live.total : null,
      onnxruntime_in_malloc_bytes: live ? live.inMalloc : null,
      onnxruntime_regions_bytes: live ? live.inRegions : null,
      faiss_index_bytes: store.indexBytes,
      store_predicted_bytes: service.storeResidentBytes(),
      expected_growth_bytes: service.expectedGrowthBytes(warm.resident),
      v8_heap_total_bytes: proc.heapTotal,
      v8_external_bytes: proc.external,
      unattributed_bytes: Math.max(0, proc.rss - proc.heapTotal - (m ? m.inUseBytes + m.freeBytes : 0) - (live?.inRegions ?? 0)),
    },
    trend: service.trend.report(),
    growth: (({ window, samples, rssGrowthBytes, heapGrowthBytes, externalGrowthBytes, thresholdBytes, flagged }) => ({
      window, samples, rss_growth_bytes: rssGrowthBytes, heap_growth_bytes: heapGrowthBytes,
      external_growth_bytes: externalGrowthBytes, threshold_bytes: thresholdBytes, flagged,
    }))(service.growth.report()),
  };
}
