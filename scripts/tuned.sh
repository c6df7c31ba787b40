#!/bin/sh
# Runs a command with glibc's allocator tuned the way ragguard is served and measured:
#   mmap_threshold=4 MiB  buffers of 4 MiB or more (attention scores, logits, batched KV) get their own
#                         mapping and go back to the OS when freed. By default glibc raises this
#                         threshold as large blocks are freed, after which they stay resident in the
#                         heap: resident memory then shows the largest past run, not the live buffers,
#                         so neither the guards' budget nor a measurement of a run's peak holds. Smaller
#                         buffers keep the heap's fast reuse (1 MiB measured tighter but cost large
#                         decode batches twice the time, in page faults).
# The tunable only takes effect at process start, hence a wrapper. Ignored where libc is not glibc.
GLIBC_TUNABLES="glibc.malloc.mmap_threshold=4194304${GLIBC_TUNABLES:+:$GLIBC_TUNABLES}"
export GLIBC_TUNABLES
exec "$@"
