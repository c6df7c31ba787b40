// GGUF weights kept quantized on the device (included by ragguard_cuda.cu, inside its anonymous
// namespace, after the element helpers and StepView).
//
// A matrix [n, k] is stored as gguf-blocks.ts lays it out: units of 32 consecutive weights of a row in
// aligned planes (Q: the quantized bits, S: a unit's scales, H: a K-quant super-block's d and dmin), each
// plane 256-byte aligned. unit32<TYPE> turns one unit back into 32 floats exactly as gguf.ts dequantizes
// the block (its CPU reference is gguf-blocks.ts dequantUnits, held to gguf.ts by the tests).
//
// Products:
//   decode-sized steps (rows <= QGEMV_MAX_ROWS): qgemv_kernel, a warp per output row streaming its units
//     once (the bytes a decode step reads are the quantized bytes), every row of X against each unit;
//   larger steps (prefill, wide batches): qmma_kernel, tensor-core tiles that dequantize the units they
//     read into shared memory (below); the runner option quantGemm: 'dequant' keeps the older way for comparison: the
//     matrix dequantized tile by tile into a bounded scratch and each tile multiplied by cuBLAS.
// The embedding gathers and dequantizes only the rows of the step's tokens.

// ggml type ids (ggml.h), the device types of gguf-blocks.ts; QT_FP8 (not a ggml type): RAGGUARD_CUDA_WEIGHTS=fp8's
// E4M3 weights of a float16/bfloat16 checkpoint, made on the device at load (fp8_pack_kernel).
enum { QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q8_0 = 8, QT_Q4_K = 12, QT_Q6_K = 14, QT_BF16 = 30, QT_FP8 = 1000 };

struct QLayout { int q, s, h; };
// Bytes of a unit in the Q and S planes, and of a super-block (8 units) in the H plane; {0,0,0}: unknown.
__host__ __device__ constexpr QLayout qlayout(int t) {
  return t == QT_F16 || t == QT_BF16 ? QLayout{64, 0, 0}
       : t == QT_Q8_0 ? QLayout{32, 2, 0}
       : t == QT_Q4_0 ? QLayout{16, 2, 0}
       : t == QT_Q4_1 ? QLayout{16, 4, 0}
       : t == QT_Q5_0 ? QLayout{20, 2, 0}
       : t == QT_Q4_K ? QLayout{16, 2, 4}
       : t == QT_Q6_K ? QLayout{24, 2, 2}
       : t == QT_FP8 ? QLayout{32, 2, 0}
       : QLayout{0, 0, 0};
}

struct QPlanes { const uint8_t* q; const uint8_t* s; const uint8_t* h; };

inline size_t qalign256(size_t n) { return (n + 255) & ~(size_t)255; }

// Plane offsets of a [rows, cols] matrix from its base and its packed bytes (gguf-blocks.ts planeOffsets).
inline size_t qplanes(int type, size_t rows, size_t cols, const uint8_t* base, QPlanes* p) {
  const QLayout l = qlayout(type);
  const size_t units = rows * cols / 32;
  const size_t s = qalign256(units * l.q);
  const size_t h = s + qalign256(units * l.s);
  if (p) *p = QPlanes{base, base + s, base + h};
  return h + qalign256(units / 8 * l.h);
}

// The 4-bit element i (0..31) of a unit whose 16 bytes are in `b` (low nibbles 0..15, high 16..31).
__device__ __forceinline__ int qnib(const uint8_t* b, int i) { return i < 16 ? b[i] & 15 : b[i - 16] >> 4; }

// A unit's bytes as loaded from the planes, before decoding: `q` its quantized bits (up to 64 bytes), `s` its
// scale-plane bytes (up to 4), `h` its super-block's header (K-quants: d and dmin, or d). Loading and
// decoding apart let a kernel issue the next unit's loads before it works on the current one (qmma_kernel);
// unit32 is the two in a row.
struct UnitRaw { uint4 q[4]; uint32_t s, h; };

template <int TY> __device__ __forceinline__ void unit_load(const QPlanes& p, size_t u, UnitRaw& r);
template <int TY> __device__ __forceinline__ void unit_decode(const UnitRaw& r, float (&w)[32]);

