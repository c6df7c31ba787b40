// The CUDA encoder: a BERT-family model (the embedder, the cross-encoder reranker) forward in float16
// with float32 accumulation, over padded batches. Loaded through koffi by encoder-binding.ts; its own
// library (build/native/libragguard_encoder.so), apart from the decoder's.
//
// Per run of R sequences padded to width S (T = R x S rows, each sequence's tokens first, then padding):
//   x = LayerNorm(word[id] + position[t] + token_type[type])
//   per layer: qkv = x Wqkv^T (cuBLAS); ctx = attention(qkv + bqkv) over each sequence's own tokens
//              (bidirectional, keys past its length masked); x = LN(ctx Wo^T + bo + x);
//              f = GELU(x Wi^T + bi); x = LN(f Wout^T + bout + x)
//   head: embedding   pooled over the sequence's tokens (mean, cls, max, mean_sqrt_len, lasttoken),
//                     L2-normalized where asked: [R, hidden]
//         classifier  logits = Wc tanh(Wp x[cls] + bp) + bc (BertForSequenceClassification): [R, labels]
//         pair        the same plus scale x cos(mean of segment A, mean of segment B) (the test reranker)
// Every buffer is allocated at creation from the limits (rows, tokens): a run allocates nothing, so the
// accountant's figures (rg_enc_plan, encoder-plan.ts) are all there is.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

using namespace nvcuda;

extern "C" {
typedef struct {
  int32_t num_layers, hidden, num_heads, intermediate, vocab, max_positions, type_vocab, num_labels;
  int32_t head;       // 0 embedding, 1 classifier, 2 pair
  int32_t pooling;    // 0 mean, 1 cls, 2 max, 3 mean_sqrt_len, 4 lasttoken
  int32_t normalize;  // embedding head: L2-normalize
  int32_t act;        // 0 GELU (erf), 1 GELU (tanh approximation)
  float ln_eps;
  int32_t max_rows, max_tokens;
  int64_t cublas_workspace_bytes;
  int32_t device;
  int32_t attention;  // 0 the tensor-core kernel; 1 the plain reference kernel (checks compare the two)
} rg_enc_config;

typedef struct {
  int64_t weights, activations, cublas_workspace, host_pinned, total, device_free, device_total;
} rg_enc_memory;
}

