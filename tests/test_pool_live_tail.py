"""A pool's live tail survives the clients users actually build (issue 9, item 1).

redis-py 8's ``Redis.from_url(url)`` reads with a 5 s socket timeout that is
not in ``connection_pool.connection_kwargs``; a blocking ``watch`` longer than
that used to die with ``BackendUnavailable``. Clients here are built the way
the README builds them. The long idles (past the real 5 s default) are marked
``slow``; the fast tests use connection classes whose own default timeout is
short and, like ``from_url``'s, invisible in the pool's kwargs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from conftest import later, require_real

from redis_agentstate.pool_models import Cursor, PoolConfig, PoolMember
from redis_agentstate.pools import AsyncPoolStore, PoolStore
from redis_agentstate.wire import block_slice_ms, effective_socket_timeout

SHORT = 0.3  # seconds: the hidden read timeout of the fast tests


class ShortReadConnection(redis.Connection):
    """Reads time out after SHORT s by the class's own default: not in the pool's kwargs, like from_url's 5 s."""

    def __init__(self, *, socket_timeout: float | None = SHORT, **kw: Any) -> None:
        super().__init__(socket_timeout=socket_timeout, **kw)


class AsyncShortReadConnection(aioredis.Connection):
    def __init__(self, *, socket_timeout: float | None = SHORT, **kw: Any) -> None:
        super().__init__(socket_timeout=socket_timeout, **kw)


@pytest.fixture
def url(real_server: Any) -> str:
    return require_real(real_server)


def _sync_shapes(url: str) -> list[tuple[str, Callable[[], Any], float | None]]:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    return [
        ("from_url", lambda: redis.Redis.from_url(url), 5.0),
        ("from_url socket_timeout=0.7", lambda: redis.Redis.from_url(url, socket_timeout=0.7), 0.7),
        ("from_url socket_timeout=None", lambda: redis.Redis.from_url(url, socket_timeout=None), None),
        ("from_url ?socket_timeout=2", lambda: redis.Redis.from_url(url + "?socket_timeout=2"), 2.0),
        ("Redis(host, port)", lambda: redis.Redis(host, int(port)), 5.0),
        (
            "shared ConnectionPool.from_url",
            lambda: redis.Redis(connection_pool=redis.ConnectionPool.from_url(url)),
            5.0,
        ),
        (
            "shared ConnectionPool(host, port)",
            lambda: redis.Redis(connection_pool=redis.ConnectionPool(host=host, port=int(port))),
            5.0,
        ),
        (
            "BlockingConnectionPool socket_timeout=0.4",
            lambda: redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, socket_timeout=0.4)),
            0.4,
        ),
        ("single_connection_client", lambda: redis.Redis.from_url(url, single_connection_client=True), 5.0),
        (
            "connection class default",
            lambda: redis.Redis(
                connection_pool=redis.ConnectionPool.from_url(url, connection_class=ShortReadConnection)
            ),
            SHORT,
        ),
    ]


def _async_shapes(url: str) -> list[tuple[str, Callable[[], Any], float | None]]:
    return [
        ("async from_url", lambda: aioredis.Redis.from_url(url), 5.0),
        ("async from_url socket_timeout=0.7", lambda: aioredis.Redis.from_url(url, socket_timeout=0.7), 0.7),
        ("async from_url socket_timeout=None", lambda: aioredis.Redis.from_url(url, socket_timeout=None), None),
        ("async shared pool", lambda: aioredis.Redis(connection_pool=aioredis.ConnectionPool.from_url(url)), 5.0),
        (
            "async connection class default",
            lambda: aioredis.Redis(
                connection_pool=aioredis.ConnectionPool.from_url(url, connection_class=AsyncShortReadConnection)
            ),
            SHORT,
        ),
    ]


class TestEffectiveTimeout:
    def test_every_client_shape_reports_its_real_read_timeout(self, url: str, twin_loop: Any) -> None:
        seen = {}
        for name, build, _ in [*_sync_shapes(url), *_async_shapes(url)]:
            client = build()
            seen[name] = effective_socket_timeout(client)
            if hasattr(client, "aclose"):
                twin_loop.run_until_complete(client.aclose())
            else:
                client.close()
        assert seen == {name: want for name, _, want in [*_sync_shapes(url), *_async_shapes(url)]}

    def test_the_default_is_really_what_a_connection_gets(self, url: str) -> None:
        """The control: the number above is the one the live connection applies (from_url hides it)."""
        client = redis.Redis.from_url(url)
        assert "socket_timeout" not in client.connection_pool.connection_kwargs
        conn = client.connection_pool.get_connection()
        try:
            assert conn.socket_timeout == effective_socket_timeout(client) == 5.0
        finally:
            client.connection_pool.release(conn)
            client.close()

    def test_slices_stay_inside_the_timeout(self, url: str) -> None:
        assert block_slice_ms(redis.Redis.from_url(url)) == 2500
        assert block_slice_ms(redis.Redis.from_url(url, socket_timeout=None)) is None
        assert block_slice_ms(redis.Redis.from_url(url, socket_timeout=0.001)) == 1


