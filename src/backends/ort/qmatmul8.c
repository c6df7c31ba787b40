/*
 * The 8-bit block product behind ragguard's QMatMul8 op (ragguard-ops.c): see qmatmul8.h.
 *
 * Why a kernel of our own: at a decode step of 8 rows ONNX Runtime's MatMulNBits (8 bits, accuracy
 * level 4) made about 12 multiply-adds a cycle a core on this machine's AVX512-VNNI cores, and its
 * products were about 80 % of the step. Here each 64 weight bytes are loaded once for up to 8 rows
 * and 2 columns, and each row's part is one VPDPBUSD (unsigned weights times signed x, 64 products
 * into 16 int32 lanes), a conversion and one multiply-add by the lanes' block scales. The zero point's
 * term (128 times the block sum of x) is one multiply-add a block per row and column, taken apart from
 * the loop. The CPUs without AVX512-VNNI run the same arithmetic in plain C (slow, exact the same).
 */
#include "qmatmul8.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 64
#ifndef PF
#define PF 1
#endif

int qm8_supported(int64_t k, int64_t blk) {
  /* a power of two from 16: a block is whole int32 lanes and a chunk holds whole blocks or lies in one */
  if (k <= 0 || blk < 16 || (blk & (blk - 1)) != 0 || k % blk != 0) return 0;
  return 1;
}

/* Set: the plain C path even where the CPU has AVX512-VNNI (a test checks it against the same inputs). */
static int portable;

void qm8_set_portable(int on) { portable = on; }

int qm8_vnni(void) {
  static int known = -1;
  if (portable) return 0;
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  }
  return known;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

int qm8_rows_init(qm8_rows* r, const float* x, int64_t m, int64_t k, int64_t blk) {
  const int64_t nb = k / blk, chunks = (k + CHUNK - 1) / CHUNK;
  const size_t xqBytes = up64((size_t)(m * chunks * CHUNK));
  const size_t sxBytes = up64((size_t)(m * chunks * 16) * sizeof(float));
  const size_t corrBytes = up64((size_t)(m * nb) * sizeof(float));
  char* mem = aligned_alloc(64, xqBytes + sxBytes + 2 * corrBytes);
  if (!mem) return -1;
  r->m = m;
  r->k = k;
  r->blk = blk;
  r->chunks = chunks;
  r->mem = mem;
  r->xq = (int8_t*)mem;
  r->sx = (float*)(mem + xqBytes);
  r->corr = (float*)(mem + xqBytes + sxBytes);
  float* sxb = (float*)(mem + xqBytes + sxBytes + corrBytes);
  memset(r->xq, 0, xqBytes);
  for (int64_t i = 0; i < m; i++) {
    const float* xr = x + i * k;
    for (int64_t b = 0; b < nb; b++) {
      float amax = 0.0f;
      for (int64_t j = 0; j < blk; j++) amax = fmaxf(amax, fabsf(xr[b * blk + j]));
      const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int64_t j = 0; j < blk; j++) {
        float v = nearbyintf(xr[b * blk + j] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        const int64_t at = b * blk + j;
        r->xq[((at / CHUNK) * m + i) * CHUNK + at % CHUNK] = (int8_t)v;
        sum += (int32_t)v;
      }
      sxb[i * nb + b] = s;
      r->corr[i * nb + b] = s * 128.0f * (float)sum;
    }
    /* Each int32 lane of a chunk (4 bytes) lies in one block: its scale, 0 past k. */
    for (int64_t c = 0; c < chunks; c++)
      for (int l = 0; l < 16; l++) {
        const int64_t at = c * CHUNK + 4 * l;
        r->sx[(c * m + i) * 16 + l] = at < k ? sxb[i * nb + at / blk] : 0.0f;
      }
  }
  return 0;
}

void qm8_rows_free(qm8_rows* r) {
  free(r->mem);
  r->mem = NULL;
}

