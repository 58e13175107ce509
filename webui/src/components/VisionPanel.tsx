import { useRef, useState } from "react";
import type { ShowResponse } from "../api";
import { streamChat } from "../chatStream";
import { takesImages } from "../hooks";
import { filesOf, isImage, readImages } from "../images";
import type { ImageFile, Stats } from "../store";
import { Markdown } from "./Markdown";
import { Thumbnails } from "./Thumbnails";

// One image and a prompt, answered as a stream over /api/chat; the image's token count comes
// from the model (/api/show), the prompt's from the server's reply.
export function VisionPanel({ model, info }: { model: string; info: ShowResponse | null }) {
  const [image, setImage] = useState<ImageFile | null>(null);
  const [prompt, setPrompt] = useState("Describe this image.");
  const [maxTokens, setMaxTokens] = useState(64);
  const [answer, setAnswer] = useState("");
  const [stats, setStats] = useState<Stats | null>(null);
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const abort = useRef<AbortController | null>(null);
  const vision = takesImages(info);
  const perImage = info?.model_info?.["mlxr.vision.tokens_per_image"];
  const pick = async (files: File[]) => {
    const { images, errors } = await readImages(files.filter(isImage).slice(0, 1));
    setError(errors.join("; "));
    if (images[0]) setImage(images[0]);
  };
  const run = async () => {
    if (!image) return;
    const controller = new AbortController();
    abort.current = controller;
    setAnswer(""); setStats(null); setError(""); setBusy(true);
    try {
      setStats(await streamChat(model, [{ role: "user", content: prompt, images: [image] }],
        { num_predict: maxTokens, temperature: 0 }, controller.signal, (p) => setAnswer(p.content)));
    } catch (e) {
      if (!controller.signal.aborted) setError(String((e as Error).message ?? e));
    } finally { abort.current = null; setBusy(false); }
  };
  return (
    <section className="panel" data-testid="vision-panel" onDragOver={(e) => e.preventDefault()}
      onDrop={(e) => { e.preventDefault(); pick(filesOf(e.dataTransfer)); }}>
      <h3>Vision: an image and a prompt</h3>
      {vision === false && (
        <div className="note warn" data-testid="vision-text-only">
          <span><b>{model}</b> takes text only: pick a model that takes images (its details list <code>vision</code>).</span>
        </div>
      )}
      <div className="row">
        <label className="button">Choose image
          <input type="file" hidden accept="image/*" data-testid="vision-file"
            onChange={(e) => { pick([...(e.target.files ?? [])]); e.target.value = ""; }} />
        </label>
        <span className="muted">or drop one here</span>
        {typeof perImage === "number" && <span data-testid="vision-image-tokens">{perImage} image tokens per image</span>}
      </div>
      {image && <Thumbnails images={[image]} testId="vision-thumbnail" />}
      <textarea rows={2} value={prompt} onChange={(e) => setPrompt(e.target.value)} data-testid="vision-prompt" />
      <div className="row">
        <label>max tokens <input type="number" min={1} max={2048} value={maxTokens} onChange={(e) => setMaxTokens(Number(e.target.value))} /></label>
        {busy ? <button className="danger" onClick={() => abort.current?.abort()}>Stop</button>
          : <button className="primary" onClick={run} disabled={!model || !image || vision === false} data-testid="vision-run">Ask</button>}
      </div>
      {error && <p className="err" data-testid="vision-error">{error}</p>}
      {(answer || busy) && <div data-testid="vision-answer"><Markdown text={answer} /></div>}
      {stats && (
        <div className="stats muted row" data-testid="vision-stats">
          <span>TTFT {stats.ttftMs.toFixed(0)} ms</span>
          {stats.promptTokens != null && <span>prompt {stats.promptTokens} tokens (image included)</span>}
          {stats.tokens != null && <span>{stats.tokens} tokens</span>}
          {stats.tokS != null && <span>{stats.tokS.toFixed(1)} tok/s</span>}
        </div>
      )}
    </section>
  );
}
