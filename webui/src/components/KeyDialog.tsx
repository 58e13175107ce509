import { useState } from "react";
import { setKey } from "../api";

// Shown when the server answers 401: the key is kept in localStorage and sent as a Bearer header.
export function KeyDialog({ onDone }: { onDone: () => void }) {
  const [value, setValue] = useState("");
  return (
    <div className="overlay">
      <form className="dialog" data-testid="key-dialog"
        onSubmit={(e) => { e.preventDefault(); setKey(value.trim()); onDone(); }}>
        <h2>API key required</h2>
        <p className="muted">This server needs an API key. It is kept in this browser only.</p>
        <input type="password" autoFocus data-testid="key-input" value={value} onChange={(e) => setValue(e.target.value)} placeholder="API key" />
        <button className="primary" type="submit" data-testid="key-save">Save</button>
      </form>
    </div>
  );
}
