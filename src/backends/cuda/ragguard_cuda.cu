// ragguard's CUDA decoder backend: a Llama/Qwen2 decoder run on a paged KV cache.
//
// One device allocation holds the weights (fused q|k|v and gate|up projections), one the KV pool laid
// out by block ([layer][k|v][block][kv_head][slot][head_dim]), one the activation workspace sized from
// the largest step (max_batched_tokens tokens, max_seqs sampled rows). Every byte allocated here is
// counted by the accountant (rg_memory), which the server's guard reads instead of guessing.
//
// A step is any mix of prefill chunks and decode tokens, described by one packed int32 array (layout in
// StepView below) that is copied to the device in one transfer: the kernels read the counts, block
// tables and slot mapping from device memory, so that a decode step of a batch-size bucket can be
// captured once as a CUDA graph and replayed with new inputs (one launch a step). A step returns only
// the sampled token ids (greedy or seeded temperature / top-k / top-p after repetition / presence /
// frequency penalties, chosen on the device); logits come
// back only when asked for (checks).
//
// GEMMs go through cuBLAS (fp16/bf16 in, fp32 accumulate) with a workspace set explicitly (required for
// graph capture, and counted). Everything else is a handful of fused kernels: embedding gather, RMSNorm
// with the residual add, q/k/v bias + rotary + KV-cache write, paged attention (split over the context
// for long sequences), SiLU x mul, last-token gather, penalties, sampling; with LoRA slots, a shrink
// kernel per projection whose expand runs inside the next of these kernels.
//
// GGUF decoders (rg_config.quantized): the projections, the embedding and the head stay quantized on the
// device as quant_kernels.cuh describes, dequantized inside the products; norms and biases are loaded as
// the dense path loads them.
//
// The C ABI (extern "C", rg_*) is what src/backends/cuda/binding.ts binds through koffi. Errors: a
// negative return and rg_last_error() for the message.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <mma.h>
#include <algorithm>
#include <map>
#include <tuple>
#include <type_traits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>
#include <unistd.h>
#include <fcntl.h>

namespace {

// One engine call at a time (the engine serialises its steps), possibly on a worker thread: a plain global.
std::string g_error;

int fail(const std::string& msg) {
  g_error = msg;
  return -1;
}

#define CUDA_TRY(expr)                                                                          \
  do {                                                                                          \
    cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) return fail(std::string(#expr) + ": " + cudaGetErrorString(e_));     \
  } while (0)
#define CUBLAS_TRY(expr)                                                                        \
  do {                                                                                          \
    cublasStatus_t s_ = (expr);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) return fail(std::string(#expr) + ": cuBLAS status " + std::to_string((int)s_)); \
  } while (0)

// ---------------------------------------------------------------------------------------------------
// Element types: the model's dtype is half or bfloat16; all arithmetic in float.
template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions (blockDim.x a multiple of 32, at most 1024). `red` holds 32 floats.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.f;
  return warp_sum(v);
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : -INFINITY;
  return warp_max(v);
}

// Eight elements of the model's type as one 16-byte access (the pointer 16-byte aligned): the kernels that
// stream weights or rows read and write this way, since scalar 2-byte accesses leave most of each memory
// transaction unused.
template <typename T> __device__ __forceinline__ void load8(const T* __restrict__ p, float (&f)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f(h[i]);
}
// The same for data this step writes (no read-only cache path).
template <typename T> __device__ __forceinline__ uint4 load8_raw(const T* p) { return *reinterpret_cast<const uint4*>(p); }

// ---------------------------------------------------------------------------------------------------
// The step's inputs, as packed by the host (binding.ts packStep): int32 words
//   [0] T tokens, [1] S sequences, [2] W block-table width, [3] P penalty entries
//   token_ids[T] positions[T] slots[T] token_seq[T]
//   seq_lens[S] last_token[S] top_k[S] seed_lo[S] seed_hi[S] sample_step[S]
//   temperature[S] top_p[S] (float32 bit patterns)
//   lora[S] (the sequence's entry in the LoRA slots; 0: the base model)
//   repetition[S] presence[S] frequency[S] (float32) pen_start[S] pen_count[S]
//   mask_at[S] (constrained decoding: k > 0 samples among the tokens set in the (k-1)-th mask; 0: any)
//   block_tables[S * W]
//   pen_tokens[P] pen_counts[P] (a row's distinct penalized tokens and their counts in its output)
//   masks[R * mask_words] (R: the rows with mask_at > 0; bit t % 32 of word t / 32 allows token t)
// Padding rows of a graph bucket have slot -1, seq_len 0, lora 0 and no penalty entries.
struct StepView {
  const int* base;
  __device__ __forceinline__ int T() const { return base[0]; }
  __device__ __forceinline__ int S() const { return base[1]; }
  __device__ __forceinline__ int W() const { return base[2]; }
  __device__ __forceinline__ const int* token_ids() const { return base + 4; }
  __device__ __forceinline__ const int* positions() const { return base + 4 + T(); }
  __device__ __forceinline__ const int* slots() const { return base + 4 + 2 * T(); }
  __device__ __forceinline__ const int* token_seq() const { return base + 4 + 3 * T(); }
  __device__ __forceinline__ const int* seq_arr(int k) const { return base + 4 + 4 * T() + k * S(); }
  __device__ __forceinline__ const int* last_token() const { return seq_arr(1); }
  __device__ __forceinline__ const int* top_k() const { return seq_arr(2); }
  __device__ __forceinline__ const int* seed_lo() const { return seq_arr(3); }
  __device__ __forceinline__ const int* seed_hi() const { return seq_arr(4); }
  __device__ __forceinline__ const int* sample_step() const { return seq_arr(5); }
  __device__ __forceinline__ const float* temperature() const { return reinterpret_cast<const float*>(seq_arr(6)); }
  __device__ __forceinline__ const float* top_p() const { return reinterpret_cast<const float*>(seq_arr(7)); }
  __device__ __forceinline__ const int* lora() const { return seq_arr(8); }
  __device__ __forceinline__ const float* repetition() const { return reinterpret_cast<const float*>(seq_arr(9)); }
  __device__ __forceinline__ const float* presence() const { return reinterpret_cast<const float*>(seq_arr(10)); }
  __device__ __forceinline__ const float* frequency() const { return reinterpret_cast<const float*>(seq_arr(11)); }
  __device__ __forceinline__ const int* pen_start() const { return seq_arr(12); }
  __device__ __forceinline__ const int* pen_count() const { return seq_arr(13); }
  __device__ __forceinline__ const int* mask_at() const { return seq_arr(14); }
  __device__ __forceinline__ const int* block_tables() const { return seq_arr(15); }
  __device__ __forceinline__ int P() const { return base[3]; }
  __device__ __forceinline__ const int* pen_tokens() const { return block_tables() + (size_t)S() * W(); }
  __device__ __forceinline__ const int* pen_counts() const { return pen_tokens() + P(); }
  __device__ __forceinline__ const unsigned* masks() const { return reinterpret_cast<const unsigned*>(pen_counts() + P()); }
};
constexpr int kSeqArrays = 15;
constexpr int kLoraSeqArray = 8;
constexpr int kMaskSeqArray = 14;

// Words of a step's packed input; `masks` the token masks' words in all.
size_t step_words(int T, int S, int W, int P, size_t masks = 0) {
  return 4 + 4 * (size_t)T + (size_t)kSeqArrays * S + (size_t)S * W + 2 * (size_t)P + masks;
}

__host__ __device__ inline size_t mask_words(int vocab) { return ((size_t)vocab + 31) / 32; }
#include "quant_kernels.cuh"
#include "quant_gemv_i8.cuh"
#include "quant_mmq.cuh"

// ---------------------------------------------------------------------------------------------------
// Kernels

// A LoRA expand fused into the kernel that reads the projection's output (the input norm, rotary, the
// post-attention norm, SiLU x mul): column `col` of a token with adapter entry idx > 0 gains
// tmp[t, c0 ..][: cap] . B[idx][:, col], rounded once to the model's type as a separate kernel would have
// written it. b null: no LoRA (the base step's graph passes none).
struct LoraExpand {
  const void* b = nullptr;
  const float* tmp = nullptr;
  int tmp_width = 0;  // the shrink's output width (both slots of a pair)
  int c0 = 0;         // this slot's first column in it
  int cap = 0;
  int out = 0;
};

// The token's adapter entry where `le` applies (0: none), its low-rank activation staged in `ts`
// (shared, at least le.tmp_width floats); every thread of the CTA must call it (it synchronises).
__device__ __forceinline__ int lora_stage(const StepView& v, const LoraExpand& le, int t, float* ts) {
  if (!le.b) return 0;
  const int idx = v.lora()[v.token_seq()[t]];
  if (idx <= 0) return 0;
  for (int r = threadIdx.x; r < le.tmp_width; r += blockDim.x) ts[r] = le.tmp[(size_t)t * le.tmp_width + r];
  __syncthreads();
  return idx;
}

// B is kept transposed on the device, Bt [entries, out, cap]: a column's `cap` values are contiguous (one
// 16-byte load per 8 of them) instead of `cap` loads `out` apart.
template <typename T>
__device__ __forceinline__ float lora_delta(const LoraExpand& le, int idx, const float* ts, int col) {
  const T* b = static_cast<const T*>(le.b) + ((size_t)idx * le.out + col) * le.cap;
  const float* tr = ts + le.c0;
  float acc = 0.f;
  if ((le.cap & 7) == 0) {
    for (int r = 0; r < le.cap; r += 8) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(b + r));
      const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc += tr[r + k] * to_f(h[k]);
    }
  } else {
    for (int r = 0; r < le.cap; ++r) acc += tr[r] * to_f(b[r]);
  }
  return acc;
}

// y (a projection's output element, as its GEMM rounded it) with the LoRA delta added and rounded again.
template <typename T>
__device__ __forceinline__ float with_lora(float y, const LoraExpand& le, int idx, const float* ts, int col) {
  return idx > 0 ? to_f(from_f<T>(y + lora_delta<T>(le, idx, ts, col))) : y;
}

// Where the row of (block `blk`, kv head `kh`, slot `off` in the block) starts in a layer's K or V plane,
// laid out [block][kv_head][slot][head_dim]: the one formula the kernels that write and read the pool share.
__device__ __forceinline__ size_t kv_row(int blk, int kh, int off, int nkv, int block_size, int hd) {
  return (((size_t)blk * nkv + kh) * block_size + off) * hd;
}

// The most rank columns a token's staged LoRA activation has (3 x max_lora_rank of 256: q|k|v).
constexpr int LORA_MAX_TMP = 3 * 256;

template <typename T>
__global__ void embed_kernel(StepView v, const T* __restrict__ emb, T* __restrict__ out, int hidden) {
  const int t = blockIdx.x;
  if (t >= v.T()) return;
  const int id = v.token_ids()[t];
  const T* row = emb + (size_t)id * hidden;
  T* dst = out + (size_t)t * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = row[i];
}

// residual (+)= delta; out = rmsnorm(residual) * w, as transformers computes it: the normalisation in
// float, rounded to the model's type, then multiplied by the weight. `rows` from the step (all tokens) or
// explicit (the sampled rows).
template <typename T>
__global__ void add_rmsnorm_kernel(StepView v, int rows_fixed, T* __restrict__ residual, const T* __restrict__ delta,
                                   const T* __restrict__ w, T* __restrict__ out, int hidden, float eps, LoraExpand le) {
  __shared__ float red[32];
  __shared__ float ts[LORA_MAX_TMP];
  const int t = blockIdx.x;
  const int rows = rows_fixed >= 0 ? rows_fixed : v.T();
  if (t >= rows) return;
  const int idx = delta ? lora_stage(v, le, t, ts) : 0;
  T* r = residual + (size_t)t * hidden;
  const T* d = delta ? delta + (size_t)t * hidden : nullptr;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float x;
    if (d) {
      T s = from_f<T>(to_f(r[i]) + with_lora<T>(to_f(d[i]), le, idx, ts, i));
      r[i] = s;
      x = to_f(s);
    } else {
      x = to_f(r[i]);
    }
    ss += x * x;
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / hidden + eps);
  T* o = out + (size_t)t * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const T n = from_f<T>(to_f(r[i]) * inv);
    o[i] = from_f<T>(to_f(n) * to_f(w[i]));
  }
}

// Attention's shapes (attention_kernel); the rotary kernel's tables are sized by MAX_HD too.
constexpr int CHUNK = 32;
constexpr int ATTN_THREADS = 128;
constexpr int MAX_HD = 256;
constexpr int MAX_G = 16;

// The same, eight elements a thread access, the row kept in registers between the sum of squares and
// the scaling (one read of the residual instead of two): the layer's two norms are latency-bound at
// decode (one CTA a token), and the scalar kernel spent ~15 us each on a 7B row (3584 elements).
// hidden % 8 == 0 and hidden / 8 <= NORM_VPT * blockDim.x.
constexpr int NORM_VPT = 4;
template <typename T>
__global__ void add_rmsnorm_vec_kernel(StepView v, int rows_fixed, T* __restrict__ residual, const T* __restrict__ delta,
                                       const T* __restrict__ w, T* __restrict__ out, int hidden, float eps, LoraExpand le) {
  __shared__ float red[32];
  __shared__ float ts[LORA_MAX_TMP];
  const int t = blockIdx.x;
  const int rows = rows_fixed >= 0 ? rows_fixed : v.T();
  if (t >= rows) return;
  const int idx = delta ? lora_stage(v, le, t, ts) : 0;
  const int nvec = hidden / 8;
  T* r = residual + (size_t)t * hidden;
  const T* d = delta ? delta + (size_t)t * hidden : nullptr;
  float x[NORM_VPT][8];
  float ss = 0.f;
#pragma unroll
  for (int a = 0; a < NORM_VPT; ++a) {
    const int i = threadIdx.x + a * blockDim.x;
    if (i >= nvec) break;
    uint4 ru = load8_raw(r + i * 8);
    T* rh = reinterpret_cast<T*>(&ru);
    if (d) {
      const uint4 du = load8_raw(d + i * 8);
      const T* dh = reinterpret_cast<const T*>(&du);
#pragma unroll
      for (int e = 0; e < 8; ++e) rh[e] = from_f<T>(to_f(rh[e]) + with_lora<T>(to_f(dh[e]), le, idx, ts, i * 8 + e));
      *reinterpret_cast<uint4*>(r + i * 8) = ru;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[a][e] = to_f(rh[e]);
      ss += x[a][e] * x[a][e];
    }
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / hidden + eps);
  T* o = out + (size_t)t * hidden;
#pragma unroll
  for (int a = 0; a < NORM_VPT; ++a) {
    const int i = threadIdx.x + a * blockDim.x;
    if (i >= nvec) break;
    float wf[8];
    load8(w + i * 8, wf);
    uint4 ou;
    T* oh = reinterpret_cast<T*>(&ou);
#pragma unroll
    for (int e = 0; e < 8; ++e) oh[e] = from_f<T>(to_f(from_f<T>(x[a][e] * inv)) * wf[e]);
    *reinterpret_cast<uint4*>(o + i * 8) = ou;
  }
}

// Per token: q/k/v bias, rotary embedding on q and k (rotate-half pairs i, i + d/2), k and v into the
// cache at the token's slot. q is rotated in place in the qkv buffer; padding tokens (slot < 0) skip the
// cache write.
template <typename T>
__global__ void qkv_rope_cache_kernel(StepView v, T* __restrict__ qkv, const T* __restrict__ bias,
                                      const float* __restrict__ inv_freq, T* __restrict__ kcache, T* __restrict__ vcache,
                                      int nh, int nkv, int hd, int block_size, LoraExpand le) {
  // The rotation's sine and cosine once per frequency (not once per head: 32x fewer of the costly
  // full-range sincosf at 7B's 28 + 4 heads).
  __shared__ float sn[MAX_HD / 2], cs[MAX_HD / 2];
  __shared__ float ts[LORA_MAX_TMP];
  const int t = blockIdx.x;
  if (t >= v.T()) return;
  const int idx = lora_stage(v, le, t, ts);
  const int pos = v.positions()[t];
  const int slot = v.slots()[t];
  const int width = (nh + 2 * nkv) * hd;
  T* row = qkv + (size_t)t * width;
  const int half = hd / 2;
  for (int j = threadIdx.x; j < half; j += blockDim.x) sincosf((float)pos * inv_freq[j], &sn[j], &cs[j]);
  __syncthreads();
  // Rotated pairs of q and k heads.
  for (int i = threadIdx.x; i < (nh + nkv) * half; i += blockDim.x) {
    const int h = i / half, j = i % half;
    const int base = h * hd;
    float x0 = with_lora<T>(to_f(row[base + j]), le, idx, ts, base + j);
    float x1 = with_lora<T>(to_f(row[base + j + half]), le, idx, ts, base + j + half);
    if (bias) {
      x0 = to_f(from_f<T>(x0 + to_f(bias[base + j])));
      x1 = to_f(from_f<T>(x1 + to_f(bias[base + j + half])));
    }
    const float s = sn[j], c = cs[j];
    const T y0 = from_f<T>(x0 * c - x1 * s);
    const T y1 = from_f<T>(x1 * c + x0 * s);
    if (h < nh) {
      row[base + j] = y0;
      row[base + j + half] = y1;
    } else if (slot >= 0) {
      const int kh = h - nh;
      const int blk = slot / block_size, off = slot % block_size;
      T* dst = kcache + kv_row(blk, kh, off, nkv, block_size, hd);
      dst[j] = y0;
      dst[j + half] = y1;
    }
  }
  if (slot < 0) return;
  const int blk = slot / block_size, off = slot % block_size;
  for (int i = threadIdx.x; i < nkv * hd; i += blockDim.x) {
    const int kh = i / hd, d = i % hd;
    const int src = (nh + nkv) * hd + i;
    float x = with_lora<T>(to_f(row[src]), le, idx, ts, src);
    if (bias) x += to_f(bias[src]);
    vcache[kv_row(blk, kh, off, nkv, block_size, hd) + d] = from_f<T>(x);
  }
}

