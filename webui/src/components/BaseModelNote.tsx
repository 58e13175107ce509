import { isBaseModel, type ShowResponse } from "../api";

// A base model has no chat template of its own: it continues text rather than answering, so
// the chat page points to the completion playground instead.
export function BaseModelNote({ model, info }: { model: string; info: ShowResponse | null }) {
  if (!isBaseModel(info)) return null;
  const toCompletion = () => { localStorage.setItem("mlxr.model", model); location.hash = "#/playground"; };
  return (
    <div className="note warn" data-testid="base-model-note">
      <span><b>{model}</b> is a base model: it has no chat template and continues text rather than answering.</span>
      <button onClick={toCompletion} data-testid="use-completion">Use completion mode</button>
    </div>
  );
}
