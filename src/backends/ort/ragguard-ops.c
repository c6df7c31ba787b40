/*
 * ragguard's ONNX Runtime custom-op library (domain "ragguard"), loaded into a session by
 * RegisterCustomOpsLibrary_V2 (ort-direct.ts). Four ops:
 *
 *   QMatMul8(A float [.., K], B uint8 [G, K / 4, 64], scales float [G, K / block_size, 16],
 *            bias float [N], XA float [B, S, R], LB float [B or 1, R, N], GA, GB, UA, UB (SwiGlu's, below;
 *            activation 1 only) (all from bias optional))
 *            -> Y float [.., N];  attributes K, N, block_size, activation (0, or 1: Y [.., N / 2]);
 *            G = ceil(N / 16)
 *
 *   QMatMul4(A float [.., K], B uint8 [G, K / 8, 64], scales float [G, K / block_size, 16],
 *            offsets float [G, K / block_size, 16], bias, XA, LB, GA, GB, UA, UB (optional, as QMatMul8's))
 *            -> Y float [.., N]
 *
 *            Y = A W (+ bias) (+ XA LB: the LoRA term, XA = A times each row's A, LB each row's B; none
 *            at rank 0); with activation 1, Y = silu(gate + GA GB) (up + UA UB) of that product's halves
 *            (gate, up), as SwiGlu computes it
 *
 *   SwiGlu(GU float [B, S, 2I], GA [B, S, R], GB [B or 1, R, I], UA [B, S, R], UB [B or 1, R, I] (the four optional))
 *            -> Y float [B, S, I]: the MLP's activation silu(gate + GA GB) (up + UA UB) (below)
 *
 *   GroupQueryAttention(query [B, S, (N + 2 Nkv) D], '', '', past_key, past_value, seqlens_k, total_sequence_length,
 *            cos_cache, sin_cache) -> output, present_key, present_value: com.microsoft's for a packed query,
 *            the causal half only, by attention.c (below)
 *
 * QMatMul8 and QMatMul4 are the products MatMulNBits (com.microsoft) computes at accuracy level 4 for
 * bits 8 without zero points (128) and for bits 4 with them (as offsets, with a block's min where it has
 * one), by the kernels in qmatmul.c, with the weights 16 columns side by side
 * (qmatmul.h says how; the converter writes them so: qmatmul-layout.ts); prefills of 128 rows or more
 * by qmatmul-bf16.c's on AMX-BF16 where it runs (x and the weights in bfloat16: computeBf16 below,
 * nearer the exact product than MatMulNBits' int8 activations, not its numbers). Column groups are shared out
 * over the session's intra-op threads (KernelContext_ParallelFor): the ops add no thread of their own.
 *
 * Only what this file uses of onnxruntime_c_api.h is declared here: the OrtApi function table is read
 * by slot (its order never changes; before loading this library ort-direct.ts checks slot 254, past all
 * used here but ParallelFor's, whose use every test of the ops exercises) and OrtCustomOp is laid out as
 * the header's version 16 of it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "attention.h"
#include "qmatmul.h"
#include "vexp.h"

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef void* const* OrtApiTable;

typedef struct {
  OrtApiTable (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

/* The API version this library asks for: one with KernelContext_ParallelFor (onnxruntime-node ships 1.30's). */
#define API_VERSION 18
enum {
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ELEMENT_FLOAT = 1,
  ELEMENT_UINT8 = 2,
  ELEMENT_INT32 = 6,
  CHARACTERISTIC_REQUIRED = 0,
  CHARACTERISTIC_OPTIONAL = 1,
};

/* OrtApi slots (onnxruntime_c_api.h order). */
enum {
  S_CreateStatus = 0,
  S_CreateCustomOpDomain = 26,
  S_CustomOpDomain_Add = 27,
  S_AddCustomOpDomain = 28,
  S_GetTensorMutableData = 51,
  S_GetDimensionsCount = 61,
  S_GetDimensions = 62,
  S_GetTensorTypeAndShape = 65,
  S_CreateCpuMemoryInfo = 69,
  S_KernelInfoGetAttribute_float = 85,
  S_KernelInfoGetAttribute_int64 = 86,
  S_KernelContext_GetInputCount = 88,
  S_KernelContext_GetInput = 90,
  S_KernelContext_GetOutput = 91,
  S_ReleaseStatus = 93,
  S_ReleaseTensorTypeAndShapeInfo = 99,
  S_ReleaseAllocator = 132,
  S_KernelContext_GetAllocator = 253,
  S_KernelContext_ParallelFor = 274,
};

static OrtApiTable api;
/* The CPU's memory info (OrtDeviceAllocator, OrtMemTypeDefault), made at registration, kept for the process's life. */
static OrtMemoryInfo* cpuMemory;
#define API(slot, type) ((type)api[slot])

typedef OrtStatus* (*CreateStatusFn)(int code, const char* msg);
typedef OrtStatus* (*CreateDomainFn)(const char* domain, OrtCustomOpDomain** out);
typedef OrtStatus* (*DomainAddFn)(OrtCustomOpDomain* domain, const void* op);
typedef OrtStatus* (*AddDomainFn)(OrtSessionOptions* options, OrtCustomOpDomain* domain);
typedef OrtStatus* (*MutableDataFn)(OrtValue* value, void** out);
typedef OrtStatus* (*DimsCountFn)(const OrtTensorTypeAndShapeInfo* info, size_t* out);
typedef OrtStatus* (*DimsFn)(const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t n);
typedef OrtStatus* (*TypeAndShapeFn)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*AttrInt64Fn)(const OrtKernelInfo* info, const char* name, int64_t* out);
typedef OrtStatus* (*AttrFloatFn)(const OrtKernelInfo* info, const char* name, float* out);
typedef void (*ReleaseStatusFn)(OrtStatus* status);
typedef OrtStatus* (*InputCountFn)(const OrtKernelContext* ctx, size_t* out);
typedef OrtStatus* (*GetInputFn)(const OrtKernelContext* ctx, size_t index, const OrtValue** out);
typedef OrtStatus* (*GetOutputFn)(OrtKernelContext* ctx, size_t index, const int64_t* dims, size_t n, OrtValue** out);
typedef void (*ReleaseInfoFn)(OrtTensorTypeAndShapeInfo* info);
/* ONNX Runtime's allocator interface (onnxruntime_c_api.h's OrtAllocator, its first members). */
typedef struct OrtAllocator {
  uint32_t version;
  void* (*Alloc)(struct OrtAllocator* self, size_t size);
  void (*Free)(struct OrtAllocator* self, void* p);
} OrtAllocator;
typedef OrtStatus* (*CpuMemoryInfoFn)(int allocatorType, int memType, OrtMemoryInfo** out);
typedef OrtStatus* (*GetAllocatorFn)(const OrtKernelContext* ctx, const OrtMemoryInfo* info, OrtAllocator** out);
typedef void (*ReleaseAllocatorFn)(OrtAllocator* allocator);
typedef OrtStatus* (*ParallelForFn)(const OrtKernelContext* ctx, void (*fn)(void*, size_t), size_t total, size_t batches, void* data);

#define TRY(expr)                 \
  do {                            \
    OrtStatus* status_ = (expr);  \
    if (status_) return status_;  \
  } while (0)

static OrtStatus* fail(int code, const char* msg) { return API(S_CreateStatus, CreateStatusFn)(code, msg); }

/* OrtCustomOp, version 16 of its layout. */
typedef struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct OrtCustomOp* op, OrtApiTable api, const OrtKernelInfo* info);
  const char* (*GetName)(const struct OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const struct OrtCustomOp* op);
  int (*GetInputType)(const struct OrtCustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp* op);
  int (*GetOutputType)(const struct OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp* op);
  void (*KernelCompute)(void* kernel, OrtKernelContext* ctx);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const struct OrtCustomOp* op, size_t index);
  int (*GetOutputCharacteristic)(const struct OrtCustomOp* op, size_t index);
  int (*GetInputMemoryType)(const struct OrtCustomOp* op, size_t index);
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const struct OrtCustomOp* op, OrtApiTable api, const OrtKernelInfo* info, void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* ctx);
} OrtCustomOp;

