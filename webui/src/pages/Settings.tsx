import { useEffect, useState } from "react";
import { getJSON, getKey, setKey } from "../api";

const THEME = "mlxr.theme";

export function applyTheme(theme = localStorage.getItem(THEME) ?? "dark"): void {
  document.documentElement.dataset.theme = theme;
}

export function Settings() {
  const [config, setConfig] = useState<Record<string, unknown> | null>(null);
  const [error, setError] = useState("");
  const [key, setKeyValue] = useState(getKey());
  const [theme, setTheme] = useState(localStorage.getItem(THEME) ?? "dark");
  useEffect(() => {
    getJSON<Record<string, unknown>>("/admin/config").then(setConfig, (e) => setError(String(e.message)));
  }, []);
  const pickTheme = (t: string) => { setTheme(t); localStorage.setItem(THEME, t); applyTheme(t); };
  return (
    <div className="settings">
      <h2>Settings</h2>
      <section className="panel">
        <h3>Appearance</h3>
        <label>Theme <select value={theme} onChange={(e) => pickTheme(e.target.value)} data-testid="theme">
          <option value="dark">dark</option><option value="light">light</option>
        </select></label>
      </section>
      <section className="panel">
        <h3>API key</h3>
        <p className="muted">Kept in this browser's storage and sent as <code>Authorization: Bearer</code> on every call; never in a URL.</p>
        <form className="row" onSubmit={(e) => { e.preventDefault(); setKey(key.trim()); }}>
          <input type="password" value={key} onChange={(e) => setKeyValue(e.target.value)} placeholder="(none)" />
          <button className="primary" type="submit">Save</button>
          <button type="button" onClick={() => { setKey(""); setKeyValue(""); }}>Forget</button>
        </form>
      </section>
      <section className="panel">
        <h3>Server configuration (read only)</h3>
        {error && <p className="err">{error}</p>}
        {config && <pre data-testid="server-config">{JSON.stringify(config, null, 2)}</pre>}
        <p className="muted">Change it with <code>mlxr serve</code> flags and restart the server. Shortcuts: Ctrl+K palette, Ctrl+Alt+1..6 pages, Enter send, Shift+Enter new line, Esc stop.</p>
      </section>
    </div>
  );
}