// Whether token t shares its sequence with a neighbour in the step (a prefill chunk of 2 or more tokens;
// a sequence's tokens are contiguous in a step, at consecutive positions).
__device__ __forceinline__ bool in_multi_token_run(const StepView& v, int t) {
  const int* seq = v.token_seq();
  const int* slots = v.slots();
  if (slots[t] < 0) return false;
  return (t > 0 && seq[t - 1] == seq[t] && slots[t - 1] >= 0) || (t + 1 < v.T() && seq[t + 1] == seq[t] && slots[t + 1] >= 0);
}

// Paged attention. One CTA per (query token, kv head, split): the G = nh / nkv query heads that share
// the kv head attend together to the token's context (positions 0..pos, causal), read from the cache
// through the sequence's block table in chunks of CHUNK keys staged in shared memory (float, rows padded
// against bank conflicts). Scores: one thread per (head, key); softmax: online per head, one warp per
// head; P x V: a lane per output dimension. With splits > 1 each CTA takes a share of the chunks and
// writes its partial max, sum and accumulator for attn_combine.

// A token's context length (itself included; 0 for a padding row) and how attention_kernel shares its
// CHUNK-key chunks among `splits` CTAs: `per` chunks each, `active` CTAs that have keys (at least 1).
// attn_combine_kernel reads the same plan, so only the active splits' partials are combined.
struct SplitPlan { int L, nchunks, per, active; };
__device__ __forceinline__ SplitPlan split_plan(const StepView& v, int t, int splits) {
  SplitPlan p;
  p.L = v.slots()[t] < 0 ? 0 : v.positions()[t] + 1;
  p.nchunks = (p.L + CHUNK - 1) / CHUNK;
  p.per = (p.nchunks + splits - 1) / splits;
  p.active = p.per > 0 ? (p.nchunks + p.per - 1) / p.per : 1;
  return p;
}

template <typename T>
__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(
    StepView v, const T* __restrict__ qkv, const T* __restrict__ kcache, const T* __restrict__ vcache,
    T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
    int nh, int nkv, int hd, int block_size, float scale, int splits, int skip_runs) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
  if (t >= v.T()) return;
  // In a prefill step prefill_attention_kernel takes every token of a multi-token run: this kernel then
  // keeps only the step's decode rows.
  if (skip_runs && in_multi_token_run(v, t)) return;
  const int G = nh / nkv;
  const int seq = v.token_seq()[t];
  const int W = v.W();
  const int* table = v.block_tables() + (size_t)seq * W;
  const int ldk = hd + 1;
  float* q_s = smem;                         // [G][hd]
  float* k_s = q_s + G * hd;                 // [CHUNK][hd+1]
  float* v_s = k_s + CHUNK * ldk;            // [CHUNK][hd+1]
  float* p_s = v_s + CHUNK * ldk;            // [G][CHUNK]
  const int width = (nh + 2 * nkv) * hd;
  // The splits that have keys: a graph is captured for the longest context's split count, and a short
  // context leaves most of them empty; those return at once and attn_combine reads only the active ones.
  // With one active split the output is written here directly (attn_combine then has nothing to do).
  const SplitPlan plan = split_plan(v, t, splits);
  const int L = plan.L;
  if (split >= plan.active) return;
  const bool direct = plan.active == 1;
  const int c0 = split * plan.per, c1 = min(plan.nchunks, c0 + plan.per);
  const T* qrow = qkv + (size_t)t * width + (size_t)kh * G * hd;
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) q_s[i] = to_f(qrow[i]) * scale;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int NW = ATTN_THREADS / 32;
  constexpr int DPL = MAX_HD / 32;       // dims per lane, at most
  constexpr int HPW = MAX_G / NW;        // heads per warp, at most
  float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
  for (int a = 0; a < HPW; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.f;
#pragma unroll
    for (int b = 0; b < DPL; ++b) acc[a][b] = 0.f;
  }
  const bool vec = (hd & 7) == 0;
  for (int c = c0; c < c1; ++c) {
    const int k0 = c * CHUNK;
    const int n = min(CHUNK, L - k0);
    __syncthreads();
    // Eight dimensions a load where the head allows (a key's row is hd / 8 16-byte accesses), else one.
    const int vw = vec ? 8 : 1, hv = hd / vw;
    for (int i = threadIdx.x; i < n * hv; i += blockDim.x) {
      const int k = i / hv, d = (i - k * hv) * vw;
      const int pos = k0 + k;
      const size_t off = kv_row(table[pos / block_size], kh, pos % block_size, nkv, block_size, hd) + d;
      if (vec) {
        float kf[8], vf[8];
        load8(kcache + off, kf);
        load8(vcache + off, vf);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          k_s[k * ldk + d + e] = kf[e];
          v_s[k * ldk + d + e] = vf[e];
        }
      } else {
        k_s[k * ldk + d] = to_f(kcache[off]);
        v_s[k * ldk + d] = to_f(vcache[off]);
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * CHUNK; i += blockDim.x) {
      const int h = i / CHUNK, k = i % CHUNK;
      float s = -INFINITY;
      if (k < n) {
        s = 0.f;
        const float* qh = q_s + h * hd;
        const float* kr = k_s + k * ldk;
        for (int d = 0; d < hd; ++d) s += qh[d] * kr[d];
      }
      p_s[i] = s;
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < HPW; ++a) {
      const int h = warp + a * NW;
      if (h >= G) break;
      float s = p_s[h * CHUNK + lane];  // CHUNK == 32: a key per lane
      const float cmax = warp_max(s);
      const float mnew = fmaxf(m[a], cmax);
      const float corr = m[a] == -INFINITY ? 0.f : __expf(m[a] - mnew);
      const float p = s == -INFINITY ? 0.f : __expf(s - mnew);
      l[a] = l[a] * corr + warp_sum(p);
      m[a] = mnew;
#pragma unroll
      for (int b = 0; b < DPL; ++b) acc[a][b] *= corr;
      for (int k = 0; k < n; ++k) {
        const float pk = __shfl_sync(0xffffffffu, p, k);
        const float* vr = v_s + k * ldk;
#pragma unroll
        for (int b = 0; b < DPL; ++b) {
          const int d = lane + 32 * b;
          if (d < hd) acc[a][b] += pk * vr[d];
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < HPW; ++a) {
    const int h = warp + a * NW;
    if (h >= G) break;
    const int qh = kh * G + h;
    if (direct) {
      const float inv = l[a] > 0.f ? 1.f / l[a] : 0.f;
      T* o = out + (size_t)t * nh * hd + (size_t)qh * hd;
#pragma unroll
      for (int b = 0; b < DPL; ++b) {
        const int d = lane + 32 * b;
        if (d < hd) o[d] = from_f<T>(acc[a][b] * inv);
      }
    } else {
      const size_t pi = ((size_t)t * nh + qh) * splits + split;
      float* pa = part_acc + pi * hd;
#pragma unroll
      for (int b = 0; b < DPL; ++b) {
        const int d = lane + 32 * b;
        if (d < hd) pa[d] = acc[a][b];
      }
      if (lane == 0) {
        part_ml[pi * 2] = m[a];
        part_ml[pi * 2 + 1] = l[a];
      }
    }
  }
}

// Prefill attention on the tensor cores (WMMA, fp16/bf16 in, fp32 accumulate). attention_kernel gives each
// query token its own CTA, which re-reads the whole context for every token: a 2048-token prefill of
// Qwen2-0.5B spent 54 of its 61 ms there (H200, 2026-12-04; 16 of 23 ms with this kernel). Here a CTA takes a tile of PF_TILE
// consecutive step tokens and one kv head: the keys and values of a PF_KEYS chunk are staged once for the
// tile's rows of all G query heads that share the kv head. Per head (a warp each): S = Q K^T into shared
// memory, an online softmax by two lanes a row (causal by position; the rows of another sequence or
// past the run masked out), the accumulator rescaled by row, then O += P V. A tile spanning sequences
// takes each sequence's run in turn; single-token rows (decode rows of a mixed step) are left to
// attention_kernel, which splits long contexts over CTAs.
constexpr int PF_TILE = 16;   // query tokens a tile: one WMMA row block
constexpr int PF_KEYS = 64;   // keys a staged chunk
constexpr int PF_WARPS = 8;   // a head a warp for G <= 8 (with 4, Qwen2-0.5B's 7 heads took two rounds: 25.3 ms a 2k TTFT against 22.6)
constexpr int PF_SLD = PF_KEYS + 4;   // a score row's stride (floats): successive rows start 4 banks apart
constexpr int PF_PLD = PF_KEYS + 8;   // a probability row's stride (16-bit elements)

__host__ __device__ inline size_t pf_align(size_t b) { return (b + 127) & ~size_t(127); }
// The kernel's shared memory for G heads of dimension hd (its carve order below).
__host__ __device__ inline size_t prefill_smem_bytes(int G, int hd) {
  return pf_align(2 * (size_t)G * PF_TILE * hd) + 2 * pf_align(2 * (size_t)PF_KEYS * hd) +
         pf_align(4 * (size_t)G * PF_TILE * hd) + pf_align(4 * (size_t)PF_WARPS * PF_TILE * PF_SLD) +
         pf_align(2 * (size_t)PF_WARPS * PF_TILE * PF_PLD) + 2 * pf_align(4 * (size_t)G * PF_TILE) +
         pf_align(4 * (size_t)PF_WARPS * PF_TILE);
}

template <typename T>
__global__ void __launch_bounds__(PF_WARPS * 32) prefill_attention_kernel(
    StepView v, const T* __restrict__ qkv, const T* __restrict__ kcache, const T* __restrict__ vcache,
    T* __restrict__ out, int nh, int nkv, int hd, int block_size, float scale) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char pf_smem[];
  const int G = nh / nkv, kh = blockIdx.y, T_ = v.T();
  const int t0 = blockIdx.x * PF_TILE;
  if (t0 >= T_) return;
  const int tn = min(PF_TILE, T_ - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned char* cur = pf_smem;
  auto take = [&](size_t bytes) { unsigned char* r = cur; cur += pf_align(bytes); return r; };
  T* q_s = reinterpret_cast<T*>(take(2 * (size_t)G * PF_TILE * hd));          // [G][TILE][hd]
  T* k_s = reinterpret_cast<T*>(take(2 * (size_t)PF_KEYS * hd));              // [KEYS][hd]
  T* v_s = reinterpret_cast<T*>(take(2 * (size_t)PF_KEYS * hd));              // [KEYS][hd]
  float* o_s = reinterpret_cast<float*>(take(4 * (size_t)G * PF_TILE * hd));  // [G][TILE][hd]
  float* s_w = reinterpret_cast<float*>(take(4 * (size_t)PF_WARPS * PF_TILE * PF_SLD)) + warp * PF_TILE * PF_SLD;
  T* p_w = reinterpret_cast<T*>(take(2 * (size_t)PF_WARPS * PF_TILE * PF_PLD)) + warp * PF_TILE * PF_PLD;
  float* m_s = reinterpret_cast<float*>(take(4 * (size_t)G * PF_TILE));       // [G][TILE]
  float* l_s = reinterpret_cast<float*>(take(4 * (size_t)G * PF_TILE));
  float* corr_w = reinterpret_cast<float*>(take(4 * (size_t)PF_WARPS * PF_TILE)) + warp * PF_TILE;
  const int width = (nh + 2 * nkv) * hd;
  const int* seqs = v.token_seq();
  const int* positions = v.positions();
  const int* slots = v.slots();
  const T zero = from_f<T>(0.f);
  for (int r0 = 0; r0 < tn;) {
    const int t = t0 + r0;
    if (!in_multi_token_run(v, t)) {
      ++r0;
      continue;
    }
    const int seq = seqs[t];
    int r1 = r0 + 1;
    while (r1 < tn && seqs[t0 + r1] == seq && slots[t0 + r1] >= 0 && positions[t0 + r1] == positions[t0 + r1 - 1] + 1) ++r1;
    const int rows = r1 - r0, first = positions[t];
    const int L = positions[t0 + r1 - 1] + 1;  // the keys the run's last row sees
    const int* table = v.block_tables() + (size_t)seq * v.W();
    __syncthreads();  // the previous run's output is written
    for (int i = threadIdx.x; i < G * PF_TILE * hd; i += blockDim.x) {
      const int h = i / (PF_TILE * hd), rem = i - h * PF_TILE * hd, r = rem / hd, d = rem - r * hd;
      q_s[i] = r < rows ? qkv[(size_t)(t + r) * width + (size_t)(kh * G + h) * hd + d] : zero;
      o_s[i] = 0.f;
    }
    for (int i = threadIdx.x; i < G * PF_TILE; i += blockDim.x) {
      m_s[i] = -INFINITY;
      l_s[i] = 0.f;
    }
    for (int c0 = 0; c0 < L; c0 += PF_KEYS) {
      const int n = min(PF_KEYS, L - c0);
      __syncthreads();  // the last chunk's readers are done (and the run's initialisation is visible)
      // Keys past n are zeros: their probabilities are 0, and 0 x a stale value could be NaN.
      const int hv = hd / 8;
      for (int i = threadIdx.x; i < PF_KEYS * hv; i += blockDim.x) {
        const int k = i / hv, d = (i - k * hv) * 8;
        uint4 kq = make_uint4(0, 0, 0, 0), vq = kq;
        if (k < n) {
          const int pos = c0 + k;
          const size_t off = kv_row(table[pos / block_size], kh, pos % block_size, nkv, block_size, hd) + d;
          kq = *reinterpret_cast<const uint4*>(kcache + off);
          vq = *reinterpret_cast<const uint4*>(vcache + off);
        }
        *reinterpret_cast<uint4*>(k_s + k * hd + d) = kq;
        *reinterpret_cast<uint4*>(v_s + k * hd + d) = vq;
      }
      __syncthreads();
      for (int h = warp; h < G; h += PF_WARPS) {
        const T* qh = q_s + (size_t)h * PF_TILE * hd;
        for (int j = 0; j < PF_KEYS / 16; ++j) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
          wmma::fill_fragment(sf, 0.f);
          for (int kk = 0; kk < hd; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
            wmma::load_matrix_sync(a, qh + kk, hd);
            wmma::load_matrix_sync(b, k_s + j * 16 * hd + kk, hd);
            wmma::mma_sync(sf, a, b, sf);
          }
          wmma::store_matrix_sync(s_w + j * 16, sf, PF_SLD, wmma::mem_row_major);
        }
        __syncwarp();
        // Two lanes a row, keys interleaved between them.
        {
          const int r = lane >> 1, half = lane & 1;
          const int lim = r < rows ? min(n, first + r - c0 + 1) : 0;  // keys j < lim are visible to row r
          const float* srow = s_w + r * PF_SLD;
          T* prow = p_w + r * PF_PLD;
          float mx = -INFINITY;
          for (int j = half; j < lim; j += 2) mx = fmaxf(mx, srow[j]);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)) * scale;
          float* mh = m_s + h * PF_TILE;
          float* lh = l_s + h * PF_TILE;
          const float mold = mh[r];
          const float mnew = fmaxf(mold, mx);
          float sum = 0.f;
          for (int j = half; j < PF_KEYS; j += 2) {
            const float p = j < lim ? __expf(srow[j] * scale - mnew) : 0.f;
            sum += p;
            prow[j] = from_f<T>(p);
          }
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          const float corr = mold == -INFINITY ? 0.f : __expf(mold - mnew);
          if (half == 0) {
            mh[r] = mnew;
            lh[r] = lh[r] * corr + sum;
            corr_w[r] = corr;
          }
        }
        __syncwarp();
        float* oh = o_s + (size_t)h * PF_TILE * hd;
        for (int r = 0; r < PF_TILE; ++r) {
          const float cr = corr_w[r];
          for (int d = lane; d < hd; d += 32) oh[r * hd + d] *= cr;
        }
        __syncwarp();
        for (int j = 0; j < hd / 16; ++j) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
          wmma::load_matrix_sync(of, oh + j * 16, hd, wmma::mem_row_major);
          for (int kk = 0; kk < PF_KEYS; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
            wmma::load_matrix_sync(a, p_w + kk, PF_PLD);
            wmma::load_matrix_sync(b, v_s + kk * hd + j * 16, hd);
            wmma::mma_sync(of, a, b, of);
          }
          wmma::store_matrix_sync(oh + j * 16, of, hd, wmma::mem_row_major);
        }
        __syncwarp();
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * rows * hd; i += blockDim.x) {
      const int h = i / (rows * hd), rem = i - h * rows * hd, r = rem / hd, d = rem - r * hd;
      const float l = l_s[h * PF_TILE + r];
      out[(size_t)(t + r) * nh * hd + (size_t)(kh * G + h) * hd + d] =
          from_f<T>(l > 0.f ? o_s[((size_t)h * PF_TILE + r) * hd + d] / l : 0.f);
    }
    r0 = r1;
  }
}

