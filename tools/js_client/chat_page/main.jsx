// A chat front end on @langchain/langgraph-sdk's React `useStream`, calling it as LangChain's Agent
// Chat UI does (src/providers/Stream.tsx, Thread.tsx, components/thread/): apiUrl and assistantId
// from the URL, the API key from localStorage ("lg:chat:apiKey"), the thread id kept in the URL's
// `threadId`, `fetchStateHistory`, a message submitted with `streamResumable` (the thread made by
// the hook, `onThreadId`), an interrupt read from `stream.interrupt` and resumed with a `command`,
// a regenerate from the message's parent checkpoint, and the thread list from `threads.search`.
// tests/test_chat_page.py bundles it with esbuild and drives it in Chromium against both servers.
import React, { useCallback, useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { Client } from "@langchain/langgraph-sdk";
import { useStream } from "@langchain/langgraph-sdk/react";

const params = new URLSearchParams(window.location.search);
const apiUrl = params.get("apiUrl");
const assistantId = params.get("assistantId");
const apiKey = window.localStorage.getItem("lg:chat:apiKey") || undefined;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function useThreadIdParam() {
  const [threadId, setThreadId] = useState(params.get("threadId"));
  const set = useCallback((id) => {
    const url = new URL(window.location.href);
    if (id) url.searchParams.set("threadId", id);
    else url.searchParams.delete("threadId");
    window.history.replaceState(null, "", url);
    setThreadId(id);
  }, []);
  return [threadId, set];
}

function contentString(content) {
  if (typeof content === "string") return content;
  return (content ?? []).filter((b) => b.type === "text").map((b) => b.text).join(" ");
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function useThreads() {
  const [threads, setThreads] = useState([]);
  const getThreads = useCallback(async () => {
    const client = new Client({ apiUrl, apiKey });
    const metadata = UUID.test(assistantId) ? { assistant_id: assistantId } : { graph_id: assistantId };
    return client.threads.search({ metadata, limit: 100 });
  }, []);
  const refresh = useCallback(() => getThreads().then(setThreads).catch(console.error), [getThreads]);
  return { threads, refresh };
}

function Chat() {
  const [threadId, setThreadId] = useThreadIdParam();
  const [conn, setConn] = useState("checking");
  const { threads, refresh } = useThreads();
  const [input, setInput] = useState("");
  const [answer, setAnswer] = useState("");
  const stream = useStream({
    apiUrl,
    apiKey,
    assistantId,
    threadId: threadId ?? null,
    messagesKey: "messages",
    fetchStateHistory: true,
    onThreadId: (id) => {
      setThreadId(id);
      // As the UI does: the thread list is read again a moment after the hook made a thread.
      sleep(1000).then(refresh);
    },
    onFinish: () => refresh(),
  });

  useEffect(() => {
    const headers = new Headers();
    if (apiKey) headers.set("X-Api-Key", apiKey);
    fetch(`${apiUrl}/info`, { headers })
      .then((res) => setConn(res.ok ? "ok" : "failed"))
      .catch(() => setConn("failed"));
    refresh();
  }, [refresh]);

  const send = (e) => {
    e.preventDefault();
    if (!input.trim() || stream.isLoading) return;
    const message = { id: crypto.randomUUID(), type: "human", content: [{ type: "text", text: input }] };
    stream.submit(
      { messages: [message] },
      {
        streamMode: ["values"],
        streamSubgraphs: true,
        streamResumable: true,
        optimisticValues: (prev) => ({ ...prev, messages: [...(prev.messages ?? []), message] }),
      },
    );
    setInput("");
  };

  const regenerate = (parentCheckpoint) =>
    stream.submit(undefined, {
      checkpoint: parentCheckpoint,
      streamMode: ["values"],
      streamSubgraphs: true,
      streamResumable: true,
    });

  const interrupt = stream.interrupt;
  const question = interrupt?.value?.question ?? (interrupt ? JSON.stringify(interrupt) : "");

  return (
    <div id="app" data-loading={String(stream.isLoading)}>
      <header>
        <strong>Agent chat</strong>
        <span id="conn" data-state={conn}>
          {conn === "ok" ? "connected" : conn === "failed" ? "Failed to connect" : "connecting"}
        </span>
        <button id="new-thread" onClick={() => { setThreadId(null); refresh(); }}>New thread</button>
        <span id="thread-id">{threadId ?? ""}</span>
      </header>
      <aside id="threads">
        {threads.map((t) => {
          const first = t.values?.messages?.[0];
          return (
            <button key={t.thread_id} className="thread" data-thread-id={t.thread_id}
              aria-current={String(t.thread_id === threadId)} onClick={() => setThreadId(t.thread_id)}>
              {first ? contentString(first.content) : t.thread_id}
            </button>
          );
        })}
      </aside>
      <main>
        <div id="messages">
          {stream.messages.map((m, i) => {
            const meta = m.type === "ai" ? stream.getMessagesMetadata(m, i) : undefined;
            const parent = meta?.firstSeenState?.parent_checkpoint;
            return (
              <div key={m.id ?? i} className="msg" data-type={m.type} data-id={m.id}>
                <span className="content">{contentString(m.content)}</span>
                {m.type === "ai" && !stream.isLoading && (
                  <button className="regenerate" onClick={() => regenerate(parent)}>Regenerate</button>
                )}
              </div>
            );
          })}
        </div>
        {interrupt && !stream.isLoading && (
          <div id="interrupt">
            <div className="question">{question}</div>
            <button id="approve" onClick={() => stream.submit({}, { command: { resume: "yes" } })}>Approve</button>
            <input id="answer" value={answer} onChange={(e) => setAnswer(e.target.value)} placeholder="or answer" />
            <button id="answer-send" onClick={() => stream.submit(undefined, { command: { resume: answer } })}>
              Answer
            </button>
          </div>
        )}
        {stream.error != null && <div id="error">{String(stream.error?.message ?? stream.error)}</div>}
        <form id="composer" onSubmit={send}>
          <input id="input" value={input} onChange={(e) => setInput(e.target.value)} placeholder="Type a message" />
          <button id="send" type="submit" disabled={stream.isLoading}>Send</button>
        </form>
      </main>
    </div>
  );
}

createRoot(document.getElementById("root")).render(<Chat />);
