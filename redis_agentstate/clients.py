"""What the library needs of a Redis client: the types the stores' ``client`` arguments are checked against.

The library calls four things on a client: ``execute_command`` (single
commands), ``pipeline(transaction=False)`` (pipelined reads and batches),
``register_script`` (one ``Script`` per operation, called with ``keys``,
``args`` and ``client``) and ``get_encoder`` (to refuse
``decode_responses=True``). ``redis.Redis`` and
``redis.cluster.RedisCluster`` satisfy :class:`SyncClient`;
``redis.asyncio.Redis`` and ``redis.asyncio.cluster.RedisCluster`` satisfy
:class:`AsyncClient`; fakeredis' ``FakeRedis`` / ``FakeAsyncRedis`` do too
(``tests/typing_clients.py`` holds mypy to that). Anything else it reads
(``connection_pool``, a cluster's nodes, to learn the read timeout) is looked
up with ``getattr`` and optional, so it is not part of the contract.

Structural typing cannot tell the flavors apart (redis-py leaves the sync
``execute_command`` unannotated, so it matches an awaitable return too); the
stores check the flavor when they are built and raise ``InvalidArgument`` for
the wrong one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, Protocol, TypeAlias

__all__ = ["AsyncClient", "AsyncPipeline", "RedisClient", "Script", "SyncClient", "SyncPipeline", "is_cluster"]


class Script(Protocol):
    """A registered Lua script (redis-py's ``Script`` / ``AsyncScript``): EVALSHA, loading it on NOSCRIPT."""

    def __call__(
        self, keys: Sequence[Any] | None = ..., args: Iterable[Any] | None = ..., client: Any = ...
    ) -> Any: ...


class SyncPipeline(Protocol):
    def execute_command(self, *args: Any, **options: Any) -> object: ...

    def execute(self, raise_on_error: bool = ...) -> Any: ...


class AsyncPipeline(Protocol):
    def execute_command(self, *args: Any, **options: Any) -> object: ...

    def execute(self, raise_on_error: bool = ...) -> Awaitable[Any]: ...


class SyncClient(Protocol):
    """A blocking client: ``redis.Redis``, ``redis.cluster.RedisCluster``, ``fakeredis.FakeRedis``."""

    def execute_command(self, *args: Any, **options: Any) -> Any: ...

    def pipeline(self, transaction: bool = ...) -> SyncPipeline: ...

    def register_script(self, script: str) -> Script: ...

    def script_load(self, script: str) -> Any: ...

    def get_encoder(self) -> Any: ...


class AsyncClient(Protocol):
    """An asyncio client: ``redis.asyncio.Redis``, ``redis.asyncio.cluster.RedisCluster``, ``FakeAsyncRedis``."""

    def execute_command(self, *args: Any, **options: Any) -> Awaitable[Any]: ...

    def pipeline(self, transaction: bool = ...) -> AsyncPipeline: ...

    def register_script(self, script: str) -> Script: ...

    def script_load(self, script: str) -> Any: ...

    def get_encoder(self) -> Any: ...


#: Either flavor (what code shared by the twins accepts).
RedisClient: TypeAlias = SyncClient | AsyncClient


def is_cluster(client: object) -> bool:
    """True for a Redis Cluster client (sync or asyncio), whose keyless commands need a target node."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))
