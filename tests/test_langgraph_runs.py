"""LangGraph runs on Redis: RunQueue / AsyncRunQueue and GraphWorker.

The queue tests run on fakeredis, a real redis-server and the local Cluster, sync and async
(``flavor``); the workers are real GraphWorkers on threads of this process (and, for a
SIGKILL, a worker process started with ``agentstate langgraph worker`` on a real server).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lg_run_graphs as graphs
import pytest
from conftest import require_real
from fork_support import run_python
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.types import Command

from redis_agentstate import InvalidArgument, LeaseLost
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import (
    AgentStateSaver,
    AsyncAgentStateSaver,
    AsyncRunQueue,
    GraphWorker,
    Run,
    RunEvent,
    RunNotFound,
    RunQueue,
    RunRejected,
    RunStopped,
)
from redis_agentstate.langgraph._runs_core import DEFAULT_RUN_TTL_MS, ID_ENTRY_GRACE_MS
from redis_agentstate.langgraph.runs import queue_namespace

TESTS = Path(__file__).parent


@pytest.fixture
def queue(make: Callable[..., Any]) -> Any:
    return make(RunQueue, AsyncRunQueue)


def events(queue: Any, run_id: str, **kw: Any) -> list[RunEvent]:
    """Every event ``stream`` yields, whichever twin ``queue`` is."""
    inner = getattr(queue, "wrapped", None)
    if inner is None:
        return list(queue.stream(run_id, **kw))

    async def collect() -> list[RunEvent]:
        return [e async for e in inner.stream(run_id, **kw)]

    return queue._loop.run_until_complete(collect())  # type: ignore[no-any-return]


@contextmanager
def worker(backend: Any, namespace: str, graph: Any, *, flavor: str = "sync", **kw: Any) -> Iterator[GraphWorker]:
    """A GraphWorker executing ``namespace``'s runs until the block ends: on threads (``sync``), or
    on an asyncio loop of its own thread, with asyncio clients (``async``)."""
    kw.setdefault("lease_ms", 3_000)
    kw.setdefault("block_ms", 200)
    if flavor == "sync":
        w = GraphWorker(graph, RunQueue(backend.sync_client(), namespace=namespace),
                        AgentStateSaver(backend.sync_client(), namespace=namespace), **kw)  # fmt: skip
        t = threading.Thread(target=w.run, daemon=True)
    else:
        built: list[GraphWorker] = []
        ready = threading.Event()

        async def main() -> None:
            clients = [backend.new_async_client(), backend.new_async_client()]
            w = GraphWorker(graph, AsyncRunQueue(clients[0], namespace=namespace),
                            AsyncAgentStateSaver(clients[1], namespace=namespace), **kw)  # fmt: skip
            built.append(w)
            ready.set()
            try:
                await w.arun()
            finally:
                for c in clients:
                    await c.aclose()

        t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    t.start()
    if flavor != "sync":
        assert ready.wait(10)
        w = built[0]
    try:
        yield w
    finally:
        w.stop()
        t.join(20)
        assert not t.is_alive(), "the worker did not stop"


@pytest.fixture
def run_worker(backend: Any, namespace: str, flavor: str) -> Callable[..., Any]:
    """``worker`` of this test's flavor: an async queue's test runs an asyncio worker."""
    return functools.partial(worker, backend, namespace, flavor=flavor)


def log_of(backend: Any, namespace: str, thread: str) -> list[str]:
    return thread_log(backend.sync_client(), namespace, thread)


def thread_log(client: Any, namespace: str, thread: str) -> list[str]:
    """The thread's ``log`` channel as its last checkpoint holds it."""
    saver = AgentStateSaver(client, namespace=namespace)
    tup = saver.get_tuple({"configurable": {"thread_id": thread}})
    return [] if tup is None else list(tup.checkpoint["channel_values"].get("log", []))


