/*
 * The block products behind ragguard's QMatMul8 and QMatMul4 ops (ragguard-ops.c): see qmatmul.h.
 *
 * Why a kernel of our own: in a decode step of 8 rows ONNX Runtime's MatMulNBits (accuracy level 4)
 * made about 12 multiply-adds a cycle a core on this machine's AVX512-VNNI cores, and its products were
 * most of the step: each 64 weight bytes' integer dot product is converted, scaled and added on its own
 * (the 64 bytes span two blocks of 32, or four of 16, each with its own scales), and it computed and
 * waited on memory in turn. Here the weights lie 16
 * columns side by side (4 bytes of each column in one 64-byte vector), so one VPDPBUSD (unsigned
 * weights times 4 signed bytes of x broadcast, 64 products into 16 int32 lanes, a lane a column) adds
 * 4 products to each of 16 columns, and a block of 32 is 8 of them summed in int32 before its only
 * conversion and scaling: 11 vector operations for 512 multiply-adds a row, against 32 the other way.
 * The lanes are the output columns, so no horizontal sums either. The weights of the next 16 columns
 * are prefetched while these compute: without it a step waited on memory and computed in turn.
 *
 * The zero point (128) is taken off in the integers: each block's sum starts at -128 * sum(xq), so the
 * dot product of the signed weights is exact before its one conversion, as llama.cpp's own are. At 4
 * bits a vector holds 8 values of each of 16 columns (4 in the low nibbles, 4 in the high), two
 * VPDPBUSDs once unpacked; each column's zero point of the block comes off after the integer sum, in
 * floats but exactly (integers below 2^24).
 * CPUs without AVX512-VNNI run the same arithmetic in plain C (slow, the same numbers up to the order
 * of float sums).
 */
#include "qmatmul.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int qm_supported(int64_t k, int64_t blk) {
  /* a power of two from 16: a block is whole vectors of each column at 8 bits (4 bytes) and at 4 (8 values) */
  if (k <= 0 || blk < 16 || (blk & (blk - 1)) != 0 || k % blk != 0) return 0;
  return 1;
}

/* Set: the plain C path even where the CPU has AVX512-VNNI (a test checks it against the same inputs). */
static int portable;

void qm_set_portable(int on) { portable = on; }

int qm_cpu_vnni(void) {
  static int known = -1;
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  }
  return known;
}

int qm_vnni(void) { return !portable && qm_cpu_vnni(); }

/* Set: the AVX512-VNNI kernels even where AMX could run (qm_set_amx(0): a test compares the two). */
static int amx_off;

void qm_set_amx(int on) { amx_off = !on; }

/*
 * AMX (the tile registers and TDPBSUD): the CPU says it has AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits
 * 24 and 25) and Linux grants this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, 18); a hypervisor that does not pass the state through refuses the request, and the
 * products stay on AVX512-VNNI. RAGGUARD_OPS_AMX=0 in the environment keeps them there too.
 */
int qm_amx(void) {
  static int known = -1;
  if (portable || amx_off || !qm_vnni()) return 0;
  if (known < 0) {
    int ok = 0;
#if defined(__x86_64__) && defined(__linux__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const char* env = getenv("RAGGUARD_OPS_AMX");
    if (((d >> 24) & 1) && ((d >> 25) & 1) && !(env && strcmp(env, "0") == 0)) ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#endif
    known = ok;
  }
  return known;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define INLINE __attribute__((always_inline)) inline

/* x's rows quantized per block: round to nearest even (the same as nearbyintf) of x * 127 / max|x|. */
VNNI static void quantize_vnni(qm_rows* r, const float* x, int64_t i0, int64_t i1) {
  const int64_t k = r->k, blk = r->blk, nb = k / blk;
  for (int64_t i = i0; i < i1; i++) {
    for (int64_t b = 0; b < nb; b++) {
      const float* xb = x + i * k + b * blk;
      __m512 mx = _mm512_setzero_ps();
      for (int64_t j = 0; j < blk; j += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(xb + j)));
      const float amax = _mm512_reduce_max_ps(mx);
      const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512 vinv = _mm512_set1_ps(inv);
      __m512i sum = _mm512_setzero_si512();
      for (int64_t j = 0; j < blk; j += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + j), vinv));
        v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        sum = _mm512_add_epi32(sum, v);
        _mm_storeu_si128((__m128i*)(r->xq + i * k + b * blk + j), _mm512_cvtepi32_epi8(v));
      }
      r->sx[i * nb + b] = s;
      r->xsum[i * nb + b] = _mm512_reduce_add_epi32(sum);
      r->xsumf[i * nb + b] = (float)r->xsum[i * nb + b];
    }
  }
}

