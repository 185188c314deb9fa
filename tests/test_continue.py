"""Leases and runners going on with the same task through ``commit_and_claim`` (issue 11, section 1).

Runs over fakeredis and a real redis-server (the ``sync_store``/``async_store`` fixtures).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from redis_agentstate import AgentStatus, AsyncCheckpointStore, Checkpoint, CheckpointStore, LeaseLost
from redis_agentstate.lease import AsyncLease, Lease
from redis_agentstate.runner import DEFAULT_MAX_CONSECUTIVE_CYCLES, AsyncRunner, Runner, StepResult
from redis_agentstate.wire import scripts


def count_scripts(store: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often each script of ``store`` was called."""
    counts: dict[str, int] = {}
    names = {id(script): name for name, script in store._scripts.items()}
    cls = type(next(iter(store._scripts.values())))  # every Script shares one class
    original = cls.__call__

    def call(self_: Any, *a: Any, **k: Any) -> Any:
        name = names.get(id(self_))
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
        return original(self_, *a, **k)

    monkeypatch.setattr(cls, "__call__", call)
    return counts


class TestLease:
    def test_commit_and_claim_hands_over_to_the_next_cycle(self, sync_store: CheckpointStore) -> None:
        sync_store.create(Checkpoint("t"))
        with sync_store.lease("t", 1, lease_ms=5_000) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 1
            cp.messages.append("one")
            nxt = lease.commit_and_claim(cp, next_token="second")
        assert lease.ended == "committed" and nxt is not None
        assert (nxt.cycle_index, nxt.token, nxt.revision) == (2, "second", lease.revision + 2)
        with nxt:
            assert nxt.checkpoint.messages == ["one"] and nxt.checkpoint.claimed_cycle == 2
            assert isinstance(nxt, Lease) and nxt.renewals == 0 and not nxt.lost
            cp = nxt.checkpoint
            cp.cycle_index = 2
            cp.messages.append("two")
            nxt.commit(cp)
        got = sync_store.load("t")
        assert got.messages == ["one", "two"] and got.cycle_index == 2 and got.claim_token is None

    def test_the_next_lease_is_kept_alive(self, sync_store: CheckpointStore) -> None:
        sync_store.create(Checkpoint("t"))
        # A 1 s lease: a 300 ms one was lost to a stall of a loaded CI machine (pytest-xdist
        # workers and the nox sessions side by side on two cores), not to a bug.
        with sync_store.lease("t", 1, lease_ms=1000) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 1
            nxt = lease.commit_and_claim(cp)
        assert nxt is not None and nxt.token == lease.token
        with nxt:
            time.sleep(2.5)  # two and a half leases long: only renewals keep it
            assert not nxt.lost and nxt.renewals >= 2
            cp = nxt.checkpoint
            cp.cycle_index = 2
            nxt.commit(cp)

    def test_a_task_that_is_not_runnable_is_a_plain_commit(self, sync_store: CheckpointStore) -> None:
        sync_store.create(Checkpoint("t"))
        with sync_store.lease("t", 1) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 1
            cp.status = AgentStatus.WAIT_USER
            assert lease.commit_and_claim(cp) is None
        got = sync_store.load("t")
        assert got.status == AgentStatus.WAIT_USER and got.claim_token is None and got.revision == 2

    def test_fenced_out_is_lease_lost_and_nothing_written(self, sync_store: CheckpointStore) -> None:
        sync_store.create(Checkpoint("t"))
        with sync_store.lease("t", 1, lease_ms=5_000) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 1
            cp.messages.append("stale")
            sync_store.save(Checkpoint("t", revision=50))  # an operator moved the task on
            with pytest.raises(LeaseLost):
                lease.commit_and_claim(cp)
            assert lease.lost
        got = sync_store.load("t")
        assert got.revision == 50 and got.messages == [] and got.claim_token is None

    async def test_async_commit_and_claim(self, async_store: AsyncCheckpointStore) -> None:
        await async_store.create(Checkpoint("t"))
        async with async_store.lease("t", 1, lease_ms=1000) as lease:  # 1 s: see the sync test
            cp = lease.checkpoint
            cp.cycle_index = 1
            cp.messages.append("one")
            nxt = await lease.commit_and_claim(cp, next_token="n")
        assert isinstance(nxt, AsyncLease) and nxt.token == "n"
        async with nxt:
            await asyncio.sleep(2.5)
            assert not nxt.lost and nxt.renewals >= 2
            cp = nxt.checkpoint
            cp.cycle_index = 2
            cp.messages.append("two")
            await nxt.commit(cp)
        assert (await async_store.load("t")).messages == ["one", "two"]

    async def test_async_fenced_out_is_lease_lost(self, async_store: AsyncCheckpointStore) -> None:
        await async_store.create(Checkpoint("t"))
        raised = []
        with pytest.raises(LeaseLost):  # the loss also cancels the work: LeaseLost again on exit
            async with async_store.lease("t", 1) as lease:
                cp = lease.checkpoint
                cp.cycle_index = 1
                await async_store.save(Checkpoint("t", revision=50))
                try:
                    await lease.commit_and_claim(cp)
                except LeaseLost as exc:
                    raised.append(exc)
                    raise
        assert raised and "fence" in str(raised[0])
        assert (await async_store.load("t")).revision == 50


def long_run(cycles: int, order: list[tuple[str, int]]) -> Any:
    def handler(cp: Checkpoint) -> StepResult:
        order.append((cp.task_id, cp.claimed_cycle or 0))
        cp.messages.append(cp.claimed_cycle)
        if cp.claimed_cycle == cycles:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
            return StepResult(cp, done=True)
        return StepResult(cp)

    return handler


