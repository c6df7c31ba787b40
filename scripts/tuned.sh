#!/bin/sh
# Runs a command with glibc's allocator tuned the way ragguard is measured and served:
#   mmap_threshold=1 MiB  buffers of 1 MiB or more (model activations, logits, KV staging) get their
#                         own mapping and go back to the OS when freed, instead of staying resident in
#                         the heap after a large run; resident memory then tracks the live buffers,
#                         which is what the memory guards budget and what bench:guard measures;
#   hugetlb=1             those mappings use transparent huge pages, so mapping them anew each run
#                         costs few page faults.
# The tunables only take effect at process start, hence a wrapper. Ignored where libc is not glibc.
GLIBC_TUNABLES="glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=1048576${GLIBC_TUNABLES:+:$GLIBC_TUNABLES}"
export GLIBC_TUNABLES
exec "$@"
