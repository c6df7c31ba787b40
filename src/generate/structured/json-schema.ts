/**
 * A JSON Schema compiled into the grammar the decoding automaton walks (json-automaton.ts), for the
 * subset OpenAI's strict structured outputs allow: type (one or a list), object properties in their
 * declared order, required, additionalProperties, array items, enum, const, anyOf, and the annotations
 * (title, description, $schema, default, examples), which change nothing. Any other keyword is refused
 * by name (a schema accepted must be a schema enforced: never a keyword silently dropped).
 *
 * What is generated is always valid against the schema, even where the schema allows more: an object
 * with `properties` gets only those (in order; optional ones may be left out), whatever its
 * additionalProperties says; one without `properties` gets free keys whose values follow
 * additionalProperties (a schema; absent or true: any JSON value; false: the empty object).
 */

export class SchemaNotSupportedError extends Error {
  constructor(readonly keyword: string, readonly at: string, why: string) {
    super(`${at}: ${why}`);
  }
}

export type SchemaNode =
  | { readonly kind: 'string'; readonly id: number }
  | { readonly kind: 'number'; readonly id: number; readonly integer: boolean }
  /** Exact texts (enum, const, true/false, null), each a JSON serialization. */
  | { readonly kind: 'literal'; readonly id: number; readonly texts: readonly string[] }
  | { readonly kind: 'object'; readonly id: number; readonly props: readonly SchemaProp[]; readonly extra: SchemaNode | null }
  | { readonly kind: 'array'; readonly id: number; readonly items: SchemaNode }
  | { readonly kind: 'anyOf'; readonly id: number; readonly options: readonly SchemaNode[] };

export interface SchemaProp {
  /** The key as it is written, quotes included (JSON.stringify of the name). */
  readonly keyText: string;
  readonly node: SchemaNode;
  readonly required: boolean;
}

const ANNOTATIONS = new Set(['title', 'description', '$schema', 'default', 'examples', '$comment']);
const TYPES = new Set(['object', 'array', 'string', 'number', 'integer', 'boolean', 'null']);
const BY_TYPE: Record<string, ReadonlySet<string>> = {
  object: new Set(['properties', 'required', 'additionalProperties']),
  array: new Set(['items']),
  string: new Set(), number: new Set(), integer: new Set(), boolean: new Set(), null: new Set(),
};
/** Depth of nested schemas accepted: a bound on the work one request's schema can ask for. */
const MAX_DEPTH = 32;

/** A compiled schema: the root node and how many nodes (ids 0 .. count - 1). */
export interface CompiledSchema {
  readonly root: SchemaNode;
  readonly nodeCount: number;
}

class Compiler {
  private next = 0;
  /** Built once per compiled schema: recursion (any value holds any value) without recursion in the compiler. */
  readonly any: SchemaNode;
  readonly anyObject: SchemaNode;

  constructor() {
    const options: SchemaNode[] = [];
    const any: SchemaNode = { kind: 'anyOf', id: this.id(), options };
    const anyObject: SchemaNode = { kind: 'object', id: this.id(), props: [], extra: any };
    options.push(anyObject, { kind: 'array', id: this.id(), items: any }, { kind: 'string', id: this.id() },
      { kind: 'number', id: this.id(), integer: false }, { kind: 'literal', id: this.id(), texts: ['true', 'false', 'null'] });
    this.any = any;
    this.anyObject = anyObject;
  }

  id(): number {
    return this.next++;
  }

  get count(): number {
    return this.next;
  }

