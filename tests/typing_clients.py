"""Checked by mypy (``[tool.mypy] files``), not run by pytest: every client the library supports
satisfies the client protocols of :mod:`redis_agentstate.clients`, and a non-client does not.

``warn_unused_ignores`` (part of ``strict``) turns the ``type: ignore`` lines below into
assertions: if mypy stopped rejecting them, the ignore would be reported as unused.
"""

from __future__ import annotations

import fakeredis
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from redis_agentstate import AsyncCheckpointStore, AsyncKeyValueStore, AsyncPoolStore, CheckpointStore, PoolStore
from redis_agentstate.clients import AsyncClient, SyncClient


def sync_clients(
    plain: redis.Redis, cluster: redis.cluster.RedisCluster, fake: fakeredis.FakeRedis
) -> list[SyncClient]:
    return [plain, cluster, fake]


def async_clients(
    plain: redis.asyncio.Redis, cluster: redis.asyncio.cluster.RedisCluster, fake: fakeredis.FakeAsyncRedis
) -> list[AsyncClient]:
    return [plain, cluster, fake]


def stores(plain: redis.Redis, aplain: redis.asyncio.Redis, acluster: redis.asyncio.cluster.RedisCluster) -> None:
    CheckpointStore(plain)
    PoolStore(redis.cluster.RedisCluster(host="localhost"))
    AsyncCheckpointStore(aplain)
    AsyncPoolStore(acluster)
    AsyncKeyValueStore(fakeredis.FakeAsyncRedis())


def not_clients() -> None:
    a: SyncClient = object()  # type: ignore[assignment]
    b: AsyncClient = "redis://localhost"  # type: ignore[assignment]
    CheckpointStore({})  # type: ignore[arg-type]
    del a, b
