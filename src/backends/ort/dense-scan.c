/*
 * Exact inner-product search of one query over rows of floats, for the faiss store's per-collection
 * vectors (src/retrieval/faiss-collections.ts, through koffi). Why not faiss's IndexFlatIP: the faiss
 * linked here is Debian's generic build (no AVX2 or AVX512 kernels): a query over 10,000 x 384 floats
 * took 4-7 ms there against about 0.5 ms for the AVX512 loop below, and bench:scale-real's 16 clients
 * wait for each other's searches on one event loop.
 *
 * Built into libragguard-ops.so beside the ONNX Runtime ops (scripts/setup.sh); it uses none of them.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The k best (score, slot) pairs seen so far as a min-heap on score (ties: the later slot is the worse). */
typedef struct {
  float* score;
  int32_t* slot;
  int32_t n, k;
} topk;

static int worse(const topk* h, int32_t a, int32_t b) {
  return h->score[a] < h->score[b] || (h->score[a] == h->score[b] && h->slot[a] > h->slot[b]);
}

static void swap(topk* h, int32_t a, int32_t b) {
  const float s = h->score[a];
  const int32_t t = h->slot[a];
  h->score[a] = h->score[b], h->slot[a] = h->slot[b];
  h->score[b] = s, h->slot[b] = t;
}

static void sift_down(topk* h, int32_t i) {
  for (;;) {
    const int32_t l = 2 * i + 1, r = l + 1;
    int32_t m = i;
    if (l < h->n && worse(h, l, m)) m = l;
    if (r < h->n && worse(h, r, m)) m = r;
    if (m == i) return;
    swap(h, i, m);
    i = m;
  }
}

static void offer(topk* h, float score, int32_t slot) {
  if (h->n < h->k) {
    int32_t i = h->n++;
    h->score[i] = score, h->slot[i] = slot;
    while (i > 0) {
      const int32_t p = (i - 1) / 2;
      if (!worse(h, i, p)) break;
      swap(h, i, p);
      i = p;
    }
    return;
  }
  /* Full: the new pair replaces the worst where it is better (a tie keeps the earlier slot). */
  if (score < h->score[0] || (score == h->score[0] && slot > h->slot[0])) return;
  h->score[0] = score, h->slot[0] = slot;
  sift_down(h, 0);
}

static float dot_portable(const float* a, const float* b, int64_t d) {
  float s = 0.f;
  for (int64_t j = 0; j < d; j++) s += a[j] * b[j];
  return s;
}

__attribute__((target("avx512f"))) static float dot_avx512(const float* a, const float* b, int64_t d) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 64 <= d; j += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 32), _mm512_loadu_ps(b + j + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 48), _mm512_loadu_ps(b + j + 48), s3);
  }
  for (; j + 16 <= d; j += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
  if (j < d) {
    const __mmask16 m = (__mmask16)((1u << (d - j)) - 1u);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, b + j), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static int use_avx512 = -1;
/* 0: the portable loop whatever the CPU (tests of the path a CPU without AVX512 runs). */
static int allow_avx512 = 1;

int ragguard_scan_avx512(void) {
  if (use_avx512 < 0) use_avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
  return use_avx512 && allow_avx512;
}

void ragguard_scan_set_portable(int on) { allow_avx512 = !on; }

/*
 * The k best rows of `rows` (n x d floats, row-major) by inner product with q, among the rows `allow`
 * lets through (bit r & 7 of byte r >> 3; NULL: every row), best first into slots and scores (ties: the
 * lower row first). Returns how many were written: k, or fewer where fewer rows are allowed.
 */
int32_t ragguard_scan_ip_topk(const float* rows, int64_t n, int64_t d, const float* q, const uint8_t* allow, int32_t k, int32_t* slots,
                              float* scores) {
  if (k <= 0 || n <= 0) return 0;
  topk h = {scores, slots, 0, k};
  const int fast = ragguard_scan_avx512();
  for (int64_t r = 0; r < n; r++) {
    if (allow && !(allow[r >> 3] & (1u << (r & 7)))) continue;
    const float* row = rows + r * d;
    offer(&h, fast ? dot_avx512(row, q, d) : dot_portable(row, q, d), (int32_t)r);
  }
  /* Heap order to best first: repeatedly move the worst to the end. */
  const int32_t found = h.n;
  while (h.n > 1) {
    swap(&h, 0, h.n - 1);
    h.n--;
    sift_down(&h, 0);
  }
  return found;
}
