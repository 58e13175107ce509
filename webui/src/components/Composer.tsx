import { useState } from "react";

const MAX_ATTACHMENT = 200_000;

export interface Attachment { name: string; text: string }

export function withAttachments(text: string, files: Attachment[]): string {
  return [text, ...files.map((f) => `File: ${f.name}\n\`\`\`\n${f.text}\n\`\`\``)].filter(Boolean).join("\n\n");
}

// Keeps its own text so typing re-renders only this box, not the conversation list or thread.
export function Composer({ busy, canSend, onSend, onStop }: {
  busy: boolean;
  canSend: boolean;
  onSend: (text: string, files: Attachment[]) => void;
  onStop: () => void;
}) {
  const [input, setInput] = useState("");
  const [files, setFiles] = useState<Attachment[]>([]);
  const send = () => {
    if (busy || !canSend || (!input.trim() && !files.length)) return;
    onSend(input.trim(), files);
    setInput("");
    setFiles([]);
  };
  const addFiles = async (list: FileList | null) => {
    const read = await Promise.all([...(list ?? [])].map(async (f) => ({ name: f.name, text: (await f.text()).slice(0, MAX_ATTACHMENT) })));
    setFiles((fs) => [...fs, ...read]);
  };
  const onKey = (e: React.KeyboardEvent) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
    if (e.key === "Escape") onStop();
  };
  return (
    <div className="composer">
      {files.length > 0 && (
        <div className="files">
          {files.map((f, i) => (
            <span key={i} className="chip">{f.name}
              <button className="icon" onClick={() => setFiles((fs) => fs.filter((_, j) => j !== i))}>×</button>
            </span>
          ))}
        </div>
      )}
      <textarea data-testid="chat-input" placeholder="Message (Enter to send, Shift+Enter for a new line)"
        value={input} onChange={(e) => setInput(e.target.value)} onKeyDown={onKey} rows={3} />
      <div className="row">
        <label className="button">Attach text file
          <input type="file" hidden multiple accept="text/*,.md,.py,.json,.txt,.csv,.ts,.js" onChange={(e) => addFiles(e.target.files)} />
        </label>
        {busy ? <button className="danger" onClick={onStop} data-testid="stop">Stop</button>
          : <button className="primary" onClick={send} disabled={!canSend} data-testid="send">Send</button>}
      </div>
    </div>
  );
}
