"""``PoolStore`` and ``AsyncPoolStore``: thin I/O shells over ``PoolCore``."""

from __future__ import annotations

from typing import Any

from .clients import RedisClient
from .core.pool import DEFAULT_MAX_RECORD_BYTES, DEFAULT_PAGE_SIZE, POOL_SCRIPTS, PoolCore
from .pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecord,
    PoolSnapshot,
    RunMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from .wire import DEFAULT_WAIT_TIMEOUT_MS, AsyncShell, RetryPolicy, StoreShell, SyncShell, block_slice_ms

__all__ = ["AsyncPoolStore", "PoolStore"]


class _Pools(StoreShell[PoolCore]):
    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        max_records: int | None = None,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        retry: RetryPolicy | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        max_messages: int | None = None,
        message_ttl_ms: int | None = None,
        shards: int | None = None,
    ) -> None:
        core = PoolCore(
            namespace, max_records=max_records, max_record_bytes=max_record_bytes, page_size=page_size,
            max_messages=max_messages, message_ttl_ms=message_ttl_ms,
        )  # fmt: skip
        super().__init__(client, core, POOL_SCRIPTS, retry, wait_replicas, wait_timeout_ms, shards)
        self._slice_ms = block_slice_ms(client)

    @property
    def max_records(self) -> int | None:
        """How many records each pool's log keeps (None: all)."""
        return self._core.max_records

    @property
    def max_messages(self) -> int | None:
        """How many messages (with their idempotency keys) each pool keeps (None: all)."""
        return self._core.max_messages

    @property
    def message_ttl_ms(self) -> int | None:
        """How long each pool keeps a message and its idempotency key (None: for ever)."""
        return self._core.message_ttl_ms


class PoolStore(_Pools, SyncShell[PoolCore]):
    """Agent pools (the seed's ``AgentPoolStore``) on a ``redis.Redis`` / ``RedisCluster`` client.

    State lives in hashes, the record log in a Redis Stream; every state
    change and its record are written by one script. ``max_records`` trims
    each pool's log to that many records (a watch cursor older than the
    oldest kept record raises ``CursorExpired``); ``max_record_bytes`` caps one
    write; ``retry`` bounds retries of connection errors (every write is safe
    to re-send); ``page_size`` is the most records (``watch``) or fields per
    hash (``snapshot``) one script reads, so no call blocks Redis for long
    whatever the pool's size. ``wait_replicas=n``
    follows every write with ``WAIT n wait_timeout_ms`` (and ``WAITAOF`` where the
    server has it and AOF is on) in the same round trip, raising
    ``WriteNotReplicated`` when fewer acknowledged; the first write raises
    ``ReplicationUnsafe`` if the primary has fewer than n replicas online (see
    :ref:`durability <wait_replicas-replica-acknowledgement>`).

    Message retention keeps a long-lived pool bounded: ``max_messages`` keeps each
    pool's newest that many messages, ``message_ttl_ms`` drops those recorded longer
    ago (either or both; each ``record_message`` drops at most a few of the oldest,
    so the work per call stays bounded). A dropped message leaves the snapshot
    and ``message_receipt``; its idempotency key is forgotten with it, so a re-send
    with that key is recorded again, as a new message with a new cursor.
    """

    def open(self, pool_id: str, config: PoolConfig) -> PoolSnapshot:
        """Open the pool (appending ``pool_opened`` if new); ``ConfigConflict`` if open with another config."""
        return self._run(self._core.open(pool_id, config))

    def snapshot(self, pool_id: str) -> PoolSnapshot:
        """The pool's state at one moment (its ``cursor``); ``PoolNotOpen`` if never opened.

        A large pool is read in pages (``page_size`` fields of each hash per
        script), then the records written meanwhile are replayed over the
        pages: the result is exactly the state after record ``cursor``, as if
        read at once. ``CursorExpired`` only if ``max_records`` trims those
        records faster than they can be read, several times in a row.
        """
        return self._run(self._core.snapshot(pool_id))

    def record_created(self, pool_id: str) -> Cursor:
        """Mark the pool created and append ``pool_created``; once: later calls return the first cursor."""
        return self._run(self._core.record_created(pool_id))

    def join(self, pool_id: str, member: PoolMember) -> Cursor:
        """Add (or replace) a member and append ``member_joined``.

        Joining the member exactly as it is already joined writes nothing and
        returns that join's cursor (a re-send, by the library or by you).
        """
        return self._run(self._core.join(pool_id, member))

    def leave(self, pool_id: str, run_id: str) -> tuple[PoolMember, Cursor]:
        """Remove a member and append ``member_left``; ``NotAMember`` if it is not one.

        A run that already left (and did not join again) is a re-sent leave:
        it returns that leave's member and cursor and writes nothing, for the
        pool's latest 1,000 leaves.
        """
        return self._run(self._core.leave(pool_id, run_id))

    def message_receipt(self, pool_id: str, idempotency_key: str) -> MessageReceipt | None:
        """The receipt first recorded under ``idempotency_key``, or None."""
        return self._run(self._core.message_receipt(pool_id, idempotency_key))

    def record_message(self, pool_id: str, message: RunMessage, receipt: MessageReceipt) -> Cursor:
        """Store the message and append ``run_message``; a recorded idempotency key returns the first cursor."""
        return self._run(self._core.record_message(pool_id, message, receipt))

    def wake_registration(self, pool_id: str, idempotency_key: str) -> WakeRegistration | None:
        """The registration first recorded under ``idempotency_key``, or None."""
        return self._run(self._core.wake_registration(pool_id, idempotency_key))

    def wake(self, pool_id: str, condition_id: str) -> StoredWake | None:
        """The stored wake condition ``condition_id``, or None."""
        return self._run(self._core.wake(pool_id, condition_id))

    def record_wake(
        self, pool_id: str, condition: WakeCondition, compiled_filter: Any, registration: WakeRegistration
    ) -> Cursor:
        """Store the wake condition and append ``wake``; a recorded idempotency key returns the first cursor."""
        return self._run(self._core.record_wake(pool_id, condition, compiled_filter, registration))

    def watch(
        self, pool_id: str, after: Cursor | None = None, *, count: int | None = None, block_ms: int | None = None
    ) -> list[PoolRecord]:
        """The records after ``after`` (from the oldest kept record if None), in order, at most ``count``.

        ``count=None`` returns every record up to the last one written when the
        call started, read ``page_size`` per script (so a large backlog never
        blocks Redis); pass ``count`` to bound what one call holds in memory.
        With ``block_ms`` > 0 and nothing new yet, waits up to that long for new
        records (``XREAD BLOCK``, in slices inside the client's read timeout)
        and returns ``[]`` if none came. Raises ``CursorExpired`` if retention
        trimmed records after ``after``.
        """
        op = self._core.watch(pool_id, after, count=count, block_ms=block_ms, slice_ms=self._slice_ms)
        return self._run(op)

    def next_event_sequence(self, pool_id: str) -> int:
        """The pool's next event number: 1, 2, 3, ... (no record appended)."""
        return self._run(self._core.next_event_sequence(pool_id))

    def list(self) -> list[str]:
        """Every pool id of the namespace, sorted."""
        return self._run(self._core.list())


