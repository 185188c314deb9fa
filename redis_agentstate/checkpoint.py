"""``CheckpointStore`` and ``AsyncCheckpointStore``: thin I/O shells over ``CheckpointCore``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .clients import RedisClient
from .core.checkpoint import DEFAULT_MAX_PAYLOAD_BYTES, CheckpointCore
from .core.lease import DEFAULT_LEASE_MS, stamp_claim_sent
from .core.limits import LimitState
from .core.reshard import ReshardReport, reshard
from .errors import TaskCancelled
from .models import Checkpoint
from .wire import DEFAULT_WAIT_TIMEOUT_MS, AsyncShell, RetryPolicy, StoreShell, SyncShell, scripts
from .wire.waker import AsyncWaker, SyncWaker

# The stores build leases (``lease()``); lease.py names its store by a protocol (``LeaseStore``) and
# both take stamp_claim_sent and DEFAULT_LEASE_MS from core/lease.py, below both: no import circle.
if TYPE_CHECKING:
    from .lease import AsyncLease, Lease

__all__ = ["AsyncCheckpointStore", "CheckpointStore"]


def _mover(shards: int, progress: Callable[[int, int], None] | None) -> Callable[[Any, bool], Any]:
    return lambda keys, cluster: reshard(keys, shards, cluster=cluster, progress=progress)


class _Checkpoints(StoreShell[CheckpointCore]):
    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        history_cache: int = 1024,
        retry: RetryPolicy | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        max_attempts: int | None = None,
        terminal_ttl_ms: int | None = None,
        shards: int | None = None,
    ) -> None:
        core = CheckpointCore(
            namespace,
            max_payload_bytes=max_payload_bytes,
            history_cache=history_cache,
            max_attempts=max_attempts,
            terminal_ttl_ms=terminal_ttl_ms,
        )
        super().__init__(client, core, scripts.CHECKPOINT_SCRIPTS + scripts.LIMIT_SCRIPTS, retry, wait_replicas,
                         wait_timeout_ms, shards)  # fmt: skip
        self._waker: Any = None

    def _claim_args(self, token: object, lease_ms: object, block_ms: object) -> tuple[str, int, int | None]:
        return self._core.claim_args(token, lease_ms, block_ms)

    @property
    def terminal_ttl_ms(self) -> int | None:
        """How long a task this store makes terminal lives unacknowledged (None: until acknowledged)."""
        return self._core.terminal_ttl_ms


class CheckpointStore(_Checkpoints, SyncShell[CheckpointCore]):
    """Fenced checkpoints of agent tasks on a ``redis.Redis`` / ``RedisCluster`` client.

    Every method is one script round trip (``list`` is one pipelined read per
    page). ``max_payload_bytes`` caps what one write may send; ``history_cache``
    is how many tasks' decoded histories are kept so reads fetch only new
    entries; ``retry`` bounds retries of connection errors (every operation is
    safe to re-send). ``wait_replicas=n``
    follows every write with ``WAIT n wait_timeout_ms`` (and ``WAITAOF`` where the
    server has it and AOF is on) in the same round trip, raising
    ``WriteNotReplicated`` when fewer acknowledged; the first write raises
    ``ReplicationUnsafe`` if the primary has fewer than n replicas online (see
    :ref:`durability <wait_replicas-replica-acknowledgement>`).
    ``terminal_ttl_ms``: a task this store makes terminal (``finalize``, or a
    ``commit`` carrying ``terminal_result``) expires that long after, with all of its keys, unless
    acknowledged first; the index entries it leaves are dropped by the readers that meet them
    (``list``, ``agentstate list``/``stats``), never by a scan (see :ref:`retention`).

    ``max_attempts=n`` parks a poison task: the claim that would be attempt
    n + 1 at one cycle (n claims ended without a commit: their leases lapsed,
    SIGKILLed workers included, or they were released with a reason), or the
    release with a reason of attempt n, parks the task instead, in the same
    script. A parked task is not runnable (``claim_next`` skips it, ``claim``
    raises ``TaskParked``), keeps its status, attempts and last failure, is
    listed by ``list_parked`` (``agentstate list --parked``) and runs again
    after ``requeue``. The default is None (off): parking holds work back
    until an operator acts, which only the application can decide is right
    (a task failing on a dependency's outage should be retried, not parked),
    and the library's behaviour before attempts were counted is kept. The
    limit travels with each claim and release, so every store of a fleet
    should use the same value.
    """

    def create(self, cp: Checkpoint, *, delay_ms: int | None = None) -> bool:
        """Store ``cp`` as a new task; False if the task already exists. ``delay_ms``: its first cycle
        is not claimable before that long from now (server clock; a scheduled start)."""
        return self._run(self._core.create(cp, delay_ms=delay_ms))

    def save(self, cp: Checkpoint) -> None:
        """Store ``cp`` unconditionally (admin/import): no fencing, history replaced."""
        self._run(self._core.save(cp))

    def load(self, task_id: str) -> Checkpoint | None:
        """The task's checkpoint, or None if it does not exist."""
        return self._run(self._core.load(task_id))

    def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Checkpoint | None:
        """Claim ``cycle_index`` under a lease of ``lease_ms`` (server clock); None if no such task."""
        return self._run(self._core.claim(task_id, cycle_index, token=token, lease_ms=lease_ms))

    def claim_next(self, *, token: str, lease_ms: int, block_ms: int | None = None) -> Checkpoint | None:
        """Claim the next cycle of any runnable task (the longest-waiting first, fleet-wide); None when none is due.

        ``block_ms``: with nothing due, wait up to that long for work to become due (woken by Redis
        through the store's one shared subscription, see :ref:`blocking <blocking-block_ms>`) instead of
        answering None at once.
        """
        tok, lease, block = self._claim_args(token, lease_ms, block_ms)
        if block is None:
            sent = time.monotonic()
            return stamp_claim_sent(self._run(self._core.claim_next(token=tok, lease_ms=lease)), sent)
        self._layout()  # the waker subscribes to every shard's channel: it needs the shard count
        waker = self._wakes()
        # One call however many wake-ups it probes at: one operation to telemetry (one span).
        with self._operation("claim_next") as run:
            found, sent = waker.claim(lambda: run(self._core.claim_next_probe(tok, lease)), block, time.monotonic)
        return stamp_claim_sent(found.checkpoint, sent)

    def lease(
        self,
        task_id: str,
        cycle_index: int,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        **options: Any,
    ) -> Lease:
        """A context manager that claims ``cycle_index`` and keeps the lease alive (see :class:`Lease`)."""
        from .lease import Lease

        return Lease(self, task_id, cycle_index, token=token, lease_ms=lease_ms, **options)

    def commit(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        replace_history: bool = False,
        delay_ms: int | None = None,
    ) -> bool:
        """Write the claimed cycle's checkpoint; False if fenced out. ``delay_ms``: the next cycle is not
        claimable before that long from now (server clock); with status ``wait_user``, the wait's deadline."""
        return self._run(self._core.commit(cp, token=token, expected_revision=expected_revision,
                                           replace_history=replace_history, delay_ms=delay_ms))  # fmt: skip

    def commit_and_claim(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        lease_ms: int,
        next_token: str | None = None,
        replace_history: bool = False,
    ) -> Checkpoint | None:
        """Commit the claimed cycle and claim the next one of the same task, in one round trip.

        ``cp`` is written as ``commit`` writes it (fenced by ``token`` and
        ``expected_revision``); then cycle ``cp.cycle_index + 1`` is claimed for
        ``next_token`` (default: ``token``) under a lease of ``lease_ms``, and
        that claim is returned, as ``claim`` would return it. None: fenced out,
        nothing written. ``cp`` must be runnable (status running, no
        ``terminal_result``), else InvalidArgument before anything is sent. A
        re-send after a lost reply returns the same claim; a ``ClaimRejected``
        (one of ``claim``'s) means the commit had applied but, after a lost
        reply, the claim was taken by another worker since.
        """
        return self._run(
            self._core.commit_and_claim(
                cp, token=token, expected_revision=expected_revision, lease_ms=lease_ms, next_token=next_token,
                replace_history=replace_history,
            )
        )  # fmt: skip

    def renew(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> bool:
        """Extend a live lease to ``lease_ms`` from now; False if it is no longer ours or expired."""
        return (
            self.renew_until(task_id, token=token, expected_revision=expected_revision, lease_ms=lease_ms) is not None
        )

    def renew_until(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> int | None:
        """Like ``renew``, returning the new ``lease_expires_at_ms`` (server clock) or None."""
        return self._run(self._core.renew(task_id, token=token, expected_revision=expected_revision, lease_ms=lease_ms))

    def _lease_renew(
        self, task_id: str, *, token: str, expected_revision: int, lease_ms: int
    ) -> tuple[int | None, TaskCancelled | None]:
        return self._run(self._core.lease_renew(task_id, token=token, expected_revision=expected_revision,
                                                lease_ms=lease_ms))  # fmt: skip

    def _wakes(self) -> SyncWaker:
        if self._waker is None:
            self._waker = SyncWaker(self._client, self._core.keys, self._core.announced)
        return self._waker  # type: ignore[no-any-return]

    def _watch_cancel(self, task_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when ``task_id`` is cancelled (a held lease's hint); returns the unwatch."""
        return self._wakes().watch(task_id, callback)

    def finalize(self, cp: Checkpoint, *, expected_revision: int, replace_history: bool = False) -> bool:
        """Write a terminal checkpoint (``cp.terminal_result`` required); False if fenced out.

        For a task nobody holds a claim on (an operator closing it, say):
        refused while any claim is held, and needs no token. A worker that
        holds the cycle finishes it with :meth:`Lease.finalize` instead (or a
        ``commit`` carrying ``terminal_result``), which is fenced by its token.
        """
        return self._run(self._core.finalize(cp, expected_revision=expected_revision, replace_history=replace_history))

    def acknowledge_terminal(self, task_id: str, *, expected_revision: int) -> bool:
        """Delete a terminal checkpoint at ``expected_revision``; False otherwise.

        True too when it already went at that revision: acknowledged before (a
        re-send), or expired (``terminal_ttl_ms``) less than ``min(ttl, 1 h)`` ago.
        """
        return self._run(self._core.acknowledge_terminal(task_id, expected_revision=expected_revision))

    def delete(self, task_id: str) -> None:
        """Remove the task whatever its state."""
        self._run(self._core.delete(task_id))

    def release(
        self, task_id: str, *, token: str, expected_revision: int, after_ms: int = 1, reason: str | None = None
    ) -> bool:
        """Give a claimed cycle up: claimable again after ``after_ms``; False if the claim is not ours any more.

        ``reason`` records the attempt as failed (kept as ``last_failure``; it parks the task when it
        was attempt ``max_attempts``); without one the attempt is given back (a shutdown is no failure).
        """
        return self._release(task_id, token=token, expected_revision=expected_revision, after_ms=after_ms,
                             reason=reason) is not None  # fmt: skip

    def _release(self, task_id: str, **kw: Any) -> str | None:
        """``release``: ``"released"``, ``"parked"`` or None (``CheckpointCore.release``)."""
        return self._run(self._core.release(task_id, **kw))

    def requeue(self, task_id: str) -> None:
        """Make a parked task runnable again at its cycle, attempts from 0 (``TaskNotFound``, ``NotParked``)."""
        self._run(self._core.requeue(task_id))

    def cancel(self, task_id: str, *, reason: str | None = None) -> bool:
        """End the task at once, status ``cancelled``, its holder fenced out: False if terminal already.

        ``reason`` is kept as ``last_failure``; ``TaskNotFound`` when there is no such task.
        """
        return self._run(self._core.cancel(task_id, reason=reason))

    def resume(self, task_id: str, *, message: Any = None) -> bool:
        """A task waiting for a person (``wait_user``) runs again, due now, ``message`` appended to its
        messages; True. NotWaiting if it is not waiting, TaskNotFound if there is no such task."""
        return self._run(self._core.resume(task_id, message=message))

    def list_parked(self) -> list[str]:
        """Every parked task id of the namespace, sorted."""
        return self._run(self._core.list_parked())

    def set_concurrency_limit(self, key: str, limit: int | None) -> None:
        """At most ``limit`` live leases of the tasks whose ``concurrency_key`` is ``key``, fleet-wide
        (None: no limit). A claim over it raises ``ConcurrencyLimited``; ``claim_next`` serves others."""
        self._run(self._core.set_concurrency_limit(key, limit))

    def concurrency_limits(self) -> list[LimitState]:
        """Every limited key of the namespace with its limit and live leases (``agentstate stats``)."""
        return self._run(self._core.concurrency_limits())

    def _step_load(self, task_id: str, **lease: Any) -> tuple[bool, Any] | None:
        """A durable step's stored result, for :meth:`Lease.step` (``CheckpointCore.step_load``)."""
        return self._run(self._core.step_load(task_id, **lease))

    def _step_record(self, task_id: str, result: Any, **lease: Any) -> tuple[bool, Any]:
        """Record a durable step's result, for :meth:`Lease.step` (``CheckpointCore.step_record``)."""
        return self._run(self._core.step_record(task_id, result, **lease))

    def _summaries(self, task_ids: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
        """Server time and a summary row per task, for the CLI (``CheckpointCore.summaries``)."""
        return self._run(self._core.summaries(task_ids))

    def list(self) -> list[str]:
        """Every task id of the namespace, sorted."""
        return self._run(self._core.list())

    def reshard(self, shards: int, *, progress: Callable[[int, int], None] | None = None) -> ReshardReport:
        """Grow the namespace (its tasks, pools, KV keys and LangGraph threads) to ``shards`` shards, a
        multiple of its count, while workers keep working (``agentstate reshard``; docs/operations.md).
        ``progress(moved, of)`` after each old shard; run again with the same count to finish one that stopped."""
        return self._reshard(_mover(shards, progress))  # type: ignore[no-any-return]


class AsyncCheckpointStore(_Checkpoints, AsyncShell[CheckpointCore]):
    """The asyncio twin of :class:`CheckpointStore` (``redis.asyncio`` clients)."""

    async def create(self, cp: Checkpoint, *, delay_ms: int | None = None) -> bool:
        """Store ``cp`` as a new task; False if it already exists (``delay_ms``: :meth:`CheckpointStore.create`)."""
        return await self._run(self._core.create(cp, delay_ms=delay_ms))

    async def save(self, cp: Checkpoint) -> None:
        """Store ``cp`` unconditionally (admin/import): no fencing, history replaced."""
        await self._run(self._core.save(cp))

    async def load(self, task_id: str) -> Checkpoint | None:
        """The task's checkpoint, or None if it does not exist."""
        return await self._run(self._core.load(task_id))

    async def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Checkpoint | None:
        """Claim ``cycle_index`` under a lease of ``lease_ms`` (server clock); None if no such task."""
        return await self._run(self._core.claim(task_id, cycle_index, token=token, lease_ms=lease_ms))

    async def claim_next(self, *, token: str, lease_ms: int, block_ms: int | None = None) -> Checkpoint | None:
        """Claim the next cycle of any runnable task, waiting ``block_ms`` (:meth:`CheckpointStore.claim_next`)."""
        tok, lease, block = self._claim_args(token, lease_ms, block_ms)
        if block is None:
            sent = time.monotonic()
            return stamp_claim_sent(await self._run(self._core.claim_next(token=tok, lease_ms=lease)), sent)
        await self._layout()
        waker = self._wakes()
        with self._operation("claim_next") as run:  # one operation to telemetry (see the sync twin)
            found, sent = await waker.claim(lambda: run(self._core.claim_next_probe(tok, lease)), block, time.monotonic)
        return stamp_claim_sent(found.checkpoint, sent)

    def lease(
        self,
        task_id: str,
        cycle_index: int,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        **options: Any,
    ) -> AsyncLease:
        """An ``async with`` context that claims ``cycle_index`` and keeps the lease alive (``lease.AsyncLease``)."""
        from .lease import AsyncLease

        return AsyncLease(self, task_id, cycle_index, token=token, lease_ms=lease_ms, **options)

    async def commit(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        replace_history: bool = False,
        delay_ms: int | None = None,
    ) -> bool:
        """Write the claimed cycle's checkpoint; False if fenced out (``delay_ms``: :meth:`CheckpointStore.commit`)."""
        return await self._run(self._core.commit(cp, token=token, expected_revision=expected_revision,
                                                 replace_history=replace_history, delay_ms=delay_ms))  # fmt: skip

    async def commit_and_claim(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        lease_ms: int,
        next_token: str | None = None,
        replace_history: bool = False,
    ) -> Checkpoint | None:
        """Commit the claimed cycle and claim the next one (see :meth:`CheckpointStore.commit_and_claim`)."""
        return await self._run(
            self._core.commit_and_claim(
                cp, token=token, expected_revision=expected_revision, lease_ms=lease_ms, next_token=next_token,
                replace_history=replace_history,
            )
        )  # fmt: skip

    async def renew(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> bool:
        """Extend a live lease to ``lease_ms`` from now; False if it is no longer ours or expired."""
        return (
            await self.renew_until(task_id, token=token, expected_revision=expected_revision, lease_ms=lease_ms)
            is not None
        )

    async def renew_until(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> int | None:
        """Like ``renew``, returning the new ``lease_expires_at_ms`` (server clock) or None."""
        return await self._run(
            self._core.renew(task_id, token=token, expected_revision=expected_revision, lease_ms=lease_ms)
        )

    async def _lease_renew(
        self, task_id: str, *, token: str, expected_revision: int, lease_ms: int
    ) -> tuple[int | None, TaskCancelled | None]:
        return await self._run(self._core.lease_renew(task_id, token=token, expected_revision=expected_revision,
                                                      lease_ms=lease_ms))  # fmt: skip

    def _wakes(self) -> AsyncWaker:
        if self._waker is None:
            self._waker = AsyncWaker(self._client, self._core.keys, self._core.announced)
        return self._waker  # type: ignore[no-any-return]

    def _watch_cancel(self, task_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when ``task_id`` is cancelled (as :meth:`CheckpointStore._watch_cancel`); from the
        store's event loop."""
        return self._wakes().watch(task_id, callback)

    async def finalize(self, cp: Checkpoint, *, expected_revision: int, replace_history: bool = False) -> bool:
        """Write a terminal checkpoint for an unclaimed task (see :meth:`CheckpointStore.finalize`)."""
        return await self._run(
            self._core.finalize(cp, expected_revision=expected_revision, replace_history=replace_history)
        )

    async def acknowledge_terminal(self, task_id: str, *, expected_revision: int) -> bool:
        """Delete a terminal checkpoint at ``expected_revision``; False otherwise."""
        return await self._run(self._core.acknowledge_terminal(task_id, expected_revision=expected_revision))

    async def delete(self, task_id: str) -> None:
        """Remove the task whatever its state."""
        await self._run(self._core.delete(task_id))

    async def release(
        self, task_id: str, *, token: str, expected_revision: int, after_ms: int = 1, reason: str | None = None
    ) -> bool:
        """Give a claimed cycle up (see :meth:`CheckpointStore.release`)."""
        return await self._release(task_id, token=token, expected_revision=expected_revision, after_ms=after_ms,
                                   reason=reason) is not None  # fmt: skip

    async def _release(self, task_id: str, **kw: Any) -> str | None:
        """``release``: ``"released"``, ``"parked"`` or None (``CheckpointCore.release``)."""
        return await self._run(self._core.release(task_id, **kw))

    async def requeue(self, task_id: str) -> None:
        """Make a parked task runnable again (see :meth:`CheckpointStore.requeue`)."""
        await self._run(self._core.requeue(task_id))

    async def cancel(self, task_id: str, *, reason: str | None = None) -> bool:
        """End the task at once, status ``cancelled`` (see :meth:`CheckpointStore.cancel`)."""
        return await self._run(self._core.cancel(task_id, reason=reason))

    async def resume(self, task_id: str, *, message: Any = None) -> bool:
        """A waiting task runs again, ``message`` appended (see :meth:`CheckpointStore.resume`)."""
        return await self._run(self._core.resume(task_id, message=message))

    async def list_parked(self) -> list[str]:
        """Every parked task id of the namespace, sorted."""
        return await self._run(self._core.list_parked())

    async def set_concurrency_limit(self, key: str, limit: int | None) -> None:
        """At most ``limit`` live leases per concurrency key (see :meth:`CheckpointStore.set_concurrency_limit`)."""
        await self._run(self._core.set_concurrency_limit(key, limit))

    async def concurrency_limits(self) -> list[LimitState]:
        """Every limited key with its limit and live leases (see :meth:`CheckpointStore.concurrency_limits`)."""
        return await self._run(self._core.concurrency_limits())

    async def _step_load(self, task_id: str, **lease: Any) -> tuple[bool, Any] | None:
        """A durable step's stored result, for :meth:`AsyncLease.step` (``CheckpointCore.step_load``)."""
        return await self._run(self._core.step_load(task_id, **lease))

    async def _step_record(self, task_id: str, result: Any, **lease: Any) -> tuple[bool, Any]:
        """Record a durable step's result, for :meth:`AsyncLease.step` (``CheckpointCore.step_record``)."""
        return await self._run(self._core.step_record(task_id, result, **lease))

    async def _summaries(self, task_ids: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
        """Server time and a summary row per task, for operator tooling (``CheckpointCore.summaries``)."""
        return await self._run(self._core.summaries(task_ids))

    async def list(self) -> list[str]:
        """Every task id of the namespace, sorted."""
        return await self._run(self._core.list())

    async def reshard(self, shards: int, *, progress: Callable[[int, int], None] | None = None) -> ReshardReport:
        """The asyncio twin of :meth:`CheckpointStore.reshard`."""
        return await self._reshard(_mover(shards, progress))  # type: ignore[no-any-return]
