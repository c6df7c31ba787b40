// Wide quantized products in integer arithmetic on the tensor cores (included by ragguard_cuda.cu after
// quant_gemv_i8.cuh, inside its anonymous namespace): rg_config.quant_gemm 2, runner option quantGemm 'int8',
// RAGGUARD_CUDA_QGEMM=int8.
//
// Why: qmma_kernel (quant_kernels.cuh) turns every unit it reads into 32 floats, rounds them to the model's
// type and stores them in shared memory before the half-precision MMA: at 32-64 rows of a 7B step that is
// most of the kernel's instructions (a 7B Q4_K_M step of 32 rows took 13 ms on the H100 against 9 ms for
// llama.cpp, whose MMQ kernels multiply the quantized integers themselves), and a prefill pays it once for
// every 64 rows of X. Here, as in MMQ:
//
//   1. X is rounded to int8 a block of 32 with (dx, dx x the block's sum): quantize_x_i8_kernel, the GEMV's;
//   2. each unit of W is unpacked to 32 signed bytes (unit_i8: a few byte operations for 4-bit types, none for
//      Q8_0) and its scales, as stored, into shared memory beside the X tile;
//   3. mma.sync m16n8k32 (s8 x s8 -> s32) multiplies a unit of W by a block of X exactly in integers, and
//      each 16 x 8 tile's integer sums take their scales once, in float: acc += dx dw isum (+ dx sum(xq) m for
//      the types with a min). Q6_K's two scales a unit take two m16n8k16 halves.
//
// The weights are used exactly as stored; X is rounded to 8 bits a block, as the int8 GEMV rounds it (the
// agreement check's @i8mma measures it). CTAs are ordered M-fastest (blockIdx.x is the tile of X's rows) so
// that the CTAs reading one tile of W run together and a prefill streams W from memory once, not once for
// every 64 rows. Types with integer values only (qgemv_i8_type); F16, BF16 and FP8 stay on qmma_kernel.
// A CTA's tile: QMMQ_BN rows of W by BM rows of X (64, or 32 for products of up to 32 rows: a decode batch
// of 32 in a 64-row tile left half the warps without products, and their accumulators' registers cost a
// resident CTA a multiprocessor).
constexpr int QMMQ_BN = 64, QMMQ_UNITS = 4, QMMQ_THREADS = 128;
constexpr int QMMQ_BK = QMMQ_UNITS * 32;  // int8 values of the inner dimension a step
// CTAs a multiprocessor should hold at once: caps the registers (65,536 / (3 x 128) = 170 a thread for the
// 64-row tile, 128 for the 32-row one) so that 12-16 warps hide each other's loads; unbounded, ptxas gave the
// 64-row Q6_K and Q5_0 kernels 211-230 (8 warps).
constexpr int qmmq_min_ctas(int bm) { return bm == 64 ? 3 : 4; }
// Products of up to this many rows (wide decode batches, short prefills) take qmmq_kernel; longer ones stay on
// qmma_kernel. Why: the scales cost a few float operations for every output and block of 32 (a prefill's
// share grows with its rows), where qmma_kernel decodes each unit once for 64 rows and leaves the rest to the
// tensor cores: on the H100 a 1,536-row prefill of a 7B Q4_K_M took 0.197 s here against 0.161 s there,
// while at 24-32 rows this one was the faster.
constexpr int QMMQ_MAX_ROWS = 64;
// The shared tiles hold each unit's 32 bytes with its words interleaved (0 4 1 5 2 6 3 7): the two words an
// m16n8k32 fragment takes from a row (tig and tig + 4) are one 8-byte load. Rows padded by 32 bytes (40
// words): the four rows of a half warp's 8-byte loads fall in 32 distinct banks.
constexpr int QMMQ_LDS = QMMQ_BK + 32;
__device__ __forceinline__ uint2 lds64(const int8_t* p) { return *reinterpret_cast<const uint2*>(p); }
// A unit's words 0-3 (a) and 4-7 (b) interleaved into the 32 bytes at dst.
__device__ __forceinline__ void sts_unit(int8_t* dst, uint4 a, uint4 b) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(a.x, b.x, a.y, b.y);
  d[1] = make_uint4(a.z, b.z, a.w, b.w);
}
constexpr int QMMQ_WU = QMMQ_BN * QMMQ_UNITS / QMMQ_THREADS;  // units of W a thread unpacks a step
static_assert(QMMQ_WU * QMMQ_THREADS == QMMQ_BN * QMMQ_UNITS && QMMQ_UNITS % QMMQ_WU == 0, "W tile split");

