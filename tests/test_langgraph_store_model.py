"""Model-based test of ``AgentStateStore``: LangGraph's own ``InMemoryStore`` is the model.

A hypothesis ``RuleBasedStateMachine`` drives two operators on one namespace (A: a sync
``AgentStateStore``, B: an ``AsyncAgentStateStore`` on a loop of its own, each with its own client
and so its own caches) through put / delete (with lost replies: the script applies, its reply is
lost, the library re-sends), batches of both, get, filtered and paged searches, semantic searches
(the exact ranking: a prefix of at most 1,000 items), ``list_namespaces`` with prefix, suffix, depth
and paging, and reshards by a third client, between which the operators go on. Every answer is
compared with ``InMemoryStore``'s to the same calls:

- ``get``: the value, and ``created_at <= updated_at``;
- ``search``: the items (namespace, key, value) in the same order, and with a query the same scores
  in the same order;
- ``list_namespaces`` and a search without a query: ours take the namespaces in tuple order,
  ``InMemoryStore`` in the order first written (documented; LangGraph leaves that order open), so a
  page of ours is compared with the same page of the model's answer in tuple order (each namespace's
  items in the model's order).

The test with an index config puts some items with ``index=False`` (stored, not embedded), as
LangGraph allows. Runs are seeded (``AGENTSTATE_MODEL_SEED``, as tests/test_model.py); hypothesis
prints the shrunk failing sequence of rules. ``AGENTSTATE_FULL_SUITE=1`` runs the long version.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any, ClassVar

import pytest
from conftest import Twin, full_suite
from faults.replies import lose_reply
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from langgraph.store.base import GetOp, PutOp
from langgraph.store.memory import InMemoryStore
from model_support import run_seeded
from test_langgraph_store import INDEX

from redis_agentstate import CheckpointStore
from redis_agentstate.langgraph import AgentStateStore, AsyncAgentStateStore

MODEL_SEED = 40
NAMESPACES = [("u", "a"), ("u", "b"), ("u", "a", "notes"), ("t", "x"), ("u",)]
KEYS = ["k1", "k2", "k3"]
TEXTS = ["red apple", "green pear", "blue sky", "apple pie", "sky high", "pear and apple"]
KINDS = ["x", "y"]
PREFIXES: list[tuple[str, ...]] = [(), ("u",), ("u", "a"), ("t",), ("u", "a", "notes"), ("z",)]
FILTERS: list[dict[str, Any] | None] = [
    None, {"kind": "x"}, {"n": {"$gt": 1}}, {"kind": {"$ne": "y"}}, {"n": {"$lte": 2}, "kind": "x"},
    {"n": {"$gte": 0, "$lt": 3}},
]  # fmt: skip
START_SHARDS = 2
MAX_SHARDS = 16


values = st.builds(
    lambda text, kind, n: {"text": text, "kind": kind, "n": n},
    st.sampled_from(TEXTS),
    st.sampled_from(KINDS),
    st.integers(0, 4),
)


class StoreMachine(RuleBasedStateMachine):
    backend: Any = None
    loop: asyncio.AbstractEventLoop | None = None
    index: Any = None
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        self.ns = f"sm-{uuid.uuid4().hex[:10]}"
        assert cls.loop is not None
        self.ops: dict[str, Any] = {
            "A": AgentStateStore(cls.backend.sync_client(), self.ns, index=cls.index, shards=START_SHARDS),
            "B": Twin(AsyncAgentStateStore(cls.backend.async_client(), self.ns, index=cls.index), cls.loop),
        }
        # A's first call fixes the namespace's shard count (the others, built without one, take it).
        self.ops["A"].get(("u",), "none")
        self.model = InMemoryStore(index=cls.index)
        self.shards = START_SHARDS
        self.mp = pytest.MonkeyPatch()
        self.loss: Any = None

    def teardown(self) -> None:
        self.mp.undo()

    def _call(self, op: str, name: str, *args: Any, **kw: Any) -> Any:
        store = self.ops[op]
        return getattr(store, name if op == "A" else "a" + name)(*args, **kw)

    def _lose(self, lose: bool) -> None:
        self.loss = lose_reply(self.mp, "lgs_put") if lose else None

    def _undo(self) -> str:
        """Disarm the loss; ' lost' when it hit (the library re-sent the call), else ''."""
        self.mp.undo()
        if self.loss is None or self.loss.lost is None:
            return ""
        assert self.loss.resent is not None, "a lost lgs_put reply was not re-sent"
        return " lost"

    # ---- writes ----------------------------------------------------------------------

    @rule(
        op=st.sampled_from(["A", "B"]),
        ns=st.sampled_from(NAMESPACES),
        key=st.sampled_from(KEYS),
        value=values,
        indexed=st.booleans(),
        lose=st.booleans(),
    )
    def put(self, op: str, ns: tuple[str, ...], key: str, value: dict[str, Any], indexed: bool, lose: bool) -> None:
        index: Any = None if indexed or type(self).index is None else False
        self._lose(lose)
        try:
            self._call(op, "put", ns, key, value, index=index)
        finally:
            hit = self._undo()
        self.model.put(ns, key, value, index=index)
        if index is False:
            # InMemoryStore keeps the vectors of the item's earlier, indexed value (a query then scores
            # the new value by the old text); an item put with index=False has none, as ours.
            self.model._vectors[ns].pop(key, None)
        type(self).stats[f"put{hit}"] += 1

    @rule(op=st.sampled_from(["A", "B"]), ns=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS), lose=st.booleans())
    def delete(self, op: str, ns: tuple[str, ...], key: str, lose: bool) -> None:
        self._lose(lose)
        try:
            self._call(op, "delete", ns, key)
        finally:
            hit = self._undo()
        self.model.delete(ns, key)
        type(self).stats[f"delete{hit}"] += 1

    @rule(
        op=st.sampled_from(["A", "B"]),
        writes=st.lists(
            st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(KEYS), st.one_of(st.none(), values)),
            min_size=1,
            max_size=4,
        ),
        read=st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(KEYS)),
    )
    def batch(self, op: str, writes: list[tuple[tuple[str, ...], str, Any]], read: tuple[tuple[str, ...], str]) -> None:
        """Reads of a batch see the store before its writes; the last put of a key wins."""
        ops: list[Any] = [GetOp(*read), *(PutOp(ns, key, value) for ns, key, value in writes)]
        got = self._call(op, "batch", ops)
        # InMemoryStore's own batch refuses two puts of one text to embed (a ValueError of LangGraph's):
        # the model takes the batch as its read, then its writes in order, which is what a batch means.
        want = self.model.get(*read)
        for ns, key, value in writes:
            self.model.put(ns, key, value)
        assert _item(got[0]) == _item(want), (got[0], want)
        type(self).stats["batch"] += 1

    @rule(roll=st.integers(0, 3))
    def reshard(self, roll: int) -> None:
        """A third client reshards the namespace (to twice the shards); both operators go on with it."""
        if roll or self.shards >= MAX_SHARDS:
            return
        raw = type(self).backend.sync_client()
        report = CheckpointStore(raw, namespace=self.ns).reshard(self.shards * 2)
        assert (report.from_shards, report.to_shards) == (self.shards, self.shards * 2)
        self.shards *= 2
        type(self).stats["reshard"] += 1

    # ---- reads -----------------------------------------------------------------------

    @rule(op=st.sampled_from(["A", "B"]), ns=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS))
    def get(self, op: str, ns: tuple[str, ...], key: str) -> None:
        got = self._call(op, "get", ns, key)
        want = self.model.get(ns, key)
        assert _item(got) == _item(want), (ns, key, got, want)
        if got is not None:
            assert got.created_at <= got.updated_at
        type(self).stats["get"] += 1

    @rule(
        op=st.sampled_from(["A", "B"]),
        prefix=st.sampled_from(PREFIXES),
        flt=st.sampled_from(FILTERS),
        limit=st.integers(1, 12),
        offset=st.integers(0, 4),
    )
    def search(self, op: str, prefix: tuple[str, ...], flt: Any, limit: int, offset: int) -> None:
        got = self._call(op, "search", prefix, filter=flt, limit=limit, offset=offset)
        want = _in_tuple_order(self.model.search(prefix, filter=flt, limit=10_000))[offset : offset + limit]
        assert [_item(i) for i in got] == [_item(i) for i in want], (prefix, flt, limit, offset)
        type(self).stats["search"] += 1

    @rule(
        op=st.sampled_from(["A", "B"]),
        prefix=st.sampled_from(PREFIXES),
        query=st.sampled_from(TEXTS),
        flt=st.sampled_from(FILTERS),
        limit=st.integers(1, 12),
        offset=st.integers(0, 3),
    )
    def semantic_search(self, op: str, prefix: tuple[str, ...], query: str, flt: Any, limit: int, offset: int) -> None:
        if type(self).index is None:
            return
        got = self._call(op, "search", prefix, query=query, filter=flt, limit=limit, offset=offset)
        # Equal scores across namespaces: ours in namespace tuple order, as everywhere. The model's whole
        # ranking is sorted so, stably (each namespace's items keep the model's order), then paged as
        # InMemoryStore pages it: the offset..offset+limit best, then items without a vector up to limit.
        ranked = self.model.search(prefix, query=query, filter=flt, limit=10_000)
        scored = sorted((i for i in ranked if i.score is not None), key=lambda i: (-i.score, tuple(i.namespace)))
        scoreless = _in_tuple_order([i for i in ranked if i.score is None])
        want = scored[offset : offset + limit]
        want += scoreless[: limit - len(want)]
        assert [_scored(i) for i in got] == [_scored(i) for i in want], (prefix, query, flt, limit, offset)
        type(self).stats["semantic search"] += 1

    @rule(
        op=st.sampled_from(["A", "B"]),
        prefix=st.sampled_from([None, *PREFIXES]),
        suffix=st.sampled_from([None, ("notes",), ("a",), ("x",)]),
        max_depth=st.sampled_from([None, 1, 2]),
        limit=st.integers(1, 10),
        offset=st.integers(0, 3),
    )
    def list_namespaces(self, op: str, prefix: Any, suffix: Any, max_depth: Any, limit: int, offset: int) -> None:
        got = self._call(op, "list_namespaces", prefix=prefix, suffix=suffix, max_depth=max_depth,
                         limit=limit, offset=offset)  # fmt: skip
        # InMemoryStore keeps listing a namespace whose last item was deleted (or that a delete of a
        # missing item named); ours and PostgresStore list the namespaces that hold items: the model's
        # answer is taken from a store holding its items only.
        holding = InMemoryStore()
        for item in self.model.search((), limit=10_000):
            holding.put(tuple(item.namespace), item.key, item.value, index=False)
        every = holding.list_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth, limit=10_000)
        assert got == sorted(every)[offset : offset + limit], (prefix, suffix, max_depth, limit, offset)
        type(self).stats["list_namespaces"] += 1

    @invariant()
    def every_item_is_as_the_model_says(self) -> None:
        """A fresh store on a client of its own (no caches) reads what the model holds, in its order."""
        if not hasattr(self, "model"):
            return
        fresh = AgentStateStore(type(self).backend.sync_client(), self.ns, index=type(self).index)
        got = fresh.search((), limit=100)
        want = _in_tuple_order(self.model.search((), limit=100))
        assert [_item(i) for i in got] == [_item(i) for i in want]


def _in_tuple_order(items: list[Any]) -> list[Any]:
    """The model's answer with its namespaces in tuple order, each namespace's items in the model's order."""
    return sorted(items, key=lambda i: tuple(i.namespace))


