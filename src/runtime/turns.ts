/**
 * Request preparation one request every other turn of the event loop.
 *
 * A burst's requests arrive in one poll of the event loop; each one's preparation (parsing, tokenizing
 * the query, the guard's prediction) is a millisecond or two of JavaScript, and run back to back inside
 * that poll they held a probe, or a shed request's 503, behind all of them (a burst of 200: up to a
 * second on 2 busy cores). Waiting for its turn here, each request prepares on a later turn, one
 * every other turn, with the loop's I/O (probes, new connections, load shedding) served in between.
 */
const waiting: (() => void)[] = [];
let scheduled = false;

/**
 * While a burst is still arriving, preparation waits: the longest it is held back, in ms.
 *
 * Why: Node reads one new connection per turn of the event loop (libuv >= 1.45 accepts one connection
 * per loop iteration: strace shows one accept4 per epoll_wait), so a burst of 200 takes 200 turns to
 * come in, and every turn that also carries a request's preparation or a query's next stage (1-3 ms of
 * tokenizing, retrieval and prompt assembly each, several times that on contended cores) holds back
 * every connection still waiting, the ones to be shed included: in a CPU profile of a burst's first
 * 400 ms the main thread was busy 99 % of the time, most of it with the admitted queries' stages.
 * So while queries keep arriving (one arrived since the last step), steps wait for a turn without an
 * arrival, for at most this long once per burst; after that, or once a turn passes without an
 * arrival, one step every other turn again, so steady traffic is never held back more than once.
 */
export const MAX_HOLD_MS = 200;
let maxHoldMs = MAX_HOLD_MS;
let arrivals = 0;
let holdingSince: number | undefined;
/** The hold of the current burst has run out: no more holding until a turn passes without an arrival. */
let holdSpent = false;

/** Sets how long a burst's arrivals may hold steps back (MAX_HOLD_MS unless set; tests). */
export function setMaxHold(ms: number): void {
  maxHoldMs = ms;
}

/** A query arrived (before it is shed or admitted): steps wait while arrivals keep coming. */
export function noteArrival(): void {
  arrivals++;
}

/** Resolves on a later turn of the event loop, after the requests that asked before it, one every other turn. */
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
  if (arrivals === 0) {
    holdingSince = undefined;
    holdSpent = false;
  } else if (!holdSpent) {
    arrivals = 0;
    const now = performance.now();
    holdingSince ??= now;
    if (now - holdingSince < maxHoldMs) {
      setImmediate(step); // the next turn: its poll for I/O reads the next connection first
      return;
    }
    holdSpent = true;
  }
  arrivals = 0;
  waiting.shift()?.();
  // Scheduled from inside the check phase, one turn left free: the next step runs on the turn after
  // next. A new connection needs two polls for I/O, one to accept it and a later one to read its
  // request (strace: accept4, then the read after the next epoll_wait), and a step on every turn put
  // one between them, a probe waiting out two steps (a burst's steps: 20-60 ms each on contended
  // cores); with a free turn between steps, one at most.
  if (waiting.length > 0) setImmediate(() => setImmediate(step));
  else scheduled = false;
}
