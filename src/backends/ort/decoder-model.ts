/**
 * A decoder-only LM exported with a KV cache, in one of two layouts (both drop in as real exports do):
 *
 * 'optimum' (Optimum / transformers.js: config.json, onnx/model.onnx)
 *   inputs  input_ids [b, s], attention_mask [b, past + s], position_ids [b, s],
 *           past_key_values.N.key|value [b, kv_heads, past, head_dim]
 *   outputs logits [b, s, vocab], present.N.key|value [b, kv_heads, past + s, head_dim]
 *   A batch's rows are right-aligned in the past tensors, padding masked; every run returns a new,
 *   longer present.
 *
 * 'genai' (onnxruntime-genai's model builder: genai_config.json, model.onnx; GroupQueryAttention)
 *   inputs  input_ids [b, s], attention_mask [b, total] (row r: 1 for its first len_r + s positions),
 *           past_key_values.N.key|value [b, kv_heads, capacity, head_dim]
 *   outputs logits [b, s or 1, vocab], present.N.key|value [b, kv_heads, capacity, head_dim]
 *   Rows are left-aligned in a buffer of `capacity` positions; given the past buffers as the present
 *   outputs too, the attention writes each row's new tokens into them in place (genai's
 *   past_present_share_buffer), so that a batch decodes step after step in one buffer, without
 *   repeating KV heads or attending to padding. On the CPU the runs go through ONNX Runtime's C API
 *   (ort-direct.ts) with the buffer in memory ONNX Runtime allocated: nothing is copied in
 *   or out (onnxruntime-node would hand the whole buffer back as a copy every run; it is the fallback
 *   where the C API cannot be bound). convert/gqa-builder.ts converts an Optimum export.
 *
 * The shape facts come from config.json; the KV and logits types (float32 or float16) from the graph.
 * A genai graph with LoRA inputs (gqa-builder.ts) also takes `lora_index` and each projection's adapter
 * slots (lora.ts, lora-pool.ts): a run feeds the rows' slot entries, or rank-0 tensors without adapters.
 *
 * On WebGPU the present KV outputs stay on the device (preferredOutputLocation 'gpu-buffer'), so that
 * a decode step can feed them back as the next step's past without a round trip through the host;
 * only the logits come back. On the CPU every output is host memory.
 */
import path from 'node:path';
import * as ort from 'onnxruntime-node';
import type { ExecutionProvider } from '../../config/config.js';
import { modelFiles, readJson, readJsonIfExists, type ModelFiles } from '../../runtime/model-dir.js';
import { halfsToFloats } from '../../runtime/float16.js';
import { kvTailModel, ONNX_FLOAT, ONNX_FLOAT16 } from './onnx-graph.js';
import { DirectSession, directUnavailable, HostTensor, ragguardOpsUnavailable, type DirectSessionOptions, type SessionValueInfo } from './ort-direct.js';
import { createSession, sessionOptions, type LoadedSession, type SessionExtras } from './session.js';
import { gatedRun } from '../../runtime/run-gate.js';
import { TextTokenizer } from '../../runtime/tokenizer.js';
import { bufferCapacity, kvArray, kvBytesPerToken, type DecoderShape, type KvArray, type KvLayout } from '../../generate/decoder-shape.js';
import { GREEDY_IDS, LAST_POSITIONS } from './convert/gqa-builder.js';
import { LORA_INDEX, loraSlots, type LoraSlot } from '../../generate/lora.js';
import { LoraPool, type DecoderAdapter } from '../../generate/lora-pool.js';
import type { ConcreteProvider, DecoderBackend, DecoderMemoryLayout, DecoderRuntime, MemoryDetail } from '../backend.js';
import type { ModelRunner } from '../../generate/model-runner.js';
import { OrtModelRunner } from './ort-runner.js';
import { presentData, type ForwardInput, type ForwardOutput, type KvTensor, type OrtDecoder } from './forward.js';
import { decoderShape, type DecoderConfig, type GenerationConfig } from './decoder-config.js';
import { pickSpare, presentNames } from './kv-spare.js';
import { loraFeeds, type LoraFeeds } from './lora-feeds.js';

