import { useEffect, useState } from "react";
import { listLoading, type LoadingModel } from "../api";

const EVERY_MS = 500;
const AFTER_MS = 700; // a first token sooner than this needs no loading state: ask no one

// While `active` (after AFTER_MS), the server's model loads under way, polled; [] otherwise.
export function useLoading(active: boolean): LoadingModel[] {
  const [loads, setLoads] = useState<LoadingModel[]>([]);
  useEffect(() => {
    if (!active) { setLoads([]); return; }
    let stopped = false;
    const tick = async () => {
      try { const l = await listLoading(); if (!stopped) setLoads(l); } catch { /* shown again next tick */ }
    };
    let t = 0;
    const first = window.setTimeout(() => { tick(); t = window.setInterval(tick, EVERY_MS); }, AFTER_MS);
    return () => { stopped = true; clearTimeout(first); clearInterval(t); };
  }, [active]);
  return loads;
}

const sameModel = (a: string, b: string) => a === b || a === `${b}:latest` || `${a}:latest` === b;
export const loadOf = (loads: LoadingModel[], model: string) => loads.find((l) => sameModel(l.name, model));

const WAITING: Record<string, string> = {
  "waiting for a slot": "waits for a free model slot (the loaded models are busy)",
  "waiting for another load": "waits for another model to finish loading",
};

// The server reports no finer progress than the seconds so far and the previous load's time:
// the bar estimates from that one (held below 95% until the load ends) or, before any load
// and while waiting for its turn, moves without a percentage.
export function LoadingBar({ load }: { load: LoadingModel }) {
  const est = load.previous_load_s;
  const loading = load.stage === "loading";
  const pct = loading && est ? Math.min(95, (load.stage_elapsed_s / est) * 100) : null;
  const what = loading ? `Loading model ${load.name}` : `${load.name} ${WAITING[load.stage] ?? load.stage}`;
  const howLong = loading
    ? `${load.stage_elapsed_s.toFixed(1)} s${est ? ` of about ${est.toFixed(1)} s (its last load)` : ""}`
    : `${load.elapsed_s.toFixed(1)} s${est ? `; loading then takes about ${est.toFixed(1)} s (its last load)` : ""}`;
  return (
    <div className="loading" data-testid="model-loading" data-stage={load.stage} role="status">
      <div className="loading-text">
        <span>{what}…</span>
        <span className="muted" data-testid="loading-time">{howLong}</span>
      </div>
      <div className={`bar-track ${pct == null ? "indeterminate" : ""}`}>
        <div className="bar-fill" style={pct == null ? undefined : { width: `${pct}%` }} />
      </div>
    </div>
  );
}
