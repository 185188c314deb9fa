"""``agentstate serve``: LangGraph's server API, judged by the real ``langgraph-sdk`` client and
``RemoteGraph``, over workers executing the runs (``GraphWorker`` tasks in the server).

On fakeredis the app runs under uvicorn in a thread of this process; on a real redis-server it is
the CLI in a subprocess (``python -m redis_agentstate serve ...``), as a user starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import lg_run_graphs as graphs
import pytest
from conftest import free_port
from fork_support import popen_python, run_python

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_client, get_sync_client  # noqa: E402

TESTS = Path(__file__).parent
TOKEN = "s3cret-token-for-tests"
GRAPHS = {n: f"lg_run_graphs:{n}" for n in ("steps", "slow", "ask", "chat", "memory", "nested")}


@dataclass
class Served:
    url: str
    token: str | None
    log: Any = None
    files: tuple[Any, Any] | None = None

    def output(self) -> tuple[str, str]:
        """What the server printed so far: (stdout, stderr)."""
        assert self.files is not None
        return _read(self.files[0]), _read(self.files[1])

    def sync(self, **kw: Any) -> Any:
        return get_sync_client(url=self.url, api_key=self.token, **kw)

    def aio(self, **kw: Any) -> Any:
        return get_client(url=self.url, api_key=self.token, **kw)

    def http(self) -> httpx.Client:
        """A raw client that sends the token when the server has one (every route but /ok needs it)."""
        headers = {"x-api-key": self.token} if self.token else {}
        return httpx.Client(base_url=self.url, timeout=30, headers=headers)

    def anonymous(self) -> httpx.Client:
        """A raw client without the token."""
        return httpx.Client(base_url=self.url, timeout=30)


def _read(f: Any) -> str:
    if f is None:
        return ""
    f.flush()
    f.seek(0)
    return str(f.read().decode("utf-8", "replace"))


def _wait_up(url: str, proc: subprocess.Popen[bytes] | None = None, err: Any = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"agentstate serve exited {proc.returncode}: {_read(err)}")
        with contextlib.suppress(httpx.HTTPError):
            # 503: it serves, but its Redis does not answer (a test's unreachable Redis).
            if httpx.get(url + "/ok", timeout=3).status_code in (200, 503):
                return
        time.sleep(0.05)
    raise AssertionError("agentstate serve did not come up")


@contextlib.contextmanager
def _in_thread(server: Any, namespace: str, token: str | None, **kw: Any) -> Iterator[Served]:
    import uvicorn

    from redis_agentstate.server import create_app

    port = free_port()
    client = fakeredis.FakeAsyncRedis(server=server, max_connections=320)  # as agentstate serve sizes it
    app = create_app({n: getattr(graphs, n) for n in GRAPHS}, client,
                     namespace=namespace, token=token, workers=2, **kw)  # fmt: skip
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        _wait_up(f"http://127.0.0.1:{port}")
        yield Served(f"http://127.0.0.1:{port}", token)
    finally:
        srv.should_exit = True
        thread.join(20)


@contextlib.contextmanager
def _cli(url: str, namespace: str, token: str | None, *extra: str) -> Iterator[Served]:
    port = free_port()
    args = [sys.executable, "-m", "redis_agentstate", "serve", "--url", url, "--namespace", namespace,
            "--port", str(port), "--workers", "2", *extra]  # fmt: skip
    for name, target in GRAPHS.items():
        args += ["--graph", f"{name}={target}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("AGENTSTATE_TOKEN", None)
    if token is not None:
        env["AGENTSTATE_TOKEN"] = token  # not on the command line: ps would show it
    # Its output goes to files, not pipes: a pipe nobody reads while the test runs would block the
    # server once its buffer filled.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen_python(args[1:], env=env, stdout=out, stderr=err)  # forked: tests/fork_support.py
        try:
            _wait_up(f"http://127.0.0.1:{port}", proc, err)
            yield Served(f"http://127.0.0.1:{port}", token, proc, (out, err))
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _serve(backend: Any, namespace: str, token: str | None, cors: tuple[str, ...] = ()) -> Any:
    extra = [arg for origin in cors for arg in ("--cors-origin", origin)]
    if backend.kind == "fake":
        return _in_thread(backend.server, namespace, token, **({"cors_origins": cors} if cors else {}))
    if backend.kind == "cluster":
        host, port = backend.cluster.startup
        return _cli(f"redis://{host}:{port}", namespace, token, "--cluster", *extra)
    return _cli(backend.url, namespace, token, *extra)


#: fakeredis (the app in this process), a real server and the local Cluster (the CLI, ``--cluster``).
on_every_backend = pytest.mark.parametrize(
    "backend",
    [pytest.param("fake", marks=pytest.mark.fakeredis), "real", pytest.param("cluster", marks=pytest.mark.cluster)],
    indirect=True,
)
#: Where the store suites already cover the Cluster: fakeredis and a real server.
on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip


@pytest.fixture
def served(backend: Any, namespace: str) -> Iterator[Served]:
    with _serve(backend, namespace, TOKEN) as s:
        yield s


def _values(client: Any, tid: str) -> Any:
    return client.threads.get_state(tid)["values"]


@on_every_backend
class TestSdkClient:
    """The real ``langgraph_sdk`` clients, sync and async, against the server."""

    def test_assistants_are_the_served_graphs(self, served: Served) -> None:
        c = served.sync()
        found = c.assistants.search()
        assert sorted(a["graph_id"] for a in found) == sorted(GRAPHS)
        steps = c.assistants.get("steps")
        assert steps["graph_id"] == "steps" and c.assistants.get(steps["assistant_id"]) == steps
        graph = c.assistants.get_graph("steps")
        assert {n["id"] for n in graph["nodes"]} >= {"a", "b", "c"}
        assert c.assistants.get_schemas("steps")["graph_id"] == "steps"
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.assistants.get("nope")
        assert err.value.response.status_code == 404

    def test_a_thread_is_created_found_updated_and_deleted(self, served: Served) -> None:
        c = served.sync()
        t = c.threads.create(metadata={"team": "a"})
        tid = t["thread_id"]
        assert t["status"] == "idle" and t["metadata"] == {"team": "a"}
        assert c.threads.get(tid)["thread_id"] == tid
        assert c.threads.create(thread_id=tid, if_exists="do_nothing")["thread_id"] == tid
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.threads.create(thread_id=tid)
        assert err.value.response.status_code == 409
        c.threads.update(tid, metadata={"stage": "two"})
        assert c.threads.get(tid)["metadata"] == {"team": "a", "stage": "two"}
        assert [x["thread_id"] for x in c.threads.search(metadata={"team": "a"})] == [tid]
        c.threads.delete(tid)
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.threads.get(tid)
        assert err.value.response.status_code == 404

    def test_search_pages_through_every_thread_in_bounded_reads(self, served: Served) -> None:
        c = served.sync()
        made = {c.threads.create(metadata={"team": "ab"[i % 2], "i": i})["thread_id"] for i in range(130)}
        walked: list[str] = []
        for offset in range(0, 140, 40):
            walked += [t["thread_id"] for t in c.threads.search(limit=40, offset=offset)]
        assert len(walked) == 130 and set(walked) == made  # every thread once, across pages of 100 keys
        team_b = c.threads.search(metadata={"team": "b"}, limit=1000)
        assert len(team_b) == 65 and all(t["metadata"]["team"] == "b" for t in team_b)
        some = sorted(made)[:3]
        assert sorted(t["thread_id"] for t in c.threads.search(ids=[*some, "no-such-thread"])) == some
        assert c.threads.count() >= 130
        with served.http() as h:
            assert h.post("/threads/search", json={"ids": "not-a-list"}).status_code == 422
            assert h.post("/threads/search", json={"metadata": ["x"]}).status_code == 422

    def test_wait_returns_the_final_values_and_the_run_is_listed(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        out = c.runs.wait(tid, "steps", input={"log": ["hi"]})
        assert out == {"log": ["hi", "a", "b", "c"]}
        runs = c.runs.list(tid)
        assert [r["status"] for r in runs] == ["success"]
        assert c.runs.get(tid, runs[0]["run_id"])["status"] == "success"
        assert c.threads.get(tid)["status"] == "idle"
        assert _values(c, tid) == out
        c.runs.delete(tid, runs[0]["run_id"])
        assert c.runs.list(tid) == [] and _values(c, tid) == out  # the run goes, its checkpoints stay
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.runs.get(tid, runs[0]["run_id"])
        assert err.value.response.status_code == 404

    # LangGraph on Python 3.10 cannot hand an async node its config or stream writer from context
    # (docs/langgraph-runs.md, "Asyncio"), and the server's workers run graphs on asyncio.
    @pytest.mark.xfail(sys.version_info < (3, 11), reason="LangGraph's async context needs Python 3.11", strict=True)
    def test_stream_sends_every_mode_asked_in_order(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        parts = list(c.runs.stream(tid, "steps", input={"log": []}, stream_mode=["values", "updates", "custom"]))
        events = [p.event for p in parts]
        assert events[0] == "metadata" and parts[0].data["run_id"]
        assert [p.data for p in parts if p.event == "updates"] == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}},
                                                                  {"c": {"log": ["c"]}}]  # fmt: skip
        assert [p.data for p in parts if p.event == "custom"] == [{"node": n} for n in "abc"]
        assert [p.data for p in parts if p.event == "values"][-1] == {"log": ["a", "b", "c"]}

    def test_join_stream_after_a_disconnect_resumes_after_the_last_event_seen(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        run = c.runs.create(tid, "slow", input={"log": []}, stream_mode=["values", "updates"])
        # A reader that saw two events, then lost its connection: the raw SSE ids are what a browser
        # (or langgraph-sdk's reconnect) sends back as Last-Event-ID.
        seen: list[tuple[str, str]] = []
        with served.http() as h, h.stream("GET", f"/threads/{tid}/runs/{run['run_id']}/stream") as r:
            event_id = None
            for line in r.iter_lines():
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("event: "):
                    seen.append((event_id or "", line[7:]))
                    if len(seen) == 3:
                        break
        rest = list(c.runs.join_stream(tid, run["run_id"], last_event_id=seen[-1][0]))
        assert rest and rest[0].event != "metadata"  # it resumed: nothing before the cut again
        full = c.runs.join_stream(tid, run["run_id"])
        everything = [p.event for p in full]
        assert everything[: len(seen)] == [e for _, e in seen]
        assert everything[len(seen) :] == [p.event for p in rest]
        assert c.runs.join(tid, run["run_id"]) == {"log": list("abcde")}

    def test_more_followers_of_one_run_than_the_pool_has_connections_all_get_every_event(self, served: Served) -> None:
        # 120 SSE clients on one run: more than redis-py's default pool of 100 connections. The server
        # reads the run once for all of them (server/_feeds.py), so none is refused, none breaks off,
        # and its workers keep their connections.
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        # Before Python 3.11 LangGraph's astream cannot stream "custom" events at all (its writer
        # calls get_config(), which finds nothing there: docs/langgraph-runs.md, "Asyncio"): values
        # stand in for them, so the fan-out is checked on every version.
        second = "custom" if sys.version_info >= (3, 11) else "values"
        run = c.runs.create(tid, "slow", input={"log": []}, stream_mode=["updates", second])
        path = f"/threads/{tid}/runs/{run['run_id']}/stream"

        async def follow(http: httpx.AsyncClient) -> list[tuple[str, str]]:
            seen: list[tuple[str, str]] = []
            event_id = ""
            async with http.stream("GET", path) as r:
                assert r.status_code == 200, await r.aread()
                async for line in r.aiter_lines():
                    if line.startswith("id: "):
                        event_id = line[4:]
                    elif line.startswith("event: "):
                        seen.append((event_id, line[7:]))
            return seen

        async def everyone() -> list[list[tuple[str, str]]]:
            limits = httpx.Limits(max_connections=130, max_keepalive_connections=130)
            async with httpx.AsyncClient(
                base_url=served.url, timeout=60, limits=limits, headers={"x-api-key": TOKEN}
            ) as http:
                return await asyncio.gather(*(follow(http) for _ in range(120)))

        got = asyncio.run(everyone())
        assert c.runs.join(tid, run["run_id"]) == {"log": list("abcde")}
        full = [p.event for p in c.runs.join_stream(tid, run["run_id"])]
        assert full.count("updates") == 5 and full.count(second) >= 5
        assert all([e for _, e in seen] == full for seen in got), [len(s) for s in got]
        if served.files is not None:
            assert "Too many connections" not in served.output()[1]
        with served.http() as h:
            bad = h.get(path, headers={"Last-Event-ID": "not-an-id"})
        assert bad.status_code == 422 and "event id" in bad.json()["detail"]

    def test_double_texting_reject_enqueue_and_interrupt(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        first = c.runs.create(tid, "slow", input={"log": ["first"]})
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.runs.create(tid, "slow", input={"log": ["second"]}, multitask_strategy="reject")
        assert err.value.response.status_code == 409
        queued = c.runs.create(tid, "slow", input={"log": ["queued"]}, multitask_strategy="enqueue")
        c.runs.join(tid, queued["run_id"])
        assert [c.runs.get(tid, r["run_id"])["status"] for r in (first, queued)] == ["success", "success"]
        log = _values(c, tid)["log"]
        assert log.index("first") < log.index("queued")
        going = c.runs.create(tid, "slow", input={"log": ["going"]})
        _until(lambda: c.runs.get(tid, going["run_id"])["status"] == "running")
        newer = c.runs.create(tid, "slow", input={"log": ["newer"]}, multitask_strategy="interrupt")
        c.runs.join(tid, newer["run_id"])
        assert c.runs.get(tid, going["run_id"])["status"] == "interrupted"
        assert c.runs.get(tid, newer["run_id"])["status"] == "success"

    def test_cancel_stops_a_running_run(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        run = c.runs.create(tid, "slow", input={"log": []})
        _until(lambda: c.runs.get(tid, run["run_id"])["status"] == "running")
        c.runs.cancel(tid, run["run_id"], wait=True)
        assert c.runs.get(tid, run["run_id"])["status"] == "interrupted"
        # Stopped at once (before its first checkpoint, or inside a node), what it finished kept.
        assert len(_values(c, tid).get("log", [])) < 5

    def test_a_run_of_a_thread_whose_task_was_cancelled_is_refused_with_409(
        self, served: Served, backend: Any, namespace: str
    ) -> None:
        # Issue 38 item 6 through the server: join of a run accepted before the thread's task was
        # cancelled answers 409 (it can never run), as does a new run; never a hang or a 500.
        from redis_agentstate import CheckpointStore
        from redis_agentstate.langgraph.runs import queue_namespace

        c = served.sync()
        tid = c.threads.create()["thread_id"]
        tasks = CheckpointStore(backend.sync_client(), namespace=queue_namespace(f"{namespace}.slow"))
        c.runs.wait(tid, "slow", input={"log": ["a"]})
        going = c.runs.create(tid, "slow", input={"log": ["b"]})
        queued = c.runs.create(tid, "slow", input={"log": ["c"]}, multitask_strategy="enqueue")
        assert tasks.cancel(tid, reason="operator")
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.runs.join(tid, queued["run_id"])
        assert err.value.response.status_code == 409 and "can never run" in err.value.response.text
        assert going["run_id"] != queued["run_id"]
        with pytest.raises(httpx.HTTPStatusError) as err:
            c.runs.wait(tid, "slow", input={"log": ["b"]}, multitask_strategy="enqueue")
        assert err.value.response.status_code == 409 and "cancelled" in err.value.response.text

    def test_a_run_starts_from_the_head_or_forks_from_an_earlier_checkpoint_as_langgraph_does(
        self, served: Served
    ) -> None:
        # Issue 41 item 0: Agent Chat UI's useStream sends the thread head as `checkpoint` on every
        # follow-up, and an earlier one to regenerate (a fork). The reference is LangGraph itself: the
        # same graph, the same calls, with that config, on an in-memory saver.
        from langgraph.checkpoint.memory import InMemorySaver

        c = served.sync()
        ref = graphs.steps.copy(update={"checkpointer": InMemorySaver()})
        cfg: Any = {"configurable": {"thread_id": "reference"}}
        tid = c.threads.create()["thread_id"]
        assert c.runs.wait(tid, "steps", input={"log": ["x"]}) == ref.invoke({"log": ["x"]}, cfg)
        head = c.threads.get_state(tid)["checkpoint"]
        assert head["thread_id"] == tid and head["checkpoint_id"]
        follow_up = c.runs.wait(tid, "steps", input={"log": ["y"]}, checkpoint=head)
        assert follow_up == ref.invoke({"log": ["y"]}, {"configurable": {**cfg["configurable"],
                                       **ref.get_state(cfg).config["configurable"]}}) == {
            "log": ["x", "a", "b", "c", "y", "a", "b", "c"]}  # fmt: skip
        # A fork from the first run's checkpoint after node a (next: b), as the whole checkpoint
        # object the client holds, and one given by checkpoint_id with an input.
        after_a = next(h for h in c.threads.get_history(tid, limit=100) if h["values"].get("log") == ["x", "a"])
        ref_after_a = next(s for s in ref.get_state_history(cfg) if s.values.get("log") == ["x", "a"])
        assert after_a["next"] == list(ref_after_a.next) == ["b"]
        forked = c.runs.wait(tid, "steps", input=None, checkpoint=after_a["checkpoint"])
        assert forked == ref.invoke(None, ref_after_a.config) == {"log": ["x", "a", "b", "c"]}
        first = next(h for h in c.threads.get_history(tid, limit=100) if h["values"].get("log") == ["x"])
        ref_first = next(s for s in ref.get_state_history(cfg) if s.values.get("log") == ["x"])
        again = c.runs.wait(tid, "steps", input={"log": ["z"]}, checkpoint_id=first["checkpoint"]["checkpoint_id"])
        assert again == ref.invoke({"log": ["z"]}, ref_first.config)
        # The thread as LangGraph leaves it: the head, and every checkpoint of its history in order
        # (the abandoned branches stay in the history, as LangGraph keeps them).
        state, ref_state = c.threads.get_state(tid), ref.get_state(cfg)
        assert (state["values"], state["next"]) == (ref_state.values, list(ref_state.next))
        history = c.threads.get_history(tid, limit=100)
        ref_history = list(ref.get_state_history(cfg))
        assert [(h["values"], h["next"], h["metadata"]["step"]) for h in history] == [
            (s.values, list(s.next), s.metadata["step"]) for s in ref_history]  # fmt: skip
        parents = {h["checkpoint"]["checkpoint_id"]: (h["parent_checkpoint"] or {}).get("checkpoint_id")
                   for h in history}  # fmt: skip
        walk, cid = [], state["checkpoint"]["checkpoint_id"]
        while cid is not None:
            walk.append(cid)
            cid = parents.get(cid)
        assert first["checkpoint"]["checkpoint_id"] in walk and after_a["checkpoint"]["checkpoint_id"] not in walk
        # A checkpoint the thread does not have: a clear 404, not a run from somewhere else.
        for bad in ({"checkpoint_id": "1f0-no-such-checkpoint"}, {"checkpoint": {"checkpoint_id": "nope"}}):
            with pytest.raises(httpx.HTTPStatusError) as err:
                c.runs.wait(tid, "steps", input={"log": []}, **bad)
            assert err.value.response.status_code == 404 and "no checkpoint" in err.value.response.text
        with served.http() as h:
            r = h.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "steps", "checkpoint": "head"})
            assert r.status_code == 422
            r = h.post(
                f"/threads/{tid}/runs/wait",
                json={"assistant_id": "steps", "checkpoint": {"thread_id": "other", "checkpoint_id": "x"}},
            )
            assert r.status_code == 422  # fmt: skip
        assert len(c.runs.list(tid, limit=100)) == 4  # the refused ones made no run

    def test_the_run_headers_the_clients_read(self, served: Served) -> None:
        # Issue 41 item 8: Content-Location names the run (/threads/T/runs/R), never its /join or
        # /stream (clients take everything after /runs/ as the run id); a join says which run it
        # answers; a cancel that waited answers 200 {} as LangGraph's server does.
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        created: list[Any] = []
        c.runs.wait(tid, "steps", input={"log": []}, on_run_created=created.append)
        list(c.runs.stream(tid, "steps", input={"log": []}, on_run_created=created.append))
        list(c.runs.stream(None, "steps", input={"log": []}, on_run_created=created.append))
        ids = [r["run_id"] for r in c.runs.list(tid)]
        assert [m["run_id"] for m in created[:2]] == ids[::-1] and [m["thread_id"] for m in created[:2]] == [tid] * 2
        # A stateless run's thread is temporary: LangGraph's server names the run alone (/runs/R).
        assert "/" not in created[2]["run_id"] and created[2]["thread_id"] is None
        with served.http() as h:
            r = h.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "steps", "input": {"log": []}})
            rid = c.runs.list(tid)[0]["run_id"]
            assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}"
            with h.stream("POST", "/runs/stream", json={"assistant_id": "steps", "input": {"log": []}}) as r:
                where = r.headers["content-location"]
                r.read()
            assert where.startswith("/runs/") and where.split("/runs/")[1].count("/") == 0
            joined = h.get(f"/threads/{tid}/runs/{rid}/join")
            assert joined.status_code == 200 and joined.headers["content-location"] == f"/threads/{tid}/runs/{rid}"
            slow = c.threads.create()["thread_id"]
            going = c.runs.create(slow, "slow", input={"log": []})
            r = h.post(f"/threads/{slow}/runs/{going['run_id']}/cancel", params={"wait": 1})
            assert (r.status_code, r.json()) == (200, {})
            assert c.runs.get(slow, going["run_id"])["status"] in ("interrupted", "success")

    def test_state_update_and_history(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        c.runs.wait(tid, "steps", input={"log": ["x"]})
        state = c.threads.get_state(tid)
        assert state["next"] == [] and state["checkpoint"]["checkpoint_id"]
        c.threads.update_state(tid, {"log": ["edited"]}, as_node="c")
        assert _values(c, tid)["log"][-1] == "edited"
        history = c.threads.get_history(tid, limit=3)
        assert len(history) == 3 and history[0]["values"]["log"][-1] == "edited"
        old = history[-1]["checkpoint"]["checkpoint_id"]
        assert c.threads.get_state(tid, checkpoint_id=old)["checkpoint"]["checkpoint_id"] == old

    # LangGraph on Python 3.10 cannot hand an async node its config or stream writer from context
    # (docs/langgraph-runs.md, "Asyncio"), and the server's workers run graphs on asyncio.
    @pytest.mark.xfail(sys.version_info < (3, 11), reason="LangGraph's async context needs Python 3.11", strict=True)
    def test_a_graph_interrupt_waits_and_a_command_resumes_it(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        paused = c.runs.wait(tid, "ask", input={"log": ["q"]})
        assert paused["__interrupt__"][0]["value"] == "approve?"
        assert c.threads.get(tid)["status"] == "interrupted"
        done = c.runs.wait(tid, "ask", command={"resume": "yes"})
        assert done["log"][-1] == "answer:yes" and c.threads.get(tid)["status"] == "idle"

    # LangGraph on Python 3.10 cannot hand an async node its config or stream writer from context
    # (docs/langgraph-runs.md, "Asyncio"), and the server's workers run graphs on asyncio.
    @pytest.mark.xfail(sys.version_info < (3, 11), reason="LangGraph's async context needs Python 3.11", strict=True)
    def test_an_interrupted_thread_lists_its_interrupts_by_task_and_subgraphs_are_listed(self, served: Served) -> None:
        # Issue 41 item 4: Thread.interrupts was always {} and get_subgraphs always {}.
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        c.runs.wait(tid, "ask", input={"log": []})
        t = c.threads.get(tid)
        assert t["status"] == "interrupted"
        [(task_id, interrupts)] = t["interrupts"].items()
        assert [i["value"] for i in interrupts] == ["approve?"] and interrupts[0]["id"]
        assert task_id == c.threads.get_state(tid)["tasks"][0]["id"]
        assert c.threads.search(ids=[tid])[0]["interrupts"] == t["interrupts"]
        c.runs.wait(tid, "ask", command={"resume": "yes"})
        assert c.threads.get(tid)["interrupts"] == {}
        inner = c.threads.create()["thread_id"]
        c.runs.wait(inner, "nested", input={"log": []})  # interrupted inside its subgraph
        [shown] = c.threads.get(inner)["interrupts"].values()
        assert [i["value"] for i in shown] == ["approve?"]
        subs = c.assistants.get_subgraphs(c.assistants.get("nested")["assistant_id"])
        assert list(subs) == ["inner"]
        assert subs["inner"].keys() == {"input_schema", "output_schema", "state_schema", "config_schema",
                                        "context_schema"}  # fmt: skip
        assert list(c.assistants.get_subgraphs("nested", namespace="inner", recurse=True)) == ["inner"]
        assert c.assistants.get_subgraphs("steps") == {}

    def test_count_honours_the_filters_search_does(self, served: Served) -> None:
        # Issue 41 item 5: threads.count(metadata=...) counted every thread.
        c = served.sync()
        made = [c.threads.create(metadata={"tag": "counted", "i": i})["thread_id"] for i in range(3)]
        c.threads.create(metadata={"tag": "other"})
        assert c.threads.count(metadata={"tag": "counted"}) == 3 == len(c.threads.search(metadata={"tag": "counted"}))
        assert c.threads.count(metadata={"tag": "none-has-it"}) == 0
        c.runs.wait(made[0], "steps", input={"log": []})
        done = {"log": ["a", "b", "c"]}
        assert c.threads.count(values=done) == 1 == len(c.threads.search(values=done))
        assert [t["thread_id"] for t in c.threads.search(values=done)] == [made[0]]
        assert c.threads.count(metadata={"tag": "counted"}, status="idle") == 3
        assert c.threads.count(status="busy") == 0 and c.threads.count() == 4
        with served.http() as h:
            assert h.post("/threads/count", json={"metadata": ["x"]}).status_code == 422
            assert h.post("/threads/count", json={"status": "sleeping"}).status_code == 422

    # LangGraph on Python 3.10 cannot hand an async node its config or stream writer from context
    # (docs/langgraph-runs.md, "Asyncio"), and the server's workers run graphs on asyncio.
    @pytest.mark.xfail(sys.version_info < (3, 11), reason="LangGraph's async context needs Python 3.11", strict=True)
    def test_messages_tuple_streams_the_models_tokens(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        parts = list(c.runs.stream(tid, "chat", input={"log": []}, stream_mode=["messages-tuple", "values"]))
        tokens = [p.data for p in parts if p.event == "messages"]
        assert tokens and all(isinstance(t, list) and len(t) == 2 for t in tokens)
        text = "".join(chunk["content"] for chunk, _meta in tokens)
        assert text == "hello there friend" and tokens[0][1]["langgraph_node"] == "talk"
        assert [p.data for p in parts if p.event == "values"][-1] == {"log": ["hello there friend"]}

    def test_the_async_client_does_the_same(self, served: Served) -> None:
        async def go() -> None:
            c = served.aio()
            tid = (await c.threads.create())["thread_id"]
            assert await c.runs.wait(tid, "steps", input={"log": []}) == {"log": ["a", "b", "c"]}
            parts = [p async for p in c.runs.stream(tid, "steps", input={"log": []}, stream_mode="updates")]
            assert [p.event for p in parts] == ["metadata", "updates", "updates", "updates"]
            assert (await c.threads.get_state(tid))["values"]["log"] == ["a", "b", "c", "a", "b", "c"]
            stateless = await c.runs.wait(None, "steps", input={"log": ["tmp"]})
            assert stateless == {"log": ["tmp", "a", "b", "c"]}

        asyncio.run(go())

    def test_remote_graph_invokes_and_streams(self, served: Served) -> None:
        from langgraph.pregel.remote import RemoteGraph

        remote = RemoteGraph("steps", url=served.url, api_key=served.token)
        tid = served.sync().threads.create()["thread_id"]
        config = {"configurable": {"thread_id": tid}}
        assert remote.invoke({"log": ["r"]}, config) == {"log": ["r", "a", "b", "c"]}
        chunks = list(remote.stream({"log": []}, config, stream_mode="updates"))
        assert chunks == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}}, {"c": {"log": ["c"]}}]
        assert remote.get_state(config).values["log"] == ["r", "a", "b", "c", "a", "b", "c"]
        assert {n.id for n in remote.get_graph().nodes.values()} >= {"a", "b", "c"}
        fresh = {"configurable": {"thread_id": "made-by-remote-graph"}}  # if_not_exists="create"
        assert remote.invoke({"log": []}, fresh) == {"log": ["a", "b", "c"]}
        history = list(remote.get_state_history(fresh, limit=2))
        assert len(history) == 2 and history[0].values == {"log": ["a", "b", "c"]}
        remote.update_state(fresh, {"log": ["edited"]}, as_node="c")
        assert remote.get_state(fresh).values["log"][-1] == "edited"


@on_every_backend
class TestStoreRoutes:
    """Issue 41: the store routes (501 before), on an ``AsyncAgentStateStore`` the served graphs share."""

    def test_items_are_put_got_searched_listed_and_deleted_as_langgraph_serves_them(self, served: Served) -> None:
        c = served.sync()
        assert c.store.put_item(["users", "u1"], "prefs", {"lang": "pt", "team": "a"}) is None
        c.store.put_item(["users", "u2"], "prefs", {"lang": "en", "team": "b"})
        c.store.put_item(["users", "u2"], "notes", {"text": "hi", "team": "b"}, ttl=60)
        c.store.put_item(["docs"], "d1", {"title": "x"})
        item = c.store.get_item(["users", "u1"], "prefs")
        assert set(item) == {"namespace", "key", "value", "created_at", "updated_at"}
        assert item["namespace"] == ["users", "u1"] and item["key"] == "prefs"
        assert item["value"] == {"lang": "pt", "team": "a"} and item["created_at"].endswith("+00:00")
        assert c.store.get_item(["users", "u1"], "nope") is None
        found = c.store.search_items(["users"], filter={"team": "b"}, limit=10)
        assert sorted(i["key"] for i in found["items"]) == ["notes", "prefs"]
        assert all(i["namespace"] == ["users", "u2"] for i in found["items"])
        page = c.store.search_items(["users"], limit=2, offset=1)
        assert len(page["items"]) == 2
        assert c.store.list_namespaces(prefix=["users"]) == {"namespaces": [["users", "u1"], ["users", "u2"]]}
        assert c.store.list_namespaces(max_depth=1)["namespaces"] == [["docs"], ["users"]]
        assert c.store.delete_item(["users", "u1"], "prefs") is None
        assert c.store.get_item(["users", "u1"], "prefs") is None

        async def aio() -> None:
            a = served.aio()
            await a.store.put_item(["users", "u3"], "prefs", {"lang": "fr"})
            assert (await a.store.get_item(["users", "u3"], "prefs"))["value"] == {"lang": "fr"}
            assert [i["key"] for i in (await a.store.search_items(["users", "u3"]))["items"]] == ["prefs"]

        asyncio.run(aio())

    def test_bad_input_is_refused_with_422_saying_what_is_wrong(self, served: Served) -> None:
        with served.http() as h:
            bad_puts = [({"namespace": ["a.b"], "key": "k", "value": {}}, "period"),
                        ({"namespace": [""], "key": "k", "value": {}}, "non-empty"),
                        ({"namespace": "users", "key": "k", "value": {}}, "list of labels"),
                        ({"namespace": [], "key": "k", "value": {}}, "at least one"),
                        ({"namespace": ["u"], "key": "", "value": {}}, "key"),
                        ({"namespace": ["u"], "key": "k", "value": [1]}, "value must be an object"),
                        ({"namespace": ["u"], "key": "k", "value": {}, "ttl": -1}, "ttl"),
                        ({"namespace": ["u"], "key": "k", "value": {}, "index": "x"}, "index")]  # fmt: skip
            for body, says in bad_puts:
                r = h.put("/store/items", json=body)
                assert r.status_code == 422 and says in r.json()["detail"], (body, r.text)
            r = h.get("/store/items", params={"namespace": "users"})
            assert r.status_code == 422 and "key" in r.json()["detail"]
            r = h.request("DELETE", "/store/items", json={"namespace": ["u"]})
            assert r.status_code == 422 and "key" in r.json()["detail"]
            r = h.post("/store/items/search", json={"namespace_prefix": ["u"], "limit": -1})
            assert r.status_code == 422 and "limit" in r.json()["detail"]
            r = h.post("/store/items/search", json={"namespace_prefix": ["u"], "filter": [1]})
            assert r.status_code == 422 and "filter" in r.json()["detail"]
            r = h.post("/store/namespaces", json={"max_depth": 0})
            assert r.status_code == 422 and "max_depth" in r.json()["detail"]
            assert h.put("/store/items", json={"namespace": ["u"], "key": "k", "value": {}}).status_code == 204
        with served.anonymous() as h:  # the token guards the store as every route
            calls = (("PUT", "/store/items", {"namespace": ["u"], "key": "k", "value": {}}),
                     ("GET", "/store/items?namespace=u&key=k", None),
                     ("DELETE", "/store/items", {"namespace": ["u"], "key": "k"}),
                     ("POST", "/store/items/search", {}), ("POST", "/store/namespaces", {}))  # fmt: skip
            for method, path, body in calls:
                assert h.request(method, path, json=body).status_code == 401, (method, path)
                wrong = h.request(method, path, json=body, headers={"x-api-key": "wrong"})
                assert wrong.status_code == 403, (method, path)
        assert served.sync().store.get_item(["u"], "k")["value"] == {}

    @pytest.mark.xfail(sys.version_info < (3, 11), reason="LangGraph's async context needs Python 3.11", strict=True)
    def test_a_graph_node_reads_and_writes_the_store_the_api_serves(self, served: Served) -> None:
        c = served.sync()
        c.store.put_item(["prefs"], "lang", {"lang": "pt"})
        tid = c.threads.create()["thread_id"]
        assert c.runs.wait(tid, "memory", input={"log": []}) == {"log": ["lang:pt"]}
        assert c.store.get_item(["seen", tid], "last")["value"] == {"lang": "pt"}


def _until(cond: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


@on_every_backend
class TestDashboardApi:
    """The dashboard's reads and actions over HTTP, on every backend (the browser: test_dashboard.py)."""

    def test_a_frame_shows_the_namespace_and_an_action_applies(self, backend: Any, served: Served,
                                                               namespace: str) -> None:  # fmt: skip
        from redis_agentstate import Checkpoint, CheckpointStore

        store = CheckpointStore(backend.sync_client(), namespace=namespace, max_attempts=1)
        for i in range(5):
            store.create(Checkpoint(f"t{i}"))
        held = store.claim("t0", 1, token="w", lease_ms=60_000)
        lapsed = store.claim("t1", 1, token="w", lease_ms=60_000)
        store.release("t1", token="w", expected_revision=lapsed.revision, reason="ValueError: no")
        auth = {"x-api-key": TOKEN}
        with served.http() as h:
            info = h.get("/dashboard/api/info").json()
            assert info["namespaces"][0] == namespace and info["read_only"] is False
            frame = h.get(f"/dashboard/api/frame?ns={namespace}").json()
            assert frame["tasks"] == 5 and frame["parked"] == 1 and frame["live_leases"] == 1, frame
            assert [r["task_id"] for r in frame["leased"]] == ["t0"] and frame["leased"][0]["claim_token"] == "w"
            assert frame["parked_tasks"][0]["last_failure"] == "ValueError: no"
            assert h.post(f"/dashboard/api/tasks/t1/requeue?ns={namespace}", headers=auth).json()["ok"] is True
            r = h.post(f"/dashboard/api/tasks/t1/requeue?ns={namespace}", headers=auth)
            assert r.status_code == 409  # not parked any more
            assert h.post(f"/dashboard/api/tasks/nope/cancel?ns={namespace}", headers=auth).status_code == 404
            assert h.post(f"/dashboard/api/tasks/t0/cancel?ns={namespace}", json={"reason": "ops"},
                          headers=auth).status_code == 200  # fmt: skip
            assert h.get("/dashboard/api/frame?ns=elsewhere").status_code == 404
        assert store.load("t1").status == "running" and store.load("t0").status == "cancelled"
        assert held.revision < store.load("t0").revision


