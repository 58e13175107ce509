import { useMemo, useState } from "react";
import type { ModelState } from "../hooks";

interface Command { label: string; run: () => void }

// Ctrl+K: type to filter, Enter runs the first match.
export function Palette({ models, onClose }: { models: ModelState; onClose: () => void }) {
  const [q, setQ] = useState("");
  const commands = useMemo<Command[]>(() => {
    const go = (p: string) => () => { location.hash = `#/${p}`; };
    return [
      { label: "New chat", run: () => { location.hash = "#/chat"; setTimeout(() => window.dispatchEvent(new Event("mlxr-new-chat"))); } },
      { label: "Stop generating", run: () => window.dispatchEvent(new Event("mlxr-stop")) },
      ...["chat", "models", "metrics", "logs", "playground", "settings"].map((p) => ({ label: `Go to ${p}`, run: go(p) })),
      ...models.models.map((m) => ({ label: `Use model ${m.name}`, run: () => { localStorage.setItem("mlxr.model", m.name); location.hash = "#/chat"; } })),
    ];
  }, [models.models]);
  const shown = commands.filter((c) => c.label.toLowerCase().includes(q.toLowerCase()));
  const pick = (c: Command | undefined) => { if (c) { c.run(); onClose(); } };
  return (
    <div className="overlay" onClick={onClose}>
      <div className="dialog palette" data-testid="palette" onClick={(e) => e.stopPropagation()}>
        <input autoFocus placeholder="Type a command" value={q} onChange={(e) => setQ(e.target.value)}
          onKeyDown={(e) => { if (e.key === "Enter") pick(shown[0]); }} />
        <ul>
          {shown.slice(0, 12).map((c) => <li key={c.label}><button onClick={() => pick(c)}>{c.label}</button></li>)}
        </ul>
      </div>
    </div>
  );
}
