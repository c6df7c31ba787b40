/**
 * The one-round-trip search's SQL writers (src/retrieval/pg-one-shot.ts), without a database: a query
 * vector's float32s written in the fewest digits that read back exactly, numbers that are not finite (or
 * not integers where an integer is meant) refused, strings through pg's escapeLiteral, and the rows of a
 * multi-statement query's search picked by position. test/pg-search-round-trip.test.ts runs them on Postgres.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type pg from 'pg';
import pgvector from 'pgvector';
import { seededRandom } from '../src/generate/sampler.js';
import {
  float32Text, floatLiteral, intLiteral, jsonbLiteral, oneShotRows, oneShotSql, textArrayLiteral, textLiteral, vectorLiteral,
} from '../src/retrieval/pg-one-shot.js';
import { searchSettingsSql, writeTransactionSql } from '../src/retrieval/pg-search-settings.js';

/** A float32 from its 32 bits. */
function fromBits(bits: number): number {
  const view = new DataView(new ArrayBuffer(4));
  view.setUint32(0, bits >>> 0);
  return view.getFloat32(0);
}

test('every float32 is written in at most 9 significant digits that read back to exactly it', () => {
  const next = seededRandom(32);
  let checked = 0;
  const samples: number[] = [
    0.1, -0.1, 1, -1, 100, 1e8, 123456789, 1.5e-8, 3.4028234663852886e38, -3.4028234663852886e38,
    1.1754943508222875e-38, 1.401298464324817e-45, 0.3333333432674408, Math.PI, -Math.E,
  ];
  for (let i = 0; i < 200_000; i++) samples.push(fromBits(Math.floor(next() * 2 ** 32)));
  // Unit-sphere components, as an embedder writes them.
  for (let i = 0; i < 100_000; i++) samples.push(Math.fround((next() * 2 - 1) / 8));
  // The float32s next to each power of ten and each edge of the integer path's range (1e-6, 1e8), both signs.
  const bits = new Uint32Array(1);
  const asFloat = new Float32Array(bits.buffer);
  for (let k = -8; k <= 9; k++) {
    for (const sign of [1, -1]) {
      asFloat[0] = sign * 10 ** k;
      const at = bits[0]!;
      for (let j = -40; j <= 40; j++) samples.push(fromBits(at + j));
    }
  }
  for (const x of samples) {
    const f = Math.fround(x);
    if (!Number.isFinite(f)) continue;
    const s = float32Text(x);
    assert.equal(Math.fround(Number(s)), f, `${x} written as ${s}`);
    const digits = s.replace(/^-/, '').replace(/e.*$/, '').replace('.', '').replace(/^0+/, '');
    assert.ok(digits.length <= 9, `${s}: ${digits.length} significant digits`);
    assert.match(s, /^-?(\d+(\.\d+)?)(e[+-]\d+)?$/, `${s} is a plain number`);
    checked++;
  }
  assert.ok(checked > 290_000);
  assert.equal(float32Text(0.1), '0.100000001');
  assert.equal(float32Text(1), '1');
  assert.equal(float32Text(100), '100');
  assert.equal(float32Text(1e8), '100000000');
  assert.equal(float32Text(1e10), '1e+10');
  assert.equal(float32Text(2 ** -30), '9.31322575e-10');
  assert.equal(float32Text(-0), '0');
  assert.equal(float32Text(-8.23611903655049e-30), '-8.23611904e-30');
});

test('NaN, the infinities and values past float32\'s range are refused, never written', () => {
  for (const bad of [NaN, Infinity, -Infinity, 1e39, -1e39]) {
    assert.throws(() => float32Text(bad), RangeError, String(bad));
    assert.throws(() => vectorLiteral(Float32Array.of(0.5, bad)), RangeError, String(bad));
  }
  for (const bad of [NaN, Infinity, -Infinity]) assert.throws(() => floatLiteral(bad), RangeError, String(bad));
  assert.equal(floatLiteral(1e39), '1e+39::float8');
  for (const bad of [NaN, Infinity, 1.5, 2 ** 53]) assert.throws(() => intLiteral(bad), RangeError, String(bad));
  assert.equal(intLiteral(10), '10');
  assert.equal(intLiteral(-3), '(-3)');
  assert.equal(floatLiteral(1.2), '1.2::float8');
  assert.equal(floatLiteral(-0.5), '(-0.5)::float8');
});