static void quantize_c(qm_rows* r, const float* x, int64_t i0, int64_t i1) {
  const int64_t k = r->k, blk = r->blk, nb = k / blk;
  for (int64_t i = i0; i < i1; i++) {
    for (int64_t b = 0; b < nb; b++) {
      const float* xb = x + i * k + b * blk;
      float amax = 0.0f;
      for (int64_t j = 0; j < blk; j++) amax = fmaxf(amax, fabsf(xb[j]));
      const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int64_t j = 0; j < blk; j++) {
        float v = nearbyintf(xb[j] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        r->xq[i * k + b * blk + j] = (int8_t)v;
        sum += (int32_t)v;
      }
      r->sx[i * nb + b] = s;
      r->xsum[i * nb + b] = sum;
      r->xsumf[i * nb + b] = (float)sum;
    }
  }
}

/* Where the rows' parts lie in their memory: xq, then sx, xsum and xsumf, each from a 64-byte boundary. */
static size_t xq_bytes(int64_t m, int64_t k) { return up64((size_t)(m * k)); }
static size_t block_bytes(int64_t m, int64_t k, int64_t blk) { return up64((size_t)(m * (k / blk)) * sizeof(float)); }

size_t qm_rows_bytes(int64_t m, int64_t k, int64_t blk) { return xq_bytes(m, k) + 3 * block_bytes(m, k, blk); }

void qm_rows_layout(qm_rows* r, void* mem, int64_t m, int64_t k, int64_t blk) {
  r->m = m;
  r->k = k;
  r->blk = blk;
  r->xq = (int8_t*)mem;
  r->sx = (float*)((char*)mem + xq_bytes(m, k));
  r->xsum = (int32_t*)((char*)mem + xq_bytes(m, k) + block_bytes(m, k, blk));
  r->xsumf = (float*)((char*)mem + xq_bytes(m, k) + 2 * block_bytes(m, k, blk));
}

void qm_rows_quantize(qm_rows* r, const float* x, int64_t i0, int64_t i1) {
  if (qm_vnni()) quantize_vnni(r, x, i0, i1);
  else quantize_c(r, x, i0, i1);
}

void qm_rows_init(qm_rows* r, void* mem, const float* x, int64_t m, int64_t k, int64_t blk) {
  qm_rows_layout(r, mem, m, k, blk);
  qm_rows_quantize(r, x, 0, m);
}

/*
 * qm_add_product on AVX512. v's rows lie n floats apart: a group's 16 columns of them are copied side by
 * side first (64 t at a time, 4 KB a group), as read in place their lines fall in two of L1's sets when
 * n x 4 bytes is a multiple of 2 KB (17,920 columns) and every load went to L2; then 4 rows at a time
 * against both groups, 8 independent sums, each v load and u broadcast used twice or four times.
 */