class TestHiddenTimeoutFast:
    """A timeout the pool's kwargs do not show, made short so the test is fast (fails before the fix)."""

    def test_sync_block_past_a_hidden_timeout(self, url: str, namespace: str) -> None:
        pool = redis.ConnectionPool.from_url(url, connection_class=ShortReadConnection)
        assert "socket_timeout" not in pool.connection_kwargs
        client = redis.Redis(connection_pool=pool)
        s = PoolStore(client, namespace=namespace)
        writer = PoolStore(redis.Redis.from_url(url), namespace=namespace)
        s.open("pool", PoolConfig())
        t0 = time.monotonic()
        assert s.watch("pool", Cursor(1), block_ms=1_200) == []
        assert 1.1 < time.monotonic() - t0 < 3
        with later(0.8, lambda: writer.join("pool", PoolMember("late"))):
            got = s.watch("pool", Cursor(1), block_ms=5_000)
        assert [r.payload.run_id for r in got] == ["late"]
        client.close()

    def test_async_block_past_a_hidden_timeout(self, url: str, namespace: str, twin_loop: Any) -> None:
        async def scenario() -> tuple[list[Any], float, list[Any]]:
            pool = aioredis.ConnectionPool.from_url(url, connection_class=AsyncShortReadConnection)
            client = aioredis.Redis(connection_pool=pool)
            s = AsyncPoolStore(client, namespace=namespace)
            await s.open("pool", PoolConfig())
            t0 = time.monotonic()
            idle = await s.watch("pool", Cursor(1), block_ms=1_200)
            elapsed = time.monotonic() - t0

            async def join_soon() -> None:
                await asyncio.sleep(0.8)
                await s.join("pool", PoolMember("late"))

            got, _ = await asyncio.gather(s.watch("pool", Cursor(1), block_ms=5_000), join_soon())
            await client.aclose()
            return idle, elapsed, got

        idle, elapsed, got = twin_loop.run_until_complete(scenario())
        assert idle == [] and 1.1 < elapsed < 3
        assert [r.payload.run_id for r in got] == ["late"]


@pytest.mark.slow
class TestIdlePastTheDefaultTimeout:
    """The README's client, untouched, idling longer than redis-py's 5 s default."""

    def test_sync_from_url_watch_idles_8s(self, url: str, namespace: str) -> None:
        client = redis.Redis.from_url(url)
        pools = PoolStore(client, namespace=namespace)
        pools.open("pool", PoolConfig())
        t0 = time.monotonic()
        assert pools.watch("pool", Cursor(1), block_ms=8_000) == []
        assert 7.9 < time.monotonic() - t0 < 11
        writer = PoolStore(redis.Redis.from_url(url), namespace=namespace)
        with later(6.0, lambda: writer.join("pool", PoolMember("after-6s"))):
            got = pools.watch("pool", Cursor(1), block_ms=8_000)
        assert [r.payload.run_id for r in got] == ["after-6s"]
        client.close()

    def test_async_from_url_watch_idles_8s(self, url: str, namespace: str, twin_loop: Any) -> None:
        async def scenario() -> tuple[list[Any], float]:
            client = aioredis.Redis.from_url(url)
            pools = AsyncPoolStore(client, namespace=namespace)
            await pools.open("pool", PoolConfig())
            t0 = time.monotonic()
            got = await pools.watch("pool", Cursor(1), block_ms=8_000)
            elapsed = time.monotonic() - t0
            await client.aclose()
            return got, elapsed

        got, elapsed = twin_loop.run_until_complete(scenario())
        assert got == [] and 7.9 < elapsed < 11

    def test_cli_watch_survives_idle(self, private_server: Any) -> None:
        """``agentstate watch POOL`` used to die after 10.5 s without new records."""
        pools = PoolStore(redis.Redis.from_url(private_server.url), namespace="idle")
        pools.open("p", PoolConfig())
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "redis_agentstate", "watch", "p", "--from", "1", "--url", private_server.url,
             "--namespace", "idle"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            time.sleep(12.0)
            assert proc.poll() is None, proc.communicate()[1]
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
            reader.start()
            joined = pools.join("p", PoolMember("after-12s"))
            reader.join(10)
            assert lines and lines[0].split()[0] == str(joined.sequence) and "after-12s" in lines[0]
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.mark.cluster
class TestCluster:
    def test_cluster_clients_report_their_read_timeout(self, redis_cluster: Any, twin_loop: Any) -> None:
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        from redis.cluster import RedisCluster

        host, port = redis_cluster.startup
        sync_default = RedisCluster.from_url(f"redis://{host}:{port}")
        sync_short = RedisCluster(host=host, port=port, socket_timeout=SHORT)
        async_default = AsyncRedisCluster.from_url(f"redis://{host}:{port}")
        try:
            assert effective_socket_timeout(sync_default) == 5.0
            assert effective_socket_timeout(sync_short) == SHORT
            assert effective_socket_timeout(async_default) == 5.0
        finally:
            sync_default.close()
            sync_short.close()
            twin_loop.run_until_complete(async_default.aclose())

    def test_cluster_block_past_the_timeout(self, redis_cluster: Any, namespace: str) -> None:
        from redis.cluster import RedisCluster

        host, port = redis_cluster.startup
        client = RedisCluster(host=host, port=port, socket_timeout=SHORT)
        s = PoolStore(client, namespace=namespace)
        s.open("pool", PoolConfig())
        t0 = time.monotonic()
        assert s.watch("pool", Cursor(1), block_ms=1_000) == []
        assert 0.9 < time.monotonic() - t0 < 3
        client.close()
