// The last minutes of /metrics, sampled from the first time the metrics page opens and on while
// other pages are shown, so coming back to it shows what happened meanwhile. (Not from the
// moment the UI opens: polling on every page would take a slow link's bandwidth from replies.)
import { getText } from "./api";
import { buckets, parseProm, quantile, total, type Sample } from "./prom";

export const EVERY_MS = 2000;
export const WINDOW = 300; // points kept: ten minutes

export interface Point {
  t: number; promptTokS: number; genTokS: number; running: number; waiting: number; kv: number; hit: number | null;
  ttft50: number | null; ttft95: number | null; itl50: number | null; itl95: number | null;
}

export interface History {
  points: Point[];
  totals: { prompt: number; generation: number; finished: number };
  error: string;
}

function point(now: Sample[], before: Sample[] | null, dt: number, t: number): Point {
  const rate = (n: string) => (before ? Math.max(total(now, n) - total(before, n), 0) / dt : 0);
  const queries = rate("vllm:prefix_cache_queries_total");
  const ttft = buckets(now, "vllm:time_to_first_token_seconds");
  const itl = buckets(now, "vllm:inter_token_latency_seconds");
  return {
    t, promptTokS: rate("vllm:prompt_tokens_total"), genTokS: rate("vllm:generation_tokens_total"),
    running: total(now, "vllm:num_requests_running"), waiting: total(now, "vllm:num_requests_waiting"),
    kv: total(now, "vllm:kv_cache_usage_perc") * 100, hit: queries ? (rate("vllm:prefix_cache_hits_total") / queries) * 100 : null,
    ttft50: quantile(0.5, ttft), ttft95: quantile(0.95, ttft), itl50: quantile(0.5, itl), itl95: quantile(0.95, itl),
  };
}

export const active = (p: Point) => p.promptTokS > 0 || p.genTokS > 0 || p.running > 0 || p.waiting > 0;

let state: History = { points: [], totals: { prompt: 0, generation: 0, finished: 0 }, error: "" };
let last: { s: Sample[]; at: number } | null = null;
let timer = 0;
const listeners = new Set<() => void>();

async function tick() {
  try {
    const s = parseProm(await getText("/metrics"));
    const at = performance.now();
    const p = point(s, last?.s ?? null, last ? (at - last.at) / 1000 : 1, Date.now() / 1000);
    last = { s, at };
    state = {
      points: [...state.points.slice(-WINDOW + 1), p],
      totals: { prompt: total(s, "vllm:prompt_tokens_total"), generation: total(s, "vllm:generation_tokens_total"),
        finished: total(s, "vllm:request_success_total") },
      error: "",
    };
  } catch (e) {
    state = { ...state, error: String((e as Error).message ?? e) };
  }
  listeners.forEach((f) => f());
}

export function startHistory(): void {
  if (timer) return;
  tick();
  timer = window.setInterval(tick, EVERY_MS);
}

export function subscribe(f: () => void): () => void {
  listeners.add(f);
  return () => listeners.delete(f);
}

export const snapshot = () => state;