/* The same arithmetic in plain C: integer dot products a block, then both scales. */
static void columns_c(const qm8_weight* w, const qm8_rows* r, float* y, int64_t n0, int64_t n1) {
  const int64_t k = w->k, blk = w->blk, nb = k / blk;
  for (int64_t i = 0; i < r->m; i++) {
    for (int64_t n = n0; n < n1; n++) {
      const uint8_t* wq = w->q + n * k;
      const float* d = w->scales + n * nb;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; b++) {
        int32_t dot = 0;
        for (int64_t j = 0; j < blk; j++) {
          const int64_t at = b * blk + j;
          dot += (int32_t)wq[at] * (int32_t)r->xq[((at / CHUNK) * r->m + i) * CHUNK + at % CHUNK];
        }
        /* the lane copy of the block's scale of x: the same float the VNNI path multiplies by */
        const float sx = r->sx[(((b * blk) / CHUNK) * r->m + i) * 16 + ((b * blk) % CHUNK) / 4];
        acc += (float)dot * (d[b] * sx) - d[b] * r->corr[i * nb + b];
      }
      y[i * w->n + n] = acc + (w->bias ? w->bias[n] : 0.0f);
    }
  }
}

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define INLINE __attribute__((always_inline)) inline

/*
 * One chunk of 64 weight bytes of NC columns (n, n+1) for MT rows: ACC_j_i += lanes of the integer dot
 * products times the lanes' scales (the weight block's times x's). `lm` masks the bytes past k, `dm`
 * the blocks past the row's last in the scales' load.
 */
#define CHUNK_STEP(c, lm, dm)                                                                                  \
  do {                                                                                                         \
    const int64_t b_ = ((c) * CHUNK) >> blkShift;                                                             \
    /* the column pair after next, a line a column per chunk: its weights arrive while these compute */ \
    if (PF) {                                                                                                  \
      _mm_prefetch((const char*)(q0 + 4 * k + (c) * CHUNK), _MM_HINT_T0);                                      \
      _mm_prefetch((const char*)(q0 + 5 * k + (c) * CHUNK), _MM_HINT_T0);                                      \
    }                                                                                                          \
    const __m512i w0_ = _mm512_maskz_loadu_epi8((lm), q0 + (c) * CHUNK);                                       \
    const __m512 d0_ = blk >= CHUNK ? _mm512_set1_ps(d0[b_]) : _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps((dm), d0 + b_)); \
    __m512i w1_ = w0_;                                                                                         \
    __m512 d1_ = d0_;                                                                                          \
    if (NC == 2) {                                                                                             \
      w1_ = _mm512_maskz_loadu_epi8((lm), q0 + k + (c) * CHUNK);                                               \
      d1_ = blk >= CHUNK ? _mm512_set1_ps(d0[nb + b_]) : _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps((dm), d0 + nb + b_)); \
    }                                                                                                          \
    _Pragma("GCC unroll 8") for (int i = 0; i < MT; i++) {                                                     \
      const __m512i xv_ = _mm512_load_si512((const void*)(xq + ((c) * rows + i) * CHUNK));                     \
      const __m512 sv_ = _mm512_load_ps(sx + ((c) * rows + i) * 16);                                           \
      const __m512i t0_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0_, xv_);                               \
      a0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0_), _mm512_mul_ps(d0_, sv_), a0[i]);                         \
      if (NC == 2) {                                                                                           \
        const __m512i t1_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1_, xv_);                             \
        a1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1_), _mm512_mul_ps(d1_, sv_), a1[i]);                       \
      }                                                                                                        \
    }                                                                                                          \
  } while (0)

