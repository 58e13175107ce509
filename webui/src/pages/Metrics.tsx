import { useEffect, useSyncExternalStore } from "react";
import { Chart } from "../components/Chart";
import { ProfileTable } from "../components/ProfileTable";
import { active, snapshot, startHistory, subscribe, WINDOW, EVERY_MS, type Point } from "../metricsHistory";

const ms = (v: number | null) => (v == null ? null : v * 1000);
// null leaves a gap: a value nobody measured is not drawn as a zero.
const series = (pts: Point[], ...fs: ((p: Point) => number | null)[]) =>
  [pts.map((p) => p.t), ...fs.map((f) => pts.map((p) => f(p)))];
const clock = (t: number) => new Date(t * 1000).toLocaleTimeString();
const SPAN_S = (WINDOW * EVERY_MS) / 1000;
const MINUTES = SPAN_S / 60;

function IdleNote({ points }: { points: Point[] }) {
  const lastActive = [...points].reverse().find(active);
  return (
    <div className="idle" data-testid="metrics-idle">
      <b>Idle</b>{" "}
      <span className="muted">
        {lastActive ? `since ${clock(lastActive.t)}` : `nothing has run since ${clock(points[0].t)}`}
      </span>
    </div>
  );
}

export function Metrics() {
  useEffect(startHistory, []);
  const { points, totals, error } = useSyncExternalStore(subscribe, snapshot);
  const latest = points[points.length - 1];
  const busy = latest ? active(latest) : false;
  const everActive = points.some(active);
  const noLatency = latest?.ttft50 == null;
  return (
    <div className="metrics">
      <h2>Metrics <span className="muted small">last {MINUTES} minutes, every {EVERY_MS / 1000} s</span></h2>
      {error && <p className="err">{error}</p>}
      <div className="cards">
        <div className="card"><span>Now</span>
          <b data-testid="metrics-status" className={busy ? "ok" : "muted"}>
            {!busy ? "idle" : latest.running || latest.waiting ? `busy: ${latest.running} running, ${latest.waiting} waiting`
              : `active: ${fmt(latest.promptTokS + latest.genTokS)} tok/s in the last ${EVERY_MS / 1000} s`}</b></div>
        <div className="card"><span>Generated tokens</span><b data-testid="total-generation">{totals.generation}</b></div>
        <div className="card"><span>Prompt tokens</span><b data-testid="total-prompt">{totals.prompt}</b></div>
        <div className="card"><span>Finished requests</span><b data-testid="total-finished">{totals.finished}</b></div>
        <div className="card"><span>TTFT p50 / p95</span><b>{fmt(ms(latest?.ttft50 ?? null))} / {fmt(ms(latest?.ttft95 ?? null))} ms</b></div>
        <div className="card"><span>ITL p50 / p95</span><b>{fmt(ms(latest?.itl50 ?? null))} / {fmt(ms(latest?.itl95 ?? null))} ms</b></div>
      </div>
      {!busy && points.length > 0 && <IdleNote points={points} />}
      <div className="charts">
        <Chart spanS={SPAN_S} title="Throughput (tok/s)" labels={["prompt", "generation"]} idle={!everActive ? "idle: no tokens" : ""}
          data={series(points, (p) => p.promptTokS, (p) => p.genTokS)} />
        <Chart spanS={SPAN_S} title="Requests" labels={["running", "waiting"]} idle={!everActive ? "idle: no requests" : ""}
          data={series(points, (p) => p.running, (p) => p.waiting)} />
        <Chart spanS={SPAN_S} title="KV cache and prefix cache (%)" labels={["KV usage", "prefix hit rate"]} unit="%"
          idle={!everActive ? "idle: cache unused" : ""} data={series(points, (p) => p.kv, (p) => p.hit)} />
        <Chart spanS={SPAN_S} title="Latency (ms, since start)" labels={["TTFT p50", "TTFT p95", "ITL p50", "ITL p95"]}
          idle={noLatency ? "no requests measured yet" : ""}
          data={series(points, (p) => ms(p.ttft50), (p) => ms(p.ttft95), (p) => ms(p.itl50), (p) => ms(p.itl95))} />
      </div>
      <ProfileTable />
    </div>
  );
}

function fmt(v: number | null): string {
  return v == null ? "–" : v.toFixed(v < 10 ? 1 : 0);
}