/* A QMatMul8 or QMatMul4 node: its attributes (glu: activation 1, the MLP's silu(gate) up over its two halves). */
typedef struct {
  int bits, glu;
  int64_t k, n, blk;
} Kernel;

/* An optional int attribute: `fallback` where the node has none. */
static void attrOr(const OrtKernelInfo* info, const char* name, int64_t fallback, int64_t* out) {
  OrtStatus* s = API(S_KernelInfoGetAttribute_int64, AttrInt64Fn)(info, name, out);
  if (s) {
    API(S_ReleaseStatus, ReleaseStatusFn)(s);
    *out = fallback;
  }
}

static OrtStatus* create(int bits, const OrtKernelInfo* info, void** out) {
  Kernel q = {.bits = bits};
  int64_t activation;
  TRY(API(S_KernelInfoGetAttribute_int64, AttrInt64Fn)(info, "K", &q.k));
  TRY(API(S_KernelInfoGetAttribute_int64, AttrInt64Fn)(info, "N", &q.n));
  TRY(API(S_KernelInfoGetAttribute_int64, AttrInt64Fn)(info, "block_size", &q.blk));
  attrOr(info, "activation", 0, &activation);
  if (q.n <= 0 || !qm_supported(q.k, q.blk)) return fail(ORT_INVALID_ARGUMENT, "QMatMul: block_size must be a power of two from 16 that divides K, N > 0");
  if (activation != 0 && (activation != 1 || q.n % 32 != 0))
    return fail(ORT_INVALID_ARGUMENT, "QMatMul: activation is 0 (none) or 1 (silu(gate) up over the two halves of N, each a multiple of 16)");
  q.glu = activation == 1;
  Kernel* kernel = malloc(sizeof *kernel);
  if (!kernel) return fail(ORT_FAIL, "QMatMul: out of memory");
  *kernel = q;
  *out = kernel;
  return NULL;
}

static OrtStatus* create8(const OrtCustomOp* op, OrtApiTable a, const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)a;
  return create(8, info, out);
}

static OrtStatus* create4(const OrtCustomOp* op, OrtApiTable a, const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)a;
  return create(4, info, out);
}

static void destroy(void* kernel) { free(kernel); }

/* A tensor's shape (at most 8 dimensions). */
static OrtStatus* shapeOf(const OrtValue* v, int64_t* dims, size_t* rank) {
  OrtTensorTypeAndShapeInfo* info = NULL;
  TRY(API(S_GetTensorTypeAndShape, TypeAndShapeFn)(v, &info));
  OrtStatus* s = API(S_GetDimensionsCount, DimsCountFn)(info, rank);
  if (!s && *rank > 8) s = fail(ORT_INVALID_ARGUMENT, "QMatMul: more than 8 dimensions");
  if (!s) s = API(S_GetDimensions, DimsFn)(info, dims, *rank);
  API(S_ReleaseTensorTypeAndShapeInfo, ReleaseInfoFn)(info);
  return s;
}

/* Whether `v` has exactly the dims d0..d(rank-1). */
static OrtStatus* expect(const OrtValue* v, size_t rank, const int64_t* want, const char* what) {
  int64_t dims[8];
  size_t r = 0;
  TRY(shapeOf(v, dims, &r));
  int same = r == rank;
  for (size_t i = 0; same && i < rank; i++) same = dims[i] == want[i];
  return same ? NULL : fail(ORT_INVALID_ARGUMENT, what);
}

/* The LoRA term's factors beside an input x of shape `dims` (`rank` of them): x A [B, S, R] and B
 * [B or 1, R, n]. B's batch is x's (an adapter entry a row) or 1 (one for all, or none: lora-feeds.ts
 * broadcasts it). QMatMul and SwiGlu take them alike. */
typedef struct {
  int64_t rank, perBatch; /* R, and x's rows a batch entry (S) */
  int shared;             /* one B for every row */
  int64_t a[3], b[3];     /* x A's and B's shapes */
} LoraShape;

static OrtStatus* loraShape(const OrtValue* xa, const OrtValue* b, const int64_t* dims, size_t rank, int64_t n, const char* misfit, LoraShape* s) {
  size_t ar = 0, br = 0;
  int64_t ad[8], bd[8];
  TRY(shapeOf(xa, ad, &ar));
  TRY(shapeOf(b, bd, &br));
  if (rank != 3 || ar != 3 || br != 3 || ad[0] != dims[0] || ad[1] != dims[1] || (bd[0] != dims[0] && bd[0] != 1) || bd[2] != n || bd[1] != ad[2])
    return fail(ORT_INVALID_ARGUMENT, misfit);
  for (int i = 0; i < 3; i++) s->a[i] = ad[i], s->b[i] = bd[i];
  s->rank = ad[2];
  s->perBatch = dims[1] > 0 ? dims[1] : 1;
  s->shared = bd[0] == 1;
  return NULL;
}

/* The activation's LoRA terms (t: GA, GB, UA, UB) beside an input of shape `dims`: GA and GB as loraShape
 * takes x A and B (`inter` columns), UA and UB of their shapes. SwiGlu and QMatMul's activation alike. */
static OrtStatus* gluTerms(const char* op, const OrtValue* const t[4], const int64_t* dims, size_t rank, int64_t inter, const char* misfit, LoraShape* s) {
  char msg[64];
  TRY(loraShape(t[0], t[1], dims, rank, inter, misfit, s));
  snprintf(msg, sizeof msg, "%s: UA is not GA's shape", op);
  TRY(expect(t[2], 3, s->a, msg));
  snprintf(msg, sizeof msg, "%s: UB is not GB's shape", op);
  return expect(t[3], 3, s->b, msg);
}

/*
 * RAGGUARD_OPS_HUGE_OUTPUTS=1 (opt-in): an output of 8 MiB or more (a
 * prefill's products: 80 MB for gate and up at 2,048 tokens) advised onto 2 MiB pages where the kernel
 * gives them (transparent huge pages on `madvise`, as here). ONNX Runtime hands each run fresh memory,
 * which the product then faults in 4 KiB at a time: on one core, 2,048 rows of the 896 x 9,728 product
 * took 111-114 ms into memory already touched, 143-146 into fresh memory, 112-116 with the advice (thread
 * CPU time). Only the 2 MiB-aligned inside of the block (every byte of it is written next); the advice
 * goes with the mapping when ONNX Runtime frees it. bench:prefill-cpu (the 1.5B, 2 Xeon cores): 22-25 %
 * more prompt tokens a second at 256-2,048 tokens, the largest resident set unchanged; but the server's
 * RAG-shaped requests no faster, so off by default (a fault in an advised region may wait for compaction).
 */
static void hugeOutput(void* y, size_t bytes) {
  static int off = -1;
  if (off < 0) {
    const char* env = getenv("RAGGUARD_OPS_HUGE_OUTPUTS");
    off = !(env && strcmp(env, "1") == 0);
  }
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (off || bytes < 4 * huge) return;
  const uintptr_t a0 = ((uintptr_t)y + huge - 1) & ~(huge - 1), a1 = ((uintptr_t)y + bytes) & ~(huge - 1);
#ifdef MADV_HUGEPAGE
  if (a1 > a0) (void)madvise((void*)a0, a1 - a0, MADV_HUGEPAGE);
#endif
}

typedef struct {
  const Kernel* kernel;
  const qm8_weight* w8;
  const qm4_weight* w4;
  const qm_rows* rows;
  float* y;
  int64_t groups, perTask;
  /* the LoRA term (optional): xa [m][rank] times each batch row's B ([B or 1][rank][n]) */
  const float *xa, *loraB;
  int64_t loraRank, perBatch;
  int bShared;
  /* rows a task takes (a chunk; m: all of them), and tasks across the groups of one chunk */
  int64_t rowsPerTask, groupTasks;
} Work;

