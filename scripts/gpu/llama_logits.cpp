// llama.cpp's own logits over teacher-forced sequences, for scripts/check-agreement.ts: the peer's side of
// the agreement table (top-1 and KL divergence against a float32 torch reference of the same checkpoint).
//
//   llama-logits MODEL.gguf SEQUENCES.txt OUT.f32
//
// SEQUENCES.txt: one sequence a line, "first_position id id id ..." (token ids; logits are written for
// every position from first_position to the line's last token). Each sequence is decoded alone from an
// empty cache in one batch (all positions at once, as a prompt is) with every layer on the GPU; OUT.f32
// gets each written position's logits, float32, vocabulary-sized rows, sequences in order.
// Built against llama.cpp's CUDA build by scripts/gpu/run-gguf.sh (the `llama` step).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf SEQUENCES.txt OUT.f32\n", argv[0]);
    return 2;
  }
  std::vector<std::pair<int, std::vector<llama_token>>> seqs;
  {
    std::ifstream in(argv[2]);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      int first = 0;
      if (!(ls >> first)) continue;
      std::vector<llama_token> ids;
      for (long id; ls >> id;) ids.push_back((llama_token)id);
      if (ids.empty() || first < 0 || first >= (int)ids.size()) {
        std::fprintf(stderr, "bad sequence line: %s\n", line.c_str());
        return 2;
      }
      seqs.emplace_back(first, ids);
    }
  }
  size_t longest = 0;
  for (auto& s : seqs) longest = std::max(longest, s.second.size());
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 999;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) { std::fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)(longest + 16);
  cp.n_batch = cp.n_ubatch = (uint32_t)(longest + 16);
  cp.n_seq_max = 1;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) { std::fprintf(stderr, "cannot create a context\n"); return 1; }
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* out = std::fopen(argv[3], "wb");
  if (!out) { std::fprintf(stderr, "cannot write %s\n", argv[3]); return 1; }
  size_t rows = 0;
  for (auto& [first, ids] : seqs) {
    llama_memory_clear(llama_get_memory(ctx), true);
    llama_batch b = llama_batch_init((int32_t)ids.size(), 0, 1);
    b.n_tokens = (int32_t)ids.size();
    for (int i = 0; i < b.n_tokens; ++i) {
      b.token[i] = ids[i];
      b.pos[i] = i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = i >= first;
    }
    if (llama_decode(ctx, b) != 0) { std::fprintf(stderr, "llama_decode failed\n"); return 1; }
    for (int i = first; i < b.n_tokens; ++i) {
      const float* l = llama_get_logits_ith(ctx, i);
      if (!l) { std::fprintf(stderr, "no logits at position %d\n", i); return 1; }
      if (std::fwrite(l, sizeof(float), (size_t)vocab, out) != (size_t)vocab) { std::fprintf(stderr, "write failed\n"); return 1; }
      ++rows;
    }
    llama_batch_free(b);
  }
  std::fclose(out);
  std::printf("{\"llama_logits\":\"%s\",\"rows\":%zu,\"vocab\":%d}\n", argv[1], rows, vocab);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
