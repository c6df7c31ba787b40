/**
 * One seam around every model run of the serving path (an embedder batch, a reranker batch, an engine
 * step), so that a benchmark can measure each run's memory on its own. Serving installs no observer
 * and a run costs one branch. Runs are tagged by the memory model's stage names.
 */
export type RunStage = 'embed' | 'rerank' | 'prefill' | 'decode';

export interface RunObserver {
  observe<T>(stage: RunStage, run: () => Promise<T>): Promise<T>;
}

let observer: RunObserver | undefined;

/** Installs (or, with undefined, removes) the process's run observer. */
export function setRunObserver(o: RunObserver | undefined): void {
  observer = o;
}

export function metered<T>(stage: RunStage, run: () => Promise<T>): Promise<T> {
  return observer ? observer.observe(stage, run) : run();
}

/** Wall milliseconds and runs summed by stage (a profile's figures). */
export type StageTimes = Partial<Record<RunStage, { ms: number; runs: number }>>;

/**
 * Installs an observer that sums each stage's wall time and runs into the returned record from now on
 * (benches' profiles); `clear` empties it between measured rounds.
 */
export function timeStages(): { spent: StageTimes; clear(): void } {
  const spent: StageTimes = {};
  setRunObserver({
    async observe<T>(stage: RunStage, run: () => Promise<T>): Promise<T> {
      const t0 = performance.now();
      try {
        return await run();
      } finally {
        const s = (spent[stage] ??= { ms: 0, runs: 0 });
        s.ms += performance.now() - t0;
        s.runs++;
      }
    },
  });
  return { spent, clear: () => { for (const k of Object.keys(spent) as RunStage[]) delete spent[k]; } };
}