@pytest.mark.parametrize("backend", ["real"], indirect=True)
class TestLeaseFlag:
    def test_lease_ms_sets_the_runs_lease(self, backend: Any, namespace: str) -> None:
        # Issue 41 item 7: the runs' lease had no flag (30 s: how long a crashed server's runs wait).
        from redis_agentstate import CheckpointStore
        from redis_agentstate.langgraph.runs import queue_namespace

        client = backend.sync_client()
        tasks = CheckpointStore(client, namespace=queue_namespace(f"{namespace}.slow"))
        with _cli(backend.url, namespace, TOKEN, "--lease-ms", "1500") as s:
            c = s.sync()
            tid = c.threads.create()["thread_id"]
            run = c.runs.create(tid, "slow", input={"log": []})
            _until(lambda: c.runs.get(tid, run["run_id"])["status"] == "running")
            held = tasks.load(tid)
            secs, micros = client.time()
            now_ms = secs * 1000 + micros // 1000
            assert held.lease_expires_at_ms is not None and 0 < held.lease_expires_at_ms - now_ms <= 1500
            assert c.runs.join(tid, run["run_id"]) == {"log": list("abcde")}


@on_fake_and_real
class TestSecurity:
    def test_without_a_token_it_is_read_only(self, backend: Any, namespace: str) -> None:
        with _serve(backend, namespace, None) as s, s.http() as h:
            assert h.post("/assistants/search", json={}).status_code == 200
            assert h.post("/store/items/search", json={}).json() == {"items": []}  # a read
            assert h.post("/store/namespaces", json={}).json() == {"namespaces": []}
            for method, path in (("POST", "/threads"), ("POST", "/threads/x/runs"), ("DELETE", "/threads/x"),
                                 ("POST", "/threads/x/runs/y/cancel"), ("PATCH", "/threads/x"),
                                 ("PUT", "/store/items"), ("DELETE", "/store/items")):  # fmt: skip
                r = h.request(method, path, json={})
                assert r.status_code == 403 and "read-only" in r.json()["detail"], (method, path)

    def test_with_a_token_every_route_but_ok_needs_it_reads_included(self, served: Served) -> None:
        # Issue 41 item 0b: with a token, a read without it (a search listing every thread, a thread's
        # conversation) answered 200.
        c = served.sync()
        tid = c.threads.create(metadata={"secret": "yes"})["thread_id"]
        c.runs.wait(tid, "steps", input={"log": ["private"]})
        run_id = c.runs.list(tid)[0]["run_id"]
        reads = [("POST", "/threads/search"), ("POST", "/threads/count"), ("GET", f"/threads/{tid}"),
                 ("GET", f"/threads/{tid}/state"), ("POST", f"/threads/{tid}/history"), ("GET", f"/threads/{tid}/runs"),
                 ("GET", f"/threads/{tid}/runs/{run_id}/stream"), ("GET", f"/threads/{tid}/runs/{run_id}/join"),
                 ("POST", "/assistants/search"), ("GET", "/assistants/steps"), ("GET", "/info"),
                 ("GET", "/dashboard/api/info"), ("GET", "/dashboard/api/frame"), ("GET", "/dashboard/api/threads"),
                 ("GET", "/dashboard/static/dashboard.js"), ("POST", "/threads")]  # fmt: skip
        with served.anonymous() as h:
            assert h.get("/ok").json() == {"ok": True}
            for method, path in reads:
                r = h.request(method, path, json={} if method == "POST" else None)
                assert r.status_code == 401 and "private" not in r.text and "secret" not in r.text, (method, path)
                wrong = h.request(method, path, headers={"x-api-key": "wrong"}, json={} if method == "POST" else None)
                assert wrong.status_code == 403, (method, path)
            bearer = h.post("/threads/search", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200 and tid in bearer.text and TOKEN not in bearer.text
            # The page without a session is the login form, and nothing of the dashboard.
            page = h.get("/")
            assert page.status_code == 200 and 'action="/dashboard/login"' in page.text
            assert "dashboard.js" not in page.text and "form-action 'self'" in page.headers["content-security-policy"]
        with pytest.raises(httpx.HTTPStatusError) as err:
            get_sync_client(url=served.url, api_key=None).threads.search()
        assert err.value.response.status_code == 401
        assert [t["thread_id"] for t in c.threads.search(metadata={"secret": "yes"})] == [tid]

    def test_the_dashboard_logs_in_once_and_its_buttons_need_the_csrf_token(
        self, served: Served, namespace: str
    ) -> None:
        from redis_agentstate.server._auth import COOKIE

        with served.anonymous() as h:
            bad = h.post("/dashboard/login", data={"token": "wrong"})
            assert bad.status_code == 401 and "wrong token" in bad.text and "set-cookie" not in bad.headers
            away = h.post("/dashboard/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"})
            assert away.status_code == 403 and "set-cookie" not in away.headers
            ok = h.post("/dashboard/login", data={"token": TOKEN}, headers={"Origin": served.url})
            assert ok.status_code == 303 and ok.headers["location"] == "/"
            set_cookie = ok.headers["set-cookie"]
            assert "httponly" in set_cookie.lower() and "samesite=strict" in set_cookie.lower()
            session = ok.cookies[COOKIE]
            assert TOKEN not in set_cookie and TOKEN not in session
        cookie = {"Cookie": f"{COOKIE}={session}"}
        action = f"/dashboard/api/tasks/no-such-task/requeue?ns={namespace}"
        with httpx.Client(base_url=served.url, timeout=30, headers=cookie) as h:
            assert "dashboard.js" in h.get("/").text  # the page itself now
            info = h.get("/dashboard/api/info").json()
            assert info["session"] is True and info["csrf"] and info["csrf"] not in (session, TOKEN)
            assert h.get("/info").status_code == 200 and h.get("/dashboard/api/frame").status_code == 200
            # A write the cookie alone would make: refused without the session's CSRF token, or with
            # another origin; with both it reaches the action (no such task: 404).
            assert h.post(action, json={}).status_code == 403
            assert h.post(action, json={}, headers={"x-csrf-token": "forged"}).status_code == 403
            csrf = {"x-csrf-token": info["csrf"]}
            assert h.post(action, json={}, headers={**csrf, "Origin": "http://evil.example"}).status_code == 403
            assert h.post(action, json={}, headers={**csrf, "Origin": served.url}).status_code == 404
            assert h.post("/threads", json={}, headers=csrf).status_code == 200
            out = h.post("/dashboard/logout", headers=csrf)
            assert out.status_code == 200 and COOKIE in out.headers["set-cookie"]
        for forged in ("1.abc.def", session.rsplit(".", 1)[0] + "." + "0" * 64, "0" + session):
            with httpx.Client(base_url=served.url, timeout=30, headers={"Cookie": f"{COOKIE}={forged}"}) as h:
                assert h.get("/dashboard/api/info").status_code == 401, forged

    def test_cors_preflights_are_answered_for_the_allowed_origins_before_the_token(
        self, backend: Any, namespace: str
    ) -> None:
        # Issue 41 item 0: a browser's client (Agent Chat UI) sends a preflight before every call; it
        # carries no token, so it is answered before the token is asked for.
        ui, other = "http://localhost:3000", "http://evil.example"
        sent = ("authorization", "content-type", "x-api-key", "last-event-id", "x-settings")  # x-settings: an app's own
        asked = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": ",".join(sent)}
        with _serve(backend, namespace, TOKEN, cors=(ui,)) as s, s.anonymous() as h:
            pre = h.options("/threads/search", headers={"Origin": ui, **asked})
            assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ui
            allowed = pre.headers["access-control-allow-headers"].lower()
            assert all(x in allowed for x in sent)
            assert "POST" in pre.headers["access-control-allow-methods"]
            refused = h.options("/threads/search", headers={"Origin": other, **asked})
            assert "access-control-allow-origin" not in refused.headers
            auth = {"Origin": ui, "x-api-key": TOKEN}
            r = h.post("/threads/search", json={}, headers=auth)
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ui
            tid = h.post("/threads", json={}, headers=auth).json()["thread_id"]
            r = h.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "steps", "input": {"log": []}}, headers=auth)
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ui
            exposed = r.headers["access-control-expose-headers"].lower()
            assert "content-location" in exposed and "x-pagination-next" in exposed
            assert "access-control-allow-credentials" not in r.headers  # auth is a header, not a cookie
            assert h.get("/threads/x", headers={"Origin": ui}).status_code == 401  # the token still guards
        with _serve(backend, namespace, TOKEN) as s, s.anonymous() as h:  # no --cors-origin: no CORS
            pre = h.options("/threads/search", headers={"Origin": ui, **asked})
            assert "access-control-allow-origin" not in pre.headers

    def test_bodies_are_bounded_and_bad_ones_refused_with_json(self, served: Served) -> None:
        auth = {"x-api-key": TOKEN}
        with served.http() as h:
            big = h.post("/threads", content=b'{"metadata": {"x": "' + b"a" * (2 << 20) + b'"}}', headers=auth)
            assert big.status_code == 413
            assert h.post("/threads", content=b"{nope", headers=auth).status_code == 422
            assert h.post("/threads", json=[1], headers=auth).status_code == 422
            for bad in ("a/b", "x" * 257, "t\n", 7):  # a "/" would put the thread's routes out of reach
                assert h.post("/threads", json={"thread_id": bad}, headers=auth).status_code == 422, bad
            assert h.post("/threads/x/runs", json={"assistant_id": "steps"}, headers=auth).status_code == 404
            r = h.post("/runs/crons", json={}, headers=auth)  # served (tests/test_serve_crons.py): no schedule
            assert r.status_code == 422 and "schedule" in r.json()["detail"]
            assert h.get("/no/such/route").status_code == 404
            assert h.get("/no/such/route").json()["detail"]


