"""The stores' shells: what every store holds, ``_run`` for the sync and asyncio twins, and the telemetry hook."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ..clients import AsyncClient, RedisClient, SyncClient
from ..errors import InvalidArgument
from ..keys import LAYOUT_SLOTS, Keys, check_shards
from . import eviction as _eviction
from . import scripts
from .client_checks import check_client, is_cluster_client
from .drivers import run_async, run_sync
from .lanes import laned
from .layout import resolve_layout
from .relocation import Relocation
from .replicas import DEFAULT_WAIT_TIMEOUT_MS, ReplicaAck
from .requests import Op, T
from .retry import RetryPolicy

__all__ = [
    "C",
    "TELEMETRY",
    "AsyncShell",
    "Observer",
    "StoreInternals",
    "StoreShell",
    "SyncShell",
    "Watch",
    "cancels",
    "check_cancel",
    "internals",
]


class _Core(Protocol):
    @property
    def keys(self) -> Keys: ...


C = TypeVar("C", bound=_Core)


#: Builds a reshard's op from keys of its own and whether the client is a Cluster's (``core.reshard.reshard``).
Mover = Callable[[Keys, bool], Op[Any]]


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
        shards: int | None = None,
    ) -> None:
        check_client(client, want_asyncio=self._ASYNCIO)
        if not isinstance(wait_replicas, int) or isinstance(wait_replicas, bool) or wait_replicas < 0:
            raise InvalidArgument(f"wait_replicas must be an int >= 0, got {wait_replicas!r}")
        if not isinstance(wait_timeout_ms, int) or isinstance(wait_timeout_ms, bool) or wait_timeout_ms < 1:
            # WAIT's timeout 0 blocks forever: never what a worker holding a lease wants.
            raise InvalidArgument(f"wait_timeout_ms must be an int >= 1, got {wait_timeout_ms!r}")
        #: The shard count asked for (``shards=``); None: the namespace's stored count (``wire/layout.py``).
        self._shards = None if shards is None else check_shards(shards)
        self._core: C = core
        self._client = client
        # With the short way of a call where the client allows it (``wire/lanes.py``).
        self._scripts: dict[str, Any] = laned(
            client, scripts.register(client, script_names + scripts.LAYOUT_SCRIPTS), asyncio=bool(self._ASYNCIO)
        )
        self._retry = retry or RetryPolicy()
        #: None: writes are not followed by WAIT (``wait_replicas=0``).
        self._ack = ReplicaAck(client, wait_replicas, wait_timeout_ms) if wait_replicas else None
        #: The server's maxmemory-policy is checked after the first operation that succeeds
        #: (``wire.eviction``): after, so a call to a server that does not answer stays within its
        #: retry bound (no extra attempt before it); successful, so the server does answer.
        self._eviction_unchecked = True
        #: How the drivers follow the namespace's shards through a reshard.
        self._moves = Relocation(core.keys)

    @property
    def namespace(self) -> str:
        return self._core.keys.namespace

    @property
    def shards(self) -> int | None:
        """The namespace's shard count: the stored one once an operation ran, else the one asked for."""
        return self._core.keys.count or self._shards

    def _mover(self, mover: Mover) -> tuple[Op[Any], dict[str, Any]]:
        """The op ``mover`` builds (a reshard, ``core/reshard.py``) and the scripts it runs: on keys of its
        own, so this store's keys follow the shards the way every other client's do."""
        keys = Keys.unresolved(self._core.keys.namespace)
        # Not resolve_layout: it would give a namespace that never existed a record (a typo'd name).
        op = mover(keys, is_cluster_client(self._client))
        return op, {**self._scripts, **scripts.register(self._client, scripts.RESHARD_SCRIPTS)}

    def _resharded(self, report: Any) -> Any:
        """``report`` of a finished reshard, after this store's keys took the new layout."""
        if self._core.keys.resolved:
            self._core.keys.configure(report.to_shards, LAYOUT_SLOTS)
        return report

    @property
    def telemetry_store(self) -> str:
        """The ``agentstate.store`` attribute of this store's spans and metrics (its core's kind)."""
        return getattr(self._core, "telemetry_store", "other")

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
        if not self._core.keys.resolved:
            self._layout()
        result = run_sync(self._client, self._scripts, self._retry, op, self._ack, self._moves)
        if self._eviction_unchecked:
            # After the first operation that succeeds: a server that does not answer keeps its retry bound.
            self._eviction_unchecked = False
            _eviction.check_sync(self._client)
        return result

    def _reshard(self, mover: Mover) -> Any:
        """Grow the namespace (the op ``mover`` builds, ``core/reshard.py``), driven without relocation."""
        op, names = self._mover(mover)
        return self._resharded(run_sync(self._client, names, self._retry, op, self._ack))

    def _layout(self) -> None:
        """Read the namespace's layout unless read already: once per store, before its first key is built
        (the record may be written, so it is acknowledged as a write)."""
        if not self._core.keys.resolved:
            run_sync(self._client, self._scripts, self._retry, resolve_layout(self._core.keys, self._shards), self._ack)

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
        if not self._core.keys.resolved:
            await self._layout()
        result = await run_async(self._client, self._scripts, self._retry, op, self._ack, self._moves)
        if self._eviction_unchecked:
            self._eviction_unchecked = False
            # A task of its own, not awaited here: a caller's timeout or cancellation must never
            # land on the check and lose the result of a write that applied.
            self._eviction_check = asyncio.ensure_future(_eviction.check_async(self._client))
        return result

    async def _reshard(self, mover: Mover) -> Any:
        """The asyncio twin of ``SyncShell._reshard``."""
        op, names = self._mover(mover)
        return self._resharded(await run_async(self._client, names, self._retry, op, self._ack))

    async def _layout(self) -> None:
        """The asyncio twin of ``SyncShell._layout`` (a cancel the read swallowed is raised by
        ``run_async``, before the operation it precedes starts)."""
        if not self._core.keys.resolved:
            layout = resolve_layout(self._core.keys, self._shards)
            await run_async(self._client, self._scripts, self._retry, layout, self._ack)

    @contextlib.contextmanager
    def _operation(self, name: str) -> Iterator[Callable[[Op[Any]], Awaitable[Any]]]:
        """The asyncio twin of ``SyncShell._operation`` (the runner returns an awaitable)."""
        observer = TELEMETRY
        if observer is None:
            yield self._drive
            return
        with observer.operation(self, name) as watch:
            yield lambda op: self._drive(watch(op))


