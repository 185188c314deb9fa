"""``GraphWorker``: executes the runs of a ``RunQueue`` with a compiled LangGraph graph, fleet-wide.

A worker takes a thread with the queue's ``claim_next`` (woken by Redis, never polling) under a
lease its keeper renews (the heartbeat), takes the thread's saver lease, then the thread's next run
under it (``lg_run_begin.lua``: runs of a thread go in creation order; the script checks the task's
claim is still the worker's) and runs the graph under the saver lease, so at most
one run per thread executes in the whole fleet and a worker that lost the thread (SIGKILLed,
frozen, cut off) can write neither a checkpoint nor an event, and one that thaws starts no further
node (each start inside the graph checks the leases, ``_LeaseGate``). Every event it streams is one
fenced script that also answers whether the run was asked to stop, so an ``interrupt`` or
``rollback`` (double-texting, ``cancel``) is seen at the run's next event or super-step boundary
at no extra round trip; both drivers also block on the run's stop signal (which ``cancel`` sets)
while the graph runs: the asyncio one cancels the graph's task at once, inside a long node too; the
sync one fences the graph out (``_StopWatch``) and ends the run at once.

A run whose worker died is taken over when the thread's lease lapses: the next worker resumes it
from the thread's last checkpoint (input ``None``), with the pending writes of the interrupted
super-step kept by the saver, so a node whose writes were saved does not run again. A run whose
worker died ``max_attempts`` times ends as an ``error`` (a poison run): a death is
a lease that lapsed without a hand-back; a hand-back (``stop()``, or a release after a Redis error)
is none. ``stop()`` (SIGTERM in the CLI)
ends each worker thread at its run's next boundary and hands the run back (pending, its
progress kept) for another worker to go on with.

Given an ``AsyncRunQueue`` and an ``AsyncAgentStateSaver``, the worker runs on asyncio instead
(``await worker.arun()``, ``graph.astream``: async nodes), ``concurrency`` tasks on one loop. The
two drivers share every decision (``_Attempt``, no I/O); they differ only in how they wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Generator
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.messages import BaseMessage, BaseMessageChunk, convert_to_messages, message_chunk_to_message
from langgraph.store.base import BaseStore
from langgraph.types import Command

from ..errors import BackendError, BackendUnavailable, InvalidArgument, LeaseLost
from ..lease import AsyncLease, Lease
from ..models import AgentStatus, Checkpoint
from ..wire.shells import StoreInternals, cancels, check_cancel, internals
from ._runs_core import Begun, Run, RunCore, RunLost
from .errors import RunStopped, ThreadBusy
from .runs import AsyncRunQueue, RunQueue
from .saver import AgentStateSaver, AsyncAgentStateSaver

__all__ = ["GraphWorker"]

log = logging.getLogger("redis_agentstate.langgraph")

#: Modes that emit at every super-step: with one of them asked for, no boundary mode is added.
_PER_STEP = frozenset({"values", "updates", "debug", "checkpoints", "tasks"})


class _Failures:
    """A worker loop's streak of failed turns, without I/O: how long to wait before the next one
    (doubling from 0.5 s to 10 s) and what to log. An unreachable Redis is one warning line when
    the streak starts and one when it ends, not a traceback per retry (a log that a pipe nobody
    reads fills up blocks the process); any other failure keeps its traceback."""

    FIRST_S, MAX_S = 0.5, 10.0

    def __init__(self, name: str) -> None:
        self.name, self.streak = name, 0

    def failed(self, exc: Exception) -> float:
        self.streak += 1
        if not isinstance(exc, BackendUnavailable):
            log.error("graph worker %s: a thread's turn failed; going on", self.name, exc_info=exc)
        elif self.streak == 1:
            log.warning("graph worker %s: Redis unavailable (%s); retrying with backoff", self.name,
                        type(exc.__cause__ or exc).__name__)  # fmt: skip
        return min(self.MAX_S, self.FIRST_S * float(1 << min(self.streak - 1, 8)))

    def ok(self) -> None:
        if self.streak:
            log.warning("graph worker %s: going on after %d failed turns", self.name, self.streak)
        self.streak = 0


class _LeaseGate(BaseCallbackHandler):
    """A callback on the graph's config that checks the attempt's leases as anything of the graph
    starts: a node, and inside one a model, tool or retriever call. The worker checks them before
    the graph and after each chunk, and a worker frozen right after such a check (SIGSTOP, a long
    pause) wakes with them lapsed while the graph goes on to its next node: another worker may have
    taken the run over, run that node and saved it meanwhile. Its writes would be refused, but the
    node's own effects would happen twice; raised here, the node does not start. The same check
    stops a run a cancel ended at once (``_Attempt.halted``): a sync node, which nothing can
    interrupt, stops at its next model, tool or retriever call instead of running to its end."""

    raise_error = True  # LangChain logs a callback's error and goes on unless told to raise it
    run_inline = True  # under asyncio, in the graph's own task rather than an executor's thread

    def __init__(self, attempt: _Attempt, leases: tuple[Any, ...]) -> None:
        self.attempt, self.leases = attempt, leases

    def _check(self, *args: Any, **kwargs: Any) -> None:
        run = self.attempt.run
        tid = run.thread_id
        if self.attempt.halted:
            raise RunStopped(f"run {run.run_id!r} was stopped by a cancel: nothing more of it starts", task_id=tid)
        if any(lease.lost for lease in self.leases):
            raise RunStopped(f"lost thread {tid!r} before a step of its run started", task_id=tid)

    on_chain_start = on_llm_start = on_chat_model_start = on_tool_start = on_retriever_start = _check


class _Attempt:
    """One attempt at one run, without I/O: its config and stream modes, what to emit for each
    chunk, when to stop, and how it ends. Both drivers of ``GraphWorker`` ask it."""

    def __init__(self, worker: GraphWorker, begun: Begun, token: str) -> None:
        self.run, self.begun, self.token = begun.run, begun, token
        run = self.run
        config = dict(run.config)
        config["configurable"] = {**(config.get("configurable") or {}), "thread_id": run.thread_id}
        config["metadata"] = {**(config.get("metadata") or {}), **run.metadata, "run_id": run.run_id}
        with contextlib.suppress(ValueError):  # LangChain's run id is a UUID: ours are, unless given otherwise
            config["run_id"] = uuid.UUID(run.run_id)
        self.config = config
        self.thread_config = {"configurable": {"thread_id": run.thread_id}}
        modes = list(run.stream_mode)
        #: ``events``: the graph runs under ``astream_events`` (v2), whose root's ``on_chain_stream``
        #: events carry the chunks of the other modes, as LangGraph's server runs it.
        self.astream_events = "events" in modes
        #: ``messages-partial``: the graph's ``messages`` chunks, each message accumulated by its id.
        self.partial = "messages-partial" in modes
        self.raw_messages = "messages" in modes
        self.messages: dict[str | None, Any] = {}
        graph_modes = [m for m in modes if m not in ("events", "messages-partial")]
        if self.partial and not self.raw_messages:
            graph_modes.append("messages")
        #: No asked mode emits at every super-step: add one for the boundaries, and do not record it.
        self.boundary = not (_PER_STEP & set(graph_modes))
        self.asked = [*graph_modes, "checkpoints"] if self.boundary else graph_modes
        self.deadline = None if worker.run_timeout_s is None else time.monotonic() + worker.run_timeout_s
        self.timeout_s = worker.run_timeout_s
        self.lease_args = worker._saver_lease
        self.status, self.error, self.stop = "success", "", ""
        #: Emits sent in this attempt: each carries its number, so a re-sent one is recognised.
        self.emitted = 0
        #: A stop watch stopped the run at once: nothing more of the graph starts (``_LeaseGate``). The
        #: sync one (``_StopWatch``) has also ended the run and revoked its saver lease: this attempt
        #: writes nothing more.
        self.halted = False

    def stream_kw(self) -> dict[str, Any]:
        """``graph.stream``'s keyword arguments for this run: its modes, subgraphs, and the nodes it stops
        before or after (``interrupt_before`` / ``interrupt_after``, as LangGraph's server passes them)."""
        kw: dict[str, Any] = {"stream_mode": self.asked, "subgraphs": self.run.subgraphs}
        for k in ("interrupt_before", "interrupt_after"):
            if (v := getattr(self.run, k)) is not None:
                kw[k] = v
        return kw

    def seq(self) -> int:
        """The number of the attempt's next emit (lg_run_emit.lua appends an emit's events once)."""
        self.emitted += 1
        return self.emitted

    @property
    def needs_last(self) -> bool:
        """A takeover (or a run handed back): where it stands depends on the thread's last checkpoint."""
        return self.begun.resumed or self.begun.attempt > 1

    def input(self, last: Any) -> Any:
        """What the graph is given: ``None`` to go on from the thread's last checkpoint ``last`` if this
        run wrote it (the saved writes of an interrupted super-step are kept), else the run's input
        or command."""
        if last is not None and last.metadata.get("run_id") == self.run.run_id:
            # From the head this run wrote: a run started from an earlier checkpoint (a fork) must
            # not go back to it, which would re-run its nodes on a branch of their own.
            conf = self.config["configurable"]
            for k in ("checkpoint_id", "checkpoint_map"):
                conf.pop(k, None)
            return None
        cmd = self.run.command
        if cmd is not None:
            return cmd if isinstance(cmd, Command) else Command(**cmd) if isinstance(cmd, dict) else cmd
        return self.run.input

    def events(self, chunk: Any) -> list[tuple[str, Any]]:
        """What to record of one chunk of ``graph.stream``: ``(mode, data)``, or with subgraphs
        ``(namespace, mode, data)``, whose events are named ``<mode>|<namespace>`` (its parts joined by
        ``|``, as LangGraph's server names them; the graph's own keep their mode's name). Under
        ``events``, a chunk is an ``astream_events`` event: the root's ``on_chain_stream`` holds a
        chunk of the modes above; every other one is recorded as an ``events`` event (but those
        tagged ``langsmith:hidden``, as LangGraph's server skips them)."""
        if self.astream_events:
            if chunk.get("event") != "on_chain_stream" or chunk.get("parent_ids"):
                return [] if "langsmith:hidden" in (chunk.get("tags") or ()) else [("events", chunk)]
            chunk = chunk["data"]["chunk"]
        if self.run.subgraphs:
            ns, mode, data = chunk
        else:
            (mode, data), ns = chunk, ()
        if self.boundary and mode == "checkpoints":
            return []
        out = [(f"{mode}|{'|'.join(ns)}" if ns else mode, data)]
        if mode == "messages" and self.partial:
            out = [*out, *self._grown(data)] if self.raw_messages else self._grown(data)
        return out

    def _grown(self, data: Any) -> list[tuple[str, Any]]:
        """LangGraph's server's ``messages`` mode for one ``(message, metadata)`` chunk: the message
        accumulated by its id so far (``messages/partial`` while it streams as chunks,
        ``messages/complete`` for a whole message), after a ``messages/metadata`` the first time its
        id is seen in this attempt."""
        msg, meta = data
        if not isinstance(msg, BaseMessage):
            msg = convert_to_messages([msg])[0]
        out: list[tuple[str, Any]] = []
        if msg.id in self.messages:
            self.messages[msg.id] += msg
        else:
            self.messages[msg.id] = msg
            out.append(("messages/metadata", {msg.id: {"metadata": meta}}))
        kind = "messages/partial" if isinstance(msg, BaseMessageChunk) else "messages/complete"
        out.append((kind, [message_chunk_to_message(self.messages[msg.id])]))
        return out

    def guard(self, *leases: Any) -> None:
        """Have each start inside the graph check ``leases`` (``_LeaseGate``), beside the callbacks
        the run's config names."""
        gate = _LeaseGate(self, leases)
        given = self.config.get("callbacks")
        if isinstance(given, BaseCallbackManager):
            given = given.copy()
            given.add_handler(gate, inherit=True)
            self.config["callbacks"] = given
        else:
            self.config["callbacks"] = [*(given or []), gate]

    def started(self, stop: str, stopping: bool, lost: bool) -> bool:
        """Once the thread's saver lease is ours and the run is known to be this attempt's: False if the
        run was asked to stop before it started. The worker takes the saver lease first and begins the
        run under it, the task's claim checked in that script (``lg_run_begin.lua``); an attempt begun
        before its saver lease was taken (``_execute`` without ``held``) checks with an ``emit`` of no
        events once it is, which raises ``RunLost`` if the run is no longer this attempt's. Without
        either check, a worker that stalled between taking the run and taking the saver lease (frozen,
        or its lease keeper starved) could wake after another worker had ended the run and the saver
        lease had fallen free, take it, and run the graph from the run's input on top of the newer
        runs' checkpoints: the saver lease alone fences checkpoints against a concurrent holder, not
        against the run having moved on. After the check, a takeover needs the saver lease this attempt
        now holds, so it waits until it lapses."""
        return self.carry_on(stop, stopping, lost)

    def carry_on(self, stop: str, stopping: bool, lost: bool) -> bool:
        """After a chunk was emitted (``stop``: what the run was asked): False to stop here."""
        if lost:
            raise LeaseLost(f"lost thread {self.run.thread_id!r}", task_id=self.run.thread_id)
        if not stop and stopping:
            stop = "stop"
        if not stop and self.deadline is not None and time.monotonic() > self.deadline:
            stop = "timeout"
        self.stop = stop
        return not stop

    def failed(self, exc: BaseException) -> list[tuple[str, Any]]:
        """The graph raised: the run ends as an error, its ``error`` event first."""
        self.status, self.error = "error", f"{type(exc).__name__}: {exc}"
        return [("error", {"error": type(exc).__name__, "message": str(exc)})]

    def ending(self) -> tuple[bool, str, str, bool]:
        """``(hand back, status, error, gone)``: hand the run back (pending) to the fleet, or end it."""
        if self.stop == "stop":
            return True, "pending", "", False
        if self.stop == "rollback":
            return False, "interrupted", "rollback", True
        if self.stop == "interrupt":
            return False, "interrupted", "interrupt", False
        if self.stop == "timeout":
            return False, "timeout", f"ran longer than {self.timeout_s} s", False
        # A graph that paused on interrupt() ran as asked: 'success', as LangGraph Platform ends it
        # (its interrupt is in the events, and the thread waits for a Command(resume=...)).
        return False, self.status, self.error, False


class _StopWatch:
    """The sync driver's watch on a run's stop signal, in a thread of its own beside the graph's: on a
    cancel (or an ``interrupt`` / ``rollback`` double-text) it fences the graph out, the thread's saver
    lease revoked with its token kept (the graph's later checkpoint writes are refused as a lost lease),
    and ends the run (``rollback``: with its checkpoints), so the cancel answers at once. A sync node
    cannot be interrupted: it stops at its next traced call (``_LeaseGate``), else the graph's thread
    finds out at its next write, and the thread's next run starts
    once it has. ``close`` (the graph ended) ends the watch: nothing is done after it."""

    def __init__(self, worker: GraphWorker, a: _Attempt, thread_lease: Any) -> None:
        self.worker, self.a, self.thread_lease = worker, a, thread_lease
        self.lock = threading.Lock()
        self.done = False
        threading.Thread(target=self._watch, name=f"stop-watch-{a.run.run_id}", daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.done = True

    def _watch(self) -> None:
        w, run = self.worker, self.a.run
        stop = ""
        while not stop and not self.done:
            try:
                stop = w._q.run(w._q.core.stop_asked(run, w.queue._slice))
            except Exception:  # a failed watch: the run's boundaries still see a stop (lg_run_emit.lua)
                time.sleep(0.5)
        with self.lock:
            if self.done or stop == "end":  # the run ended (ours, or fenced out): nothing to stop
                return
            try:
                if stop == "rollback":
                    w.saver.delete_for_runs([run.run_id])
                self.thread_lease.revoke()
                self.a.halted = True
                w._q.run(w._q.core.finish(run, self.a.token, "interrupted", stop, gone=stop == "rollback"))
            except Exception as exc:  # taken over meanwhile, or Redis failing: its boundaries decide
                log.warning("graph worker %s: could not stop run %s at once: %s", w.name, run.run_id, exc)
                return
            w._count("interrupted")


class _AsyncStopWatch:
    """The asyncio driver's watch on a run's stop signal (``_StopWatch``'s twin), and the watches still
    in their blocking read after their graph ended (each ends at its run's end marker, or its slice)."""

    def __init__(self, worker: GraphWorker) -> None:
        self.worker = worker
        self.lingering: set[asyncio.Future[str]] = set()

    async def close(self) -> None:
        for watch in list(self.lingering):
            watch.cancel()
        await asyncio.gather(*self.lingering, return_exceptions=True)

    async def around(self, a: _Attempt, graph: Awaitable[None]) -> None:
        """Run the graph beside a watch on the run's stop signal: a cancel stops the graph at once
        (its task is cancelled: an async node is cancelled where it awaits; a sync node's thread
        finishes alone and its writes are dropped, as LangGraph drops a cancelled task's), not at its
        next boundary. The saver lease is still this attempt's until the run has ended. A graph that
        ends first leaves the watch in its blocking read, which the run's end marker answers: a read
        cancelled halfway would cost its pooled connection (and the next one a new handshake)."""
        body = asyncio.ensure_future(graph)
        ended = asyncio.Event()
        watch = asyncio.ensure_future(self._await_stop(a.run, ended))
        try:
            await asyncio.wait((body, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.set()
            if not body.done():
                # A sync node in an executor's thread is not cancelled with the task: halted, it
                # stops at its next traced call (_LeaseGate).
                if watch.done() and not watch.cancelled() and watch.exception() is None and watch.result():
                    a.halted = True
                body.cancel()
            if not watch.done() and not body.done():
                watch.cancel()  # this task itself was cancelled: nothing waits for the run's end
            await asyncio.wait((body,))
        if body.cancelled():
            a.stop = watch.result()
        else:
            if not watch.done():
                self.lingering.add(watch)  # ends at the run's end marker (or its slice): kept until then
                watch.add_done_callback(self.lingering.discard)
            body.result()  # the worker's trouble (RunLost, LeaseLost, BackendError) goes on up

    async def _await_stop(self, run: Run, ended: asyncio.Event) -> str:
        """The stop asked of ``run``; '' once the graph ended (``ended``) and the watch's read returned."""
        core, baseline = self.worker._q.core, cancels()
        while not ended.is_set():
            try:
                stop: str = await self.worker._q.run(core.stop_asked(run, self.worker.queue._slice))
            except Exception:  # a failed watch: the run's boundaries still see a stop (lg_run_emit.lua)
                if ended.is_set():
                    return ""
                await asyncio.sleep(0.5)
                continue
            finally:
                check_cancel(baseline)  # a cancel the blocking read swallowed: the watch ends here
            if stop == "end":  # the run ended (ours, or fenced out): nothing to stop
                await ended.wait()
                return ""
            if stop:
                return stop
        return ""


def _drive(events: AsyncIterator[Any]) -> Generator[Any, None, None]:
    """An async iterator's items, from sync code, on an event loop of the calling thread's own;
    closing the generator closes the async one (the graph's task stops there)."""
    loop = asyncio.new_event_loop()
    it = aiter(events)
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(it))
            except StopAsyncIteration:
                return
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(it.aclose())  # type: ignore[attr-defined]
        loop.close()


def _sync_chunks(graph: Any, a: _Attempt, last: Any) -> Generator[Any, None, None]:
    """The sync driver's chunks: ``graph.stream``, or under ``events`` ``graph.astream_events``
    (LangChain has no sync twin) driven on an event loop of this thread's own."""
    kw = a.stream_kw()
    if not a.astream_events:
        return graph.stream(a.input(last), a.config, **kw)  # type: ignore[no-any-return]
    return _drive(graph.astream_events(a.input(last), a.config, version="v2", **kw))


def _put_back(lease: Lease | AsyncLease, remaining: int) -> Checkpoint:
    """The thread's task as the worker commits it: due now if it has runs left, else waiting for one."""
    cp = lease.checkpoint
    cp.cycle_index = lease.cycle_index
    cp.status = AgentStatus.RUNNING if remaining else AgentStatus.WAIT_USER
    return cp


class GraphWorker:
    """Runs ``graph`` (compiled; its checkpointer becomes ``saver``) for the runs of ``queue``.

    ``queue`` and ``saver`` are both sync (``RunQueue``, ``AgentStateSaver``: ``run()``, one thread
    per ``concurrency``) or both asyncio (``AsyncRunQueue``, ``AsyncAgentStateSaver``:
    ``await arun()``, one task per ``concurrency``). ``lease_ms``: the thread's lease (renewed by
    its keeper; a dead worker's runs are taken over after about this long). ``run_timeout_s``: a
    run still going after this long ends as ``timeout`` at its next boundary. ``max_attempts``: a
    run whose worker died this many times (its lease lapsed without a hand-back) ends as ``error``;
    hand-backs (``stop()``, a release after a Redis error) do not count. ``graph_id``: the name of
    ``graph`` (an unnamed one runs under it, as in LangGraph's server); a run whose
    ``metadata["graph_id"]`` names another graph ends as ``error`` without running.
    ``store``: a LangGraph ``BaseStore`` (e.g. ``AgentStateStore``) the graph's nodes reach through
    ``get_store()`` / ``InjectedStore`` (it replaces the store ``graph`` was compiled with; None keeps it).
    """

    def __init__(
        self,
        graph: Any,
        queue: RunQueue | AsyncRunQueue,
        saver: AgentStateSaver | AsyncAgentStateSaver,
        *,
        concurrency: int = 1,
        lease_ms: int = 30_000,
        max_attempts: int = 3,
        run_timeout_s: float | None = None,
        name: str | None = None,
        block_ms: int = 5_000,
        graph_id: str | None = None,
        store: Any = None,
    ) -> None:
        self.asyncio = isinstance(queue, AsyncRunQueue)
        if not isinstance(queue, (RunQueue, AsyncRunQueue)):
            raise InvalidArgument(f"queue must be a RunQueue or an AsyncRunQueue, got {type(queue).__name__}")
        want = AsyncAgentStateSaver if self.asyncio else AgentStateSaver
        if not isinstance(saver, want):
            raise InvalidArgument(f"a {type(queue).__name__} takes an {want.__name__}, got {type(saver).__name__}")
        if not hasattr(graph, "stream") or not hasattr(graph, "copy"):
            raise InvalidArgument(f"graph must be a compiled LangGraph graph, got {type(graph).__name__}")
        for what, value, lo in (("concurrency", concurrency, 1), ("lease_ms", lease_ms, 1000),
                                ("max_attempts", max_attempts, 1), ("block_ms", block_ms, 1)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise InvalidArgument(f"{what} must be an int >= {lo}, got {value!r}")
        if run_timeout_s is not None and not (isinstance(run_timeout_s, (int, float)) and run_timeout_s > 0):
            raise InvalidArgument(f"run_timeout_s must be a number > 0 or None, got {run_timeout_s!r}")
        if store is not None and not isinstance(store, BaseStore):
            raise InvalidArgument(f"store must be a LangGraph BaseStore, got {type(store).__name__}")
        update: dict[str, Any] = {"checkpointer": saver}
        if store is not None:
            update["store"] = store
        if graph_id is not None and getattr(graph, "name", None) == "LangGraph":
            update["name"] = graph_id  # a graph left unnamed runs under its id, as LangGraph's server names it
        self.graph = graph.copy(update=update)
        self.store: Any = store
        self.queue: Any = queue
        #: The queue's core and driver: the worker drives the run operations one by one (begin, emit,
        #: finish, wake, the stop watch), as the queue's own methods do.
        self._q: StoreInternals[RunCore] = internals(queue, resolve=False)
        self.saver: Any = saver
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.max_attempts = max_attempts
        self.run_timeout_s = run_timeout_s
        self.block_ms = block_ms
        #: The graph this worker runs: a run whose metadata names another ``graph_id`` is not executed
        #: here (it ends as an error saying so: a queue's workers should all run its graph).
        self.graph_id = graph_id
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._stopping = threading.Event()
        #: Runs this worker ended, by final status (for people and tests).
        self.finished: dict[str, int] = {}
        self._lock = threading.Lock()
        self._watch = _AsyncStopWatch(self)
        #: The thread's saver lease, as an attempt takes it: waiting out a dead holder's lease.
        self._saver_lease = {"lease_ms": self.lease_ms, "wait_ms": self.lease_ms + 2_000}

    def stop(self) -> None:
        """End at each running run's next boundary, handing it back (pending) to the fleet."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _count(self, status: str) -> None:
        with self._lock:
            self.finished[status] = self.finished.get(status, 0) + 1

    def _close_waker(self) -> None:
        waker = getattr(self.queue.tasks, "_waker", None)
        if waker is not None:  # the woken claims' subscription: no listener outlives the worker
            waker.close()

    async def _aclose_waker(self) -> None:
        waker = getattr(self.queue.tasks, "_waker", None)
        if waker is not None:
            await waker.aclose()

    def _wrong_graph(self, run: Run) -> str:
        """Why this worker must not execute ``run`` ('' if it may): the run names another graph."""
        wanted = run.metadata.get("graph_id")
        if self.graph_id is None or wanted is None or wanted == self.graph_id:
            return ""
        return f"GraphMismatch: the run is for graph {wanted!r}, and reached a worker of {self.graph_id!r}"

    def _lost(self, run: Run, exc: BaseException) -> None:
        log.warning("graph worker %s: run %s of thread %r is not ours any more: %s",
                    self.name, run.run_id, run.thread_id, exc)  # fmt: skip

    def _redis_failed(self, run: Run, exc: BaseException) -> None:
        # Redis failed under the run (a restart, a failover): the run is handed back if Redis answers
        # again, else its lease lapses and another worker takes it over. Either way it resumes from the
        # last checkpoint: a Redis error never ends a run as the graph's error.
        log.warning("graph worker %s: Redis failed under run %s of thread %r (%s); handing it back",
                    self.name, run.run_id, run.thread_id, exc)  # fmt: skip

    # ---- the sync driver ---------------------------------------------------

    def run(self) -> None:
        """Execute runs until ``stop()``: ``concurrency`` threads, each one run at a time (an asyncio
        worker runs ``arun()`` on a loop of its own)."""
        if self.asyncio:
            asyncio.run(self.arun())
            return
        threads = [threading.Thread(target=self._loop, name=f"graph-worker-{i}", daemon=True)
                   for i in range(self.concurrency)]  # fmt: skip
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)
        except KeyboardInterrupt:
            self.stop()
            for t in threads:
                t.join()
        finally:
            self._close_waker()

    def _loop(self) -> None:
        failures = _Failures(self.name)
        while not self._stopping.is_set():
            try:
                self.run_once(block_ms=self.block_ms)
            except Exception as exc:
                self._stopping.wait(failures.failed(exc))
            else:
                failures.ok()

    def run_once(self, *, block_ms: int | None = None) -> bool:
        """Take one thread with work and execute its next run; False when nothing came within ``block_ms``."""
        lease = Lease.next(self.queue.tasks, lease_ms=self.lease_ms, block_ms=block_ms)
        if lease is None:
            return False
        with lease:
            self._turn(lease)
        return True

    def _turn(self, lease: Lease) -> None:
        core, tid = self._q.core, lease.task_id
        remaining, delay = 0, None
        # The thread's saver lease first, then the run begun under it with the task's claim checked in
        # the same script: no fenced check of its own after (_Attempt.started), one round trip less.
        with contextlib.ExitStack() as held:
            try:
                thread_lease = held.enter_context(self.saver.lease(tid, **self._saver_lease))
                begun = self._q.run(core.begin(tid, lease.token, self.name, self.max_attempts, lease.revision))
            except RunLost as exc:
                log.warning("graph worker %s: thread %r is not ours any more: %s", self.name, tid, exc)
                return
            except ThreadBusy:  # the previous holder's saver lease has not lapsed yet: back, later
                lease.release(reason="ThreadBusy")
                return
            if begun is not None and begun.later_ms:
                remaining, delay = 1, begun.later_ms  # the next run is not due: the thread is put off until it is
            elif begun is not None and begun.rollback:
                self.saver.delete_for_runs([begun.run.run_id])
                held.close()
                self._q.run(core.finish(begun.run, "", "interrupted", "rollback", gone=True))
                remaining = 1  # look again at once: the thread may have a run behind it
            elif begun is not None and (wrong := self._wrong_graph(begun.run)):
                held.close()
                remaining = self._q.run(core.finish(begun.run, lease.token, "error", wrong))
                self._count("error")
            elif begun is not None:
                left = self._execute(_Attempt(self, begun, lease.token), lease, (held, thread_lease))
                if left is None:  # lost the thread, or handed the run back: the lease ends as it is
                    return
                remaining = left
        try:
            lease.commit(_put_back(lease, remaining), delay_ms=delay)
        except LeaseLost:
            log.warning("graph worker %s: lost thread %r before putting it back", self.name, tid)
            return
        if not remaining:
            # A run created while the task was ours did not wake it (it was not waiting): look again.
            self._q.run(core.wake(tid))

    def _execute(self, a: _Attempt, lease: Lease, held: tuple[contextlib.ExitStack, Any] | None = None) -> int | None:
        """Run the graph for one attempt; the thread's active runs left, or None if the run is not ours
        any more (lost) or was handed back (stop, Redis failing). ``held``: the thread's saver lease,
        taken before the run was begun (its exit stack, and the lease), else taken here."""
        core, run = self._q.core, a.run
        try:
            with held[0] if held else self.saver.lease(run.thread_id, **a.lease_args) as entered:
                thread_lease = held[1] if held else entered
                # _Attempt.started: the run must still be this attempt's (begun under the lease, it is).
                stop = "" if held else self._q.run(core.emit(run, a.token, [], seq=a.seq()))
                if a.started(stop, self._stopping.is_set(), lease.lost):
                    a.guard(lease, thread_lease)
                    last = self.saver.get_tuple(a.thread_config) if a.needs_last else None
                    watch = _StopWatch(self, a, thread_lease)
                    chunks = _sync_chunks(self.graph, a, last)
                    try:
                        for chunk in chunks:
                            stop = self._q.run(core.emit(run, a.token, a.events(chunk), seq=a.seq()))
                            if not a.carry_on(stop, self._stopping.is_set(), lease.lost):
                                break
                    except (RunLost, LeaseLost, BackendError):
                        raise  # the worker's trouble, not the run's: it goes on elsewhere (below)
                    except Exception as exc:
                        self._q.run(core.emit(run, a.token, a.failed(exc), seq=a.seq()))
                    finally:
                        watch.close()
                        chunks.close()
                if a.halted:  # the stop watch ended the run: nothing more of this attempt
                    return None
                if a.stop == "rollback":
                    self.saver.delete_for_runs([run.run_id])
                back, status, error, gone = a.ending()
                if not back:  # ended before the saver lease goes: a joiner hears of it a round trip sooner
                    left: int = self._q.run(core.finish(run, a.token, status, error, gone=gone))
        except (RunLost, LeaseLost) as exc:
            if not a.halted:
                self._lost(run, exc)
            return None
        except (BackendError, ThreadBusy) as exc:
            # ThreadBusy: the previous holder's saver lease has not lapsed yet. Either way: back, later.
            if isinstance(exc, BackendError):
                self._redis_failed(run, exc)
            with contextlib.suppress(Exception):
                self._q.run(core.finish(run, a.token, "pending"))
                lease.release(reason=f"{type(exc).__name__}")
            return None
        if back:
            self._q.run(core.finish(run, a.token, "pending"))
            lease.release()
            return None
        self._count(status)
        return left

    # ---- the asyncio driver ----------------------------------------------------

    async def arun(self) -> None:
        """Execute runs until ``stop()``: ``concurrency`` tasks on this loop, each one run at a time."""
        if not self.asyncio:
            raise InvalidArgument("arun() needs an AsyncRunQueue and an AsyncAgentStateSaver; run() for sync ones")
        try:
            await asyncio.gather(*(self._aloop() for _ in range(self.concurrency)))
        finally:
            await self._watch.close()
            await self._aclose_waker()

    async def _aloop(self) -> None:
        failures = _Failures(self.name)
        while not self._stopping.is_set():
            try:
                await self.arun_once(block_ms=self.block_ms)
            except Exception as exc:
                await self._asleep_unless_stopped(failures.failed(exc))
            else:
                failures.ok()

    async def _asleep_unless_stopped(self, seconds: float) -> None:
        # stop() is a threading.Event (the CLI's signal handler may set it from any thread).
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.1, left))

    async def arun_once(self, *, block_ms: int | None = None) -> bool:
        """The asyncio twin of ``run_once``; a ``stop()`` ends its wait for work at once."""
        lease = await self._anext_lease(block_ms)
        if lease is None:
            return False
        async with lease:
            await self._aturn(lease)
        return True

    async def _anext_lease(self, block_ms: int | None) -> AsyncLease | None:
        """The next thread with work (``claim_next``, blocked up to ``block_ms``), or None: nothing came,
        or ``stop()`` was called meanwhile (an idle worker, so an idle server, stops at once, not when
        its block runs out)."""
        claim = asyncio.ensure_future(AsyncLease.next(self.queue.tasks, lease_ms=self.lease_ms, block_ms=block_ms))
        if block_ms is None or block_ms <= 0:
            return await claim
        stopped = asyncio.ensure_future(self._asleep_unless_stopped(block_ms / 1000 + 1))
        try:
            await asyncio.wait((claim, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not claim.done():
                claim.cancel()  # the waker's wait: a claim it had sent would lapse (lease_ms) and be taken over
            await asyncio.wait((claim, stopped))
        return None if claim.cancelled() else claim.result()

    async def _aturn(self, lease: AsyncLease) -> None:
        core, tid = self._q.core, lease.task_id
        remaining, delay = 0, None
        async with contextlib.AsyncExitStack() as held:  # as _turn: the saver lease first, begun under it
            try:
                thread_lease = await held.enter_async_context(self.saver.lease(tid, **self._saver_lease))
                begun = await self._q.run(core.begin(tid, lease.token, self.name, self.max_attempts, lease.revision))
            except RunLost as exc:
                log.warning("graph worker %s: thread %r is not ours any more: %s", self.name, tid, exc)
                return
            except ThreadBusy:
                await lease.release(reason="ThreadBusy")
                return
            if begun is not None and begun.later_ms:
                remaining, delay = 1, begun.later_ms
            elif begun is not None and begun.rollback:
                await self.saver.adelete_for_runs([begun.run.run_id])
                await held.aclose()
                await self._q.run(core.finish(begun.run, "", "interrupted", "rollback", gone=True))
                remaining = 1
            elif begun is not None and (wrong := self._wrong_graph(begun.run)):
                await held.aclose()
                remaining = await self._q.run(core.finish(begun.run, lease.token, "error", wrong))
                self._count("error")
            elif begun is not None:
                left = await self._aexecute(_Attempt(self, begun, lease.token), lease, (held, thread_lease))
                if left is None:
                    return
                remaining = left
        try:
            await lease.commit(_put_back(lease, remaining), delay_ms=delay)
        except LeaseLost:
            log.warning("graph worker %s: lost thread %r before putting it back", self.name, tid)
            return
        if not remaining:
            await self._q.run(core.wake(tid))

    async def _astream(self, a: _Attempt, lease: AsyncLease, last: Any) -> None:
        core, run = self._q.core, a.run
        kw = a.stream_kw()
        if a.astream_events:
            chunks = self.graph.astream_events(a.input(last), a.config, version="v2", **kw)
        else:
            chunks = self.graph.astream(a.input(last), a.config, **kw)
        try:
            async for chunk in chunks:
                stop = await self._q.run(core.emit(run, a.token, a.events(chunk), seq=a.seq()))
                if not a.carry_on(stop, self._stopping.is_set(), lease.lost):
                    break
        except (RunLost, LeaseLost, BackendError):
            raise
        except Exception as exc:
            await self._q.run(core.emit(run, a.token, a.failed(exc), seq=a.seq()))
        finally:
            await chunks.aclose()

    async def _aexecute(
        self, a: _Attempt, lease: AsyncLease, held: tuple[contextlib.AsyncExitStack, Any] | None = None
    ) -> int | None:
        """The asyncio twin of ``_execute`` (``graph.astream``)."""
        core, run = self._q.core, a.run
        try:
            async with held[0] if held else self.saver.lease(run.thread_id, **a.lease_args) as entered:
                thread_lease = held[1] if held else entered
                stop = "" if held else await self._q.run(core.emit(run, a.token, [], seq=a.seq()))
                if a.started(stop, self._stopping.is_set(), lease.lost):
                    a.guard(lease, thread_lease)
                    last = await self.saver.aget_tuple(a.thread_config) if a.needs_last else None
                    await self._watch.around(a, self._astream(a, lease, last))
                if a.stop == "rollback":
                    await self.saver.adelete_for_runs([run.run_id])
                back, status, error, gone = a.ending()
                if not back:  # as _execute: ended before the saver lease goes
                    left: int = await self._q.run(core.finish(run, a.token, status, error, gone=gone))
        except (RunLost, LeaseLost) as exc:
            self._lost(run, exc)
            return None
        except (BackendError, ThreadBusy) as exc:
            if isinstance(exc, BackendError):
                self._redis_failed(run, exc)
            with contextlib.suppress(Exception):
                await self._q.run(core.finish(run, a.token, "pending"))
                await lease.release(reason=f"{type(exc).__name__}")
            return None
        if back:
            await self._q.run(core.finish(run, a.token, "pending"))
            await lease.release()
            return None
        self._count(status)
        return left