// Where they were declared first: tests, scripts and benchmarks import them from here.
export { bufferCapacity, type KvLayout } from '../../generate/decoder-shape.js';
export { presentData, type ForwardInput, type ForwardOutput, type KvTensor } from './forward.js';
export { configDims } from './decoder-config.js';
export { SPARE_RATIO } from './kv-spare.js';

export interface DecoderLoadOptions extends SessionExtras {
  /** genai layout on the CPU: run through ONNX Runtime's C API with buffers in place (default true). */
  direct?: boolean;
  /** That direct session's threads, spinning and profiler (ort-direct.ts). */
  directOptions?: DirectSessionOptions;
}

/**
 * The ONNX Runtime decoder: what its runner runs (OrtDecoder, forward.ts) and, to the layers above, a
 * DecoderBackend (backends/backend.ts) whose runner is an OrtModelRunner over a host KV pool.
 */
export class DecoderModel implements OrtDecoder, DecoderBackend {
  /** Its runs allocate their buffers as they go: the guard predicts them and the profile run measures them. */
  readonly preallocated = false;
  /** The kv-tail graph on this model's provider (onnx-graph.ts), made on first use. */
  private tail: Promise<ort.InferenceSession> | undefined;
  /** present.N.key|value in the flat [k0, v0, k1, v1, ...] order of past and present tensors. */
  private readonly kvNames: readonly string[];
  /**
   * A direct decode step's logits output, [rows, 1, vocab] float32, kept from step to step while the
   * batch's row count holds: ONNX Runtime writes into it and the step's lastLogits view it, so a step
   * allocates, wraps and copies no logits (at 8 rows, 128 KiB a step that the garbage collector
   * otherwise chased).
   */
  private stepLogits: HostTensor | undefined;
  /** Whether the direct session's logits are float32, which the step buffer is (read once, not per step). */
  private readonly directLogitsFloat32: boolean;
  /** Whether the direct session's graph gives each row's greedy id (GREEDY_IDS, int64). */
  private readonly directGreedy: boolean;
  /**
   * The graph takes a prefill batch right-padded to its longest row (ForwardInput.counts): it sends
   * each row's last real position through the head, and says so by its LAST_POSITIONS output
   * (gqa-builder.ts). Read from the graph itself, so that a conversion cached before it, or another
   * builder's genai graph (which slice the last position, a pad for a shorter row), keeps prefilling
   * one sequence a run instead of giving a padded row a pad's logits.
   */
  readonly paddedPrefill: boolean;
  /** The graph's LoRA slots (lora.ts), or null where the export has no LoRA inputs. */
  readonly loraSlots: readonly LoraSlot[] | null;
  /** Rank-0 A and B per slot, fed where no row has an adapter: made once. */
  private zeroLora: Record<string, KvTensor> | undefined;
  /** The resident adapters' slots (lora-pool.ts), made by loraPoolFor(). */
  private pool: LoraPool<KvTensor> | undefined;

  private constructor(
    readonly tokenizer: TextTokenizer,
    /** onnxruntime-node's session, where runs go through it (null where they go through `direct`). */
    private readonly loaded: LoadedSession | null,
    /** Runs through ONNX Runtime's C API with host buffers (genai layout on the CPU); else onnxruntime-node's. */
    private readonly direct: DirectSession | null,
    readonly files: ModelFiles,
    readonly shape: DecoderShape,
    readonly layout: KvLayout,
    readonly bosId: number | undefined,
    readonly eosIds: ReadonlySet<number>,
  ) {
    this.kvNames = presentNames(shape.numLayers);
    this.directLogitsFloat32 = direct?.outputs.find((o) => o.name === 'logits')?.type === 'float32';
    this.directGreedy = direct?.outputs.find((o) => o.name === GREEDY_IDS)?.type === 'int64';
    const names = new Set(direct?.inputs.map((i) => i.name) ?? loaded?.session.inputNames ?? []);
    const outputs = new Set(direct?.outputs.map((o) => o.name) ?? loaded?.session.outputNames ?? []);
    this.paddedPrefill = layout === 'genai' && outputs.has(LAST_POSITIONS);
    const slots = loraSlots(shape);
    this.loraSlots = names.has(LORA_INDEX) && slots.every((s) => names.has(s.a) && names.has(s.b)) ? slots : null;
  }

