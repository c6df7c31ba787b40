/*
 * y = x W^T for 8-bit block-quantized weights: w[n][k] = scale[n][k / blk] * (q[n][k] - 128), q stored
 * 16 columns side by side (the layout below, written by the converter: qmatmul8-layout.ts). x is
 * quantized to int8 per block of blk as it goes (symmetric, round to nearest), as MatMulNBits does at
 * accuracy level 4, and each block's integer dot product is scaled by both blocks' scales.
 *
 * Layout, for G = ceil(n / 16) groups of 16 columns (columns past n are zero weights):
 *   q       [G][k / 4][16][4]  group g, bytes 4j..4j+3 of column 16g + c at [g][j][c]
 *   scales  [G][k / blk][16]   column 16g + c's scale of block b at [g][b][c] (0 past n)
 * so one 64-byte load holds 4 weights of each of 16 columns, and a block is blk / 4 such loads.
 */
#ifndef RAGGUARD_QMATMUL8_H
#define RAGGUARD_QMATMUL8_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t k, n, blk;
  const uint8_t* q;     /* [G][k / 4][64] */
  const float* scales;  /* [G][k / blk][16] */
  const float* bias;    /* [n] or NULL */
} qm8_weight;

/* The rows of x quantized: what every column's product reads. */
typedef struct {
  int64_t m, k, blk;
  int8_t* xq;      /* [m][k] */
  float* sx;       /* [m][k / blk]: x's block scales */
  int32_t* zsum;   /* [m][k / blk]: -128 * sum(xq) of the block (the zero point's term, in the dot's integers) */
  void* mem;
} qm8_rows;

/* Whether blk is a block size handled here for k (a power of two from 16 that divides k). */
int qm8_supported(int64_t k, int64_t blk);
int qm8_rows_init(qm8_rows* r, const float* x, int64_t m, int64_t k, int64_t blk);
void qm8_rows_free(qm8_rows* r);
/* Column groups [g0, g1) (columns 16 g0 .. 16 g1, those below n written) of every row: y[m][n]. */
void qm8_groups(const qm8_weight* w, const qm8_rows* r, float* y, int64_t g0, int64_t g1);
/* 1 where the products run the AVX512-VNNI kernel: the CPU has it and qm8_set_portable(1) was not called. */
int qm8_vnni(void);
/* 1: the plain C path from now on, whatever the CPU (for tests); 0: back to the CPU's best. */
void qm8_set_portable(int on);
#endif