template <int TY> __device__ __forceinline__ void unit32(const QPlanes& p, size_t u, float (&w)[32]) {
  UnitRaw r;
  unit_load<TY>(p, u, r);
  unit_decode<TY>(r, w);
}

__device__ __forceinline__ float half_bits(uint32_t b) { return __half2float(__ushort_as_half((unsigned short)(b & 0xffffu))); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

// F16 / BF16: 64 bytes a unit.
template <> __device__ __forceinline__ void unit_load<QT_F16>(const QPlanes& p, size_t u, UnitRaw& r) {
  const uint4* q = reinterpret_cast<const uint4*>(p.q + u * 64);
#pragma unroll
  for (int g = 0; g < 4; ++g) r.q[g] = __ldg(q + g);
}
template <> __device__ __forceinline__ void unit_load<QT_BF16>(const QPlanes& p, size_t u, UnitRaw& r) { unit_load<QT_F16>(p, u, r); }
template <> __device__ __forceinline__ void unit_decode<QT_F16>(const UnitRaw& r, float (&w)[32]) {
  const __half* h = reinterpret_cast<const __half*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = __half2float(h[i]);
}
template <> __device__ __forceinline__ void unit_decode<QT_BF16>(const UnitRaw& r, float (&w)[32]) {
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = __bfloat162float(h[i]);
}
// Q8_0 (and FP8 below): 32 bytes and a float16 scale.
template <> __device__ __forceinline__ void unit_load<QT_Q8_0>(const QPlanes& p, size_t u, UnitRaw& r) {
  r.s = ld_u16(p.s + 2 * u);
  const uint4* q = reinterpret_cast<const uint4*>(p.q + u * 32);
  r.q[0] = __ldg(q);
  r.q[1] = __ldg(q + 1);
}
template <> __device__ __forceinline__ void unit_decode<QT_Q8_0>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.s);
  const int8_t* b = reinterpret_cast<const int8_t*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = d * (float)b[i];
}
template <> __device__ __forceinline__ void unit_load<QT_Q4_0>(const QPlanes& p, size_t u, UnitRaw& r) {
  r.s = ld_u16(p.s + 2 * u);
  r.q[0] = __ldg(reinterpret_cast<const uint4*>(p.q + u * 16));
}
template <> __device__ __forceinline__ void unit_decode<QT_Q4_0>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.s);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = d * (float)(qnib(b, i) - 8);
}
template <> __device__ __forceinline__ void unit_load<QT_Q4_1>(const QPlanes& p, size_t u, UnitRaw& r) {
  r.s = ld_u32(p.s + 4 * u);
  r.q[0] = __ldg(reinterpret_cast<const uint4*>(p.q + u * 16));
}
template <> __device__ __forceinline__ void unit_decode<QT_Q4_1>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.s), m = half_bits(r.s >> 16);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = fmaf(d, (float)qnib(b, i), m);
}
// Q5_0: 20 bytes a unit, 4-byte aligned: five words (16 nibble bytes, then qh in q[1].x).
template <> __device__ __forceinline__ void unit_load<QT_Q5_0>(const QPlanes& p, size_t u, UnitRaw& r) {
  r.s = ld_u16(p.s + 2 * u);
  const uint32_t* q = reinterpret_cast<const uint32_t*>(p.q + u * 20);
  r.q[0] = make_uint4(__ldg(q), __ldg(q + 1), __ldg(q + 2), __ldg(q + 3));
  r.q[1].x = __ldg(q + 4);
}
template <> __device__ __forceinline__ void unit_decode<QT_Q5_0>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.s);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(r.q);
  const uint32_t qh = r.q[1].x;
