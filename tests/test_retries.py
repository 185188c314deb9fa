"""Retries are safe, per operation, and connections are never reused mid-reply.

Each test puts ``tests/faults.FaultProxy`` between the store and a real
redis-server. ``lose_next_reply`` forwards one request, waits for the
server's reply (so the write has certainly applied), throws the reply away
and resets the connection. The store must then re-send and report the truth:

* create / save carry a per-call nonce, so the re-send of an applied write
  returns True and applies nothing a second time (a *new* call, with a new
  nonce, is correctly refused: the negative control that shows the nonce is
  doing the work);
* commit / finalize / acknowledge_terminal are named by their content, so the
  library's re-send and the caller's own re-send of the same write both
  return True and apply nothing a second time (a *different* write at the
  same revision is refused: the negative control);
* claim re-sent with the same token and cycle returns that same claim (the
  revision moved once);
* renew, delete, load and list are idempotent by nature.

Every case runs with redis-py's own retries switched off (so the re-send is
the library's ``RetryPolicy``) and with redis-py's defaults (so the
re-send is the client's); both are safe. Then: after a socket timeout, an
async cancellation or a blackholed connection, the late reply is never read
by the next command (redis-py disconnects the connection; we prove it).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
import redis.asyncio as aioredis
from conftest import RealServer, Twin, require_real
from faults import FaultProxy
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    BackendUnavailable,
    Checkpoint,
    CheckpointStore,
    RetryPolicy,
)
from redis_agentstate.wire.scripts import script_text

pytestmark = pytest.mark.real

LEASE = 60_000


def sha(name: str) -> bytes:
    return hashlib.sha1(script_text(name).encode()).hexdigest().encode()


@pytest.fixture
def proxy(real_server: RealServer) -> Iterator[FaultProxy]:
    url = urlparse(require_real(real_server))
    p = FaultProxy(url.port or 6379, url.hostname or "127.0.0.1")
    yield p
    p.stop()


@pytest.fixture
def direct(real_server: RealServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(require_real(real_server))
    yield client
    client.close()


class Harness:
    """A store through the proxy (``via``) and one straight to the server (``admin``)."""

    def __init__(self, via: Any, admin: CheckpointStore, proxy: FaultProxy) -> None:
        self.via = via
        self.admin = admin
        self.proxy = proxy

    def lose_reply_of(self, script: str) -> bytes:
        pattern = sha(script)
        self.proxy.watch(pattern)
        self.proxy.lose_next_reply(pattern)
        return pattern

    def assert_resent_once(self, pattern: bytes) -> None:
        assert self.proxy.stats["replies_lost"] == 1, self.proxy.stats
        assert self.proxy.armed == 0
        assert self.proxy.seen(pattern) == 2, "the request was not re-sent exactly once"


@pytest.fixture(params=["sync-library-retry", "sync-client-retry", "async-library-retry", "async-client-retry"])
def h(
    request: pytest.FixtureRequest, proxy: FaultProxy, direct: redis.Redis, twin_loop: asyncio.AbstractEventLoop
) -> Iterator[Harness]:
    flavor, layer = request.param.split("-", 1)
    kw: dict[str, Any] = {"port": proxy.port, "socket_timeout": 5}
    if layer == "library-retry":
        kw["retry"] = Retry(NoBackoff(), 0)  # redis-py does not re-send: our RetryPolicy must
    ns = f"rt-{uuid.uuid4().hex[:8]}"
    admin = CheckpointStore(direct, namespace=ns)
    # Load every script on the server first, so the lost reply is the script's, not a NOSCRIPT.
    admin.create(Checkpoint("warm"))
    admin.claim("warm", 1, token="w", lease_ms=LEASE)
    admin.renew("warm", token="w", expected_revision=1, lease_ms=LEASE)
    admin.commit(Checkpoint("warm", cycle_index=1), token="w", expected_revision=1)
    admin.finalize(Checkpoint("warm", cycle_index=1, terminal_result=1), expected_revision=2)
    admin.acknowledge_terminal("warm", expected_revision=3)
    admin.save(Checkpoint("warm"))
    admin.load("warm")
    admin.delete("warm")
    if flavor == "sync":
        client: Any = redis.Redis(**kw)
        yield Harness(CheckpointStore(client, namespace=ns), admin, proxy)
        client.close()
    else:
        aclient = aioredis.Redis(**kw)
        yield Harness(Twin(AsyncCheckpointStore(aclient, namespace=ns), twin_loop), admin, proxy)
        twin_loop.run_until_complete(aclient.aclose())


def claimed(h: Harness, tid: str, cycle: int = 1, token: str = "tok") -> Checkpoint:
    cp = h.admin.claim(tid, cycle, token=token, lease_ms=LEASE)
    assert cp is not None
    return cp


# ---- a lost reply, per operation ----------------------------------------------


def test_create_lost_reply_is_true_and_applied_once(h: Harness) -> None:
    pattern = h.lose_reply_of("create")
    assert h.via.create(Checkpoint("t", messages=["m"])) is True
    h.assert_resent_once(pattern)
    cp = h.admin.load("t")
    assert cp.messages == ["m"] and cp.revision == 0
    assert h.via.create(Checkpoint("t")) is False  # negative control: a new call is refused


def test_save_lost_reply_is_applied_once(h: Harness) -> None:
    pattern = h.lose_reply_of("save")
    h.via.save(Checkpoint("t", cycle_index=4, messages=["a", "b"], revision=7))
    h.assert_resent_once(pattern)
    cp = h.admin.load("t")
    assert (cp.cycle_index, cp.messages, cp.revision) == (4, ["a", "b"], 7)


def test_commit_lost_reply_is_true_and_applied_once(h: Harness) -> None:
    h.admin.create(Checkpoint("t", messages=["m0"]))
    cp = claimed(h, "t")
    cp.cycle_index = 1
    cp.messages.append("m1")
    cp.cycles.append({"c": 1})
    pattern = h.lose_reply_of("commit")
    assert h.via.commit(cp, token="tok", expected_revision=cp.revision) is True
    h.assert_resent_once(pattern)
    after = h.admin.load("t")
    assert after.revision == cp.revision + 1
    assert after.messages == ["m0", "m1"] and after.cycles == [{"c": 1}]  # appended once
    assert after.claim_token is None
    # The caller's own re-send of the same write is recognised too; a different write is fenced out.
    assert h.via.commit(cp, token="tok", expected_revision=cp.revision) is True
    cp.messages.append("m2")
    assert h.via.commit(cp, token="tok", expected_revision=cp.revision) is False  # negative control
    assert h.admin.load("t") == after


def test_commit_lost_reply_then_next_claim_is_still_true(h: Harness) -> None:
    """The re-send arrives after another worker claimed the next cycle (the revision moved on).

    Found by the chaos suite: the nonce was only honoured while the revision was
    still ``expected + 1``, so this re-send was told False for a write that had
    applied, and the worker believed a committed cycle was lost.
    """
    h.admin.create(Checkpoint("t", messages=["m0"]))
    cp = claimed(h, "t")
    cp.cycle_index = 1
    cp.messages.append("m1")
    taken: list[Checkpoint | None] = []
    h.proxy.watch(sha("commit"))
    h.proxy.lose_next_reply(
        sha("commit"), then=lambda: taken.append(h.admin.claim("t", 2, token="next", lease_ms=LEASE))
    )
    assert h.via.commit(cp, token="tok", expected_revision=cp.revision) is True
    h.assert_resent_once(sha("commit"))
    assert taken and taken[0] is not None and taken[0].revision == cp.revision + 2
    after = h.admin.load("t")
    assert after.messages == ["m0", "m1"] and after.claim_token == "next"


def test_finalize_lost_reply_is_true_and_applied_once(h: Harness) -> None:
    h.admin.create(Checkpoint("t", messages=["m0"]))
    cp = h.admin.load("t")
    cp.status = AgentStatus.COMPLETED
    cp.terminal_result = {"answer": 42}
    cp.messages.append("done")
    pattern = h.lose_reply_of("finalize")
    assert h.via.finalize(cp, expected_revision=0) is True
    h.assert_resent_once(pattern)
    after = h.admin.load("t")
    assert after.revision == 1 and after.terminal_result == {"answer": 42}
    assert after.messages == ["m0", "done"]
    assert h.via.finalize(cp, expected_revision=0) is True  # the caller's re-send of the same write
    cp.terminal_result = {"answer": 43}
    assert h.via.finalize(cp, expected_revision=0) is False  # negative control: a different write
    assert h.admin.load("t") == after


def test_acknowledge_lost_reply_is_true_and_applied_once(h: Harness) -> None:
    h.admin.create(Checkpoint("t", status=AgentStatus.FAILED, terminal_result="boom"))
    pattern = h.lose_reply_of("acknowledge_terminal")
    assert h.via.acknowledge_terminal("t", expected_revision=0) is True
    h.assert_resent_once(pattern)
    assert h.admin.load("t") is None
    assert h.via.acknowledge_terminal("t", expected_revision=0) is True  # the caller's re-send
    assert h.via.acknowledge_terminal("t", expected_revision=1) is False  # negative control


def test_claim_lost_reply_returns_the_same_claim(h: Harness) -> None:
    h.admin.create(Checkpoint("t"))
    pattern = h.lose_reply_of("claim")
    cp = h.via.claim("t", 1, token="tok", lease_ms=LEASE)
    h.assert_resent_once(pattern)
    assert cp is not None and cp.claim_token == "tok" and cp.claimed_cycle == 1
    assert cp.revision == 1  # bumped once, not twice
    stored = h.admin.load("t")
    assert stored.revision == 1 and stored.lease_expires_at_ms == cp.lease_expires_at_ms
    cp.cycle_index = 1
    assert h.via.commit(cp, token="tok", expected_revision=cp.revision)


def test_renew_lost_reply_is_true(h: Harness) -> None:
    h.admin.create(Checkpoint("t"))
    cp = claimed(h, "t")
    pattern = h.lose_reply_of("renew")
    assert h.via.renew("t", token="tok", expected_revision=cp.revision, lease_ms=LEASE) is True
    h.assert_resent_once(pattern)
    stored = h.admin.load("t")
    assert stored.revision == cp.revision and stored.claim_token == "tok"
    assert stored.lease_expires_at_ms >= cp.lease_expires_at_ms


def test_delete_load_list_lost_replies(h: Harness) -> None:
    h.admin.create(Checkpoint("a", messages=["x"]))
    h.admin.create(Checkpoint("b"))
    pattern = h.lose_reply_of("load")
    assert h.via.load("a").messages == ["x"]
    h.assert_resent_once(pattern)
    h.proxy.stats.clear()
    h.proxy.watch(b"ZRANGEBYLEX")
    h.proxy.lose_next_reply(b"ZRANGEBYLEX")
    assert h.via.list() == ["a", "b"]
    assert h.proxy.stats["replies_lost"] == 1
    h.proxy.stats.clear()
    h.proxy.lose_next_reply(sha("delete"))
    h.via.delete("a")
    assert h.proxy.stats["replies_lost"] == 1
    assert h.admin.list() == ["b"]


# ---- bounded retries ---------------------------------------------------------


def test_retries_are_bounded_and_then_raise(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = redis.Redis(port=proxy.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    policy = RetryPolicy(attempts=4, max_wait_s=0.05, max_delay_s=5)
    store = CheckpointStore(client, namespace=f"rt-{uuid.uuid4().hex[:8]}", retry=policy)
    store.list()  # connect
    before = proxy.stats["connections"]
    with proxy.fault("reset"):
        t0 = time.monotonic()
        with pytest.raises(BackendUnavailable) as info:
            store.load("t")
        elapsed = time.monotonic() - t0
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    # Each attempt after the first reconnects (redis-py may also replace the reset
    # connection before the first one): never more connections than attempts.
    assert policy.attempts - 1 <= proxy.stats["connections"] - before <= policy.attempts
    assert elapsed < 2
    assert store.load("t") is None  # and the store works again once the network does
    client.close()


# ---- no reuse mid-reply ------------------------------------------------------


def _two_tasks(admin: CheckpointStore) -> None:
    admin.create(Checkpoint("A", messages=["I am A"] * 50, shared_state={"who": "A"}))
    admin.create(Checkpoint("B", messages=["I am B"], shared_state={"who": "B"}))


def _assert_b(cp: Checkpoint | None) -> None:
    assert cp is not None and cp.task_id == "B"
    assert cp.shared_state == {"who": "B"} and cp.messages == ["I am B"]


@pytest.mark.parametrize("fault", ["delay", "blackhole"])
def test_sync_timeout_discards_the_connection(proxy: FaultProxy, direct: redis.Redis, fault: str) -> None:
    ns = f"rt-{uuid.uuid4().hex[:8]}"
    _two_tasks(CheckpointStore(direct, namespace=ns))
    # One connection at most: if the timed-out one went back to the pool, B's read would get A's reply.
    pool = redis.BlockingConnectionPool(port=proxy.port, max_connections=1, socket_timeout=0.3, timeout=5)
    client = redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
    store = CheckpointStore(client, namespace=ns, retry=RetryPolicy(attempts=2, max_wait_s=0.01))
    assert store.load("B") is not None
    with proxy.fault(fault, delay_s=0.5):
        with pytest.raises(BackendUnavailable) as info:
            store.load("A")
        assert isinstance(info.value.__cause__, redis.TimeoutError)
    time.sleep(1.2)  # the delayed reply to A has arrived by now (delay mode)
    _assert_b(store.load("B"))
    client.close()


def test_async_cancellation_discards_the_connection(
    proxy: FaultProxy, direct: redis.Redis, twin_loop: asyncio.AbstractEventLoop
) -> None:
    ns = f"rt-{uuid.uuid4().hex[:8]}"
    _two_tasks(CheckpointStore(direct, namespace=ns))

    async def scenario() -> None:
        pool = aioredis.BlockingConnectionPool(port=proxy.port, max_connections=1, timeout=5)
        client = aioredis.Redis(connection_pool=pool)
        store = AsyncCheckpointStore(client, namespace=ns)
        assert await store.load("B") is not None
        proxy.set_mode("delay", delay_s=0.4)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(store.load("A"), 0.2)  # cancelled mid-reply
        proxy.set_mode("pass")
        await asyncio.sleep(1.0)  # A's late reply is on the wire by now
        _assert_b(await store.load("B"))
        # The same for a write: a cancelled commit applies at most once, and the connection is fresh.
        cp = await store.claim("B", 1, token="t", lease_ms=LEASE)
        assert cp is not None
        cp.cycle_index = 1
        cp.messages.append("B1")
        proxy.set_mode("delay", delay_s=0.4)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(store.commit(cp, token="t", expected_revision=cp.revision), 0.2)
        proxy.set_mode("pass")
        await asyncio.sleep(1.0)
        after = await store.load("B")
        assert after is not None and after.task_id == "B"
        assert after.messages in (["I am B"], ["I am B", "B1"])
        assert after.revision in (cp.revision, cp.revision + 1)
        await client.aclose()

    twin_loop.run_until_complete(scenario())


def test_async_socket_timeout_discards_the_connection(
    proxy: FaultProxy, direct: redis.Redis, twin_loop: asyncio.AbstractEventLoop
) -> None:
    ns = f"rt-{uuid.uuid4().hex[:8]}"
    _two_tasks(CheckpointStore(direct, namespace=ns))

    async def scenario() -> None:
        pool = aioredis.BlockingConnectionPool(port=proxy.port, max_connections=1, socket_timeout=0.3, timeout=5)
        client = aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        store = AsyncCheckpointStore(client, namespace=ns, retry=RetryPolicy(attempts=2, max_wait_s=0.01))
        assert await store.load("B") is not None
        proxy.set_mode("delay", delay_s=0.5)
        with pytest.raises(BackendUnavailable) as info:
            await store.load("A")
        assert isinstance(info.value.__cause__, redis.TimeoutError)
        proxy.set_mode("pass")
        await asyncio.sleep(1.2)
        _assert_b(await store.load("B"))
        await client.aclose()

    twin_loop.run_until_complete(scenario())


def test_default_policy_is_bounded_and_jittered() -> None:
    policy = RetryPolicy()
    assert 1 < policy.attempts <= 5 and policy.max_delay_s <= 10
    waits = {round(policy.sync().wait(_FakeState(n)), 6) for n in range(1, 6) for _ in range(5)}  # type: ignore[arg-type]
    assert len(waits) > 5 and max(waits) <= policy.max_wait_s


class _Clock:
    """A monotonic clock the test moves: the deadline rule checked without the machine's load in it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _attempt_starts(
    policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch, attempt_s: float = 0.002
) -> tuple[_Clock, float, list[float]]:
    """Drive ``policy``'s retrier over a call that always fails (``attempt_s`` each); when each attempt started.

    On a fake clock: under a loaded CI the gap between tenacity's stop decision and the
    attempt's first line is the scheduler's, not the policy's, and a wall-clock bound on it flakes.
    """
    from redis_agentstate.wire import retry as retry_module

    clock = _Clock()
    monkeypatch.setattr(retry_module, "time", clock)
    started = clock.now
    retrier = policy.sync(started)
    retrier.sleep = clock.sleep  # type: ignore[method-assign]
    starts: list[float] = []
    with pytest.raises(redis.ConnectionError):
        for attempt in retrier:
            with attempt:
                starts.append(clock.now)
                clock.now += attempt_s
                raise redis.ConnectionError("down")
    return clock, started, starts


