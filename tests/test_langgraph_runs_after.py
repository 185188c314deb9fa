"""A run created with a delay (``RunQueue.create(after_ms=...)``, ``after_seconds`` of LangGraph's
API): it exists, pending, from its create, and no worker begins it before its time
(``lg_run_create.lua`` records when, ``lg_run_begin.lua`` answers ``later`` until then and the worker
puts the thread's task off that long). A lost reply of either script, re-sent, applies once; two
workers racing for the thread begin it once, not early.

fakeredis, a real redis-server and the local Cluster (``backend``), sync and async (``flavor``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from faults.replies import lose_first_reply
from test_langgraph_runs_resend import _lose_batch, _Worker, scripts_of

from redis_agentstate import CheckpointStore
from redis_agentstate.errors import InvalidArgument
from redis_agentstate.langgraph import AsyncRunQueue, RunQueue
from redis_agentstate.langgraph import scripts as S
from redis_agentstate.langgraph.runs import queue_namespace

DELAY_MS = 1_500


@pytest.fixture
def queue(make: Callable[..., Any]) -> Any:
    return make(RunQueue, AsyncRunQueue)


@pytest.fixture
def one_worker(backend: Any, namespace: str, flavor: str, twin_loop: Any) -> Callable[..., _Worker]:
    return lambda **kw: _Worker(backend, namespace, flavor, twin_loop, **kw)


def test_a_delayed_run_exists_at_once_and_starts_no_earlier(
    queue: Any, one_worker: Any, backend: Any, namespace: str
) -> None:
    w = one_worker()
    run = queue.create("t", {"log": []}, after_ms=DELAY_MS)
    assert run.status == "pending" and run.not_before_ms == run.created_at_ms + DELAY_MS
    assert queue.get(run.run_id).not_before_ms == run.not_before_ms
    # A worker that takes the thread now begins nothing: the thread is put off until the run's time.
    assert w.run_once()
    got = queue.get(run.run_id)
    assert (got.status, got.attempt, got.started_at_ms) == ("pending", 0, None)
    task = CheckpointStore(backend.sync_client(), namespace=queue_namespace(namespace)).load("t")
    assert task.due_at_ms is not None and task.due_at_ms >= run.not_before_ms - 5
    # Then it runs, once, at its time.
    assert w.run_once()
    done = queue.join(run.run_id, timeout_s=10)
    assert (done.status, done.attempt) == ("success", 1)
    assert done.started_at_ms is not None and done.started_at_ms >= run.not_before_ms


def test_bad_delays_are_refused_before_anything_is_written(queue: Any) -> None:
    for bad in (-1, 1.5, "1", True, 10**15):
        with pytest.raises(InvalidArgument):
            queue.create("t", {"log": []}, after_ms=bad)
    assert queue.list("t") == []


def test_a_re_sent_delayed_create_keeps_its_time(queue: Any, backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _lose_batch(monkeypatch, scripts_of(queue)[S.LG_RUN_CREATE])
    run = queue.create("t", {"log": []}, after_ms=DELAY_MS)
    assert len(sent) == 2  # lost, then re-sent
    assert [r.run_id for r in queue.list("t")] == [run.run_id]
    stored = queue.get(run.run_id)
    # The re-send answered the first execution's run: its time was not moved on.
    assert stored.not_before_ms == run.not_before_ms == stored.created_at_ms + DELAY_MS


def test_a_re_sent_later_begin_writes_nothing(queue: Any, one_worker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    w = one_worker(max_attempts=1)  # a phantom attempt would end the run as lost
    run = queue.create("t", {"log": []}, after_ms=DELAY_MS)
    sent = lose_first_reply(w.scripts[S.LG_RUN_BEGIN], monkeypatch)
    assert w.run_once()
    assert len(sent) == 2
    got = queue.get(run.run_id)
    assert (got.status, got.attempt) == ("pending", 0)
    assert w.run_once()
    done = queue.join(run.run_id, timeout_s=10)
    assert (done.status, done.attempt, done.error) == ("success", 1, "")


def test_two_workers_race_for_a_delayed_run_it_runs_once_not_early(
    queue: Any, one_worker: Any, backend: Any, flavor: str, twin_loop: Any
) -> None:
    run = queue.create("t", {"log": []}, after_ms=DELAY_MS)
    workers = [one_worker(), one_worker()]
    if flavor == "async":
        # Two asyncio workers on one loop, each taking turns as a server's tasks do.
        async def race() -> None:
            async def go(w: Any) -> None:
                while (await w.queue.get(run.run_id)).status == "pending" or not w.finished:
                    if sum(x.w.finished.get("success", 0) for x in workers):
                        return
                    await w.arun_once(block_ms=500)

            await asyncio.gather(*(go(x.w) for x in workers))

        twin_loop.run_until_complete(asyncio.wait_for(race(), 15))
        done = queue.join(run.run_id, timeout_s=10)
    else:
        stop = threading.Event()

        def go(w: _Worker) -> None:
            while not stop.is_set():
                w.w.run_once(block_ms=500)

        threads = [threading.Thread(target=go, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        try:
            done = queue.join(run.run_id, timeout_s=15)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
    assert (done.status, done.attempt) == ("success", 1)
    assert done.started_at_ms is not None and done.started_at_ms >= run.not_before_ms
    assert sum(w.w.finished.get("success", 0) for w in workers) == 1
