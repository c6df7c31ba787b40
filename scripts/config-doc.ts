/** Prints the configuration table (every environment variable, its default and meaning) for the README. */
import { configTable } from '../src/config/config.js';

console.log(configTable());
