"""``AgentStateStore``'s approximate vector index (issue 40): semantic search of a prefix holding more
than ``MAX_EXACT`` live items ranks what an IVF index kept in Redis finds (``_store_ann.py``).

Every test runs on {fakeredis, real redis-server, local Cluster} x {sync, async}; the exact limit
and the training threshold are set low on the store under test (``max_exact``, ``ann.index_at``)
so a few hundred items reach the index. What is checked: results against LangGraph's own
``InMemoryStore`` (identical when every list is probed; recall otherwise), the index's invariants
in Redis (every vector in one list of the current version, the nearest centroid's, unless a
re-train is moving it), re-training as a namespace grows, puts racing a re-train, a mover that
stops, two stores training at once, and damaged centroids.
"""

from __future__ import annotations

import asyncio
import math
import random
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from langgraph.store.base import PutOp
from langgraph.store.memory import InMemoryStore

from redis_agentstate import CorruptState
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import AgentStateStore, AsyncAgentStateStore, _store_ann

DIMS = 12
CLUSTERS = 9


def _vector(text: str) -> list[float]:
    """A deterministic embedding with cluster structure: ``c<k>-...`` lies near centre k."""
    cluster = int(text[1:].split("-")[0]) if text.startswith("c") and "-" in text else 0
    centre = random.Random(f"centre{cluster}")
    rng = random.Random(text)
    return [centre.gauss(0, 1) + rng.gauss(0, 0.45) for _ in range(DIMS)]


def embed(texts: list[str]) -> list[list[float]]:
    return [_vector(t) for t in texts]


INDEX: Any = {"dims": DIMS, "embed": embed, "fields": ["text"]}


class Memory:
    """A store of the test's flavor with the sync vocabulary (the async twin's ``a``-methods)."""

    def __init__(self, store: Any, flavor: str) -> None:
        self.store, self.flavor = store, flavor

    def __getattr__(self, name: str) -> Any:
        if self.flavor == "async" and name in {"put", "get", "delete", "search", "batch"}:
            return getattr(self.store, "a" + name)
        return getattr(self.store, name)

    @property
    def core(self) -> Any:
        return self.store._core


@pytest.fixture
def mk(make: Callable[..., Any], flavor: str) -> Callable[..., Memory]:
    def build(index_at: int = 40, max_exact: int = 30, **kw: Any) -> Memory:
        memory = Memory(make(AgentStateStore, AsyncAgentStateStore, **kw), flavor)
        memory.core.ann.index_at = index_at
        memory.core.max_exact = max_exact
        return memory

    return build


def docs(start: int, stop: int, prefix: str = "k") -> list[PutOp]:
    return [PutOp(("docs",), f"{prefix}{i}", {"text": f"c{i % CLUSTERS}-{i}", "i": i}) for i in range(start, stop)]


def put_all(stores: list[Any], ops: list[PutOp], chunk: int = 10) -> None:
    for i in range(0, len(ops), chunk):
        for s in stores:
            s.batch(ops[i : i + chunk])


QUERIES = [f"c{k}-q{j}" for k in range(CLUSTERS) for j in range(2)]


def index_state(raw: Any, keys: Any) -> dict[str, Any]:
    state = {k.decode(): v for k, v in raw.hgetall(keys.centroids).items()}
    members = raw.zrange(keys.lists, 0, -1, withscores=True)
    return {
        "version": int(state.get("v", 0)),
        "moving": state.get("pv"),
        "centroids": state,
        "members": {m.decode(): int(s) for m, s in members},
    }


