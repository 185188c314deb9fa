"""``RunQueue`` and ``AsyncRunQueue``: LangGraph runs on Redis, thin I/O shells over ``RunCore``.

::

    queue = RunQueue(redis.Redis(), namespace="agentstate")
    run = queue.create("thread-1", {"messages": ["hi"]}, multitask_strategy="enqueue",
                       stream_mode=["values", "messages"])
    for event in queue.stream(run.run_id):        # live, until the run ends; resume with after=event.id
        print(event.event, event.data)
    queue.join(run.run_id).status                  # 'success'

Runs are executed by ``GraphWorker``s (``agentstate langgraph worker MODULE:ATTR``) anywhere in
the fleet; see ``_runs_core`` for the layout and ``docs/langgraph-runs.md`` for the semantics.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ..checkpoint import AsyncCheckpointStore, CheckpointStore
from ..clients import RedisClient
from ..keys import validate_namespace
from ..wire import AsyncShell, RetryPolicy, StoreShell, SyncShell, block_slice_ms
from ..wire.replicas import DEFAULT_WAIT_TIMEOUT_MS
from ..wire.scripts import CHECKPOINT_SCRIPTS
from ._runs_core import (
    DEFAULT_MAX_ACTIVE,
    DEFAULT_MAX_EVENTS,
    DEFAULT_RUN_TTL_MS,
    Run,
    RunCore,
    RunEvent,
    check_timeout_s,
)
from .scripts import LG_RUN_SCRIPTS

__all__ = ["AsyncRunQueue", "RunQueue", "queue_namespace"]


def queue_namespace(namespace: str) -> str:
    """The namespace a run queue keeps its threads' tasks and runs in: its own, so that a
    GraphWorker's ``claim_next`` never meets the tasks of a ``CheckpointStore`` of ``namespace``."""
    return validate_namespace(validate_namespace(namespace) + ".runs")


class _Queue(StoreShell[RunCore]):
    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        *,
        serde: SerializerProtocol | None = None,
        run_ttl_ms: int = DEFAULT_RUN_TTL_MS,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_active: int = DEFAULT_MAX_ACTIVE,
        retry: RetryPolicy | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        shards: int | None = None,
    ) -> None:
        self.queue_namespace = queue_namespace(namespace)
        core = RunCore(self.queue_namespace, serde or JsonPlusSerializer(),
                       run_ttl_ms=run_ttl_ms, max_events=max_events, max_active=max_active)  # fmt: skip
        super().__init__(client, core, CHECKPOINT_SCRIPTS + LG_RUN_SCRIPTS, retry, wait_replicas,
                         wait_timeout_ms, shards)  # fmt: skip
        self._options = {"retry": retry, "wait_replicas": wait_replicas, "wait_timeout_ms": wait_timeout_ms,
                         "shards": shards}  # fmt: skip
        self._slice = block_slice_ms(client)

    @property
    def serde(self) -> SerializerProtocol:
        return self._core.serde


class RunQueue(_Queue, SyncShell[RunCore]):
    """Runs of LangGraph threads on a ``redis.Redis`` / ``RedisCluster`` client.

    ``create`` queues a run with LangGraph Platform's double-texting strategies (``reject``,
    ``enqueue``, ``interrupt``, ``rollback``), atomically with the thread's active runs;
    ``stream`` reads its events from the start or after an id, live while it runs; ``join``
    waits for its final status; ``cancel`` stops it wherever its worker is. An ended run is kept
    ``run_ttl_ms`` (a day), with its last ``max_events`` events.
    """

    _tasks: CheckpointStore | None = None

    def create(
        self,
        thread_id: Any,
        input: Any = None,
        *,
        command: Any = None,
        config: Mapping[str, Any] | None = None,
        multitask_strategy: str = "reject",
        stream_mode: str | Sequence[str] = "values",
        metadata: Mapping[str, Any] | None = None,
        subgraphs: bool = False,
        run_id: str | None = None,
        interrupt_before: str | Sequence[str] | None = None,
        interrupt_after: str | Sequence[str] | None = None,
        webhook: str | None = None,
        after_ms: int = 0,
        concurrency_key: str | None = None,
    ) -> Run:
        """A new pending run of ``thread_id``; ``RunRejected`` if the strategy refuses it. ``subgraphs``:
        record the subgraphs' events too, each named ``<mode>|<namespace>`` (LangGraph's server's names).
        ``run_id``: the run's id (a new uuid4 by default); a run of that id that exists already is
        answered as is, nothing created (an idempotent create: the same id sent twice makes one run).
        ``interrupt_before`` / ``interrupt_after``: nodes the graph stops before / after (``"*"``: all), as
        ``graph.stream`` takes them. ``after_ms``: the run starts no earlier than this long from now (server
        clock; runs of the thread behind it wait too). ``webhook``: a URL recorded with the run (``agentstate
        serve`` POSTs the run's result to it). ``concurrency_key``: the key of the thread's task, when this
        run is the thread's first (a per-key concurrency limit, ``tasks.set_concurrency_limit``)."""
        return self._run(self._core.create(thread_id, input, command=command, config=config,
                                           multitask_strategy=multitask_strategy, stream_mode=stream_mode,
                                           metadata=metadata, subgraphs=subgraphs, run_id=run_id,
                                           interrupt_before=interrupt_before, interrupt_after=interrupt_after,
                                           webhook=webhook, after_ms=after_ms,
                                           concurrency_key=concurrency_key))  # fmt: skip

    def get(self, run_id: str) -> Run | None:
        """The run, or None (never created, rolled back, or expired)."""
        return self._run(self._core.get(run_id))

    def list(self, thread_id: Any, *, limit: int = 100) -> list[Run]:
        """The thread's kept runs, newest first."""
        return self._run(self._core.runs_of(thread_id, limit))

    def stream(self, run_id: str, *, after: str | None = None, block_ms: int | None = None) -> Iterator[RunEvent]:
        """The run's events after ``after`` (from the start by default), live while it runs, ending
        after its final ``end`` event; ``block_ms``: stop when no event came for that long."""
        cur = self._core.cursor(run_id, after, block_ms)
        while not cur.done:
            yield from self._run(self._core.events(cur, self._slice))

    def join(self, run_id: str, *, timeout_s: float | None = None) -> Run:
        """Wait for the run's final status (``TimeoutError`` after ``timeout_s``: None or a finite
        number of seconds, else ``InvalidArgument``; ``RunRejected`` if the thread's task was
        cancelled meanwhile, so that the run can never run)."""
        timeout_s = check_timeout_s(timeout_s)
        cur, deadline = self._core.cursor(run_id, None, None), _deadline(timeout_s)
        while (run := self._run(self._core.join_step(cur, self._slice, _left_ms(deadline)))) is None:
            _check_deadline(deadline, run_id)
        return run

    def cancel(self, run_id: str, *, action: str = "interrupt") -> bool:
        """Stop the run (``interrupt``: progress kept; ``rollback``: the run and its checkpoints deleted);
        False if it had ended already."""
        return self._run(self._core.cancel(run_id, action))

    def delete(self, run_id: str) -> bool:
        """Delete an ended run (its record and events; the checkpoints it wrote stay); False if it is
        still pending or running (cancel it first). ``RunNotFound`` if there is no such run."""
        return self._run(self._core.delete(run_id))

    @property
    def tasks(self) -> CheckpointStore:
        """The checkpoint store of the threads' tasks (what a GraphWorker claims)."""
        if self._tasks is None:
            self._tasks = CheckpointStore(self._client, self.queue_namespace, **self._options)  # type: ignore[arg-type]
        return self._tasks