namespace {

enum Kind {
  K_WORD, K_POS, K_TYPE, K_EMB_LN_W, K_EMB_LN_B,
  K_Q_W, K_K_W, K_V_W, K_Q_B, K_K_B, K_V_B,
  K_O_W, K_O_B, K_LN1_W, K_LN1_B,
  K_I_W, K_I_B, K_OUT_W, K_OUT_B, K_LN2_W, K_LN2_B,
  K_POOL_W, K_POOL_B, K_CLS_W, K_CLS_B, K_SCALE,
  K_COUNT
};
constexpr int FIRST_LAYER_KIND = K_Q_W, LAST_LAYER_KIND = K_LN2_B;

std::mutex g_err_mu;
std::string g_err;
void set_err(const std::string& s) {
  std::lock_guard<std::mutex> g(g_err_mu);
  g_err = s;
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      set_err(std::string(#x) + ": " + cudaGetErrorString(e_));                \
      return -1;                                                               \
    }                                                                          \
  } while (0)
#define CB(x)                                                                  \
  do {                                                                         \
    cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      set_err(std::string(#x) + ": cuBLAS status " + std::to_string((int)s_)); \
      return -1;                                                               \
    }                                                                          \
  } while (0)

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

struct Region {
  int64_t off = 0;    // bytes into the weights
  int64_t count = 0;  // elements
  bool f16 = false;
};

struct LayerRegions {
  Region qkv_w, qkv_b, o_w, o_b, ln1_w, ln1_b, i_w, i_b, out_w, out_b, ln2_w, ln2_b;
};

struct Layout {
  Region word, pos, type, eln_w, eln_b, pool_w, pool_b, cls_w, cls_b, scale;
  std::vector<LayerRegions> layers;
  int64_t weights = 0;
  // activations (byte offsets)
  int64_t a_ids = 0, a_types = 0, a_lens = 0, a_x = 0, a_qkv = 0, a_ctx = 0, a_tmp = 0, a_ffn = 0, a_out = 0, activations = 0;
  // pinned host: inputs as on the device, then the output
  int64_t h_out = 0, host_pinned = 0;
  int out_width = 0;
};

// Same checks and words as encoder-plan.ts encoderShapeProblem.
std::string shape_problem(const rg_enc_config& c) {
  if (c.num_layers < 1 || c.hidden < 1 || c.num_heads < 1 || c.intermediate < 1 || c.vocab < 1 || c.max_positions < 1 || c.type_vocab < 1)
    return "a dimension is not positive";
  if (c.hidden % c.num_heads != 0) return "hidden_size is not a multiple of num_attention_heads";
  int d = c.hidden / c.num_heads;
  if (d != 32 && d != 64 && d != 128) return "head dimension " + std::to_string(d) + " (the kernel takes 32, 64, 128)";
  if (c.hidden > 1024) return "hidden_size above 1024";
  if (c.intermediate % 2 != 0) return "intermediate_size is odd";
  if (c.head < 0 || c.head > 2) return "unknown head";
  if (c.head == 0 && (c.pooling < 0 || c.pooling > 4)) return "unknown pooling";
  if (c.head != 0 && c.num_labels < 1) return "a classifier head without labels";
  if (c.head == 2 && c.num_labels != 1) return "a pair head scores one logit";
  if (c.max_rows < 1 || c.max_tokens < 1) return "limits are not positive";
  if (c.cublas_workspace_bytes < 0) return "negative cuBLAS workspace";
  return "";
}

Layout layout_of(const rg_enc_config& c) {
  Layout L;
  const int64_t H = c.hidden, I = c.intermediate;
  int64_t at = 0;
  auto put = [&](Region& r, int64_t count, bool f16) {
    r.off = at;
    r.count = count;
    r.f16 = f16;
    at += align256(count * (f16 ? 2 : 4));
  };
  put(L.word, (int64_t)c.vocab * H, true);
  put(L.pos, (int64_t)c.max_positions * H, true);
  put(L.type, (int64_t)c.type_vocab * H, true);
  put(L.eln_w, H, false);
  put(L.eln_b, H, false);
  L.layers.resize(c.num_layers);
  for (auto& l : L.layers) {
    put(l.qkv_w, 3 * H * H, true);
    put(l.qkv_b, 3 * H, false);
    put(l.o_w, H * H, true);
    put(l.o_b, H, false);
    put(l.ln1_w, H, false);
    put(l.ln1_b, H, false);
    put(l.i_w, I * H, true);
    put(l.i_b, I, false);
    put(l.out_w, H * I, true);
    put(l.out_b, H, false);
    put(l.ln2_w, H, false);
    put(l.ln2_b, H, false);
  }
  if (c.head != 0) {
    put(L.pool_w, H * H, true);
    put(L.pool_b, H, false);
    put(L.cls_w, (int64_t)c.num_labels * H, true);
    put(L.cls_b, c.num_labels, false);
    if (c.head == 2) put(L.scale, 1, false);
  }
  L.weights = at;
  const int64_t M = c.max_tokens, R = c.max_rows;
  L.out_width = c.head == 0 ? c.hidden : c.num_labels;
  L.a_ids = 0;
  L.a_types = 4 * M;
  L.a_lens = 8 * M;
  int64_t a = align256(4 * (2 * M + R));
  L.h_out = a;
  L.host_pinned = a + align256(4 * R * (int64_t)L.out_width);
  L.a_x = a;
  a += align256(2 * M * H);
  L.a_qkv = a;
  a += align256(2 * M * 3 * H);
  L.a_ctx = a;
  a += align256(2 * M * H);
  L.a_tmp = a;
  a += align256(2 * M * H);
  L.a_ffn = a;
  a += align256(2 * M * I);
  L.a_out = a;
  a += align256(4 * R * (int64_t)L.out_width);
  L.activations = a;
  return L;
}

// ---------------------------------------------------------------------------------------------------
// kernels

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); `scratch` holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(t);
}

// v holds this lane's values of one row (element lane + 32k); writes LN(v) * g + b.
__device__ __forceinline__ void warp_layer_norm(float (&v)[32], int H, int lane, const float* __restrict__ g,
                                                const float* __restrict__ b, __half* __restrict__ out, float eps) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 32; k++)
    if (lane + 32 * k < H) s += v[k];
  const float mean = warp_sum(s) / H;
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < 32; k++)
    if (lane + 32 * k < H) {
      const float d = v[k] - mean;
      q += d * d;
    }
  const float rstd = rsqrtf(warp_sum(q) / H + eps);
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const int c = lane + 32 * k;
    if (c < H) out[c] = __float2half((v[k] - mean) * rstd * g[c] + b[c]);
  }
}

// A warp per row: word + position + token type, then LayerNorm.
__global__ void embed_kernel(const int* __restrict__ ids, const int* __restrict__ types, int T, int width,
                             const __half* __restrict__ word, const __half* __restrict__ pos, const __half* __restrict__ type,
                             const float* __restrict__ g, const float* __restrict__ b, __half* __restrict__ x, int H, float eps) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= T) return;
  const int64_t id = ids[row], tt = types[row], t = row % width;
  float v[32];
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const int c = lane + 32 * k;
    v[k] = c < H ? __half2float(word[id * H + c]) + __half2float(pos[t * H + c]) + __half2float(type[tt * H + c]) : 0.f;
  }
  warp_layer_norm(v, H, lane, g, b, x + (int64_t)row * H, eps);
}

// A warp per row: out = LN(a + bias + res) (out may be res: a row is read whole before it is written).
__global__ void add_norm_kernel(const __half* __restrict__ a, const float* __restrict__ bias, const __half* res,
                                const float* __restrict__ g, const float* __restrict__ b, __half* out, int T, int H, float eps) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= T) return;
  const __half* ar = a + (int64_t)row * H;
  const __half* rr = res + (int64_t)row * H;
  float v[32];
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const int c = lane + 32 * k;
    v[k] = c < H ? __half2float(ar[c]) + bias[c] + __half2float(rr[c]) : 0.f;
  }
  warp_layer_norm(v, H, lane, g, b, out + (int64_t)row * H, eps);
}

