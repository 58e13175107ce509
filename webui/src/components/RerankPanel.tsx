import { useState } from "react";
import { postJSON } from "../api";

interface RerankResult { index: number; relevance_score: number }

// A query against documents (one a line), scored by /v1/rerank, best first.
export function RerankPanel({ model }: { model: string }) {
  const [query, setQuery] = useState("What is the capital of France?");
  const [docs, setDocs] = useState("Paris is the capital of France.\nBerlin is in Germany.\nThe cat sat on the mat.");
  const [result, setResult] = useState<{ documents: string[]; results: RerankResult[] } | null>(null);
  const [error, setError] = useState("");
  const run = async () => {
    setError("");
    const documents = docs.split("\n").map((s) => s.trim()).filter(Boolean).slice(0, 100);
    try {
      const r = await postJSON<{ results: RerankResult[] }>("/v1/rerank", { model, query, documents, return_documents: false });
      setResult({ documents, results: r.results });
    } catch (e) { setResult(null); setError(String((e as Error).message ?? e)); }
  };
  return (
    <section className="panel">
      <h3>Rerank: a query against documents</h3>
      <input value={query} onChange={(e) => setQuery(e.target.value)} data-testid="rerank-query" />
      <textarea rows={4} value={docs} onChange={(e) => setDocs(e.target.value)} data-testid="rerank-documents" />
      <button className="primary" onClick={run} disabled={!model} data-testid="rerank-run">Rerank (one document per line)</button>
      {error && <p className="err" data-testid="rerank-error">{error}</p>}
      {result && (
        <table data-testid="rerank-table">
          <thead><tr><th>rank</th><th>document</th><th>index</th><th>score</th></tr></thead>
          <tbody>
            {result.results.map((r, rank) => (
              <tr key={r.index}>
                <td>{rank + 1}</td><td>{result.documents[r.index]}</td><td>{r.index}</td>
                <td className="score">{r.relevance_score.toFixed(6)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