#pragma unroll
  // (int): qh is unsigned, and an unsigned q - 16 would wrap for q < 16 (a weight of 2^32 d).
  for (int i = 0; i < 32; ++i) w[i] = d * (float)((qnib(b, i) | (int)((qh >> i) & 1) << 4) - 16);
}
// Q4_K: the unit's 6-bit scale and min (two bytes of S), the super-block's d and dmin (four bytes of H).
template <> __device__ __forceinline__ void unit_load<QT_Q4_K>(const QPlanes& p, size_t u, UnitRaw& r) {
  r.h = ld_u32(p.h + 4 * (u >> 3));
  r.s = ld_u16(p.s + 2 * u);
  r.q[0] = __ldg(reinterpret_cast<const uint4*>(p.q + u * 16));
}
template <> __device__ __forceinline__ void unit_decode<QT_Q4_K>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.h), dmin = half_bits(r.h >> 16);
  // d x a 6-bit scale is exact in float: the element is one rounding of scale q - min, as gguf.ts's.
  const float scale = d * (float)(r.s & 0xffu), mn = dmin * (float)((r.s >> 8) & 0xffu);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = fmaf(scale, (float)qnib(b, i), -mn);
}
// Q6_K: 24 bytes a unit, 8-byte aligned (16 nibble bytes, then 8 bytes of 2-bit highs in q[1].xy); two
// signed 8-bit scales (S) and the super-block's d (H).
template <> __device__ __forceinline__ void unit_load<QT_Q6_K>(const QPlanes& p, size_t u, UnitRaw& r) {
  r.h = ld_u16(p.h + 2 * (u >> 3));
  r.s = ld_u16(p.s + 2 * u);
  const uint2* q = reinterpret_cast<const uint2*>(p.q + u * 24);
  const uint2 a = __ldg(q), b = __ldg(q + 1), c = __ldg(q + 2);
  r.q[0] = make_uint4(a.x, a.y, b.x, b.y);
  r.q[1].x = c.x;
  r.q[1].y = c.y;
}
template <> __device__ __forceinline__ void unit_decode<QT_Q6_K>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.h);
  const float s0 = d * (float)(int8_t)(r.s & 0xffu), s1 = d * (float)(int8_t)((r.s >> 8) & 0xffu);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int hi = (b[16 + (i & 7)] >> (2 * (i >> 3))) & 3;
    w[i] = (i < 16 ? s0 : s1) * (float)((qnib(b, i) | (hi << 4)) - 32);
  }
}

// FP8: 32 E4M3 bytes and a float16 scale a unit (per-block scales of 32 weights: a row's outliers cost only
// their own block's resolution).
template <> __device__ __forceinline__ void unit_load<QT_FP8>(const QPlanes& p, size_t u, UnitRaw& r) { unit_load<QT_Q8_0>(p, u, r); }
template <> __device__ __forceinline__ void unit_decode<QT_FP8>(const UnitRaw& r, float (&w)[32]) {
  const float d = half_bits(r.s);
  const __nv_fp8_e4m3* b = reinterpret_cast<const __nv_fp8_e4m3*>(r.q);
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = d * (float)b[i];
}

// Quantizes `units` units of 32 source values (src_dtype 0 f32, 1 f16, 2 bf16) into FP8 units from unit
// `u_begin` on: scale = the block's largest |value| / 448 (E4M3's largest), rounded up to float16 so that
// no value saturates, each value rounded to the nearest E4M3.
__global__ void fp8_pack_kernel(const void* __restrict__ src, int src_dtype, QPlanes P, size_t u_begin, size_t units) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= units) return;
  float x[32];
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    const size_t e = i * 32 + k;
    x[k] = src_dtype == 0 ? reinterpret_cast<const float*>(src)[e]
         : src_dtype == 1 ? __half2float(reinterpret_cast<const __half*>(src)[e])
                          : __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(src)[e]);
  }
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(x[k]));
  const __half hs = __float2half_ru(amax / 448.f);
  const float s = __half2float(hs);
  const float inv = s > 0.f ? 1.f / s : 0.f;
  const size_t u = u_begin + i;
  *reinterpret_cast<__half*>(const_cast<uint8_t*>(P.s) + 2 * u) = hs;
  uint4 out[2];
  __nv_fp8_e4m3* q = reinterpret_cast<__nv_fp8_e4m3*>(out);
#pragma unroll
  for (int k = 0; k < 32; ++k) q[k] = __nv_fp8_e4m3(x[k] * inv);
  uint4* dst = reinterpret_cast<uint4*>(const_cast<uint8_t*>(P.q) + u * 32);
  dst[0] = out[0];
  dst[1] = out[1];
}

// The largest |value| over a CTA's threads (blockDim.x a multiple of 32, at most 1024), for every thread.
__device__ __forceinline__ float block_amax(float v) {
  __shared__ float red[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = 0.f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) m = fmaxf(m, red[i]);
  __syncthreads();  // red is reused by the next call
  return m;
}