// y = GELU(y + bias), in place over T x I (I even: pairs of halves).
__global__ void bias_gelu_kernel(__half* y, const float* __restrict__ bias, int64_t pairs, int I, int tanh_approx) {
  __half2* y2 = reinterpret_cast<__half2*>(y);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < pairs; i += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)((2 * i) % I);
    float2 v = __half22float2(y2[i]);
    v.x += bias[c];
    v.y += bias[c + 1];
    if (tanh_approx) {
      const float k = 0.7978845608028654f;
      v.x = 0.5f * v.x * (1.f + tanhf(k * (v.x + 0.044715f * v.x * v.x * v.x)));
      v.y = 0.5f * v.y * (1.f + tanhf(k * (v.y + 0.044715f * v.y * v.y * v.y)));
    } else {
      v.x = 0.5f * v.x * (1.f + erff(v.x * 0.7071067811865476f));
      v.y = 0.5f * v.y * (1.f + erff(v.y * 0.7071067811865476f));
    }
    y2[i] = __floats2half2_rn(v.x, v.y);
  }
}

constexpr int ATT_BQ = 64, ATT_BK = 64, ATT_THREADS = 128;

constexpr size_t attention_smem(int D) {
  return (size_t)(3 * ATT_BQ * D + ATT_BQ * ATT_BK) * 2 + (size_t)(ATT_BQ * ATT_BK + ATT_BQ * D + 2 * ATT_BQ) * 4;
}

union Half8 {
  uint4 u;
  __half h[8];
};

// Rows [r0, r0 + 64) of one head's q, k or v (part 0, 1, 2) with its bias, into a 64 x D tile; rows at or
// past `limit` are zeros.
template <int D>
__device__ __forceinline__ void load_tile(__half* dst, const __half* __restrict__ base, int64_t ld, int part, int H, int h,
                                          const float* __restrict__ bias, int r0, int limit) {
  constexpr int CHUNKS = D / 8;
  const float* bp = bias + part * H + h * D;
  for (int i = threadIdx.x; i < ATT_BQ * CHUNKS; i += ATT_THREADS) {
    const int r = i / CHUNKS, c8 = (i % CHUNKS) * 8, row = r0 + r;
    Half8 t;
    if (row < limit) {
      Half8 raw;
      raw.u = *reinterpret_cast<const uint4*>(base + row * ld + part * H + h * D + c8);
#pragma unroll
      for (int k = 0; k < 8; k++) t.h[k] = __float2half(__half2float(raw.h[k]) + bp[c8 + k]);
    } else {
      t.u = make_uint4(0, 0, 0, 0);
    }
    *reinterpret_cast<uint4*>(dst + r * D + c8) = t.u;
  }
}

