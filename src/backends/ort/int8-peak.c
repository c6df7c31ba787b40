/*
 * The machine's int8 multiply-add throughput, measured: the physical limit of ragguard's block products
 * (qmatmul.c) and of any other int8 CPU kernel here, against which benchmarks put prefill tokens/s.
 * Why measured: a nominal figure (cores x instructions a cycle x the clock /proc/cpuinfo gives) assumes
 * how many AVX512-VNNI instructions a core retires a cycle (Intel's server cores: two, on ports 0 and 5;
 * AMD's Zen 4: one 512-bit, split over its two 256-bit pipes) and a clock a hypervisor may not give.
 *
 * Each thread runs VPDPBUSD (64 unsigned x signed int8 products summed into 16 int32 lanes) on 16
 * independent accumulators, so neither the instruction's latency nor memory limits it: what it sustains
 * is the core's int8 multiply-add peak. Built into libragguard-ops.so beside the ONNX Runtime ops
 * (scripts/setup.sh); read through koffi by src/backends/ort/int8-peak.ts.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "qmatmul.h"

#define CHAINS 16

typedef struct {
  int64_t iters;
  double seconds;
  int32_t sink; /* the accumulators' sum, stored so that the loop's results are used */
} run_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Inputs the compiler cannot see through, so that the loop is not folded away. */
static volatile int32_t seed_a = 0x01020304, seed_b = 0x05060708;

__attribute__((target("avx512f,avx512vnni"))) static void* vnni_loop(void* arg) {
  run_t* r = (run_t*)arg;
  const __m512i a = _mm512_set1_epi32(seed_a), b = _mm512_set1_epi32(seed_b);
  __m512i acc[CHAINS];
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_epi32(i);
  const double t0 = now_s();
  for (int64_t n = 0; n < r->iters; n++) {
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  r->seconds = now_s() - t0;
  __m512i sum = acc[0];
  for (int i = 1; i < CHAINS; i++) sum = _mm512_add_epi32(sum, acc[i]);
  r->sink = _mm512_reduce_add_epi32(sum);
  return NULL;
}

static void* amx_loop(void* arg) {
  run_t* r = (run_t*)arg;
  const double t0 = now_s();
  r->sink = qm_amx_peak_loop(r->iters);
  r->seconds = now_s() - t0;
  return NULL;
}

/* `threads` threads running `loop` at once, `iters` rounds each of `per_round` multiply-adds: their rates
 * (each thread's count over its own time) summed; 0 where a thread could not start. At most 256 threads. */
static double run_threads(void* (*loop)(void*), int32_t threads, int64_t iters, double per_round) {
  if (threads < 1 || threads > 256 || iters < 1) return 0;
  pthread_t ids[256];
  run_t runs[256];
  int started = 0;
  for (; started < threads; started++) {
    runs[started] = (run_t){.iters = iters};
    if (pthread_create(&ids[started], NULL, loop, &runs[started]) != 0) break;
  }
  double per_s = 0;
  for (int i = 0; i < started; i++) {
    pthread_join(ids[i], NULL);
    per_s += (double)iters * per_round / runs[i].seconds;
  }
  return started == threads ? per_s : 0;
}

/*
 * Int8 multiply-adds a second summed over `threads` threads running at once, each `iters` rounds of
 * CHAINS VPDPBUSD; 0 where AVX512-VNNI is missing or a thread could not start. At most 256 threads.
 */
double ragguard_int8_peak(int32_t threads, int64_t iters) {
  if (!qm_cpu_vnni()) return 0;
  return run_threads(vnni_loop, threads, iters, CHAINS * 64.0);
}

/*
 * The same on AMX (where qm_amx: the CPU has it and Linux grants the tile state), each round 4 TDPBSUD of
 * 16 x 16 x 64 multiply-adds: the peak of products of 16 rows or more there. A TDPBSUD costs the same at
 * any depth, so a product in blocks of 32 reaches half of it at most. 0 where AMX does not run.
 */
double ragguard_amx_int8_peak(int32_t threads, int64_t iters) {
  if (!qm_amx()) return 0;
  return run_threads(amx_loop, threads, iters, 4 * 16 * 16 * 64.0);
}
