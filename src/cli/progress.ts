/**
 * A progress bar on stderr: redrawn in place on a terminal, one line per update elsewhere (a log, a
 * pipe), so that it never mixes with the report on stdout.
 */
export class ProgressBar {
  private readonly tty: boolean;

  constructor(private readonly total: number, private readonly out: NodeJS.WriteStream = process.stderr, private readonly width = 30) {
    this.tty = out.isTTY === true;
  }

  update(done: number, label: string): void {
    const frac = this.total === 0 ? 1 : done / this.total;
    const fill = Math.round(frac * this.width);
    const bar = `[${'#'.repeat(fill)}${'.'.repeat(this.width - fill)}] ${done}/${this.total} ${Math.round(frac * 100)}%`;
    if (this.tty) {
      const cols = this.out.columns ?? 100;
      this.out.write(`\r\x1b[K${`${bar} ${label}`.slice(0, cols - 1)}`);
    } else {
      this.out.write(`${bar} ${label}\n`);
    }
  }

  end(): void {
    if (this.tty) this.out.write('\n');
  }
}
