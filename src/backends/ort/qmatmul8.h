/*
 * y = x W^T for 8-bit block-quantized weights in MatMulNBits' layout (bits 8, zero point 128):
 * w[n][k] = scale[n][k / blk] * (q[n][k] - 128). x is quantized to int8 per block of blk as it goes
 * (symmetric, round to nearest), as MatMulNBits does at accuracy level 4, and each block's integer dot
 * product is scaled by both blocks' scales.
 */
#ifndef RAGGUARD_QMATMUL8_H
#define RAGGUARD_QMATMUL8_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t k, n, blk;
  const uint8_t* q;     /* [n][k] */
  const float* scales;  /* [n][k / blk] */
  const float* bias;    /* [n] or NULL */
} qm8_weight;

/* The rows of x quantized: what every column's product reads. */
typedef struct {
  int64_t m, k, blk, chunks;
  int8_t* xq;      /* [chunks][m][64], zero beyond k: a chunk's rows side by side */
  float* sx;       /* [chunks][m][16]: each int32 lane's block scale of x */
  float* corr;     /* [m][k / blk]: sx * 128 * sum(xq) of the block (the zero point's term) */
  void* mem;
} qm8_rows;

/* Whether blk is a block size handled here for k (a power of two from 16 that divides k). */
int qm8_supported(int64_t k, int64_t blk);
int qm8_rows_init(qm8_rows* r, const float* x, int64_t m, int64_t k, int64_t blk);
void qm8_rows_free(qm8_rows* r);
/* Columns [n0, n1) of every row: y[m][n] for m < rows. */
void qm8_columns(const qm8_weight* w, const qm8_rows* r, float* y, int64_t n0, int64_t n1);
/* 1 where the products run the AVX512-VNNI kernel: the CPU has it and qm8_set_portable(1) was not called. */
int qm8_vnni(void);
/* 1: the plain C path from now on, whatever the CPU (for tests); 0: back to the CPU's best. */
void qm8_set_portable(int on);
#endif
