/**
 * Where a start is: the phase it is in, how far that phase has got, and how long each took. The server
 * listens from its first second and answers its probes from this (/healthz live, /readyz 503 with the
 * phase and progress); the start-up log and a library user can read it too.
 *
 * Phases, in order (a phase with nothing to do is skipped):
 * - loading: the three models (progress: models loaded of 3), then the index and the memory budget;
 * - profiling: the profile run that calibrates the memory model (progress: model runs of the run's
 *   total), or the check that restores its cached calibration (guards/calibration-cache.ts);
 * - ingesting: the sample corpus (RAGGUARD_CORPUS_DIR) into an empty index (progress: documents
 *   embedded of the corpus'). The server ingests it itself, ready when done, rather than `npm run
 *   setup` building the index: the index's vectors belong to the embedder and chunking the server runs
 *   with (RAGGUARD_EMBEDDER, RAGGUARD_CHUNK_TOKENS), which setup cannot know, and a fresh index
 *   directory (a new volume, a test) gets its corpus the same way. Not ready before it is done: a query
 *   answered from part of the corpus would be silently different from the same query a minute later.
 *   The ingest is one atomic batch: a stop half-way keeps nothing of it, and the next start ingests again;
 * - warming: the service is up and its app takes requests; the warm-up query runs (server/warmup.ts).
 * Then ready.
 */
import type { RagService, StartPhase } from './rag.js';

export type StartupPhase = 'loading' | 'profiling' | 'ingesting' | 'warming';
export const STARTUP_PHASES: readonly StartupPhase[] = ['loading', 'profiling', 'ingesting', 'warming'];

export interface StartupProgress {
  done: number;
  of: number;
  unit: 'models' | 'runs' | 'documents';
}

export interface StartupStatus {
  phase: StartupPhase;
  /** How far the phase has got, where it can say (a restored calibration and the warm-up cannot). */
  progress?: StartupProgress;
  /** Since the start, and since this phase began. */
  elapsed_ms: number;
  phase_elapsed_ms: number;
}

export class Startup {
  private current: StartupPhase | 'ready' = 'loading';
  private loaded = { done: 0, of: 3 };
  private service: RagService | undefined;
  private readonly t0 = performance.now();
  private phaseT0 = this.t0;
  private readonly took: Partial<Record<StartupPhase, number>> = {};

  /** loadModels' listener. */
  readonly onModelLoaded = (done: number, of: number): void => {
    this.loaded = { done, of };
  };

  /** RagService.start's listener. */
  readonly onPhase = (p: StartPhase, service: RagService): void => {
    this.service = service;
    if (p.phase === 'profile') this.enter('profiling');
    if (p.phase === 'ingest') this.enter('ingesting');
  };

  get phase(): StartupPhase | 'ready' {
    return this.current;
  }

  get ready(): boolean {
    return this.current === 'ready';
  }

  enter(phase: StartupPhase): void {
    this.end();
    this.current = phase;
  }

  /** The start is over: ready. */
  finish(): void {
    this.end();
    this.current = 'ready';
  }

  /** Milliseconds each phase took (those run so far), and the whole start's once ready. */
  durations(): Partial<Record<StartupPhase | 'total', number>> {
    return { ...this.took, ...(this.ready ? { total: Math.round(this.phaseT0 - this.t0) } : {}) };
  }

  /** Where the start is; undefined once ready. */
  status(): StartupStatus | undefined {
    if (this.current === 'ready') return undefined;
    const now = performance.now();
    const progress = this.progress(this.current);
    return {
      phase: this.current, ...(progress ? { progress } : {}),
      elapsed_ms: Math.round(now - this.t0), phase_elapsed_ms: Math.round(now - this.phaseT0),
    };
  }

  /** In words, for a 503's message: "ingesting (12 of 40 documents)". */
  describe(): string {
    const s = this.status();
    if (!s) return 'ready';
    return s.progress ? `${s.phase} (${s.progress.done} of ${s.progress.of} ${s.progress.unit})` : s.phase;
  }

  private progress(phase: StartupPhase): StartupProgress | undefined {
    if (phase === 'loading') return { ...this.loaded, unit: 'models' };
    const p = phase === 'profiling' ? this.service?.profileProgress : phase === 'ingesting' ? this.service?.ingestProgress : undefined;
    return p ? { done: p.done, of: p.of, unit: phase === 'profiling' ? 'runs' : 'documents' } : undefined;
  }

  private end(): void {
    const now = performance.now();
    if (this.current !== 'ready') this.took[this.current] = Math.round(now - this.phaseT0);
    this.phaseT0 = now;
  }
}
