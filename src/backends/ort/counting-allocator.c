/*
 * An OrtAllocator that counts: every byte ONNX Runtime allocates through it (a session's
 * intermediate tensors, outputs, scratch buffers, initializers) is added to a live total, and the
 * highest live total since the last reset is kept. This is the host's "accounted bytes" meter
 * (src/backends/ort/ort-allocator.ts registers it with ONNX Runtime's environment; every CPU session then
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
 * Freed large blocks may stay resident for reuse, up to a limit the server sets (the warm cache,
 * ragguard_set_warm_limit; 0 = none, every freed block's pages go back at once). Why: the same shapes
 * run again and again (a reranker batch, a prefill chunk), and a block whose pages went back is faulted
 * in and zeroed anew at its next use. Measured on the CPU here, the reranker at 32 pairs a run scored
 * 247 pairs/s with every page returned and 540 with them kept (transformers.js, whose ONNX Runtime arena
 * keeps everything: 672). The limit bounds what is kept: resident large blocks are at most the live
 * ones plus the limit, and the server counts the limit in its budget as it counts the weights.
 * Warm blocks are reused best fit (the smallest that holds the request; the rest of it stays warm);
 * the oldest go back first when the limit is passed.
 *
 * Built by scripts/setup.sh (cc -O2 -shared -fPIC); no ONNX Runtime header needed: the struct below
 * is OrtAllocator's layout up to the fields read at version 16.
 */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct OrtAllocator {
  uint32_t version;
  void *(*Alloc)(struct OrtAllocator *self, size_t size);
  void (*Free)(struct OrtAllocator *self, void *p);
  const void *(*Info)(const struct OrtAllocator *self);
} OrtAllocator;

static _Atomic int64_t live;  /* bytes allocated and not yet freed */
static _Atomic int64_t peak;  /* highest `live` since the last reset */
static _Atomic int64_t count; /* allocations since start */
/* The part of `live` in malloc's blocks (small ones, and large ones where the regions are full): it is
 * also inside glibc's own in-use figure, which a reader of both would otherwise count twice. */
static _Atomic int64_t heap_live;
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

/* ---- the warm cache: freed large blocks kept resident ------------------------------------------- */

#define MAX_WARM 256

typedef struct {
  Region *r;
  char *block;
  size_t len;
} Warm;

static Warm warm[MAX_WARM]; /* oldest first */
static int nwarm;
static _Atomic int64_t warm_bytes;
static int64_t warm_limit;

/* Gives a block's pages back and its range to its region. Called with region_lock held. */
static void give_back(Region *r, char *block, size_t len) {
  if (!region_give(r, (size_t)(block - r->base), len)) madvise(block, len, MADV_DONTNEED);
}

/* Drops warm blocks, oldest first, until at most `keep` bytes are warm. Called with region_lock held. */
static void warm_trim(int64_t keep) {
  int k = 0;
  while (k < nwarm && atomic_load(&warm_bytes) > keep) {
    give_back(warm[k].r, warm[k].block, warm[k].len);
    atomic_fetch_sub(&warm_bytes, (int64_t)warm[k].len);
    k++;
  }
  for (int j = k; j < nwarm; j++) warm[j - k] = warm[j];
  nwarm -= k;
}

/* A warm block of at least len bytes (the smallest), its rest kept warm; NULL where none holds len. Called with region_lock held. */
static char *warm_take(size_t len) {
  int best = -1;
  for (int k = 0; k < nwarm; k++) {
    if (warm[k].len >= len && (best < 0 || warm[k].len < warm[best].len)) best = k;
  }
  if (best < 0) return NULL;
  Warm w = warm[best];
  atomic_fetch_sub(&warm_bytes, (int64_t)w.len);
  if (w.len > len) {
    warm[best] = (Warm){w.r, w.block + len, w.len - len};
    atomic_fetch_add(&warm_bytes, (int64_t)(w.len - len));
  } else {
    for (int j = best + 1; j < nwarm; j++) warm[j - 1] = warm[j];
    nwarm--;
  }
  return w.block;
}

/* Keeps a freed block warm, or gives it back where the limit or the list does not allow. Called with region_lock held. */
static void warm_put(Region *r, char *block, size_t len) {
  if ((int64_t)len > warm_limit) {
    give_back(r, block, len);
    return;
  }
  if (nwarm == MAX_WARM) warm_trim(atomic_load(&warm_bytes) - (int64_t)warm[0].len);
  warm[nwarm++] = (Warm){r, block, len};
  atomic_fetch_add(&warm_bytes, (int64_t)len);
  warm_trim(warm_limit);
}

