"""Attempts and parking (poison tasks): attempts counted per cycle in the claim scripts,
``max_attempts`` parks in the same script (after lapsed leases, SIGKILLed workers included, or
releases with a reason), ``claim`` raises ``TaskParked``, ``claim_next`` skips parked tasks,
``requeue`` runs one again, the Runner records the handler's exception and backs off, and the
CLI lists and requeues parked tasks."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from test_claim_next import assert_index_matches_state, ids_in_one_shard

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    AsyncRunner,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    InvalidArgument,
    NotParked,
    Runner,
    StepResult,
    TaskNotFound,
    TaskParked,
    WriteNotReplicated,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.keys import Keys
from redis_agentstate.wire import scripts as S

#: A lease short enough to lapse in a test, long enough for a loaded 2-core machine to claim under.
SHORT_MS = 150
LONG_MS = 30_000


def lapse(store: Any, task_id: str) -> None:
    """Wait until the task's claim has lapsed on the server clock (never a fixed sleep to assert on)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, rows = store._summaries([task_id])
        if not rows or rows[0]["lease_state"] != "live":
            return
        time.sleep(max(0.005, rows[0]["lease_remaining_ms"] / 1000 + 0.005))
    raise AssertionError(f"the lease of {task_id} never lapsed")


def claimable(store: Any, task_id: str) -> None:
    """Wait until a released task is due again (its ``after_ms`` passed on the server clock)."""
    lapse(store, task_id)


def in_ready(raw: Any, namespace: str, task_id: str) -> bool:
    return raw.zscore(Keys(namespace).task(task_id).ready, task_id) is not None


