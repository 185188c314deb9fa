"""Every run-queue script under a lost reply: the server ran it, the client saw a connection error,
the library's retry sent it again. What is observable (the runs, their attempts, their events, the
id entries, the returned value) must be what one execution gives (issue 38, item 4).

fakeredis, a real redis-server and the local Cluster (``backend``), sync and async (``flavor``).
A script call sent alone is lost with ``faults.replies``; a create goes in a pipelined batch with
its id entry (and its thread's task), so its loss is injected at the pipeline (``_lose_batch``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import lg_run_graphs as graphs
import pytest
import redis.exceptions as rex
from faults.replies import lose_first_reply

from redis_agentstate.langgraph import (
    AgentStateSaver,
    AsyncAgentStateSaver,
    AsyncRunQueue,
    GraphWorker,
    RunNotFound,
    RunQueue,
    RunRejected,
    _runs_core,
)
from redis_agentstate.langgraph import scripts as S
from redis_agentstate.wire import pipelines


@pytest.fixture
def queue(make: Callable[..., Any]) -> Any:
    return make(RunQueue, AsyncRunQueue)


def scripts_of(queue: Any) -> dict[str, Any]:
    return getattr(queue, "wrapped", queue)._scripts  # type: ignore[no-any-return]


def core_run(queue: Any, op: Any) -> Any:
    """Drive a ``RunCore`` op through ``queue`` (either twin): as a worker does."""
    return queue._run(op)


def _lose_batch(monkeypatch: pytest.MonkeyPatch, script: Any) -> list[int]:
    """The next pipelined batch that holds a call of ``script`` runs on the server, then its reply is
    lost (a ConnectionError); later batches go through. Returns one entry per batch sent with it."""
    sent: list[int] = []
    sync_pipeline, async_pipeline = pipelines._pipeline_sync, pipelines._pipeline_async

    def holds(entries: Any, replies: list[Any]) -> bool:
        """The batch ran a call of ``script`` (one that met NOSCRIPT did not run: it is sent again)."""
        return any(cmd[0] == "EVALSHA" and cmd[1] == script.sha and not isinstance(reply, rex.NoScriptError)
                   for (cmd, _), reply in zip(entries, replies, strict=False))  # fmt: skip

    def lose_sync(client: Any, entries: Any) -> list[Any]:
        replies = sync_pipeline(client, entries)
        if holds(entries, replies):
            sent.append(1)
            if len(sent) == 1:
                raise rex.ConnectionError("reply lost (injected)")
        return replies

    async def lose_async(client: Any, entries: Any) -> list[Any]:
        replies = await async_pipeline(client, entries)
        if holds(entries, replies):
            sent.append(1)
            if len(sent) == 1:
                raise rex.ConnectionError("reply lost (injected)")
        return replies

    monkeypatch.setattr(pipelines, "_pipeline_sync", lose_sync)
    monkeypatch.setattr(pipelines, "_pipeline_async", lose_async)
    return sent


def _lose_when(script: Any, monkeypatch: pytest.MonkeyPatch, when: Callable[[list[Any]], bool]) -> list[list[Any]]:
    """As ``lose_first_reply``, for the first call of ``script`` whose ARGV (bytes, as the wire sends
    it) ``when`` picks (the calls before it go through untouched); returns the ARGV of that call and
    of the calls after it."""
    return lose_first_reply(script, monkeypatch, when=when)


class _Worker:
    """A GraphWorker of this test's flavor whose ``run_once`` runs here (no threads): one thread's
    turn, deterministic, so that a lost reply lands where the test says."""

    def __init__(self, backend: Any, namespace: str, flavor: str, loop: Any, **kw: Any) -> None:
        kw.setdefault("lease_ms", 5_000)
        self.loop = loop
        if flavor == "sync":
            self.w = GraphWorker(graphs.steps, RunQueue(backend.sync_client(), namespace=namespace),
                                 AgentStateSaver(backend.sync_client(), namespace=namespace), **kw)  # fmt: skip
        else:
            self.w = GraphWorker(graphs.steps, AsyncRunQueue(backend.async_client(), namespace=namespace),
                                 AsyncAgentStateSaver(backend.async_client(), namespace=namespace), **kw)  # fmt: skip

    @property
    def scripts(self) -> dict[str, Any]:
        return self.w.queue._scripts  # type: ignore[no-any-return]

    def run_once(self) -> bool:
        if self.w.asyncio:
            return bool(self.loop.run_until_complete(self.w.arun_once(block_ms=5_000)))
        return self.w.run_once(block_ms=5_000)


@pytest.fixture
def one_worker(backend: Any, namespace: str, flavor: str, twin_loop: Any) -> Callable[..., _Worker]:
    return lambda **kw: _Worker(backend, namespace, flavor, twin_loop, **kw)


def _events(queue: Any, run_id: str) -> list[Any]:
    inner = getattr(queue, "wrapped", None)
    if inner is None:
        return list(queue.stream(run_id, block_ms=0))

    async def collect() -> list[Any]:
        return [e async for e in inner.stream(run_id, block_ms=0)]

    return queue._loop.run_until_complete(collect())  # type: ignore[no-any-return]


class TestCreate:
    def test_a_create_whose_reply_was_lost_returns_its_run_once(
        self, queue: Any, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        sent = _lose_batch(monkeypatch, scripts_of(queue)[S.LG_RUN_CREATE])
        run = queue.create("t", {"log": ["in"]})  # a thread new to this client: task, index and run in one batch
        assert len(sent) == 2  # lost, then re-sent
        assert run.status == "pending" and run.thread_id == "t"
        assert [r.run_id for r in queue.list("t")] == [run.run_id]
        assert queue.get(run.run_id).input == {"log": ["in"]}
        again = _lose_batch(monkeypatch, scripts_of(queue)[S.LG_RUN_CREATE])
        second = queue.create("t", {"log": ["2"]}, multitask_strategy="enqueue")  # a thread it knows
        assert len(again) == 2 and second.run_id != run.run_id
        assert [r.run_id for r in queue.list("t")] == [second.run_id, run.run_id]
        with pytest.raises(RunRejected):  # the re-send queued nothing more: reject sees two active runs
            queue.create("t", {"log": []})
        raw, keys = backend.sync_client(), queue._core.keys
        assert raw.llen(keys.runs("t").active) == 2

    @pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
    def test_a_re_sent_create_answers_the_runs_it_ended_and_their_id_entries_follow(
        self, queue: Any, backend: Any, monkeypatch: pytest.MonkeyPatch, strategy: str
    ) -> None:
        first = queue.create("t", {"log": ["a"]})
        _lose_batch(monkeypatch, scripts_of(queue)[S.LG_RUN_CREATE])
        second = queue.create("t", {"log": ["b"]}, multitask_strategy=strategy)
        raw, lookup = backend.sync_client(), queue._core.keys.run_lookup
        if strategy == "interrupt":
            assert queue.get(first.run_id).status == "interrupted"
            assert 0 < raw.pttl(lookup(first.run_id)) <= _runs_core.DEFAULT_RUN_TTL_MS + _runs_core.ID_ENTRY_GRACE_MS
        else:
            assert queue.get(first.run_id) is None and raw.exists(lookup(first.run_id)) == 0
        assert [r.run_id for r in queue.list("t") if not r.done] == [second.run_id]
        assert [e.event for e in _events(queue, second.run_id)] == []

    def test_a_create_sent_again_after_a_sealed_shard_returns_its_run_once(
        self, queue: Any, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The id entry's shard is sealed by a reshard while the thread's is not: the run is created,
        the batch meets the seal and is sent again once the seal is gone."""
        queue.create("warm-up", {})  # the namespace's layout, known from here on
        keys = queue._core.keys
        thread_tag = keys.task("t").checkpoint.split("}:")[0]
        rid = next(f"run-{i}" for i in range(1000) if keys.run_lookup(f"run-{i}").split("}:")[0] != thread_tag)
        seal = keys.run_lookup(rid).split("}:")[0] + "}:moved"

        class _Ids:
            @staticmethod
            def uuid4() -> str:
                return rid

        monkeypatch.setattr(_runs_core, "uuid", _Ids)
        raw = backend.sync_client()
        raw.set(seal, "sealed")
        unseal = threading.Timer(0.3, raw.delete, args=(seal,))
        unseal.start()
        try:
            run = queue.create("t", {"log": []})
        finally:
            unseal.join()
        assert run.run_id == rid and [r.run_id for r in queue.list("t")] == [rid]
        assert queue.get(rid).status == "pending"


