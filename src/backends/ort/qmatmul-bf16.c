/*
 * Prefill products on AMX in bfloat16 (TDPBF16PS): see qmatmul.h.
 *
 * Why a second AMX path. The int8 one (qmatmul.c) sums a block of 32 in integers, but every block's sums
 * then leave the tiles to be converted and scaled by both blocks' scales (x's a row, the weight's a
 * column): 16 x 16 sums stored, loaded, converted and scaled for each 8,192 multiply-adds of a TDPBSUD of
 * half depth, so the vector ports, not the tiles, set the pace, and the products ran near 0.05 of
 * TDPBSUD's peak (bench/results, e969a05). Here the scales go into the weights instead: each product's
 * weights are dequantized once (w = scale q + offset, as the int8 kernels' own formula, rounded to
 * bfloat16) and x is rounded to bfloat16, so a tile's sums stay in it, as floats, over all of k, and
 * nothing but tile loads runs between two TDPBF16PS. TDPBF16PS makes half TDPBSUD's multiply-adds an
 * instruction, a price well paid against 0.05 of it. x keeps 8 significant bits a value where the int8
 * path kept 7 of its block's largest, and the weights every bit of their 4 or 8 but the rounding of the
 * product with their scale.
 *
 * A product runs in three passes over the threads (ragguard-ops.c): x converted, rows shared out; then,
 * a slab of column groups at a time (a few MB, so that the dequantized weights stay near the cache and
 * their memory small whatever N: the logits' 151,936 columns would take 467 MB at once), the slab's
 * weights dequantized, a pair of groups a task, and its products, a chunk of rows by a pair of groups a
 * task. Dequantizing a weight costs about a third of a vector operation, once a product: from 128 rows
 * (QM_BF16_MIN_ROWS) the products gain more than it costs: below, the int8 tiles are as fast (2 Xeon cores).
 */
#include <stdlib.h>
#include <string.h>

#include "amx-tiles.h"
#include "qmatmul.h"
#include "vexp.h"

#define BF16 __attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16,amx-tile,amx-int8,amx-bf16")))

/* Set: the int8 paths at every row count (qm_set_bf16(0): a test compares the two). */
static int bf16_off;

void qm_set_bf16(int on) { bf16_off = !on; }

int qm_bf16(void) {
  static int known = -1;
  if (bf16_off || !qm_amx()) return 0;
  if (known < 0) {
    int ok = 0;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    /* AMX-BF16: CPUID leaf 7 EDX bit 22; AVX512-BF16 (the conversions): leaf 7 subleaf 1 EAX bit 5 */
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const int amx_bf16 = (d >> 22) & 1;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    const char* env = getenv("RAGGUARD_OPS_AMX_BF16");
    ok = amx_bf16 && ((a >> 5) & 1) && !(env && strcmp(env, "0") == 0);
#endif
    known = ok;
  }
  return known;
}

int qm_bf16_runs(int64_t m, int64_t k) { return m >= QM_BF16_MIN_ROWS && k % 32 == 0 && qm_bf16(); }

static int64_t up32(int64_t m) { return (m + 31) & ~(int64_t)31; }

size_t qm_bf16_rows_bytes(int64_t m, int64_t k) { return (size_t)(up32(m) * k) * sizeof(uint16_t); }

BF16 void qm_bf16_rows_convert(uint16_t* xb, const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++) {
    uint16_t* row = xb + i * k;
    if (i >= m) {
      memset(row, 0, (size_t)k * sizeof(uint16_t));
      continue;
    }
    const float* xi = x + i * k;
    /* 32 values: the first 16 in the low half (cvtne2ps takes its second operand there), as they lie */
    for (int64_t j = 0; j < k; j += 32)
      _mm512_storeu_si512((void*)(row + j), (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xi + j + 16), _mm512_loadu_ps(xi + j)));
  }
}

size_t qm_bf16_group_bytes(int64_t k) { return (size_t)k * 16 * sizeof(uint16_t); }

/*
 * A weight row of the tiles' layout from two k's 16 columns: column c's pair (a[c], b[c]) in dword c, a in
 * the low half, as TDPBF16PS pairs x's k and k + 1. cvtne2ps puts a's 16 (rounded to nearest even) in
 * words 0-15 and b's in 16-31; the permutation interleaves them.
 */
BF16 static inline void store_pair(uint16_t* row, __m512 a, __m512 b, __m512i interleave) {
  _mm512_storeu_si512((void*)row, _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a)));
}

BF16 static inline __m512i interleave_index(void) {
  int16_t idx[32];
  for (int c = 0; c < 16; c++) idx[2 * c] = (int16_t)c, idx[2 * c + 1] = (int16_t)(16 + c);
  return _mm512_loadu_si512((const void*)idx);
}

