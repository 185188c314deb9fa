"""``AgentStateSaver`` and ``AsyncAgentStateSaver``: LangGraph checkpointers, thin I/O shells over ``SaverCore``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from datetime import timedelta
from typing import Any, Generic, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol, maybe_add_typed_methods

from ..clients import RedisClient
from ..core.lease import Clock, KeptLease, LeaseState, LeaseTiming, Renewed, new_token
from ..errors import LeaseLost
from ..spec import StoreSpec
from ..wire import AsyncShell, Op, RetryPolicy, StoreShell, SyncShell, block_slice_ms
from ..wire.keeper import CancelOnLoss, TaskKeeper, ThreadKeeper
from ._core import LG_SCRIPTS, SaverCore, _ident
from ._leases import Acquired

__all__ = ["AgentStateSaver", "AsyncAgentStateSaver", "AsyncThreadLease", "ThreadLease"]

log = logging.getLogger("redis_agentstate.langgraph")


class _Savers(StoreShell[SaverCore], BaseCheckpointSaver[str]):
    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = "agentstate",
        serde: SerializerProtocol | None = None,
        ttl: float | timedelta | None = None,
        refresh_on_read: bool = False,
        retry: RetryPolicy | None = None,
        shards: int | None = None,
    ) -> None:
        BaseCheckpointSaver.__init__(self, serde=serde)
        core = SaverCore(namespace, self.serde, ttl, refresh_on_read)
        StoreShell.__init__(self, client, core, LG_SCRIPTS, retry, shards=shards)

    # The core serializes: a serializer assigned after construction (``saver.serde =
    # EncryptedSerializer(...)``, as LangGraph's docs do) must reach it, or values go out in plaintext.
    @property
    def serde(self) -> SerializerProtocol:
        serde: SerializerProtocol = self.__dict__.get("_serde", BaseCheckpointSaver.serde)
        return serde

    @serde.setter
    def serde(self, value: SerializerProtocol) -> None:
        value = maybe_add_typed_methods(value)
        self.__dict__["_serde"] = value
        core = self.__dict__.get("_core")
        if core is not None:
            core.serde = value

    def __copy__(self) -> Any:
        """A shallow copy with a core of its own (its serde can change alone) sharing this one's
        lease tokens and list cache: ``with_allowlist`` (``StateGraph.compile``) copies the saver,
        and a lease taken on this saver must fence the compiled graph's writes."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__["_core"] = dataclasses.replace(self._core)
        return clone

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> Any:
        """The base class's shallow clone with a stricter serde (``StateGraph.compile`` calls this).

        The clone's core serializes with the clone's serde, and shares this saver's lease
        tokens and list cache: a lease taken on this saver fences the compiled graph's writes.
        """
        return super().with_allowlist(extra_allowlist)

    def setup(self) -> None:
        """Nothing to create (as ``PostgresSaver.setup``, for code written against it): the
        saver's keys are made by its first write and its scripts are loaded on first use."""

    async def asetup(self) -> None:
        """The async face of :meth:`setup` (a no-op too)."""

    def get_next_version(self, current: str | None, channel: None) -> str:
        return SaverCore.next_version(current)

    def _slice_ms(self) -> int | None:
        return block_slice_ms(self._client)


