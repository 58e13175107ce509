// The few parts of Prometheus' text exposition format the metrics page reads.
export interface Sample { name: string; labels: Record<string, string>; value: number }

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parseProm(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(LABEL)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

// Sum over models (label model_name) of one series.
export function total(samples: Sample[], name: string): number {
  return samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
}

// Cumulative bucket counts summed over models: [[le, count]] sorted by le.
export function buckets(samples: Sample[], histogram: string): [number, number][] {
  const by = new Map<number, number>();
  for (const s of samples) {
    if (s.name !== `${histogram}_bucket`) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    by.set(le, (by.get(le) ?? 0) + s.value);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

// The quantile by linear interpolation inside the bucket holding it, as PromQL's
// histogram_quantile does; null when there are no observations.
export function quantile(q: number, cumulative: [number, number][]): number | null {
  const count = cumulative.length ? cumulative[cumulative.length - 1][1] : 0;
  if (!count) return null;
  const rank = q * count;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, c] of cumulative) {
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + ((le - prevLe) * (rank - prevCount)) / Math.max(c - prevCount, 1e-12);
    }
    prevLe = le;
    prevCount = c;
  }
  return prevLe;
}
