// The agentstate dashboard: no framework, no build step. Every value from Redis reaches the page
// through textContent (never innerHTML), so an id or a reason holding HTML shows as text. With a token
// the server let this page load only with a session (an HttpOnly cookie the script cannot read); each
// action carries the session's CSRF token, which /dashboard/api/info hands this page.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { ns: null, info: null, frame: null, offset: 0, frames: null, poolTail: null, runEvents: null, history: [] };
const RUN_EVENTS = ["metadata", "values", "updates", "custom", "debug", "messages", "tasks", "checkpoints", "error"];

function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function button(label, onClick, title) {
  const b = el("button", label, title ? { title } : {});
  b.disabled = !!(state.info && state.info.read_only);
  if (b.disabled) b.title = "read-only: the server was started without --token";
  b.addEventListener("click", onClick);
  return b;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function row(...cells) {
  const tr = el("tr");
  for (const c of cells) {
    const td = el("td");
    if (c instanceof Node) td.append(c); else td.textContent = c === null || c === undefined ? "" : String(c);
    tr.append(td);
  }
  return tr;
}

function seconds(ms) {
  return (ms / 1000).toFixed(1) + " s";
}

function serverNow() {
  return Date.now() + state.offset;
}

async function act(path, body) {
  const headers = { "content-type": "application/json" };
  if (state.info && state.info.csrf) headers["x-csrf-token"] = state.info.csrf;
  const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body || {}), credentials: "same-origin" });
  if (r.status === 401) { location.reload(); return false; } // the session ended: the login form again
  let detail = "";
  try { detail = (await r.json()).detail || ""; } catch (e) { detail = ""; }
  $("action-result").textContent = r.ok ? "done: " + path : "refused (" + r.status + "): " + detail;
  $("action-result").className = r.ok ? "" : "error";
  return r.ok;
}

function taskAction(task, action, body) {
  const q = "?ns=" + encodeURIComponent(state.ns);
  return act("/dashboard/api/tasks/" + encodeURIComponent(task) + "/" + action + q, body);
}

// ---- the frame: tasks, leases, parked, waiting, limits --------------------------------------

function render(frame) {
  state.frame = frame;
  state.offset = frame.server_time_ms - Date.now();
  $("error").hidden = !frame.error;
  $("error").textContent = frame.error || "";
  const statuses = Object.entries(frame.by_status || {});
  fill($("by-status").tBodies[0], statuses.length ? statuses.map(([s, n]) => row(s, n)) : [row("(no tasks)", 0)]);
  const facts = [
    ["tasks", frame.tasks], ["claimable now", frame.claimable_now], ["due now", frame.due_now],
    ["live leases", frame.live_leases], ["expired leases", frame.expired_leases], ["parked", frame.parked],
    ["oldest due", frame.oldest_due ? frame.oldest_due.task_id + " (" + seconds(frame.oldest_due.wait_ms) + ")" : "-"],
    ["totals", Object.entries(frame.counters || {}).map(([k, v]) => k + " " + v).join(", ")],
  ];
  $("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", k), el("dd", v === undefined ? "…" : v)]));
  renderLeases();
  const parked = frame.parked_tasks || [];
  $("parked-note").textContent = frame.parked > parked.length ? "(first " + parked.length + " of " + frame.parked + ")" : "";
  fill($("parked").tBodies[0], parked.map((t) => row(t.task_id, t.attempts, t.last_failure || t.corrupt || "",
    button("requeue", () => taskAction(t.task_id, "requeue")))));
  fill($("waiting").tBodies[0], (frame.waiting || []).map((t) => {
    const answer = el("input", null, { type: "text", placeholder: "\"yes\"", "aria-label": "answer for " + t.task_id });
    const resume = button("resume", () => {
      let message;
      try { message = answer.value ? JSON.parse(answer.value) : null; } catch (e) {
        $("action-result").textContent = "the answer must be JSON"; return;
      }
      taskAction(t.task_id, "resume", { message });
    });
    const deadline = t.due_in_ms === null || t.due_in_ms === undefined ? "none" : seconds(t.due_in_ms);
    return row(t.task_id, t.cycle_index, deadline, answer, resume);
  }));
  fill($("limits").tBodies[0], (frame.concurrency_limits || []).map((l) => row(l.key, l.live, l.limit === null ? "none" : l.limit)));
  const h = frame.history || [];
  if (h.length > 1) state.history = h.slice(); else if (h.length === 1) state.history.push(h[0]);
  state.history = state.history.slice(-600);
  const r = frame.per_second || {};
  $("rate-now").textContent = r.claims === null || r.claims === undefined ? "" :
    "now: " + ["claims", "commits", "takeovers"].map((k) => k + " " + Number(r[k]).toFixed(1)).join(", ");
  drawChart();
}

function renderLeases() {
  const frame = state.frame;
  if (!frame) return;
  const leased = frame.leased || [];
  $("leases-note").textContent = frame.live_leases > leased.length ? "(first " + leased.length + " of " + frame.live_leases + ")" : "";
  const now = serverNow();
  fill($("leases").tBodies[0], leased.map((t) => {
    const left = t.lease_expires_at_ms - now;
    return row(t.task_id, t.claim_token, t.claimed_cycle, left > 0 ? seconds(left) : "expired " + seconds(-left) + " ago",
      button("cancel", () => { if (confirm("cancel task " + t.task_id + "?")) taskAction(t.task_id, "cancel"); }));
  }));
}