class AsyncRunQueue(_Queue, AsyncShell[RunCore]):
    """The asyncio twin of :class:`RunQueue` (a ``redis.asyncio`` client)."""

    _tasks: AsyncCheckpointStore | None = None

    async def create(
        self,
        thread_id: Any,
        input: Any = None,
        *,
        command: Any = None,
        config: Mapping[str, Any] | None = None,
        multitask_strategy: str = "reject",
        stream_mode: str | Sequence[str] = "values",
        metadata: Mapping[str, Any] | None = None,
        subgraphs: bool = False,
        run_id: str | None = None,
        interrupt_before: str | Sequence[str] | None = None,
        interrupt_after: str | Sequence[str] | None = None,
        webhook: str | None = None,
        after_ms: int = 0,
        concurrency_key: str | None = None,
    ) -> Run:
        """A new pending run of ``thread_id`` (see ``RunQueue.create``)."""
        return await self._run(self._core.create(thread_id, input, command=command, config=config,
                                                 multitask_strategy=multitask_strategy, stream_mode=stream_mode,
                                                 metadata=metadata, subgraphs=subgraphs, run_id=run_id,
                                           interrupt_before=interrupt_before, interrupt_after=interrupt_after,
                                           webhook=webhook, after_ms=after_ms,
                                           concurrency_key=concurrency_key))  # fmt: skip

    async def get(self, run_id: str) -> Run | None:
        """The run, or None (never created, rolled back, or expired)."""
        return await self._run(self._core.get(run_id))

    async def list(self, thread_id: Any, *, limit: int = 100) -> list[Run]:
        """The thread's kept runs, newest first."""
        return await self._run(self._core.runs_of(thread_id, limit))

    async def stream(
        self, run_id: str, *, after: str | None = None, block_ms: int | None = None
    ) -> AsyncIterator[RunEvent]:
        """The run's events after ``after``, live while it runs (see ``RunQueue.stream``)."""
        cur = self._core.cursor(run_id, after, block_ms)
        while not cur.done:
            for event in await self._run(self._core.events(cur, self._slice)):
                yield event

    async def join(self, run_id: str, *, timeout_s: float | None = None) -> Run:
        """Wait for the run's final status (``TimeoutError`` after ``timeout_s``: None or a finite
        number of seconds, else ``InvalidArgument``; ``RunRejected`` if the thread's task was
        cancelled meanwhile, so that the run can never run)."""
        timeout_s = check_timeout_s(timeout_s)
        cur, deadline = self._core.cursor(run_id, None, None), _deadline(timeout_s)
        while (run := await self._run(self._core.join_step(cur, self._slice, _left_ms(deadline)))) is None:
            _check_deadline(deadline, run_id)
        return run

    async def cancel(self, run_id: str, *, action: str = "interrupt") -> bool:
        """Stop the run (see ``RunQueue.cancel``)."""
        return await self._run(self._core.cancel(run_id, action))

    async def delete(self, run_id: str) -> bool:
        """Delete an ended run (see ``RunQueue.delete``)."""
        return await self._run(self._core.delete(run_id))

    @property
    def tasks(self) -> AsyncCheckpointStore:
        """The checkpoint store of the threads' tasks (what a GraphWorker claims)."""
        if self._tasks is None:
            self._tasks = AsyncCheckpointStore(self._client, self.queue_namespace, **self._options)  # type: ignore[arg-type]
        return self._tasks


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


def _left_ms(deadline: float | None) -> int | None:
    return None if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))


def _check_deadline(deadline: float | None, run_id: str) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"run {run_id} did not end in time")