/* Byte e of each of the 16 dwords (column c's value of k 4j + e, or 8p + e in a nibble's half), as floats. */
BF16 static inline __m512 byte_of(__m512i v, const int e) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * e), _mm512_set1_epi32(0xFF)));
}

BF16 void qm8_bf16_weights(const qm8_weight* w, uint16_t* out, int64_t g0, int64_t g1) {
  const int64_t k = w->k, nb = k / w->blk, quads = k / 4;
  const __m512i interleave = interleave_index();
  const __m512 zero_point = _mm512_set1_ps(128.0f);
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* q = w->q + g * quads * 64;
    const float* dg = w->scales + g * nb * 16;
    uint16_t* o = out + (g - g0) * k * 16;
    for (int64_t j = 0; j < quads; j++) {
      const __m512 d = _mm512_loadu_ps(dg + (4 * j / w->blk) * 16);
      const __m512i v = _mm512_loadu_si512((const void*)(q + j * 64));
      /* q - 128 exact in floats (small integers), then one rounding each: the scale's product, then bfloat16's */
      store_pair(o + (2 * j) * 32, _mm512_mul_ps(_mm512_sub_ps(byte_of(v, 0), zero_point), d), _mm512_mul_ps(_mm512_sub_ps(byte_of(v, 1), zero_point), d), interleave);
      store_pair(o + (2 * j + 1) * 32, _mm512_mul_ps(_mm512_sub_ps(byte_of(v, 2), zero_point), d), _mm512_mul_ps(_mm512_sub_ps(byte_of(v, 3), zero_point), d), interleave);
    }
  }
}

BF16 void qm4_bf16_weights(const qm4_weight* w, uint16_t* out, int64_t g0, int64_t g1) {
  const int64_t k = w->k, nb = k / w->blk, pairs = k / 8;
  const __m512i interleave = interleave_index(), nibble = _mm512_set1_epi8(0x0F);
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t* q = w->q + g * pairs * 64;
    const float* dg = w->scales + g * nb * 16;
    const float* og = w->offsets + g * nb * 16;
    uint16_t* o = out + (g - g0) * k * 16;
    for (int64_t p = 0; p < pairs; p++) {
      const int64_t b = 8 * p / w->blk;
      const __m512 d = _mm512_loadu_ps(dg + b * 16), off = _mm512_loadu_ps(og + b * 16);
      const __m512i v = _mm512_loadu_si512((const void*)(q + p * 64));
      /* low nibbles: k 8p .. 8p + 3 (byte e of a column's dword); high ones: 8p + 4 .. 8p + 7 */
      const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      store_pair(o + (4 * p) * 32, _mm512_fmadd_ps(byte_of(lo, 0), d, off), _mm512_fmadd_ps(byte_of(lo, 1), d, off), interleave);
      store_pair(o + (4 * p + 1) * 32, _mm512_fmadd_ps(byte_of(lo, 2), d, off), _mm512_fmadd_ps(byte_of(lo, 3), d, off), interleave);
      store_pair(o + (4 * p + 2) * 32, _mm512_fmadd_ps(byte_of(hi, 0), d, off), _mm512_fmadd_ps(byte_of(hi, 1), d, off), interleave);
      store_pair(o + (4 * p + 3) * 32, _mm512_fmadd_ps(byte_of(hi, 2), d, off), _mm512_fmadd_ps(byte_of(hi, 3), d, off), interleave);
    }
  }
}

/* 16 rows' sums of group g (sum[i]: row i0 + i) into y, with the bias, rows below m and columns below n only. */
BF16 static void store_sums(float* y, int64_t m, int64_t n, const float* bias, int64_t g, int64_t i0, const float (*sum)[16]) {
  const int64_t left = n - 16 * g;
  const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + 16 * g) : _mm512_setzero_ps();
  for (int64_t i = 0; i < 16 && i0 + i < m; i++) _mm512_mask_storeu_ps(y + (i0 + i) * n + 16 * g, keep, _mm512_add_ps(_mm512_load_ps(sum[i]), b));
}

/*
 * The 32 x 32 sums of rows a0's 16 and a1's 16 (x's bfloat16 rows, `stride` bytes apart) by groups b0 and
 * b1 (b1 only where `two`) over all of k, into sums[0] (a0 b0), [1] (a0 b1), [2] (a1 b0), [3] (a1 b1): the 4
 * sum tiles kept over all of k (tiles 0-3), 2 tiles of x (4, 5: 16 rows by 32 values) and 2 of weights
 * (6, 7: 16 k-pairs by 16 columns), the configuration of amx_begin at a step of 64 bytes.
 */
