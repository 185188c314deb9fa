"""Runners: a worker loop of ``claim_next -> handler(checkpoint) -> commit`` under a kept lease.

The handler contract (the same for :class:`Runner` and :class:`AsyncRunner`)::

    def handler(cp: Checkpoint) -> StepResult | Checkpoint: ...
    async def handler(cp: Checkpoint) -> StepResult | Checkpoint: ...   # AsyncRunner
    def handler(cp: Checkpoint, cycle: Cycle) -> StepResult | Checkpoint: ...   # with durable steps
    async def handler(cp: Checkpoint, cycle: AsyncCycle) -> ...                  # AsyncRunner

* ``cp`` is the checkpoint as claimed: ``cp.claimed_cycle`` is the cycle to
  run, ``cp.cycle_index`` the last committed one. It is the handler's to
  change: append to ``messages``/``cycles`` (history is append-only), edit
  ``shared_state``, set ``status``.
* Return ``StepResult(cp)`` to commit the cycle, ``StepResult(cp, done=True)``
  to finish the task (``cp.terminal_result`` must be set; the commit and the
  terminal state are one fenced write). A handler that rewrote the history
  (compaction) returns ``StepResult(cp, replace_history=True)``. Returning a bare ``Checkpoint`` means
  ``done = cp.terminal_result is not None``. The runner sets
  ``cycle_index`` to the claimed cycle before writing; claim fields are ignored.
* A cycle that leaves the task runnable is committed together with the claim
  of the task's next cycle, in one script (``commit_and_claim``): the same
  worker goes straight on with the task, up to ``max_consecutive_cycles``
  cycles in a row (default 8, see :class:`Runner`); then the commit is a plain
  one and the worker takes the longest-waiting task from ``claim_next``.
* Raising fails the cycle: it is logged with its traceback and released with
  the exception (type and message, cut to 500 characters) as the attempt's
  failure reason (a ``BackendError``, Redis failing rather than the task, is
  released without one: its attempt is given back), to be claimed again (by
  any worker) after a delay that backs off exponentially with the task's
  attempts at that cycle: between ``failure_delay_ms`` and twice that after
  the first, doubling after each further one, up to ``failure_delay_max_ms``
  (at the cap, between half of it and all of it): jittered, and never sooner
  than ``failure_delay_ms``. With the store's
  ``max_attempts``, the task is parked after its last attempt fails, whether
  the handler raised or the worker died (its lease lapsing counts too).
* A handler that takes a second positional parameter (without a default) gets the cycle's
  :class:`Cycle` (:class:`AsyncCycle` on asyncio): ``cycle.step(name, fn,
  *args)`` runs ``fn`` once per (task, cycle, name), its result memoized in
  Redis under the lease (:meth:`Lease.step`), so the retry of a cycle whose
  worker died does not call the model or send the email again;
  ``cycle.step_key(name)`` is the idempotency key to hand the service ``fn``
  calls; ``cycle.lease`` the lease. The signature is read once, when the runner
  is built; one-parameter handlers are called as before.
* A long handler should call ``current_lease().check()`` between steps: it
  raises :class:`~redis_agentstate.errors.LeaseLost` as soon as the lease is
  lost. On asyncio, losing the lease cancels the handler by itself.
* ``store.cancel(task_id)`` reaches the worker that holds the task within
  milliseconds (announced through the store's wake-up subscription; at the
  latest at the lease's next renewal): an async handler is cancelled, a sync
  handler's result is dropped (its commit is refused before anything is
  sent), the cycle is logged and counted (``RunnerStats.cancelled``), and the
  worker goes on with other tasks.

Stopping: :meth:`Runner.stop`, or SIGTERM/SIGINT when ``handle_signals`` (the
default, main thread only). The first signal stops claiming and lets every
in-flight cycle finish and commit; a second one exits at once (sync: raises
``SystemExit`` from :meth:`Runner.run`; async: cancels the cycles, which
release their claims). ``run(stop_when_idle=True)`` returns once idle: nothing due, and
no retry of a cycle that run released after a failure pending (it waits for each such
retry once; see :meth:`Runner.run`). Every log line about a cycle (logger
``redis_agentstate.runner``) carries ``task=... cycle=... revision=... token=...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import math
import os
import random
import signal
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .core.lease import failure_reason
from .core.validate import check_int
from .errors import AgentStateError, BackendError, InvalidArgument, LeaseLost
from .lease import DEFAULT_LEASE_MS, AsyncLease, Lease, LeaseTiming
from .models import Checkpoint

if TYPE_CHECKING:
    from .checkpoint import AsyncCheckpointStore, CheckpointStore

__all__ = [
    "DEFAULT_MAX_CONSECUTIVE_CYCLES",
    "AsyncCycle",
    "AsyncRunner",
    "Cycle",
    "Runner",
    "RunnerStats",
    "StepResult",
    "current_lease",
]

#: How many cycles of one task a worker runs in a row (the first claimed by ``claim_next``, the
#: others by ``commit_and_claim``) before it commits plainly and goes back to ``claim_next``.
#: 8 takes most of the gain: a cycle by ``claim_next`` costs a peek at every shard's head and a
#: claim (2 round trips, about 100-150 us of server time; 1 round trip and one script when an
#: earlier peek or an announcement left a candidate) plus the commit; continuing costs one
#: script. Over a streak of K cycles that is (K + 2) / K round trips per cycle: 3 at K = 1, 1.25 at
#: K = 8, 1.125 at K = 16, so beyond 8 the gain is small. The price is fairness while more tasks
#: are due than workers are free: a task that waits behind busy workers waits for one of them to
#: end its streak, at most 8 of its cycles (a few seconds of LLM calls per cycle, not minutes),
#: instead of one. With nothing else due, a streak ends at the cap and the task is claimed again
#: at once through ``claim_next``, so the cap costs an idle fleet one claim_next per 8 cycles.
DEFAULT_MAX_CONSECUTIVE_CYCLES = 8
#: The cap of the retry delay after failed attempts (unless ``failure_delay_ms`` is longer): a
#: minute keeps a task that failed on a passing outage from waiting long after it ended.
DEFAULT_FAILURE_DELAY_MAX_MS = 60_000
#: How long past a retry's due time (on this host's clock) a ``stop_when_idle`` run's claim blocks for
#: it: the server made it due no later than that time, so the claim finds it (or finds it taken).
RETRY_MARGIN_MS = 20

log = logging.getLogger("redis_agentstate.runner")


@dataclass
class StepResult:
    """What a handler returns: the checkpoint after this cycle, and whether the task is done.

    ``replace_history=True`` stores ``checkpoint.messages``/``cycles`` as the whole history
    (e.g. after compacting or summarising it) instead of appending what was added since the
    claim; it is passed to the commit or finalize. ``delay_ms``: the task's next cycle is not
    claimable before that long from now (server clock): a timer, "look again in an hour"; with
    ``checkpoint.status`` ``wait_user``, the deadline of the wait for a person (at it the task
    is due by itself, status still ``wait_user``; ``store.resume`` makes it ``running``).
    """

    checkpoint: Checkpoint
    done: bool = False
    replace_history: bool = False
    delay_ms: int | None = None


@dataclass
class RunnerStats:
    """Counters of one runner (cumulative over ``run`` calls)."""

    claimed: int = 0
    committed: int = 0
    finalized: int = 0
    lost: int = 0
    failed: int = 0
    claim_errors: int = 0
    #: Cycles claimed together with the previous cycle's commit (``commit_and_claim``).
    continued: int = 0
    #: Tasks this runner parked: their failed cycle was the last attempt (the store's ``max_attempts``).
    parked: int = 0
    #: Cycles dropped because their task was cancelled while the handler ran (also counted in ``lost``).
    cancelled: int = 0


T = TypeVar("T")


class Cycle:
    """What a two-parameter handler gets besides the checkpoint: the cycle's lease and its durable steps."""

    __slots__ = ("lease",)

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` once per (task, cycle, name), its result memoized (:meth:`Lease.step`)."""
        return self.lease.step(name, fn, *args, **kwargs)

    def step_key(self, name: str) -> str:
        """The idempotency key of step ``name`` of this cycle, the same for every attempt (:meth:`Lease.step_key`)."""
        return self.lease.step_key(name)


class AsyncCycle:
    """The asyncio twin of :class:`Cycle` (``await cycle.step(name, fn, *args)``, ``fn`` a coroutine function)."""

    __slots__ = ("lease",)

    def __init__(self, lease: AsyncLease) -> None:
        self.lease = lease

    async def step(self, name: str, fn: Callable[..., Awaitable[T] | T], /, *args: Any, **kwargs: Any) -> T:
        """``await fn(*args, **kwargs)`` once per (task, cycle, name), memoized (:meth:`AsyncLease.step`)."""
        return await self.lease.step(name, fn, *args, **kwargs)

    def step_key(self, name: str) -> str:
        """The idempotency key of step ``name`` of this cycle (:meth:`Lease.step_key`)."""
        return self.lease.step_key(name)


def takes_cycle(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` has a second positional parameter without a default (it then gets the
    :class:`Cycle`).

    One with a default (``def step(cp, who="w")``) or ``*args`` does not count: a handler
    written before cycles existed, or a wrapper without ``functools.wraps`` around one, must
    keep getting one argument.
    """
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: as before
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty


Outcome = StepResult | Checkpoint
Handler = Callable[[Checkpoint], Outcome] | Callable[[Checkpoint, Cycle], Outcome]
AsyncHandler = Callable[[Checkpoint], Awaitable[Outcome]] | Callable[[Checkpoint, AsyncCycle], Awaitable[Outcome]]

_current: ContextVar[Lease | AsyncLease | None] = ContextVar("agentstate_current_lease", default=None)

#: Every runner alive, for the lease gauges of ``redis_agentstate.telemetry`` (weak: a dropped runner leaves).
RUNNERS: weakref.WeakSet[_RunnerBase[Any, Any]] = weakref.WeakSet()


def current_lease() -> Lease | AsyncLease | None:
    """The lease of the cycle the calling handler is running (None outside a handler)."""
    return _current.get()


class CycleLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with the cycle it concerns."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        e = self.extra or {}
        return f"task={e['task_id']} cycle={e['cycle']} revision={e['revision']} token={e['token']}: {msg}", kwargs


def cycle_log(lease: Lease | AsyncLease, logger: logging.Logger) -> CycleLog:
    extra = {"task_id": lease.task_id, "cycle": lease.cycle_index, "revision": lease.revision, "token": lease.token}
    return CycleLog(logger, extra)


def default_worker_id() -> str:
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{os.urandom(2).hex()}"


H = TypeVar("H")
S = TypeVar("S")


class _RunnerBase(Generic[S, H]):
    """Configuration, counters, logging and the handler contract; no I/O."""

    def __init__(
        self,
        store: S,
        handler: H,
        *,
        concurrency: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        renew_interval_ms: int | None = None,
        renew_deadline_ms: int | None = None,
        idle_min_ms: int = 50,
        idle_max_ms: int = 2_000,
        failure_delay_ms: int = 1_000,
        failure_delay_max_ms: int | None = None,
        max_consecutive_cycles: int = DEFAULT_MAX_CONSECUTIVE_CYCLES,
        worker_id: str | None = None,
        handle_signals: bool = True,
        on_lease_lost: Callable[[Any, Checkpoint | None], None] | None = None,
        on_written: Callable[[Any, Checkpoint, bool], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if not callable(handler):
            raise InvalidArgument("handler must be callable")
        self.store = store
        self.handler = handler
        #: Read once: a handler with a second positional parameter gets the cycle (Cycle / AsyncCycle).
        self._takes_cycle = takes_cycle(handler)
        self.concurrency = check_int(concurrency, "concurrency", 1, 4096)
        self.timing = LeaseTiming(lease_ms, renew_deadline_ms, renew_interval_ms)
        self.idle_min_ms = check_int(idle_min_ms, "idle_min_ms", 1, 3_600_000)
        self.idle_max_ms = check_int(idle_max_ms, "idle_max_ms", idle_min_ms, 3_600_000)
        self.failure_delay_ms = check_int(failure_delay_ms, "failure_delay_ms", 1, 3_600_000)
        if failure_delay_max_ms is None:
            failure_delay_max_ms = max(self.failure_delay_ms, DEFAULT_FAILURE_DELAY_MAX_MS)
        self.failure_delay_max_ms = check_int(
            failure_delay_max_ms, "failure_delay_max_ms", self.failure_delay_ms, 3_600_000
        )
        self.max_consecutive_cycles = check_int(max_consecutive_cycles, "max_consecutive_cycles", 1, 1_000_000)
        self.worker_id = worker_id or default_worker_id()
        self.handle_signals = handle_signals
        self.on_lease_lost = on_lease_lost
        self.on_written = on_written
        self.log = logger or log
        self.stats = RunnerStats()
        self._tokens = itertools.count()
        self._stats_lock = threading.Lock()
        self._signals = 0
        #: The lease each worker (thread or task) claimed last; the live ones are the leases held now.
        self._leases: dict[object, Lease | AsyncLease] = {}
        #: In a ``stop_when_idle`` run: the cycles it released after a failure whose retry it waits
        #: for, with when they are due (monotonic), and every cycle it ever waited for (once each).
        self._wait_retries = False
        self._retries: dict[tuple[str, int], float] = {}
        self._awaited: set[tuple[str, int]] = set()
        RUNNERS.add(self)

    def _start_run(self, stop_when_idle: bool) -> None:
        self._signals = 0
        with self._stats_lock:
            self._leases.clear()  # the previous run's workers are gone
            self._wait_retries = stop_when_idle
            self._retries.clear()
            self._awaited.clear()

    def live_leases(self) -> list[Lease | AsyncLease]:
        """The leases this runner's workers hold now (claimed, not yet written, released or lost)."""
        with self._stats_lock:
            leases = list(self._leases.values())
        return [lease for lease in leases if lease.ended is None and not lease.lost]

    def _worker_slot(self) -> object:
        raise NotImplementedError

    # ---- decisions shared by both shells -----------------------------------------------

    def _new_token(self) -> str:
        """A fresh claim token per claimed cycle: log lines and histories tell the cycles apart."""
        return f"{self.worker_id}:{next(self._tokens)}"

    def _continues(self, cp: Checkpoint, done: bool, streak: int, delay_ms: int | None = None) -> bool:
        """Whether to claim the task's next cycle with this commit (see ``max_consecutive_cycles``); never
        when the next cycle is delayed (it is not due)."""
        return not done and not delay_ms and streak < self.max_consecutive_cycles and not self.stopping

    @property
    def stopping(self) -> bool:
        raise NotImplementedError

    def _lease_kwargs(self) -> dict[str, Any]:
        return {
            "token": self._new_token(),
            "lease_ms": self.timing.lease_ms,
            "renew_interval_ms": self.timing.renew_interval_ms,
            "renew_deadline_ms": self.timing.renew_deadline_ms,
        }

    def _block_ms(self, stop_when_idle: bool) -> int | None:
        """How long one ``claim_next`` blocks while idle: ``idle_max_ms``, so a stop is seen that soon.

        Blocking costs the server nothing while no work becomes due (the store's one subscription
        wakes a blocked worker when a task is due; see ``wire.waker``), so idle workers do not poll.
        A ``stop_when_idle`` run does not block (None) unless a retry it waits for is pending: then
        until that retry is due (and ``RETRY_MARGIN_MS``), at most ``idle_max_ms``.
        """
        if not stop_when_idle:
            return self.idle_max_ms
        with self._stats_lock:
            due = min(self._retries.values(), default=None)
        if due is None:
            return None
        wait = math.ceil((due - time.monotonic()) * 1000) + RETRY_MARGIN_MS
        return min(max(wait, RETRY_MARGIN_MS), self.idle_max_ms)

    def _idle(self, stop_when_idle: bool, sent: float) -> bool:
        """A claim sent at ``sent`` (monotonic) found nothing: True if the worker's run is over.

        Only a ``stop_when_idle`` run ends, and only once no retry it waits for is pending. A retry
        that was due before the claim was sent and was not found is not waited for any more:
        another worker took it, or it was deleted, saved or requeued.
        """
        if not stop_when_idle:
            return False
        with self._stats_lock:
            for key in [key for key, due in self._retries.items() if due <= sent]:
                del self._retries[key]
            return not self._retries

    def _idle_delay(self, idle_polls: int) -> float:
        """Full-jitter exponential backoff between ``idle_min_ms`` and ``idle_max_ms`` (seconds)."""
        cap = min(self.idle_max_ms, self.idle_min_ms * 2 ** min(idle_polls, 30))
        return random.uniform(self.idle_min_ms, cap) / 1000

    def _count(self, what: str) -> None:
        with self._stats_lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)

    def _outcome(self, result: object, lease: Lease | AsyncLease) -> tuple[Checkpoint, bool, bool, int | None]:
        """``(checkpoint to write, done, replace_history, delay_ms)`` from what the handler returned."""
        replace_history, delay_ms = False, None
        if isinstance(result, StepResult):
            delay_ms = result.delay_ms
            cp, done = result.checkpoint, bool(result.done)
            if not isinstance(result.replace_history, bool):
                raise InvalidArgument(
                    f"StepResult.replace_history must be a bool, got {type(result.replace_history).__name__}"
                )
            replace_history = result.replace_history
        elif isinstance(result, Checkpoint):
            cp, done = result, result.terminal_result is not None
        else:
            raise InvalidArgument(f"handler must return a StepResult or a Checkpoint, got {type(result).__name__}")
        if not isinstance(cp, Checkpoint):
            raise InvalidArgument(f"StepResult.checkpoint must be a Checkpoint, got {type(cp).__name__}")
        if done and cp.terminal_result is None:
            raise InvalidArgument("a done StepResult needs checkpoint.terminal_result")
        if done and delay_ms:
            raise InvalidArgument("a done StepResult has no next cycle to delay: drop delay_ms")
        cp = replace(cp, cycle_index=lease.cycle_index, claim_token=None, claimed_cycle=None, lease_expires_at_ms=None)
        return cp, done, replace_history, delay_ms

    def _claim_failed(self, exc: Exception, idle_polls: int) -> float:
        self._count("claim_errors")
        delay = self._idle_delay(idle_polls + 3)
        self.log.warning("claim_next failed, retrying in %.0f ms: %s", delay * 1000, exc)
        return delay

    def _claimed(self, lease: Lease | AsyncLease) -> CycleLog:
        self._count("claimed")
        with self._stats_lock:
            self._leases[self._worker_slot()] = lease
            self._retries.pop((lease.task_id, lease.cycle_index), None)
        clog = cycle_log(lease, self.log)
        clog.info("claimed (lease %d ms)", self.timing.lease_ms)
        return clog

    def _failure_delay_ms(self, attempts: int) -> int:
        """The retry delay after failed attempt ``attempts`` (1 = the first): exponential, capped, jittered.

        A random value between ``failure_delay_ms * 2 ** (attempts - 1)`` and twice that, both
        capped at ``failure_delay_max_ms`` (at the cap: between half of it and all of it).
        Failures of many tasks at once (a dependency's outage) do not come back in lockstep, and
        no retry comes sooner than ``failure_delay_ms``: it is the floor a user sets.
        """
        ceiling = min(self.failure_delay_max_ms, self.failure_delay_ms * 2 ** min(max(attempts, 1), 40))
        floor = max(self.failure_delay_ms, ceiling / 2)
        return max(1, int(random.uniform(floor, ceiling)))

    def _handler_failed(self, clog: CycleLog, lease: Lease | AsyncLease, exc: BaseException) -> tuple[int, str | None]:
        """Count and log a failed cycle; ``(after_ms, reason)`` for its release.

        A ``BackendError`` (Redis unreachable, a write too few replicas acknowledged, a
        failover's ``NOREPLICAS``) is the backend's failure, not the task's: the cycle is
        released without a reason, which gives its attempt back, after the first delay
        (not one grown by attempts). Otherwise a failover could park healthy tasks under
        ``max_attempts``. Everything else counts as a failed attempt, with its reason.
        """
        self._count("failed")
        attempts = lease.checkpoint.attempts
        if isinstance(exc, BackendError):
            delay = self._failure_delay_ms(1)
            clog.error("cycle failed on the backend (not counted as an attempt); releasing it for retry in %d ms",
                       delay, exc_info=exc)  # fmt: skip
            return delay, None
        delay = self._failure_delay_ms(attempts)
        clog.error("handler failed (attempt %d); releasing the cycle for retry in %d ms", attempts, delay, exc_info=exc)
        return delay, failure_reason(exc)

    def _released(self, clog: CycleLog, lease: Lease | AsyncLease, after_ms: int | None) -> None:
        """A failed cycle was released for a retry in ``after_ms`` (None: the release failed or was not ours).

        A ``stop_when_idle`` run waits for that retry, once per cycle: if the retry fails too, the
        next one is left to a later run, so a task that fails every time cannot keep it running.
        """
        if lease.parked:
            self._count("parked")
            clog.error("task parked after %d attempt(s) at this cycle; `agentstate requeue` runs it again",
                       lease.checkpoint.attempts)  # fmt: skip
            return
        key = (lease.task_id, lease.cycle_index)
        with self._stats_lock:
            if after_ms is not None and self._wait_retries and key not in self._awaited:
                self._awaited.add(key)
                self._retries[key] = time.monotonic() + after_ms / 1000

    def _release_failed(self, clog: CycleLog, exc: Exception) -> None:
        # Whatever the release raised (Redis down, a bug), the worker goes on: the claim lapses.
        clog.warning("releasing the failed cycle failed; it is claimable again when its lease expires: %r", exc,
                     exc_info=not isinstance(exc, AgentStateError))  # fmt: skip

    def _written(self, clog: CycleLog, lease: Lease | AsyncLease, cp: Checkpoint, done: bool) -> None:
        self._count("finalized" if done else "committed")
        clog.info("%s; new revision=%d", "finalized (task done)" if done else "committed", lease.revision + 1)
        if self.on_written is not None:
            try:
                self.on_written(lease, cp, done)
            except Exception:
                clog.exception("on_written callback failed")

    def _lost(self, clog: CycleLog, lease: Lease | AsyncLease, cp: Checkpoint | None, exc: LeaseLost) -> None:
        self._count("lost")
        cancel = lease.cancelled
        if cancel is not None:
            self._count("cancelled")
            clog.info("task cancelled (%s): handler stopped, cycle dropped", cancel.reason)
        else:
            clog.warning("lease lost, cycle not committed: %s", exc)
        if self.on_lease_lost is not None:
            try:
                self.on_lease_lost(lease, cp)
            except Exception:
                clog.exception("on_lease_lost callback failed")

    def _signal_received(self, signum: int) -> bool:
        """True for the first signal (stop gracefully), False for a later one (stop now)."""
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            self.log.warning("%s received: finishing in-flight cycles, then stopping (again to exit now)", name)
            return True
        self.log.warning("%s received again: exiting now; in-flight cycles are released or expire", name)
        return False