static void task(void* data, size_t i) {
  const Work* work = data;
  const int64_t chunk = (int64_t)i / work->groupTasks;
  const int64_t g0 = ((int64_t)i % work->groupTasks) * work->perTask;
  const int64_t g1 = g0 + work->perTask < work->groups ? g0 + work->perTask : work->groups;
  const int64_t m = work->rows->m, n = work->kernel->n, k = work->rows->k, nb = k / work->rows->blk;
  const int64_t i0 = chunk * work->rowsPerTask, i1 = i0 + work->rowsPerTask < m ? i0 + work->rowsPerTask : m;
  /* the chunk's rows as rows of their own: every kernel indexes rows from the start of xq, sx, xsum, xsumf and y */
  qm_rows part = *work->rows;
  part.m = i1 - i0;
  part.xq += i0 * k;
  part.sx += i0 * nb;
  part.xsum += i0 * nb;
  part.xsumf += i0 * nb;
  float* y = work->y + i0 * n;
  if (work->kernel->bits == 8) qm8_groups(work->w8, &part, y, g0, g1);
  else qm4_groups(work->w4, &part, y, g0, g1);
  /* the LoRA term on the columns just written, while they are in cache (a chunk of rows only where every
   * row takes the same B: compute() keeps whole rows otherwise, as a row's B follows its batch entry) */
  if (work->loraRank > 0) qm_add_product(y, i1 - i0, n, work->xa + i0 * work->loraRank, work->loraRank, work->loraB, work->perBatch, work->bShared, g0, g1);
}

/*
 * Rows a task takes. A prefill's rows of x (m x k bytes once quantized: 2 MB at 1,280 x 1,536, 11 MB at
 * 1,280 x 8,960) outgrow a core's L2, and a task of all rows and a few column groups read them all from
 * L3 again for every group: 1.1 GB a product for the MLP's gate and up at 1,280 tokens. A chunk of x of
 * a third of the core's L2 (16 to 512 rows, whole 16-row tiles) stays there while the chunk's column
 * groups pass, beside the task's weights. The weights are what each chunk reads again, so a chunk of few
 * rows costs too: the 1.5B's down projection (k 8,960) took chunks of 16 rows at a fixed 256 KB, its
 * 10 MB of weights and scales read 128 times a 2,048-token prefill, and ran 0.6 of the speed it reaches at
 * 64 rows (2 MB L2, Intel Xeon with AMX). Small products (decode steps, short prompts) keep every row in
 * one task, as does a LoRA term with a B a batch entry.
 */
static int64_t l2Bytes(void) {
  static int64_t bytes;
  if (bytes == 0) {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    /* 1 MB where the C library cannot tell (the smallest L2 of the CPUs with AVX512-VNNI) */
    bytes = l2 >= 256 * 1024 && l2 <= 64L * 1024 * 1024 ? (int64_t)l2 : 1024 * 1024;
  }
  return bytes;
}

/* Rows of rowBytes each (x as a kernel reads it), whole tiles of `tile` rows (a power of two). */
static int64_t rowChunk(int64_t m, int64_t rowBytes, int64_t tile, int loraByBatch) {
  if (m < 64 || loraByBatch) return m;
  int64_t rows = (l2Bytes() / 3 / rowBytes) & ~(tile - 1);
  rows = rows < tile ? tile : rows > 512 ? 512 : rows;
  return rows >= m ? m : rows;
}

/* Rows of x to quantize: tasks of perTask rows (about 64 K values). */
typedef struct {
  qm_rows* rows;
  const float* x;
  int64_t perTask;
} Quant;

static void quantTask(void* data, size_t i) {
  const Quant* q = data;
  const int64_t i0 = (int64_t)i * q->perTask, i1 = i0 + q->perTask < q->rows->m ? i0 + q->perTask : q->rows->m;
  qm_rows_quantize(q->rows, q->x, i0, i1);
}

/*
 * A product on AMX-BF16 (qmatmul-bf16.c: prefills of QM_BF16_MIN_ROWS rows or more where it runs), in
 * passes over the threads: x's rows converted to bfloat16; then, a slab of column groups at a time, the
 * slab's weights dequantized (a pair of groups a task) and its products (a chunk of rows by a pair of
 * groups a task, chunks of x of a third of L2, whole 32-row steps). The slab (BF16_SLAB_BYTES) keeps the
 * dequantized weights few MB whatever N, near the cache for the products that read them next.
 */
#define BF16_SLAB_BYTES ((size_t)8 << 20)

/* A product as compute() hands it to product(): its operands (both paths read them), then the AMX-BF16
 * path's own state (computeBf16 fills it). */
typedef struct {
  const Kernel* kernel;
  const qm8_weight* w8;
  const qm4_weight* w4;
  const float* x;
  float* y;
  /* m: x's rows; m32: the bfloat16 rows, whole 32-row steps (those from m zero) */
  int64_t m, m32;
  uint16_t *xb, *wb;
  /* rows a conversion task takes; the slab's groups; rows a product task takes, and its pairs of groups */
  int64_t convertRows, slab0, slab1, rowsPerTask, pairTasks;
  const float *xa, *loraB;
  int64_t loraRank, perBatch;
  int bShared;
  /* glu: y is the activation (qm_bf16_glu), the slab holds gate's groups [slab0, slab1) then up's (half groups on) */
  int glu;
  int64_t half;
} ProductWork;

/* The group at position j of the slab. */
static int64_t slabGroup(const ProductWork* b, int64_t j) {
  if (!b->glu) return b->slab0 + j;
  const int64_t c = b->slab1 - b->slab0;
  return j < c ? b->slab0 + j : b->half + b->slab0 + j - c;
}

static void bf16ConvertTask(void* data, size_t i) {
  const ProductWork* b = data;
  const int64_t i0 = (int64_t)i * b->convertRows;
  qm_bf16_rows_convert(b->xb, b->x, b->m, b->kernel->k, i0, i0 + b->convertRows < b->m32 ? i0 + b->convertRows : b->m32);
}

/* Positions 2 i and 2 i + 1 of the slab (of `positions`). */
static void bf16WeightsTask(void* data, size_t i) {
  const ProductWork* b = data;
  const int64_t positions = (b->slab1 - b->slab0) * (b->glu ? 2 : 1);
  for (int64_t j = 2 * (int64_t)i; j < 2 * (int64_t)i + 2 && j < positions; j++) {
    const int64_t g = slabGroup(b, j);
    uint16_t* out = b->wb + j * b->kernel->k * 16;
    if (b->kernel->bits == 8) qm8_bf16_weights(b->w8, out, g, g + 1);
    else qm4_bf16_weights(b->w4, out, g, g + 1);
  }
}

/* glu: a chunk of rows by one of the slab's gate groups and its up group. */
static void bf16GluTask(void* data, size_t i) {
  const ProductWork* b = data;
  const int64_t k = b->kernel->k, c = b->slab1 - b->slab0, inter = b->half * 16;
  const int64_t i0 = ((int64_t)i / c) * b->rowsPerTask, i1 = i0 + b->rowsPerTask < b->m32 ? i0 + b->rowsPerTask : b->m32;
  const int64_t j = (int64_t)i % c;
  const float* bias = b->kernel->bits == 8 ? b->w8->bias : b->w4->bias;
  qm_bf16_glu(b->xb, b->m, k, i0, i1, b->wb + j * k * 16, b->wb + (c + j) * k * 16, inter, bias, bias ? bias + inter : NULL, b->y, b->slab0 + j);
}

