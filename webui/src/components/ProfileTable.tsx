import { useState } from "react";

interface OpRow { op: string; calls: number; ms_per_step: number }
interface Bench { model?: string; batch?: number; prompt_len?: number; gen_len?: number; decode_tok_s?: number; profile: OpRow[] }

function parseBench(text: string): Bench {
  const data = JSON.parse(text);
  const rows = data?.profile;
  if (!Array.isArray(rows) || !rows.every((r) => typeof r?.op === "string" && Number.isFinite(r?.ms_per_step))) {
    throw new Error("not a `mlxr bench --profile --json` file: no profile rows");
  }
  return data as Bench;
}

// The server keeps no per-op times: they come from `mlxr bench --profile --json FILE`,
// opened here from disk and read in the browser only.
export function ProfileTable() {
  const [bench, setBench] = useState<Bench | null>(null);
  const [error, setError] = useState("");
  const open = async (files: FileList | null) => {
    const file = files?.[0];
    if (!file) return;
    try { setBench(parseBench(await file.text())); setError(""); } catch (e) { setError(String((e as Error).message ?? e)); }
  };
  const total = bench ? bench.profile.reduce((a, r) => a + r.ms_per_step, 0) || 1 : 1;
  return (
    <section className="panel">
      <h3>Per-op time</h3>
      <p className="muted">From <code>mlxr bench --profile --json FILE</code>: open the file to see where a decode step's time goes.</p>
      <label className="button">Open bench JSON
        <input type="file" hidden accept=".json,application/json" data-testid="profile-file" onChange={(e) => open(e.target.files)} />
      </label>
      {error && <p className="err">{error}</p>}
      {bench && (
        <>
          <p className="muted">{bench.model} · batch {bench.batch} · prompt {bench.prompt_len} · gen {bench.gen_len}
            {bench.decode_tok_s != null && ` · decode ${bench.decode_tok_s.toFixed(1)} tok/s`}</p>
          <table data-testid="profile-table">
            <thead><tr><th>op</th><th>calls</th><th>ms / step</th><th>share</th></tr></thead>
            <tbody>
              {bench.profile.map((r) => (
                <tr key={r.op}>
                  <td>{r.op}</td><td>{r.calls}</td><td>{r.ms_per_step.toFixed(3)}</td>
                  <td className="share"><span className="bar" style={{ width: `${(120 * r.ms_per_step) / total}px` }} />
                    {((100 * r.ms_per_step) / total).toFixed(1)}%</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}