// FP8 with one scale a row (runner option fp8Gemm 'cublaslt': the scale cuBLASLt applies in its epilogue as an
// outer vector): a CTA per row of the chunk (`k` values of src each): the row's largest |value| / 448 rounded up
// to float16 (so nothing saturates, and the unit scales the GEMV and the tensor-core tiles read hold it exactly),
// written as every unit's scale and, as float, into row_scale[row]; each value rounded to the nearest E4M3.
__global__ void fp8_pack_rows_kernel(const void* __restrict__ src, int src_dtype, QPlanes P, size_t row_begin, int k,
                                     float* __restrict__ row_scale) {
  const size_t base = (size_t)blockIdx.x * k;
  auto val = [&](size_t e) -> float {
    return src_dtype == 0 ? reinterpret_cast<const float*>(src)[e]
         : src_dtype == 1 ? __half2float(reinterpret_cast<const __half*>(src)[e])
                          : __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(src)[e]);
  };
  float amax = 0.f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(val(base + i)));
  amax = block_amax(amax);
  const __half hs = __float2half_ru(amax / 448.f);
  const float s = __half2float(hs);
  const float inv = s > 0.f ? 1.f / s : 0.f;
  const size_t row = row_begin + blockIdx.x;
  const int upr = k / 32;
  for (int c = threadIdx.x; c < upr; c += blockDim.x) {
    const size_t u = row * upr + c;
    *reinterpret_cast<__half*>(const_cast<uint8_t*>(P.s) + 2 * u) = hs;
    uint4 out[2];
    __nv_fp8_e4m3* q = reinterpret_cast<__nv_fp8_e4m3*>(out);
#pragma unroll
    for (int j = 0; j < 32; ++j) q[j] = __nv_fp8_e4m3(val(base + (size_t)c * 32 + j) * inv);
    uint4* dst = reinterpret_cast<uint4*>(const_cast<uint8_t*>(P.q) + u * 32);
    dst[0] = out[0];
    dst[1] = out[1];
  }
  if (threadIdx.x == 0) row_scale[row] = s;
}

// A step's activations as FP8 for cuBLASLt, one scale a row (a token): a CTA per row of X ([rows, k], the model's
// type, rows `ldx` apart): scale = the row's largest |value| / 448 (1 for a row of zeros), each value rounded to
// the nearest E4M3 into out [rows, k] and the scale into scale[row].
template <typename T>
__global__ void act_fp8_kernel(const T* __restrict__ X, int ldx, int k, uint8_t* __restrict__ out, float* __restrict__ scale) {
  const T* x = X + (size_t)blockIdx.x * ldx;
  float amax = 0.f;
  for (int i = threadIdx.x * 8; i < k; i += blockDim.x * 8) {
    float f[8];
    load8(x + i, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
  }
  amax = block_amax(amax);
  const float s = amax > 0.f ? amax / 448.f : 1.f;
  const float inv = 1.f / s;
  uint8_t* o = out + (size_t)blockIdx.x * k;
  for (int i = threadIdx.x * 8; i < k; i += blockDim.x * 8) {
    float f[8];
    load8(x + i, f);
    uint2 v;
    __nv_fp8_e4m3* q = reinterpret_cast<__nv_fp8_e4m3*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = __nv_fp8_e4m3(f[j] * inv);
    *reinterpret_cast<uint2*>(o + i) = v;
  }
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
}

constexpr int QGEMV_MAX_ROWS = 8;
constexpr int QGEMV_WARPS = 4;

// A GEMV warp's row sums into Y[r, j] (rows `ldy` apart; float, or the model's type), lane 0 writing.
template <typename T, int R>
__device__ __forceinline__ void qgemv_store(float (&acc)[R], int rows, int lane, int j, void* __restrict__ Y, bool y_f32, int ldy) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    const float sum = warp_sum(acc[r]);
    if (lane == 0) {
      if (y_f32) static_cast<float*>(Y)[(size_t)r * ldy + j] = sum;
      else static_cast<T*>(Y)[(size_t)r * ldy + j] = from_f<T>(sum);
    }
  }
}