static void bf16ProductTask(void* data, size_t i) {
  const ProductWork* b = data;
  const int64_t k = b->kernel->k, n = b->kernel->n;
  const int64_t i0 = ((int64_t)i / b->pairTasks) * b->rowsPerTask, i1 = i0 + b->rowsPerTask < b->m32 ? i0 + b->rowsPerTask : b->m32;
  const int64_t g0 = b->slab0 + 2 * ((int64_t)i % b->pairTasks), g1 = g0 + 2 < b->slab1 ? g0 + 2 : b->slab1;
  const float* bias = b->kernel->bits == 8 ? b->w8->bias : b->w4->bias;
  qm_bf16_groups(b->xb, b->m, k, i0, i1, b->wb + (g0 - b->slab0) * k * 16, n, bias, b->y, g0, g1);
  /* the LoRA term on the columns just written (rows of the chunk below m), as task() adds it */
  const int64_t rows = (i1 < b->m ? i1 : b->m) - i0;
  if (b->loraRank > 0 && rows > 0)
    qm_add_product(b->y + i0 * n, rows, n, b->xa + i0 * b->loraRank, b->loraRank, b->loraB, b->perBatch, b->bShared, g0, g1);
}

static OrtStatus* computeBf16(OrtKernelContext* ctx, OrtAllocator* alloc, ProductWork* b) {
  const int64_t k = b->kernel->k, m32 = b->m32 = (b->m + 31) & ~(int64_t)31;
  /* glu: the slab's groups are gate's and as many of up's, so it steps over gate's (half) groups */
  const int64_t groups = b->glu ? b->half : (b->kernel->n + 15) / 16;
  int64_t slabGroups = (int64_t)(BF16_SLAB_BYTES / qm_bf16_group_bytes(k) / (b->glu ? 2 : 1)) & ~(int64_t)1;
  if (slabGroups < 2) slabGroups = 2;
  if (slabGroups > groups) slabGroups = groups;
  const size_t xBytes = (qm_bf16_rows_bytes(b->m, k) + 63) & ~(size_t)63;
  /* x's bfloat16 rows and the slab's weights from the session's allocator: the one the guards account */
  char* mem = alloc->Alloc(alloc, xBytes + (size_t)(slabGroups * (b->glu ? 2 : 1)) * qm_bf16_group_bytes(k));
  if (!mem) return fail(ORT_FAIL, "QMatMul: out of memory");
  b->xb = (uint16_t*)mem;
  b->wb = (uint16_t*)(mem + xBytes);
  b->convertRows = (65536 + k - 1) / k;
  /* chunks of bfloat16 rows as task() takes int8 ones (whole rows where the LoRA term has a B a batch row) */
  b->rowsPerTask = rowChunk(m32, 2 * k, 32, b->loraRank > 0 && !b->bShared);
  const int64_t chunks = (m32 + b->rowsPerTask - 1) / b->rowsPerTask;
  OrtStatus* s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, bf16ConvertTask, (size_t)((m32 + b->convertRows - 1) / b->convertRows), 0, b);
  for (int64_t g = 0; !s && g < groups; g += slabGroups) {
    b->slab0 = g;
    b->slab1 = g + slabGroups < groups ? g + slabGroups : groups;
    b->pairTasks = (b->slab1 - b->slab0 + 1) / 2;
    const int64_t c = b->slab1 - b->slab0;
    s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, bf16WeightsTask, (size_t)(b->glu ? c : b->pairTasks), 0, b);
    if (!s && b->glu) s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, bf16GluTask, (size_t)(chunks * c), 0, b);
    else if (!s) s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, bf16ProductTask, (size_t)(chunks * b->pairTasks), 0, b);
  }
  alloc->Free(alloc, mem);
  return s;
}

/* The glu pass over a gate-and-up product `gu` [rows, 2 inter] into y (ragguard-ops' SwiGlu; its terms optional: rank 0). */
static OrtStatus* gluRows(OrtKernelContext* ctx, const float* gu, const float* const terms[4], float* y, int64_t inter, int64_t rows, int64_t rank,
                          int64_t perBatch, int bShared);

