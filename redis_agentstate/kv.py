"""``KeyValueStore`` and ``AsyncKeyValueStore``: thin I/O shells over ``KvCore``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from .clients import RedisClient
from .core.kv import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES, KV_SCRIPTS, KvCore
from .wire import DEFAULT_WAIT_TIMEOUT_MS, AsyncShell, RetryPolicy, StoreShell, SyncShell

__all__ = ["AsyncKeyValueStore", "KeyValueStore"]


class _KeyValues(StoreShell[KvCore]):
    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        *,
        retry: RetryPolicy | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        shards: int | None = None,
    ) -> None:
        core = KvCore(namespace, max_key_bytes=max_key_bytes, max_value_bytes=max_value_bytes)
        super().__init__(client, core, KV_SCRIPTS, retry, wait_replicas, wait_timeout_ms, shards)


class KeyValueStore(_KeyValues, SyncShell[KvCore]):
    """The seeds' key/value state seam on a ``redis.Redis`` / ``RedisCluster`` client.

    Keys are non-empty strings of at most ``max_key_bytes`` UTF-8 bytes,
    values any bytes up to ``max_value_bytes``; anything else raises
    ``InvalidArgument`` before a byte is sent. Batches are pipelined;
    ``keys()`` and ``count()`` read per-shard indexes (never ``KEYS`` or
    ``SCAN``) and never report an expired key. ``wait_replicas=n``
    follows every write with ``WAIT n wait_timeout_ms`` (and ``WAITAOF`` where the
    server has it and AOF is on) in the same round trip, raising
    ``WriteNotReplicated`` when fewer acknowledged; the first write raises
    ``ReplicationUnsafe`` if the primary has fewer than n replicas online (see
    :ref:`durability <wait_replicas-replica-acknowledgement>`).
    """

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        return self._run(self._core.get(key))

    def set(self, key: str, value: bytes, *, ttl_ms: int | None = None) -> None:
        """Store ``value`` under ``key``, expiring after ``ttl_ms`` if given (else never)."""
        self._run(self._core.set(key, value, ttl_ms=ttl_ms))

    def swap(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Compare-and-set: store ``value`` under ``key`` (no expiry) if it holds ``expected`` (None: if
        it holds nothing), in one script; True if ``key`` now holds ``value``, False if it held
        something else (nothing written: read it again and retry)."""
        return self._run(self._core.swap(key, expected, value))

    def delete(self, key: str) -> None:
        """Remove ``key`` (a missing key is fine)."""
        self._run(self._core.delete(key))

    def get_many(self, keys: Iterable[str]) -> list[bytes | None]:
        """The values of ``keys``, in order (None where missing), in one pipeline."""
        return self._run(self._core.get_many(keys))

    def set_many(self, items: Mapping[str, bytes] | Iterable[tuple[str, bytes]], *, ttl_ms: int | None = None) -> None:
        """Store every ``(key, value)`` in one pipeline: one script per shard and chunk (500 keys or 32 MiB), so
        atomic within a chunk, not across chunks or shards."""
        self._run(self._core.set_many(items, ttl_ms=ttl_ms))

    def exists(self, key: str) -> bool:
        """True if ``key`` holds a value."""
        return self._run(self._core.exists(key))

    def keys(self) -> Iterator[str]:
        """Every live key of the namespace, sorted."""
        return iter(self._run(self._core.keys_list()))

    def keys_page(self, after: str | None = None, *, limit: int = 100) -> tuple[list[str], str | None]:
        """Up to ``limit`` (at most 1,000) live keys after ``after``, sorted, and the ``after`` of the
        next page (None after the last): a bounded read, where ``keys()`` reads them all."""
        return self._run(self._core.keys_page(after, limit))

    def count(self) -> int:
        """The number of live keys of the namespace."""
        return self._run(self._core.count())


class AsyncKeyValueStore(_KeyValues, AsyncShell[KvCore]):
    """The asyncio twin of :class:`KeyValueStore` (``redis.asyncio`` clients)."""

    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        return await self._run(self._core.get(key))

    async def set(self, key: str, value: bytes, *, ttl_ms: int | None = None) -> None:
        """Store ``value`` under ``key``, expiring after ``ttl_ms`` if given (else never)."""
        await self._run(self._core.set(key, value, ttl_ms=ttl_ms))

    async def swap(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Compare-and-set ``key`` from ``expected`` to ``value`` (see ``KeyValueStore.swap``)."""
        return await self._run(self._core.swap(key, expected, value))

    async def delete(self, key: str) -> None:
        """Remove ``key`` (a missing key is fine)."""
        await self._run(self._core.delete(key))

    async def get_many(self, keys: Iterable[str]) -> list[bytes | None]:
        """The values of ``keys``, in order (None where missing), in one pipeline."""
        return await self._run(self._core.get_many(keys))

    async def set_many(
        self, items: Mapping[str, bytes] | Iterable[tuple[str, bytes]], *, ttl_ms: int | None = None
    ) -> None:
        """Store every ``(key, value)`` in one pipeline: one script per shard and chunk (500 keys or 32 MiB), so
        atomic within a chunk, not across chunks or shards."""
        await self._run(self._core.set_many(items, ttl_ms=ttl_ms))

    async def exists(self, key: str) -> bool:
        """True if ``key`` holds a value."""
        return await self._run(self._core.exists(key))

    async def keys(self) -> Iterator[str]:
        """Every live key of the namespace, sorted."""
        return iter(await self._run(self._core.keys_list()))

    async def keys_page(self, after: str | None = None, *, limit: int = 100) -> tuple[list[str], str | None]:
        """Up to ``limit`` live keys after ``after``, and the next page's ``after`` (see ``KeyValueStore``)."""
        return await self._run(self._core.keys_page(after, limit))

    async def count(self) -> int:
        """The number of live keys of the namespace."""
        return await self._run(self._core.count())
