/*
 * Causal attention with grouped KV heads, as ONNX Runtime's GroupQueryAttention (com.microsoft) computes
 * it for a packed QKV input, over a KV buffer of `cap` positions a row and head (BNSH), rotary
 * embedding (rotate-half or interleaved) applied to the new tokens' queries and keys on the way.
 *
 * Row b feeds `seq` new tokens after past[b] cached ones: their keys (rotated) and values go to
 * positions past[b] .. past[b] + seq - 1 of the buffer, and new token i's query attends keys
 * 0 .. past[b] + i, softmax(scale q k) v. Only the causal half is computed, a block of rows at a time
 * with a running softmax (no [new, context] score matrix in memory): ONNX Runtime's CPU kernel
 * multiplies every query by every key of the buffer into one such matrix, 207 MB a layer at 2,048 tokens.
 */
#ifndef RAGGUARD_ATTENTION_H
#define RAGGUARD_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t batch, seq, heads, kvHeads, dim; /* B, S, N, Nkv, D (D a multiple of 16) */
  int64_t cap;                             /* the buffer's positions a row and KV head */
  int64_t rotaryHalf;                      /* cos and sin columns (rotary dimension / 2); 0: no rotary */
  int interleaved;                         /* rotary pairs (2j, 2j + 1), else (j, j + rotaryHalf) */
  float scale;
  const float* qkv;          /* [B, S, (N + 2 Nkv) D]: queries, keys, values of the new tokens */
  const int64_t* past;       /* [B]: cached positions before the new tokens */
  const float *cos, *sin;    /* [positions, rotaryHalf] */
  float *keys, *values;      /* [B, Nkv, cap, D] */
  float* out;                /* [B, S, N D] */
} attn_problem;

/* Writes rows b's new tokens s0 .. s1 - 1, their rotated keys and their values, into the buffer. */
void attn_store_kv(const attn_problem* p, int64_t b, int64_t s0, int64_t s1);

/* The attention's tasks (a block of query rows of one row b and KV head each), largest first. */
int64_t attn_tasks(const attn_problem* p);

/* Scratch memory one task needs (a thread's, reused task after task). */
size_t attn_scratch_bytes(const attn_problem* p);

/* Task t (every key and value it reads stored by attn_store_kv). `scratch`: attn_scratch_bytes, 64-byte aligned. */
void attn_task(const attn_problem* p, int64_t t, void* scratch);

#endif
