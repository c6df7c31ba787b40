/*
 * Causal grouped-query attention (attention.h), for ragguard-ops.c's GroupQueryAttention.
 *
 * A task takes 64 query rows of one row b and KV head g: the G = N / Nkv query heads that share the
 * head, position after position (row r is token r / G's head g G + r % G), so a decode step's G heads
 * fill one task and a prefill's rows fill whole ones. Its queries, rotated and scaled, are laid out
 * transposed, 16 rows side by side: a score is then an FMA of a key's broadcast component with 16
 * rows' components, 16 rows' softmax state is one vector, and nothing is summed across lanes. Keys
 * go by in steps of 64 up to the task's last position (the causal half only): scores, the running max
 * and sum (each lane masked to the keys its token sees), then the values weighted into the task's
 * output rows, which stay in the thread's scratch until the last step divides them by the sum.
 *
 * On AVX512 (qm_vnni: the ops' own switch) the steps are vector code; elsewhere a plain C path
 * computes the same function a row at a time (the portable test compares the two).
 */
#include "attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "qmatmul.h"
#include "vexp.h"

#define ROWS 64 /* query rows a task: 4 vectors of 16 */
#define KEYS 32 /* keys a step: their keys and values (16 KB each at D = 128) stay in L1 while the rows pass */
#define AVX512 __attribute__((target("avx512f")))
#define INLINE static inline __attribute__((always_inline))

/* One head's rotary embedding of `x` at position `pos`, times `mul`, into y (y may be x). */
INLINE void rotate(const attn_problem* p, const float* x, float* y, int64_t pos, float mul) {
  const int64_t D = p->dim, half = p->rotaryHalf;
  if (half == 0) {
    for (int64_t d = 0; d < D; d++) y[d] = x[d] * mul;
    return;
  }
  const float *c = p->cos + pos * half, *s = p->sin + pos * half;
  if (p->interleaved) {
    for (int64_t j = 0; j < half; j++) {
      const float a = x[2 * j], b = x[2 * j + 1];
      y[2 * j] = (a * c[j] - b * s[j]) * mul;
      y[2 * j + 1] = (b * c[j] + a * s[j]) * mul;
    }
  } else {
    for (int64_t j = 0; j < half; j++) {
      const float a = x[j], b = x[j + half];
      y[j] = (a * c[j] - b * s[j]) * mul;
      y[j + half] = (b * c[j] + a * s[j]) * mul;
    }
  }
  for (int64_t d = 2 * half; d < D; d++) y[d] = x[d] * mul;
}

AVX512 static void rotate_avx512(const attn_problem* p, const float* x, float* y, int64_t pos, float mul) { rotate(p, x, y, pos, mul); }
static void rotate_c(const attn_problem* p, const float* x, float* y, int64_t pos, float mul) { rotate(p, x, y, pos, mul); }

void attn_store_kv(const attn_problem* p, int64_t b, int64_t s0, int64_t s1) {
  const int64_t D = p->dim, N = p->heads, Nkv = p->kvHeads, width = (N + 2 * Nkv) * D;
  const int vec = qm_vnni();
  for (int64_t i = s0; i < s1; i++) {
    const int64_t pos = p->past[b] + i;
    const float* row = p->qkv + (b * p->seq + i) * width;
    for (int64_t g = 0; g < Nkv; g++) {
      const int64_t at = ((b * Nkv + g) * p->cap + pos) * D;
      if (vec) rotate_avx512(p, row + (N + g) * D, p->keys + at, pos, 1.0f);
      else rotate_c(p, row + (N + g) * D, p->keys + at, pos, 1.0f);
      memcpy(p->values + at, row + (N + Nkv + g) * D, (size_t)D * sizeof(float));
    }
  }
}

/* Tasks per row b and KV head: blocks of ROWS of the S G query rows. */
static int64_t blocks(const attn_problem* p) { return (p->seq * (p->heads / p->kvHeads) + ROWS - 1) / ROWS; }

