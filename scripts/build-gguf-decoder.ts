/**
 * Converts a GGUF decoder into the genai layout once (src/backends/ort/convert/gguf-decoder.ts), into
 * RAGGUARD_GGUF_CACHE with RAGGUARD_GGUF_WEIGHTS, as the server would at start-up; a later start (or
 * run) finds it converted. Setup runs it on the pretrained decoder.
 *   tsx scripts/build-gguf-decoder.ts <model.gguf>
 */
import { loadConfig } from '../src/config/config.js';
import { ggufDecoderDir, ggufOptionsFor } from '../src/backends/ort/convert/gguf-decoder.js';

const [file] = process.argv.slice(2);
if (!file) {
  console.error('usage: tsx scripts/build-gguf-decoder.ts <model.gguf>');
  process.exit(2);
}
const cfg = loadConfig(process.env);
const dir = await ggufDecoderDir(file, ggufOptionsFor(cfg, (m) => console.log(m)));
console.log(`[gguf] ${file}: ${dir}`);