template <typename T>
__global__ void attn_combine_kernel(StepView v, const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                    T* __restrict__ out, int nh, int hd, int splits) {
  const int t = blockIdx.x, qh = blockIdx.y;
  if (t >= v.T()) return;
  // Only attention_kernel's active splits wrote partials; with one, it wrote the output itself.
  const int active = split_plan(v, t, splits).active;
  if (active == 1) return;
  const size_t base = ((size_t)t * nh + qh) * splits;
  float mmax = -INFINITY;
  for (int s = 0; s < active; ++s) mmax = fmaxf(mmax, part_ml[(base + s) * 2]);
  float lsum = 0.f;
  for (int s = 0; s < active; ++s) {
    const float ms = part_ml[(base + s) * 2];
    if (ms != -INFINITY) lsum += part_ml[(base + s) * 2 + 1] * __expf(ms - mmax);
  }
  const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < active; ++s) {
      const float ms = part_ml[(base + s) * 2];
      if (ms != -INFINITY) a += part_acc[(base + s) * hd + d] * __expf(ms - mmax);
    }
    out[(size_t)t * nh * hd + (size_t)qh * hd + d] = from_f<T>(a * inv);
  }
}

// Y[r, n] = X[r, :] . W[n, :] for the R (<= GEMV_MAX_ROWS) rows of a small decode step, fp32 accumulate.
// A decode step at batch 1-4 is a matrix-vector product that only streams W: a warp per output column
// reads W's row once in 16-byte accesses (GEMV_UNROLL in flight per lane) and keeps R sums; the few rows
// of X stay in L1/L2. cuBLAS's GEMM kernels left q/k/v and o at 42-46 % of the H200's bandwidth at these
// shapes. k % 8 == 0 and 16-byte aligned rows (checked by the caller).
constexpr int GEMV_MAX_ROWS = 4;
constexpr int GEMV_WARPS = 4;
constexpr int GEMV_UNROLL = 4;
template <typename T, typename OutT, int R>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_kernel(const T* __restrict__ X, const T* __restrict__ W,
                                                             OutT* __restrict__ Y, int n, int k) {
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (col >= n) return;
  const T* w = W + (size_t)col * k;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  constexpr int STEP = 32 * 8;
  for (int i0 = lane * 8; i0 < k; i0 += STEP * GEMV_UNROLL) {
    float wf[GEMV_UNROLL][8];
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
      const int i = i0 + u * STEP;
      if (i < k) load8(w + i, wf[u]);
    }
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
      const int i = i0 + u * STEP;
      if (i >= k) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xf[8];
        load8(X + (size_t)r * k + i, xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r] = fmaf(wf[u][e], xf[e], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0) {
      if constexpr (sizeof(OutT) == 4) Y[(size_t)r * n + col] = sum;
      else Y[(size_t)r * n + col] = from_f<T>(sum);
    }
  }
}

// gate|up [T, 2I] -> silu(gate) * up [T, I], rounded as transformers rounds (act, then the product).
template <typename T>
__global__ void silu_mul_kernel(StepView v, const T* __restrict__ gu, T* __restrict__ out, int inter, LoraExpand lg,
                                LoraExpand lu) {
  __shared__ float ts[LORA_MAX_TMP];
  const int t = blockIdx.y;
  if (t >= v.T()) return;
  const int idx = lora_stage(v, lg, t, ts);
  const T* g = gu + (size_t)t * 2 * inter;
  const T* u = g + inter;
  T* o = out + (size_t)t * inter;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
    const float x = with_lora<T>(to_f(g[i]), lg, idx, ts, i);
    const float a = to_f(from_f<T>(x / (1.f + __expf(-x))));
    o[i] = from_f<T>(a * with_lora<T>(to_f(u[i]), lu, idx, ts, i));
  }
}

// The last token of each sequence (the one whose next token is sampled) gathered into [S, hidden].
template <typename T>
__global__ void gather_last_kernel(StepView v, const T* __restrict__ src, T* __restrict__ dst, int hidden) {
  const int s = blockIdx.x;
  if (s >= v.S()) return;
  const int t = v.last_token()[s];
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[(size_t)s * hidden + i] = src[(size_t)t * hidden + i];
}

// Counter-based randomness (SplitMix64 of seed, step and token): the same seed and output position give
// the same draw, in any batch and after preemption.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float gumbel(uint64_t seed, int step, int token) {
  const uint64_t r = mix64(seed ^ mix64(((uint64_t)(uint32_t)step << 32) | (uint32_t)token));
  const float u = ((float)(r >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
  return -__logf(-__logf(u));
}

// Repetition, presence and frequency penalties on the logits of each row's listed tokens (distinct in a
// row, so no two threads write one logit), in place, before sampling; as sampler.ts applies them. A row
// without entries (most, and every padding row) returns at once: in a graph this kernel costs a launch.
__global__ void penalty_kernel(StepView v, float* __restrict__ logits, int vocab) {
  const int s = blockIdx.x;
  if (s >= v.S()) return;
  const int n = v.pen_count()[s];
  if (n <= 0) return;
  const int start = v.pen_start()[s];
  const float rep = v.repetition()[s], pres = v.presence()[s], freq = v.frequency()[s];
  const int* toks = v.pen_tokens() + start;
  const int* cnts = v.pen_counts() + start;
  float* x = logits + (size_t)s * vocab;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int t = toks[i];
    if (t < 0 || t >= vocab) continue;
    float y = x[t];
    if (rep > 0.f && rep != 1.f) y = y > 0.f ? y / rep : y * rep;
    const int c = cnts[i];
    if (c > 0) y = y - pres - freq * (float)c;
    x[t] = y;
  }
}

// One CTA per sampled row. Temperature 0: argmax (lowest index on ties). Otherwise the logits are
// divided by the temperature, the top-k and top-p sets are cut by bisection on a threshold (a pass over
// the vocabulary per step: no sort), and the token is drawn by the Gumbel-max trick from the kept set,
// which is an exact draw from the renormalised distribution.
constexpr int SAMPLE_THREADS = 1024;
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(StepView v, const float* __restrict__ logits, int vocab,
                                                             int* __restrict__ out_tokens) {
  __shared__ float red[32];
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  const int s = blockIdx.x;
  if (s >= v.S()) return;
  const float* xs = logits + (size_t)s * vocab;
  // A constrained row's tokens outside its mask are -inf (never drawn, never the argmax).
  const int ma = v.mask_at()[s];
  const unsigned* mk = ma > 0 ? v.masks() + (size_t)(ma - 1) * mask_words(vocab) : nullptr;
  auto x_at = [&](int i) -> float { return (mk && !((__ldg(mk + (i >> 5)) >> (i & 31)) & 1u)) ? -INFINITY : xs[i]; };
  const float temp = v.temperature()[s];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto argmax_of = [&](auto score) -> int {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float sc = score(i);
      if (sc > bv || (sc == bv && i < bi)) { bv = sc; bi = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    __syncthreads();
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
      const int nw = blockDim.x >> 5;
      bv = lane < nw ? best_v[lane] : -INFINITY;
      bi = lane < nw ? best_i[lane] : 0x7fffffff;
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
      }
      if (lane == 0) best_i[0] = bi;
    }
    __syncthreads();
    return best_i[0];
  };
  if (!(temp > 0.f)) {
    const int tok = argmax_of([&](int i) { return x_at(i); });
    if (threadIdx.x == 0) out_tokens[s] = tok;
    return;
  }
  const float invt = 1.f / temp;
  float mx = -INFINITY, mn = INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float y = x_at(i) * invt;
    mx = fmaxf(mx, y);
    if (y > -INFINITY) mn = fminf(mn, y);
  }
  mx = block_max(mx, red);
  mn = -block_max(-mn, red);
  float thr = -INFINITY;
  const int k = v.top_k()[s];
  if (k > 0 && k < vocab) {
    // Largest threshold with at least k logits at or above it.
    float lo = mn, hi = mx;
    for (int it = 0; it < 32; ++it) {
      const float mid = 0.5f * (lo + hi);
      float c = 0.f;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) c += (x_at(i) * invt >= mid) ? 1.f : 0.f;
      c = block_sum(c, red);
      if (c >= (float)k) lo = mid; else hi = mid;
    }
    thr = lo;
  }
  const float p = v.top_p()[s];
  if (p > 0.f && p < 1.f) {
    float z = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float y = x_at(i) * invt;
      if (y >= thr) z += __expf(y - mx);
    }
    z = block_sum(z, red);
    // Largest threshold whose kept mass is still at least p (the smallest nucleus).
    float lo = fmaxf(thr, mn), hi = mx;
    for (int it = 0; it < 32; ++it) {
      const float mid = 0.5f * (lo + hi);
      float mass = 0.f;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float y = x_at(i) * invt;
        if (y >= mid) mass += __expf(y - mx);
      }
      mass = block_sum(mass, red);
      if (mass >= p * z) lo = mid; else hi = mid;
    }
    thr = fmaxf(thr, lo);
  }
  const uint64_t seed = ((uint64_t)(uint32_t)v.seed_hi()[s] << 32) | (uint32_t)v.seed_lo()[s];
  const int step = v.sample_step()[s];
  const int tok = argmax_of([&](int i) {
    const float y = x_at(i) * invt;
    return y >= thr ? y + gumbel(seed, step, i) : -INFINITY;
  });
  if (threadIdx.x == 0) out_tokens[s] = tok;
}

// LoRA (punica's shrink and expand, per row): a row whose sequence has adapter entry idx > 0 adds
// (x A[idx]) B[idx] to a projection's output; rows of the base model (idx 0) return at once. On the device
// A and B are kept transposed, At [entries, cap, in] and Bt [entries, out, cap] (rg_lora_write transposes
// lora.ts's [in, cap] and [cap, out]; the scale is folded into B), so that what one thread or CTA reads is
// contiguous. The shrink is a kernel
// after the projection's GEMM; its float32 output is expanded by the kernel that reads the projection's
// output next (LoraExpand), so a layer's LoRA costs four launches, not eight. Two slots that share their
// input (gate and up) shrink together: columns [0, cap0) of the activation are the first's.
constexpr int LORA_THREADS = 256;

// tmp[t, c] = x[t] . At[idx][c]: a CTA per (rank column, token), its threads over `in` in 16-byte loads
// issued together (up to LORA_UNROLL each before the first is used), then one reduction. LoRA's cost is
// latency, not bytes (a rank-8 adapter reads a few hundred KB a layer): the first form (a CTA per token,
// each thread a chain of dependent loads) took ~30 us a projection, and a warp per column still walked
// 19 dependent 16-byte loads along the down projection's 4864 inputs.
constexpr int LORA_UNROLL = 4;
template <typename T>
__global__ void __launch_bounds__(LORA_THREADS) lora_shrink_kernel(StepView v, const T* __restrict__ x, int ldx,
                                                                 const T* __restrict__ A0, int cap0, const T* __restrict__ A1,
                                                                 int cap1, float* __restrict__ tmp, int in) {
  __shared__ float red[32];
  const int col = blockIdx.x, t = blockIdx.y;
  if (t >= v.T()) return;
  const int idx = v.lora()[v.token_seq()[t]];
  if (idx <= 0) return;
  const int cap = cap0 + cap1;
  const T* a = col < cap0 ? A0 + ((size_t)idx * cap0 + col) * in : A1 + ((size_t)idx * cap1 + (col - cap0)) * in;
  const T* xr = x + (size_t)t * ldx;
  float acc = 0.f;
  if ((in & 7) == 0 && (ldx & 7) == 0) {
    const int stride = blockDim.x * 8;
    for (int i0 = threadIdx.x * 8; i0 < in; i0 += stride * LORA_UNROLL) {
      uint4 au[LORA_UNROLL], xu[LORA_UNROLL];
#pragma unroll
      for (int u = 0; u < LORA_UNROLL; ++u) {
        const int i = i0 + u * stride;
        if (i < in) {
          au[u] = __ldg(reinterpret_cast<const uint4*>(a + i));
          xu[u] = load8_raw(xr + i);
        }
      }
#pragma unroll
      for (int u = 0; u < LORA_UNROLL; ++u) {
        if (i0 + u * stride >= in) break;
        const T* ah = reinterpret_cast<const T*>(&au[u]);
        const T* xh = reinterpret_cast<const T*>(&xu[u]);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc += to_f(xh[k]) * to_f(ah[k]);
      }
    }
  } else {
    for (int i = threadIdx.x; i < in; i += blockDim.x) acc += to_f(xr[i]) * to_f(a[i]);
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) tmp[(size_t)t * cap + col] = acc;
}

template <typename T>
__global__ void convert_kernel(const void* __restrict__ src, int src_dtype, T* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float x;
    if (src_dtype == 0) x = reinterpret_cast<const float*>(src)[i];
    else if (src_dtype == 1) x = __half2float(reinterpret_cast<const __half*>(src)[i]);
    else x = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(src)[i]);
    dst[i] = from_f<T>(x);
  }
}

// Copy-on-write: whole blocks (every layer, k and v, every kv head) from src[i] to dst[i].
__global__ void copy_blocks_kernel(uint16_t* __restrict__ pool, const int* __restrict__ pairs, int n, size_t block_elems,
                                   size_t plane_elems, int planes) {
  const int i = blockIdx.x, plane = blockIdx.y;
  if (i >= n || plane >= planes) return;
  const size_t src = plane * plane_elems + (size_t)pairs[2 * i] * block_elems;
  const size_t dst = plane * plane_elems + (size_t)pairs[2 * i + 1] * block_elems;
  for (size_t e = threadIdx.x; e < block_elems; e += blockDim.x) pool[dst + e] = pool[src + e];
}

}  // namespace

// =====================================================================================================
// The C ABI

extern "C" {

struct rg_config {
  int32_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, vocab;
  int32_t dtype;            // 0 float16, 1 bfloat16
  int32_t tie_embeddings;   // lm_head is the embedding matrix
  int32_t qkv_bias;         // q/k/v projections carry biases (Qwen2)
  float rms_eps;
  int32_t num_blocks, block_size;
  int32_t max_batched_tokens, max_seqs, max_blocks_per_seq;
  int64_t cublas_workspace_bytes;
  int32_t device;
  int32_t graph_max_batch;  // decode steps of up to this many rows replay CUDA graphs (0: none)
  int32_t max_loras;        // adapters resident at once in the LoRA slots (0: no slots)
  int32_t max_lora_rank;    // rank per module of a slot
  int32_t quantized;        // 1: a GGUF decoder (embedding, head and projections uploaded by rg_quant_upload);
                            // 2: FP8 weights made at load from a float16/bfloat16 checkpoint (rg_load_tensor)
  int64_t quant_bytes;      // the quantized matrices' packed bytes (gguf-blocks.ts planeOffsets, summed)
  int64_t quant_tile_bytes; // the larger products' scratch (split partial sums; dequantized tiles)
  int32_t quant_gemm;       // products of more than QGEMV_MAX_ROWS rows: 0 qmma_kernel (the quantized units
                            // read inside the tensor-core kernel), 1 tiles dequantized for cuBLAS (comparison),
                            // 2 qmmq_kernel (integer types: int8 tensor cores, X rounded to int8 blocks)
};

struct rg_memory {
  int64_t weights, kv_pool, workspace, cublas_workspace, graphs, host_pinned, total;
  int64_t device_free, device_total;
  int64_t lora;  // the LoRA slots (in total)
};

// Weight kinds, as rg_load_tensor takes them.
enum { W_EMBED = 0, W_LM_HEAD, W_FINAL_NORM, W_INPUT_NORM, W_QKV, W_QKV_BIAS, W_O, W_POST_NORM, W_GATE_UP, W_DOWN };

// LoRA slot projections, as rg_lora_write takes them (lora.ts's slot order in a layer).
enum { L_QKV = 0, L_O, L_GATE, L_UP, L_DOWN, L_COUNT };

}  // extern "C"

