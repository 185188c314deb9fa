"""The LangGraph store's approximate vector index (``AgentStateStore``): an inverted-file index (IVF)
per store namespace, kept in Redis, for semantic searches of prefixes that hold more than
``MAX_EXACT`` items (up to that, ``_store_core.py`` ranks every item exactly, as InMemoryStore).

Layout (``_lgs.lua``): ``lgsc:<path>`` holds the index's version, its centroids (float32, unit
length: spherical k-means, since the ranking is by cosine) and the vector count it was trained at;
``lgsl:<path>`` is one zset of every stored vector, scored ``version * LIST_SPAN + list``. Version
0 is "no index": every vector in list 0. A put chooses each vector's list client side (the nearest
centroid of the version it last read) and lgs_put writes the item, its vectors and its lists at
once, refusing (writing nothing) when the version moved on, so the client reads the new centroids
and re-sends: a list never holds a vector placed by other centroids than its version's.

Training. A put whose namespace holds ``INDEX_AT`` vectors and no index, or ``RETRAIN`` times as
many (or a quarter as many) as it was trained at, trains: a sample read with ``HRANDFIELD`` in
pages, k-means with about sqrt(n) lists, then lgs_train installs the centroids as the next version
(a compare-and-set on the version: of two clients training at once, one wins) and names the
winner the *mover*, holding a lease. The mover reads the previous version's lists page by page,
chooses each item's new lists from its vectors and writes them (lgs_assign.lua: an item put since
the re-train chose its lists itself and is left as it is), then ends the move (lgs_train 'finish':
only once no vector is left in the old version's lists). A mover that stops (a crash) leaves its
lease to lapse; the next put of the namespace claims the move and finishes it. Until the move
ends, a search probes both versions' lists, so every vector is in a list it probes the nearest of.

Search. The nearest ``nprobe`` lists of the query (of each version a move is between), each read
in pages of ``PAGE`` keys (lgs_probe.lua: live items only), their vectors read with ``HMGET``, and
ranked exactly client side (``_store_rank.rank``). Every script reads a bounded page whatever a
namespace holds. Items without vectors are in no list: an approximate search returns only items
with a score.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

from langgraph.store.base import Item, SearchOp

from ..core.replies import text as reply_text
from ..errors import ConfigConflict
from ..keys import Keys, StoreKeys
from ..wire import Batch, Call, Op, Pipe, corrupt_state, member_id, new_nonce, restart
from ..wire.scripts import Reply
from . import _store_rank
from ._store_index import _path
from ._store_rank import Candidate, decode_vectors
from .scripts import LGS_ASSIGN, LGS_COUNT, LGS_GET, LGS_PROBE, LGS_PUT, LGS_TRAIN

__all__ = ["INDEX_AT", "LIST_SPAN", "Group", "VectorIndex", "list_key"]

#: A namespace gets an index once this many of its items have vectors.
INDEX_AT = 1000
#: Re-trained when its vector count reaches RETRAIN times the count it was trained at (or falls to 1/RETRAIN²).
RETRAIN = 2.0
#: Scores of one version's lists in ``lgsl`` span this many (the most lists an index has).
LIST_SPAN = 65536
MAX_LISTS = 4096
#: The mover's lease: a move silent this long is taken over by the next put of the namespace.
LEASE_MS = 30_000
#: Training sample: this many vectors per list, at most MAX_SAMPLE, read SAMPLE_PAGE per command.
SAMPLE_PER_LIST = 48
MAX_SAMPLE = 12_000
SAMPLE_PAGE = 500
ITERATIONS = 12
#: The share of an index's lists a search probes (at least MIN_PROBE; more when offset + limit
#: asks for more items than that many lists hold).
PROBE_SHARE = 0.08
MIN_PROBE = 6
#: Keys one lgs_probe call and one HMGET read.
PAGE = 500
#: Members a move re-places per lgs_assign call (each several writes: a smaller page than a read's).
MOVE_PAGE = 200
#: Namespaces counted (lgs_count) per round trip.
COUNT_PAGE = 256
#: Centroid sets and namespace versions a store keeps in memory.
CACHE = 4096
#: How many times a put re-chooses its vectors' lists when the index moved on meanwhile.
STALE_TRIES = 8

#: One put group before its lists are chosen: key, value, ttl, packed vectors, the vectors.
Group = tuple[str, bytes | str, str, bytes | str, list[list[float]]]

np: Any = getattr(_store_rank, "_np", None)


def list_key(member: bytes | str, lists_key: str) -> str:
    """The item key of an ``lgsl`` member (``list_member`` in _lgs.lua)."""
    text = member_id(member, lists_key)
    head, sep, tail = text.rpartition("\0")
    return head if sep and tail.isdigit() else text


def lists_of(count: int) -> int:
    """How many lists an index of ``count`` vectors gets."""
    return max(8, min(MAX_LISTS, round(math.sqrt(count))))


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else list(vector)


class Centroids:
    """One version's centroids: unit vectors, float32 as stored."""

    def __init__(self, raw: bytes, dims: int) -> None:
        if dims <= 0 or len(raw) % (4 * dims) or not raw:
            raise ValueError(f"{len(raw)} bytes of centroids for {dims} dimensions")
        self.raw, self.dims, self.count = raw, dims, len(raw) // (4 * dims)
        if np is not None:
            self.matrix: Any = np.frombuffer(raw, dtype="<f4").reshape(self.count, dims).astype(np.float64)
        else:
            flat = struct.unpack(f"<{self.count * dims}f", raw)
            self.matrix = [flat[i * dims : (i + 1) * dims] for i in range(self.count)]

    def similarities(self, vector: Sequence[float]) -> list[float]:
        if np is not None:
            return list((self.matrix @ np.asarray(vector, dtype=np.float64)).tolist())
        return [sum(a * b for a, b in zip(row, vector, strict=True)) for row in self.matrix]

    def nearest(self, vector: Sequence[float]) -> int:
        sims = self.similarities(vector)
        return max(range(len(sims)), key=sims.__getitem__)

    def ranked(self, vector: Sequence[float]) -> list[int]:
        """The lists, nearest to ``vector`` first."""
        sims = self.similarities(vector)
        return sorted(range(len(sims)), key=sims.__getitem__, reverse=True)


