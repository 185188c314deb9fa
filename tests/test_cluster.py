"""The stores on a real 3-primary Redis Cluster, through ``RedisCluster`` (sync and asyncio).

What is proven here:

* every script's keys share one slot for any task id (no CROSSSLOT possible);
* the checkpoint flow (create, claim, renew, commit, finalize, acknowledge,
  delete, load, list) works with tasks spread over all 64 shards and all
  three primaries, from both client flavors;
* a ``SCRIPT FLUSH`` on every node is invisible (NOSCRIPT is handled);
* moving a slot that holds live tasks to another primary, by hand
  (SETSLOT/MIGRATE with pauses, so clients see ASK and TRYAGAIN) and with
  ``redis-cli --cluster reshard``, while workers claim and commit, loses
  nothing: every acknowledged commit is in the final state, exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from cluster_support import LocalCluster, cluster_backend, redis_cluster  # noqa: F401 - fixture
from conftest import Twin
from flows import HOSTILE_IDS, checkpoint_flow, claim_next_flow, ids_on_every_shard, kv_flow, pool_flow
from redis.crc import key_slot

from redis_agentstate import (
    AsyncCheckpointStore,
    BackendError,
    Checkpoint,
    CheckpointStore,
)
from redis_agentstate.keys import DEFAULT_SHARDS, Keys
from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore
from redis_agentstate.pools import AsyncPoolStore, PoolStore

pytestmark = [pytest.mark.cluster, pytest.mark.real]


def ns() -> str:
    return f"cl-{uuid.uuid4().hex[:8]}"


def test_every_task_key_set_is_in_one_slot() -> None:
    keys = Keys("tenant:a")
    for tid in [*HOSTILE_IDS, *ids_on_every_shard(keys)]:
        slots = {key_slot(k.encode()) for k in keys.task(tid).as_list()}
        assert len(slots) == 1, (tid, slots)
    shard_slots = {key_slot(keys.shard_tasks(s).encode()) for s in range(DEFAULT_SHARDS)}
    assert len(shard_slots) == DEFAULT_SHARDS  # 64 distinct slots: the namespace spreads over the cluster


def test_shards_cover_every_primary(redis_cluster: LocalCluster) -> None:  # noqa: F811
    keys = Keys(ns())
    owners = {redis_cluster.owner_of_slot(key_slot(keys.shard_tasks(s).encode())).port for s in range(DEFAULT_SHARDS)}
    assert owners == {n.port for n in redis_cluster.nodes}


@pytest.fixture(params=["sync", "async"])
def cluster_make(request: pytest.FixtureRequest, redis_cluster: LocalCluster, twin_loop: Any) -> Any:  # noqa: F811
    """``cluster_make(SyncCls, AsyncCls)``: a store of this flavor on a RedisCluster client."""
    backend = cluster_backend(redis_cluster)

    def build(sync_cls: type, async_cls: type, **kw: Any) -> Any:
        kw.setdefault("namespace", ns())
        if request.param == "sync":
            return sync_cls(backend.sync_client(), **kw)
        return Twin(async_cls(backend.async_client(), **kw), twin_loop)

    yield build
    backend.close(twin_loop)


@pytest.fixture
def cluster_store(cluster_make: Any) -> Any:
    return cluster_make(CheckpointStore, AsyncCheckpointStore)


def test_checkpoint_flow_across_all_shards(cluster_store: Any) -> None:
    keys = Keys(cluster_store.namespace)
    checkpoint_flow(cluster_store, ids_on_every_shard(keys))


def test_claim_next_finds_tasks_on_every_node(cluster_store: Any) -> None:
    claim_next_flow(cluster_store, ids_on_every_shard(Keys(cluster_store.namespace), per_shard=2))


def test_pools_on_every_node(cluster_make: Any, redis_cluster: LocalCluster) -> None:  # noqa: F811
    pools = cluster_make(PoolStore, AsyncPoolStore)
    keys = Keys(pools.namespace)
    pool_ids = ids_on_every_shard(keys, prefix="pool")[::8]  # 8 pools on 8 shards
    owners = {redis_cluster.owner_of_slot(key_slot(keys.pool(p).state.encode())).port for p in pool_ids}
    assert len(owners) >= 2
    for pid in pool_ids:
        pool_flow(pools, pid)
    assert sorted(pools.list()) == sorted(pool_ids)


def test_kv_keys_and_count_across_all_shards(cluster_make: Any) -> None:
    kv = cluster_make(KeyValueStore, AsyncKeyValueStore)
    kv_flow(kv, [*(k[:500] for k in HOSTILE_IDS), *ids_on_every_shard(Keys(kv.namespace), prefix="k")])


def test_hostile_ids_and_big_list_on_cluster(cluster_store: Any) -> None:
    tids = sorted({*HOSTILE_IDS, *(f"bulk-{i}" for i in range(300))})
    for tid in tids:
        assert cluster_store.create(Checkpoint(task_id=tid))
    assert cluster_store.list() == tids
    for tid in HOSTILE_IDS:
        assert cluster_store.load(tid).task_id == tid
        cluster_store.delete(tid)
    assert cluster_store.list() == sorted(t for t in tids if t not in HOSTILE_IDS)


def test_script_flush_on_every_node_is_invisible(redis_cluster: LocalCluster) -> None:  # noqa: F811
    client = redis_cluster.sync_client()
    try:
        store = CheckpointStore(client, namespace=ns())
        tids = ids_on_every_shard(Keys(store.namespace))
        for tid in tids:
            store.create(Checkpoint(task_id=tid))
        for node in redis_cluster.nodes:
            with node.client() as c:
                c.script_flush()
        for tid in tids:
            assert store.claim(tid, 1, token="t", lease_ms=10_000) is not None
    finally:
        client.close()


# ---- live slot migration ----------------------------------------------------


class Ledger:
    """What the workers were told: per task, the cycles whose commit returned True."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, list[int]] = {}
        self.resolved_unknown = 0
        self.errors: Counter[str] = Counter()

    def ack(self, tid: str, cycle: int) -> None:
        with self.lock:
            self.acked.setdefault(tid, []).append(cycle)


