// Every call goes to the same origin with a JSON body and, when one is stored, the API key.
const KEY_STORE = "mlxr.apiKey";

export function getKey(): string {
  return localStorage.getItem(KEY_STORE) ?? "";
}

export function setKey(key: string): void {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
}

// The app listens for this to open the key dialog.
export const AUTH_EVENT = "mlxr-auth-required";

function headers(hasBody: boolean): HeadersInit {
  const h: Record<string, string> = {};
  if (hasBody) h["Content-Type"] = "application/json";
  const key = getKey();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

async function errorOf(res: Response): Promise<ApiError> {
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    const e = body.error;
    message = typeof e === "string" ? e : e?.message ?? message;
  } catch {
    /* not JSON: keep the status line */
  }
  if (res.status === 401) window.dispatchEvent(new Event(AUTH_EVENT));
  return new ApiError(res.status, message);
}

export async function request(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
  const res = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!res.ok) throw await errorOf(res);
  return res;
}

export async function getJSON<T>(path: string, signal?: AbortSignal): Promise<T> {
  return (await request("GET", path, undefined, signal)).json();
}

export async function postJSON<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T> {
  return (await request("POST", path, body, signal)).json();
}

export async function getText(path: string, signal?: AbortSignal): Promise<string> {
  return (await request("GET", path, undefined, signal)).text();
}

// Ollama's streams: one JSON object per line.
export async function* ndjson<T>(res: Response): AsyncGenerator<T> {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line) as T;
    }
  }
  if (buf.trim()) yield JSON.parse(buf) as T;
}

export interface TagModel {
  name: string;
  model: string;
  size: number;
  digest: string;
  modified_at: string;
  details: { format?: string; family?: string; parameter_size?: string; quantization_level?: string };
}

export interface PsModel {
  name: string;
  model: string;
  size: number;
  size_vram?: number;
  expires_at: string;
  context_length?: number;
}

export const listModels = async () => (await getJSON<{ models: TagModel[] }>("/api/tags")).models;
export const listRunning = async () => (await getJSON<{ models: PsModel[] }>("/api/ps")).models;

export function formatBytes(n: number): string {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// GET /admin/loading: the model loads under way on the server.
export interface LoadingModel {
  name: string;
  stage: string;
  started_at: number;
  elapsed_s: number;
  stage_elapsed_s: number;
  previous_load_s: number | null;
}

export const listLoading = async () => (await getJSON<{ models: LoadingModel[] }>("/admin/loading")).models;

export interface ShowResponse {
  details?: Record<string, unknown>;
  model_info?: Record<string, unknown>;
  parameters?: string;
  template?: string;
  capabilities?: string[];
  modified_at?: string;
}

export const showModel = (model: string) => postJSON<ShowResponse>("/api/show", { model });

// A model without a chat template of its own: a base model, which continues text rather than
// answering (its /api/chat uses MLXR's template for the family, or there is none at all).
export const isBaseModel = (info: ShowResponse | null) => {
  const origin = info?.model_info?.["mlxr.chat_template"];
  return origin === "built-in" || origin === "none";
};