#define AP_T 64
__attribute__((target("avx512f"))) static void add_rows_avx512(float* y, int64_t n, const float* u, int64_t r, int64_t t0, int64_t t1,
                                                               const float* vp, int64_t groups, int64_t c0, __mmask16 m0, __mmask16 m1,
                                                               int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    const float *u0 = u + i * r, *u1 = u0 + r, *u2 = u1 + r, *u3 = u2 + r;
    for (int64_t t = t0; t < t1; t++) {
      const __m512 v0 = _mm512_load_ps(vp + (t - t0) * 16), v1 = _mm512_load_ps(vp + (AP_T + t - t0) * 16);
      const __m512 b0 = _mm512_set1_ps(u0[t]), b1 = _mm512_set1_ps(u1[t]), b2 = _mm512_set1_ps(u2[t]), b3 = _mm512_set1_ps(u3[t]);
      a00 = _mm512_fmadd_ps(b0, v0, a00);
      a01 = _mm512_fmadd_ps(b0, v1, a01);
      a10 = _mm512_fmadd_ps(b1, v0, a10);
      a11 = _mm512_fmadd_ps(b1, v1, a11);
      a20 = _mm512_fmadd_ps(b2, v0, a20);
      a21 = _mm512_fmadd_ps(b2, v1, a21);
      a30 = _mm512_fmadd_ps(b3, v0, a30);
      a31 = _mm512_fmadd_ps(b3, v1, a31);
    }
    const __m512 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    for (int j = 0; j < 4; j++) {
      float* yi = y + (i + j) * n + c0;
      _mm512_mask_storeu_ps(yi, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, yi), acc[j][0]));
      if (groups > 1) _mm512_mask_storeu_ps(yi + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, yi + 16), acc[j][1]));
    }
  }
  for (; i < i1; i++) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (int64_t t = t0; t < t1; t++) {
      const __m512 b = _mm512_set1_ps(u[i * r + t]);
      a0 = _mm512_fmadd_ps(b, _mm512_load_ps(vp + (t - t0) * 16), a0);
      a1 = _mm512_fmadd_ps(b, _mm512_load_ps(vp + (AP_T + t - t0) * 16), a1);
    }
    float* yi = y + i * n + c0;
    _mm512_mask_storeu_ps(yi, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, yi), a0));
    if (groups > 1) _mm512_mask_storeu_ps(yi + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, yi + 16), a1));
  }
}

__attribute__((target("avx512f"))) static void add_product_avx512(float* y, int64_t m, int64_t n, const float* u, int64_t r, const float* v,
                                                                  int64_t per_batch, int shared, int64_t g0, int64_t g1) {
  _Alignas(64) float vp[2 * AP_T * 16];
  for (int64_t g = g0; g < g1; g += 2) {
    const int64_t c0 = 16 * g;
    if (c0 >= n) break;
    const int64_t groups = g + 1 < g1 && c0 + 16 < n ? 2 : 1;
    const __mmask16 m0 = n - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c0)) - 1);
    const __mmask16 m1 = groups < 2 ? 0 : n - c0 - 16 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c0 - 16)) - 1);
    /* one batch row's B at a time (every row's, where shared) */
    for (int64_t b0 = 0; b0 < m; b0 += shared ? m : per_batch) {
      const int64_t b1 = shared || b0 + per_batch > m ? m : b0 + per_batch;
      const float* vb = v + (shared ? 0 : b0 / per_batch) * r * n + c0;
      for (int64_t t0 = 0; t0 < r; t0 += AP_T) {
        const int64_t t1 = t0 + AP_T < r ? t0 + AP_T : r;
        for (int64_t t = t0; t < t1; t++) {
          _mm512_store_ps(vp + (t - t0) * 16, _mm512_maskz_loadu_ps(m0, vb + t * n));
          _mm512_store_ps(vp + (AP_T + t - t0) * 16, _mm512_maskz_loadu_ps(m1, vb + t * n + 16));
        }
        add_rows_avx512(y, n, u, r, t0, t1, vp, groups, c0, m0, m1, b0, b1);
      }
    }
  }
}

void qm_add_product(float* y, int64_t m, int64_t n, const float* u, int64_t r, const float* v, int64_t per_batch, int shared, int64_t g0, int64_t g1) {
  if (r <= 0 || m <= 0) return;
  if (per_batch <= 0) per_batch = m;
  if (qm_vnni()) {
    add_product_avx512(y, m, n, u, r, v, per_batch, shared, g0, g1);
    return;
  }
  for (int64_t g = g0; g < g1; g++) {
    for (int64_t i = 0; i < m; i++) {
      const float* vi = v + (shared ? 0 : i / per_batch) * r * n;
      for (int64_t c = 16 * g; c < 16 * g + 16 && c < n; c++) {
        float acc = 0.0f;
        for (int64_t t = 0; t < r; t++) acc += u[i * r + t] * vi[t * n + c];
        y[i * n + c] += acc;
      }
    }
  }
}