namespace {

struct Graph {
  int batch = 0;
  int splits = 1;
  cudaGraphExec_t exec = nullptr;
  // The same step with the LoRA kernels (captured where there are slots): a step with no adapter row
  // replays `exec`, which has none of them, so the base model's steps cost what they did.
  cudaGraphExec_t lora_exec = nullptr;
};

struct Engine {
  rg_config cfg{};
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* cublas_ws = nullptr;
  // Weights: one allocation, carved.
  char* wbase = nullptr;
  size_t wbytes = 0;
  void* embed = nullptr;
  void* lm_head = nullptr;
  void* final_norm = nullptr;
  struct Layer { void *in_norm, *qkv, *qkv_b, *o, *post_norm, *gate_up, *down; };
  std::vector<Layer> layers;
  // A GGUF decoder's quantized matrices: segments of output rows (q, k and v are three segments of the
  // fused q|k|v, each of its own type), carved from the end of the weights' allocation.
  // rscale: an FP8 matrix's float scale a row (fp8_lt only; cuBLASLt's outer-vector scale), else null.
  struct QSeg { int type, row0, rows, cols; QPlanes p; const float* rscale = nullptr; };
  std::vector<std::vector<QSeg>> qmats;  // by qmat_index(kind, layer)
  char* qarea = nullptr;
  size_t qused = 0;
  void* qtile = nullptr;
  bool quantized() const { return cfg.quantized != 0; }
  bool qready = false;  // every quantized matrix uploaded whole (rg_load_done checked)
  size_t qmat_index(int kind, int layer) const { return (size_t)kind * (cfg.num_layers + 1) + (layer + 1); }
  float* inv_freq = nullptr;
  // KV pool: one allocation [layer][k|v][block][kv_head][slot][head_dim].
  char* kv = nullptr;
  size_t kv_bytes = 0;
  // Workspace.
  char* ws = nullptr;
  size_t ws_bytes = 0;
  int* d_step = nullptr;
  size_t step_cap_words = 0;
  void *resid, *normed, *qkvbuf, *attn, *delta, *gu, *act, *last;
  float* logits = nullptr;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  int max_splits = 1;
  // prefill_attention_kernel's shared memory, or 0 where it cannot run (head_dim not a multiple of 16, or
  // more than the device lets a CTA have): prefill then goes through attention_kernel.
  size_t prefill_smem = 0;
  int* d_tokens = nullptr;
  int* d_pairs = nullptr;
  // Host pinned staging.
  int* h_step = nullptr;
  int* h_tokens = nullptr;
  size_t pinned_bytes = 0;
  // Weight loading's staging (a bounded pinned buffer and a device scratch), freed by rg_load_done.
  void* stage_h = nullptr;
  void* stage_d = nullptr;
  int sms = 132;
  // Graphs by batch bucket.
  std::vector<Graph> graphs;
  size_t graph_bytes = 0;
  bool capturing = false;
  // LoRA slots: one allocation, [layer][projection] A then B; the shrink's float32 output in the workspace.
  struct LoraSlot { void *a, *b; int in, cap, out; };  // transposed: a [entries, cap, in], b [entries, out, cap]
  char* lora = nullptr;
  size_t lora_bytes = 0;
  std::vector<LoraSlot> lora_slots;
  float* lora_t = nullptr;
  // Adapter uploads' own stream: they neither wait for a step in flight nor are left unfinished by one.
  cudaStream_t lora_stream = nullptr;
  // Whether the step being run (or captured) launches the LoRA kernels: some row has an adapter.
  bool lora_on = false;
  // Profiling (rg_profile): events between the phases of a directly launched step, summed by phase after
  // the step's sync. Off by default; while on, steps launch directly (a graph's kernels cannot be timed apart).
  bool profiling = false;
  std::vector<cudaEvent_t> prof_events;
  std::vector<int> prof_phase;
  size_t prof_n = 0;
  double prof_ms[16] = {0};
  int64_t prof_steps = 0;
  void mark(int phase) {
    if (!profiling) return;
    if (prof_n == prof_events.size()) {
      cudaEvent_t ev;
      if (cudaEventCreate(&ev) != cudaSuccess) return;
      prof_events.push_back(ev);
      prof_phase.push_back(0);
    }
    cudaEventRecord(prof_events[prof_n], stream);
    prof_phase[prof_n++] = phase;
  }
  // Steps of at most this many rows multiply through gemv_kernel instead of cuBLAS (rg_set_gemv_rows;
  // graphs keep what they were captured with).
  int gemv_rows = GEMV_MAX_ROWS;
  // The quantized GEMV's products (rg_set_qgemv_math): 0 float (the default), 1 paired half arithmetic
  // where activations are float16 (quant_kernels.cuh qgemv_kernel H2), 2 int8 activations and dp4a
  // (quant_gemv_i8.cuh) for the integer types.
  int qgemv_math = 0;
  // FP8 products of more than gemv_rows rows through cuBLASLt (rg_set_fp8_gemm 1, before the weights load):
  // the weights are packed with one scale a row (fp8_pack_rows_kernel), each step's activations quantized a
  // row at a time (act_fp8_kernel), and cuBLASLt's FP8 GEMM applies both scales in its epilogue
  // (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F). A shape cuBLASLt has no algorithm for goes through
  // qmma_kernel, and fp8_lt_note says so.
  bool fp8_lt = false;
  cublasLtHandle_t lt = nullptr;
  // outer: cuBLASLt applies the row and token scales (OUTER_VEC_32F); else its product is unscaled float
  // [N, M] (ld M) in the tile, scaled into Y by fp8_outer_scale_kernel.
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr; cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr; cublasLtMatmulAlgo_t algo{}; bool ok = false; bool outer = false;
    void release() {
      if (op) cublasLtMatmulDescDestroy(op);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (c) cublasLtMatrixLayoutDestroy(c);
      op = nullptr; a = b = c = nullptr;
    }
  };
  std::map<std::tuple<int, int, int, int>, LtPlan> lt_plans;  // (M, N, K, output type)
  std::string fp8_lt_note;
  size_t elt() const { return 2; }
  size_t kv_plane_elems() const { return (size_t)cfg.num_blocks * cfg.num_kv_heads * cfg.block_size * cfg.head_dim; }
  void* kplane(int layer) const { return kv + (size_t)(2 * layer) * kv_plane_elems() * elt(); }
  void* vplane(int layer) const { return kv + (size_t)(2 * layer + 1) * kv_plane_elems() * elt(); }
  int qkv_width() const { return (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim; }
};

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// Sizes of each weight kind in elements.
size_t weight_elems(const rg_config& c, int kind) {
  const size_t H = c.hidden, q = (size_t)c.num_heads * c.head_dim, kvw = (size_t)c.num_kv_heads * c.head_dim;
  switch (kind) {
    case W_EMBED: case W_LM_HEAD: return (size_t)c.vocab * H;
    case W_FINAL_NORM: case W_INPUT_NORM: case W_POST_NORM: return H;
    case W_QKV: return (q + 2 * kvw) * H;
    case W_QKV_BIAS: return q + 2 * kvw;
    case W_O: return H * q;
    case W_GATE_UP: return 2 * (size_t)c.intermediate * H;
    case W_DOWN: return H * c.intermediate;
  }
  return 0;
}

// The weights a GGUF decoder keeps quantized (rg_quant_upload): not allocated dense.
bool quant_kind(int kind) { return kind == W_EMBED || kind == W_LM_HEAD || kind == W_QKV || kind == W_O || kind == W_GATE_UP || kind == W_DOWN; }

// Dense bytes of a weight kind in this engine's allocation (0 for a GGUF decoder's quantized matrices).
size_t dense_bytes(const rg_config& c, int kind) {
  return c.quantized && quant_kind(kind) ? 0 : align256(weight_elems(c, kind) * 2);
}

// A LoRA slot's dimensions (lora.ts loraSlots): input width, rank capacity (fused modules x rank), output width.
void lora_dims(const rg_config& c, int p, int& in, int& cap, int& out) {
  const int q = c.num_heads * c.head_dim, kvw = c.num_kv_heads * c.head_dim, R = c.max_lora_rank;
  switch (p) {
    case L_QKV: in = c.hidden; cap = 3 * R; out = q + 2 * kvw; break;
    case L_O: in = q; cap = R; out = c.hidden; break;
    case L_GATE: case L_UP: in = c.hidden; cap = R; out = c.intermediate; break;
    default: in = c.intermediate; cap = R; out = c.hidden; break;
  }
}

size_t lora_slot_bytes(const rg_config& c) {
  if (c.max_loras <= 0) return 0;
  const size_t entries = (size_t)c.max_loras + 1;
  size_t per = 0;
  for (int p = 0; p < L_COUNT; ++p) {
    int in, cap, out;
    lora_dims(c, p, in, cap, out);
    per += align256(entries * in * cap * 2) + align256(entries * cap * out * 2);
  }
  return per * c.num_layers;
}

// The most penalty entries a step carries (step-pack.ts maxPenaltyEntries): a row's distinct tokens are
// at most its positions and at most the vocabulary.
int max_penalty_entries(const rg_config& c) {
  const int64_t per = std::min<int64_t>(c.vocab, (int64_t)c.max_blocks_per_seq * c.block_size);
  return (int)((int64_t)c.max_seqs * per);
}

cudaDataType_t cuda_type(const rg_config& c) { return c.dtype == 1 ? CUDA_R_16BF : CUDA_R_16F; }

template <typename T, typename OutT, int R>
void launch_gemv(Engine& e, const void* X, const void* W, void* Y, int n, int k) {
  gemv_kernel<T, OutT, R><<<(n + GEMV_WARPS - 1) / GEMV_WARPS, GEMV_WARPS * 32, 0, e.stream>>>(
      (const T*)X, (const T*)W, (OutT*)Y, n, k);
}
template <typename T, typename OutT>
void gemv_rows(Engine& e, const void* X, const void* W, void* Y, int rows, int n, int k) {
  switch (rows) {
    case 1: launch_gemv<T, OutT, 1>(e, X, W, Y, n, k); break;
    case 2: launch_gemv<T, OutT, 2>(e, X, W, Y, n, k); break;
    case 3: launch_gemv<T, OutT, 3>(e, X, W, Y, n, k); break;
    default: launch_gemv<T, OutT, 4>(e, X, W, Y, n, k); break;
  }
}

// Y[rows, n] = X[rows, k] . W[n, k]^T (row-major), fp32 accumulate. Up to e.gemv_rows rows (a small
// decode step) through gemv_kernel where the output is at least as wide as the input, the rest through
// cuBLAS. Measured on the H200 at 7B's shapes, batch 1 (bench:gpu's two profiles): the GEMV took gate|up
// from 2.10 to 1.94 ms a step and o from 0.42 to 0.34, but down (3584 outputs of 18944: too few warps,
// each with a long row) from 1.17 to 1.35, so down stays on cuBLAS.
int gemm(Engine& e, const void* X, const void* W, void* Y, int rows, int n, int k, cudaDataType_t ytype) {
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t t = cuda_type(e.cfg);
  if (rows <= e.gemv_rows && rows <= GEMV_MAX_ROWS && n >= k && k % 8 == 0 && ((uintptr_t)X & 15) == 0 && ((uintptr_t)W & 15) == 0) {
    const bool f32 = ytype == CUDA_R_32F;
    if (e.cfg.dtype == 1) {
      if (f32) gemv_rows<__nv_bfloat16, float>(e, X, W, Y, rows, n, k);
      else gemv_rows<__nv_bfloat16, __nv_bfloat16>(e, X, W, Y, rows, n, k);
    } else {
      if (f32) gemv_rows<__half, float>(e, X, W, Y, rows, n, k);
      else gemv_rows<__half, __half>(e, X, W, Y, rows, n, k);
    }
    return 0;
  }
  CUBLAS_TRY(cublasGemmEx(e.blas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha, W, t, k, X, t, k, &beta, Y, ytype, n,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

// A quantized matrix's output rows n and width k (weight_elems' factors).
void qmat_dims(const rg_config& c, int kind, int& n, int& k) {
  const int q = c.num_heads * c.head_dim, kvw = c.num_kv_heads * c.head_dim;
  switch (kind) {
    case W_EMBED: case W_LM_HEAD: n = c.vocab; k = c.hidden; break;
    case W_QKV: n = q + 2 * kvw; k = c.hidden; break;
    case W_O: n = c.hidden; k = q; break;
    case W_GATE_UP: n = 2 * c.intermediate; k = c.hidden; break;
    default: n = c.hidden; k = c.intermediate; break;
  }
}

template <typename T, int R, int TY>
void launch_qgemv(Engine& e, const Engine::QSeg& sg, const void* X, void* y, bool f32, int ldy, int rows, int k) {
  const int grid = (sg.rows + QGEMV_WARPS - 1) / QGEMV_WARPS;
  if (std::is_same<T, __half>::value && e.qgemv_math == 1)
    qgemv_kernel<T, R, TY, true><<<grid, QGEMV_WARPS * 32, 0, e.stream>>>((const T*)X, sg.p, y, f32, ldy, rows, sg.rows, k);
  else
    qgemv_kernel<T, R, TY, false><<<grid, QGEMV_WARPS * 32, 0, e.stream>>>((const T*)X, sg.p, y, f32, ldy, rows, sg.rows, k);
}

// The step's activations X [rows, k] as int8 blocks in e.qtile for qgemv_i8_kernel (quant_gemv_i8.cuh).
template <typename T>
void quantize_x_i8(Engine& e, const void* X, int rows, int k, int8_t*& xq, float2*& xd, bool interleaved = false) {
  xq = static_cast<int8_t*>(e.qtile);
  xd = reinterpret_cast<float2*>(static_cast<char*>(e.qtile) + qgemv_i8_values_bytes(rows, k));
  const int blocks = rows * (k / 32);
  quantize_x_i8_kernel<T><<<(blocks + 7) / 8, 256, 0, e.stream>>>((const T*)X, blocks, xq, xd, interleaved);
}

template <typename T, int R, int TY>
void launch_qgemv_i8(Engine& e, const Engine::QSeg& sg, const int8_t* xq, const float2* xd, void* y, bool f32, int ldy, int rows, int k) {
  if constexpr (qgemv_i8_type(TY)) {
    const int grid = (sg.rows + QGEMV_WARPS - 1) / QGEMV_WARPS;
    qgemv_i8_kernel<T, R, TY><<<grid, QGEMV_WARPS * 32, 0, e.stream>>>(xq, xd, sg.p, y, f32, ldy, rows, sg.rows, k);
  }
}

// A GEMV product of `rows` (<= QGEMV_MAX_ROWS) rows: the kernel instantiated for the next row count up (1, 2,
// 4 or 8), in int8 (xq, xd) or in float.
template <typename T, int TY>
void launch_gemv_rows(Engine& e, const Engine::QSeg& sg, bool i8, const void* X, const int8_t* xq, const float2* xd, void* y,
                      bool f32, int ldy, int rows, int k) {
  auto go = [&](auto R) {
    if (i8) launch_qgemv_i8<T, decltype(R)::value, TY>(e, sg, xq, xd, y, f32, ldy, rows, k);
    else launch_qgemv<T, decltype(R)::value, TY>(e, sg, X, y, f32, ldy, rows, k);
  };
  if (rows == 1) go(std::integral_constant<int, 1>{});
  else if (rows == 2) go(std::integral_constant<int, 2>{});
  else if (rows <= 4) go(std::integral_constant<int, 4>{});
  else go(std::integral_constant<int, 8>{});
}

// cuBLASLt's FP8 GEMM for an M x N x K product of FP8 weights [M, K] (row scales) and FP8 activations [N, K]
// (token scales) into `ytype` with rows `ld` apart: its descriptors and algorithm, made once a shape. First
// with both scales in cuBLASLt's epilogue (OUTER_VEC_32F); where this cuBLASLt has no such algorithm (the
// H100 run of 2026-12-05 fell back to the tiles at every shape), unscaled into float (ld M) for
// fp8_outer_scale_kernel to scale. Null where neither has an algorithm (e.fp8_lt_note says why; the caller
// uses qmma_kernel).
Engine::LtPlan* lt_plan(Engine& e, int M, int N, int K, int ld, cudaDataType_t ytype) {
  const auto key = std::make_tuple(M, N, K, (int)ytype * 1000003 + ld);
  auto it = e.lt_plans.find(key);
  if (it != e.lt_plans.end()) return it->second.ok ? &it->second : nullptr;
  Engine::LtPlan& p = e.lt_plans[key];
  auto note = [&](const std::string& why) {
    if (e.fp8_lt_note.find(why) == std::string::npos)
      e.fp8_lt_note += (e.fp8_lt_note.empty() ? "" : "; ") + why + " (" + std::to_string(M) + " x " + std::to_string(N) + " x " + std::to_string(K) + ")";
  };
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const uint64_t ws = (uint64_t)e.cfg.cublas_workspace_bytes;
  // One attempt: the scales in the epilogue (outer) or none (unscaled float out). Its status, or -1 where a
  // descriptor could not be made.
  auto attempt = [&](bool outer, int& found) -> int {
    found = 0;
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return -1;
    if (cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) != CUBLAS_STATUS_SUCCESS) return -1;
    if (outer && (cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)) != CUBLAS_STATUS_SUCCESS ||
                  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)) != CUBLAS_STATUS_SUCCESS)) return -1;
    if (cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, M, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, N, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&p.c, outer ? ytype : CUDA_R_32F, M, N, outer ? ld : M) != CUBLAS_STATUS_SUCCESS) return -1;
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return -1;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t res{};
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(e.lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) p.algo = res.algo;
    return (int)st;
  };
  int found = 0;
  int st = attempt(true, found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) { p.ok = p.outer = true; return &p; }
  p.release();
  note("no FP8 algorithm with outer-vector scales (status " + std::to_string(st) + "): scaled after an unscaled GEMM");
  st = attempt(false, found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) { p.ok = true; return &p; }
  p.release();
  note("no FP8 algorithm at all (status " + std::to_string(st) + "): the tiles");
  return nullptr;
}

