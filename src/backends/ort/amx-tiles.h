/*
 * The AMX tile configuration both prefill paths load (qmatmul.c's int8 products, qmatmul-bf16.c's
 * bfloat16 ones): tiles 0-3 hold 16 x 16 sums of 32 bits, 4 and 5 rows of x, 6 and 7 weights; loaded for
 * a product and left as found. Included by those two files (static functions: each compiles its own).
 */
#ifndef RAGGUARD_AMX_TILES_H
#define RAGGUARD_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AMX_TILES_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,amx-tile,amx-int8")))

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) amx_config;

/*
 * LDTILECFG and STTILECFG with the whole 64 bytes as their memory operand. GCC 12's _tile_loadconfig and
 * _tile_storeconfig name only the first 8 bytes (a void*) as read or written, so the compiler may drop the
 * stores of the rows and column widths before a load (it did at -O2 here: amx_begin loaded palette 1 with
 * every tile 0 x 0, and the first TILEZERO faulted), and does not know a store wrote the rest.
 */
AMX_TILES_TARGET static inline void tile_loadconfig(const amx_config* c) { __asm__ volatile("ldtilecfg %0" : : "m"(*c)); }
AMX_TILES_TARGET static inline void tile_storeconfig(amx_config* c) { __asm__ volatile("sttilecfg %0" : "=m"(*c)); }

/* x bytes (k) a TDPBSUD takes: a block, or 64 of a longer one (a tile row is 64 bytes at most). */
static inline int64_t amx_step(int64_t blk) { return blk < 64 ? blk : 64; }

/*
 * The thread's tile configuration is left as we found it. Our products run on whatever thread ONNX Runtime
 * gives them, and in a process that also runs llama.cpp (node-llama-cpp in process: bench/gguf.ts) that
 * thread may run ggml's AMX kernels too; those load a thread's tile configuration once and assume it stays
 * (ggml_tile_config_init), so a TILERELEASE of ours left the thread unconfigured and ggml's next tile load
 * faulted (SIGILL). amx_begin stores the configuration in force (STTILECFG: all zeros, palette 0, where none
 * is) into `saved` before loading ours; amx_end loads it back, or releases the tiles where there was none.
 * Only the configuration comes back: loading a configuration zeroes the tile data, so whatever a caller's
 * tiles held is gone, which ggml does not mind (its kernels load their tiles' data afresh on every call,
 * only the configuration is kept from one call to the next).
 */
/* tiles 0-3: sums [16][16] int32; 4, 5: x [16 rows][step bytes]; 6, 7: weights [step / 4 quads][64]. */
AMX_TILES_TARGET static inline void amx_begin(int64_t step, amx_config* saved) {
  amx_config c __attribute__((aligned(64)));
  tile_storeconfig(saved);
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 4; t++) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = 4; t < 6; t++) c.rows[t] = 16, c.colsb[t] = (uint16_t)step;
  for (int t = 6; t < 8; t++) c.rows[t] = (uint8_t)(step / 4), c.colsb[t] = 64;
  tile_loadconfig(&c);
}

/* The configuration amx_begin found back in force (`saved`, 64-byte aligned), or the tiles released where none was. */
AMX_TILES_TARGET static inline void amx_end(const amx_config* saved) {
  if (saved->palette) tile_loadconfig(saved);
  else _tile_release();
}
#endif
