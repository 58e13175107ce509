import { useEffect, useState } from "react";
import { formatBytes, postJSON, request, type TagModel } from "../api";
import { PullForm } from "../components/PullForm";
import type { ModelState } from "../hooks";

function Drawer({ model, onClose }: { model: string; onClose: () => void }) {
  const [info, setInfo] = useState<Record<string, unknown> | null>(null);
  const [error, setError] = useState("");
  useEffect(() => {
    postJSON<Record<string, unknown>>("/api/show", { model }).then(setInfo, (e) => setError(String(e.message)));
  }, [model]);
  return (
    <aside className="drawer" data-testid="details-drawer">
      <header className="row"><h3>{model}</h3><button className="icon" onClick={onClose}>×</button></header>
      {error && <p className="err">{error}</p>}
      {info && (
        <>
          <h4>Details</h4>
          <pre>{JSON.stringify(info.details, null, 2)}</pre>
          <h4>Model info</h4>
          <pre>{JSON.stringify(info.model_info, null, 2)}</pre>
          <h4>Parameters</h4>
          <pre>{String(info.parameters ?? "")}</pre>
          <h4>Template</h4>
          <pre>{String(info.template ?? "")}</pre>
        </>
      )}
    </aside>
  );
}

export function Models({ models }: { models: ModelState }) {
  const [open, setOpen] = useState<string | null>(null);
  const [error, setError] = useState("");
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
  const load = (m: TagModel) => act(() => postJSON("/api/generate", { model: m.name, prompt: "" }));
  const unload = (m: TagModel) => act(() => postJSON("/api/generate", { model: m.name, prompt: "", keep_alive: 0 }));
  return (
    <div className="models">
      <h2>Models</h2>
      <PullForm onDone={models.refresh} />
      {(error || models.error) && <p className="err">{error || models.error}</p>}
      <table data-testid="models-table">
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
              <td>{loaded.has(m.name) ? <span className="ok">loaded</span> : <span className="muted">on disk</span>}</td>
              <td className="actions">
                {loaded.has(m.name) ? <button onClick={() => unload(m)}>Unload</button> : <button onClick={() => load(m)}>Load</button>}
                <button onClick={() => copy(m)}>Copy</button>
                <button className="danger" data-testid={`delete-${m.name}`}
                  onClick={() => confirm(`Delete ${m.name}?`) && remove(m)}>Delete</button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <h3>Running</h3>
      <table data-testid="running-table">
        <thead><tr><th>Name</th><th>Size</th><th>GPU memory</th><th>Context</th><th>Expires</th></tr></thead>
        <tbody>
          {models.running.map((r) => (
            <tr key={r.name}>
              <td>{r.name}</td><td>{formatBytes(r.size)}</td><td>{formatBytes(r.size_vram ?? 0)}</td>
              <td>{r.context_length ?? ""}</td><td>{new Date(r.expires_at).toLocaleString()}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {open && <Drawer key={open} model={open} onClose={() => setOpen(null)} />}
    </div>
  );
}