def longest_streak(order: list[tuple[str, int]]) -> int:
    best = run = 0
    for i, (tid, _) in enumerate(order):
        run = run + 1 if i and order[i - 1][0] == tid else 1
        best = max(best, run)
    return best


class TestRunner:
    """The streak cap, in claim_next's peek order. A held lease keeps the store's wake-up subscription
    up, so its announcements feed claim_next's candidates, whose longest-waiting-first order is stale
    by up to ``claim_next_candidate_age_s`` (an announcement missed while the subscription was still
    starting leaves a task out of them meanwhile): these runs, a few ms long, peek every time."""

    @pytest.fixture(autouse=True)
    def _always_peek(self, request: pytest.FixtureRequest) -> None:
        for name in ("sync_store", "async_store"):
            if name in request.fixturenames:
                request.getfixturevalue(name)._core.claim_next_candidate_age_s = 0

    def test_the_default_cap(self) -> None:
        assert DEFAULT_MAX_CONSECUTIVE_CYCLES == 8

    def test_a_long_run_continues_in_one_script_per_cycle_up_to_the_cap(
        self, sync_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        sync_store.create(Checkpoint("t"))
        counts = count_scripts(sync_store, monkeypatch)
        order: list[tuple[str, int]] = []
        runner = Runner(sync_store, long_run(20, order), max_consecutive_cycles=8, handle_signals=False)
        stats = runner.run(stop_when_idle=True)
        # Streaks of 8: cycles 1-8, 9-16, 17-20; each streak starts with claim_next.
        assert counts.get(scripts.CLAIM_NEXT) == 3
        assert counts.get(scripts.COMMIT_AND_CLAIM) == 7 + 7 + 3
        assert counts.get(scripts.COMMIT) == 3  # the cap's two plain commits and the finalize
        assert (stats.claimed, stats.continued, stats.committed, stats.finalized) == (20, 17, 19, 1)
        got = sync_store.load("t")
        assert got.messages == list(range(1, 21)) and got.is_terminal

    def test_the_cap_lets_waiting_tasks_in(self, sync_store: CheckpointStore) -> None:
        for tid in ("a", "b", "c"):
            sync_store.create(Checkpoint(tid))
        order: list[tuple[str, int]] = []
        runner = Runner(sync_store, long_run(9, order), max_consecutive_cycles=3, handle_signals=False)
        stats = runner.run(stop_when_idle=True)
        assert stats.finalized == 3 and len(order) == 27
        assert longest_streak(order) == 3
        # Round robin in streaks of 3: every task has its streak before any has a second one.
        heads = [tid for tid, _ in order[::3]]
        assert all(set(heads[i : i + 3]) == {"a", "b", "c"} for i in (0, 3, 6)), heads

    def test_one_turns_continuing_off(self, sync_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
        sync_store.create(Checkpoint("t"))
        counts = count_scripts(sync_store, monkeypatch)
        stats = Runner(sync_store, long_run(4, []), max_consecutive_cycles=1, handle_signals=False).run(
            stop_when_idle=True
        )
        assert stats.continued == 0 and scripts.COMMIT_AND_CLAIM not in counts
        assert counts[scripts.CLAIM_NEXT] == 4

    async def test_async_runner_continues_up_to_the_cap(self, async_store: AsyncCheckpointStore) -> None:
        for tid in ("a", "b"):
            await async_store.create(Checkpoint(tid))
        order: list[tuple[str, int]] = []
        sync_handler = long_run(10, order)

        async def handler(cp: Checkpoint) -> StepResult:
            await asyncio.sleep(0)
            return sync_handler(cp)  # type: ignore[no-any-return]

        runner = AsyncRunner(async_store, handler, max_consecutive_cycles=4, handle_signals=False)
        stats = await runner.run(stop_when_idle=True)
        assert stats.finalized == 2 and stats.claimed == 20
        assert stats.continued == 20 - 6  # streaks 4+4+2 per task
        assert longest_streak(order) == 4
        for tid in ("a", "b"):
            assert (await async_store.load(tid)).messages == list(range(1, 11))

    def test_the_cap_is_validated(self, sync_store: CheckpointStore) -> None:
        from redis_agentstate import InvalidArgument

        with pytest.raises(InvalidArgument):
            Runner(sync_store, long_run(1, []), max_consecutive_cycles=0)


class TestLeaseAfterALostReply:
    def test_a_commit_that_applied_but_whose_claim_was_taken_ends_the_lease_as_committed(
        self, sync_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Only a re-send raises ClaimRejected from commit_and_claim: the commit stands, no next lease."""
        from redis_agentstate import AlreadyClaimed

        sync_store.create(Checkpoint("t"))
        real = sync_store.commit_and_claim

        def applied_then_taken(cp: Checkpoint, **kw: Any) -> Any:
            real(cp, **kw)
            raise AlreadyClaimed("taken since", task_id="t")

        monkeypatch.setattr(sync_store, "commit_and_claim", applied_then_taken)
        with sync_store.lease("t", 1) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 1
            cp.messages.append("one")
            assert lease.commit_and_claim(cp) is None
            assert lease.ended == "committed" and not lease.lost
        assert sync_store.load("t").messages == ["one"]

    async def test_async_the_same(self, async_store: AsyncCheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
        from redis_agentstate import CycleConflict

        await async_store.create(Checkpoint("t"))
        real = async_store.commit_and_claim

        async def applied_then_moved_on(cp: Checkpoint, **kw: Any) -> Any:
            await real(cp, **kw)
            raise CycleConflict("moved on", task_id="t", expected=1, found=3)

        monkeypatch.setattr(async_store, "commit_and_claim", applied_then_moved_on)
        async with async_store.lease("t", 1) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 1
            assert await lease.commit_and_claim(cp) is None
            assert lease.ended == "committed" and not lease.lost