// D = A B for A 16 x 32 (rows g and g + 8: words tig and 4 + tig of a row's 32 bytes), B 32 x 8 (column g:
// words tig and 4 + tig), D's e-th value row g (+8 for e >= 2), column 2 tig + (e & 1).
__device__ __forceinline__ void mma_s8_k32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}
// The same for 16 of the inner dimension (a0, a1: rows g and g + 8, word tig; b: column g, word tig).
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

// Y[r, c] = X[r, :] . W[c, :] for a tile of BM rows of X (xq, xd: quantize_x_i8_kernel's, rows k apart) by
// QMMQ_BN rows of W, QMMQ_UNITS units of the inner dimension a step; four warps (2 x 2) each BM / 2 x 32 of
// the tile. Splits of the inner dimension over gridDim.z write partial sums as qmma_kernel's do.
template <typename T, int TY, int BM>
__global__ void __launch_bounds__(QMMQ_THREADS, qmmq_min_ctas(BM)) qmmq_kernel(const int8_t* __restrict__ xq, const float2* __restrict__ xd, QPlanes W,
                                                           void* __restrict__ Y, bool y_f32, int ldy, float* __restrict__ partial,
                                                           int rows, int n, int k, int steps_per_split) {
  static_assert(BM == 32 || BM == 64, "a warp holds one or two 16-row halves");
  constexpr int MI = BM / 32;                                    // 16-row tiles a warp multiplies
  constexpr int XU = BM * QMMQ_UNITS / QMMQ_THREADS;             // blocks of X (32 bytes, a scale) a thread copies
  static_assert(XU * QMMQ_THREADS == BM * QMMQ_UNITS, "X tile split");
  // Two stages: while the warps multiply one step's tiles, the next step's units and X are loaded (their
  // global loads issued before the products, their unpacking and shared stores after).
  __shared__ __align__(16) int8_t As[2][BM][QMMQ_LDS];
  __shared__ __align__(16) int8_t Bs[2][QMMQ_BN][QMMQ_LDS];
  __shared__ float2 Xs[2][BM][QMMQ_UNITS];  // (dx, dx x sum) of a row's block
  // (d0, m), or Q6_K's (d0, d1), of a W row's unit; unit-major, so that a lane's two columns are one load
  __shared__ __align__(16) float2 Ws[2][QMMQ_UNITS][QMMQ_BN];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, tig = lane & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * QMMQ_BN;
  const int upr = k / 32, ksteps = (upr + QMMQ_UNITS - 1) / QMMQ_UNITS;
  const int s0 = blockIdx.z * steps_per_split, s1 = min(ksteps, s0 + steps_per_split);
  float acc[MI][4][4] = {};  // the warp's BM / 2 x 32 block, as mma_tile_store reads it
  // This thread's units of each W tile: row wr, units wu0.. of the step (adjacent threads read a row's
  // adjacent units). Out-of-range rows and units load a valid unit (clamped) and get zero scales.
  const int wr = tid / (QMMQ_UNITS / QMMQ_WU), wu0 = (tid % (QMMQ_UNITS / QMMQ_WU)) * QMMQ_WU;
  const bool row_ok = n0 + wr < n;
  const size_t wrow = (size_t)min(n0 + wr, n - 1) * upr;
  UnitRaw raw[QMMQ_WU];
  uint4 xv[XU][2];
  float2 xs[XU];
  auto load = [&](int s) {
#pragma unroll
    for (int w = 0; w < QMMQ_WU; ++w) unit_load<TY>(W, wrow + min(s * QMMQ_UNITS + wu0 + w, upr - 1), raw[w]);
#pragma unroll
    for (int j = 0; j < XU; ++j) {
      // Block u of row r (adjacent threads: a row's adjacent blocks). Rows past X's (a tile's padding) and
      // blocks past k load nothing.
      const int i = tid + j * QMMQ_THREADS, r = i / QMMQ_UNITS, u = s * QMMQ_UNITS + i % QMMQ_UNITS, gm = m0 + r;
      const bool ok = gm < rows && u < upr;
      const uint4* src = reinterpret_cast<const uint4*>(xq + (size_t)gm * k + (size_t)u * 32);
      xv[j][0] = ok ? __ldg(src) : make_uint4(0u, 0u, 0u, 0u);
      xv[j][1] = ok ? __ldg(src + 1) : make_uint4(0u, 0u, 0u, 0u);
      xs[j] = ok ? __ldg(xd + (size_t)gm * upr + u) : make_float2(0.f, 0.f);
    }
  };
  auto store = [&](int s, int buf) {
#pragma unroll
    for (int w = 0; w < QMMQ_WU; ++w) {
      UnitI8 u;
      unit_i8<TY>(raw[w], u);
      const int uu = wu0 + w;
      sts_unit(&Bs[buf][wr][uu * 32], make_uint4(u.q[0], u.q[1], u.q[2], u.q[3]), make_uint4(u.q[4], u.q[5], u.q[6], u.q[7]));
      // A padded row or unit multiplies by zero scales (its integers are a real unit's: finite).
      const bool ok = row_ok && s * QMMQ_UNITS + uu < upr;
      Ws[buf][uu][wr] = ok ? make_float2(u.d0, i8_halves(TY) ? u.d1 : u.m) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < XU; ++j) {
      const int i = tid + j * QMMQ_THREADS, r = i / QMMQ_UNITS, u = i % QMMQ_UNITS;
      sts_unit(&As[buf][r][u * 32], xv[j][0], xv[j][1]);
      Xs[buf][r][u] = xs[j];
    }
  };
  // The warp's 16-row halves that hold rows of X (a decode batch of 32 fills half the tile): the others skip
  // their products. Uniform across the warp, so mma.sync sees all its lanes.
  const int wm0 = wm * (BM / 2);  // the warp's first row of the tile
  bool half_ok[MI];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) half_ok[mi] = m0 + wm0 + mi * 16 < rows;
  auto multiply = [&](int cur) {
#pragma unroll
    for (int u = 0; u < QMMQ_UNITS; ++u) {
      // Words tig and tig + 4 of each row's unit (interleaved: one load), as the fragments take them.
      const int kb = u * 32 + 8 * tig;
      uint32_t a[MI][4], b[4][2];
      float2 xsc[MI][2], wsc[4][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int r = wm0 + mi * 16 + g;
        const uint2 top = lds64(&As[cur][r][kb]), bottom = lds64(&As[cur][r + 8][kb]);
        a[mi][0] = top.x;
        a[mi][1] = bottom.x;
        a[mi][2] = top.y;
        a[mi][3] = bottom.y;
        xsc[mi][0] = Xs[cur][r][u];
        xsc[mi][1] = Xs[cur][r + 8][u];
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int c = wn * 32 + ni * 8;
        const uint2 col = lds64(&Bs[cur][c + g][kb]);
        b[ni][0] = col.x;
        b[ni][1] = col.y;
        const float4 sc = *reinterpret_cast<const float4*>(&Ws[cur][u][c + 2 * tig]);  // columns 2 tig, 2 tig + 1
        wsc[ni][0] = make_float2(sc.x, sc.y);
        wsc[ni][1] = make_float2(sc.z, sc.w);
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        if (!half_ok[mi]) continue;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          if constexpr (i8_halves(TY)) {
            int lo[4], hi[4];
            mma_s8_k16(lo, a[mi][0], a[mi][1], b[ni][0]);
            mma_s8_k16(hi, a[mi][2], a[mi][3], b[ni][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 x = xsc[mi][e >> 1], w = wsc[ni][e & 1];
              acc[mi][ni][e] = fmaf(x.x, fmaf(w.x, (float)lo[e], w.y * (float)hi[e]), acc[mi][ni][e]);
            }
          } else {
            int d[4];
            mma_s8_k32(d, a[mi], b[ni]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 x = xsc[mi][e >> 1], w = wsc[ni][e & 1];
              float v = fmaf((float)d[e], x.x * w.x, acc[mi][ni][e]);
              if constexpr (i8_min(TY)) v = fmaf(x.y, w.y, v);
              acc[mi][ni][e] = v;
            }
          }
        }
      }
    }
  };
  two_stages(s0, s1, load, multiply, store);
  mma_tile_store<T>(acc, m0 + wm0, n0 + wn * 32, g, tig, rows, n, partial, Y, y_f32, ldy);
}