def test_no_attempt_starts_after_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = RetryPolicy(attempts=10_000, max_wait_s=0.05, multiplier_s=0.05, max_delay_s=0.3)
    clock, started, starts = _attempt_starts(policy, monkeypatch)
    assert len(starts) > 3 and all(s < started + 0.3 for s in starts)
    assert clock.now <= started + 0.3 + 0.002  # no wait ends after the deadline either (the last attempt may)
    # and the deadline is what stopped it, not the attempt count
    assert len(starts) < 10_000


def test_attempts_count_the_first_try_and_max_delay_zero_means_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(_attempt_starts(RetryPolicy(attempts=3, max_wait_s=0.01, multiplier_s=0.01), monkeypatch)[2]) == 3
    assert len(_attempt_starts(RetryPolicy(attempts=100, max_delay_s=0), monkeypatch)[2]) == 1


# ---- the documented bound: max_delay_s plus one attempt ---------------------------------------


class Blackhole:
    """Where a call can only time out.

    ``silent``: a TCP server that accepts connections and never answers (a frozen Redis, or a
    partition after the handshake); ``connections`` counts the attempts, since redis-py drops a
    connection that timed out. ``unreachable``: a listener whose accept queue is full, so the
    kernel drops new SYNs and every connect times out (a blackholed address).
    """

    def __init__(self, kind: str = "silent") -> None:
        self.kind = kind
        self.held: list[socket.socket] = []
        if kind == "silent":
            self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
            self.port = self.listener.getsockname()[1]
            threading.Thread(target=self._accept, daemon=True).start()
            return
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port = self.listener.getsockname()[1]
        filler = socket.create_connection(("127.0.0.1", self.port), timeout=2)  # fills the queue
        self.held.append(filler)
        probe = socket.socket()
        probe.settimeout(0.2)
        with probe, pytest.raises(OSError):  # proves SYNs are now dropped
            probe.connect(("127.0.0.1", self.port))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)

    @property
    def connections(self) -> int:
        return len(self.held)

    def close(self) -> None:
        self.listener.close()
        for c in self.held:
            c.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    b = Blackhole("silent")
    yield b
    b.close()