  compile(s: unknown, at: string, depth: number): SchemaNode {
    if (depth > MAX_DEPTH) throw new SchemaNotSupportedError('depth', at, `schemas nested deeper than ${MAX_DEPTH} levels are not supported`);
    if (s === true) return this.any;
    if (s === false) throw new SchemaNotSupportedError('false', at, 'the schema false matches nothing');
    if (s === null || typeof s !== 'object' || Array.isArray(s)) throw new SchemaNotSupportedError('schema', at, 'a schema must be an object');
    const o = s as Record<string, unknown>;
    for (const k of Object.keys(o)) {
      if (ANNOTATIONS.has(k) || k === 'type' || k === 'enum' || k === 'const' || k === 'anyOf') continue;
      if (Object.values(BY_TYPE).some((set) => set.has(k))) continue;
      throw new SchemaNotSupportedError(k, at, `the keyword '${k}' is not supported (constrained decoding enforces OpenAI's strict subset: ` +
        'type, properties, required, additionalProperties, items, enum, const, anyOf)');
    }
    if ('const' in o || 'enum' in o) return this.literal(o, at);
    if ('anyOf' in o) {
      const list = o['anyOf'];
      if (!Array.isArray(list) || list.length === 0) throw new SchemaNotSupportedError('anyOf', at, 'anyOf must be a non-empty array of schemas');
      const others = Object.keys(o).filter((k) => k !== 'anyOf' && !ANNOTATIONS.has(k));
      if (others.length > 0) throw new SchemaNotSupportedError(others[0]!, at, `'${others[0]}' beside anyOf is not supported (put it in each branch)`);
      return { kind: 'anyOf', id: this.id(), options: list.map((b, i) => this.compile(b, `${at}.anyOf[${i}]`, depth + 1)) };
    }
    const type = o['type'];
    let types: string[];
    if (type === undefined) {
      if ('properties' in o || 'required' in o || 'additionalProperties' in o) types = ['object'];
      else if ('items' in o) types = ['array'];
      else return this.any;
    } else types = Array.isArray(type) ? type.map(String) : [String(type)];
    if (types.length === 0) throw new SchemaNotSupportedError('type', at, 'type must name at least one type');
    for (const t of types) if (!TYPES.has(t)) throw new SchemaNotSupportedError('type', at, `type '${t}' is not a JSON Schema type`);
    for (const k of Object.keys(o)) {
      if (ANNOTATIONS.has(k) || k === 'type') continue;
      if (!types.some((t) => BY_TYPE[t]!.has(k))) throw new SchemaNotSupportedError(k, at, `'${k}' does not apply to type ${types.join(' or ')}`);
    }
    const nodes = types.map((t) => this.typed(t, o, at, depth));
    return nodes.length === 1 ? nodes[0]! : { kind: 'anyOf', id: this.id(), options: nodes };
  }

  private typed(t: string, o: Record<string, unknown>, at: string, depth: number): SchemaNode {
    switch (t) {
      case 'string': return { kind: 'string', id: this.id() };
      case 'number': return { kind: 'number', id: this.id(), integer: false };
      case 'integer': return { kind: 'number', id: this.id(), integer: true };
      case 'boolean': return { kind: 'literal', id: this.id(), texts: ['true', 'false'] };
      case 'null': return { kind: 'literal', id: this.id(), texts: ['null'] };
      case 'array': return { kind: 'array', id: this.id(), items: 'items' in o ? this.compile(o['items'], `${at}.items`, depth + 1) : this.any };
      default: return this.object(o, at, depth);
    }
  }

  private object(o: Record<string, unknown>, at: string, depth: number): SchemaNode {
    const props = o['properties'];
    if (props !== undefined && (props === null || typeof props !== 'object' || Array.isArray(props))) {
      throw new SchemaNotSupportedError('properties', at, 'properties must be an object of schemas');
    }
    const req = o['required'] ?? [];
    if (!Array.isArray(req) || req.some((r) => typeof r !== 'string')) throw new SchemaNotSupportedError('required', at, 'required must be an array of property names');
    const names = Object.keys((props ?? {}) as object);
    for (const r of req as string[]) {
      if (!names.includes(r)) throw new SchemaNotSupportedError('required', at, `required names '${r}', which properties does not define`);
    }
    const add = o['additionalProperties'];
    if (add !== undefined && typeof add !== 'boolean' && (add === null || typeof add !== 'object')) {
      throw new SchemaNotSupportedError('additionalProperties', at, 'additionalProperties must be a boolean or a schema');
    }
    if (names.length > 0) {
      const p = props as Record<string, unknown>;
      return {
        kind: 'object', id: this.id(), extra: null,
        props: names.map((n) => ({ keyText: JSON.stringify(n), node: this.compile(p[n], `${at}.properties.${n}`, depth + 1), required: (req as string[]).includes(n) })),
      };
    }
    if (add === false) return { kind: 'object', id: this.id(), props: [], extra: null };
    if (add === undefined || add === true) return this.anyObject;
    return { kind: 'object', id: this.id(), props: [], extra: this.compile(add, `${at}.additionalProperties`, depth + 1) };
  }