class AgentStateSaver(_Savers, SyncShell[SaverCore]):
    """A LangGraph checkpointer on a ``redis.Redis`` or ``RedisCluster`` client.

    ``ttl`` (seconds or a ``timedelta``) expires every key of a thread that long after
    its last write (set by the same script as the write; ``refresh_on_read`` also
    refreshes it on ``get_tuple``). ``lease(thread_id)`` makes this saver the thread's
    one writer. The ``a``-prefixed methods run the blocking ones in the default
    executor, so the saver also serves ``graph.ainvoke``.
    """

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        cluster: bool = False,
        namespace: str = "agentstate",
        serde: SerializerProtocol | None = None,
        ttl: float | timedelta | None = None,
        refresh_on_read: bool = False,
        retry: RetryPolicy | None = None,
    ) -> Iterator[AgentStateSaver]:
        """``with AgentStateSaver.from_conn_string(url) as saver:``, as LangGraph's Postgres and Redis
        savers: a saver on a client of its own for ``url`` (any URL :class:`StoreSpec` takes;
        ``cluster=True`` for a Redis Cluster), closed when the block ends."""
        client = StoreSpec.redis(conn_string, cluster=cluster).client()
        try:
            yield cls(client, namespace=namespace, serde=serde, ttl=ttl, refresh_on_read=refresh_on_read, retry=retry)
        finally:
            client.close()

    def __enter__(self) -> AgentStateSaver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Nothing to close: the client is the caller's (``from_conn_string`` closes its own)."""

    # ---- the BaseCheckpointSaver interface --------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._core.get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        lister = self._core.lister(config, filter=filter, before=before, limit=limit)
        while (page := self._run(lister.next_page())) is not None:
            yield from page

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._run(self._core.put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._run(self._core.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._core.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._core.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._core.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        skipped = self._run(self._core.prune(thread_ids, strategy=strategy))
        if skipped:
            log.info("prune left %d leased thread(s) alone: %s", len(skipped), skipped)

    # ---- the async twins, on the default executor ----------------------

    async def _in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = await self._in_thread(self.get_tuple, config)
        return result

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        lister = self._core.lister(config, filter=filter, before=before, limit=limit)
        while (page := await self._in_thread(self._run, lister.next_page())) is not None:
            for item in page:
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        result: RunnableConfig = await self._in_thread(self.put, config, checkpoint, metadata, new_versions)
        return result

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._in_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._in_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._in_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._in_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._in_thread(self.prune, thread_ids, strategy=strategy)

    # ---- one writer per thread -------------------------------------------

    def lease(
        self, thread_id: str | int, *, lease_ms: int = 30_000, wait_ms: int = 0, clock: Clock | None = None
    ) -> ThreadLease:
        """Claim ``thread_id`` for this saver (``with saver.lease(tid): graph.invoke(...)``).

        While held, this saver's writes to the thread are fenced in Redis (``LeaseLost``
        once another holder took over) and every other writer's are refused
        (``ThreadBusy``). A held thread makes this raise ``ThreadBusy`` after ``wait_ms``
        (0: at once); a waiter is woken by the release, not by polling. The lease is kept by
        the store leases' keeper (:mod:`redis_agentstate.lease`'s rules; ``clock``: its
        :class:`~redis_agentstate.lease.Clock`, for tests).
        """
        return ThreadLease(self, thread_id, lease_ms=lease_ms, wait_ms=wait_ms, clock=clock)


S = TypeVar("S", bound=_Savers)


class _ThreadLeaseBase(KeptLease, Generic[S]):
    """What both thread leases share, with no I/O: the checks, the acquire/renew/release steps and
    the lease state. The keeper (``wire.keeper``, the store leases' own) asks it, through
    :class:`KeptLease`, for every decision; the shells only block or await."""

    _log = log

    def __init__(self, saver: S, thread_id: object, *, lease_ms: int, wait_ms: int, clock: Clock | None) -> None:
        # The id as every write stores it (an int or UUID thread id is its str): the token the
        # lease leaves on the core must be the one the saver's writes look up, and release
        # must find the same keys.
        self.thread_id = _ident(thread_id, "thread_id")
        super().__init__(LeaseTiming(lease_ms), clock)
        self.wait_ms = wait_ms
        self.token = new_token()
        self._saver = saver
        #: Ended by ``revoke``: the token stays on the saver until the release that ends the block.
        self._revoked = False

    def check(self) -> None:
        """Raise ``LeaseLost`` if the keeper could not keep the lease."""
        state = self._state
        if state is not None and (reason := state.loss_reason(self._clock.now())) is not None:
            raise LeaseLost(f"lease on thread {self.thread_id!r} lost: {reason}", task_id=self.thread_id)

    @property
    def renewals(self) -> int:
        """Renewals confirmed so far."""
        return 0 if self._state is None else self._state.renewals

    def _describe(self, what: str) -> str:
        return f"{what} [thread={self.thread_id!r} token={self.token}]"

    def _acquire_op(self) -> Op[Acquired]:
        return self._saver._core.acquire(
            self.thread_id, self.token, self.timing.lease_ms, self.wait_ms, self._saver._slice_ms(), self._clock.now
        )

    def _acquired(self, got: Acquired) -> None:
        """Hold the lease the claim answered, counted from when its attempt was sent."""
        self._state = LeaseState(self.timing, sent_at=got.sent_at, expires_at_ms=got.expires_at_ms)

    def _begin_release(self) -> LeaseState | None:
        """End the lease as released; its state, or None if it had already ended (nothing to release)."""
        state = self._state
        if state is None:
            return None
        with self._lock:
            if state.ended is not None:
                return None
            state.end("released")  # the keeper sends no further renewal
        return state

    def _release_op(self) -> Op[bool]:
        return self._saver._core.release(self.thread_id, self.token)

    def _revoke_op(self) -> Op[bool]:
        return self._saver._core.revoke(self.thread_id, self.token)

    def _renew_op(self) -> Op[int | None]:
        return self._saver._core.renew(self.thread_id, self.token, self.timing.lease_ms)


class ThreadLease(_ThreadLeaseBase["AgentStateSaver"]):
    """A claimed thread, kept alive by a background thread until the ``with`` block ends."""

    def __init__(
        self, saver: AgentStateSaver, thread_id: object, *, lease_ms: int, wait_ms: int, clock: Clock | None = None
    ) -> None:
        super().__init__(saver, thread_id, lease_ms=lease_ms, wait_ms=wait_ms, clock=clock)
        self._keeper = ThreadKeeper(self, self._renewal, f"lease-{self.thread_id}")

    def __enter__(self) -> ThreadLease:
        self._acquired(self._saver._run(self._acquire_op()))
        self._keeper.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def revoke(self) -> bool:
        """End the lease now, from any thread (the run under it was cancelled): released in Redis, its
        token kept on the saver, so a checkpoint write still under way with it is refused (a lost
        lease), never written unfenced; the release that ends the ``with`` block forgets the token.
        A renewal in flight is not waited for: its reply finds the lease ended, and Redis refuses it
        once the release has landed."""
        state = self._begin_release()
        if state is None:
            return False
        self._revoked = True
        self._keeper.wake()
        return bool(self._saver._run(self._revoke_op()))

    def release(self) -> bool:
        """Give the thread up and wake one waiter; False if it was not ours any more."""
        state = self._begin_release()
        if state is None:
            if self._revoked:
                self._saver._core.forget(self.thread_id, self.token)
            return False
        self._keeper.wake()
        # A renewal in flight lands first (it takes at most what was left of the deadline).
        self._keeper.join(timeout=state.time_left(self._clock.now()))
        return self._saver._run(self._release_op())

    def _renewal(self) -> Renewed:
        return self._saver._run(self._renew_op()), None


class AsyncAgentStateSaver(_Savers, AsyncShell[SaverCore]):
    """The asyncio twin of :class:`AgentStateSaver` (``redis.asyncio`` clients).

    As ``AsyncPostgresSaver``: the sync methods may be called from another thread
    than the event loop's (they run the coroutine there); on the loop's own thread
    they raise ``asyncio.InvalidStateError``.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = "agentstate",
        serde: SerializerProtocol | None = None,
        ttl: float | timedelta | None = None,
        refresh_on_read: bool = False,
        retry: RetryPolicy | None = None,
        shards: int | None = None,
    ) -> None:
        super().__init__(
            client, namespace=namespace, serde=serde, ttl=ttl, refresh_on_read=refresh_on_read, retry=retry,
            shards=shards,
        )  # fmt: skip
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
        serde: SerializerProtocol | None = None,
        ttl: float | timedelta | None = None,
        refresh_on_read: bool = False,
        retry: RetryPolicy | None = None,
    ) -> AsyncIterator[AsyncAgentStateSaver]:
        """``async with AsyncAgentStateSaver.from_conn_string(url) as saver:`` (see
        :meth:`AgentStateSaver.from_conn_string`), on a ``redis.asyncio`` client closed at the end."""
        client = StoreSpec.redis(conn_string, cluster=cluster).async_client()
        try:
            yield cls(client, namespace=namespace, serde=serde, ttl=ttl, refresh_on_read=refresh_on_read, retry=retry)
        finally:
            await client.aclose()

    async def __aenter__(self) -> AsyncAgentStateSaver:
        self._bind()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Nothing to close: the client is the caller's (``from_conn_string`` closes its own)."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._bind()
        return await self._run(self._core.get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        self._bind()
        lister = self._core.lister(config, filter=filter, before=before, limit=limit)
        while (page := await self._run(lister.next_page())) is not None:
            for item in page:
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._bind()
        return await self._run(self._core.put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._bind()
        await self._run(self._core.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        self._bind()
        await self._run(self._core.delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._bind()
        await self._run(self._core.delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._bind()
        await self._run(self._core.copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._bind()
        skipped = await self._run(self._core.prune(thread_ids, strategy=strategy))
        if skipped:
            log.info("prune left %d leased thread(s) alone: %s", len(skipped), skipped)

    def _bind(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    # ---- sync faces, run on the saver's loop from another thread ------------

    def _sync(self, coro: Any) -> Any:
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            coro.close()
            raise asyncio.InvalidStateError(
                "Synchronous calls to AsyncAgentStateSaver are only allowed from a thread other than the "
                "event loop's. From the loop, use the async interface, e.g. `await checkpointer.aget_tuple(...)` "
                "or `await graph.ainvoke(...)`."
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = self._sync(self.aget_tuple(config))
        return result

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._sync(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        result: RunnableConfig = self._sync(self.aput(config, checkpoint, metadata, new_versions))
        return result

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self.aprune(thread_ids, strategy=strategy))

    # ---- one writer per thread -------------------------------------------

    def lease(
        self, thread_id: str | int, *, lease_ms: int = 30_000, wait_ms: int = 0, clock: Clock | None = None
    ) -> AsyncThreadLease:
        """``async with saver.lease(tid): await graph.ainvoke(...)``: see :meth:`AgentStateSaver.lease`."""
        return AsyncThreadLease(self, thread_id, lease_ms=lease_ms, wait_ms=wait_ms, clock=clock)


class AsyncThreadLease(_ThreadLeaseBase["AsyncAgentStateSaver"]):
    """The asyncio twin of :class:`ThreadLease`: the keeper is a task, and losing the lease
    cancels the task that entered ``async with`` (it sees ``LeaseLost``), as ``AsyncLease`` does.

    The keeper cancels again every ``RECANCEL_S`` until the body has stopped: a cancel
    swallowed on the way (see ``lease.RECANCEL_S``; LangGraph's first await in ``ainvoke`` is a
    Redis command) must not let the graph run on.
    """

    def __init__(
        self,
        saver: AsyncAgentStateSaver,
        thread_id: object,
        *,
        lease_ms: int,
        wait_ms: int,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(saver, thread_id, lease_ms=lease_ms, wait_ms=wait_ms, clock=clock)
        self._keeper = TaskKeeper(self, self._renewal, f"lease-{self.thread_id}")
        self._body = CancelOnLoss()

    async def __aenter__(self) -> AsyncThreadLease:
        self._saver._bind()
        self._acquired(await self._saver._run(self._acquire_op()))
        self._body.enter()
        self._keeper.start(self._body.keeping)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        await self._body.exit(self.release, exc, self._lost_error)

    def _lost_error(self) -> LeaseLost:
        reason = self.lost_reason or "lease lost"
        return LeaseLost(f"lease on thread {self.thread_id!r} lost, work cancelled: {reason}", task_id=self.thread_id)

    async def revoke(self) -> bool:
        """End the lease now (see :meth:`ThreadLease.revoke`): released in Redis, its token kept on the
        saver until the release that ends the ``async with`` block; the body is not cancelled."""
        state = self._begin_release()
        if state is None:
            return False
        self._revoked = True
        self._keeper.wake()
        return bool(await self._saver._run(self._revoke_op()))

    async def release(self) -> bool:
        """Give the thread up and wake one waiter; False if it was not ours any more."""
        state = self._begin_release()
        if state is None:
            if self._revoked:
                self._saver._core.forget(self.thread_id, self.token)
            return False
        await self._keeper.stop()  # a renewal in flight lands first
        return await self._saver._run(self._release_op())

    def _announce_lost(self, fenced: bool) -> None:
        self._body.cancel(self._describe("lease lost, work cancelled"))

    async def _renewal(self) -> Renewed:
        return await self._saver._run(self._renew_op()), None