def train(sample: list[Sequence[float]], lists: int, dims: int, seed: int = 0) -> bytes:
    """Spherical k-means of ``sample``: ``lists`` unit centroids as float32 bytes."""
    rng = random.Random(seed)
    data = [_unit(v) for v in sample if any(v)]
    if not data:
        data = [[1.0] + [0.0] * (dims - 1)]
    k = min(lists, len(data))
    if np is not None:
        x = np.asarray(data, dtype=np.float32)
        c = x[rng.sample(range(len(data)), k)].copy()
        for _ in range(ITERATIONS):
            labels = np.argmax(x @ c.T, axis=1)
            sums = np.zeros_like(c)
            np.add.at(sums, labels, x)
            norms = np.linalg.norm(sums, axis=1)
            empty = norms == 0
            if empty.any():  # a list nobody chose takes a random point: no list stays empty
                sums[empty] = x[[rng.randrange(len(data)) for _ in range(int(empty.sum()))]]
                norms = np.linalg.norm(sums, axis=1)
            c = (sums / norms[:, None]).astype(np.float32)
        return bytes(c.astype("<f4").tobytes())
    centroids = [list(data[i]) for i in rng.sample(range(len(data)), k)]
    for _ in range(ITERATIONS):
        sums = [[0.0] * dims for _ in range(k)]
        for v in data:
            best = max(range(k), key=lambda j: sum(a * b for a, b in zip(centroids[j], v, strict=True)))
            sums[best] = [a + b for a, b in zip(sums[best], v, strict=True)]
        centroids = [_unit(s) if any(s) else list(data[rng.randrange(len(data))]) for s in sums]
    return struct.pack(f"<{k * dims}f", *(x for row in centroids for x in row))