// Y[n, m] = acc[n, m] x rs[m] x xs[n]: an unscaled FP8 product (float [N, M]) scaled by its weight rows' and
// tokens' scales into Y (rows ldy apart; float or the model's type).
template <typename T>
__global__ void fp8_outer_scale_kernel(const float* __restrict__ acc, int M, int N, const float* __restrict__ rs,
                                       const float* __restrict__ xs, void* __restrict__ y, bool f32, int ldy) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)M * N) return;
  const int n = (int)(i / M), m = (int)(i % M);
  const float v = acc[i] * rs[m] * xs[n];
  if (f32) static_cast<float*>(y)[(size_t)n * ldy + m] = v;
  else static_cast<T*>(y)[(size_t)n * ldy + m] = from_f<T>(v);
}

// Y[:, row0 .. row0 + M) = X . W^T for an FP8 segment with row scales through cuBLASLt, the activations
// quantized a row at a time into e.qtile (in chunks of rows that fit it, with the unscaled float product
// where cuBLASLt cannot scale). 0 done; 1 no algorithm for a shape (nothing was launched for it: the caller
// runs qmma_kernel); < 0 an error.
template <typename T>
int fp8_lt_project(Engine& e, const Engine::QSeg& sg, const void* X, char* y, size_t ysz, int ldy, int rows, int k, cudaDataType_t ytype) {
  const size_t cap = (size_t)e.cfg.quant_tile_bytes;
  if (cap < 16384) return 1;
  const int M = sg.rows;
  // Every chunk's plan first, so that a shape without an algorithm launches nothing; chunks sized for the
  // epilogue's scales, then again for the float product where that plan is the unscaled one.
  auto plans = [&](int chunk, bool& outer) {
    outer = true;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
      const Engine::LtPlan* p = lt_plan(e, M, std::min(chunk, rows - r0), k, ldy, ytype);
      if (!p) return false;
      outer = outer && p->outer;
    }
    return true;
  };
  int chunk = (int)std::min<size_t>((size_t)rows, (cap - 4096) / ((size_t)k + 4));
  bool outer = false;
  if (chunk < 1 || !plans(chunk, outer)) return 1;
  if (!outer) {
    chunk = (int)std::min<size_t>((size_t)rows, (cap - 8192) / ((size_t)k + 4 + 4 * (size_t)M));
    if (chunk < 1 || !plans(chunk, outer)) return 1;
  }
  uint8_t* x8 = static_cast<uint8_t*>(e.qtile);
  float* xs = reinterpret_cast<float*>(x8 + qalign256((size_t)chunk * k));
  float* acc = reinterpret_cast<float*>(x8 + qalign256(qalign256((size_t)chunk * k) + (size_t)chunk * 4));
  const float alpha = 1.f, beta = 0.f;
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int nr = std::min(chunk, rows - r0);
    act_fp8_kernel<T><<<nr, 256, 0, e.stream>>>(static_cast<const T*>(X) + (size_t)r0 * k, k, k, x8, xs);
    Engine::LtPlan* p = lt_plan(e, M, nr, k, ldy, ytype);
    char* d = y + (size_t)r0 * ldy * ysz;
    if (p->outer) {
      CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sg.rscale, sizeof(sg.rscale)));
      CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof(xs)));
      CUBLAS_TRY(cublasLtMatmul(e.lt, p->op, &alpha, sg.p.q, p->a, x8, p->b, &beta, d, p->c, d, p->c, &p->algo,
                                e.cublas_ws, (size_t)e.cfg.cublas_workspace_bytes, e.stream));
    } else {
      CUBLAS_TRY(cublasLtMatmul(e.lt, p->op, &alpha, sg.p.q, p->a, x8, p->b, &beta, acc, p->c, acc, p->c, &p->algo,
                                e.cublas_ws, (size_t)e.cfg.cublas_workspace_bytes, e.stream));
      const size_t total = (size_t)M * nr;
      fp8_outer_scale_kernel<T><<<(unsigned)((total + 255) / 256), 256, 0, e.stream>>>(acc, M, nr, sg.rscale, xs, d, ysz == 4, ldy);
    }
  }
  return 0;
}

// A split product's partial sums (plan.partial) added into y, after the product's kernel.
template <typename T>
void reduce_splits(Engine& e, const KSplit& plan, char* y, bool f32, int ldy, int rows, int n) {
  if (!plan.partial) return;
  const size_t total = (size_t)rows * n;
  qmma_reduce_kernel<T><<<(unsigned)((total + 255) / 256), 256, 0, e.stream>>>(plan.partial, plan.splits, y, f32, ldy, rows, n);
}

// qmmq_kernel's launch for a tile of BM rows of X (quant_mmq.cuh), its splits and their sum.
template <typename T, int BM>
int qmmq_launch(Engine& e, const Engine::QSeg& sg, const int8_t* xq, const float2* xd, char* y, bool f32, int ldy, int rows, int k,
                void* scratch, size_t scratch_bytes) {
  const int ksteps = (k / 32 + QMMQ_UNITS - 1) / QMMQ_UNITS;
  const int ctas_n = (sg.rows + QMMQ_BN - 1) / QMMQ_BN, ctas_m = (rows + BM - 1) / BM;
  const KSplit plan = ksplit_plan(ctas_n * ctas_m, ksteps, e.sms, qmmq_min_ctas(BM), rows, sg.rows, scratch, scratch_bytes);
  int bad = 0;
  QTYPE_DISPATCH(sg.type, bad = 1,
    if constexpr (qgemv_i8_type(TY))
      qmmq_kernel<T, TY, BM><<<dim3(ctas_m, ctas_n, plan.splits), QMMQ_THREADS, 0, e.stream>>>(xq, xd, sg.p, y, f32, ldy, plan.partial, rows, sg.rows, k, plan.per))
  if (bad) return fail("unknown quantized type " + std::to_string(sg.type));
  reduce_splits<T>(e, plan, y, f32, ldy, rows, sg.rows);
  return 0;
}

// Y[:, row0 .. row0 + sg.rows) = X . W^T through qmmq_kernel (quant_mmq.cuh) for up to QMMQ_MAX_ROWS rows (a
// 32-row tile up to 32): X quantized to int8 blocks in e.qtile once for every segment of the product (xq, xd
// keep it for the next), the split partial sums after it. 0 done; 1 the scratch does not hold X's int8 rows
// or k is not a multiple of 64 (nothing launched: the caller runs qmma_kernel); < 0 an error.
template <typename T>
int qmmq_project(Engine& e, const Engine::QSeg& sg, const void* X, char* y, size_t ysz, int ldy, int rows, int k,
                 int8_t*& xq, float2*& xd) {
  const size_t cap = (size_t)e.cfg.quant_tile_bytes;
  const size_t whole = qalign256(qgemv_i8_scratch_bytes(rows, k));
  // Units are loaded two at a time (qmmq_kernel): a row's unit count must be even.
  if (whole > cap || k % 64 != 0) return 1;
  // Interleaved for the kernel's tiles. A product's segments take the GEMV or this path alike (the choice is
  // by rows), so X's int8 rows from one segment are in this layout for the next.
  if (!xq) quantize_x_i8<T>(e, X, rows, k, xq, xd, true);
  void* scratch = static_cast<char*>(e.qtile) + whole;
  return rows <= QMMQ_TILE32_ROWS ? qmmq_launch<T, 32>(e, sg, xq, xd, y, ysz == 4, ldy, rows, k, scratch, cap - whole)
                                  : qmmq_launch<T, 64>(e, sg, xq, xd, y, ysz == 4, ldy, rows, k, scratch, cap - whole);
}

