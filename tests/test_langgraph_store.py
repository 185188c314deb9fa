"""``AgentStateStore`` / ``AsyncAgentStateStore``: LangGraph's BaseStore on plain Redis (issue 40).

Every test runs on {fakeredis, real redis-server, local Cluster} x {sync, async} (``make``); the
semantics are checked against LangGraph's own ``InMemoryStore`` on the same operations.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore
from redis.crc import key_slot

from redis_agentstate import CorruptState, InvalidArgument
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import (
    AgentStateSaver,
    AgentStateStore,
    AsyncAgentStateStore,
    GraphWorker,
    RunQueue,
    _store_cache,
    _store_core,
    _store_index,
    _store_rank,
)
from redis_agentstate.wire import scripts

SEP = "\0"


class Memory:
    """A store of the test's flavor with the sync vocabulary: the async twin's ``a``-methods."""

    def __init__(self, store: Any, flavor: str) -> None:
        self.store, self.flavor = store, flavor

    def __getattr__(self, name: str) -> Any:
        if self.flavor == "async" and name in {"put", "get", "delete", "search", "list_namespaces", "batch", "sweep"}:
            return getattr(self.store, "asweep" if name == "sweep" else "a" + name)
        return getattr(self.store, name)


@pytest.fixture
def mk(make: Callable[..., Any], flavor: str) -> Callable[..., Memory]:
    return lambda **kw: Memory(make(AgentStateStore, AsyncAgentStateStore, **kw), flavor)


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic 8-d embedding: letter counts folded, with a constant so no vector is zero."""
    out = []
    for text in texts:
        v = [0.0] * 8
        for ch in text.lower():
            v[ord(ch) % 8] += 1.0
        v[0] += 0.5
        out.append(v)
    return out


INDEX: Any = {"dims": 8, "embed": embed, "fields": ["text"]}


def both(ours: Memory, ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]], ref: InMemoryStore) -> None:
    for name, args, kw in ops:
        getattr(ours, name)(*args, **kw)
        getattr(ref, name)(*args, **kw)


def view(items: list[Any]) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    return [(tuple(i.namespace), i.key, i.value) for i in items]


# Written in namespace (tuple) order: InMemoryStore returns namespaces in the order first written,
# ours in tuple order (documented; test_namespaces_come_in_tuple_order), so this sequence makes the two agree.
DOCS = [
    (("teams", "t1"), "e", {"lang": "pt", "n": 0}),
    (("users", "u1"), "a", {"lang": "pt", "n": 3, "tags": ["x", "y"], "nest": {"k": 1, "deep": {"z": True}}}),
    (("users", "u1"), "b", {"lang": "en", "n": 5, "tags": ["y"], "nest": {"k": 2}}),
    (("users", "u10"), "f", {"lang": "pt", "n": 3}),
    (("users", "u2"), "c", {"lang": "pt", "n": 7.5, "nest": {"k": 1}}),
    (("users", "u2", "work"), "d", {"lang": "de", "n": -1}),
]
FILTERS: list[dict[str, Any] | None] = [
    None, {"lang": "pt"}, {"n": {"$gt": 3}}, {"n": {"$gte": 3}}, {"n": {"$lt": 3}}, {"n": {"$lte": 3}},
    {"lang": {"$ne": "pt"}}, {"lang": {"$eq": "en"}}, {"nest": {"k": 1}}, {"nest": {"deep": {"z": True}}},
    {"tags": ["x", "y"]}, {"lang": "pt", "n": {"$gte": 3, "$lt": 7}}, {"missing": None},
]  # fmt: skip


class TestSemantics:
    """Put/get/delete, search and list_namespaces answer as InMemoryStore on the same operations."""

    def test_put_get_delete_and_timestamps(self, mk: Callable[..., Memory]) -> None:
        s = mk()
        assert s.get(("a",), "k") is None
        s.put(("a",), "k", {"v": 1})
        first = s.get(("a",), "k")
        assert (tuple(first.namespace), first.key, first.value) == (("a",), "k", {"v": 1})
        s.put(("a",), "k", {"v": 2})  # within the same millisecond too: updated_at moves on
        second = s.get(("a",), "k")
        assert second.value == {"v": 2}
        assert second.created_at == first.created_at and second.updated_at > first.updated_at
        s.delete(("a",), "k")
        s.delete(("a",), "k")  # a missing item is fine
        assert s.get(("a",), "k") is None and s.list_namespaces() == []

    @pytest.mark.parametrize("flt", FILTERS, ids=lambda f: json.dumps(f))
    def test_search_matches_in_memory(self, mk: Callable[..., Memory], flt: Any) -> None:
        s, ref = mk(), InMemoryStore()
        both(s, [("put", (ns, k, v), {}) for ns, k, v in DOCS], ref)
        for prefix in [(), ("users",), ("users", "u1"), ("users", "u2"), ("nope",), ("users", "u")]:
            for limit, offset in [(10, 0), (2, 0), (2, 1), (1, 3), (0, 0)]:
                got = s.search(prefix, filter=flt, limit=limit, offset=offset)
                want = ref.search(prefix, filter=flt, limit=limit, offset=offset)
                # Namespaces come in tuple order (InMemoryStore: first-written order, the same here).
                assert view(got) == view(want), (prefix, limit, offset)

    def test_lists_for_namespaces_and_a_str_match_path_as_postgres_takes_them(self, mk: Callable[..., Memory]) -> None:
        from langgraph.store.base import ListNamespacesOp, MatchCondition

        s = mk()
        s.put(["users", "u1"], "k", {"v": 1})  # type: ignore[arg-type]
        assert [tuple(i.namespace) for i in s.search(["users"])] == [("users", "u1")]  # type: ignore[arg-type]
        assert s.get(["users", "u1"], "k").value == {"v": 1}  # type: ignore[arg-type]
        op = ListNamespacesOp(match_conditions=(MatchCondition("suffix", "u1"),))  # type: ignore[arg-type]
        assert s.batch([op]) == [[("users", "u1")]]

    def test_namespaces_come_in_tuple_order(self, mk: Callable[..., Memory]) -> None:
        s = mk()
        for ns in [("b",), ("a", "z"), ("a",), ("a", "b", "c"), ("a-b",)]:
            s.put(ns, "k", {})
        assert [tuple(i.namespace) for i in s.search(())] == sorted(
            [("b",), ("a", "z"), ("a",), ("a", "b", "c"), ("a-b",)]
        )

    def test_list_namespaces_matches_in_memory(self, mk: Callable[..., Memory]) -> None:
        s, ref = mk(), InMemoryStore()
        both(s, [("put", (ns, k, v), {}) for ns, k, v in DOCS], ref)
        cases: list[dict[str, Any]] = [
            {}, {"prefix": ("users",)}, {"prefix": ("users", "*")}, {"suffix": ("work",)}, {"suffix": ("*",)},
            {"prefix": ("*", "u2")}, {"max_depth": 1}, {"max_depth": 2}, {"prefix": ("users",), "max_depth": 2},
            {"limit": 2}, {"limit": 2, "offset": 2}, {"offset": 10}, {"prefix": ("users", "u1"), "suffix": ("u1",)},
        ]  # fmt: skip
        for kw in cases:
            assert s.list_namespaces(**kw) == ref.list_namespaces(**kw), kw

    def test_batch_reads_before_writes_and_last_put_wins(self, mk: Callable[..., Memory]) -> None:
        s, ref = mk(), InMemoryStore()
        ops = [
            PutOp(("n",), "k", {"v": 1}), GetOp(("n",), "k"), PutOp(("n",), "k", {"v": 2}),
            SearchOp(("n",), None, 10, 0), PutOp(("n",), "gone", {"v": 0}), PutOp(("n",), "gone", None),
        ]  # fmt: skip
        got, want = s.batch(ops), ref.batch(ops)
        assert got[1] is None and want[1] is None and got[3] == want[3] == []
        assert s.get(("n",), "k").value == {"v": 2} and s.get(("n",), "gone") is None

    def test_update_keeps_its_place_and_a_new_put_goes_last(self, mk: Callable[..., Memory]) -> None:
        s, ref = mk(), InMemoryStore()
        ops = [("put", (("o",), k, {"k": k}), {}) for k in "abc"]
        ops += [("put", (("o",), "a", {"k": "A"}), {}), ("delete", (("o",), "b"), {}), ("put", (("o",), "b", {}), {})]
        both(s, ops, ref)
        assert view(s.search(("o",))) == view(ref.search(("o",)))

    def test_many_items_and_namespaces_page(self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch) -> None:
        # Small pages, so every paging path (items, namespaces, windows) runs.
        monkeypatch.setattr(_store_index, "PAGE", 3)
        monkeypatch.setattr(_store_index, "NS_PAGE", 2)
        monkeypatch.setattr(_store_index, "WINDOW", 2)
        s, ref = mk(shards=4), InMemoryStore()
        ops = [("put", (("p", f"u{i % 7}"), f"k{i}", {"i": i}), {}) for i in range(40)]
        both(s, ops, ref)
        assert view(s.search(("p",), limit=100)) == view(ref.search(("p",), limit=100))
        assert view(s.search(("p",), limit=5, offset=11)) == view(ref.search(("p",), limit=5, offset=11))
        assert view(s.search(("p",), filter={"i": {"$gte": 30}})) == view(
            ref.search(("p",), filter={"i": {"$gte": 30}})
        )
        assert s.list_namespaces(limit=100) == ref.list_namespaces(limit=100)


