import { useState } from "react";
import { postJSON } from "../api";
import { ModelPicker } from "../components/ModelPicker";
import { RerankPanel } from "../components/RerankPanel";
import { SimilarityMatrix } from "../components/SimilarityMatrix";
import { VisionPanel } from "../components/VisionPanel";
import { useShow, type ModelState } from "../hooks";

interface Logprobs { tokens: string[]; token_logprobs: (number | null)[]; top_logprobs: (Record<string, number> | null)[] | null }
interface CompletionResponse { choices: { text: string; logprobs: Logprobs | null }[] }

function Completion({ model }: { model: string }) {
  const [prompt, setPrompt] = useState("The capital of France is");
  const [maxTokens, setMaxTokens] = useState(16);
  const [temperature, setTemperature] = useState(0);
  const [result, setResult] = useState<Logprobs | null>(null);
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const run = async () => {
    setBusy(true); setError("");
    try {
      const r = await postJSON<CompletionResponse>("/v1/completions",
        { model, prompt, max_tokens: maxTokens, temperature, logprobs: 5 });
      setResult(r.choices[0]?.logprobs ?? null);
    } catch (e) { setError(String((e as Error).message ?? e)); } finally { setBusy(false); }
  };
  return (
    <section className="panel">
      <h3>Completion with per-token log-probabilities</h3>
      <textarea rows={3} value={prompt} onChange={(e) => setPrompt(e.target.value)} data-testid="completion-prompt" />
      <div className="row">
        <label>max tokens <input type="number" min={1} max={512} value={maxTokens} onChange={(e) => setMaxTokens(Number(e.target.value))} /></label>
        <label>temperature <input type="number" step={0.1} min={0} max={2} value={temperature} onChange={(e) => setTemperature(Number(e.target.value))} /></label>
        <button className="primary" onClick={run} disabled={busy || !model} data-testid="completion-run">Complete</button>
      </div>
      {error && <p className="err">{error}</p>}
      {result && (
        <div className="tokens" data-testid="completion-tokens">
          {result.tokens.map((t, i) => {
            const lp = result.token_logprobs[i];
            const p = lp == null ? 1 : Math.exp(lp);
            const top = result.top_logprobs?.[i] ?? {};
            const alts = Object.entries(top).map(([k, v]) => `${JSON.stringify(k)} ${(Math.exp(v) * 100).toFixed(1)}%`).join("\n");
            return (
              <span key={i} className={`tok p${Math.min(4, Math.floor(p * 5))}`} title={`p=${(p * 100).toFixed(1)}%\n${alts}`}>{t}</span>
            );
          })}
        </div>
      )}
    </section>
  );
}

function cosine(a: number[], b: number[]): number {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / (Math.sqrt(na * nb) || 1);
}

function Embeddings({ model }: { model: string }) {
  const [text, setText] = useState("the cat sat on the mat\na cat was sitting on a mat\nstock prices fell sharply");
  const [matrix, setMatrix] = useState<{ inputs: string[]; sims: number[][] } | null>(null);
  const [error, setError] = useState("");
  const run = async () => {
    setError("");
    const inputs = text.split("\n").map((s) => s.trim()).filter(Boolean).slice(0, 16);
    try {
      const r = await postJSON<{ embeddings: number[][] }>("/api/embed", { model, input: inputs });
      setMatrix({ inputs, sims: r.embeddings.map((a) => r.embeddings.map((b) => cosine(a, b))) });
    } catch (e) { setError(String((e as Error).message ?? e)); }
  };
  return (
    <section className="panel">
      <h3>Embeddings: cosine similarity</h3>
      <textarea rows={4} value={text} onChange={(e) => setText(e.target.value)} data-testid="embed-input" />
      <button className="primary" onClick={run} disabled={!model} data-testid="embed-run">Embed (one input per line)</button>
      {error && <p className="err">{error}</p>}
      {matrix && <SimilarityMatrix inputs={matrix.inputs} sims={matrix.sims} />}
    </section>
  );
}

interface Token { id: number; text: string; special: boolean }

function Tokenizer({ model }: { model: string }) {
  const [text, setText] = useState("Hello, tokenizer! 12345 naïve café");
  const [tokens, setTokens] = useState<Token[] | null>(null);
  const [error, setError] = useState("");
  const run = async () => {
    setError("");
    try {
      setTokens((await postJSON<{ tokens: Token[] }>("/admin/tokenize", { model, text })).tokens);
    } catch (e) { setError(String((e as Error).message ?? e)); }
  };
  return (
    <section className="panel">
      <h3>Tokenizer</h3>
      <textarea rows={2} value={text} onChange={(e) => setText(e.target.value)} data-testid="tokenize-input" />
      <button className="primary" onClick={run} disabled={!model} data-testid="tokenize-run">Tokenize</button>
      {error && <p className="err">{error}</p>}
      {tokens && (
        <div className="tokens" data-testid="tokenize-tokens">
          <div className="muted">{tokens.length} tokens</div>
          {tokens.map((t, i) => (
            <span key={i} className={`tok ${t.special ? "special" : `p${i % 5}`}`} title={`id ${t.id}`}>{t.text}</span>
          ))}
        </div>
      )}
    </section>
  );
}

export function Playground({ models }: { models: ModelState }) {
  const [model, setModel] = useState(localStorage.getItem("mlxr.model") ?? "");
  const chosen = model || models.models[0]?.name || "";
  const info = useShow(chosen);
  return (
    <div className="playground">
      <header className="toolbar"><h2>Playgrounds</h2><ModelPicker state={models} value={chosen} onChange={setModel} /></header>
      <Completion model={chosen} />
      <VisionPanel model={chosen} info={info} />
      <Embeddings model={chosen} />
      <RerankPanel model={chosen} />
      <Tokenizer model={chosen} />
    </div>
  );
}