static void groups8_c(const qm8_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) {
  const int64_t k = w->k, blk = w->blk, nb = k / blk, quads = k / 4;
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* qg = w->q + g * quads * 64;
    const float* dg = w->scales + g * nb * 16;
    for (int64_t i = 0; i < r->m; i++) {
      const int8_t* xi = r->xq + i * k;
      float acc[16] = {0};
      for (int64_t b = 0; b < nb; b++) {
        int32_t dot[16];
        for (int c = 0; c < 16; c++) dot[c] = -128 * r->xsum[i * nb + b];
        for (int64_t j = b * blk / 4; j < (b + 1) * blk / 4; j++)
          for (int c = 0; c < 16; c++)
            for (int e = 0; e < 4; e++) dot[c] += (int32_t)qg[j * 64 + c * 4 + e] * (int32_t)xi[4 * j + e];
        const float sx = r->sx[i * nb + b];
        for (int c = 0; c < 16; c++) acc[c] += ((float)dot[c] * sx) * dg[b * 16 + c];
      }
      for (int c = 0; c < 16 && 16 * g + c < w->n; c++) y[i * w->n + 16 * g + c] = acc[c] + (w->bias ? w->bias[16 * g + c] : 0.0f);
    }
  }
}

/* A tile's sums into y: rows m0..m0+MT of group g's columns below n, plus their bias. */
VNNI static INLINE void store_tile(float* y, int64_t n, const float* bias, int64_t g, int64_t m0, const int MT, const __m512* acc) {
  const int64_t left = n - 16 * g;
  const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + 16 * g) : _mm512_setzero_ps();
  _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) _mm512_mask_storeu_ps(y + (m0 + i) * n + 16 * g, keep, _mm512_add_ps(acc[i], b));
}

/*
 * Groups g0..g1 of every row, the rows 8 at a time (a group's weights, 16 k bytes or half that, stay in
 * cache for the next 8): TILE(w, r, y, g, m0, MT, prefetch) with MT a constant, so its loops unroll
 * over registers; the next group's weights are prefetched on the first pass over a group only.
 */
#define TILE_CASE(TILE, MT) \
  case MT:                  \
    TILE(w, r, y, g, m0, MT, m0 == 0); \
    break;
#define FOR_TILES(TILE)                                          \
  for (int64_t g = g0; g < g1; g++)                              \
    for (int64_t m0 = 0; m0 < r->m; m0 += 8) switch (r->m - m0 < 8 ? r->m - m0 : 8) { \
        TILE_CASE(TILE, 1)                                       \
        TILE_CASE(TILE, 2)                                       \
        TILE_CASE(TILE, 3)                                       \
        TILE_CASE(TILE, 4)                                       \
        TILE_CASE(TILE, 5)                                       \
        TILE_CASE(TILE, 6)                                       \
        TILE_CASE(TILE, 7)                                       \
        TILE_CASE(TILE, 8)                                       \
      }

