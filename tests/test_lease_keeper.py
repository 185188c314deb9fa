"""The one lease keeper (``wire.keeper``) keeping LangGraph's thread leases, on an injected clock.

The store leases' keeper is driven the same way in test_lease.py; here ``ThreadLease`` and
``AsyncThreadLease`` get the same guarantees from the same keeper: a renewal every
``renew_interval`` of the lease's clock, a renewal that outlives the renew deadline is a lost
lease (the async body is cancelled), and a revoke while a renewal is in flight ends the lease
without calling it lost. The clock is fake, so the decisions do not depend on the machine's load;
the renewals themselves go to Redis (fakeredis and a real server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from clock_support import FakeClock, wait_for
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from redis_agentstate import AsyncCheckpointStore, Checkpoint, CheckpointStore, LeaseLost
from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver, AsyncThreadLease, ThreadBusy, ThreadLease
from redis_agentstate.lease import AsyncLease, Lease

LEASE_MS = 30_000  # Redis's own lease runs on real time: long enough for any load


async def await_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


class Gate:
    """Holds every thread-lease renewal sent while it is closed: a Redis that does not answer."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Renewals of the thread leases built from here on wait for the gate, then go to Redis."""
    g = Gate()
    sync_renewal, async_renewal = ThreadLease._renewal, AsyncThreadLease._renewal

    def held(self: ThreadLease) -> Any:
        g.entered.set()
        assert g.opened.wait(60)
        return sync_renewal(self)

    async def held_async(self: AsyncThreadLease) -> Any:
        g.entered.set()
        while not g.opened.is_set():
            await asyncio.sleep(0.005)
        return await async_renewal(self)

    monkeypatch.setattr(ThreadLease, "_renewal", held)
    monkeypatch.setattr(AsyncThreadLease, "_renewal", held_async)
    yield g
    g.opened.set()  # no renewal thread is left waiting


def _put(saver: AgentStateSaver, tid: str) -> Any:
    return saver.put(generate_config(tid), generate_checkpoint(), generate_metadata(), {})


async def _aput(saver: AsyncAgentStateSaver, tid: str) -> Any:
    return await saver.aput(generate_config(tid), generate_checkpoint(), generate_metadata(), {})


def _expiry(lease: ThreadLease | AsyncThreadLease) -> int:
    state = lease._state
    assert state is not None and state.expires_at_ms is not None
    return state.expires_at_ms


# ---- sync: ThreadLease ----------------------------------------------------------------------------


def test_a_thread_lease_renews_on_its_clock_at_each_interval(backend: Any, namespace: str) -> None:
    clock = FakeClock()
    holder = AgentStateSaver(backend.sync_client(), namespace=namespace)
    other = AgentStateSaver(backend.sync_client(), namespace=namespace)
    with holder.lease("t", lease_ms=LEASE_MS, clock=clock) as lease:
        assert lease.clock is clock
        interval = lease.timing.interval_s  # 7.5 s of fake time
        first_expiry = _expiry(lease)
        for n in range(1, 9):  # 8 renewals: 60 fake seconds, twice the lease
            wait_for(lambda: clock.waiting == 1, "the keeper to wait for its next renewal")
            clock.advance(interval - 0.01)
            time.sleep(0.05)
            assert lease.renewals == n - 1  # not due yet on the lease's clock
            clock.advance(0.01 + 1e-6)  # past the interval, whatever the float rounding
            wait_for(lambda n=n: lease.renewals == n, f"renewal {n}")  # type: ignore[misc]
            lease.check()
            assert not lease.lost and lease.remaining_s() == pytest.approx(lease.timing.deadline_s)
        assert clock.t - 1_000.0 == pytest.approx(2 * LEASE_MS / 1000)
        assert _expiry(lease) >= first_expiry  # each renewal re-granted the lease from the server's now
        with pytest.raises(ThreadBusy):
            _put(other, "t")
        _put(holder, "t")
    _put(other, "t")  # released on the way out


def test_a_thread_lease_renewal_that_outlives_its_deadline_loses_the_lease(
    backend: Any, namespace: str, gate: Gate
) -> None:
    clock = FakeClock()
    holder = AgentStateSaver(backend.sync_client(), namespace=namespace)
    other = AgentStateSaver(backend.sync_client(), namespace=namespace)
    with holder.lease("t", lease_ms=LEASE_MS, clock=clock) as lease:
        wait_for(lambda: clock.waiting == 1, "the keeper to wait")
        clock.advance(lease.timing.interval_s)
        assert gate.entered.wait(30)  # the renewal is sent, and Redis does not answer
        wait_for(lambda: clock.waiting == 1, "the keeper to wait on the renewal")
        assert lease._require().lost_reason is None
        clock.advance(lease.timing.deadline_s - lease.timing.interval_s + 0.001)
        wait_for(lambda: lease._require().lost_reason is not None, "the keeper to declare the lease lost")
        assert "did not answer in time" in (lease.lost_reason or "")
        assert lease.lost and lease.renewals == 0
        with pytest.raises(LeaseLost, match="did not answer in time"):
            lease.check()
        gate.opened.set()  # the late renewal lands: a lost lease never comes back
        wait_for(lambda: lease._keeper._thread is not None and not lease._keeper._thread.is_alive(), "the keeper")
        assert lease.lost and lease.renewals == 0
    with other.lease("t", wait_ms=0):  # released on the way out
        _put(other, "t")