/* The product y = x W (+ bias) (+ the LoRA term) on the int8 kernels or AMX-BF16, or with glu its activation on AMX-BF16 (b->glu). */
static OrtStatus* product(OrtKernelContext* ctx, OrtAllocator* alloc, ProductWork* b) {
  const Kernel* q = b->kernel;
  const int64_t m = b->m, groups = (q->n + 15) / 16;
  if (qm_bf16_runs(m, q->k)) return computeBf16(ctx, alloc, b);
  void* mem = alloc->Alloc(alloc, qm_rows_bytes(m, q->k, q->blk));
  if (!mem) return fail(ORT_FAIL, "QMatMul: out of memory");
  qm_rows rows;
  qm_rows_layout(&rows, mem, m, q->k, q->blk);
  /* x quantized over the threads too, rows shared out (a prefill's 2,048 x 4,864 floats took one core
   * 5-6 ms a product while the other waited) */
  Quant quant = {&rows, b->x, (65536 + q->k - 1) / q->k};
  OrtStatus* s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, quantTask, (size_t)((m + quant.perTask - 1) / quant.perTask), 0, &quant);
  if (!s) {
    /* Tasks of 2 groups (32 columns) of a chunk of rows: hundreds for the large products, so that the
     * threads end together. */
    const int64_t rowsPerTask = rowChunk(m, q->k, 16, b->loraRank > 0 && !b->bShared), perTask = 2, groupTasks = (groups + perTask - 1) / perTask;
    Work work = {q, b->w8, b->w4, &rows, b->y, groups, perTask, b->xa, b->loraB, b->loraRank, b->perBatch, b->bShared, rowsPerTask, groupTasks};
    const size_t tasks = (size_t)(groupTasks * ((m + rowsPerTask - 1) / rowsPerTask));
    s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, task, tasks, 0, &work);
  }
  alloc->Free(alloc, mem);
  return s;
}

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel* q = kernel;
  /* inputs: A, B, scales, then (4 bits) the offsets, then the optional bias and the LoRA term's x A and B,
   * then (activation 1) the activation's LoRA terms GA, GB, UA, UB as SwiGlu takes them (see inputCount8/inputCount4) */
  const size_t biasAt = q->bits == 8 ? 3 : 4, xaAt = biasAt + 1, gaAt = xaAt + 2;
  size_t inputs = 0;
  TRY(API(S_KernelContext_GetInputCount, InputCountFn)(ctx, &inputs));
  const OrtValue *a = NULL, *b = NULL, *scales = NULL, *offsets = NULL, *bias = NULL, *xa = NULL, *loraB = NULL;
  const OrtValue* glu[4] = {NULL, NULL, NULL, NULL};
  TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, 0, &a));
  TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, 1, &b));
  TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, 2, &scales));
  if (q->bits == 4) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, 3, &offsets));
  if (inputs > biasAt) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, biasAt, &bias));
  if (inputs > xaAt) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, xaAt, &xa));
  if (inputs > xaAt + 1) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, xaAt + 1, &loraB));
  for (size_t i = 0; i < 4; i++)
    if (inputs > gaAt + i) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, gaAt + i, &glu[i]));
  if ((xa == NULL) != (loraB == NULL)) return fail(ORT_INVALID_ARGUMENT, "QMatMul: the LoRA inputs come two together (x A, B)");
  const int terms = glu[0] != NULL;
  if (terms && !q->glu) return fail(ORT_INVALID_ARGUMENT, "QMatMul: GA, GB, UA and UB are the activation's (activation 1)");
  if (terms && (!glu[1] || !glu[2] || !glu[3])) return fail(ORT_INVALID_ARGUMENT, "QMatMul: the activation's LoRA inputs come four together (GA, GB, UA, UB)");
  int64_t dims[8];
  size_t rank = 0;
  TRY(shapeOf(a, dims, &rank));
  if (rank < 1 || dims[rank - 1] != q->k) return fail(ORT_INVALID_ARGUMENT, "QMatMul: A's last dimension is not K");
  const int64_t groups = (q->n + 15) / 16, blocks = q->k / q->blk, inter = q->n / 2;
  const int64_t bShape[3] = {groups, q->k / (q->bits == 8 ? 4 : 8), 64}, sShape[3] = {groups, blocks, 16}, nShape[1] = {q->n};
  TRY(expect(b, 3, bShape, q->bits == 8 ? "QMatMul8: B is not [ceil(N / 16), K / 4, 64]" : "QMatMul4: B is not [ceil(N / 16), K / 8, 64]"));
  TRY(expect(scales, 3, sShape, "QMatMul: scales are not [ceil(N / 16), K / block_size, 16]"));
  if (offsets) TRY(expect(offsets, 3, sShape, "QMatMul4: offsets are not [ceil(N / 16), K / block_size, 16]"));
  if (bias) TRY(expect(bias, 1, nShape, "QMatMul: bias is not [N]"));
  int64_t m = 1;
  for (size_t i = 0; i + 1 < rank; i++) m *= dims[i];
  int64_t loraRank = 0, perBatch = m > 0 ? m : 1, gluRank = 0, gluPerBatch = perBatch;
  int bShared = 1, gluShared = 1;
  if (xa) {
    LoraShape ls;
    TRY(loraShape(xa, loraB, dims, rank, q->n, "QMatMul: A [B, S, K], x A [B, S, R] and B [B or 1, R, N] do not fit", &ls));
    loraRank = ls.rank;
    perBatch = ls.perBatch;
    bShared = ls.shared;
  }
  if (terms) {
    LoraShape ls;
    TRY(gluTerms("QMatMul", glu, dims, rank, inter, "QMatMul: A [B, S, K], GA [B, S, R] and GB [B or 1, R, N / 2] do not fit", &ls));
    gluRank = ls.rank;
    gluPerBatch = ls.perBatch;
    gluShared = ls.shared;
  }
  void *x = NULL, *wq = NULL, *ws = NULL, *wo = NULL, *wb = NULL, *pa = NULL, *pb = NULL, *y = NULL;
  void* pt[4] = {NULL, NULL, NULL, NULL};
  TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)a, &x));
  TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)b, &wq));
  TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)scales, &ws));
  if (offsets) TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)offsets, &wo));
  if (bias) TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)bias, &wb));
  if (loraRank > 0) {
    TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)xa, &pa));
    TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)loraB, &pb));
  }
  if (gluRank > 0)
    for (int i = 0; i < 4; i++) TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)glu[i], &pt[i]));
  const int64_t width = q->glu ? inter : q->n;
  dims[rank - 1] = width;
  OrtValue* out = NULL;
  TRY(API(S_KernelContext_GetOutput, GetOutputFn)(ctx, 0, dims, rank, &out));
  TRY(API(S_GetTensorMutableData, MutableDataFn)(out, &y));
  if (m == 0) return NULL;
  hugeOutput(y, (size_t)(m * width) * sizeof(float));
  const qm8_weight w8 = {q->k, q->n, q->blk, wq, ws, wb};
  const qm4_weight w4 = {q->k, q->n, q->blk, wq, ws, wo, wb};
  /* x quantized (a byte a value and three numbers a block), or in bfloat16, in memory from the session's
   * allocator: the one the counting allocator accounts (session.use_env_allocators), so the guards see it
   * as they see MatMulNBits' own. */
  /* (the OrtAllocator handed out is a wrapper made for the call: released after it) */
  OrtAllocator* alloc = NULL;
  TRY(API(S_KernelContext_GetAllocator, GetAllocatorFn)(ctx, cpuMemory, &alloc));
  /* With the activation: on AMX-BF16 without LoRA terms the product's sums go straight into it
   * (qm_bf16_glu); otherwise the product is written to memory of its own and the activation read from it,
   * as the graph's QMatMul and SwiGlu nodes did. */
  const int fused = q->glu && gluRank == 0 && loraRank == 0 && qm_bf16_runs(m, q->k);
  float* gu = q->glu && !fused ? alloc->Alloc(alloc, (size_t)(m * q->n) * sizeof(float)) : NULL;
  OrtStatus* s = q->glu && !fused && !gu ? fail(ORT_FAIL, "QMatMul: out of memory") : NULL;
  if (!s) {
    ProductWork pw = {.kernel = q, .w8 = &w8, .w4 = &w4, .x = x, .y = gu ? gu : y, .m = m, .xa = pa, .loraB = pb, .loraRank = loraRank,
                   .perBatch = perBatch, .bShared = bShared, .glu = fused, .half = q->n / 32};
    s = product(ctx, alloc, &pw);
  }
  if (!s && gu) {
    const float* const t[4] = {pt[0], pt[1], pt[2], pt[3]};
    s = gluRows(ctx, gu, t, y, inter, m, gluRank, gluPerBatch, gluShared);
  }
  if (gu) alloc->Free(alloc, gu);
  API(S_ReleaseAllocator, ReleaseAllocatorFn)(alloc);
  return s;
}

static const char* name8(const OrtCustomOp* op) {
  (void)op;
  return "QMatMul8";
}
static const char* name4(const OrtCustomOp* op) {
  (void)op;
  return "QMatMul4";
}
static const char* provider(const OrtCustomOp* op) {
  (void)op;
  return "CPUExecutionProvider";
}
/* QMatMul8: A, B (uint8), scales; QMatMul4: A, B (uint8), scales, offsets; then, optional in both: bias
 * [N], x A [B, S, R] and B [B or 1, R, N] (the LoRA term). An absent one is named ''. */
static int inputType8(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i == 1 ? ELEMENT_UINT8 : ELEMENT_FLOAT;
}
static int inputType4(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i == 1 ? ELEMENT_UINT8 : ELEMENT_FLOAT;
}
static size_t inputCount8(const OrtCustomOp* op) {
  (void)op;
  return 10;
}
static size_t inputCount4(const OrtCustomOp* op) {
  (void)op;
  return 11;
}
static int characteristic8(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i >= 3 ? CHARACTERISTIC_OPTIONAL : CHARACTERISTIC_REQUIRED;
}
static int characteristic4(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i >= 4 ? CHARACTERISTIC_OPTIONAL : CHARACTERISTIC_REQUIRED;
}
static int outputType(const OrtCustomOp* op, size_t i) {
  (void)op;
  (void)i;
  return ELEMENT_FLOAT;
}
static size_t outputCount(const OrtCustomOp* op) {
  (void)op;
  return 1;
}
static int outputCharacteristic(const OrtCustomOp* op, size_t i) {
  (void)op;
  (void)i;
  return CHARACTERISTIC_REQUIRED;
}
static int memoryType(const OrtCustomOp* op, size_t i) {
  (void)op;
  (void)i;
  return 0; /* OrtMemTypeDefault */
}
static int one(const OrtCustomOp* op) {
  (void)op;
  return 1;
}


/* --- SwiGlu ----------------------------------------------------------------------------------------- */

/*
 * SwiGlu(GU float [B, S, 2I], GA float [B, S, R], GB float [B or 1, R, I], UA float [B, S, R], UB float [B or 1, R, I])
 *   -> Y float [B, S, I]   (the four low-rank inputs optional, together)
 *   g = GU[.., :I] + GA GB, u = GU[.., I:] + UA UB, Y = g sigmoid(g) u
 * the MLP's activation after its gate and up product (one QMatMul of 2I columns), each half's LoRA term
 * taken on the way: GA, UA are x times each row's A (the graph's MatMul, [B, S, R]), GB, UB each row's B;
 * at rank 0 (no adapter in the batch) there is no term to add. In one pass over the rows it replaces what
 * the graph did in eight nodes (a Split copying the product into two tensors, the LoRA terms' second
 * MatMuls and their Adds, Sigmoid and two Muls that ONNX Runtime fuses into QuickGelu and a Mul), each
 * writing a tensor of its own: at a prefill of 2,048 tokens each of those is 40 MB of fresh memory a
 * layer, faulted in page by page (a rank-0 term's MatMul writes 40 MB of zeros).
 */
