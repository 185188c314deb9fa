"""Lease keepers: claim a cycle, renew it in the background, and say so loudly when it is lost.

::

    with store.lease("task-1", cycle_index=4, lease_ms=30_000) as lease:
        cp = lease.checkpoint           # as claimed (cycle_index 3, claimed_cycle 4)
        ...                             # work; call lease.check() between steps
        cp.cycle_index = lease.cycle_index
        lease.commit(cp)                # fenced by the claim's revision

    async with async_store.lease("task-1", 4) as lease:   # the same, on asyncio
        ...

How loss is decided (the same rules for both shells, in :class:`LeaseState`,
which does no I/O and reads no clock of its own; it, the timing knobs, the
clock and everything else the two shells share live in ``core/lease.py``,
and the renewals are sent by the one keeper, ``wire/keeper.py``, on a thread
or a task, which also keeps the LangGraph saver's thread leases; the classes
here only claim, write and release):

* The lease is counted from the moment the claim (or the last confirmed
  renewal) was *sent*, on the local monotonic clock (``CLOCK_BOOTTIME`` where
  the OS has it, so a suspended machine does not freeze it). The server set
  its expiry from its own ``TIME`` read after that moment, so the local count
  can only end early, never late, whatever the wall clocks say.
* The keeper renews every ``renew_interval_ms`` and gives up at
  ``renew_deadline_ms`` after the last confirmed send: from then on the lease
  is lost even if Redis would still honour it, and a renewal still in flight
  then is not waited for. ``lease_ms -
  renew_deadline_ms`` is the safety margin for clock-rate differences and for
  the work to notice. A renewal that Redis refuses (another worker holds the
  task, or the checkpoint moved on) loses the lease at once; a renewal that
  cannot reach Redis is retried until the deadline; a renewal that raises
  anything else, or a keeper that crashes, loses it at once.
* Knobs are validated the way Kubernetes validates leader election:
  ``lease_ms > renew_deadline_ms > renew_interval_ms * 1.2`` and all positive.

Once lost: :attr:`Lease.lost` is True, :meth:`Lease.check` and every later
``commit``/``finalize`` raise :class:`~redis_agentstate.errors.LeaseLost`, the
``on_lost`` callback runs and an error is logged; the async keeper also
cancels the task that entered ``async with`` (which then sees ``LeaseLost``
instead of ``CancelledError``), and again every :data:`RECANCEL_S` until it
has left the block, since a cancel can be swallowed on its way. A commit that
reaches Redis is still fenced there by the claim's revision, so even a worker
that ignores all of this can never overwrite a newer claim.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from .core.lease import (
    DEFAULT_LEASE_MS,
    JITTER_FACTOR,
    SYSTEM_CLOCK,
    Clock,
    LeaseBase,
    LeaseState,
    LeaseTiming,
    claim_sent,
    log,
    monotonic,
)
from .errors import TaskCancelled
from .models import Checkpoint
from .wire.keeper import RECANCEL_S as RECANCEL_S  # documented here: the async keeper's re-cancel period
from .wire.keeper import CancelOnLoss, TaskKeeper, ThreadKeeper


class LeaseStore(Protocol):
    """What a :class:`Lease` calls on its store: ``redis_agentstate.CheckpointStore`` (a protocol, as
    that store builds leases with ``lease()`` and so imports this module; the calls' arguments are
    the store's own, checked where it defines them)."""

    @property
    def namespace(self) -> str: ...

    def claim(self, *args: Any, **kwargs: Any) -> Checkpoint | None: ...
    def claim_next(self, *args: Any, **kwargs: Any) -> Checkpoint | None: ...
    def commit(self, *args: Any, **kwargs: Any) -> bool: ...
    def commit_and_claim(self, *args: Any, **kwargs: Any) -> Checkpoint | None: ...
    def cancel(self, *args: Any, **kwargs: Any) -> bool: ...
    def _lease_renew(self, *args: Any, **kwargs: Any) -> tuple[int | None, TaskCancelled | None]: ...
    def _release(self, *args: Any, **kwargs: Any) -> str | None: ...
    def _step_load(self, *args: Any, **kwargs: Any) -> tuple[bool, Any] | None: ...
    def _step_record(self, *args: Any, **kwargs: Any) -> tuple[bool, Any]: ...


class AsyncLeaseStore(Protocol):
    """What an :class:`AsyncLease` awaits on its store: ``redis_agentstate.AsyncCheckpointStore``."""

    @property
    def namespace(self) -> str: ...

    async def claim(self, *args: Any, **kwargs: Any) -> Checkpoint | None: ...
    async def claim_next(self, *args: Any, **kwargs: Any) -> Checkpoint | None: ...
    async def commit(self, *args: Any, **kwargs: Any) -> bool: ...
    async def commit_and_claim(self, *args: Any, **kwargs: Any) -> Checkpoint | None: ...
    async def cancel(self, *args: Any, **kwargs: Any) -> bool: ...
    async def _lease_renew(self, *args: Any, **kwargs: Any) -> tuple[int | None, TaskCancelled | None]: ...
    async def _release(self, *args: Any, **kwargs: Any) -> str | None: ...
    async def _step_load(self, *args: Any, **kwargs: Any) -> tuple[bool, Any] | None: ...
    async def _step_record(self, *args: Any, **kwargs: Any) -> tuple[bool, Any]: ...


T = TypeVar("T")

__all__ = [
    "DEFAULT_LEASE_MS",
    "JITTER_FACTOR",
    "AsyncLease",
    "AsyncLeaseStore",
    "Clock",
    "Lease",
    "LeaseStore",
    "LeaseState",
    "LeaseTiming",
    "monotonic",
]


def _sent(cp: Checkpoint, before: float, mono: float) -> float:
    """When (on the lease's clock) the claim ``cp`` that ``claim_next`` just returned was sent.

    ``before``/``mono``: the lease clock and ``time.monotonic()`` read before the call. A claim_next
    that blocked claimed on its last attempt, whose send time its reply carries (``claim_sent``); a
    reply that carries none (a store that does not report it) counts from the call's start (earlier:
    the lease looks shorter).
    """
    sent = claim_sent(cp)
    return before if sent is None else before + max(0.0, sent - mono)


class Lease(LeaseBase[LeaseStore]):
    """A claimed cycle kept alive by a background thread (see :mod:`redis_agentstate.lease`).

    Build it with :meth:`CheckpointStore.lease` (claims on ``__enter__``) or
    :meth:`Lease.next` (claims the next runnable task now). ``on_lost(lease)``
    runs on the keeper thread when the lease is lost; :attr:`lost_event` is
    set at the same moment for work that wants to wait on it. Leaving the
    ``with`` block without a commit or finalize releases the claim at once so
    another worker can take the cycle (``release_on_exit=False`` lets it
    expire instead). ``clock`` replaces the keeper's time source and waits
    (:class:`Clock`; for tests).
    """

    def __init__(
        self,
        store: LeaseStore,
        task_id: str,
        cycle_index: int,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        on_lost: Callable[[Lease], None] | None = None,
        release_on_exit: bool = True,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            store, task_id, cycle_index, token=token, lease_ms=lease_ms, renew_interval_ms=renew_interval_ms,
            renew_deadline_ms=renew_deadline_ms, on_lost=on_lost, release_on_exit=release_on_exit, clock=clock,
        )  # fmt: skip
        self.lost_event = threading.Event()
        self._keeper = ThreadKeeper(self, self._renewal, f"agentstate-lease-{self.task_id[:40]}")

    @classmethod
    def next(
        cls,
        store: LeaseStore,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        on_lost: Callable[[Lease], None] | None = None,
        release_on_exit: bool = True,
        clock: Clock | None = None,
        block_ms: int | None = None,
    ) -> Lease | None:
        """Claim the next runnable cycle of any task (``claim_next``); None when nothing is due.

        ``block_ms``: wait up to that long for work (``claim_next``'s). The returned lease is
        claimed; its keeper starts on ``__enter__``.
        """
        token, granted = cls._next_args(token, lease_ms, renew_deadline_ms, renew_interval_ms)
        clock = clock or SYSTEM_CLOCK
        before, mono = clock.now(), time.monotonic()
        if block_ms is None:  # a store subclass may override claim_next without block_ms
            cp = store.claim_next(token=token, lease_ms=granted)
        else:
            cp = store.claim_next(token=token, lease_ms=granted, block_ms=block_ms)
        if cp is None:
            return None
        sent = _sent(cp, before, mono)
        lease = cls(
            store, cp.task_id, cp.claimed_cycle or 0, token=token, lease_ms=lease_ms,
            renew_interval_ms=renew_interval_ms, renew_deadline_ms=renew_deadline_ms, on_lost=on_lost,
            release_on_exit=release_on_exit, clock=clock,
        )  # fmt: skip
        lease._adopt(cp, sent)
        return lease

    def __enter__(self) -> Lease:
        if self._state is None:
            sent = self._clock.now()
            self._adopt(
                self._store.claim(self.task_id, self.cycle_index, token=self.token, lease_ms=self.timing.lease_ms),
                sent,
            )
        self._keeper.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._exiting(exc)
        self.close()

    def close(self) -> None:
        """Stop the keeper; release the claim if it was neither written nor lost."""
        if self._state is None:
            return
        try:
            if self._should_release():
                try:
                    self.release(reason=self._exit_reason)
                except Exception:
                    log.exception("%s", self._describe("release on exit failed; the lease will expire"))
        finally:
            with self._lock:
                self._state.end("closed")
            self._keeper.wake()
            self._keeper.join(timeout=5)

    def _lose(self, reason: str, *, fenced: bool = False, cancel: TaskCancelled | None = None) -> bool:
        first = super()._lose(reason, fenced=fenced, cancel=cancel)
        if first:
            self.lost_event.set()
        self._keeper.wake()
        return first

    def commit(self, cp: Checkpoint, *, replace_history: bool = False, delay_ms: int | None = None) -> None:
        """Write the claimed cycle (``cp.cycle_index`` must be :attr:`cycle_index`); ends the lease.

        ``delay_ms``: the next cycle is not claimable before that long from now (server clock);
        with ``cp.status`` ``wait_user``, the wait's deadline (see ``CheckpointStore.commit``).
        Raises :class:`LeaseLost` if the lease is lost, before sending
        anything, or if Redis fences the write out.
        """
        self._write(cp, final=False, replace_history=replace_history, delay_ms=delay_ms)

    def finalize(self, cp: Checkpoint, *, replace_history: bool = False) -> None:
        """Write the claimed cycle as the task's terminal checkpoint (``terminal_result`` required).

        One fenced write: the claim ends and the task becomes terminal
        atomically, so no other worker can claim a further cycle in between.
        It is a ``commit`` under this lease's token. Not the same operation as
        :meth:`CheckpointStore.finalize`, which writes a terminal checkpoint
        for a task that nobody holds a claim on (and is refused while one does).
        """
        self._write(cp, final=True, replace_history=replace_history)

    def _write(self, cp: Checkpoint, *, final: bool, replace_history: bool, delay_ms: int | None = None) -> None:
        self._check_write(cp, final=final)
        with self._guarded_write("finalized" if final else "committed") as out:
            out.applied = self._store.commit(cp, **self._write_args(replace_history, delay_ms))
        self._keeper.wake()

    def commit_and_claim(
        self, cp: Checkpoint, *, replace_history: bool = False, next_token: str | None = None
    ) -> Lease | None:
        """Commit the claimed cycle and claim the next one of the same task, in one round trip.

        Ends this lease like :meth:`commit` (and raises :class:`LeaseLost` the
        same way) and returns the next cycle's lease, claimed for
        ``next_token`` (default: this lease's token) with this lease's knobs;
        its keeper starts on ``with``. None when the cycle was committed but
        the next was not claimed: ``cp`` is not runnable (a plain commit then),
        or, after a lost reply, another worker has claimed it since.
        """
        if not self._can_continue(cp):
            self.commit(cp, replace_history=replace_history)
            return None
        self._check_write(cp, final=False)
        sent = self._clock.now()
        with self._guarded_write("committed", continuing=True) as out:
            out.next = self._store.commit_and_claim(cp, **self._continue_args(replace_history, next_token))
        self._keeper.wake()
        return self._next_lease(out.next, sent)

    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once for this cycle: a durable step named ``name``.

        The first attempt at the cycle runs ``fn`` and stores its result in Redis, fenced by
        this lease (live on the server clock), before returning it; a later attempt at the same
        cycle (after a crash, a lapse, a release for retry) gets the stored result back without
        calling ``fn``. Results are dropped when the cycle is committed (or finalized), so the
        next cycle runs its steps afresh. The result is returned as the codec reads it back
        (a tuple as a list), the same on the first run and on a replay; it must encode and be
        at most the store's ``max_payload_bytes`` (``InvalidArgument``, nothing recorded).

        A step that raises is not recorded: the exception propagates and the retry runs it
        again. A crash inside ``fn``, after its effect and before its result is stored, also
        runs it again: pass :meth:`step_key` to the service ``fn`` calls. ``LeaseLost`` when
        the lease is no longer current: nothing was read or recorded, and the work must stop.
        """
        hit, result = self._step_found(name, self._store._step_load(self.task_id, **self._step_args(name)))
        if hit:
            return result  # type: ignore[no-any-return]
        result = fn(*args, **kwargs)
        return self._step_recorded(name, self._store._step_record(self.task_id, result, **self._step_args(name)))  # type: ignore[no-any-return]

    def _successor(self, nxt: Checkpoint) -> Lease:
        return Lease(self._store, self.task_id, nxt.claimed_cycle or 0, token=nxt.claim_token,
                     clock=self._clock, **self._successor_options())  # fmt: skip

    def release(self, *, after_ms: int = 1, reason: str | None = None) -> bool:
        """Give the cycle up: it becomes claimable again after ``after_ms``. False if it was not ours any more.

        ``reason`` (e.g. the handler's exception, ``"ValueError: ..."``) records the attempt as
        failed: it is the task's ``last_failure``, and with the store's ``max_attempts`` the
        release of the last attempt parks the task (:attr:`parked`). Without a reason the attempt
        is given back (a shutdown is no failure). Leaving the ``with`` block on an exception
        releases with that exception as the reason.
        """
        args = self._begin_release(after_ms, reason)
        if args is None:
            return False
        self._keeper.wake()
        # A renewal in flight lands first (it takes at most what was left of the deadline).
        self._keeper.join(timeout=self._require().time_left(self._clock.now()))
        return self._released(self._store._release(self.task_id, **args))

    def _renewal(self) -> tuple[int | None, TaskCancelled | None]:
        return self._store._lease_renew(self.task_id, **self._renew_args())


class AsyncLease(LeaseBase[AsyncLeaseStore]):
    """The asyncio twin of :class:`Lease`: the keeper is a task, and losing the
    lease cancels the task that entered ``async with`` (it sees ``LeaseLost``),
    again every :data:`RECANCEL_S` until it has left the block (:class:`CancelOnLoss`)."""

    def __init__(
        self,
        store: AsyncLeaseStore,
        task_id: str,
        cycle_index: int,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        on_lost: Callable[[AsyncLease], None] | None = None,
        release_on_exit: bool = True,
        cancel_on_loss: bool = True,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            store, task_id, cycle_index, token=token, lease_ms=lease_ms, renew_interval_ms=renew_interval_ms,
            renew_deadline_ms=renew_deadline_ms, on_lost=on_lost, release_on_exit=release_on_exit, clock=clock,
        )  # fmt: skip
        self._cancel_on_loss = cancel_on_loss
        self._keeper = TaskKeeper(self, self._renewal, f"agentstate-lease-{self.task_id}")
        self._body = CancelOnLoss()

    @classmethod
    async def next(
        cls,
        store: AsyncLeaseStore,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        on_lost: Callable[[AsyncLease], None] | None = None,
        release_on_exit: bool = True,
        cancel_on_loss: bool = True,
        clock: Clock | None = None,
        block_ms: int | None = None,
    ) -> AsyncLease | None:
        """Claim the next runnable cycle of any task; None when nothing is due (see :meth:`Lease.next`)."""
        token, granted = cls._next_args(token, lease_ms, renew_deadline_ms, renew_interval_ms)
        clock = clock or SYSTEM_CLOCK
        before, mono = clock.now(), time.monotonic()
        if block_ms is None:
            cp = await store.claim_next(token=token, lease_ms=granted)
        else:
            cp = await store.claim_next(token=token, lease_ms=granted, block_ms=block_ms)
        if cp is None:
            return None
        sent = _sent(cp, before, mono)
        lease = cls(
            store, cp.task_id, cp.claimed_cycle or 0, token=token, lease_ms=lease_ms,
            renew_interval_ms=renew_interval_ms, renew_deadline_ms=renew_deadline_ms, on_lost=on_lost,
            release_on_exit=release_on_exit, cancel_on_loss=cancel_on_loss, clock=clock,
        )  # fmt: skip
        lease._adopt(cp, sent)
        return lease

    async def __aenter__(self) -> AsyncLease:
        if self._state is None:
            sent = self._clock.now()
            cp = await self._store.claim(
                self.task_id, self.cycle_index, token=self.token, lease_ms=self.timing.lease_ms
            )
            self._adopt(cp, sent)
        self._body.enter()
        self._keeper.start(self._body.keeping)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._exiting(exc)
        await self._body.exit(
            self.close,
            exc,
            lambda: self._lost_error(f"lease lost, work cancelled: {self.lost_reason}"),
        )

    async def close(self) -> None:
        """Stop the keeper; release the claim if it was neither written nor lost."""
        if self._state is None:
            return
        try:
            if self._should_release():
                try:
                    await self.release(reason=self._exit_reason)
                except Exception:
                    log.exception("%s", self._describe("release on exit failed; the lease will expire"))
        finally:
            with self._lock:
                self._state.end("closed")
            await self._keeper.stop()

    def _lose(self, reason: str, *, fenced: bool = False, cancel: TaskCancelled | None = None) -> bool:
        first = super()._lose(reason, fenced=fenced, cancel=cancel)
        if first and self._cancel_on_loss:
            self._body.cancel(self._describe(f"lease lost: {reason}"))
        return first

    async def commit(self, cp: Checkpoint, *, replace_history: bool = False, delay_ms: int | None = None) -> None:
        """Write the claimed cycle; ends the lease (see :meth:`Lease.commit`)."""
        await self._write(cp, final=False, replace_history=replace_history, delay_ms=delay_ms)

    async def finalize(self, cp: Checkpoint, *, replace_history: bool = False) -> None:
        """Write the claimed cycle as the terminal checkpoint (see :meth:`Lease.finalize`)."""
        await self._write(cp, final=True, replace_history=replace_history)

    async def _write(self, cp: Checkpoint, *, final: bool, replace_history: bool, delay_ms: int | None = None) -> None:
        self._check_write(cp, final=final)
        with self._guarded_write("finalized" if final else "committed") as out:
            out.applied = await self._store.commit(cp, **self._write_args(replace_history, delay_ms))
        self._keeper.wake()

    async def commit_and_claim(
        self, cp: Checkpoint, *, replace_history: bool = False, next_token: str | None = None
    ) -> AsyncLease | None:
        """Commit the claimed cycle and claim the next one (see :meth:`Lease.commit_and_claim`)."""
        if not self._can_continue(cp):
            await self.commit(cp, replace_history=replace_history)
            return None
        self._check_write(cp, final=False)
        sent = self._clock.now()
        with self._guarded_write("committed", continuing=True) as out:
            out.next = await self._store.commit_and_claim(cp, **self._continue_args(replace_history, next_token))
        self._keeper.wake()
        return self._next_lease(out.next, sent)

    async def step(self, name: str, fn: Callable[..., Awaitable[T] | T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` once for this cycle (see :meth:`Lease.step`).

        ``fn`` is a coroutine function (a plain function's result is used as it is).
        """
        loaded = await self._store._step_load(self.task_id, **self._step_args(name))
        hit, result = self._step_found(name, loaded)
        if hit:
            return result  # type: ignore[no-any-return]
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        recorded = await self._store._step_record(self.task_id, result, **self._step_args(name))
        return self._step_recorded(name, recorded)  # type: ignore[no-any-return]

    def _successor(self, nxt: Checkpoint) -> AsyncLease:
        return AsyncLease(self._store, self.task_id, nxt.claimed_cycle or 0, token=nxt.claim_token,
                          cancel_on_loss=self._cancel_on_loss, clock=self._clock,
                          **self._successor_options())  # fmt: skip

    async def release(self, *, after_ms: int = 1, reason: str | None = None) -> bool:
        """Give the cycle up: claimable again after ``after_ms`` (``reason``: see :meth:`Lease.release`)."""
        args = self._begin_release(after_ms, reason)
        if args is None:
            return False
        await self._keeper.stop()  # a renewal in flight lands first
        return self._released(await self._store._release(self.task_id, **args))

    async def _renewal(self) -> tuple[int | None, TaskCancelled | None]:
        return await self._store._lease_renew(self.task_id, **self._renew_args())