test('a query vector is pgvector\'s text form, compact', () => {
  assert.equal(vectorLiteral(Float32Array.of(0.5, -0.25, 0.1, 0)), "'[0.5,-0.25,0.100000001,0]'::vector");
  // 384 dimensions of an embedder's scale: a third shorter than pgvector's toSql (a double's digits).
  const next = seededRandom(7);
  const v = Float32Array.from({ length: 384 }, () => (next() * 2 - 1) / 8);
  const doubles = String(pgvector.toSql(Array.from(v))).length;
  assert.ok(vectorLiteral(v).length < 0.75 * doubles, `${vectorLiteral(v).length} characters against ${doubles}`);
});

test('strings go through escapeLiteral: a quote and a backslash cannot end the literal', () => {
  assert.equal(textLiteral("it's"), "'it''s'");
  assert.equal(textLiteral('a\\b'), " E'a\\\\b'");
  assert.equal(textLiteral("x'; DROP TABLE ragguard_chunks; --\\"), " E'x''; DROP TABLE ragguard_chunks; --\\\\'");
  assert.equal(jsonbLiteral({ "o'k": 'a\\"b' }), ` E'{"o''k":"a\\\\\\\\\\\\"b"}'::jsonb`);
  assert.equal(textArrayLiteral(["it's", 'b']), "ARRAY['it''s','b']::text[]");
  assert.equal(textArrayLiteral([]), "'{}'::text[]");
  assert.throws(() => textLiteral(5 as unknown as string), TypeError);
});

test('the settings: local set_configs with checked integers, the collection escaped; a write\'s opening', () => {
  assert.equal(writeTransactionSql({ statementTimeoutMs: 30_000 }), 'BEGIN; SET LOCAL statement_timeout = 30000');
  assert.throws(() => writeTransactionSql({ statementTimeoutMs: NaN }), RangeError);
  assert.throws(() => searchSettingsSql({ efSearch: 1.5, statementTimeoutMs: 0 }), RangeError);
  assert.throws(() => searchSettingsSql({ efSearch: 400, statementTimeoutMs: -1.5 }), RangeError);
  const plain = searchSettingsSql({ efSearch: 400, statementTimeoutMs: 100 });
  assert.match(plain, /^SELECT set_config\('transaction_read_only', 'on', true\), set_config\('hnsw.iterative_scan', 'relaxed_order', true\), /);
  assert.match(plain, /set_config\('hnsw.ef_search', '400', true\), set_config\('statement_timeout', '100', true\)$/);
  const open = searchSettingsSql({ efSearch: 400, statementTimeoutMs: 100, collection: "a'b" });
  assert.match(open, /FROM ragguard_collection_stats WHERE collection = 'a''b'\), 400\)::text, true\)/);
  assert.doesNotMatch(open, /;/);
});

test('a one-shot search is its settings and the statement; its rows are the statement\'s', () => {
  assert.equal(oneShotSql('SELECT 0', 'SELECT 1'), 'SELECT 0; SELECT 1');
  assert.throws(() => oneShotSql('SELECT 0', 'SELECT 1;'));
  const result = (command: string, rows: { n: number }[]) => ({ command, rows, rowCount: rows.length, oid: 0, fields: [] }) as pg.QueryResult<{ n: number }>;
  const sent = [result('SELECT', [{ n: 9 }]), result('SELECT', [{ n: 1 }, { n: 2 }])];
  assert.deepEqual(oneShotRows(sent), [{ n: 1 }, { n: 2 }]);
  assert.throws(() => oneShotRows(sent.slice(0, 1)), /did not run as sent/);
  assert.throws(() => oneShotRows(result('SELECT', [])), /did not run as sent/);
  assert.throws(() => oneShotRows([result('SELECT', []), result('SELECT', [{ n: 1 }])]), /did not run as sent/);
  assert.throws(() => oneShotRows([...sent, result('SELECT', [])]), /did not run as sent/);
});