typedef struct {
  const float *gu, *ga, *gb, *ua, *ub;
  float* y;
  int64_t inter, rank, rows, perBatch, perTask;
  int bShared; /* GB and UB are [1, R, I]: one adapter (or none) for every row, broadcast */
} GluWork;

#define AVX512 __attribute__((target("avx512f")))

AVX512 static void glu_rows_avx512(const GluWork* w, int64_t r0, int64_t r1) {
  const int64_t I = w->inter, R = w->rank;
  for (int64_t i = r0; i < r1; i++) {
    const float* g = w->gu + i * 2 * I;
    const float* u = g + I;
    const int64_t bi = w->bShared ? 0 : i / w->perBatch;
    const float *ga = w->ga + i * R, *ua = w->ua + i * R, *gb = w->gb + bi * R * I, *ub = w->ub + bi * R * I;
    float* y = w->y + i * I;
    for (int64_t j = 0; j < I; j += 16) {
      const __mmask16 m = I - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (I - j)) - 1);
      __m512 gv = _mm512_maskz_loadu_ps(m, g + j), uv = _mm512_maskz_loadu_ps(m, u + j);
      if (R > 0) {
        __m512 gt = _mm512_setzero_ps(), ut = _mm512_setzero_ps();
        for (int64_t t = 0; t < R; t++) {
          gt = _mm512_fmadd_ps(_mm512_set1_ps(ga[t]), _mm512_maskz_loadu_ps(m, gb + t * I + j), gt);
          ut = _mm512_fmadd_ps(_mm512_set1_ps(ua[t]), _mm512_maskz_loadu_ps(m, ub + t * I + j), ut);
        }
        gv = _mm512_add_ps(gv, gt);
        uv = _mm512_add_ps(uv, ut);
      }
      /* g sigmoid(g) u = g / (1 + e^-g) u */
      _mm512_mask_storeu_ps(y + j, m, silu_mul512(gv, uv));
    }
  }
}

static void glu_rows_c(const GluWork* w, int64_t r0, int64_t r1) {
  const int64_t I = w->inter, R = w->rank;
  for (int64_t i = r0; i < r1; i++) {
    const int64_t bi = w->bShared ? 0 : i / w->perBatch;
    for (int64_t j = 0; j < I; j++) {
      float g = w->gu[i * 2 * I + j], u = w->gu[i * 2 * I + I + j];
      if (R > 0) {
        float gt = 0.0f, ut = 0.0f;
        for (int64_t t = 0; t < R; t++) {
          gt += w->ga[i * R + t] * w->gb[(bi * R + t) * I + j];
          ut += w->ua[i * R + t] * w->ub[(bi * R + t) * I + j];
        }
        g += gt;
        u += ut;
      }
      w->y[i * I + j] = g / (1.0f + expf(-g)) * u;
    }
  }
}

static void gluTask(void* data, size_t t) {
  const GluWork* w = data;
  const int64_t r0 = (int64_t)t * w->perTask, r1 = r0 + w->perTask < w->rows ? r0 + w->perTask : w->rows;
  if (qm_vnni()) glu_rows_avx512(w, r0, r1);
  else glu_rows_c(w, r0, r1);
}

static OrtStatus* createGlu(const OrtCustomOp* op, OrtApiTable a, const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)a;
  (void)info;
  *out = NULL;
  return NULL;
}

static void destroyGlu(void* kernel) { (void)kernel; }

static OrtStatus* computeGlu(void* kernel, OrtKernelContext* ctx) {
  (void)kernel;
  size_t inputs = 0;
  TRY(API(S_KernelContext_GetInputCount, InputCountFn)(ctx, &inputs));
  const OrtValue* in[5] = {NULL, NULL, NULL, NULL, NULL};
  for (size_t i = 0; i < inputs && i < 5; i++) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, i, &in[i]));
  const int terms = in[1] != NULL;
  if (terms && (!in[2] || !in[3] || !in[4])) return fail(ORT_INVALID_ARGUMENT, "SwiGlu: the LoRA inputs come four together (GA, GB, UA, UB)");
  int64_t dims[8];
  size_t rank = 0;
  TRY(shapeOf(in[0], dims, &rank));
  if (rank < 1 || dims[rank - 1] % 2 != 0) return fail(ORT_INVALID_ARGUMENT, "SwiGlu: the input's last dimension is not even (gate and up side by side)");
  const int64_t inter = dims[rank - 1] / 2;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < rank; i++) rows *= dims[i];
  int64_t loraRank = 0, perBatch = rows > 0 ? rows : 1;
  int bShared = 1;
  if (terms) {
    LoraShape ls;
    TRY(gluTerms("SwiGlu", in + 1, dims, rank, inter, "SwiGlu: GU [B, S, 2I], GA [B, S, R] and GB [B or 1, R, I] do not fit", &ls));
    loraRank = ls.rank;
    perBatch = ls.perBatch;
    bShared = ls.shared;
  }
  void* p[5] = {NULL, NULL, NULL, NULL, NULL};
  for (int i = 0; i < (terms ? 5 : 1); i++) TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[i], &p[i]));
  dims[rank - 1] = inter;
  OrtValue* out = NULL;
  void* y = NULL;
  TRY(API(S_KernelContext_GetOutput, GetOutputFn)(ctx, 0, dims, rank, &out));
  TRY(API(S_GetTensorMutableData, MutableDataFn)(out, &y));
  if (rows == 0 || inter == 0) return NULL;
  hugeOutput(y, (size_t)(rows * inter) * sizeof(float));
  const float* const t[4] = {p[1], p[2], p[3], p[4]};
  return gluRows(ctx, p[0], t, y, inter, rows, loraRank, perBatch, bShared);
}

static OrtStatus* gluRows(OrtKernelContext* ctx, const float* gu, const float* const terms[4], float* y, int64_t inter, int64_t rows, int64_t rank,
                          int64_t perBatch, int bShared) {
  /* tasks of about 64 K values: enough of them for the threads to end together, few enough to cost nothing */
  const int64_t per = (65536 + inter - 1) / inter;
  GluWork work = {gu, terms[0], terms[1], terms[2], terms[3], y, inter, rank, rows, perBatch, per, bShared};
  return API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, gluTask, (size_t)((rows + per - 1) / per), 0, &work);
}

static const char* nameGlu(const OrtCustomOp* op) {
  (void)op;
  return "SwiGlu";
}
static int inputTypeGlu(const OrtCustomOp* op, size_t i) {
  (void)op;
  (void)i;
  return ELEMENT_FLOAT;
}
static size_t inputCountGlu(const OrtCustomOp* op) {
  (void)op;
  return 5;
}
static int characteristicGlu(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i == 0 ? CHARACTERISTIC_REQUIRED : CHARACTERISTIC_OPTIONAL;
}

/* --- GroupQueryAttention ---------------------------------------------------------------------------- */

/*
 * GroupQueryAttention(query float [B, S, (N + 2 Nkv) D], key '', value '', past_key float [B, Nkv, P, D],
 *   past_value float [B, Nkv, P, D], seqlens_k int32 [B], total_sequence_length int32 [1],
 *   cos_cache float [positions, R / 2], sin_cache float [positions, R / 2])
 *   -> output float [B, S, N D], present_key, present_value float [B, Nkv, max(total, P), D]
 *   attributes num_heads, kv_num_heads, do_rotary, rotary_interleaved, scale (0: 1 / sqrt(D))
 * com.microsoft's GroupQueryAttention as ONNX Runtime's CPU kernel computes it, for a packed QKV input
 * (the converter's graphs: gqa-builder.ts), by attention.c: the causal half only, a block of rows at a
 * time, where ONNX Runtime's kernel fills a [B, N, S, P] score matrix (207 MB a layer at a 2,048-token
 * prefill of the 1.5B, 1.3 of its 5.9 s). Its rules are kept: a first prompt when S is
 * total_sequence_length (rows right-padded, their pasts 0), else row b's past is seqlens_k[b] + 1 - S
 * (S > 1 then only for one row); the new keys and values go to positions past .. past + S - 1 of the
 * present, which may be the past buffer itself (given as the output: the decoder's in-place KV). What
 * it does not compute (separate K and V, a local window, softcap, smooth softmax) it refuses.
 */