class TestQueue:
    def test_create_get_list_and_reject(self, queue: Any) -> None:
        run = queue.create("t1", {"log": ["in"]}, metadata={"who": "me"}, stream_mode=["values", "custom"])
        assert isinstance(run, Run) and run.status == "pending" and run.thread_id == "t1"
        got = queue.get(run.run_id)
        assert got.input == {"log": ["in"]} and got.metadata == {"who": "me"}
        assert got.stream_mode == ["values", "custom"] and got.multitask_strategy == "reject"
        with pytest.raises(RunRejected) as info:
            queue.create("t1", {"log": ["again"]})
        assert info.value.run_id == run.run_id and info.value.thread_id == "t1"
        second = queue.create("t1", {"log": ["queued"]}, multitask_strategy="enqueue")
        assert [r.run_id for r in queue.list("t1")] == [second.run_id, run.run_id]
        assert queue.get("no-such-run") is None
        assert queue.list("other") == []

    def test_list_keeps_creation_order_within_a_millisecond_and_a_clock_that_went_back(
        self, queue: Any, backend: Any
    ) -> None:
        """Runs created back to back share milliseconds; after a failover the server's clock may read
        earlier than the newest run's. Either way the list is newest first by creation, not by run id."""
        made = [queue.create("t", {"i": i}, multitask_strategy="enqueue").run_id for i in range(20)]
        raw, history = backend.sync_client(), queue._core.keys.runs("t").history
        newest = raw.zscore(history, made[-1])
        raw.zadd(history, {made[-1]: newest + 600_000})  # as if the clock then went 10 min back
        made += [queue.create("t", {"i": i}, multitask_strategy="enqueue").run_id for i in range(20, 23)]
        assert [r.run_id for r in queue.list("t")] == made[::-1]
        assert [r.run_id for r in queue.list("t", limit=5)] == made[:-6:-1]

    def test_cancel_a_pending_run_ends_it_and_rollback_deletes_it(self, queue: Any) -> None:
        first = queue.create("t", {"log": ["1"]})
        second = queue.create("t", {"log": ["2"]}, multitask_strategy="enqueue")
        assert queue.cancel(first.run_id) is True
        assert queue.get(first.run_id).status == "interrupted"
        assert [e.event for e in events(queue, first.run_id)] == ["end"]
        assert queue.cancel(first.run_id) is False  # ended already
        assert queue.cancel(second.run_id, action="rollback") is True
        assert queue.get(second.run_id) is None
        with pytest.raises(RunNotFound):
            queue.cancel(second.run_id)

    def test_delete_removes_an_ended_run_and_refuses_an_active_one(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        first = queue.create("t", {"log": []})
        second = queue.create("t", {"log": []}, multitask_strategy="enqueue")
        assert queue.delete(first.run_id) is False  # pending: its worker may be starting it
        assert queue.get(first.run_id).status == "pending"
        with run_worker(graphs.steps):
            assert queue.join(first.run_id, timeout_s=30).status == "success"
            assert queue.join(second.run_id, timeout_s=30).status == "success"
        assert queue.delete(first.run_id) is True
        assert queue.get(first.run_id) is None and [r.run_id for r in queue.list("t")] == [second.run_id]
        assert log_of(backend, namespace, "t") == list("abcabc")  # its checkpoints are the thread's: kept
        raw, keys = backend.sync_client(), queue._core.keys
        h, e = keys.runs("t").run(first.run_id)
        assert raw.exists(h, e, keys.run_lookup(first.run_id)) == 0
        for gone in (first.run_id, "no-such-run"):
            with pytest.raises(RunNotFound):
                queue.delete(gone)
        with pytest.raises(RunNotFound):
            queue.join(first.run_id, timeout_s=1)

    def test_interrupt_and_rollback_end_pending_runs_before_queueing(self, queue: Any, backend: Any) -> None:
        a = queue.create("t", {"log": ["a"]})
        b = queue.create("t", {"log": ["b"]}, multitask_strategy="interrupt")
        assert queue.get(a.run_id).status == "interrupted" and queue.get(b.run_id).status == "pending"
        c = queue.create("t", {"log": ["c"]}, multitask_strategy="rollback")
        assert queue.get(b.run_id) is None and queue.get(c.run_id).status == "pending"
        # The ways from a run id to its thread: an ended run's expires with it, a deleted one's goes.
        raw, lookup = backend.sync_client(), queue._core.keys.run_lookup
        assert 0 < raw.pttl(lookup(a.run_id)) <= DEFAULT_RUN_TTL_MS + ID_ENTRY_GRACE_MS
        assert raw.exists(lookup(b.run_id)) == 0
        assert raw.pttl(lookup(c.run_id)) == -1  # active: no expiry yet

    def test_bad_input_is_refused_before_anything_is_written(self, queue: Any, backend: Any, namespace: str) -> None:
        raw = backend.sync_client()
        qns = queue_namespace(namespace)
        before = set(raw.keys(f"{qns}:*")) if backend.kind != "cluster" else None
        for kwargs in ({"multitask_strategy": "sometimes"}, {"stream_mode": "everything"}, {"stream_mode": []},
                       {"config": "no"}, {"metadata": 3}):  # fmt: skip
            with pytest.raises(InvalidArgument):
                queue.create("t", {"log": []}, **kwargs)
        with pytest.raises(InvalidArgument, match="serialized"):
            queue.create("t", {"log": [threading.Lock()]})
        with pytest.raises(InvalidArgument):
            queue.create("t", {"log": []}, command=Command(resume=1))
        with pytest.raises(InvalidArgument):
            queue.create("bad\0thread", {})
        with pytest.raises(InvalidArgument):
            queue.cancel("r", action="explode")
        with pytest.raises(InvalidArgument):
            events(queue, "r", after="yesterday")
        for call in (lambda: queue.cancel("missing"), lambda: events(queue, "missing"),
                     lambda: queue.join("missing", timeout_s=1)):  # fmt: skip
            with pytest.raises(RunNotFound):
                call()
        if before is not None:  # the namespace's layout record aside (the first call of any store writes it)
            assert {k for k in raw.keys(f"{qns}:*") if not k.endswith(b"}:layout")} == before
        assert queue.list("t") == []

    def test_two_clients_double_texting_at_once_get_one_outcome(self, backend: Any, namespace: str) -> None:
        for i in range(10):
            outcomes: list[Any] = []
            barrier = threading.Barrier(2)

            def text(
                q: RunQueue, tid: str = f"race-{i}", barrier: Any = barrier, outcomes: list[Any] = outcomes
            ) -> None:
                barrier.wait()
                try:
                    outcomes.append(q.create(tid, {"log": []}))
                except RunRejected as exc:
                    outcomes.append(exc)

            qs = [RunQueue(backend.sync_client(), namespace=namespace) for _ in range(2)]
            threads = [threading.Thread(target=text, args=(q,)) for q in qs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            runs = [o for o in outcomes if isinstance(o, Run)]
            assert len(runs) == 1 and len(outcomes) == 2, outcomes
            assert outcomes[[isinstance(o, RunRejected) for o in outcomes].index(True)].run_id == runs[0].run_id


class TestWorker:
    def test_a_run_streams_every_mode_and_a_reader_resumes_after_any_event(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any, flavor: str
    ) -> None:
        modes = ["values", "updates", "custom", "debug"]
        if flavor == "async" and sys.version_info < (3, 11):
            # LangGraph's astream writer for "custom" reads the node's config from a contextvar that
            # asyncio hands on only from 3.11: before that it raises in the node, whatever the saver.
            modes.remove("custom")
        with run_worker(graphs.steps):
            run = queue.create("t", {"log": ["in"]}, stream_mode=modes)
            seen = events(queue, run.run_id)
            done = queue.join(run.run_id, timeout_s=20)
        assert done.status == "success" and done.attempt == 1
        kinds = [e.event for e in seen]
        assert kinds[0] == "metadata" and kinds[-1] == "end" and seen[-1].data["status"] == "success"
        assert set(modes) <= set(kinds)
        if "custom" in modes:
            assert [e.data for e in seen if e.event == "custom"] == [{"node": "a"}, {"node": "b"}, {"node": "c"}]
        assert seen[-2].event in ("values", "debug")
        assert [e.data for e in seen if e.event == "values"][-1] == {"log": ["in", "a", "b", "c"]}
        ids = [e.id for e in seen]
        assert len(set(ids)) == len(ids)
        for k in (0, len(seen) // 2, len(seen) - 2):
            assert [e.id for e in events(queue, run.run_id, after=ids[k])] == ids[k + 1 :]
        assert events(queue, run.run_id, after=ids[-1]) == []

    def test_enqueued_runs_of_a_thread_run_in_creation_order(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        runs = [queue.create("t", {"log": [f"in{i}"]}, multitask_strategy="enqueue") for i in range(4)]
        with run_worker(graphs.steps, concurrency=3):
            done = [queue.join(r.run_id, timeout_s=30) for r in runs]
        assert [d.status for d in done] == ["success"] * 4
        starts = [d.started_at_ms for d in done]
        assert starts == sorted(starts)
        assert all(done[i].ended_at_ms <= done[i + 1].started_at_ms for i in range(3))  # one at a time
        log = log_of(backend, namespace, "t")
        assert [x for x in log if x.startswith("in")] == ["in0", "in1", "in2", "in3"]

    def test_many_threads_run_side_by_side(self, queue: Any, backend: Any, namespace: str, run_worker: Any) -> None:
        runs = [queue.create(f"t{i}", {"log": []}) for i in range(12)]
        with run_worker(graphs.steps, concurrency=3) as w:
            done = [queue.join(r.run_id, timeout_s=30) for r in runs]
        assert {d.status for d in done} == {"success"}
        assert w.finished == {"success": 12}

    def test_interrupt_stops_the_running_run_at_a_boundary_and_keeps_its_progress(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        with run_worker(graphs.slow):
            first = queue.create("t", {"log": ["first"]})
            _wait_for(lambda: len(log_of(backend, namespace, "t")) >= 2)  # it is under way
            second = queue.create("t", {"log": ["second"]}, multitask_strategy="interrupt")
            a, b = queue.join(first.run_id, timeout_s=30), queue.join(second.run_id, timeout_s=30)
        assert (a.status, a.error) == ("interrupted", "interrupt")
        assert b.status == "success"
        log = log_of(backend, namespace, "t")
        cut = log.index("second")
        assert log[:2] == ["first", "a"] and len(log[1:cut]) < 5  # stopped early, its steps kept
        assert log[cut:] == ["second", "a", "b", "c", "d", "e"]

    def test_rollback_deletes_the_running_run_and_its_checkpoints(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        with run_worker(graphs.slow):
            first = queue.create("t", {"log": ["first"]})
            _wait_for(lambda: len(log_of(backend, namespace, "t")) >= 2)
            second = queue.create("t", {"log": ["second"]}, multitask_strategy="rollback")
            b = queue.join(second.run_id, timeout_s=30)
        assert b.status == "success" and queue.get(first.run_id) is None
        assert log_of(backend, namespace, "t") == ["second", "a", "b", "c", "d", "e"]  # nothing of the first

    def test_cancel_reaches_a_running_run_wherever_its_worker_is(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        with run_worker(graphs.slow):
            run = queue.create("t", {"log": []})
            _wait_for(lambda: queue.get(run.run_id).status == "running")
            assert queue.cancel(run.run_id) is True
            done = queue.join(run.run_id, timeout_s=30)
        assert done.status == "interrupted" and len(log_of(backend, namespace, "t")) < 5

    def test_a_graph_interrupt_ends_the_run_and_a_command_resumes_it(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any, flavor: str, request: pytest.FixtureRequest
    ) -> None:
        # interrupt() reads its config from a contextvar that asyncio hands to a node only from Python
        # 3.11 on: before that, LangGraph fails it under any async driver (test_langgraph.py says so too).
        request.applymarker(
            pytest.mark.xfail(
                flavor == "async" and sys.version_info < (3, 11),
                reason="LangGraph: interrupt() under asyncio needs Python 3.11",
                strict=True,
            )
        )
        with run_worker(graphs.ask):
            first = queue.create("t", {"log": ["q"]}, stream_mode="updates")
            assert queue.join(first.run_id, timeout_s=20).status == "success"  # as LangGraph Platform ends it
            paused = [e.data for e in events(queue, first.run_id) if e.event == "updates"][-1]
            assert paused["__interrupt__"][0].value == "approve?"
            second = queue.create("t", command=Command(resume="yes"))
            assert queue.join(second.run_id, timeout_s=20).status == "success"
        assert log_of(backend, namespace, "t") == ["q", "a", "answer:yes"]

    def test_a_failing_graph_ends_the_run_as_an_error_with_its_event(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        with run_worker(graphs.steps):
            run = queue.create("t", {"log": "not a list"})  # operator.add of a list and a str fails
            done = queue.join(run.run_id, timeout_s=20)
        assert done.status == "error" and "TypeError" in done.error
        evs = events(queue, run.run_id)
        assert [e.event for e in evs][-2:] == ["error", "end"] and evs[-2].data["error"] == "TypeError"

    def test_stop_hands_the_run_back_and_another_worker_finishes_it(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        with run_worker(graphs.slow) as first:
            run = queue.create("t", {"log": []})
            _wait_for(lambda: len(log_of(backend, namespace, "t")) >= 2)
            first.stop()
        assert queue.get(run.run_id).status == "pending"
        with run_worker(graphs.slow):
            done = queue.join(run.run_id, timeout_s=30)
        assert done.status == "success" and done.attempt == 2
        assert log_of(backend, namespace, "t") == ["a", "b", "c", "d", "e"]  # no step ran twice

    def test_a_forked_run_handed_back_goes_on_from_its_own_checkpoints_not_the_fork_point(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        # A run that starts from an earlier checkpoint (config's checkpoint_id: agentstate serve's
        # `checkpoint`, a fork) and is handed back: the next attempt goes on from the checkpoints
        # this run wrote, as any run does, not from the fork point again (which re-ran its nodes
        # and left its first attempt's checkpoints as an abandoned branch).
        saver = AgentStateSaver(backend.sync_client(), namespace=namespace)
        with run_worker(graphs.slow):
            assert queue.join(queue.create("t", {"log": []}).run_id, timeout_s=30).status == "success"
        after_a = next(c for c in saver.list({"configurable": {"thread_id": "t"}})
                       if c.checkpoint["channel_values"].get("log") == ["a"])  # fmt: skip
        fork = after_a.config["configurable"]["checkpoint_id"]
        with run_worker(graphs.slow) as first:
            run = queue.create("t", None, config={"configurable": {"checkpoint_id": fork}})
            _wait_for(lambda: len(log_of(backend, namespace, "t")) == 3)  # a, then b and c of the fork
            first.stop()
        assert queue.get(run.run_id).status == "pending"
        with run_worker(graphs.slow):
            done = queue.join(run.run_id, timeout_s=30)
        assert done.status == "success" and done.attempt == 2
        assert log_of(backend, namespace, "t") == ["a", "b", "c", "d", "e"]
        mine = {c.config["configurable"]["checkpoint_id"]: c for c in saver.list({"configurable": {"thread_id": "t"}})
                if c.metadata.get("run_id") == run.run_id}  # fmt: skip
        chain, at = [], saver.get_tuple({"configurable": {"thread_id": "t"}})
        while at is not None and at.config["configurable"]["checkpoint_id"] != fork:
            chain.append(at.config["configurable"]["checkpoint_id"])
            at = None if at.parent_config is None else saver.get_tuple(at.parent_config)
        assert at is not None and set(chain) == set(mine)
        # LangGraph's own fork checkpoint, then one per node of the fork: each once.
        logs = sorted((c.metadata["step"], c.metadata["source"], c.checkpoint["channel_values"]["log"])
                      for c in mine.values())  # fmt: skip
        assert logs == [(2, "fork", ["a"])] + [(3 + i, "loop", list("abcde"[: 2 + i])) for i in range(4)]


def _wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def test_a_stale_attempt_can_write_no_event_after_a_takeover(backend: Any, namespace: str) -> None:
    q = RunQueue(backend.sync_client(), namespace=namespace)
    run = q.create("t", {"log": []})
    core = q._core
    stale = q._run(core.begin("t", "tok-a", "w1", 3))
    taken = q._run(core.begin("t", "tok-b", "w2", 3))  # what the next worker does once the lease lapsed
    assert taken.resumed and taken.attempt == 2
    from redis_agentstate.langgraph._runs_core import RunLost

    with pytest.raises(RunLost):
        q._run(core.emit(stale.run, "tok-a", [("values", {"log": ["late"]})], seq=1))
    with pytest.raises(RunLost):
        q._run(core.finish(stale.run, "tok-a", "success"))
    assert q._run(core.emit(taken.run, "tok-b", [("values", {"log": ["ok"]})], seq=1)) == ""
    assert [e.data for e in q.stream(run.run_id, block_ms=0) if e.event == "values"] == [{"log": ["ok"]}]


def test_a_stream_read_as_its_run_ends_still_yields_the_end_event(
    backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ends between the two commands of a stream's read (a pipeline, not atomic): the stream
    still ends with the run's ``end`` event. With the events read before the status, a finish in
    between made the read see no event and a final status, and the stream ended without ``end``
    (found by the full suite, ``test_a_run_streams_every_mode...``, once under load)."""
    client = backend.sync_client()
    q = RunQueue(client, namespace=namespace)
    other = RunQueue(backend.sync_client(), namespace=namespace)
    run = q.create("t", {"log": []})
    real = client.pipeline
    ended: list[bool] = []

    class OneByOne:
        """The stream's pipelined read, its commands sent one at a time with the run's end between."""

        def __init__(self, **kw: Any) -> None:
            self.commands: list[tuple[Any, ...]] = []

        def execute_command(self, *cmd: Any) -> None:
            self.commands.append(cmd)

        def execute(self, raise_on_error: bool = True) -> list[Any]:
            pipe = real(transaction=False)
            if ended or not any(cmd[0] == "XRANGE" for cmd in self.commands):
                for cmd in self.commands:
                    pipe.execute_command(*cmd)
                return list(pipe.execute(raise_on_error=raise_on_error))
            first, *rest = self.commands
            replies = [client.execute_command(*first)]
            ended.append(other.cancel(run.run_id))  # the run ends here, between the read's two commands
            for cmd in rest:
                pipe.execute_command(*cmd)
            return replies + list(pipe.execute(raise_on_error=raise_on_error))

    monkeypatch.setattr(client, "pipeline", OneByOne)
    seen = list(q.stream(run.run_id))
    assert ended == [True]
    assert seen and seen[-1].event == "end" and seen[-1].data["status"] == "interrupted"


def test_a_begin_under_a_claim_another_worker_took_since_begins_nothing(backend: Any, namespace: str) -> None:
    """A worker begins the thread's next run under its claim of the thread's task, checked in the same
    script (lg_run_begin.lua): once another worker claimed the task (the first stalled past its
    lease), the first begins nothing, and the second begins the run as its first attempt."""
    from redis_agentstate.langgraph._runs_core import RunLost

    q = RunQueue(backend.sync_client(), namespace=namespace)
    run = q.create("t", {"log": []})
    core = q._core
    stale = q.tasks.claim_next(token="tok-a", lease_ms=200)
    assert stale is not None and stale.task_id == "t"
    deadline = time.monotonic() + 10
    while (taken := q.tasks.claim_next(token="tok-b", lease_ms=60_000)) is None:  # once tok-a's lease lapsed
        assert time.monotonic() < deadline, "the task was never claimed again"
        time.sleep(0.05)
    with pytest.raises(RunLost):
        q._run(core.begin("t", "tok-a", "w1", 3, stale.revision))
    got = q.get(run.run_id)
    assert (got.status, got.attempt) == ("pending", 0)
    assert [e.event for e in q.stream(run.run_id, block_ms=0)] == []  # no metadata event: nothing begun
    begun = q._run(core.begin("t", "tok-b", "w2", 3, taken.revision))
    assert begun is not None and (begun.run.run_id, begun.attempt, begun.resumed) == (run.run_id, 1, False)


class _HeldLease:
    """What ``GraphWorker._execute`` asks of the thread's task lease: it is still held."""

    lost = False

    def release(self, reason: str = "") -> None:
        pass


class _AHeldLease(_HeldLease):
    async def release(self, reason: str = "") -> None:  # type: ignore[override]
        pass


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_worker_that_stalled_before_the_saver_lease_writes_no_checkpoint(
    backend: Any, namespace: str, flavor: str, twin_loop: asyncio.AbstractEventLoop
) -> None:
    """The chaos run's find (a run saved twice, after a newer run): a worker took run X, then stalled
    before taking the thread's saver lease; another worker took X over and finished it, a second run
    finished after it, the saver lease fell free. The stale worker then must not run the graph (it
    would start X again from its input, on top of the second run's checkpoint)."""
    from redis_agentstate.langgraph.worker import _Attempt

    q = RunQueue(backend.sync_client(), namespace=namespace)
    x = q.create("t", {"log": ["x"]})
    core = q._core
    stale = q._run(core.begin("t", "tok-a", "w1", 3))  # then the worker stalls
    saver = AgentStateSaver(backend.sync_client(), namespace=namespace)
    # Leases long enough that a loaded machine's scheduling cannot lapse one between its renewals: the
    # takeover here is the begin under another token, not a lapse.
    w = GraphWorker(graphs.steps, q, saver, lease_ms=5_000)
    taken = q._run(core.begin("t", "tok-b", "w2", 3))  # the task lease lapsed: taken over
    assert w._execute(_Attempt(w, taken, "tok-b"), _HeldLease()) == 0  # type: ignore[arg-type]
    y = q.create("t", {"log": ["y"]})
    second = q._run(core.begin("t", "tok-c", "w3", 3))
    assert w._execute(_Attempt(w, second, "tok-c"), _HeldLease()) == 0  # type: ignore[arg-type]
    before = log_of(backend, namespace, "t")
    assert before == ["x", "a", "b", "c", "y", "a", "b", "c"]
    if flavor == "sync":
        assert w._execute(_Attempt(w, stale, "tok-a"), _HeldLease()) is None  # type: ignore[arg-type]
    else:
        client, aclient = backend.new_async_client(), backend.new_async_client()
        aw = GraphWorker(graphs.steps, AsyncRunQueue(client, namespace=namespace),
                         AsyncAgentStateSaver(aclient, namespace=namespace), lease_ms=5_000)  # fmt: skip
        attempt = aw._aexecute(_Attempt(aw, stale, "tok-a"), _AHeldLease())  # type: ignore[arg-type]
        assert twin_loop.run_until_complete(attempt) is None
        twin_loop.run_until_complete(client.aclose())
        twin_loop.run_until_complete(aclient.aclose())
    assert log_of(backend, namespace, "t") == before
    assert q.get(x.run_id).status == "success" and q.get(x.run_id).attempt == 2
    assert q.get(y.run_id).status == "success"


class _FrozenAfterCheck(_HeldLease):
    """A task lease that is lost from a given check of the attempt on: the worker froze right after
    that check passed, and by the time it runs on, the lease has lapsed."""

    def __init__(self) -> None:
        self.frozen = False

    @property
    def lost(self) -> bool:  # type: ignore[override]
        return self.frozen


def _recording_chain(started: list[str]) -> Any:
    """a -> b -> c, each node noting that its body started (what a model call or a tool would do)."""

    def node(name: str) -> Any:
        def run(state: graphs.State) -> dict[str, Any]:
            started.append(name)
            return {"log": [name]}

        return run

    return graphs._chain("abc", node=node)


def _stale_attempt(
    backend: Any, namespace: str, graph: Any, flavor: str, twin_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch, checks: int, seen: list[str] | None = None,
) -> tuple[RunQueue, Run]:  # fmt: skip
    """Worker w1 (token tok-a) runs thread t's new run on ``flavor``'s driver, its task lease read as
    lost from its ``checks``-th lease check on (``seen``: told of each check): it froze right after
    that check passed. The attempt must end nothing (the run is left to a takeover)."""
    from redis_agentstate.langgraph.worker import _Attempt

    q = RunQueue(backend.sync_client(), namespace=namespace)
    run = q.create("t", {"log": []})
    begun = q._run(q._core.begin("t", "tok-a", "w1", 3))
    task_lease = _FrozenAfterCheck()
    carry_on = _Attempt.carry_on
    count = [0]

    def check_then_freeze(self: Any, *args: Any) -> bool:
        go = carry_on(self, *args)
        count[0] += 1
        if seen is not None:
            seen.append(f"check{count[0]}")
        task_lease.frozen = task_lease.frozen or count[0] == checks
        return go

    monkeypatch.setattr(_Attempt, "carry_on", check_then_freeze)
    if flavor == "sync":
        w = GraphWorker(graph, q, AgentStateSaver(backend.sync_client(), namespace=namespace), lease_ms=5_000)
        assert w._execute(_Attempt(w, begun, "tok-a"), task_lease) is None  # type: ignore[arg-type]
    else:
        client, aclient = backend.new_async_client(), backend.new_async_client()
        aw = GraphWorker(graph, AsyncRunQueue(client, namespace=namespace),
                         AsyncAgentStateSaver(aclient, namespace=namespace), lease_ms=5_000)  # fmt: skip
        attempt = aw._aexecute(_Attempt(aw, begun, "tok-a"), task_lease)  # type: ignore[arg-type]
        assert twin_loop.run_until_complete(attempt) is None
        twin_loop.run_until_complete(client.aclose())
        twin_loop.run_until_complete(aclient.aclose())
    return q, run


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize("checks", [2, 3], ids=["frozen-before-the-first-node", "frozen-between-nodes"])
def test_a_worker_frozen_right_after_a_lease_check_starts_no_node(
    backend: Any,
    namespace: str,
    flavor: str,
    checks: int,
    twin_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runs chaos test's find ('node a of run R ran again after its saved execution'): a worker
    checks its lease before the graph starts and after each super-step's chunk, and a SIGSTOP can
    land right after a check passed. The worker that took the run over meanwhile ran the node and
    saved it; the stale one, thawed, must not start that node again (its writes would be fenced, but
    the node's own effects, a model call or a tool, would happen twice). Each node's start checks
    the leases (a callback of the graph's config), so the freeze is caught there."""
    from redis_agentstate.langgraph.worker import _Attempt

    started: list[str] = []
    graph = _recording_chain(started)
    q, run = _stale_attempt(backend, namespace, graph, flavor, twin_loop, monkeypatch, checks, seen=started)
    # The worker checks once before the graph, once per chunk (the input's first): nothing may start
    # after the check it froze behind; what started before it did.
    assert started == ["check1", "check2", "a", "check3"][: 2 * checks - 2]
    assert q.get(run.run_id).status == "running"  # not ended by the stale worker: it is taken over
    # The takeover goes on from what the stale attempt saved: a node refused at its start left
    # nothing that makes the run fail or a saved node run again.
    monkeypatch.undo()
    del started[:]
    taken = q._run(q._core.begin("t", "tok-b", "w2", 3))
    w2 = GraphWorker(graph, q, AgentStateSaver(backend.sync_client(), namespace=namespace), lease_ms=5_000)
    assert w2._execute(_Attempt(w2, taken, "tok-b"), _HeldLease()) == 0  # type: ignore[arg-type]
    assert started == ["a", "b", "c"][checks - 2 :]
    assert log_of(backend, namespace, "t") == ["a", "b", "c"]
    assert (q.get(run.run_id).status, q.get(run.run_id).attempt) == ("success", 2)


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_node_retry_policy_does_not_retry_a_lost_run(
    backend: Any, namespace: str, flavor: str, twin_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose retry policy retries every Exception (LangGraph's default retries all but a few
    built-in ones): the gate's refusal is a RunStopped, a GraphBubbleUp, which LangGraph never
    retries and saves no error for. As a plain error, the node was tried max_attempts times,
    with LangGraph's backoff between (seconds of a worker kept on a run that is not its own)."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import RetryPolicy

    from redis_agentstate.langgraph.worker import _LeaseGate

    started: list[str] = []

    def a(state: graphs.State) -> dict[str, Any]:
        started.append("a")
        return {"log": ["a"]}

    b = StateGraph(graphs.State)
    b.add_node("a", a, retry_policy=RetryPolicy(retry_on=Exception, max_attempts=4, initial_interval=5.0))
    b.add_edge(START, "a")
    b.add_edge("a", END)
    graph = b.compile()
    refused: list[BaseException] = []
    gate_start = _LeaseGate.on_chain_start

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            gate_start(self, *args, **kwargs)
        except BaseException as exc:
            refused.append(exc)
            raise

    monkeypatch.setattr(_LeaseGate, "on_chain_start", counted)
    # Frozen after the check that follows the input's chunk: "a" is next.
    q, run = _stale_attempt(backend, namespace, graph, flavor, twin_loop, monkeypatch, checks=2)
    assert started == [] and len(refused) == 1 and isinstance(refused[0], RunStopped)
    assert isinstance(refused[0], LeaseLost) and refused[0].task_id == "t"
    tup = AgentStateSaver(backend.sync_client(), namespace=namespace).get_tuple({"configurable": {"thread_id": "t"}})
    assert tup is None or not [w for w in tup.pending_writes or () if w[1] == "__error__"]  # no error saved for "a"
    assert q.get(run.run_id).status == "running"  # left to the worker that takes it over


def test_a_tool_node_that_handles_tool_errors_lets_a_stopped_run_through() -> None:
    """ToolNode(handle_tool_errors=True) answers a failing tool with an error message to the model
    and goes on; a run stopped as one of its tools starts is not a tool's failure, and stops."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    from redis_agentstate.langgraph.worker import _LeaseGate

    ran: list[str] = []

    @tool
    def look_up(q: str) -> str:
        """Looks q up."""
        ran.append(q)
        return q

    class ToolGate(_LeaseGate):  # the gate at the tool's start only: the node itself has started
        on_chain_start = BaseCallbackHandler.on_chain_start

    lost = _FrozenAfterCheck()
    lost.frozen = True
    attempt = types.SimpleNamespace(run=types.SimpleNamespace(run_id="r", thread_id="t"), halted=False)
    call = AIMessage("", tool_calls=[{"name": "look_up", "args": {"q": "x"}, "id": "c1"}])
    b = StateGraph(MessagesState)
    b.add_node("tools", ToolNode([look_up], handle_tool_errors=True))
    b.add_edge(START, "tools")
    graph = b.compile()
    with pytest.raises(RunStopped):
        graph.invoke({"messages": [call]}, config={"callbacks": [ToolGate(attempt, (lost,))]})
    assert ran == []
    assert graph.invoke({"messages": [call]})["messages"][-1].content == "x"  # a held lease: the tool runs


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_cancel_stops_a_sync_node_at_its_next_model_call(backend: Any, namespace: str, driver: str) -> None:
    """Nothing interrupts a sync node, on either driver (asyncio runs it in an executor's thread,
    which cancelling the graph's task does not stop). After a cancel its next traced call (a model,
    a tool: here a runnable invoked with the node's config) raises instead of running, and the next
    node never starts."""
    from langchain_core.runnables import RunnableConfig, RunnableLambda

    calls: list[int] = []
    started: list[str] = []

    def model(i: int) -> int:
        calls.append(i)
        time.sleep(0.05)
        return i

    def node(name: str) -> Any:
        def run(state: graphs.State, config: RunnableConfig) -> dict[str, Any]:
            started.append(name)
            if name == "a":
                for i in range(40):
                    RunnableLambda(model).invoke(i, config)
            return {"log": [name]}

        return run

    q = RunQueue(backend.sync_client(), namespace=namespace)
    with worker(backend, namespace, graphs._chain("ab", node=node), flavor=driver):
        run = q.create("t", {"log": []})
        _wait_for(lambda: len(calls) >= 3)
        q.cancel(run.run_id, action="interrupt")
        assert q.join(run.run_id, timeout_s=20).status == "interrupted"
        at_end = len(calls)
        time.sleep(0.5)  # ten more calls' time, had the node gone on
    assert len(calls) <= at_end + 1 < 40, calls
    assert started == ["a"]


def test_a_sigkilled_worker_s_run_resumes_elsewhere_without_rerunning_saved_nodes(
    real_server: Any, namespace: str
) -> None:
    """A worker process (the CLI) SIGKILLs itself inside node b; another worker takes the run over
    once the lease lapses and resumes from the checkpoint after a: a runs once, b twice (its
    first attempt died before writing), c once."""
    url = require_real(real_server)
    import redis

    env = {
        **os.environ,
        "AGENTSTATE_LG_URL": url,
        "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    q = RunQueue(redis.Redis.from_url(url), namespace=namespace)
    run = q.create("crash", {"log": ["in"]})
    cmd = [sys.executable, "-m", "redis_agentstate", "langgraph", "worker", "lg_run_graphs:crashy", "--url", url,
           "--queue-namespace", namespace, "--saver-namespace", namespace, "--lease-ms", "1500"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    os.environ["AGENTSTATE_LG_URL"] = url
    try:
        start = time.monotonic()
        saver = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
        w = GraphWorker(graphs.crashy, RunQueue(redis.Redis.from_url(url), namespace=namespace), saver,
                        lease_ms=1500, block_ms=200)  # fmt: skip
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        done = q.join(run.run_id, timeout_s=30)
        took = time.monotonic() - start
        w.stop()
        t.join(10)
    finally:
        os.environ.pop("AGENTSTATE_LG_URL", None)
    assert done.status == "success" and done.attempt == 2, done
    r = redis.Redis.from_url(url)
    assert [int(r.get(f"crash:ran:{n}") or 0) for n in "abc"] == [1, 2, 1]
    assert took < 10
    evs = q.stream(run.run_id)
    kinds = [e.event for e in evs]
    assert kinds.count("metadata") == 2 and kinds[-1] == "end"


def test_the_cli_lists_tails_and_cancels_runs(real_server: Any, namespace: str) -> None:
    url = require_real(real_server)
    import redis

    q = RunQueue(redis.Redis.from_url(url), namespace=namespace)
    run = q.create("<b>thread</b>", {"log": []})

    def cli(*args: str) -> str:
        out = run_python(["-m", "redis_agentstate", "langgraph", *args, "--url", url, "--queue-namespace", namespace],
                         timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    assert run.run_id in cli("runs", "<b>thread</b>") and "pending" in cli("runs", "<b>thread</b>")
    assert "interrupt asked" in cli("cancel", run.run_id)
    tail = cli("tail", run.run_id)  # ended: the tail prints the final event and exits
    assert "end" in tail and "interrupted" in tail
    assert '"status": "interrupted"' in cli("runs", "<b>thread</b>", "--json")
    assert "ended already" in cli("cancel", run.run_id)
    bad = run_python(["-m", "redis_agentstate", "langgraph", "worker", "no_such_module:g", "--url", url], timeout=60)
    assert bad.returncode == 1 and "cannot import" in bad.stderr


def test_keys_of_a_run_belong_to_its_thread() -> None:
    from redis_agentstate.keys import describe_key

    keys = Keys("ns")
    keys.configure(64, "slots")
    rk = keys.runs("th")
    h, e = rk.run("r1")
    assert describe_key(h) == ("hash", "thread", "th") and describe_key(e) == ("stream", "thread", "th")
    assert describe_key(rk.active) == ("list", "thread", "th")
    assert describe_key(keys.run_lookup("r1")) == ("string", "run", "r1")
    assert h.split("}:")[0] == keys.task("th").checkpoint.split("}:")[0]  # one slot with the thread's task


def test_async_queue_streams_live(backend: Any, namespace: str, twin_loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> list[str]:
        q = AsyncRunQueue(backend.new_async_client(), namespace=namespace)
        run = await q.create("t", {"log": []}, stream_mode="updates")
        with worker(backend, namespace, graphs.steps):
            seen = [e.event async for e in q.stream(run.run_id)]
            assert (await q.join(run.run_id, timeout_s=20)).status == "success"
        await q.client.aclose()
        return seen

    assert twin_loop.run_until_complete(main()) == ["metadata", "updates", "updates", "updates", "end"]


def test_a_run_for_another_graph_ends_as_an_error_without_running(backend: Any, namespace: str) -> None:
    q = RunQueue(backend.sync_client(), namespace=namespace)
    other = q.create("t", {"log": ["x"]}, metadata={"graph_id": "billing"})
    mine = q.create("t", {"log": ["y"]}, metadata={"graph_id": "steps"}, multitask_strategy="enqueue")
    with worker(backend, namespace, graphs.steps, graph_id="steps"):
        a, b = q.join(other.run_id, timeout_s=20), q.join(mine.run_id, timeout_s=20)
    assert a.status == "error" and "GraphMismatch" in a.error and "'billing'" in a.error
    assert b.status == "success"
    assert log_of(backend, namespace, "t") == ["y", "a", "b", "c"]  # nothing of the other graph's run


def test_join_waits_no_longer_than_its_timeout(backend: Any, namespace: str) -> None:
    q = RunQueue(backend.sync_client(), namespace=namespace)
    run = q.create("t", {"log": []})  # no worker: it stays pending
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        q.join(run.run_id, timeout_s=0.3)
    assert time.monotonic() - start < 2.5  # the run never ends: a join that ignored its timeout would hang


def test_runs_move_with_their_threads_in_a_reshard(backend: Any, namespace: str) -> None:
    q = RunQueue(backend.sync_client(), namespace=namespace, shards=2)
    done = [q.create(f"t{i}", {"log": [f"r{i}"]}) for i in range(6)]
    with worker(backend, namespace, graphs.steps):
        for r in done:
            assert q.join(r.run_id, timeout_s=20).status == "success"
    before = {r.run_id: [e.id for e in q.stream(r.run_id)] for r in done}
    pending = [q.create(f"t{i}", {"log": [f"p{i}"]}) for i in range(6)]
    # A running run's stop signal (lg_run_cancel.lua writes it while its worker runs the graph): a
    # kind of its own, which the reshard must move with the thread too, not leave under the old tag.
    client = backend.sync_client()
    old_stop = q._core.keys.runs("t2").stop(pending[2].run_id)
    client.xadd(old_stop, {"action": "interrupt"})
    report = q.tasks.reshard(8)
    assert report.to_shards == 8 and report.unknown == 0  # every run key is a kind the resharder knows
    mover = RunQueue(backend.sync_client(), namespace=namespace)
    assert {r.run_id: [e.id for e in mover.stream(r.run_id)] for r in done} == before  # events moved whole
    new_stop = mover._core.keys.runs("t2").stop(pending[2].run_id)  # the layout read: keys of 8 shards
    assert new_stop != old_stop and client.exists(old_stop) == 0 and client.xlen(new_stop) == 1
    client.delete(new_stop)  # the run is pending: its worker would never read it
    assert [r.run_id for r in mover.list("t0")] == [pending[0].run_id, done[0].run_id]
    with pytest.raises(RunRejected):
        mover.create("t1", {"log": []})  # the thread's active run moved with it: the check still sees it
    with worker(backend, namespace, graphs.steps):
        assert all(mover.join(r.run_id, timeout_s=30).status == "success" for r in pending)
    assert log_of(backend, namespace, "t3") == ["r3", "a", "b", "c", "p3", "a", "b", "c"]


def test_sigterm_hands_the_run_back_at_its_next_boundary(real_server: Any, namespace: str) -> None:
    url = require_real(real_server)
    import redis

    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    q = RunQueue(redis.Redis.from_url(url), namespace=namespace)
    run = q.create("term", {"log": []})
    cmd = [sys.executable, "-m", "redis_agentstate", "langgraph", "worker", "lg_run_graphs:slow", "--url", url,
           "--queue-namespace", namespace, "--saver-namespace", namespace]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: (r := q.get(run.run_id)) is not None and r.status == "running")
        _wait_for(lambda: len(thread_log(redis.Redis.from_url(url), namespace, "term")) >= 1)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"stopped" in err
    handed = q.get(run.run_id)
    assert handed.status == "pending" and handed.attempt == 1
    kept = thread_log(redis.Redis.from_url(url), namespace, "term")
    assert 1 <= len(kept) < 5
    w = GraphWorker(graphs.slow, RunQueue(redis.Redis.from_url(url), namespace=namespace),
                    AgentStateSaver(redis.Redis.from_url(url), namespace=namespace), block_ms=200)  # fmt: skip
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    done = q.join(run.run_id, timeout_s=30)
    w.stop()
    t.join(10)
    assert done.status == "success" and done.attempt == 2
    assert thread_log(redis.Redis.from_url(url), namespace, "term") == ["a", "b", "c", "d", "e"]  # nothing twice


def test_retention_keeps_the_last_events_and_an_ended_run_expires(backend: Any, namespace: str) -> None:
    q = RunQueue(backend.sync_client(), namespace=namespace, max_events=4, run_ttl_ms=1_500)
    run = q.create("t", {"log": []}, stream_mode=["values", "updates"])
    w = GraphWorker(graphs.steps, RunQueue(backend.sync_client(), namespace=namespace, max_events=4, run_ttl_ms=1_500),
                    AgentStateSaver(backend.sync_client(), namespace=namespace), block_ms=200)  # fmt: skip
    backend.sync_client().script_flush()  # the run's end then goes after its id entry's TTL (a NOSCRIPT re-send)
    assert w.run_once(block_ms=2_000)
    done = q.join(run.run_id, timeout_s=10)
    assert done.status == "success"
    kept = list(q.stream(run.run_id))
    assert len(kept) == 4 and kept[-1].event == "end"  # the oldest went first
    assert [r.run_id for r in q.list("t")] == [run.run_id]
    raw = backend.sync_client()
    h, e = q._core.keys.runs("t").run(run.run_id)
    assert 0 < raw.pttl(h) <= 1_500 and 0 < raw.pttl(e) <= 1_500
    # The id's entry outlives the record, whatever order its TTL and the record's were set in: here
    # the end's script was re-sent after the entry's (NOSCRIPT, scripts flushed below).
    lookup = q._core.keys.run_lookup(run.run_id)
    assert raw.pexpiretime(lookup) - raw.pexpiretime(h) > ID_ENTRY_GRACE_MS // 2
    _wait_for(lambda: q.get(run.run_id) is None, timeout=10)  # expired with its record
    assert q.list("t") == []
    with pytest.raises(RunNotFound):
        q.cancel(run.run_id)


def _drive(queue: Any, value: Any) -> Any:
    """``value``, awaited on the twin's loop if ``queue`` is the asyncio twin's (its ``tasks`` store is async)."""
    if inspect.isawaitable(value):
        return queue._loop.run_until_complete(value)
    return value


class TestDeaths:
    """Issue 38, item 5: only deaths (a lease that lapsed without a hand-back) count toward max_attempts."""

    def test_hand_backs_are_no_deaths_and_the_third_death_ends_the_run(self, queue: Any) -> None:
        run = queue.create("t", {"log": []})
        core = queue._core
        for token in ("restart-1", "restart-2"):  # two rolling restarts: each worker hands the run back
            begun = queue._run(core.begin("t", token, "w", 3))
            assert begun is not None and not begun.resumed
            assert queue._run(core.finish(begun.run, token, "pending")) == 1
        assert queue._run(core.begin("t", "crash", "w", 3)) is not None  # then its worker dies: no hand-back
        taken = queue._run(core.begin("t", "after-crash", "w", 3))  # the lease lapsed: taken over, death 1
        assert taken is not None and taken.attempt == 4 and taken.resumed
        assert queue.get(run.run_id).status == "running"
        assert queue._run(core.begin("t", "again", "w", 3)) is not None  # death 2
        assert queue._run(core.begin("t", "last", "w", 3)) is None  # death 3: a poison run, ended
        got = queue.get(run.run_id)
        assert (got.status, got.error, got.attempt) == ("error", "lost its worker 3 times", 5)
        assert [e.event for e in events(queue, run.run_id)] == ["metadata"] * 5 + ["end"]

    def test_workers_stopped_twice_and_one_crash_still_finish_the_run(
        self, queue: Any, backend: Any, namespace: str, run_worker: Any
    ) -> None:
        run = queue.create("t", {"log": []})
        for attempt in (1, 2):  # two rolling restarts, each once its attempt made progress
            base = len(log_of(backend, namespace, "t"))
            with run_worker(graphs.slow, max_attempts=2) as w:
                _wait_for(lambda attempt=attempt, base=base: queue.get(run.run_id).attempt == attempt
                          and len(log_of(backend, namespace, "t")) > base)  # fmt: skip
                w.stop()
            assert queue.get(run.run_id).status == "pending"
        # A worker takes the run and dies at once (its attempt begun, the thread's task lease left to lapse).
        assert queue._run(queue._core.begin("t", "dead-worker", "w", 2)) is not None
        with run_worker(graphs.slow, max_attempts=2):
            done = queue.join(run.run_id, timeout_s=30)
        assert (done.status, done.error, done.attempt) == ("success", "", 4)
        assert log_of(backend, namespace, "t") == list("abcde")  # no saved node ran twice


class TestCancelledThread:
    """Issue 38, item 6: a thread whose task was cancelled in the queue's namespace can run nothing,
    so its new runs are refused (RunRejected) and a join of a run accepted before says so."""

    def test_the_task_store_s_cancel_refuses_new_runs_and_join_reports_the_accepted_ones(
        self, queue: Any, backend: Any
    ) -> None:
        first = queue.create("t", {"log": []})
        queued = queue.create("t", {"log": []}, multitask_strategy="enqueue")
        assert _drive(queue, queue.tasks.cancel("t", reason="operator"))
        for strategy in ("reject", "enqueue", "interrupt", "rollback"):
            with pytest.raises(RunRejected, match="cancelled") as info:
                queue.create("t", {"log": []}, multitask_strategy=strategy)
            assert info.value.thread_id == "t"
        # Nothing accepted (runs created in the same millisecond list in id order: compare as sets).
        assert {r.run_id for r in queue.list("t")} == {queued.run_id, first.run_id}
        for r in (first, queued):
            with pytest.raises(RunRejected, match="can never run"):
                queue.join(r.run_id, timeout_s=10)
        assert queue.create("other", {"log": []}).status == "pending"  # other threads go on
        _drive(queue, queue.tasks.delete("t"))  # the documented way to start the thread afresh
        again = queue.create("t", {"log": []}, multitask_strategy="enqueue")
        assert again.status == "pending" and queue.get(again.run_id).status == "pending"

    def test_a_thread_cancelled_with_the_cli_refuses_new_runs(self, real_server: Any, namespace: str) -> None:
        url = require_real(real_server)
        import redis

        q = RunQueue(redis.Redis.from_url(url), namespace=namespace)
        run = q.create("th", {"log": []})
        out = run_python(["-m", "redis_agentstate", "cancel", "th", "--namespace", queue_namespace(namespace),
                          "--url", url], timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        with pytest.raises(RunRejected, match="cancelled"):
            q.create("th", {"log": []}, multitask_strategy="enqueue")
        with pytest.raises(RunRejected, match="can never run"):
            q.join(run.run_id, timeout_s=10)
        assert [r.run_id for r in q.list("th")] == [run.run_id]


class TestBadArguments:
    """Issue 38, item 9: InvalidArgument (a ValueError) for a join's timeout or an event id that
    Redis or Python would refuse with an error of their own, before anything is sent."""

    @pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, 10**400, "5", -1, True, 10**12])
    def test_join_refuses_a_timeout_that_is_no_finite_number_of_seconds(self, queue: Any, timeout: Any) -> None:
        run = queue.create("t", {"log": []})
        with pytest.raises(InvalidArgument, match="timeout_s"):
            queue.join(run.run_id, timeout_s=timeout)
        with pytest.raises(InvalidArgument, match="timeout_s"):  # before anything: not RunNotFound
            queue.join("no-such-run", timeout_s=timeout)
        with pytest.raises(TimeoutError):
            queue.join(run.run_id, timeout_s=0)

    @pytest.mark.parametrize(
        "after", ["²-0", "1-\u0661", "1" * 23 + "-0", f"0-{2**64}", "garbage", "-1-0", " 1-0", "1-"]
    )
    def test_stream_refuses_an_event_id_redis_would_refuse(self, queue: Any, after: str) -> None:
        run = queue.create("t", {"log": []})
        with pytest.raises(InvalidArgument, match="after must be an event id"):
            events(queue, run.run_id, after=after)

    def test_stream_takes_the_largest_event_ids(self, queue: Any) -> None:
        run = queue.create("t", {"log": []})
        queue.cancel(run.run_id)  # ended: its stream holds its end event
        top = 2**64 - 1
        for after in (f"{top}-0", f"{top}-{top}"):
            assert events(queue, run.run_id, after=after, block_ms=0) == []
        for after in ("0-0", f"0-{top}"):
            assert [e.event for e in events(queue, run.run_id, after=after)] == ["end"]

    def test_the_cli_tail_refuses_a_bad_event_id_with_a_clear_message(self, real_server: Any, namespace: str) -> None:
        url = require_real(real_server)
        import redis

        run = RunQueue(redis.Redis.from_url(url), namespace=namespace).create("t", {"log": []})
        for bad in ("²-0", "1-\u0661", "1" * 23 + "-0", "garbage"):  # \u0661: ARABIC-INDIC DIGIT ONE
            out = run_python(["-m", "redis_agentstate", "langgraph", "tail", run.run_id, "--after", bad,
                              "--url", url, "--queue-namespace", namespace], timeout=60)  # fmt: skip
            err = out.stderr
            assert out.returncode == 1 and "--after must be an event id" in err and "BackendError" not in err, err
