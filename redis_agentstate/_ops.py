"""Sans-I/O plumbing: an operation is a generator that yields requests and returns a result.

Stores never hold logic of their own. A core method (e.g.
``CheckpointCore.commit``) is a generator: it validates, builds one request,
yields it, receives the raw reply, and either returns the parsed result or
yields a follow-up request. ``run_sync`` and ``run_async`` are the only two
places that talk to Redis, so the sync and async stores are three-line shells
and no rule can drift between them.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import random
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import redis.exceptions as rex
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from . import scripts
from .errors import BackendError, BackendUnavailable, InvalidArgument
from .keys import Keys

__all__ = ["Call", "Command", "Op", "Pipe", "RetryPolicy", "run_async", "run_sync"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One ``EVALSHA`` of a registered script."""

    script: str
    keys: Sequence[str]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Pipe:
    """Independent read commands sent in one pipeline (one round trip per node)."""

    commands: Sequence[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Command:
    """One plain command sent on its own, e.g. a blocking ``XREAD`` (never pipelined)."""

    args: Sequence[Any]


Request = Call | Pipe | Command
Op = Generator[Request, Any, T]

#: Errors after which the request may or may not have applied. Every request
#: this library sends is safe to re-send (see DESIGN.md, "Retry-safe").
_TRANSIENT = (rex.ConnectionError, rex.TimeoutError, rex.TryAgainError, rex.ClusterDownError)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded, jittered retries of transient connection errors.

    ``attempts`` counts the first try; ``max_delay_s`` caps the whole retrying;
    waits are full-jitter exponential between 0 and ``max_wait_s``.
    """

    attempts: int = 3
    max_wait_s: float = 0.5
    max_delay_s: float = 5.0
    multiplier_s: float = 0.05
    retry_on: tuple[type[BaseException], ...] = field(default=_TRANSIENT)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise InvalidArgument("RetryPolicy.attempts must be an int >= 1")
        for name in ("max_wait_s", "max_delay_s", "multiplier_s"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"RetryPolicy.{name} must be >= 0")

    def first_wait(self) -> float:
        """Jittered pause before the first re-send (the later ones are tenacity's)."""
        return random.uniform(0, min(self.max_wait_s, self.multiplier_s))

    def _kwargs(self, retries: bool) -> dict[str, Any]:
        # ``retries``: the first attempt already failed outside tenacity.
        attempts = self.attempts - 1 if retries else self.attempts
        return {
            "stop": stop_after_attempt(attempts) | stop_after_delay(self.max_delay_s),
            "wait": wait_random_exponential(multiplier=self.multiplier_s, max=self.max_wait_s),
            "retry": retry_if_exception_type(self.retry_on),
            "reraise": True,
        }

    def sync(self, retries: bool = False) -> Retrying:
        return Retrying(**self._kwargs(retries))

    def asyncio(self, retries: bool = False) -> AsyncRetrying:
        return AsyncRetrying(**self._kwargs(retries))


NO_RETRY = RetryPolicy(attempts=1)


def _translate(exc: rex.RedisError) -> BackendError:
    if isinstance(exc, _TRANSIENT):
        return BackendUnavailable(f"Redis unavailable: {exc}")
    return BackendError(f"Redis error: {exc}")


def _send_sync(client: Any, scripts: dict[str, Any], req: Request) -> Any:
    if isinstance(req, Call):
        return scripts[req.script](keys=req.keys, args=req.args, client=client)
    if isinstance(req, Command):
        return client.execute_command(*req.args)
    pipe = client.pipeline(transaction=False)
    for cmd in req.commands:
        pipe.execute_command(*cmd)
    return pipe.execute()


async def _send_async(client: Any, scripts: dict[str, Any], req: Request) -> Any:
    if isinstance(req, Call):
        return await scripts[req.script](keys=req.keys, args=req.args, client=client)
    if isinstance(req, Command):
        return await client.execute_command(*req.args)
    pipe = client.pipeline(transaction=False)
    for cmd in req.commands:
        pipe.execute_command(*cmd)
    return await pipe.execute()


def _send_retrying_sync(client: Any, scripts: dict[str, Any], retry: RetryPolicy, req: Request) -> Any:
    # The first try runs outside tenacity: the happy path pays no retry bookkeeping.
    try:
        return _send_sync(client, scripts, req)
    except retry.retry_on:
        if retry.attempts == 1:
            raise
    time.sleep(retry.first_wait())
    for attempt in retry.sync(retries=True):
        with attempt:
            return _send_sync(client, scripts, req)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def run_sync(client: Any, scripts: dict[str, Any], retry: RetryPolicy, op: Op[T]) -> T:
    """Drive ``op`` to completion with blocking I/O."""
    try:
        req = next(op)
        while True:
            try:
                reply = _send_retrying_sync(client, scripts, retry, req)
            except rex.RedisError as exc:
                raise _translate(exc) from exc
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


async def _send_retrying_async(client: Any, scripts: dict[str, Any], retry: RetryPolicy, req: Request) -> Any:
    try:
        return await _send_async(client, scripts, req)
    except retry.retry_on:
        if retry.attempts == 1:
            raise
    await asyncio.sleep(retry.first_wait())
    async for attempt in retry.asyncio(retries=True):
        with attempt:
            return await _send_async(client, scripts, req)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


async def run_async(client: Any, scripts: dict[str, Any], retry: RetryPolicy, op: Op[T]) -> T:
    """Drive ``op`` to completion on the running event loop."""
    try:
        req = next(op)
        while True:
            try:
                reply = await _send_retrying_async(client, scripts, retry, req)
            except rex.RedisError as exc:
                raise _translate(exc) from exc
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


#: Members fetched per index and round trip by ``list_indexes``.
LIST_PAGE = 5000


def list_indexes(index_keys: Sequence[str]) -> Op[list[str]]:
    """Every member of the lex-ordered zsets ``index_keys``, sorted, paged (one pipeline per page)."""
    found: list[str] = []
    pending = {key: b"-" for key in index_keys}
    while pending:
        keys = list(pending)
        replies = yield Pipe([("ZRANGEBYLEX", key, pending[key], b"+", "LIMIT", 0, LIST_PAGE) for key in keys])
        pending = {}
        for key, page in zip(keys, replies, strict=True):
            found.extend(m.decode("utf-8") if isinstance(m, bytes) else str(m) for m in page)
            if len(page) == LIST_PAGE:
                pending[key] = b"(" + page[-1]
    found.sort()
    return found


def check_client(client: Any) -> None:
    """Refuse a client that would decode our binary blobs as text."""
    try:
        decode = client.get_encoder().decode_responses
    except AttributeError as exc:
        raise InvalidArgument(f"expected a redis-py client, got {type(client).__name__}") from exc
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


def _timeout_holders(client: Any) -> list[Any]:
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


def effective_socket_timeout(client: Any) -> float | None:
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


def block_slice_ms(client: Any) -> int | None:
    """Longest single blocking command (``XREAD BLOCK``) that stays well inside the client's read timeout.

    Half the timeout: the reply comes after the block plus a round trip and the server's own delay.
    None when the client has no read timeout (one block of any length is safe).
    """
    timeout = effective_socket_timeout(client)
    return None if timeout is None else max(1, int(timeout * 1000) // 2)


class _NonceSource:
    """Unique per-call identities: a random per-process prefix and a counter.

    Cheaper than ``os.urandom`` per call; the prefix is drawn again in a forked
    child so two processes never share one.
    """

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


#: A per-call identity that makes a re-sent write recognisable (not a secret).
new_nonce = _NonceSource()
os.register_at_fork(after_in_child=new_nonce.reseed)


class _Core(Protocol):
    @property
    def keys(self) -> Keys: ...


C = TypeVar("C", bound=_Core)


class StoreShell(Generic[C]):
    """What every store holds: its core, the client, the client's registered scripts, the retry policy.

    A store class is ``(<its own __init__ building the core>, SyncShell)`` or
    ``(..., AsyncShell)``; the only difference between the twins is ``_run``.
    """

    def __init__(self, client: Any, core: C, script_names: tuple[str, ...], retry: RetryPolicy | None) -> None:
        check_client(client)
        self._core: C = core
        self._client = client
        self._scripts: dict[str, Any] = scripts.register(client, script_names)
        self._retry = retry or RetryPolicy()

    @property
    def namespace(self) -> str:
        return self._core.keys.namespace

    @property
    def client(self) -> Any:
        return self._client


class SyncShell(StoreShell[C]):
    def _run(self, op: Op[T]) -> T:
        return run_sync(self._client, self._scripts, self._retry, op)


class AsyncShell(StoreShell[C]):
    async def _run(self, op: Op[T]) -> T:
        return await run_async(self._client, self._scripts, self._retry, op)
