"""``agentstate serve``'s runs path, judged by ``langgraph-sdk`` (and raw httpx): a cancel that
stops a run inside a long node at once, ... (issue 41, items 1, 2, 7, 9).

The app runs under uvicorn in a thread of this process (on fakeredis and on a real redis-server),
so a test can look at what a graph's node went through (``lg_serve_graphs.EVENTS``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lg_serve_graphs as graphs
import pytest
from conftest import free_port, require_real
from fork_support import popen_python
from serve_support import app_in_thread, langgraph_dev, langgraph_dev_cli, needs_311, ok, ours_need_311, until

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_sync_client

TESTS = Path(__file__).parent
TOKEN = "s3cret-token-for-tests"
GRAPHS = ("long_sync", "long_async", "parent", "quick_async")

on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip


@contextlib.contextmanager
def _served(backend: Any, namespace: str, **kw: Any) -> Iterator[str]:
    from redis_agentstate.server import create_app

    client = backend.new_async_client(max_connections=320)
    app = create_app({n: getattr(graphs, n) for n in GRAPHS}, client, namespace=namespace, token=TOKEN,
                     workers=2, **kw)  # fmt: skip
    with app_in_thread(app) as url:
        yield url


@pytest.fixture
def real_redis_url(real_server: Any) -> str:
    return require_real(real_server)


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
        until(lambda: "started" in graphs.EVENTS.get(tid, []))
        t0 = time.monotonic()
        c.runs.cancel(tid, run["run_id"], wait=True)
        took = time.monotonic() - t0
        assert took < 1.0, f"cancel(wait=True) took {took:.2f} s"
        assert c.runs.get(tid, run["run_id"])["status"] == "interrupted"
        # The node would have ended by now: its output must not have reached the thread.
        time.sleep(graphs.LONG_S + 0.5)
        assert _log(c, tid) == ["a"]
        # Its head has ``long`` next: interrupted, as langgraph dev 0.16.7 leaves a thread whose run was
        # cancelled inside a node (it says so for both graphs).
        assert c.threads.get(tid)["status"] == "interrupted"
        if graph == "long_async":
            assert graphs.EVENTS[tid] == ["started", "cancelled"]  # its task was cancelled, not left to end
        # The thread goes on: a next run executes (here without the long sleep).
        done = c.runs.wait(tid, graph, input={"log": []}, config={"configurable": {"sleep": 0}})
        assert done["log"] == ["a", "a", "long"]

    def test_cancel_wait_raw_http_answers_200_at_once(self, url: str) -> None:
        h = httpx.Client(base_url=url, headers={"x-api-key": TOKEN}, timeout=30)
        tid = h.post("/threads", json={}).json()["thread_id"]
        rid = h.post(f"/threads/{tid}/runs", json={"assistant_id": "long_async", "input": {"log": []}}).json()["run_id"]
        until(lambda: "started" in graphs.EVENTS.get(tid, []))
        t0 = time.monotonic()
        r = h.post(f"/threads/{tid}/runs/{rid}/cancel", params={"wait": 1, "action": "rollback"})
        assert time.monotonic() - t0 < 1.0
        assert r.status_code == 200 and r.json() == {}
        # A rollback deletes the run and what it wrote: the thread has no checkpoint of it.
        assert h.get(f"/threads/{tid}/runs/{rid}").status_code == 404
        time.sleep(0.3)
        assert h.get(f"/threads/{tid}/state").json()["values"] in ({}, None, {"log": []})


@on_fake_and_real
class TestSubgraphsAndDisconnect:
    """Item 2: ``stream_subgraphs=True`` streams the subgraphs' events, named ``<mode>|<namespace>`` as
    LangGraph's server names them (``graph.stream(subgraphs=True)``'s namespace joined by ``|``), and
    ``on_disconnect="cancel"`` cancels the run when its streaming client goes away."""

    @needs_311
    def test_stream_subgraphs_streams_the_subgraphs_events(self, url: str) -> None:
        c = get_sync_client(url=url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        parts = list(c.runs.stream(tid, "parent", input={"log": []}, stream_mode=["updates", "custom"],
                                   stream_subgraphs=True))  # fmt: skip
        names = [p.event for p in parts]
        sub = [n for n in names if "|" in n]
        assert sub, names
        assert all(n.split("|")[1].startswith("child:") for n in sub), sub
        custom = [p.data for p in parts if p.event.startswith("custom|child:")]
        assert custom == [{"in": "x"}]
        updates = [p.data for p in parts if p.event.startswith("updates|child:")]
        assert updates == [{"x": {"log": ["x"]}}, {"y": {"log": ["y"]}}]
        # The parent's own events keep their names, after the subgraph's, as LangGraph streams them.
        assert names.index("updates") > names.index(sub[-1])
        assert [p.data for p in parts if p.event == "updates"] == [{"child": {"log": ["x", "y"]}}]
        # join_stream with a mode filter keeps that mode's subgraph events.
        run_id = parts[0].data["run_id"]
        again = [p.event for p in c.runs.join_stream(tid, run_id, stream_mode="custom")]
        assert [n for n in again if n.startswith("custom")] == [n for n in names if n.startswith("custom")]
        # Without stream_subgraphs: the graph's own events only (its custom event is the subgraph's).
        names = [p.event for p in c.runs.stream(tid, "parent", input={"log": []}, stream_mode=["updates", "custom"])]
        assert not [n for n in names if "|" in n] and "custom" not in names, names

    def test_on_disconnect_cancel_cancels_the_run(self, url: str) -> None:
        h = httpx.Client(base_url=url, headers={"x-api-key": TOKEN}, timeout=30)
        tid = h.post("/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "long_async", "input": {"log": []}, "on_disconnect": "cancel"}
        with h.stream("POST", f"/threads/{tid}/runs/stream", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: dropping the iterator closes the connection
            first = next(lines)
            assert first.startswith(("id:", "event:")), first
            until(lambda: "started" in graphs.EVENTS.get(tid, []))
        # The client went away mid-run: the run is cancelled (its node too), not left to end.
        runs = h.get(f"/threads/{tid}/runs").json()
        until(lambda: h.get(f"/threads/{tid}/runs/{runs[0]['run_id']}").json()["status"] == "interrupted", 5)
        assert graphs.EVENTS[tid] == ["started", "cancelled"]

    def test_on_disconnect_cancel_on_wait_cancels_the_run(self, url: str) -> None:
        h = httpx.Client(base_url=url, headers={"x-api-key": TOKEN}, timeout=30)
        tid = h.post("/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "long_async", "input": {"log": []}, "on_disconnect": "cancel"}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up waiting and goes away
            h.post(f"/threads/{tid}/runs/wait", json=body, timeout=httpx.Timeout(30, read=1.0))
        rid = h.get(f"/threads/{tid}/runs").json()[0]["run_id"]
        until(lambda: h.get(f"/threads/{tid}/runs/{rid}").json()["status"] == "interrupted", 5)
        assert graphs.EVENTS[tid] == ["started", "cancelled"]

    def test_on_disconnect_continue_lets_the_run_end(self, url: str) -> None:
        h = httpx.Client(base_url=url, headers={"x-api-key": TOKEN}, timeout=30)
        tid = h.post("/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "long_async", "input": {"log": []}, "config": {"configurable": {"sleep": 0.5}}}
        with h.stream("POST", f"/threads/{tid}/runs/stream", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            until(lambda: "started" in graphs.EVENTS.get(tid, []))
        rid = h.get(f"/threads/{tid}/runs").json()[0]["run_id"]
        until(lambda: h.get(f"/threads/{tid}/runs/{rid}").json()["status"] == "success", 10)
        assert h.post(f"/threads/{tid}/runs/stream", json={**body, "on_disconnect": "later"}).status_code == 422


@pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"], indirect=True)
@needs_311
def test_run_queue_subgraphs_on_the_sync_and_asyncio_workers(backend: Any, namespace: str) -> None:
    """``RunQueue.create(subgraphs=True)``: both GraphWorker drivers record the subgraphs' events."""
    import asyncio

    from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver, AsyncRunQueue, GraphWorker, RunQueue

    client = backend.sync_client()
    q = RunQueue(client, namespace=namespace)
    run = q.create("t-sync", {"log": []}, stream_mode=["updates", "custom"], subgraphs=True)
    assert q.get(run.run_id).subgraphs is True  # type: ignore[union-attr]
    assert GraphWorker(graphs.parent, q, AgentStateSaver(client, namespace=namespace)).run_once(block_ms=5000)
    names = [e.event for e in q.stream(run.run_id)]
    assert [n.split(":")[0] for n in names if "|" in n] == ["custom|child", "updates|child", "updates|child"]

    async def on_asyncio() -> list[str]:
        aclient = backend.new_async_client()
        try:
            aq = AsyncRunQueue(aclient, namespace=namespace)
            arun = await aq.create("t-async", {"log": []}, stream_mode=["updates", "custom"], subgraphs=True)
            w = GraphWorker(graphs.parent, aq, AsyncAgentStateSaver(aclient, namespace=namespace))
            assert await w.arun_once(block_ms=5000)
            out = [e.event async for e in aq.stream(arun.run_id)]
            await w._aclose_waker()
            return out
        finally:
            await aclient.aclose()

    anames = asyncio.run(on_asyncio())
    assert [n.split(":")[0] for n in anames if "|" in n] == ["custom|child", "updates|child", "updates|child"]


