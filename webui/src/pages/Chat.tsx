import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from "react";
import { streamChat, type Partial } from "../chatStream";
import { ConversationList, MessageView, SamplingPanel } from "../components/ChatParts";
import { BaseModelNote } from "../components/BaseModelNote";
import { Composer, withAttachments, type Attachment } from "../components/Composer";
import { LoadingBar, loadOf, useLoading } from "../components/LoadingState";
import { Markdown } from "../components/Markdown";
import { ModelPicker } from "../components/ModelPicker";
import { takesImages, useShow, type ModelState } from "../hooks";
import {
  loadConversations, loadSampling, newConversation, samplingOptions, saveConversations, saveSampling,
  type Conversation, type ImageFile, type Msg,
} from "../store";

const MODEL_STORE = "mlxr.model";
export function Chat({ models }: { models: ModelState }) {
  const [convs, setConvs] = useState<Conversation[]>(loadConversations);
  const [currentId, setCurrentId] = useState<string>(() => convs[0]?.id ?? "");
  const [sampling, setSampling] = useState(loadSampling);
  const [live, setLive] = useState<Partial | null>(null);
  const [side, setSide] = useState<"" | "convs" | "sampling">(""); // the panel shown on a narrow screen
  const abort = useRef<AbortController | null>(null);
  const defaultModel = localStorage.getItem(MODEL_STORE) ?? "";
  const current = convs.find((c) => c.id === currentId);
  const model = current?.model || defaultModel || models.models[0]?.name || "";

  // Saving 500 conversations on every keystroke would stall typing: save after a pause,
  // and at once when the page goes away or the chat page closes.
  const latest = useRef(convs);
  latest.current = convs;
  useEffect(() => {
    const t = setTimeout(() => saveConversations(convs), 400);
    return () => clearTimeout(t);
  }, [convs]);
  useEffect(() => {
    const flush = () => saveConversations(latest.current);
    window.addEventListener("pagehide", flush);
    return () => { window.removeEventListener("pagehide", flush); flush(); };
  }, []);
  useEffect(() => saveSampling(sampling), [sampling]);

  const update = useCallback((id: string, f: (c: Conversation) => Conversation) => {
    setConvs((cs) => cs.map((c) => (c.id === id ? { ...f(c), updated: Date.now() } : c)));
  }, []);

  const ensureConversation = (): Conversation => {
    if (current) return current;
    const c = newConversation(model);
    setConvs((cs) => [c, ...cs]);
    setCurrentId(c.id);
    return c;
  };

  // A long reply is re-rendered as markdown at most once a frame, however fast tokens come.
  const frame = useRef(0);
  const pendingLive = useRef<Partial | null>(null);
  const showSoon = (p: Partial) => {
    pendingLive.current = p;
    if (!frame.current) frame.current = requestAnimationFrame(() => { frame.current = 0; setLive(pendingLive.current); });
  };

  const run = async (conv: Conversation, history: Msg[]) => {
    const controller = new AbortController();
    abort.current = controller;
    const system: Msg[] = conv.system.trim() ? [{ role: "system", content: conv.system }] : [];
    update(conv.id, (c) => ({ ...c, messages: history }));
    setLive({ content: "", thinking: "", toolCalls: [] });
    let reply: Msg = { role: "assistant", content: "" };
    let last: Partial = { content: "", thinking: "", toolCalls: [] };
    try {
      const stats = await streamChat(conv.model || model, [...system, ...history], samplingOptions(sampling),
        controller.signal, (p) => { last = p; showSoon(p); });
      reply = { role: "assistant", content: last.content, thinking: last.thinking || undefined, toolCalls: last.toolCalls, stats };
    } catch (e) {
      const stopped = controller.signal.aborted;
      reply = { role: "assistant", content: last.content, thinking: last.thinking || undefined, stopped,
        error: stopped ? undefined : String((e as Error).message ?? e) };
    } finally {
      abort.current = null;
      cancelAnimationFrame(frame.current);
      frame.current = 0;
      setLive(null);
      update(conv.id, (c) => ({ ...c, messages: [...history, reply] }));
      models.refresh();
    }
  };

  const send = (input: string, files: Attachment[], images: ImageFile[]) => {
    const text = withAttachments(input, files);
    if ((!text && !images.length) || live) return;
    const conv = { ...ensureConversation(), model };
    const user: Msg = images.length ? { role: "user", content: text, images } : { role: "user", content: text };
    const history: Msg[] = [...conv.messages, user];
    const title = input.slice(0, 60) || files[0]?.name || images[0]?.name || "Chat";
    if (conv.messages.length === 0) update(conv.id, (c) => ({ ...c, title, model }));
    run(conv, history);
  };

  const stop = () => abort.current?.abort();
  const regenerate = () => {
    if (!current) return;
    const msgs = current.messages;
    run(current, msgs[msgs.length - 1]?.role === "assistant" ? msgs.slice(0, -1) : msgs);
  };
  const edit = (index: number, text: string) => {
    if (!current) return;
    run(current, [...current.messages.slice(0, index), { ...current.messages[index], content: text }]);
  };
  const pickModel = (m: string) => {
    localStorage.setItem(MODEL_STORE, m);
    if (current) update(current.id, (c) => ({ ...c, model: m }));
    else setConvs((cs) => [...cs]);
  };
  useEffect(() => {
    const onNew = () => { const c = newConversation(model); setConvs((cs) => [c, ...cs]); setCurrentId(c.id); };
    const onStop = () => abort.current?.abort();
    window.addEventListener("mlxr-new-chat", onNew);
    window.addEventListener("mlxr-stop", onStop);
    return () => { window.removeEventListener("mlxr-new-chat", onNew); window.removeEventListener("mlxr-stop", onStop); };
  }, [model]);

  // Stable callbacks keep the memoised list and messages from re-rendering on every token.
  const latestHandlers = useRef({ edit, regenerate });
  latestHandlers.current = { edit, regenerate };
  const onEdit = useCallback((i: number, text: string) => latestHandlers.current.edit(i, text), []);
  const onRegenerate = useCallback(() => latestHandlers.current.regenerate(), []);
  const onNew = useCallback(() => window.dispatchEvent(new Event("mlxr-new-chat")), []);
  const onDelete = useCallback((id: string) => setConvs((cs) => cs.filter((c) => c.id !== id)), []);
  const sorted = useMemo(() => [...convs].sort((a, b) => b.updated - a.updated), [convs]);
  const messages = current?.messages ?? [];
  const waitingForFirst = !!live && !live.content && !live.thinking && live.toolCalls.length === 0;
  const loads = useLoading(waitingForFirst);
  const load = loadOf(loads, current?.model || model);
  const info = useShow(model);

  // A chat opens at its newest message, and follows a reply while the reader is at the bottom.
  const box = useRef<HTMLDivElement>(null);
  const atBottom = useRef(true);
  useLayoutEffect(() => {
    const el = box.current;
    if (el) { el.scrollTop = el.scrollHeight; atBottom.current = true; }
  }, [currentId]);
  useLayoutEffect(() => {
    const el = box.current;
    if (el && atBottom.current) el.scrollTop = el.scrollHeight;
  }, [messages.length, live, load?.stage]);
  const onScroll = () => {
    const el = box.current;
    if (el) atBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
  };
  const toggle = (p: "convs" | "sampling") => setSide((v) => (v === p ? "" : p));
  return (
    <div className={`chat ${side ? `show-${side}` : ""}`}>
      <ConversationList conversations={sorted} current={currentId} onSelect={(id) => { setCurrentId(id); setSide(""); }}
        onNew={onNew} onDelete={onDelete} />
      <section className="thread">
        <header className="toolbar">
          <button className="narrow-only" onClick={() => toggle("convs")} data-testid="toggle-chats">Chats</button>
          <ModelPicker state={models} value={model} onChange={pickModel} />
          <button className="narrow-only" onClick={() => toggle("sampling")} data-testid="toggle-sampling">Options</button>
          <span className="muted">{current?.title ?? "New chat"}</span>
        </header>
        <div className="messages" data-testid="messages" ref={box} onScroll={onScroll}>
          {messages.map((m, i) => (
            <MessageView key={`${currentId}-${i}`} m={m} index={i} last={i === messages.length - 1}
              busy={!!live} onEdit={onEdit} onRegenerate={onRegenerate} />
          ))}
          {live && (
            <div className="msg assistant streaming" data-testid="msg-streaming">
              <div className="role">assistant</div>
              {waitingForFirst && (load ? <LoadingBar load={load} />
                : <div className="muted" data-testid="waiting-first-token">waiting for the first token…</div>)}
              {live.thinking && <pre className="thinking">{live.thinking}</pre>}
              <Markdown text={live.content} />
              {!load && <span className="cursor">▍</span>}
            </div>
          )}
        </div>
        <BaseModelNote model={model} info={info} />
        <Composer busy={!!live} canSend={!!model} model={model} vision={takesImages(info)} onSend={send} onStop={stop} />
      </section>
      <SamplingPanel s={sampling} onChange={setSampling} system={current?.system ?? ""}
        onSystem={(v) => { const c = ensureConversation(); update(c.id, (x) => ({ ...x, system: v })); }} />
    </div>
  );
}
