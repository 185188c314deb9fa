"""claim_next(block_ms=...): blocks while nothing is due, woken by Redis when work becomes due."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import later

from redis_agentstate import AgentStatus, AsyncCheckpointStore, Checkpoint, CheckpointStore, InvalidArgument
from redis_agentstate.keys import DEFAULT_SHARDS, Keys

LONG = 20_000  # a block no test waits out: a claim before it ends was woken, not timed out


def running(tid: str) -> Checkpoint:
    return Checkpoint(task_id=tid, cycle_index=0, status=AgentStatus.RUNNING)


def other(backend: Any, namespace: str) -> CheckpointStore:
    """A second worker (its own client) on the same namespace."""
    return CheckpointStore(backend.sync_client(), namespace=namespace)


def close_waker(store: Any, loop: Any) -> None:
    """Stop a store's listeners before its event loop closes (the Twin's loop outlives no test)."""
    inner = getattr(store, "wrapped", store)
    waker = inner._waker
    if waker is None:
        return
    if isinstance(inner, AsyncCheckpointStore):
        loop.run_until_complete(waker.aclose())
    else:
        waker.close()


class TestBlocking:
    @pytest.fixture(autouse=True)
    def _setup(self, backend: Any, namespace: str, store: Any, twin_loop: Any) -> Iterator[None]:
        self.backend, self.namespace, self.store = backend, namespace, store
        self.peer = other(backend, namespace)
        yield
        close_waker(store, twin_loop)

    def timed(self, **kw: Any) -> tuple[Checkpoint | None, float]:
        t0 = time.monotonic()
        cp = self.store.claim_next(token=uuid.uuid4().hex, **kw)
        return cp, time.monotonic() - t0

    @pytest.mark.parametrize("bad", [-1, 1.5, "100", True, 86_400_001])
    def test_bad_block_ms(self, bad: Any) -> None:
        with pytest.raises(InvalidArgument):
            self.store.claim_next(token="t", lease_ms=1000, block_ms=bad)

    def test_none_after_block_ms_when_nothing_due(self) -> None:
        cp, took = self.timed(lease_ms=1000, block_ms=300)
        assert cp is None
        assert took >= 0.29
        cp, _ = self.timed(lease_ms=1000, block_ms=0)
        assert cp is None

    def test_due_work_is_claimed_at_once(self) -> None:
        self.peer.create(running("t1"))
        cp, _ = self.timed(lease_ms=60_000, block_ms=LONG)
        assert cp is not None and cp.task_id == "t1" and cp.claimed_cycle == 1

    def test_wakes_on_create(self) -> None:
        with later(0.3, lambda: self.peer.create(running("t1"))):
            cp, took = self.timed(lease_ms=60_000, block_ms=LONG)
        assert cp is not None and cp.task_id == "t1"
        assert took < LONG / 1000 / 2

    def test_wakes_on_runnable_commit(self) -> None:
        self.peer.create(running("t1"))
        held = self.peer.claim_next(token="w1", lease_ms=60_000)
        assert held is not None

        def commit() -> None:
            done = Checkpoint(task_id="t1", cycle_index=1, status=AgentStatus.RUNNING, shared_state={"n": 1})
            assert self.peer.commit(done, token="w1", expected_revision=held.revision)

        with later(0.3, commit):
            cp, took = self.timed(lease_ms=60_000, block_ms=LONG)
        assert cp is not None and cp.task_id == "t1" and cp.claimed_cycle == 2
        assert cp.shared_state == {"n": 1}
        assert took < LONG / 1000 / 2

    def test_wakes_on_release(self) -> None:
        self.peer.create(running("t1"))
        held = self.peer.claim_next(token="w1", lease_ms=60_000)
        assert held is not None
        release = lambda: self.peer.renew("t1", token="w1", expected_revision=held.revision, lease_ms=1)  # noqa: E731
        with later(0.3, release):
            cp, took = self.timed(lease_ms=60_000, block_ms=LONG)
        assert cp is not None and cp.task_id == "t1" and cp.claimed_cycle == 1 and cp.claim_token != "w1"
        assert took < LONG / 1000 / 2

    def test_finds_a_lapsed_lease(self) -> None:
        # A lapse publishes nothing: the waiter times itself by the lease's expiry.
        self.peer.create(running("t1"))
        sent = time.monotonic()
        assert self.peer.claim_next(token="w1", lease_ms=700) is not None
        cp, took = self.timed(lease_ms=60_000, block_ms=LONG)
        assert cp is not None and cp.task_id == "t1" and cp.claimed_cycle == 1
        # Not before the lease lapsed (timed from before the claim was sent: a loaded machine can
        # spend a good part of the 700 ms between the claim and the waiter), nor long after it.
        assert time.monotonic() - sent >= 0.69 and took < LONG / 1000 / 2

    def test_block_longer_than_the_clients_socket_timeout(self) -> None:
        # The fixtures build clients with from_url: redis-py 8 reads with a 5 s timeout.
        if self.backend.kind == "fake":
            pytest.skip("fakeredis has no socket")
        with later(5.8, lambda: self.peer.create(running("t1"))):
            cp, took = self.timed(lease_ms=60_000, block_ms=LONG)
        assert cp is not None and cp.task_id == "t1"
        assert took >= 5.7


def test_no_lost_wakeup_sync_threads(backend: Any, namespace: str) -> None:
    """Many blocked threads on one store, many creates: every task claimed exactly once."""
    store = CheckpointStore(backend.sync_client(), namespace=namespace)
    peer = other(backend, namespace)
    n_tasks, n_workers = 60, 12
    claimed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i: int) -> None:
        while not stop.is_set():
            cp = store.claim_next(token=f"w{i}-{uuid.uuid4().hex}", lease_ms=120_000, block_ms=300)
            if cp is not None:
                with lock:
                    claimed.append(cp.task_id)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_workers)]
    for t in threads:
        t.start()
    for i in range(n_tasks):
        peer.create(running(f"t{i}"))
        if i % 7 == 0:
            time.sleep(0.02)
    deadline = time.monotonic() + 30
    while len(claimed) < n_tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    counts = Counter(claimed)
    assert sorted(counts) == sorted(f"t{i}" for i in range(n_tasks))
    assert set(counts.values()) == {1}


def test_no_lost_wakeup_async_many_waiters(backend: Any, namespace: str) -> None:
    """200 blocked coroutines on one store; tasks created in bursts are each claimed exactly once."""

    async def main() -> None:
        client = backend.new_async_client()
        store = AsyncCheckpointStore(client, namespace=namespace)
        peer = other(backend, namespace)
        claimed: list[str] = []
        n_tasks = 80

        async def worker(i: int) -> None:
            while len(claimed) < n_tasks:
                cp = await store.claim_next(token=f"w{i}-{uuid.uuid4().hex}", lease_ms=120_000, block_ms=LONG)
                if cp is not None:
                    claimed.append(cp.task_id)

        workers = [asyncio.create_task(worker(i)) for i in range(200)]
        await asyncio.sleep(0.3)
        for i in range(n_tasks):
            await asyncio.to_thread(peer.create, running(f"t{i}"))
        try:
            await asyncio.wait_for(_until(lambda: len(claimed) >= n_tasks), 30)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            assert not store._waker.state.waiters  # cancelled waiters unregistered
            await store._waker.aclose()
            await client.aclose()
        counts = Counter(claimed)
        assert sorted(counts) == sorted(f"t{i}" for i in range(n_tasks))
        assert set(counts.values()) == {1}

    asyncio.run(main())


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.02)


@pytest.mark.xfail(
    sys.version_info < (3, 11),
    reason="Python 3.10 does not count cancel requests (no Task.cancelling()), so a cancel that the client "
    "library swallows mid-command (fakeredis and redis-py 8.1 do) cannot be re-raised by the waiter",
    strict=False,
)
def test_cancelled_async_waiter_leaves_nothing_stuck(backend: Any, namespace: str) -> None:
    async def main() -> None:
        client = backend.new_async_client()
        store = AsyncCheckpointStore(client, namespace=namespace)
        # Cancelled while it subscribes: the next caller subscribes again.
        early = asyncio.create_task(store.claim_next(token="a", lease_ms=60_000, block_ms=LONG))
        await asyncio.sleep(0)
        early.cancel()
        with pytest.raises(asyncio.CancelledError):
            await early
        waiter = asyncio.create_task(store.claim_next(token="a", lease_ms=60_000, block_ms=LONG))
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not store._waker.state.waiters
        # The store still works, blocking included, and the next create wakes the next caller.
        await asyncio.to_thread(other(backend, namespace).create, running("t1"))
        cp = await asyncio.wait_for(store.claim_next(token="b", lease_ms=60_000, block_ms=LONG), 10)
        assert cp is not None and cp.task_id == "t1"
        await store._waker.aclose()
        await client.aclose()

    asyncio.run(main())


def _subscribers(node_client: Any) -> int:
    """Connections of a node subscribed to any sharded channel (CLIENT LIST ``ssub=``)."""
    listed = node_client.execute_command("CLIENT", "LIST")
    text = listed.decode() if isinstance(listed, bytes) else str(listed)
    return sum(1 for line in text.splitlines() if "ssub=" in line and "ssub=0" not in line)


def _await_subscribed(cluster: Any, keys: Keys) -> None:
    """Wait until each shard's due channel has its one subscriber (the waker subscribes in the
    background; a fixed second was too short on a loaded machine), then check it is exactly one."""
    deadline = time.monotonic() + 30
    for s in range(DEFAULT_SHARDS):
        channel = keys.shard_due(s)
        owner = cluster.sync_client().get_node_from_key(channel)
        while True:
            numsub = int(owner.redis_connection.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])
            if numsub or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert numsub == 1, channel


def test_cluster_one_subscriber_connection_per_primary(redis_cluster: Any, namespace: str) -> None:
    cluster = redis_cluster
    nodes = [n.client() for n in cluster.nodes]
    before = [_subscribers(c) for c in nodes]

    async def main() -> None:
        client = cluster.async_client()
        store = AsyncCheckpointStore(client, namespace=namespace)
        waiters = [
            asyncio.create_task(store.claim_next(token=f"w{i}", lease_ms=60_000, block_ms=LONG)) for i in range(50)
        ]
        await asyncio.to_thread(_await_subscribed, cluster, Keys(namespace))
        during = [_subscribers(c) for c in nodes]
        for b, d in zip(before, during, strict=True):
            assert d - b <= 1
        sync_peer = CheckpointStore(cluster.sync_client(), namespace=namespace)
        await asyncio.to_thread(sync_peer.create, running("t1"))
        done, _ = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert [t.result().task_id for t in done] == ["t1"]
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await store._waker.aclose()
        await client.aclose()

    asyncio.run(main())

    # The sync store: 20 blocked threads, the same single subscriber connection per primary.
    store = CheckpointStore(cluster.sync_client(), namespace=namespace + "-sync")
    got: list[Any] = []

    def block(i: int) -> None:
        # Long enough that they are all still blocked when the subscriptions are counted.
        got.append(store.claim_next(token=f"s{i}", lease_ms=60_000, block_ms=6_000))

    before = [_subscribers(c) for c in nodes]
    threads = [threading.Thread(target=block, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    _await_subscribed(cluster, Keys(namespace + "-sync"))
    during = [_subscribers(c) for c in nodes]
    for b, d in zip(before, during, strict=True):
        assert d - b <= 1
    for t in threads:
        t.join()
    assert got == [None] * 20
    store._waker.close()
    for c in nodes:
        c.close()


def test_runner_is_woken(backend: Any, namespace: str) -> None:
    """An idle Runner blocks in claim_next and picks up a created task."""
    from redis_agentstate import Runner, StepResult

    claims: list[tuple[int | None, str | None]] = []

    class Recording(CheckpointStore):
        """Like the chaos workers' store: overrides claim_next, which the Runner must still go through."""

        def claim_next(self, *, token: str, lease_ms: int, block_ms: int | None = None) -> Checkpoint | None:
            cp = super().claim_next(token=token, lease_ms=lease_ms, block_ms=block_ms)
            claims.append((block_ms, cp.task_id if cp else None))
            return cp

    store = Recording(backend.sync_client(), namespace=namespace)
    seen: list[str] = []

    def handler(cp: Checkpoint) -> StepResult:
        seen.append(cp.task_id)
        cp.terminal_result = {"ok": True}
        cp.status = AgentStatus.COMPLETED
        return StepResult(cp, done=True)

    runner = Runner(store, handler, concurrency=3, handle_signals=False, idle_max_ms=3_000)
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        time.sleep(0.5)
        other(backend, namespace).create(running("t1"))
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runner.stop()
        t.join()
    assert seen == ["t1"]
    assert (3_000, "t1") in claims  # blocked through the override, with the Runner's idle_max_ms
    assert store._waker is not None
    store._waker.close()


