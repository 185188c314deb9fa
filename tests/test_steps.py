"""Durable steps (issue 25): ``Lease.step`` runs a side effect once per (task, cycle, name).

On fakeredis, a real redis-server and the local Cluster (the ``backend`` fixture), sync and
async: a result survives a crash of the attempt that recorded it, is dropped when the cycle is
written, a step that raised is not recorded, a frozen holder woken after a takeover can neither
record nor read, and bad input is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    Checkpoint,
    CheckpointStore,
    CorruptState,
    InvalidArgument,
    LeaseLost,
)
from redis_agentstate.codec import encode
from redis_agentstate.core.steps import MAX_STEP_NAME_BYTES
from redis_agentstate.keys import Keys
from redis_agentstate.lease import Clock, Lease
from redis_agentstate.runner import AsyncCycle, AsyncRunner, Cycle, Runner, StepResult, takes_cycle


class Counter:
    """A side effect whose runs are counted (the stand-in for an LLM call or an email)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, prompt: str, *, n: int = 1) -> dict[str, Any]:
        self.calls.append(prompt)
        return {"answer": prompt.upper() * n, "pair": (1, 2)}

    async def acall(self, prompt: str, *, n: int = 1) -> dict[str, Any]:
        await asyncio.sleep(0)
        return self(prompt, n=n)


def steps_key(store: Any, task_id: str) -> str:
    return Keys(store.namespace).task(task_id).steps


def next_cycle(cp: Checkpoint) -> Checkpoint:
    cp.cycle_index = cp.claimed_cycle or cp.cycle_index + 1
    return cp


class Crash(Exception):
    """The attempt dies after its step (a SIGKILL, as the retry sees it)."""


# ---- memoized across attempts ---------------------------------------------------------------------


def test_a_step_is_not_run_again_after_the_attempt_crashed(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("t"))
    llm = Counter()
    with pytest.raises(Crash), sync_store.lease("t", 1, lease_ms=5_000) as lease:
        first = lease.step("llm", llm, "hi", n=2)
        assert first == {"answer": "HIHI", "pair": [1, 2]}  # as the codec reads it back, also the first time
        raise Crash  # released with the reason: the cycle is claimable again
    assert raw.hlen(steps_key(sync_store, "t")) == 1
    time.sleep(0.01)  # the release makes the cycle claimable 1 ms from now
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        assert lease.step("llm", llm, "hi", n=2) == first
        assert lease.step("other", llm, "yo") == {"answer": "YO", "pair": [1, 2]}
        lease.commit(next_cycle(lease.checkpoint))
    assert llm.calls == ["hi", "yo"]


