#!/bin/bash
# Stand-ins for llama.cpp's llama-batched-bench and llama-server in DIR, for a dry run of bench:gpu-gguf on a
# machine without a GPU (BENCH_GPU_GGUF_STANDIN=1 LLAMA_BIN=DIR): the batched bench prints its JSON lines
# with made-up speeds; the server answers /health and /completion greedily as the tests' stand-in library
# does (each token the last + 1), with top-2 log-probabilities, and /v1/chat/completions (bench:rag-gpu's
# dry run) with max_tokens words, streamed as OpenAI chunks (usage last with stream_options.include_usage).
# Plumbing only: no figure comes from them.
set -euo pipefail
dir=${1:?usage: llama-standin.sh DIR}
mkdir -p "$dir"
cat > "$dir/llama-batched-bench" <<'BB'
#!/bin/bash
npl=1; pp=24; tg=64
while [[ $# -gt 0 ]]; do case $1 in -npl) npl=$2; shift;; -npp) pp=$2; shift;; -ntg) tg=$2; shift;; esac; shift; done
for pl in ${npl//,/ }; do
  echo "{\"n_kv_max\": 8192, \"n_batch\": 2048, \"n_ubatch\": 512, \"flash_attn\": -1, \"is_pp_shared\": 0, \"n_gpu_layers\": 99, \"n_threads\": 16, \"n_threads_batch\": 16, \"pp\": $pp, \"tg\": $tg, \"pl\": $pl, \"n_kv\": $((pl * (pp + tg))), \"t_pp\": 0.01, \"speed_pp\": 1000.0, \"t_tg\": 1.0, \"speed_tg\": $((pl * 100)).0, \"t\": 1.01, \"speed\": 100.0}"
done
BB
cat > "$dir/llama-server" <<'SRV'
#!/usr/bin/env node
const http = require('node:http');
const port = Number(process.argv[process.argv.indexOf('--port') + 1]);
http.createServer((req, res) => {
  if (req.url === '/health') { res.end('{"status":"ok"}'); return; }
  let body = '';
  req.on('data', (d) => (body += d));
  req.on('end', () => {
    const q = JSON.parse(body);
    if (req.url === '/v1/chat/completions') {
      const n = Math.max(1, q.max_tokens ?? 16);
      const prompt = JSON.stringify(q.messages ?? []).length >> 2;
      const usage = { prompt_tokens: prompt, completion_tokens: n, total_tokens: prompt + n };
      if (!q.stream) {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: ' tok'.repeat(n) }, finish_reason: 'length' }], usage }));
        return;
      }
      res.setHeader('content-type', 'text/event-stream');
      const chunk = (delta, finish) => res.write(`data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`);
      let i = 0;
      const tick = () => {
        if (i++ < n) { chunk({ content: ' tok' }, null); setTimeout(tick, 2); return; }
        chunk({}, 'length');
        if (q.stream_options?.include_usage) res.write(`data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [], usage })}\n\n`);
        res.end('data: [DONE]\n\n');
      };
      tick();
      return;
    }
    const tokens = [];
    let last = q.prompt[q.prompt.length - 1];
    for (let i = 0; i < q.n_predict; i++) tokens.push((last = last + 1));
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ tokens, completion_probabilities: tokens.map((id) => ({ id, top_logprobs: [{ id, logprob: -0.1 }, { id: id + 1, logprob: -2.4 }] })) }));
  });
}).listen(port, '127.0.0.1');
SRV
chmod +x "$dir/llama-batched-bench" "$dir/llama-server"