// Attention of one (sequence, head, block of 64 queries) on tensor cores: each of the 4 warps holds 16
// query rows; keys in tiles of 64 with an online softmax in float32 (scores and the output accumulate
// in float32 in shared memory; probabilities go to the P x V product as float16).
template <int D>
__global__ void __launch_bounds__(ATT_THREADS) attention_kernel(const __half* __restrict__ qkv, const float* __restrict__ qkv_b,
                                                                 __half* __restrict__ ctx, const int* __restrict__ lens, int width,
                                                                 int H, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  __half* sQ = reinterpret_cast<__half*>(smem);
  __half* sK = sQ + ATT_BQ * D;
  __half* sV = sK + ATT_BK * D;
  __half* sP = sV + ATT_BK * D;
  float* sS = reinterpret_cast<float*>(sP + ATT_BQ * ATT_BK);
  float* sO = sS + ATT_BQ * ATT_BK;
  float* sM = sO + ATT_BQ * D;
  float* sL = sM + ATT_BQ;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ATT_BQ;
  const int len = lens[b];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t ld = 3 * (int64_t)H;
  const __half* base = qkv + (int64_t)b * width * ld;
  __half* out = ctx + (int64_t)b * width * H + h * D;
  if (q0 >= len) {
    // Padding queries only: zeros (finite; pooling and heads never read them).
    for (int i = tid; i < ATT_BQ * D; i += ATT_THREADS) {
      const int r = i / D, c = i % D;
      if (q0 + r < width) out[(int64_t)(q0 + r) * H + c] = __float2half(0.f);
    }
    return;
  }
  load_tile<D>(sQ, base, ld, 0, H, h, qkv_b, q0, width);
  for (int i = tid; i < ATT_BQ * D; i += ATT_THREADS) sO[i] = 0.f;
  if (tid < ATT_BQ) {
    sM[tid] = -INFINITY;
    sL[tid] = 0.f;
  }
  for (int k0 = 0; k0 < len; k0 += ATT_BK) {
    load_tile<D>(sK, base, ld, 1, H, h, qkv_b, k0, len);
    load_tile<D>(sV, base, ld, 2, H, h, qkv_b, k0, len);
    __syncthreads();
    {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> kt;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
#pragma unroll
      for (int n = 0; n < ATT_BK / 16; n++) {
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
          wmma::load_matrix_sync(a, sQ + warp * 16 * D + k * 16, D);
          wmma::load_matrix_sync(kt, sK + n * 16 * D + k * 16, D);
          wmma::mma_sync(acc, a, kt, acc);
        }
        wmma::store_matrix_sync(sS + warp * 16 * ATT_BK + n * 16, acc, ATT_BK, wmma::mem_row_major);
      }
    }
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int row = warp * 16 + r;
      const float* srow = sS + row * ATT_BK;
      const float s0 = k0 + lane < len ? srow[lane] * scale : -INFINITY;
      const float s1 = k0 + lane + 32 < len ? srow[lane + 32] * scale : -INFINITY;
      const float m_old = sM[row];
      // Key k0 is always a real one: m_new is finite.
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
      const float alpha = __expf(m_old - m_new);
      const float p0 = __expf(s0 - m_new), p1 = __expf(s1 - m_new);
      const float sum = warp_sum(p0 + p1);
      sP[row * ATT_BK + lane] = __float2half(p0);
      sP[row * ATT_BK + lane + 32] = __float2half(p1);
      for (int c = lane; c < D; c += 32) sO[row * D + c] *= alpha;
      __syncwarp();
      if (lane == 0) {
        sM[row] = m_new;
        sL[row] = sL[row] * alpha + sum;
      }
    }
    __syncwarp();
    {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> p;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> v;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
#pragma unroll
      for (int n = 0; n < D / 16; n++) {
        wmma::load_matrix_sync(o, sO + warp * 16 * D + n * 16, D, wmma::mem_row_major);
#pragma unroll
        for (int k = 0; k < ATT_BK / 16; k++) {
          wmma::load_matrix_sync(p, sP + warp * 16 * ATT_BK + k * 16, ATT_BK);
          wmma::load_matrix_sync(v, sV + k * 16 * D + n * 16, D);
          wmma::mma_sync(o, p, v, o);
        }
        wmma::store_matrix_sync(sO + warp * 16 * D + n * 16, o, D, wmma::mem_row_major);
      }
    }
    __syncthreads();  // the next tile overwrites sK and sV
  }
  __syncwarp();
  for (int r = 0; r < 16; r++) {
    const int row = warp * 16 + r, q = q0 + row;
    if (q >= width) break;
    const float inv = 1.f / sL[row];
    for (int c = lane; c < D; c += 32) out[(int64_t)q * H + c] = __float2half(sO[row * D + c] * inv);
  }
}

// The reference: a warp per (row, head), keys one at a time with an online softmax, all in float32.
// Slow; the checks hold the tensor-core kernel against it.
__global__ void attention_reference_kernel(const __half* __restrict__ qkv, const float* __restrict__ qkv_b,
                                           __half* __restrict__ ctx, const int* __restrict__ lens, int T, int width,
                                           int H, int heads, float scale) {
  const int64_t w = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= (int64_t)T * heads) return;
  const int h = (int)(w % heads);
  const int64_t row = w / heads;
  const int b = (int)(row / width), D = H / heads, len = lens[b];
  const int64_t ld = 3 * (int64_t)H;
  float q[4], o[4];
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const int d = lane + 32 * k;
    q[k] = d < D ? __half2float(__float2half(__half2float(qkv[row * ld + h * D + d]) + qkv_b[h * D + d])) : 0.f;
    o[k] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j < len; j++) {
    const int64_t kr = (int64_t)b * width + j;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int d = lane + 32 * k;
      if (d < D) s += q[k] * __half2float(__float2half(__half2float(qkv[kr * ld + H + h * D + d]) + qkv_b[H + h * D + d]));
    }
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new), p = expf(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int d = lane + 32 * k;
      const float v = d < D ? __half2float(__float2half(__half2float(qkv[kr * ld + 2 * H + h * D + d]) + qkv_b[2 * H + h * D + d])) : 0.f;
      o[k] = o[k] * alpha + p * v;
    }
    m = m_new;
  }
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const int d = lane + 32 * k;
    if (d < D) ctx[row * H + h * D + d] = __float2half(o[k] / l);
  }
}

// A block per sequence: the embedding head's pooling, then the L2 normalization.
__global__ void pool_kernel(const __half* __restrict__ x, const int* __restrict__ lens, int width, int H, int mode,
                            int normalize, float* __restrict__ out) {
  __shared__ float scratch[32];
  const int b = blockIdx.x, len = lens[b];
  const __half* xb = x + (int64_t)b * width * H;
  float* ob = out + (int64_t)b * H;
  float sq = 0.f;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float v;
    if (mode == 1) {
      v = __half2float(xb[c]);
    } else if (mode == 4) {
      v = __half2float(xb[(int64_t)(len - 1) * H + c]);
    } else if (mode == 2) {
      v = -INFINITY;
      for (int t = 0; t < len; t++) v = fmaxf(v, __half2float(xb[(int64_t)t * H + c]));
    } else {
      float s = 0.f;
      for (int t = 0; t < len; t++) s += __half2float(xb[(int64_t)t * H + c]);
      v = mode == 0 ? s / len : s / sqrtf((float)len);
    }
    ob[c] = v;
    sq += v * v;
  }
  if (!normalize) return;
  const float inv = 1.f / fmaxf(sqrtf(block_sum(sq, scratch)), 1e-12f);
  for (int c = threadIdx.x; c < H; c += blockDim.x) ob[c] *= inv;
}