def cancels() -> int:
    """Cancel requests pending on the current task (0 before Python 3.11, which does not count them)."""
    task = asyncio.current_task()
    counter = getattr(task, "cancelling", None)
    return int(counter()) if counter is not None else 0


def check_cancel(baseline: int) -> None:
    """Raise the cancel an await below us swallowed (redis-py 8.1 and fakeredis sometimes return
    normally from a round trip cancelled mid-way): a blocked caller must not wait out its block."""
    if cancels() > baseline:
        raise asyncio.CancelledError()


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


@dataclass(frozen=True)
class StoreInternals(Generic[C]):
    """The inside of one store (see :func:`internals`)."""

    #: The sans-I/O core: ``CheckpointCore``, ``PoolCore`` or ``KvCore``. Its ``keys`` builds every key.
    core: C
    #: redis-py ``Script`` objects (``AsyncScript`` for an asyncio store) by operation name; each has
    #: ``.sha`` and ``.script`` and is called as ``script(keys=..., args=..., client=...)``.
    scripts: Mapping[str, Any]
    #: The client the store was built with.
    client: Any
    #: The store's retry policy for connection errors.
    retry: RetryPolicy
    #: Drives an operation to completion the way the store's methods do (a coroutine function for
    #: an asyncio store).
    run: Callable[[Op[Any]], Any]


def internals(store: StoreShell[C], *, resolve: bool = True) -> StoreInternals[C]:
    """The core, registered scripts, client, retry policy and driver of ``store`` (any of the stores).

    The one way into a store from outside its module: the library's own tools (the ``agentstate``
    commands, the dashboard, the LangGraph worker and server) build operations on ``core`` and drive
    them with ``run``, exactly as the store's methods do; benchmarks and tests reach it through
    :mod:`redis_agentstate.testing`. Not for application code: its shape follows the internals.

    A sync store reads its namespace's layout here if no operation did yet (unless ``resolve`` is
    False), so the core's ``keys`` build keys at once; an asyncio store's core builds them after the
    store's first operation. ``run`` resolves the layout before the first operation it drives."""
    if not isinstance(store, StoreShell):
        raise TypeError(f"expected a store of redis_agentstate, got {type(store).__name__}")
    if resolve and isinstance(store, SyncShell) and not store._core.keys.resolved:
        store._layout()
    run: Callable[[Op[Any]], Any] = store._run  # type: ignore[attr-defined]
    return StoreInternals(store._core, store._scripts, store._client, store._retry, run)