def _indexes(raw: Any, namespace: str) -> dict[str, set[str]]:
    """Every lgsns key of the namespace and the paths it lists."""
    return {k.decode(): {m.decode() for m in raw.zrange(k, 0, -1)} for k in raw.scan_iter(match=f"{namespace}:*lgsns")}


def _record(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every script call a store's batch sends from now on (a pipeline's calls one by one)."""
    from redis_agentstate.wire import Batch, Call

    sent: list[Any] = []
    execute = _store_core.StoreCore.execute

    def recorded(self: Any, *args: Any) -> Any:
        op = execute(self, *args)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                req = op.send(reply) if error is None else op.throw(error)
            except StopIteration as stop:
                return stop.value
            sent.extend(req.calls if isinstance(req, Batch) else [req] if isinstance(req, Call) else [])
            error = None
            try:
                reply = yield req
            except BaseException as exc:  # handed to the op, as the driver would
                error, reply = exc, None

    monkeypatch.setattr(_store_core.StoreCore, "execute", recorded)
    return sent


class TestPrefixIndex:
    """A search or listing of a namespace prefix reads the prefix's own shard: each namespace is listed in
    the shard of each of its prefixes (lgs_index.lua), not looked for in every shard."""

    def test_a_prefix_search_is_one_script_in_one_slot(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        s, ref = mk(), InMemoryStore()
        ops = [("put", (("memories", f"u{u}"), f"k{j}", {"kind": "pref" if j % 2 else "fact", "j": j}), {})
               for u in range(30) for j in range(4)]  # fmt: skip
        both(s, ops, ref)
        sent = _record(monkeypatch)
        got = s.search(("memories", "u7"), filter={"kind": "pref"}, limit=10)
        assert view(got) == view(ref.search(("memories", "u7"), filter={"kind": "pref"}, limit=10))
        assert len(got) == 2
        assert [c.script for c in sent] == ["lgs_prefix"]
        assert len({key_slot(str(k).encode()) for c in sent for k in c.keys}) == 1
        sent.clear()
        assert view(s.search(("memories", "u7"), limit=3, offset=1)) == view(
            ref.search(("memories", "u7"), limit=3, offset=1)
        )
        assert [c.script for c in sent] == ["lgs_prefix"]

    def test_a_wider_prefix_reads_the_shards_of_what_it_holds_only(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        s, ref = mk(), InMemoryStore()
        ops = [("put", (("memories", f"u{u}"), "k", {"u": u}), {}) for u in range(5)]
        ops += [("put", (("memories", "u1", "notes"), "n", {"u": 1}), {}), ("put", (("other",), "o", {}), {})]
        both(s, ops, ref)
        sent = _record(monkeypatch)
        want = sorted(view(ref.search(("memories",), limit=100)), key=lambda i: i[0])  # ours: in tuple order
        assert view(s.search(("memories",), limit=100)) == want
        # The prefix's own shard lists the 6 namespaces; each is read in its own shard (one pipeline).
        assert sent[0].script == "lgs_prefix" and len(sent) <= 1 + 6
        assert all(c.script == "lgs_search" for c in sent[1:])
        sent.clear()
        assert view(s.search(("memories", "u1"))) == view(ref.search(("memories", "u1")))
        assert len(sent) <= 2
        sent.clear()
        assert s.list_namespaces(prefix=("memories",)) == ref.list_namespaces(prefix=("memories",))
        # One page of the prefix's index, then each listed namespace checked in its own shard (at most
        # one call per shard), never the 64 shards' indexes.
        assert [c.script for c in sent] == ["lgs_namespaces"] * len(sent) and 1 <= len(sent) <= 1 + 6
        sent.clear()
        assert s.list_namespaces(prefix=("memories", "u1")) == [("memories", "u1"), ("memories", "u1", "notes")]
        assert len(sent) <= 2

    def test_every_prefix_lists_what_lives_under_it_and_nothing_it_lost(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        s, ref = mk(), InMemoryStore()
        ops = [("put", (("a", f"b{i}", f"c{j}"), "k", {"i": i, "j": j}), {}) for i in range(4) for j in range(3)]
        ops += [("put", (("a",), "top", {}), {}), ("put", (("a", "b1"), "mid", {}), {})]
        ops += [("delete", (("a", "b2", f"c{j}"), "k"), {}) for j in range(3)]  # a whole subtree emptied
        ops += [("delete", (("a", "b1"), "mid"), {}), ("put", (("a", "b1"), "mid", {"again": 1}), {})]
        both(s, ops, ref)
        prefixes = [(), ("a",), ("a", "b1"), ("a", "b2"), ("a", "b2", "c1"), ("a", "b3", "c2"), ("a", "b")]
        for prefix in prefixes:
            want = sorted(view(ref.search(prefix, limit=100)), key=lambda i: i[0])  # ours: in tuple order
            assert view(s.search(prefix, limit=100)) == want, prefix
            # InMemoryStore lists a namespace whose items were all deleted; ours does not (documented).
            assert s.list_namespaces(prefix=prefix, limit=100) == sorted({i[0] for i in want})
        # The indexes hold exactly the live namespaces: each in the shard of every prefix of its own.
        keys = Keys(namespace, 64)
        live = {SEP.join(i.namespace) for i in ref.search((), limit=100)}
        want: dict[str, set[str]] = {}
        for path in live:
            labels = path.split(SEP)
            for k in range(1, len(labels) + 1):
                want.setdefault(keys.store(SEP.join(labels[:k])).namespaces, set()).add(path)
        got = _indexes(raw, namespace)
        assert got == want
        assert {k.decode().replace("lgsng", "lgsns") for k in raw.scan_iter(match=f"{namespace}:*lgsng")} == set(want)

    def test_many_new_namespaces_are_listed_in_bounded_calls(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_store_index, "INDEX_GROUPS", 3)
        s = mk()
        sent = _record(monkeypatch)
        s.batch([PutOp(("many", f"u{u}"), "k", {"u": u}) for u in range(10)])
        listings = [c for c in sent if c.script == "lgs_index"]
        assert len(listings) == 4 and all(len(c.args) <= 3 * 3 for c in listings)
        assert len(s.list_namespaces(prefix=("many",), limit=100)) == 10
        sent.clear()
        s.batch([PutOp(("many", f"u{u}"), "k", None) for u in range(10)])
        assert len([c for c in sent if c.script == "lgs_index"]) == 4
        assert s.list_namespaces(prefix=("many",)) == []

    def test_a_namespace_emptied_and_filled_again_stays_listed_whatever_the_order(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        """lgs_index.lua: a late listing never lowers a later one; an unlisting removes only its own."""
        s = mk()
        s.put(("p", "q"), "k", {"v": 1})
        keys = Keys(namespace, 64)
        parent = keys.store("p")
        first = raw.zscore(parent.generations, "p" + SEP + "q")
        assert first is not None
        s.delete(("p", "q"), "k")
        assert raw.zscore(parent.generations, "p" + SEP + "q") is None
        s.put(("p", "q"), "k", {"v": 2})
        second = raw.zscore(parent.generations, "p" + SEP + "q")
        assert second > first
        # A late unlisting of the first listing, and a late listing of it, change nothing.
        script = raw.register_script(scripts.script_text("lgs_index"))
        assert script(keys=[parent.namespaces, parent.generations], args=["-", "p" + SEP + "q", int(first)]) == 0
        assert script(keys=[parent.namespaces, parent.generations], args=["+", "p" + SEP + "q", int(first)]) == 0
        assert raw.zscore(parent.generations, "p" + SEP + "q") == second
        assert s.list_namespaces(prefix=("p",)) == [("p", "q")]


class TestSemanticSearch:
    def test_ranking_and_scores_match_in_memory(self, mk: Callable[..., Memory]) -> None:
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        texts = ["apples and pears", "a red car", "pears", "zebra crossing", "carrots", "an apple a day"]
        ops = [("put", (("m", f"u{i % 2}"), f"k{i}", {"text": t, "i": i}), {}) for i, t in enumerate(texts)]
        ops.append(("put", (("m", "u0"), "plain", {"other": 1}), {}))  # nothing to embed: scoreless
        ops.append(("put", (("m", "u1"), "noindex", {"text": "pears"}), {"index": False}))
        both(s, ops, ref)
        for query, kw in [("pear", {}), ("car", {"limit": 3}), ("apple", {"offset": 2, "limit": 3}),
                          ("pears", {"filter": {"i": {"$ne": 2}}}), ("zzz", {"limit": 20})]:  # fmt: skip
            got = s.search(("m",), query=query, **kw)
            want = ref.search(("m",), query=query, **kw)
            assert view(got) == view(want), query
            for g, w in zip(got, want, strict=True):
                # float32 storage: equal to InMemoryStore's float64 scores to float32 precision.
                assert (g.score is None) == (w.score is None)
                assert g.score is None or math.isclose(g.score, w.score, rel_tol=1e-6, abs_tol=1e-6)

    def test_vectors_are_float32_bytes(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s = mk(index=INDEX)
        s.put(("m",), "k", {"text": "hello"})
        keys = Keys(namespace, 64).store("m")  # the default layout: 64 slot-aware shards
        import msgpack

        table = msgpack.unpackb(raw.hget(keys.vectors, "k"), raw=False)
        assert list(table) == ["text"]
        vector, norm = table["text"]  # float32 bytes, and the norm a search divides by
        assert len(vector) == 8 * 4 and list(struct.unpack("<8f", vector)) == embed(["hello"])[0]
        assert norm == math.sqrt(sum(x * x for x in embed(["hello"])[0]))

    def test_vectors_stored_without_their_norm_still_rank(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        """Vectors written before norms were stored (``{path: float32 bytes}``) rank as the others."""
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        both(s, [("put", (("m",), k, {"text": t}), {}) for k, t in [("a", "pears"), ("b", "cars"), ("c", "par")]], ref)
        import msgpack

        keys = Keys(namespace, 64).store("m")
        for key in ("a", "c"):
            table = msgpack.unpackb(raw.hget(keys.vectors, key), raw=False)
            raw.hset(keys.vectors, key, msgpack.packb({p: v[0] for p, v in table.items()}))
        got, want = s.search(("m",), query="pear"), ref.search(("m",), query="pear")
        assert view(got) == view(want)
        assert all(math.isclose(g.score, w.score, rel_tol=1e-6) for g, w in zip(got, want, strict=True))

    @pytest.mark.parametrize("numpy", [False, True], ids=["python", "numpy"])
    def test_ranking_with_ties_several_fields_and_pages_matches_in_memory(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch, numpy: bool
    ) -> None:
        """Both ways of computing the scores (numpy when importable, pure Python) rank as InMemoryStore:
        equal scores in insertion order, an item's best field, scoreless items last."""
        if numpy and not _store_rank.NUMPY:
            pytest.skip("numpy is not importable here")
        monkeypatch.setattr(_store_rank, "NUMPY", numpy)
        index: Any = {"dims": 8, "embed": embed, "fields": ["text", "more"]}
        s, ref = mk(index=index), InMemoryStore(index=index)
        words = ["pear", "car", "pear", "apple pie", "zebra", "pear", "carrot", "a", "pears and cars"]
        ops = [("put", (("t",), f"k{i}", {"text": w, "more": words[-1 - i] + "!"}), {}) for i, w in enumerate(words)]
        ops += [("put", (("t",), "plain", {"other": 1}), {}), ("put", (("t",), "x", {"more": "pear"}), {})]
        both(s, ops, ref)
        for query, kw in [("pear", {}), ("pear", {"limit": 2, "offset": 1}), ("car", {"limit": 20}),
                          ("zzz", {"limit": 4, "offset": 9}), ("pear", {"filter": {"text": "pear"}})]:  # fmt: skip
            got, want = s.search(("t",), query=query, **kw), ref.search(("t",), query=query, **kw)
            assert view(got) == view(want), (query, kw)
            for g, w in zip(got, want, strict=True):
                assert (g.score is None) == (w.score is None)
                assert g.score is None or math.isclose(g.score, w.score, rel_tol=1e-6, abs_tol=1e-6)

    def test_without_the_cache_a_ranking_reads_values_with_their_vectors(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """One script reads each page of items with their vectors (mode '1'): a score is always that of the
        value returned, whatever a writer does between two reads."""
        s, ref = mk(index=INDEX, vector_cache_bytes=0), InMemoryStore(index=INDEX)
        both(s, [("put", (("d",), f"k{i}", {"text": f"doc {i} " + "x" * i}), {}) for i in range(30)], ref)
        sent = _record(monkeypatch)
        got = s.search(("d",), query="doc xxxx", limit=3, offset=2)
        assert view(got) == view(ref.search(("d",), query="doc xxxx", limit=3, offset=2))
        assert [(c.script, c.args[-1] if c.script == "lgs_prefix" else None) for c in sent] == [("lgs_prefix", "1")]

    def test_a_ranking_from_the_cache_reads_the_values_it_returns_only(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With the cache of vectors (the default): the first search scans the namespace (stamps, then its
        vectors by HMGET); the next ones send the prefix's listing and one lgs_pick, which checks the
        write version and reads the 3 values returned, the 2 ranked before the offset checked live only."""
        if not _store_rank.NUMPY:
            pytest.skip("the cache needs numpy")
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        both(s, [("put", (("d",), f"k{i}", {"text": f"doc {i} " + "x" * i}), {}) for i in range(30)], ref)
        sent = _record(monkeypatch)
        want = view(ref.search(("d",), query="doc xxxx", limit=3, offset=2))
        assert view(s.search(("d",), query="doc xxxx", limit=3, offset=2)) == want
        assert [c.script for c in sent] == ["lgs_prefix", "lgs_scan", "lgs_prefix", "lgs_pick"]
        sent.clear()
        got = s.search(("d",), query="doc xxxx", limit=3, offset=2)
        assert view(got) == want
        assert [c.script for c in sent] == ["lgs_prefix", "lgs_pick"]
        pick = sent[1].args
        assert pick[2] == 2 and pick[3 + 2 :] == [i.key for i in got]
        sent.clear()
        both(s, [("put", (("d",), "k3", {"text": "doc xxxx"}), {})], ref)  # a writer: the version moves
        sent.clear()
        got = s.search(("d",), query="doc xxxx", limit=3)
        assert view(got) == view(ref.search(("d",), query="doc xxxx", limit=3))
        assert [c.script for c in sent] == ["lgs_prefix", "lgs_pick", "lgs_scan", "lgs_prefix", "lgs_pick"]

    def test_more_than_it_ranks_exactly_goes_to_the_vector_index(
        self, mk: Callable[..., Memory], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Above MAX_EXACT live items the ranking reads the index's lists (tests/test_langgraph_store_ann.py);
        before one is trained, its one list holds every vector: InMemoryStore's answer still."""
        monkeypatch.setattr(_store_core, "MAX_EXACT", 5)
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        both(s, [("put", (("big",), f"k{i}", {"text": f"item {i}", "i": i}), {}) for i in range(6)], ref)
        for kw in ({}, {"filter": {"i": {"$lt": 5}}}, {"limit": 2, "offset": 1}):
            got, want = s.search(("big",), query="item", **kw), ref.search(("big",), query="item", **kw)
            assert view(got) == view(want), kw
        assert len(s.search(("big",), limit=10)) == 6  # no query: no ranking


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.mark.skipif(not _store_rank.NUMPY, reason="the cache of vectors needs numpy")
class TestVectorCache:
    """The client's cache of namespaces' vectors (``_store_cache.py``): never a stale answer, bounded."""

    @pytest.mark.parametrize("cache_bytes", [_store_cache.DEFAULT_BYTES, 0], ids=["cache", "no-cache"])
    def test_searches_while_another_store_writes_see_every_write_that_returned(
        self, mk: Callable[..., Memory], backend: Any, namespace: str, cache_bytes: int
    ) -> None:
        """A second store (its own client) puts, updates and deletes while this one searches. Against a
        read-after-write model: a search returns every item whose put returned before it began and no
        delete had begun by its end, no item whose delete returned before it began, each at least as new
        as the last write that returned before it began, and each score that of the value it returns."""
        s = mk(index=INDEX, vector_cache_bytes=cache_bytes)
        writer = AgentStateStore(backend.sync_client(), namespace=namespace, index=INDEX)
        words = ["pear", "pears", "a pear tree", "car", "apple", "pear pie", "zebra", "peer"]
        keys = [f"k{i}" for i in range(12)]
        for i, key in enumerate(keys[:6]):
            writer.put(("race",), key, {"text": words[i % len(words)], "gen": 0})
        # [kind, key, gen, began, returned]: logged before the write is sent (returned None until it is).
        log: list[list[Any]] = [["put", key, 0, 0.0, 0.0] for key in keys[:6]]
        s.search(("race",), query="pear", limit=50)  # warm: the searches below start from the cache
        stop = threading.Event()
        failed: list[BaseException] = []

        def write() -> None:
            rng = __import__("random").Random(7)
            gen = 0
            try:
                while not stop.is_set() and gen < 300:
                    gen += 1
                    key = rng.choice(keys)
                    entry: list[Any] = ["delete" if rng.random() < 0.25 else "put", key, gen, time.monotonic(), None]
                    log.append(entry)
                    if entry[0] == "delete":
                        writer.delete(("race",), key)
                    else:
                        writer.put(("race",), key, {"text": rng.choice(words), "gen": gen})
                    entry[4] = time.monotonic()
            except BaseException as exc:  # reported by the test thread
                failed.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        searches = 0
        try:
            while thread.is_alive() or searches < 5:
                began = time.monotonic()
                got = s.search(("race",), query="pear", limit=50)
                ended = time.monotonic()
                searches += 1
                seen = [list(e) for e in log]
                found = {i.key: i for i in got}
                assert len(found) == len(got)
                for key in keys:
                    mine = [e for e in seen if e[1] == key]
                    done = [e for e in mine if e[4] is not None and e[4] <= began]
                    last = done[-1] if done else None
                    # Writes that may have reached the server by the search's end: begun by then, after ``last``.
                    racing = [e for e in mine if e[3] <= ended and (last is None or e[2] > last[2])]
                    if key in found:
                        gen = found[key].value["gen"]
                        if last is not None and last[0] == "delete":
                            assert any(e[0] == "put" for e in racing), f"{key} was deleted before the search began"
                        assert last is None or last[0] == "delete" or gen >= last[2], (key, gen)
                        want = _cosine(embed(["pear"])[0], embed([found[key].value["text"]])[0])
                        assert math.isclose(found[key].score, want, rel_tol=1e-6), key
                    elif last is not None and last[0] == "put":
                        assert any(e[0] == "delete" for e in racing), f"{key} (put before the search) is missing"
                scores = [i.score for i in got]
                assert scores == sorted(scores, reverse=True)
        finally:
            stop.set()
            thread.join()
        assert not failed, failed
        assert searches >= 5

    def test_an_item_that_expires_after_the_cache_read_it_is_never_returned(self, mk: Callable[..., Memory]) -> None:
        s = mk(index=INDEX, ttl={"default_ttl": 0.001, "refresh_on_read": False})  # 60 ms
        s.put(("e",), "short", {"text": "pear"})
        s.put(("e",), "long", {"text": "pears"}, ttl=None)
        s.put(("e",), "other", {"text": "car"}, ttl=None)
        # Fills the cache (with "short" while it lives: 60 ms is short on a loaded machine).
        assert "long" in [i.key for i in s.search(("e",), query="pear", limit=2)]
        deadline = time.monotonic() + 10
        while s.get(("e",), "short") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert [i.key for i in s.search(("e",), query="pear", limit=1)] == ["long"]
        assert [i.key for i in s.search(("e",), query="pear", limit=1, offset=1)] == ["other"]

    def test_a_new_namespace_under_the_prefix_is_ranked_in(self, mk: Callable[..., Memory]) -> None:
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        assert s.search((), query="pear") == [] and s.search(("p",), query="pear") == []
        both(s, [("put", (("p", "a"), "x", {"text": "pear"}), {})], ref)
        assert view(s.search(("p",), query="pear")) == view(ref.search(("p",), query="pear"))
        both(s, [("put", (("p", "b"), "y", {"text": "pears"}), {}), ("put", (("p", "a"), "x", None), {})], ref)
        assert view(s.search(("p",), query="pear")) == view(ref.search(("p",), query="pear"))
        assert view(s.search((), query="pear")) == view(ref.search((), query="pear"))

    def test_a_short_pick_among_many_ties_ranks_as_in_memory(self, mk: Callable[..., Memory]) -> None:
        """Many more items than the pick (the cache sorts only the rows that can be in it), equal scores
        among them: InMemoryStore's order (ties in insertion order), scoreless items after."""
        s, ref = mk(index=INDEX), InMemoryStore(index=INDEX)
        words = ["pear", "pears", "reap", "car", "pear", "a pear", "zebra"]
        ops = [("put", (("ties",), f"k{i:02d}", {"text": words[i % len(words)]}), {}) for i in range(60)]
        ops.append(("put", (("ties",), "plain", {"other": 1}), {}))
        both(s, ops, ref)
        for kw in ({"limit": 3}, {"limit": 3, "offset": 2}, {"limit": 5, "offset": 9}, {"limit": 4, "offset": 58}):
            got, want = s.search(("ties",), query="pear", **kw), ref.search(("ties",), query="pear", **kw)
            assert view(got) == view(want), kw
            assert all(math.isclose(g.score or 0, w.score or 0, rel_tol=1e-6) for g, w in zip(got, want, strict=True))

    def test_the_cache_is_bounded_by_bytes(self, mk: Callable[..., Memory]) -> None:
        s, ref = mk(index=INDEX, vector_cache_bytes=3000), InMemoryStore(index=INDEX)
        ops = [("put", ((f"n{j}",), f"k{i}", {"text": f"doc {i} " + "x" * (i + j)}), {}) for j in range(3)
               for i in range(6)]  # fmt: skip
        both(s, ops, ref)
        cache = s.store._core.cache
        for _ in range(2):
            for j in range(3):
                got, want = s.search((f"n{j}",), query="doc xx"), ref.search((f"n{j}",), query="doc xx")
                assert view(got) == view(want)
                assert 0 < cache.nbytes <= 3000
        assert len(cache._entries) < 3
        off = mk(index=INDEX, vector_cache_bytes=0)
        assert view(off.search(("n0",), query="doc xx")) == view(ref.search(("n0",), query="doc xx"))
        assert off.store._core.cache.nbytes == 0
        for bad in (-1, 1.5, "64", True):
            with pytest.raises(InvalidArgument, match="vector_cache_bytes"):
                mk(index=INDEX, vector_cache_bytes=bad)


class TestTTL:
    def test_expired_items_are_never_returned_and_sweep_drops_them(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        s = mk(ttl={"default_ttl": 0.001, "refresh_on_read": False})  # 60 ms, not renewed by the reads below
        s.put(("t", "a"), "k", {"v": 1})
        s.put(("t", "b"), "k", {"v": 2}, ttl=None)
        deadline = time.monotonic() + 10
        while s.get(("t", "a"), "k") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert view(s.search(("t",))) == [(("t", "b"), "k", {"v": 2})]
        assert s.list_namespaces() == [("t", "b")]
        assert s.sweep() == 1
        keys = Keys(namespace, 64).store("t" + SEP + "a")
        assert raw.exists(keys.items, keys.order, keys.expiry) == 0
        assert s.sweep() == 0

    def test_refresh_on_read(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s = mk(ttl={"default_ttl": 10, "refresh_on_read": True})
        s.put(("r",), "k", {"v": 1})
        keys = Keys(namespace, 64).store("r")
        first = raw.zscore(keys.expiry, "k")
        time.sleep(0.01)
        s.get(("r",), "k", refresh_ttl=False)
        assert raw.zscore(keys.expiry, "k") == first
        s.get(("r",), "k")
        second = raw.zscore(keys.expiry, "k")
        assert second > first
        time.sleep(0.01)
        s.search(("r",))
        assert raw.zscore(keys.expiry, "k") > second

    def test_a_search_refreshes_every_item_it_returns_in_bounded_calls(
        self, mk: Callable[..., Memory], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_store_index, "PAGE", 2)
        s = mk(ttl={"default_ttl": 10})
        for i in range(5):
            s.put(("r",), f"k{i}", {"i": i})
        keys = Keys(namespace, 64).store("r")
        before = dict(raw.zrange(keys.expiry, 0, -1, withscores=True))
        time.sleep(0.01)
        assert len(s.search(("r",), limit=10)) == 5
        after = dict(raw.zrange(keys.expiry, 0, -1, withscores=True))
        assert set(after) == set(before) and all(after[k] > before[k] for k in before)


def _dump(raw: Any, namespace: str) -> dict[bytes, Any]:
    record = Keys(namespace).layout_key().encode()
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{namespace}:*", count=1000)) if k != record}


class TestBadInput:
    @pytest.mark.parametrize(
        "op, error",
        [
            (PutOp(("a.b",), "k", {"v": 1}), InvalidNamespaceError),
            (PutOp(("a", ""), "k", {"v": 1}), InvalidNamespaceError),
            (PutOp((), "k", {"v": 1}), InvalidNamespaceError),
            (PutOp(("a", 1), "k", {"v": 1}), InvalidNamespaceError),  # type: ignore[arg-type]
            (PutOp(("a",), "k", {"v": object()}), InvalidArgument),
            (PutOp(("a",), "k", ["not", "a", "dict"]), InvalidArgument),  # type: ignore[arg-type]
            (PutOp(("a",), 7, {"v": 1}), InvalidArgument),  # type: ignore[arg-type]
            (PutOp(("a",), "k", {"v": 1}, ttl=-1), InvalidArgument),
            (PutOp(("a",), "k", {"v": 1}, index="text"), InvalidArgument),  # type: ignore[arg-type]
            (SearchOp(("a",), {"v": {"$regex": "x"}}), InvalidArgument),
            (SearchOp(("a",), None, -1), InvalidArgument),
            (SearchOp("a", None), InvalidArgument),  # type: ignore[arg-type]
            (GetOp(("a.b",), "k"), InvalidNamespaceError),
            (PutOp(("a", "\ud800"), "k", {"v": 1}), InvalidArgument),  # a lone surrogate: not UTF-8
            (PutOp(("a",), "\udfff", {"v": 1}), InvalidArgument),
            (PutOp(("a",), "k", {"v": "\ud800"}), InvalidArgument),
            (PutOp(("a",), "k" * 1025, {"v": 1}), InvalidArgument),
        ],
    )
    def test_refused_before_anything_is_written(
        self, mk: Callable[..., Memory], raw: Any, namespace: str, op: Any, error: type[Exception]
    ) -> None:
        s = mk()
        s.put(("a",), "kept", {"v": 0})
        before = _dump(raw, namespace)
        with pytest.raises(error):
            s.batch([PutOp(("a",), "new", {"v": 1}), op])
        assert _dump(raw, namespace) == before
        assert s.get(("a",), "kept").value == {"v": 0} and s.get(("a",), "new") is None

    def test_wrong_embedding_size_is_refused(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s = mk(index={"dims": 4, "embed": embed, "fields": ["text"]})
        with pytest.raises(InvalidArgument, match="8 dimensions"):
            s.put(("a",), "k", {"text": "x"})
        assert _dump(raw, namespace) == {}

    def test_bad_configuration(self, mk: Callable[..., Memory]) -> None:
        for kw in [{"ttl": {"default_ttl": 0}}, {"ttl": {"nope": 1}}, {"index": {"dims": 0, "embed": embed}},
                   {"index": {"embed": embed}}, {"ttl": {"refresh_on_read": "yes"}},
                   {"ttl": {"sweep_interval_minutes": 0}}]:  # fmt: skip
            with pytest.raises(InvalidArgument):
                mk(**kw)


class TestCorruptData:
    def test_a_damaged_item_names_its_key(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s = mk()
        s.put(("c",), "k", {"v": 1})
        keys = Keys(namespace, 64).store("c")
        raw.hset(keys.items, "k", b"garbage")
        for call in (lambda: s.get(("c",), "k"), lambda: s.search(("c",)), lambda: s.put(("c",), "k", {"v": 2})):
            with pytest.raises(CorruptState) as err:
                call()
            assert keys.items in str(err.value) and "LangGraph store namespace" in str(err.value)
        raw.hset(keys.items, "k", b"1:2::n:[1,2]")  # a header, and JSON that is not an object
        with pytest.raises(CorruptState, match="lgsi"):
            s.get(("c",), "k")

    def test_a_key_of_the_wrong_type_or_damaged_vectors(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        s = mk(index=INDEX)
        s.put(("w",), "k", {"text": "x"})
        keys = Keys(namespace, 64).store("w")
        raw.hset(keys.vectors, "k", b"\xc1")
        with pytest.raises(CorruptState, match="lgsv"):
            s.search(("w",), query="x")
        raw.delete(keys.items)
        raw.set(keys.items, "a string")
        with pytest.raises(CorruptState, match="lgsi"):
            s.get(("w",), "k")

    def test_a_damaged_write_version_names_its_key(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        """The write version the cache of vectors checks (``lgsc`` field ``w``): damaged, a search (cold or
        from the cache) and a put raise CorruptState naming the key, and the put writes nothing."""
        s = mk(index=INDEX)
        s.put(("v",), "k", {"text": "pear"})
        assert [i.key for i in s.search(("v",), query="pear")] == ["k"]
        keys = Keys(namespace, 64).store("v")
        assert raw.hget(keys.centroids, "w").isdigit()
        for damage in (b"garbage", b"1" * 40):
            raw.hset(keys.centroids, "w", damage)
            for store in (s, mk(index=INDEX)):  # warm, and a store with nothing cached
                with pytest.raises(CorruptState, match="lgsc"):
                    store.search(("v",), query="pear")
            with pytest.raises(CorruptState, match="lgsc"):
                s.put(("v",), "k", {"text": "car"})
            assert raw.hget(keys.centroids, "w") == damage
            assert json.loads(raw.hget(keys.items, "k").split(b":", 4)[4]) == {"text": "pear"}
        raw.delete(keys.centroids)
        raw.set(keys.centroids, "a string")
        with pytest.raises(CorruptState, match="lgsc"):
            s.search(("v",), query="pear")

    def test_vectors_damaged_after_the_cache_read_them_are_found_at_the_next_write(
        self, mk: Callable[..., Memory], raw: Any, namespace: str
    ) -> None:
        s = mk(index=INDEX)
        s.put(("dv",), "k", {"text": "pear"})
        s.put(("dv",), "j", {"text": "car"})
        s.search(("dv",), query="pear")
        keys = Keys(namespace, 64).store("dv")
        raw.hset(keys.vectors, "j", b"\xc1")
        s.put(("dv",), "j", {"text": "cars"})  # a write: its vectors are read again, the new ones
        assert [i.key for i in s.search(("dv",), query="car")] == ["j", "k"]
        raw.hset(keys.vectors, "j", b"\xc1")
        s.put(("dv",), "k", {"text": "pears"})  # j's stamp is unchanged: the cache keeps its vectors
        assert [i.key for i in s.search(("dv",), query="car")] == ["j", "k"]
        with pytest.raises(CorruptState, match="lgsv"):
            mk(index=INDEX).search(("dv",), query="car")


class TestLayout:
    def test_namespaces_spread_over_slots_and_one_namespace_shares_one(self, mk: Callable[..., Memory], raw: Any,
                                                                       namespace: str) -> None:  # fmt: skip
        s = mk()
        for u in range(20):
            s.put(("users", f"u{u}"), "k", {"u": u})
        slots = set()
        for u in range(20):
            keys = Keys(namespace, 64).store(f"users{SEP}u{u}")
            own = {key_slot(k.encode()) for k in keys.as_list()}
            assert len(own) == 1 and raw.hexists(keys.items, "k")
            slots |= own
        assert len(slots) > 5
        assert len(s.search(("users",), limit=100)) == 20

    def test_a_reshard_moves_every_namespace_and_its_indexes(
        self, mk: Callable[..., Memory], backend: Any, namespace: str, raw: Any
    ) -> None:
        """The mover splits the shards' namespace indexes by path (keys.STORE_INDEXES), a path listed for a
        prefix going to the new shard of that prefix (keys.STORE_PREFIX_INDEXES): after 2 -> 8 shards every
        prefix lists and searches as before, by a store made before and after, each from its own shard."""
        from redis_agentstate import CheckpointStore

        before = mk(shards=2)
        for u in range(12):
            before.put(("users", f"u{u}"), "k", {"u": u})
            before.put(("users", f"u{u}", "notes"), "n", {"u": u})
        before.put(("users",), "top", {"u": -1})
        prefixes = [(), ("users",), ("users", "u3"), ("users", "u3", "notes"), ("users", "u1"), ("nope",)]
        was = {p: (before.list_namespaces(prefix=p, limit=100), view(before.search(p, limit=100))) for p in prefixes}
        assert len(was[("users",)][0]) == 25 and len(was[("users", "u3")][1]) == 2
        report = CheckpointStore(backend.sync_client(), namespace=namespace).reshard(8)
        assert (report.from_shards, report.to_shards) == (2, 8)
        for s in (before, mk()):
            for p in prefixes:
                assert (s.list_namespaces(prefix=p, limit=100), view(s.search(p, limit=100))) == was[p], p
            assert sorted(i.value["u"] for i in s.search(("users",), filter={"u": {"$gte": 0}}, limit=100)) == sorted(
                list(range(12)) * 2
            )
            assert s.get(("users", "u3"), "k").value == {"u": 3}
        # Each path sits in the new shard of each of its prefixes, and nowhere else.
        keys = Keys(namespace, 8)
        want: dict[str, set[str]] = {}
        for ns in was[()][0]:
            for k in range(1, len(ns) + 1):
                want.setdefault(keys.store(SEP.join(ns[:k])).namespaces, set()).add(SEP.join(ns))
        got = _indexes(raw, namespace)
        assert got == want
        before.put(("users", "new"), "k", {"u": 99})
        before.delete(("users", "u3", "notes"), "n")
        after = mk()
        assert after.get(("users", "new"), "k").value == {"u": 99}
        assert after.list_namespaces(prefix=("users", "u3")) == [("users", "u3")]
        assert ("users", "new") in after.list_namespaces(prefix=("users",), limit=100)


# ---- a graph that uses the store, run by a GraphWorker ----------------------------------------------


class _S(TypedDict):
    n: int


def _remembering_graph() -> Any:
    from langgraph.config import get_store
    from langgraph.graph import END, START, StateGraph

    def node(state: _S) -> dict[str, int]:
        store = get_store()
        seen = store.get(("mem",), "count")
        count = (seen.value["c"] if seen else 0) + state["n"]
        store.put(("mem",), "count", {"c": count})
        return {"n": count}

    b = StateGraph(_S)
    b.add_node("node", node)
    b.add_edge(START, "node")
    b.add_edge("node", END)
    return b.compile()


@pytest.mark.parametrize(
    "backend",
    [pytest.param("fake", marks=pytest.mark.fakeredis), "real", pytest.param("cluster", marks=pytest.mark.cluster)],
    indirect=True,
)
def test_graph_worker_passes_its_store(backend: Any, namespace: str) -> None:
    store = AgentStateStore(backend.sync_client(), namespace)
    worker = GraphWorker(_remembering_graph(), RunQueue(backend.sync_client(), namespace=namespace),
                         AgentStateSaver(backend.sync_client(), namespace=namespace), store=store,
                         lease_ms=3_000, block_ms=200)  # fmt: skip
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        queue = RunQueue(backend.sync_client(), namespace=namespace)
        for tid in ("t1", "t2"):
            run = queue.create(tid, {"n": 2})
            assert queue.join(run.run_id, timeout_s=30).status == "success"
    finally:
        worker.stop()
        t.join(20)
    assert store.get(("mem",), "count").value == {"c": 4}
    with pytest.raises(InvalidArgument):
        GraphWorker(_remembering_graph(), RunQueue(backend.sync_client(), namespace=namespace),
                    AgentStateSaver(backend.sync_client(), namespace=namespace), store=object())  # fmt: skip


def test_compile_with_saver_and_store(backend: Any, namespace: str) -> None:
    graph = _remembering_graph().builder.compile(
        checkpointer=AgentStateSaver(backend.sync_client(), namespace=namespace),
        store=AgentStateStore(backend.sync_client(), namespace),
    )
    config = {"configurable": {"thread_id": "t"}}
    assert graph.invoke({"n": 3}, config)["n"] == 3
    assert graph.invoke({"n": 4}, config)["n"] == 7


class TestShells:
    def test_async_store_sync_face_runs_on_its_loop_from_another_thread(self, backend: Any, namespace: str) -> None:
        import asyncio

        got: list[Any] = []

        async def main() -> None:
            client = backend.new_async_client()
            async with AsyncAgentStateStore(client, namespace) as store:
                with pytest.raises(asyncio.InvalidStateError):
                    store.put(("a",), "k", {"v": 0})  # from the loop itself: refused, not a deadlock

                def work() -> None:
                    store.put(("a",), "k", {"v": 2})
                    got.append(store.get(("a",), "k"))

                await asyncio.get_running_loop().run_in_executor(None, work)
            await client.aclose()

        asyncio.run(main())
        assert got[0].value == {"v": 2}

    def test_async_calls_in_one_turn_of_the_loop_run_as_one_batch(
        self, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As LangGraph's AsyncBatchedBaseStore: concurrent calls share one batch (their gets one round
        trip); a call that fails its checks, or whose reads fail, fails alone; reads see no write of the turn."""
        import asyncio

        from langgraph.store.base import InvalidNamespaceError

        executed: list[int] = []
        execute = _store_core.StoreCore.execute

        def counted(self: Any, plan: Any, *args: Any) -> Any:
            executed.append(len(plan.ops))
            return execute(self, plan, *args)

        async def main() -> dict[str, Any]:
            client = backend.new_async_client()
            out: dict[str, Any] = {}
            async with AsyncAgentStateStore(client, namespace, index=INDEX) as store:
                await asyncio.gather(*(store.aput(("u", str(i)), "k", {"i": i, "text": f"t{i}"}) for i in range(8)))
                monkeypatch.setattr(_store_core.StoreCore, "execute", counted)
                sent = _record(monkeypatch)
                got = await asyncio.gather(*(store.aget(("u", str(i)), "k") for i in range(8)))
                out["gets"] = [g.value["i"] for g in got]
                out["get_calls"] = [c.script for c in sent]
                out["get_runs"] = list(executed)
                executed.clear()
                # A bad call, a search that fails while it runs (a filter on an operand that is no number), good ones.
                results = await asyncio.gather(
                    store.aput(("u", "0"), "k", {"i": 100}),
                    store.aget(("u", "1"), "k"),
                    store.aput(("bad.label",), "k", {"i": -1}),
                    store.asearch(("u",), query="t", filter={"i": {"$gt": "not a number"}}),
                    store.aget(("u", "0"), "k"),
                    return_exceptions=True,
                )
                out["mixed"] = results
                out["after"] = (await store.aget(("u", "0"), "k")).value
                out["same_turn"] = await asyncio.gather(
                    store.aput(("u", "2"), "k", {"i": 200}), store.aget(("u", "2"), "k")
                )
                out["then"] = (await store.aget(("u", "2"), "k")).value
            await client.aclose()
            return out

        out = asyncio.run(main())
        assert out["gets"] == list(range(8))
        assert out["get_runs"] == [8] and out["get_calls"] == ["lgs_get"] * 8  # one pipeline: a call per namespace
        put, get1, bad, search, get0 = out["mixed"]
        assert put is None and get1.value == {"i": 1, "text": "t1"}
        assert isinstance(bad, InvalidNamespaceError) and type(search) is ValueError
        # One call failed its checks: the turn's calls ran one by one, in the order they were made.
        assert get0.value == {"i": 100} and out["after"] == {"i": 100}
        # Merged: the reads of a turn see none of its writes (InMemoryStore's rule for one batch).
        assert out["same_turn"][1].value == {"i": 2, "text": "t2"} and out["then"] == {"i": 200}

    def test_a_damaged_shard_index_names_its_key(self, mk: Callable[..., Memory], raw: Any, namespace: str) -> None:
        s = mk(shards=1)
        s.put(("a",), "k", {"v": 1})
        index = Keys(namespace, 1).store_index(0)[0]
        raw.delete(index)
        raw.set(index, "not a zset")
        with pytest.raises(CorruptState, match="lgsns"):
            s.list_namespaces()


@pytest.mark.parametrize("backend", ["real"], indirect=True)
def test_from_conn_string_and_setup(backend: Any, namespace: str, twin_loop: Any) -> None:
    """The URL face (a server's URL: the Cluster's clients are built by hand in these tests)."""
    with AgentStateStore.from_conn_string(backend.url, namespace=namespace) as store:
        store.setup()
        store.put(("a",), "k", {"v": 1})

    async def main() -> Any:
        async with AsyncAgentStateStore.from_conn_string(backend.url, namespace=namespace) as s:
            await s.asetup()
            return await s.aget(("a",), "k")

    assert twin_loop.run_until_complete(main()).value == {"v": 1}


#: Why the swallowed-cancel tests need 3.11: the driver sees a cancel a round trip swallowed by the
#: task's cancel count (``Task.cancelling``), which Python 3.10 does not keep.
SWALLOWED_CANCELS = "Python 3.10 keeps no cancel count (Task.cancelling), so a swallowed cancel goes unseen"


def _swept(raw: Any, namespace: str) -> bool:
    keys = Keys(namespace, 64).store("s")
    return raw.exists(keys.items, keys.order, keys.expiry) == 0


def test_ttl_sweeper_thread(backend: Any, namespace: str, raw: Any) -> None:
    store = AgentStateStore(backend.sync_client(), namespace, ttl={"default_ttl": 0.001, "sweep_interval_minutes": 1})
    assert AgentStateStore(backend.sync_client(), namespace).start_ttl_sweeper().done()  # no ttl: nothing to sweep
    with store:
        store.put(("s",), "k", {"v": 1})
        future = store.start_ttl_sweeper(sweep_interval_minutes=0.0005)  # every 30 ms
        deadline = time.monotonic() + 20
        while not _swept(raw, namespace):
            assert time.monotonic() < deadline, "the sweeper did not drop the expired item"
            time.sleep(0.02)
        assert not future.done()
    assert store.stop_ttl_sweeper(5) and future.done()  # the block's end stopped it


def test_ttl_sweeper_task(backend: Any, namespace: str, raw: Any) -> None:
    import asyncio

    async def main() -> None:
        client = backend.new_async_client()
        async with AsyncAgentStateStore(client, namespace, ttl={"default_ttl": 0.001}) as store:
            await store.aput(("s",), "k", {"v": 1})
            task = await store.start_ttl_sweeper(sweep_interval_minutes=0.0005)
            assert await store.start_ttl_sweeper() is task  # one sweeper per store
            deadline = time.monotonic() + 20
            while not _swept(raw, namespace):
                assert time.monotonic() < deadline, "the sweeper did not drop the expired item"
                await asyncio.sleep(0.02)
        assert task.done()  # the block's end stopped it
        await client.aclose()

    asyncio.run(main())


@pytest.mark.skipif(sys.version_info < (3, 11), reason=SWALLOWED_CANCELS)
def test_a_cancelled_sweeper_stops_wherever_the_cancel_lands(backend: Any, namespace: str) -> None:
    """A cancel that lands mid round trip ends the sweeper task: redis-py's asyncio read returned
    normally from some cancelled reads, the sweep after it ran as if nothing had been asked, and the
    task swept for ever (``stop_ttl_sweeper()`` without a timeout hung a whole suite worker)."""
    import asyncio
    import random

    async def main() -> None:
        client = backend.new_async_client()
        rng = random.Random(7)
        stuck = 0
        try:
            for i in range(60):
                store = AsyncAgentStateStore(client, f"{namespace}-{i}", ttl={"default_ttl": 0.001})
                await store.aput(("s",), "k", {"v": 1})
                # Every 0.6 ms: the cancel below lands in a sweep's round trip more often than not.
                task = await store.start_ttl_sweeper(sweep_interval_minutes=0.00001)
                await asyncio.sleep(rng.random() * 0.03)
                if not await store.stop_ttl_sweeper(5):
                    stuck += 1

                    async def stop_now() -> int:
                        raise asyncio.CancelledError()

                    # The test's own way out, so that a regression fails here instead of hanging:
                    # the loop's next sweep raises what its cancel should have.
                    store.asweep = stop_now  # type: ignore[method-assign]
                    await asyncio.wait({task}, timeout=5)
        finally:
            await client.aclose()
        assert stuck == 0, f"{stuck} of 60 sweepers kept sweeping after their cancel"

    asyncio.run(main())


@pytest.mark.skipif(sys.version_info < (3, 11), reason=SWALLOWED_CANCELS)
def test_a_cancel_a_round_trip_swallowed_is_raised_after_it(backend: Any, namespace: str) -> None:
    """Every cancel of a task awaiting a store call ends that task with CancelledError: none returns
    as if it had not been asked (the calls are gets and sweeps, cancelled at random points)."""
    import asyncio
    import random

    async def main() -> None:
        client = backend.new_async_client()
        store = AsyncAgentStateStore(client, namespace, ttl={"default_ttl": 0.001})
        await store.aput(("s",), "k", {"v": 1})
        rng = random.Random(11)
        returned = 0
        try:
            for i in range(300):
                call = store.asweep() if i % 2 else store.aget(("s",), "k")
                task = asyncio.ensure_future(call)
                await asyncio.sleep(rng.random() * 0.002)
                asked = task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    continue
                returned += asked  # a cancel asked of a running call, and it returned normally
        finally:
            await client.aclose()
        assert returned == 0, f"{returned} of 300 cancelled calls returned as if not cancelled"

    asyncio.run(main())