class TestAttempts:
    """Counting: fresh claims count, re-sends and commits do not (every backend, sync and async)."""

    def test_each_fresh_claim_of_a_cycle_is_an_attempt(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        assert store.load("t").attempts == 0
        for i in range(1, 4):
            cp = store.claim("t", 1, token=f"w{i}", lease_ms=SHORT_MS)
            assert (cp.attempts, cp.parked) == (i, False)
            if i > 1:
                # The attempt before lapsed without a commit or a release: that is its failure.
                assert cp.last_failure is not None
                assert f"w{i - 1}" in cp.last_failure and "expired without a commit" in cp.last_failure
            lapse(store, "t")
        assert store.load("t").attempts == 3

    def test_a_resent_claim_is_not_an_attempt(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(Checkpoint("t"))
        first = store.claim("t", 1, token="a", lease_ms=SHORT_MS)
        again = store.claim("t", 1, token="a", lease_ms=SHORT_MS)  # a re-send after a lost reply
        assert first.attempts == again.attempts == 1 and again.revision == first.revision
        # The same token claiming its own lapsed cycle again (nobody took it) is still that attempt.
        lapse(store, "t")
        third = store.claim("t", 1, token="a", lease_ms=LONG_MS)
        assert third.attempts == 1 and not third.parked
        assert store.list_parked() == []

    def test_a_commit_resets_the_count_and_the_failure(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=3)
        store.create(Checkpoint("t"))
        store.claim("t", 1, token="a", lease_ms=SHORT_MS)
        lapse(store, "t")
        cp = store.claim("t", 1, token="b", lease_ms=LONG_MS)
        assert cp.attempts == 2 and cp.last_failure
        cp.cycle_index = 1
        nxt = store.commit_and_claim(cp, token="b", expected_revision=cp.revision, lease_ms=LONG_MS)
        # The next cycle's claim made with the commit is its attempt 1.
        assert (nxt.attempts, nxt.last_failure) == (1, None)
        loaded = store.load("t")
        assert (loaded.attempts, loaded.last_failure, loaded.parked) == (1, None, False)
        nxt.cycle_index = 2
        assert store.commit(nxt, token="b", expected_revision=nxt.revision)
        loaded = store.load("t")
        assert (loaded.cycle_index, loaded.attempts, loaded.last_failure) == (2, 0, None)
        assert store.claim("t", 3, token="c", lease_ms=LONG_MS).attempts == 1

    def test_a_release_without_a_reason_gives_the_attempt_back(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(Checkpoint("t"))
        for i in range(3):  # a worker shutting down three times is no poison
            cp = store.claim("t", 1, token=f"w{i}", lease_ms=LONG_MS)
            assert cp.attempts == 1
            assert store.release("t", token=f"w{i}", expected_revision=cp.revision)
            claimable(store, "t")
        assert store.load("t").attempts == 0 and store.list_parked() == []


class TestParking:
    """Parking in the same script, and what a parked task is (every backend, sync and async)."""

    def test_parked_after_max_attempts_of_lapsed_leases(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=2)
        store.create(Checkpoint("t"))
        held = []
        for i in range(2):
            held.append(store.claim("t", 1, token=f"w{i}", lease_ms=SHORT_MS))
            lapse(store, "t")
        with pytest.raises(TaskParked) as info:
            store.claim("t", 1, token="w2", lease_ms=LONG_MS)
        assert isinstance(info.value, ClaimRejected)
        assert (info.value.task_id, info.value.attempts) == ("t", 2)
        assert "w1" in info.value.reason and "expired without a commit" in info.value.reason
        cp = store.load("t")
        assert (cp.parked, cp.attempts, cp.status, cp.cycle_index) == (True, 2, AgentStatus.RUNNING, 0)
        assert cp.claim_token is None and cp.last_failure == info.value.reason
        assert store.list_parked() == ["t"] and not in_ready(raw, store.namespace, "t")
        # The last holder's late commit is fenced out: parking moved the revision on.
        late = held[-1]
        late.cycle_index = 1
        assert not store.commit(late, token="w1", expected_revision=late.revision)
        # Still parked, and claim keeps saying so (nothing written).
        with pytest.raises(TaskParked):
            store.claim("t", 1, token="w3", lease_ms=LONG_MS)
        assert store.load("t").revision == cp.revision
        assert_index_matches_state(raw, store.namespace)

    def test_parked_by_the_release_of_the_last_attempt(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=2)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="a", lease_ms=LONG_MS)
        assert store.release("t", token="a", expected_revision=cp.revision, reason="ValueError: first")
        loaded = store.load("t")
        assert (loaded.attempts, loaded.last_failure, loaded.parked) == (1, "ValueError: first", False)
        claimable(store, "t")
        cp = store.claim("t", 1, token="b", lease_ms=LONG_MS)
        # Released, not lapsed: the recorded reason stands.
        assert (cp.attempts, cp.last_failure) == (2, "ValueError: first")
        assert store.release("t", token="b", expected_revision=cp.revision, reason="ValueError: second")
        loaded = store.load("t")
        assert (loaded.parked, loaded.attempts, loaded.last_failure) == (True, 2, "ValueError: second")
        assert store.list_parked() == ["t"] and not in_ready(raw, store.namespace, "t")
        # A re-send of that release (a lost reply) still reports success and writes nothing.
        assert store.release("t", token="b", expected_revision=cp.revision, reason="ValueError: second")
        assert store.load("t").revision == loaded.revision
        # Not this token's claim any more: refused.
        assert not store.release("t", token="zz", expected_revision=loaded.revision, reason="x")
        with pytest.raises(TaskParked) as info:
            store.claim("t", 1, token="c", lease_ms=LONG_MS)
        assert info.value.reason == "ValueError: second"
        assert_index_matches_state(raw, store.namespace)

    def test_a_release_after_the_lease_lapsed_still_records_the_failure(self, make: Callable[..., Any]) -> None:
        """Nobody claimed since: the claim is still the holder's, so its reason (not "expired") is kept."""
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=3)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="slow", lease_ms=SHORT_MS)
        lapse(store, "t")
        assert store.release("t", token="slow", expected_revision=cp.revision, reason="TimeoutError: model")
        claimable(store, "t")
        nxt = store.claim("t", 1, token="next", lease_ms=LONG_MS)
        assert (nxt.attempts, nxt.last_failure) == (2, "TimeoutError: model")

    def test_claim_next_skips_parked_tasks_and_serves_the_healthy(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        # One shard: the poison tasks sit at the head of the very index the healthy ones queue in.
        poison, lapser, *healthy = ids_in_one_shard(namespace, 6)
        for tid in (poison, lapser, *healthy):
            store.create(Checkpoint(tid))
        cp = store.claim(poison, 1, token="p", lease_ms=LONG_MS)
        store.release(poison, token="p", expected_revision=cp.revision, reason="RuntimeError: poison")
        store.claim(lapser, 1, token="l", lease_ms=SHORT_MS)  # dies holding it
        lapse(store, lapser)
        served = []
        while (nxt := store.claim_next(token=f"w{len(served)}", lease_ms=LONG_MS)) is not None:
            served.append(nxt.task_id)
            nxt.cycle_index = 1
            nxt.status, nxt.terminal_result = AgentStatus.COMPLETED, "ok"
            assert store.commit(nxt, token=f"w{len(served) - 1}", expected_revision=nxt.revision)
        assert sorted(served) == sorted(healthy)
        # claim_next met the lapsed one (its next claim would be attempt 2) and parked it.
        assert store.list_parked() == sorted([poison, lapser])
        parked = store.load(lapser)
        assert parked.parked and parked.attempts == 1 and "expired without a commit" in parked.last_failure
        assert not in_ready(raw, namespace, poison) and not in_ready(raw, namespace, lapser)
        assert store.claim_next(token="again", lease_ms=LONG_MS) is None
        assert_index_matches_state(raw, namespace)

    def test_requeue_runs_a_parked_task_again(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(Checkpoint("t", cycle_index=4, shared_state={"k": 1}))
        cp = store.claim("t", 5, token="a", lease_ms=LONG_MS)
        store.release("t", token="a", expected_revision=cp.revision, reason="KeyError: 'x'")
        assert store.list_parked() == ["t"]
        assert store.requeue("t") is None
        loaded = store.load("t")
        # Exactly as it was, runnable; the last failure is kept for the operator until a commit.
        assert (loaded.parked, loaded.attempts, loaded.status, loaded.cycle_index) == (
            False, 0, AgentStatus.RUNNING, 4)  # fmt: skip
        assert loaded.shared_state == {"k": 1} and loaded.last_failure == "KeyError: 'x'"
        assert store.list_parked() == [] and in_ready(raw, store.namespace, "t")
        nxt = store.claim_next(token="b", lease_ms=LONG_MS)
        assert (nxt.task_id, nxt.claimed_cycle, nxt.attempts) == ("t", 5, 1)
        with pytest.raises(NotParked) as info:
            store.requeue("t")
        assert info.value.task_id == "t" and info.value.status == "running"
        with pytest.raises(TaskNotFound):
            store.requeue("missing")
        with pytest.raises(InvalidArgument):
            store.requeue("")
        assert_index_matches_state(raw, store.namespace)

    def test_finalize_save_and_delete_take_a_task_out_of_parking(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        for tid in ("f", "s", "d"):
            store.create(Checkpoint(tid))
            cp = store.claim(tid, 1, token="a", lease_ms=LONG_MS)
            store.release(tid, token="a", expected_revision=cp.revision, reason="boom")
        assert store.list_parked() == ["d", "f", "s"]
        # An operator gives up on one: nobody holds it, so it may be finalized.
        cp = store.load("f")
        cp.status, cp.terminal_result = AgentStatus.FAILED, {"error": cp.last_failure}
        assert store.finalize(cp, expected_revision=cp.revision)
        store.save(Checkpoint("s", cycle_index=0))
        store.delete("d")
        assert store.list_parked() == []
        f, s = store.load("f"), store.load("s")
        assert f.is_terminal and not f.parked and f.attempts == 0
        assert (s.parked, s.attempts, s.last_failure) == (False, 0, None) and in_ready(raw, store.namespace, "s")
        assert_index_matches_state(raw, store.namespace)

    @pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
    def test_bad_max_attempts_is_refused(self, make: Callable[..., Any], bad: Any) -> None:
        with pytest.raises(InvalidArgument, match="max_attempts"):
            make(CheckpointStore, AsyncCheckpointStore, max_attempts=bad)

    def test_bad_release_arguments_write_nothing(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="a", lease_ms=LONG_MS)
        for kw in ({"reason": 42}, {"reason": b"bytes"}, {"after_ms": 0}, {"after_ms": True}):
            with pytest.raises(InvalidArgument):
                store.release("t", token="a", expected_revision=cp.revision, **kw)
        after = store.load("t")
        assert (after.revision, after.claim_token, after.attempts, after.parked) == (cp.revision, "a", 1, False)

    def test_a_long_reason_is_cut_not_refused(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="a", lease_ms=LONG_MS)
        assert store.release("t", token="a", expected_revision=cp.revision, reason="é" * 5000)
        why = store.load("t").last_failure
        assert why.endswith("...") and len(why.encode()) <= 1024 and why.startswith("éé")

    def test_parking_is_off_by_default(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        for i in range(5):
            cp = store.claim("t", 1, token=f"w{i}", lease_ms=LONG_MS)
            assert store.release("t", token=f"w{i}", expected_revision=cp.revision, reason="boom")
            claimable(store, "t")
        loaded = store.load("t")
        assert (loaded.parked, loaded.attempts) == (False, 5) and store.list_parked() == []

    def test_corrupt_attempt_fields_are_named(self, make: Callable[..., Any], raw: Any) -> None:
        from redis_agentstate import CorruptState

        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=3)
        store.create(Checkpoint("t"))
        raw.hset(Keys(store.namespace).task("t").checkpoint, "att", "-1")
        with pytest.raises(CorruptState):
            store.claim("t", 1, token="a", lease_ms=LONG_MS)
        _, rows = store._summaries(["t"])
        assert rows[0]["status"] == "corrupt" and "att" in rows[0]["corrupt"]


def test_requeue_resent_after_a_lost_reply_succeeds(backend: Any, namespace: str) -> None:
    """The same requeue call (same nonce) sent twice: the second finds it done, not NotParked."""
    store = CheckpointStore(backend.sync_client(), namespace=namespace, max_attempts=1)
    store.create(Checkpoint("t"))
    cp = store.claim("t", 1, token="a", lease_ms=LONG_MS)
    store.release("t", token="a", expected_revision=cp.revision, reason="boom")
    call = next(store._core.requeue("t"))
    script = store._scripts[S.REQUEUE]
    first = script(keys=call.keys, args=call.args, client=store.client)
    again = script(keys=call.keys, args=call.args, client=store.client)
    assert (first[0], again[0]) == (S.Reply.DONE, S.Reply.DONE_BEFORE)
    other = next(store._core.requeue("t"))  # a new call (new nonce): not parked any more
    assert script(keys=other.keys, args=other.args, client=store.client)[0] == S.Reply.NOT_PARKED


# ---- leases: the with block's exception is the failure ---------------------------------------------


def test_lease_released_on_an_exception_records_it_and_parks(sync_store: CheckpointStore) -> None:
    store = CheckpointStore(sync_store.client, namespace=sync_store.namespace, max_attempts=2)
    store.create(Checkpoint("t"))
    for i in range(2):
        with pytest.raises(ValueError), store.lease("t", 1, lease_ms=LONG_MS) as lease:
            raise ValueError(f"bad input {i}")
        claimable(store, "t")
    assert lease.parked
    cp = store.load("t")
    assert (cp.parked, cp.attempts, cp.last_failure) == (True, 2, "ValueError: bad input 1")
    with pytest.raises(TaskParked), store.lease("t", 1, lease_ms=LONG_MS):
        pass


def test_a_lease_left_on_a_backend_error_gives_its_attempt_back(sync_store: CheckpointStore) -> None:
    store = CheckpointStore(sync_store.client, namespace=sync_store.namespace, max_attempts=1)
    store.create(Checkpoint("t"))
    for _ in range(3):
        with pytest.raises(WriteNotReplicated), store.lease("t", 1, lease_ms=LONG_MS):
            flaky_backend(Checkpoint("t"))
        claimable(store, "t")
    cp = store.load("t")
    assert (cp.parked, cp.attempts, cp.last_failure) == (False, 0, None)


async def test_an_async_lease_left_on_a_backend_error_gives_its_attempt_back(
    async_store: AsyncCheckpointStore,
) -> None:
    store = AsyncCheckpointStore(async_store.client, namespace=async_store.namespace, max_attempts=1)
    await store.create(Checkpoint("t"))
    for _ in range(3):
        with pytest.raises(WriteNotReplicated):
            async with store.lease("t", 1, lease_ms=LONG_MS):
                flaky_backend(Checkpoint("t"))
        await asyncio.sleep(0.01)  # released with after_ms=1
    cp = await store.load("t")
    assert (cp.parked, cp.attempts, cp.last_failure) == (False, 0, None)


async def test_async_lease_release_with_a_reason_parks(async_store: AsyncCheckpointStore) -> None:
    store = AsyncCheckpointStore(async_store.client, namespace=async_store.namespace, max_attempts=1)
    await store.create(Checkpoint("t"))
    async with store.lease("t", 1, lease_ms=LONG_MS) as lease:
        assert await lease.release(reason="TimeoutError: model did not answer")
    assert lease.parked
    cp = await store.load("t")
    assert (cp.parked, cp.last_failure) == (True, "TimeoutError: model did not answer")
    assert await store.create(Checkpoint("t2"))
    with pytest.raises(ValueError):
        async with store.lease("t2", 1, lease_ms=LONG_MS):
            raise ValueError("boom")
    cp2 = await store.load("t2")
    assert (cp2.parked, cp2.last_failure) == (True, "ValueError: boom")
    assert await store.list_parked() == ["t", "t2"]


# ---- the Runner ----------------------------------------------------------------------------------


def poison_or_step(cp: Checkpoint) -> StepResult:
    if cp.task_id.startswith("poison"):
        raise RuntimeError(f"cannot handle {cp.task_id}")
    cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
    return StepResult(cp, done=True)


def test_runner_parks_a_poison_task_with_its_exception(sync_store: CheckpointStore) -> None:
    store = CheckpointStore(sync_store.client, namespace=sync_store.namespace, max_attempts=3)
    for tid in ("poison-1", "ok-1", "ok-2"):
        store.create(Checkpoint(tid))
    runner = Runner(store, poison_or_step, handle_signals=False, idle_min_ms=5, idle_max_ms=20,
                    failure_delay_ms=5, failure_delay_max_ms=20)  # fmt: skip
    deadline = time.monotonic() + 30
    while store.list_parked() != ["poison-1"] and time.monotonic() < deadline:
        runner.run(stop_when_idle=True)
        time.sleep(0.01)
    cp = store.load("poison-1")
    assert (cp.parked, cp.attempts) == (True, 3)
    assert cp.last_failure == "RuntimeError: cannot handle poison-1"
    assert (runner.stats.failed, runner.stats.parked, runner.stats.finalized) == (3, 1, 2)
    assert store.load("ok-1").is_terminal and store.load("ok-2").is_terminal
    assert runner.run(stop_when_idle=True).claimed == runner.stats.claimed  # nothing runnable left


async def test_async_runner_parks_a_poison_task(async_store: AsyncCheckpointStore) -> None:
    store = AsyncCheckpointStore(async_store.client, namespace=async_store.namespace, max_attempts=2)
    for tid in ("poison-1", "ok-1"):
        await store.create(Checkpoint(tid))

    async def handler(cp: Checkpoint) -> StepResult:
        return poison_or_step(cp)

    runner = AsyncRunner(store, handler, handle_signals=False, idle_min_ms=5, idle_max_ms=20,
                         failure_delay_ms=5, failure_delay_max_ms=20)  # fmt: skip
    deadline = time.monotonic() + 30
    while await store.list_parked() != ["poison-1"] and time.monotonic() < deadline:
        await runner.run(stop_when_idle=True)
        await asyncio.sleep(0.01)
    cp = await store.load("poison-1")
    assert (cp.parked, cp.attempts, cp.last_failure) == (True, 2, "RuntimeError: cannot handle poison-1")
    assert runner.stats.parked == 1 and (await store.load("ok-1")).is_terminal


def flaky_backend(cp: Checkpoint) -> StepResult:
    """A handler whose own Redis writes fail (a failover): the backend's fault, never the task's."""
    raise WriteNotReplicated("task 'x': 0 of 1 replica(s) acknowledged within 500 ms", acknowledged=0, required=1)


def test_runner_does_not_count_backend_errors_as_attempts(sync_store: CheckpointStore) -> None:
    store = CheckpointStore(sync_store.client, namespace=sync_store.namespace, max_attempts=2)
    store.create(Checkpoint("t"))
    runner = Runner(store, flaky_backend, handle_signals=False, idle_min_ms=5, idle_max_ms=20,
                    failure_delay_ms=5, failure_delay_max_ms=20)  # fmt: skip
    deadline = time.monotonic() + 30
    while runner.stats.failed < 5 and time.monotonic() < deadline:
        runner.run(stop_when_idle=True)
        time.sleep(0.01)
    cp = store.load("t")
    assert runner.stats.failed >= 5 and runner.stats.parked == 0
    assert (cp.parked, cp.attempts, cp.last_failure) == (False, 0, None)  # each attempt given back
    assert store.list_parked() == []


async def test_async_runner_does_not_count_backend_errors_as_attempts(async_store: AsyncCheckpointStore) -> None:
    store = AsyncCheckpointStore(async_store.client, namespace=async_store.namespace, max_attempts=2)
    await store.create(Checkpoint("t"))

    async def handler(cp: Checkpoint) -> StepResult:
        return flaky_backend(cp)

    runner = AsyncRunner(store, handler, handle_signals=False, idle_min_ms=5, idle_max_ms=20,
                         failure_delay_ms=5, failure_delay_max_ms=20)  # fmt: skip
    deadline = time.monotonic() + 30
    while runner.stats.failed < 5 and time.monotonic() < deadline:
        await runner.run(stop_when_idle=True)
        await asyncio.sleep(0.01)
    cp = await store.load("t")
    assert runner.stats.failed >= 5 and runner.stats.parked == 0
    assert (cp.parked, cp.attempts, cp.last_failure) == (False, 0, None)


def test_runner_failure_delay_backs_off_exponentially_with_jitter_and_a_cap(sync_store: CheckpointStore) -> None:
    runner = Runner(sync_store, poison_or_step, handle_signals=False, failure_delay_ms=100,
                    failure_delay_max_ms=1_000)  # fmt: skip
    # Never sooner than failure_delay_ms; doubling; at the cap, between half of it and all of it.
    for attempts, low, high in ((1, 100, 200), (2, 200, 400), (3, 400, 800), (4, 500, 1_000), (50, 500, 1_000)):
        delays = [runner._failure_delay_ms(attempts) for _ in range(200)]
        assert all(low <= d <= high for d in delays), (attempts, min(delays), max(delays))
        assert len(set(delays)) > 10, "no jitter"
    # The cap defaults to a minute, or to failure_delay_ms when that is longer.
    assert Runner(sync_store, poison_or_step, handle_signals=False).failure_delay_max_ms == 60_000
    assert (
        Runner(sync_store, poison_or_step, handle_signals=False, failure_delay_ms=90_000).failure_delay_max_ms == 90_000
    )
    for bad in ({"failure_delay_max_ms": 50, "failure_delay_ms": 100}, {"failure_delay_max_ms": True},
                {"failure_delay_max_ms": 0}):  # fmt: skip
        with pytest.raises(InvalidArgument, match="failure_delay"):
            Runner(sync_store, poison_or_step, handle_signals=False, **bad)


# ---- SIGKILL: the takeover after a dead worker counts --------------------------------------------

WORKER = textwrap.dedent(
    """
    import sys, time, redis
    from redis_agentstate import CheckpointStore, Runner
    url, ns = sys.argv[1], sys.argv[2]
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns, max_attempts=int(sys.argv[3]))

    def handler(cp):
        print("CLAIMED", cp.task_id, cp.attempts, flush=True)
        time.sleep(3600)  # hangs holding the claim until SIGKILLed

    Runner(store, handler, lease_ms=600, idle_min_ms=5, idle_max_ms=20).run()
    """
)


@pytest.mark.real
def test_sigkilled_workers_park_a_poison_task(private_server: Any) -> None:
    """Each worker claims the task and is SIGKILLed mid-cycle: nothing runs at the kill, yet the
    next claim counts the dead worker's attempt, and after max_attempts the task is parked."""
    max_attempts, ns = 2, "sigkill"
    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace=ns, max_attempts=max_attempts)
    store.create(Checkpoint("poison"))
    seen = []
    for _ in range(max_attempts):
        proc = subprocess.Popen([sys.executable, "-c", WORKER, private_server.url, ns, str(max_attempts)],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("CLAIMED poison"), line
            seen.append(int(line.split()[2]))
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lapse(store, "poison")
    assert seen == [1, 2]
    # The next worker's claim_next finds attempt 3 would exceed max_attempts=2: parked, nothing served.
    assert store.claim_next(token="survivor", lease_ms=LONG_MS) is None
    cp = store.load("poison")
    assert (cp.parked, cp.attempts, cp.claim_token) == (True, 2, None)
    assert "expired without a commit" in cp.last_failure
    assert store.list_parked() == ["poison"]
    client.close()


# ---- CLI: list --parked and requeue -----------------------------------------------------------------


@pytest.fixture
def parked_tasks(private_server: Any) -> tuple[str, str]:
    url, ns = private_server.url, "parkcli"
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns, max_attempts=1)
    for tid in ("healthy", "poison-a", "poison-b"):
        store.create(Checkpoint(tid, cycle_index=2))
    for tid, why in (("poison-a", "RuntimeError: cannot parse the tool call"), ("poison-b", "KeyError: 'user'")):
        cp = store.claim(tid, 3, token="w", lease_ms=LONG_MS)
        store.release(tid, token="w", expected_revision=cp.revision, reason=why)
    store.client.close()
    return url, ns


def test_cli_list_parked_text_and_json(parked_tasks: tuple[str, str], capsys: Any) -> None:
    url, ns = parked_tasks
    assert cli_mod.main(["list", "--parked", "--url", url, "--namespace", ns]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["TASK", "STATUS", "AT", "CYCLE", "ATTEMPTS", "LAST", "FAILURE"]
    assert out[1].split()[:4] == ["poison-a", "running", "3", "1"]
    assert out[1].endswith("RuntimeError: cannot parse the tool call")
    assert out[2].split()[:4] == ["poison-b", "running", "3", "1"] and out[2].endswith("KeyError: 'user'")
    assert "healthy" not in "\n".join(out) and "agentstate requeue TASK" in out[-1]
    assert cli_mod.main(["list", "--parked", "--url", url, "--namespace", ns, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["task_id"], r["parked"], r["attempts"], r["last_failure"]) for r in rows] == [
        ("poison-a", True, 1, "RuntimeError: cannot parse the tool call"),
        ("poison-b", True, 1, "KeyError: 'user'"),
    ]
    assert cli_mod.main(["list", "--parked", "--limit", "1", "--url", url, "--namespace", ns]) == 0
    assert "and 1 more parked task(s)" in capsys.readouterr().out
    # The plain list marks them.
    assert cli_mod.main(["list", "--url", url, "--namespace", ns]) == 0
    listing = capsys.readouterr().out
    assert "(parked)" in listing.split("poison-a")[1].splitlines()[0]
    assert "(parked)" not in listing.split("healthy")[1].splitlines()[0]
    # stats counts them apart: parked tasks are not claimable.
    assert cli_mod.main(["stats", "--url", url, "--namespace", ns, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["parked"], data["claimable_now"], data["by_status"]) == (2, 1, {"running": 3})


def test_cli_requeue(parked_tasks: tuple[str, str], capsys: Any) -> None:
    url, ns = parked_tasks
    assert cli_mod.main(["requeue", "poison-a", "--url", url, "--namespace", ns]) == 0
    out = capsys.readouterr().out
    assert out.startswith("requeued poison-a: runnable again at cycle 3 (it had 1 attempt(s)")
    assert cli_mod.main(["requeue", "poison-b", "--url", url, "--namespace", ns, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "task_id": "poison-b", "requeued": True, "attempts": 1, "last_failure": "KeyError: 'user'"}  # fmt: skip
    assert cli_mod.main(["list", "--parked", "--url", url, "--namespace", ns, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    # Not parked, missing: one line, exit status 1, the error's type.
    assert cli_mod.main(["requeue", "healthy", "--url", url, "--namespace", ns, "--json"]) == 1
    err = json.loads(capsys.readouterr().err)["error"]
    assert err["type"] == "NotParked" and "not parked" in err["message"]
    assert cli_mod.main(["requeue", "nope", "--url", url, "--namespace", ns]) == 1
    err_line = capsys.readouterr().err
    assert len(err_line.splitlines()) == 1 and "no task 'nope'" in err_line
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    assert store.claim_next(token="w", lease_ms=LONG_MS) is not None
    store.client.close()
