"""The dashboard's data: one collector per namespace, shared by every open page.

A collector reads what ``agentstate stats --watch`` reads, once a second (``counters``, ``due_head``,
``parked_tasks``, the concurrency limits: a few pipelined round trips whatever the namespace
holds), and sweeps the tasks' statuses (``status_counts``: a page per shard per round trip, each
bounded, keeping the first ``keep`` leased and waiting tasks) as often as it can while sweeping at
most a ``1 / DUTY`` share of the time: every second on a small namespace, every few seconds on one
of 100,000 tasks, so the live leases stay fresh without the page weighing on Redis. Pages
subscribe to its frames over server-sent events, so ten open pages cost Redis what one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from ..checkpoint import AsyncCheckpointStore
from ..core.stats import pulse, status_counts, status_fields
from ..errors import AgentStateError
from ..wire.shells import internals

__all__ = ["Collector"]

log = logging.getLogger("redis_agentstate.server")

#: Rows of leased, waiting and parked tasks a frame carries (the CLI lists them all).
KEEP = 50
#: Per-second rate points kept for the charts: ten minutes.
HISTORY = 600
#: A sweep starts ``DUTY`` times its last one's length after that one started (at most one in ``DUTY``).
DUTY = 4


def _row(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("task_id", "status", "cycle_index", "claim_token", "claimed_cycle", "lease_expires_at_ms",
            "lease_remaining_ms", "attempts", "last_failure", "due_in_ms", "priority", "corrupt")  # fmt: skip
    return {k: r.get(k) for k in keep}


class Collector:
    """Frames of one namespace: the latest, and the rates of the last ``HISTORY`` seconds."""

    def __init__(self, store: AsyncCheckpointStore, *, interval_s: float = 1.0) -> None:
        self.store, self.interval_s = store, interval_s
        #: Seconds between two sweeps' starts: DUTY times the last one's length, at least a frame's.
        self.sweep_every_s = interval_s
        self.latest: dict[str, Any] | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._sweep: dict[str, Any] = {}
        self._swept_at = 0.0
        self._previous: tuple[int, dict[str, int]] | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.version = 0

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"dashboard-{self.store.namespace}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def refresh_soon(self) -> None:
        """After an action: the next frame sweeps again, so the page shows its effect at once."""
        self._swept_at = 0.0

    async def next_frame(self, seen: int, timeout_s: float = 15.0) -> tuple[int, dict[str, Any] | None]:
        """The first frame newer than version ``seen`` (waiting up to ``timeout_s``), and its version."""
        self.start()
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version > seen), timeout_s)
            return self.version, self.latest

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                frame = await self._frame()
            except (AgentStateError, OSError) as exc:
                frame = {**(self.latest or {}), "error": f"Redis: {type(exc).__name__}"}
                log.warning("dashboard: namespace %r: %s", self.store.namespace, type(exc).__name__)
            async with self._changed:
                self.latest = frame
                self.version += 1
                self._changed.notify_all()
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    async def _frame(self) -> dict[str, Any]:
        inside = internals(self.store)
        core, run = inside.core, inside.run
        beat = await run(pulse(core, KEEP))
        rates = beat.rates(self._previous)
        if self._previous is not None and rates["claims"] is not None:
            self.history.append({"t": beat.now_ms, **rates})
        self._previous = beat.mark
        # Half a beat of slack: a sweep due before the next frame is made now, not a beat late.
        if time.monotonic() - self._swept_at >= self.sweep_every_s - self.interval_s / 2:
            began = time.monotonic()
            counts = await run(status_counts(core, keep=KEEP))
            self.sweep_every_s = max(self.interval_s, DUTY * (time.monotonic() - began))
            self._sweep = {
                "swept_at_ms": counts.now_ms,
                "sweep_every_s": round(self.sweep_every_s, 2),
                **status_fields(counts),
                "leased": [_row(r) for r in counts.leased],
                "waiting": [_row(r) for r in counts.waiting],
                "corrupt": dict(list(counts.corrupt.items())[:KEEP]),
            }
            self._swept_at = began
        return {
            "namespace": self.store.namespace,
            **self._sweep,
            **beat.fields(rates, _row),
            "history": list(self.history),
        }