int64_t attn_tasks(const attn_problem* p) { return blocks(p) * p->batch * p->kvHeads; }

size_t attn_scratch_bytes(const attn_problem* p) {
  /* transposed queries and output rows (ROWS x D each), a step's scores (KEYS x ROWS), max, sum, scale, positions */
  return ((size_t)(2 * ROWS * p->dim + KEYS * ROWS + 3 * ROWS) * sizeof(float) + ROWS * sizeof(int32_t) + 63) & ~(size_t)63;
}

/* Which rows b, head g and first query row task t takes: the last blocks (the longest) first. */
static void place(const attn_problem* p, int64_t t, int64_t* b, int64_t* g, int64_t* r0) {
  const int64_t pairs = p->batch * p->kvHeads, blk = blocks(p) - 1 - t / pairs;
  *b = (t % pairs) / p->kvHeads;
  *g = (t % pairs) % p->kvHeads;
  *r0 = blk * ROWS;
}

/* --- AVX512 ---------------------------------------------------------------------------------------- */

/* Scores of NK keys (from `k`, D apart) for NV vectors of 16 rows (qt: [NV][D][16]), into sc[key][NV * 16]. */
AVX512 INLINE void scores(int nv, int nk, const float* qt, const float* k, int64_t D, float* sc, int64_t stride) {
  __m512 acc[8][2];
  for (int j = 0; j < nk; j++)
    for (int v = 0; v < nv; v++) acc[j][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d++) {
    __m512 q[2];
    for (int v = 0; v < nv; v++) q[v] = _mm512_load_ps(qt + (v * D + d) * 16);
    for (int j = 0; j < nk; j++) {
      const __m512 kd = _mm512_set1_ps(k[j * D + d]);
      for (int v = 0; v < nv; v++) acc[j][v] = _mm512_fmadd_ps(kd, q[v], acc[j][v]);
    }
  }
  for (int j = 0; j < nk; j++)
    for (int v = 0; v < nv; v++) _mm512_store_ps(sc + j * stride + v * 16, acc[j][v]);
}

AVX512 static void scores_any(int nv, int nk, const float* qt, const float* k, int64_t D, float* sc, int64_t stride) {
#define SC(V, K) \
  case V * 8 + K: scores(V, K, qt, k, D, sc, stride); break;
  switch (nv * 8 + nk) {
    SC(1, 8) SC(2, 8) SC(1, 1) SC(2, 1)
    default: break;
  }
#undef SC
}

/* Output rows o0 and o1 (D floats each, NZ vectors: D = 16 NZ) scaled by a0 and a1, plus NK keys' values
 * weighted by their probabilities (pr[key * stride], pr[key * stride + 1]). */
AVX512 INLINE void weigh(int nz, float* o, int64_t D, float a0, float a1, const float* pr, int64_t stride, const float* v, int64_t nk) {
  __m512 x[8], y[8];
  for (int z = 0; z < nz; z++) {
    x[z] = _mm512_mul_ps(_mm512_load_ps(o + z * 16), _mm512_set1_ps(a0));
    y[z] = _mm512_mul_ps(_mm512_load_ps(o + D + z * 16), _mm512_set1_ps(a1));
  }
  for (int64_t t = 0; t < nk; t++) {
    const __m512 p0 = _mm512_set1_ps(pr[t * stride]), p1 = _mm512_set1_ps(pr[t * stride + 1]);
    const float* vt = v + t * D;
    for (int z = 0; z < nz; z++) {
      const __m512 vz = _mm512_loadu_ps(vt + z * 16);
      x[z] = _mm512_fmadd_ps(p0, vz, x[z]);
      y[z] = _mm512_fmadd_ps(p1, vz, y[z]);
    }
  }
  for (int z = 0; z < nz; z++) {
    _mm512_store_ps(o + z * 16, x[z]);
    _mm512_store_ps(o + D + z * 16, y[z]);
  }
}