/* Rows m0..m0+MT of 8-bit column group g: one pass over the group's weights, a block at a time. */
VNNI static INLINE void tile8(const qm8_weight* w, const qm_rows* r, float* y, int64_t g, int64_t m0, const int MT, int prefetch) {
  const int64_t k = w->k, blk = w->blk, nb = k / blk, quads = k / 4, bq = blk / 4;
  const uint8_t* qg = w->q + g * quads * 64;
  const float* dg = w->scales + g * nb * 16;
  const int8_t* x0 = r->xq + m0 * k;
  __m512 acc[16];
  _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    __m512i s[16];
    _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) s[i] = _mm512_set1_epi32(-128 * r->xsum[(m0 + i) * nb + b]);
    for (int64_t j0 = 0; j0 < bq; j0 += 8) {
      const int64_t jn = bq - j0 < 8 ? bq - j0 : 8;
      const uint8_t* qb = qg + (b * bq + j0) * 64;
      /* the next group's same lines, a group (16 k bytes) ahead: they arrive while this one computes */
      if (prefetch)
        for (int64_t j = 0; j < jn; j++) _mm_prefetch((const char*)(qb + quads * 64 + j * 64), _MM_HINT_T0);
      if (jn == 8) {
        __m512i wv[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) wv[j] = _mm512_loadu_si512((const void*)(qb + j * 64));
        _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) {
          const int8_t* xb = x0 + i * k + b * blk + 4 * j0;
          _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            int32_t v;
            memcpy(&v, xb + 4 * j, 4);
            s[i] = _mm512_dpbusd_epi32(s[i], wv[j], _mm512_set1_epi32(v));
          }
        }
      } else {
        for (int64_t j = 0; j < jn; j++) {
          const __m512i wv = _mm512_loadu_si512((const void*)(qb + j * 64));
          _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) {
            int32_t v;
            memcpy(&v, x0 + i * k + b * blk + 4 * (j0 + j), 4);
            s[i] = _mm512_dpbusd_epi32(s[i], wv, _mm512_set1_epi32(v));
          }
        }
      }
    }
    const __m512 d = _mm512_loadu_ps(dg + b * 16);
    _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) {
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(s[i]), _mm512_set1_ps(r->sx[(m0 + i) * nb + b]));
      acc[i] = _mm512_fmadd_ps(u, d, acc[i]);
    }
  }
  store_tile(y, w->n, w->bias, g, m0, MT, acc);
}

VNNI static void groups8_vnni(const qm8_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) { FOR_TILES(tile8) }


/* --- 4 bits ------------------------------------------------------------------------------------- */

static void groups4_c(const qm4_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) {
  const int64_t k = w->k, blk = w->blk, nb = k / blk, pairs = k / 8;
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* qg = w->q + g * pairs * 64;
    const float* dg = w->scales + g * nb * 16;
    const float* og = w->offsets + g * nb * 16;
    for (int64_t i = 0; i < r->m; i++) {
      const int8_t* xi = r->xq + i * k;
      float acc[16] = {0};
      for (int64_t b = 0; b < nb; b++) {
        int32_t dot[16] = {0};
        for (int64_t p = b * blk / 8; p < (b + 1) * blk / 8; p++)
          for (int c = 0; c < 16; c++)
            for (int e = 0; e < 4; e++) {
              const uint8_t v = qg[p * 64 + c * 4 + e];
              dot[c] += (int32_t)(v & 15) * (int32_t)xi[8 * p + e] + (int32_t)(v >> 4) * (int32_t)xi[8 * p + 4 + e];
            }
        const float sx = r->sx[i * nb + b], sum = r->xsumf[i * nb + b];
        for (int c = 0; c < 16; c++) acc[c] += ((float)dot[c] * dg[b * 16 + c] + og[b * 16 + c] * sum) * sx;
      }
      for (int c = 0; c < 16 && 16 * g + c < w->n; c++) y[i * w->n + 16 * g + c] = acc[c] + (w->bias ? w->bias[16 * g + c] : 0.0f);
    }
  }
}

/*
 * Rows m0..m0+MT of 4-bit column group g. A 64-byte vector holds 8 values of each of 16 columns (4 in
 * its low nibbles, the next 4 in its high ones): two VPDPBUSDs once unpacked. After the block's integer
 * sum: (d sum + offset sum(xq)) sx, each column's scale and offset of the block (the offset holds the
 * zero point and the min: as many operations as the zero point alone took).
 */