  static async load(dir: string, ep: ExecutionProvider, extras: DecoderLoadOptions = {}): Promise<DecoderModel> {
    const files = await modelFiles(dir);
    const layout: KvLayout = files.genai ? 'genai' : 'optimum';
    const cfg = await readJson<DecoderConfig>(path.join(dir, 'config.json'));
    const gen = await readJsonIfExists<GenerationConfig>(path.join(dir, 'generation_config.json'));
    const tokenizer = await TextTokenizer.load(dir);
    const wantDirect = layout === 'genai' && extras.direct !== false;
    // A GGUF converted for ragguard's kernels runs only where the ops library is registered: a direct
    // session on the CPU. Anywhere else ONNX Runtime would stop at an op it does not know.
    const kernels = (cfg as { ragguard_source?: { kernels?: string } }).ragguard_source?.kernels;
    if (kernels === 'ragguard') {
      const why = !wantDirect || ep !== 'cpu' ? `it is loaded on '${ep}'` : ragguardOpsUnavailable();
      if (why) throw new Error(`decoder ${dir}: converted for ragguard's QMatMul8 and QMatMul4 (RAGGUARD_CPU_KERNELS=ragguard), which runs only on the cpu provider through ONNX Runtime's C API, but ${why}; RAGGUARD_CPU_KERNELS=onnxruntime converts it for ONNX Runtime's MatMulNBits`);
    }
    // genai asked for on the CPU goes straight to the C API's session: the model loads once.
    let direct = wantDirect && ep === 'cpu' ? DirectSession.create(files.onnx, extras.directOptions) : null;
    let loaded: LoadedSession | null = null;
    if (!direct) {
      // genai's present is the past buffer itself, given as a host output: it stays where the past is.
      const node = await createSession(files.onnx, ep, { ...extras, deviceOutputs: layout === 'genai' ? [] : presentNames(cfg.num_hidden_layers) });
      // 'auto' that settled on the CPU: the C API's session takes over from onnxruntime-node's.
      direct = wantDirect && node.provider === 'cpu' ? DirectSession.create(files.onnx, extras.directOptions) : null;
      if (direct) await node.session.release();
      else loaded = node;
    }
    const inputs: readonly SessionValueInfo[] = direct?.inputs
      ?? loaded?.session.inputMetadata.map((m) => ({ name: m.name, type: m.isTensor ? m.type : undefined })) ?? [];
    const kvType = inputs.find((m) => m.name === 'past_key_values.0.key')?.type ?? 'float32';
    if (kvType !== 'float32' && kvType !== 'float16') throw new Error(`decoder ${files.onnx}: KV of type ${kvType} is not supported`);
    const shape = decoderShape(cfg, kvType);
    const eos = gen?.eos_token_id ?? cfg.eos_token_id ?? [];
    const eosIds = new Set(Array.isArray(eos) ? eos : [eos]);
    const expected = ['input_ids', 'attention_mask', 'past_key_values.0.key'];
    for (const name of expected) {
      if (!inputs.some((m) => m.name === name)) {
        throw new Error(`decoder ${files.onnx} lacks input '${name}': export it with a KV cache (past_key_values)`);
      }
    }
    return new DecoderModel(tokenizer, loaded, direct, files, shape, layout, gen?.bos_token_id ?? cfg.bos_token_id ?? undefined, eosIds);
  }

  /** How runs reach ONNX Runtime: its C API with buffers in place, or onnxruntime-node (and why not the former). */
  get runPath(): { path: 'direct' | 'onnxruntime-node'; reason?: string } {
    if (this.direct) return { path: 'direct' };
    const reason = this.layout !== 'genai' ? 'optimum layout' : this.provider !== 'cpu' ? `${this.provider} provider` : directUnavailable() || 'disabled';
    return { path: 'onnxruntime-node', reason };
  }

  get provider(): ConcreteProvider {
    return this.loaded?.provider ?? 'cpu'; // direct sessions are CPU sessions
  }

