"""The same ``langgraph-sdk`` calls against ``agentstate serve`` and LangChain's own server
(``langgraph dev``, from ``pip install "langgraph-cli[inmem]"``), in one run: assistants (create,
get, update, versions, latest, search, count, delete, runs on one), thread ``copy`` and
``prune``, ``runs/batch`` and the thread stream must answer with the same status codes and the
same shapes (field names and types; values where both servers must agree).

Runs where ``langgraph dev`` is installed: ``$AGENTSTATE_LANGGRAPH_DEV`` names its ``langgraph``
command (else ``langgraph`` on ``PATH``); skipped otherwise. Ours runs on a real redis-server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port, require_real

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_sync_client
from test_serve import TESTS, TOKEN, _wait_up
from test_serve_assistants import GRAPHS

LANGGRAPH = os.environ.get("AGENTSTATE_LANGGRAPH_DEV") or shutil.which("langgraph")
pytestmark = pytest.mark.skipif(LANGGRAPH is None, reason="langgraph dev is not installed (AGENTSTATE_LANGGRAPH_DEV)")


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str], url: str, cwd: str | None = None) -> Iterator[str]:
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, cwd=cwd)
        try:
            _wait_up(url, proc, out)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def servers(real_server: Any) -> Iterator[dict[str, tuple[str, str | None]]]:
    """``{"dev": (url, key), "ours": (url, key)}``: both servers on the same graphs."""
    redis_url = require_real(real_server)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as project:
        graphs = {n: f"{TESTS / (t.split(':')[0] + '.py')}:{t.split(':')[1]}" for n, t in GRAPHS.items()}
        Path(project, "langgraph.json").write_text(json.dumps({"dependencies": ["."], "graphs": graphs}))
        dev_port, our_port = free_port(), free_port()
        dev = [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--port", str(dev_port)]
        ours = [sys.executable, "-m", "redis_agentstate", "serve", "--url", redis_url, "--namespace",
                f"parity-{uuid.uuid4().hex[:8]}", "--port", str(our_port)]  # fmt: skip
        for name, target in GRAPHS.items():
            ours += ["--graph", f"{name}={target}"]
        with (
            _process(dev, env, f"http://127.0.0.1:{dev_port}", cwd=project) as dev_url,
            _process(ours, {**env, "AGENTSTATE_TOKEN": TOKEN}, f"http://127.0.0.1:{our_port}") as our_url,
        ):
            yield {"dev": (dev_url, None), "ours": (our_url, TOKEN)}


def shape(x: Any) -> Any:
    """What two servers' answers must share: the fields and their types, not ids or times."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [shape(v) for v in x[:1]]
    return type(x).__name__