// Y[r, row0 + j] = X[r, :] . W[j, :] for the `rows` (<= R) rows of a decode step: a warp per output row j
// of this segment, its lanes over the row's units; Y's rows are `ldy` apart (a segment writes its columns
// of a fused output: q|k|v, gate|up). float output (the head's logits) or the model's type. H2 (float16
// activations only; rg_set_qgemv_math): the products in paired half arithmetic, below.
template <typename T, int R, int TY, bool H2>
__global__ void __launch_bounds__(QGEMV_WARPS * 32) qgemv_kernel(const T* __restrict__ X, QPlanes W, void* __restrict__ Y,
                                                               bool y_f32, int ldy, int rows, int n, int k) {
  const int lane = threadIdx.x & 31;
  const int j = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
  if (j >= n) return;
  const int upr = k / 32;
  const size_t u0 = (size_t)j * upr;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int c = lane; c < upr; c += 32) {
    float w[32];
    unit32<TY>(W, u0 + c, w);
    if constexpr (H2 && std::is_same<T, __half>::value) {
      // float16 activations: the unit's weights once as half pairs, then each row's partial sums of
      // sixteen elements (two halves of the unit, eight products to a half lane) in paired half arithmetic
      // (HFMA2: two products an instruction, no conversion of X), added in float. Converting every
      // activation to float and multiplying in float costs about twice the instructions, and at 2-8 rows
      // the kernel was bound by issuing them (the SASS: one HADD2.F32 and one FFMA an element a row), not
      // by the bytes it reads. A partial of eight products stays far inside half's range (weights of a few
      // hundredths times activations of at most thousands) and rounds about as finely as the float16
      // weights themselves; bfloat16 activations (8 mantissa bits) keep the float products below. Not the
      // default until a GPU run has measured it and the agreement check has held it (bench:gpu-gguf
      // BENCH_GPU_QGEMV_MATH, check-agreement.ts @half2).
      __half2 wh[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) wh[i] = __floats2half2_rn(w[2 * i], w[2 * i + 1]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const uint4* x = reinterpret_cast<const uint4*>(X + (size_t)r * k + (size_t)c * 32);
        const uint4 u[4] = {__ldg(x), __ldg(x + 1), __ldg(x + 2), __ldg(x + 3)};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const __half2* xa = reinterpret_cast<const __half2*>(&u[2 * h]);
          const __half2* xb = reinterpret_cast<const __half2*>(&u[2 * h + 1]);
          const __half2* wa = wh + 8 * h;
          __half2 p = __hmul2(wa[0], xa[0]);
#pragma unroll
          for (int i = 1; i < 4; ++i) p = __hfma2(wa[i], xa[i], p);
#pragma unroll
          for (int i = 0; i < 4; ++i) p = __hfma2(wa[4 + i], xb[i], p);
          const float2 f = __half22float2(p);
          acc[r] += f.x + f.y;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const T* x = X + (size_t)r * k + (size_t)c * 32;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          float xf[8];
          load8(x + 8 * g, xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(w[8 * g + e], xf[e], acc[r]);
        }
      }
    }
  }
  qgemv_store<T, R>(acc, rows, lane, j, Y, y_f32, ldy);
}

// Stores 32 floats as the model's type, four 16-byte stores (dst 16-byte aligned).
template <typename T> __device__ __forceinline__ void store32(T* dst, const float (&w)[32]) {
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    uint4 v;
    T* h = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = from_f<T>(w[8 * g + i]);
    reinterpret_cast<uint4*>(dst)[g] = v;
  }
}

// `units` units from unit `u_begin` on, dequantized into out (row-major, the segment's rows in order).
template <typename T, int TY>
__global__ void qdequant_kernel(QPlanes W, size_t u_begin, size_t units, T* __restrict__ out) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= units) return;
  float w[32];
  unit32<TY>(W, u_begin + i, w);
  store32(out + i * 32, w);
}

// The step's tokens' rows of a quantized embedding, dequantized into out [T, hidden].
template <typename T, int TY>
__global__ void qembed_kernel(StepView v, QPlanes E, T* __restrict__ out, int hidden) {
  const int t = blockIdx.x;
  if (t >= v.T()) return;
  const int upr = hidden / 32;
  const size_t row = (size_t)v.token_ids()[t] * upr;
  for (int c = threadIdx.x; c < upr; c += blockDim.x) {
    float w[32];
    unit32<TY>(E, row + c, w);
    store32(out + (size_t)t * hidden + (size_t)c * 32, w);
  }
}