def _advance(store: CheckpointStore, tid: str, token: str, ledger: Ledger) -> None:
    """Claim the next cycle of ``tid`` and commit it; resolve unknown outcomes by reading."""
    cp = store.load(tid)
    if cp is None:
        raise AssertionError(f"task {tid} vanished")
    nxt = cp.cycle_index + 1
    got = store.claim(tid, nxt, token=token, lease_ms=20_000)
    assert got is not None
    got.cycle_index = nxt
    got.messages.append(f"c{nxt}")
    try:
        ok = store.commit(got, token=token, expected_revision=got.revision)
    except BackendError as exc:
        # Outcome unknown: it may have applied. Read back and decide.
        ledger.errors[type(exc).__name__] += 1
        now = store.load(tid)
        assert now is not None
        if now.cycle_index == nxt and now.messages[-1] == f"c{nxt}" and now.revision == got.revision + 1:
            ledger.resolved_unknown += 1
            ledger.ack(tid, nxt)
        return
    assert ok, f"commit of {tid} cycle {nxt} fenced out with no competitor"
    ledger.ack(tid, nxt)


def _sync_worker(cluster: LocalCluster, namespace: str, tids: list[str], stop: threading.Event, ledger: Ledger) -> None:
    client = cluster.sync_client()
    store = CheckpointStore(client, namespace=namespace)
    token = f"w-{uuid.uuid4().hex[:6]}"
    try:
        while not stop.is_set():
            for tid in tids:
                try:
                    _advance(store, tid, token, ledger)
                except BackendError as exc:  # claim/load unavailable: try the next one
                    ledger.errors[type(exc).__name__] += 1
                    time.sleep(0.01)
    finally:
        client.close()


