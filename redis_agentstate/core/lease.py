"""The lease keepers' logic, without I/O: timing knobs, the keeper's state machine, the clock.

:class:`LeaseTiming` validates the knobs, :class:`LeaseState` makes every
decision (renew, wait, lost, stop) from times it is given, :class:`Clock` is
where a keeper reads the time and waits, :class:`KeptLease` is what the one
keeper (``wire/keeper.py``, a thread and a task twin) asks of any lease it
keeps, a store's or a LangGraph thread's, and :class:`LeaseBase` holds what the
thread (:class:`~redis_agentstate.lease.Lease`) and task
(:class:`~redis_agentstate.lease.AsyncLease`) shells of a store's lease share,
so the twins in ``lease.py`` only carry out its steps with blocking or awaited
calls. The rules are described in ``lease.py``'s module docstring.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import BackendError, BackendUnavailable, ClaimRejected, InvalidArgument, LeaseLost, TaskCancelled
from ..models import AgentStatus, Checkpoint
from ..wire import shells
from .steps import check_step_name, step_key
from .validate import MAX_CLAIM_FROM_REVISION, MAX_CYCLE, MAX_LEASE_MS, check_int

__all__ = [
    "DEFAULT_LEASE_MS",
    "JITTER_FACTOR",
    "LOST",
    "RENEW",
    "STOP",
    "SYSTEM_CLOCK",
    "WAIT",
    "Clock",
    "KeptLease",
    "Renewed",
    "claim_sent",
    "failure_reason",
    "LeaseBase",
    "LeaseState",
    "LeaseTiming",
    "monotonic",
    "new_token",
    "stamp_claim_sent",
]

log = logging.getLogger("redis_agentstate.lease")  # the name users configure, wherever the code lives

DEFAULT_LEASE_MS = 30_000

#: Where a claim returned by ``claim_next`` carries when its request was sent: an instance
#: attribute, not a dataclass field, so it is in no ``repr``, comparison or serialized form.
_CLAIM_SENT_ATTR = "_agentstate_claim_sent"


def stamp_claim_sent(cp: Checkpoint | None, sent: float) -> Checkpoint | None:
    """``cp`` (a claim just returned), marked with ``sent``: the ``time.monotonic()`` at which the request
    that claimed it was sent (after a block, its last attempt, not its start). ``Lease.next`` counts the
    lease from it; the mark travels with the reply, so a store subclass overriding ``claim_next``
    (recording it, say) still hands it to the lease through ``super()``."""
    if cp is not None:
        cp.__dict__[_CLAIM_SENT_ATTR] = sent
    return cp


def claim_sent(cp: Checkpoint) -> float | None:
    """The send time :func:`stamp_claim_sent` put on ``cp``; None for a claim that carries none."""
    sent = cp.__dict__.get(_CLAIM_SENT_ATTR)
    return sent if isinstance(sent, float) else None


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

    async def wait_async(self, wait: Callable[[float], Awaitable[bool]], timeout: float) -> bool:
        """The task keeper's wait: ``timeout`` seconds on this clock, through ``wait(seconds)``, which awaits
        what the keeper waits for (an event, a renewal) that many real seconds and says whether it came.

        A clock whose time runs otherwise (a test's) calls ``wait`` in short slices until its own
        time has passed ``timeout``, as its ``wait`` does with the event.
        """
        return await wait(timeout)


SYSTEM_CLOCK = Clock()


#: How much of an exception's message a failure reason keeps: enough to recognise it, not a log.
FAILURE_REASON_CHARS = 500


def failure_reason(exc: BaseException) -> str:
    """``"<type>: <message>"`` of ``exc``, cut to FAILURE_REASON_CHARS: the reason a failed attempt records."""
    kind = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        kind = f"{module}.{kind}"
    try:
        text = str(exc)
    except Exception:  # a __str__ that raises must not turn a release into a crash
        text = "<unprintable>"
    reason = f"{kind}: {text}" if text else kind
    if len(reason) > FAILURE_REASON_CHARS:
        reason = reason[: FAILURE_REASON_CHARS - 3] + "..."
    return reason


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
        #: Why the lease was lost, when it was lost because the task was cancelled.
        self.cancel: TaskCancelled | None = None

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

    def lose(self, reason: str, *, fenced: bool = False, cancel: TaskCancelled | None = None) -> bool:
        """Mark lost; False if it already was lost or had ended, or (unless ``fenced``) a write is in flight."""
        if self.lost_reason is not None or self.ended is not None or (self.writing and not fenced):
            return False
        self.lost_reason = reason
        self.cancel = cancel
        return True

    def renew_now(self) -> bool:
        """A hint that the claim may be gone (a cancel was announced): renew at the next step; False if
        the keeper has nothing to renew any more."""
        if self.lost_reason is not None or self.ended is not None:
            return False
        self.next_renew_at = float("-inf")
        return True

    def end(self, how: str) -> None:
        if self.ended is None:
            self.ended = how


#: What a renewal answered: the new expiry (server ms; None: refused) and, for a store's lease, the
#: cancel that refused it (None otherwise).
Renewed = tuple[int | None, TaskCancelled | None]


class KeptLease:
    """What the one lease keeper (``wire.keeper``: a thread and a task twin) asks of the lease it keeps,
    the same for a store's lease and a LangGraph thread lease: each decision, taken on this lease's
    clock and state, without I/O. The keeper only sends the renewals and waits.

    A subclass says who it is (``_describe``), where it logs (``_log``), what a loss does besides
    being recorded and logged (``_announce_lost``), and may watch for cancels (``_watch_cancels``).
    """

    _log: logging.Logger = log

    def __init__(self, timing: LeaseTiming, clock: Clock | None) -> None:
        self.timing = timing
        self._clock = clock or SYSTEM_CLOCK
        self._state: LeaseState | None = None
        self._lock = threading.Lock()

    @property
    def clock(self) -> Clock:
        """Where this lease's keeper reads the time and waits."""
        return self._clock

    @property
    def lost(self) -> bool:
        """True once the lease is lost (also when the deadline passed and the keeper has not woken yet)."""
        return self._state is not None and self._state.is_lost(self._clock.now())

    @property
    def lost_reason(self) -> str | None:
        return None if self._state is None else self._state.loss_reason(self._clock.now())

    def remaining_s(self) -> float:
        """Seconds left before the keeper's deadline, on the lease's clock (0 before the claim)."""
        return 0.0 if self._state is None else self._state.time_left(self._clock.now())

    def _describe(self, what: str) -> str:
        raise NotImplementedError

    def _require(self) -> LeaseState:
        if self._state is None:
            raise RuntimeError("the lease is not claimed yet: enter it with `with` / `async with`")
        return self._state

    def _lose(self, reason: str, *, fenced: bool = False, cancel: TaskCancelled | None = None) -> bool:
        """Mark lost, log, announce; True only for the call that did it."""
        with self._lock:
            first = self._require().lose(reason, fenced=fenced, cancel=cancel)
        if first:
            # A cancel is someone's decision, no fault of the worker's: a warning, not an error.
            level = logging.ERROR if cancel is None else logging.WARNING
            self._log.log(level, "%s", self._describe(f"lease lost: {reason}"))
            self._announce_lost(fenced)
        return first

    def _announce_lost(self, fenced: bool) -> None:
        """What a loss does besides being recorded and logged (once, on the call that lost it)."""

    # ---- the keeper's loop, step by step ----------------------------------------

    def _next_step(self) -> tuple[str, float]:
        """What the keeper does now; a passed deadline is declared lost here, so LOST and STOP both mean return."""
        state = self._require()
        with self._lock:
            step, delay = state.next_step(self._clock.now())
        if step == LOST:
            self._lose(state.loss_reason(self._clock.now()) or "lease deadline passed")
        return step, delay

    def _on_renew_reply(self, sent_at: float, reply: Renewed) -> bool:
        """Apply a renewal reply; False when the keeper must stop (lost)."""
        expires_at_ms, cancel = reply
        state = self._require()
        if cancel is not None:
            self._lose(f"the task was cancelled ({cancel.reason})", cancel=cancel)
            return False
        with self._lock:
            reason = state.renewed(sent_at, self._clock.now(), expires_at_ms)
        if reason is not None:
            self._lose(reason)
            return False
        return True

    def _on_renew_error(self, exc: BaseException) -> bool:
        """Apply a renewal that raised; False when the keeper must stop (lost), True to retry later."""
        state = self._require()
        with self._lock:
            reason = state.renew_failed(self._clock.now(), exc)
        if reason is not None:
            self._lose(reason)
            return False
        self._log.warning("%s", self._describe(f"renewal could not reach Redis, retrying: {exc}"))
        return True

    def _renew_timed_out(self) -> None:
        self._lose("no renewal confirmed before the lease deadline (Redis did not answer in time)")

    def _keeper_crashed(self, keeper: str, exc: BaseException) -> None:
        """The keeper (``thread`` or ``task``) died of ``exc``: a keeper that dies must not leave a lease
        that looks alive."""
        self._lose(f"lease keeper {keeper} crashed: {exc!r}")

    def _keeper_cancelled(self) -> None:
        """The keeper's task was cancelled by someone else than the lease's own end."""
        state = self._require()
        if state.ended is None and state.lost_reason is None:
            self._lose("lease keeper task was cancelled")

    def _cancel_heard(self) -> bool:
        """A cancel of this lease's task was announced: True if the keeper must wake and renew now (the
        renewal's refusal says whether the task was really cancelled, see renew.lua)."""
        state = self._state
        if state is None:
            return False
        with self._lock:
            return state.renew_now()

    def _watch_cancels(self, heard: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``heard`` on a cancel announcement of this lease's task while the keeper runs; the unwatch
        (None: nothing is watched)."""
        return None


@dataclass
class WriteOutcome:
    """What a fenced write's I/O reported: whether it applied, and the next cycle's claim if any."""

    applied: bool = False
    next: Checkpoint | None = None


S = TypeVar("S")
L = TypeVar("L", bound="LeaseBase[Any]")


class LeaseBase(KeptLease, Generic[S]):
    """State and rules shared by the thread and the task shells of a store's lease (no I/O here)."""

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
        super().__init__(LeaseTiming(lease_ms, renew_deadline_ms, renew_interval_ms), clock)
        self.task_id = task_id
        self.cycle_index = check_int(cycle_index, "cycle_index", 1, MAX_CYCLE)
        self.token = token if token is not None else new_token()
        self._store = store
        self._on_lost = on_lost
        self._release_on_exit = release_on_exit
        self._checkpoint: Checkpoint | None = None
        self._sent_at = 0.0
        self._parked = False
        #: The failure that ended the ``with`` block, released with the claim (``close``).
        self._exit_reason: str | None = None

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
    def parked(self) -> bool:
        """True once :meth:`release` with a reason parked the task (it was attempt ``max_attempts``)."""
        return self._parked

    @property
    def ended(self) -> str | None:
        """``committed``, ``finalized``, ``released`` or ``closed`` once the lease is over, else None."""
        return None if self._state is None else self._state.ended

    def age_s(self) -> float:
        """Seconds since the claim of this cycle was sent, on the local monotonic clock (0 before it)."""
        return 0.0 if self._state is None else max(0.0, self._clock.now() - self._sent_at)

    @property
    def cancelled(self) -> TaskCancelled | None:
        """The cancel, once the lease was lost because the task was cancelled (``store.cancel``); else None."""
        return None if self._state is None else self._state.cancel

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost (or already over); else return."""
        state = self._require()
        reason = state.loss_reason(self._clock.now())
        if reason is not None:
            self._lose(reason)
            raise self._lost_error(f"lease lost: {reason}")
        if state.ended is not None:
            raise LeaseLost(
                self._describe(f"lease already ended ({state.ended})"), task_id=self.task_id, revision=self.revision
            )

    # ---- durable steps (the shells' ``step``) ------------------------------------

    def step_key(self, name: str) -> str:
        """The idempotency key of step ``name`` of this cycle: the same for every attempt at it.

        Pass it to the service the step calls (a payment API's ``Idempotency-Key``, an email
        provider's dedupe id), so that the one case ``step`` cannot cover, a crash inside the
        step after its effect and before its result was recorded, is deduplicated there.
        """
        return step_key(getattr(self._store, "namespace", ""), self.task_id, self.cycle_index, check_step_name(name))

    def _step_args(self, name: str) -> dict[str, Any]:
        """``_step_load``/``_step_record``'s: the name checked, and this claim, checked live here first."""
        name = check_step_name(name)
        self.check()
        return {"token": self.token, "expected_revision": self.revision, "cycle_index": self.cycle_index,
                "name": name}  # fmt: skip

    def _step_refused(self, name: str) -> LeaseLost:
        self._lose("Redis refused a durable step: the claim is no longer current (taken over, or its lease lapsed)")
        return LeaseLost(
            self._describe(f"step {name!r}: the lease is not current, nothing was recorded"),
            task_id=self.task_id,
            revision=self.revision,
        )

    def _step_found(self, name: str, found: tuple[bool, Any] | None) -> tuple[bool, Any]:
        """What ``_step_load`` answered: ``(True, result)`` to return, ``(False, None)`` to run the step."""
        if found is None:
            raise self._step_refused(name)
        if not found[0]:
            # Redis found the lease current when it read; a worker frozen since (SIGSTOP, a long
            # pause) reads it as lost here, on the lease's clock, and must not start the step.
            self.check()
        return found

    def _step_recorded(self, name: str, recorded: tuple[bool, Any]) -> Any:
        """What ``_step_record`` answered: the result as stored, or LeaseLost (the step is not recorded)."""
        applied, result = recorded
        if not applied:
            raise self._step_refused(name)
        return result

    # ---- shared rules ---------------------------------------------------------

    def _describe(self, what: str) -> str:
        rev = self._checkpoint.revision if self._checkpoint is not None else "?"
        return f"{what} [task={self.task_id} cycle={self.cycle_index} revision={rev} token={self.token}]"

    def _adopt(self, cp: Checkpoint | None, sent_at: float) -> None:
        if cp is None:
            raise ClaimRejected(f"no checkpoint for task {self.task_id!r}", task_id=self.task_id)
        if cp.claim_token != self.token or cp.claimed_cycle != self.cycle_index:
            raise ClaimRejected(f"claim reply for task {self.task_id!r} is not this lease's", task_id=self.task_id)
        self._checkpoint = cp
        self._sent_at = sent_at
        self._state = LeaseState(self.timing, sent_at=sent_at, expires_at_ms=cp.lease_expires_at_ms)

    def _lost_error(self, what: str) -> LeaseLost:
        """The LeaseLost to raise: its ``__cause__`` is the cancel when the task was cancelled."""
        exc = LeaseLost(self._describe(what), task_id=self.task_id, revision=self.revision)
        exc.__cause__ = self.cancelled
        return exc

    def _announce_lost(self, fenced: bool) -> None:
        """Count the loss, then run ``on_lost``."""
        observer = shells.TELEMETRY
        if observer is not None:
            observer.lease_lost(getattr(self._store, "namespace", ""), fenced=fenced)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("%s", self._describe("on_lost callback failed"))

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

    def _write_args(self, replace_history: bool, delay_ms: int | None = None) -> dict[str, Any]:
        """A lease's commit and finalize are both the fenced commit of its claim (``delay_ms``: a commit's only)."""
        delay = {} if delay_ms is None else {"delay_ms": delay_ms}  # a store subclass may not know it
        return {"token": self.token, "expected_revision": self.revision, "replace_history": replace_history, **delay}

    def _can_continue(self, cp: Checkpoint) -> bool:
        """Whether ``cp`` may be committed with the next cycle claimed in the same script.

        Not when it is not runnable, when the next claim would pass the revision limit (the store
        would refuse it), or for a limited task (its place goes back to its key): a plain commit.
        """
        return (
            cp.concurrency_key is None
            and cp.status == AgentStatus.RUNNING
            and cp.terminal_result is None
            and self.cycle_index < MAX_CYCLE
            and self.revision + 1 <= MAX_CLAIM_FROM_REVISION
        )

    def _continue_args(self, replace_history: bool, next_token: str | None) -> dict[str, Any]:
        """``commit_and_claim``'s: this claim's fence, and a full lease for the next cycle."""
        return {
            "token": self.token,
            "expected_revision": self.revision,
            "lease_ms": self.timing.lease_ms,
            "next_token": self.token if next_token is None else next_token,
            "replace_history": replace_history,
        }

    def _successor_options(self) -> dict[str, Any]:
        """The knobs a continued lease inherits (each shell adds its own)."""
        return {
            "lease_ms": self.timing.lease_ms,
            "renew_interval_ms": self.timing.renew_interval_ms,
            "renew_deadline_ms": self.timing.renew_deadline_ms,
            "on_lost": self._on_lost,
            "release_on_exit": self._release_on_exit,
        }

    def _write_failed(self) -> None:
        with self._lock:
            self._require().writing = False

    @contextlib.contextmanager
    def _guarded_write(self, how: str, *, continuing: bool = False) -> Iterator[WriteOutcome]:
        """Around a commit's (or commit_and_claim's) I/O: the body sets ``applied`` (``continuing``: ``next``,
        the claim it returned, which says whether it applied); on the way out the lease ends as ``how``, or
        is lost to the fence (``LeaseLost``). An error leaves it claimed and re-raises; for ``continuing``,
        ``ClaimRejected`` can only come from a re-send whose commit had applied while the next claim was
        taken since: committed, no successor."""
        out = WriteOutcome()
        try:
            yield out
            if continuing:
                out.applied = out.next is not None  # None: fenced out, nothing written
        except ClaimRejected:
            if not continuing:
                self._write_failed()
                raise
            out.applied, out.next = True, None
        except BaseException:
            self._write_failed()
            raise
        self._after_write(out.applied, how)

    def _next_lease(self: L, nxt: Checkpoint | None, sent: float) -> L | None:
        """The next cycle's lease, holding the claim a commit_and_claim sent at ``sent`` returned (None: none)."""
        if nxt is None:
            return None
        lease = self._successor(nxt)
        lease._adopt(nxt, sent)
        return lease

    def _successor(self: L, nxt: Checkpoint) -> L:
        """A lease of this shell for the claim ``nxt``, with this lease's knobs (``_successor_options``)."""
        raise NotImplementedError

    def _after_write(self, applied: bool, how: str) -> None:
        state = self._require()
        if applied:
            with self._lock:
                state.end(how)
            return
        self._lose("Redis rejected the write: the claim's revision is no longer current (fenced out)", fenced=True)
        raise self._lost_error(f"write rejected by the fence, nothing was {how}")

    def _watch_cancels(self, heard: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``heard`` (the keeper's: ``_cancel_heard``, then wake) on a cancel announcement of this task,
        through the store's cancel subscription, while the keeper runs; returns the unwatch."""
        watch = getattr(self._store, "_watch_cancel", None)
        if watch is None:
            return None
        try:
            return watch(self.task_id, heard)  # type: ignore[no-any-return]
        except Exception:  # the hint is optional: the renewals find the cancel anyway
            log.debug("%s", self._describe("cancel announcements unavailable"), exc_info=True)
            return None

    def _release_args(self, after_ms: int, reason: str | None) -> dict[str, Any]:
        after_ms = check_int(after_ms, "after_ms", 1, MAX_LEASE_MS)
        if reason is not None and not isinstance(reason, str):
            raise InvalidArgument(f"reason must be a str or None, got {type(reason).__name__}")
        return {"token": self.token, "expected_revision": self.revision, "after_ms": after_ms, "reason": reason}

    def _begin_release(self, after_ms: int, reason: str | None = None) -> dict[str, Any] | None:
        """End the lease as released; the store ``core.release`` arguments that give the cycle up, or None if it had
        ended."""
        state = self._require()
        if state.ended is not None:
            return None
        args = self._release_args(after_ms, reason)
        with self._lock:
            state.end("released")  # the keeper sends no further renewal
        return args

    # ---- what the keeper sends ------------------------------------------------------

    def _renew_args(self) -> dict[str, Any]:
        """One renewal: this claim's token, fenced by its revision, for a full lease."""
        return {"token": self.token, "expected_revision": self.revision, "lease_ms": self.timing.lease_ms}

    @staticmethod
    def _next_args(
        token: str | None, lease_ms: int, renew_deadline_ms: int | None, renew_interval_ms: int | None
    ) -> tuple[str, int]:
        """``(token, lease_ms)`` for ``claim_next``: the knobs are validated before anything is sent."""
        timing = LeaseTiming(lease_ms, renew_deadline_ms, renew_interval_ms)
        return (token if token is not None else new_token()), timing.lease_ms

    def _released(self, outcome: str | None) -> bool:
        """Record what the store's release answered; True if the cycle was given up (parked included)."""
        if outcome == "parked":
            self._parked = True
            log.error("%s", self._describe("task parked: this was its last attempt (max_attempts)"))
        return outcome is not None

    def _exiting(self, exc: BaseException | None) -> None:
        """The ``with`` body ended with ``exc``: an Exception is the attempt's failure, released with the claim.

        Anything else (KeyboardInterrupt, SystemExit, a cancelled task) is a shutdown, not a failure;
        nor is a ``BackendError`` (Redis failing, not the task: as the Runner, its attempt is given back).
        """
        if isinstance(exc, Exception) and not isinstance(exc, (LeaseLost, BackendError)):
            self._exit_reason = failure_reason(exc)

    def _should_release(self) -> bool:
        state = self._state
        return (
            self._release_on_exit and state is not None and state.ended is None and not state.is_lost(self._clock.now())
        )