@on_fake_and_real
class TestDoubleTexting:
    """Item 6: double-texting as LangChain's server does it: no ``multitask_strategy`` on a busy thread
    enqueues (langgraph-api's default), and ``interrupt`` / ``rollback`` stop the running run at once,
    inside a long node too, without its node's output."""

    def test_no_strategy_on_a_busy_thread_enqueues(self, url: str) -> None:
        c = get_sync_client(url=url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        first = c.runs.create(tid, "long_async", input={"log": []}, config={"configurable": {"sleep": 0.5}})
        until(lambda: "started" in graphs.EVENTS.get(tid, []))
        second = c.runs.create(tid, "long_async", input={"log": []}, config={"configurable": {"sleep": 0}})
        assert second["status"] == "pending" and second["multitask_strategy"] == "enqueue"
        c.runs.join(tid, second["run_id"])
        assert [c.runs.get(tid, r["run_id"])["status"] for r in (first, second)] == ["success", "success"]
        assert _log(c, tid) == ["a", "long", "a", "long"]

    @pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
    def test_interrupt_and_rollback_stop_the_running_run_at_once(self, url: str, strategy: str) -> None:
        c = get_sync_client(url=url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        first = c.runs.create(tid, "long_async", input={"log": []})
        until(lambda: "started" in graphs.EVENTS.get(tid, []))
        t0 = time.monotonic()
        second = c.runs.create(tid, "long_async", input={"log": []}, multitask_strategy=strategy,
                               config={"configurable": {"sleep": 0}})  # fmt: skip
        c.runs.join(tid, second["run_id"])
        took = time.monotonic() - t0
        assert took < 1.5, f"the double-text's run ended {took:.2f} s later"
        assert graphs.EVENTS[tid][:2] == ["started", "cancelled"]
        if strategy == "interrupt":
            assert c.runs.get(tid, first["run_id"])["status"] == "interrupted"
            assert _log(c, tid) == ["a", "a", "long"]  # the first run's 'a' kept, never its 'long'
        else:
            assert first["run_id"] not in [r["run_id"] for r in c.runs.list(tid)]
            assert _log(c, tid) == ["a", "long"]  # the thread as if the first run never was


@pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"], indirect=True)
@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_the_sync_driver_fences_a_cancelled_run_out_at_once(backend: Any, namespace: str, action: str) -> None:
    """Item 1 on the sync driver (``GraphWorker.run()``, a ``RunQueue``): a sync node cannot be stopped,
    but the cancel answers at once (the run ends ``interrupted``, or is deleted) and the node's output,
    written after the cancel, is refused by the thread's lease: it never reaches the thread."""
    from redis_agentstate.langgraph import AgentStateSaver, GraphWorker, RunQueue

    client = backend.sync_client()
    q, saver = RunQueue(client, namespace=namespace), AgentStateSaver(client, namespace=namespace)
    worker = GraphWorker(graphs.long_sync, q, saver, block_ms=200)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        tid = f"sync-{action}-{namespace}"
        run = q.create(tid, {"log": []})
        until(lambda: "started" in graphs.EVENTS.get(tid, []))
        t0 = time.monotonic()
        assert q.cancel(run.run_id, action=action)
        if action == "interrupt":
            assert q.join(run.run_id, timeout_s=5).status == "interrupted"
        else:
            until(lambda: q.get(run.run_id) is None, 5)
        took = time.monotonic() - t0
        assert took < 1.0, f"the cancelled run ended {took:.2f} s later"
        until(lambda: graphs.EVENTS[tid] == ["started", "ended"], graphs.LONG_S + 5)  # the node ran on
        time.sleep(0.3)
        head = saver.get_tuple({"configurable": {"thread_id": tid}})
        logged = [] if head is None else head.checkpoint["channel_values"].get("log", [])
        assert logged == (["a"] if action == "interrupt" else []), logged
        # The thread goes on: its next run executes.
        nxt = q.create(tid, {"log": []}, config={"configurable": {"sleep": 0}})
        assert q.join(nxt.run_id, timeout_s=20).status == "success"
    finally:
        worker.stop()
        thread.join(10)


def _cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("AGENTSTATE_TOKEN", None)
    env["AGENTSTATE_TOKEN"] = TOKEN  # not on the command line: ps would show it
    return env


@contextlib.contextmanager
def _serve_cli(redis_url: str, namespace: str, *extra: str, graphs_: tuple[str, ...] = GRAPHS) -> Iterator[Any]:
    """``agentstate serve`` in a subprocess, its output in files; yields (url, process)."""
    port = free_port()
    args = [sys.executable, "-m", "redis_agentstate", "serve", "--url", redis_url, "--namespace", namespace,
            "--port", str(port), *extra]  # fmt: skip
    for name in graphs_:
        args += ["--graph", f"{name}=lg_serve_graphs:{name}"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen_python(args[1:], env=_cli_env(), stdout=out, stderr=err)  # forked: tests/fork_support.py
        try:
            url = f"http://127.0.0.1:{port}"
            until(lambda: proc.poll() is not None or ok(url), 30)
            assert proc.poll() is None, f"agentstate serve exited {proc.returncode}: {_read(err)}"
            yield url, proc, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _read(f: Any) -> str:
    f.flush()
    f.seek(0)
    return str(f.read().decode("utf-8", "replace"))


@pytest.mark.parametrize("workers", ["1", "4"])
def test_an_idle_server_stops_within_a_second_of_sigterm(real_redis_url: str, namespace: str, workers: str) -> None:
    """Item 7: an idle ``agentstate serve`` (its workers blocked in claim_next, 5 s at a time) stops
    on SIGTERM at once, not after their block runs out."""
    with _serve_cli(real_redis_url, namespace, "--workers", workers) as (url, proc, err):
        c = get_sync_client(url=url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        assert c.runs.wait(tid, "quick_async", input={"log": []})["log"] == ["q"]  # it ran a run, then idles
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        took = time.monotonic() - t0
        assert proc.returncode in (0, -signal.SIGTERM), _read(err)  # uvicorn re-raises the signal it caught
        assert took < 2.5, f"stopped {took:.2f} s after SIGTERM"


@contextlib.contextmanager
def _worker_cli(redis_url: str, *args: str) -> Iterator[Any]:
    """``agentstate langgraph worker ...`` in a subprocess; yields (process, its stderr file)."""
    argv = [sys.executable, "-m", "redis_agentstate", "langgraph", "worker", *args, "--url", redis_url]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=_cli_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            yield proc, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _status_becomes(c: Any, tid: str, rid: str, status: str, timeout: float) -> None:
    try:
        until(lambda: c.runs.get(tid, rid)["status"] == status, timeout)
    except AssertionError:
        raise AssertionError(f"run {rid} is {c.runs.get(tid, rid)['status']}, not {status}") from None


class TestCliWorkerFleet:
    """Item 9: ``agentstate serve --workers 0`` and a fleet of ``agentstate langgraph worker MODULE:ATTR
    --namespace <ns>.<NAME>`` processes, as docs/serve.md says: the worker derives the queue, the saver
    and the graph id from ``--namespace`` as serve does, and runs async graphs."""

    def test_a_cli_worker_runs_the_servers_runs_of_an_async_graph(self, real_redis_url: str, namespace: str) -> None:
        with _serve_cli(real_redis_url, namespace, "--workers", "0", graphs_=("quick_async", "long_async")) as (
            url, _proc, _err
        ):  # fmt: skip
            c = get_sync_client(url=url, api_key=TOKEN)
            with _worker_cli(real_redis_url, "lg_serve_graphs:quick_async", "--namespace", f"{namespace}.quick_async",
                             "--concurrency", "2") as (worker, err):  # fmt: skip
                tid = c.threads.create()["thread_id"]
                run = c.runs.create(tid, "quick_async", input={"log": []})
                _status_becomes(c, tid, run["run_id"], "success", 20)
                assert c.threads.get_state(tid)["values"] == {"log": ["q"]}, _read(err)
                t0 = time.monotonic()
                worker.send_signal(signal.SIGTERM)  # idle: it stops at once, exit 0
                assert worker.wait(15) == 0, _read(err)
                assert time.monotonic() - t0 < 2.5
            # A cancel reaches a CLI worker's run inside a long node at once too.
            with _worker_cli(real_redis_url, "lg_serve_graphs:long_async", "--namespace",
                             f"{namespace}.long_async") as (worker, err):  # fmt: skip
                tid = c.threads.create()["thread_id"]
                run = c.runs.create(tid, "long_async", input={"log": []})
                until(lambda: c.threads.get_state(tid)["values"].get("log") == ["a"], 20)
                time.sleep(0.3)  # inside its long node
                t0 = time.monotonic()
                c.runs.cancel(tid, run["run_id"], wait=True)
                assert time.monotonic() - t0 < 1.0
                assert c.runs.get(tid, run["run_id"])["status"] == "interrupted", _read(err)

    def test_a_cli_worker_with_explicit_namespaces_runs_an_async_graph(
        self, real_redis_url: str, namespace: str
    ) -> None:
        ns = f"{namespace}.quick_async"
        with (
            _serve_cli(real_redis_url, namespace, "--workers", "0", graphs_=("quick_async",)) as (url, _p, _e),
            _worker_cli(real_redis_url, "lg_serve_graphs:quick_async", "--queue-namespace", ns, "--saver-namespace", ns,
                        "--graph-id", "quick_async") as (_worker, err),
        ):  # fmt: skip
            c = get_sync_client(url=url, api_key=TOKEN)
            tid = c.threads.create()["thread_id"]
            run = c.runs.create(tid, "quick_async", input={"log": []})
            until(lambda: c.runs.get(tid, run["run_id"])["status"] not in ("pending", "running"), 20)
            got = c.runs.get(tid, run["run_id"])
            assert got["status"] == "success", (got, _read(err))  # not "No synchronous function provided"

    def test_worker_names_follow_the_namespace_as_serve_does(self) -> None:
        import argparse

        from redis_agentstate.cli import build_parser
        from redis_agentstate.langgraph.cli import worker_names

        def names(*argv: str) -> tuple[str, str, str | None, str]:
            args = build_parser().parse_args(["langgraph", "worker", "m:agent", *argv])
            if not hasattr(args, "namespace"):
                args.namespace = None
            assert isinstance(args, argparse.Namespace)
            return worker_names(args)

        assert names("--namespace", "prod.chat") == ("prod.chat", "prod.chat", "prod.store", "chat")
        assert names() == ("agentstate", "agentstate", None, "agent")
        assert names("--namespace", "prod.chat", "--queue-namespace", "q", "--saver-namespace", "s",
                     "--store-namespace", "st", "--graph-id", "g") == ("q", "s", "st", "g")  # fmt: skip


# ---- the same checks against LangChain's own server, where it is installed ------------------------
#
# AGENTSTATE_LANGGRAPH_DEV=/path/to/bin/langgraph (a venv with `langgraph-cli[inmem]`) adds
# `langgraph dev` to the servers below, so one run shows the two agree; without it, only ours runs.


@pytest.fixture(params=["agentstate", "langgraph_dev"])
def server_url(request: pytest.FixtureRequest, real_server: Any, namespace: str) -> Iterator[str]:
    if request.param != "langgraph_dev" and request.node.originalname == "test_subgraph_event_names":
        ours_need_311(request)  # the subgraph's node reads its config
    if request.param == "langgraph_dev":
        with langgraph_dev(langgraph_dev_cli(), "lg_serve_graphs", ("parent", "long_async")) as url:
            yield url
        return
    with _serve_cli(require_real(real_server), namespace, "--workers", "2", graphs_=("parent", "long_async")) as (
        url, _p, _e
    ):  # fmt: skip
        yield url


class TestAsLangGraphDev:
    """Items 1, 2 and 6 through the CLI, with what ``langgraph dev`` 0.16.7 answers as the expected values."""

    def test_subgraph_event_names(self, server_url: str) -> None:
        c = get_sync_client(url=server_url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        parts = list(c.runs.stream(tid, "parent", input={"log": []}, stream_mode=["updates", "custom"],
                                   stream_subgraphs=True))  # fmt: skip
        seen = [(p.event.split(":")[0], p.data) for p in parts if p.event != "metadata"]
        assert seen == [
            ("custom|child", {"in": "x"}),
            ("updates|child", {"x": {"log": ["x"]}}),
            ("updates|child", {"y": {"log": ["y"]}}),
            ("updates", {"child": {"log": ["x", "y"]}}),
        ]

    def test_a_busy_thread_enqueues_and_a_cancel_answers_at_once(self, server_url: str) -> None:
        c = get_sync_client(url=server_url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        first = c.runs.create(tid, "long_async", input={"log": []})
        until(lambda: (c.threads.get_state(tid)["values"] or {}).get("log") == ["a"], 20)
        time.sleep(0.3)  # inside its long node
        second = c.runs.create(tid, "long_async", input={"log": []}, config={"configurable": {"sleep": 0}})
        assert (second["status"], second["multitask_strategy"]) == ("pending", "enqueue")
        t0 = time.monotonic()
        c.runs.cancel(tid, first["run_id"], wait=True)
        assert time.monotonic() - t0 < 1.0
        assert c.runs.get(tid, first["run_id"])["status"] == "interrupted"
        c.runs.join(tid, second["run_id"])
        assert c.threads.get_state(tid)["values"] == {"log": ["a", "a", "long"]}