  /** Its KV layout and run path, for /healthz and the start-up log. */
  runtime(): DecoderRuntime {
    const { path, reason } = this.runPath;
    return { layout: this.layout, run_path: path, ...(reason ? { run_path_reason: reason } : {}) };
  }

  /** What the memory model sizes its runs by: the KV layout, in-place runs, the LoRA path. */
  memoryLayout(loraMaxRank: number): DecoderMemoryLayout {
    return { kvLayout: this.layout, kvInPlace: this.runPath.path === 'direct', lora: this.loraSlots !== null, loraMaxRank };
  }

  /** Nothing planned: what its load added is measured (guards/process-memory.ts measureLoad). */
  plannedLoadBytes(): undefined {
    return undefined;
  }

  /** The engine's runner over a host KV pool of `numBlocks` blocks of `blockSize` tokens. */
  createRunner(numBlocks: number, blockSize: number): OrtModelRunner {
    return new OrtModelRunner(this, { numBlocks, blockSize });
  }

  /** Its runners keep no accounts of their own: the load's measurement stands. */
  runnerLoadBytes(): undefined {
    return undefined;
  }

  memoryDetail(_runner: ModelRunner, loaded: string): MemoryDetail {
    return { how: 'measured', detail: `${loaded}; onnx weights ${this.files.onnxBytes} bytes on disk` };
  }

  /** True when present KV outputs stay in device memory between runs. */
  get presentOnDevice(): boolean {
    return this.provider === 'webgpu' && this.layout === 'optimum';
  }

  /** How a batch's cached tokens sit in the past tensors: right-aligned (optimum) or left-aligned (genai). */
  get kvPlacement(): 'right' | 'left' {
    return this.layout === 'genai' ? 'left' : 'right';
  }

  /** Positions the past tensors need for rows of `lengths` cached tokens taking `newTokens` more. */
  pastWidth(lengths: readonly number[], newTokens: number): number {
    const longest = Math.max(0, ...lengths);
    return this.layout === 'genai' ? bufferCapacity(longest + newTokens, this.shape.maxPositions) : longest;
  }

  /**
   * Whether a run's present (of `width` positions) can be the past of a run feeding `newTokens` to
   * rows of `lengths` (the same rows, whose KV it holds), as it is.
   */
  canExtend(width: number, lengths: readonly number[], newTokens: number): boolean {
    const longest = Math.max(0, ...lengths);
    return this.layout === 'genai' ? width >= longest + newTokens : width === longest;
  }

  /**
   * Host present tensors of a left-aligned (genai) batch copied into buffers of `newWidth` positions,
   * each row's tokens where they were: a batch that outgrew its buffer goes on without a gather.
   */
  widen(present: readonly KvTensor[], width: number, newWidth: number): KvTensor[] {
    if (this.layout !== 'genai') throw new Error('only a genai layout\'s buffer widens in place');
    const { headDim: D } = this.shape;
    const rows = present[0]!.dims[0]!;
    const wider = this.allocPast(rows, newWidth);
    const outs = presentData(wider);
    presentData(present).forEach((src, j) => {
      for (let i = 0; i < src.length / (width * D); i++) outs[j]!.set(src.subarray(i * width * D, (i + 1) * width * D), i * newWidth * D);
    });
    return wider;
  }

  /** Position of row token `t` (of a row holding `length` tokens) in a present tensor of `width` positions. */
  slot(width: number, length: number, t: number): number {
    return this.layout === 'genai' ? t : width - length + t;
  }

  /** KV bytes one token occupies across all layers (keys and values). */
  get kvBytesPerToken(): number {
    return kvBytesPerToken(this.shape);
  }

  /**
   * One run of `rows` rows, `newTokens` each, over `context` zero past tokens, inputs built here as
   * the engine builds them: the start-up profile's prefill (context 0) and decode (newTokens 1) stages.
   */
  async profileRun(rows: number, newTokens: number, context: number): Promise<void> {
    const lengths = new Array<number>(rows).fill(context);
    const width = this.pastWidth(lengths, newTokens);
    const out = await this.forward({
      tokens: Array.from({ length: rows }, () => new Array<number>(newTokens).fill(this.bosId ?? 1)),
      lengths,
      past: this.allocPast(rows, width),
      width,
    });
    for (const t of out.present) t.dispose();
  }

