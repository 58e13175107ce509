// Conversations and UI preferences live in the browser's localStorage only.
export interface Stats {
  ttftMs: number;
  tokS: number | null;
  tokens: number | null;
}

export interface ToolCall {
  function?: { name?: string; arguments?: unknown };
}

export interface Msg {
  role: "user" | "assistant" | "system";
  content: string;
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

export interface Sampling {
  temperature: number;
  top_p: number;
  top_k: number;
  num_predict: number;
  seed: string;
}

const CONVS = "mlxr.conversations";
const SAMPLING = "mlxr.sampling";
export const DEFAULT_SAMPLING: Sampling = { temperature: 0.8, top_p: 0.9, top_k: 40, num_predict: 256, seed: "" };

function read<T>(key: string, fallback: T): T {
  try {
    const raw = localStorage.getItem(key);
    return raw ? (JSON.parse(raw) as T) : fallback;
  } catch {
    return fallback;
  }
}

export const loadConversations = () => read<Conversation[]>(CONVS, []);
export const saveConversations = (c: Conversation[]) => localStorage.setItem(CONVS, JSON.stringify(c));
export const loadSampling = () => ({ ...DEFAULT_SAMPLING, ...read<Partial<Sampling>>(SAMPLING, {}) });
export const saveSampling = (s: Sampling) => localStorage.setItem(SAMPLING, JSON.stringify(s));

export function newConversation(model: string): Conversation {
  return { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`, title: "New chat", model, system: "", messages: [], updated: Date.now() };
}

export function samplingOptions(s: Sampling): Record<string, number> {
  const o: Record<string, number> = {
    temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, num_predict: s.num_predict,
  };
  if (s.seed.trim() !== "" && Number.isFinite(Number(s.seed))) o.seed = Number(s.seed);
  return o;
}
