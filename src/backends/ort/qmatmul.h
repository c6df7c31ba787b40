/*
 * y = x W^T for block-quantized weights as MatMulNBits takes them (com.microsoft, accuracy level 4),
 * stored 16 columns side by side (the layouts below, written by the converter: qmatmul-layout.ts):
 *
 *   8 bits  w[n][k] = scale[n][k / blk] * (q[n][k] - 128)
 *   4 bits  w[n][k] = scale[n][k / blk] * q[n][k] + offset[n][k / blk]
 *           (offset = -scale * zero point, plus the block's min where it has one: Q4_1's and Q4_K's)
 *
 * x is quantized to int8 per block of blk as it goes (symmetric, round to nearest even), as MatMulNBits
 * does at accuracy level 4; each block's dot product is summed in integers and scaled by both blocks'
 * scales. At 4 bits the offset multiplies the block's sum of quantized x (an integer the quantization
 * keeps): a block's min is then taken as llama.cpp takes it, in the block's own few operations, where
 * the graph had computed it apart (x's float block sums times the mins, [rows, n] written and added).
 *
 * Layouts, for G = ceil(n / 16) groups of 16 columns (columns past n: zero weights, scale 0):
 *   8-bit q  [G][k / 4][16][4]    bytes 4j..4j+3 of column 16g + c at [g][j][c]
 *   4-bit q  [G][k / 8][16][4]    byte [g][p][c][e]: value 8p + e of column 16g + c in its low nibble,
 *                                 8p + 4 + e in its high one
 *   scales   [G][k / blk][16]     column 16g + c's scale of block b at [g][b][c]
 *   offsets  [G][k / blk][16]     (4 bits) column 16g + c's offset of block b, float
 * so one 64-byte load holds 4 (8 bits) or 8 (4 bits) weights of each of 16 columns.
 */
#ifndef RAGGUARD_QMATMUL_H
#define RAGGUARD_QMATMUL_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t k, n, blk;
  const uint8_t* q;     /* [G][k / 4][64] */
  const float* scales;  /* [G][k / blk][16] */
  const float* bias;    /* [n] or NULL */
} qm8_weight;

typedef struct {
  int64_t k, n, blk;
  const uint8_t* q;      /* [G][k / 8][64] */
  const float* scales;   /* [G][k / blk][16] */
  const float* offsets;  /* [G][k / blk][16] */
  const float* bias;     /* [n] or NULL */
} qm4_weight;

/* The rows of x quantized: what every column's product reads. */
typedef struct {
  int64_t m, k, blk;
  int8_t* xq;      /* [m][k] */
  float* sx;       /* [m][k / blk]: x's block scales */
  int32_t* xsum;   /* [m][k / blk]: sum(xq) of the block (for the zero points' term) */
  float* xsumf;    /* [m][k / blk]: the same sums as floats (exact, below 2^24), which the 4-bit offsets
                      multiply: converted once here, not by a scalar conversion in every column group's
                      epilogue, where it took the vector ports the scaling needs (the kernels alone 3-12 % faster on AMX;
                      end to end within the run-to-run spread: bench/results, e969a05) */
} qm_rows;

/* Whether blk is a block size handled here for k (a power of two from 16 that divides k). */
int qm_supported(int64_t k, int64_t blk);
/* The memory qm_rows_init takes for m rows (the caller's: the op takes it from ONNX Runtime's allocator). */
size_t qm_rows_bytes(int64_t m, int64_t k, int64_t blk);
/* x's m rows quantized into `mem` (qm_rows_bytes of it, 64-byte aligned). */
void qm_rows_init(qm_rows* r, void* mem, const float* x, int64_t m, int64_t k, int64_t blk);
/* qm_rows_init in two steps, so that threads can share the rows out: where the parts lie in `mem`, then
 * rows i0..i1 of x (the full rows of x, m of them) quantized. */
void qm_rows_layout(qm_rows* r, void* mem, int64_t m, int64_t k, int64_t blk);
void qm_rows_quantize(qm_rows* r, const float* x, int64_t i0, int64_t i1);
/* Column groups [g0, g1) (columns 16 g0 .. 16 g1, those below n written) of every row: y[m][n]. */
void qm8_groups(const qm8_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1);
void qm4_groups(const qm4_weight* w, const qm_rows* r, float* y, int64_t g0, int64_t g1);
/*
 * A product of small inner width added to columns [16 g0, 16 g1) of y [m][n] (those below n):
 *   y[i][c] += sum_t u[i][t] v_i[t][c],   u [m][r], v_i = v + (shared ? 0 : i / per_batch) r n, each [r][n]
 * the LoRA term (u: x A, [B, S, r]; v: each batch row's B, [B or 1, r, n]) taken while the product's
 * columns are in cache, where the graph wrote it to a tensor of its own and added it in another pass.
 */