  /**
   * Past tensors of `width` positions for `rows` rows, on the host, for the caller to fill (the
   * engine gathers into them). onnxruntime-node's are zeroed; a direct session's are not (a genai
   * run reads only each row's own positions, which the caller writes).
   */
  allocPast(rows: number, width: number): KvTensor[] {
    return Array.from({ length: 2 * this.shape.numLayers }, () => this.pastTensor(rows, width));
  }

  /**
   * allocPast for the engine's changed batches, with `pace` awaited before each tensor (the engine's
   * pacer: a turn of the event loop once its slice is spent). A batch's 2 x layers new tensors, made in
   * one stretch, held the event loop for 25-35 ms with the garbage collections their new views set off
   * (bench:overload's slowest probes in the middle of a burst); since the counting allocator's regions
   * (counting-allocator.c) large tensors add no view, and what is left to pace is their allocation.
   *
   * `spare`: a direct session's tensors that their runs are done with but that are still allocated
   * (the runner releases them at the step barrier). A past tensor is made in the memory of one of them
   * where it fits and is at most SPARE_RATIO times as large as needed, instead of a new allocation;
   * the ones taken are removed from `spare` and are released with the tensor made in them
   * (DirectSession.tensorOver says why: no new view of the memory, so no full garbage collection).
   */
  async allocPastPaced(rows: number, width: number, spare: KvTensor[] | undefined, pace: () => Promise<void> | undefined): Promise<KvTensor[]> {
    const past: KvTensor[] = [];
    for (let i = 0; i < 2 * this.shape.numLayers; i++) {
      await pace();
      past.push(this.pastTensor(rows, width, spare));
    }
    return past;
  }

  /** One layer's key or value past (allocPast, allocPastPaced). */
  private pastTensor(rows: number, width: number, spare?: KvTensor[]): KvTensor {
    const { numKvHeads: H, headDim: D, kvDtype } = this.shape;
    const dims = [rows, H, width, D];
    const direct = this.direct;
    if (!direct) return new ort.Tensor(kvDtype, kvArray(kvDtype, rows * H * width * D), dims);
    const i = spare ? pickSpare(spare, kvDtype, rows * H * width * D) : -1;
    return i < 0 ? direct.tensor(kvDtype, dims) : direct.tensorOver(spare!.splice(i, 1)[0] as HostTensor, kvDtype, dims);
  }

  /**
   * The last `n` positions of each present tensor, in host memory: [batch, kv_heads, n, head_dim] per
   * layer key/value. Where present KV lives on the device this is the only download path, and it moves
   * just the tail; on the CPU it runs the same graph (so tests exercise it).
   */
  async kvTail(present: readonly KvTensor[], n: number): Promise<KvArray[]> {
    // Outputs in host memory: sessionOptions keeps outputs on the device only when asked to.
    this.tail ??= ort.InferenceSession.create(kvTailModel(present.length, this.shape.kvDtype === 'float16' ? ONNX_FLOAT16 : ONNX_FLOAT),
      sessionOptions(this.provider));
    const session = await this.tail;
    const feeds: Record<string, ort.Tensor> = { starts: new ort.Tensor('int64', BigInt64Array.of(BigInt(-n)), [1]) };
    present.forEach((t, i) => {
      if (t instanceof HostTensor) throw new Error('kvTail reads device tensors; host ones are read in place');
      feeds[`x${i}`] = t;
    });
    const out = await gatedRun(() => session.run(feeds));
    return present.map((_, i) => {
      const t = out[`y${i}`]!;
      const data = t.data as KvArray;
      t.dispose();
      return data;
    });
  }

  /** A host tensor of the decoder's kind: ONNX Runtime's memory on the direct path, else onnxruntime-node's. */
  private hostTensor(dims: readonly number[]): KvTensor {
    const type = this.shape.kvDtype;
    if (this.direct) return this.direct.tensor(type, dims);
    return new ort.Tensor(type, kvArray(type, dims.reduce((a, b) => a * b, 1)), [...dims]);
  }

