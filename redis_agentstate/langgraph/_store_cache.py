"""The LangGraph store's client-side cache of namespaces' vectors (``AgentStateStore``'s semantic search).

Why: an exact ranking reads every vector of the searched prefix (6 MB for 1,000 items at 1536
dimensions), and decoding them costs more than the ranking. A store keeps the vectors of each
namespace it ranked as one float32 matrix (rows in the namespace's insertion order, their norms, the
item of each row), with the namespace's *write version*: a field of its ``lgsc`` hash that every
lgs_put call with items (or that drops an expired one) moves on (``_lgs.lua``).

A search without a filter then ranks from the cache with no I/O and sends one round trip: the
prefix's listing (lgs_prefix, paths only) and, per namespace under it, lgs_pick: the items the
ranking picked, read in the same script that checks the write version is still the cache's, with
every item ranked before them checked live (an expired one changes who comes next). A namespace
whose version moved, or a pick that met an expired item, is scanned again (lgs_scan: each live key
and its stamp, which every write of the item changes, and the version, read with the first page):
the vectors of unchanged stamps are kept, the others read (HMGET), and the ranking runs again. A new
namespace under the prefix (the listing changed) is scanned and ranked in too. After ``TRIES``
rounds that keep meeting writers, the search takes the path without the cache. So a result is
always what the namespaces held when their picks ran, and a put that returned before a search began
is in it (its listing and its version moved before it returned).

Bounded memory: an LRU of entries by bytes (``vector_cache_bytes``, default ``DEFAULT_BYTES``; 0
turns the cache off); an entry bigger than the bound ranks its search and is not kept. Without
numpy there is no cache (the pure-Python ranking reads the vectors each time).
"""

from __future__ import annotations

import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import Item, SearchOp

from ..core.replies import text as reply_text
from ..errors import InvalidArgument
from ..keys import Keys, StoreKeys
from ..wire import Batch, Call, Op, Pipe, corrupt_state, member_id
from . import _store_index as ix
from ._store_index import SEP, StoreIndex, _path
from ._store_rank import decode_vectors, top
from .scripts import LGS_PICK, LGS_PREFIX, LGS_SCAN

try:
    import numpy as _np  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - the cache is off without numpy
    _np = None  # type: ignore[assignment,unused-ignore]

__all__ = [
    "DEFAULT_BYTES", "SCAN_BYTES", "SCAN_PAGE", "TRIES", "CachedSearch", "Entry", "VectorCache", "build", "check_bytes",
    "rank",
]  # fmt: skip

#: The cache's bound by default: 64 MiB (about 10 namespaces of 1,000 items at 1536 dimensions, or
#: 250 at 64).
DEFAULT_BYTES = 64 * 2**20
#: Items one lgs_scan call scans, and the bytes of items it reads at most (it reads their headers).
SCAN_PAGE = 1000
SCAN_BYTES = 2**20
#: Rounds of rank-then-pick a search makes before it reads without the cache (writers keep moving it).
TRIES = 4
#: Seconds a namespace found above the exact limit is not tried from the cache again.
BIG_S = 5.0
#: Values (rows x dimensions) of one block of a ranking's dot products.
BLOCK = 2**17
#: Prefixes whose listing a cache remembers.
LISTINGS = 1024