// A block per sequence: the classifier over the pooler's tanh(Wp x[cls] + bp); the pair head adds
// scale x cos(mean of segment A, mean of segment B) over the sequence's tokens (type 0 and 1).
// Dynamic shared memory: 2 x H floats.
__global__ void classifier_kernel(const __half* __restrict__ x, const int* __restrict__ lens, const int* __restrict__ types,
                                  int width, int H, int labels, int pair, const __half* __restrict__ pw,
                                  const float* __restrict__ pb, const __half* __restrict__ cw, const float* __restrict__ cb,
                                  const float* __restrict__ scale, float* __restrict__ out) {
  extern __shared__ float sm[];
  __shared__ float scratch[32];
  __shared__ float cos_ab;
  float* cls = sm;
  float* pooled = sm + H;
  const int b = blockIdx.x, len = lens[b];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const __half* xb = x + (int64_t)b * width * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) cls[c] = __half2float(xb[c]);
  float dot = 0.f, na2 = 0.f, nb2 = 0.f;
  if (pair) {
    const int* tb = types + (int64_t)b * width;
    int na = 0, nb = 0;
    for (int t = 0; t < len; t++) (tb[t] == 0 ? na : nb)++;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
      float sa = 0.f, sb = 0.f;
      for (int t = 0; t < len; t++) {
        const float v = __half2float(xb[(int64_t)t * H + c]);
        if (tb[t] == 0) sa += v;
        else sb += v;
      }
      sa /= fmaxf((float)na, 1.f);
      sb /= fmaxf((float)nb, 1.f);
      dot += sa * sb;
      na2 += sa * sa;
      nb2 += sb * sb;
    }
  }
  __syncthreads();
  if (pair) {
    dot = block_sum(dot, scratch);
    na2 = block_sum(na2, scratch);
    nb2 = block_sum(nb2, scratch);
    if (threadIdx.x == 0) cos_ab = dot / (fmaxf(sqrtf(na2), 1e-12f) * fmaxf(sqrtf(nb2), 1e-12f));
  }
  for (int o = warp; o < H; o += warps) {
    float s = 0.f;
    for (int i = lane; i < H; i += 32) s += __half2float(pw[(int64_t)o * H + i]) * cls[i];
    s = warp_sum(s);
    if (lane == 0) pooled[o] = tanhf(s + pb[o]);
  }
  __syncthreads();
  for (int l = warp; l < labels; l += warps) {
    float s = 0.f;
    for (int i = lane; i < H; i += 32) s += __half2float(cw[(int64_t)l * H + i]) * pooled[i];
    s = warp_sum(s);
    if (lane == 0) out[(int64_t)b * labels + l] = s + cb[l] + (pair && l == 0 ? scale[0] * cos_ab : 0.f);
  }
}

// ---------------------------------------------------------------------------------------------------
// the engine

struct Engine {
  rg_enc_config cfg{};
  Layout L;
  unsigned char* weights = nullptr;
  unsigned char* act = nullptr;
  void* cublas_ws = nullptr;
  unsigned char* host = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::vector<uint8_t> loaded;  // (kind, layer) uploaded
  bool ready = false;
  std::mutex mu;

  template <typename T>
  T* w(const Region& r) { return reinterpret_cast<T*>(weights + r.off); }
  template <typename T>
  T* a(int64_t off) { return reinterpret_cast<T*>(act + off); }
};

int slot(int kind, int layer) {
  return kind >= FIRST_LAYER_KIND && kind <= LAST_LAYER_KIND ? K_COUNT + layer * K_COUNT + kind : kind;
}

bool required(const rg_enc_config& c, int kind) {
  if (kind >= K_POOL_W && kind <= K_CLS_B) return c.head != 0;
  if (kind == K_SCALE) return c.head == 2;
  return true;
}

const char* kind_name(int k) {
  static const char* names[K_COUNT] = {
      "word_embeddings", "position_embeddings", "token_type_embeddings", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias",
      "query.weight", "key.weight", "value.weight", "query.bias", "key.bias", "value.bias",
      "attention.output.dense.weight", "attention.output.dense.bias", "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
      "intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight", "output.dense.bias", "output.LayerNorm.weight", "output.LayerNorm.bias",
      "pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias", "scale"};
  return k >= 0 && k < K_COUNT ? names[k] : "?";
}

