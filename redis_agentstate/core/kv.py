"""Everything the key/value stores do that is not I/O: checks, requests, replies.

The seam of the seeds (``get``/``set``/``delete`` plus batches, ``exists``,
``keys``, ``count``) under a namespace. A value lives at
``ns:{ns#SS}:kv:<key>``, the key verbatim after a fixed kind segment, so no
key can reach another namespace's or another kind's keys.

Why ``keys()`` and ``count()`` need neither ``KEYS`` nor ``SCAN``: each of
the namespace's shards keeps an index in its own hash slot, written by the same
script as the value (``lua/kv_set.lua``, ``lua/kv_delete.lua``), so it
never misses a live key and works unchanged on Redis Cluster:

* ``kvkeys`` -- a zset of every key of the shard (score 0, so it pages in
  lex order with ``ZRANGEBYLEX``, cost proportional to the page);
* ``kvttl`` -- a zset of the keys that have a TTL, scored by their absolute
  expiry (``PEXPIRETIME``, the server's own number).

Redis expires values on its own, so the index outlives expired keys. Readers
never report them: ``kv_keys.lua`` and ``kv_count.lua`` compare each expiry
with the server clock (``TIME``, the clock Redis expires by), and ``count``
is ``ZCARD kvkeys - ZCOUNT kvttl -inf (now``, exact in O(log n) per shard.
Writers drop up to 100 expired index entries per call, so the index does
not grow without bound. ``SCAN`` was rejected: it walks the whole keyspace
(every namespace's keys), returns duplicates, and would still need a
per-key expiry check for ``count``. Keys written around this store (plain
``SET``/``DEL`` by another tool) are not indexed; eviction under a
``maxmemory`` policy can leave index entries for evicted keys, which is why
agent state belongs on a Redis with ``noeviction``.

Batches (``get_many``, ``set_many``) are one pipeline: ``GET`` per key, and
one ``EVALSHA`` of ``kv_set.lua`` per shard (per chunk) for ``set_many``
(``wire.Batch``; NOSCRIPT is handled there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from ..errors import InvalidArgument
from ..keys import Keys
from ..wire import Batch, Call, Command, Op, Pipe, member_id, restart, restartable
from ..wire.scripts import KV_COUNT, KV_DELETE, KV_KEYS, KV_SCRIPTS, KV_SET, KV_SWAP
from .validate import check_id, check_int

__all__ = ["DEFAULT_MAX_KEY_BYTES", "DEFAULT_MAX_VALUE_BYTES", "KV_SCRIPTS", "KvCore"]

DEFAULT_MAX_KEY_BYTES = 512
DEFAULT_MAX_VALUE_BYTES = 8 * 2**20
#: A TTL longer than a century is a bug, not a TTL.
MAX_TTL_MS = 100 * 366 * 24 * 3600 * 1000
#: One set_many script call carries at most this many keys or this many value bytes.
_BATCH_KEYS = 500
_BATCH_BYTES = 32 * 2**20
_KEYS_PAGE = 1000


class KvCore:
    """Validation, request building and reply parsing for one namespace's key/value seam."""

    #: The ``agentstate.store`` attribute of its operations' spans and metrics (telemetry).
    telemetry_store: ClassVar[str] = "kv"

    def __init__(self, namespace: str, *, max_key_bytes: int, max_value_bytes: int) -> None:
        self.keys = Keys.unresolved(namespace)
        self.max_key_bytes = check_int(max_key_bytes, "max_key_bytes", 1, 2**20)
        self.max_value_bytes = check_int(max_value_bytes, "max_value_bytes", 0, 512 * 2**20)

    # ---- checks ---------------------------------------------------------

    def _key(self, key: object) -> str:
        return check_id(key, "key", max_bytes=self.max_key_bytes)

    def _value(self, value: object, key: str) -> bytes:
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        if not isinstance(value, bytes):
            raise InvalidArgument(f"value of key {key!r} must be bytes, got {type(value).__name__}")
        if len(value) > self.max_value_bytes:
            raise InvalidArgument(
                f"value of key {key!r} is {len(value)} bytes, over max_value_bytes={self.max_value_bytes}"
            )
        return value

    @staticmethod
    def _ttl(ttl_ms: object) -> str:
        return "" if ttl_ms is None else str(check_int(ttl_ms, "ttl_ms", 1, MAX_TTL_MS))

    def _key_list(self, keys: object) -> list[str]:
        if isinstance(keys, (str, bytes, bytearray)) or not isinstance(keys, Iterable):
            raise InvalidArgument(f"keys must be an iterable of str, got {type(keys).__name__}")
        return [self._key(k) for k in keys]

    def _items(self, items: object) -> list[tuple[str, bytes]]:
        if isinstance(items, Mapping):
            pairs: Iterable[Any] = items.items()
        elif isinstance(items, (str, bytes, bytearray)) or not isinstance(items, Iterable):
            raise InvalidArgument(f"items must be a mapping or an iterable of pairs, got {type(items).__name__}")
        else:
            pairs = items
        out = []
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidArgument(f"each item must be a (key, value) pair, got {pair!r:.80}")
            key = self._key(pair[0])
            out.append((key, self._value(pair[1], key)))
        return out

    def _index(self, key: str) -> list[str]:
        """KEYS of a one-key kv script: the key's shard index, then its value key."""
        return list(self.keys.kv_keys(key))

    # ---- operations -----------------------------------------------------

    def get(self, key: str) -> Op[bytes | None]:
        reply = yield Command(["GET", self.keys.kv(self._key(key))])
        return None if reply is None else bytes(reply)

    def exists(self, key: str) -> Op[bool]:
        reply = yield Command(["EXISTS", self.keys.kv(self._key(key))])
        return bool(reply)

    def get_many(self, keys: Iterable[str]) -> Op[list[bytes | None]]:
        wanted = self._key_list(keys)
        if not wanted:
            return []
        replies = yield Pipe([("GET", self.keys.kv(k)) for k in wanted])
        return [None if r is None else bytes(r) for r in replies]

    def set(self, key: str, value: bytes, *, ttl_ms: int | None = None) -> Op[None]:
        k = self._key(key)
        v = self._value(value, k)
        yield Call(KV_SET, self._index(k), [self._ttl(ttl_ms), v])
        return None

    def set_many(
        self, items: Mapping[str, bytes] | Iterable[tuple[str, bytes]], *, ttl_ms: int | None = None
    ) -> Op[None]:
        pairs = self._items(items)
        ttl = self._ttl(ttl_ms)
        # Setting them again is harmless: a reshard that splits a chunk's shard starts it over.
        return (yield from restart(lambda: self._set_many(pairs, ttl)))

    def _set_many(self, pairs: list[tuple[str, bytes]], ttl: str) -> Op[None]:
        # Grouped by the keys each builds (one reading of the layout per key): a call's keys share a shard.
        by_shard: dict[tuple[str, str], list[tuple[str, str, bytes]]] = {}
        for key, value in pairs:
            keys_index, ttls, value_key = self.keys.kv_keys(key)
            by_shard.setdefault((keys_index, ttls), []).append((key, value_key, value))
        calls: list[Call] = []
        for index_keys, group in by_shard.items():
            index = list(index_keys)
            chunk: list[tuple[str, bytes]] = []
            size = 0
            for _key, value_key, value in group:
                if chunk and (len(chunk) >= _BATCH_KEYS or size + len(value) > _BATCH_BYTES):
                    calls.append(self._set_call(index, chunk, ttl))
                    chunk, size = [], 0
                chunk.append((value_key, value))
                size += len(value)
            calls.append(self._set_call(index, chunk, ttl))
        if calls:
            yield Batch(calls)
        return None

    def _set_call(self, index: list[str], chunk: list[tuple[str, bytes]], ttl: str) -> Call:
        return Call(KV_SET, [*index, *(k for k, _ in chunk)], [ttl, *(v for _, v in chunk)])

    def swap(self, key: str, expected: bytes | None, value: bytes) -> Op[bool]:
        k = self._key(key)
        v = self._value(value, k)
        old = b"" if expected is None else self._value(expected, k)
        reply = yield Call(KV_SWAP, self._index(k), ["0" if expected is None else "1", old, v])
        return bool(reply)

    def delete(self, key: str) -> Op[None]:
        yield Call(KV_DELETE, self._index(self._key(key)), [])
        return None

    @restartable
    def keys_list(self) -> Op[list[str]]:
        """Every live key, sorted: pages of every shard's index, one pipeline per round."""
        found: list[str] = []
        pending: dict[int, bytes] = {shard: b"-" for shard in range(self.keys.shards)}
        while pending:
            shards = list(pending)
            replies = yield Batch([Call(KV_KEYS, self.keys.kv_index(s), [pending[s], _KEYS_PAGE]) for s in shards])
            pending = {}
            for shard, page in zip(shards, replies, strict=True):
                found.extend(member_id(k, self.keys.kv_index(shard)[0]) for k in page[1:])
                if page[0]:
                    pending[shard] = b"(" + page[0]
        found.sort()
        return found

    @restartable
    def keys_page(self, after: str | None, limit: int) -> Op[tuple[list[str], str | None]]:
        """Up to ``limit`` live keys after ``after`` (from the first by default), sorted, and the cursor
        of the next page (None after the last): one pipeline of one bounded read per shard."""
        limit = check_int(limit, "limit", 1, _KEYS_PAGE)
        start = "-" if after is None else "(" + self._key(after)
        shards = range(self.keys.shards)
        replies = yield Batch([Call(KV_KEYS, self.keys.kv_index(s), [start, limit]) for s in shards])
        found: list[str] = []
        cut: str | None = None  # every key up to it was read, from every shard that has more
        for shard, page in zip(shards, replies, strict=True):
            found.extend(member_id(k, self.keys.kv_index(shard)[0]) for k in page[1:])
            if page[0]:
                last = member_id(page[0], self.keys.kv_index(shard)[0])
                cut = last if cut is None else min(cut, last)
        found = sorted(k for k in found if cut is None or k <= cut)[:limit]
        if len(found) == limit:
            return found, found[-1]
        return found, cut  # a short page (expired keys were skipped) before the cut, or the last one

    @restartable
    def count(self) -> Op[int]:
        replies = yield Batch([Call(KV_COUNT, self.keys.kv_index(s), []) for s in range(self.keys.shards)])
        return sum(int(r) for r in replies)