/* MT rows (m0..m0+MT) by NC columns (n, n+1): one pass over the columns' weights. */
VNNI static INLINE void tile(const qm8_weight* w, const qm8_rows* r, float* y, int64_t m0, const int MT, int64_t n, const int NC, __m512i idx, int perChunk) {
  const int64_t k = w->k, blk = w->blk, nb = k / blk, chunks = r->chunks;
  __m512 a0[8], a1[8];
  _Pragma("GCC unroll 8") for (int i = 0; i < MT; i++) a0[i] = a1[i] = _mm512_setzero_ps();
  const uint8_t* q0 = w->q + n * k;
  const float* d0 = w->scales + n * nb;
  /* rows of a chunk lie side by side ([chunks][m][64]): row i of the tile is i * 64 bytes on */
  const int64_t rows = r->m;
  const int8_t* xq = r->xq + m0 * CHUNK;
  const float* sx = r->sx + m0 * 16;
  const int blkShift = __builtin_ctzll((unsigned long long)blk);
  const __mmask16 dFull = (__mmask16)((1u << perChunk) - 1);
  /* every chunk but the last whole and within the scales */
  for (int64_t c = 0; c + 1 < chunks; c++) CHUNK_STEP(c, ~0ull, dFull);
  {
    const int64_t c = chunks - 1, left = nb - (c * CHUNK) / blk;
    const __mmask64 lm = (k % CHUNK) ? ((1ull << (k % CHUNK)) - 1) : ~0ull;
    const __mmask16 dm = (__mmask16)((1u << (left < perChunk ? left : perChunk)) - 1);
    CHUNK_STEP(c, lm, dm);
  }
  /* The zero point's term: minus sum over blocks of d * (sx * 128 * sum xq). */
  for (int64_t b = 0; b < nb; b += 16) {
    const __mmask16 bm = nb - b >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nb - b)) - 1);
    const __m512 e0 = _mm512_maskz_loadu_ps(bm, d0 + b);
    const __m512 e1 = NC == 2 ? _mm512_maskz_loadu_ps(bm, d0 + nb + b) : e0;
    _Pragma("GCC unroll 8") for (int i = 0; i < MT; i++) {
      const __m512 cv = _mm512_maskz_loadu_ps(bm, r->corr + (m0 + i) * nb + b);
      a0[i] = _mm512_fnmadd_ps(e0, cv, a0[i]);
      if (NC == 2) a1[i] = _mm512_fnmadd_ps(e1, cv, a1[i]);
    }
  }
  const float b0 = w->bias ? w->bias[n] : 0.0f, b1 = w->bias && NC == 2 ? w->bias[n + 1] : 0.0f;
  _Pragma("GCC unroll 8") for (int i = 0; i < MT; i++) {
    y[(m0 + i) * w->n + n] = _mm512_reduce_add_ps(a0[i]) + b0;
    if (NC == 2) y[(m0 + i) * w->n + n + 1] = _mm512_reduce_add_ps(a1[i]) + b1;
  }
}

#define TILE_CASE(MT)                                          \
  case MT:                                                     \
    for (n = n0; n + 1 < n1; n += 2) tile(w, r, y, m0, MT, n, 2, idx, perChunk); \
    if (n < n1) tile(w, r, y, m0, MT, n, 1, idx, perChunk);   \
    break;

VNNI static void columns_vnni(const qm8_weight* w, const qm8_rows* r, float* y, int64_t n0, int64_t n1) {
  const int64_t blk = w->blk;
  const int perChunk = blk < CHUNK ? (int)(CHUNK / blk) : 1;
  /* lane l of a chunk covers bytes 4l..4l+3: block (4l) / blk of the chunk's first */
  int lanes[16];
  for (int l = 0; l < 16; l++) lanes[l] = blk < CHUNK ? (int)((4 * l) / blk) : 0;
  const __m512i idx = _mm512_loadu_si512((const void*)lanes);
  for (int64_t m0 = 0; m0 < r->m; m0 += 8) {
    const int64_t mt = r->m - m0 < 8 ? r->m - m0 : 8;
    int64_t n;
    switch (mt) {
      TILE_CASE(1)
      TILE_CASE(2)
      TILE_CASE(3)
      TILE_CASE(4)
      TILE_CASE(5)
      TILE_CASE(6)
      TILE_CASE(7)
      TILE_CASE(8)
    }
  }
}

void qm8_columns(const qm8_weight* w, const qm8_rows* r, float* y, int64_t n0, int64_t n1) {
  if (qm8_vnni()) columns_vnni(w, r, y, n0, n1);
  else columns_c(w, r, y, n0, n1);
}