def test_revoking_a_thread_lease_while_it_renews(backend: Any, namespace: str, gate: Gate) -> None:
    clock = FakeClock()
    holder = AgentStateSaver(backend.sync_client(), namespace=namespace)
    other = AgentStateSaver(backend.sync_client(), namespace=namespace)
    with holder.lease("t", lease_ms=LEASE_MS, clock=clock) as lease:
        wait_for(lambda: clock.waiting == 1, "the keeper to wait")
        clock.advance(lease.timing.interval_s)
        assert gate.entered.wait(30)  # a renewal in flight
        assert lease.revoke()  # from another thread than the keeper's, without waiting for it
        assert not lease.revoke()  # once
        with other.lease("t", wait_ms=0):  # released in Redis at once
            _put(other, "t")
        gate.opened.set()  # the renewal is answered after the revoke: it finds the lease ended
        wait_for(lambda: lease._keeper._thread is not None and not lease._keeper._thread.is_alive(), "the keeper")
        assert not lease.lost and lease.lost_reason is None and lease.renewals == 0
        with pytest.raises(LeaseLost):
            _put(holder, "t")  # the revoked token still fences the holder's writes
    assert lease._state is not None and lease._state.ended == "released"
    _put(holder, "t")  # the block's end forgot the token: an unleased thread takes any writer


# ---- async: AsyncThreadLease ---------------------------------------------------------------------


async def test_an_async_thread_lease_renews_on_its_clock_at_each_interval(backend: Any, namespace: str) -> None:
    clock = FakeClock()
    holder = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    other = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    try:
        async with holder.lease("t", lease_ms=LEASE_MS, clock=clock) as lease:
            assert lease.clock is clock
            interval = lease.timing.interval_s
            first_expiry = _expiry(lease)
            for n in range(1, 9):
                await await_for(lambda: clock.waiting == 1, "the keeper to wait for its next renewal")
                clock.advance(interval - 0.01)
                await asyncio.sleep(0.05)
                assert lease.renewals == n - 1
                clock.advance(0.01 + 1e-6)  # past the interval, whatever the float rounding
                await await_for(lambda n=n: lease.renewals == n, f"renewal {n}")  # type: ignore[misc]
                lease.check()
                assert not lease.lost and lease.remaining_s() == pytest.approx(lease.timing.deadline_s)
            assert _expiry(lease) >= first_expiry
            with pytest.raises(ThreadBusy):
                await _aput(other, "t")
            await _aput(holder, "t")
        await _aput(other, "t")
    finally:
        await holder.client.aclose()
        await other.client.aclose()


async def test_an_async_thread_lease_renewal_that_outlives_its_deadline_cancels_the_work(
    backend: Any, namespace: str, gate: Gate
) -> None:
    clock = FakeClock()
    holder = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    other = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    reached_end = False
    try:
        with pytest.raises(LeaseLost, match="work cancelled"):
            async with holder.lease("t", lease_ms=LEASE_MS, clock=clock) as lease:
                await await_for(lambda: clock.waiting == 1, "the keeper to wait")
                clock.advance(lease.timing.interval_s)
                await await_for(gate.entered.is_set, "the renewal to be sent")
                await await_for(lambda: clock.waiting == 1, "the keeper to wait on the renewal")
                assert lease._require().lost_reason is None
                clock.advance(lease.timing.deadline_s - lease.timing.interval_s + 0.001)
                await asyncio.sleep(30)  # cancelled by the loss
                reached_end = True
        assert not reached_end
        assert "did not answer in time" in (lease.lost_reason or "") and lease.renewals == 0
        gate.opened.set()
        async with other.lease("t", wait_ms=0):  # released on the way out
            await _aput(other, "t")
    finally:
        await holder.client.aclose()
        await other.client.aclose()


async def test_revoking_an_async_thread_lease_while_it_renews(backend: Any, namespace: str, gate: Gate) -> None:
    clock = FakeClock()
    holder = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    other = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    try:
        async with holder.lease("t", lease_ms=LEASE_MS, clock=clock) as lease:
            await await_for(lambda: clock.waiting == 1, "the keeper to wait")
            clock.advance(lease.timing.interval_s)
            await await_for(gate.entered.is_set, "the renewal to be sent")
            assert await lease.revoke()
            assert not await lease.revoke()
            async with other.lease("t", wait_ms=0):
                await _aput(other, "t")
            gate.opened.set()
            keeper = lease._keeper._task
            assert keeper is not None
            await asyncio.wait_for(asyncio.shield(keeper), 30)  # the late reply finds the lease ended
            assert not lease.lost and lease.lost_reason is None and lease.renewals == 0
            with pytest.raises(LeaseLost):
                await _aput(holder, "t")
        assert lease._state is not None and lease._state.ended == "released"
        await _aput(holder, "t")
    finally:
        await holder.client.aclose()
        await other.client.aclose()


