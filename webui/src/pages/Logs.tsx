import { useVirtualizer } from "@tanstack/react-virtual";
import { useEffect, useMemo, useRef, useState } from "react";
import { tailLogs, type LogLine } from "../logStream";

const KEEP = 5000;
const BACKLOG = 2000;
const LEVELS = ["debug", "info", "warning", "error", "critical"];

function extras(l: LogLine): string {
  const { ts: _t, level: _l, logger: _g, msg: _m, ...rest } = l;
  const keys = Object.keys(rest);
  return keys.length ? keys.map((k) => `${k}=${typeof rest[k] === "object" ? JSON.stringify(rest[k]) : rest[k]}`).join(" ") : "";
}

export function Logs() {
  const [lines, setLines] = useState<LogLine[]>([]);
  const [level, setLevel] = useState("debug");
  const [logger, setLogger] = useState("");
  const [search, setSearch] = useState("");
  const [follow, setFollow] = useState(true);
  const [status, setStatus] = useState("connecting");
  const pending = useRef<LogLine[]>([]);
  const box = useRef<HTMLDivElement>(null);

  useEffect(() => {
    const controller = new AbortController();
    // New lines are batched: one render per flush, not per line.
    const flush = setInterval(() => {
      if (!pending.current.length) return;
      const add = pending.current;
      pending.current = [];
      setLines((ls) => [...ls, ...add].slice(-KEEP));
    }, 200);
    setStatus("live");
    tailLogs(BACKLOG, controller.signal, (l) => pending.current.push(l))
      .then(() => setStatus("ended"))
      .catch((e) => { if (!controller.signal.aborted) setStatus(`error: ${e.message ?? e}`); });
    return () => { controller.abort(); clearInterval(flush); };
  }, []);

  const loggers = useMemo(() => [...new Set(lines.map((l) => l.logger))].sort(), [lines]);
  const shown = useMemo(() => {
    const min = LEVELS.indexOf(level);
    const q = search.toLowerCase();
    return lines.filter((l) => LEVELS.indexOf(l.level) >= min && (!logger || l.logger === logger)
      && (!q || l.msg.toLowerCase().includes(q) || extras(l).toLowerCase().includes(q)));
  }, [lines, level, logger, search]);

  const rows = useVirtualizer({ count: shown.length, getScrollElement: () => box.current, estimateSize: () => 22, overscan: 20 });
  useEffect(() => { if (follow && shown.length) rows.scrollToIndex(shown.length - 1, { align: "end" }); }, [shown.length, follow, rows]);

  return (
    <div className="logs">
      <header className="toolbar">
        <h2>Logs</h2>
        <select value={level} onChange={(e) => setLevel(e.target.value)} data-testid="log-level">
          {LEVELS.map((l) => <option key={l} value={l}>{l}+</option>)}
        </select>
        <select value={logger} onChange={(e) => setLogger(e.target.value)} data-testid="log-logger">
          <option value="">all loggers</option>
          {loggers.map((l) => <option key={l} value={l}>{l}</option>)}
        </select>
        <input placeholder="Search" value={search} onChange={(e) => setSearch(e.target.value)} data-testid="log-search" />
        <label><input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} /> follow</label>
        <span className="muted" data-testid="log-count">{shown.length} / {lines.length} lines · {status}</span>
      </header>
      <div className="logbox" ref={box} data-testid="log-box">
        <div style={{ height: rows.getTotalSize(), position: "relative" }}>
          {rows.getVirtualItems().map((v) => {
            const l = shown[v.index];
            return (
              <div key={v.key} className={`logline lv-${l.level}`} data-testid="log-line"
                style={{ position: "absolute", top: 0, transform: `translateY(${v.start}px)`, height: v.size }}>
                <span className="ts">{new Date(l.ts * 1000).toLocaleTimeString()}</span>
                <span className="lv">{l.level}</span>
                <span className="lg">{l.logger}</span>
                <span className="m">{l.msg}</span>
                <span className="x">{extras(l)}</span>
              </div>
            );
          })}
        </div>
      </div>
    </div>
  );
}
