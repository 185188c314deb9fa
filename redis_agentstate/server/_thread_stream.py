"""``GET /threads/{id}/stream`` of ``agentstate serve`` (``threads.join_stream``): one event stream
of every run of a thread, as LangGraph's server joins a thread.

It follows the thread's runs in the order they were created: each run that had not ended when
the stream was opened (from its first event), then each run created later, as it runs. Every event
of a run is sent as the run's own stream sends it (``run_modes``), and after its last one a
``metadata`` event ``{"status": "run_done", "run_id": ...}``; ``lifecycle`` sends the
``metadata`` events only. The stream stays open (a comment every ``HEARTBEAT_S`` while nothing
happens, so a gone client is noticed) until the client leaves or the thread is deleted. New runs
are looked for every ``POLL_S`` while none is followed (one bounded read of the thread's runs).
Its events carry no ``id``: a run's event ids do not order events across runs, so there is no
``Last-Event-ID`` to resume from (one sent is a 422).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..langgraph.errors import RunNotFound
from ._shapes import sse

if TYPE_CHECKING:
    from ._served import App, ServedGraph

__all__ = ["HEARTBEAT_S", "POLL_S", "thread_stream_route"]

#: How often a stream that follows no run looks for a new one.
POLL_S = 0.5
#: How long an idle stream waits before a heartbeat comment.
HEARTBEAT_S = 15.0
_MODES = ("run_modes", "lifecycle", "state_update")


def _modes(request: Request) -> set[str]:
    """The modes asked (``stream_modes``, comma-separated, as LangGraph's server reads them; or
    ``stream_mode``, repeated, as ``langgraph-sdk`` sends them); ``run_modes`` by default."""
    raw = [m for v in request.query_params.getlist("stream_modes") for m in v.split(",")]
    raw += request.query_params.getlist("stream_mode")
    modes = {m.strip() for m in raw if m.strip()} or {"run_modes"}
    for m in modes:
        if m not in _MODES:
            raise HTTPException(422, f"Invalid stream mode: {m} (one of {', '.join(_MODES)})")
    if "state_update" in modes:
        raise HTTPException(422, "stream mode 'state_update' is not served by agentstate serve")
    return modes


def thread_stream_route(app: App) -> Callable[[Request], Awaitable[Response]]:
    """The route's handler, on ``app``."""

    async def handler(request: Request) -> Response:
        tid = request.path_params["tid"]
        rec = await app.book.need_record(tid)
        if request.headers.get("last-event-id"):
            raise HTTPException(422, "a thread stream cannot resume after Last-Event-ID (join a run's stream)")
        modes = _modes(request)
        if app.streams.locked():
            raise HTTPException(503, "too many open event streams")
        # The runs that ended before the stream opened, read before its headers are sent: a run a
        # client creates once it has them is followed.
        g = app.book.graph_of(rec)
        ended = set() if g is None else {r.run_id for r in await g.queue.list(tid, limit=100) if r.done}
        return StreamingResponse(_body(app, tid, modes, ended), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})  # fmt: skip

    return handler


async def _body(app: App, tid: str, modes: set[str], seen: set[str]) -> AsyncIterator[bytes]:
    everything = "run_modes" in modes
    async with app.streams:
        idle = 0.0
        while True:
            rec = await app.book.record(tid)
            if rec is None:
                return  # the thread was deleted
            g = app.book.graph_of(rec)
            runs = [] if g is None else sorted(await g.queue.list(tid, limit=100), key=lambda r: r.created_at_ms)
            followed = False
            for run in runs:
                if run.run_id in seen:
                    continue
                seen.add(run.run_id)
                assert g is not None
                async for chunk in _run_events(app, g, run.run_id, everything):
                    yield chunk
                followed = True
            if followed:
                idle = 0.0
                continue
            await asyncio.sleep(POLL_S)
            idle += POLL_S
            if idle >= HEARTBEAT_S:
                idle = 0.0
                yield b": heartbeat\n\n"


async def _run_events(app: App, g: ServedGraph, run_id: str, everything: bool) -> AsyncIterator[bytes]:
    """One run's events (all, or its ``metadata`` ones), then its ``run_done``."""
    try:
        async for ev in app.feeds.follow(g.queue, run_id, None):
            if ev.event == "end":
                break
            if everything or ev.event == "metadata":
                yield sse(ev.event, ev.data)
    except RunNotFound:
        return  # deleted meanwhile
    yield sse("metadata", {"status": "run_done", "run_id": run_id})
