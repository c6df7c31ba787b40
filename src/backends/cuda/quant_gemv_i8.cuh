// The quantized GEMV in integer arithmetic (included by ragguard_cuda.cu after quant_kernels.cuh, inside its
// anonymous namespace): rg_set_qgemv_math 2, runner option qgemvMath 'int8'.
//
// Why: at 2-8 rows the float GEMV (quant_kernels.cuh qgemv_kernel) is bound by the instructions it issues,
// not by the bytes it reads: every weight is decoded to float once and then costs a conversion of X and an
// FMA per row. On the H100 a 7B Q4_K_M step of 8 rows took 18.4 ms against 4.3 ms for one row, while
// llama.cpp's took 8.2 ms: its MMVQ kernels quantize the step's activations to int8 in blocks of 32 and
// multiply four weight-activation pairs an instruction (dp4a). This is the same arithmetic on our layout:
//
//   1. quantize_x_i8_kernel: each 32 values of a row of X -> 32 int8 (round(x / dx), dx = the block's
//      largest |x| / 127) and (dx, dx x the sum of the int8 values), into the engine's quantized-tile
//      scratch (a GEMV step does not use it otherwise);
//   2. qgemv_i8_kernel: qgemv_kernel's shape (a warp per output row, its lanes over the row's units, every
//      row of the step against each unit it loads) with the unit's quantized values kept as packed bytes:
//      a unit's integer dot product with a row's block is 8 dp4a, then its scales once, in float.
//
// The weights are used exactly (their integers and scales as stored); the activations are rounded to 8 bits
// a block, as llama.cpp's q8_1 does: results differ from the float GEMV by that rounding (the agreement
// check's @int8 measures it). Types with integer values only (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K); F16,
// BF16 and FP8 segments stay on the float GEMV.

__host__ __device__ constexpr bool qgemv_i8_type(int t) {
  return t == QT_Q8_0 || t == QT_Q4_0 || t == QT_Q4_1 || t == QT_Q5_0 || t == QT_Q4_K || t == QT_Q6_K;
}

// Bytes of the int8 activations of `rows` rows of width k in the scratch: the values, then (256-aligned) a
// float2 (dx, dx x sum) a block.
inline size_t qgemv_i8_values_bytes(int rows, int k) { return qalign256((size_t)rows * k); }
inline size_t qgemv_i8_scratch_bytes(int rows, int k) { return qgemv_i8_values_bytes(rows, k) + (size_t)rows * (k / 32) * sizeof(float2); }

// X [rows, k] (contiguous, k a multiple of 32) as `blocks` = rows x k / 32 blocks: a warp a block. With
// `interleaved`, each block's eight 32-bit words are stored in the order 0 4 1 5 2 6 3 7, as qmmq_kernel's
// shared tiles hold them (quant_mmq.cuh): it copies X's blocks there as they are, with cp.async.
template <typename T>
__global__ void quantize_x_i8_kernel(const T* __restrict__ X, int blocks, int8_t* __restrict__ xq, float2* __restrict__ xd,
                                     bool interleaved) {
  const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (b >= blocks) return;  // the whole warp: b is the same for its lanes
  const int lane = threadIdx.x & 31;
  const float v = to_f<T>(X[(size_t)b * 32 + lane]);
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.f;
  const int q = amax > 0.f ? __float2int_rn(v / d) : 0;
  const int word = lane >> 2, at = interleaved ? ((word & 3) * 2 + (word >> 2)) * 4 + (lane & 3) : lane;
  xq[(size_t)b * 32 + at] = (int8_t)q;
  const float sum = warp_sum((float)q);  // at most 32 x 127: exact in float
  if (lane == 0) xd[b] = make_float2(d, d * sum);
}

// The unit's i-th 32-bit word of quantized bits as loaded (bytes 4i..4i+3 of its Q plane bytes).
__device__ __forceinline__ int qword(const UnitRaw& r, int i) { return (int)reinterpret_cast<const uint32_t*>(r.q)[i]; }

// 4-bit values of a nibble word: the low nibbles (elements 4a..4a+3 of the unit, for word a) and the high
// ones (elements 16+4a..16+4a+3), each in its own byte.
__device__ __forceinline__ int nib_lo(int v) { return v & 0x0F0F0F0F; }
__device__ __forceinline__ int nib_hi(int v) { return (v >> 4) & 0x0F0F0F0F; }
// Four bits (t's lowest) spread to bit 4 of four bytes: Q5_0's fifth bits.
__device__ __forceinline__ int spread4(uint32_t t) {
  return (int)(((t & 1u) << 4) | ((t & 2u) << 11) | ((t & 4u) << 18) | ((t & 8u) << 25));
}

// A unit as 32 signed int8 values and float scales, the weights exactly as stored:
//   w_i = d0 q_i (i < 16) or d1 q_i (i >= 16), plus m (Q4_1's min, Q4_K's -dmin x its 6-bit min)
// with q's word a holding elements 4a..4a+3, one a byte. d1 differs from d0 only for Q6_K (a scale per 16);
// both products, the GEMV's dp4a (unit_dot_i8) and the tensor cores' (quant_mmq.cuh), start from it.
struct UnitI8 { int q[8]; float d0, d1, m; };
__host__ __device__ constexpr bool i8_halves(int t) { return t == QT_Q6_K; }
__host__ __device__ constexpr bool i8_min(int t) { return t == QT_Q4_1 || t == QT_Q4_K; }

template <int TY> __device__ __forceinline__ void unit_i8(const UnitRaw& r, UnitI8& u);

