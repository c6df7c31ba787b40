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
// 64-row tile, 102 for the 32-row one) so that 12-20 warps hide each other's loads; unbounded, ptxas gave the
// 64-row Q6_K and Q5_0 kernels 211-230 (8 warps). The 32-row tile fits 5 (89-96 registers, 37 KB of shared
// memory) since X's tile goes to shared memory by cp.async, without registers.
constexpr int qmmq_min_ctas(int bm) { return bm == 64 ? 3 : 5; }
// Products of up to this many rows (wide decode batches, short prefills) take qmmq_kernel; longer ones stay on
// qmma_kernel. Why: the scales cost a few float operations for every output and block of 32 (a prefill's
// share grows with its rows), where qmma_kernel decodes each unit once for 64 rows and leaves the rest to the
// tensor cores: on the H100 a 1,536-row prefill of a 7B Q4_K_M took 0.197 s here against 0.161 s there,
// while at 24-32 rows this one was the faster.
constexpr int QMMQ_MAX_ROWS = 64;
// Products of up to this many rows take the 32-row tile (two or more M tiles of it past 32 rows), longer ones
// the 64-row tile. A build-time setting (-DQMMQ_TILE32_ROWS=64) so that the device runs can time both.
#ifndef QMMQ_TILE32_ROWS
#define QMMQ_TILE32_ROWS 32
#endif
// The shared tiles hold each unit's 32 bytes with its words interleaved (0 4 1 5 2 6 3 7): the two words an
// m16n8k32 fragment takes from a row (tig and tig + 4) are one 8-byte load. Rows padded by 32 bytes (40
// words): the four rows of a half warp's 8-byte loads fall in 32 distinct banks. X's blocks arrive
// interleaved (quantize_x_i8_kernel's `interleaved`) and are copied as they are, by cp.async.
constexpr int QMMQ_LDS = QMMQ_BK + 32;
__device__ __forceinline__ uint2 lds64(const int8_t* p) { return *reinterpret_cast<const uint2*>(p); }
// A unit's words 0-3 (a) and 4-7 (b) interleaved into the 32 bytes at dst, as two 16-byte stores; `flip`
// stores the second half first. Why: a 16-byte store is done 8 lanes at a time, and with rows 160 bytes
// apart the first halves of the units that 8 lanes store fall in the same 16-byte bank groups twice over
// (a 2-way conflict on every store); lanes that flip fill the other groups.
__device__ __forceinline__ void sts_unit(int8_t* dst, uint4 a, uint4 b, bool flip) {
  const uint4 lo = make_uint4(a.x, b.x, a.y, b.y), hi = make_uint4(a.z, b.z, a.w, b.w);
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[flip] = flip ? hi : lo;
  d[!flip] = flip ? lo : hi;
}
constexpr int QMMQ_WU = QMMQ_BN * QMMQ_UNITS / QMMQ_THREADS;  // units of W a thread unpacks a step
static_assert(QMMQ_WU == 2 && QMMQ_UNITS % QMMQ_WU == 0, "W tile split: a thread's two adjacent units of a row");

