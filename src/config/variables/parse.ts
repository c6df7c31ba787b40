/**
 * A configuration variable (config.ts lists them all in VARIABLES) and the parsers of its raw value: each
 * throws a message saying what was expected, which loadConfig prefixes with the variable's name.
 */
import path from 'node:path';
import type { Config } from '../settings.js';

export interface Variable {
  name: string;
  default: string;
  doc: string;
  apply(cfg: Partial<Config>, raw: string): void;
}

export function int(min: number, max: number, set: (c: Partial<Config>, v: number) => void) {
  return (c: Partial<Config>, raw: string) => {
    if (!/^-?\d+$/.test(raw.trim())) throw new Error(`expected an integer, got '${raw}'`);
    const v = Number(raw);
    if (v < min || v > max) throw new Error(`expected an integer in [${min}, ${max}], got ${v}`);
    set(c, v);
  };
}

export function num(min: number, max: number, set: (c: Partial<Config>, v: number) => void) {
  return (c: Partial<Config>, raw: string) => {
    const v = Number(raw);
    if (raw.trim() === '' || !Number.isFinite(v)) throw new Error(`expected a number, got '${raw}'`);
    if (v < min || v > max) throw new Error(`expected a number in [${min}, ${max}], got ${v}`);
    set(c, v);
  };
}

export function str(set: (c: Partial<Config>, v: string) => void, allowEmpty = false) {
  return (c: Partial<Config>, raw: string) => {
    if (!allowEmpty && raw.trim() === '') throw new Error('must not be empty');
    set(c, raw);
  };
}

export function bool(set: (c: Partial<Config>, v: boolean) => void) {
  return (c: Partial<Config>, raw: string) => {
    if (!['true', 'false', '1', '0'].includes(raw)) throw new Error(`expected true or false, got '${raw}'`);
    set(c, raw === 'true' || raw === '1');
  };
}

export function intList(set: (c: Partial<Config>, v: number[]) => void) {
  return (c: Partial<Config>, raw: string) => {
    const v = raw.split(',').map((x) => x.trim());
    if (!v.every((x) => /^\d+$/.test(x)) || v.length === 0) throw new Error(`expected comma-separated integers, got '${raw}'`);
    const n = v.map(Number);
    if (n.some((x, i) => x < 1 || (i > 0 && x <= n[i - 1]!))) throw new Error('expected increasing positive integers');
    set(c, n);
  };
}

export function oneOf<T extends string>(values: readonly T[], set: (c: Partial<Config>, v: T) => void) {
  return (c: Partial<Config>, raw: string) => {
    if (!(values as readonly string[]).includes(raw)) throw new Error(`expected one of ${values.join(', ')}, got '${raw}'`);
    set(c, raw as T);
  };
}

/** A LoRA adapter's name: a directory under RAGGUARD_ADAPTER_DIR, never a path. */
export const ADAPTER_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

const ROOT = path.resolve(import.meta.dirname, '..', '..', '..');
export const rel = (p: string) => path.resolve(ROOT, p);

/** An http(s) URL, as given; refused otherwise. */
export function httpUrl(raw: string): string {
  let u: URL;
  try {
    u = new URL(raw.trim());
  } catch {
    throw new Error(`expected an http:// or https:// URL, got '${raw}'`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error(`expected an http:// or https:// URL, got '${raw}'`);
  return raw.trim();
}

export function apiKey(v: string): string {
  if (v !== '' && (v.length < 8 || /\s/.test(v))) throw new Error('expected at least 8 characters and no whitespace');
  return v;
}
