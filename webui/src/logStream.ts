import { createParser } from "eventsource-parser";
import { request } from "./api";

export interface LogLine {
  ts: number;
  level: string;
  logger: string;
  msg: string;
  [key: string]: unknown;
}

// Reads /admin/logs/stream with fetch (not EventSource) so the API key goes in a header,
// never in the URL. Resolves when the stream ends or `signal` aborts.
export async function tailLogs(backlog: number, signal: AbortSignal, onLine: (l: LogLine) => void): Promise<void> {
  const res = await request("GET", `/admin/logs/stream?backlog=${backlog}`, undefined, signal);
  const parser = createParser({
    onEvent: (e) => {
      try { onLine(JSON.parse(e.data) as LogLine); } catch { /* a line that is not JSON is skipped */ }
    },
  });
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    parser.feed(value);
  }
}
