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
which does no I/O and reads no clock of its own):

* The lease is counted from the moment the claim (or the last confirmed
  renewal) was *sent*, on the local monotonic clock (``CLOCK_BOOTTIME`` where
  the OS has it, so a suspended machine does not freeze it). The server set
  its expiry from its own ``TIME`` read after that moment, so the local count
  can only end early, never late, whatever the wall clocks say.
* The keeper renews every ``renew_interval_ms`` and gives up at
  ``renew_deadline_ms`` after the last confirmed send: from then on the lease
  is lost even if Redis would still honour it. ``lease_ms -
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
instead of ``CancelledError``). A commit that reaches Redis is still fenced
there by the claim's revision, so even a worker that ignores all of this can
never overwrite a newer claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._validate import MAX_CYCLE, MAX_LEASE_MS, check_int
from .errors import BackendUnavailable, ClaimRejected, InvalidArgument, LeaseLost
from .models import Checkpoint

if TYPE_CHECKING:
    from .checkpoint import AsyncCheckpointStore, CheckpointStore

__all__ = [
    "DEFAULT_LEASE_MS",
    "JITTER_FACTOR",
    "AsyncLease",
    "Clock",
    "Lease",
    "LeaseState",
    "LeaseTiming",
    "monotonic",
]

log = logging.getLogger("redis_agentstate.lease")

DEFAULT_LEASE_MS = 30_000
#: As in Kubernetes leader election: the renew deadline must exceed the renew interval by this factor.
JITTER_FACTOR = 1.2

_CLOCK_ID = getattr(time, "CLOCK_BOOTTIME", None)


def monotonic() -> float:
    """Seconds on a clock that never goes back and keeps counting while the machine sleeps."""
    if _CLOCK_ID is not None:
        return time.clock_gettime(_CLOCK_ID)
    return time.monotonic()


