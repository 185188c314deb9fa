"""The one lease keeper: renews a held lease until it ends or is lost, on a thread or on a task.

Every lease the library keeps goes through here: a store's :class:`~redis_agentstate.lease.Lease`
and :class:`~redis_agentstate.lease.AsyncLease`, and LangGraph's ``ThreadLease`` and
``AsyncThreadLease``. The keeper decides nothing: it asks the lease (a
:class:`~redis_agentstate.core.lease.KeptLease`, whose rules run on the I/O-free
:class:`~redis_agentstate.core.lease.LeaseState`) for each step, waits on the lease's
:class:`~redis_agentstate.core.lease.Clock`, and sends the renewal it was given, bounded by the
lease's deadline: a renewal still unanswered when the deadline passes loses the lease, whether
Redis is slow, the connection hangs or the renewal waits on a busy client.

:class:`ThreadKeeper` and :class:`TaskKeeper` are the blocking and the awaited twin of the same
loop. :class:`CancelOnLoss` is what a lost async lease does to the work inside its ``async with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..core.lease import LOST, STOP, WAIT, KeptLease, Renewed, log
from ..errors import LeaseLost

__all__ = ["RECANCEL_S", "CancelOnLoss", "TaskKeeper", "ThreadKeeper"]


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


class ThreadKeeper:
    """Keeps ``lease`` on a daemon thread, sending ``renew()`` (a blocking call) when the lease says so.

    ``start`` once the lease is claimed; ``wake`` after anything that may change the next step (a
    write, a release, a loss, a cancel heard): the lease's state decides what the keeper does then.
    """

    def __init__(self, lease: KeptLease, renew: Callable[[], Renewed], name: str) -> None:
        self._lease = lease
        self._renew = renew
        self._name = name
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the keeper to return (not from the keeper's own thread)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)

    def _heard(self) -> None:
        if self._lease._cancel_heard():
            self.wake()  # the keeper renews now: the renewal's reply says whether it was a cancel

    def _run(self) -> None:
        lease, clock = self._lease, self._lease.clock
        state = lease._require()
        unwatch = lease._watch_cancels(self._heard)
        try:
            while True:
                # ``_wake`` only wakes the keeper; what it does next is the state's decision, made
                # after the clear, so a wake-up set from here on is never missed.
                self._wake.clear()
                step, delay = lease._next_step()
                if step in (STOP, LOST):
                    return
                if step == WAIT:
                    clock.wait(self._wake, delay)
                    continue
                sent = clock.now()
                call = _Call(self._renew)
                if not clock.wait(call.done, state.time_left(sent)):
                    lease._renew_timed_out()
                    return
                if call.error is not None:
                    if not lease._on_renew_error(call.error):
                        return
                elif not lease._on_renew_reply(sent, call.result):
                    return
        except BaseException as exc:
            lease._keeper_crashed("thread", exc)
            raise
        finally:
            if unwatch is not None:
                unwatch()


async def _event_set(event: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)
    return event.is_set()


async def _settled(call: asyncio.Future[Any], seconds: float) -> bool:
    await asyncio.wait((call,), timeout=seconds)
    return call.done()


def _retrieve(call: asyncio.Future[Any]) -> None:
    """A renewal given up on (the deadline passed) may still fail: its error is not the keeper's news."""
    if not call.cancelled():
        call.exception()


class TaskKeeper:
    """The asyncio twin of :class:`ThreadKeeper`: keeps ``lease`` on a task, awaiting ``renew()``.

    ``start(around)`` in the lease's ``__aenter__`` runs the renewals as ``around(renewals)`` (the
    :meth:`CancelOnLoss.keeping` of the lease's body); ``stop`` when the lease ends.
    """

    def __init__(self, lease: KeptLease, renew: Callable[[], Awaitable[Renewed]], name: str) -> None:
        self._lease = lease
        self._renew = renew
        self._name = name
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, around: Callable[[Callable[[], Awaitable[None]]], Coroutine[Any, Any, None]]) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(around(self._run), name=self._name)

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def stop(self, timeout: float = 5.0) -> None:
        """Wake the keeper and wait up to ``timeout`` seconds for it to return (a renewal in flight lands
        first: it takes at most what was left of the deadline); cancelled if it does not."""
        self.wake()
        task = self._task
        if task is None or task is asyncio.current_task() or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=timeout)
        except asyncio.TimeoutError:
            task.cancel()
        except asyncio.CancelledError:
            task.cancel()
            raise

    def _heard(self) -> None:
        if self._lease._cancel_heard():
            self.wake()

    async def _run(self) -> None:
        lease, clock = self._lease, self._lease.clock
        state = lease._require()
        wake = self._wake
        assert wake is not None
        unwatch = lease._watch_cancels(self._heard)
        try:
            while True:
                wake.clear()  # as the thread keeper: a wake-up, then the state decides
                step, delay = lease._next_step()
                if step in (STOP, LOST):
                    return
                if step == WAIT:
                    await clock.wait_async(functools.partial(_event_set, wake), delay)
                    continue
                sent = clock.now()
                call = asyncio.ensure_future(self._renew())
                try:
                    answered = await clock.wait_async(functools.partial(_settled, call), state.time_left(sent))
                except asyncio.CancelledError:
                    call.cancel()
                    raise
                if not answered:
                    call.add_done_callback(_retrieve)
                    call.cancel()
                    lease._renew_timed_out()
                    return
                error = None if call.cancelled() else call.exception()
                if call.cancelled() or isinstance(error, asyncio.CancelledError):
                    raise asyncio.CancelledError()
                if error is not None:
                    if not lease._on_renew_error(error):
                        return
                elif not lease._on_renew_reply(sent, call.result()):
                    return
        except asyncio.CancelledError:
            lease._keeper_cancelled()
            raise
        except Exception as exc:
            # Logged (with the traceback) and turned into a lost lease, which cancels the work.
            log.error("%s", lease._describe("lease keeper task crashed"), exc_info=exc)
            lease._keeper_crashed("task", exc)
        finally:
            if unwatch is not None:
                unwatch()