// The region a kind is written to, and the element offset inside it (q, k, v share the fused ones).
bool target(Engine& e, int kind, int layer, Region*& r, int64_t& sub, int64_t& count) {
  const int64_t H = e.cfg.hidden;
  sub = 0;
  if (kind >= FIRST_LAYER_KIND && kind <= LAST_LAYER_KIND) {
    if (layer < 0 || layer >= e.cfg.num_layers) return false;
    LayerRegions& l = e.L.layers[layer];
    switch (kind) {
      case K_Q_W: case K_K_W: case K_V_W: r = &l.qkv_w; sub = (kind - K_Q_W) * H * H; count = H * H; return true;
      case K_Q_B: case K_K_B: case K_V_B: r = &l.qkv_b; sub = (kind - K_Q_B) * H; count = H; return true;
      case K_O_W: r = &l.o_w; break;
      case K_O_B: r = &l.o_b; break;
      case K_LN1_W: r = &l.ln1_w; break;
      case K_LN1_B: r = &l.ln1_b; break;
      case K_I_W: r = &l.i_w; break;
      case K_I_B: r = &l.i_b; break;
      case K_OUT_W: r = &l.out_w; break;
      case K_OUT_B: r = &l.out_b; break;
      case K_LN2_W: r = &l.ln2_w; break;
      case K_LN2_B: r = &l.ln2_b; break;
      default: return false;
    }
    count = r->count;
    return true;
  }
  if (!required(e.cfg, kind)) return false;
  switch (kind) {
    case K_WORD: r = &e.L.word; break;
    case K_POS: r = &e.L.pos; break;
    case K_TYPE: r = &e.L.type; break;
    case K_EMB_LN_W: r = &e.L.eln_w; break;
    case K_EMB_LN_B: r = &e.L.eln_b; break;
    case K_POOL_W: r = &e.L.pool_w; break;
    case K_POOL_B: r = &e.L.pool_b; break;
    case K_CLS_W: r = &e.L.cls_w; break;
    case K_CLS_B: r = &e.L.cls_b; break;
    case K_SCALE: r = &e.L.scale; break;
    default: return false;
  }
  count = r->count;
  return true;
}

int gemm(Engine& e, const __half* W, const __half* X, __half* Y, int out, int in, int T) {
  const float one = 1.f, zero = 0.f;
  // Row-major Y[T, out] = X[T, in] W[out, in]^T: column-major Y^T = W^T(op T of W's [in, out] view) X^T.
  CB(cublasGemmEx(e.blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, W, CUDA_R_16F, in, X, CUDA_R_16F, in, &zero, Y, CUDA_R_16F,
                  out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

int forward(Engine& e, int rows, int width) {
  const rg_enc_config& c = e.cfg;
  const int H = c.hidden, I = c.intermediate, T = rows * width, D = H / c.num_heads;
  cudaStream_t s = e.stream;
  __half* x = e.a<__half>(e.L.a_x);
  __half* qkv = e.a<__half>(e.L.a_qkv);
  __half* ctx = e.a<__half>(e.L.a_ctx);
  __half* tmp = e.a<__half>(e.L.a_tmp);
  __half* ffn = e.a<__half>(e.L.a_ffn);
  const int* lens = e.a<int>(e.L.a_lens);
  const int row_blocks = (T + 7) / 8;  // 8 warps of 256 threads, a warp per row
  embed_kernel<<<row_blocks, 256, 0, s>>>(e.a<int>(e.L.a_ids), e.a<int>(e.L.a_types), T, width, e.w<__half>(e.L.word),
                                          e.w<__half>(e.L.pos), e.w<__half>(e.L.type), e.w<float>(e.L.eln_w), e.w<float>(e.L.eln_b), x, H,
                                          c.ln_eps);
  const float scale = 1.f / sqrtf((float)D);
  for (int li = 0; li < c.num_layers; li++) {
    LayerRegions& l = e.L.layers[li];
    if (gemm(e, e.w<__half>(l.qkv_w), x, qkv, 3 * H, H, T)) return -1;
    const float* qkv_b = e.w<float>(l.qkv_b);
    if (c.attention == 1) {
      const int64_t warps = (int64_t)T * c.num_heads;
      attention_reference_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, s>>>(qkv, qkv_b, ctx, lens, T, width, H, c.num_heads, scale);
    } else {
      const dim3 grid((width + ATT_BQ - 1) / ATT_BQ, c.num_heads, rows);
      if (D == 32) attention_kernel<32><<<grid, ATT_THREADS, attention_smem(32), s>>>(qkv, qkv_b, ctx, lens, width, H, scale);
      else if (D == 64) attention_kernel<64><<<grid, ATT_THREADS, attention_smem(64), s>>>(qkv, qkv_b, ctx, lens, width, H, scale);
      else attention_kernel<128><<<grid, ATT_THREADS, attention_smem(128), s>>>(qkv, qkv_b, ctx, lens, width, H, scale);
    }
    if (gemm(e, e.w<__half>(l.o_w), ctx, tmp, H, H, T)) return -1;
    add_norm_kernel<<<row_blocks, 256, 0, s>>>(tmp, e.w<float>(l.o_b), x, e.w<float>(l.ln1_w), e.w<float>(l.ln1_b), x, T, H, c.ln_eps);
    if (gemm(e, e.w<__half>(l.i_w), x, ffn, I, H, T)) return -1;
    const int64_t pairs = (int64_t)T * I / 2;
    const unsigned blocks = (unsigned)std::min<int64_t>((pairs + 255) / 256, 65535);
    bias_gelu_kernel<<<blocks, 256, 0, s>>>(ffn, e.w<float>(l.i_b), pairs, I, c.act);
    if (gemm(e, e.w<__half>(l.out_w), ffn, tmp, H, I, T)) return -1;
    add_norm_kernel<<<row_blocks, 256, 0, s>>>(tmp, e.w<float>(l.out_b), x, e.w<float>(l.ln2_w), e.w<float>(l.ln2_b), x, T, H, c.ln_eps);
  }
  float* out = e.a<float>(e.L.a_out);
  if (c.head == 0) {
    pool_kernel<<<rows, 256, 0, s>>>(x, lens, width, H, c.pooling, c.normalize, out);
  } else {
    classifier_kernel<<<rows, 256, 2 * H * sizeof(float), s>>>(x, lens, e.a<int>(e.L.a_types), width, H, c.num_labels, c.head == 2,
                                                              e.w<__half>(e.L.pool_w), e.w<float>(e.L.pool_b), e.w<__half>(e.L.cls_w),
                                                              e.w<float>(e.L.cls_b), c.head == 2 ? e.w<float>(e.L.scale) : nullptr, out);
  }
  CK(cudaGetLastError());
  return 0;
}

void release(Engine* e) {
  if (!e) return;
  if (e->blas) cublasDestroy(e->blas);
  if (e->stream) cudaStreamDestroy(e->stream);
  if (e->weights) cudaFree(e->weights);
  if (e->act) cudaFree(e->act);
  if (e->cublas_ws) cudaFree(e->cublas_ws);
  if (e->host) cudaFreeHost(e->host);
  delete e;
}

int create_into(Engine* e) {
  const rg_enc_config& c = e->cfg;
  CK(cudaSetDevice(c.device));
  CK(cudaMalloc(&e->weights, e->L.weights));
  CK(cudaMemset(e->weights, 0, e->L.weights));
  CK(cudaMalloc(&e->act, e->L.activations));
  CK(cudaMemset(e->act, 0, e->L.activations));
  if (c.cublas_workspace_bytes > 0) CK(cudaMalloc(&e->cublas_ws, c.cublas_workspace_bytes));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&e->host), e->L.host_pinned, cudaHostAllocDefault));
  CK(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
  CB(cublasCreate(&e->blas));
  CB(cublasSetStream(e->blas, e->stream));
  CB(cublasSetWorkspace(e->blas, e->cublas_ws, (size_t)c.cublas_workspace_bytes));
  CK(cudaFuncSetAttribute(attention_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attention_smem(32)));
  CK(cudaFuncSetAttribute(attention_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attention_smem(64)));
  CK(cudaFuncSetAttribute(attention_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attention_smem(128)));
  e->loaded.assign(K_COUNT * (1 + c.num_layers), 0);
  return 0;
}

}  // namespace

