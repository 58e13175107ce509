import { ndjson, request } from "./api";
import type { Msg, Stats, ToolCall } from "./store";

interface ChatChunk {
  message?: { content?: string; thinking?: string; tool_calls?: ToolCall[] };
  done?: boolean;
  eval_count?: number;
  eval_duration?: number;
  prompt_eval_count?: number;
  error?: string;
}

export interface Partial {
  content: string;
  thinking: string;
  toolCalls: ToolCall[];
}

// Ollama's message: images as base64 beside the text (an image whose bytes were not kept is left out).
function wireMessage(m: Msg) {
  const images = (m.images ?? []).map((i) => i.data).filter(Boolean);
  return images.length ? { role: m.role, content: m.content, images } : { role: m.role, content: m.content };
}

// Streams one reply from Ollama's /api/chat; onDelta gets the text so far after every chunk.
// Time to first token is measured here, from sending to the first content; tok/s comes from
// the server's own eval_count / eval_duration in the last chunk.
export async function streamChat(
  model: string,
  messages: Msg[],
  options: Record<string, number>,
  signal: AbortSignal,
  onDelta: (p: Partial) => void,
): Promise<Stats> {
  const started = performance.now();
  let ttftMs = 0;
  const part: Partial = { content: "", thinking: "", toolCalls: [] };
  const body = {
    model,
    stream: true,
    options,
    messages: messages.map(wireMessage),
  };
  const res = await request("POST", "/api/chat", body, signal);
  let stats: Stats = { ttftMs: 0, tokS: null, tokens: null };
  for await (const chunk of ndjson<ChatChunk>(res)) {
    if (chunk.error) throw new Error(chunk.error);
    const m = chunk.message;
    if (m?.content || m?.thinking || m?.tool_calls) {
      if (!ttftMs) ttftMs = performance.now() - started;
      part.content += m.content ?? "";
      part.thinking += m.thinking ?? "";
      if (m.tool_calls) part.toolCalls.push(...m.tool_calls);
      onDelta({ ...part });
    }
    if (chunk.done) {
      const secs = (chunk.eval_duration ?? 0) / 1e9;
      const tokens = chunk.eval_count ?? null;
      stats = { ttftMs, tokens, tokS: tokens && secs > 0 ? tokens / secs : null, promptTokens: chunk.prompt_eval_count ?? null };
    }
  }
  return { ...stats, ttftMs };
}