def check_index(raw: Any, keys: Any) -> dict[str, Any]:
    """The index's invariants: every stored vector has one member, in the current version's list of its
    nearest centroid (or, while a move is under way, in the version moved from); nothing else."""
    state = index_state(raw, keys)
    version = state["version"]
    vectors = {k.decode(): v for k, v in raw.hgetall(keys.vectors).items()}
    centroids = None
    if version:
        centroids = _store_ann.Centroids(state["centroids"][f"c:{version}"], DIMS)
    expected = set()
    for key, packed in vectors.items():
        table = msgpack.unpackb(packed, raw=False)
        for n, (raw_vector, _) in enumerate(table.values(), 1):
            member = key if n == 1 and "\0" not in key else f"{key}\0{n}"
            expected.add(member)
            score = state["members"].get(member)
            assert score is not None, f"vector {n} of {key!r} is in no list"
            at, lst = divmod(score, _store_ann.LIST_SPAN)
            if at != version:
                assert state["moving"] is not None and at == int(state["moving"]), (key, at, version)
                continue
            if centroids is not None:
                vector = struct.unpack(f"<{DIMS}f", raw_vector)
                sims = centroids.similarities(vector)
                assert math.isclose(sims[lst], max(sims), rel_tol=1e-9, abs_tol=1e-9), (key, lst)
            else:
                assert lst == 0
    assert set(state["members"]) == expected, "a list names a vector that is not stored"
    return state


def keys_of(namespace: str, path: str = "docs") -> Any:
    return Keys(namespace, 64).store(path)


def recall(got: list[Any], want: list[Any]) -> float:
    return len({g.key for g in got} & {w.key for w in want}) / max(1, len(want))


