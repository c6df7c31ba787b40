/**
 * Model directories: the Hugging Face / Optimum export layout (config.json, tokenizer.json,
 * onnx/model.onnx), or onnxruntime-genai's (genai_config.json naming the decoder's file, model.onnx).
 */
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { externalDataFiles } from './onnx-proto.js';

export async function readJson<T>(file: string): Promise<T> {
  return JSON.parse(await readFile(file, 'utf8')) as T;
}

export async function readJsonIfExists<T>(file: string): Promise<T | undefined> {
  try {
    return await readJson<T>(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

export interface ModelFiles {
  dir: string;
  onnx: string;
  /** The directory is in onnxruntime-genai's layout (genai_config.json). */
  genai: boolean;
  /**
   * Bytes of the ONNX file and the external data files it names (weights as stored on disk, fp16 for
   * the shipped models; exports over 2 GiB keep them outside the graph file).
   */
  onnxBytes: number;
}

interface GenaiConfig {
  model?: { decoder?: { filename?: string } };
}

export async function modelFiles(dir: string): Promise<ModelFiles> {
  const genai = await readJsonIfExists<GenaiConfig>(path.join(dir, 'genai_config.json'));
  const onnx = genai ? path.join(dir, genai.model?.decoder?.filename ?? 'model.onnx') : path.join(dir, 'onnx', 'model.onnx');
  let size: number;
  try {
    size = (await stat(onnx)).size;
  } catch {
    throw new Error(genai
      ? `model directory ${dir}: genai_config.json names ${path.relative(dir, onnx)}, which is missing`
      : `model directory ${dir} has no onnx/model.onnx (expected the Optimum export layout, or genai_config.json)`);
  }
  // A graph file holding its own weights is read by ONNX Runtime anyway; only a small one (a graph whose
  // weights are elsewhere) is worth scanning for external data here.
  if (size < 256 * 2 ** 20) {
    for (const f of externalDataFiles(await readFile(onnx))) size += (await stat(path.join(path.dirname(onnx), f))).size;
  }
  return { dir, onnx, genai: genai !== undefined, onnxBytes: size };
}

/** Pads rows of token ids to one length into int64 tensors' data, row-major. */
export function padRows(rows: readonly (readonly number[])[], pad: number): { ids: BigInt64Array; mask: BigInt64Array; width: number } {
  const width = Math.max(1, ...rows.map((r) => r.length));
  const ids = new BigInt64Array(rows.length * width).fill(BigInt(pad));
  const mask = new BigInt64Array(rows.length * width);
  rows.forEach((r, i) => {
    for (let j = 0; j < r.length; j++) {
      ids[i * width + j] = BigInt(r[j]!);
      mask[i * width + j] = 1n;
    }
  });
  return { ids, mask, width };
}

/**
 * Reads external data files next to an ONNX graph (readInitializers' ExternalDataReader), each file
 * opened once. A location must stay inside the graph's directory: an absolute path or '..' is refused.
 */
export function externalDataReader(graphDir: string): { read: (location: string, offset: number, length: number | undefined) => Uint8Array; close: () => void } {
  const fds = new Map<string, number>();
  return {
    read(location, offset, length) {
      const file = path.resolve(graphDir, location);
      if (path.isAbsolute(location) || path.relative(graphDir, file).startsWith('..')) throw new Error(`external data location ${location} leaves ${graphDir}`);
      let fd = fds.get(file);
      if (fd === undefined) {
        fd = openSync(file, 'r');
        fds.set(file, fd);
      }
      const n = length ?? fstatSync(fd).size - offset;
      const buf = Buffer.alloc(n);
      let at = 0;
      while (at < n) {
        const got = readSync(fd, buf, at, n - at, offset + at);
        if (got <= 0) throw new Error(`external data ${location}: ${n} bytes at ${offset} run past its end`);
        at += got;
      }
      return new Uint8Array(buf.buffer, buf.byteOffset, n);
    },
    close() {
      for (const fd of fds.values()) closeSync(fd);
      fds.clear();
    },
  };
}
