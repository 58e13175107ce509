import { useCallback, useEffect, useState } from "react";
import { listModels, listRunning, showModel, type PsModel, type ShowResponse, type TagModel } from "./api";

// Calls load() now and every `everyMs`; errors are kept for display, never thrown.
export function usePoll<T>(load: () => Promise<T>, everyMs: number, deps: unknown[] = []) {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<string>("");
  const refresh = useCallback(async () => {
    try {
      setData(await load());
      setError("");
    } catch (e) {
      setError(String((e as Error).message ?? e));
    }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, deps);
  useEffect(() => {
    refresh();
    const t = setInterval(refresh, everyMs);
    return () => clearInterval(t);
  }, [refresh, everyMs]);
  return { data, error, refresh };
}

export interface ModelState {
  models: TagModel[];
  running: PsModel[];
  error: string;
  refresh: () => Promise<void>;
}

export function useModels(everyMs = 3000): ModelState {
  const { data, error, refresh } = usePoll(async () => {
    const [models, running] = await Promise.all([listModels(), listRunning()]);
    return { models, running };
  }, everyMs);
  return { models: data?.models ?? [], running: data?.running ?? [], error, refresh };
}

// /api/show of one model (null while it loads, or when it fails): capabilities, chat template.
export function useShow(model: string): ShowResponse | null {
  const [info, setInfo] = useState<{ model: string; info: ShowResponse } | null>(null);
  useEffect(() => {
    if (!model) return;
    let stale = false;
    showModel(model).then((i) => { if (!stale) setInfo({ model, info: i }); }, () => { /* unknown: no note */ });
    return () => { stale = true; };
  }, [model]);
  return info?.model === model ? info.info : null;
}

export const takesImages = (info: ShowResponse | null): boolean | null =>
  info ? (info.capabilities ?? []).includes("vision") : null;
