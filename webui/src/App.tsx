import { useEffect, useState } from "react";
import { AUTH_EVENT } from "./api";
import { KeyDialog } from "./components/KeyDialog";
import { Palette } from "./components/Palette";
import { useModels } from "./hooks";
import { Chat } from "./pages/Chat";
import { Logs } from "./pages/Logs";
import { Metrics } from "./pages/Metrics";
import { Models } from "./pages/Models";
import { Playground } from "./pages/Playground";
import { Settings, applyTheme } from "./pages/Settings";

export const PAGES = ["chat", "models", "metrics", "logs", "playground", "settings"] as const;
export type Page = (typeof PAGES)[number];

function pageFromHash(): Page {
  const p = location.hash.replace(/^#\/?/, "") as Page;
  return PAGES.includes(p) ? p : "chat";
}

export function App() {
  const [page, setPage] = useState<Page>(pageFromHash);
  const [needKey, setNeedKey] = useState(false);
  const [keyVersion, setKeyVersion] = useState(0);
  const [palette, setPalette] = useState(false);
  const [navOpen, setNavOpen] = useState(false); // the page links on a narrow screen
  const models = useModels();

  useEffect(() => {
    applyTheme();
    const onHash = () => { setPage(pageFromHash()); setNavOpen(false); };
    const onAuth = () => setNeedKey(true);
    const onKey = (e: KeyboardEvent) => {
      const mod = e.ctrlKey || e.metaKey;
      if (mod && e.key.toLowerCase() === "k") { e.preventDefault(); setPalette((v) => !v); }
      else if (mod && e.altKey && /^[1-6]$/.test(e.key)) { e.preventDefault(); location.hash = `#/${PAGES[Number(e.key) - 1]}`; }
      else if (e.key === "Escape") setPalette(false);
    };
    window.addEventListener("hashchange", onHash);
    window.addEventListener(AUTH_EVENT, onAuth);
    window.addEventListener("keydown", onKey);
    return () => {
      window.removeEventListener("hashchange", onHash);
      window.removeEventListener(AUTH_EVENT, onAuth);
      window.removeEventListener("keydown", onKey);
    };
  }, []);

  const keyEntered = () => { setNeedKey(false); setKeyVersion((v) => v + 1); models.refresh(); };
  return (
    <div className="app">
      <nav className={`nav ${navOpen ? "open" : ""}`}>
        <span className="brand">MLXR</span>
        <button className="ghost nav-toggle" onClick={() => setNavOpen((v) => !v)} aria-expanded={navOpen}
          aria-label="Pages" data-testid="nav-toggle">☰ <span className="nav-current">{page}</span></button>
        <div className="nav-links">
          {PAGES.map((p) => (
            <a key={p} href={`#/${p}`} className={p === page ? "active" : ""} data-testid={`nav-${p}`}
              onClick={() => setNavOpen(false)}>{p}</a>
          ))}
        </div>
        <span className="spacer" />
        <button className="ghost" onClick={() => setPalette(true)} title="Command palette (Ctrl+K)">⌘K</button>
      </nav>
      <main key={keyVersion} className={`page page-${page}`}>
        {page === "chat" && <Chat models={models} />}
        {page === "models" && <Models models={models} />}
        {page === "metrics" && <Metrics />}
        {page === "logs" && <Logs />}
        {page === "playground" && <Playground models={models} />}
        {page === "settings" && <Settings />}
      </main>
      {palette && <Palette models={models} onClose={() => setPalette(false)} />}
      {needKey && <KeyDialog onDone={keyEntered} />}
    </div>
  );
}