class Clock:
    """Where a lease keeper reads the time and waits: :func:`monotonic` and ``Event.wait``.

    A test passes its own (``Lease(..., clock=...)``) to drive the keeper's
    decisions deterministically, whatever the machine's load.
    """

    def now(self) -> float:
        return monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds passed on this clock; True if set."""
        return event.wait(timeout)


SYSTEM_CLOCK = Clock()


def new_token() -> str:
    """A fresh claim token: unique per claim, readable in logs."""
    return f"{os.getpid()}-{os.urandom(6).hex()}"


@dataclass(frozen=True)
class LeaseTiming:
    """Validated timing knobs of a lease keeper (all in milliseconds).

    ``lease_ms``: the lease Redis grants per claim/renewal. ``renew_deadline_ms``
    (default 2/3 of the lease): after this long without a confirmed renewal,
    counted from when that renewal was sent, the lease is lost.
    ``renew_interval_ms`` (default 1/4 of the lease): how often to renew; a
    renewal that could not reach Redis is retried after half of it.
    """

    lease_ms: int = DEFAULT_LEASE_MS
    renew_deadline_ms: int | None = None
    renew_interval_ms: int | None = None

    def __post_init__(self) -> None:
        lease = check_int(self.lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        deadline = self.renew_deadline_ms
        interval = self.renew_interval_ms
        if deadline is None:
            deadline = lease * 2 // 3
            object.__setattr__(self, "renew_deadline_ms", deadline)
        if interval is None:
            interval = lease // 4
            object.__setattr__(self, "renew_interval_ms", interval)
        check_int(deadline, "renew_deadline_ms", 0, MAX_LEASE_MS)
        check_int(interval, "renew_interval_ms", 0, MAX_LEASE_MS)
        if interval <= 0:
            raise InvalidArgument(f"renew_interval_ms must be greater than zero (lease_ms={lease} is too short)")
        if deadline <= 0:
            raise InvalidArgument("renew_deadline_ms must be greater than zero")
        if lease <= deadline:
            raise InvalidArgument(
                f"lease_ms ({lease}) must be greater than renew_deadline_ms ({deadline}): "
                "the difference is the safety margin against clock-rate differences"
            )
        if deadline <= JITTER_FACTOR * interval:
            raise InvalidArgument(
                f"renew_deadline_ms ({deadline}) must be greater than {JITTER_FACTOR} * renew_interval_ms "
                f"({interval}): the keeper must get more than one try before the deadline"
            )

    @property
    def deadline_s(self) -> float:
        return self.renew_deadline_ms / 1000  # type: ignore[operator]

    @property
    def interval_s(self) -> float:
        return self.renew_interval_ms / 1000  # type: ignore[operator]


# Next-step kinds of LeaseState.next_step.
RENEW, WAIT, LOST, STOP = "renew", "wait", "lost", "stop"


class LeaseState:
    """Every decision a lease keeper makes, without I/O and without reading a clock.

    The shells (thread or task) pass ``now`` from :func:`monotonic` and carry
    out the step this returns. Once lost, a lease never comes back; once
    ended (committed, finalized, released, closed) the keeper stops.
    """

    def __init__(self, timing: LeaseTiming, *, sent_at: float, expires_at_ms: int | None) -> None:
        self.timing = timing
        self.valid_until = sent_at + timing.deadline_s
        self.next_renew_at = sent_at + timing.interval_s
        self.expires_at_ms = expires_at_ms
        self.renewals = 0
        self.lost_reason: str | None = None
        self.ended: str | None = None
        self.writing = False  # a commit/finalize is in flight: the fence decides, not the keeper

    def expired(self, now: float) -> bool:
        return now >= self.valid_until

    def is_lost(self, now: float) -> bool:
        return self.lost_reason is not None or (self.ended is None and self.expired(now))

    def loss_reason(self, now: float) -> str | None:
        if self.lost_reason is not None:
            return self.lost_reason
        if self.ended is None and self.expired(now):
            return self._deadline_reason()
        return None

    def _deadline_reason(self) -> str:
        return (
            f"no renewal confirmed within renew_deadline_ms={self.timing.renew_deadline_ms} "
            f"of the last one sent (lease_ms={self.timing.lease_ms})"
        )

    def next_step(self, now: float) -> tuple[str, float]:
        """``(RENEW, 0)``, ``(WAIT, seconds)``, ``(LOST, 0)`` or ``(STOP, 0)``."""
        if self.ended is not None or self.lost_reason is not None or self.writing:
            return STOP, 0.0
        if self.expired(now):
            return LOST, 0.0
        if now >= self.next_renew_at:
            return RENEW, 0.0
        return WAIT, min(self.next_renew_at, self.valid_until) - now

    def time_left(self, now: float) -> float:
        """Seconds until the deadline (what a renewal in flight may take at most)."""
        return max(0.0, self.valid_until - now)

    def renewed(self, sent_at: float, now: float, expires_at_ms: int | None) -> str | None:
        """Record a renewal reply; returns a loss reason, or None if the lease is still held."""
        if self.lost_reason is not None:
            return self.lost_reason
        if self.writing or self.ended is not None:
            return None  # our own write may be what moved the revision on
        if expires_at_ms is None:
            return "Redis refused the renewal: the claim is gone (taken over after expiry, committed, or changed)"
        if self.expired(now):
            return self._deadline_reason() + "; the renewal answered too late"
        self.valid_until = max(self.valid_until, sent_at + self.timing.deadline_s)
        self.next_renew_at = sent_at + self.timing.interval_s
        self.expires_at_ms = expires_at_ms
        self.renewals += 1
        return None

    def renew_failed(self, now: float, exc: BaseException) -> str | None:
        """Record a renewal that raised; returns a loss reason or None (retry later)."""
        if isinstance(exc, BackendUnavailable):
            self.next_renew_at = now + self.timing.interval_s / 2
            return None
        return f"renewal failed: {exc!r}"

    def lose(self, reason: str, *, fenced: bool = False) -> bool:
        """Mark lost; False if it already was lost or had ended, or (unless ``fenced``) a write is in flight."""
        if self.lost_reason is not None or self.ended is not None or (self.writing and not fenced):
            return False
        self.lost_reason = reason
        return True

    def end(self, how: str) -> None:
        if self.ended is None:
            self.ended = how


S = TypeVar("S")


class _LeaseBase(Generic[S]):
    """State and rules shared by the thread and the task shells (no I/O here)."""

    def __init__(
        self,
        store: S,
        task_id: str,
        cycle_index: int,
        *,
        token: str | None,
        lease_ms: int,
        renew_interval_ms: int | None,
        renew_deadline_ms: int | None,
        on_lost: Callable[[Any], None] | None,
        release_on_exit: bool,
        clock: Clock | None = None,
    ) -> None:
        self.timing = LeaseTiming(lease_ms, renew_deadline_ms, renew_interval_ms)
        self._clock = clock or SYSTEM_CLOCK
        self.task_id = task_id
        self.cycle_index = check_int(cycle_index, "cycle_index", 1, MAX_CYCLE)
        self.token = token if token is not None else new_token()
        self._store = store
        self._on_lost = on_lost
        self._release_on_exit = release_on_exit
        self._state: LeaseState | None = None
        self._checkpoint: Checkpoint | None = None
        self._sent_at = 0.0
        self._lock = threading.Lock()

    # ---- what the work sees -------------------------------------------------

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint as claimed (``cycle_index`` is the previous cycle, ``claimed_cycle`` this one)."""
        if self._checkpoint is None:
            raise RuntimeError("the lease is not claimed yet: enter it with `with` / `async with`")
        return self._checkpoint

    @property
    def revision(self) -> int:
        """The claim's revision: every commit under this lease is fenced by it."""
        return self.checkpoint.revision

    @property
    def expires_at_ms(self) -> int | None:
        """Server-clock expiry of the last confirmed claim or renewal."""
        return None if self._state is None else self._state.expires_at_ms

    @property
    def renewals(self) -> int:
        return 0 if self._state is None else self._state.renewals

    @property
    def lost(self) -> bool:
        """True once the lease is lost (also when the deadline passed and the keeper has not woken yet)."""
        return self._state is not None and self._state.is_lost(self._clock.now())

    @property
    def lost_reason(self) -> str | None:
        return None if self._state is None else self._state.loss_reason(self._clock.now())

    @property
    def ended(self) -> str | None:
        """``committed``, ``finalized``, ``released`` or ``closed`` once the lease is over, else None."""
        return None if self._state is None else self._state.ended

    def remaining_s(self) -> float:
        """Seconds left before the keeper's deadline, on the local monotonic clock."""
        return 0.0 if self._state is None else self._state.time_left(self._clock.now())

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost (or already over); else return."""
        state = self._require()
        reason = state.loss_reason(self._clock.now())
        if reason is not None:
            self._lose(reason)
            raise LeaseLost(self._describe(f"lease lost: {reason}"), task_id=self.task_id, revision=self.revision)
        if state.ended is not None:
            raise LeaseLost(
                self._describe(f"lease already ended ({state.ended})"), task_id=self.task_id, revision=self.revision
            )

    # ---- shared rules ---------------------------------------------------------

    def _describe(self, what: str) -> str:
        rev = self._checkpoint.revision if self._checkpoint is not None else "?"
        return f"{what} [task={self.task_id} cycle={self.cycle_index} revision={rev} token={self.token}]"

    def _require(self) -> LeaseState:
        if self._state is None:
            raise RuntimeError("the lease is not claimed yet: enter it with `with` / `async with`")
        return self._state

    def _adopt(self, cp: Checkpoint | None, sent_at: float) -> None:
        if cp is None:
            raise ClaimRejected(f"no checkpoint for task {self.task_id!r}", task_id=self.task_id)
        if cp.claim_token != self.token or cp.claimed_cycle != self.cycle_index:
            raise ClaimRejected(f"claim reply for task {self.task_id!r} is not this lease's", task_id=self.task_id)
        self._checkpoint = cp
        self._sent_at = sent_at
        self._state = LeaseState(self.timing, sent_at=sent_at, expires_at_ms=cp.lease_expires_at_ms)

    def _lose(self, reason: str, *, fenced: bool = False) -> bool:
        """Mark lost, log, run ``on_lost``; True only for the call that did it."""
        with self._lock:
            first = self._require().lose(reason, fenced=fenced)
        if not first:
            return False
        log.error("%s", self._describe(f"lease lost: {reason}"))
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("%s", self._describe("on_lost callback failed"))
        return True

    def _check_write(self, cp: Checkpoint, *, final: bool) -> None:
        self.check()
        if not isinstance(cp, Checkpoint):
            raise InvalidArgument(f"expected a Checkpoint, got {type(cp).__name__}")
        if cp.task_id != self.task_id:
            raise InvalidArgument(f"checkpoint of task {cp.task_id!r} committed under the lease of {self.task_id!r}")
        if cp.cycle_index != self.cycle_index:
            raise InvalidArgument(
                f"commit the claimed cycle: checkpoint.cycle_index is {cp.cycle_index}, the lease holds "
                f"cycle {self.cycle_index}",
                task_id=self.task_id,
            )
        if final and cp.terminal_result is None:
            raise InvalidArgument("finalized checkpoint must include terminal_result", task_id=self.task_id)
        with self._lock:
            state = self._require()
            ok = state.lost_reason is None and state.ended is None
            if ok:
                state.writing = True
        if not ok:
            self.check()  # raises LeaseLost

    def _write_args(self, replace_history: bool) -> dict[str, Any]:
        """A lease's commit and finalize are both the fenced commit of its claim."""
        return {"token": self.token, "expected_revision": self.revision, "replace_history": replace_history}

    def _write_failed(self) -> None:
        with self._lock:
            self._require().writing = False

    def _after_write(self, applied: bool, how: str) -> None:
        state = self._require()
        if applied:
            with self._lock:
                state.end(how)
            return
        self._lose("Redis rejected the write: the claim's revision is no longer current (fenced out)", fenced=True)
        raise LeaseLost(
            self._describe(f"write rejected by the fence, nothing was {how}"),
            task_id=self.task_id,
            revision=self.revision,
        )

    def _on_renew_reply(self, sent_at: float, expires_at_ms: int | None) -> bool:
        """Apply a renewal reply; False when the keeper must stop (lost)."""
        state = self._require()
        with self._lock:
            reason = state.renewed(sent_at, self._clock.now(), expires_at_ms)
        if reason is not None:
            self._lose(reason)
            return False
        return True

    def _on_renew_error(self, exc: BaseException) -> bool:
        state = self._require()
        with self._lock:
            reason = state.renew_failed(self._clock.now(), exc)
        if reason is not None:
            self._lose(reason)
            return False
        log.warning("%s", self._describe(f"renewal could not reach Redis, retrying: {exc}"))
        return True

    def _release_args(self, after_ms: int) -> dict[str, Any]:
        after_ms = check_int(after_ms, "after_ms", 1, MAX_LEASE_MS)
        return {"token": self.token, "expected_revision": self.revision, "lease_ms": after_ms}

    def _should_release(self) -> bool:
        state = self._state
        return (
            self._release_on_exit and state is not None and state.ended is None and not state.is_lost(self._clock.now())
        )