BF16 static inline void tile_sums(const uint16_t* a0, const uint16_t* a1, int64_t stride, const uint16_t* b0, const uint16_t* b1, int two, int64_t k,
                                  float (*sums)[16][16]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  if (two) {
    for (int64_t kk = 0; kk < k; kk += 32) {
      _tile_loadd(4, a0 + kk, stride);
      _tile_loadd(6, b0 + kk * 16, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b1 + kk * 16, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a1 + kk, stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  } else {
    for (int64_t kk = 0; kk < k; kk += 32) {
      _tile_loadd(4, a0 + kk, stride);
      _tile_loadd(6, b0 + kk * 16, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, a1 + kk, stride);
      _tile_dpbf16ps(2, 5, 6);
    }
  }
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  _tile_stored(2, sums[2], 64);
  _tile_stored(3, sums[3], 64);
  /* GCC's tile stores name no memory (their asm takes addresses only): the loads of `sums` after them */
  __asm__ volatile("" : : : "memory");
}

/* Rows [i0, i1) (multiples of 32 apart, or i1 the padded end) by groups [g0, g1): 32 rows by 2 groups at a time (tile_sums). */
BF16 void qm_bf16_groups(const uint16_t* xb, int64_t m, int64_t k, int64_t i0, int64_t i1, const uint16_t* wb, int64_t n, const float* bias,
                         float* y, int64_t g0, int64_t g1) {
  float sums[4][16][16] __attribute__((aligned(64)));
  amx_config saved __attribute__((aligned(64)));
  const int64_t stride = k * (int64_t)sizeof(uint16_t);
  /* keep the conversions' stores before the tile loads (see tile_sums) */
  __asm__ volatile("" : : : "memory");
  amx_begin(64, &saved);
  for (int64_t g = g0; g < g1; g += 2) {
    const int two = g + 1 < g1;
    const uint16_t* b0 = wb + (g - g0) * k * 16;
    for (int64_t i = i0; i < i1; i += 32) {
      tile_sums(xb + i * k, xb + (i + 16) * k, stride, b0, b0 + k * 16, two, k, sums);
      store_sums(y, m, n, bias, g, i, (const float(*)[16])sums[0]);
      store_sums(y, m, n, bias, g, i + 16, (const float(*)[16])sums[2]);
      if (two) {
        store_sums(y, m, n, bias, g + 1, i, (const float(*)[16])sums[1]);
        store_sums(y, m, n, bias, g + 1, i + 16, (const float(*)[16])sums[3]);
      }
    }
  }
  amx_end(&saved);
}

/* 16 rows' activations silu(gate + gate bias) (up + up bias) of sums gate and up into y's columns 16 j (rows below m). */
BF16 static void store_glu(float* y, int64_t m, int64_t inter, const float* biasGate, const float* biasUp, int64_t j, int64_t i0,
                           const float (*gate)[16], const float (*up)[16]) {
  const __m512 bg = biasGate ? _mm512_loadu_ps(biasGate + 16 * j) : _mm512_setzero_ps();
  const __m512 bu = biasUp ? _mm512_loadu_ps(biasUp + 16 * j) : _mm512_setzero_ps();
  for (int64_t i = 0; i < 16 && i0 + i < m; i++)
    _mm512_storeu_ps(y + (i0 + i) * inter + 16 * j, silu_mul512(_mm512_add_ps(_mm512_load_ps(gate[i]), bg), _mm512_add_ps(_mm512_load_ps(up[i]), bu)));
}

BF16 void qm_bf16_glu(const uint16_t* xb, int64_t m, int64_t k, int64_t i0, int64_t i1, const uint16_t* gate, const uint16_t* up, int64_t inter,
                      const float* biasGate, const float* biasUp, float* y, int64_t j) {
  float sums[4][16][16] __attribute__((aligned(64)));
  amx_config saved __attribute__((aligned(64)));
  const int64_t stride = k * (int64_t)sizeof(uint16_t);
  __asm__ volatile("" : : : "memory");
  amx_begin(64, &saved);
  for (int64_t i = i0; i < i1; i += 32) {
    tile_sums(xb + i * k, xb + (i + 16) * k, stride, gate, up, 1, k, sums);
    store_glu(y, m, inter, biasGate, biasUp, j, i, (const float(*)[16])sums[0], (const float(*)[16])sums[1]);
    store_glu(y, m, inter, biasGate, biasUp, j, i + 16, (const float(*)[16])sums[2], (const float(*)[16])sums[3]);
  }
  amx_end(&saved);
}