// Y[rows, n] = X[rows, k] . W^T for a GGUF decoder's quantized matrix (kind, layer), segment by segment
// (each writes its columns of Y). Up to e.gemv_rows rows through qgemv_kernel, which reads the quantized
// bytes once; more through qmma_kernel on the tensor cores (e.qtile holds split partial sums), with
// quant_gemm 2 up to QMMQ_MAX_ROWS rows of the integer types through qmmq_kernel, or, with quant_gemm 1,
// through tiles dequantized into e.qtile and cuBLAS, a tile's rows at most quant_tile_bytes of half values.
template <typename T>
int qproject(Engine& e, int kind, int layer, const void* X, void* Y, int rows, int n, int k, cudaDataType_t ytype) {
  const std::vector<Engine::QSeg>& segs = e.qmats[e.qmat_index(kind, layer)];
  const bool f32 = ytype == CUDA_R_32F;
  const size_t ysz = f32 ? 4 : 2;
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t t = cuda_type(e.cfg);
  const size_t tile_rows = std::max<size_t>(1, (size_t)e.cfg.quant_tile_bytes / ((size_t)k * 2));
  // X as int8 blocks (quantize_x_i8) in e.qtile, once for every segment of the product (q|k|v, gate|up).
  int8_t* xq = nullptr;
  float2* xd = nullptr;
  for (const Engine::QSeg& sg : segs) {
    if (sg.cols != k) return fail("a quantized matrix has the wrong width for its product");
    char* y = static_cast<char*>(Y) + (size_t)sg.row0 * ysz;
    int bad = 0;
    if (rows <= e.gemv_rows && rows <= QGEMV_MAX_ROWS) {
      // qgemv_math 2: the integer types' rows in int8 (X quantized once for every segment that takes it).
      const bool i8 = e.qgemv_math == 2 && qgemv_i8_type(sg.type) && qgemv_i8_scratch_bytes(rows, k) <= (size_t)e.cfg.quant_tile_bytes;
      if (i8 && !xq) quantize_x_i8<T>(e, X, rows, k, xq, xd);
      QTYPE_DISPATCH(sg.type, bad = 1, launch_gemv_rows<T, TY>(e, sg, i8, X, xq, xd, y, f32, n, rows, k))
      if (bad) return fail("unknown quantized type " + std::to_string(sg.type));
      continue;
    }
    if (e.cfg.quant_gemm == 2 && qgemv_i8_type(sg.type) && rows <= QMMQ_MAX_ROWS) {
      const int r = qmmq_project<T>(e, sg, X, y, ysz, n, rows, k, xq, xd);
      if (r < 0) return r;
      if (r == 0) continue;
    }
    // The paths below use e.qtile as their own scratch: X's int8 rows there are gone for a later segment.
    xq = nullptr;
    xd = nullptr;
    if (sg.type == QT_FP8 && sg.rscale && e.fp8_lt) {
      const int r = fp8_lt_project<T>(e, sg, X, y, ysz, n, rows, k, ytype);
      if (r < 0) return r;
      if (r == 0) continue;
    }
    if (e.cfg.quant_gemm != 1) {
      const int ctas_n = (sg.rows + QMMA_BN - 1) / QMMA_BN, ctas_m = (rows + QMMA_BM - 1) / QMMA_BM;
      const int ksteps = (k / 32 + 1) / 2;
      const KSplit plan = ksplit_plan(ctas_n * ctas_m, ksteps, e.sms, QMMA_RESIDENT, rows, sg.rows, e.qtile, (size_t)e.cfg.quant_tile_bytes);
      QTYPE_DISPATCH(sg.type, bad = 1,
        qmma_kernel<T, TY><<<dim3(ctas_n, ctas_m, plan.splits), QMMA_THREADS, 0, e.stream>>>((const T*)X, sg.p, y, f32, n, plan.partial, rows, sg.rows, k, plan.per))
      if (bad) return fail("unknown quantized type " + std::to_string(sg.type));
      reduce_splits<T>(e, plan, y, f32, n, rows, sg.rows);
      continue;
    }
    for (int r0 = 0; r0 < sg.rows; r0 += (int)tile_rows) {
      const int nr = std::min<int>((int)tile_rows, sg.rows - r0);
      const size_t units = (size_t)nr * k / 32, u0 = (size_t)r0 * k / 32;
      const unsigned grid = (unsigned)((units + 255) / 256);
      QTYPE_DISPATCH(sg.type, bad = 1, qdequant_kernel<T, TY><<<grid, 256, 0, e.stream>>>(sg.p, u0, units, (T*)e.qtile))
      if (bad) return fail("unknown quantized type " + std::to_string(sg.type));
      CUBLAS_TRY(cublasGemmEx(e.blas, CUBLAS_OP_T, CUBLAS_OP_N, nr, rows, k, &alpha, e.qtile, t, k, X, t, k, &beta,
                              y + (size_t)r0 * ysz, ytype, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  return 0;
}

// A projection: the dense weight W through gemm, or the GGUF decoder's quantized matrix (kind, layer).
int project(Engine& e, int kind, int layer, const void* W, const void* X, void* Y, int rows, int n, int k, cudaDataType_t ytype) {
  if (!e.quantized()) return gemm(e, X, W, Y, rows, n, k, ytype);
  return e.cfg.dtype == 1 ? qproject<__nv_bfloat16>(e, kind, layer, X, Y, rows, n, k, ytype)
                          : qproject<__half>(e, kind, layer, X, Y, rows, n, k, ytype);
}

// Context splits for a decode of `rows` sequences: enough CTAs to fill the GPU's multiprocessors.
int decode_splits(const Engine& e, int rows) {
  const int sms = e.sms;
  const int ctas = rows * e.cfg.num_kv_heads;
  int s = (2 * sms + ctas - 1) / ctas;
  return s < 1 ? 1 : (s > e.max_splits ? e.max_splits : s);
}

// A projection's LoRA shrink, right after its GEMM: x A into the float32 scratch (the consumer of the
// GEMM's output expands it). `p1` (or -1): a second slot on the same input (up after gate).
template <typename T>
void lora_shrink(Engine& e, int layer, int p, int p1, const void* x, int ldx, int tokens) {
  const Engine::LoraSlot& s = e.lora_slots[(size_t)layer * L_COUNT + p];
  const Engine::LoraSlot* s1 = p1 >= 0 ? &e.lora_slots[(size_t)layer * L_COUNT + p1] : nullptr;
  const int cap1 = s1 ? s1->cap : 0;
  const int cap = s.cap + cap1;
  StepView v{e.d_step};
  // As many threads as 16-byte pieces of the input, in warps, up to LORA_THREADS.
  const int pieces = (s.in + 7) / 8;
  const int threads = pieces >= LORA_THREADS ? LORA_THREADS : ((pieces + 31) / 32) * 32;
  lora_shrink_kernel<T><<<dim3(cap, tokens), threads, 0, e.stream>>>(
      v, (const T*)x, ldx, (const T*)s.a, s.cap, s1 ? (const T*)s1->a : nullptr, cap1, e.lora_t, s.in);
}

// The expand of slot p for the consumer kernel (none while the step runs no LoRA, or for layer -1).
// `other`: the slot the shrink ran beside p (gate and up), whose columns come first when `second`.
LoraExpand lora_expand(const Engine& e, int layer, int p, int other = -1, bool second = false) {
  LoraExpand le;
  if (!e.lora_on || layer < 0) return le;
  const Engine::LoraSlot& s = e.lora_slots[(size_t)layer * L_COUNT + p];
  const int other_cap = other >= 0 ? e.lora_slots[(size_t)layer * L_COUNT + other].cap : 0;
  le.b = s.b;
  le.tmp = e.lora_t;
  le.tmp_width = s.cap + other_cap;
  le.c0 = second ? other_cap : 0;
  le.cap = s.cap;
  le.out = s.out;
  return le;
}
// Profiling phases (rg_profile_read's order): the time from one mark to the next goes to the later mark's phase.
enum { P_EMBED = 0, P_NORM, P_QKV_GEMM, P_ROPE_CACHE, P_ATTENTION, P_O_GEMM, P_GATE_UP_GEMM, P_SILU, P_DOWN_GEMM, P_HEAD_GEMM, P_SAMPLE, P_COUNT };

// residual (+)= delta; out = rmsnorm(residual) * w over `rows` rows (-1: the step's tokens).
template <typename T>
void add_rmsnorm(Engine& e, int grid, int rows_fixed, void* residual, const void* delta, const void* w, void* out,
                 LoraExpand le = LoraExpand{}) {
  const int H = e.cfg.hidden;
  StepView v{e.d_step};
  const int nvec = H / 8;
  if (H % 8 == 0 && nvec <= NORM_VPT * 1024) {
    // A vector a thread where the row allows (latency), up to NORM_VPT each in the widest rows.
    const int threads = nvec >= 1024 ? 1024 : ((nvec + 31) / 32) * 32;
    add_rmsnorm_vec_kernel<T><<<grid, threads, 0, e.stream>>>(v, rows_fixed, (T*)residual, (const T*)delta, (const T*)w,
                                                               (T*)out, H, e.cfg.rms_eps, le);
  } else {
    add_rmsnorm_kernel<T><<<grid, 256, 0, e.stream>>>(v, rows_fixed, (T*)residual, (const T*)delta, (const T*)w, (T*)out,
                                                       H, e.cfg.rms_eps, le);
  }
}

template <typename T>
int forward(Engine& e, int tokens, int seqs, int splits) {
  const rg_config& c = e.cfg;
  StepView v{e.d_step};
  const int H = c.hidden, nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim, I = c.intermediate;
  const int qw = e.qkv_width();
  const cudaDataType_t t = cuda_type(c);
  cudaStream_t st = e.stream;
  const int nthr = 256;
  e.mark(-1);
  if (e.quantized()) {
    const Engine::QSeg& sg = e.qmats[e.qmat_index(W_EMBED, -1)].front();
    int bad = 0;
    QTYPE_DISPATCH(sg.type, bad = 1, qembed_kernel<T, TY><<<tokens, 128, 0, st>>>(v, sg.p, (T*)e.resid, H))
    if (bad) return fail("unknown quantized type " + std::to_string(sg.type));
  } else {
    embed_kernel<T><<<tokens, nthr, 0, st>>>(v, (const T*)e.embed, (T*)e.resid, H);
  }
  e.mark(P_EMBED);
  const int G = nh / nkv;
  // A thread per rotated pair where it fits (the loop's steps are each a round trip to memory), and as
  // many CTAs for SiLU x mul as its row needs.
  const int pairs = (nh + nkv) * (hd / 2);
  const int rope_threads = pairs >= 1024 ? 1024 : ((pairs + 31) / 32) * 32;
  const int silu_ctas = (I + nthr - 1) / nthr < 128 ? (I + nthr - 1) / nthr : 128;
  const size_t attn_smem = ((size_t)G * hd + 2 * (size_t)CHUNK * (hd + 1) + (size_t)G * CHUNK) * sizeof(float);
  const float scale = 1.f / sqrtf((float)hd);
  // A step with a prefill chunk (more tokens than sequences) runs its chunks' attention tiled, where the
  // shapes allow it (attn_smem_opt_in); decode steps (and so the captured graphs) never do.
  const bool tiled = tokens > seqs && e.prefill_smem > 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const Engine::Layer& L = e.layers[l];
    // The previous layer's down projection gets its LoRA delta here, as the residual takes it.
    add_rmsnorm<T>(e, tokens, -1, e.resid, l == 0 ? nullptr : e.delta, L.in_norm, e.normed, lora_expand(e, l - 1, L_DOWN));
    e.mark(P_NORM);
    if (project(e, W_QKV, l, L.qkv, e.normed, e.qkvbuf, tokens, qw, H, t)) return -1;
    if (e.lora_on) lora_shrink<T>(e, l, L_QKV, -1, e.normed, H, tokens);
    e.mark(P_QKV_GEMM);
    qkv_rope_cache_kernel<T><<<tokens, rope_threads, 0, st>>>(v, (T*)e.qkvbuf, (const T*)L.qkv_b, e.inv_freq, (T*)e.kplane(l),
                                                      (T*)e.vplane(l), nh, nkv, hd, c.block_size, lora_expand(e, l, L_QKV));
    e.mark(P_ROPE_CACHE);
    attention_kernel<T><<<dim3(tokens, nkv, splits), ATTN_THREADS, attn_smem, st>>>(
        v, (const T*)e.qkvbuf, (const T*)e.kplane(l), (const T*)e.vplane(l), (T*)e.attn, e.part_acc, e.part_ml, nh, nkv,
        hd, c.block_size, scale, splits, tiled ? 1 : 0);
    if (tiled) {
      prefill_attention_kernel<T><<<dim3((tokens + PF_TILE - 1) / PF_TILE, nkv), PF_WARPS * 32, e.prefill_smem, st>>>(
          v, (const T*)e.qkvbuf, (const T*)e.kplane(l), (const T*)e.vplane(l), (T*)e.attn, nh, nkv, hd, c.block_size, scale);
    }
    if (splits > 1) attn_combine_kernel<T><<<dim3(tokens, nh), 64, 0, st>>>(v, e.part_acc, e.part_ml, (T*)e.attn, nh, hd, splits);
    e.mark(P_ATTENTION);
    if (project(e, W_O, l, L.o, e.attn, e.delta, tokens, H, nh * hd, t)) return -1;
    if (e.lora_on) lora_shrink<T>(e, l, L_O, -1, e.attn, nh * hd, tokens);
    e.mark(P_O_GEMM);
    add_rmsnorm<T>(e, tokens, -1, e.resid, e.delta, L.post_norm, e.normed, lora_expand(e, l, L_O));
    e.mark(P_NORM);
    if (project(e, W_GATE_UP, l, L.gate_up, e.normed, e.gu, tokens, 2 * I, H, t)) return -1;
    // gate and up are one GEMM here, two slots in lora.ts: one shrink for both, expanded by SiLU x mul.
    if (e.lora_on) lora_shrink<T>(e, l, L_GATE, L_UP, e.normed, H, tokens);
    e.mark(P_GATE_UP_GEMM);
    silu_mul_kernel<T><<<dim3(silu_ctas, tokens), nthr, 0, st>>>(v, (const T*)e.gu, (T*)e.act, I, lora_expand(e, l, L_GATE, L_UP, false),
                                                              lora_expand(e, l, L_UP, L_GATE, true));
    e.mark(P_SILU);
    if (project(e, W_DOWN, l, L.down, e.act, e.delta, tokens, H, I, t)) return -1;
    if (e.lora_on) lora_shrink<T>(e, l, L_DOWN, -1, e.act, I, tokens);
    e.mark(P_DOWN_GEMM);
  }
  // Only the sampled rows go through the final norm and the head.
  add_rmsnorm<T>(e, tokens, -1, e.resid, e.delta, e.final_norm, e.normed, lora_expand(e, c.num_layers - 1, L_DOWN));
  gather_last_kernel<T><<<seqs, nthr, 0, st>>>(v, (const T*)e.normed, (T*)e.last, H);
  e.mark(P_NORM);
  if (project(e, c.tie_embeddings ? W_EMBED : W_LM_HEAD, -1, e.lm_head, e.last, e.logits, seqs, c.vocab, H, CUDA_R_32F)) return -1;
  e.mark(P_HEAD_GEMM);
  penalty_kernel<<<seqs, 256, 0, st>>>(v, e.logits, c.vocab);
  sample_kernel<<<seqs, SAMPLE_THREADS, 0, st>>>(v, e.logits, c.vocab, e.d_tokens);
  e.mark(P_SAMPLE);
  CUDA_TRY(cudaGetLastError());
  return 0;
}

int run_forward(Engine& e, int tokens, int seqs, int splits) {
  return e.cfg.dtype == 1 ? forward<__nv_bfloat16>(e, tokens, seqs, splits) : forward<__half>(e, tokens, seqs, splits);
}

int attn_smem_opt_in(Engine& e) {
  const int G = e.cfg.num_heads / e.cfg.num_kv_heads, hd = e.cfg.head_dim;
  const int bytes = (int)(((size_t)G * hd + 2 * (size_t)CHUNK * (hd + 1) + (size_t)G * CHUNK) * sizeof(float));
  if (e.cfg.dtype == 1) {
    CUDA_TRY(cudaFuncSetAttribute(attention_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  } else {
    CUDA_TRY(cudaFuncSetAttribute(attention_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  }
  int optin = 0;
  CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, e.cfg.device));
  const size_t pf = prefill_smem_bytes(G, hd);
  e.prefill_smem = 0;
  if (hd % 16 == 0 && pf <= (size_t)optin) {
    if (e.cfg.dtype == 1) {
      CUDA_TRY(cudaFuncSetAttribute(prefill_attention_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf));
    } else {
      CUDA_TRY(cudaFuncSetAttribute(prefill_attention_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf));
    }
    e.prefill_smem = pf;
  }
  return 0;
}


// RAGGUARD_CUDA_WEIGHTS=fp8: `count` elements of a checkpoint tensor (whole rows of the fused weight `kind`,
// from element `dst_offset` on) read from the file through the staging buffers and quantized on the device
// into the FP8 segment rg_quant_upload registered for (kind, layer).
int load_fp8(Engine& e, int kind, int layer, int64_t dst_offset, const char* path, int64_t file_offset, int64_t count, int src_dtype) {
  const rg_config& c = e.cfg;
  int n, k;
  qmat_dims(c, kind, n, k);
  if (kind == W_LM_HEAD && c.tie_embeddings) return fail("lm_head is tied to the embeddings");
  const int l = kind == W_EMBED || kind == W_LM_HEAD ? -1 : layer;
  if (l >= c.num_layers || (l < 0 && kind != W_EMBED && kind != W_LM_HEAD)) return fail("layer out of range");
  const std::vector<Engine::QSeg>& segs = e.qmats[e.qmat_index(kind, l)];
  if (segs.size() != 1 || segs[0].type != QT_FP8 || segs[0].rows != n) return fail("no FP8 segment registered for this weight");
  if (dst_offset < 0 || dst_offset % k || count % 32 || (size_t)(dst_offset + count) > (size_t)n * k) return fail("tensor does not fit its FP8 weight in whole rows");
  const size_t src_elt = src_dtype == 0 ? 4 : 2;
  // A multiple of 32 elements of every source type; with a scale a row (fp8_lt), whole rows.
  const size_t row_bytes = (size_t)k * src_elt;
  const size_t chunk = e.fp8_lt ? std::max<size_t>(1, (64ull << 20) / row_bytes) * row_bytes : 64ull << 20;
  if (e.fp8_lt && !segs[0].rscale) return fail("an FP8 weight for cuBLASLt was registered without its row scales");
  if (e.fp8_lt && count % k) return fail("an FP8 weight for cuBLASLt loads in whole rows");
  // The staging buffers are 64 MiB whatever the chunk (a row wider than that cannot load).
  if (chunk > (64ull << 20)) return fail("an FP8 row is wider than the 64 MiB staging buffer");
  if (!e.stage_h && cudaMallocHost(&e.stage_h, 64ull << 20) != cudaSuccess) { e.stage_h = nullptr; return fail("staging allocation failed"); }
  if (!e.stage_d && cudaMalloc(&e.stage_d, 64ull << 20) != cudaSuccess) { e.stage_d = nullptr; return fail("staging allocation failed"); }
  const int fd = open(path, O_RDONLY);
  if (fd < 0) return fail(std::string("cannot open ") + path);
  const size_t bytes = (size_t)count * src_elt;
  int rc = 0;
  for (size_t done = 0; done < bytes && rc == 0;) {
    const size_t nb = bytes - done < chunk ? bytes - done : chunk;
    size_t got = 0;
    while (got < nb) {
      const ssize_t r = pread(fd, static_cast<char*>(e.stage_h) + got, nb - got, file_offset + done + got);
      if (r <= 0) { rc = fail(std::string("short read from ") + path); break; }
      got += (size_t)r;
    }
    if (rc) break;
    if (cudaMemcpy(e.stage_d, e.stage_h, nb, cudaMemcpyHostToDevice) != cudaSuccess) { rc = fail("weight upload failed"); break; }
    const size_t units = nb / src_elt / 32, u0 = ((size_t)dst_offset + done / src_elt) / 32;
    if (e.fp8_lt) {
      const size_t rows_in = nb / row_bytes, row0 = ((size_t)dst_offset + done / src_elt) / k;
      fp8_pack_rows_kernel<<<(unsigned)rows_in, 256>>>(e.stage_d, src_dtype, segs[0].p, row0, k, const_cast<float*>(segs[0].rscale));
    } else {
      fp8_pack_kernel<<<(unsigned)((units + 255) / 256), 256>>>(e.stage_d, src_dtype, segs[0].p, u0, units);
    }
    if (cudaDeviceSynchronize() != cudaSuccess) rc = fail("FP8 quantization failed");
    done += nb;
  }
  close(fd);
  return rc;
}

}  // namespace

extern "C" {

const char* rg_last_error() { return g_error.c_str(); }

int rg_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    g_error = "no CUDA device";
    return 0;
  }
  return n;
}

// Sizes, in bytes, of what rg_create allocates for a config, without allocating: the guard's figures.
// out[0] weights, [1] kv pool, [2] workspace, [3] cublas workspace, [4] pinned host, [5] LoRA slots.
int rg_plan(const rg_config* c, int64_t* out);

void* rg_create(const rg_config* cfg) {
  auto* e = new Engine();
  e->cfg = *cfg;
  const rg_config& c = e->cfg;
  auto bail = [&](const std::string& m) -> void* {
    g_error = m;
    // Frees what was made (cudaFree of null is a no-op).
    cudaFree(e->wbase); cudaFree(e->kv); cudaFree(e->ws); cudaFree(e->cublas_ws); cudaFree(e->inv_freq);
    cudaFree(e->lora);
    if (e->lora_stream) cudaStreamDestroy(e->lora_stream);
    cudaFreeHost(e->h_step);
    if (e->blas) cublasDestroy(e->blas);
    if (e->stream) cudaStreamDestroy(e->stream);
    delete e;
    return nullptr;
  };
  if (c.num_heads % c.num_kv_heads != 0) return bail("num_heads must be a multiple of num_kv_heads");
  if (c.num_heads / c.num_kv_heads > MAX_G) return bail("more than 16 query heads per kv head");
  if (c.head_dim > MAX_HD || c.head_dim % 2) return bail("head_dim must be even and at most 256");
  if (c.max_loras < 0 || (c.max_loras > 0 && (c.max_lora_rank < 1 || c.max_lora_rank > 256))) return bail("max_loras must be >= 0 and max_lora_rank 1..256");
  if (c.quantized && (c.hidden % 32 || c.intermediate % 32 || (c.num_heads * c.head_dim) % 32 || c.quant_bytes < 0 || c.quant_tile_bytes < (int64_t)64 * c.intermediate * 2))
    return bail("a GGUF decoder needs hidden, intermediate and q widths that are multiples of 32 and a dequantization tile of at least 64 rows");
  e->gemv_rows = c.quantized ? QGEMV_MAX_ROWS : GEMV_MAX_ROWS;
  if (cudaSetDevice(c.device) != cudaSuccess) return bail("cudaSetDevice failed: no CUDA device?");
  cudaDeviceGetAttribute(&e->sms, cudaDevAttrMultiProcessorCount, c.device);
  if (cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking) != cudaSuccess) return bail("stream create failed");
  if (cublasCreate(&e->blas) != CUBLAS_STATUS_SUCCESS) return bail("cublasCreate failed");
  cublasSetStream(e->blas, e->stream);
  if (cudaMalloc(&e->cublas_ws, c.cublas_workspace_bytes) != cudaSuccess) return bail("cuBLAS workspace allocation failed");
  if (cublasSetWorkspace(e->blas, e->cublas_ws, c.cublas_workspace_bytes) != CUBLAS_STATUS_SUCCESS) return bail("cublasSetWorkspace failed");
  cublasSetMathMode(e->blas, CUBLAS_DEFAULT_MATH);
  int64_t plan[6];
  rg_plan(&c, plan);
  // Weights.
  e->wbytes = (size_t)plan[0];
  if (cudaMalloc(&e->wbase, e->wbytes) != cudaSuccess) return bail("weights allocation failed (" + std::to_string(e->wbytes) + " bytes)");
  {
    char* p = e->wbase;
    auto take = [&](int kind) -> void* {
      if (c.quantized && quant_kind(kind)) return nullptr;
      void* r = p;
      p += dense_bytes(c, kind);
      return r;
    };
    e->embed = take(W_EMBED);
    e->lm_head = c.tie_embeddings ? e->embed : take(W_LM_HEAD);
    e->final_norm = take(W_FINAL_NORM);
    e->layers.resize(c.num_layers);
    for (auto& L : e->layers) {
      L.in_norm = take(W_INPUT_NORM);
      L.qkv = take(W_QKV);
      L.qkv_b = c.qkv_bias ? take(W_QKV_BIAS) : nullptr;
      L.o = take(W_O);
      L.post_norm = take(W_POST_NORM);
      L.gate_up = take(W_GATE_UP);
      L.down = take(W_DOWN);
    }
    if (c.quantized) {
      e->qarea = p;
      e->qmats.resize((size_t)(W_DOWN + 1) * (c.num_layers + 1));
    }
  }
  if (cudaMalloc(&e->inv_freq, c.head_dim / 2 * sizeof(float)) != cudaSuccess) return bail("rotary table allocation failed");
  // KV pool.
  e->kv_bytes = (size_t)plan[1];
  if (cudaMalloc(&e->kv, e->kv_bytes) != cudaSuccess) return bail("KV pool allocation failed (" + std::to_string(e->kv_bytes) + " bytes)");
  cudaMemset(e->kv, 0, e->kv_bytes);
  // Workspace, carved as rg_plan sized it.
  e->ws_bytes = (size_t)plan[2];
  if (cudaMalloc(&e->ws, e->ws_bytes) != cudaSuccess) return bail("workspace allocation failed");
  {
    const size_t Tm = c.max_batched_tokens, Sm = c.max_seqs;
    e->max_splits = 16;
    char* p = e->ws;
    auto take = [&](size_t bytes) { void* r = p; p += align256(bytes); return r; };
    e->step_cap_words = step_words((int)Tm, (int)Sm, c.max_blocks_per_seq, max_penalty_entries(c), Sm * mask_words(c.vocab));
    e->d_step = (int*)take(e->step_cap_words * 4);
    e->resid = take(Tm * c.hidden * 2);
    e->normed = take(Tm * c.hidden * 2);
    e->qkvbuf = take(Tm * e->qkv_width() * 2);
    e->attn = take(Tm * c.num_heads * c.head_dim * 2);
    e->delta = take(Tm * c.hidden * 2);
    e->gu = take(Tm * 2 * c.intermediate * 2);
    e->act = take(Tm * c.intermediate * 2);
    e->last = take(Sm * c.hidden * 2);
    e->logits = (float*)take(Sm * c.vocab * 4);
    e->part_acc = (float*)take(Sm * c.num_heads * e->max_splits * c.head_dim * 4);
    e->part_ml = (float*)take(Sm * c.num_heads * e->max_splits * 2 * 4);
    e->d_tokens = (int*)take(Sm * 4);
    e->d_pairs = (int*)take(2 * (size_t)c.num_blocks * 4);
    if (c.max_loras > 0) e->lora_t = (float*)take(Tm * 3 * c.max_lora_rank * 4);
    if (c.quantized) e->qtile = take((size_t)c.quant_tile_bytes);
  }
  // LoRA slots, zeroed: entry 0 stays zeros (the base model's rows), the others until an adapter loads.
  e->lora_bytes = (size_t)plan[5];
  if (e->lora_bytes > 0) {
    if (cudaMalloc(&e->lora, e->lora_bytes) != cudaSuccess) return bail("LoRA slots allocation failed (" + std::to_string(e->lora_bytes) + " bytes)");
    if (cudaMemset(e->lora, 0, e->lora_bytes) != cudaSuccess) return bail("LoRA slots could not be zeroed");
    if (cudaStreamCreateWithFlags(&e->lora_stream, cudaStreamNonBlocking) != cudaSuccess) return bail("LoRA stream create failed");
    const size_t entries = (size_t)c.max_loras + 1;
    char* p = e->lora;
    for (int l = 0; l < c.num_layers; ++l) {
      for (int q = 0; q < L_COUNT; ++q) {
        Engine::LoraSlot s{};
        lora_dims(c, q, s.in, s.cap, s.out);
        s.a = p;
        p += align256(entries * s.in * s.cap * 2);
        s.b = p;
        p += align256(entries * s.cap * s.out * 2);
        e->lora_slots.push_back(s);
      }
    }
  }
  e->pinned_bytes = (size_t)plan[4];
  if (cudaMallocHost(&e->h_step, e->pinned_bytes) != cudaSuccess) return bail("pinned staging allocation failed");
  e->h_tokens = e->h_step + e->step_cap_words;
  if (attn_smem_opt_in(*e)) return bail(g_error);
  return e;
}

int rg_plan(const rg_config* cp, int64_t* out) {
  const rg_config& c = *cp;
  size_t w = 0;
  w += dense_bytes(c, W_EMBED);
  if (!c.tie_embeddings) w += dense_bytes(c, W_LM_HEAD);
  w += dense_bytes(c, W_FINAL_NORM);
  size_t per = dense_bytes(c, W_INPUT_NORM) + dense_bytes(c, W_QKV) + (c.qkv_bias ? dense_bytes(c, W_QKV_BIAS) : 0) +
               dense_bytes(c, W_O) + dense_bytes(c, W_POST_NORM) + dense_bytes(c, W_GATE_UP) + dense_bytes(c, W_DOWN);
  w += per * c.num_layers;
  if (c.quantized) w += align256((size_t)c.quant_bytes);
  const size_t kv = (size_t)c.num_layers * 2 * c.num_blocks * c.num_kv_heads * c.block_size * c.head_dim * 2;
  const size_t Tm = c.max_batched_tokens, Sm = c.max_seqs;
  const size_t qw = (size_t)(c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const int splits = 16;
  const int P = max_penalty_entries(c);
  // The step's staging holds every row's token mask too (constrained decoding).
  const size_t step_cap = step_words((int)Tm, (int)Sm, c.max_blocks_per_seq, P, Sm * mask_words(c.vocab));
  size_t ws = align256(step_cap * 4) + align256(Tm * c.hidden * 2) * 3 +
              align256(Tm * qw * 2) + align256(Tm * c.num_heads * c.head_dim * 2) + align256(Tm * 2 * c.intermediate * 2) +
              align256(Tm * c.intermediate * 2) + align256(Sm * c.hidden * 2) + align256(Sm * c.vocab * 4) +
              align256(Sm * c.num_heads * splits * c.head_dim * 4) + align256(Sm * c.num_heads * splits * 2 * 4) +
              align256(Sm * 4) + align256(2 * (size_t)c.num_blocks * 4) +
              (c.max_loras > 0 ? align256(Tm * 3 * (size_t)c.max_lora_rank * 4) : 0) +
              (c.quantized ? align256((size_t)c.quant_tile_bytes) : 0);
  out[0] = (int64_t)w;
  out[1] = (int64_t)kv;
  out[2] = (int64_t)ws;
  out[3] = c.cublas_workspace_bytes;
  out[4] = (int64_t)((step_cap + Sm) * 4);
  out[5] = (int64_t)lora_slot_bytes(c);
  return 0;
}

void rg_destroy(void* h) {
  auto* e = static_cast<Engine*>(h);
  if (!e) return;
  cudaStreamSynchronize(e->stream);
  for (auto& g : e->graphs) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
    if (g.lora_exec) cudaGraphExecDestroy(g.lora_exec);
  }
  cudaFree(e->lora);
  if (e->lora_stream) cudaStreamDestroy(e->lora_stream);
  cudaFree(e->wbase); cudaFree(e->kv); cudaFree(e->ws); cudaFree(e->cublas_ws); cudaFree(e->inv_freq);
  cudaFreeHost(e->h_step);
  cudaFreeHost(e->stage_h);
  cudaFree(e->stage_d);
  for (auto& kv : e->lt_plans) kv.second.release();
  if (e->lt) cublasLtDestroy(e->lt);
  cublasDestroy(e->blas);
  cudaStreamDestroy(e->stream);
  delete e;
}

// The rotary inverse frequencies (head_dim / 2 floats), computed by the host from the config's
// rope_theta and rope scaling.
int rg_set_rope(void* h, const float* inv_freq) {
  auto* e = static_cast<Engine*>(h);
  CUDA_TRY(cudaMemcpy(e->inv_freq, inv_freq, e->cfg.head_dim / 2 * sizeof(float), cudaMemcpyHostToDevice));
  return 0;
}

// Loads `count` elements of one tensor from a file (bytes at `file_offset`, of src_dtype 0 f32, 1 f16,
// 2 bf16) into weight `kind` of `layer` at element offset `dst_offset`, converting to the model's dtype.
int rg_load_tensor(void* h, int kind, int layer, int64_t dst_offset, const char* path, int64_t file_offset,
                   int64_t count, int src_dtype) {
  auto* e = static_cast<Engine*>(h);
  const rg_config& c = e->cfg;
  void* base = nullptr;
  switch (kind) {
    case W_EMBED: base = e->embed; break;
    case W_LM_HEAD: base = e->lm_head; break;
    case W_FINAL_NORM: base = e->final_norm; break;
    default: {
      if (layer < 0 || layer >= c.num_layers) return fail("layer out of range");
      const Engine::Layer& L = e->layers[layer];
      void* ptrs[] = {nullptr, nullptr, nullptr, L.in_norm, L.qkv, L.qkv_b, L.o, L.post_norm, L.gate_up, L.down};
      if (kind < 0 || kind > W_DOWN) return fail("unknown weight kind");
      base = ptrs[kind];
    }
  }
  if (c.quantized == 2 && quant_kind(kind)) return load_fp8(*e, kind, layer, dst_offset, path, file_offset, count, src_dtype);
  if (!base) return fail("this model has no such weight (kind " + std::to_string(kind) + ")");
  if (kind == W_LM_HEAD && c.tie_embeddings) return fail("lm_head is tied to the embeddings");
  if (dst_offset < 0 || (size_t)(dst_offset + count) > weight_elems(c, kind)) return fail("tensor does not fit its weight");
  const size_t src_elt = src_dtype == 0 ? 4 : 2;
  const size_t bytes = (size_t)count * src_elt;
  // Staged through a bounded pinned buffer and a device scratch (kept across tensors until
  // rg_load_done), so a 7B shard does not need its size twice.
  const size_t chunk = 64ull << 20;
  if (!e->stage_h && cudaMallocHost(&e->stage_h, chunk) != cudaSuccess) { e->stage_h = nullptr; return fail("staging allocation failed"); }
  if (!e->stage_d && cudaMalloc(&e->stage_d, chunk) != cudaSuccess) { e->stage_d = nullptr; return fail("staging allocation failed"); }
  void* hbuf = e->stage_h;
  void* dbuf = e->stage_d;
  const int fd = open(path, O_RDONLY);
  if (fd < 0) return fail(std::string("cannot open ") + path);
  int rc = 0;
  const bool same = (src_dtype == 1 && c.dtype == 0) || (src_dtype == 2 && c.dtype == 1);
  char* dst = static_cast<char*>(base) + dst_offset * 2;
  for (size_t done = 0; done < bytes && rc == 0;) {
    const size_t n = bytes - done < chunk ? bytes - done : chunk;
    size_t got = 0;
    while (got < n) {
      const ssize_t r = pread(fd, static_cast<char*>(hbuf) + got, n - got, file_offset + done + got);
      if (r <= 0) { rc = fail(std::string("short read from ") + path); break; }
      got += (size_t)r;
    }
    if (rc) break;
    const size_t elems = n / src_elt;
    if (same) {
      if (cudaMemcpy(dst + done, hbuf, n, cudaMemcpyHostToDevice) != cudaSuccess) rc = fail("weight upload failed");
    } else {
      if (cudaMemcpy(dbuf, hbuf, n, cudaMemcpyHostToDevice) != cudaSuccess) { rc = fail("weight upload failed"); break; }
      void* out = dst + (done / src_elt) * 2;
      if (c.dtype == 1) convert_kernel<__nv_bfloat16><<<1024, 256>>>(dbuf, src_dtype, (__nv_bfloat16*)out, elems);
      else convert_kernel<__half><<<1024, 256>>>(dbuf, src_dtype, (__half*)out, elems);
      if (cudaDeviceSynchronize() != cudaSuccess) rc = fail("weight conversion failed");
    }
    done += n;
  }
  close(fd);
  return rc;
}

// Weights are in: the loading's staging buffers go back.
int rg_load_done(void* h) {
  auto* e = static_cast<Engine*>(h);
  CUDA_TRY(cudaDeviceSynchronize());
  if (e->quantized()) {
    const rg_config& c = e->cfg;
    // Every quantized matrix whole (its segments' rows add up; they cannot overlap: rg_quant_upload),
    // the embedding in one segment (the gather indexes its rows directly).
    for (int kind : {W_EMBED, W_LM_HEAD, W_QKV, W_O, W_GATE_UP, W_DOWN}) {
      if (kind == W_LM_HEAD && c.tie_embeddings) continue;
      const bool wide = kind == W_EMBED || kind == W_LM_HEAD;
      for (int l = wide ? -1 : 0; l < (wide ? 0 : c.num_layers); ++l) {
        int n, k;
        qmat_dims(c, kind, n, k);
        int got = 0;
        for (const auto& sg : e->qmats[e->qmat_index(kind, l)]) got += sg.rows;
        if (got != n) return fail("quantized weight kind " + std::to_string(kind) + " of layer " + std::to_string(l) + ": " + std::to_string(got) + " of " + std::to_string(n) + " rows uploaded");
      }
    }
    if (e->qmats[e->qmat_index(W_EMBED, -1)].size() != 1) return fail("the quantized embedding must be one segment");
    e->qready = true;
  }
  cudaFreeHost(e->stage_h);
  cudaFree(e->stage_d);
  e->stage_h = nullptr;
  e->stage_d = nullptr;
  return 0;
}

// Builds the CUDA graphs of decode steps for batch buckets (ascending, each at most max_seqs and
// graph_max_batch). The inputs they read live at fixed device addresses; a capture runs the step with
// `bucket` padding rows (no cache writes). Returns the graphs' device bytes (cudaMemGetInfo delta).
int rg_capture_graphs(void* h, const int32_t* buckets, int n) {
  auto* e = static_cast<Engine*>(h);
  if (e->quantized() && !e->qready) return fail("the quantized weights are not all uploaded (rg_load_done)");
  size_t free0 = 0, total = 0;
  CUDA_TRY(cudaStreamSynchronize(e->stream));
  CUDA_TRY(cudaMemGetInfo(&free0, &total));
  for (int i = 0; i < n; ++i) {
    const int b = buckets[i];
    if (b <= 0 || b > e->cfg.max_seqs || b > e->cfg.max_batched_tokens) return fail("graph bucket out of range");
    // A padding step: b tokens, b sequences, every slot -1 (nothing written), seq_len 0.
    int* w = e->h_step;
    const int W = 1;
    std::memset(w, 0, step_words(b, b, W, 0) * 4);
    w[0] = b; w[1] = b; w[2] = W;
    int* slots = w + 4 + 2 * b;
    int* tseq = w + 4 + 3 * b;
    int* last = w + 4 + 4 * b + b;
    for (int r = 0; r < b; ++r) { slots[r] = -1; tseq[r] = r; last[r] = r; }
    CUDA_TRY(cudaMemcpyAsync(e->d_step, w, step_words(b, b, W, 0) * 4, cudaMemcpyHostToDevice, e->stream));
    Graph g;
    g.batch = b;
    g.splits = decode_splits(*e, b);
    // The base step, then (with LoRA slots) the same with the LoRA kernels: two graphs per bucket.
    for (int variant = 0; variant < (e->cfg.max_loras > 0 ? 2 : 1); ++variant) {
      e->lora_on = variant == 1;
      // Warm run outside capture (cuBLAS picks and caches its kernels), then capture.
      const int warm = run_forward(*e, b, b, g.splits);
      if (warm || cudaStreamSynchronize(e->stream) != cudaSuccess) {
        e->lora_on = false;
        return warm ? -1 : fail("warm-up before graph capture failed");
      }
      cudaGraph_t graph;
      CUDA_TRY(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
      const int rc = run_forward(*e, b, b, g.splits);
      const cudaError_t end = cudaStreamEndCapture(e->stream, &graph);
      e->lora_on = false;
      if (rc) return -1;
      if (end != cudaSuccess) return fail(std::string("graph capture failed: ") + cudaGetErrorString(end));
      cudaGraphExec_t& exec = variant == 1 ? g.lora_exec : g.exec;
      CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
      CUDA_TRY(cudaGraphUpload(exec, e->stream));
    }
    e->graphs.push_back(g);
  }
  CUDA_TRY(cudaStreamSynchronize(e->stream));
  size_t free1 = 0;
  CUDA_TRY(cudaMemGetInfo(&free1, &total));
  e->graph_bytes += free0 > free1 ? free0 - free1 : 0;
  return (int)(e->graph_bytes >> 20);
}

// One step. `words` is the packed input (StepView's layout) of T tokens and S sequences. When every
// sequence feeds one token and a graph's bucket holds S, the step is padded to the bucket and the graph
// replays; otherwise the kernels are launched directly. Writes S token ids; logits [S, vocab] too when
// `logits_out` is not null. Synchronous: returns once the ids are on the host.
int rg_step(void* h, const int32_t* words, int32_t nwords, int32_t* tokens_out, float* logits_out) {
  auto* e = static_cast<Engine*>(h);
  if (e->quantized() && !e->qready) return fail("the quantized weights are not all uploaded (rg_load_done)");
  const int T = words[0], S = words[1], W = words[2], P = words[3];
  if (P < 0 || P > max_penalty_entries(e->cfg)) return fail("more penalty entries than the step's staging holds");
  if (T <= 0 || T > e->cfg.max_batched_tokens || S <= 0 || S > e->cfg.max_seqs || S > T) return fail("step exceeds the configured limits");
  // Rows with a token mask (constrained decoding): their masks follow the penalty entries, one each.
  const int32_t* mask_at = words + 4 + 4 * (size_t)T + (size_t)kMaskSeqArray * S;
  int R = 0;
  for (int s = 0; s < S; ++s) {
    if (mask_at[s] < 0 || mask_at[s] > S) return fail("mask reference out of range");
    R += mask_at[s] > 0;
  }
  const size_t M = (size_t)R * mask_words(e->cfg.vocab);
  if ((size_t)nwords != step_words(T, S, W, P, M)) return fail("packed step has the wrong size");
  if (W > e->cfg.max_blocks_per_seq) return fail("block table wider than max_blocks_per_seq");
  // A token id outside the vocabulary would make the embedding read past its table (an illegal address
  // poisons the whole CUDA context, every later request included): refused here, as cheap as a scan of T ints.
  for (int t = 0; t < T; ++t) {
    if (words[4 + t] < 0 || words[4 + t] >= e->cfg.vocab) return fail("token id " + std::to_string(words[4 + t]) + " is outside the vocabulary (" + std::to_string(e->cfg.vocab) + ")");
  }
  // Rows with an adapter: the step runs the LoRA kernels (its graph's LoRA variant); none: the base step.
  const int32_t* lora = words + 4 + 4 * (size_t)T + (size_t)kLoraSeqArray * S;
  bool any_lora = false;
  for (int s = 0; s < S; ++s) {
    if (lora[s] < 0 || lora[s] > e->cfg.max_loras) return fail("LoRA entry " + std::to_string(lora[s]) + " out of range (max_loras " + std::to_string(e->cfg.max_loras) + ")");
    any_lora |= lora[s] > 0;
  }
  e->lora_on = any_lora;
  const Graph* g = nullptr;
  if (T == S && !e->profiling) for (const auto& c : e->graphs) if (c.batch >= S && (!any_lora || c.lora_exec)) { g = &c; break; }
  if (g && g->batch != S) {
    // Pad to the bucket: rows S..b-1 write nothing and attend to nothing.
    const int b = g->batch;
    int* w = e->h_step;
    w[0] = b; w[1] = b; w[2] = W; w[3] = P;
    const int* src = words + 4;
    int* dst = w + 4;
    for (int a = 0; a < 4; ++a) {  // token arrays
      std::memcpy(dst, src, T * 4);
      for (int r = T; r < b; ++r) dst[r] = a == 2 ? -1 : (a == 3 ? r : 0);
      src += T; dst += b;
    }
    for (int a = 0; a < kSeqArrays; ++a) {
      std::memcpy(dst, src, S * 4);
      for (int r = S; r < b; ++r) dst[r] = a == 1 ? r : 0;
      src += S; dst += b;
    }
    std::memcpy(dst, src, (size_t)S * W * 4);
    std::memset(dst + (size_t)S * W, 0, (size_t)(b - S) * W * 4);
    // The penalty entries and the masks as they were (rows point into them by index; padding rows have none).
    std::memcpy(dst + (size_t)b * W, src + (size_t)S * W, (2 * (size_t)P + M) * 4);
    CUDA_TRY(cudaMemcpyAsync(e->d_step, w, step_words(b, b, W, P, M) * 4, cudaMemcpyHostToDevice, e->stream));
  } else {
    std::memcpy(e->h_step, words, (size_t)nwords * 4);
    CUDA_TRY(cudaMemcpyAsync(e->d_step, e->h_step, (size_t)nwords * 4, cudaMemcpyHostToDevice, e->stream));
  }
  if (g) {
    CUDA_TRY(cudaGraphLaunch(any_lora ? g->lora_exec : g->exec, e->stream));
  } else {
    const int splits = T == S ? decode_splits(*e, S) : 1;
    if (run_forward(*e, T, S, splits)) return -1;
  }
  CUDA_TRY(cudaMemcpyAsync(e->h_tokens, e->d_tokens, S * 4, cudaMemcpyDeviceToHost, e->stream));
  if (logits_out) CUDA_TRY(cudaMemcpyAsync(logits_out, e->logits, (size_t)S * e->cfg.vocab * 4, cudaMemcpyDeviceToHost, e->stream));
  CUDA_TRY(cudaStreamSynchronize(e->stream));
  std::memcpy(tokens_out, e->h_tokens, S * 4);
  // The sampler finds no token when no logit is a number above -inf (NaN weights or activations, or a mask
  // that allows nothing): an error, never an id past the vocabulary fed to the next step.
  for (int s = 0; s < S; ++s) {
    if (tokens_out[s] < 0 || tokens_out[s] >= e->cfg.vocab) { e->prof_n = 0; return fail("row " + std::to_string(s) + " has no finite logit to sample from (NaN, or -inf everywhere)"); }
  }
  if (e->profiling && e->prof_n > 1) {
    for (size_t i = 1; i < e->prof_n; ++i) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, e->prof_events[i - 1], e->prof_events[i]) == cudaSuccess && e->prof_phase[i] >= 0)
        e->prof_ms[e->prof_phase[i]] += ms;
    }
    e->prof_steps++;
  }
  e->prof_n = 0;
  return 0;
}