// cp.async of 16 (or 8) bytes from global to shared memory; `ok` false fills the destination with zeros
// (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool ok) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Units u and u + 1 of W (u even: one K-quant super-block) with as few loads as their planes allow: the two
// units' scales are one 4-byte load, their super-block's header one load, their quantized bytes contiguous.
// Why: a unit's own 2-byte scale load used 2 of a sector's 32 bytes, and the profile of the 32-row tile
// (7B Q4_K) showed 12.3 of 32 bytes used per sector over the kernel's global loads.
template <int TY> __device__ __forceinline__ void unit_load_pair(const QPlanes& p, size_t u, UnitRaw (&r)[2]) {
  unit_load<TY>(p, u, r[0]);
  unit_load<TY>(p, u + 1, r[1]);
}
// The pair's two 2-byte scales (S) as one 4-byte load (u even: 4-byte aligned).
__device__ __forceinline__ void pair_scales(const QPlanes& p, size_t u, UnitRaw (&r)[2]) {
  const uint32_t s = ld_u32(p.s + 2 * u);
  r[0].s = s & 0xffffu;
  r[1].s = s >> 16;
}
template <> __device__ __forceinline__ void unit_load_pair<QT_Q8_0>(const QPlanes& p, size_t u, UnitRaw (&r)[2]) {
  pair_scales(p, u, r);
  const uint4* q = reinterpret_cast<const uint4*>(p.q + u * 32);
  r[0].q[0] = __ldg(q);
  r[0].q[1] = __ldg(q + 1);
  r[1].q[0] = __ldg(q + 2);
  r[1].q[1] = __ldg(q + 3);
}
template <> __device__ __forceinline__ void unit_load_pair<QT_Q4_0>(const QPlanes& p, size_t u, UnitRaw (&r)[2]) {
  pair_scales(p, u, r);
  const uint4* q = reinterpret_cast<const uint4*>(p.q + u * 16);
  r[0].q[0] = __ldg(q);
  r[1].q[0] = __ldg(q + 1);
}
// Q4_K: Q4_0's planes (16 bytes and a 2-byte scale a unit) and the super-block's d and dmin.
template <> __device__ __forceinline__ void unit_load_pair<QT_Q4_K>(const QPlanes& p, size_t u, UnitRaw (&r)[2]) {
  unit_load_pair<QT_Q4_0>(p, u, r);
  r[0].h = r[1].h = ld_u32(p.h + 4 * (u >> 3));
}
// Q6_K: the pair's 48 bytes (16-byte aligned for u even) as three 16-byte loads.
template <> __device__ __forceinline__ void unit_load_pair<QT_Q6_K>(const QPlanes& p, size_t u, UnitRaw (&r)[2]) {
  pair_scales(p, u, r);
  r[0].h = r[1].h = ld_u16(p.h + 2 * (u >> 3));
  const uint4* q = reinterpret_cast<const uint4*>(p.q + u * 24);
  const uint4 a = __ldg(q), b = __ldg(q + 1), c = __ldg(q + 2);
  r[0].q[0] = a;
  r[0].q[1].x = b.x;
  r[0].q[1].y = b.y;
  r[1].q[0] = make_uint4(b.z, b.w, c.x, c.y);
  r[1].q[1].x = c.z;
  r[1].q[1].y = c.w;
}

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
  __shared__ __align__(16) int8_t As[2][BM][QMMQ_LDS];
  __shared__ __align__(16) int8_t Bs[2][QMMQ_BN][QMMQ_LDS];
  __shared__ __align__(16) float2 Xs[2][BM][QMMQ_UNITS];  // (dx, dx x sum) of a row's block
  // (d0, m), or Q6_K's (d0, d1), of a W row's unit; unit-major, so that a lane's two columns are one load.
  // Units 2 and 3 keep column c at c ^ 8 (ws_col), so that a half warp's stores (8 rows of units u and u + 2)
  // fill 32 banks. Not padded: the 64-row tile's static shared memory is 48 KB to the byte.
  __shared__ __align__(16) float2 Ws[2][QMMQ_UNITS][QMMQ_BN];
  auto ws_col = [](int u, int c) { return c ^ ((u & 2) << 2); };
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
  // W's units of step s into registers (out-of-range units clamped to the row's last pair: k % 64 == 0).
  auto load_w = [&](int s) { unit_load_pair<TY>(W, wrow + min(s * QMMQ_UNITS + wu0, upr - 2), raw); };
  // X's blocks and their scales of step s straight into shared buffer buf (cp.async, no registers): block u
  // of row r, adjacent threads a row's adjacent blocks. Rows past X's (a tile's padding) and blocks past k
  // are zeros. The halves of a block are copied in the order that keeps 8 lanes' 16-byte writes in distinct
  // banks (sts_unit's `flip`: rows r and r + 1 of a lane group alternate).
  auto load_x = [&](int s, int buf) {
#pragma unroll
    for (int j = 0; j < XU; ++j) {
      const int i = tid + j * QMMQ_THREADS, r = i / QMMQ_UNITS, uu = i % QMMQ_UNITS, u = s * QMMQ_UNITS + uu, gm = m0 + r;
      const bool ok = gm < rows && u < upr;
      const size_t b = ok ? (size_t)gm * upr + u : 0;
      const int8_t* src = xq + b * 32;
      int8_t* dst = &As[buf][r][uu * 32];
      const int h = r & 1;
      cp_async16(dst + 16 * h, src + 16 * h, ok);
      cp_async16(dst + 16 * (h ^ 1), src + 16 * (h ^ 1), ok);
      cp_async8(&Xs[buf][r][uu], xd + b, ok);
    }
    cp_async_commit();
  };
  auto store_w = [&](int s, int buf) {
    // Lane groups of 8 hold rows wr .. wr + 3, and rows 2-3 of each group store their units' halves flipped.
    const bool flip = (wr >> 1) & 1;
#pragma unroll
    for (int w = 0; w < QMMQ_WU; ++w) {
      UnitI8 u;
      unit_i8<TY>(raw[w], u);
      const int uu = wu0 + w;
      sts_unit(&Bs[buf][wr][uu * 32], make_uint4(u.q[0], u.q[1], u.q[2], u.q[3]), make_uint4(u.q[4], u.q[5], u.q[6], u.q[7]), flip);
      // A padded row or unit multiplies by zero scales (its integers are a real unit's: finite).
      const bool ok = row_ok && s * QMMQ_UNITS + uu < upr;
      Ws[buf][uu][ws_col(uu, wr)] = ok ? make_float2(u.d0, i8_halves(TY) ? u.d1 : u.m) : make_float2(0.f, 0.f);
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
        const float4 sc = *reinterpret_cast<const float4*>(&Ws[cur][u][ws_col(u, c) + 2 * tig]);  // columns 2 tig, 2 tig + 1
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
  // Two stages: while the warps multiply one step's tiles, the next step's X is copied by cp.async and its
  // units of W loaded, then unpacked and stored after the products. s0 < s1 for every split the host
  // launches; `more` is the CTA's alike, so no thread skips a barrier.
  if (s0 < s1) {
    load_w(s0);
    load_x(s0, 0);
    store_w(s0, 0);
    cp_async_wait_all();
    __syncthreads();
  }
  for (int s = s0; s < s1; ++s) {
    const int cur = (s - s0) & 1;
    const bool more = s + 1 < s1;
    // The other buffer was last read in the step before, whose barrier every thread has passed.
    if (more) {
      load_w(s + 1);
      load_x(s + 1, cur ^ 1);
    }
    multiply(cur);
    if (more) store_w(s + 1, cur ^ 1);
    cp_async_wait_all();
    __syncthreads();
  }
  mma_tile_store<T>(acc, m0 + wm0, n0 + wn * 32, g, tig, rows, n, partial, Y, y_f32, ldy);
}