def _item(item: Any) -> Any:
    return None if item is None else (tuple(item.namespace), item.key, item.value)


def _scored(item: Any) -> Any:
    score = item.score
    return (*_item(item), None if score is None else round(score, 6))


def _run(machine: type[StoreMachine], config: pytest.Config, backend: Any) -> None:
    examples, steps = (25, 40) if full_suite(config) else (10, 30)
    if backend.kind != "fake":
        examples = examples // 2
    run_seeded(machine, examples=examples, steps=steps, default_seed=MODEL_SEED)
    # Every kind of rule ran: a machine whose rules all fail their draws checks nothing.
    kinds = {"put", "put lost", "delete", "delete lost", "batch", "get", "search", "list_namespaces"}
    assert kinds <= set(machine.stats), machine.stats


def test_the_store_behaves_as_in_memory_store(
    backend: Any, twin_loop: asyncio.AbstractEventLoop, pytestconfig: pytest.Config
) -> None:
    class Plain(StoreMachine):
        pass

    Plain.backend, Plain.loop, Plain.index = backend, twin_loop, None
    _run(Plain, pytestconfig, backend)


def test_the_semantic_store_behaves_as_in_memory_store(
    backend: Any, twin_loop: asyncio.AbstractEventLoop, pytestconfig: pytest.Config
) -> None:
    class Semantic(StoreMachine):
        pass

    Semantic.backend, Semantic.loop, Semantic.index = backend, twin_loop, INDEX
    _run(Semantic, pytestconfig, backend)
    assert Semantic.stats["semantic search"] > 0
