import type { ModelState } from "../hooks";

// A select of the registry's models; loaded ones are marked so the first-token wait is expected.
export function ModelPicker({ state, value, onChange }: { state: ModelState; value: string; onChange: (m: string) => void }) {
  const loaded = new Set(state.running.map((r) => r.name));
  const names = state.models.map((m) => m.name);
  if (value && !names.includes(value)) names.unshift(value);
  return (
    <label className="picker">
      <span className="muted">Model</span>
      <select data-testid="model-picker" value={value} onChange={(e) => onChange(e.target.value)}>
        {names.length === 0 && <option value="">(no models)</option>}
        {names.map((n) => (
          <option key={n} value={n}>
            {loaded.has(n) ? "● " : "○ "}
            {n}
            {loaded.has(n) ? " (loaded)" : ""}
          </option>
        ))}
      </select>
    </label>
  );
}