  private literal(o: Record<string, unknown>, at: string): SchemaNode {
    const values = 'const' in o ? [o['const']] : o['enum'];
    if (!Array.isArray(values) || values.length === 0) throw new SchemaNotSupportedError('enum', at, 'enum must be a non-empty array');
    const type = o['type'];
    const types = type === undefined ? undefined : new Set(Array.isArray(type) ? type.map(String) : [String(type)]);
    const texts = values.filter((v) => types === undefined || types.has(jsonType(v)) || (types.has('number') && jsonType(v) === 'integer'))
      .map((v) => JSON.stringify(v));
    if (texts.length === 0) throw new SchemaNotSupportedError('enum', at, 'no value of enum/const has the schema\'s type');
    const other = Object.keys(o).find((k) => !ANNOTATIONS.has(k) && k !== 'type' && k !== 'enum' && k !== 'const');
    if (other) throw new SchemaNotSupportedError(other, at, `'${other}' beside enum/const is not supported`);
    return { kind: 'literal', id: this.id(), texts: [...new Set(texts)] };
  }
}

function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

/** A JSON Schema (the subset above) compiled; throws SchemaNotSupportedError naming the keyword and where. */
export function compileSchema(schema: unknown, at = 'schema'): CompiledSchema {
  const c = new Compiler();
  const root = c.compile(schema, at, 0);
  return { root, nodeCount: c.count };
}

/** json_object: any JSON object. */
export function anyObjectSchema(): CompiledSchema {
  const c = new Compiler();
  return { root: c.anyObject, nodeCount: c.count };
}

/**
 * Whether `value` validates against `schema` (the same subset; for tests and benchmarks, so that a
 * check does not depend on the compiler it checks).
 */
export function validates(value: unknown, schema: unknown): boolean {
  if (schema === true || schema === undefined) return true;
  if (schema === false || schema === null || typeof schema !== 'object') return false;
  const s = schema as Record<string, unknown>;
  if ('const' in s && JSON.stringify(s['const']) !== JSON.stringify(value)) return false;
  if (Array.isArray(s['enum']) && !s['enum'].some((e) => JSON.stringify(e) === JSON.stringify(value))) return false;
  if (Array.isArray(s['anyOf']) && !s['anyOf'].some((b) => validates(value, b))) return false;
  if (s['type'] !== undefined) {
    const types = Array.isArray(s['type']) ? s['type'] as string[] : [s['type'] as string];
    const t = jsonType(value);
    if (!types.some((x) => x === t || (x === 'number' && t === 'integer'))) return false;
  }
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    const v = value as Record<string, unknown>;
    const props = (s['properties'] ?? {}) as Record<string, unknown>;
    for (const r of (s['required'] ?? []) as string[]) if (!(r in v)) return false;
    for (const [k, x] of Object.entries(v)) {
      if (k in props) {
        if (!validates(x, props[k])) return false;
      } else if (s['additionalProperties'] === false) return false;
      else if (s['additionalProperties'] !== undefined && !validates(x, s['additionalProperties'])) return false;
    }
  }
  if (Array.isArray(value) && s['items'] !== undefined && !value.every((x) => validates(x, s['items']))) return false;
  return true;
}