class VectorIndex:
    """The client side of the namespaces' IVF indexes: lists chosen at put, training, moves, probes."""

    def __init__(self, keys: Keys, dims: int) -> None:
        self.keys = keys
        self.dims = dims
        self.index_at = INDEX_AT
        #: path -> the index version this store last read (absent: 0, no index).
        self.versions: dict[str, int] = {}
        self._centroids: dict[tuple[str, int], Centroids] = {}

    # ---- puts ---------------------------------------------------------------------------

    def lists(self, path: str, vectors: list[list[float]]) -> tuple[int, str]:
        """The version this store knows ``path``'s index at, and the list of each vector in it."""
        version = self.versions.get(path, 0)
        centroids = self._centroids.get((path, version))
        if version == 0 or centroids is None:  # none, or dropped from the cache: lgs_put says which
            return 0, ",".join("0" for _ in vectors)
        return version, ",".join(str(centroids.nearest(v)) for v in vectors)

    def learn(self, path: str) -> Op[None]:
        """Read ``path``'s index version and its centroids (after a put refused as placed by older ones)."""
        keys = self.keys.store(path)
        while True:
            (version,) = yield Pipe([("HGET", keys.centroids, "v")])
            version = int(version or 0)
            if version == 0 or (yield from self.centroids(keys, path, version)) is not None:
                self._remember(path, version)
                return None

    def _remember(self, path: str, version: int) -> None:
        if len(self.versions) > CACHE:
            self.versions.clear()
        self.versions[path] = version

    def centroids(self, keys: StoreKeys, path: str, version: int) -> Op[Centroids | None]:
        """Version ``version``'s centroids (None once a move from it ended and they went)."""
        found = self._centroids.get((path, version))
        if found is not None:
            return found
        (raw,) = yield Pipe([("HGET", keys.centroids, f"c:{version}")])
        if not raw:
            return None
        try:
            found = Centroids(bytes(raw), self.dims)
        except ValueError as exc:
            raise corrupt_state(keys.centroids, [keys.centroids], f"holds centroids we did not write ({exc})") from exc
        if len(self._centroids) > CACHE:
            self._centroids.clear()
        self._centroids[(path, version)] = found
        return found

    # ---- upkeep ----------------------------------------------------------------------

    def needs_upkeep(self, reply: Sequence[Any]) -> bool:
        """Whether an lgs_put reply says its namespace needs a training, or a move taken over."""
        vectors, version, trained, moving = int(reply[4]), int(reply[5]), reply_text(reply[6]), reply_text(reply[7])
        if moving:
            return moving == "0"
        if vectors < self.index_at:
            return False
        if version == 0 or not trained:
            return True
        return vectors >= RETRAIN * int(trained) or vectors * RETRAIN * RETRAIN <= int(trained)

    def upkeep(self, path: str, reply: Sequence[Any]) -> Op[None]:
        """Train ``path``'s index (or take over its move) and move its items to the new version."""
        keys = self.keys.store(path)
        version, moving, vectors = int(reply[5]), reply_text(reply[7]), int(reply[4])
        token = new_nonce()
        if moving == "0":
            won = yield Call(LGS_TRAIN, keys.as_list(), ["claim", version, token, LEASE_MS, "", "", ""])
        else:
            count = lists_of(vectors)
            sample = yield from self._sample(keys, min(vectors, MAX_SAMPLE, SAMPLE_PER_LIST * count))
            raw = train(sample, count, self.dims, seed=vectors)
            won = yield Call(
                LGS_TRAIN,
                keys.as_list(),
                ["train", version, token, LEASE_MS, raw, len(raw) // (4 * self.dims), vectors],
            )
        if int(won[0]) != Reply.DONE:
            return None
        yield from self.move(path, int(won[1]), token)
        return None

    def _sample(self, keys: StoreKeys, size: int) -> Op[list[Sequence[float]]]:
        """About ``size`` stored vectors, drawn at random (HRANDFIELD, SAMPLE_PAGE a command)."""
        pages = [min(SAMPLE_PAGE, size - i) for i in range(0, size, SAMPLE_PAGE)]
        replies = yield Pipe([("HRANDFIELD", keys.vectors, n, "WITHVALUES") for n in pages])
        drawn: dict[bytes, bytes] = {}
        for reply in replies:
            # Pairs as RESP3 answers them, or a flat list as RESP2 does.
            flat = [x for pair in reply for x in pair] if reply and isinstance(reply[0], list) else reply
            for j in range(0, len(flat), 2):
                drawn[bytes(flat[j])] = bytes(flat[j + 1])
        # In key order: the same vectors train the same centroids, whatever order HRANDFIELD gave.
        return [v for key in sorted(drawn) for v in self.vectors_of(keys, key, drawn[key])]

    def vectors_of(self, keys: StoreKeys, key: Any, packed: bytes) -> list[Sequence[float]]:
        return [struct.unpack(f"<{self.dims}f", raw) for raw, _ in decode_vectors(packed, self.dims, keys, key)]

    def move(self, path: str, version: int, token: str) -> Op[None]:
        """Re-place every vector still in version ``version - 1``'s lists, then end the move."""
        keys = self.keys.store(path)
        centroids = yield from self.centroids(keys, path, version)
        if centroids is None:
            return None
        base = (version - 1) * LIST_SPAN
        last: list[Any] = []
        while True:
            page = ("ZRANGEBYSCORE", keys.lists, base, base + LIST_SPAN - 1, "LIMIT", 0, MOVE_PAGE)
            (members,) = yield Pipe([page])
            if members and members == last:
                return None  # nothing moved them (data we did not write): the lease lapses, a put retries
            last = members
            if not members:
                done = yield Call(LGS_TRAIN, keys.as_list(), ["finish", version, token, LEASE_MS, "", "", ""])
                if int(done[0]) == Reply.DONE or int(done[1]) != version:
                    return None
                continue
            names = list(dict.fromkeys(list_key(m, keys.lists) for m in members))
            (blobs,) = yield Pipe([("HMGET", keys.vectors, *names)])
            args: list[Any] = [version, token, LEASE_MS]
            for key, blob in zip(names, blobs, strict=True):
                vectors = self.vectors_of(keys, key, bytes(blob)) if blob else []
                args += [key, ",".join(str(centroids.nearest(v)) for v in vectors)]
            moved = yield Call(LGS_ASSIGN, keys.as_list(), args)
            if int(moved[0]) != Reply.DONE:
                return None  # a newer version since: its own move re-places everything

    # ---- search ---------------------------------------------------------------------------

    def counts(self, paths: list[str]) -> Op[list[tuple[int, int, str]]]:
        """Per path: its live items, its index version and the version a move is from ('' none)."""
        out: list[tuple[int, int, str]] = []
        for i in range(0, len(paths), COUNT_PAGE):
            part = paths[i : i + COUNT_PAGE]
            replies = yield Batch([Call(LGS_COUNT, self.keys.store(p).as_list(), []) for p in part])
            out.extend((int(r[0]), int(r[1]), reply_text(r[2])) for r in replies)
        return out

    def probe_scores(
        self, path: str, version: int, moving: str, query: Sequence[float], share: float, want: int, live: int
    ) -> Op[list[int] | None]:
        """The scores (in ``lgsl``) of the lists a search of ``query`` reads in ``path``: the nearest of
        each version a move is between (all of version 0, which has one list); None when a version's
        centroids went meanwhile (the caller reads the counts again)."""
        keys = self.keys.store(path)
        scores: list[int] = []
        for v in [version] + ([int(moving)] if moving else []):
            if v == 0:
                scores.append(0)
                continue
            centroids = yield from self.centroids(keys, path, v)
            if centroids is None:
                return None
            k = centroids.count
            per_list = max(1.0, live / k)
            n = max(MIN_PROBE, math.ceil(share * k), math.ceil(2 * want / per_list))
            scores.extend(v * LIST_SPAN + j for j in centroids.ranked(query)[: min(k, n)])
        return scores

    def counts_above(self, read: tuple[list[str], dict[str, Any]], exact: int) -> Op[list[tuple[int, int, str]] | None]:
        """Each path's live items and index state (lgs_count), unless what a prefix read found shows the
        prefix holds one namespace of at most ``exact`` items, all in its first page (the usual
        per-user search: no round trip more)."""
        paths, first = read
        if not paths:
            return None
        if len(paths) == 1 and paths[0] in first and not first[paths[0]][1] and len(first[paths[0]][0]) <= exact:
            return None
        return (yield from self.counts(paths))

    def candidates(
        self,
        op: SearchOp,
        query: list[float],
        paths: list[str],
        counts: list[tuple[int, int, str]],
        read_item: Callable[[tuple[str, ...], str, bytes, StoreKeys], Item],
        passes: Callable[[Item, dict[str, Any]], bool],
    ) -> Op[list[Candidate]]:
        """The items the namespaces' indexes find near ``query`` (those that pass the filter), with their
        vectors: the nearest lists of each namespace, more of them while a filter leaves too few."""
        want = op.offset + op.limit
        share = PROBE_SHARE
        read: set[tuple[str, int]] = set()
        found: list[Candidate] = []
        while True:
            todo: list[tuple[str, int]] = []
            for path, (live, version, moving) in zip(paths, counts, strict=True):
                if live == 0:
                    continue
                scores = yield from self.probe_scores(path, version, moving, query, share, want, live)
                if scores is None:  # a move ended meanwhile: read the versions again
                    counts = yield from self.counts(paths)
                    return (yield from self.candidates(op, query, paths, counts, read_item, passes))
                todo += [(path, s) for s in scores if (path, s) not in read]
            if not todo:
                return found
            read.update(todo)
            found += yield from self._probe(op, todo, read_item, passes)
            if not op.filter or len(found) >= want or share >= 1.0:
                return found
            share = min(1.0, share * 2)

    def fetch(
        self,
        picked: list[tuple[float | None, Candidate]],
        refresh: bool,
        read_item: Callable[[tuple[str, ...], str, bytes, StoreKeys], Item],
    ) -> Op[list[tuple[float | None, Item]]]:
        """The items of a ranking's pick of what the index found, in its order (lgs_get, one call per
        namespace, refreshing their TTL if asked); one deleted or expired since the ranking read its
        vectors is left out."""
        by_ns: dict[tuple[str, ...], list[str]] = {}
        for _, c in picked:
            by_ns.setdefault(c.namespace, []).append(c.key)
        if not by_ns:
            return []
        flag = "1" if refresh else "0"

        def send() -> Op[dict[tuple[tuple[str, ...], str], Item]]:
            calls = []
            for ns, ks in by_ns.items():
                keys = self.keys.store(_path(ns))
                calls += [(ns, keys, ks[i : i + PAGE]) for i in range(0, len(ks), PAGE)]
            replies = yield Batch([Call(LGS_GET, keys.as_list(), [flag, *ks]) for _, keys, ks in calls])
            items: dict[tuple[tuple[str, ...], str], Item] = {}
            for (ns, keys, ks), blobs in zip(calls, replies, strict=True):
                for key, blob in zip(ks, blobs, strict=True):
                    if blob:
                        items[(ns, key)] = read_item(ns, key, blob, keys)
            return items

        items = yield from restart(send)
        return [(score, items[(c.namespace, c.key)]) for score, c in picked if (c.namespace, c.key) in items]

    def _probe(
        self,
        op: SearchOp,
        lists: list[tuple[str, int]],
        read_item: Callable[[tuple[str, ...], str, bytes, StoreKeys], Item],
        passes: Callable[[Item, dict[str, Any]], bool],
    ) -> Op[list[Candidate]]:
        """The live items of ``lists`` ((path, score) pairs) that pass the filter, with their vectors."""
        keys_of: dict[str, list[str]] = {}
        pending = {i: 0 for i in range(len(lists))}
        while pending:
            order = list(pending)
            replies = yield Batch(
                [
                    Call(LGS_PROBE, self.keys.store(lists[i][0]).as_list(), [lists[i][1], pending[i], PAGE])
                    for i in order
                ]
            )
            pending = {}
            for i, page in zip(order, replies, strict=True):
                path = lists[i][0]
                keys = self.keys.store(path)
                keys_of.setdefault(path, []).extend(list_key(k, keys.lists) for k in page[1:])
                if page[0]:
                    pending[i] = int(page[0])
        reads: list[tuple[str, list[str]]] = []
        commands: list[tuple[Any, ...]] = []
        for path, names in keys_of.items():
            names = list(dict.fromkeys(names))
            keys = self.keys.store(path)
            for j in range(0, len(names), PAGE):
                part = names[j : j + PAGE]
                reads.append((path, part))
                commands.append(("HMGET", keys.vectors, *part))
                if op.filter:
                    commands.append(("HMGET", keys.items, *part))
        if not commands:
            return []
        replies = iter((yield Pipe(commands)))
        found: list[Candidate] = []
        for path, part in reads:
            keys = self.keys.store(path)
            namespace = tuple(path.split("\0"))
            vectors = next(replies)
            blobs = next(replies) if op.filter else [None] * len(part)
            for key, packed, blob in zip(part, vectors, blobs, strict=True):
                if not packed or (op.filter and not blob):
                    continue  # gone since its list was read
                item = read_item(namespace, key, bytes(blob), keys) if blob else None
                if item is not None and op.filter and not passes(item, op.filter):
                    continue
                found.append(Candidate(namespace, key, decode_vectors(bytes(packed), self.dims, keys, key), item))
        return found

    # ---- puts, with each vector's list -------------------------------------------------------

    def put_args(self, path: str, groups: list[Group], nonce: str) -> list[Any]:
        """lgs_put's ARGV: each vector's list chosen by the index version this store knows."""
        version, args = 0, []
        for key, value, ttl, packed, vecs in groups:
            lists = ""
            if vecs:
                version, lists = self.lists(path, vecs)
            args += [key, value, ttl, packed, lists]
        return [nonce, version, *args]

    def send_puts(self, calls: list[tuple[str, list[Group]]], nonce: str) -> Op[list[Any]]:
        """The puts; a call refused as placed by an index version that moved on chooses its lists again."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for _ in range(STALE_TRIES):
            sent = yield Batch(
                [Call(LGS_PUT, self.keys.store(calls[i][0]).as_list(), self.put_args(*calls[i], nonce)) for i in todo]
            )
            stale = []
            for i, reply in zip(todo, sent, strict=True):
                if int(reply[0]) == Reply.INDEX_MOVED:
                    stale.append(i)
                else:
                    replies[i] = reply
            if not stale:
                return replies
            for path in dict.fromkeys(calls[i][0] for i in stale):
                yield from self.learn(path)
            todo = stale
        raise ConfigConflict(f"the vector index of store namespace {calls[todo[0]][0]!r} changed {STALE_TRIES} "
                             "times during one put")  # fmt: skip
