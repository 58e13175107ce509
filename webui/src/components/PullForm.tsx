import { useState } from "react";
import { ndjson, request } from "../api";

interface Step { status?: string; total?: number; completed?: number; error?: string }

// Pull (a local file path or file:// URL; there is no model hub) or import (create from a
// path or an existing model under a new name), showing the server's progress stream.
export function PullForm({ onDone }: { onDone: () => void }) {
  const [source, setSource] = useState("");
  const [name, setName] = useState("");
  const [step, setStep] = useState<Step | null>(null);
  const [busy, setBusy] = useState(false);
  const [steps, setSteps] = useState(0);
  const run = async (e: React.FormEvent) => {
    e.preventDefault();
    if (!source.trim()) return;
    setBusy(true);
    setStep({ status: "starting" });
    setSteps(0);
    try {
      const res = name.trim()
        ? await request("POST", "/api/create", { model: name.trim(), from: source.trim(), stream: true })
        : await request("POST", "/api/pull", { model: source.trim(), stream: true });
      for await (const s of ndjson<Step>(res)) {
        setStep(s);
        setSteps((n) => n + 1);
      }
    } catch (err) {
      setStep({ error: String((err as Error).message ?? err) });
    } finally {
      setBusy(false);
      onDone();
    }
  };
  const pct = step?.total ? Math.round(((step.completed ?? 0) / step.total) * 100) : null;
  return (
    <form className="pull" onSubmit={run} data-testid="pull-form">
      <input data-testid="pull-source" placeholder="/path/to/model.gguf, file:// URL or a model directory"
        value={source} onChange={(e) => setSource(e.target.value)} />
      <input data-testid="pull-name" placeholder="name (optional: import under this name)"
        value={name} onChange={(e) => setName(e.target.value)} />
      <button className="primary" disabled={busy} data-testid="pull-submit">{name.trim() ? "Import" : "Pull"}</button>
      {step && (
        <div className="progress" data-testid="pull-progress" data-steps={steps}>
          {step.error ? <span className="err">{step.error}</span> : <span>{step.status}</span>}
          {pct !== null && <progress max={100} value={pct} />}
          {pct !== null && <span>{pct}%</span>}
        </div>
      )}
    </form>
  );
}
