import { useState } from "react";
import { formatBytes, postJSON, request, type TagModel } from "../api";
import { LoadingBar, loadOf, useLoading } from "../components/LoadingState";
import { ModelDetails } from "../components/ModelDetails";
import { PullForm } from "../components/PullForm";
import type { ModelState } from "../hooks";

export function Models({ models }: { models: ModelState }) {
  const [open, setOpen] = useState<string | null>(null);
  const [error, setError] = useState("");
  const [pending, setPending] = useState(0); // load requests in flight from this page
  const loads = useLoading(pending > 0);
  const loaded = new Map(models.running.map((r) => [r.name, r]));
  const act = async (f: () => Promise<unknown>) => {
    setError("");
    try { await f(); } catch (e) { setError(String((e as Error).message ?? e)); }
    await models.refresh();
  };
  const copy = (m: TagModel) => {
    const to = prompt(`Copy ${m.name} to:`, `${m.name.split(":")[0]}-copy`);
    if (to) act(() => request("POST", "/api/copy", { source: m.name, destination: to }));
  };
  const remove = (m: TagModel) => act(() => request("DELETE", "/api/delete", { model: m.name }));
  const load = async (m: TagModel) => {
    setPending((n) => n + 1);
    try { await act(() => postJSON("/api/generate", { model: m.name, prompt: "" })); } finally { setPending((n) => n - 1); }
  };
  const unload = (m: TagModel) => act(() => postJSON("/api/generate", { model: m.name, prompt: "", keep_alive: 0 }));
  return (
    <div className="models">
      <h2>Models</h2>
      <PullForm onDone={models.refresh} />
      {(error || models.error) && <p className="err">{error || models.error}</p>}
      <div className="table-wrap"><table data-testid="models-table">
        <thead><tr><th>Name</th><th>Size</th><th>Format</th><th>Family</th><th>Params</th><th>Quant</th><th>State</th><th></th></tr></thead>
        <tbody>
          {models.models.map((m) => (
            <tr key={m.name} data-model={m.name}>
              <td><button className="link" onClick={() => setOpen(m.name)}>{m.name}</button></td>
              <td>{formatBytes(m.size)}</td>
              <td>{m.details?.format}</td>
              <td>{m.details?.family}</td>
              <td>{m.details?.parameter_size}</td>
              <td>{m.details?.quantization_level}</td>
              <td>{loaded.has(m.name) ? <span className="ok">loaded</span>
                : loadOf(loads, m.name) ? <LoadingBar load={loadOf(loads, m.name)!} /> : <span className="muted">on disk</span>}</td>
              <td className="actions">
                {loaded.has(m.name) ? <button onClick={() => unload(m)}>Unload</button> : <button onClick={() => load(m)}>Load</button>}
                <button onClick={() => copy(m)}>Copy</button>
                <button className="danger" data-testid={`delete-${m.name}`}
                  onClick={() => confirm(`Delete ${m.name}?`) && remove(m)}>Delete</button>
              </td>
            </tr>
          ))}
        </tbody>
      </table></div>
      <h3>Running</h3>
      <div className="table-wrap"><table data-testid="running-table">
        <thead><tr><th>Name</th><th>Size</th><th>GPU memory</th><th>Context</th><th>Expires</th></tr></thead>
        <tbody>
          {models.running.map((r) => (
            <tr key={r.name}>
              <td>{r.name}</td><td>{formatBytes(r.size)}</td><td>{formatBytes(r.size_vram ?? 0)}</td>
              <td>{r.context_length ?? ""}</td><td>{new Date(r.expires_at).toLocaleString()}</td>
            </tr>
          ))}
        </tbody>
      </table></div>
      {open && <ModelDetails key={open} model={open} onClose={() => setOpen(null)} />}
    </div>
  );
}