def _async_worker(
    cluster: LocalCluster, namespace: str, tids: list[str], stop: threading.Event, ledger: Ledger
) -> None:
    async def run() -> None:
        client = cluster.async_client()
        store = AsyncCheckpointStore(client, namespace=namespace)
        try:
            while not stop.is_set():
                for tid in tids:
                    try:
                        cp = await store.load(tid)
                        assert cp is not None
                        nxt = cp.cycle_index + 1
                        got = await store.claim(tid, nxt, token="aw", lease_ms=20_000)
                        assert got is not None
                        got.cycle_index = nxt
                        got.messages.append(f"c{nxt}")
                        try:
                            ok = await store.commit(got, token="aw", expected_revision=got.revision)
                        except BackendError as exc:
                            ledger.errors[type(exc).__name__] += 1
                            now = await store.load(tid)
                            assert now is not None
                            if now.cycle_index == nxt and now.revision == got.revision + 1:
                                ledger.resolved_unknown += 1
                                ledger.ack(tid, nxt)
                            continue
                        assert ok
                        ledger.ack(tid, nxt)
                    except BackendError as exc:
                        ledger.errors[type(exc).__name__] += 1
                        await asyncio.sleep(0.01)
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.slow
def test_slot_migration_under_live_workers(redis_cluster: LocalCluster) -> None:  # noqa: F811
    namespace = ns()
    keys = Keys(namespace)
    setup = redis_cluster.sync_client()
    store = CheckpointStore(setup, namespace=namespace)
    tids = ids_on_every_shard(keys, per_shard=2)  # 128 tasks, 2 per slot
    for tid in tids:
        assert store.create(Checkpoint(task_id=tid))

    def slot_of(tid: str) -> int:
        return key_slot(keys.task(tid).checkpoint.encode())

    # Slot A: moved by hand, key batches with pauses (clients see ASK and TRYAGAIN).
    slot_a = slot_of(tids[0])
    src_a = redis_cluster.owner_of_slot(slot_a)
    dst_a = next(n for n in redis_cluster.nodes if n.port != src_a.port)
    # Slot B: moved by redis-cli --cluster reshard, from the third node to slot A's old home.
    src_b = next(n for n in redis_cluster.nodes if n.port not in (src_a.port, dst_a.port))
    dst_b = src_a
    # Every task gets a worker; tasks are split so that no two workers compete.
    groups = [tids[i::5] for i in range(5)]
    stop = threading.Event()
    ledger = Ledger()
    threads = [
        threading.Thread(target=_sync_worker, args=(redis_cluster, namespace, g, stop, ledger)) for g in groups[:4]
    ]
    threads.append(threading.Thread(target=_async_worker, args=(redis_cluster, namespace, groups[4], stop, ledger)))
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        before = sum(map(len, ledger.acked.values()))
        stats_before = redis_cluster.error_stats()
        moved = redis_cluster.move_slot(slot_a, dst_a, batch=1, pause_s=0.02)
        assert moved >= 2  # the slot held live task keys (2 tasks x hash + lists + shard indexes)
        assert redis_cluster.owner_of_slot(slot_a).port == dst_a.port
        time.sleep(0.3)
        # reshard moves the source's lowest-numbered slots: ask for exactly as many
        # as reach the first slot that holds tasks.
        task_slots = {slot_of(t) for t in tids}
        owned_b = redis_cluster.slots_of(src_b)
        slot_b = next(s for s in owned_b if s in task_slots)
        redis_cluster.reshard(src_b, dst_b, owned_b.index(slot_b) + 1)
        assert redis_cluster.owner_of_slot(slot_b).port == dst_b.port
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    stats = redis_cluster.error_stats()
    during = sum(map(len, ledger.acked.values())) - before
    redirects = stats - stats_before
    print(f"commits during moves: {during}; client errors: {dict(ledger.errors)}; server replies: {redirects}")
    # The clients really were redirected mid-move (the server counts the error replies it sent).
    assert redirects.get("MOVED", 0) > 0
    assert redirects.get("ASK", 0) + redirects.get("TRYAGAIN", 0) > 0
    assert during > 0, "workers made no progress while slots moved"

    # Nothing lost, nothing doubled: each task is at exactly the cycles acknowledged.
    moved_tids = [t for t in tids if slot_of(t) in (slot_a, slot_b)]
    assert len(moved_tids) >= 4
    for tid in tids:
        cp = store.load(tid)
        acked = ledger.acked.get(tid, [])
        assert acked == list(range(1, len(acked) + 1)), (tid, acked)
        assert cp.cycle_index == len(acked), (tid, cp.cycle_index, len(acked))
        assert cp.messages == [f"c{i}" for i in range(1, len(acked) + 1)]
        assert cp.revision == 2 * len(acked)
    for tid in moved_tids:
        assert ledger.acked.get(tid), f"task {tid} in a moved slot made no progress"
    assert store.list() == sorted(tids)
    setup.close()
