import { useEffect, useState } from "react";
import { isBaseModel, showModel, type ShowResponse } from "../api";

const TEMPLATE_ORIGIN: Record<string, string> = {
  model: "its own (from the model files or Modelfile)",
  "built-in": "none of its own: base model (MLXR's template for the family is used by /api/chat)",
  none: "none: base model (completion only)",
};

function text(v: unknown): string {
  if (v == null) return "";
  if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en-US") : String(+v.toPrecision(6));
  if (Array.isArray(v)) return v.map(text).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function KeyValues({ rows, testId }: { rows: [string, unknown][]; testId: string }) {
  return (
    <table className="kv" data-testid={testId}>
      <tbody>{rows.map(([k, v]) => <tr key={k}><th>{k}</th><td>{text(v)}</td></tr>)}</tbody>
    </table>
  );
}

function SamplingTable({ info }: { info: ShowResponse }) {
  const values = (info.model_info?.["mlxr.sampling_defaults"] ?? {}) as Record<string, unknown>;
  const sources = (info.model_info?.["mlxr.sampling_sources"] ?? {}) as Record<string, string>;
  const keys = Object.keys(values);
  if (!keys.length) return <p className="muted" data-testid="sampling-defaults">None from the model: each API's own defaults apply.</p>;
  return (
    <table data-testid="sampling-defaults">
      <thead><tr><th>Parameter</th><th>Value</th><th>From</th></tr></thead>
      <tbody>{keys.map((k) => <tr key={k}><td>{k}</td><td>{text(values[k])}</td><td className="muted">{sources[k] ?? ""}</td></tr>)}</tbody>
    </table>
  );
}

// /api/show of one model as tables: what it is, the sampling defaults in force, its architecture.
export function ModelDetails({ model, onClose }: { model: string; onClose: () => void }) {
  const [info, setInfo] = useState<ShowResponse | null>(null);
  const [error, setError] = useState("");
  useEffect(() => { showModel(model).then(setInfo, (e) => setError(String(e.message))); }, [model]);
  const mi = info?.model_info ?? {};
  const origin = String(mi["mlxr.chat_template"] ?? "");
  const arch = Object.entries(mi).filter(([k]) => !k.startsWith("mlxr."));
  const details = Object.entries(info?.details ?? {}).filter(([, v]) => v !== "" && v != null && !(Array.isArray(v) && !v.length));
  return (
    <aside className="drawer" data-testid="details-drawer">
      <header className="row"><h3>{model}</h3><button className="icon" onClick={onClose}>×</button></header>
      {error && <p className="err">{error}</p>}
      {info && (
        <>
          <KeyValues testId="model-summary" rows={[
            ["Kind", isBaseModel(info) ? "base model (continues text; use completion mode)" : "chat model"],
            ["Chat template", TEMPLATE_ORIGIN[origin] ?? origin],
            ["Capabilities", (info.capabilities ?? []).join(", ")],
            ...details,
            ["Modified", info.modified_at ? new Date(info.modified_at).toLocaleString() : ""],
          ]} />
          <h4>Sampling defaults in force</h4>
          <SamplingTable info={info} />
          <h4>Architecture</h4>
          <KeyValues testId="model-info" rows={arch} />
          <details><summary>Parameters (Modelfile form)</summary><pre>{info.parameters ?? ""}</pre></details>
          <details><summary>Template</summary><pre>{info.template ?? ""}</pre></details>
        </>
      )}
    </aside>
  );
}
