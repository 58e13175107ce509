import { useEffect, useRef, useState } from "react";
import { getText } from "../api";
import { Chart } from "../components/Chart";
import { ProfileTable } from "../components/ProfileTable";
import { buckets, parseProm, quantile, total, type Sample } from "../prom";

const EVERY_MS = 1000;
const WINDOW = 120; // points kept per series

interface Point {
  t: number; promptTokS: number; genTokS: number; running: number; waiting: number; kv: number; hit: number;
  ttft50: number | null; ttft95: number | null; itl50: number | null; itl95: number | null;
}

function point(now: Sample[], before: Sample[] | null, dt: number, t: number): Point {
  const rate = (n: string) => (before ? Math.max(total(now, n) - total(before, n), 0) / dt : 0);
  const queries = rate("vllm:prefix_cache_queries_total");
  const ttft = buckets(now, "vllm:time_to_first_token_seconds");
  const itl = buckets(now, "vllm:inter_token_latency_seconds");
  return {
    t, promptTokS: rate("vllm:prompt_tokens_total"), genTokS: rate("vllm:generation_tokens_total"),
    running: total(now, "vllm:num_requests_running"), waiting: total(now, "vllm:num_requests_waiting"),
    kv: total(now, "vllm:kv_cache_usage_perc") * 100, hit: queries ? (rate("vllm:prefix_cache_hits_total") / queries) * 100 : 0,
    ttft50: quantile(0.5, ttft), ttft95: quantile(0.95, ttft), itl50: quantile(0.5, itl), itl95: quantile(0.95, itl),
  };
}

const ms = (v: number | null) => (v == null ? null : v * 1000);
const series = (pts: Point[], ...fs: ((p: Point) => number | null)[]) =>
  [pts.map((p) => p.t), ...fs.map((f) => pts.map((p) => f(p) ?? 0))];

export function Metrics() {
  const [points, setPoints] = useState<Point[]>([]);
  const [totals, setTotals] = useState({ prompt: 0, generation: 0, finished: 0 });
  const [error, setError] = useState("");
  const last = useRef<{ s: Sample[]; at: number } | null>(null);
  useEffect(() => {
    const tick = async () => {
      try {
        const s = parseProm(await getText("/metrics"));
        const at = performance.now();
        const dt = last.current ? (at - last.current.at) / 1000 : 1;
        const p = point(s, last.current?.s ?? null, dt, Date.now() / 1000);
        last.current = { s, at };
        setPoints((ps) => [...ps.slice(-WINDOW + 1), p]);
        setTotals({ prompt: total(s, "vllm:prompt_tokens_total"), generation: total(s, "vllm:generation_tokens_total"),
          finished: total(s, "vllm:request_success_total") });
        setError("");
      } catch (e) { setError(String((e as Error).message ?? e)); }
    };
    tick();
    const t = setInterval(tick, EVERY_MS);
    return () => clearInterval(t);
  }, []);
  const latest = points[points.length - 1];
  return (
    <div className="metrics">
      <h2>Metrics</h2>
      {error && <p className="err">{error}</p>}
      <div className="cards">
        <div className="card"><span>Generated tokens</span><b data-testid="total-generation">{totals.generation}</b></div>
        <div className="card"><span>Prompt tokens</span><b data-testid="total-prompt">{totals.prompt}</b></div>
        <div className="card"><span>Finished requests</span><b data-testid="total-finished">{totals.finished}</b></div>
        <div className="card"><span>TTFT p50 / p95</span><b>{fmt(ms(latest?.ttft50 ?? null))} / {fmt(ms(latest?.ttft95 ?? null))} ms</b></div>
        <div className="card"><span>ITL p50 / p95</span><b>{fmt(ms(latest?.itl50 ?? null))} / {fmt(ms(latest?.itl95 ?? null))} ms</b></div>
      </div>
      <div className="charts">
        <Chart title="Throughput (tok/s)" labels={["prompt", "generation"]} data={series(points, (p) => p.promptTokS, (p) => p.genTokS)} />
        <Chart title="Requests" labels={["running", "waiting"]} data={series(points, (p) => p.running, (p) => p.waiting)} />
        <Chart title="KV cache and prefix cache (%)" labels={["KV usage", "prefix hit rate"]} data={series(points, (p) => p.kv, (p) => p.hit)} unit="%" />
        <Chart title="Latency (ms, since start)" labels={["TTFT p50", "TTFT p95", "ITL p50", "ITL p95"]}
          data={series(points, (p) => ms(p.ttft50), (p) => ms(p.ttft95), (p) => ms(p.itl50), (p) => ms(p.itl95))} />
      </div>
      <ProfileTable />
    </div>
  );
}

function fmt(v: number | null): string {
  return v == null ? "–" : v.toFixed(v < 10 ? 1 : 0);
}
