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
 * Large blocks (LARGE_BLOCK, 2 MiB, and up: a decoder's KV buffers, logits, prompt activations) come from
 * regions of address space reserved once (mmap, no memory committed until touched), each at most 4 GiB,
 * and go back to the kernel when freed (madvise MADV_DONTNEED), as glibc's own mappings for blocks
 * over its mmap threshold do. Why: the JS side reads a tensor's memory through an ArrayBuffer, and
 * each new ArrayBuffer over native memory is external memory to V8 until it is collected: every
 * 64 MiB of it starts a full collection of the heap. A batch's new past buffers (up to ~0.9 GB on the
 * CPU here) made V8 mark its ~95 MB heap over and over during a burst, with main-thread pauses of up
 * to 70 ms. Within a region the JS side views a block through the region's one ArrayBuffer
 * (ort-direct.ts), made once. Where the regions are full, large blocks fall back to malloc.
 *
 * Built by scripts/setup.sh (cc -O2 -shared -fPIC); no ONNX Runtime header needed: the struct below
 * is OrtAllocator's layout up to the fields read at version 16.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

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

/* ---- large blocks: reserved regions ---------------------------------------------------------- */

/* Blocks from this size up come from the regions: glibc's mmap threshold as scripts/tuned.sh sets it,
 * so that blocks which were fresh mappings before still are, and smaller ones keep reusing the heap's
 * pages (a 1 MiB threshold made a prefill 38 % slower in page faults: tuned.sh). */
#define LARGE_BLOCK ((size_t)2 << 20)
#define PAGE ((size_t)4096)
#define HEADER ((size_t)64)             /* a block's size, ahead of its 64-byte aligned data */
#define MAX_REGIONS 8
#define MAX_FREE 1024                   /* free ranges per region (more: the block falls back to malloc) */

typedef struct {
  size_t off, len;
} Range;

typedef struct {
  char *base;
  size_t size;
  Range free[MAX_FREE]; /* by offset, none adjacent (coalesced) */
  int nfree;
} Region;

static Region regions[MAX_REGIONS];
static int nregions;
static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;

/* Reserves `count` regions of `size` bytes each (a multiple of the page size, at most 4 GiB); returns how many were reserved. */
int ragguard_reserve_regions(int count, int64_t size) {
  pthread_mutex_lock(&region_lock);
  while (nregions < count && nregions < MAX_REGIONS && size > 0 && (size_t)size % PAGE == 0) {
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) break;
    Region *r = &regions[nregions++];
    r->base = p;
    r->size = (size_t)size;
    r->free[0] = (Range){0, (size_t)size};
    r->nfree = 1;
  }
  int n = nregions;
  pthread_mutex_unlock(&region_lock);
  return n;
}

void *ragguard_region_base(int i) { return i >= 0 && i < nregions ? regions[i].base : NULL; }
int64_t ragguard_region_size(int i) { return i >= 0 && i < nregions ? (int64_t)regions[i].size : 0; }

/* First fit in the regions; NULL where no free range is large enough. Called with region_lock held. */
static void *region_take(size_t len) {
  for (int i = 0; i < nregions; i++) {
    Region *r = &regions[i];
    for (int k = 0; k < r->nfree; k++) {
      if (r->free[k].len < len) continue;
      char *p = r->base + r->free[k].off;
      r->free[k].off += len;
      r->free[k].len -= len;
      if (r->free[k].len == 0) {
        for (int j = k + 1; j < r->nfree; j++) r->free[j - 1] = r->free[j];
        r->nfree--;
      }
      return p;
    }
  }
  return NULL;
}

/* The region holding p, or NULL. */
static Region *region_of(const void *p) {
  for (int i = 0; i < nregions; i++) {
    if ((const char *)p >= regions[i].base && (const char *)p < regions[i].base + regions[i].size) return &regions[i];
  }
  return NULL;
}

/* Gives [off, off + len) of r back (its pages to the kernel first); 0 where the free list is full. Called with region_lock held. */
static int region_give(Region *r, size_t off, size_t len) {
  int k = 0;
  while (k < r->nfree && r->free[k].off < off) k++;
  int before = k > 0 && r->free[k - 1].off + r->free[k - 1].len == off;
  int after = k < r->nfree && off + len == r->free[k].off;
  if (!before && !after && r->nfree == MAX_FREE) return 0;
  madvise(r->base + off, len, MADV_DONTNEED);
  if (before && after) {
    r->free[k - 1].len += len + r->free[k].len;
    for (int j = k + 1; j < r->nfree; j++) r->free[j - 1] = r->free[j];
    r->nfree--;
  } else if (before) {
    r->free[k - 1].len += len;
  } else if (after) {
    r->free[k].off = off;
    r->free[k].len += len;
  } else {
    for (int j = r->nfree; j > k; j--) r->free[j] = r->free[j - 1];
    r->free[k] = (Range){off, len};
    r->nfree++;
  }
  return 1;
}

/* ---- the allocator ----------------------------------------------------------------------------- */

static void count_alloc(int64_t held) {
  int64_t now = atomic_fetch_add(&live, held) + held;
  int64_t high = atomic_load(&peak);
  while (now > high && !atomic_compare_exchange_weak(&peak, &high, now)) {
  }
  atomic_fetch_add(&count, 1);
}

static void *counting_alloc(OrtAllocator *self, size_t size) {
  (void)self;
  if (size >= LARGE_BLOCK && nregions > 0) {
    size_t len = (size + HEADER + PAGE - 1) / PAGE * PAGE;
    pthread_mutex_lock(&region_lock);
    char *block = region_take(len);
    pthread_mutex_unlock(&region_lock);
    if (block != NULL) {
      *(size_t *)block = len;
      count_alloc((int64_t)len);
      return block + HEADER;
    }
  }
  void *p = NULL;
  if (posix_memalign(&p, 64, size == 0 ? 1 : size) != 0) return NULL;
  count_alloc((int64_t)malloc_usable_size(p));
  return p;
}

static void counting_free(OrtAllocator *self, void *p) {
  (void)self;
  if (p == NULL) return;
  Region *r = nregions > 0 ? region_of(p) : NULL;
  if (r != NULL) {
    char *block = (char *)p - HEADER;
    size_t len = *(size_t *)block;
    atomic_fetch_sub(&live, (int64_t)len);
    pthread_mutex_lock(&region_lock);
    int given = region_give(r, (size_t)(block - r->base), len);
    pthread_mutex_unlock(&region_lock);
    /* A free list full of holes: the pages still go back, the range stays out of use. */
    if (!given) madvise(block, len, MADV_DONTNEED);
    return;
  }
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
