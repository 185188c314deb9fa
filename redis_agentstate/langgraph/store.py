"""``AgentStateStore`` and ``AsyncAgentStateStore``: LangGraph's ``BaseStore`` (long-term memory) on
plain Redis or a Redis Cluster, thin I/O shells over ``StoreCore`` (``_store_core.py``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from typing import Any

from langgraph.store.base import BaseStore, IndexConfig, PutOp, Result, TTLConfig
from langgraph.store.base import Op as StoreOp

from ..clients import RedisClient
from ..spec import StoreSpec
from ..wire import AsyncShell, RetryPolicy, StoreShell, SyncShell
from ._store_cache import DEFAULT_BYTES
from ._store_core import LGS_SCRIPTS, Plan, StoreCore

__all__ = ["AgentStateStore", "AsyncAgentStateStore"]

#: One ``abatch`` call waiting for its turn: its ops and the future of its results.
_Unit = tuple[list[StoreOp], "asyncio.Future[list[Result]]"]

log = logging.getLogger("redis_agentstate.langgraph")


async def _settle(future: asyncio.Future[list[Result]] | None, work: Awaitable[Any]) -> BaseException | None:
    """Await ``work`` into ``future`` (its result, or its error); the error, if any. A cancellation or exit
    is raised on, after the future has it."""
    try:
        result = await work
    except BaseException as exc:
        if future is not None and not future.done():
            future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
        return exc
    if future is not None and not future.done():
        future.set_result(result)
    return None


def _interval_s(store: _Stores, minutes: float | None) -> float:
    ttl = store.ttl_config or {}
    return 60.0 * float(minutes or ttl.get("sweep_interval_minutes") or 5)


class _Stores(StoreShell[StoreCore], BaseStore):
    #: LangGraph's flag: ``put(..., ttl=)`` and ``ttl={"default_ttl": ...}`` are honoured.
    supports_ttl = True

    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        retry: RetryPolicy | None = None,
        shards: int | None = None,
        vector_cache_bytes: int = DEFAULT_BYTES,
    ) -> None:
        core = StoreCore(namespace, index, ttl, vector_cache_bytes)
        StoreShell.__init__(self, client, core, LGS_SCRIPTS, retry, shards=shards)
        self.ttl_config = core.ttl
        self.index_config = core.index

    def _plan(self, ops: Iterable[StoreOp]) -> Plan:
        plan = self._core.plan(ops)
        self._core.embed_targets(plan)
        return plan

    def setup(self) -> None:
        """Nothing to create (as ``PostgresStore.setup``, for code written against it): keys are made by the
        first write, scripts loaded on first use, the namespace's layout read by the first operation."""

    async def asetup(self) -> None:
        """The async face of :meth:`setup` (a no-op too)."""