def check_bytes(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"vector_cache_bytes must be an int >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class Entry:
    """One namespace's live items (insertion order) at write version ``version``, and their vectors."""

    version: bytes
    keys: list[str]
    #: key -> (stamp, first row, row after the last): what a rescan compares and keeps.
    spans: dict[str, tuple[bytes, int, int]]
    matrix: Any  # float32, one row per vector
    norms: Any  # float64, the norm stored with each vector
    owners: Any  # the item (index into keys) of each row
    #: The items without a vector (nothing embedded): ranked after the others, in insertion order.
    scoreless: list[int]
    nbytes: int


def build(
    old: Entry | None,
    version: bytes,
    scanned: Sequence[tuple[str, bytes]],
    vectors: dict[str, list[tuple[bytes, float]]],
    dims: int,
) -> Entry:
    """The entry of a scan: ``old``'s rows for the keys whose stamp it already holds, ``vectors`` for the rest
    (a key absent there has none: scoreless)."""
    assert _np is not None
    keep_at: list[int] = []
    keep_from: list[int] = []
    new_at: list[int] = []
    new_raw: list[bytes] = []
    new_norms: list[float] = []
    owners: list[int] = []
    spans: dict[str, tuple[bytes, int, int]] = {}
    keys: list[str] = []
    scoreless: list[int] = []
    row = 0
    size = 0
    none: dict[str, tuple[bytes, int, int]] = {}
    spans_of = (old.spans if old is not None else none).get
    for j, (key, stamp) in enumerate(scanned):
        prev = spans_of(key)
        if prev is not None and prev[0] == stamp:
            n = prev[2] - prev[1]
            if n == 1:
                keep_at.append(row)
                keep_from.append(prev[1])
            else:
                keep_at.extend(range(row, row + n))
                keep_from.extend(range(prev[1], prev[2]))
        else:
            got = vectors.get(key, ())
            n = len(got)
            for k, (raw, norm) in enumerate(got):
                new_at.append(row + k)
                new_raw.append(raw)
                new_norms.append(norm)
        if n == 1:
            owners.append(j)
        elif n == 0:
            scoreless.append(j)
        else:
            owners.extend([j] * n)
        spans[key] = (stamp, row, row + n)
        keys.append(key)
        size += len(key) + len(stamp)
        row += n
    matrix = _np.empty((row, dims), dtype="<f4")
    norms = _np.empty(row, dtype=_np.float64)
    if keep_at and old is not None:
        matrix[keep_at] = old.matrix[keep_from]
        norms[keep_at] = old.norms[keep_from]
    if new_at:
        matrix[new_at] = _np.frombuffer(b"".join(new_raw), dtype="<f4").reshape(len(new_raw), dims)
        norms[new_at] = new_norms
    owned = _np.asarray(owners, dtype=_np.int64)
    size += matrix.nbytes + norms.nbytes + owned.nbytes + 120 * len(keys)
    return Entry(version, keys, spans, matrix, norms, owned, scoreless, size)


def unpack_scan(packed: bytes, key: str) -> list[tuple[str, bytes]]:
    """lgs_scan's items (``<#key>:<key><#stamp>:<stamp>`` each) as (key, stamp); CorruptState naming ``key`` (the
    order index the keys come from) for anything else."""
    out: list[tuple[str, bytes]] = []
    i, end = 0, len(packed)
    try:
        while i < end:
            colon = packed.index(b":", i)
            start = colon + 1 + int(packed[i:colon])
            name = packed[colon + 1 : start]
            colon = packed.index(b":", start)
            i = colon + 1 + int(packed[start:colon])
            if i > end or start > end:
                raise ValueError("truncated")
            out.append((name.decode("utf-8"), packed[colon + 1 : i]))
    except ValueError as exc:  # UnicodeDecodeError included
        raise corrupt_state(key, [key], f"holds an id that is not UTF-8 or a stamp we did not write ({exc})") from exc
    return out


def _scores(entry: Entry, query: Any, qnorm: float) -> Any:
    """``_store_rank._scores``' numpy computation over an entry's rows (float64 dot products)."""
    assert _np is not None
    # In blocks of about BLOCK values: one product of the whole matrix lets the BLAS spread it over
    # threads, which on a loaded machine costs ten times the work (the results are the same).
    rows = len(entry.norms)
    step = max(1, BLOCK // max(1, entry.matrix.shape[1]))
    dots = _np.empty(rows, dtype=_np.float64)
    for i in range(0, rows, step):
        dots[i : i + step] = entry.matrix[i : i + step].astype(_np.float64) @ query
    norm = entry.norms * qnorm
    out = _np.zeros(len(entry.norms), dtype=_np.float64)
    _np.divide(dots, norm, out=out, where=norm > 0)
    return out


def rank(
    query: Sequence[float], entries: Sequence[Entry], offset: int, limit: int
) -> tuple[list[tuple[int, int]], list[tuple[float | None, int, int]]]:
    """InMemoryStore's pick over the entries' items (in entry order, then insertion order), as
    ``_store_rank.rank``: the (entry, item) ranked before ``offset``, and the picked (score, entry, item)."""
    assert _np is not None
    qnorm = sum(map(operator.mul, query, query)) ** 0.5  # _store_rank._scores' sum, in the same order
    q = _np.asarray(query, dtype=_np.float64)
    bases: list[int] = []
    parts: list[Any] = []
    owners: list[Any] = []
    scoreless: list[int] = []
    base = 0
    for entry in entries:
        bases.append(base)
        if len(entry.norms):
            parts.append(_scores(entry, q, qnorm))
            owners.append(entry.owners + base)
        scoreless.extend(base + i for i in entry.scoreless)
        base += len(entry.keys)
    scores = _np.concatenate(parts) if parts else _np.zeros(0)
    rows = _np.concatenate(owners) if owners else _np.zeros(0, dtype=_np.int64)
    order = None
    want = offset + limit
    if len(scores) and bool(_np.isfinite(scores).all()):
        if len(scores) > 4 * want and len(scores) == base - len(scoreless):
            # One vector per item: the rows scoring at least the want-th best hold the pick, ties included.
            kth = len(scores) - want
            rows_in = _np.nonzero(scores >= _np.partition(scores, kth)[kth])[0]
            order = rows_in[_np.argsort(-scores[rows_in], kind="stable")].tolist()
        else:
            # Stable on the negated scores: equal scores keep their row order, as sorted(..., reverse=True).
            order = _np.argsort(-scores, kind="stable").tolist()
    before, kept = top(scores.tolist(), rows.tolist(), scoreless, offset, limit, order)

    def locate(i: int) -> tuple[int, int]:
        e = _bisect(bases, i)
        return e, i - bases[e]

    return [locate(i) for i in before], [(s, *locate(i)) for s, i in kept]


def _bisect(bases: list[int], i: int) -> int:
    lo, hi = 0, len(bases) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bases[mid] <= i:
            lo = mid
        else:
            hi = mid - 1
    return lo


class VectorCache:
    """Entries by namespace (its items key, which names the shard layout too), least recently used first
    out, at most ``max_bytes`` in all; the listings of prefixes it ranked. Thread-safe (a sync store's
    ``abatch`` runs in executor threads)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = check_bytes(max_bytes)
        self.enabled = max_bytes > 0 and _np is not None
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._listings: OrderedDict[tuple[str, ...], list[str]] = OrderedDict()
        self._big: dict[str, float] = {}
        self._lock = threading.Lock()
        self.nbytes = 0

    def get(self, name: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                self._entries.move_to_end(name)
            return entry

    def put(self, name: str, entry: Entry) -> None:
        with self._lock:
            old = self._entries.pop(name, None)
            if old is not None:
                self.nbytes -= old.nbytes
            if entry.nbytes > self.max_bytes:
                return
            self._entries[name] = entry
            self.nbytes += entry.nbytes
            while self.nbytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.nbytes -= dropped.nbytes

    def clear(self) -> None:
        """Forget everything (the next search of each namespace scans it again)."""
        with self._lock:
            self._entries.clear()
            self._listings.clear()
            self._big.clear()
            self.nbytes = 0

    def listing(self, prefix: tuple[str, ...]) -> list[str] | None:
        with self._lock:
            paths = self._listings.get(prefix)
            if paths is not None:
                self._listings.move_to_end(prefix)
            return paths

    def remember_listing(self, prefix: tuple[str, ...], paths: list[str] | None) -> None:
        with self._lock:
            self._listings.pop(prefix, None)
            if paths is not None:
                self._listings[prefix] = paths
                while len(self._listings) > LISTINGS:
                    self._listings.popitem(last=False)

    def note_big(self, name: str) -> None:
        with self._lock:
            if len(self._big) > 4096:
                self._big.clear()
            self._big[name] = time.monotonic() + BIG_S

    def is_big(self, names: Sequence[str]) -> bool:
        with self._lock:
            if not self._big:
                return False
            now = time.monotonic()
            return any(self._big.get(n, 0.0) > now for n in names)


class CachedSearch:
    """Semantic searches without a filter ranked from a ``VectorCache``, as ops the store's shells run."""

    def __init__(
        self,
        keys: Keys,
        names: StoreIndex,
        cache: VectorCache,
        dims: int,
        read_item: Callable[[tuple[str, ...], str, bytes, StoreKeys], Item],
    ) -> None:
        self.keys, self.names, self.cache, self.dims, self.read_item = keys, names, cache, dims, read_item

    def search(
        self, op: SearchOp, query: list[float], exact: int, refresh: bool
    ) -> Op[list[tuple[float | None, Item]] | None]:
        """A ranking from the cache: rank with no I/O, then one round trip that checks the prefix's listing and
        every namespace's write version and reads the items picked; what moved is scanned again and the
        ranking runs again. None: the cache cannot answer (above the exact limit, a listing of more than
        one page, or writers that kept moving it): the caller reads without it."""
        prefix = op.namespace_prefix
        listing: Call | None = None
        if prefix:
            start, stop = ix._range(prefix)
            listing = Call(LGS_PREFIX, self.keys.store(_path(prefix)).as_list(), [start, stop, ix.NS_PAGE, 0, "0"])
        rescan: set[str] = set()
        for _ in range(TRIES):
            paths = self.cache.listing(prefix) if prefix else None
            if paths is None:
                if prefix:
                    paths, _first = yield from self.names.prefix_read(prefix, "0", items=False)
                    self.cache.remember_listing(prefix, paths)
                else:
                    paths = yield from self.names.paths("-", "+", everything=False)
            names = [self.keys.store(p) for p in paths]
            if self.cache.is_big([k.items for k in names]):
                return None
            entries = [None if k.items in rescan else self.cache.get(k.items) for k in names]
            todo = [i for i, e in enumerate(entries) if e is None]
            if todo:
                olds = [self.cache.get(names[i].items) for i in todo]
                filled = yield from self._scan([names[i] for i in todo], olds, exact)
                if filled is None:
                    return None
                for i, entry in zip(todo, filled, strict=True):
                    entries[i] = entry
            ready = [e for e in entries if e is not None]  # all of them, once scanned: one per path
            if sum(len(e.keys) for e in ready) > exact:
                return None
            before, kept = rank(query, ready, op.offset, op.limit)
            wanted: list[list[str]] = [[] for _ in ready]
            for e, i in before:
                wanted[e].append(ready[e].keys[i])
            checked = [len(w) for w in wanted]
            for _score, e, i in kept:
                wanted[e].append(ready[e].keys[i])
            flag = "1" if refresh else "0"
            calls = [
                Call(LGS_PICK, k.as_list(), [e.version, flag, n, *w])
                for k, e, n, w in zip(names, ready, checked, wanted, strict=True)
            ]
            if listing is None and not calls:
                return []  # the root, and nothing under it
            replies = yield Batch(([listing] if listing is not None else []) + calls)
            if listing is not None:
                reply, replies = replies[0], replies[1:]
                keys = self.keys.store(_path(prefix))
                now = [member_id(p, keys.namespaces) for p in reply[2 : 2 + int(reply[1])]]
                if reply[0]:  # more paths than one page: a listing the cache does not keep
                    self.cache.remember_listing(prefix, None)
                    return None
                if now != paths:
                    self.cache.remember_listing(prefix, now)
                    continue
            rescan = set()
            items: dict[tuple[int, str], bytes] = {}
            for n, (k, entry, w, reply) in enumerate(zip(names, ready, wanted, replies, strict=True)):
                if bytes(reply[0]) != entry.version or not all(reply[1:]):
                    rescan.add(k.items)  # a writer since the scan, or a picked item expired
                    continue
                for key, blob in zip(w, reply[1:], strict=True):
                    items[(n, key)] = blob
            if rescan:
                continue
            out: list[tuple[float | None, Item]] = []
            for score, n, i in kept:
                key = ready[n].keys[i]
                out.append((score, self.read_item(tuple(paths[n].split(SEP)), key, items[(n, key)], names[n])))
            return out
        return None

    def _scan(self, names: list[StoreKeys], olds: list[Entry | None], exact: int) -> Op[list[Entry] | None]:
        """The entries of these namespaces, scanned now (lgs_scan, every namespace in each round trip), the
        vectors of the keys whose stamp ``olds`` does not hold read with HMGET; cached. None when they hold
        more than ``exact`` live items (then noted, so searches of them skip the cache for a while)."""
        versions: list[bytes] = [b""] * len(names)
        scanned: list[list[tuple[str, bytes]]] = [[] for _ in names]
        after: dict[int, str] = dict.fromkeys(range(len(names)), "")
        live = 0
        while after:
            order = list(after)
            replies = yield Batch(
                [Call(LGS_SCAN, names[i].as_list(), [after[i], SCAN_PAGE, SCAN_BYTES, exact]) for i in order]
            )
            for i, reply in zip(order, replies, strict=True):
                first = after.pop(i) == ""
                if first:
                    versions[i] = bytes(reply[0])
                    live += int(reply[1])
                    if live > exact:
                        for k in names:
                            self.cache.note_big(k.items)
                        return None
                scanned[i].extend(unpack_scan(bytes(reply[3]), names[i].order))
                if reply[2]:
                    after[i] = reply_text(reply[2])
        reads: list[tuple[int, list[str]]] = []
        for i, (old, got) in enumerate(zip(olds, scanned, strict=True)):
            spans = old.spans if old is not None else {}
            need = [key for key, stamp in got if key not in spans or spans[key][0] != stamp]
            reads += [(i, need[j : j + ix.PAGE]) for j in range(0, len(need), ix.PAGE)]
        vectors: list[dict[str, list[tuple[bytes, float]]]] = [{} for _ in names]
        if reads:
            replies = yield Pipe([("HMGET", names[i].vectors, *ks) for i, ks in reads])
            for (i, ks), packed in zip(reads, replies, strict=True):
                for key, blob in zip(ks, packed, strict=True):
                    if blob:
                        vectors[i][key] = decode_vectors(bytes(blob), self.dims, names[i], key)
        entries = []
        for i, k in enumerate(names):
            entry = build(olds[i], versions[i], scanned[i], vectors[i], self.dims)
            self.cache.put(k.items, entry)
            entries.append(entry)
        return entries
