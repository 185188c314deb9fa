"""Everything ``AgentStateStore`` does that is not I/O: checks, requests, replies, filters, ranking.

LangGraph's ``BaseStore`` on plain Redis (no modules), with ``InMemoryStore``'s semantics.

Layout (``keys.py``, "LangGraph long-term memory"). A store namespace (a tuple of labels) is
stored under its *path*, the labels joined by NUL (LangGraph forbids NUL in a label, so the join
is unambiguous, and the lex order of paths is the tuple order of the labels). The namespace's
items live in the shard of its path, so one namespace's items share a hash slot and each call
touches one namespace: its items (a hash of header + JSON), their insertion order (a zset: what a
search pages in), their expiries (a zset) and their vectors (a hash of float32 bytes). Each shard
indexes the paths it holds and the paths under each prefix whose path it holds (``lgsns``, lex
order; ``_store_index.py``): a namespace prefix is a lex range of its own shard's index.

Why by namespace and not by prefix: a per-user namespace (``("memories", user_id)``, the usual
shape) then spreads over every shard by its user id, where a shard chosen by the first label would
put every user's memories on one node. A search of a prefix is one script in the prefix's slot
(its own namespace's first page and the paths under it), then one bounded page per other namespace
under it (``PAGE`` items per script call, several namespaces per round trip). Nothing reads the
keyspace (no ``SCAN``/``KEYS``).

Order. A search without a query returns the namespaces in tuple order (InMemoryStore: the order
the namespaces were first written), and within a namespace the items in the order they were first
put (as InMemoryStore's dicts: an update keeps its place, a delete and put again goes last).

TTL (LangGraph's ``ttl={"default_ttl", "refresh_on_read", "sweep_interval_minutes"}``, in
minutes): an item's expiry is kept on the server clock, every reader compares with it (an expired
item is never returned, nor a namespace whose every item expired), writers of a namespace drop up
to 100 expired items per call, and ``sweep()`` visits every namespace.

Semantic search ranks exactly as InMemoryStore (cosine, max over an item's fields, scoreless items
last) where the searched prefix holds at most ``MAX_EXACT`` live items; above that it ranks the
items an approximate index finds (``_store_ann.py``: an IVF index per namespace, in Redis), exactly.
Vectors are stored as float32 with their norms (``_store_rank.py``), so scores equal InMemoryStore's
on the float32-rounded vectors. A ranking without a filter ranks from the client's cache of the
namespaces' vectors and reads the values of the items it returns only, in scripts that check the
namespaces are as the cache holds them (``_store_cache.py``); otherwise (a filter, no numpy, the
cache off) it reads the items with their vectors, each page in one script.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from langgraph.store.base import (
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    validate_op_namespace,
)
from langgraph.store.base import Op as StoreOp
from langgraph.store.base.embed import get_text_at_path, tokenize_path

from ..errors import InvalidArgument
from ..keys import MAX_ID_BYTES, Keys, StoreKeys
from ..wire import Batch, Call, Op, corrupt_state, new_nonce, restart
from . import _store_ann as ann
from . import _store_cache as cache
from . import _store_index as ix
from . import _store_rank
from ._store_index import SEP, StoreIndex, _path, _utf8
from ._store_rank import Candidate, decode_vectors, pack_vectors, rank
from .scripts import LGS_GET, LGS_PUT, LGS_SCRIPTS

__all__ = ["LGS_SCRIPTS", "MAX_EXACT", "Plan", "StoreCore", "pack_vectors"]

#: The most live items a searched prefix holds for a semantic search to rank every one of them
#: (InMemoryStore's ranking); above, it ranks what the approximate index finds.
MAX_EXACT = 1000

#: One lgs_put call carries at most this many items or bytes (a bigger batch is several calls).
PUT_ITEMS = 100
PUT_BYTES = 8 * 2**20
MAX_TTL_MINUTES = 100 * 366 * 24 * 60
_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


# ---- InMemoryStore's matching, verbatim in meaning (langgraph/store/memory) -----------------------


def _compare_values(item_value: Any, filter_value: Any) -> bool:
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(_apply_operator(item_value, op_key, op_value) for op_key, op_value in filter_value.items())
        if not isinstance(item_value, dict):
            return False
        return all(_compare_values(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(_compare_values(iv, fv) for iv, fv in zip(item_value, filter_value, strict=False))
        )
    return bool(item_value == filter_value)


def _apply_operator(value: Any, operator: str, op_value: Any) -> bool:
    if operator == "$eq":
        return bool(value == op_value)
    if operator == "$gt":
        return float(value) > float(op_value)
    if operator == "$gte":
        return float(value) >= float(op_value)
    if operator == "$lt":
        return float(value) < float(op_value)
    if operator == "$lte":
        return float(value) <= float(op_value)
    if operator == "$ne":
        return bool(value != op_value)
    raise InvalidArgument(f"Unsupported operator: {operator}")  # pragma: no cover - checked up front


def _passes(item: Item, flt: dict[str, Any]) -> bool:
    return all(_compare_values(item.value.get(k), v) for k, v in flt.items())


def _does_match(condition: MatchCondition, key: tuple[str, ...]) -> bool:
    path = condition.path
    if len(key) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(key, path, strict=False)
    else:
        pairs = zip(reversed(key), reversed(path), strict=False)
    return all(p == "*" or k == p for k, p in pairs)


# ---- checks ---------------------------------------------------------------------------------------


def _labels(namespace: object, what: str) -> tuple[str, ...]:
    # A list too, as PostgresStore takes it (InMemoryStore would compare it with tuples and find nothing).
    if not isinstance(namespace, (tuple, list)):
        raise InvalidArgument(f"{what} must be a tuple of str labels, got {type(namespace).__name__}")
    return tuple(namespace)


def _normal(op: StoreOp) -> StoreOp:
    """``op`` with its namespace (prefix, match paths) as a tuple; a match path given as one str is one
    label, as PostgresStore reads it."""
    if isinstance(op, (GetOp, PutOp)):
        return op._replace(namespace=_labels(op.namespace, "namespace"))
    if isinstance(op, SearchOp):
        return op._replace(namespace_prefix=_labels(op.namespace_prefix, "namespace_prefix"))
    if isinstance(op, ListNamespacesOp) and op.match_conditions:
        conditions = []
        for cond in op.match_conditions:
            path = (cond.path,) if isinstance(cond.path, str) else _labels(cond.path, "a match condition's path")
            conditions.append(MatchCondition(match_type=cond.match_type, path=path))
        return op._replace(match_conditions=tuple(conditions))
    return op


def _writable(namespace: tuple[str, ...]) -> None:
    """An item's namespace has a label. (``BaseStore.put`` also refuses the root label "langgraph", which
    LangGraph itself writes through ``batch``: as InMemoryStore, ``batch`` takes it.)"""
    if not namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidArgument(f"key must be a str, got {type(key).__name__}")
    if len(_utf8(key, "key")) > MAX_ID_BYTES:
        raise InvalidArgument(f"key {key!r:.80} is longer than {MAX_ID_BYTES} bytes")
    return key


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{what} must be an int >= 0, got {value!r}")
    return value


def _check_filter(flt: object) -> None:
    if flt is None:
        return
    if not isinstance(flt, dict):
        raise InvalidArgument(f"filter must be a dict, got {type(flt).__name__}")

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise InvalidArgument(f"filter keys must be str, got {k!r}")
                if k.startswith("$") and k not in _OPERATORS:
                    raise InvalidArgument(f"Unsupported operator: {k} (one of {sorted(_OPERATORS)})")
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(flt)


def _ttl_ms(minutes: object, what: str) -> str:
    if minutes is None:
        return ""
    if not isinstance(minutes, (int, float)) or isinstance(minutes, bool) or not 0 < minutes <= MAX_TTL_MINUTES:
        raise InvalidArgument(f"{what} must be a positive number of minutes, got {minutes!r}")
    return str(max(1, round(minutes * 60_000)))


def _check_ttl_config(ttl: object) -> TTLConfig | None:
    if ttl is None:
        return None
    if not isinstance(ttl, dict):
        raise InvalidArgument(f"ttl must be a dict (LangGraph's TTLConfig), got {type(ttl).__name__}")
    unknown = set(ttl) - {"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"}
    if unknown:
        raise InvalidArgument(f"ttl has unknown settings {sorted(unknown)}")
    _ttl_ms(ttl.get("default_ttl"), "ttl['default_ttl']")
    for flag in ("refresh_on_read", "omit_expired"):
        if not isinstance(ttl.get(flag, True), bool):
            raise InvalidArgument(f"ttl[{flag!r}] must be a bool, got {ttl[flag]!r}")
    sweep = ttl.get("sweep_interval_minutes")
    if sweep is not None and (not isinstance(sweep, (int, float)) or isinstance(sweep, bool) or not sweep > 0):
        raise InvalidArgument(f"ttl['sweep_interval_minutes'] must be a positive number of minutes, got {sweep!r}")
    return cast(TTLConfig, dict(ttl))


def _when(ms: bytes) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)


# ---- a batch, planned ------------------------------------------------------------------------------


@dataclass
class Plan:
    """A batch after its checks: what to embed before any I/O, then what to run."""

    ops: list[StoreOp]
    #: (namespace, key) -> the batch's last PutOp of it (InMemoryStore's rule: the last wins).
    puts: dict[tuple[tuple[str, ...], str], PutOp] = field(default_factory=dict)
    #: Texts to embed (each once), and per text the (namespace, key, field path) it is for.
    texts: dict[str, list[tuple[tuple[str, ...], str, str]]] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    #: (namespace, key) -> the value as stored (JSON).
    encoded: dict[tuple[tuple[str, ...], str], bytes] = field(default_factory=dict)


class StoreCore:
    """Validation, request building and reply parsing for one namespace's LangGraph store."""

    def __init__(
        self,
        namespace: str,
        index: IndexConfig | None,
        ttl: TTLConfig | None,
        cache_bytes: int = cache.DEFAULT_BYTES,
    ) -> None:
        self.keys = Keys.unresolved(namespace)
        self.cache = cache.VectorCache(cache_bytes)
        self.names = StoreIndex(self.keys)
        self.ttl = _check_ttl_config(ttl)
        self.default_ttl = None if self.ttl is None else self.ttl.get("default_ttl")
        self.index: dict[str, Any] | None = None
        self.embeddings: Any = None
        self.dims = 0
        self.fields: list[tuple[str, Any]] = []
        if index is not None:
            if not isinstance(index, dict) or "dims" not in index or "embed" not in index:
                raise InvalidArgument("index must be a dict with 'dims' and 'embed' (LangGraph's IndexConfig)")
            dims = index["dims"]
            if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= 65536:
                raise InvalidArgument(f"index['dims'] must be an int from 1 to 65536, got {dims!r}")
            fields = index.get("fields") or ["$"]
            if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
                raise InvalidArgument(f"index['fields'] must be a list of str paths, got {fields!r}")
            self.index = dict(index)
            self.dims = dims
            self.embeddings = ensure_embeddings(index["embed"])
            self.fields = [(p, tokenize_path(p)) if p != "$" else (p, p) for p in fields]
        self.ann = ann.VectorIndex(self.keys, self.dims)
        self.cached = cache.CachedSearch(self.keys, self.names, self.cache, self.dims, self._item)
        #: MAX_EXACT for this store, where set (tests set it low to reach the approximate index).
        self.max_exact: int | None = None

    # ---- planning (no I/O) ----------------------------------------------------

    def plan(self, ops: Iterable[StoreOp]) -> Plan:
        """Check every op (LangGraph's namespace rules first), before anything is embedded or sent."""
        given = list(ops)
        for op in given:
            if not isinstance(op, (GetOp, PutOp, SearchOp, ListNamespacesOp)):
                raise InvalidArgument(f"Unknown operation type: {type(op).__name__}")
        plan = Plan([_normal(op) for op in given])
        for op in plan.ops:
            validate_op_namespace(op)
            if isinstance(op, GetOp):
                _path(op.namespace)
                _key(op.key)
            elif isinstance(op, SearchOp):
                _path(op.namespace_prefix)
                _check_filter(op.filter)
                _count(op.limit, "limit")
                _count(op.offset, "offset")
                if op.query is not None and not isinstance(op.query, str):
                    raise InvalidArgument(f"query must be a str, got {type(op.query).__name__}")
                if op.query and self.embeddings is not None and op.query not in plan.queries:
                    plan.queries.append(op.query)
            elif isinstance(op, ListNamespacesOp):
                for cond in op.match_conditions or ():
                    if cond.match_type not in ("prefix", "suffix"):
                        raise InvalidArgument(f"Unsupported match type: {cond.match_type}")
                if op.max_depth is not None and (_count(op.max_depth, "max_depth") < 1):
                    raise InvalidArgument("max_depth must be >= 1")
                _count(op.limit, "limit")
                _count(op.offset, "offset")
            else:
                self._plan_put(op, plan)
        return plan

    def _plan_put(self, op: PutOp, plan: Plan) -> None:
        _writable(op.namespace)
        _path(op.namespace)
        key = _key(op.key)
        _ttl_ms(op.ttl, "ttl")
        if op.value is not None:
            if not isinstance(op.value, dict):
                raise InvalidArgument(
                    f"the value of {op.namespace!r}/{key!r} must be a dict, got {type(op.value).__name__}"
                )
            try:
                encoded = json.dumps(op.value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"the value of {op.namespace!r}/{key!r} is not JSON-serializable: {exc}") from exc
            plan.encoded[(op.namespace, key)] = encoded
            listed = isinstance(op.index, list) and all(isinstance(p, str) and p for p in op.index)
            if op.index is not None and op.index is not False and not listed:
                raise InvalidArgument(f"index must be False, None or a list of field paths, got {op.index!r}")
        plan.puts[(op.namespace, key)] = op

    def embed_targets(self, plan: Plan) -> None:
        """Fill ``plan.texts``: the texts of the batch's puts to embed (InMemoryStore's ``_extract_texts``)."""
        if self.embeddings is None:
            return
        for (namespace, key), op in plan.puts.items():
            if op.value is None or op.index is False:
                continue
            paths = self.fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
            for path, tokens in paths:
                texts = get_text_at_path(op.value, tokens)
                if len(texts) > 1:
                    for i, text in enumerate(texts):
                        plan.texts.setdefault(text, []).append((namespace, key, f"{path}.{i}"))
                elif texts:
                    plan.texts.setdefault(texts[0], []).append((namespace, key, path))

    def check_vector(self, vector: object, what: str) -> list[float]:
        if not isinstance(vector, Sequence) or len(vector) != self.dims:
            size = len(vector) if isinstance(vector, Sequence) else type(vector).__name__
            raise InvalidArgument(f"the embedding of {what} has {size} dimensions, index['dims'] is {self.dims}")
        return [float(x) for x in vector]

    # ---- the batch ------------------------------------------------------------------

    def execute(
        self, plan: Plan, documents: Sequence[Sequence[float]], queries: dict[str, Sequence[float]]
    ) -> Op[list[Result]]:
        """Reads in op order, then the puts (as InMemoryStore: a batch's reads do not see its writes)."""
        vectors: dict[tuple[tuple[str, ...], str], dict[str, list[float]]] = {}
        if len(documents) != len(plan.texts):
            raise InvalidArgument(f"the embedder returned {len(documents)} embeddings for {len(plan.texts)} texts")
        for vector, (text, targets) in zip(documents, plan.texts.items(), strict=True):
            checked = self.check_vector(vector, repr(text[:40]))
            for namespace, key, path in targets:
                vectors.setdefault((namespace, key), {})[path] = checked
        query_vectors = {q: self.check_vector(v, f"query {q[:40]!r}") for q, v in queries.items()}
        results: list[Result] = []
        gets = [op for op in plan.ops if isinstance(op, GetOp)]
        got = iter((yield from self._gets(gets)) if gets else [])
        for op in plan.ops:
            if isinstance(op, GetOp):
                results.append(next(got))
            elif isinstance(op, SearchOp):
                qv = query_vectors.get(op.query) if op.query else None
                results.append((yield from self._search(op, qv)))
            elif isinstance(op, ListNamespacesOp):
                results.append((yield from self._list(op)))
            else:
                results.append(None)
        if plan.puts:
            calls = self._put_calls(plan, vectors)
            # One nonce for the batch: a re-send (a lost reply, or a reshard restarting it) leaves every
            # item it wrote already as it is.
            nonce = new_nonce()
            replies = yield from restart(lambda: self.ann.send_puts(calls, nonce))
            yield from self.names.relist([path for path, _ in calls], replies)
            upkeep = {path: reply for (path, _), reply in zip(calls, replies, strict=True)}
            for path, reply in upkeep.items():
                if self.embeddings is not None and self.ann.needs_upkeep(reply):
                    yield from restart(functools.partial(self.ann.upkeep, path, reply))
        return results

    def _refresh(self, wanted: bool) -> bool:
        return self.ttl is not None and bool(wanted)

    # ---- get ------------------------------------------------------------------

    def _get(self, op: GetOp) -> Op[Item | None]:
        return (yield from restart(lambda: self._get_once(op)))

    def _gets(self, ops: list[GetOp]) -> Op[list[Item | None]]:
        """A batch's GetOps in one round trip: one lgs_get call per namespace and TTL refresh flag."""
        if len(ops) == 1:
            return [(yield from self._get(ops[0]))]

        def send() -> Op[list[Item | None]]:
            groups: dict[tuple[tuple[str, ...], str], list[int]] = {}
            for i, op in enumerate(ops):
                groups.setdefault((op.namespace, "1" if self._refresh(op.refresh_ttl) else "0"), []).append(i)
            calls: list[Call] = []
            parts: list[tuple[StoreKeys, list[int]]] = []
            for (namespace, flag), idx in groups.items():
                keys = self.keys.store(_path(namespace))
                for j in range(0, len(idx), ix.PAGE):
                    calls.append(Call(LGS_GET, keys.as_list(), [flag, *(ops[i].key for i in idx[j : j + ix.PAGE])]))
                    parts.append((keys, idx[j : j + ix.PAGE]))
            replies = yield Batch(calls)
            out: list[Item | None] = [None] * len(ops)
            for (keys, part), blobs in zip(parts, replies, strict=True):
                for i, blob in zip(part, blobs, strict=True):
                    if blob:
                        out[i] = self._item(ops[i].namespace, ops[i].key, blob, keys)
            return out

        return (yield from restart(send))

    def _get_once(self, op: GetOp) -> Op[Item | None]:
        keys = self.keys.store(_path(op.namespace))
        refresh = "1" if self._refresh(op.refresh_ttl) else "0"
        (blob,) = yield Call(LGS_GET, keys.as_list(), [refresh, op.key])
        if not blob:
            return None
        return self._item(op.namespace, op.key, blob, keys)

    def _item(self, namespace: tuple[str, ...], key: str, blob: bytes, keys: StoreKeys) -> Item:
        try:
            created, updated, _ttl, _nonce, body = bytes(blob).split(b":", 4)
            value = json.loads(body)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
            return Item(value=value, key=key, namespace=namespace, created_at=_when(created), updated_at=_when(updated))
        except (ValueError, TypeError, OverflowError) as exc:
            raise corrupt_state(
                keys.items, [keys.items], f"holds item {key!r} that is not one we wrote ({exc})"
            ) from exc

    # ---- search ---------------------------------------------------------------

    def _search(self, op: SearchOp, query: list[float] | None) -> Op[list[SearchItem]]:
        refresh = self._refresh(op.refresh_ttl)
        kept: list[tuple[float | None, Item]]
        if query is None:
            found = yield from self._candidates(op, "0", (yield from self._paths(op, "0")))
            kept = [(None, cast(Item, c.item)) for c in found[op.offset : op.offset + op.limit]]
        else:
            exact = MAX_EXACT if self.max_exact is None else self.max_exact
            cached = None
            if not op.filter and self.cache.enabled and _store_rank.NUMPY and (op.offset + op.limit) > 0:
                cached = yield from restart(functools.partial(self.cached.search, op, query, exact, refresh))
            kept = cached if cached is not None else (yield from self._uncached(op, query, exact, refresh))
            refresh = False
        if kept and refresh:
            yield from self._touch([item for _, item in kept])
        return [
            SearchItem(
                namespace=item.namespace,
                key=item.key,
                value=item.value,
                created_at=item.created_at,
                updated_at=item.updated_at,
                score=None if score is None else float(score),
            )
            for score, item in kept
        ]

    def _uncached(
        self, op: SearchOp, query: list[float], exact: int, refresh: bool
    ) -> Op[list[tuple[float | None, Item]]]:
        """A ranking that reads the items of the prefix with their vectors, each page in one script: a score is
        always that of the value returned, whatever a writer does between two reads (above the exact limit:
        what the vector index finds). Refreshes the TTL of the items returned if asked."""
        mode = "1"
        paths = yield from self._paths(op, mode)
        counts = yield from self.ann.counts_above(paths, exact)
        if counts is not None and sum(c[0] for c in counts) > exact:
            near = functools.partial(self.ann.candidates, op, query, paths[0], counts, self._item, _passes)
            found = yield from restart(near)
        else:
            found = yield from self._candidates(op, mode, paths)
        picked = rank(query, self.dims, found, op.offset, op.limit)
        if any(c.item is None for _, c in picked):
            # The vector index's candidates without a filter: their vectors only, then the values of the
            # items picked (refreshing their TTL as it reads them).
            return (yield from self.ann.fetch(picked, refresh, self._item))
        kept = [(score, cast(Item, c.item)) for score, c in picked]
        if kept and refresh:
            yield from self._touch([item for _, item in kept])
        return kept

    def _paths(self, op: SearchOp, mode: str) -> Op[tuple[list[str], dict[str, ix._Page]]]:
        """The namespace paths under the prefix, and the first page of the prefix's own items."""
        if op.namespace_prefix:
            return (yield from self.names.prefix_read(op.namespace_prefix, mode))
        return (yield from self.names.paths("-", "+", everything=False)), {}

    def _candidates(self, op: SearchOp, mode: str, read: tuple[list[str], dict[str, ix._Page]]) -> Op[list[Candidate]]:
        """The live items under the prefix that pass the filter, in search order; without a filter or a
        ranking, only up to offset + limit of them. ``mode`` (lgs_search's): '0' items, '1' items and
        vectors."""
        paths, first = read
        ranked = mode != "0"
        stop = None if op.filter or ranked else op.offset + op.limit
        found: list[Candidate] = []
        for start in range(0, len(paths), ix.WINDOW):
            if stop is not None and len(found) >= stop:
                break
            window = paths[start : start + ix.WINDOW]
            pages = yield from restart(functools.partial(self.names.read_window, window, mode, first))
            for path, entries in zip(window, pages, strict=True):
                namespace = tuple(path.split(SEP))
                keys = self.keys.store(path)
                for key, blob, packed in entries:
                    item = self._item(namespace, key, blob, keys)
                    if item is not None and op.filter and not _passes(item, op.filter):
                        continue
                    vectors = decode_vectors(packed, self.dims, keys, key) if ranked else []
                    found.append(Candidate(namespace, key, vectors, item))
        return found

    def _touch(self, items: list[Item]) -> Op[None]:
        """Refresh the TTL of items a search returned (lgs_get with refresh, one call per namespace)."""
        by_ns: dict[tuple[str, ...], list[str]] = {}
        for item in items:
            by_ns.setdefault(tuple(item.namespace), []).append(item.key)

        def send() -> Op[None]:
            # At most PAGE keys per call, whatever limit the search had: every script reads a bounded page.
            calls = [
                Call(LGS_GET, self.keys.store(_path(ns)).as_list(), ["1", *ks[i : i + ix.PAGE]])
                for ns, ks in by_ns.items()
                for i in range(0, len(ks), ix.PAGE)
            ]
            yield Batch(calls)
            return None

        yield from restart(send)
        return None

    # ---- list namespaces ---------------------------------------------------------

    def _list(self, op: ListNamespacesOp) -> Op[list[tuple[str, ...]]]:
        conditions = list(op.match_conditions or ())
        fixed: list[str] = []
        for cond in conditions:
            if cond.match_type == "prefix":
                for label in cond.path:
                    if label == "*":
                        break
                    fixed.append(label)
                break
        names = yield from self.names.listed(tuple(fixed))
        out: list[tuple[str, ...]] = []
        for path in names:
            ns = tuple(path.split(SEP))
            if not all(_does_match(c, ns) for c in conditions):
                continue
            if op.max_depth is not None:
                ns = ns[: op.max_depth]
                if out and out[-1] == ns:
                    continue  # truncation keeps lex order: equal truncations are adjacent
            out.append(ns)
        return out[op.offset : op.offset + op.limit]

    # ---- puts -------------------------------------------------------------------

    def _put_calls(
        self, plan: Plan, vectors: dict[tuple[tuple[str, ...], str], dict[str, list[float]]]
    ) -> list[tuple[str, list[ann.Group]]]:
        """Per namespace (path), chunks of groups: one lgs_put call each."""
        groups: dict[str, list[ann.Group]] = {}
        for (namespace, key), op in plan.puts.items():
            path = _path(namespace)
            if op.value is None:
                group: ann.Group = (key, "", "", "", [])
            else:
                ttl = _ttl_ms(op.ttl, "ttl")
                vec = vectors.get((namespace, key))
                packed = pack_vectors(vec) if vec else ""
                group = (key, plan.encoded[(namespace, key)], ttl, packed, list(vec.values()) if vec else [])
            groups.setdefault(path, []).append(group)
        calls: list[tuple[str, list[ann.Group]]] = []
        for path, entries in groups.items():
            chunk: list[ann.Group] = []
            size = 0
            for group in entries:
                if chunk and (len(chunk) >= PUT_ITEMS or size > PUT_BYTES):
                    calls.append((path, chunk))
                    chunk, size = [], 0
                chunk.append(group)
                size += sum(len(g) for g in group[:4])
            calls.append((path, chunk))
        return calls

    # ---- sweep -------------------------------------------------------------------

    def sweep(self) -> Op[int]:
        """Drop every expired item: each namespace (whose items all expired included), 100 per call."""
        paths = yield from self.names.paths("-", "+", everything=True)
        dropped = 0
        for start in range(0, len(paths), ix.WINDOW):
            todo = paths[start : start + ix.WINDOW]
            while todo:
                batch = todo

                def send(batch: list[str] = batch) -> Op[list[Any]]:
                    replies: list[Any] = yield Batch(
                        [Call(LGS_PUT, self.keys.store(p).as_list(), [new_nonce(), 0]) for p in batch]
                    )
                    return replies

                replies = yield from restart(send)
                yield from self.names.relist(batch, replies)
                todo = []
                for path, reply in zip(batch, replies, strict=True):
                    dropped += int(reply[1])
                    if int(reply[1]) >= 100:
                        todo.append(path)
        return dropped
