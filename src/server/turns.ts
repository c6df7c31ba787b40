/**
 * Request preparation one request per turn of the event loop.
 *
 * A burst's requests arrive in one poll of the event loop; each one's preparation (parsing, tokenizing
 * the query, the guard's prediction) is a millisecond or two of JavaScript, and run back to back inside
 * that poll they held a probe, or a shed request's 503, behind all of them (a burst of 200: up to a
 * second on 2 busy cores). Waiting for its turn here, each request prepares on a later turn, one per
 * turn, with the loop's I/O (probes, new connections, load shedding) served in between.
 */
const waiting: (() => void)[] = [];
let scheduled = false;

/** Resolves on a later turn of the event loop, after the requests that asked before it, one per turn. */
export function nextTurn(): Promise<void> {
  return new Promise((resolve) => {
    waiting.push(resolve);
    if (!scheduled) {
      scheduled = true;
      setImmediate(step);
    }
  });
}

function step(): void {
  waiting.shift()?.();
  // Scheduled from inside the check phase: the next one runs on the next turn, after its poll for I/O.
  if (waiting.length > 0) setImmediate(step);
  else scheduled = false;
}