// ---------------------------------------------------------------------------------------------------
// Products of more than QGEMV_MAX_ROWS rows (wide decode batches, prefill) on the tensor cores, reading
// the quantized units inside the matrix kernel: no dequantized copy of the matrix is written or read.
//
// Y[r, j] = X[r, :] . W[j, :] for a CTA tile of QMMA_BM rows of X by QMMA_BN rows of W, QMMA_BK (two units)
// of the inner dimension a step: each thread dequantizes one unit of W (unit32, the same function the GEMV
// and the tests' reference use) into shared memory as the model's type, the X tile is copied beside it, and
// four warps (2 x 2, each 32 x 32 of the tile) multiply with mma.sync m16n8k16 (half or bfloat16 operands,
// float accumulators). The weights are rounded to the model's type exactly as the dequantized tiles for
// cuBLAS were, so results equal that path's up to the order of the float sums.
//
// A product with too few CTAs to fill the GPU (a decode batch through o or down: 3,584 outputs at 7B) splits
// the inner dimension over gridDim.z: each split writes float partial sums into `partial` ([splits, rows, n],
// the scratch that held dequantized tiles before), and qmma_reduce_kernel adds them in split order (the same
// sums in the same order every time: results do not depend on timing).
constexpr int QMMA_BM = 64, QMMA_BN = 64, QMMA_BK = 64, QMMA_THREADS = 128;
// Rows padded by 16 bytes: a warp's fragment loads (8 rows x 4 words) then fall in 32 distinct banks.
constexpr int QMMA_LDS = QMMA_BK + 8;

template <typename T> __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <> __device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <typename T> __device__ __forceinline__ uint32_t lds32(const T* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A warp's MI x 16 by 32 block of a tensor-core product (accumulators [mi][ni][e] of m16n8 tiles, rows r0..,
// columns c0..) into Y, or, where the inner dimension is split over gridDim.z, into its split's partial sums.
// Accumulator e of (mi, ni): row g (+8 for e >= 2), columns 2 tig and 2 tig + 1 of the 16 x 8 tile.
template <typename T, int MI>
__device__ __forceinline__ void mma_tile_store(const float (&acc)[MI][4][4], int r0, int c0, int g, int tig, int rows, int n,
                                               float* __restrict__ partial, void* __restrict__ Y, bool y_f32, int ldy) {
  // A lane's two adjacent columns are one store where the pair is aligned (n and ldy even, Y aligned to a pair:
  // 8 bytes for float, 4 for 16-bit; every shape the models have); otherwise they are stored one by one.
  const bool pairs = ((n | ldy) & 1) == 0 && (reinterpret_cast<uintptr_t>(Y) & (y_f32 ? 7 : 3)) == 0;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + mi * 16 + g + 8 * h;
        const int c = c0 + ni * 8 + 2 * tig;
        if (r >= rows || c >= n) continue;
        const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if (pairs) {
          if (partial) *reinterpret_cast<float2*>(&partial[((size_t)blockIdx.z * rows + r) * n + c]) = make_float2(v0, v1);
          else if (y_f32) *reinterpret_cast<float2*>(&static_cast<float*>(Y)[(size_t)r * ldy + c]) = make_float2(v0, v1);
          else {
            __align__(4) const T two[2] = {from_f<T>(v0), from_f<T>(v1)};
            *reinterpret_cast<uint32_t*>(&static_cast<T*>(Y)[(size_t)r * ldy + c]) = *reinterpret_cast<const uint32_t*>(two);
          }
          continue;
        }
        for (int e = 0; e < 2; ++e) {
          if (c + e >= n) break;
          const float v = e ? v1 : v0;
          if (partial) partial[((size_t)blockIdx.z * rows + r) * n + c + e] = v;
          else if (y_f32) static_cast<float*>(Y)[(size_t)r * ldy + c + e] = v;
          else static_cast<T*>(Y)[(size_t)r * ldy + c + e] = from_f<T>(v);
        }
      }
}