typedef struct {
  int64_t heads, kvHeads, rotary, interleaved;
  float scale;
} AttnKernel;

static float attrFloatOr(const OrtKernelInfo* info, const char* name, float fallback) {
  float v = fallback;
  OrtStatus* s = API(S_KernelInfoGetAttribute_float, AttrFloatFn)(info, name, &v);
  if (s) {
    API(S_ReleaseStatus, ReleaseStatusFn)(s);
    v = fallback;
  }
  return v;
}

static OrtStatus* createAttn(const OrtCustomOp* op, OrtApiTable a, const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)a;
  AttnKernel k;
  int64_t window, smooth;
  attrOr(info, "num_heads", 0, &k.heads);
  attrOr(info, "kv_num_heads", 0, &k.kvHeads);
  attrOr(info, "do_rotary", 0, &k.rotary);
  attrOr(info, "rotary_interleaved", 0, &k.interleaved);
  attrOr(info, "local_window_size", -1, &window);
  attrOr(info, "smooth_softmax", 0, &smooth);
  k.scale = attrFloatOr(info, "scale", 0.0f);
  if (k.heads <= 0 || k.kvHeads <= 0 || k.heads % k.kvHeads != 0)
    return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): num_heads must be a positive multiple of kv_num_heads");
  if (window != -1 || smooth != 0 || attrFloatOr(info, "softcap", 0.0f) != 0.0f)
    return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): local_window_size, softcap and smooth_softmax are not implemented");
  AttnKernel* kernel = malloc(sizeof *kernel);
  if (!kernel) return fail(ORT_FAIL, "GroupQueryAttention: out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

typedef struct {
  const attn_problem* p;
  int64_t chunk, chunks; /* positions a task of attnStoreTask, and such chunks a row */
  char* scratch;
  size_t scratchBytes;
  int64_t tasks;
  int64_t next; /* the next attention task to take (atomic) */
} AttnWork;

static void attnStoreTask(void* data, size_t i) {
  const AttnWork* w = data;
  const int64_t b = (int64_t)i / w->chunks, s0 = ((int64_t)i % w->chunks) * w->chunk;
  attn_store_kv(w->p, b, s0, s0 + w->chunk < w->p->seq ? s0 + w->chunk : w->p->seq);
}

/* A worker with its own scratch takes tasks until none is left: rows near a prefill's end see more keys
 * than rows near its start, so tasks of fixed rows take unequal times, and whichever thread is free
 * takes the next. */
static void attnWorker(void* data, size_t i) {
  AttnWork* w = data;
  void* scratch = w->scratch + i * w->scratchBytes;
  for (int64_t t; (t = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED)) < w->tasks;) attn_task(w->p, t, scratch);
}

#define ATTN_WORKERS 16

static OrtStatus* computeAttn(void* kernel, OrtKernelContext* ctx) {
  const AttnKernel* k = kernel;
  size_t inputs = 0;
  TRY(API(S_KernelContext_GetInputCount, InputCountFn)(ctx, &inputs));
  const OrtValue* in[9] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
  for (size_t i = 0; i < inputs && i < 9; i++) TRY(API(S_KernelContext_GetInput, GetInputFn)(ctx, i, &in[i]));
  if (in[1] || in[2]) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): separate key and value inputs are not taken (pack them into the query)");
  if (!in[0] || !in[5] || !in[6]) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): query, seqlens_k and total_sequence_length are required");
  if (!in[3] != !in[4]) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): past_key and past_value come together");
  if (!in[7] != !in[8] || (k->rotary && !in[7])) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): do_rotary takes cos_cache and sin_cache, together");
  int64_t q[8], pk[8], sl[8], tl[8], cs[8];
  size_t qr = 0, pr = 0, slr = 0, tlr = 0, csr = 0;
  TRY(shapeOf(in[0], q, &qr));
  const int64_t N = k->heads, Nkv = k->kvHeads;
  if (qr != 3 || q[2] % (N + 2 * Nkv) != 0 || (q[2] / (N + 2 * Nkv)) % 16 != 0)
    return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): query is not [B, S, (num_heads + 2 kv_num_heads) D], D a multiple of 16");
  const int64_t B = q[0], S = q[1], D = q[2] / (N + 2 * Nkv);
  int64_t P = 0;
  if (in[3]) {
    TRY(shapeOf(in[3], pk, &pr));
    if (pr != 4 || pk[0] != B || pk[1] != Nkv || pk[3] != D) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): past_key is not [B, kv_num_heads, P, D]");
    TRY(expect(in[4], 4, pk, "GroupQueryAttention (ragguard): past_value is not past_key's shape"));
    P = pk[2];
  }
  TRY(shapeOf(in[5], sl, &slr));
  TRY(shapeOf(in[6], tl, &tlr));
  if (slr != 1 || sl[0] != B) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): seqlens_k is not [B]");
  if (tlr > 1 || (tlr == 1 && tl[0] != 1)) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): total_sequence_length is not one value");
  int64_t half = 0, positions = 0;
  if (k->rotary) {
    TRY(shapeOf(in[7], cs, &csr));
    if (csr != 2 || cs[1] < 1 || 2 * cs[1] > D) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): cos_cache is not [positions, R / 2], R <= D");
    TRY(expect(in[8], 2, cs, "GroupQueryAttention (ragguard): sin_cache is not cos_cache's shape"));
    half = cs[1];
    positions = cs[0];
  }
  void *qkv = NULL, *pastK = NULL, *pastV = NULL, *lens = NULL, *total = NULL, *cosv = NULL, *sinv = NULL;
  TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[0], &qkv));
  TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[5], &lens));
  TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[6], &total));
  if (in[3]) {
    TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[3], &pastK));
    TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[4], &pastV));
  }
  if (k->rotary) {
    TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[7], &cosv));
    TRY(API(S_GetTensorMutableData, MutableDataFn)((OrtValue*)in[8], &sinv));
  }
  const int64_t totalLen = *(const int32_t*)total, cap = totalLen > P ? totalLen : P;
  const int first = S == totalLen;
  if (!first && S > 1 && B != 1) return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): several new tokens after a past only for one row (batch 1)");
  /* each row's past, checked against the buffers before anything is written */
  int64_t* past = malloc((size_t)(B > 0 ? B : 1) * sizeof(int64_t));
  if (!past) return fail(ORT_FAIL, "GroupQueryAttention: out of memory");
  for (int64_t b = 0; b < B; b++) {
    const int64_t len = (int64_t)((const int32_t*)lens)[b] + 1;
    past[b] = first ? 0 : len - S;
    if ((first && (len < 1 || len > S)) || (!first && past[b] < 0) || past[b] + S > cap || past[b] > P || (k->rotary && past[b] + S > positions)) {
      free(past);
      return fail(ORT_INVALID_ARGUMENT, "GroupQueryAttention (ragguard): seqlens_k does not fit the new tokens, the past buffer or the rotary caches");
    }
  }
  const int64_t outDims[3] = {B, S, N * D}, kvDims[4] = {B, Nkv, cap, D};
  OrtValue *out = NULL, *presentK = NULL, *presentV = NULL;
  void *y = NULL, *keys = NULL, *values = NULL;
  OrtStatus* s = API(S_KernelContext_GetOutput, GetOutputFn)(ctx, 0, outDims, 3, &out);
  if (!s) s = API(S_KernelContext_GetOutput, GetOutputFn)(ctx, 1, kvDims, 4, &presentK);
  if (!s) s = API(S_KernelContext_GetOutput, GetOutputFn)(ctx, 2, kvDims, 4, &presentV);
  if (!s) s = API(S_GetTensorMutableData, MutableDataFn)(out, &y);
  if (!s) s = API(S_GetTensorMutableData, MutableDataFn)(presentK, &keys);
  if (!s) s = API(S_GetTensorMutableData, MutableDataFn)(presentV, &values);
  if (s || B == 0 || S == 0) {
    free(past);
    return s;
  }
  if (!(pastK && keys == pastK && values == pastV)) {
    /* a present of its own: the past's positions copied in, the rest zero (as ONNX Runtime's kernel leaves it) */
    for (int64_t b = 0; b < B; b++)
      for (int64_t g = 0; g < Nkv; g++) {
        const size_t at = (size_t)((b * Nkv + g) * cap * D), from = (size_t)((b * Nkv + g) * P * D), n = (size_t)(past[b] * D);
        if (n > 0) {
          memcpy((float*)keys + at, (const float*)pastK + from, n * sizeof(float));
          memcpy((float*)values + at, (const float*)pastV + from, n * sizeof(float));
        }
        memset((float*)keys + at + n, 0, (size_t)(cap * D - (int64_t)n) * sizeof(float));
        memset((float*)values + at + n, 0, (size_t)(cap * D - (int64_t)n) * sizeof(float));
      }
  }
  const attn_problem p = {
      .batch = B, .seq = S, .heads = N, .kvHeads = Nkv, .dim = D, .cap = cap, .rotaryHalf = half, .interleaved = (int)k->interleaved,
      .scale = k->scale != 0.0f ? k->scale : 1.0f / sqrtf((float)D), .qkv = qkv, .past = past, .cos = cosv, .sin = sinv,
      .keys = keys, .values = values, .out = y};
  AttnWork w = {.p = &p, .chunk = 64, .chunks = (S + 63) / 64, .tasks = attn_tasks(&p), .next = 0};
  const int64_t workers = w.tasks < ATTN_WORKERS ? w.tasks : ATTN_WORKERS;
  w.scratchBytes = attn_scratch_bytes(&p);
  /* the workers' scratch from the session's allocator (the one the guards account): 16 x 75 KB at D = 128 */
  OrtAllocator* alloc = NULL;
  s = API(S_KernelContext_GetAllocator, GetAllocatorFn)(ctx, cpuMemory, &alloc);
  void* mem = s ? NULL : alloc->Alloc(alloc, (size_t)workers * w.scratchBytes + 64);
  if (!s && !mem) s = fail(ORT_FAIL, "GroupQueryAttention: out of memory");
  if (!s) {
    w.scratch = (char*)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, attnStoreTask, (size_t)(B * w.chunks), 0, &w);
    if (!s) s = API(S_KernelContext_ParallelFor, ParallelForFn)(ctx, attnWorker, (size_t)workers, 0, &w);
  }
  if (mem) alloc->Free(alloc, mem);
  if (alloc) API(S_ReleaseAllocator, ReleaseAllocatorFn)(alloc);
  free(past);
  return s;
}

