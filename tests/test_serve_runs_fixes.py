"""``agentstate serve``'s runs path, judged by ``langgraph-sdk`` (and raw httpx): a cancel that
stops a run inside a long node at once, ... (issue 41, items 1, 2, 7, 9).

The app runs under uvicorn in a thread of this process (on fakeredis and on a real redis-server),
so a test can look at what a graph's node went through (``lg_serve_graphs.EVENTS``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import lg_serve_graphs as graphs
import pytest
from conftest import free_port

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_sync_client

TOKEN = "s3cret-token-for-tests"
GRAPHS = ("long_sync", "long_async", "parent", "quick_async")

on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip


@contextlib.contextmanager
def _served(backend: Any, namespace: str, **kw: Any) -> Iterator[str]:
    import uvicorn

    from redis_agentstate.server import create_app

    port = free_port()
    client = backend.new_async_client(max_connections=320)
    app = create_app({n: getattr(graphs, n) for n in GRAPHS}, client, namespace=namespace, token=TOKEN,
                     workers=2, **kw)  # fmt: skip
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: _ok(url), 30)
        yield url
    finally:
        srv.should_exit = True
        thread.join(20)


def _ok(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/ok", timeout=3).status_code == 200
    return False


def _until(cond: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def url(backend: Any, namespace: str) -> Iterator[str]:
    with _served(backend, namespace) as u:
        yield u


def _log(c: Any, tid: str) -> list[str]:
    return list(c.threads.get_state(tid)["values"].get("log", []))


@on_fake_and_real
class TestCancelStopsAtOnce:
    """Item 1: ``runs.cancel(wait=True)`` on a run inside a long node answers at once, the run is
    ``interrupted``, and nothing the run did after the cancel reaches the thread."""

    @pytest.mark.parametrize("graph", ["long_async", "long_sync"])
    def test_cancel_wait_inside_a_long_node(self, url: str, graph: str) -> None:
        c = get_sync_client(url=url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        run = c.runs.create(tid, graph, input={"log": []})
        _until(lambda: "started" in graphs.EVENTS.get(tid, []))
        t0 = time.monotonic()
        c.runs.cancel(tid, run["run_id"], wait=True)
        took = time.monotonic() - t0
        assert took < 1.0, f"cancel(wait=True) took {took:.2f} s"
        assert c.runs.get(tid, run["run_id"])["status"] == "interrupted"
        # The node would have ended by now: its output must not have reached the thread.
        time.sleep(graphs.LONG_S + 0.5)
        assert _log(c, tid) == ["a"]
        assert c.threads.get(tid)["status"] == "idle"
        if graph == "long_async":
            assert graphs.EVENTS[tid] == ["started", "cancelled"]  # its task was cancelled, not left to end
        # The thread goes on: a next run executes (here without the long sleep).
        done = c.runs.wait(tid, graph, input={"log": []}, config={"configurable": {"sleep": 0}})
        assert done["log"] == ["a", "a", "long"]

    def test_cancel_wait_raw_http_answers_200_at_once(self, url: str) -> None:
        h = httpx.Client(base_url=url, headers={"x-api-key": TOKEN}, timeout=30)
        tid = h.post("/threads", json={}).json()["thread_id"]
        rid = h.post(f"/threads/{tid}/runs", json={"assistant_id": "long_async", "input": {"log": []}}).json()["run_id"]
        _until(lambda: "started" in graphs.EVENTS.get(tid, []))
        t0 = time.monotonic()
        r = h.post(f"/threads/{tid}/runs/{rid}/cancel", params={"wait": 1, "action": "rollback"})
        assert time.monotonic() - t0 < 1.0
        assert r.status_code == 200 and r.json() == {}
        # A rollback deletes the run and what it wrote: the thread has no checkpoint of it.
        assert h.get(f"/threads/{tid}/runs/{rid}").status_code == 404
        time.sleep(0.3)
        assert h.get(f"/threads/{tid}/state").json()["values"] in ({}, None, {"log": []})