class TestApproximateSearch:
    def test_every_list_probed_answers_as_in_memory(
        self, mk: Callable[..., Memory], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Probing every list, the approximate path ranks every item exactly: InMemoryStore's answer,
        several fields per item and a key with NUL included."""
        monkeypatch.setattr(_store_ann, "PROBE_SHARE", 1.0)
        index: Any = {"dims": DIMS, "embed": embed, "fields": ["text", "more"]}
        s, ref = mk(index=index), InMemoryStore(index=index)
        ops = [PutOp(("docs",), f"k{i}", {"text": f"c{i % CLUSTERS}-{i}", "more": f"c{i % 4}-m{i}"}) for i in range(90)]
        ops.append(PutOp(("docs",), "nul\0key", {"text": "c1-nul", "more": "c2-nul"}))
        put_all([s, ref], ops)
        state = check_index(raw, keys_of(namespace))
        assert state["version"] >= 1 and state["moving"] is None
        for query in QUERIES[:6]:
            for kw in ({"limit": 10}, {"limit": 5, "offset": 3}, {"filter": {"more": {"$ne": "x"}}, "limit": 7}):
                got, want = s.search(("docs",), query=query, **kw), ref.search(("docs",), query=query, **kw)
                assert [(g.key, g.value) for g in got] == [(w.key, w.value) for w in want], (query, kw)
                for g, w in zip(got, want, strict=True):
                    assert math.isclose(g.score, w.score, rel_tol=1e-6, abs_tol=1e-6)

    def test_recall_of_the_nearest_lists(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        put_all([s, ref], docs(0, 240))
        check_index(raw, keys_of(namespace))
        hits = []
        for query in QUERIES:
            got, want = s.search(("docs",), query=query, limit=10), ref.search(("docs",), query=query, limit=10)
            hits.append(recall(got, want))
            scores = {w.key: w.score for w in ref.search(("docs",), query=query, limit=300)}
            for g in got:  # every item returned is ranked exactly
                assert math.isclose(g.score, scores[g.key], rel_tol=1e-6, abs_tol=1e-6)
            assert [g.score for g in got] == sorted((g.score for g in got), reverse=True)
        assert sum(hits) / len(hits) >= 0.95, hits
        flt = {"i": {"$lt": 60}}
        for query in QUERIES[:4]:
            got = s.search(("docs",), query=query, filter=flt, limit=10)
            want = ref.search(("docs",), query=query, filter=flt, limit=10)
            assert len(got) == 10 and all(g.value["i"] < 60 for g in got)
            assert recall(got, want) >= 0.7

    def test_exact_up_to_the_limit_approximate_above_it(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A prefix of max_exact live items is ranked exactly without a list read; one more, by the index."""
        from redis_agentstate.wire import drivers

        s, ref = mk(index=INDEX, index_at=10_000, max_exact=30), InMemoryStore(index=INDEX)
        put_all([s, ref], docs(0, 30))
        sent: list[str] = []
        for name in ("_send_sync", "_send_async"):
            original = getattr(drivers, name)

            def spy(client: Any, scripts: Any, req: Any, original: Any = original) -> Any:
                sent.extend(c.script for c in getattr(req, "calls", [req]) if hasattr(c, "script"))
                return original(client, scripts, req)

            monkeypatch.setattr(drivers, name, spy)
        got, want = s.search(("docs",), query="c3-x"), ref.search(("docs",), query="c3-x")
        assert [g.key for g in got] == [w.key for w in want] and "lgs_probe" not in sent
        put_all([s, ref], docs(30, 31))
        sent.clear()
        got, want = s.search(("docs",), query="c3-x"), ref.search(("docs",), query="c3-x")
        # No index trained (index_at not reached): version 0 has one list, every vector: the same answer.
        assert "lgs_count" in sent and "lgs_probe" in sent
        assert [g.key for g in got] == [w.key for w in want]


class TestUpkeep:
    def test_retrained_as_it_grows_and_lists_follow_deletes_and_expiry(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        s = mk(index=INDEX, index_at=40)
        keys = keys_of(namespace)
        put_all([s], docs(0, 39))
        assert check_index(raw, keys)["version"] == 0
        put_all([s], docs(39, 40))
        first = check_index(raw, keys)
        assert first["version"] == 1 and first["centroids"]["n"] == b"40"
        put_all([s], docs(40, 79))
        assert check_index(raw, keys)["version"] == 1
        put_all([s], docs(79, 80))
        grown = check_index(raw, keys)
        assert grown["version"] == 2 and grown["moving"] is None and "c:1" not in grown["centroids"]
        for i in range(0, 80, 3):
            s.delete(("docs",), f"k{i}")
        s.put(("docs",), "k1", {"text": "no vector"}, index=False)
        s.put(("docs",), "short", {"text": "c2-short"}, ttl=0.0001)
        time.sleep(0.05)
        s.put(("docs",), "k2", {"text": "c5-moved"})  # prunes the expired item
        state = check_index(raw, keys)
        assert "k0" not in state["members"] and "k1" not in state["members"] and "short" not in state["members"]
        assert all(r.key != "short" for r in s.search(("docs",), query="c2-short", limit=50))

    def test_a_put_with_stale_centroids_is_placed_by_the_new_ones(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        """Store B knows version 1; store A re-trains to 2; B's put is refused, reads version 2, re-sends."""
        a, b = mk(index=INDEX), mk(index=INDEX)
        keys = keys_of(namespace)
        put_all([a], docs(0, 40))
        b.put(("docs",), "b0", {"text": "c4-b0"})
        assert b.core.ann.versions["docs"] == 1
        put_all([a], docs(40, 80))
        assert check_index(raw, keys)["version"] == 2
        b.put(("docs",), "b1", {"text": "c6-b1"})
        assert b.core.ann.versions["docs"] == 2
        state = check_index(raw, keys)
        assert divmod(state["members"]["b1"], _store_ann.LIST_SPAN)[0] == 2

    def test_a_stopped_move_is_searched_both_ways_then_taken_over(
        self, mk: Callable[..., Memory], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A mover stops after installing version 2 (its lease keeps others off); puts go to version 2,
        searches probe both versions; once the lease lapsed, the next put finishes the move."""
        monkeypatch.setattr(_store_ann, "PROBE_SHARE", 1.0)
        a, b, ref = mk(index=INDEX), mk(index=INDEX), InMemoryStore(index=INDEX)
        keys = keys_of(namespace)
        put_all([a, ref], docs(0, 79))
        monkeypatch.setattr(_store_ann.VectorIndex, "move", lambda self, *args: iter(()))
        put_all([a, ref], docs(79, 80))
        monkeypatch.undo()
        monkeypatch.setattr(_store_ann, "PROBE_SHARE", 1.0)
        state = check_index(raw, keys)
        assert state["version"] == 2 and state["moving"] == b"1"
        put_all([b, ref], docs(80, 90))  # the mover's lease is live: b places its items, moves nothing
        state = check_index(raw, keys)
        assert state["moving"] == b"1"
        assert {divmod(state["members"][f"k{i}"], _store_ann.LIST_SPAN)[0] for i in range(80, 90)} == {2}
        for query in QUERIES[:4]:
            got, want = b.search(("docs",), query=query, limit=10), ref.search(("docs",), query=query, limit=10)
            assert [g.key for g in got] == [w.key for w in want]
        monkeypatch.setattr(_store_ann, "LEASE_MS", 1)
        raw.hset(keys.centroids, "lease", 1)  # the stopped mover's lease has lapsed
        b.put(("docs",), "b1", {"text": "c3-b1"})
        state = check_index(raw, keys)
        assert state["version"] == 2 and state["moving"] is None and "c:1" not in state["centroids"]

    def test_a_reshard_moves_the_index_with_its_namespace(
        self, mk: Callable[..., Memory], backend: Any, raw: Any, namespace: str
    ) -> None:
        from redis_agentstate import CheckpointStore

        s, ref = mk(index=INDEX, shards=2), InMemoryStore(index=INDEX)
        put_all([s, ref], docs(0, 90))
        was = check_index(raw, Keys(namespace, 2).store("docs"))
        assert CheckpointStore(backend.sync_client(), namespace=namespace).reshard(8).to_shards == 8
        now = check_index(raw, Keys(namespace, 8).store("docs"))
        assert (now["version"], now["members"], now["centroids"]) == (was["version"], was["members"], was["centroids"])
        for store in (s, mk(index=INDEX)):
            store.core.max_exact = 30
            hits = [recall(store.search(("docs",), query=q, limit=10), ref.search(("docs",), query=q, limit=10))
                    for q in QUERIES]  # fmt: skip
            assert sum(hits) / len(hits) >= 0.95
        s.put(("docs",), "after", {"text": "c2-after"})
        assert "after" in check_index(raw, Keys(namespace, 8).store("docs"))["members"]

    def test_damaged_centroids_name_their_key(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s = mk(index=INDEX)
        put_all([s], docs(0, 40))
        keys = keys_of(namespace)
        raw.hset(keys.centroids, "c:1", b"\x01\x02\x03")
        fresh = mk(index=INDEX)
        with pytest.raises(CorruptState, match="lgsc"):
            fresh.search(("docs",), query="c1-x")


def _two_stores_race(backend: Any, namespace: str, flavor: str) -> None:
    """Two stores put into one namespace at once, each crossing training thresholds."""
    ops = {name: docs(0, 120, prefix=name) for name in ("a", "b")}
    if flavor == "sync":
        stores = {n: AgentStateStore(backend.sync_client(), namespace, index=INDEX) for n in ops}
        errors: list[BaseException] = []

        def run(name: str) -> None:
            try:
                store = stores[name]
                store._core.ann.index_at = 40
                for i in range(0, len(ops[name]), 10):
                    store.batch(ops[name][i : i + 10])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(n,)) for n in ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        return

    async def main() -> None:
        clients = [backend.new_async_client() for _ in ops]
        try:
            stores = [AsyncAgentStateStore(c, namespace, index=INDEX) for c in clients]

            async def run(store: Any, name: str) -> None:
                store._core.ann.index_at = 40
                for i in range(0, len(ops[name]), 10):
                    await store.abatch(ops[name][i : i + 10])

            await asyncio.gather(*(run(s, n) for s, n in zip(stores, ops, strict=True)))
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("flavor_", ["sync", "async"])
def test_two_stores_training_at_once_leave_one_sound_index(
    backend: Any, namespace: str, raw: Any, flavor_: str
) -> None:
    _two_stores_race(backend, namespace, flavor_)
    state = check_index(raw, keys_of(namespace))
    # 240 vectors: trained at 40, 80 and 160 (whichever store won each compare-and-set), no move left.
    assert state["version"] >= 3 and state["moving"] is None
    ref = InMemoryStore(index=INDEX)
    for name in ("a", "b"):
        ref.batch(docs(0, 120, prefix=name))
    store = AgentStateStore(backend.sync_client(), namespace, index=INDEX)
    store._core.max_exact = 30
    hits = [
        recall(store.search(("docs",), query=q, limit=10), ref.search(("docs",), query=q, limit=10)) for q in QUERIES
    ]
    assert sum(hits) / len(hits) >= 0.95, hits