/* weigh() over D in chunks of up to 128 (8 vectors: 16 accumulators in registers). */
AVX512 static void weigh_any(float* o, int64_t D, float a0, float a1, const float* pr, int64_t stride, const float* v, int64_t nk) {
  for (int64_t d0 = 0; d0 < D; d0 += 128) {
    const int nz = (int)((D - d0 < 128 ? D - d0 : 128) / 16);
#define W(Z) \
  case Z: weigh(Z, o + d0, D, a0, a1, pr, stride, v + d0, nk); break;
    switch (nz) { W(1) W(2) W(3) W(4) W(5) W(6) W(7) W(8) default: break; }
#undef W
  }
}

AVX512 static void task_avx512(const attn_problem* p, int64_t b, int64_t g, int64_t r0, char* scratch) {
  const int64_t D = p->dim, N = p->heads, Nkv = p->kvHeads, G = N / Nkv, width = (N + 2 * Nkv) * D;
  const int64_t all = p->seq * G, rows = all - r0 < ROWS ? all - r0 : ROWS;
  const int nv = (int)((rows + 15) / 16), stride = nv * 16;
  float *qt = (float*)scratch, *o = qt + ROWS * D, *sc = o + ROWS * D, *mx = sc + KEYS * ROWS, *sum = mx + ROWS, *alpha = sum + ROWS;
  int32_t* pos = (int32_t*)(alpha + ROWS);
  const int64_t past = p->past[b];
  /* the rows' queries, rotated and scaled, transposed 16 rows side by side; rows past the last: zero, seeing no key */
  float q[D];
  int32_t last = 0;
  for (int r = 0; r < stride; r++) {
    if (r < rows) {
      const int64_t i = (r0 + r) / G, h = g * G + (r0 + r) % G;
      pos[r] = (int32_t)(past + i);
      last = pos[r];
      rotate(p, p->qkv + (b * p->seq + i) * width + h * D, q, past + i, p->scale);
    } else {
      pos[r] = -1;
      memset(q, 0, sizeof q);
    }
    for (int64_t d = 0; d < D; d++) qt[((r / 16) * D + d) * 16 + r % 16] = q[d];
    mx[r] = -1e30f;
    sum[r] = 0.0f;
  }
  memset(o, 0, (size_t)(stride * D) * sizeof(float));
  const float *keys = p->keys + (b * Nkv + g) * p->cap * D, *values = p->values + (b * Nkv + g) * p->cap * D;
  for (int64_t t0 = 0; t0 <= last; t0 += KEYS) {
    const int64_t nk = last + 1 - t0 < KEYS ? last + 1 - t0 : KEYS;
    /* two vectors of rows by 8 keys at a time: 16 sums in registers, the two vectors' queries (16 KB) in L1 */
    int64_t t = 0;
    for (int v = 0; v < nv; v += 2) {
      const int vc = nv - v < 2 ? nv - v : 2;
      for (t = 0; t + 8 <= nk; t += 8) scores_any(vc, 8, qt + v * D * 16, keys + (t0 + t) * D, D, sc + t * stride + v * 16, stride);
      for (; t < nk; t++) scores_any(vc, 1, qt + v * D * 16, keys + (t0 + t) * D, D, sc + t * stride + v * 16, stride);
    }
    /* the running max and sum of each lane over the keys its token sees (key t0 + t <= its position) */
    for (int v = 0; v < nv; v++) {
      const __m512i at = _mm512_loadu_si512(pos + v * 16);
      const __m512 m0 = _mm512_loadu_ps(mx + v * 16);
      __m512 m1 = m0;
      for (t = 0; t < nk; t++) {
        const __mmask16 sees = _mm512_cmp_epi32_mask(_mm512_set1_epi32((int32_t)(t0 + t)), at, _MM_CMPINT_LE);
        m1 = _mm512_mask_max_ps(m1, sees, m1, _mm512_load_ps(sc + t * stride + v * 16));
      }
      __m512 s = _mm512_setzero_ps();
      for (t = 0; t < nk; t++) {
        const __mmask16 sees = _mm512_cmp_epi32_mask(_mm512_set1_epi32((int32_t)(t0 + t)), at, _MM_CMPINT_LE);
        const __m512 e = _mm512_maskz_mov_ps(sees, exp512(_mm512_sub_ps(_mm512_load_ps(sc + t * stride + v * 16), m1)));
        _mm512_store_ps(sc + t * stride + v * 16, e);
        s = _mm512_add_ps(s, e);
      }
      const __m512 a = exp512(_mm512_sub_ps(m0, m1));
      _mm512_storeu_ps(alpha + v * 16, a);
      _mm512_storeu_ps(sum + v * 16, _mm512_fmadd_ps(_mm512_loadu_ps(sum + v * 16), a, s));
      _mm512_storeu_ps(mx + v * 16, m1);
    }
    /* rows in pairs (a pair's second past the last: a zero row, its probabilities zero) */
    for (int r = 0; r < rows; r += 2) weigh_any(o + r * D, D, alpha[r], alpha[r + 1], sc + r, stride, values + t0 * D, nk);
  }
  for (int r = 0; r < rows; r++) {
    const int64_t i = (r0 + r) / G, h = g * G + (r0 + r) % G;
    const __m512 inv = _mm512_set1_ps(1.0f / sum[r]);
    float* y = p->out + (b * p->seq + i) * N * D + h * D;
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(y + d, _mm512_mul_ps(_mm512_load_ps(o + r * D + d), inv));
  }
}