class Runner(_RunnerBase["CheckpointStore", Handler]):
    """Runs ``handler`` on claimable cycles with ``concurrency`` worker threads (see :mod:`redis_agentstate.runner`).

    ``lease_ms`` / ``renew_*_ms``: the lease kept per cycle (:class:`LeaseTiming`).
    While there is no work a worker blocks in ``claim_next(block_ms=idle_max_ms)``,
    woken when a task becomes due; ``idle_min_ms`` / ``idle_max_ms`` also bound the
    jittered backoff after a failed claim. ``on_lease_lost(lease, checkpoint)`` runs when a cycle's result
    could not be committed because the lease was lost (``checkpoint`` is None
    if the handler had not returned); ``on_written(lease, checkpoint, done)``
    after each successful commit or finalize. ``max_consecutive_cycles``: how many
    cycles of one task a worker runs in a row before it goes back to
    ``claim_next`` (``DEFAULT_MAX_CONSECUTIVE_CYCLES`` says why 8; 1 turns
    continuing off). ``failure_delay_ms`` / ``failure_delay_max_ms``: the retry delay after a
    failed cycle, doubling with the task's attempts at that cycle up to the cap (default
    ``DEFAULT_FAILURE_DELAY_MAX_MS``, or ``failure_delay_ms`` if longer), jittered.
    """

    def __init__(self, store: CheckpointStore, handler: Handler, **options: Any) -> None:
        super().__init__(store, handler, **options)
        self._stop = threading.Event()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called or a signal asked the runner to stop."""
        return self._stop.is_set()

    def _worker_slot(self) -> object:
        return threading.get_ident()

    def stop(self) -> None:
        """Stop claiming; in-flight cycles finish (thread-safe, signal-safe)."""
        self._stop.set()

    def run(self, *, stop_when_idle: bool = False) -> RunnerStats:
        """Work until :meth:`stop` or a signal, or with ``stop_when_idle`` until idle.

        Idle: a claim finds nothing due, and no retry this run waits for is pending. A cycle the
        run released after a failure (the handler raised, or the store refused its write) is
        retried after its failure delay; the run waits for that retry (that long, no longer) and
        runs it, once per cycle: a retry that fails again is left to a later run or another
        worker. Work other workers hold, or delayed by anyone else, is not waited for.
        """
        self._stop.clear()
        self._start_run(stop_when_idle)
        restore = self._install_signals()
        try:
            threads = [
                threading.Thread(
                    target=self._worker, args=(stop_when_idle,), name=f"agentstate-runner-{i}", daemon=True
                )
                for i in range(self.concurrency)
            ]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.1)  # short joins keep the main thread responsive to signals
        finally:
            restore()
        return self.stats

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum: int, frame: object) -> None:
            if self._signal_received(signum):
                self.stop()
            else:
                raise SystemExit(128 + signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _worker(self, stop_when_idle: bool) -> None:
        idle = 0
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                lease = Lease.next(self.store, block_ms=self._block_ms(stop_when_idle), **self._lease_kwargs())
            except AgentStateError as exc:
                self._stop.wait(self._claim_failed(exc, idle))
                continue
            if lease is None:
                if self._idle(stop_when_idle, sent):
                    return
                idle += 1
                continue
            idle = 0
            streak = 1
            nxt: Lease | None = lease
            while nxt is not None:
                nxt = self._cycle(nxt, streak)
                streak += 1

    def _cycle(self, lease: Lease, streak: int = 1) -> Lease | None:
        """Run one claimed cycle; the lease of the task's next cycle when it was claimed with the commit."""
        clog = self._claimed(lease)
        cp: Checkpoint | None = None
        nxt: Lease | None = None
        with lease:
            reset = _current.set(lease)
            try:
                # A worker frozen since its claim (SIGSTOP, a long pause) reads its lease as lost, on the
                # lease's own clock, and starts no handler: the cycle may have run elsewhere meanwhile.
                lease.check()
                if self._takes_cycle:
                    result = self.handler(lease.checkpoint, Cycle(lease))  # type: ignore[call-arg]
                else:
                    result = self.handler(lease.checkpoint)  # type: ignore[call-arg]
                cp, done, replace_history, delay_ms = self._outcome(result, lease)
            except LeaseLost as exc:
                self._lost(clog, lease, cp, exc)
                return None
            except Exception as exc:
                self._release(clog, lease, *self._handler_failed(clog, lease, exc))
                return None
            finally:
                _current.reset(reset)
            try:
                if done:
                    lease.finalize(cp, replace_history=replace_history)
                elif self._continues(cp, done, streak, delay_ms):
                    nxt = lease.commit_and_claim(cp, replace_history=replace_history, next_token=self._new_token())
                else:
                    lease.commit(cp, replace_history=replace_history, delay_ms=delay_ms)
            except LeaseLost as exc:
                self._lost(clog, lease, cp, exc)
                return None
            except AgentStateError as exc:
                self._release(clog, lease, *self._handler_failed(clog, lease, exc))
                return None
            self._written(clog, lease, cp, done)
        if nxt is not None:
            self._count("continued")
        return nxt

    def _release(self, clog: CycleLog, lease: Lease, after_ms: int, reason: str | None) -> None:
        try:
            released = lease.release(after_ms=after_ms, reason=reason)
        except Exception as exc:
            self._release_failed(clog, exc)
            released = False
        self._released(clog, lease, after_ms if released else None)