  /**
   * The adapter slots, allocated on first call (`maxLoras` adapters resident at once, modules of rank
   * up to `maxRank`); later calls get the same pool, which must have the same shape.
   */
  loraPoolFor(maxLoras: number, maxRank: number): LoraPool<KvTensor> {
    if (!this.loraSlots) throw new Error(`decoder ${this.files.onnx} has no LoRA inputs (build it with scripts/build-gqa-decoder.ts)`);
    if (this.pool && (this.pool.maxLoras !== maxLoras || this.pool.maxRank !== maxRank)) {
      throw new Error(`the decoder's adapter slots are ${this.pool.maxLoras} x rank ${this.pool.maxRank}, not ${maxLoras} x ${maxRank}`);
    }
    this.pool ??= new LoraPool(this.loraSlots, maxLoras, maxRank, this.shape.kvDtype, (dims) => this.hostTensor(dims));
    return this.pool;
  }

  /** The LoRA inputs of a run of `rows` rows (lora-feeds.ts). */
  private loraFeeds(rows: number, adapters: readonly (DecoderAdapter | undefined)[] | undefined): LoraFeeds {
    return loraFeeds({
      slots: this.loraSlots, pool: this.pool, direct: this.direct, hostTensor: (dims) => this.hostTensor(dims),
      zeroLora: (make) => (this.zeroLora ??= make()),
    }, rows, adapters);
  }

  async forward(input: ForwardInput): Promise<ForwardOutput> {
    const { tokens, lengths, width, counts } = input;
    const batch = tokens.length;
    const seq = tokens[0]!.length;
    const genai = this.layout === 'genai';
    if (counts && (!this.paddedPrefill || lengths.some((len) => len !== 0) || counts.some((n) => n < 1 || n > seq))) {
      // GroupQueryAttention takes rows of several lengths only as a first prompt (no past), and only
      // this builder's graph reads each row's own last position.
      throw new Error('a padded prefill needs a graph with per-row last positions and rows without past tokens');
    }
    // optimum: [batch, width + seq], each row's tokens right-aligned; genai: [batch, total], left-aligned.
    const maskWidth = genai ? Math.max(...lengths) + seq : width + seq;
    const ids = BigInt64Array.from(tokens.flat(), BigInt);
    const mask = new BigInt64Array(batch * maskWidth);
    lengths.forEach((len, r) => {
      const from = r * maskWidth + (genai ? 0 : width - len);
      mask.fill(1n, from, from + len + (counts?.[r] ?? seq));
    });
    const past = input.past ?? this.allocPast(batch, genai ? width : 0);
    const lora = this.loraFeeds(batch, input.adapters);
    let run: RunResult;
    try {
      run = this.direct
        ? await this.runDirect(this.direct, ids, [batch, seq], mask, [batch, maskWidth], past, lora.feeds, input.signal)
        : await this.runBinding(ids, [batch, seq], mask, [batch, maskWidth], past, lengths, lora.feeds, input.signal);
    } finally {
      for (const t of lora.made) t.dispose();
    }
    const { logits, positions, greedyIds } = run;
    if (run.reused && positions === 1 && logits instanceof Float32Array) return { lastLogits: logits, greedyIds, present: run.present, width };
    // Each row's last position (the graph may keep only that one).
    const V = this.shape.vocabSize;
    const last = logits instanceof Float32Array ? new Float32Array(batch * V) : new Uint16Array(batch * V);
    for (let b = 0; b < batch; b++) {
      const off = (b * positions + positions - 1) * V;
      last.set(logits.subarray(off, off + V), b * V);
    }
    run.release();
    return { lastLogits: last instanceof Float32Array ? last : halfsToFloats(last), greedyIds, present: run.present, width: genai ? width : width + seq };
  }

