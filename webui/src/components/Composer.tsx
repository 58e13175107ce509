import { useState } from "react";
import { filesOf, isImage, MAX_IMAGES, readImages } from "../images";
import type { ImageFile } from "../store";
import { Thumbnails } from "./Thumbnails";

const MAX_ATTACHMENT = 200_000;

export interface Attachment { name: string; text: string }

export function withAttachments(text: string, files: Attachment[]): string {
  return [text, ...files.map((f) => `File: ${f.name}\n\`\`\`\n${f.text}\n\`\`\``)].filter(Boolean).join("\n\n");
}

// Keeps its own text so typing re-renders only this box, not the conversation list or thread.
// Images come from the attach button, a drop or a paste; `vision` is false for a model that
// takes text only (null while unknown), and then images are not sent.
export function Composer({ busy, canSend, model, vision, onSend, onStop }: {
  busy: boolean;
  canSend: boolean;
  model: string;
  vision: boolean | null;
  onSend: (text: string, files: Attachment[], images: ImageFile[]) => void;
  onStop: () => void;
}) {
  const [input, setInput] = useState("");
  const [files, setFiles] = useState<Attachment[]>([]);
  const [images, setImages] = useState<ImageFile[]>([]);
  const [problem, setProblem] = useState("");
  const textOnly = vision === false && images.length > 0;
  const send = () => {
    if (busy || !canSend || textOnly || (!input.trim() && !files.length && !images.length)) return;
    onSend(input.trim(), files, images);
    setInput("");
    setFiles([]);
    setImages([]);
    setProblem("");
  };
  const addFiles = async (list: File[]) => {
    const texts = list.filter((f) => !isImage(f));
    const read = await Promise.all(texts.map(async (f) => ({ name: f.name, text: (await f.text()).slice(0, MAX_ATTACHMENT) })));
    const { images: added, errors } = await readImages(list.filter(isImage));
    setFiles((fs) => [...fs, ...read]);
    const all = [...images, ...added];
    if (all.length > MAX_IMAGES) errors.push(`at most ${MAX_IMAGES} images a message: the rest were left out`);
    setImages(all.slice(0, MAX_IMAGES));
    setProblem(errors.join("; "));
  };
  const onKey = (e: React.KeyboardEvent) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
    if (e.key === "Escape") onStop();
  };
  const onPaste = (e: React.ClipboardEvent) => {
    const pasted = filesOf(e.clipboardData).filter(isImage);
    if (pasted.length) { e.preventDefault(); addFiles(pasted); }
  };
  const onDrop = (e: React.DragEvent) => { e.preventDefault(); addFiles(filesOf(e.dataTransfer)); };
  return (
    <div className="composer" data-testid="composer" onDragOver={(e) => e.preventDefault()} onDrop={onDrop}>
      {files.length > 0 && (
        <div className="files">
          {files.map((f, i) => (
            <span key={i} className="chip">{f.name}
              <button className="icon" onClick={() => setFiles((fs) => fs.filter((_, j) => j !== i))}>×</button>
            </span>
          ))}
        </div>
      )}
      <Thumbnails images={images} testId="composer-images" onRemove={(i) => setImages((is) => is.filter((_, j) => j !== i))} />
      {textOnly && (
        <div className="note warn" data-testid="text-only-note">
          <span><b>{model}</b> takes text only: it cannot see images. Remove them, or pick a model that takes images.</span>
        </div>
      )}
      {problem && <div className="err" data-testid="attach-problem">{problem}</div>}
      <textarea data-testid="chat-input" placeholder="Message (Enter to send, Shift+Enter for a new line; drop or paste images)"
        value={input} onChange={(e) => setInput(e.target.value)} onKeyDown={onKey} onPaste={onPaste} rows={3} />
      <div className="row">
        <span className="row">
          <label className="button">Attach file or image
            <input type="file" hidden multiple accept="image/*,text/*,.md,.py,.json,.txt,.csv,.ts,.js"
              onChange={(e) => { addFiles([...(e.target.files ?? [])]); e.target.value = ""; }} />
          </label>
          {vision === false && <span className="muted" data-testid="model-text-only">{model} takes text only</span>}
          {vision === true && <span className="muted" data-testid="model-takes-images">{model} takes images</span>}
        </span>
        {busy ? <button className="danger" onClick={onStop} data-testid="stop">Stop</button>
          : <button className="primary" onClick={send} disabled={!canSend || textOnly} data-testid="send">Send</button>}
      </div>
    </div>
  );
}