def test_a_step_survives_a_lapsed_lease_taken_over_by_another_worker(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    llm = Counter()
    dead = Lease(sync_store, "t", 1, token="dead", lease_ms=300, release_on_exit=False)
    with dead:
        assert dead.step("llm", llm, "a") == {"answer": "A", "pair": [1, 2]}
        dead._keeper.wake()  # the worker dies: no renewal, no release
    time.sleep(0.45)
    with sync_store.lease("t", 1, token="next", lease_ms=5_000) as lease:
        assert lease.step("llm", llm, "a") == {"answer": "A", "pair": [1, 2]}
        assert lease.step_key("llm") == dead.step_key("llm")  # the same for every attempt at the cycle
    assert llm.calls == ["a"]


async def test_async_step_is_memoized_across_attempts(async_store: AsyncCheckpointStore, raw: Any) -> None:
    await async_store.create(Checkpoint("t"))
    llm = Counter()
    with pytest.raises(Crash):
        async with async_store.lease("t", 1, lease_ms=5_000) as lease:
            assert await lease.step("llm", llm.acall, "hi") == {"answer": "HI", "pair": [1, 2]}
            raise Crash
    await asyncio.sleep(0.01)
    async with async_store.lease("t", 1, lease_ms=5_000) as lease:
        assert await lease.step("llm", llm.acall, "hi") == {"answer": "HI", "pair": [1, 2]}
        assert await lease.step("sync fn", llm, "x") == {"answer": "X", "pair": [1, 2]}
        await lease.commit(next_cycle(lease.checkpoint))
    assert llm.calls == ["hi", "x"]
    assert not raw.exists(steps_key(async_store, "t"))


# ---- one cycle's results, never another's -----------------------------------------------------------


def test_results_are_dropped_when_the_cycle_commits(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("t"))
    llm = Counter()
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        lease.step("llm", llm, "one")
        lease.commit(next_cycle(lease.checkpoint))
    assert not raw.exists(steps_key(sync_store, "t"))
    with sync_store.lease("t", 2, lease_ms=5_000) as lease:
        assert lease.step("llm", llm, "two") == {"answer": "TWO", "pair": [1, 2]}  # run again: a new cycle
        nxt = lease.commit_and_claim(next_cycle(lease.checkpoint))
    assert nxt is not None and not raw.exists(steps_key(sync_store, "t"))
    with nxt:
        nxt.step("llm", llm, "three")
        cp = next_cycle(nxt.checkpoint)
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
        nxt.finalize(cp)
    assert not raw.exists(steps_key(sync_store, "t"))
    assert llm.calls == ["one", "two", "three"]


def test_a_fenced_out_commit_keeps_them(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        lease.step("s", Counter(), "x")
        cp = next_cycle(lease.checkpoint)
        assert not sync_store.commit(cp, token="someone else", expected_revision=lease.revision)
    assert raw.hlen(steps_key(sync_store, "t")) == 1


def test_delete_finalize_and_acknowledge_remove_them(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("d"))
    with pytest.raises(Crash), sync_store.lease("d", 1, lease_ms=5_000) as lease:
        lease.step("s", Counter(), "x")
        raise Crash
    assert raw.exists(steps_key(sync_store, "d"))
    sync_store.delete("d")
    assert not raw.exists(steps_key(sync_store, "d"))
    # An operator's finalize (no lease) of a task with results left over, then its acknowledgement.
    sync_store.create(Checkpoint("a"))
    raw.hset(steps_key(sync_store, "a"), "1\0s", b"left over")
    cp = sync_store.load("a")
    assert cp is not None
    cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
    assert sync_store.finalize(cp, expected_revision=cp.revision)
    assert not raw.exists(steps_key(sync_store, "a"))
    raw.hset(steps_key(sync_store, "a"), "1\0s", b"left over")
    assert sync_store.acknowledge_terminal("a", expected_revision=cp.revision + 1)
    assert not raw.exists(steps_key(sync_store, "a"))


def test_a_result_is_read_only_by_its_own_cycle(sync_store: CheckpointStore, raw: Any) -> None:
    """The field carries the cycle: a result stored for cycle 1 (left over, say) is not cycle 2's."""
    sync_store.create(Checkpoint("t"))
    llm = Counter()
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        lease.commit(next_cycle(lease.checkpoint))
    raw.hset(steps_key(sync_store, "t"), "1\0llm", encode("cycle 1's", what="test"))
    with sync_store.lease("t", 2, lease_ms=5_000) as lease:
        assert lease.step("llm", llm, "two") == {"answer": "TWO", "pair": [1, 2]}
    assert llm.calls == ["two"]


def test_a_save_drops_them(sync_store: CheckpointStore, raw: Any) -> None:
    """A save replaces what the task held: moved back to an earlier cycle, it does not replay another run's."""
    sync_store.create(Checkpoint("t"))
    llm = Counter()
    with pytest.raises(Crash), sync_store.lease("t", 1, lease_ms=5_000) as lease:
        lease.step("llm", llm, "one")
        raise Crash
    sync_store.save(Checkpoint("t", cycle_index=0, revision=50))
    assert not raw.exists(steps_key(sync_store, "t"))
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        lease.step("llm", llm, "one again")
    assert llm.calls == ["one", "one again"]


# ---- what is not memoized ------------------------------------------------------------------------------


def test_a_step_that_raised_is_not_recorded_and_runs_again(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("t"))
    runs: list[int] = []

    def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise TimeoutError("the model timed out")
        return "ok"

    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        with pytest.raises(TimeoutError):
            lease.step("llm", flaky)
        assert not raw.exists(steps_key(sync_store, "t"))
        assert lease.step("llm", flaky) == "ok"
        assert lease.step("llm", flaky) == "ok"
    assert len(runs) == 2


# ---- fenced: a frozen holder woken after a takeover ---------------------------------------------------


class FrozenClock(Clock):
    """The holder's clock stands still: its keeper neither renews nor notices the lapse (a frozen process)."""

    def __init__(self) -> None:
        self.t = super().now()

    def now(self) -> float:
        return self.t


def take_over(store: CheckpointStore, after_s: float) -> Lease:
    time.sleep(after_s)  # the frozen holder's lease lapses on the server clock
    lease = store.lease("t", 1, token="new", lease_ms=5_000)
    lease.__enter__()
    return lease


def test_a_frozen_holder_can_neither_record_nor_read_after_a_takeover(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("t"))
    # A second of lease: a loaded machine must still reach the step inside it (the takeover is the point).
    frozen = Lease(sync_store, "t", 1, token="frozen", lease_ms=1_000, clock=FrozenClock(), release_on_exit=False)
    llm = Counter()
    with frozen:
        holder: list[Lease] = []

        def slow_call(prompt: str) -> str:
            llm(prompt)
            holder.append(take_over(sync_store, 1.15))  # frozen mid-call; another worker takes over
            return "late"

        with pytest.raises(LeaseLost, match="nothing was recorded"):
            frozen.step("llm", slow_call, "p")
        assert not raw.exists(steps_key(sync_store, "t"))  # the frozen holder recorded nothing
        new = holder[0]
        assert new.step("llm", llm, "q") == {"answer": "Q", "pair": [1, 2]}
        calls = len(llm.calls)
        # The new holder's result is not the frozen one's: it cannot read it, nor run another step.
        with pytest.raises(LeaseLost):
            frozen.step("llm", llm, "p")
        with pytest.raises(LeaseLost):
            frozen.step("other", llm, "p")
        assert len(llm.calls) == calls
        assert frozen.lost
        new.commit(next_cycle(new.checkpoint))
        new.close()


async def test_async_frozen_holder_cannot_record_after_a_takeover(
    async_store: AsyncCheckpointStore, sync_store: CheckpointStore, raw: Any
) -> None:
    await async_store.create(Checkpoint("t"))
    from redis_agentstate.lease import AsyncLease

    frozen = AsyncLease(async_store, "t", 1, token="frozen", lease_ms=1_000, release_on_exit=False)
    frozen._clock = FrozenClock()
    holder: list[Lease] = []

    async def slow_call() -> str:
        holder.append(await asyncio.to_thread(take_over, sync_store, 1.15))
        return "late"

    with pytest.raises(LeaseLost):
        async with frozen:
            await frozen.step("llm", slow_call)
    assert not raw.exists(steps_key(async_store, "t"))
    with pytest.raises(LeaseLost):
        await frozen.step("llm", slow_call)
    holder[0].close()


def test_a_lapsed_lease_nobody_took_records_nothing(sync_store: CheckpointStore, raw: Any) -> None:
    """Live on the server clock: even with nobody else holding the cycle, a lapsed holder is refused."""
    sync_store.create(Checkpoint("t"))
    frozen = Lease(sync_store, "t", 1, token="frozen", lease_ms=300, clock=FrozenClock(), release_on_exit=False)
    with frozen, pytest.raises(LeaseLost):
        frozen.step("s", lambda: time.sleep(0.45) or "late")
    assert not raw.exists(steps_key(sync_store, "t"))


def test_a_step_after_the_commit_is_refused(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        lease.commit(next_cycle(lease.checkpoint))
        with pytest.raises(LeaseLost, match="ended"):
            lease.step("late", Counter(), "x")


# ---- bad input: InvalidArgument, nothing written ------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", "a\0b", "x" * (MAX_STEP_NAME_BYTES + 1), "é" * (MAX_STEP_NAME_BYTES // 2 + 1), "\ud800", 7, None]
)
def test_bad_step_names_are_refused_before_anything_runs(sync_store: CheckpointStore, raw: Any, name: Any) -> None:
    sync_store.create(Checkpoint("t"))
    llm = Counter()
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        with pytest.raises(InvalidArgument):
            lease.step(name, llm, "x")
        with pytest.raises(InvalidArgument):
            lease.step_key(name)
        assert lease.step("é" * (MAX_STEP_NAME_BYTES // 2), llm, "ok") == {"answer": "OK", "pair": [1, 2]}
    assert llm.calls == ["ok"]
    assert raw.hlen(steps_key(sync_store, "t")) == 1


def test_a_result_over_the_payload_limit_or_unencodable_is_not_recorded(make: Callable[..., Any], raw: Any) -> None:
    store = make(CheckpointStore, AsyncCheckpointStore, max_payload_bytes=2048)
    store.create(Checkpoint("t"))
    lease = store.lease("t", 1, lease_ms=5_000)
    if isinstance(store, CheckpointStore):
        with lease:
            with pytest.raises(InvalidArgument, match="max_payload_bytes"):
                lease.step("big", lambda: "x" * 4096)
            with pytest.raises(InvalidArgument, match="not msgpack-serialisable"):
                lease.step("odd", lambda: object())
            assert lease.step("small", lambda: "x" * 1024) == "x" * 1024
    else:

        async def body() -> None:
            async with lease:
                with pytest.raises(InvalidArgument, match="max_payload_bytes"):
                    await lease.step("big", lambda: "x" * 4096)
                assert await lease.step("small", lambda: "x" * 1024) == "x" * 1024

        store._loop.run_until_complete(body())
    assert [f.split(b"\0")[1] for f in raw.hkeys(steps_key(store, "t"))] == [b"small"]


def test_step_keys_name_the_task_the_cycle_and_the_step(sync_store: CheckpointStore) -> None:
    for tid in ("t", "u"):
        sync_store.create(Checkpoint(tid))
    with sync_store.lease("t", 1, lease_ms=5_000) as a, sync_store.lease("u", 1, lease_ms=5_000) as b:
        keys = {a.step_key("x"), a.step_key("y"), b.step_key("x")}
        assert len(keys) == 3 and all(k.startswith("agentstate-step-") and len(k) == 48 for k in keys)
        first = a.step_key("x")
        a.commit(next_cycle(a.checkpoint))
    with sync_store.lease("t", 2, lease_ms=5_000) as a:
        assert a.step_key("x") != first


# ---- corrupt data and a flushed script cache --------------------------------------------------------


def test_data_the_library_did_not_write_is_corrupt_state(sync_store: CheckpointStore, raw: Any) -> None:
    sync_store.create(Checkpoint("t"))
    key = steps_key(sync_store, "t")
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        raw.hset(key, "1\0s", b"\x09not ours")
        with pytest.raises(CorruptState) as info:
            lease.step("s", Counter(), "x")
        assert info.value.key == key and info.value.task_id == "t"
        raw.delete(key)
        raw.set(key, "a string")
        with pytest.raises(CorruptState, match="is a Redis string"):
            lease.step("s", Counter(), "x")
        raw.delete(key)


def test_steps_work_after_script_flush(make: Callable[..., Any], raw: Any) -> None:
    store = make(CheckpointStore, AsyncCheckpointStore)
    store.create(Checkpoint("t"))
    llm = Counter()
    lease = store.lease("t", 1, lease_ms=5_000)
    if isinstance(store, CheckpointStore):
        with lease:
            lease.step("a", llm, "a")
            raw.script_flush()
            assert lease.step("a", llm, "a") == {"answer": "A", "pair": [1, 2]}
            raw.script_flush()
            lease.step("b", llm, "b")
    else:

        async def body() -> None:
            async with lease:
                await lease.step("a", llm.acall, "a")
                raw.script_flush()
                assert await lease.step("a", llm.acall, "a") == {"answer": "A", "pair": [1, 2]}
                raw.script_flush()
                await lease.step("b", llm.acall, "b")

        store._loop.run_until_complete(body())
    assert llm.calls == ["a", "b"]


# ---- the Runner hands a handler its cycle -------------------------------------------------------------


def test_takes_cycle_reads_the_signature() -> None:
    def one(cp: Checkpoint) -> Checkpoint:
        return cp

    def two(cp: Checkpoint, cycle: Cycle) -> Checkpoint:
        return cp

    def defaulted(cp: Checkpoint, who: str = "w") -> Checkpoint:
        return cp

    def star(*args: Any) -> Any:
        return args[0]

    class Handler:
        def __call__(self, cp: Checkpoint, cycle: Cycle) -> Checkpoint:
            return cp

    assert [takes_cycle(f) for f in (one, two, defaulted, star, Handler(), print)] == [
        False, True, False, False, True, False,
    ]  # fmt: skip


def test_runner_memoizes_a_step_across_a_crashed_attempt(sync_store: CheckpointStore) -> None:
    for i in range(3):
        sync_store.create(Checkpoint(f"t{i}"))
    llm = Counter()
    crashed: set[tuple[str, int]] = set()
    keys: dict[tuple[str, int], set[str]] = {}

    def handler(cp: Checkpoint, cycle: Cycle) -> StepResult:
        at = (cp.task_id, cp.claimed_cycle or 0)
        reply = cycle.step("llm", llm, f"{cp.task_id}/{cp.claimed_cycle}")
        keys.setdefault(at, set()).add(cycle.step_key("llm"))
        if at not in crashed:  # every cycle's first attempt dies after its model call
            crashed.add(at)
            raise Crash("after the model call, before the commit")
        cp.messages.append(reply["answer"])
        if cp.claimed_cycle == 2:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
            return StepResult(cp, done=True)
        return StepResult(cp)

    runner = Runner(sync_store, handler, handle_signals=False, failure_delay_ms=5, idle_min_ms=5, idle_max_ms=20)
    stats = runner.run(stop_when_idle=True)
    assert (stats.failed, stats.finalized) == (6, 3)
    assert sorted(llm.calls) == sorted(f"t{i}/{c}" for i in range(3) for c in (1, 2))  # once per cycle
    assert all(len(k) == 1 for k in keys.values())
    for i in range(3):
        cp = sync_store.load(f"t{i}")
        assert cp is not None and cp.messages == [f"T{i}/1", f"T{i}/2"]


async def test_async_runner_memoizes_a_step_across_a_crashed_attempt(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    llm = Counter()
    attempts: list[int] = []

    async def handler(cp: Checkpoint, cycle: AsyncCycle) -> StepResult:
        reply = await cycle.step("llm", llm.acall, "q")
        attempts.append(1)
        if len(attempts) == 1:
            raise Crash
        assert cycle.lease.step_key("llm") == cycle.step_key("llm")
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, reply
        return StepResult(cp, done=True)

    stats = await AsyncRunner(async_store, handler, handle_signals=False, failure_delay_ms=5).run(stop_when_idle=True)
    assert (stats.failed, stats.finalized, llm.calls) == (1, 1, ["q"])
    done = await async_store.load("t")
    assert done is not None and done.terminal_result == {"answer": "Q", "pair": [1, 2]}


def test_one_argument_handlers_are_called_as_before(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    seen: list[int] = []

    def handler(cp: Checkpoint, who: str = "default") -> StepResult:
        seen.append(len(who))
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, who
        return StepResult(cp, done=True)

    Runner(sync_store, handler, handle_signals=False).run(stop_when_idle=True)
    done = sync_store.load("t")
    assert done is not None and done.terminal_result == "default"
