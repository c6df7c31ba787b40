/**
 * The tokenizer that scripts/gpu/pack-llama.sh gives the random-weight checkpoints: tokenizer.json and
 * tokenizer_config.json built from a GGUF file's vocabulary (src/runtime/gguf-tokenizer.ts, as the CPU path
 * builds them), written to OUT_DIR. llama.cpp's convert_hf_to_gguf.py recognises a BPE pre-tokenizer by the
 * sha256 of str(token ids) of one test text (conversion/base.py get_vocab_base_pre), so the files must
 * tokenize it as Qwen2's own tokenizer does: checked here; exit code 1 where the hash is not qwen2's.
 *
 *   node --import tsx scripts/gpu/qwen-tokenizer.ts <file.gguf> <OUT_DIR>
 */
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { GgufFile } from '../../src/runtime/gguf.js';
import { ggufTokenizer } from '../../src/runtime/gguf-tokenizer.js';
import { TextTokenizer } from '../../src/runtime/tokenizer.js';

/** llama.cpp's test text (conversion/base.py chktxt). */
const CHKTXT = '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL';
/** conversion/base.py's hash for qwen2 (ref: Qwen/Qwen1.5-7B). */
const QWEN2 = 'e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea';

const [file, out] = process.argv.slice(2) as [string, string];
const f = GgufFile.open(file);
const tok = ggufTokenizer(f, 32768);
f.close();
mkdirSync(out, { recursive: true });
writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tok.tokenizer));
writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify(tok.config, null, 1));
const ids = (await TextTokenizer.load(out)).encode(CHKTXT, true);
const hash = createHash('sha256').update(`[${ids.join(', ')}]`).digest('hex');
console.log(JSON.stringify({ check: 'qwen-tokenizer', tokens: ids.length, chkhsh: hash, qwen2: hash === QWEN2 }));
process.exitCode = hash === QWEN2 ? 0 : 1;