@pytest.fixture
def unreachable() -> Iterator[Blackhole]:
    b = Blackhole("unreachable")
    yield b
    b.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TIMEOUT = 0.4  # the client's socket_connect_timeout and socket_timeout
MARGIN = 0.75  # scheduling slack on a loaded machine: this is a bound, not a benchmark


def _timed_call(flavor: str, port: int, policy: RetryPolicy, twin_loop: asyncio.AbstractEventLoop) -> float:
    # The documented recipe for a tight bound: redis-py's own retries off, explicit timeouts.
    kw: dict[str, Any] = {"port": port, "socket_timeout": TIMEOUT, "socket_connect_timeout": TIMEOUT}
    kw["retry"] = Retry(NoBackoff(), 0)
    t0 = time.monotonic()
    if flavor == "sync":
        client = redis.Redis(**kw)
        with pytest.raises(BackendUnavailable):
            CheckpointStore(client, namespace="bound", retry=policy).load("t")
        client.close()
    else:

        async def call() -> None:
            client = aioredis.Redis(**kw)
            try:
                with pytest.raises(BackendUnavailable):
                    await AsyncCheckpointStore(client, namespace="bound", retry=policy).load("t")
            finally:
                await client.aclose()

        twin_loop.run_until_complete(call())
    return time.monotonic() - t0


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_max_delay_zero_means_one_attempt_against_a_blackhole(
    flavor: str, blackhole: Blackhole, twin_loop: asyncio.AbstractEventLoop
) -> None:
    # Before: the first attempt ran outside the deadline's clock, so max_delay_s=0 still made two.
    elapsed = _timed_call(flavor, blackhole.port, RetryPolicy(attempts=100, max_delay_s=0), twin_loop)
    assert blackhole.connections == 1
    assert elapsed <= 0 + 2 * TIMEOUT + MARGIN


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_call_against_a_blackhole_ends_within_max_delay_plus_one_attempt(
    flavor: str, blackhole: Blackhole, twin_loop: asyncio.AbstractEventLoop
) -> None:
    policy = RetryPolicy(attempts=10_000, max_delay_s=1.0, max_wait_s=0.05, multiplier_s=0.05)
    elapsed = _timed_call(flavor, blackhole.port, policy, twin_loop)
    assert elapsed <= policy.max_delay_s + 2 * TIMEOUT + MARGIN
    # Attempts of ~TIMEOUT each kept starting until the deadline, and none after it.
    assert 2 <= blackhole.connections <= int(policy.max_delay_s / TIMEOUT) + 1
    assert elapsed >= policy.max_delay_s - policy.max_wait_s  # gave up only when no attempt could start in time


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize("max_delay_s", [0.0, 1.0])
def test_a_call_to_a_blackholed_address_ends_within_max_delay_plus_one_attempt(
    flavor: str, max_delay_s: float, unreachable: Blackhole, twin_loop: asyncio.AbstractEventLoop
) -> None:
    # Every connect times out (socket_connect_timeout): attempts of ~TIMEOUT until the deadline.
    policy = RetryPolicy(attempts=10_000, max_delay_s=max_delay_s, max_wait_s=0.05, multiplier_s=0.05)
    elapsed = _timed_call(flavor, unreachable.port, policy, twin_loop)
    assert TIMEOUT * 0.9 <= elapsed <= policy.max_delay_s + 2 * TIMEOUT + MARGIN


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_call_against_a_closed_port_ends_within_max_delay(flavor: str, twin_loop: asyncio.AbstractEventLoop) -> None:
    # Refused connections fail at once, so the waits are the whole story: none may end past
    # the deadline (before: the last one could run max_wait_s beyond it, here up to 3 s).
    policy = RetryPolicy(attempts=10_000, max_delay_s=1.0, max_wait_s=3.0, multiplier_s=3.0)
    elapsed = _timed_call(flavor, closed_port(), policy, twin_loop)
    assert elapsed <= policy.max_delay_s + MARGIN


class _FakeState:
    """The two attributes tenacity's wait strategies read."""

    def __init__(self, n: int) -> None:
        self.attempt_number = n
        self.seconds_since_start = 0.0
        self.outcome: Callable[[], None] | None = None
