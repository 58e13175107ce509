import { memo, useState } from "react";
import { Markdown } from "./Markdown";
import { Thumbnails } from "./Thumbnails";
import type { Conversation, Msg, Sampling } from "../store";

export const ConversationList = memo(function ConversationList(props: {
  conversations: Conversation[];
  current: string;
  onSelect: (id: string) => void;
  onNew: () => void;
  onDelete: (id: string) => void;
}) {
  const [filter, setFilter] = useState("");
  const f = filter.toLowerCase();
  const shown = f ? props.conversations.filter((c) => c.title.toLowerCase().includes(f)) : props.conversations;
  return (
    <aside className="convs">
      <button className="primary" onClick={props.onNew} data-testid="new-chat">+ New chat</button>
      <input placeholder="Search chats" value={filter} onChange={(e) => setFilter(e.target.value)} />
      <ul data-testid="conversation-list">
        {shown.map((c) => (
          <li key={c.id} className={c.id === props.current ? "active" : ""}>
            <button className="title" onClick={() => props.onSelect(c.id)}>{c.title}</button>
            <button className="icon" title="Delete chat" onClick={() => props.onDelete(c.id)}>×</button>
          </li>
        ))}
      </ul>
    </aside>
  );
});

function StatsLine({ m }: { m: Msg }) {
  if (!m.stats && !m.stopped && !m.error) return null;
  const s = m.stats;
  return (
    <div className="stats" data-testid="reply-stats">
      {s && s.ttftMs > 0 && <span>TTFT {s.ttftMs.toFixed(0)} ms</span>}
      {s?.tokS != null && <span>{s.tokS.toFixed(1)} tok/s</span>}
      {s?.tokens != null && <span>{s.tokens} tokens</span>}
      {s?.promptTokens != null && <span>prompt {s.promptTokens} tokens</span>}
      {m.stopped && <span className="warn">stopped</span>}
      {m.error && <span className="err">{m.error}</span>}
    </div>
  );
}

export const MessageView = memo(function MessageView(props: {
  m: Msg;
  index: number;
  last: boolean;
  busy: boolean;
  onEdit: (index: number, text: string) => void;
  onRegenerate: () => void;
}) {
  const { m } = props;
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState(m.content);
  return (
    <div className={`msg ${m.role}`} data-testid={`msg-${m.role}`}>
      <div className="role">{m.role}</div>
      {m.thinking && (
        <details className="thinking">
          <summary>reasoning</summary>
          <pre>{m.thinking}</pre>
        </details>
      )}
      {m.images && <Thumbnails images={m.images} testId="msg-images" />}
      {editing ? (
        <div className="edit">
          <textarea value={draft} onChange={(e) => setDraft(e.target.value)} rows={4} />
          <button className="primary" onClick={() => { setEditing(false); props.onEdit(props.index, draft); }}>Save & send</button>
          <button onClick={() => setEditing(false)}>Cancel</button>
        </div>
      ) : m.role === "assistant" ? (
        <Markdown text={m.content} />
      ) : (
        <div className="plain">{m.content}</div>
      )}
      {m.toolCalls && m.toolCalls.length > 0 && (
        <div className="toolcalls">
          {m.toolCalls.map((t, i) => (
            <pre key={i}>tool call: {t.function?.name} {JSON.stringify(t.function?.arguments)}</pre>
          ))}
        </div>
      )}
      <StatsLine m={m} />
      {!props.busy && !editing && (
        <div className="msg-actions">
          {m.role === "user" && <button onClick={() => { setDraft(m.content); setEditing(true); }}>edit</button>}
          {m.role === "assistant" && props.last && <button onClick={props.onRegenerate} data-testid="regenerate">regenerate</button>}
        </div>
      )}
    </div>
  );
});

export function SamplingPanel({ s, onChange, system, onSystem }: {
  s: Sampling;
  onChange: (s: Sampling) => void;
  system: string;
  onSystem: (v: string) => void;
}) {
  const num = (k: keyof Sampling, step: number, min: number, max: number) => (
    <label>
      <span>{k}</span>
      <input type="number" step={step} min={min} max={max} value={(s[k] as number | null) ?? ""}
        placeholder="model's default"
        onChange={(e) => onChange({ ...s, [k]: e.target.value === "" ? null : Number(e.target.value) })} />
    </label>
  );
  return (
    <aside className="sampling">
      <label className="system">
        <span>System prompt</span>
        <textarea data-testid="system-prompt" rows={4} value={system} onChange={(e) => onSystem(e.target.value)} />
      </label>
      {num("temperature", 0.1, 0, 2)}
      {num("top_p", 0.05, 0, 1)}
      {num("top_k", 1, 0, 1000)}
      {num("num_predict", 16, 1, 8192)}
      <label>
        <span>seed</span>
        <input value={s.seed} placeholder="random" onChange={(e) => onChange({ ...s, seed: e.target.value })} />
      </label>
    </aside>
  );
}