template <> __device__ __forceinline__ void unit_i8<QT_Q8_0>(const UnitRaw& r, UnitI8& u) {
#pragma unroll
  for (int g = 0; g < 8; ++g) u.q[g] = qword(r, g);
  u.d0 = u.d1 = half_bits(r.s);
  u.m = 0.f;
}
// A unit's 32 nibbles, minus OFF each (8 for Q4_0's q - 8; 0 for the unsigned ones, which then cost no
// subtraction): the low nibbles of word a are elements 4a.., the high ones 16 + 4a...
template <int OFF> __device__ __forceinline__ void nib_i8(const UnitRaw& r, UnitI8& u) {
  constexpr uint32_t off = 0x01010101u * OFF;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int v = qword(r, a);
    u.q[a] = OFF ? (int)__vsub4(nib_lo(v), off) : nib_lo(v);  // q - OFF in each byte, a signed byte
    u.q[a + 4] = OFF ? (int)__vsub4(nib_hi(v), off) : nib_hi(v);
  }
}
template <> __device__ __forceinline__ void unit_i8<QT_Q4_0>(const UnitRaw& r, UnitI8& u) {
  nib_i8<8>(r, u);
  u.d0 = u.d1 = half_bits(r.s);
  u.m = 0.f;
}
template <> __device__ __forceinline__ void unit_i8<QT_Q4_1>(const UnitRaw& r, UnitI8& u) {
  nib_i8<0>(r, u);  // w = d q + m
  u.d0 = u.d1 = half_bits(r.s);
  u.m = half_bits(r.s >> 16);
}
template <> __device__ __forceinline__ void unit_i8<QT_Q5_0>(const UnitRaw& r, UnitI8& u) {
  const uint32_t qh = r.q[1].x;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int v = qword(r, a);
    u.q[a] = (int)__vsub4(nib_lo(v) | spread4(qh >> (4 * a)), 0x10101010);  // q - 16: -16..15
    u.q[a + 4] = (int)__vsub4(nib_hi(v) | spread4(qh >> (16 + 4 * a)), 0x10101010);
  }
  u.d0 = u.d1 = half_bits(r.s);
  u.m = 0.f;
}
template <> __device__ __forceinline__ void unit_i8<QT_Q4_K>(const UnitRaw& r, UnitI8& u) {
  nib_i8<0>(r, u);  // w = d sc q - dmin m
  u.d0 = u.d1 = half_bits(r.h) * (float)(r.s & 0xffu);
  u.m = -half_bits(r.h >> 16) * (float)((r.s >> 8) & 0xffu);
}
template <> __device__ __forceinline__ void unit_i8<QT_Q6_K>(const UnitRaw& r, UnitI8& u) {
  // Element i's two high bits are bits 2(i >> 3) of byte 16 + (i & 7): for the 4 elements of group g
  // (4g..4g+3) that is word 4 + (g & 1) shifted by 2(g >> 1), one pair a byte.
  const uint32_t hw[2] = {r.q[1].x, r.q[1].y};
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    const int v = qword(r, g & 3);
    const int nib = g < 4 ? nib_lo(v) : nib_hi(v);
    u.q[g] = (int)__vsub4(nib | (int)(((hw[g & 1] >> (2 * (g >> 1))) & 0x03030303u) << 4), 0x20202020);  // q - 32: -32..31
  }
  const float d = half_bits(r.h);
  u.d0 = d * (float)(int8_t)(r.s & 0xffu);
  u.d1 = d * (float)(int8_t)((r.s >> 8) & 0xffu);
  u.m = 0.f;
}

// A unit's dot product with one row's block: x the block's 8 words of int8 values, ds its (dx, dx x sum).
// The integer sums are exact; the scales come in once, in float.
template <int TY> __device__ __forceinline__ float unit_dot_i8(const UnitRaw& r, const int (&x)[8], float2 ds) {
  UnitI8 u;
  unit_i8<TY>(r, u);
  if constexpr (i8_halves(TY)) {
    int lo = 0, hi = 0;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      lo = __dp4a(u.q[g], x[g], lo);
      hi = __dp4a(u.q[g + 4], x[g + 4], hi);
    }
    return ds.x * (u.d0 * (float)lo + u.d1 * (float)hi);
  } else {
    int s = 0;
#pragma unroll
    for (int g = 0; g < 8; ++g) s = __dp4a(u.q[g], x[g], s);
    const float v = u.d0 * ds.x * (float)s;
    if constexpr (i8_min(TY)) return v + u.m * ds.y;
    else return v;
  }
}

// Y[r, row0 + j] = X[r, :] . W[j, :] from the quantized activations (xq, xd: quantize_x_i8_kernel's) for the
// `rows` (<= R) rows of a decode step; as qgemv_kernel otherwise (Y's rows `ldy` apart, float or T out).
template <typename T, int R, int TY>
__global__ void __launch_bounds__(QGEMV_WARPS * 32) qgemv_i8_kernel(const int8_t* __restrict__ xq, const float2* __restrict__ xd,
                                                                  QPlanes W, void* __restrict__ Y, bool y_f32, int ldy,
                                                                  int rows, int n, int k) {
  const int lane = threadIdx.x & 31;
  const int j = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);
  if (j >= n) return;
  const int upr = k / 32;
  const size_t u0 = (size_t)j * upr;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int c = lane; c < upr; c += 32) {
    UnitRaw raw;
    unit_load<TY>(W, u0 + c, raw);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      const int4* xp = reinterpret_cast<const int4*>(xq + ((size_t)r * upr + c) * 32);
      const int4 a = __ldg(xp), b = __ldg(xp + 1);
      const int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      acc[r] += unit_dot_i8<TY>(raw, x, __ldg(xd + (size_t)r * upr + c));
    }
  }
  qgemv_store<T, R>(acc, rows, lane, j, Y, y_f32, ldy);
}