  private async runDirect(session: DirectSession, ids: BigInt64Array, idsDims: number[], mask: BigInt64Array, maskDims: number[],
    past: readonly KvTensor[], lora: Readonly<Record<string, KvTensor>>, signal?: AbortSignal): Promise<RunResult> {
    const hostPast = past.map((t) => {
      if (!(t instanceof HostTensor)) throw new Error('a direct run takes past tensors from allocPast');
      return t;
    });
    const inputIds = session.tensor('int64', idsDims);
    (inputIds.data as BigInt64Array).set(ids);
    const attention = session.tensor('int64', maskDims);
    (attention.data as BigInt64Array).set(mask);
    const feeds: Record<string, HostTensor> = { input_ids: inputIds, attention_mask: attention };
    for (const [name, t] of Object.entries(lora)) feeds[name] = t as HostTensor;
    // A decode step's logits are [rows, 1, vocab] in every genai export (a prefill's may be every position's).
    const step = idsDims[1] === 1 && this.directLogitsFloat32;
    if (step && this.stepLogits?.dims[0] !== idsDims[0]) {
      this.stepLogits?.dispose();
      this.stepLogits = session.tensor('float32', [idsDims[0]!, 1, this.shape.vocabSize]);
    }
    const fetches: Record<string, HostTensor | null> = { logits: step ? this.stepLogits! : null };
    if (this.directGreedy) fetches[GREEDY_IDS] = null; // [rows, positions] int64: 8 bytes a row
    this.kvNames.forEach((name, i) => {
      feeds[name.replace('present', 'past_key_values')] = hostPast[i]!;
      fetches[name] = hostPast[i]!; // written in place
    });
    try {
      const out = await gatedRun(() => session.run(feeds, fetches, signal), signal);
      const logits = out['logits']!;
      let greedyIds: number[] | undefined;
      const greedy = out[GREEDY_IDS];
      if (greedy) {
        // Each row's last position, copied out: the tensor goes now.
        const ids = greedy.data as BigInt64Array;
        const positions = greedy.dims[1]!;
        greedyIds = Array.from({ length: idsDims[0]! }, (_, r) => Number(ids[r * positions + positions - 1]!));
        greedy.dispose();
      }
      return {
        logits: logits.data as Float32Array | Uint16Array, positions: logits.dims[1]!, greedyIds, present: hostPast, reused: step,
        release: () => step || logits.dispose(),
      };
    } finally {
      inputIds.dispose();
      attention.dispose();
    }
  }

  private async runBinding(ids: BigInt64Array, idsDims: number[], mask: BigInt64Array, maskDims: number[],
    past: readonly KvTensor[], lengths: readonly number[], lora: Readonly<Record<string, KvTensor>>, signal?: AbortSignal): Promise<RunResult> {
    if (!this.loaded) throw new Error('this decoder runs through a direct session');
    const { session } = this.loaded;
    const [batch, seq] = idsDims as [number, number];
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor('int64', ids, idsDims),
      attention_mask: new ort.Tensor('int64', mask, maskDims),
    };
    for (const [name, t] of Object.entries(lora)) feeds[name] = t as ort.Tensor;
    if (session.inputNames.includes('position_ids')) {
      feeds['position_ids'] = new ort.Tensor('int64', BigInt64Array.from(lengths.flatMap((len) => Array.from({ length: seq }, (_, k) => BigInt(len + k)))), [batch, seq]);
    }
    const fetches: Record<string, ort.Tensor | null> = { logits: null };
    this.kvNames.forEach((name, i) => {
      const t = past[i]!;
      if (t instanceof HostTensor) throw new Error('onnxruntime-node runs take onnxruntime-node tensors');
      feeds[name.replace('present', 'past_key_values')] = t;
      // genai: the past buffer is also the present output, written in place (and handed back as a copy).
      fetches[name] = this.layout === 'genai' ? t : null;
    });
    // onnxruntime-node's run cannot be stopped once started: the signal only shortens the wait for the gate.
    const result = await gatedRun(() => session.run(feeds, fetches), signal);
    const logits = result['logits']!;
    return {
      logits: logits.data as Float32Array | Uint16Array, positions: logits.dims[1]!,
      present: this.kvNames.map((n) => result[n]!), reused: false, release: () => logits.dispose(),
    };
  }
}

/** A run's outputs before the last-position logits are taken out; release() frees the logits. */
interface RunResult {
  logits: Float32Array | Uint16Array;
  positions: number;
  /** Each row's greedy id at its last position, where the graph gives them. */
  greedyIds?: number[];
  /** The logits are the model's step buffer (valid until the next run; release() keeps them). */
  reused: boolean;
  present: KvTensor[];
  release(): void;
}