void qm_add_product(float* y, int64_t m, int64_t n, const float* u, int64_t r, const float* v, int64_t per_batch, int shared, int64_t g0, int64_t g1);
/* 1 where the products run the AVX512-VNNI kernels: the CPU has it and qm_set_portable(1) was not called. */
int qm_vnni(void);
/* 1 where the CPU has AVX512-VNNI (and BW), whatever qm_set_portable says (int8-peak.c measures it). */
int qm_cpu_vnni(void);
/* 1: the plain C path from now on, whatever the CPU (for tests); 0: back to the CPU's best. */
void qm_set_portable(int on);
/* 1 where products of 16 rows or more run on AMX (TDPBSUD): the CPU has AMX-INT8, Linux grants the tile
 * state, RAGGUARD_OPS_AMX is not 0, qm_set_amx(0) and qm_set_portable(1) were not called. */
int qm_amx(void);
/* The AMX peak's loop (int8-peak.c): `iters` rounds of 4 full-depth TDPBSUD on independent tiles; only
 * where qm_amx() is 1. Returns a sum of the results. */
int32_t qm_amx_peak_loop(int64_t iters);
/* 0: the AVX512-VNNI kernels at every row count from now on (for tests); 1: AMX again where it can run. */
void qm_set_amx(int on);
/*
 * Prefills on AMX in bfloat16 (qmatmul-bf16.c): products of QM_BF16_MIN_ROWS rows or more where the CPU
 * has AMX-BF16 and AVX512-BF16 besides qm_amx's, and k is a multiple of 32. x is rounded to bfloat16 rows
 * (up to a multiple of 32 rows, those past m zero), the weights dequantized to bfloat16 a group at a time
 * ([k / 2][16][2]: k-pair j's two values of column c at [j][c]), and the sums kept in floats over all of k.
 */
#define QM_BF16_MIN_ROWS 128
/* 1 where AMX-BF16 runs here (qm_amx, the CPU's AMX-BF16 and AVX512-BF16, RAGGUARD_OPS_AMX_BF16 not 0, qm_set_bf16(0) not called). */
int qm_bf16(void);
/* 1 where a product of m rows and inner width k runs on AMX-BF16. */
int qm_bf16_runs(int64_t m, int64_t k);
/* 0: the int8 paths at every row count from now on (for tests); 1: AMX-BF16 again where it runs. */
void qm_set_bf16(int on);
/* The bfloat16 rows' memory (m rounded up to 32 rows of k). */
size_t qm_bf16_rows_bytes(int64_t m, int64_t k);
/* Rows [i0, i1) of the padded rows written into xb from x (m rows of k floats); rows from m zero. */
void qm_bf16_rows_convert(uint16_t* xb, const float* x, int64_t m, int64_t k, int64_t i0, int64_t i1);
/* A group's dequantized weights' memory (16 columns of k). */
size_t qm_bf16_group_bytes(int64_t k);
/* Groups [g0, g1) dequantized into out (group g at (g - g0) x qm_bf16_group_bytes). */
void qm8_bf16_weights(const qm8_weight* w, uint16_t* out, int64_t g0, int64_t g1);
void qm4_bf16_weights(const qm4_weight* w, uint16_t* out, int64_t g0, int64_t g1);
/*
 * y [m][n] at rows [i0, i1) (i0 a multiple of 32, i1 too or the padded end; rows from m not written) and
 * columns of groups [g0, g1), whose dequantized weights start at wb (group g0's), plus the bias where given.
 */
void qm_bf16_groups(const uint16_t* xb, int64_t m, int64_t k, int64_t i0, int64_t i1, const uint16_t* wb, int64_t n, const float* bias,
                    float* y, int64_t g0, int64_t g1);
/*
 * The MLP's activation over a gate-and-up product of 2 inter columns (gate's first): y [m][inter] at rows
 * [i0, i1) and columns 16 j .. 16 j + 15 = silu(x gate + biasGate) (x up + biasUp), from gate's group j
 * and up's (their dequantized weights at `gate` and `up`), the biases [inter] each where given. The
 * gate-and-up product itself is never written: at a 2,048-token prefill of the 1.5B, 147 MB a layer.
 */
void qm_bf16_glu(const uint16_t* xb, int64_t m, int64_t k, int64_t i0, int64_t i1, const uint16_t* gate, const uint16_t* up, int64_t inter,
                 const float* biasGate, const float* biasUp, float* y, int64_t j);
#endif
