"""One Redis read per followed run, however many clients follow it.

Were each SSE client of a run to run its own ``AsyncRunQueue.stream`` (one blocking ``XREAD``, so
one pooled connection, per client), a hundred clients on one run would take the whole pool
(redis-py's default is 100 connections), and the server's own graph workers, which share the client, would
fail with "Too many connections" and break streams mid-run. Here the first follower of a run starts
a reader that reads the run's stream once, from its start, into a list; every follower walks that
list at its own pace (a slow one delays nobody) and skips what it has seen (``Last-Event-ID``). The
reader stops and the list is dropped when the last follower leaves, so memory is bounded by the runs
being followed and each run's event cap (``AsyncRunQueue(max_events=...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..langgraph._runs_core import RunEvent

if TYPE_CHECKING:
    from ..langgraph import AsyncRunQueue

__all__ = ["RunFeeds"]


def _order(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


class _Feed:
    """A run's events read so far, and the reader adding to them."""

    def __init__(self, queue: AsyncRunQueue, run_id: str) -> None:
        self.events: list[RunEvent] = []
        self.done = False
        self.error: BaseException | None = None
        self.followers = 0
        self.changed = asyncio.Condition()
        self.reader = asyncio.create_task(self._read(queue, run_id), name=f"agentstate-serve-feed-{run_id}")

    async def wait_past(self, seen: int) -> None:
        """Until there are more than ``seen`` events, or the reader stopped."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.done or len(self.events) > seen)

    async def _read(self, queue: AsyncRunQueue, run_id: str) -> None:
        try:
            async for ev in queue.stream(run_id):
                self.events.append(ev)
                async with self.changed:
                    self.changed.notify_all()
        except Exception as exc:
            self.error = exc
        finally:
            self.done = True
            async with self.changed:
                self.changed.notify_all()


class RunFeeds:
    """The runs followed now, each read once (see the module docstring)."""

    def __init__(self) -> None:
        self._feeds: dict[tuple[int, str], _Feed] = {}

    def __len__(self) -> int:
        return len(self._feeds)

    async def follow(self, queue: AsyncRunQueue, run_id: str, after: str | None = None) -> AsyncIterator[RunEvent]:
        """The run's events after ``after`` (all by default), live, ending after its final one; raises
        what the run's ``stream`` raised (``RunNotFound`` for an unknown run)."""
        key = (id(queue), run_id)
        feed = self._feeds.get(key)
        if feed is None or (feed.done and feed.error is not None):
            feed = self._feeds[key] = _Feed(queue, run_id)
        feed.followers += 1
        floor, i = (None if after is None else _order(after)), 0
        try:
            while True:
                while i < len(feed.events):
                    ev = feed.events[i]
                    i += 1
                    if floor is None or _order(ev.id) > floor:
                        yield ev
                if feed.done:
                    if feed.error is not None:
                        raise feed.error
                    return
                await feed.wait_past(i)
        finally:
            feed.followers -= 1
            if feed.followers == 0 and self._feeds.get(key) is feed:
                del self._feeds[key]
                if not feed.done:
                    feed.reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await feed.reader

    async def close(self) -> None:
        """Stop every reader (the server is shutting down)."""
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            feed.reader.cancel()
        for feed in feeds:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feed.reader