class AsyncPoolStore(_Pools, AsyncShell[PoolCore]):
    """The asyncio twin of :class:`PoolStore` (``redis.asyncio`` clients)."""

    async def open(self, pool_id: str, config: PoolConfig) -> PoolSnapshot:
        """Open the pool (appending ``pool_opened`` if new); ``ConfigConflict`` if open with another config."""
        return await self._run(self._core.open(pool_id, config))

    async def snapshot(self, pool_id: str) -> PoolSnapshot:
        """The pool's state at one moment (its ``cursor``), read in pages; see :meth:`PoolStore.snapshot`."""
        return await self._run(self._core.snapshot(pool_id))

    async def record_created(self, pool_id: str) -> Cursor:
        """Mark the pool created and append ``pool_created``; once: later calls return the first cursor."""
        return await self._run(self._core.record_created(pool_id))

    async def join(self, pool_id: str, member: PoolMember) -> Cursor:
        """Add (or replace) a member and append ``member_joined``; the same member again returns its join."""
        return await self._run(self._core.join(pool_id, member))

    async def leave(self, pool_id: str, run_id: str) -> tuple[PoolMember, Cursor]:
        """Remove a member and append ``member_left``; ``NotAMember`` if it is not one (see :meth:`PoolStore.leave`)."""
        return await self._run(self._core.leave(pool_id, run_id))

    async def message_receipt(self, pool_id: str, idempotency_key: str) -> MessageReceipt | None:
        """The receipt first recorded under ``idempotency_key``, or None."""
        return await self._run(self._core.message_receipt(pool_id, idempotency_key))

    async def record_message(self, pool_id: str, message: RunMessage, receipt: MessageReceipt) -> Cursor:
        """Store the message and append ``run_message``; a recorded idempotency key returns the first cursor."""
        return await self._run(self._core.record_message(pool_id, message, receipt))

    async def wake_registration(self, pool_id: str, idempotency_key: str) -> WakeRegistration | None:
        """The registration first recorded under ``idempotency_key``, or None."""
        return await self._run(self._core.wake_registration(pool_id, idempotency_key))

    async def wake(self, pool_id: str, condition_id: str) -> StoredWake | None:
        """The stored wake condition ``condition_id``, or None."""
        return await self._run(self._core.wake(pool_id, condition_id))

    async def record_wake(
        self, pool_id: str, condition: WakeCondition, compiled_filter: Any, registration: WakeRegistration
    ) -> Cursor:
        """Store the wake condition and append ``wake``; a recorded idempotency key returns the first cursor."""
        return await self._run(self._core.record_wake(pool_id, condition, compiled_filter, registration))

    async def watch(
        self, pool_id: str, after: Cursor | None = None, *, count: int | None = None, block_ms: int | None = None
    ) -> list[PoolRecord]:
        """The records after ``after`` (from the oldest kept record if None), in order, at most ``count``.

        As :meth:`PoolStore.watch`; the wait is ``XREAD BLOCK`` on one pooled
        connection, so the event loop stays free.
        """
        op = self._core.watch(pool_id, after, count=count, block_ms=block_ms, slice_ms=self._slice_ms)
        return await self._run(op)

    async def next_event_sequence(self, pool_id: str) -> int:
        """The pool's next event number: 1, 2, 3, ... (no record appended)."""
        return await self._run(self._core.next_event_sequence(pool_id))

    async def list(self) -> list[str]:
        """Every pool id of the namespace, sorted."""
        return await self._run(self._core.list())
