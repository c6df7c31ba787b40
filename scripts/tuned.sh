#!/bin/sh
# Runs a command with glibc's allocator tuned the way ragguard is served and measured:
#   mmap_threshold=2 MiB  buffers of 2 MiB or more (KV buffers, prompt activations, logits) get their own
#                         mapping and go back to the OS when freed. By default glibc raises this
#                         threshold as large blocks are freed, after which they stay resident in the
#                         heap: resident memory then shows the largest past run, not the live buffers,
#                         so neither the guards' budget nor a measurement of a run's peak holds.
#                         Measured on the CPU here, the same 1200-token prefill of the genai decoder,
#                         8 times in one process: 22.4-25.9 MiB at 4 MiB (whether a 3 MiB buffer lands
#                         on resident heap pages or not), 25.3-26.2 at 2 MiB, 21.8-22.1 at 1 MiB; but
#                         1 MiB made that prefill 38 % slower (page faults of its 1-2 MiB activations),
#                         2 MiB did not (46 ms against 47).
#   arena_max=1           one malloc arena for every thread. CPU model runs happen on a worker thread
#                         (koffi's async calls, so that the event loop stays free while a model runs:
#                         src/runtime/run-gate.ts); with an arena per thread, a run's freed buffers under
#                         the threshold stay in that thread's arena where the next run, on another
#                         thread, cannot reuse them, and resident memory grows by the sum of the arenas'
#                         peaks. Runs are serialised, so the one arena's lock is hardly contended.
# The tunables only take effect at process start, hence a wrapper. Ignored where libc is not glibc.
GLIBC_TUNABLES="glibc.malloc.mmap_threshold=2097152:glibc.malloc.arena_max=1${GLIBC_TUNABLES:+:$GLIBC_TUNABLES}"
export GLIBC_TUNABLES
exec "$@"