// The two shared-memory stages of the tensor-core kernels, over a split's steps s0..s1: while the warps
// multiply one step's tiles (multiply(buffer)), the next step's are loaded (load(step): global loads into
// registers, issued before the products) and stored into the idle buffer after them (store(step, buffer)).
// s0 < s1 for every split the host launches, and the condition is the CTA's alike: no thread skips a barrier.
template <typename Load, typename Multiply, typename Store>
__device__ __forceinline__ void two_stages(int s0, int s1, Load& load, Multiply& multiply, Store& store) {
  if (s0 < s1) {
    load(s0);
    store(s0, 0);
    __syncthreads();
  }
  for (int s = s0; s < s1; ++s) {
    const int cur = (s - s0) & 1;
    const int next = min(s + 1, s1 - 1);  // the last step loads its own again, into the idle buffer
    load(next);
    multiply(cur);
    // The other buffer was last read in the step before, whose barrier every thread has passed.
    store(next, cur ^ 1);
    __syncthreads();
  }
}

template <typename T, int TY>
__global__ void __launch_bounds__(QMMA_THREADS) qmma_kernel(const T* __restrict__ X, QPlanes W, void* __restrict__ Y, bool y_f32,
                                                           int ldy, float* __restrict__ partial, int rows, int n, int k,
                                                           int steps_per_split) {
  // Two stages: while the warps multiply one step's tiles, the next step's units and X rows are loaded
  // (their global loads issued before the products, their decoding and shared stores after).
  __shared__ __align__(16) T As[2][QMMA_BM][QMMA_LDS];
  __shared__ __align__(16) T Bs[2][QMMA_BN][QMMA_LDS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, tig = lane & 3;
  const int n0 = blockIdx.x * QMMA_BN, m0 = blockIdx.y * QMMA_BM;
  const int upr = k / 32, ksteps = (upr + 1) / 2;
  const int s0 = blockIdx.z * steps_per_split, s1 = min(ksteps, s0 + steps_per_split);
  float acc[2][4][4] = {};  // the warp's 32 x 32 block, as mma_tile_store reads it
  // This thread's unit of each W tile: row wr of the tile, its wu-th unit of the step (two threads a row
  // read the row's two adjacent units: 32 contiguous bytes of a 4-bit plane). Out-of-range rows and units
  // load a valid unit (clamped) and are zeroed after decoding: no branch around the loads.
  const int wr = tid >> 1, wu = tid & 1;
  const bool row_ok = n0 + wr < n;
  const size_t wrow = (size_t)min(n0 + wr, n - 1) * upr;
  constexpr int XV = QMMA_BM * (QMMA_BK / 8) / QMMA_THREADS;  // 16-byte pieces of the X tile a thread copies
  UnitRaw raw;
  uint4 xv[XV];
  auto load = [&](int s) {
    unit_load<TY>(W, wrow + min(2 * s + wu, upr - 1), raw);
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      const int i = tid + j * QMMA_THREADS, r = i / (QMMA_BK / 8), c = (i % (QMMA_BK / 8)) * 8;
      const int gm = m0 + r, kk = s * QMMA_BK + c;
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(X + (size_t)min(gm, rows - 1) * k + min(kk, k - 8)));
      xv[j] = gm < rows && kk < k ? v : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto store = [&](int s, int buf) {
    float w[32];
    unit_decode<TY>(raw, w);
    const float keep = row_ok && 2 * s + wu < upr ? 1.f : 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] *= keep;
    store32(&Bs[buf][wr][wu * 32], w);
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      const int i = tid + j * QMMA_THREADS, r = i / (QMMA_BK / 8), c = (i % (QMMA_BK / 8)) * 8;
      *reinterpret_cast<uint4*>(&As[buf][r][c]) = xv[j];
    }
  };
  auto multiply = [&](int cur) {
#pragma unroll
    for (int kk = 0; kk < QMMA_BK; kk += 16) {
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wm * 32 + mi * 16 + g;
        a[mi][0] = lds32(&As[cur][r][kk + 2 * tig]);
        a[mi][1] = lds32(&As[cur][r + 8][kk + 2 * tig]);
        a[mi][2] = lds32(&As[cur][r][kk + 2 * tig + 8]);
        a[mi][3] = lds32(&As[cur][r + 8][kk + 2 * tig + 8]);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int c = wn * 32 + ni * 8 + g;
        b[ni][0] = lds32(&Bs[cur][c][kk + 2 * tig]);
        b[ni][1] = lds32(&Bs[cur][c][kk + 2 * tig + 8]);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_16816<T>(acc[mi][ni], a[mi], b[ni]);
    }
  };
  two_stages(s0, s1, load, multiply, store);
  mma_tile_store<T>(acc, m0 + wm * 32, n0 + wn * 32, g, tig, rows, n, partial, Y, y_f32, ldy);
}