#: How long the async keeper waits for the body to leave the block after cancelling it before it
#: cancels again: a cancel can be swallowed on the way (Python < 3.12's ``asyncio.wait_for``, which
#: redis-py awaits on every command sent with a ``socket_timeout``, 5 s by default in redis-py 8,
#: returns the result of an inner call that completed in the same loop iteration as the cancel and
#: drops the cancel).
RECANCEL_S = 0.2


class CancelOnLoss:
    """The task inside an async lease's ``async with``, which losing the lease cancels.

    Shared by :class:`~redis_agentstate.lease.AsyncLease` and the LangGraph saver's
    ``AsyncThreadLease``: ``enter`` in ``__aenter__``; ``cancel`` when the lease is lost; the keeper
    task runs ``keeping(renewals)``, which once the renewals have ended cancels the body again every
    :data:`RECANCEL_S` until it has left the block (a swallowed cancel must not let it run on);
    ``exit`` in ``__aexit__``.
    """

    def __init__(self) -> None:
        self._work: asyncio.Task[Any] | None = None
        self._left: asyncio.Event | None = None
        self._message = ""
        #: Cancels sent to the body, delivered or swallowed: ``exit`` takes each back.
        self._sent = 0
        self.cancelled = False

    def enter(self) -> None:
        self._work = asyncio.current_task()
        self._left = asyncio.Event()

    def cancel(self, message: str) -> None:
        """Cancel the body, unless it has left the block (or there is none)."""
        work = self._work
        if work is not None and not work.done():
            self.cancelled = True
            self._message = message
            self._sent += 1
            work.cancel(message)

    async def keeping(self, renewals: Callable[[], Awaitable[None]]) -> None:
        """The keeper task: ``renewals()`` (until the lease is lost or over), then the re-cancels."""
        await renewals()
        left = self._left
        while self.cancelled and left is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(left.wait(), timeout=RECANCEL_S)
            work = self._work
            if work is None or work.done():
                return
            self._sent += 1
            work.cancel(f"{self._message} (cancelled again: the body has not left the block)")

    async def exit(
        self, close: Callable[[], Awaitable[Any]], exc: BaseException | None, lost: Callable[[], LeaseLost]
    ) -> None:
        """Leave the ``async with``: from here on a loss cancels nothing; ``close()``, then turn our own
        cancellation into ``lost()`` and let anyone else's through. Every cancel we sent is taken back
        (``uncancel``), so the task's ``cancelling()`` count is what it was (``asyncio.timeout`` reads it)."""
        self._work = None
        if self._left is not None:
            self._left.set()
        delivered = isinstance(exc, asyncio.CancelledError)
        try:
            await close()
            if self.cancelled and not delivered:
                # Our cancel may still be pending if the body finished without awaiting: take it here.
                await asyncio.sleep(0)
        except asyncio.CancelledError as cancel:
            if not self.cancelled or delivered:
                raise
            delivered = True
            exc = exc or cancel
        if not self.cancelled:
            return
        task = asyncio.current_task()
        if task is not None and hasattr(task, "uncancel"):
            for _ in range(self._sent):
                task.uncancel()
        if exc is None or isinstance(exc, asyncio.CancelledError):
            error = lost()
            # A cancelled task's LeaseLost keeps the TaskCancelled as its cause (``LeaseLost.cancelled``).
            raise error from (error.__cause__ or exc)
