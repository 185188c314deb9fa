"""Low-level hooks for benchmarks and tests that drive the library's own operations by hand.

Not for application code, and not covered by the stability promise of the
stores' API: what :func:`internals` returns changes shape when the library's
internals do. It exists so the benchmarks (``benchmarks/``) and tests have one
supported seam to the inside of a store instead of reaching for its private
attributes, and so that seam is changed, and type-checked, with the code.

A store is a thin shell over a sans-I/O *core*: each core method returns an
*operation*, a generator that yields requests (:class:`Call`: one script
``EVALSHA``; or a pipeline or a single command) and is sent their replies.
With :func:`internals`, :func:`first_call` and :func:`finish`, a benchmark can
build the exact request a store method would send, send it its own way (or
not at all), and parse the reply with the library's code::

    inside = internals(store)
    op = inside.core.claim("task-1", 1, token="w", lease_ms=30_000)
    call = first_call(op)
    reply = inside.scripts[call.script](keys=call.keys, args=call.args, client=inside.client)
    checkpoint = finish(op, reply)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from .wire import C, Call, Command, Op, RetryPolicy, StoreShell, SyncShell, T

__all__ = ["Call", "Command", "Op", "StoreInternals", "finish", "first_call", "internals"]


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


def internals(store: StoreShell[C]) -> StoreInternals[C]:
    """The core, registered scripts, client, retry policy and driver of ``store`` (any of the stores).

    A sync store reads its namespace's layout here if no operation did yet, so the core's ``keys``
    build keys at once; an asyncio store's core builds them after the store's first operation."""
    if not isinstance(store, StoreShell):
        raise TypeError(f"expected a store of redis_agentstate, got {type(store).__name__}")
    if isinstance(store, SyncShell):
        store._layout()
    run: Callable[[Op[Any]], Any] = store._run  # type: ignore[attr-defined]
    return StoreInternals(store._core, store._scripts, store._client, store._retry, run)


def first_call(op: Op[Any]) -> Call:
    """The first request of ``op``, which must be a script call (claim, commit, ...)."""
    req = next(op)
    if not isinstance(req, Call):
        op.close()
        raise TypeError(f"expected a script call, got {type(req).__name__}")
    return req


def finish(op: Op[T], reply: Any) -> T:
    """Feed ``op`` the reply of its first (and only) request; its result."""
    try:
        op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    op.close()
    raise RuntimeError("operation asked for a second request")