// The split products' partial sums added in split order into Y (rows x n, `ldy` apart).
template <typename T>
__global__ void qmma_reduce_kernel(const float* __restrict__ partial, int splits, void* __restrict__ Y, bool y_f32, int ldy,
                                   int rows, int n) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * n) return;
  const int r = (int)(i / n), c = (int)(i % n);
  float s = 0.f;
  for (int z = 0; z < splits; ++z) s += partial[(size_t)z * rows * n + i];
  if (y_f32) static_cast<float*>(Y)[(size_t)r * ldy + c] = s;
  else static_cast<T*>(Y)[(size_t)r * ldy + c] = from_f<T>(s);
}

// CTAs of qmma_kernel a multiprocessor holds at once (80-96 registers a thread, 36 KB of shared memory: 5-6).
constexpr int QMMA_RESIDENT = 5;

// How many splits of the inner dimension a product of `ctas` CTAs and `ksteps` steps takes: enough CTAs for
// two waves of `resident` CTAs on each of the GPU's multiprocessors, each split at least 2 steps long, the
// partial sums within `scratch`. Why so many: a decode step of 32 rows is bound by the weight bytes in flight,
// not by arithmetic; with splits sized for two CTAs a multiprocessor (the rule before 2026-12-06) a 7B
// Q4_K_M gate projection of 296 CTAs ran 9 warps a multiprocessor and read at 0.3 TB/s (Nsight Compute, H100).
inline int qmma_splits(int ctas, int ksteps, int sms, int resident, size_t rows, size_t n, size_t scratch) {
  int s = (2 * resident * sms + ctas - 1) / ctas;
  s = std::min(s, std::max(1, ksteps / 2));
  s = std::min(s, 16);
  while (s > 1 && (size_t)s * rows * n * 4 > scratch) --s;
  return std::max(s, 1);
}

// How a tensor-core product splits its inner dimension: `per` steps a split, `splits` splits (none empty),
// `partial` their sums (in the scratch at `scratch`, `scratch_bytes` long; null for one split).
struct KSplit {
  int per, splits;
  float* partial;
};
inline KSplit ksplit_plan(int ctas, int ksteps, int sms, int resident, int rows, int n, void* scratch, size_t scratch_bytes) {
  const int want = qmma_splits(ctas, ksteps, sms, resident, (size_t)rows, (size_t)n, scratch_bytes);
  const int per = (ksteps + want - 1) / want;
  const int splits = (ksteps + per - 1) / per;
  return {per, splits, splits > 1 ? static_cast<float*>(scratch) : nullptr};
}

// Calls body with TY bound to the unit type `ty` as a constant; an unknown type runs `bad`.
#define QTYPE_DISPATCH(ty, bad, ...)                                         \
  switch (ty) {                                                              \
    case QT_F16: { constexpr int TY = QT_F16; __VA_ARGS__; } break;          \
    case QT_BF16: { constexpr int TY = QT_BF16; __VA_ARGS__; } break;        \
    case QT_Q8_0: { constexpr int TY = QT_Q8_0; __VA_ARGS__; } break;        \
    case QT_Q4_0: { constexpr int TY = QT_Q4_0; __VA_ARGS__; } break;        \
    case QT_Q4_1: { constexpr int TY = QT_Q4_1; __VA_ARGS__; } break;        \
    case QT_Q5_0: { constexpr int TY = QT_Q5_0; __VA_ARGS__; } break;        \
    case QT_Q4_K: { constexpr int TY = QT_Q4_K; __VA_ARGS__; } break;        \
    case QT_Q6_K: { constexpr int TY = QT_Q6_K; __VA_ARGS__; } break;        \
    case QT_FP8: { constexpr int TY = QT_FP8; __VA_ARGS__; } break;          \
    default: bad;                                                            \
  }
