// Conversations and UI preferences live in the browser's localStorage only.
export interface Stats {
  ttftMs: number;
  tokS: number | null;
  tokens: number | null;
  promptTokens?: number | null; // the server's prompt_eval_count: image tokens included
}

// An attached image: its file's bytes as base64 (what Ollama's `images` takes). `data` is empty
// when the browser's storage was too small to keep it with the conversation.
export interface ImageFile {
  name: string;
  mime: string;
  data: string;
}

export interface ToolCall {
  function?: { name?: string; arguments?: unknown };
}

export interface Msg {
  role: "user" | "assistant" | "system";
  content: string;
  images?: ImageFile[];
  thinking?: string;
  toolCalls?: ToolCall[];
  stats?: Stats;
  stopped?: boolean;
  error?: string;
}

export interface Conversation {
  id: string;
  title: string;
  model: string;
  system: string;
  messages: Msg[];
  updated: number;
}

// null: not sent, so the model's own default (its files, preset or Modelfile) applies.
export interface Sampling {
  temperature: number | null;
  top_p: number | null;
  top_k: number | null;
  num_predict: number | null;
  seed: string;
}

const CONVS = "mlxr.conversations";
const SAMPLING = "mlxr.sampling";
export const DEFAULT_SAMPLING: Sampling = { temperature: null, top_p: null, top_k: null, num_predict: 256, seed: "" };

function read<T>(key: string, fallback: T): T {
  try {
    const raw = localStorage.getItem(key);
    return raw ? (JSON.parse(raw) as T) : fallback;
  } catch {
    return fallback;
  }
}

export const loadConversations = () => read<Conversation[]>(CONVS, []);
// Images can outgrow localStorage's few megabytes: then the conversations are kept without
// their images' bytes (the names stay) rather than not at all.
export function saveConversations(c: Conversation[]): void {
  try {
    localStorage.setItem(CONVS, JSON.stringify(c));
  } catch {
    const bare = c.map((x) => ({ ...x, messages: x.messages.map((m) => (m.images ? { ...m, images: m.images.map((i) => ({ ...i, data: "" })) } : m)) }));
    try { localStorage.setItem(CONVS, JSON.stringify(bare)); } catch { /* nothing fits: keep the previous save */ }
  }
}
export const loadSampling = () => ({ ...DEFAULT_SAMPLING, ...read<Partial<Sampling>>(SAMPLING, {}) });
export const saveSampling = (s: Sampling) => localStorage.setItem(SAMPLING, JSON.stringify(s));

export function newConversation(model: string): Conversation {
  return { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`, title: "New chat", model, system: "", messages: [], updated: Date.now() };
}

export function samplingOptions(s: Sampling): Record<string, number> {
  const o: Record<string, number> = {};
  for (const k of ["temperature", "top_p", "top_k", "num_predict"] as const) {
    const v = s[k];
    if (v !== null && v !== undefined && Number.isFinite(v)) o[k] = v;
  }
  if (s.seed.trim() !== "" && Number.isFinite(Number(s.seed))) o.seed = Number(s.seed);
  return o;
}