class AgentStateStore(_Stores, SyncShell[StoreCore]):
    """LangGraph long-term memory on a ``redis.Redis`` or ``RedisCluster`` client (no modules needed).

    ``InMemoryStore``'s semantics: namespaces of labels, put/get/delete, ``search`` with a namespace
    prefix, filters (``$eq $ne $gt $gte $lt $lte``, nested dicts, plain equality), limit/offset
    and, with ``index={"dims", "embed", "fields"}``, a query ranked by cosine similarity (exact
    where the prefix holds at most 1,000 live items; above, over what a vector index kept in Redis
    finds: ``_store_ann.py``); ``list_namespaces``; ``ttl={"default_ttl", "refresh_on_read"}`` in
    minutes (an expired item is never returned; ``sweep()`` drops them all). Values are
    JSON-serializable dicts. The ``a``-prefixed methods run the blocking ones in the default
    executor, so the store also serves ``graph.ainvoke``.

    ``vector_cache_bytes`` bounds the client memory that keeps the vectors of the namespaces it ranked
    (float32, least recently used out first; default 64 MiB, 0 turns it off): a search without a
    filter then ranks from it and reads only the items it returns, in the same scripts that check the
    namespaces have not changed since (``_store_cache.py``: never a stale answer).
    """

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        cluster: bool = False,
        namespace: str = "agentstate",
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        retry: RetryPolicy | None = None,
        shards: int | None = None,
        vector_cache_bytes: int = DEFAULT_BYTES,
    ) -> Iterator[AgentStateStore]:
        """``with AgentStateStore.from_conn_string(url) as store:``: a store on a client of its own for
        ``url`` (any URL :class:`StoreSpec` takes; ``cluster=True`` for a Redis Cluster), closed at the end."""
        client = StoreSpec.redis(conn_string, cluster=cluster).client()
        try:
            yield cls(
                client,
                namespace,
                index=index,
                ttl=ttl,
                retry=retry,
                shards=shards,
                vector_cache_bytes=vector_cache_bytes,
            )
        finally:
            client.close()

    def __enter__(self) -> AgentStateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stops the TTL sweeper if one runs; the client is the caller's (``from_conn_string`` closes its own)."""
        self.stop_ttl_sweeper()

    def batch(self, ops: Iterable[StoreOp]) -> list[Result]:
        plan = self._plan(ops)
        embeddings = self._core.embeddings
        documents = embeddings.embed_documents(list(plan.texts)) if plan.texts else []
        queries = {q: embeddings.embed_query(q) for q in plan.queries}
        return self._run(self._core.execute(plan, documents, queries))

    async def abatch(self, ops: Iterable[StoreOp]) -> list[Result]:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(self.batch, list(ops)))

    def sweep(self) -> int:
        """Drop every expired item now (readers never return one anyway); the number dropped."""
        return self._run(self._core.sweep())

    def sweep_ttl(self) -> int:
        """:meth:`sweep` under ``PostgresStore``'s name."""
        return self.sweep()

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> concurrent.futures.Future[None]:
        """Sweep every ``sweep_interval_minutes`` (else the ttl config's, else 5) on a daemon thread, as
        ``PostgresStore.start_ttl_sweeper``: a future done when the sweeper stops (cancel it to stop it).
        Without a ttl config there is nothing to sweep: the future is done at once."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.ttl_config:
            future.set_result(None)
            return future
        running = self.__dict__.get("_sweeper")
        if running is not None and running[0].is_alive():
            future.add_done_callback(lambda f: running[1].set() if f.cancelled() else None)
            return future
        stop = threading.Event()
        interval = _interval_s(self, sweep_interval_minutes)

        def loop() -> None:
            try:
                while not stop.wait(interval):
                    try:
                        dropped = self.sweep()
                        log.debug("store TTL sweep dropped %d item(s)", dropped)
                    except Exception:  # a failed sweep is retried at the next interval
                        log.exception("store TTL sweep failed")
            finally:
                if not future.done():
                    future.set_result(None)

        thread = threading.Thread(target=loop, name="agentstate-store-ttl-sweeper", daemon=True)
        future.add_done_callback(lambda f: stop.set() if f.cancelled() else None)
        self.__dict__["_sweeper"] = (thread, stop)
        thread.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; False if it was still running after ``timeout`` seconds."""
        running = self.__dict__.get("_sweeper")
        if running is None or not running[0].is_alive():
            return True
        running[1].set()
        running[0].join(timeout)
        return not running[0].is_alive()


