// LangChain's JavaScript client (@langchain/langgraph-sdk) against one LangGraph server.
// usage: node check.mjs URL [API_KEY]; prints one JSON line per call: {name, ok, error?, ms}.
// The graphs are tools/js_client/graphs.py (steps, slow, ask, chat); tools/js_client_check.py
// runs this against `agentstate serve` and `langgraph dev` side by side.
import { Client } from "@langchain/langgraph-sdk";

const [url, apiKey] = process.argv.slice(2);
// No retries: a server error is a failed call here, not 20 s of back-off.
const client = new Client({ apiUrl: url, apiKey: apiKey || undefined, callerOptions: { maxRetries: 0 } });
const input = { log: [] };
const ctx = {};

function check(cond, what) {
  if (!cond) throw new Error(`expected ${what}`);
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function collect(iter) {
  const parts = [];
  for await (const part of iter) parts.push(part);
  return parts;
}
const events = (parts) => parts.map((p) => p.event.split("|")[0]);

const calls = [
  ["assistants.search", async () => {
    const found = await client.assistants.search({ graphId: "steps" });
    check(found.length >= 1 && found[0].graph_id === "steps", "an assistant of graph steps");
    ctx.assistant = found[0].assistant_id;
  }],
  ["assistants.get", async () => {
    const a = await client.assistants.get(ctx.assistant);
    check(a.graph_id === "steps", "graph_id steps");
  }],
  ["assistants.getGraph", async () => {
    const g = await client.assistants.getGraph(ctx.assistant);
    check(g.nodes.some((n) => n.id === "b"), "node b in the drawing");
  }],
  ["assistants.getSchemas", async () => {
    const s = await client.assistants.getSchemas(ctx.assistant);
    check(s.graph_id === "steps" && s.state_schema, "a state schema");
  }],
  ["assistants.getSubgraphs", async () => {
    const s = await client.assistants.getSubgraphs(ctx.assistant);
    check(typeof s === "object", "an object");
  }],
  ["assistants.create", async () => {
    const a = await client.assistants.create({ graphId: "steps", metadata: { team: "js" }, name: "mine" });
    check(a.graph_id === "steps" && a.name === "mine", "the created assistant");
    ctx.mine = a.assistant_id;
  }],
  ["assistants.update", async () => {
    const a = await client.assistants.update(ctx.mine, { metadata: { team: "js2" } });
    check(a.version === 2 && a.metadata.team === "js2", "version 2");
  }],
  ["assistants.getVersions", async () => {
    const v = await client.assistants.getVersions(ctx.mine);
    check(v.length === 2, "two versions");
  }],
  ["assistants.setLatest", async () => {
    const a = await client.assistants.setLatest(ctx.mine, 1);
    check(a.version === 1, "version 1");
  }],
  ["assistants.count", async () => {
    const n = await client.assistants.count({ graphId: "steps" });
    check(n >= 2, "two or more");
  }],
  ["runs.wait on a created assistant", async () => {
    const v = await client.runs.wait(null, ctx.mine, { input });
    check(same(v.log, ["a", "b", "c"]), "log a b c");
  }],
  ["assistants.delete", async () => {
    await client.assistants.delete(ctx.mine);
  }],
  ["threads.create", async () => {
    const t = await client.threads.create({ metadata: { user: "js-u1" } });
    ctx.thread = t.thread_id;
  }],
  ["threads.get", async () => {
    const t = await client.threads.get(ctx.thread);
    check(t.thread_id === ctx.thread && t.metadata.user === "js-u1", "the thread");
  }],
  ["threads.update", async () => {
    const t = await client.threads.update(ctx.thread, { metadata: { tag: "t1" } });
    check(t.metadata.tag === "t1", "metadata tag");
  }],
  ["threads.search", async () => {
    const found = await client.threads.search({ metadata: { user: "js-u1" } });
    check(found.some((t) => t.thread_id === ctx.thread), "the thread found");
  }],
  ["threads.count", async () => {
    const n = await client.threads.count({ metadata: { user: "js-u1" } });
    check(n >= 1, "at least one");
  }],
  ["runs.wait", async () => {
    const v = await client.runs.wait(ctx.thread, "steps", { input });
    check(same(v.log, ["a", "b", "c"]), "log a b c");
  }],
  ["threads.getState", async () => {
    const s = await client.threads.getState(ctx.thread);
    check(same(s.values.log, ["a", "b", "c"]) && s.next.length === 0, "the values");
    ctx.head = s.checkpoint;
  }],
  ["threads.getHistory", async () => {
    const h = await client.threads.getHistory(ctx.thread, { limit: 10 });
    check(h.length >= 4, "four or more checkpoints");
  }],
  ["threads.updateState", async () => {
    await client.threads.updateState(ctx.thread, { values: { log: ["x"] }, asNode: "c" });
    const s = await client.threads.getState(ctx.thread);
    check(same(s.values.log, ["a", "b", "c", "x"]), "x appended");
  }],
  ["runs.create + join", async () => {
    const r = await client.runs.create(ctx.thread, "steps", { input });
    ctx.run = r.run_id;
    const v = await client.runs.join(ctx.thread, r.run_id);
    check(v.log && v.log.at(-1) === "c", "the run's values");
  }],
  ["runs.get", async () => {
    const r = await client.runs.get(ctx.thread, ctx.run);
    check(r.status === "success", "status success");
  }],
  ["runs.list", async () => {
    const rs = await client.runs.list(ctx.thread);
    check(rs.length >= 2, "two or more runs");
  }],
  ["runs.stream values", async () => {
    const parts = await collect(client.runs.stream(ctx.thread, "steps", { input, streamMode: "values" }));
    check(events(parts).includes("values"), "values events");
  }],
  ["runs.stream updates", async () => {
    const parts = await collect(client.runs.stream(ctx.thread, "steps", { input, streamMode: "updates" }));
    check(parts.filter((p) => p.event === "updates").length === 3, "three updates");
  }],
  ["runs.stream custom", async () => {
    const parts = await collect(client.runs.stream(ctx.thread, "steps", { input, streamMode: "custom" }));
    check(same(parts.filter((p) => p.event === "custom").map((p) => p.data.node), ["a", "b", "c"]), "custom a b c");
  }],
  ["runs.stream values+updates", async () => {
    const parts = await collect(client.runs.stream(ctx.thread, "steps", { input, streamMode: ["values", "updates"] }));
    const ev = new Set(events(parts));
    check(ev.has("values") && ev.has("updates"), "both modes");
  }],
  ["runs.stream messages-tuple", async () => {
    const t = await client.threads.create();
    const parts = await collect(client.runs.stream(t.thread_id, "chat", {
      input: { messages: [{ role: "user", content: "hi" }] }, streamMode: "messages-tuple",
    }));
    const text = parts.filter((p) => p.event === "messages").map((p) => p.data[0].content).join("");
    check(text === "hello there friend", `the tokens (got ${JSON.stringify(text)})`);
  }],
  ["runs.stream events", async () => {
    const parts = await collect(client.runs.stream(ctx.thread, "steps", { input, streamMode: "events" }));
    check(parts.some((p) => p.event === "events" && p.data.event === "on_chain_start"), "on_chain_start events");
  }],
  ["runs.stream stateless", async () => {
    const parts = await collect(client.runs.stream(null, "steps", { input, streamMode: "values" }));
    const last = parts.filter((p) => p.event === "values").at(-1);
    check(last && same(last.data.log, ["a", "b", "c"]), "final values");
  }],
  ["runs.wait stateless", async () => {
    const v = await client.runs.wait(null, "steps", { input });
    check(same(v.log, ["a", "b", "c"]), "log a b c");
  }],
  ["runs.joinStream", async () => {
    const t = await client.threads.create();
    const r = await client.runs.create(t.thread_id, "slow", { input, streamMode: ["values"], streamResumable: true });
    const parts = await collect(client.runs.joinStream(t.thread_id, r.run_id));
    check(events(parts).includes("values"), "values events");
  }],
  ["runs.cancel (wait)", async () => {
    const t = await client.threads.create();
    const r = await client.runs.create(t.thread_id, "slow", { input });
    await new Promise((ok) => setTimeout(ok, 500));
    const started = Date.now();
    await client.runs.cancel(t.thread_id, r.run_id, true);
    const got = await client.runs.get(t.thread_id, r.run_id);
    check(got.status === "interrupted", `interrupted (got ${got.status})`);
    check(Date.now() - started < 1500, `a cancel under 1.5 s (took ${Date.now() - started} ms)`);
  }],
  ["double-text reject", async () => {
    const t = await client.threads.create();
    await client.runs.create(t.thread_id, "slow", { input });
    let refused = false;
    try {
      await client.runs.create(t.thread_id, "slow", { input, multitaskStrategy: "reject" });
    } catch (e) {
      refused = String(e).includes("409");
    }
    check(refused, "409 on a busy thread");
    ctx.busy = t.thread_id;
  }],
  ["double-text enqueue (no strategy)", async () => {
    const t = await client.threads.create();
    await client.runs.create(t.thread_id, "steps", { input });
    const r = await client.runs.create(t.thread_id, "steps", { input });
    const v = await client.runs.join(t.thread_id, r.run_id);
    check(v.log.length === 6, "both runs applied");
  }],
  ["interrupt", async () => {
    const t = await client.threads.create();
    ctx.asked = t.thread_id;
    await client.runs.wait(t.thread_id, "ask", { input });
    const s = await client.threads.getState(t.thread_id);
    check(s.next.length === 1 && s.tasks[0].interrupts.length === 1, "one interrupt");
    const th = await client.threads.get(t.thread_id);
    check(th.status === "interrupted", `thread interrupted (got ${th.status})`);
  }],
  ["resume (command)", async () => {
    const v = await client.runs.wait(ctx.asked, "ask", { command: { resume: "yes" } });
    check(same(v.log, ["answer:yes"]), "the answer in the log");
  }],
  ["resume as useStream submits it (input {} and a command)", async () => {
    // Agent Chat UI's inbox resumes with submit({}, { command: { resume } }): an empty input beside
    // the command, which LangGraph's server takes as no input.
    const t = await client.threads.create();
    await client.runs.wait(t.thread_id, "ask", { input });
    const parts = await collect(client.runs.stream(t.thread_id, "ask", {
      input: {}, command: { resume: "yes" }, streamMode: ["values"], streamSubgraphs: true, streamResumable: true,
    }));
    const last = parts.filter((p) => p.event === "values").at(-1);
    check(last && same(last.data.log, ["answer:yes"]), `the answer in the log (got ${JSON.stringify(parts.at(-1))})`);
  }],
  ["threads.copy", async () => {
    const c = await client.threads.copy(ctx.thread);
    const s = await client.threads.getState(c.thread_id);
    check(c.thread_id !== ctx.thread && s.values.log.length > 0, "a copy with the values");
    ctx.copy = c.thread_id;
  }],
  ["threads.delete", async () => {
    await client.threads.delete(ctx.copy);
    let gone = false;
    try { await client.threads.get(ctx.copy); } catch (e) { gone = String(e).includes("404"); }
    check(gone, "404 after delete");
  }],
  ["runs.createBatch", async () => {
    const rs = await client.runs.createBatch([{ assistantId: "steps", input }, { assistantId: "steps", input }]);
    check(rs.length === 2, "two runs");
  }],
  ["store.putItem", async () => {
    await client.store.putItem(["js", "prefs"], "lang", { v: "fr" });
  }],
  ["store.getItem", async () => {
    const item = await client.store.getItem(["js", "prefs"], "lang");
    check(item && item.value.v === "fr", "the value");
  }],
  ["store.searchItems", async () => {
    const r = await client.store.searchItems(["js"], { filter: { v: "fr" } });
    check(r.items.length === 1, "one item");
  }],
  ["store.listNamespaces", async () => {
    const r = await client.store.listNamespaces({ prefix: ["js"] });
    check(r.namespaces.some((n) => same(n, ["js", "prefs"])), "the namespace");
  }],
  ["store.deleteItem", async () => {
    await client.store.deleteItem(["js", "prefs"], "lang");
    const item = await client.store.getItem(["js", "prefs"], "lang");
    check(item === null, "null after delete");
  }],
  ["crons.createForThread", async () => {
    const c = await client.crons.createForThread(ctx.thread, "steps", { schedule: "*/5 * * * *", input });
    ctx.cron = c.cron_id;
  }],
  ["crons.search", async () => {
    const cs = await client.crons.search({ assistantId: ctx.assistant });
    check(cs.some((c) => c.cron_id === ctx.cron), "the cron");
  }],
  ["crons.delete", async () => {
    await client.crons.delete(ctx.cron);
  }],
  ["runs.delete", async () => {
    await client.runs.delete(ctx.thread, ctx.run);
  }],
];

for (const [name, call] of calls) {
  const started = Date.now();
  try {
    await call();
    console.log(JSON.stringify({ name, ok: true, ms: Date.now() - started }));
  } catch (e) {
    const error = String(e && e.message ? e.message : e).slice(0, 200);
    console.log(JSON.stringify({ name, ok: false, error, ms: Date.now() - started }));
  }
}