// Steps of at most `rows` rows (0..4; a GGUF decoder's quantized products 0..8) multiply through the GEMV kernel instead of cuBLAS; 0: cuBLAS
// always. Applies to steps launched directly and to graphs captured afterwards (bench:gpu compares the two).
int rg_set_gemv_rows(void* h, int32_t rows) {
  auto* e = static_cast<Engine*>(h);
  const int most = e->quantized() ? QGEMV_MAX_ROWS : GEMV_MAX_ROWS;
  if (rows < 0 || rows > most) return fail("gemv rows must be 0.." + std::to_string(most));
  e->gemv_rows = rows;
  return 0;
}

// FP8 products of more rows than the GEMV takes: 0 qmma_kernel (the default), 1 cuBLASLt's FP8 GEMM with a
// scale a weight row and a scale a token (Engine::fp8_lt). Before the weights are registered and loaded: it
// changes how they are packed (a scale a row, kept as float after the planes: rg_quant_upload's nbytes).
int rg_set_fp8_gemm(void* h, int32_t mode) {
  auto* e = static_cast<Engine*>(h);
  if (e->cfg.quantized != 2) return fail("cuBLASLt's FP8 products are for FP8 weights (rg_config.quantized 2)");
  if (mode != 0 && mode != 1) return fail("fp8 gemm must be 0 (qmma) or 1 (cuBLASLt)");
  for (const auto& segs : e->qmats)
    if (!segs.empty()) return fail("rg_set_fp8_gemm: the FP8 weights are registered already");
  if (mode == 1 && !e->lt) {
    if (cublasLtCreate(&e->lt) != CUBLAS_STATUS_SUCCESS) return fail("cublasLtCreate failed");
  }
  e->fp8_lt = mode == 1;
  return 0;
}

