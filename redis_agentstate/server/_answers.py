"""How ``agentstate serve`` answers a run: a wait's or a join's result, a run's events (SSE), the
headers that name the run, and the temporary thread of a stateless run dropped once it ended.

A wait whose run takes longer than ``FIRST_ANSWER_S`` is answered as LangGraph's server answers
it: the headers at once, a newline every ``WAIT_HEARTBEAT_S`` while the run goes on (JSON parsers
skip it), then the result, so a proxy sees traffic and a client cut off mid-run has the answer's
``Location`` to reconnect to; a quicker run is answered whole (a 409 for one that can never run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..errors import RunNotFound, RunRejected, ThreadBusy
from ..langgraph import Run
from ..wire.shells import internals
from . import _shapes as shapes
from ._feeds import RunFeeds
from ._served import ServedGraph, ThreadBook
from ._shapes import json_response as _json

__all__ = ["FIRST_ANSWER_S", "WAIT_HEARTBEAT_S", "RunAnswers", "asked", "disconnected", "location"]

FIRST_ANSWER_S = 0.1
WAIT_HEARTBEAT_S = 5.0
#: How long a stateless run's answer waits for its worker to give the thread's saver lease back.
DROP_WAIT_S = 5.0

log = logging.getLogger("redis_agentstate.server")


class RunAnswers:
    """The answers of the run routes, on the app's thread records, graphs, feeds and stream cap."""

    def __init__(self, book: ThreadBook, graphs: dict[str, ServedGraph], feeds: RunFeeds,
                 streams: asyncio.Semaphore) -> None:  # fmt: skip
        self.book, self.graphs, self.feeds, self.streams = book, graphs, feeds, streams
        #: Work left to run on its own (a cancel, a drop), kept until it ends.
        self.detached: set[asyncio.Future[Any]] = set()

    async def final(self, g: ServedGraph, run: Run, *, orphan_check: bool = False) -> Any:
        """The answer of a wait or a join: the thread's values (with its pending interrupts) once the
        run ended, or its error. ``orphan_check``: the thread may be a stateless run's, dropped at the
        run's end by that run's own request; if its record is gone once the state was read (it is
        dropped before its checkpoints), the run's recorded ``values`` events answer instead."""
        if run.status == "error":
            kind, _, message = run.error.partition(": ")
            return {"__error__": {"error": kind or "Error", "message": message or run.error}}
        snap = await g.stateful.aget_state({"configurable": {"thread_id": run.thread_id}})
        if orphan_check and await self.book.record(run.thread_id) is None:
            return await self.final_of_events(g, run)
        values = snap.values
        if getattr(snap, "interrupts", ()):
            values = (
                {**values, "__interrupt__": [shapes._interrupt(i) for i in snap.interrupts]}
                if isinstance(values, dict)
                else values
            )
        return values

    async def final_of_events(self, g: ServedGraph, run: Run) -> Any:
        """A finished run's last ``values`` event (``{}`` for a run that streamed none), as LangGraph's
        server answers a join from the run's stream."""
        last: Any = {}
        async for ev in self.feeds.follow(g.queue, run.run_id, None):
            if ev.event == "end":
                break
            if ev.event == "values":
                last = ev.data
        return last

    async def drop_when_done(self, g: ServedGraph, run: Run) -> None:
        """Drops the temporary thread of ``run`` once the run ended (its client went away first)."""
        with contextlib.suppress(HTTPException, RunNotFound):
            await self.join(g, run.run_id)
        await self.drop_thread(g, run.thread_id)

    async def answer(self, g: ServedGraph, run: Run, *, delete: bool = False, request: Request | None = None,
                     orphan_check: bool = False) -> Response:  # fmt: skip
        """A wait's or a join's answer. A run that ends within ``FIRST_ANSWER_S`` (or can never run:
        409) is answered whole; a longer one as LangGraph's server answers: the headers at once, a
        newline every ``WAIT_HEARTBEAT_S`` while it goes on, then the result (``final``).
        ``delete``: the run's temporary thread is dropped once the run ended, after its values were
        read, or (the client gone first) when it ends. ``request``: its client going away cancels
        the run (``on_disconnect="cancel"``). ``orphan_check``: as ``final`` (a join)."""
        try:
            # One blocking read of FIRST_ANSWER_S: the run's end, or whether its thread's task was
            # cancelled (then it can never run: 409, while the status can still say so).
            ended = await g.queue.join(run.run_id, timeout_s=FIRST_ANSWER_S)
        except RunRejected as exc:
            raise HTTPException(409, str(exc)) from exc
        except TimeoutError:
            pass
        else:
            out = await self.final(g, ended, orphan_check=orphan_check)
            if delete:
                await self.drop_thread(g, run.thread_id)
            return _json(out, headers=location(run, "/join"))
        join = asyncio.ensure_future(self.join(g, run.run_id))
        gone = asyncio.ensure_future(disconnected(request) if request is not None else asyncio.Event().wait())

        async def body() -> AsyncIterator[bytes]:
            answered = False
            try:
                while not join.done() and not gone.done():
                    yield b"\n"
                    await asyncio.wait((join, gone), timeout=WAIT_HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    return  # nobody reads on; the finally cancels the run
                try:
                    ended = join.result()
                except HTTPException as exc:  # its thread's task was cancelled meanwhile: it can never run
                    answered = True
                    yield shapes.dumps({"__error__": {"error": "RunRejected", "message": exc.detail}}).encode()
                    return
                out = await self.final(g, ended, orphan_check=orphan_check)
                if delete:
                    await self.drop_thread(g, run.thread_id)
                answered = True
                yield shapes.dumps(out).encode()
            finally:
                # Maybe cancelled (the client went away): no await here, what is left runs on its own.
                gone.cancel()
                if not answered:
                    join.cancel()
                    if request is not None:
                        self.detach(g.queue.cancel(run.run_id))
                    if delete:
                        self.detach(self.drop_when_done(g, run))

        return StreamingResponse(body(), media_type="application/json", headers=location(run, "/join"))

    async def join(self, g: ServedGraph, run_id: str) -> Run:
        while True:
            with contextlib.suppress(TimeoutError):
                try:
                    return await g.queue.join(run_id, timeout_s=30)
                except RunRejected as exc:  # its thread's task was cancelled: the run can never run
                    raise HTTPException(409, str(exc)) from exc

    async def run_of(self, tid: str, rid: str) -> tuple[ServedGraph, Run]:
        """The run ``rid`` of thread ``tid``; a stateless run's too once its temporary thread was
        dropped (a client reconnecting to the join its wait named): the run's record outlives it."""
        if await self.book.record(tid) is not None:
            return await self.book.run_of(tid, rid)
        for g in self.graphs.values():
            run = await g.queue.get(rid)
            if run is not None and run.thread_id == tid:
                return g, run
        raise HTTPException(404, f"no thread {tid!r}")

    async def drop_thread(self, g: ServedGraph, tid: str) -> None:
        # The record first: a join that read the state and then still finds the record read it whole.
        await self.book.kv.delete(tid)
        # A worker ends its run before it gives the thread's saver lease back (a joiner hears of the end
        # a round trip sooner), so the lease can still be held for a moment: wait for it, bounded. A
        # thread still held after that (its worker stalled) is left, as a crashed server's would be.
        deadline = time.monotonic() + DROP_WAIT_S
        while True:
            try:
                await g.saver.adelete_thread(tid)
                return
            except ThreadBusy:
                if time.monotonic() > deadline:
                    log.warning("stateless run's thread %r still leased after %g s: left in place", tid, DROP_WAIT_S)
                    return
                await asyncio.sleep(0.01)

    def events(self, g: ServedGraph, run: Run, after: str | None, modes: list[str] | None, delete: bool = False,
               cancel_on_disconnect: bool = False, stateless: bool = False) -> StreamingResponse:  # fmt: skip
        if self.streams.locked():
            raise HTTPException(503, "too many open event streams")
        internals(g.queue).core.cursor(run.run_id, after, None)  # a bad Last-Event-ID: 422 now, not a broken stream

        async def body() -> AsyncIterator[bytes]:
            ended = False
            async with self.streams:
                try:
                    async for ev in self.feeds.follow(g.queue, run.run_id, after):
                        if ev.event == "end":
                            ended = True
                            break
                        name = ev.event  # a subgraph's: '<mode>|<namespace>', filtered on its mode
                        if modes and not asked(name, modes):
                            continue
                        yield shapes.sse(name, ev.data, ev.id)
                    ended = True
                except RunNotFound:
                    ended = True
                    return
                finally:
                    if cancel_on_disconnect and not ended:
                        # The client went away mid-run (on_disconnect='cancel'): stop the run. A task of
                        # its own: this one is being cancelled, and every await in it would be too.
                        self.detach(g.queue.cancel(run.run_id))
                    if delete and ended:
                        with contextlib.suppress(Exception):
                            await self.join(g, run.run_id)
                            await self.drop_thread(g, run.thread_id)
                    elif delete:  # cancelled (the client went away): no await here
                        self.detach(self.drop_when_done(g, run))

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no",
                   **location(run, "/stream", stateless=stateless)}  # fmt: skip
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    def detach(self, work: Awaitable[Any]) -> None:
        """Run ``work`` in a task of its own, kept until it ends (its errors are the run's, not the caller's)."""
        task = asyncio.ensure_future(work)
        self.detached.add(task)
        task.add_done_callback(self.detached.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def stateless_run(self, rid: str) -> tuple[ServedGraph, Run]:
        """A run by its id alone (a stateless stream's ``Location``), in whichever graph has it."""
        for g in self.graphs.values():
            run = await g.queue.get(rid)
            if run is not None:
                return g, run
        raise HTTPException(404, f"no run {rid!r}")


def location(run: Run, then: str = "", *, stateless: bool = False) -> dict[str, str]:
    """``Content-Location``: the run itself, never its /join or /stream (clients parse the run id out
    of it: the JS client's onRunCreated, langgraph-sdk's on_run_created take everything after /runs/).
    ``Location``: where a client whose answer was cut off reconnects (both SDKs GET it, with
    ``Last-Event-ID`` for a stream), as LangGraph's server sends it: ``then`` is ``/join`` for a
    wait or a join, ``/stream`` for a stream. A ``stateless`` run's stream (or its creation) names the
    run alone, ``/runs/{run}``, as there: after a stream that names a thread's run, both SDKs GET
    the run to see whether it goes on, and a temporary thread is gone by then."""
    if stateless and then != "/join":
        path = f"/runs/{run.run_id}"
        return {"Location": path + then, "Content-Location": path} if then else {"Content-Location": path}
    path = f"/threads/{run.thread_id}/runs/{run.run_id}"
    return {"Location": path + then, "Content-Location": path}


def asked(event: str, modes: list[str]) -> bool:
    """Whether a joined stream filtered on ``modes`` (LangGraph's names) sends ``event``: ``metadata``
    and ``error`` always, a subgraph's ``<mode>|<namespace>`` on its mode, and under ``messages`` or
    ``messages-tuple`` every ``messages...`` event, as LangGraph's server filters a join."""
    mode = event.partition("|")[0]
    if event in ("metadata", "error") or mode in modes:
        return True
    return mode.startswith("messages") and ("messages" in modes or "messages-tuple" in modes)


async def disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body was read) went away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