VNNI static INLINE void tile4(const qm4_weight* w, const qm_rows* r, float* y, int64_t g, int64_t m0, const int MT, int prefetch) {
  const int64_t k = w->k, blk = w->blk, nb = k / blk, pairs = k / 8, bp = blk / 8;
  const uint8_t* qg = w->q + g * pairs * 64;
  const float* dg = w->scales + g * nb * 16;
  const float* og = w->offsets + g * nb * 16;
  const int8_t* x0 = r->xq + m0 * k;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[16];
  _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    __m512i s[16];
    _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) s[i] = _mm512_setzero_si512();
    for (int64_t p0 = 0; p0 < bp; p0 += 4) {
      const int64_t pn = bp - p0 < 4 ? bp - p0 : 4;
      const uint8_t* qb = qg + (b * bp + p0) * 64;
      if (prefetch)
        for (int64_t j = 0; j < pn; j++) _mm_prefetch((const char*)(qb + pairs * 64 + j * 64), _MM_HINT_T0);
      for (int64_t j = 0; j < pn; j++) {
        const __m512i v = _mm512_loadu_si512((const void*)(qb + j * 64));
        const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) {
          int32_t a, c;
          memcpy(&a, x0 + i * k + b * blk + 8 * (p0 + j), 4);
          memcpy(&c, x0 + i * k + b * blk + 8 * (p0 + j) + 4, 4);
          s[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s[i], lo, _mm512_set1_epi32(a)), hi, _mm512_set1_epi32(c));
        }
      }
    }
    const __m512 d = _mm512_loadu_ps(dg + b * 16), o = _mm512_loadu_ps(og + b * 16);
    _Pragma("GCC unroll 16") for (int i = 0; i < MT; i++) {
      const __m512 u = _mm512_fmadd_ps(o, _mm512_set1_ps(r->xsumf[(m0 + i) * nb + b]), _mm512_mul_ps(_mm512_cvtepi32_ps(s[i]), d));
      acc[i] = _mm512_fmadd_ps(u, _mm512_set1_ps(r->sx[(m0 + i) * nb + b]), acc[i]);
    }
  }
  store_tile(y, w->n, w->bias, g, m0, MT, acc);
}

VNNI static void groups4_vnni(const qm4_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) { FOR_TILES(tile4) }

/* --- AMX: prefills (16 rows or more) ---------------------------------------------------------------- */

/*
 * At 16 rows or more the products run on AMX where the CPU and the kernel allow it (qm_amx): TDPBSUD
 * multiplies a tile of 16 rows of x (signed bytes) by a tile of k-quads of 16 columns' weights (unsigned
 * bytes), the layout the weights already have (one 64-byte row of the 8-bit layout is 4 bytes of each of
 * 16 columns: one row of a B tile), into 16 x 16 int32 sums: 16 times VPDPBUSD's multiply-adds an
 * instruction. The sums are a block's (the tiles span one block, or 64 k of a longer one), so each block's
 * integer dot product is exactly the AVX512-VNNI kernel's, and its conversion and scaling are the same
 * operations in the same order (the zero point's term in the integers at 8 bits, in floats at 4): the
 * outputs are bit for bit the VNNI kernel's. A tile step is 2 x 16 rows by 2 groups (4 sum tiles, 2 of
 * x, 2 of weights: the 8 tile registers); a pair of groups' weights (k x 32 bytes; at 4 bits unpacked
 * once a pair into k-quads of bytes) stays in cache while every row passes. Rows past the last 16 take
 * the AVX512-VNNI tiles.
 */
#define AMX __attribute__((target("avx512f,avx512bw,avx512vnni,amx-tile,amx-int8")))

#include "amx-tiles.h"

/*
 * Block e's sums (sum[i]: row m0 + i, 16 columns) converted and scaled into the rows' accumulators: the
 * operations tile8 and tile4 do, in their order.
 */