extern "C" {

const char* rg_enc_last_error() {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> g(g_err_mu);
  copy = g_err;
  return copy.c_str();
}

int rg_enc_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// out: weights, activations, cuBLAS workspace, pinned host, device total (encoder-plan.ts planEncoder).
int rg_enc_plan(const rg_enc_config* cfg, int64_t* out) {
  const std::string p = shape_problem(*cfg);
  if (!p.empty()) {
    set_err("encoder shape: " + p);
    return -1;
  }
  const Layout L = layout_of(*cfg);
  out[0] = L.weights;
  out[1] = L.activations;
  out[2] = cfg->cublas_workspace_bytes;
  out[3] = L.host_pinned;
  out[4] = L.weights + L.activations + cfg->cublas_workspace_bytes;
  return 0;
}

void* rg_enc_create(const rg_enc_config* cfg) {
  const std::string p = shape_problem(*cfg);
  if (!p.empty()) {
    set_err("encoder shape: " + p);
    return nullptr;
  }
  Engine* e = new Engine();
  e->cfg = *cfg;
  e->L = layout_of(*cfg);
  if (create_into(e) != 0) {
    release(e);
    return nullptr;
  }
  return e;
}

void rg_enc_destroy(void* h) {
  Engine* e = static_cast<Engine*>(h);
  if (e) cudaSetDevice(e->cfg.device);
  release(e);
}

// One tensor in float32 (as encoder-weights.ts resolved it: Linear weights [out, in]); converted to the
// region's type. Refuses a wrong element count and float16 overflow, by the tensor's name.
int rg_enc_upload(void* h, int kind, int layer, const float* data, int64_t count) {
  Engine* e = static_cast<Engine*>(h);
  std::lock_guard<std::mutex> g(e->mu);
  Region* r = nullptr;
  int64_t sub = 0, expect = 0;
  if (kind < 0 || kind >= K_COUNT || !target(*e, kind, layer, r, sub, expect)) {
    set_err(std::string("no place for ") + kind_name(kind) + " of layer " + std::to_string(layer) + " in this model");
    return -1;
  }
  if (count != expect) {
    set_err(std::string(kind_name(kind)) + " of layer " + std::to_string(layer) + ": " + std::to_string(count) + " elements, expected " +
            std::to_string(expect));
    return -1;
  }
  CK(cudaSetDevice(e->cfg.device));
  if (r->f16) {
    std::vector<__half> tmp(count);
    for (int64_t i = 0; i < count; i++) {
      tmp[i] = __float2half_rn(data[i]);
      if (!std::isfinite(__half2float(tmp[i]))) {
        set_err(std::string(kind_name(kind)) + " of layer " + std::to_string(layer) + ": element " + std::to_string(i) + " (" +
                std::to_string(data[i]) + ") does not fit float16");
        return -1;
      }
    }
    CK(cudaMemcpy(e->weights + r->off + sub * 2, tmp.data(), count * 2, cudaMemcpyHostToDevice));
  } else {
    CK(cudaMemcpy(e->weights + r->off + sub * 4, data, count * 4, cudaMemcpyHostToDevice));
  }
  e->loaded[slot(kind, layer)] = 1;
  return 0;
}

// Every tensor the model needs is in (else the first missing one is named).
int rg_enc_load_done(void* h) {
  Engine* e = static_cast<Engine*>(h);
  std::lock_guard<std::mutex> g(e->mu);
  for (int k = 0; k < K_COUNT; k++) {
    if (k >= FIRST_LAYER_KIND && k <= LAST_LAYER_KIND) {
      for (int l = 0; l < e->cfg.num_layers; l++)
        if (!e->loaded[slot(k, l)]) {
          set_err(std::string("missing ") + kind_name(k) + " of layer " + std::to_string(l));
          return -1;
        }
    } else if (required(e->cfg, k) && !e->loaded[slot(k, 0)]) {
      set_err(std::string("missing ") + kind_name(k));
      return -1;
    }
  }
  e->ready = true;
  return 0;
}

// One run: `rows` sequences padded to `width` (ids and types row-major, rows x width; lens each
// sequence's tokens, 1..width). Writes rows x out_width floats (the embedding, or the logits).
int rg_enc_run(void* h, const int32_t* ids, const int32_t* types, const int32_t* lens, int32_t rows, int32_t width, float* out) {
  Engine* e = static_cast<Engine*>(h);
  std::lock_guard<std::mutex> g(e->mu);
  const rg_enc_config& c = e->cfg;
  if (!e->ready) {
    set_err("run before every weight was loaded");
    return -1;
  }
  if (rows < 1 || width < 1 || rows > c.max_rows || (int64_t)rows * width > c.max_tokens || width > c.max_positions) {
    set_err("run of " + std::to_string(rows) + " x " + std::to_string(width) + " outside the limits (rows " + std::to_string(c.max_rows) +
            ", tokens " + std::to_string(c.max_tokens) + ", positions " + std::to_string(c.max_positions) + ")");
    return -1;
  }
  const int64_t T = (int64_t)rows * width;
  for (int r = 0; r < rows; r++)
    if (lens[r] < 1 || lens[r] > width) {
      set_err("sequence " + std::to_string(r) + " has length " + std::to_string(lens[r]) + " in a run of width " + std::to_string(width));
      return -1;
    }
  for (int64_t i = 0; i < T; i++)
    if (ids[i] < 0 || ids[i] >= c.vocab || types[i] < 0 || types[i] >= c.type_vocab) {
      set_err("token " + std::to_string(i) + ": id " + std::to_string(ids[i]) + " or type " + std::to_string(types[i]) + " outside the model's tables");
      return -1;
    }
  CK(cudaSetDevice(c.device));
  unsigned char* hb = e->host;
  std::memcpy(hb + e->L.a_ids, ids, T * 4);
  std::memcpy(hb + e->L.a_types, types, T * 4);
  std::memcpy(hb + e->L.a_lens, lens, (size_t)rows * 4);
  CK(cudaMemcpyAsync(e->act + e->L.a_ids, hb + e->L.a_ids, T * 4, cudaMemcpyHostToDevice, e->stream));
  CK(cudaMemcpyAsync(e->act + e->L.a_types, hb + e->L.a_types, T * 4, cudaMemcpyHostToDevice, e->stream));
  CK(cudaMemcpyAsync(e->act + e->L.a_lens, hb + e->L.a_lens, (size_t)rows * 4, cudaMemcpyHostToDevice, e->stream));
  if (forward(*e, rows, width)) return -1;
  const size_t bytes = (size_t)rows * e->L.out_width * 4;
  CK(cudaMemcpyAsync(hb + e->L.h_out, e->act + e->L.a_out, bytes, cudaMemcpyDeviceToHost, e->stream));
  CK(cudaStreamSynchronize(e->stream));
  std::memcpy(out, hb + e->L.h_out, bytes);
  return 0;
}

int rg_enc_memory_info(void* h, rg_enc_memory* m) {
  Engine* e = static_cast<Engine*>(h);
  m->weights = e->L.weights;
  m->activations = e->L.activations;
  m->cublas_workspace = e->cfg.cublas_workspace_bytes;
  m->host_pinned = e->L.host_pinned;
  m->total = e->L.weights + e->L.activations + e->cfg.cublas_workspace_bytes;
  size_t fr = 0, tot = 0;
  CK(cudaSetDevice(e->cfg.device));
  CK(cudaMemGetInfo(&fr, &tot));
  m->device_free = (int64_t)fr;
  m->device_total = (int64_t)tot;
  return 0;
}

}  // extern "C"
