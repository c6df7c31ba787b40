/**
 * The configuration table (every environment variable, its default and meaning) from src/config/config.ts.
 * Prints it; with --write, replaces the table between the README's config-doc markers instead, so the
 * README's reference is the typed config's own words.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { configTable } from '../src/config/config.js';

const BEGIN = '<!-- config-doc:begin -->';
const END = '<!-- config-doc:end -->';

if (process.argv.includes('--write')) {
  const file = new URL('../README.md', import.meta.url);
  const readme = readFileSync(file, 'utf8');
  const from = readme.indexOf(BEGIN);
  const to = readme.indexOf(END);
  if (from < 0 || to < from) throw new Error(`README.md lacks the markers ${BEGIN} ... ${END}`);
  writeFileSync(file, `${readme.slice(0, from + BEGIN.length)}\n\n${configTable()}\n\n${readme.slice(to)}`);
  console.log('README.md: configuration table written');
} else {
  console.log(configTable());
}