class TestCli:
    """What the command itself refuses and prints (no Redis needed)."""

    def test_a_taken_port_is_an_error_before_any_serving_line(self) -> None:
        # Issue 41 item 7: the start line was printed before the port was bound, then uvicorn failed.
        import socket

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_TOKEN"}
            out = run_python(["-m", "redis_agentstate", "serve", "--url", "redis://127.0.0.1:1/0",
                             "--graph", "steps=lg_run_graphs:steps", "--port", str(port)],
                             env=env, cwd=TESTS, timeout=60)  # fmt: skip
        assert out.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
        assert "agentstate serve: http://" not in out.stderr and "\\n" not in out.stderr

    def test_bad_cors_origins_and_leases_are_refused(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_TOKEN"}
        for extra, said in ((["--cors-origin", "localhost:3000"], "--cors-origin"),
                            (["--cors-origin", "http://x.example/"], "--cors-origin"),
                            (["--lease-ms", "999"], "--lease-ms")):  # fmt: skip
            out = run_python(["-m", "redis_agentstate", "serve", "--url", "redis://127.0.0.1:1/0",
                             "--graph", "steps=lg_run_graphs:steps", "--port", str(free_port()), *extra],
                             env=env, cwd=TESTS, timeout=60)  # fmt: skip
            assert out.returncode != 0 and said in out.stderr, (extra, out.stderr)

    def test_without_the_serve_extra_it_says_which_extra_to_install(self) -> None:
        # Issue 41 item 9: "unexpected error: ModuleNotFoundError: No module named 'starlette'".
        without = (
            "import sys, importlib.abc\n"
            "class NoServeExtra(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in ('starlette', 'uvicorn'):\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, NoServeExtra())\n"
            "from redis_agentstate.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_TOKEN"}
        out = subprocess.run([sys.executable, "-c", without, "serve", "--url", "redis://127.0.0.1:1/0",
                              "--graph", "steps=lg_run_graphs:steps", "--port", str(free_port())],
                             capture_output=True, text=True, env=env, cwd=TESTS, timeout=60)  # fmt: skip
        assert out.returncode == 1 and "pip install 'redis-agentstate[serve]'" in out.stderr, out.stderr
        assert "unexpected error" not in out.stderr and "Traceback" not in out.stderr

    def test_a_target_that_is_not_a_graph_is_a_clear_error(self) -> None:
        # Issue 41 item 9: a function needing arguments said "unexpected error: TypeError ...".
        env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_TOKEN"}
        for target, said in (("_node", "calling it as a factory failed (TypeError"), ("State", "the class State"),
                             ("SLOW_S", "not a graph (a float)")):  # fmt: skip
            out = run_python(["-m", "redis_agentstate", "serve", "--url", "redis://127.0.0.1:1/0",
                             "--graph", f"g=lg_run_graphs:{target}", "--port", str(free_port())],
                             env=env, cwd=TESTS, timeout=60)  # fmt: skip
            assert out.returncode == 1 and said in out.stderr and "must be a compiled LangGraph graph" in out.stderr, (
                target,
                out.stderr,
            )
            assert "unexpected error" not in out.stderr and "Traceback" not in out.stderr, out.stderr

    def test_the_cli_refuses_a_public_host_without_a_token(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_TOKEN"}
        out = run_python(["-m", "redis_agentstate", "serve", "--url", "redis://127.0.0.1:1/0",
                         "--graph", "steps=lg_run_graphs:steps", "--host", "0.0.0.0"],
                         env=env, cwd=TESTS, timeout=60)  # fmt: skip
        assert out.returncode != 0 and "needs --token" in out.stderr

    def test_the_token_and_the_redis_password_never_reach_a_reply_or_the_log(self, namespace: str) -> None:
        # A Redis that does not answer: every request fails in Redis, where the URL would show.
        url = f"redis://:hunter2pw@127.0.0.1:{free_port()}/0"
        with _cli(url, namespace, TOKEN) as s, s.http() as h:
            replies = [h.get("/threads/x"), h.post("/threads", json={}, headers={"x-api-key": TOKEN}),
                       h.post("/threads", json={}, headers={"x-api-key": "wrong-" + TOKEN})]  # fmt: skip
            health = h.get("/ok")
            s.log.terminate()
            s.log.wait(20)
            out, err = s.output()
        assert [r.status_code for r in replies] == [503, 503, 403]
        # Issue 41 item 7: healthy only when it can serve (a load balancer's check): not with Redis gone.
        assert health.status_code == 503 and health.json()["ok"] is False and "hunter2pw" not in health.text
        assert "Redis unavailable" in err  # the workers said so, once each, without the URL
        for text in [*(r.text for r in replies), out, err]:
            assert TOKEN not in text and "hunter2pw" not in text
