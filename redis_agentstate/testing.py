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

from typing import Any

from .wire import Call, Command, Op, T
from .wire.shells import StoreInternals, internals

__all__ = ["Call", "Command", "Op", "StoreInternals", "finish", "first_call", "internals"]


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