// What cuBLASLt's FP8 path could not do (a shape it has no algorithm for: those products ran qmma_kernel), or "".
const char* rg_fp8_gemm_note(void* h) { return static_cast<Engine*>(h)->fp8_lt_note.c_str(); }

// The quantized GEMV's products: 0 in float (the default), 1 in paired half arithmetic where activations are
// float16 (16-element partials added in float), 2 with the activations quantized to int8 a block of 32 and
// dp4a (quant_gemv_i8.cuh; the integer types, others stay in float). A GGUF decoder only; graphs captured
// afterwards keep it.
int rg_set_qgemv_math(void* h, int32_t mode) {
  auto* e = static_cast<Engine*>(h);
  if (!e->quantized()) return fail("the GEMV's products are set for a quantized decoder only");
  if (mode < 0 || mode > 2) return fail("qgemv math must be 0 (float), 1 (half pairs) or 2 (int8)");
  e->qgemv_math = mode;
  return 0;
}

// Profiling: on (1) or off (0); turning it on clears the sums. While on, every step launches its kernels
// directly and the time between phases is summed by phase.
int rg_profile(void* h, int32_t on) {
  auto* e = static_cast<Engine*>(h);
  e->profiling = on != 0;
  e->prof_n = 0;
  if (e->profiling) {
    for (double& m : e->prof_ms) m = 0;
    e->prof_steps = 0;
  }
  return 0;
}

// out[0] = steps profiled, out[1..P_COUNT] = milliseconds by phase (embed, norm, qkv gemm, rope+cache,
// attention, o gemm, gate/up gemm, silu, down gemm, head gemm, sample). Returns P_COUNT.
int rg_profile_read(void* h, double* out, int32_t n) {
  auto* e = static_cast<Engine*>(h);
  if (n < P_COUNT + 1) return fail("rg_profile_read: buffer too small");
  out[0] = (double)e->prof_steps;
  for (int i = 0; i < P_COUNT; ++i) out[1 + i] = e->prof_ms[i];
  return P_COUNT;
}

// Device time of the decode graph of bucket `batch` replayed `reps` times back to back on the last step's
// inputs (its cache writes land where that step's did): the step's cost without the host. Returns 0 and the
// mean milliseconds in *ms, or -1 where no graph holds `batch`.
int rg_graph_time(void* h, int32_t batch, int32_t reps, float* ms) {
  auto* e = static_cast<Engine*>(h);
  const Graph* g = nullptr;
  for (const auto& c : e->graphs) if (c.batch == batch) { g = &c; break; }
  if (!g) return fail("no graph of that batch size");
  cudaEvent_t a, b;
  CUDA_TRY(cudaEventCreate(&a));
  CUDA_TRY(cudaEventCreate(&b));
  CUDA_TRY(cudaEventRecord(a, e->stream));
  for (int i = 0; i < reps; ++i) CUDA_TRY(cudaGraphLaunch(g->exec, e->stream));
  CUDA_TRY(cudaEventRecord(b, e->stream));
  CUDA_TRY(cudaEventSynchronize(b));
  float total = 0;
  CUDA_TRY(cudaEventElapsedTime(&total, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  *ms = total / (reps > 0 ? reps : 1);
  return 0;
}

// Copy-on-write: blocks src[i] -> dst[i] (pairs flattened), every layer's k and v.
int rg_copy_blocks(void* h, const int32_t* pairs, int n) {
  auto* e = static_cast<Engine*>(h);
  if (n <= 0) return 0;
  if (n > e->cfg.num_blocks) return fail("too many block copies");
  CUDA_TRY(cudaMemcpyAsync(e->d_pairs, pairs, (size_t)n * 2 * 4, cudaMemcpyHostToDevice, e->stream));
  const size_t block_elems = (size_t)e->cfg.num_kv_heads * e->cfg.block_size * e->cfg.head_dim;
  copy_blocks_kernel<<<dim3(n, 2 * e->cfg.num_layers), 256, 0, e->stream>>>((uint16_t*)e->kv, e->d_pairs, n, block_elems,
                                                                          e->kv_plane_elems(), 2 * e->cfg.num_layers);
  CUDA_TRY(cudaGetLastError());
  CUDA_TRY(cudaStreamSynchronize(e->stream));
  return 0;
}

// Writes an adapter's weights for one slot into `entry` (1..max_loras) of layer `layer`, projection
// `projection` (L_QKV..L_DOWN): A [in, cap] and B [cap, out] as float32, rank already zero-padded to the
// slot's capacity and the scale folded into B (lora.ts), converted here to the model's dtype and copied
// in one transfer each. A null pair zeroes the entry's slot (a slot the adapter leaves alone: the entry
// may hold an earlier adapter's weights). Called while steps may run: the entry is free, so no step in
// flight reads it; the copies go on their own stream and are complete on return (a pageable copy may
// otherwise still be in DMA when the next step, on a stream that does not wait for it, reads the entry).
int rg_lora_write(void* h, int layer, int projection, int entry, const float* a, const float* b) {
  auto* e = static_cast<Engine*>(h);
  const rg_config& c = e->cfg;
  if (c.max_loras <= 0) return fail("this engine has no LoRA slots (max_loras 0)");
  if (layer < 0 || layer >= c.num_layers || projection < 0 || projection >= L_COUNT) return fail("LoRA slot out of range");
  if (entry < 1 || entry > c.max_loras) return fail("LoRA entry " + std::to_string(entry) + " out of range 1.." + std::to_string(c.max_loras));
  if ((a == nullptr) != (b == nullptr)) return fail("LoRA A and B come in pairs");
  const Engine::LoraSlot& s = e->lora_slots[(size_t)layer * L_COUNT + projection];
  const size_t na = (size_t)s.in * s.cap, nb = (size_t)s.cap * s.out;
  char* da = static_cast<char*>(s.a) + (size_t)entry * na * 2;
  char* db = static_cast<char*>(s.b) + (size_t)entry * nb * 2;
  if (!a) {
    CUDA_TRY(cudaMemsetAsync(da, 0, na * 2, e->lora_stream));
    CUDA_TRY(cudaMemsetAsync(db, 0, nb * 2, e->lora_stream));
    CUDA_TRY(cudaStreamSynchronize(e->lora_stream));
    return 0;
  }
  // A and B go in transposed (A [cap, in]: a rank column is one contiguous row for the shrink; B [out,
  // cap]: an output column's rank values are contiguous for the expand).
  std::vector<uint16_t> host(na + nb);
  for (size_t i = 0; i < na + nb; ++i) {
    const size_t j = i - na;
    const float x = i < na ? a[(i % s.in) * s.cap + i / s.in] : b[(j % s.cap) * s.out + j / s.cap];
    if (c.dtype == 1) {
      const __nv_bfloat16 y = __float2bfloat16_rn(x);
      std::memcpy(&host[i], &y, 2);
    } else {
      const __half y = __float2half_rn(x);
      std::memcpy(&host[i], &y, 2);
    }
  }
  CUDA_TRY(cudaMemcpyAsync(da, host.data(), na * 2, cudaMemcpyHostToDevice, e->lora_stream));
  CUDA_TRY(cudaMemcpyAsync(db, host.data() + na, nb * 2, cudaMemcpyHostToDevice, e->lora_stream));
  CUDA_TRY(cudaStreamSynchronize(e->lora_stream));  // `host` is freed on return
  return 0;
}

// Uploads one segment of a GGUF decoder's quantized matrix: output rows [row0, row0 + rows) of weight
// `kind` (W_EMBED, W_LM_HEAD, W_QKV, W_O, W_GATE_UP, W_DOWN; layer -1 for the first two), `cols` wide, of
// unit type `type` (a ggml type id), packed as gguf-blocks.ts packMatrix lays it out (`nbytes` must be the
// layout's size), at byte `offset` (256-aligned) of the quantized area that rg_config.quant_bytes sized.
int rg_quant_upload(void* h, int kind, int layer, int row0, int type, int rows, int cols, int64_t offset,
                    const uint8_t* data, int64_t nbytes) {
  auto* e = static_cast<Engine*>(h);
  const rg_config& c = e->cfg;
  if (!e->quantized()) return fail("rg_quant_upload: this engine holds dense weights (rg_config.quantized 0)");
  if (!quant_kind(kind)) return fail("weight kind " + std::to_string(kind) + " is not a quantized matrix");
  const bool wide = kind == W_EMBED || kind == W_LM_HEAD;
  if (wide ? layer != -1 : (layer < 0 || layer >= c.num_layers)) return fail("layer out of range for weight kind " + std::to_string(kind));
  if (kind == W_LM_HEAD && c.tie_embeddings) return fail("lm_head is tied to the embeddings");
  if (qlayout(type).q == 0) return fail("unknown quantized type " + std::to_string(type));
  int n, k;
  qmat_dims(c, kind, n, k);
  if (cols != k || row0 < 0 || rows <= 0 || row0 + rows > n) return fail("quantized segment does not fit its weight");
  if (cols % ((type == QT_Q4_K || type == QT_Q6_K) ? 256 : 32)) return fail("quantized rows are not whole blocks");
  if (offset < 0 || offset % 256) return fail("quantized segment offset must be 256-aligned");
  QPlanes p;
  const size_t bytes = qplanes(type, rows, cols, reinterpret_cast<const uint8_t*>(e->qarea) + offset, &p);
  // FP8 weights for cuBLASLt (rg_set_fp8_gemm) keep a float scale a row after the planes.
  const size_t rscale_bytes = type == QT_FP8 && e->fp8_lt ? qalign256((size_t)rows * 4) : 0;
  if ((int64_t)(bytes + rscale_bytes) != nbytes)
    return fail("packed segment is " + std::to_string(nbytes) + " bytes, its layout " + std::to_string(bytes + rscale_bytes));
  if ((size_t)offset + bytes + rscale_bytes > (size_t)c.quant_bytes) return fail("quantized segment runs past quant_bytes");
  std::vector<Engine::QSeg>& segs = e->qmats[e->qmat_index(kind, layer)];
  for (const auto& sg : segs) {
    if (row0 < sg.row0 + sg.rows && sg.row0 < row0 + rows) return fail("quantized segment overlaps one uploaded before");
  }
  if (data) {
    CUDA_TRY(cudaMemcpy(e->qarea + offset, data, bytes, cudaMemcpyHostToDevice));
  } else {
    // An FP8 matrix's place, filled by rg_load_tensor as the checkpoint's tensors arrive.
    if (type != QT_FP8) return fail("only an FP8 segment is registered without data");
    CUDA_TRY(cudaMemset(e->qarea + offset, 0, bytes + rscale_bytes));
  }
  const float* rscale = rscale_bytes ? reinterpret_cast<const float*>(e->qarea + offset + bytes) : nullptr;
  segs.push_back(Engine::QSeg{type, row0, rows, cols, p, rscale});
  e->qused += bytes + rscale_bytes;
  e->qready = false;
  return 0;
}

int rg_memory_info(void* h, rg_memory* m) {
  auto* e = static_cast<Engine*>(h);
  m->weights = (int64_t)e->wbytes;
  m->kv_pool = (int64_t)e->kv_bytes;
  m->workspace = (int64_t)e->ws_bytes;
  m->cublas_workspace = e->cfg.cublas_workspace_bytes;
  m->graphs = (int64_t)e->graph_bytes;
  m->host_pinned = (int64_t)e->pinned_bytes;
  m->lora = (int64_t)e->lora_bytes;
  m->total = m->weights + m->kv_pool + m->workspace + m->cublas_workspace + m->graphs + (int64_t)(e->cfg.head_dim / 2 * 4) + m->lora;
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  m->device_free = (int64_t)f;
  m->device_total = (int64_t)t;
  return 0;
}

}  // extern "C"