class AsyncRunner(_RunnerBase["AsyncCheckpointStore", AsyncHandler]):
    """The asyncio twin of :class:`Runner`: ``concurrency`` worker tasks, an ``async`` handler,
    and a lost lease cancels its handler."""

    def __init__(self, store: AsyncCheckpointStore, handler: AsyncHandler, **options: Any) -> None:
        super().__init__(store, handler, **options)
        self._stop: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called or a signal asked the runner to stop."""
        return self._stop is not None and self._stop.is_set()

    def _worker_slot(self) -> object:
        return asyncio.current_task()

    def stop(self) -> None:
        """Stop claiming; in-flight cycles finish. Call from the runner's event loop."""
        if self._stop is not None:
            self._stop.set()

    async def run(self, *, stop_when_idle: bool = False) -> RunnerStats:
        """Work until :meth:`stop` or a signal, or with ``stop_when_idle`` until idle (see :meth:`Runner.run`)."""
        self._stop = asyncio.Event()
        self._start_run(stop_when_idle)
        loop = asyncio.get_running_loop()
        installed = self._install_signals(loop)
        try:
            self._workers = [
                loop.create_task(self._worker(stop_when_idle), name=f"agentstate-runner-{i}")
                for i in range(self.concurrency)
            ]
            await asyncio.gather(*self._workers, return_exceptions=False)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._workers = []
        return self.stats

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []

        def on_signal(signum: int) -> None:
            if self._signal_received(signum):
                self.stop()
            else:
                for task in self._workers:
                    task.cancel()

        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError):  # e.g. Windows, or not the main thread's loop
                continue
            installed.append(sig)
        return installed

    async def _wait(self, seconds: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _worker(self, stop_when_idle: bool) -> None:
        idle = 0
        assert self._stop is not None
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                lease = await AsyncLease.next(
                    self.store, block_ms=self._block_ms(stop_when_idle), **self._lease_kwargs()
                )
            except AgentStateError as exc:
                await self._wait(self._claim_failed(exc, idle))
                continue
            if lease is None:
                if self._idle(stop_when_idle, sent):
                    return
                idle += 1
                continue
            idle = 0
            streak = 1
            nxt: AsyncLease | None = lease
            while nxt is not None:
                nxt = await self._cycle(nxt, streak)
                streak += 1

    async def _cycle(self, lease: AsyncLease, streak: int = 1) -> AsyncLease | None:
        """Run one claimed cycle; the lease of the task's next cycle when it was claimed with the commit."""
        clog = self._claimed(lease)
        cp: Checkpoint | None = None
        nxt: AsyncLease | None = None
        try:
            async with lease:
                reset = _current.set(lease)
                try:
                    lease.check()  # as Runner._cycle
                    if self._takes_cycle:
                        result = await self.handler(lease.checkpoint, AsyncCycle(lease))  # type: ignore[call-arg]
                    else:
                        result = await self.handler(lease.checkpoint)  # type: ignore[call-arg]
                    cp, done, replace_history, delay_ms = self._outcome(result, lease)
                except LeaseLost:
                    raise
                except Exception as exc:
                    await self._release(clog, lease, *self._handler_failed(clog, lease, exc))
                    return None
                finally:
                    _current.reset(reset)
                try:
                    if done:
                        await lease.finalize(cp, replace_history=replace_history)
                    elif self._continues(cp, done, streak, delay_ms):
                        nxt = await lease.commit_and_claim(
                            cp, replace_history=replace_history, next_token=self._new_token()
                        )
                    else:
                        await lease.commit(cp, replace_history=replace_history, delay_ms=delay_ms)
                except LeaseLost:
                    raise
                except AgentStateError as exc:
                    await self._release(clog, lease, *self._handler_failed(clog, lease, exc))
                    return None
                self._written(clog, lease, cp, done)
        except LeaseLost as exc:
            self._lost(clog, lease, cp, exc)
            return None
        if nxt is not None:
            self._count("continued")
        return nxt

    async def _release(self, clog: CycleLog, lease: AsyncLease, after_ms: int, reason: str | None) -> None:
        try:
            released = await lease.release(after_ms=after_ms, reason=reason)
        except Exception as exc:
            self._release_failed(clog, exc)
            released = False
        self._released(clog, lease, after_ms if released else None)
