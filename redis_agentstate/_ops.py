"""Sans-I/O plumbing: an operation is a generator that yields requests and returns a result.

Stores never hold logic of their own. A core method (e.g.
``CheckpointCore.commit``) is a generator: it validates, builds one request,
yields it, receives the raw reply, and either returns the parsed result or
yields a follow-up request. A request that fails is thrown into the op at
its ``yield`` as the library's error (``BackendError``, ``CorruptState``, ...),
so an op may recover from it; most let it propagate. ``run_sync`` and
``run_async`` are the only two places that talk to Redis, so the sync and async stores are three-line shells
and no rule can drift between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import math
import os
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

import redis.exceptions as rex
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from . import _eviction, scripts
from .clients import AsyncClient, RedisClient, SyncClient
from .errors import (
    AgentStateError,
    BackendError,
    BackendUnavailable,
    CorruptState,
    InvalidArgument,
    ReplicationUnsafe,
    WriteNotReplicated,
)
from .keys import Keys, describe_key

__all__ = [
    "TELEMETRY",
    "Batch",
    "Call",
    "Command",
    "Observer",
    "Op",
    "Pipe",
    "ReplicaAck",
    "RetryPolicy",
    "run_async",
    "run_sync",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One ``EVALSHA`` of a registered script.

    ``keys`` may be str or (encoded once, for a hot task) UTF-8 bytes: Redis sees the same key.
    """

    script: str
    keys: Sequence[str | bytes]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Pipe:
    """Independent read commands sent in one pipeline (one round trip per node).

    Reads only: every write is a script, declared in ``scripts.WRITES``.
    ``wrongtype_ok``: a command that meets a key of another Redis type answers
    its ``redis.ResponseError`` in place instead of failing the request (for a
    reader that can skip that key, as claim_next skips a corrupt shard index).
    """

    commands: Sequence[Sequence[Any]]
    wrongtype_ok: bool = False


@dataclass(frozen=True, slots=True)
class Batch:
    """Independent script calls sent in one pipeline, as ``EVALSHA``; the reply is the list of their replies.

    A script the server does not hold (NOSCRIPT: a ``SCRIPT FLUSH``, a
    fail-over to a fresh node) is loaded and only the calls that missed it
    are sent again, as redis-py's ``Script`` does for one call.
    """

    calls: Sequence[Call]


@dataclass(frozen=True, slots=True)
class Command:
    """One plain read command sent on its own, e.g. a blocking ``XREAD`` (never pipelined)."""

    args: Sequence[Any]


Request = Call | Batch | Pipe | Command
Op = Generator[Request, Any, T]

#: Errors after which the request may or may not have applied. Every request
#: this library sends is safe to re-send (see docs/design.md, "Retry-safe").
_TRANSIENT = (rex.ConnectionError, rex.TimeoutError, rex.TryAgainError, rex.ClusterDownError)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded, jittered retries of transient connection errors.

    ``attempts`` counts the first try; waits are full-jitter exponential between 0
    and ``max_wait_s``. ``max_delay_s`` is a deadline counted from the start of the
    call: no wait ends, and no attempt starts, after it. So a call returns or raises
    within ``max_delay_s`` plus the duration of one attempt, and one attempt is one
    redis-py call, bounded by the client's own settings: its ``Retry`` (redis-py 8
    retries 10 times by default, with backoff up to 1 s) and its
    ``socket_connect_timeout``/``socket_timeout`` (5 s by default). Build the client
    with ``retry=Retry(NoBackoff(), 0)`` and explicit timeouts to make the bound
    ``max_delay_s + socket_connect_timeout + socket_timeout`` (see :ref:`retries`).
    """

    attempts: int = 3
    max_wait_s: float = 0.5
    max_delay_s: float = 5.0
    multiplier_s: float = 0.05
    retry_on: tuple[type[BaseException], ...] = field(default=_TRANSIENT)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise InvalidArgument(f"RetryPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("max_wait_s", "max_delay_s", "multiplier_s"):
            value = getattr(self, name)
            # bool is an int, and NaN compares False with everything: both would slip past `< 0`.
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"RetryPolicy.{name} must be a finite number >= 0, got {value!r}")
        retry_on = self.retry_on
        if not isinstance(retry_on, tuple) or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in retry_on
        ):
            raise InvalidArgument(f"RetryPolicy.retry_on must be a tuple of exception classes, got {retry_on!r}")

    def _kwargs(self, started: float | None) -> dict[str, Any]:
        deadline = (time.monotonic() if started is None else started) + self.max_delay_s
        return {
            "stop": stop_after_attempt(self.attempts) | _StopBeforeDeadline(deadline),
            "wait": wait_random_exponential(multiplier=self.multiplier_s, max=self.max_wait_s),
            "retry": retry_if_exception_type(self.retry_on),
            "reraise": True,
        }

    def sync(self, started: float | None = None) -> Retrying:
        """The tenacity retrier of one call that began at ``started`` (``time.monotonic()``; default now)."""
        return Retrying(**self._kwargs(started))

    def asyncio(self, started: float | None = None) -> AsyncRetrying:
        """The asyncio twin of :meth:`sync`."""
        return AsyncRetrying(**self._kwargs(started))


class _StopBeforeDeadline(stop_base):
    """Stop when the next attempt would start at or after ``deadline`` (a ``time.monotonic()`` reading).

    tenacity's own ``stop_before_delay`` counts from its first attempt; ours counts
    from the call's start, so the first try (run outside tenacity) is inside it.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return time.monotonic() + retry_state.upcoming_sleep >= self.deadline