/* --- plain C ---------------------------------------------------------------------------------------- */

static void task_c(const attn_problem* p, int64_t b, int64_t g, int64_t r0, char* scratch) {
  const int64_t D = p->dim, N = p->heads, Nkv = p->kvHeads, G = N / Nkv, width = (N + 2 * Nkv) * D;
  const int64_t all = p->seq * G, rows = all - r0 < ROWS ? all - r0 : ROWS;
  float *q = (float*)scratch, *w = q + D, *acc = w + D;
  const float *keys = p->keys + (b * Nkv + g) * p->cap * D, *values = p->values + (b * Nkv + g) * p->cap * D;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t i = (r0 + r) / G, h = g * G + (r0 + r) % G, last = p->past[b] + i;
    rotate_c(p, p->qkv + (b * p->seq + i) * width + h * D, q, last, p->scale);
    /* softmax over keys 0 .. last, a block of D keys at a time (w), the running max m and sum s */
    float m = -1e30f, s = 0.0f;
    memset(acc, 0, (size_t)D * sizeof(float));
    for (int64_t t0 = 0; t0 <= last; t0 += D) {
      const int64_t nk = last + 1 - t0 < D ? last + 1 - t0 : D;
      float m1 = m;
      for (int64_t t = 0; t < nk; t++) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += q[d] * keys[(t0 + t) * D + d];
        w[t] = dot;
        if (dot > m1) m1 = dot;
      }
      const float a = expf(m - m1);
      s *= a;
      for (int64_t d = 0; d < D; d++) acc[d] *= a;
      for (int64_t t = 0; t < nk; t++) {
        const float e = expf(w[t] - m1);
        s += e;
        for (int64_t d = 0; d < D; d++) acc[d] += e * values[(t0 + t) * D + d];
      }
      m = m1;
    }
    float* y = p->out + (b * p->seq + i) * N * D + h * D;
    for (int64_t d = 0; d < D; d++) y[d] = acc[d] / s;
  }
}

void attn_task(const attn_problem* p, int64_t t, void* scratch) {
  int64_t b, g, r0;
  place(p, t, &b, &g, &r0);
  if (qm_vnni()) task_avx512(p, b, g, r0, scratch);
  else task_c(p, b, g, r0, scratch);
}