class TestWorkerScripts:
    def test_a_re_sent_emit_streams_its_events_once(
        self, queue: Any, one_worker: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        w = one_worker()
        # "updates", not "custom": before Python 3.11 an asyncio worker's graph cannot stream "custom".
        run = queue.create("t", {"log": []}, stream_mode="updates")
        # The first emit with events (the empty one opens the attempt): its reply is lost.
        sent = _lose_when(w.scripts[S.LG_RUN_EMIT], monkeypatch, lambda argv: len(argv) > 3)
        assert w.run_once()
        assert len(sent) >= 2 and sent[0] == sent[1]
        assert queue.join(run.run_id, timeout_s=10).status == "success"
        evs = _events(queue, run.run_id)
        assert [e.event for e in evs] == ["metadata", "updates", "updates", "updates", "end"]
        assert [e.data for e in evs if e.event == "updates"] == [{n: {"log": [n]}} for n in "abc"]

    def test_a_re_sent_begin_is_one_attempt(self, queue: Any, one_worker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        w = one_worker(max_attempts=1)  # a phantom attempt would end the run as lost
        run = queue.create("t", {"log": []}, stream_mode="updates")
        sent = lose_first_reply(w.scripts[S.LG_RUN_BEGIN], monkeypatch)
        assert w.run_once()
        assert len(sent) == 2
        done = queue.join(run.run_id, timeout_s=10)
        assert (done.status, done.attempt, done.error) == ("success", 1, "")
        assert [e.event for e in _events(queue, run.run_id)] == ["metadata", "updates", "updates", "updates", "end"]

    def test_a_re_sent_finish_ends_the_run_once_and_the_worker_goes_on(
        self, queue: Any, one_worker: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        w = one_worker()
        first = queue.create("t", {"log": ["1"]})
        second = queue.create("t", {"log": ["2"]}, multitask_strategy="enqueue")
        sent = _lose_batch(monkeypatch, w.scripts[S.LG_RUN_FINISH])  # the end goes with its id entry's expiry
        assert w.run_once()
        assert len(sent) == 2
        assert w.w.finished == {"success": 1}  # not "lost": the worker knows its run ended
        assert queue.get(first.run_id).status == "success"
        assert [e.event for e in _events(queue, first.run_id)].count("end") == 1
        assert w.run_once()  # the thread was put back due: its next run goes at once
        assert queue.join(second.run_id, timeout_s=10).status == "success"


class TestFinishCore:
    """lg_run_finish's three ends under a lost reply, driven as a worker drives them."""

    @pytest.mark.parametrize("status", ["success", "pending"])
    def test_a_re_sent_end_or_hand_back_answers_as_the_first(
        self, queue: Any, monkeypatch: pytest.MonkeyPatch, status: str
    ) -> None:
        run = queue.create("t", {"log": []})
        core = queue._core
        begun = core_run(queue, core.begin("t", "tok-a", "w1", 3))
        finish = scripts_of(queue)[S.LG_RUN_FINISH]
        # A hand-back is one call; an end goes with its id entry's expiry, in one batch.
        sent = lose_first_reply(finish, monkeypatch) if status == "pending" else _lose_batch(monkeypatch, finish)
        assert core_run(queue, core.finish(begun.run, "tok-a", status)) == (1 if status == "pending" else 0)
        assert len(sent) == 2
        got = queue.get(run.run_id)
        assert got.status == status and got.attempt == 1
        assert [e.event for e in _events(queue, run.run_id)].count("end") == (0 if status == "pending" else 1)

    def test_a_re_sent_rollback_end_answers_as_the_first(self, queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        run = queue.create("t", {"log": []})
        core = queue._core
        core_run(queue, core.begin("t", "tok-a", "w1", 3))
        assert queue.cancel(run.run_id, action="rollback") is True  # asked of the running run
        handed = core_run(queue, core.begin("t", "tok-b", "w2", 3))  # its worker is gone: handed out to delete
        assert handed.rollback
        sent = _lose_batch(monkeypatch, scripts_of(queue)[S.LG_RUN_FINISH])
        assert core_run(queue, core.finish(handed.run, "", "interrupted", "rollback", gone=True)) == 0
        assert len(sent) == 2 and queue.get(run.run_id) is None


class TestQueueScripts:
    @pytest.mark.parametrize("action", ["interrupt", "rollback"])
    def test_a_re_sent_cancel_of_a_pending_run_is_still_true(
        self, queue: Any, monkeypatch: pytest.MonkeyPatch, action: str
    ) -> None:
        run = queue.create("t", {"log": []})
        sent = lose_first_reply(scripts_of(queue)[S.LG_RUN_CANCEL], monkeypatch)
        assert queue.cancel(run.run_id, action=action) is True
        assert len(sent) == 2
        if action == "interrupt":
            assert queue.get(run.run_id).status == "interrupted"
            assert [e.event for e in _events(queue, run.run_id)] == ["end"]
            assert queue.cancel(run.run_id) is False  # a new cancel (another nonce): it ended already
        else:
            assert queue.get(run.run_id) is None
            with pytest.raises(RunNotFound):  # a new cancel: the run is gone
                queue.cancel(run.run_id)

    def test_a_re_sent_cancel_of_a_running_run_that_ended_meanwhile_is_still_true(
        self, queue: Any, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        run = queue.create("t", {"log": []})
        core = queue._core
        begun = core_run(queue, core.begin("t", "tok-a", "w1", 3))
        worker_side = RunQueue(backend.sync_client(), namespace=namespace)

        def worker_ends_it() -> None:
            # Its worker saw the cancel at its next boundary and ended the run before the re-send landed.
            worker_side._run(worker_side._core.finish(begun.run, "tok-a", "interrupted", "interrupt"))

        sent = lose_first_reply(scripts_of(queue)[S.LG_RUN_CANCEL], monkeypatch, between=worker_ends_it)
        assert queue.cancel(run.run_id) is True
        assert len(sent) == 2
        got = queue.get(run.run_id)
        assert (got.status, got.error) == ("interrupted", "interrupt")
        assert queue.cancel(run.run_id) is False  # a new cancel: it had ended

    def test_a_re_sent_delete_is_still_true(self, queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        run = queue.create("t", {"log": []})
        assert queue.cancel(run.run_id) is True
        sent = lose_first_reply(scripts_of(queue)[S.LG_RUN_DELETE], monkeypatch)
        assert queue.delete(run.run_id) is True
        assert len(sent) == 2 and queue.get(run.run_id) is None and queue.list("t") == []
        with pytest.raises(RunNotFound):
            queue.delete(run.run_id)

    def test_a_re_sent_wake_wakes_once(self, queue: Any, backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        queue.create("t", {"log": []})
        raw, keys = backend.sync_client(), queue._core.keys
        raw.hset(keys.task("t").checkpoint, "status", "wait_user")  # as a worker leaves a thread it emptied
        rev = int(raw.hget(keys.task("t").checkpoint, "rev"))
        sent = lose_first_reply(scripts_of(queue)[S.LG_RUN_WAKE], monkeypatch)
        assert core_run(queue, queue._core.wake("t")) == 1
        assert len(sent) == 2
        h = raw.hgetall(keys.task("t").checkpoint)
        assert h[b"status"] == b"running" and int(h[b"rev"]) == rev + 1  # woken once

    def test_a_re_sent_id_entry_delete_of_a_refused_create_leaves_none(
        self, queue: Any, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        first = queue.create("t", {"log": []})
        refused = uuid.uuid4()

        class _Ids:
            @staticmethod
            def uuid4() -> uuid.UUID:
                return refused

        monkeypatch.setattr(_runs_core, "uuid", _Ids)
        sent = _lose_when(scripts_of(queue)[S.LG_RUN_INDEX], monkeypatch, lambda argv: argv == [b"", b""])
        with pytest.raises(RunRejected):
            queue.create("t", {"log": []})
        assert len(sent) == 2
        raw, lookup = backend.sync_client(), queue._core.keys.run_lookup
        assert raw.exists(lookup(str(refused))) == 0 and raw.exists(lookup(first.run_id)) == 1
