/**
 * An encoder's session (embedder, reranker): BERT-style int64 inputs padded to one width, float
 * outputs copied out. On the CPU it runs through ONNX Runtime's C API (ort-direct.ts), whose runs
 * happen on a worker thread, so that the event loop stays free while a model runs (a reranker run of
 * 16 pairs of 256 tokens takes ~300 ms on 2 busy cores: on the main thread, every probe and every 503
 * waited for it). On other providers, or where the C API cannot be bound, through onnxruntime-node.
 * Every run passes the process's run gate (run-gate.ts): one at a time.
 */
import * as ort from 'onnxruntime-node';
import type { ExecutionProvider } from '../../config/config.js';
import { padRows } from '../../runtime/model-dir.js';
import { gatedRun } from '../../runtime/run-gate.js';
import { metered, type RunStage } from '../../runtime/run-meter.js';
import type { ConcreteProvider, EncoderOutput, EncoderRuns } from '../backend.js';
import { DirectSession, type HostTensor } from './ort-direct.js';
import { createSession, encoderFeeds, type SessionExtras } from './session.js';

export class EncoderSession implements EncoderRuns {
  readonly preallocated = false;

  private constructor(
    readonly provider: ConcreteProvider,
    private readonly node: ort.InferenceSession | null,
    private readonly direct: DirectSession | null,
    readonly inputNames: readonly string[],
    readonly outputNames: readonly string[],
    /** Why a requested provider was not used (auto fallback). */
    readonly fallbackReason?: string,
  ) {}

  static async create(modelFile: string, requested: ExecutionProvider, extras: SessionExtras = {}): Promise<EncoderSession> {
    // The CPU asked for: straight to the C API's session (the model loads once).
    const direct = requested === 'cpu' ? DirectSession.create(modelFile) : null;
    if (direct) return EncoderSession.ofDirect(direct);
    const loaded = await createSession(modelFile, requested, extras);
    if (loaded.provider === 'cpu') {
      const d = DirectSession.create(modelFile);
      if (d) {
        await loaded.session.release();
        return EncoderSession.ofDirect(d, loaded.fallbackReason);
      }
    }
    return new EncoderSession(loaded.provider, loaded.session, null, loaded.session.inputNames, loaded.session.outputNames, loaded.fallbackReason);
  }

  private static ofDirect(d: DirectSession, fallbackReason?: string): EncoderSession {
    return new EncoderSession('cpu', null, d, d.inputs.map((i) => i.name), d.outputs.map((o) => o.name), fallbackReason);
  }

  /**
   * An output's element type ('float32', ...) and rank, from the model's type info (the C API's, or
   * onnxruntime-node's metadata); undefined fields where the graph does not say or it is not a tensor.
   */
  outputInfo(name: string): { type?: string; rank?: number } {
    if (this.direct) {
      const o = this.direct.outputs.find((x) => x.name === name);
      return { type: o?.type, rank: o?.rank };
    }
    const m = this.node!.outputMetadata.find((x) => x.name === name);
    return m?.isTensor ? { type: m.type, rank: m.shape.length } : {};
  }

  /** Releases the model (the session is unusable afterwards). */
  async release(): Promise<void> {
    if (this.direct) this.direct.dispose();
    else await this.node!.release();
  }

  /** How runs reach ONNX Runtime: 'direct' (C API, off the main thread) or 'onnxruntime-node'. */
  get runPath(): 'direct' | 'onnxruntime-node' {
    return this.direct ? 'direct' : 'onnxruntime-node';
  }

  /**
   * One run over token-id rows (padded with `padId`; `typeRows` for token_type_ids, zeros without),
   * returning the `output` tensor (a copy), tagged `stage` for the run meter (none: a profile run). An
   * abort of `signal` leaves the run gate's line, or stops a direct run already going (RunInterrupted).
   */
  async run(stage: RunStage | undefined, output: string, rows: readonly (readonly number[])[], padId: number,
    typeRows?: readonly (readonly number[])[], signal?: AbortSignal): Promise<EncoderOutput> {
    if (this.node) {
      const session = this.node;
      const feeds = encoderFeeds(session, rows, padId, typeRows);
      // onnxruntime-node's run cannot be stopped once started: the signal only shortens the wait for the gate.
      const result = await gatedRun(() => (stage ? metered(stage, () => session.run(feeds)) : session.run(feeds)), signal);
      const t = result[output]!;
      const out = { data: t.data as Float32Array, dims: [...t.dims] };
      for (const r of Object.values(result)) r.dispose();
      return out;
    }
    const session = this.direct!;
    const { ids, mask, width } = padRows(rows, padId);
    const dims = [rows.length, width];
    const made: HostTensor[] = [];
    const feeds: Record<string, HostTensor> = {};
    for (const name of this.inputNames) {
      const t = session.tensor('int64', dims);
      made.push(t);
      const data = t.data as BigInt64Array;
      if (name === 'input_ids') data.set(ids);
      else if (name === 'attention_mask') data.set(mask);
      else if (name === 'token_type_ids') {
        if (typeRows) data.set(padRows(typeRows, 0).ids);
        else data.fill(0n);
      } else throw new Error(`encoder input '${name}' is not supported`);
      feeds[name] = t;
    }
    try {
      const go = () => session.run(feeds, { [output]: null }, signal);
      const result = await gatedRun(() => (stage ? metered(stage, go) : go()), signal);
      const t = result[output]!;
      try {
        if (t.type !== 'float32') throw new Error(`encoder output '${output}' is ${t.type}, float32 expected`);
        return { data: (t.data as Float32Array).slice(), dims: [...t.dims] };
      } finally {
        t.dispose();
      }
    } finally {
      for (const t of made) t.dispose();
    }
  }

  /** One run over [batch, tokens] dummy ids (profiling: the shape is what matters). */
  async dummyRun(batch: number, tokens: number, padId: number): Promise<void> {
    const row = Array.from({ length: tokens }, (_, i) => (i === 0 ? padId + 1 : padId + 2));
    await this.run(undefined, this.outputNames[0]!, Array.from({ length: batch }, () => row), padId);
  }
}