def both(servers: dict[str, tuple[str, str | None]], scenario: Callable[[Any, httpx.Client], dict[str, Any]]
         ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    out = []
    for name in ("dev", "ours"):
        url, key = servers[name]
        with httpx.Client(base_url=url, headers={"x-api-key": key} if key else {}, timeout=30) as h:
            out.append(scenario(get_sync_client(url=url, api_key=key), h))
    return out[0], out[1]


def call(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``("ok", the answer)`` or ``(status code, None)``."""
    try:
        return "ok", fn()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code, None


def _assistants(c: Any, h: httpx.Client) -> dict[str, Any]:
    out: dict[str, Any] = {}
    status, a = call(lambda: c.assistants.create("configured", context={"model": "m1"}, config={"tags": ["t"]},
                                                 metadata={"team": "p"}, name="Parity", description="d"))  # fmt: skip
    aid = a["assistant_id"]
    out["create"] = (status, shape(a), {k: a[k] for k in ("config", "context", "metadata", "name", "version")})
    out["get"] = shape(c.assistants.get(aid))
    u = c.assistants.update(aid, context={"model": "m2"}, metadata={"s": 2}, name="P2")
    out["update"] = (shape(u), {k: u[k] for k in ("config", "context", "metadata", "name", "version")})
    t = c.assistants.update(aid, config={"tags": ["x"]})
    out["update tags"] = {k: t[k] for k in ("config", "context", "version")}
    out["versions"] = [(v["version"], v["context"], shape(v)) for v in c.assistants.get_versions(aid)]
    out["versions by metadata"] = [v["version"] for v in c.assistants.get_versions(aid, metadata={"s": 2})]
    latest = c.assistants.set_latest(aid, 1)
    out["latest"] = {k: latest[k] for k in ("config", "context", "name", "version")}
    out["latest missing"] = call(lambda: c.assistants.set_latest(aid, 99))[0]
    out["search"] = [x["name"] for x in c.assistants.search(metadata={"team": "p"})]
    out["search by name"] = [x["name"] for x in c.assistants.search(name="parity", graph_id="configured")]
    out["search select"] = c.assistants.search(metadata={"team": "p"}, select=["name", "version"])
    out["count"] = c.assistants.count(metadata={"team": "p"})
    out["run"] = c.runs.wait(None, aid, input={"log": []})
    out["run context"] = c.runs.wait(None, aid, input={"log": []}, context={"tone": "warm"})
    out["graph"] = sorted(n["id"] for n in c.assistants.get_graph(aid)["nodes"])
    out["schemas"] = sorted(c.assistants.get_schemas(aid))
    missing = str(uuid.uuid4())
    for name, fn in [("get", lambda: c.assistants.get(missing)), ("patch", lambda: c.assistants.update(missing)),
                     ("versions", lambda: c.assistants.get_versions(missing)),
                     ("delete", lambda: c.assistants.delete(missing)),
                     ("run", lambda: c.runs.wait(None, missing, input={})),
                     ("run on no graph", lambda: c.runs.wait(None, "no-such-graph", input={})),
                     ("create on no graph", lambda: c.assistants.create("no-such-graph")),
                     ("create twice", lambda: c.assistants.create("steps", assistant_id=aid)),
                     ("create bad id", lambda: c.assistants.create("steps", assistant_id="x"))]:  # fmt: skip
        out[f"{name}: status"] = call(fn)[0]
    for body in ({"graph_id": "steps", "config": []}, {"graph_id": "steps", "if_exists": "x"},
                 {"graph_id": "steps", "context": {"a": 1}, "config": {"configurable": {"a": 2}}}):  # fmt: skip
        out[f"POST /assistants {json.dumps(body)}"] = h.post("/assistants", json=body).status_code
    out["search bad sort"] = h.post("/assistants/search", json={"sort_by": "color"}).status_code
    out["delete"] = call(lambda: c.assistants.delete(aid))
    out["get deleted"] = call(lambda: c.assistants.get(aid))[0]
    return out


def test_assistants_answer_as_langgraph_dev(servers: dict[str, tuple[str, str | None]]) -> None:
    dev, ours = both(servers, _assistants)
    # One difference, ours on purpose: langgraph dev's set_latest restores a version's config but
    # not its context (then config.configurable says m1 and context m2); ours restores both.
    assert dev["latest"]["context"] == {"model": "m2"} and dev["latest"]["config"]["configurable"] == {"model": "m1"}
    assert ours["latest"]["context"] == {"model": "m1"}
    dev["latest"]["context"] = ours["latest"]["context"]
    assert ours == dev


def _threads(c: Any, h: httpx.Client) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tid = c.threads.create(metadata={"team": "p"})["thread_id"]
    c.runs.wait(tid, "steps", input={"log": ["x"]})
    copy = c.threads.copy(tid)
    new = copy["thread_id"]
    out["copy"] = (copy["status"], copy["metadata"]["team"], new != tid)
    out["copy state"] = c.threads.get_state(new)["values"]
    out["copy history"] = len(c.threads.get_history(new, limit=100)) == len(c.threads.get_history(tid, limit=100))
    out["copy runs"] = c.runs.list(new)
    out["copy missing"] = call(lambda: c.threads.copy(str(uuid.uuid4())))[0]
    out["prune"] = c.threads.prune([tid, str(uuid.uuid4())])
    out["pruned"] = call(lambda: c.threads.get(tid))[0]
    out["prune none"] = c.threads.prune([])
    out["prune bad"] = [h.post("/threads/prune", json=b).status_code
                        for b in ({"thread_ids": [new], "strategy": "x"}, {"thread_ids": new})]  # fmt: skip
    return out


def test_thread_copy_and_prune_answer_as_langgraph_dev(servers: dict[str, tuple[str, str | None]]) -> None:
    dev, ours = both(servers, _threads)
    assert ours == dev


def _batch_and_stream(c: Any, h: httpx.Client) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs = c.runs.create_batch([{"assistant_id": "steps", "input": {"log": [str(i)]}} for i in range(2)])
    out["batch"] = [shape(r) for r in runs][:1] and sorted(runs[0])
    out["batch joined"] = [c.runs.join(r["thread_id"], r["run_id"]) for r in runs]
    out["batch bad"] = [h.post("/runs/batch", json=b).status_code for b in ([], {"a": 1})]
    tid = c.threads.create()["thread_id"]
    parts: list[tuple[str, Any]] = []

    def read() -> None:
        for p in c.threads.join_stream(tid):
            parts.append((p.event, p.data))
            if p.event == "metadata" and p.data.get("status") == "run_done":
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(1)  # the stream is open: the run below is one it follows
    run = c.runs.create(tid, "steps", input={"log": []}, stream_mode=["values", "updates"])
    reader.join(20)
    out["stream"] = [(e, d.get("status") if e == "metadata" else d) for e, d in parts]
    out["stream run"] = parts[-1][1]["run_id"] == run["run_id"] if parts else None
    return out


def test_runs_batch_and_the_thread_stream_answer_as_langgraph_dev(servers: dict[str, tuple[str, str | None]]) -> None:
    dev, ours = both(servers, _batch_and_stream)
    # LangGraph's runs carry langsmith_session_name, which ours has no use for.
    dev["batch"] = [k for k in dev["batch"] if k != "langsmith_session_name"]
    assert ours == dev