static const char* nameAttn(const OrtCustomOp* op) {
  (void)op;
  return "GroupQueryAttention";
}
static int inputTypeAttn(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i == 5 || i == 6 ? ELEMENT_INT32 : ELEMENT_FLOAT;
}
static size_t inputCountAttn(const OrtCustomOp* op) {
  (void)op;
  return 9;
}
static int characteristicAttn(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i == 0 || i == 5 || i == 6 ? CHARACTERISTIC_REQUIRED : CHARACTERISTIC_OPTIONAL;
}
static size_t outputCountAttn(const OrtCustomOp* op) {
  (void)op;
  return 3;
}

#define OP_OUT(NAME, INPUT_TYPE, INPUT_COUNT, CHARACTERISTIC, CREATE, COMPUTE, DESTROY, OUTPUT_COUNT) \
  {                                                               \
      .version = 16,                                              \
      .GetName = NAME,                                            \
      .GetExecutionProviderType = provider,                       \
      .GetInputType = INPUT_TYPE,                                 \
      .GetInputTypeCount = INPUT_COUNT,                           \
      .GetOutputType = outputType,                                \
      .GetOutputTypeCount = OUTPUT_COUNT,                         \
      .KernelDestroy = DESTROY,                                   \
      .GetInputCharacteristic = CHARACTERISTIC,                   \
      .GetOutputCharacteristic = outputCharacteristic,            \
      .GetInputMemoryType = memoryType,                           \
      .GetVariadicInputMinArity = one,                            \
      .GetVariadicInputHomogeneity = one,                         \
      .GetVariadicOutputMinArity = one,                           \
      .GetVariadicOutputHomogeneity = one,                        \
      .CreateKernelV2 = CREATE,                                   \
      .KernelComputeV2 = COMPUTE,                                 \
  }

#define OP_WITH(NAME, INPUT_TYPE, INPUT_COUNT, CHARACTERISTIC, CREATE, COMPUTE, DESTROY) \
  OP_OUT(NAME, INPUT_TYPE, INPUT_COUNT, CHARACTERISTIC, CREATE, COMPUTE, DESTROY, outputCount)
#define OP(NAME, INPUT_TYPE, INPUT_COUNT, CHARACTERISTIC, CREATE) OP_WITH(NAME, INPUT_TYPE, INPUT_COUNT, CHARACTERISTIC, CREATE, compute, destroy)

static const OrtCustomOp qmatmul8 = OP(name8, inputType8, inputCount8, characteristic8, create8);
static const OrtCustomOp qmatmul4 = OP(name4, inputType4, inputCount4, characteristic4, create4);
static const OrtCustomOp swiglu = OP_WITH(nameGlu, inputTypeGlu, inputCountGlu, characteristicGlu, createGlu, computeGlu, destroyGlu);
static const OrtCustomOp attention = OP_OUT(nameAttn, inputTypeAttn, inputCountAttn, characteristicAttn, createAttn, computeAttn, destroy, outputCountAttn);

/*
 * The library's entry point (RegisterCustomOpsLibrary_V2 calls it with each session's options). The
 * domain is made once and kept for the process's life: sessions made with it refer to it.
 */
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  static OrtCustomOpDomain* domain;
  if (!api) {
    api = base->GetApi(API_VERSION);
    if (!api) return NULL; /* nothing to report through: an ONNX Runtime older than 1.18 */
  }
  if (!cpuMemory) TRY(API(S_CreateCpuMemoryInfo, CpuMemoryInfoFn)(0, 0, &cpuMemory));
  if (!domain) {
    TRY(API(S_CreateCustomOpDomain, CreateDomainFn)("ragguard", &domain));
    TRY(API(S_CustomOpDomain_Add, DomainAddFn)(domain, &qmatmul8));
    TRY(API(S_CustomOpDomain_Add, DomainAddFn)(domain, &qmatmul4));
    TRY(API(S_CustomOpDomain_Add, DomainAddFn)(domain, &swiglu));
    TRY(API(S_CustomOpDomain_Add, DomainAddFn)(domain, &attention));
  }
  return API(S_AddCustomOpDomain, AddDomainFn)(options, domain);
}

/* Which kernel the products run here (1: AVX512-VNNI, 0: plain C). */
int ragguard_ops_vnni(void) { return qm_vnni(); }

/* 1: the products take the plain C path on any CPU from now on (a test compares the two); 0: undone. */
void ragguard_ops_set_portable(int on) { qm_set_portable(on); }

/* Whether products of 16 rows or more run on AMX here (1), else on the kernels ragguard_ops_vnni says (0). */
int ragguard_ops_amx(void) { return qm_amx(); }

/* 0: the AVX512-VNNI kernels at every row count from now on (a test compares the two); 1: AMX again where it can run. */
void ragguard_ops_set_amx(int on) { qm_set_amx(on); }

/* Whether prefills of QM_BF16_MIN_ROWS rows or more run on AMX-BF16 here (qm_bf16). */
int ragguard_ops_amx_bf16(void) { return qm_bf16(); }

/* 0: the int8 paths at every row count from now on (a test compares the two); 1: AMX-BF16 again where it runs. */
void ragguard_ops_set_amx_bf16(int on) { qm_set_bf16(on); }
