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