@pytest.mark.benchmark
def test_blocking_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks.blocking`` and ``benchmarks.shard_spread`` in a tiny configuration."""
    import json

    from benchmarks import blocking, shard_spread

    blocking.main(["--window", "1", "--rounds", "1", "--samples", "5", "--workers", "10"])
    out = json.loads(capsys.readouterr().out)
    assert set(out["idle_server_cpu_pct"]) == {"polling", "blocking", "no_workers"}
    assert out["create_to_claimed_ms"]["blocking"]["n"] == 5
    assert [row["tasks"] for row in out["claim_next_when_due"]] == [100, 10_000]
    shard_spread.main(["--namespaces", "50"])
    spread = json.loads(capsys.readouterr().out)
    assert spread["distinct_slots_agentstate"] == 64
    assert sum(int(c) for c in spread["3_primaries"]["agentstate"].split()) == 64


def test_lost_subscription_wakes_callers_and_comes_back(backend: Any, namespace: str) -> None:
    """The server drops the subscriber: blocked callers poll, the next one resubscribes, nothing is missed."""
    if backend.kind != "real":
        pytest.skip("CLIENT KILL needs a real server")
    from redis_agentstate.wire import waker as _waker

    store = CheckpointStore(backend.sync_client(), namespace=namespace)
    peer = other(backend, namespace)
    admin = backend.sync_client()
    assert store.claim_next(token="w0", lease_ms=60_000, block_ms=100) is None
    assert store._waker.state.subscribed
    killed = admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    assert int(killed) >= 1
    with later(0.5, lambda: peer.create(running("t1"))):
        cp = store.claim_next(token="w1", lease_ms=60_000, block_ms=LONG)
    assert cp is not None and cp.task_id == "t1"
    deadline = time.monotonic() + _waker.RETRY_S + 10
    while not store._waker.state.subscribed and time.monotonic() < deadline:
        assert store.claim_next(token="w2", lease_ms=60_000, block_ms=500) is None
    assert store._waker.state.subscribed  # back after RETRY_S
    with later(0.3, lambda: peer.create(running("t2"))):
        cp = store.claim_next(token="w3", lease_ms=60_000, block_ms=LONG)
    assert cp is not None and cp.task_id == "t2"
    store._waker.close()


class TestWakeState:
    """The decisions of the waker, without I/O."""

    def test_one_announcement_wakes_one_caller_in_order(self) -> None:
        from redis_agentstate.wire.waker import Waiter, WakeState

        state = WakeState(subscribed=True)
        a, b = Waiter(None), Waiter(None)
        state.enter(a)
        state.enter(b)
        assert state.announced(0, 0.0) == [a]
        assert state.announced(0, 0.0) == [b]
        assert state.announced(0, 0.0) == []  # nobody left to wake: the next call attempts first anyway

    def test_an_unused_wakeup_is_passed_on(self) -> None:
        from redis_agentstate.wire.waker import Waiter, WakeState

        state = WakeState(subscribed=True)
        a, b = Waiter(None), Waiter(None)
        state.enter(a)
        state.enter(b)
        assert state.announced(0, 0.0) == [a]
        assert state.leave(a, used=False) == [b]  # a timed out or was cancelled
        assert b.woken
        assert state.leave(b, used=True) == []

    def test_a_later_due_time_arms_the_timer_and_one_caller_takes_it(self) -> None:
        from redis_agentstate.core.checkpoint import ClaimNextFound
        from redis_agentstate.wire.waker import Waiter, WakeState

        state = WakeState(subscribed=True)
        a = Waiter(None)
        state.enter(a)
        assert state.announced(500, 10.0) == [a]  # a nudge: re-time by the earlier timer
        assert not a.woken
        assert state.wait_s(deadline=20.0, now=10.0) == pytest.approx(0.5)
        assert not state.timer_due(10.4)
        assert state.timer_due(10.5)
        assert not state.timer_due(10.5)  # taken once
        # An attempt reports the earliest lease expiry: the callers sleep until then.
        state.probed(state.seq, ClaimNextFound(None, 2_000, False), 11.0)
        assert state.wait_s(deadline=60.0, now=11.0) == pytest.approx(2.0)

    def test_only_the_first_caller_sleeps_until_the_timer_and_hands_it_on(self) -> None:
        from redis_agentstate.wire.waker import Waiter, WakeState

        state = WakeState(subscribed=True)
        a, b = Waiter(None), Waiter(None)
        state.enter(a)
        state.enter(b)
        state.arm(10.5)
        assert state.wait_s(deadline=20.0, now=10.0, waiter=a) == pytest.approx(0.5)
        assert state.wait_s(deadline=20.0, now=10.0, waiter=b) == pytest.approx(10.0)  # no herd at the timer
        state.leave(a, used=True)
        assert state.wait_s(deadline=20.0, now=10.0, waiter=b) == pytest.approx(0.5)  # b holds the timer now

    def test_known_empty_until_an_announcement_a_timer_or_a_second(self) -> None:
        from redis_agentstate.core.checkpoint import ClaimNextFound
        from redis_agentstate.wire.waker import KNOWN_EMPTY_S, WakeState

        state = WakeState(subscribed=True)
        seq = state.seq
        state.probed(seq, ClaimNextFound(None, None, False), 5.0)
        assert state.known_empty(5.5)
        assert not state.known_empty(5.0 + KNOWN_EMPTY_S)
        state.announced(0, 5.6)
        assert not state.known_empty(5.7)
        # A probe that began before an announcement proves nothing.
        state.probed(seq, ClaimNextFound(None, None, False), 6.0)
        assert not state.known_empty(6.1)
        state.subscribed = False
        state.probed(state.seq, ClaimNextFound(None, None, False), 7.0)
        assert not state.known_empty(7.1)  # unsubscribed: every call attempts

    def test_a_lost_subscription_wakes_everyone_and_they_poll(self) -> None:
        from redis_agentstate.wire.waker import POLL_S, Waiter, WakeState

        state = WakeState(subscribed=True)
        waiters = [Waiter(None) for _ in range(3)]
        for w in waiters:
            state.enter(w)
        assert state.lost() == waiters
        assert all(w.woken for w in waiters)
        assert state.wait_s(deadline=100.0, now=1.0) == pytest.approx(POLL_S)