class AsyncAgentStateStore(_Stores, AsyncShell[StoreCore]):
    """The asyncio twin of :class:`AgentStateStore` (``redis.asyncio`` clients). Its sync methods
    run on the store's event loop from another thread (as LangGraph's async stores)."""

    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        retry: RetryPolicy | None = None,
        shards: int | None = None,
        vector_cache_bytes: int = DEFAULT_BYTES,
    ) -> None:
        super().__init__(
            client, namespace, index=index, ttl=ttl, retry=retry, shards=shards, vector_cache_bytes=vector_cache_bytes
        )
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        *,
        cluster: bool = False,
        namespace: str = "agentstate",
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        retry: RetryPolicy | None = None,
        shards: int | None = None,
        vector_cache_bytes: int = DEFAULT_BYTES,
    ) -> AsyncIterator[AsyncAgentStateStore]:
        """``async with AsyncAgentStateStore.from_conn_string(url) as store:`` (see
        :meth:`AgentStateStore.from_conn_string`), on a ``redis.asyncio`` client closed at the end."""
        client = StoreSpec.redis(conn_string, cluster=cluster).async_client()
        try:
            yield cls(
                client,
                namespace,
                index=index,
                ttl=ttl,
                retry=retry,
                shards=shards,
                vector_cache_bytes=vector_cache_bytes,
            )
        finally:
            await client.aclose()

    async def __aenter__(self) -> AsyncAgentStateStore:
        self._bind()
        return self

    def _bind(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    async def abatch(self, ops: Iterable[StoreOp]) -> list[Result]:
        """Run ``ops``; the batches of the coroutines that call in the same turn of the event loop run as
        one (as LangGraph's ``AsyncBatchedBaseStore``): their reads together (the gets in one round trip),
        then their puts together, so the reads of all of them see the state before the writes of all of
        them. A batch that fails its checks, or whose reads fail, fails alone (nothing was written); an
        error while the merged puts are sent is the error of every batch with a put."""
        self._bind()
        given = list(ops)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Result]] = loop.create_future()
        pending: list[_Unit] = self.__dict__.setdefault("_pending", [])
        pending.append((given, future))
        if len(pending) == 1:
            loop.call_soon(self._drain)
        return await future

    def _drain(self) -> None:
        units = [u for u in self.__dict__.pop("_pending", []) if not u[1].done()]
        if units:
            task = asyncio.get_running_loop().create_task(self._run_units(units))
            running: set[asyncio.Task[None]] = self.__dict__.setdefault("_draining", set())
            running.add(task)
            task.add_done_callback(running.discard)

    async def _run_units(self, units: list[_Unit]) -> None:
        try:
            if len(units) == 1 or not await self._run_merged(units):
                for given, future in units:
                    await _settle(future, self._run_ops(given))
        except BaseException as exc:  # no caller is left waiting, whatever went wrong
            for _, future in units:
                if not future.done():
                    future.set_exception(exc)
            raise

    async def _run_merged(self, units: list[_Unit]) -> bool:
        """The units as one batch; False (nothing written) when they must run one by one instead."""
        ops = [op for given, _ in units for op in given]
        try:
            reads, writes = self._plan([op for op in ops if not isinstance(op, PutOp)]), None
            if any(isinstance(op, PutOp) for op in ops):
                writes = self._plan([op for op in ops if isinstance(op, PutOp)])
                embedded = await self._embed(writes)
            results = iter(await self._execute(reads) if reads.ops else [])
        except Exception:
            return False
        if writes is not None:
            failed = await _settle(None, self._run(self._core.execute(writes, *embedded)))
            if failed is not None:
                for given, future in units:
                    if not future.done() and any(isinstance(op, PutOp) for op in given):
                        future.set_exception(failed)
        for given, future in units:
            answers = [None if isinstance(op, PutOp) else next(results) for op in given]
            if not future.done():
                future.set_result(answers)
        return True

    async def _embed(self, plan: Plan) -> tuple[list[Any], dict[str, Any]]:
        embeddings = self._core.embeddings
        documents = await embeddings.aembed_documents(list(plan.texts)) if plan.texts else []
        queries = {}
        for q in plan.queries:
            queries[q] = await embeddings.aembed_query(q)
        return documents, queries

    async def _run_ops(self, ops: list[StoreOp]) -> list[Result]:
        return await self._execute(self._plan(ops))

    async def _execute(self, plan: Plan) -> list[Result]:
        documents, queries = await self._embed(plan)
        return await self._run(self._core.execute(plan, documents, queries))

    async def asweep(self) -> int:
        """Drop every expired item now (see :meth:`AgentStateStore.sweep`); the number dropped."""
        self._bind()
        return await self._run(self._core.sweep())

    async def sweep_ttl(self) -> int:
        """:meth:`asweep` under ``AsyncPostgresStore``'s name."""
        return await self.asweep()

    async def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> asyncio.Task[None]:
        """Sweep every ``sweep_interval_minutes`` (else the ttl config's, else 5) in a task of the running
        loop, as ``AsyncPostgresStore.start_ttl_sweeper``; cancel it or ``await stop_ttl_sweeper()``."""
        self._bind()
        running: asyncio.Task[None] | None = self.__dict__.get("_sweeper")
        if running is not None and not running.done():
            return running
        interval = _interval_s(self, sweep_interval_minutes)

        async def loop() -> None:
            if not self.ttl_config:
                return
            while True:
                await asyncio.sleep(interval)
                try:
                    dropped = await self.asweep()
                    log.debug("store TTL sweep dropped %d item(s)", dropped)
                except Exception:  # a failed sweep is retried at the next interval
                    log.exception("store TTL sweep failed")

        task = asyncio.get_running_loop().create_task(loop())
        self.__dict__["_sweeper"] = task
        return task

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper task; False if it had not stopped after ``timeout`` seconds."""
        task: asyncio.Task[None] | None = self.__dict__.get("_sweeper")
        if task is None or task.done():
            return True
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=timeout)
        return bool(done)

    async def __aexit__(self, *exc_info: object) -> None:
        """Stops the TTL sweeper if one runs; the client is the caller's (``from_conn_string`` closes its own)."""
        await self.stop_ttl_sweeper()

    def batch(self, ops: Iterable[StoreOp]) -> list[Result]:
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        coro = self.abatch(list(ops))
        if loop is None or running is loop or not loop.is_running():
            coro.close()
            raise asyncio.InvalidStateError(
                "Synchronous calls to AsyncAgentStateStore are only allowed from a thread other than the "
                "event loop's, while it runs. From the loop, use the async interface, e.g. `await store.aget(...)`."
            )
        result: list[Result] = asyncio.run_coroutine_threadsafe(coro, loop).result()
        return result

    def sweep(self) -> int:
        """The sync face of :meth:`asweep` (from a thread other than the store's loop)."""
        loop = self.loop
        if loop is None or not loop.is_running():
            raise asyncio.InvalidStateError("AsyncAgentStateStore.sweep: use `await store.asweep()`")
        result: int = asyncio.run_coroutine_threadsafe(self.asweep(), loop).result()
        return result