/* Sets how many bytes of freed large blocks may stay resident (0: none); gives back what is over it. */
void ragguard_set_warm_limit(int64_t bytes) {
  pthread_mutex_lock(&region_lock);
  warm_limit = bytes > 0 ? bytes : 0;
  warm_trim(warm_limit);
  pthread_mutex_unlock(&region_lock);
}

int64_t ragguard_warm_bytes(void) { return atomic_load(&warm_bytes); }

/* Bytes of [p, p + len) (page-aligned) held in memory of this process's own: pages present and mapped
 * here alone (/proc/self/pagemap's present and exclusively-mapped bits, which need no privilege). Not
 * mincore: a fresh page that was read but never written maps the kernel's shared zero page, which
 * mincore reports resident and resident memory does not count; its first write then grows resident
 * memory (measured: 45 MiB of the warm cache in bench:guard's first burst). Where pagemap cannot be
 * read, mincore's count. */
static int64_t resident_in(char *p, size_t len) {
  static int pagemap = -2;
  if (pagemap == -2) pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  int64_t resident = 0;
  if (pagemap >= 0) {
    uint64_t entries[4096];
    for (size_t off = 0; off < len; off += sizeof entries / sizeof entries[0] * PAGE) {
      size_t n = (len - off) / PAGE < sizeof entries / sizeof entries[0] ? (len - off) / PAGE : sizeof entries / sizeof entries[0];
      ssize_t got = pread(pagemap, entries, n * sizeof entries[0], (off_t)((uintptr_t)(p + off) / PAGE * sizeof entries[0]));
      for (ssize_t i = 0; i < got / (ssize_t)sizeof entries[0]; i++) resident += ((entries[i] >> 63) & 1) && ((entries[i] >> 56) & 1) ? (int64_t)PAGE : 0;
    }
    return resident;
  }
  unsigned char vec[4096];
  for (size_t off = 0; off < len; off += sizeof vec * PAGE) {
    size_t n = len - off < sizeof vec * PAGE ? len - off : sizeof vec * PAGE;
    if (mincore(p + off, n, vec) != 0) continue;
    for (size_t i = 0; i < n / PAGE; i++) resident += (vec[i] & 1) ? (int64_t)PAGE : 0;
  }
  return resident;
}

/* Bytes of the warm blocks' pages that are resident now (resident_in). A block is fresh address space
 * until written, and a run may write only part of a block it asked for (or only read it), so a warm
 * block can hold less than its length: its next use faults the rest in, and resident memory grows with
 * no counter moving (measured: 45 MiB in the first burst of bench:guard). The budget counts the warm
 * cache at its limit; this says how much of that is not resident yet. */
int64_t ragguard_warm_resident_bytes(void) {
  int64_t resident = 0;
  pthread_mutex_lock(&region_lock);
  for (int k = 0; k < nwarm; k++) resident += resident_in(warm[k].block, warm[k].len);
  pthread_mutex_unlock(&region_lock);
  return resident;
}
int64_t ragguard_warm_limit(void) { return warm_limit; }

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
    char *block = warm_take(len);
    if (block == NULL) block = region_take(len);
    pthread_mutex_unlock(&region_lock);
    if (block != NULL) {
      *(size_t *)block = len;
      count_alloc((int64_t)len);
      return block + HEADER;
    }
  }
  void *p = NULL;
  if (posix_memalign(&p, 64, size == 0 ? 1 : size) != 0) return NULL;
  const int64_t held = (int64_t)malloc_usable_size(p);
  atomic_fetch_add(&heap_live, held);
  count_alloc(held);
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
    /* A free list full of holes: the pages still go back, the range stays out of use (give_back). */
    if (warm_limit > 0) warm_put(r, block, len);
    else give_back(r, block, len);
    pthread_mutex_unlock(&region_lock);
    return;
  }
  const int64_t held = (int64_t)malloc_usable_size(p);
  atomic_fetch_sub(&heap_live, held);
  atomic_fetch_sub(&live, held);
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
int64_t ragguard_heap_live_bytes(void) { return atomic_load(&heap_live); }

/* Starts a new peak window at the live total now. */
void ragguard_reset_peak(void) { atomic_store(&peak, atomic_load(&live)); }
