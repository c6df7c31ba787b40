/**
 * Main-thread work in slices: a turn of the event loop once a slice's time is spent.
 *
 * Why: a decoder step's main-thread work between two model runs (sampling every row's next token from
 * 152k logits, releasing the last step's tensors, allocating and gathering a changed batch's past) ran
 * as one synchronous stretch, 50-110 ms for a batch of 32 on 2 contended cores (plus a garbage
 * collection when one fell in it), and the event loop's I/O (health probes, load-shedding 503s)
 * waited behind it. A Pacer shared by that work yields once `sliceMs` has passed since the stretch
 * began (start()) or since its last yield, so no slice holds the loop much longer than that.
 */
export class Pacer {
  private since = performance.now();
  /** Turns given to the event loop (tests, stats). */
  yields = 0;

  constructor(readonly sliceMs = 8) {}

  /** A synchronous stretch begins now (the continuation of an awaited model run, say). */
  start(): void {
    this.since = performance.now();
  }

  /** Whether this slice is spent: the caller should `await turn()` before more work. */
  get due(): boolean {
    return performance.now() - this.since >= this.sliceMs;
  }

  /** A turn of the event loop (its poll for I/O included), then a new slice. */
  async turn(): Promise<void> {
    await new Promise<void>((r) => setImmediate(r));
    this.yields++;
    this.since = performance.now();
  }

  /** turn() when the slice is spent; else nothing (not even a microtask). */
  pace(): Promise<void> | undefined {
    return this.due ? this.turn() : undefined;
  }
}
