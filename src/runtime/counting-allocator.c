/*
 * An OrtAllocator that counts: every byte ONNX Runtime allocates through it (a session's
 * intermediate tensors, outputs, scratch buffers, initializers) is added to a live total, and the
 * highest live total since the last reset is kept. This is the host's "accounted bytes" meter
 * (src/runtime/ort-allocator.ts registers it with ONNX Runtime's environment; every CPU session then
 * allocates through it with session.use_env_allocators=1).
 *
 * Why not the process's resident size: glibc keeps and reuses freed memory, spreads a run's buffers
 * over per-thread arenas and maps large blocks fresh, so a run's resident growth scatters by +-40 %
 * between two runs of one shape. The bytes the runtime asked for are the run's own demand, exactly.
 *
 * Sizes are malloc_usable_size's (what the block really holds), counted the same way at allocation
 * and at free, so the live total returns to where it was when every block is freed. Blocks are
 * 64-byte aligned, as ONNX Runtime's own CPU allocator makes them (MLAS kernels expect it).
 *
 * Built by scripts/setup.sh (cc -O2 -shared -fPIC); no ONNX Runtime header needed: the struct below
 * is OrtAllocator's layout up to the fields read at version 16.
 */
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct OrtAllocator {
  uint32_t version;
  void *(*Alloc)(struct OrtAllocator *self, size_t size);
  void (*Free)(struct OrtAllocator *self, void *p);
  const void *(*Info)(const struct OrtAllocator *self);
} OrtAllocator;

static _Atomic int64_t live;  /* bytes allocated and not yet freed */
static _Atomic int64_t peak;  /* highest `live` since the last reset */
static _Atomic int64_t count; /* allocations since start */
static const void *memory_info;

static void *counting_alloc(OrtAllocator *self, size_t size) {
  (void)self;
  void *p = NULL;
  if (posix_memalign(&p, 64, size == 0 ? 1 : size) != 0) return NULL;
  int64_t held = (int64_t)malloc_usable_size(p);
  int64_t now = atomic_fetch_add(&live, held) + held;
  int64_t high = atomic_load(&peak);
  while (now > high && !atomic_compare_exchange_weak(&peak, &high, now)) {
  }
  atomic_fetch_add(&count, 1);
  return p;
}

static void counting_free(OrtAllocator *self, void *p) {
  (void)self;
  if (p == NULL) return;
  atomic_fetch_sub(&live, (int64_t)malloc_usable_size(p));
  free(p);
}

static const void *counting_info(const OrtAllocator *self) {
  (void)self;
  return memory_info;
}

static OrtAllocator allocator = {16, counting_alloc, counting_free, counting_info};

/* The allocator, described by `info` (an OrtMemoryInfo for the CPU that the caller keeps alive). */
OrtAllocator *ragguard_counting_allocator(const void *info) {
  memory_info = info;
  return &allocator;
}

int64_t ragguard_live_bytes(void) { return atomic_load(&live); }
int64_t ragguard_peak_bytes(void) { return atomic_load(&peak); }
int64_t ragguard_allocations(void) { return atomic_load(&count); }

/* Starts a new peak window at the live total now. */
void ragguard_reset_peak(void) { atomic_store(&peak, atomic_load(&live)); }