AMX static INLINE void amx_scale(const int BITS, int64_t nb, const qm_rows* r, const float* dg, const float* og, int64_t m0, int64_t e,
                                 const int32_t (*sum)[16], __m512* acc) {
  const __m512 d = _mm512_loadu_ps(dg + e * 16);
  if (BITS == 8) {
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
      const int64_t row = m0 + i;
      /* as tile8: the sum from -128 sum(xq), the products added (int32: the same sum in any order) */
      const __m512i s = _mm512_add_epi32(_mm512_load_si512((const void*)sum[i]), _mm512_set1_epi32(-128 * r->xsum[row * nb + e]));
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(r->sx[row * nb + e]));
      acc[i] = _mm512_fmadd_ps(u, d, acc[i]);
    }
  } else {
    const __m512 o = _mm512_loadu_ps(og + e * 16);
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
      const int64_t row = m0 + i;
      const __m512 u = _mm512_fmadd_ps(o, _mm512_set1_ps(r->xsumf[row * nb + e]), _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void*)sum[i])), d));
      acc[i] = _mm512_fmadd_ps(u, _mm512_set1_ps(r->sx[row * nb + e]), acc[i]);
    }
  }
}

/* Block b's products (rows m0..m0+16 of one group) into sum tile C from x tile A and weight tile B, stored to `to`. */
#define AMX_BLOCK(C, A, B, b, to)                                     \
  do {                                                                \
    _tile_zero(C);                                                    \
    for (int64_t kk = (b) * blk; kk < ((b) + 1) * blk; kk += step) {  \
      _tile_loadd(A, x0 + kk, k);                                     \
      _tile_loadd(B, wq + kk / 4 * 64, 64);                           \
      _tile_dpbsud(C, A, B);                                          \
    }                                                                 \
    _tile_stored(C, (to), 64);                                        \
  } while (0)

/*
 * Rows m0..m0+16 of group g (wq its k-quads, [k / 4][64]; dg its scales; og its offsets at 4 bits).
 * Consecutive blocks take tiles 0, 4, 6 and 1, 5, 7 in turn (tiles are not renamed: a block reusing the
 * last one's would wait for it), and a block's sums are scaled one block later, while the next block's
 * products run (a load of what a tile store has not yet written would wait for it, and hold back every
 * later instruction). The 16 accumulators stay in registers: at 2 x 16 rows or 2 groups at a time they
 * did not, and a tile step took longer.
 */
AMX static INLINE void amx_tile(const int BITS, int64_t k, int64_t n, int64_t blk, const qm_rows* r, const uint8_t* wq, const float* dg,
                                const float* og, const float* bias, float* y, int64_t g, int64_t m0) {
  const int64_t nb = k / blk, step = amx_step(blk);
  __m512 acc[16];
  int32_t sums[4][16][16] __attribute__((aligned(64)));
  _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  const int8_t* x0 = r->xq + m0 * k;
  /* GCC's _tile_loadd names no memory it reads (its asm has only the address as an input), so nothing
     stops the compiler from moving a store to the rows' int8 values or the packed weights past a tile
     load that reads them: this barrier keeps every earlier store before the loads below. */
  __asm__ volatile("" : : : "memory");
  for (int64_t b = 0; b < nb + 2; b++) {
    if (b < nb) switch (b & 3) {
        case 0: AMX_BLOCK(0, 4, 6, b, sums[0]); break;
        case 1: AMX_BLOCK(1, 5, 7, b, sums[1]); break;
        case 2: AMX_BLOCK(2, 4, 6, b, sums[2]); break;
        default: AMX_BLOCK(3, 5, 7, b, sums[3]); break;
      }
    if (b >= 2) amx_scale(BITS, nb, r, dg, og, m0, b - 2, sums[(b - 2) & 3], acc);
  }
  store_tile(y, n, bias, g, m0, 16, acc);
}

#define AMX_TILES(BITS, WQ) \
  for (int64_t m0 = 0; m0 < m16; m0 += 16) amx_tile(BITS, w->k, w->n, w->blk, r, WQ, dg, og, w->bias, y, g, m0);