function drawChart() {
  const c = $("chart"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const pts = state.history;
  if (pts.length < 2) return;
  const max = Math.max(1, ...pts.flatMap((p) => [p.claims || 0, p.commits || 0, p.takeovers || 0]));
  const t0 = pts[0].t, t1 = pts[pts.length - 1].t, span = Math.max(1, t1 - t0);
  g.fillStyle = "#666";
  g.fillText(max.toFixed(1) + "/s", 4, 12);
  for (const [key, color] of [["claims", "#1f77b4"], ["commits", "#2ca02c"], ["takeovers", "#d62728"]]) {
    g.strokeStyle = color;
    g.beginPath();
    pts.forEach((p, i) => {
      const x = ((p.t - t0) / span) * (c.width - 2) + 1, y = c.height - 2 - ((p[key] || 0) / max) * (c.height - 20);
      if (i) g.lineTo(x, y); else g.moveTo(x, y);
    });
    g.stroke();
  }
}

// ---- pools --------------------------------------------------------------------------------------

async function loadPools() {
  const r = await fetch("/dashboard/api/pools?ns=" + encodeURIComponent(state.ns));
  if (!r.ok) return;
  const data = await r.json();
  $("pools-note").textContent = data.count > data.pools.length ? "(first " + data.pools.length + " of " + data.count + ")" : "(" + data.count + ")";
  $("pools").replaceChildren(...data.pools.map((p) => {
    const li = el("li");
    const b = el("button", p);
    b.addEventListener("click", () => tailPool(p));
    li.append(b);
    return li;
  }));
}

function tailPool(pool) {
  if (state.poolTail) state.poolTail.close();
  const log = $("pool-tail");
  log.textContent = "";
  const src = new EventSource("/dashboard/api/pools/" + encodeURIComponent(pool) + "/tail?ns=" + encodeURIComponent(state.ns));
  src.addEventListener("record", (ev) => {
    const rec = JSON.parse(ev.data);
    log.append(document.createTextNode("#" + rec.sequence + " " + rec.kind + " " + JSON.stringify(rec.payload) + "\n"));
    log.scrollTop = log.scrollHeight;
  });
  state.poolTail = src;
}

// ---- LangGraph threads and runs ------------------------------------------------------------------

async function loadThreads() {
  const r = await fetch("/dashboard/api/threads");
  if (!r.ok) return;
  const data = await r.json();
  $("threads-note").textContent = data.count > data.threads.length ? "(first " + data.threads.length + " of " + data.count + ")" : "(" + data.count + ")";
  fill($("threads").tBodies[0], data.threads.map((t) => {
    const runs = el("span");
    for (const run of t.runs) {
      const b = el("button", run.status + (run.attempt > 1 ? " (attempt " + run.attempt + ")" : ""), { title: run.run_id + (run.error ? ": " + run.error : "") });
      b.addEventListener("click", () => watchRun(t.thread_id, run));
      runs.append(b, " ");
    }
    return row(t.thread_id, t.graph_id || "-", runs);
  }));
}

function watchRun(thread, run) {
  if (state.runEvents) state.runEvents.close();
  const title = $("run-title");
  title.replaceChildren(el("span", "run " + run.run_id + " of thread " + thread + " "));
  if (run.status === "pending" || run.status === "running") {
    title.append(button("cancel run", () => act("/threads/" + encodeURIComponent(thread) + "/runs/" + encodeURIComponent(run.run_id) + "/cancel?action=interrupt")));
  }
  const log = $("run-events");
  log.textContent = "";
  const src = new EventSource("/threads/" + encodeURIComponent(thread) + "/runs/" + encodeURIComponent(run.run_id) + "/stream");
  for (const name of RUN_EVENTS) {
    src.addEventListener(name, (ev) => {
      // "error" is also the EventSource's own event when the stream closes (no data): not a run's.
      if (!(ev instanceof MessageEvent)) return;
      log.append(document.createTextNode(name + " " + ev.data + "\n"));
      log.scrollTop = log.scrollHeight;
    });
  }
  src.onerror = () => src.close(); // the run ended: the server closed the stream
  state.runEvents = src;
}

// ---- wiring -------------------------------------------------------------------------------------

function connect() {
  if (state.frames) state.frames.close();
  state.history = [];
  const src = new EventSource("/dashboard/api/frames?ns=" + encodeURIComponent(state.ns));
  src.addEventListener("frame", (ev) => {
    $("conn").textContent = "live";
    $("conn").className = "badge ok";
    render(JSON.parse(ev.data));
  });
  src.onerror = () => { $("conn").textContent = "reconnecting…"; $("conn").className = "badge bad"; };
  state.frames = src;
  loadPools();
}

async function main() {
  const r = await fetch("/dashboard/api/info");
  if (r.status === 401) { location.reload(); return; }
  state.info = await r.json();
  $("mode").textContent = state.info.read_only ? "read-only" : "logged in";
  $("logout").hidden = !state.info.session;
  $("logout").addEventListener("click", async () => {
    await fetch("/dashboard/logout", { method: "POST", headers: { "x-csrf-token": state.info.csrf || "" } });
    location.reload();
  });
  const sel = $("ns");
  sel.replaceChildren(...state.info.namespaces.map((n) => el("option", n, { value: n })));
  state.ns = state.info.namespaces[0];
  sel.addEventListener("change", () => { state.ns = sel.value; connect(); });
  connect();
  loadThreads();
  setInterval(renderLeases, 250);
  setInterval(() => { $("clock").textContent = new Date(serverNow()).toISOString().slice(11, 19) + " UTC"; }, 250);
  setInterval(loadThreads, 3000);
  setInterval(loadPools, 10000);
}

main();