class _Call:
    """Runs one blocking call on a daemon thread so the keeper can stop waiting at its deadline."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        threading.Thread(target=self._run, name="agentstate-lease-renew", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # handed to the keeper, which decides
            self.error = exc
        finally:
            self.done.set()


class Lease(_LeaseBase["CheckpointStore"]):
    """A claimed cycle kept alive by a background thread (see the module docstring).

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
        store: CheckpointStore,
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def next(
        cls,
        store: CheckpointStore,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        on_lost: Callable[[Lease], None] | None = None,
        release_on_exit: bool = True,
        clock: Clock | None = None,
    ) -> Lease | None:
        """Claim the next runnable cycle of any task (``claim_next``); None when nothing is due.

        The returned lease is claimed; its keeper starts on ``__enter__``.
        """
        timing = LeaseTiming(lease_ms, renew_deadline_ms, renew_interval_ms)
        token = token if token is not None else new_token()
        sent = (clock or SYSTEM_CLOCK).now()
        cp = store.claim_next(token=token, lease_ms=timing.lease_ms)
        if cp is None:
            return None
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
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._keep, name=f"agentstate-lease-{self.task_id[:40]}", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the keeper; release the claim if it was neither written nor lost."""
        if self._state is None:
            return
        try:
            if self._should_release():
                try:
                    self.release()
                except Exception:
                    log.exception("%s", self._describe("release on exit failed; the lease will expire"))
        finally:
            with self._lock:
                self._state.end("closed")
            self._stop.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=5)

    def _lose(self, reason: str, *, fenced: bool = False) -> bool:
        first = super()._lose(reason, fenced=fenced)
        if first:
            self.lost_event.set()
        self._stop.set()
        return first

    def commit(self, cp: Checkpoint, *, replace_history: bool = False) -> None:
        """Write the claimed cycle (``cp.cycle_index`` must be :attr:`cycle_index`); ends the lease.

        Raises :class:`LeaseLost` if the lease is lost, before sending
        anything, or if Redis fences the write out.
        """
        self._write(cp, final=False, replace_history=replace_history)

    def finalize(self, cp: Checkpoint, *, replace_history: bool = False) -> None:
        """Write the claimed cycle as the task's terminal checkpoint (``terminal_result`` required).

        One fenced write: the claim ends and the task becomes terminal
        atomically, so no other worker can claim a further cycle in between.
        It is a ``commit`` under this lease's token. Not the same operation as
        :meth:`CheckpointStore.finalize`, which writes a terminal checkpoint
        for a task that nobody holds a claim on (and is refused while one does).
        """
        self._write(cp, final=True, replace_history=replace_history)

    def _write(self, cp: Checkpoint, *, final: bool, replace_history: bool) -> None:
        self._check_write(cp, final=final)
        try:
            applied = self._store.commit(cp, **self._write_args(replace_history))
        except BaseException:
            self._write_failed()
            raise
        self._after_write(applied, "finalized" if final else "committed")
        self._stop.set()

    def release(self, *, after_ms: int = 1) -> bool:
        """Give the cycle up: it becomes claimable again after ``after_ms``. False if it was not ours any more."""
        state = self._require()
        if state.ended is not None:
            return False
        args = self._release_args(after_ms)
        with self._lock:
            state.end("released")  # the keeper sends no further renewal...
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=state.time_left(self._clock.now()))  # ...and one in flight lands first
        return self._store.renew_until(self.task_id, **args) is not None

    def _keep(self) -> None:
        state = self._require()
        try:
            while True:
                with self._lock:
                    step, delay = state.next_step(self._clock.now())
                if step == STOP:
                    return
                if step == LOST:
                    self._lose(state.loss_reason(self._clock.now()) or "lease deadline passed")
                    return
                if step == WAIT:
                    self._clock.wait(self._stop, delay)
                    continue
                sent = self._clock.now()
                call = _Call(
                    lambda: self._store.renew_until(
                        self.task_id, token=self.token, expected_revision=self.revision, lease_ms=self.timing.lease_ms
                    )
                )
                if not self._clock.wait(call.done, state.time_left(sent)):
                    self._lose("no renewal confirmed before the lease deadline (Redis did not answer in time)")
                    return
                if call.error is not None:
                    if not self._on_renew_error(call.error):
                        return
                elif not self._on_renew_reply(sent, call.result):
                    return
        except BaseException as exc:
            # A keeper that dies must not leave a lease that looks alive.
            self._lose(f"lease keeper thread crashed: {exc!r}")
            raise


class AsyncLease(_LeaseBase["AsyncCheckpointStore"]):
    """The asyncio twin of :class:`Lease`: the keeper is a task, and losing the
    lease cancels the task that entered ``async with`` (it sees ``LeaseLost``)."""

    def __init__(
        self,
        store: AsyncCheckpointStore,
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
    ) -> None:
        super().__init__(
            store, task_id, cycle_index, token=token, lease_ms=lease_ms, renew_interval_ms=renew_interval_ms,
            renew_deadline_ms=renew_deadline_ms, on_lost=on_lost, release_on_exit=release_on_exit,
        )  # fmt: skip
        self._cancel_on_loss = cancel_on_loss
        self._stop: asyncio.Event | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._work: asyncio.Task[Any] | None = None
        self._cancelled_work = False

    @classmethod
    async def next(
        cls,
        store: AsyncCheckpointStore,
        *,
        token: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        on_lost: Callable[[AsyncLease], None] | None = None,
        release_on_exit: bool = True,
        cancel_on_loss: bool = True,
    ) -> AsyncLease | None:
        """Claim the next runnable cycle of any task; None when nothing is due (see :meth:`Lease.next`)."""
        timing = LeaseTiming(lease_ms, renew_deadline_ms, renew_interval_ms)
        token = token if token is not None else new_token()
        sent = monotonic()
        cp = await store.claim_next(token=token, lease_ms=timing.lease_ms)
        if cp is None:
            return None
        lease = cls(
            store, cp.task_id, cp.claimed_cycle or 0, token=token, lease_ms=lease_ms,
            renew_interval_ms=renew_interval_ms, renew_deadline_ms=renew_deadline_ms, on_lost=on_lost,
            release_on_exit=release_on_exit, cancel_on_loss=cancel_on_loss,
        )  # fmt: skip
        lease._adopt(cp, sent)
        return lease

    async def __aenter__(self) -> AsyncLease:
        if self._state is None:
            sent = monotonic()
            cp = await self._store.claim(
                self.task_id, self.cycle_index, token=self.token, lease_ms=self.timing.lease_ms
            )
            self._adopt(cp, sent)
        self._stop = asyncio.Event()
        self._work = asyncio.current_task()
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name=f"agentstate-lease-{self.task_id}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._work = None  # from here on, a loss cancels nothing
        delivered = isinstance(exc, asyncio.CancelledError)
        try:
            await self.close()
            if self._cancelled_work and not delivered:
                # Our cancel may still be pending if the body finished without awaiting: take it here.
                await asyncio.sleep(0)
        except asyncio.CancelledError as cancel:
            if not self._cancelled_work or delivered:
                raise
            delivered = True
            exc = exc or cancel
        if not self._cancelled_work:
            return
        task = asyncio.current_task()
        if delivered and task is not None and hasattr(task, "uncancel"):
            task.uncancel()
        if exc is None or isinstance(exc, asyncio.CancelledError):
            raise LeaseLost(
                self._describe(f"lease lost, work cancelled: {self.lost_reason}"),
                task_id=self.task_id,
                revision=self.revision,
            ) from exc

    async def close(self) -> None:
        """Stop the keeper; release the claim if it was neither written nor lost."""
        if self._state is None:
            return
        try:
            if self._should_release():
                try:
                    await self.release()
                except Exception:
                    log.exception("%s", self._describe("release on exit failed; the lease will expire"))
        finally:
            with self._lock:
                self._state.end("closed")
            await self._stop_keeper()

    async def _stop_keeper(self) -> None:
        if self._stop is not None:
            self._stop.set()
        keeper = self._keeper
        if keeper is not None and keeper is not asyncio.current_task() and not keeper.done():
            try:
                await asyncio.wait_for(asyncio.shield(keeper), timeout=5)
            except asyncio.TimeoutError:
                keeper.cancel()
            except asyncio.CancelledError:
                keeper.cancel()
                raise

    def _lose(self, reason: str, *, fenced: bool = False) -> bool:
        first = super()._lose(reason, fenced=fenced)
        work = self._work
        if first and self._cancel_on_loss and work is not None and not work.done():
            self._cancelled_work = True
            work.cancel(self._describe(f"lease lost: {reason}"))
        return first

    async def commit(self, cp: Checkpoint, *, replace_history: bool = False) -> None:
        """Write the claimed cycle; ends the lease (see :meth:`Lease.commit`)."""
        await self._write(cp, final=False, replace_history=replace_history)

    async def finalize(self, cp: Checkpoint, *, replace_history: bool = False) -> None:
        """Write the claimed cycle as the terminal checkpoint (see :meth:`Lease.finalize`)."""
        await self._write(cp, final=True, replace_history=replace_history)

    async def _write(self, cp: Checkpoint, *, final: bool, replace_history: bool) -> None:
        self._check_write(cp, final=final)
        try:
            applied = await self._store.commit(cp, **self._write_args(replace_history))
        except BaseException:
            self._write_failed()
            raise
        self._after_write(applied, "finalized" if final else "committed")
        if self._stop is not None:
            self._stop.set()

    async def release(self, *, after_ms: int = 1) -> bool:
        """Give the cycle up: claimable again after ``after_ms``. False if it was not ours any more."""
        state = self._require()
        if state.ended is not None:
            return False
        args = self._release_args(after_ms)
        with self._lock:
            state.end("released")  # the keeper sends no further renewal...
        await self._stop_keeper()  # ...and one in flight lands first
        return await self._store.renew_until(self.task_id, **args) is not None

    async def _keep(self) -> None:
        state = self._require()
        stop = self._stop
        assert stop is not None
        try:
            while True:
                step, delay = state.next_step(monotonic())
                if step == STOP:
                    return
                if step == LOST:
                    self._lose(state.loss_reason(monotonic()) or "lease deadline passed")
                    return
                if step == WAIT:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                    continue
                sent = monotonic()
                try:
                    expires = await asyncio.wait_for(
                        self._store.renew_until(
                            self.task_id, token=self.token, expected_revision=self.revision,
                            lease_ms=self.timing.lease_ms,
                        ),
                        timeout=state.time_left(sent),
                    )  # fmt: skip
                except asyncio.TimeoutError:
                    self._lose("no renewal confirmed before the lease deadline (Redis did not answer in time)")
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not self._on_renew_error(exc):
                        return
                    continue
                if not self._on_renew_reply(sent, expires):
                    return
        except asyncio.CancelledError:
            if state.ended is None and state.lost_reason is None:
                self._lose("lease keeper task was cancelled")
            raise
        except Exception as exc:
            # Logged (with the traceback) and turned into a lost lease, which cancels the work.
            log.error("%s", self._describe("lease keeper task crashed"), exc_info=exc)
            self._lose(f"lease keeper task crashed: {exc!r}")
