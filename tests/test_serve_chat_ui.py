"""What a front end on ``useStream`` (LangChain's Agent Chat UI) relies on, through ``langgraph-sdk``
against ``agentstate serve`` and LangChain's own server (``langgraph dev``) in one run; each case
was found driving the UI in Chromium against both.

Reconnects: both SDKs read ``Location`` on ``runs.stream`` and ``runs.wait`` and, when the
connection drops before the answer is whole, GET it (a stream with ``Last-Event-ID``); the UI
streams with ``streamResumable``, so a dropped connection mid-run is its reconnect. A proxy between
the client and each server cuts the first answer of the run's POST after its headers (a stream:
after its first event); the client must still get every event and the final values.
``Content-Location`` stays the run itself (clients take the run id from it).

The thread list: the UI's history is ``threads.search(metadata=..., limit=100)`` with no sort,
which LangGraph's server answers last-updated first (a run updates its thread).

Runs where ``langgraph dev`` is installed (``$AGENTSTATE_LANGGRAPH_DEV``, else ``langgraph`` on
``PATH``); skipped otherwise. Ours runs on a real redis-server.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port, require_real
from serve_support import until

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_sync_client
from test_serve import TESTS, TOKEN
from test_serve_parity import LANGGRAPH, _process

pytestmark = [
    pytest.mark.skipif(LANGGRAPH is None, reason="langgraph dev is not installed (AGENTSTATE_LANGGRAPH_DEV)"),
    pytest.mark.filterwarnings("ignore:Request failed, attempting reconnect:UserWarning"),
]

#: ``a``, then ``long`` sleeping ``configurable["sleep"]`` seconds: the cut lands mid-run.
GRAPH = "lg_serve_graphs:long_sync"
SLEEP = {"configurable": {"sleep": 1.0}}


class CuttingProxy:
    """Relays TCP to ``upstream``; a connection whose first request is a ``POST`` to a path ending
    in one of ``cut`` is closed once the answer's headers (and, for a stream, its first event) have
    gone through. Every other connection (the client's reconnect) is relayed whole."""

    def __init__(self, upstream: int, cut: tuple[str, ...]) -> None:
        self.upstream, self.cut = upstream, cut
        self.cuts: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as up:
            first = client.recv(65536)
            line = first.split(b"\r\n", 1)[0].decode("latin-1")
            method, path = [*line.split(" "), "", ""][:2]
            cut = method == "POST" and path.endswith(self.cut)
            up.sendall(first)
            threading.Thread(target=self._pipe, args=(client, up), daemon=True).start()
            seen = b""
            while data := up.recv(65536):
                if not cut:
                    client.sendall(data)
                    continue
                seen += data
                head, sep, body = seen.partition(b"\r\n\r\n")
                if not sep:
                    continue
                stream = b"text/event-stream" in head.lower()
                if stream and b"\n\n" not in body.replace(b"\r\n", b"\n"):
                    continue  # a stream is cut after its first whole event
                keep = len(head) + 4 + (len(body) if stream else 0)
                client.sendall(seen[:keep])
                self.cuts.append(path)
                client.shutdown(socket.SHUT_RDWR)
                return

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def servers(real_server: Any) -> Iterator[dict[str, tuple[int, str | None]]]:
    """``{"dev": (port, key), "ours": (port, key)}``: both servers serving ``long``."""
    redis_url = require_real(real_server)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as project:
        module, _, attr = GRAPH.partition(":")
        spec = {"dependencies": ["."], "graphs": {"long": f"{TESTS / (module + '.py')}:{attr}"}}
        Path(project, "langgraph.json").write_text(json.dumps(spec))
        dev_port, our_port = free_port(), free_port()
        dev = [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--port", str(dev_port)]
        ours = [sys.executable, "-m", "redis_agentstate", "serve", "--url", redis_url, "--namespace",
                f"chat-ui-{uuid.uuid4().hex[:8]}", "--port", str(our_port), "--graph", f"long={GRAPH}"]  # fmt: skip
        with (
            _process(dev, env, f"http://127.0.0.1:{dev_port}", cwd=project),
            _process(ours, {**env, "AGENTSTATE_TOKEN": TOKEN}, f"http://127.0.0.1:{our_port}"),
        ):
            yield {"dev": (dev_port, None), "ours": (our_port, TOKEN)}


@contextlib.contextmanager
def cut_client(port: int, key: str | None, cut: tuple[str, ...]) -> Iterator[tuple[Any, Any, CuttingProxy]]:
    """A client straight to the server, one through a proxy cutting ``cut``, and the proxy."""
    proxy = CuttingProxy(port, cut)
    try:
        yield (get_sync_client(url=f"http://127.0.0.1:{port}", api_key=key),
               get_sync_client(url=f"http://127.0.0.1:{proxy.port}", api_key=key), proxy)  # fmt: skip
    finally:
        proxy.close()


@pytest.mark.parametrize("server", ["dev", "ours"])
def test_a_cut_stream_reconnects_to_its_run_stream(servers: dict[str, tuple[int, str | None]], server: str) -> None:
    port, key = servers[server]
    with cut_client(port, key, ("/runs/stream",)) as (direct, cut, proxy):
        tid = direct.threads.create()["thread_id"]
        created: list[Any] = []
        parts = list(cut.runs.stream(tid, "long", input={"log": []}, config=SLEEP, stream_mode="values",
                                     stream_resumable=True, on_run_created=created.append))  # fmt: skip
        assert proxy.cuts == [f"/threads/{tid}/runs/stream"]  # the first answer was cut, the reconnect was not
        names = [p.event for p in parts]
        assert names[0] == "metadata" and names.count("metadata") == 1, names
        assert parts[-1].event == "values" and parts[-1].data == {"log": ["a", "long"]}, parts
        runs = direct.runs.list(tid)
        assert len(runs) == 1 and runs[0]["status"] == "success"
        assert created and created[0]["run_id"] == runs[0]["run_id"] and created[0]["thread_id"] == tid


@pytest.mark.parametrize("server", ["dev", "ours"])
def test_a_cut_wait_reconnects_to_its_run_join(servers: dict[str, tuple[int, str | None]], server: str) -> None:
    port, key = servers[server]
    with cut_client(port, key, ("/runs/wait",)) as (direct, cut, proxy):
        tid = direct.threads.create()["thread_id"]
        out = cut.runs.wait(tid, "long", input={"log": []}, config=SLEEP)
        assert proxy.cuts == [f"/threads/{tid}/runs/wait"]
        assert out == {"log": ["a", "long"]}
        runs = direct.runs.list(tid)
        assert len(runs) == 1 and runs[0]["status"] == "success"


@pytest.mark.parametrize("server", ["dev", "ours"])
def test_threads_search_lists_the_last_used_first(servers: dict[str, tuple[int, str | None]], server: str) -> None:
    port, key = servers[server]
    c = get_sync_client(url=f"http://127.0.0.1:{port}", api_key=key)
    tag = {"t": uuid.uuid4().hex}
    made = []
    for _ in range(3):
        made.append(c.threads.create(metadata=tag)["thread_id"])
        time.sleep(0.01)  # created_at apart
    a, b, d = made
    quick = {"configurable": {"sleep": 0}}
    for tid in (a, b, a):  # a's second run makes it the last used: runs, not only metadata, update a thread
        c.runs.wait(tid, "long", input={"log": []}, config=quick)
        time.sleep(0.01)

    def ids(**kw: Any) -> list[str]:
        return [t["thread_id"] for t in c.threads.search(metadata=tag, **kw)]

    assert ids() == [a, b, d]
    assert ids(limit=1, offset=1) == [b]
    assert ids(sort_by="created_at") == [d, b, a]  # descending unless asked
    assert ids(sort_by="created_at", sort_order="asc") == [a, b, d]
    assert ids(sort_by="updated_at", sort_order="asc") == [d, b, a]


@pytest.mark.parametrize("server", ["dev", "ours"])
def test_state_and_history_name_checkpoints_as_langgraph(
    servers: dict[str, tuple[int, str | None]], server: str
) -> None:
    """A front end sends a state's ``parent_checkpoint`` back as a run's ``checkpoint`` (useStream's
    regenerate): a checkpoint is ``thread_id``, ``checkpoint_ns`` and ``checkpoint_id`` (no
    ``checkpoint_map`` the thread does not have), none without an id, and a state also carries
    LangGraph's ``checkpoint_id`` and ``parent_checkpoint_id``."""
    port, key = servers[server]
    c = get_sync_client(url=f"http://127.0.0.1:{port}", api_key=key)
    named = {"thread_id", "checkpoint_ns", "checkpoint_id"}
    tid = c.threads.create()["thread_id"]
    empty = c.threads.get_state(tid)
    assert (empty["checkpoint"], empty["parent_checkpoint"], empty["metadata"]) == (None, None, None)
    assert (empty["checkpoint_id"], empty["parent_checkpoint_id"]) == (None, None)  # type: ignore[typeddict-item]
    c.runs.wait(tid, "long", input={"log": []}, config={"configurable": {"sleep": 0}})
    history = c.threads.get_history(tid, limit=10)
    assert len(history) == 4 and history[-1]["parent_checkpoint"] is None
    for s in [c.threads.get_state(tid), *history]:
        assert set(s["checkpoint"]) == named and s["checkpoint"]["thread_id"] == tid, s["checkpoint"]
        assert s["checkpoint_id"] == s["checkpoint"]["checkpoint_id"]  # type: ignore[typeddict-item]
        parent = s["parent_checkpoint"]
        assert parent is None or set(parent) == named, parent
        assert s["parent_checkpoint_id"] == (parent and parent["checkpoint_id"])  # type: ignore[typeddict-item]
    out: dict[str, Any] = dict(c.threads.update_state(tid, {"log": ["x"]}))
    assert set(out["checkpoint"]) == named and out["configurable"] == out["checkpoint"]
    assert out["checkpoint_id"] == out["checkpoint"]["checkpoint_id"] == c.threads.get_state(tid)["checkpoint_id"]  # type: ignore[typeddict-item]


def _recorded(client: Any) -> list[tuple[str, str, int]]:
    """The requests ``client`` (langgraph-sdk's sync client) sends from now on: method, path, status."""
    seen: list[tuple[str, str, int]] = []
    client.http.client.event_hooks["response"].append(
        lambda r: seen.append((r.request.method, r.request.url.path, r.status_code))
    )
    return seen


@pytest.mark.parametrize("server", ["dev", "ours"])
def test_a_stateless_stream_names_its_run_alone(servers: dict[str, tuple[int, str | None]], server: str) -> None:
    """A stateless stream's ``Location`` is ``/runs/R/stream`` and its ``Content-Location``
    ``/runs/R``, as LangGraph's server sends them: its thread is temporary, so both SDKs, which GET
    ``/threads/T/runs/R`` after a stream that named one to see whether the run still goes on, ask
    nothing more (a 404 once the thread was dropped, a console error in a browser), and
    ``on_run_created`` gets no thread."""
    port, key = servers[server]
    c = get_sync_client(url=f"http://127.0.0.1:{port}", api_key=key)
    seen = _recorded(c)
    created: list[Any] = []
    parts = list(c.runs.stream(None, "long", input={"log": []}, config={"configurable": {"sleep": 0}},
                               stream_mode="values", on_run_created=created.append))  # fmt: skip
    assert parts[-1].event == "values" and parts[-1].data == {"log": ["a", "long"]}
    assert seen == [("POST", "/runs/stream", 200)]
    rid = created[0]["run_id"]
    assert created == [{"run_id": rid, "thread_id": None}]
    body = {"assistant_id": "long", "input": {"log": []}, "config": {"configurable": {"sleep": 0}}}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/runs/stream", headers={"x-api-key": key or ""}, json=body) as r:
        r.read()
        rid = r.headers["content-location"].removeprefix("/runs/")
        assert r.headers["location"] == f"/runs/{rid}/stream" and "/" not in rid


@pytest.mark.parametrize("server", ["dev", "ours"])
def test_a_cut_stateless_wait_reconnects_to_its_run_join(
    servers: dict[str, tuple[int, str | None]], server: str
) -> None:
    """A stateless wait's answer starts at once (its headers, then a newline now and then), so a
    client cut off mid-run has its ``Location``, the temporary thread's run's ``/join``; the join
    answers the run's values though the thread is dropped when the run ends."""
    port, key = servers[server]
    with cut_client(port, key, ("/runs/wait",)) as (_, cut, proxy):
        out = cut.runs.wait(None, "long", input={"log": []}, config={"configurable": {"sleep": 2.0}})
        assert proxy.cuts == ["/runs/wait"]
        assert out == {"log": ["a", "long"]}


def test_a_cut_stateless_stream_resumes_on_ours_and_leaves_no_thread(
    servers: dict[str, tuple[int, str | None]],
) -> None:
    """Beyond LangGraph's server, which answers a stateless stream's ``Location`` (``/runs/R/stream``)
    404: ours serves it, so a cut stateless stream resumes after ``Last-Event-ID``, from the run's
    recorded events, wherever its temporary thread is. A stateless run whose client was cut off still
    drops its temporary thread when it ends, a wait's as a stream's."""
    port, key = servers["ours"]
    direct = get_sync_client(url=f"http://127.0.0.1:{port}", api_key=key)
    before = direct.threads.count()
    with cut_client(port, key, ("/runs/stream",)) as (_, cut, proxy):
        parts = list(cut.runs.stream(None, "long", input={"log": []}, config=SLEEP, stream_mode="values"))
        assert proxy.cuts == ["/runs/stream"]
    assert [p.event for p in parts] == ["metadata", "values", "values", "values"]
    assert parts[-1].data == {"log": ["a", "long"]}
    with cut_client(port, key, ("/runs/wait",)) as (_, cut, proxy):
        assert cut.runs.wait(None, "long", input={"log": []}, config=SLEEP) == {"log": ["a", "long"]}
        assert proxy.cuts == ["/runs/wait"]
    until(lambda: direct.threads.count() == before, 10)
