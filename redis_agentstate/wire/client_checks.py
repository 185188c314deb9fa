"""What the stores check of a client: its flavor, ``decode_responses``, and its read timeout."""

from __future__ import annotations

import inspect
from typing import Any, cast

from ..errors import InvalidArgument

__all__ = [
    "block_slice_ms",
    "check_client",
    "effective_socket_timeout",
    "is_asyncio_client",
    "is_cluster_client",
]


def is_asyncio_client(client: object) -> bool:
    """True for a ``redis.asyncio`` client (plain or cluster, fakeredis' too), False for a sync one."""
    import redis
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    if isinstance(client, (redis.asyncio.Redis, AsyncRedisCluster)):
        return True
    if isinstance(client, (redis.Redis, RedisCluster)):
        return False
    # A wrapper or look-alike: its commands are coroutines or they are not.
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def is_cluster_client(client: object) -> bool:
    """``client`` is a Redis Cluster client (sync or asyncio)."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def check_client(client: object, *, want_asyncio: bool | None = None) -> None:
    """Refuse a client that would decode our binary blobs as text, or of the wrong flavor.

    ``want_asyncio``: True for an async store (needs a ``redis.asyncio`` client), False for a
    sync store; a mismatch would otherwise surface much later as a ``TypeError`` or a
    misleading ``CorruptState`` (a coroutine object read as a reply).
    """
    try:
        decode = cast(Any, client).get_encoder().decode_responses
    except AttributeError as exc:
        raise InvalidArgument(f"expected a redis-py client, got {type(client).__name__}") from exc
    if want_asyncio is not None and is_asyncio_client(client) != want_asyncio:
        if want_asyncio:
            raise InvalidArgument(
                f"an async store needs a redis.asyncio client (redis.asyncio.Redis or "
                f"redis.asyncio.cluster.RedisCluster), got the sync {type(client).__module__}.{type(client).__name__}"
            )
        raise InvalidArgument(
            f"a sync store needs a sync client (redis.Redis or redis.cluster.RedisCluster), got the asyncio "
            f"{type(client).__module__}.{type(client).__name__}; use the Async... store with it"
        )
    if decode:
        raise InvalidArgument(
            "the Redis client has decode_responses=True; redis_agentstate stores binary "
            "msgpack and needs a client created with decode_responses=False"
        )


#: redis-py's read timeout when none is given (5 s since redis-py 6; a constant in ``redis._defaults``).
_REDIS_PY_DEFAULT_TIMEOUT_S = 5.0
_NO_DEFAULT = object()


def _init_default(cls: Any, name: str) -> Any:
    """The default of ``name`` in the first ``__init__`` along ``cls``'s MRO that declares it."""
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            param = inspect.signature(init).parameters.get(name)
        except (TypeError, ValueError):
            continue
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
    return _NO_DEFAULT


def _seconds(value: Any) -> float | None:
    try:
        return float(value) if value else None
    except (TypeError, ValueError):
        return _REDIS_PY_DEFAULT_TIMEOUT_S


def _timeout_holders(client: object) -> list[Any]:
    """Objects that build the client's connections: pools, cluster nodes, the cluster client itself."""
    holders: list[Any] = []
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        holders.append(pool)
    get_nodes = getattr(client, "get_nodes", None)
    if callable(get_nodes):
        try:
            nodes = list(get_nodes())
        except Exception:  # an uninitialised cluster client: fall through to its kwargs
            nodes = []
        for node in nodes:
            # Sync cluster: each node has a redis.Redis with its own pool; async: the node builds connections.
            node_pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
            holders.append(node_pool if node_pool is not None else node)
    holders.append(client)  # redis.asyncio.cluster.RedisCluster keeps connection_kwargs itself
    nodes_manager = getattr(client, "nodes_manager", None)
    if nodes_manager is not None:
        holders.append(nodes_manager)
    return holders


def effective_socket_timeout(client: object) -> float | None:
    """The read timeout (seconds) the client's connections apply to every reply; None if they wait forever.

    Not just ``connection_pool.connection_kwargs["socket_timeout"]``: ``Redis.from_url(url)`` and a
    ``ConnectionPool`` built without the argument leave it out of the kwargs, and the connection class's
    own default (5 s in redis-py 8) applies. So: a single-connection client's live connection if any, else
    the kwargs of whatever builds the connections (pool, cluster node), else the connection class's
    ``__init__`` default, else redis-py's default. Unknown shapes get the default: assuming a timeout that
    is not there costs a few extra ``XREAD``s, missing one that is kills the read.
    """
    conn = getattr(client, "connection", None)
    if conn is not None and hasattr(conn, "socket_timeout"):
        return _seconds(conn.socket_timeout)
    for holder in _timeout_holders(client):
        kwargs = getattr(holder, "connection_kwargs", None)
        if not isinstance(kwargs, dict):
            continue
        if "socket_timeout" in kwargs:
            return _seconds(kwargs["socket_timeout"])
        cls = getattr(holder, "connection_class", None) or kwargs.get("connection_class")
        default = _init_default(cls, "socket_timeout") if cls is not None else _NO_DEFAULT
        if default is not _NO_DEFAULT:
            return _seconds(default)
    return _REDIS_PY_DEFAULT_TIMEOUT_S


def block_slice_ms(client: object) -> int | None:
    """Longest single blocking command (``XREAD BLOCK``) that stays well inside the client's read timeout.

    Half the timeout: the reply comes after the block plus a round trip and the server's own delay.
    None when the client has no read timeout (one block of any length is safe).
    """
    timeout = effective_socket_timeout(client)
    return None if timeout is None else max(1, int(timeout * 1000) // 2)