/* Rows past the last 16 (m16..m) of group g on the AVX512-VNNI tiles. */
#define VNNI_TAIL(TILE)                                                                 \
  for (int64_t m0 = m16; m0 < r->m; m0 += 8) switch (r->m - m0 < 8 ? r->m - m0 : 8) {  \
      case 1: TILE(w, r, y, g, m0, 1, 0); break;                                        \
      case 2: TILE(w, r, y, g, m0, 2, 0); break;                                        \
      case 3: TILE(w, r, y, g, m0, 3, 0); break;                                        \
      case 4: TILE(w, r, y, g, m0, 4, 0); break;                                        \
      case 5: TILE(w, r, y, g, m0, 5, 0); break;                                        \
      case 6: TILE(w, r, y, g, m0, 6, 0); break;                                        \
      case 7: TILE(w, r, y, g, m0, 7, 0); break;                                        \
      default: TILE(w, r, y, g, m0, 8, 0); break;                                       \
    }

AMX static void groups8_amx(const qm8_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) {
  const int64_t k = w->k, nb = k / w->blk, quads = k / 4, m16 = r->m & ~(int64_t)15;
  const float* og = NULL;
  amx_config saved __attribute__((aligned(64)));
  amx_begin(amx_step(w->blk), &saved);
  for (int64_t g = g0; g < g1; g++) {
    const float* dg = w->scales + g * nb * 16;
    AMX_TILES(8, w->q + g * quads * 64)
    VNNI_TAIL(tile8)
  }
  amx_end(&saved);
}

AMX static void groups4_amx(const qm4_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) {
  const int64_t k = w->k, nb = k / w->blk, pairs = k / 8, m16 = r->m & ~(int64_t)15;
  /* a group's weights as k-quads of bytes (each nibble in a byte of its own), unpacked once for every row */
  uint8_t* unpacked = aligned_alloc(64, (size_t)(pairs * 128));
  if (!unpacked) {
    groups4_vnni(w, r, y, g0, g1);
    return;
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  amx_config saved __attribute__((aligned(64)));
  amx_begin(amx_step(w->blk), &saved);
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* qg = w->q + g * pairs * 64;
    for (int64_t p = 0; p < pairs; p++) {
      const __m512i v = _mm512_loadu_si512((const void*)(qg + p * 64));
      _mm512_store_si512((void*)(unpacked + 2 * p * 64), _mm512_and_si512(v, nibble));
      _mm512_store_si512((void*)(unpacked + (2 * p + 1) * 64), _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
    }
    const float* dg = w->scales + g * nb * 16;
    const float* og = w->offsets + g * nb * 16;
    AMX_TILES(4, unpacked)
    VNNI_TAIL(tile4)
  }
  amx_end(&saved);
  free(unpacked);
}

/*
 * The AMX int8 peak's loop (int8-peak.c runs it on every core): `iters` rounds of 4 TDPBSUD at full depth
 * (16 x 16 x 64 multiply-adds each) into 4 independent sum tiles, from 2 x and 2 weight tiles that stay
 * put, so neither the instruction's latency nor memory limits it. Returns the sums' total (so the loop's
 * results are used), in the configuration amx_begin takes at a step of 64 bytes.
 */
AMX int32_t qm_amx_peak_loop(int64_t iters) {
  _Alignas(64) static const int8_t ones[16 * 64] = {1};
  _Alignas(64) int32_t out[16 * 16];
  amx_config saved __attribute__((aligned(64)));
  amx_begin(64, &saved);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t n = 0; n < iters; n++) {
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
  }
  int32_t total = 0;
  _tile_stored(0, out, 64);
  for (int i = 0; i < 256; i++) total += out[i];
  _tile_stored(3, out, 64);
  for (int i = 0; i < 256; i++) total += out[i];
  amx_end(&saved);
  return total;
}

/* --- dispatch ------------------------------------------------------------------------------------ */

void qm8_groups(const qm8_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) {
  if (r->m >= 16 && qm_amx()) groups8_amx(w, r, y, g0, g1);
  else if (qm_vnni()) groups8_vnni(w, r, y, g0, g1);
  else groups8_c(w, r, y, g0, g1);
}

void qm4_groups(const qm4_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1) {
  if (r->m >= 16 && qm_amx()) groups4_amx(w, r, y, g0, g1);
  else if (qm_vnni()) groups4_vnni(w, r, y, g0, g1);
  else groups4_c(w, r, y, g0, g1);
}