NO_RETRY = RetryPolicy(attempts=1)


def _translate(exc: rex.RedisError) -> BackendError:
    if isinstance(exc, _TRANSIENT):
        return BackendUnavailable(f"Redis unavailable: {exc}")
    return BackendError(f"Redis error: {exc}")


# ---- data under our keys that we did not write ---------------------------------
#
# Two ways to find it, worded the same on every server (Redis, Valkey and
# fakeredis word their own errors differently):
#
# * A script that checks what it reads before it writes answers with the error
#   reply ``AGENTSTATE_CORRUPT <i> <what>``: KEYS[i] holds a malformed
#   ``<what>`` (a field name). An error reply, so it reads the same whatever
#   the script's normal reply is.
# * A command that meets a key of another Redis type fails with WRONGTYPE,
#   which names no key. The driver then asks for the TYPE of every key of the
#   request and names the one that is not what ``keys.KEY_TYPES`` says. Only
#   failed requests pay for that; scripts that write make sure to fail this
#   way before their first write (see the probes in the Lua preludes).

#: The error-reply prefix of a script that found data it did not write (see above).
CORRUPT_REPLY = "AGENTSTATE_CORRUPT"
_OWNER_LABELS = {"task": "task", "pool": "agent pool", "key": "key/value key", "thread": "LangGraph thread"}


