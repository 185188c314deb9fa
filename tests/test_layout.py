"""A namespace's layout: slot-aware shard tags, the shard count as a namespace setting stored in
Redis (every client agrees; another count asked for is ``ConfigConflict`` before anything is
written), a 0.2 namespace kept in its legacy layout, a corrupt record refused; on every backend,
sync and async, for the checkpoint, pool, KV and LangGraph stores, and through the CLI."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from flows import claim_next_flow, ids_on_every_shard, kv_flow, pool_flow
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from redis.crc import key_slot as redis_py_key_slot

from redis_agentstate import (
    AsyncCheckpointStore,
    AsyncKeyValueStore,
    AsyncPoolStore,
    Checkpoint,
    CheckpointStore,
    ConfigConflict,
    CorruptState,
    InvalidArgument,
    KeyValueStore,
    PoolStore,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.keys import (
    DEFAULT_SHARDS,
    LAYOUT_LEGACY,
    LAYOUT_SLOTS,
    MAX_SHARDS,
    SLOTS,
    Keys,
    check_shards,
    shard_slots,
    shard_tags,
)
from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver
from redis_agentstate.wire.layout import parse_layout

NAMESPACES = ["agentstate", "tenant-42", "a", "ünï:cödé ✓", "x" * 128]


def even_ranges(primaries: int) -> list[tuple[int, int]]:
    """The slot range of each primary as ``redis-cli --cluster create`` assigns them."""
    per = SLOTS / primaries
    return [(round(i * per), round((i + 1) * per) - 1) for i in range(primaries)]


def per_primary(slots: list[int], primaries: int) -> list[int]:
    ranges = even_ranges(primaries)
    counts = Counter(next(i for i, (a, b) in enumerate(ranges) if a <= s <= b) for s in slots)
    return [counts.get(p, 0) for p in range(primaries)]


class TestTags:
    """The arithmetic: no server."""

    @pytest.mark.parametrize("namespace", NAMESPACES)
    @pytest.mark.parametrize("shards", [1, 3, 64, 1000, 1024])
    def test_every_tag_lands_on_its_evenly_spaced_slot(self, namespace: str, shards: int) -> None:
        slots = shard_slots(namespace, shards)
        tags = shard_tags(namespace, shards)
        keys = Keys(namespace, shards)
        # Redis's own slot function (redis-py's copy of it) on the full key, not on our tag.
        assert [redis_py_key_slot(keys.shard_tasks(s).encode()) for s in range(shards)] == slots
        assert len(set(slots)) == len(set(tags)) == shards
        gaps = sorted((b - a) % SLOTS for a, b in zip(slots, [*slots[1:], slots[0]], strict=True))
        assert gaps[-1] - gaps[0] <= 1 or shards == 1

    def test_every_slot_is_reachable(self) -> None:
        keys = Keys("agentstate", MAX_SHARDS)
        slots = {redis_py_key_slot(keys.shard_ready(s).encode()) for s in range(MAX_SHARDS)}
        assert slots == set(range(SLOTS))

    @pytest.mark.parametrize("namespace", NAMESPACES)
    @pytest.mark.parametrize("primaries", [3, 6, 12, 24, 48, 96])
    def test_no_primary_has_more_than_its_share_rounded_up(self, namespace: str, primaries: int) -> None:
        for shards in (64, 256, 1024):
            counts = per_primary(shard_slots(namespace, shards), primaries)
            assert max(counts) <= math.ceil(shards / primaries)
            assert min(counts) >= math.floor(shards / primaries)

    def test_the_issue_targets_at_24_and_48_primaries(self) -> None:
        """busiest / mean <= 1.15 and no idle primary: 64 shards reach it at 24 primaries, 256 at 48."""
        for namespace in NAMESPACES:
            for primaries, shards in ((24, 64), (48, 256), (48, 1024), (96, 1024)):
                counts = per_primary(shard_slots(namespace, shards), primaries)
                assert max(counts) / (shards / primaries) <= 1.15 and min(counts) > 0

    def test_no_two_counts_share_a_shard(self) -> None:
        """A namespace grown from one count to another moves every shard to keys of its own."""
        seen: dict[str, int] = {}
        for shards in (1, 2, 64, 128, 256, 1024):
            for tag in shard_tags("agentstate", shards):
                assert seen.setdefault(tag, shards) == shards
        assert not set(shard_tags("agentstate", 64, LAYOUT_LEGACY)) & set(seen)

    def test_the_legacy_layout_is_0_2s(self) -> None:
        keys = Keys("ns", DEFAULT_SHARDS, LAYOUT_LEGACY)
        assert keys.task("t").checkpoint == f"ns:{{ns#{keys.shard_of('t'):02d}}}:cp:t"
        assert keys.shard_ready(7) == "ns:{ns#07}:ready"
        with pytest.raises(InvalidArgument):
            Keys("ns", 128, LAYOUT_LEGACY)

    def test_tags_stay_inside_the_namespace_pattern(self) -> None:
        keys = Keys("acme", 256)
        pattern = keys.pattern()
        assert pattern == "acme:{acme#*"
        for s in range(256):
            assert keys.shard_prefix(s).startswith(pattern[:-1])
        assert keys.layout_key().startswith(pattern[:-1])

    @pytest.mark.parametrize("bad", [0, -1, MAX_SHARDS + 1, True, 1.5, "64", None])
    def test_bad_shard_counts(self, bad: object) -> None:
        with pytest.raises(InvalidArgument):
            check_shards(bad)

    @pytest.mark.parametrize(
        "raw", [b"", b"slots", b"slots 0", b"slots -1", b"slots 016", b"slots 99999", b"legacy 128", b"rings 64",
                b"slots 64 x", b"\xff\xfe", b"slots 64 96 0", b"slots 64 64 0", b"slots 64 128 65", b"slots 64 128",
                b"slots 64 32768 0", b"legacy 64 128 x"]
    )  # fmt: skip
    def test_a_record_we_would_not_write_is_corrupt(self, raw: bytes) -> None:
        with pytest.raises(CorruptState):
            parse_layout(raw, "k")
        assert parse_layout(b"slots 1024", "k") == (LAYOUT_SLOTS, 1024, 0, 0)
        assert parse_layout(b"legacy 64", "k") == (LAYOUT_LEGACY, 64, 0, 0)
        assert parse_layout(b"legacy 64 256 3", "k") == (LAYOUT_LEGACY, 64, 256, 3)
        assert parse_layout(b"slots 64 128 64", "k") == (LAYOUT_SLOTS, 64, 128, 64)

    def test_keys_before_the_layout_is_read_refuse(self) -> None:
        keys = Keys.unresolved("ns")
        assert not keys.resolved
        with pytest.raises(RuntimeError, match="layout"):
            keys.task("t")


def _core(store: Any) -> Any:
    return getattr(store, "wrapped", store)._core


def _record(raw: Any, namespace: str) -> bytes | None:
    value: bytes | None = raw.get(Keys(namespace).layout_key())
    return value


def _dump(raw: Any, namespace: str) -> dict[bytes, Any]:
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=Keys(namespace).pattern() + "*", count=1000))}


class TestNamespaceSetting:
    """The shard count is stored with the namespace; every client of it agrees (every backend)."""

    def test_a_new_namespace_gets_the_default_count_in_the_slot_layout(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        assert store.shards is None
        assert store.create(Checkpoint("t"))
        assert store.shards == DEFAULT_SHARDS
        assert _record(raw, namespace) == b"slots 64"
        keys = Keys(namespace)
        assert raw.exists(keys.task("t").checkpoint)

    def test_a_count_asked_for_is_stored_and_every_later_client_reads_it(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=256)
        keys = Keys(namespace, 256)
        claim_next_flow(store, ids_on_every_shard(keys, prefix="a"))
        assert _record(raw, namespace) == b"slots 256"
        tids = ids_on_every_shard(keys, prefix="b")
        for tid in tids:
            assert store.create(Checkpoint(tid))
        assert all(raw.exists(keys.task(t).checkpoint) for t in tids)
        later = make(CheckpointStore, AsyncCheckpointStore)  # shards=None: whatever is stored
        assert sorted(later.list()) == sorted(tids)
        assert later.shards == 256
        assert make(CheckpointStore, AsyncCheckpointStore, shards=256).load(tids[0]) is not None

    def test_another_count_is_refused_before_anything_is_written(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        first = make(CheckpointStore, AsyncCheckpointStore, shards=128)
        assert first.create(Checkpoint("t"))
        before = _dump(raw, namespace)
        for cls in ((CheckpointStore, AsyncCheckpointStore), (PoolStore, AsyncPoolStore),
                    (KeyValueStore, AsyncKeyValueStore)):  # fmt: skip
            other = make(*cls, shards=64)
            with pytest.raises(ConfigConflict, match="128 shards") as refused:
                other.count() if cls[0] is KeyValueStore else other.list()
            assert refused.value.key == Keys(namespace).layout_key()
        with pytest.raises(ConfigConflict):
            make(CheckpointStore, AsyncCheckpointStore, shards=64).create(Checkpoint("u"))
        assert _dump(raw, namespace) == before

    def test_the_first_writer_wins(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        a = make(CheckpointStore, AsyncCheckpointStore, shards=32)
        b = make(CheckpointStore, AsyncCheckpointStore, shards=96)
        assert a.create(Checkpoint("t"))
        with pytest.raises(ConfigConflict):
            b.create(Checkpoint("t"))
        assert _record(raw, namespace) == b"slots 32"

    def test_pools_kv_and_threads_share_the_namespace_count(
        self, make: Callable[..., Any], raw: Any, namespace: str, flavor: str, backend: Any, twin_loop: Any
    ) -> None:
        pools = make(PoolStore, AsyncPoolStore, shards=200)
        pool_flow(pools)
        keys = Keys(namespace, 200)
        assert raw.exists(keys.pool("pool-1").state)
        kv = make(KeyValueStore, AsyncKeyValueStore)
        kv_flow(kv, ids_on_every_shard(keys, prefix="k"))
        assert kv.shards == 200
        kv.set("here", b"v")
        assert raw.get(keys.kv("here")) == b"v"
        cp = make(CheckpointStore, AsyncCheckpointStore, shards=200)
        assert cp.create(Checkpoint("t")) and raw.exists(keys.task("t").checkpoint)
        saver = _saver(backend, flavor, namespace, twin_loop, shards=200)
        cfg = _put(saver, flavor, twin_loop, "thread-1")
        assert raw.exists(keys.thread("thread-1").index)
        assert _get(saver, flavor, twin_loop, cfg) is not None
        wrong = _saver(backend, flavor, namespace, twin_loop, shards=64)
        with pytest.raises(ConfigConflict):
            _put(wrong, flavor, twin_loop, "thread-2")
        assert not raw.exists(keys.thread("thread-2").index)

    def test_a_corrupt_record_is_refused_and_kept(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        record = Keys(namespace).layout_key()
        raw.set(record, "slots lots")
        with pytest.raises(CorruptState) as bad:
            make(CheckpointStore, AsyncCheckpointStore).create(Checkpoint("t"))
        assert bad.value.key == record
        assert raw.get(record) == b"slots lots"
        raw.delete(record)
        raw.hset(record, "shards", "64")  # another Redis type: the script's GET fails, nothing written
        before = _dump(raw, namespace)
        with pytest.raises(CorruptState):
            make(CheckpointStore, AsyncCheckpointStore).create(Checkpoint("t"))
        assert _dump(raw, namespace) == before

    def test_a_store_resolves_once(self, make: Callable[..., Any], namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=16)
        store.create(Checkpoint("t"))
        keys = _core(store).keys
        assert (keys.shards, keys.layout) == (16, LAYOUT_SLOTS)
        store.load("t")
        assert _core(store).keys is keys and keys.shards == 16


class TestAtManyShards:
    """Priorities and concurrency limits keep their guarantees at 1,024 shards (every backend)."""

    def test_claim_next_serves_higher_priorities_first(self, make: Callable[..., Any], namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=1024)
        tids = ids_on_every_shard(Keys(namespace, 1024), prefix="p")[::16]  # 64 tasks, 64 shards apart
        for i, tid in enumerate(tids):
            assert store.create(Checkpoint(tid, priority=i % 4))
        got = []
        while (cp := store.claim_next(token="w", lease_ms=60_000)) is not None:
            got.append(cp.priority)
        assert got == sorted(got, reverse=True) and len(got) == len(tids)

    def test_a_concurrency_limit_holds(self, make: Callable[..., Any], namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=1024)
        store.set_concurrency_limit("acme", 2)
        tids = ids_on_every_shard(Keys(namespace, 1024), prefix="l")[:5]
        for tid in tids:
            assert store.create(Checkpoint(tid, concurrency_key="acme"))
        got = []
        while (cp := store.claim_next(token="w", lease_ms=60_000)) is not None:
            got.append(cp.task_id)
        assert len(got) == 2
        assert [lim.live for lim in store.concurrency_limits() if lim.key == "acme"] == [2]


class TestLegacyNamespace:
    """A namespace that held 0.2 data (``{ns#SS}`` tags, no record) keeps it where it is."""

    def _legacy(self, make: Callable[..., Any]) -> tuple[Any, Any]:
        old = make(CheckpointStore, AsyncCheckpointStore)
        _core(old).keys.configure(DEFAULT_SHARDS, LAYOUT_LEGACY)  # as 0.2 built its keys
        kv = make(KeyValueStore, AsyncKeyValueStore)
        _core(kv).keys.configure(DEFAULT_SHARDS, LAYOUT_LEGACY)
        return old, kv

    @pytest.mark.parametrize("what", ["tasks", "kv"])
    def test_its_data_is_found_and_the_record_says_legacy(
        self, make: Callable[..., Any], raw: Any, namespace: str, what: str
    ) -> None:
        old, old_kv = self._legacy(make)
        if what == "tasks":
            for tid in ("t1", "t2"):
                assert old.create(Checkpoint(tid, messages=["m"]))
        else:
            old_kv.set("k", b"v")
        assert _record(raw, namespace) is None
        new = make(CheckpointStore, AsyncCheckpointStore)
        kv = make(KeyValueStore, AsyncKeyValueStore)
        if what == "tasks":
            assert sorted(new.list()) == ["t1", "t2"]
            assert new.load("t1").messages == ["m"]
            assert new.create(Checkpoint("t3"))
            got = set()
            while (cp := new.claim_next(token="w", lease_ms=60_000)) is not None:
                got.add(cp.task_id)
            assert got == {"t1", "t2", "t3"}
        else:
            assert kv.get("k") == b"v"
        assert _record(raw, namespace) == b"legacy 64"
        with pytest.raises(ConfigConflict, match="legacy"):
            make(CheckpointStore, AsyncCheckpointStore, shards=128).list()

    def test_an_empty_namespace_is_not_legacy(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        make(CheckpointStore, AsyncCheckpointStore).list()
        assert _record(raw, namespace) == b"slots 64"


def _saver(backend: Any, flavor: str, namespace: str, loop: asyncio.AbstractEventLoop, **kw: Any) -> Any:
    if flavor == "sync":
        return AgentStateSaver(backend.sync_client(), namespace=namespace, **kw)

    async def build() -> AsyncAgentStateSaver:
        return AsyncAgentStateSaver(backend.async_client(), namespace=namespace, **kw)

    return loop.run_until_complete(build())


def _put(saver: Any, flavor: str, loop: asyncio.AbstractEventLoop, thread: str) -> Any:
    args = (generate_config(thread), generate_checkpoint(), generate_metadata(), {})
    return saver.put(*args) if flavor == "sync" else loop.run_until_complete(saver.aput(*args))


def _get(saver: Any, flavor: str, loop: asyncio.AbstractEventLoop, cfg: Any) -> Any:
    return saver.get_tuple(cfg) if flavor == "sync" else loop.run_until_complete(saver.aget_tuple(cfg))


class TestCluster:
    """On the local 3-primary Cluster: each primary holds its share of the shards, to one."""

    @pytest.mark.parametrize("shards", [64, 256])
    def test_every_primary_holds_its_share(self, redis_cluster: Any, shards: int) -> None:
        client = redis_cluster.sync_client()
        try:
            keys = Keys("tenant-42", shards)
            owners = Counter(client.get_node_from_key(keys.shard_ready(s)).port for s in range(shards))
            primaries = len({n.port for n in client.get_primaries()})
            assert len(owners) == primaries
            assert max(owners.values()) - min(owners.values()) <= 1
        finally:
            client.close()


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.real
def test_a_namespace_fills_a_cluster_of_12_primaries() -> None:
    """A bounded many-primary Cluster (the 24- and 48-primary figures are benchmarks.shard_spread's):
    every store's flows run on a 256-shard namespace, every primary holds its share of the shards
    and of the keys, none is idle, and 0.2's tags on the same cluster would leave it lopsided; then
    the namespace grows live to 1,024 shards and stays as even."""
    from cluster_support import LocalCluster

    cluster = LocalCluster.start(12, timeout=60.0)
    try:
        client = cluster.sync_client()
        primaries = {n.name: client.get_redis_connection(n) for n in client.get_primaries()}
        assert len(primaries) == 12
        store = CheckpointStore(client, namespace="fill", shards=256)
        keys = Keys("fill", 256)
        claim_next_flow(store, ids_on_every_shard(keys, prefix="flow"))
        pool_flow(PoolStore(client, namespace="fill"))
        kv_flow(KeyValueStore(client, namespace="fill"), ids_on_every_shard(keys, prefix="k"))
        owners = Counter(client.get_node_from_key(keys.shard_ready(s)).name for s in range(256))
        assert sorted(owners) == sorted(primaries) and max(owners.values()) - min(owners.values()) <= 1
        for i in range(6_000):
            assert store.create(Checkpoint(f"task-{i}"))
        per_primary = [int(conn.dbsize()) for conn in primaries.values()]
        assert min(per_primary) > 0
        assert max(per_primary) / (sum(per_primary) / 12) <= 1.15, per_primary
        legacy = Counter(client.get_node_from_key(f"fill:{{fill#{s:02d}}}:ready").name for s in range(64))
        assert max(legacy.values()) / (64 / 12) > 1.15  # what the slot-aware tags fix
        # Grown live to 1,024 shards (every old shard listed by slot): every task where the new layout
        # puts it, and the primaries as even as before.
        report = store.reshard(1024)
        assert (report.moved, report.unknown) == (256, 0)
        grown = CheckpointStore(client, namespace="fill")
        assert all(grown.load(f"task-{i}") is not None for i in range(0, 6_000, 7))
        assert grown.shards == 1024 and len(grown.list()) == 6_000
        per_primary = [int(conn.dbsize()) for conn in primaries.values()]
        assert max(per_primary) / (sum(per_primary) / 12) <= 1.15, per_primary
        client.close()
    finally:
        cluster.stop()


class TestCli:
    """The CLI reads the namespace's layout as any client does."""

    def test_stats_and_list_on_a_namespace_of_300_shards(
        self, backend: Any, namespace: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        if backend.kind == "fake":
            pytest.skip("the CLI connects by URL")
        store = CheckpointStore(backend.sync_client(), namespace=namespace, shards=300)
        tids = ids_on_every_shard(Keys(namespace, 300), prefix="c")[:40]
        for tid in tids:
            assert store.create(Checkpoint(tid))
        if backend.kind == "cluster":
            host, port = backend.cluster.startup
            target = ["--url", f"redis://{host}:{port}", "--cluster"]
        else:
            target = ["--url", backend.url]
        assert cli_mod.main(["list", *target, "--namespace", namespace, "--json"]) == 0
        listed = [row["task_id"] for row in json.loads(capsys.readouterr().out)]
        assert sorted(listed) == sorted(tids)
        assert cli_mod.main(["stats", *target, "--namespace", namespace, "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert (stats["tasks"], stats["shards"], stats["layout"]) == (40, 300, "slots"), stats
        assert cli_mod.main(["stats", *target, "--namespace", namespace]) == 0
        assert "40 task(s), 300 shards (slots layout)" in capsys.readouterr().out
