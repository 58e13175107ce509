// A cosine-similarity matrix as a heat map. The colour scale spans the off-diagonal values of
// this matrix (small models put every pair near 1, which a fixed -1..1 scale shows as one colour);
// the legend says which values the ends stand for.

// From pale to saturated blue, then to amber at the top of the scale.
const STOPS: [number, number, number][] = [[30, 41, 59], [37, 99, 235], [96, 165, 250], [250, 204, 21]];

export function scaleColour(f: number): string {
  const x = Math.max(0, Math.min(1, f)) * (STOPS.length - 1);
  const i = Math.min(Math.floor(x), STOPS.length - 2);
  const t = x - i;
  const [a, b] = [STOPS[i], STOPS[i + 1]];
  const c = a.map((v, k) => Math.round(v + (b[k] - v) * t));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

export function range(sims: number[][]): [number, number] {
  const off = sims.flatMap((row, i) => row.filter((_, j) => j !== i));
  if (!off.length) return [-1, 1];
  const lo = Math.min(...off), hi = Math.max(...off);
  return hi - lo < 1e-6 ? [lo - 0.5, hi + 0.5] : [lo, hi];
}

export function SimilarityMatrix({ inputs, sims }: { inputs: string[]; sims: number[][] }) {
  const [lo, hi] = range(sims);
  const at = (v: number) => (v - lo) / (hi - lo);
  const ink = (v: number) => (at(v) > 0.55 ? "#0b1020" : "#f8fafc");
  return (
    <div className="simwrap">
      <div className="table-wrap">
        <table className="matrix" data-testid="cosine-matrix">
          <thead><tr><th />{inputs.map((_, i) => <th key={i}>{i + 1}</th>)}</tr></thead>
          <tbody>
            {sims.map((row, i) => (
              <tr key={i}>
                <th title={inputs[i]}>{i + 1}. {inputs[i].slice(0, 30)}</th>
                {row.map((v, j) => (i === j
                  ? <td key={j} className="sim self" title="an input with itself">{v.toFixed(3)}</td>
                  : <td key={j} className="sim" title={`${inputs[i]}\n${inputs[j]}\ncosine ${v.toFixed(4)}`}
                    style={{ background: scaleColour(at(v)), color: ink(v) }}>{v.toFixed(3)}</td>))}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <div className="legend" data-testid="similarity-legend">
        <span>{lo.toFixed(3)}</span>
        <span className="ramp" style={{ background: `linear-gradient(to right, ${[0, 0.33, 0.67, 1].map(scaleColour).join(", ")})` }} />
        <span>{hi.toFixed(3)}</span>
        <span className="muted">cosine similarity, scaled to the lowest and highest pair (the diagonal is 1)</span>
      </div>
    </div>
  );
}