# ---- the acquire's send time ------------------------------------------------------------------


def test_a_thread_lease_taken_after_a_wait_counts_from_its_last_attempt(backend: Any, namespace: str) -> None:
    """A lease won after waiting on the holder is counted from the attempt that won it, not from the
    start of the wait: a wait longer than the renew deadline must not hand over a lease born lost."""
    holder = AgentStateSaver(backend.sync_client(), namespace=namespace)
    waiter = AgentStateSaver(backend.sync_client(), namespace=namespace)
    got: list[ThreadLease] = []
    lease_ms = 1_500  # renew deadline 1 s; the wait below is longer
    with holder.lease("t", lease_ms=LEASE_MS):

        def wait() -> None:
            with waiter.lease("t", lease_ms=lease_ms, wait_ms=10_000) as lease:
                got.append(lease)
                lease.check()

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(1.3)
    t.join(30)
    assert len(got) == 1 and not got[0].lost


# ---- the claim's send time, returned with the claim ------------------------------------------------


class Recording(CheckpointStore):
    """Overrides claim_next, as a store that records its claims: the claim's send time still reaches
    the lease, with the reply of ``super().claim_next``."""

    def claim_next(self, *, token: str, lease_ms: int, block_ms: int | None = None) -> Checkpoint | None:
        return super().claim_next(token=token, lease_ms=lease_ms, block_ms=block_ms)


class Copying(CheckpointStore):
    """Hands out a copy of the claim built field by field: a reply that carries no send time."""

    def claim_next(self, *, token: str, lease_ms: int, block_ms: int | None = None) -> Checkpoint | None:
        cp = super().claim_next(token=token, lease_ms=lease_ms, block_ms=block_ms)
        return None if cp is None else dataclasses.replace(cp)


@pytest.mark.parametrize("store_class", [CheckpointStore, Recording, Copying])
def test_a_lease_from_a_blocked_claim_next_counts_from_the_attempt_that_claimed(
    backend: Any, namespace: str, store_class: type[CheckpointStore]
) -> None:
    store = store_class(backend.sync_client(), namespace=namespace)
    creator = CheckpointStore(backend.sync_client(), namespace=namespace)
    waited = 1.2
    created: list[float] = []

    def create() -> None:
        created.append(time.monotonic())
        creator.create(Checkpoint("t"))

    timer = threading.Timer(waited, create)
    timer.start()
    lease = Lease.next(store, lease_ms=LEASE_MS, block_ms=20_000)
    assert lease is not None and lease.task_id == "t"
    # Each side is read in the order that makes the comparison exact, whatever the scheduler does:
    # the clock read second has seen more time go by.
    if store_class is Copying:
        since_created = time.monotonic() - created[0]
        age = lease.age_s()
    else:
        age = lease.age_s()
        since_created = time.monotonic() - created[0]
    timer.join()
    try:
        if store_class is Copying:
            # No send time with the reply: counted from the call's start, which came before the
            # task was created (the timer waits 1.2 s; comparing with `waited` itself missed by the
            # few ms between the timer's start and the call's, CI on 3.13).
            assert age > since_created
        else:  # counted from the attempt that claimed, which was sent after the task was created
            assert age <= since_created
    finally:
        with lease:
            lease.release()
    store._waker.close()  # type: ignore[union-attr]


async def test_an_async_lease_from_a_blocked_claim_next_counts_from_the_attempt_that_claimed(
    backend: Any, namespace: str
) -> None:
    store = AsyncCheckpointStore(backend.new_async_client(), namespace=namespace)
    creator = AsyncCheckpointStore(backend.new_async_client(), namespace=namespace)
    waited = 1.2

    created: list[float] = []

    async def create() -> None:
        await asyncio.sleep(waited)
        created.append(time.monotonic())
        await creator.create(Checkpoint("t"))

    task = asyncio.create_task(create())
    try:
        lease = await AsyncLease.next(store, lease_ms=LEASE_MS, block_ms=20_000)
        age = lease.age_s() if lease is not None else 0.0
        since_created = time.monotonic() - created[0]
        await task
        assert lease is not None and lease.task_id == "t"
        assert age <= since_created  # counted from the attempt that claimed, sent after the create
        async with lease:
            await lease.release()
    finally:
        if store._waker is not None:
            await store._waker.aclose()
        await store.client.aclose()
        await creator.client.aclose()