class _PipeCommandError(rex.ResponseError):
    """One command of a pipeline failed: keeps which one, so its keys can be named."""

    def __init__(self, command: Sequence[Any], error: rex.ResponseError) -> None:
        super().__init__(str(error))
        self.command = command
        self.error = error


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _command_keys(args: Sequence[Any]) -> list[str]:
    """The keys of one of the commands this library sends (the ACL list in the README is all of them)."""
    name = _text(args[0]).upper()
    if name == "EVALSHA":  # never EVAL: scripts go by SHA (and SCRIPT LOAD after a NOSCRIPT)
        return [_text(k) for k in args[3 : 3 + int(args[2])]]
    if name == "XREAD":
        streams = [_text(a).upper() for a in args].index("STREAMS")
        rest = args[streams + 1 :]
        return [_text(k) for k in rest[: len(rest) // 2]]
    if name in ("TIME", "TYPE") or len(args) < 2:
        return []
    return [_text(args[1])]


def request_keys(req: Request) -> list[str]:
    """Every key ``req`` touches."""
    if isinstance(req, Call):
        return [_text(k) for k in req.keys]
    if isinstance(req, Command):
        return _command_keys(req.args)
    if isinstance(req, Batch):
        return [_text(k) for call in req.calls for k in call.keys]
    return [k for cmd in req.commands for k in _command_keys(cmd)]


def corrupt_state(key: str, keys: Sequence[str], detail: str) -> CorruptState:
    """``CorruptState`` naming ``key`` and the task, pool or key/value key it belongs to.

    A shard-wide key (an index) belongs to nobody: the owner is then taken
    from the other keys of the request, e.g. the task a claim was for.
    """
    owner, task_id = "shard index", None
    for k in (key, *keys):
        _, kind, ident = describe_key(k)
        if kind is not None and ident is not None:
            owner = f"{_OWNER_LABELS[kind]} {ident!r}"
            task_id = ident if kind == "task" else None
            break
    return CorruptState(
        f"{key!r} ({owner}) {detail}: not data redis_agentstate wrote; nothing was written",
        key=key,
        task_id=task_id,
    )


def _explain(req: Request, exc: rex.RedisError) -> Op[BackendError | CorruptState]:
    """The library error for ``exc``, which ``req`` raised; may ask Redis for key types first."""
    if isinstance(exc, _PipeCommandError):
        req, exc = Command(exc.command), exc.error
    message = str(exc)
    if isinstance(exc, rex.ResponseError) and message.startswith(CORRUPT_REPLY + " "):
        _, index, what = message.split(" ", 2)
        keys = request_keys(req)
        return corrupt_state(keys[int(index) - 1], keys, f"holds a malformed {what}")
    if isinstance(exc, rex.ResponseError) and "WRONGTYPE" in message:
        keys = list(dict.fromkeys(request_keys(req)))
        if keys:
            found = yield Pipe([("TYPE", k) for k in keys])
            for key, kind in zip(keys, found, strict=True):
                expected = describe_key(key)[0]
                if expected is not None and _text(kind) not in ("none", expected):
                    return corrupt_state(key, keys, f"is a Redis {_text(kind)} where the library keeps a {expected}")
    return _translate(exc)


def _raise_first_error(commands: Sequence[Sequence[Any]], replies: list[Any], wrongtype_ok: bool = False) -> list[Any]:
    for cmd, reply in zip(commands, replies, strict=True):
        if wrongtype_ok and isinstance(reply, rex.ResponseError) and str(reply).startswith("WRONGTYPE"):
            continue
        if isinstance(reply, rex.ResponseError):
            raise _PipeCommandError(cmd, reply)
        if isinstance(reply, Exception):
            raise reply
    return replies


def _evalsha(scripts: dict[str, Any], call: Call) -> tuple[Any, ...]:
    return ("EVALSHA", scripts[call.script].sha, len(call.keys), *call.keys, *call.args)


def _missed(req: Batch, replies: list[Any]) -> list[int]:
    """Indexes of the calls of ``req`` that met NOSCRIPT."""
    return [i for i, reply in enumerate(replies) if isinstance(reply, rex.NoScriptError)]


def _pipeline_sync(client: SyncClient, entries: Sequence[tuple[Sequence[Any], dict[str, Any]]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for cmd, options in entries:
        pipe.execute_command(*cmd, **options)
    return cast(list[Any], pipe.execute(raise_on_error=False))


async def _pipeline_async(client: AsyncClient, entries: Sequence[tuple[Sequence[Any], dict[str, Any]]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for cmd, options in entries:
        pipe.execute_command(*cmd, **options)
    return cast(list[Any], await pipe.execute(raise_on_error=False))


def _send_batch_sync(
    client: SyncClient, scripts: dict[str, Any], req: Batch, ack: ReplicaAck | None = None
) -> tuple[list[Any], list[Any]]:
    """The replies of ``req``'s calls, and of the waits ``ack`` adds after them (see ``ReplicaAck``)."""
    commands = [_evalsha(scripts, call) for call in req.calls]
    routes, owners = ack.routes(client, req.calls) if ack else ([], [])
    waits = ack.entries(routes) if ack else []
    replies = _pipeline_sync(client, [*((cmd, {}) for cmd in commands), *waits])
    replies, waited = replies[: len(commands)], replies[len(commands) :]
    missed = _missed(req, replies)
    if missed:
        for name in dict.fromkeys(req.calls[i].script for i in missed):
            scripts[name].sha = client.script_load(scripts[name].script)
        for i in missed:
            commands[i] = _evalsha(scripts, req.calls[i])
        if ack and len(missed) < len(commands):
            # The calls that ran the first time were waited for by that pipeline's waits
            # (the re-send may use another connection, whose WAIT would not cover them).
            ack.verify(client, req.calls, routes, owners, waited)
        again = _pipeline_sync(client, [*((commands[i], {}) for i in missed), *waits])
        for i, reply in zip(missed, again, strict=False):
            replies[i] = reply
        waited = again[len(missed) :]
    replies = _raise_first_error(commands, replies)
    if ack:
        ack.verify(client, req.calls, routes, owners, waited)
    return replies, waited


async def _send_batch_async(
    client: AsyncClient, scripts: dict[str, Any], req: Batch, ack: ReplicaAck | None = None
) -> tuple[list[Any], list[Any]]:
    commands = [_evalsha(scripts, call) for call in req.calls]
    routes, owners = ack.routes(client, req.calls) if ack else ([], [])
    waits = ack.entries(routes) if ack else []
    replies = await _pipeline_async(client, [*((cmd, {}) for cmd in commands), *waits])
    replies, waited = replies[: len(commands)], replies[len(commands) :]
    missed = _missed(req, replies)
    if missed:
        for name in dict.fromkeys(req.calls[i].script for i in missed):
            scripts[name].sha = await client.script_load(scripts[name].script)
        for i in missed:
            commands[i] = _evalsha(scripts, req.calls[i])
        if ack and len(missed) < len(commands):
            # The calls that ran the first time were waited for by that pipeline's waits
            # (the re-send may use another connection, whose WAIT would not cover them).
            ack.verify(client, req.calls, routes, owners, waited)
        again = await _pipeline_async(client, [*((commands[i], {}) for i in missed), *waits])
        for i, reply in zip(missed, again, strict=False):
            replies[i] = reply
        waited = again[len(missed) :]
    replies = _raise_first_error(commands, replies)
    if ack:
        ack.verify(client, req.calls, routes, owners, waited)
    return replies, waited


# ---- replica acknowledgement (wait_replicas) -----------------------------------
#
# A write of a store with ``wait_replicas=n`` goes out as one pipeline: its
# EVALSHA(s), then ``WAIT n timeout`` (and ``WAITAOF 1 0 timeout`` where the
# server has it and the primary's AOF is on) on the same connection, so WAIT
# waits for exactly the replication offset the write reached. On Redis Cluster
# a keyless WAIT would go to a random node: each is sent with ``target_nodes``
# set to the primary owning the write's slot, and redis-py's cluster pipeline
# runs a node's commands in order on one connection. Which requests are writes
# is ``scripts.WRITES``; the rest is sent as before.

#: Default ``wait_timeout_ms``. Replicas on a healthy network acknowledge within a
#: few ms; 1 s absorbs a replica's fork or a GC-like stall without failing the write.
#: WAITAOF does not wait for the next ``everysec`` tick (measured well under 1 ms on
#: Valkey 8.1, see docs/durability.md). Worst case a write
#: blocks 2 s (WAIT, then WAITAOF), inside redis-py's default 5 s read timeout, so the
#: client never gives up on the reply (and re-sends the write) before WAIT answers.
DEFAULT_WAIT_TIMEOUT_MS = 1000

#: The first server version with WAITAOF (Valkey 8 reports redis_version 7.2.4).
_WAITAOF_SINCE = (7, 2)


def _is_cluster(client: object) -> bool:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def _version(text: Any) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in _text(text).split(".")[:2])
    except ValueError:
        return (0,)


class ReplicaAck:
    """A store's ``wait_replicas``/``wait_timeout_ms``, and what its first write learnt of the server.

    The checks are pure (``learn``, ``verify``); the drivers only fetch ``INFO`` and send.
    """

    def __init__(self, client: object, replicas: int, timeout_ms: int) -> None:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InvalidArgument(f"ReplicaAck needs wait_replicas >= 1, got {replicas!r}")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 1:
            # WAIT's timeout 0 blocks forever: never what a worker holding a lease wants.
            raise InvalidArgument(f"wait_timeout_ms must be an int >= 1, got {timeout_ms!r}")
        if type(client).__module__.startswith("fakeredis"):
            raise ReplicationUnsafe(
                f"wait_replicas={replicas} needs a Redis server with replicas; fakeredis has no WAIT or replication"
            )
        socket_timeout = effective_socket_timeout(client)
        if socket_timeout is not None and 2 * timeout_ms >= socket_timeout * 1000:
            raise InvalidArgument(
                f"wait_timeout_ms={timeout_ms} needs the client's socket_timeout above {2 * timeout_ms / 1000:g} s "
                f"(it is {socket_timeout:g} s): a write waits up to twice wait_timeout_ms (WAIT, then WAITAOF), "
                f"and a read timeout first would re-send the write"
            )
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.checked = False
        #: Also ``WAITAOF 1 0``: the server has it and every primary has its AOF on.
        self.aof = False

    def learn(self, infos: dict[str, dict[str, Any]]) -> None:
        """Check the setup from each primary's ``INFO server replication persistence`` (node name -> dict).

        Raises ``ReplicationUnsafe`` (nothing written yet) when a primary could never give
        ``replicas`` acknowledgements: every write would time out.
        """
        if not infos:
            raise ReplicationUnsafe(f"wait_replicas={self.replicas}: the client knows no primary to check")
        aof = True
        for node, info in infos.items():
            role = _text(info.get("role", "?"))
            if role != "master":
                raise ReplicationUnsafe(
                    f"wait_replicas={self.replicas}: {node} is a {role}, not a primary; nothing was written"
                )
            online = sum(
                1
                for name, value in info.items()
                if _text(name).startswith("slave") and isinstance(value, dict) and _text(value.get("state")) == "online"
            )
            if online < self.replicas:
                raise ReplicationUnsafe(
                    f"wait_replicas={self.replicas}, but {node} has {online} replica(s) online "
                    f"(connected_slaves={info.get('connected_slaves', 0)}): every write would time out waiting "
                    f"for them; nothing was written. Add replicas or lower wait_replicas."
                )
            aof = aof and _version(info.get("redis_version", "0")) >= _WAITAOF_SINCE and info.get("aof_enabled") == 1
        self.aof = aof
        self.checked = True

    def waits(self) -> list[tuple[Any, ...]]:
        """The commands that follow a write on its node."""
        waits: list[tuple[Any, ...]] = [("WAIT", self.replicas, self.timeout_ms)]
        if self.aof:
            waits.append(("WAITAOF", 1, 0, self.timeout_ms))
        return waits

    def routes(self, client: object, calls: Sequence[Call]) -> tuple[list[Any], list[str | None]]:
        """Where the waits go, and each call's node at send time.

        One node: ``[None]``. A cluster: each primary owning a call's slot (one WAIT per node).
        """
        if not _is_cluster(client):
            return [None], [None] * len(calls)
        nodes: dict[str, Any] = {}
        owners: list[str | None] = []
        for call in calls:
            node = cast(Any, client).get_node_from_key(call.keys[0])
            nodes.setdefault(node.name, node)
            owners.append(node.name)
        return list(nodes.values()), owners

    def entries(self, routes: list[Any]) -> list[tuple[Sequence[Any], dict[str, Any]]]:
        """The waits that follow a write's EVALSHAs in its pipeline, each with its pipeline options."""
        out: list[tuple[Sequence[Any], dict[str, Any]]] = []
        for node in routes:
            options = {} if node is None else {"target_nodes": node}
            out.extend((wait, options) for wait in self.waits())
        return out

    def verify(
        self, client: object, calls: Sequence[Call], routes: list[Any], owners: list[str | None], replies: list[Any]
    ) -> None:
        """Raise ``WriteNotReplicated`` unless every node acknowledged (``replies``: the waits' replies, in order)."""
        per_node = len(self.waits())
        acknowledged = self.replicas
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        for i in range(len(routes)):
            got = replies[i * per_node : (i + 1) * per_node]
            count = got[0] if isinstance(got[0], int) and not isinstance(got[0], bool) else 0
            if per_node == 2 and not (isinstance(got[1], list) and got[1] and got[1][0] == 1):
                count = 0  # WAITAOF's [local, replicas]: the primary did not fsync in time
            acknowledged = min(acknowledged, count)
        if _is_cluster(client):
            for call, owner in zip(calls, owners, strict=True):
                if cast(Any, client).get_node_from_key(call.keys[0]).name != owner:
                    # A redirect (MOVED/ASK) re-sent this write to another node, without its WAIT.
                    acknowledged = 0
        if acknowledged >= self.replicas:
            return
        key = _text(calls[0].keys[0]) if calls and calls[0].keys else None
        kind, ident = describe_key(key)[1:] if key is not None else (None, None)
        what = f"{_OWNER_LABELS[kind]} {ident!r}" if kind is not None and ident is not None else "a write"
        raise WriteNotReplicated(
            f"{what}: {acknowledged} of {self.replicas} replica(s) acknowledged within {self.timeout_ms} ms"
            f"{' (or the AOF fsync did not)' if self.aof else ''}"
            f"{f' (WAIT failed: {failed})' if failed is not None else ''}; the write may still have applied: "
            f"re-send it to learn its outcome",
            acknowledged=acknowledged,
            required=self.replicas,
            task_id=ident if kind == "task" else None,
            key=key,
        )


#: The INFO sections ``ReplicaAck.learn`` reads.
_INFO = ("INFO", "server", "replication", "persistence")


def _info_targets(client: object) -> list[Any]:
    return list(cast(Any, client).get_primaries()) if _is_cluster(client) else [None]


def _learn_sync(client: SyncClient, ack: ReplicaAck) -> None:
    infos: dict[str, dict[str, Any]] = {}
    try:
        for node in _info_targets(client):
            options = {} if node is None else {"target_nodes": node}
            infos["the primary" if node is None else f"primary {node.name}"] = cast(Any, client).execute_command(
                *_INFO, **options
            )
    except rex.ResponseError as exc:
        raise ReplicationUnsafe(
            f"wait_replicas={ack.replicas}: could not read the server's replication state ({exc}); "
            f"the client needs the INFO command; nothing was written"
        ) from exc
    ack.learn(infos)


async def _learn_async(client: AsyncClient, ack: ReplicaAck) -> None:
    infos: dict[str, dict[str, Any]] = {}
    if _is_cluster(client):
        # An asyncio RedisCluster learns its nodes on first use; the routing of WAITs needs them now.
        await cast(Any, client).initialize()
    try:
        for node in _info_targets(client):
            options = {} if node is None else {"target_nodes": node}
            infos["the primary" if node is None else f"primary {node.name}"] = await cast(Any, client).execute_command(
                *_INFO, **options
            )
    except rex.ResponseError as exc:
        raise ReplicationUnsafe(
            f"wait_replicas={ack.replicas}: could not read the server's replication state ({exc}); "
            f"the client needs the INFO command; nothing was written"
        ) from exc
    ack.learn(infos)


def _write_calls(req: Request) -> list[Call] | None:
    """The script calls of ``req`` if it is a write (``scripts.WRITES``), else None."""
    if isinstance(req, Call):
        return [req] if req.script in scripts.WRITES else None
    if isinstance(req, Batch) and any(call.script in scripts.WRITES for call in req.calls):
        return list(req.calls)
    return None


def _send_acked_sync(client: SyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck) -> Any:
    calls = _write_calls(req)
    if calls is None:
        return _send_sync(client, scripts, req)
    if not ack.checked:
        _learn_sync(client, ack)
    replies, _ = _send_batch_sync(client, scripts, Batch(calls), ack)
    return replies[0] if isinstance(req, Call) else replies


async def _send_acked_async(client: AsyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck) -> Any:
    calls = _write_calls(req)
    if calls is None:
        return await _send_async(client, scripts, req)
    if not ack.checked:
        await _learn_async(client, ack)
    replies, _ = await _send_batch_async(client, scripts, Batch(calls), ack)
    return replies[0] if isinstance(req, Call) else replies


def _send_sync(client: SyncClient, scripts: dict[str, Any], req: Request) -> Any:
    if isinstance(req, Call):
        return scripts[req.script](keys=req.keys, args=req.args, client=client)
    if isinstance(req, Batch):
        return _send_batch_sync(client, scripts, req)[0]
    if isinstance(req, Command):
        return client.execute_command(*req.args)
    pipe = client.pipeline(transaction=False)
    for cmd in req.commands:
        pipe.execute_command(*cmd)
    return _raise_first_error(req.commands, pipe.execute(raise_on_error=False), req.wrongtype_ok)


async def _send_async(client: AsyncClient, scripts: dict[str, Any], req: Request) -> Any:
    if isinstance(req, Call):
        return await scripts[req.script](keys=req.keys, args=req.args, client=client)
    if isinstance(req, Batch):
        return (await _send_batch_async(client, scripts, req))[0]
    if isinstance(req, Command):
        return await client.execute_command(*req.args)
    pipe = client.pipeline(transaction=False)
    for cmd in req.commands:
        pipe.execute_command(*cmd)
    return _raise_first_error(req.commands, await pipe.execute(raise_on_error=False), req.wrongtype_ok)


def _send_one_sync(client: SyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck | None) -> Any:
    return _send_sync(client, scripts, req) if ack is None else _send_acked_sync(client, scripts, req, ack)


async def _send_one_async(client: AsyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck | None) -> Any:
    return await (_send_async(client, scripts, req) if ack is None else _send_acked_async(client, scripts, req, ack))


def _retry_sync(
    client: SyncClient,
    scripts: dict[str, Any],
    retry: RetryPolicy,
    req: Request,
    ack: ReplicaAck | None,
    started: float,
    failed: BaseException | None,
) -> Any:
    """Re-send ``req`` after its first try (begun at ``started``) failed with ``failed``, per ``retry``."""
    for attempt in retry.sync(started):
        with attempt:
            if failed is not None:
                # tenacity's attempt 1 is the failure above: it decides from there whether to wait and re-send.
                first, failed = failed, None
                raise first
            return _send_one_sync(client, scripts, req, ack)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def run_sync(
    client: SyncClient, scripts: dict[str, Any], retry: RetryPolicy, op: Op[T], ack: ReplicaAck | None = None
) -> T:
    """Drive ``op`` to completion with blocking I/O; ``ack``: wait for replicas after each write."""
    try:
        req = next(op)
        while True:
            # The first try runs outside tenacity, so the happy path pays no retry bookkeeping;
            # the deadline counts from its start all the same (redis-py's own retries and
            # connect timeouts inside it are within max_delay_s, not on top of it).
            started = time.monotonic()
            try:
                try:
                    if ack is None:
                        reply = _send_sync(client, scripts, req)
                    else:
                        reply = _send_acked_sync(client, scripts, req, ack)
                except retry.retry_on as exc:
                    reply = _retry_sync(client, scripts, retry, req, ack, started, exc)
            except rex.RedisError as exc:
                # Thrown into the op, which may recover (claim_next skips a corrupt task).
                req = op.throw(_caused(_error_sync(client, scripts, req, exc), exc))
                continue
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


def _caused(error: AgentStateError, cause: rex.RedisError) -> AgentStateError:
    """``error`` as if raised ``from cause`` (it is thrown into the op, not raised here)."""
    error.__cause__ = cause
    return error


def _error_sync(client: SyncClient, scripts: dict[str, Any], req: Request, exc: rex.RedisError) -> AgentStateError:
    try:
        return run_sync(client, scripts, NO_RETRY, _explain(req, exc))
    except AgentStateError:
        return _translate(exc)  # Redis failed again while we looked: report the first error


async def _error_async(
    client: AsyncClient, scripts: dict[str, Any], req: Request, exc: rex.RedisError
) -> AgentStateError:
    try:
        return await run_async(client, scripts, NO_RETRY, _explain(req, exc))
    except AgentStateError:
        return _translate(exc)


async def _retry_async(
    client: AsyncClient,
    scripts: dict[str, Any],
    retry: RetryPolicy,
    req: Request,
    ack: ReplicaAck | None,
    started: float,
    failed: BaseException | None,
) -> Any:
    """The asyncio twin of :func:`_retry_sync`."""
    async for attempt in retry.asyncio(started):
        with attempt:
            if failed is not None:
                first, failed = failed, None
                raise first
            return await _send_one_async(client, scripts, req, ack)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


async def run_async(
    client: AsyncClient, scripts: dict[str, Any], retry: RetryPolicy, op: Op[T], ack: ReplicaAck | None = None
) -> T:
    """Drive ``op`` to completion on the running event loop; ``ack``: wait for replicas after each write."""
    try:
        req = next(op)
        while True:
            started = time.monotonic()  # as run_sync: the first try outside tenacity
            try:
                try:
                    if ack is None and type(req) is Call:
                        # The hot path, inlined: one coroutine fewer per script call than via _send_async.
                        reply = await scripts[req.script](keys=req.keys, args=req.args, client=client)
                    elif ack is None:
                        reply = await _send_async(client, scripts, req)
                    else:
                        reply = await _send_acked_async(client, scripts, req, ack)
                except retry.retry_on as exc:
                    reply = await _retry_async(client, scripts, retry, req, ack, started, exc)
            except rex.RedisError as exc:
                req = op.throw(_caused(await _error_async(client, scripts, req, exc), exc))
                continue
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


def member_id(member: Any, key: str) -> str:
    """An id read from index ``key``; every id the library stores is UTF-8, so anything else is corrupt."""
    if not isinstance(member, bytes):
        return str(member)
    try:
        return member.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise corrupt_state(key, [key], f"holds an id that is not UTF-8: {member!r:.80}") from exc


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
            found.extend(member_id(m, key) for m in page)
            if len(page) == LIST_PAGE:
                pending[key] = b"(" + page[-1]
    found.sort()
    return found


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
    ``(..., AsyncShell)``; the only difference between the twins is ``_run`` (and the
    client flavor each accepts).
    """

    #: True: needs a ``redis.asyncio`` client; False: a sync one (set by the twins).
    _ASYNCIO: ClassVar[bool | None] = None

    _client: RedisClient

    def __init__(
        self,
        client: RedisClient,
        core: C,
        script_names: tuple[str, ...],
        retry: RetryPolicy | None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        check_client(client, want_asyncio=self._ASYNCIO)
        if not isinstance(wait_replicas, int) or isinstance(wait_replicas, bool) or wait_replicas < 0:
            raise InvalidArgument(f"wait_replicas must be an int >= 0, got {wait_replicas!r}")
        if not isinstance(wait_timeout_ms, int) or isinstance(wait_timeout_ms, bool) or wait_timeout_ms < 1:
            # WAIT's timeout 0 blocks forever: never what a worker holding a lease wants.
            raise InvalidArgument(f"wait_timeout_ms must be an int >= 1, got {wait_timeout_ms!r}")
        self._core: C = core
        self._client = client
        self._scripts: dict[str, Any] = scripts.register(client, script_names)
        self._retry = retry or RetryPolicy()
        #: None: writes are not followed by WAIT (``wait_replicas=0``).
        self._ack = ReplicaAck(client, wait_replicas, wait_timeout_ms) if wait_replicas else None
        #: The server's maxmemory-policy is checked after the first operation that succeeds
        #: (``_eviction``): after, so a call to a server that does not answer stays within its
        #: retry bound (no extra attempt before it); successful, so the server does answer.
        self._eviction_unchecked = True

    @property
    def namespace(self) -> str:
        return self._core.keys.namespace

    @property
    def client(self) -> Any:
        """The client the store was built with (typed ``Any`` so its whole command API stays usable)."""
        return self._client


class SyncShell(StoreShell[C]):
    _ASYNCIO = False
    _client: SyncClient  # checked in __init__

    def _run(self, op: Op[T]) -> T:
        # Every store operation passes here once (run_sync also drives internal follow-ups,
        # which are part of the operation): the one place telemetry wraps. Disabled, it
        # costs this global read and compare.
        observer = TELEMETRY
        if observer is None:
            return self._drive(op)
        return observer.run_sync(self, op)

    def _drive(self, op: Op[T]) -> T:
        """``op`` run as ``_run`` runs it without telemetry (the observer's way in)."""
        result = run_sync(self._client, self._scripts, self._retry, op, self._ack)
        if self._eviction_unchecked:
            # After the first operation that succeeds: a server that does not answer keeps its retry bound.
            self._eviction_unchecked = False
            _eviction.check_sync(self._client)
        return result

    @contextlib.contextmanager
    def _operation(self, name: str) -> Iterator[Callable[[Op[Any]], Any]]:
        """A runner of ops (as ``_run``) that together make one public call ``name``: one operation to
        telemetry (one span, one duration), e.g. the probes of a blocked ``claim_next`` at each wake-up."""
        observer = TELEMETRY
        if observer is None:
            yield self._drive
            return
        with observer.operation(self, name) as watch:
            yield lambda op: self._drive(watch(op))


class AsyncShell(StoreShell[C]):
    _ASYNCIO = True
    _client: AsyncClient  # checked in __init__

    #: The eviction check of an asyncio store, running beside the caller (see ``_run``).
    _eviction_check: asyncio.Task[None] | None = None

    async def _run(self, op: Op[T]) -> T:
        observer = TELEMETRY
        if observer is None:
            return await self._drive(op)
        return await observer.run_async(self, op)

    async def _drive(self, op: Op[T]) -> T:
        """``op`` run as ``_run`` runs it without telemetry (the observer's way in)."""
        result = await run_async(self._client, self._scripts, self._retry, op, self._ack)
        if self._eviction_unchecked:
            self._eviction_unchecked = False
            # A task of its own, not awaited here: a caller's timeout or cancellation must never
            # land on the check and lose the result of a write that applied.
            self._eviction_check = asyncio.ensure_future(_eviction.check_async(self._client))
        return result

    @contextlib.contextmanager
    def _operation(self, name: str) -> Iterator[Callable[[Op[Any]], Awaitable[Any]]]:
        """The asyncio twin of ``SyncShell._operation`` (the runner returns an awaitable)."""
        observer = TELEMETRY
        if observer is None:
            yield self._drive
            return
        with observer.operation(self, name) as watch:
            yield lambda op: self._drive(watch(op))


# ---- telemetry hook ---------------------------------------------------------------
#
# ``redis_agentstate.telemetry.instrument()`` sets TELEMETRY; nothing else does.
# This module never imports OpenTelemetry: while TELEMETRY is None (the extra not
# installed, or not enabled) a store operation pays one global read and compare.


#: Wraps an op so that its requests and replies count towards an operation under way.
Watch = Callable[[Op[Any]], Op[Any]]


class Observer(Protocol):
    """What ``telemetry.instrument()`` installs: wraps every store operation, hears of lease events."""

    def run_sync(self, shell: SyncShell[Any], op: Op[T]) -> T: ...

    async def run_async(self, shell: AsyncShell[Any], op: Op[T]) -> T: ...

    def lease_lost(self, namespace: str, *, fenced: bool) -> None: ...

    def operation(self, shell: StoreShell[Any], name: str) -> contextlib.AbstractContextManager[Watch]: ...


#: The installed observer; None: telemetry is off.
TELEMETRY: Observer | None = None
