"""The lease keeper: timing rules (pure), the thread and task shells on fakeredis and a real
server, a process frozen with SIGSTOP, and a Redis that stops answering."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from clock_support import FakeClock, wait_for

from redis_agentstate import (
    AgentStatus,
    AlreadyClaimed,
    AsyncCheckpointStore,
    BackendUnavailable,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    InvalidArgument,
    LeaseLost,
)
from redis_agentstate.core.lease import LOST, RENEW, STOP, WAIT
from redis_agentstate.lease import AsyncLease, Lease, LeaseState, LeaseTiming

# ---- timing knobs (validated like Kubernetes leader election) ----------------------------------


class TestLeaseTiming:
    def test_defaults_scale_with_the_lease(self) -> None:
        t = LeaseTiming(30_000)
        assert (t.lease_ms, t.renew_deadline_ms, t.renew_interval_ms) == (30_000, 20_000, 7_500)

    @pytest.mark.parametrize(
        ("lease", "deadline", "interval", "message"),
        [
            (1000, 1000, 100, r"lease_ms \(1000\) must be greater than renew_deadline_ms"),
            (1000, 1200, 100, "must be greater than renew_deadline_ms"),
            (1000, 600, 500, r"must be greater than 1.2 \* renew_interval_ms"),
            (1000, 600, 0, "renew_interval_ms must be greater than zero"),
            (1000, 0, 100, "between 0|greater than zero"),
            (1000, -5, 100, "between 0"),
            (0, None, None, "lease_ms must be between 1"),
            (3, None, None, "too short"),
            (1000, 600.0, None, "must be an int"),
        ],
    )
    def test_nonsense_is_rejected(self, lease: Any, deadline: Any, interval: Any, message: str) -> None:
        with pytest.raises(InvalidArgument, match=message):
            LeaseTiming(lease, deadline, interval)

    def test_store_lease_validates_before_any_io(self) -> None:
        class NoIO:
            def __getattr__(self, name: str) -> Any:
                raise AssertionError(f"I/O attempted: {name}")

        with pytest.raises(InvalidArgument):
            Lease(NoIO(), "t", 1, lease_ms=100, renew_deadline_ms=200)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            Lease(NoIO(), "t", 0, lease_ms=100)  # type: ignore[arg-type]


# ---- the decisions, on a fake clock -------------------------------------------------------------


def test_the_lease_logic_lives_once_without_io() -> None:
    """The timing, the state machine and the clock sit in ``core.lease`` with no I/O; the twins in
    ``lease.py`` share every decision through it instead of each carrying a copy."""
    import ast
    import inspect

    import redis_agentstate.core.lease as core
    import redis_agentstate.lease as twins

    def imported(module: Any) -> set[str]:
        tree = ast.parse(inspect.getsource(module))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}

    assert not imported(core) & {"asyncio", "redis", "socket", "subprocess"}
    for name in ("LeaseTiming", "LeaseState", "Clock", "monotonic"):
        assert getattr(twins, name) is getattr(core, name)
    assert issubclass(Lease, core.LeaseBase) and issubclass(AsyncLease, core.LeaseBase)
    # No state transition is spelled out in a twin: they ask LeaseState (through LeaseBase) for each step.
    source = inspect.getsource(twins)
    for rule in (".next_step(", ".renewed(", ".renew_failed(", "LeaseTiming("):
        assert rule not in source, rule
    # Nor in the one keeper, which both these and LangGraph's thread leases run, nor in the thread leases.
    import redis_agentstate.langgraph.saver as saver
    import redis_agentstate.wire.keeper as keeper

    assert issubclass(core.LeaseBase, core.KeptLease) and issubclass(saver.ThreadLease, core.KeptLease)
    for module in (keeper, saver):
        source = inspect.getsource(module)
        for rule in (".next_step(", ".renewed(", ".renew_failed("):
            assert rule not in source, (module.__name__, rule)


class TestLeaseState:
    timing = LeaseTiming(1000, 600, 250)

    def test_renews_on_interval_and_is_lost_at_the_deadline_from_the_send(self) -> None:
        st = LeaseState(self.timing, sent_at=10.0, expires_at_ms=5_000)
        assert st.next_step(10.1) == (WAIT, pytest.approx(0.15))
        assert st.next_step(10.25)[0] == RENEW
        assert not st.is_lost(10.599)
        assert st.is_lost(10.6) and st.next_step(10.6)[0] == LOST
        assert "renew_deadline_ms=600" in (st.loss_reason(10.6) or "")

    def test_a_confirmed_renewal_counts_from_when_it_was_sent(self) -> None:
        st = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        # Sent at 0.25, answered at 0.5: the new deadline is 0.25 + 0.6, not 0.5 + 0.6.
        assert st.renewed(0.25, 0.5, 1250) is None
        assert st.valid_until == pytest.approx(0.85) and st.expires_at_ms == 1250 and st.renewals == 1
        assert st.next_step(0.5)[0] == RENEW
        assert st.is_lost(0.85)

    def test_refusal_loses_at_once(self) -> None:
        st = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        assert "refused" in (st.renewed(0.25, 0.26, None) or "")

    def test_late_confirmation_does_not_revive(self) -> None:
        st = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        assert "too late" in (st.renewed(0.25, 0.7, 1250) or "")

    def test_unreachable_redis_is_retried_until_the_deadline(self) -> None:
        st = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        assert st.renew_failed(0.3, BackendUnavailable("down")) is None
        assert st.next_step(0.35) == (WAIT, pytest.approx(0.075))
        assert st.next_step(0.425)[0] == RENEW
        assert st.next_step(0.6)[0] == LOST

    def test_any_other_error_loses(self) -> None:
        st = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        assert "RuntimeError" in (st.renew_failed(0.3, RuntimeError("boom")) or "")

    def test_lost_is_final_and_ended_stops(self) -> None:
        st = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        assert st.lose("x") and not st.lose("y")
        assert st.renewed(0.1, 0.1, 9999) == "x" and st.next_step(0.1)[0] == STOP
        done = LeaseState(self.timing, sent_at=0.0, expires_at_ms=1000)
        done.end("committed")
        assert done.next_step(5.0)[0] == STOP and not done.is_lost(5.0) and not done.lose("late")


# ---- the thread and task shells on a store ------------------------------------------------------


def next_cycle(cp: Checkpoint, note: str) -> Checkpoint:
    cp.cycle_index = cp.claimed_cycle
    cp.messages.append({"note": note, "cycle": cp.cycle_index})
    return cp


def test_renewals_keep_the_lease_across_five_times_its_duration(sync_store: CheckpointStore) -> None:
    # The keeper's clock is fake: it decides on fake time only, so a loaded machine cannot make a
    # renewal "late". Redis's own lease is real time, hence a lease long enough (30 s) that the
    # thief below is refused by the server however slow the test runs.
    clock = FakeClock()
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=30_000, clock=clock) as lease:
        first_expiry = lease.expires_at_ms
        interval = lease.timing.interval_s  # 7.5 s of fake time
        for n in range(1, 21):  # 20 renewals: 150 fake seconds, five times the lease
            wait_for(lambda: clock.waiting == 1, "the keeper to wait for its next renewal")
            clock.advance(interval)
            wait_for(lambda n=n: lease.renewals == n, f"renewal {n}")  # type: ignore[misc]
            lease.check()
            assert not lease.lost and lease.remaining_s() == pytest.approx(lease.timing.deadline_s)
            with pytest.raises(AlreadyClaimed):
                sync_store.claim("t", 1, token="thief", lease_ms=300)
        assert clock.t - 1_000.0 == pytest.approx(5 * lease.timing.lease_ms / 1000)
        assert lease.expires_at_ms >= first_expiry  # each renewal re-granted 30 s from server "now"
        lease.commit(next_cycle(lease.checkpoint, "kept"))
        assert lease.ended == "committed"
    cp = sync_store.load("t")
    assert cp.cycle_index == 1 and cp.claim_token is None and cp.messages[-1]["note"] == "kept"


def test_a_keeper_that_cannot_renew_before_the_deadline_loses_the_lease(sync_store: CheckpointStore) -> None:
    # The same fake clock, jumped past the renew deadline in one step: the keeper wakes to a
    # passed deadline and declares the lease lost before sending anything.
    clock = FakeClock()
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=30_000, clock=clock) as lease:
        wait_for(lambda: clock.waiting == 1, "the keeper to wait")
        clock.advance(lease.timing.deadline_s + 0.001)
        assert lease.lost_event.wait(30)
        assert lease.renewals == 0 and "renew_deadline_ms=20000" in (lease.lost_reason or "")
        with pytest.raises(LeaseLost):
            lease.commit(next_cycle(lease.checkpoint, "late"))
    assert sync_store.load("t").messages == []


async def test_async_renewals_keep_the_lease_across_five_times_its_duration(
    async_store: AsyncCheckpointStore,
) -> None:
    # Real time (the sync twin above is the deterministic one): a 1 s lease renewed every 250 ms
    # has a 667 ms deadline, so only a stall of over 400 ms could lose it.
    await async_store.create(Checkpoint("t"))
    async with async_store.lease("t", 1, lease_ms=1_000) as lease:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            lease.check()
            with pytest.raises(AlreadyClaimed):
                await async_store.claim("t", 1, token="thief", lease_ms=300)
            await asyncio.sleep(0.1)
        assert not lease.lost and lease.renewals >= 6
        await lease.commit(next_cycle(lease.checkpoint, "kept"))
    cp = await async_store.load("t")
    assert cp.cycle_index == 1 and cp.messages[-1]["note"] == "kept"


def test_loss_is_loud_check_commit_and_callback(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    seen: list[Lease] = []
    with sync_store.lease("t", 1, lease_ms=400, on_lost=seen.append) as lease:
        # An operator resets the task: the revision moves, so the next renewal is refused.
        sync_store.save(Checkpoint("t", revision=50))
        assert lease.lost_event.wait(1.0), "keeper did not notice within ~one renew interval"
        assert lease.lost and "refused" in (lease.lost_reason or "")
        with pytest.raises(LeaseLost, match="token="):
            lease.check()
        with pytest.raises(LeaseLost):
            lease.commit(next_cycle(lease.checkpoint, "stale"))
        assert seen == [lease]
    assert sync_store.load("t").revision == 50 and sync_store.load("t").messages == []


def test_server_fence_backs_up_the_local_check(sync_store: CheckpointStore) -> None:
    """Even when the keeper has not noticed yet, Redis rejects the write and the lease reports loss."""
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=30_000) as lease:
        sync_store.save(Checkpoint("t", revision=50))
        assert not lease.lost  # the next renewal is 7.5 s away
        with pytest.raises(LeaseLost, match="fence"):
            lease.commit(next_cycle(lease.checkpoint, "stale"))
        assert lease.lost


async def test_async_loss_cancels_the_work(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    cancelled = asyncio.Event()
    started = time.monotonic()
    with pytest.raises(LeaseLost, match="work cancelled"):
        async with async_store.lease("t", 1, lease_ms=400) as lease:
            await async_store.save(Checkpoint("t", revision=50))
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise
    assert cancelled.is_set() and lease.lost
    assert time.monotonic() - started < 2.0
    # The task that ran the lease is usable afterwards (the cancellation was consumed).
    await asyncio.sleep(0.01)
    assert (await async_store.load("t")).revision == 50


async def test_async_commit_after_loss_raises(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    async with async_store.lease("t", 1, lease_ms=30_000, cancel_on_loss=False) as lease:
        await async_store.save(Checkpoint("t", revision=50))
        with pytest.raises(LeaseLost, match="fence"):
            await lease.commit(next_cycle(lease.checkpoint, "stale"))
        with pytest.raises(LeaseLost):
            lease.check()


def test_leaving_without_commit_releases_the_cycle(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    with pytest.raises(ZeroDivisionError), sync_store.lease("t", 1, lease_ms=30_000):
        1 / 0  # noqa: B018
    time.sleep(0.01)
    cp = sync_store.claim_next(token="next", lease_ms=30_000)
    assert cp is not None and cp.task_id == "t" and cp.claimed_cycle == 1


async def test_async_leaving_without_commit_releases_the_cycle(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    async with async_store.lease("t", 1, lease_ms=30_000) as lease:
        assert lease.revision == 1
    await asyncio.sleep(0.01)
    cp = await async_store.claim_next(token="next", lease_ms=30_000)
    assert cp is not None and cp.claimed_cycle == 1


def test_finalize_under_the_lease_is_one_fenced_write(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    lease = Lease.next(sync_store, lease_ms=5_000)
    assert lease is not None and lease.task_id == "t" and lease.cycle_index == 1
    with lease:
        cp = next_cycle(lease.checkpoint, "last")
        with pytest.raises(InvalidArgument):
            lease.finalize(cp)  # no terminal_result
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"answer": 42}
        lease.finalize(cp)
        with pytest.raises(LeaseLost, match="ended"):
            lease.commit(cp)
    final = sync_store.load("t")
    assert final.is_terminal and final.terminal_result == {"answer": 42}
    assert Lease.next(sync_store, lease_ms=5_000) is None


async def test_async_next_and_finalize(async_store: AsyncCheckpointStore) -> None:
    assert await AsyncLease.next(async_store, lease_ms=5_000) is None
    await async_store.create(Checkpoint("t"))
    lease = await AsyncLease.next(async_store, lease_ms=5_000)
    assert lease is not None
    async with lease:
        cp = next_cycle(lease.checkpoint, "last")
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
        await lease.finalize(cp)
    assert (await async_store.load("t")).terminal_result == "ok"


def test_commit_must_be_of_the_claimed_cycle(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=5_000) as lease:
        with pytest.raises(InvalidArgument, match="claimed cycle"):
            lease.commit(lease.checkpoint)  # cycle_index still 0
        with pytest.raises(InvalidArgument, match="under the lease"):
            lease.commit(Checkpoint("other", cycle_index=1))
        lease.commit(next_cycle(lease.checkpoint, "ok"))


def test_missing_task_and_taken_task(sync_store: CheckpointStore) -> None:
    with pytest.raises(ClaimRejected, match="no checkpoint"), sync_store.lease("nope", 1):
        pass
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=5_000), pytest.raises(AlreadyClaimed), sync_store.lease("t", 1):
        pass


def test_a_renewal_that_raises_loses_the_lease(sync_store: CheckpointStore, monkeypatch: Any) -> None:
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=200) as lease:
        monkeypatch.setattr(sync_store, "_lease_renew", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bug")))
        assert lease.lost_event.wait(1.0)
        assert "RuntimeError('bug')" in (lease.lost_reason or "")


def test_a_crashing_keeper_thread_is_a_lost_lease(sync_store: CheckpointStore, monkeypatch: Any) -> None:
    sync_store.create(Checkpoint("t"))
    crashes: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    with sync_store.lease("t", 1, lease_ms=200) as lease:
        monkeypatch.setattr(lease._state, "next_step", lambda now: 1 / 0)
        lease._keeper.wake()  # wake the keeper now
        assert lease.lost_event.wait(1.0)
        assert "crashed" in (lease.lost_reason or "")
        with pytest.raises(LeaseLost, match="crashed"):
            lease.check()
    assert crashes and crashes[0].exc_type is ZeroDivisionError


async def test_a_crashing_keeper_task_is_a_lost_lease(async_store: AsyncCheckpointStore, monkeypatch: Any) -> None:
    await async_store.create(Checkpoint("t"))
    with pytest.raises(LeaseLost, match="crashed"):
        async with async_store.lease("t", 1, lease_ms=200) as lease:
            monkeypatch.setattr(lease._state, "next_step", lambda now: 1 / 0)
            await asyncio.sleep(1.0)


# ---- real processes: a frozen worker, a frozen Redis --------------------------------------------


FROZEN_WORKER = textwrap.dedent(
    """
    import json, sys, time
    import redis
    from redis_agentstate import CheckpointStore, LeaseLost

    store = CheckpointStore(redis.Redis.from_url(sys.argv[1]), namespace="frozen")
    out = lambda *a: print(json.dumps(a), flush=True)
    with store.lease("t", 1, lease_ms=int(sys.argv[2])) as lease:
        out("READY", lease.revision, lease.token)
        cp = lease.checkpoint
        try:
            for _ in range(200):          # the "work": short steps, checking the lease between them
                time.sleep(0.02)
                lease.check()
            out("NEVER_LOST")
        except LeaseLost as exc:
            out("LOST", str(exc))
        cp.cycle_index = 1
        cp.messages.append("written by the frozen worker")
        try:
            lease.commit(cp)
            out("COMMITTED")
        except LeaseLost as exc:
            out("COMMIT_REFUSED", str(exc))
        # What a worker without a keeper would do: write anyway. Redis fences it out.
        out("RAW_COMMIT", store.commit(cp, token=lease.token, expected_revision=lease.revision))
    """
)


@pytest.mark.real
def test_sigstopped_process_comes_back_to_lease_lost_and_is_fenced(private_server: Any) -> None:
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace="frozen")
    store.create(Checkpoint("t"))
    lease_ms = 500
    proc = subprocess.Popen(
        [sys.executable, "-c", FROZEN_WORKER, private_server.url, str(lease_ms)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready[0] == "READY"
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5
            thief = None
            while thief is None and time.monotonic() < deadline:
                try:
                    thief = store.claim("t", 1, token="thief", lease_ms=30_000)
                except AlreadyClaimed:
                    time.sleep(0.05)
            assert thief is not None and thief.revision == ready[1] + 1
            assert store.commit(next_cycle(thief, "by the thief"), token="thief", expected_revision=thief.revision)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        lines = [json.loads(line) for line in proc.stdout]
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kinds = [line[0] for line in lines]
    assert kinds == ["LOST", "COMMIT_REFUSED", "RAW_COMMIT"], lines
    assert ready[2] in lines[0][1]
    assert lines[2][1] is False
    assert [m["note"] for m in store.load("t").messages] == ["by the thief"]


@pytest.mark.real
def test_a_renewal_stuck_on_a_frozen_redis_still_loses_on_time(private_server: Any) -> None:
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace="hung")
    store.create(Checkpoint("t"))
    # The keeper's 400 ms deadline, inside a 2 s lease: the 1.6 s between them is the room a loaded
    # machine's scheduling gets (a 600 ms lease left 200 ms, and three nox sessions on two cores took 290).
    with store.lease("t", 1, lease_ms=2000, renew_deadline_ms=400, renew_interval_ms=100) as lease:
        os.kill(private_server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert lease.lost_event.wait(5.0), "the keeper waited on a renewal that never answers"
            # Lost before the lease itself could lapse (2 s after its last renewal, at most `started`).
            assert time.monotonic() - started <= 2.0
            assert "did not answer" in (lease.lost_reason or "")
        finally:
            os.kill(private_server.proc.pid, signal.SIGCONT)


@pytest.mark.real
async def test_async_renewal_stuck_on_a_frozen_redis_cancels_on_time(private_server: Any) -> None:
    client = aioredis.Redis.from_url(private_server.url)
    store = AsyncCheckpointStore(client, namespace="hung")
    await store.create(Checkpoint("t"))
    started = 0.0
    try:
        with pytest.raises(LeaseLost, match="did not answer"):
            async with store.lease("t", 1, lease_ms=2000, renew_deadline_ms=400, renew_interval_ms=100):
                os.kill(private_server.proc.pid, signal.SIGSTOP)
                started = time.monotonic()
                await asyncio.sleep(10)
        assert time.monotonic() - started <= 2.0  # before the lease could lapse (see the sync twin)
    finally:
        os.kill(private_server.proc.pid, signal.SIGCONT)
        await client.aclose()


# ---- races found in review ------------------------------------------------------------------------


def _slow_commit_reply(store: Any, monkeypatch: Any, seconds: float) -> None:
    """The commit applies on the server at once; its reply reaches us ``seconds`` later."""
    script = store._scripts["commit"]
    original = type(script).__call__

    def delayed(self_: Any, *a: Any, **k: Any) -> Any:
        result = original(self_, *a, **k)
        if self_ is not script:
            return result
        if hasattr(result, "__await__"):

            async def later() -> Any:
                reply = await result
                await asyncio.sleep(seconds)
                return reply

            return later()
        time.sleep(seconds)
        return result

    monkeypatch.setattr(type(script), "__call__", delayed)


def test_a_renewal_refused_because_our_own_commit_applied_is_not_a_loss(
    sync_store: CheckpointStore, monkeypatch: Any
) -> None:
    sync_store.create(Checkpoint("t"))
    seen: list[Lease] = []
    _slow_commit_reply(sync_store, monkeypatch, 0.3)  # renewals every ~100 ms meanwhile
    with sync_store.lease("t", 1, lease_ms=400, on_lost=seen.append) as lease:
        lease.commit(next_cycle(lease.checkpoint, "applied"))
        assert not lease.lost and lease.ended == "committed"
    assert seen == [] and sync_store.load("t").cycle_index == 1


async def test_async_renewal_refused_because_our_own_commit_applied_is_not_a_loss(
    async_store: AsyncCheckpointStore, monkeypatch: Any
) -> None:
    await async_store.create(Checkpoint("t"))
    _slow_commit_reply(async_store, monkeypatch, 0.3)
    async with async_store.lease("t", 1, lease_ms=400) as lease:
        await lease.commit(next_cycle(lease.checkpoint, "applied"))
        assert not lease.lost and lease.ended == "committed"
    assert (await async_store.load("t")).cycle_index == 1


async def test_cancelling_the_task_during_lease_exit_is_not_swallowed(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    reached_exit = asyncio.Event()

    async def work() -> None:
        async with async_store.lease("t", 1, lease_ms=30_000) as lease:
            await lease.commit(next_cycle(lease.checkpoint, "done"))
            reached_exit.set()
        await asyncio.sleep(10)  # must never get here once cancelled

    task = asyncio.create_task(work())
    await reached_exit.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)


async def test_async_loss_cancels_work_that_keeps_awaiting_redis(backend: Any, namespace: str) -> None:
    """The loop blocked past the lease, then the body awaits Redis commands: the keeper's cancel can
    land in the loop iteration where a command completes, which Python 3.11's asyncio.wait_for (in
    redis-py) swallows. The keeper cancels again until the body has left the block. Several rounds:
    one swallowed cancel is enough to fail, and it is not swallowed every time."""
    client = backend.new_async_client()
    store = AsyncCheckpointStore(client, namespace=namespace)
    try:
        for round_ in range(3):
            task_id = f"t{round_}"
            await store.create(Checkpoint(task_id))
            reached: list[str] = []
            started = time.monotonic()
            with pytest.raises(LeaseLost, match="work cancelled"):
                async with store.lease(task_id, 1, lease_ms=300):
                    time.sleep(0.4)  # the event loop blocked: the keeper cannot renew
                    for _ in range(50):
                        await store.load(task_id)
                    await asyncio.sleep(3)
                    reached.append("end of body")
            assert reached == [], f"round {round_}: the body ran on after the loss"
            assert time.monotonic() - started < 2.5, f"round {round_}: the body was not stopped promptly"
            assert _cancelling() == 0  # every cancel of ours taken back
    finally:
        await client.aclose()


def _cancelling() -> int:
    """The current task's count of cancel requests not taken back (0 on Python 3.10, which keeps none)."""
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling() if hasattr(task, "cancelling") else 0


async def test_async_loss_takes_back_a_cancel_that_was_swallowed(backend: Any, namespace: str) -> None:
    """The keeper's only cancel swallowed (as on fakeredis, deterministically: see the test above) and the
    body done without awaiting again: LeaseLost all the same, and the task's cancel count is back to 0,
    which ``asyncio.timeout`` relies on in whatever the task runs next."""
    client = backend.new_async_client()
    store = AsyncCheckpointStore(client, namespace=namespace)
    try:
        await store.create(Checkpoint("t"))
        with pytest.raises(LeaseLost, match="work cancelled"):
            async with store.lease("t", 1, lease_ms=300):
                time.sleep(0.4)  # the event loop blocked: the keeper cannot renew
                await store.load("t")
        assert _cancelling() == 0
    finally:
        await client.aclose()
