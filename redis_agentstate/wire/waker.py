"""Wake-ups of blocked ``claim_next(block_ms=...)`` callers: one subscriber per store, shared by all callers.

Every script that makes a task due now (create, save and commit of a runnable
task; a release; requeue) publishes on its shard's sharded pub/sub channel
``ns:{ns#SS}:due`` (``_common.lua``'s ``notify_due``), with the ms until the
task is due as payload. A store that has blocked callers keeps one
subscription to the namespace's 64 channels: on a single server one
connection (one ``SSUBSCRIBE`` of all 64); on Redis Cluster one connection per
primary that owns any of them (a command may only name channels of one slot,
so one ``SSUBSCRIBE`` per slot, all on that primary's connection). Never one
per caller: 200 blocked workers of a store share them.

A blocked caller (``Waiter``) registers *before* its claim attempt, so a task
that becomes due after the attempt's peek is announced while it is
registered: no wake-up is lost between a failed attempt and the wait. One
announcement wakes one caller (FIFO), not all of them; a woken caller that
does not use its wake-up (it claimed something else, it timed out or was
cancelled) passes it on, and a woken caller that claimed wakes the next one,
whose attempt either claims more work or re-reads the earliest due time.

A lease that lapses publishes nothing. Each attempt reports the earliest
ready entry not yet due (a live lease's expiry, a delayed release); the
callers sleep at most until then, and the first to wake at that time claims
it ("the timer"). While the subscription is down (connecting, a lost
connection, an ACL without the channels) callers poll instead, so they are
slower but never stuck; a lost connection wakes every caller.

The same subscription carries cancels (``cancel.lua`` publishes ``cancel <task id>``): a lease
that holds a task registers a watch (``watch``) for as long as it holds it, which keeps the
subscription up (it lingers out only with neither blocked callers nor watches), and a cancel
of a watched task calls its callbacks, on the listener's thread or task. The lease then renews
at once and learns from the refusal that the task was cancelled: the message is only a hint.

``WakeState`` holds every decision and no I/O; ``SyncWaker`` (a listener
thread per connection) and ``AsyncWaker`` (a listener task per connection)
only read messages and signal waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis.exceptions as rex

from ..core.checkpoint import ClaimNextFound
from ..keys import Keys
from .shells import cancels as _cancels
from .shells import check_cancel as _check_cancel

__all__ = ["AsyncWaker", "SyncWaker", "WakeState", "Waiter"]

logger = logging.getLogger("redis_agentstate")

#: How long a probe that found nothing due lets later callers skip their own first attempt
#: (while no announcement arrived and no timer fell due): the idle cost of a Runner's loop of
#: blocks is then one probe per second per store, not one per call.
KNOWN_EMPTY_S = 1.0
#: While unsubscribed, callers poll at most this far apart.
POLL_S = 0.5
#: A listener with no caller registered for this long closes its connections.
LINGER_S = 10.0
#: How long a listener waits for one message before it looks at its linger and its health.
LISTEN_S = 1.0
#: After a failed subscription, callers poll this long before one tries to subscribe again.
RETRY_S = 5.0
#: A subscription confirms within this, or the subscriber is treated as down (callers poll).
SUBSCRIBE_TIMEOUT_S = 5.0


@dataclass(eq=False)
class Waiter:
    """One blocked caller: ``woken`` once handed a wake-up; ``signal`` wakes its wait (set by the driver)."""

    signal: Any
    woken: bool = False


@dataclass
class WakeState:
    """The waiters, the sequence of announcements and the timer; the drivers call it under their lock."""

    waiters: deque[Waiter] = field(default_factory=deque)
    #: Bumped by every announcement, timer and lost subscription.
    seq: int = 0
    #: ``time.monotonic()`` when the earliest known not-yet-due entry falls due.
    timer_at: float | None = None
    subscribed: bool = False
    empty_seq: int = -1
    empty_at: float = 0.0
    last_busy: float = field(default_factory=time.monotonic)
    #: A failed subscription was logged at warning level (reset by the next success).
    down_logged: bool = False
    #: Held leases' cancel callbacks by task id (``watch``): they keep the subscription up.
    watches: dict[str, list[Callable[[], None]]] = field(default_factory=dict)

    def watch(self, task_id: str, callback: Callable[[], None]) -> None:
        self.watches.setdefault(task_id, []).append(callback)

    def unwatch(self, task_id: str, callback: Callable[[], None]) -> None:
        callbacks = self.watches.get(task_id)
        if callbacks is not None:
            with contextlib.suppress(ValueError):
                callbacks.remove(callback)
            if not callbacks:
                del self.watches[task_id]
        self.last_busy = time.monotonic()

    def cancelled(self, task_id: str) -> list[Callable[[], None]]:
        """The callbacks to run for a cancel of ``task_id``."""
        return list(self.watches.get(task_id, ()))

    def idle(self, now: float) -> bool:
        """Nobody needs the subscription: no blocked caller, no watch, for ``LINGER_S``."""
        return not self.waiters and not self.watches and now - self.last_busy > LINGER_S

    def enter(self, waiter: Waiter) -> int:
        self.waiters.append(waiter)
        self.last_busy = time.monotonic()
        return self.seq

    def leave(self, waiter: Waiter, *, used: bool) -> list[Waiter]:
        """Unregister ``waiter``; the waiters to signal (its unused wake-up goes on to the next one)."""
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)
        self.last_busy = time.monotonic()
        if waiter.woken and not used:
            waiter.woken = False
            return self.wake_one()
        return []

    def wake_one(self) -> list[Waiter]:
        for waiter in self.waiters:
            if not waiter.woken:
                waiter.woken = True
                return [waiter]
        return []

    def wake_all(self) -> list[Waiter]:
        for waiter in self.waiters:
            waiter.woken = True
        return list(self.waiters)

    def announced(self, delay_ms: int, now: float) -> list[Waiter]:
        """A ``notify_due`` message: due now wakes one caller; due later arms the timer."""
        self.seq += 1
        if delay_ms <= 0:
            return self.wake_one()
        return self.arm(now + delay_ms / 1000)

    def arm(self, at: float) -> list[Waiter]:
        """Time the callers by ``at`` too; a timer earlier than before nudges the first caller to re-time itself."""
        if self.timer_at is not None and self.timer_at <= at:
            return []
        self.timer_at = at
        return list(self.waiters)[:1]

    def timer_due(self, now: float) -> bool:
        """The timer fell due: the caller who saw it first takes it (True) and makes an attempt."""
        if self.timer_at is None or self.timer_at > now:
            return False
        self.timer_at = None
        self.seq += 1
        return True

    def probed(self, seq: int, found: ClaimNextFound, now: float) -> list[Waiter]:
        """Learn from an attempt made by a caller registered at ``seq``."""
        out = self.arm(now + found.wait_ms / 1000) if found.wait_ms is not None else []
        if found.checkpoint is None and not found.more_due and seq == self.seq and self.subscribed:
            self.empty_seq, self.empty_at = seq, now
        return out

    def known_empty(self, now: float) -> bool:
        """A recent probe found nothing due and nothing was announced or fell due since."""
        return (
            self.subscribed
            and self.empty_seq == self.seq
            and now - self.empty_at < KNOWN_EMPTY_S
            and (self.timer_at is None or self.timer_at > now)
        )

    def lost(self) -> list[Waiter]:
        self.subscribed = False
        self.seq += 1
        return self.wake_all()

    def wait_s(self, deadline: float, now: float, waiter: Waiter | None = None) -> float:
        """How long ``waiter`` sleeps now: to its deadline, the timer, or the next poll when unsubscribed.

        Only the first registered caller sleeps until the timer (a caller that leaves hands it on,
        see ``claim``): 200 blocked threads all waking at every timer, one to take it, made each
        timer late by the herd (a p99 of 350 ms with 200 threads, benchmarks/timers.py).
        """
        until = deadline
        if self.timer_at is not None and (waiter is None or not self.waiters or self.waiters[0] is waiter):
            until = min(until, self.timer_at)
        if not self.subscribed:
            until = min(until, now + POLL_S)
        return max(0.0, until - now)


def _log_down(state: WakeState, exc: BaseException) -> None:
    """A warning the first time; while it stays down (a server without SSUBSCRIBE, an ACL without
    the channels), each retry only at debug level."""
    level = logging.DEBUG if state.down_logged else logging.WARNING
    state.down_logged = True
    logger.log(
        level,
        "claim_next: wake-up subscription down (%s); blocked callers poll, and held leases hear of a cancel "
        "at their next renewal, until it is back",
        exc,
    )


def channels(keys: Keys) -> list[str]:
    if not keys.resolved:
        raise RuntimeError(f"namespace {keys.namespace!r}: a waker was built before the store read its layout")
    return [keys.shard_due(s) for s in range(keys.shards)]


def _is_cluster(client: object) -> bool:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


#: ``_parse``'s "delay" of a cancel message (``notify_cancel``): not an announcement of work.
CANCEL = -1


def _parse(message: dict[str, Any]) -> tuple[int, str | None] | None:
    """``(ms until due, task id)`` of a ``notify_due`` message, ``(CANCEL, task id)`` of a
    ``notify_cancel`` one; None for another kind of message."""
    if message.get("type") not in ("smessage", b"smessage"):
        return None
    data = message.get("data")
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    delay, _, task_id = text.partition(" ")
    if delay == "cancel":
        return CANCEL, task_id
    try:
        return int(delay), task_id or None
    except ValueError:
        return 0, None


def _run_callbacks(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # one lease's bug must not stop the listener that serves them all
            logger.exception("cancel callback failed")


# ---- threads --------------------------------------------------------------------------


class SyncWaker:
    """The subscriber of a sync store: a listener thread per connection (one, or one per cluster primary)."""

    def __init__(self, client: Any, keys: Keys, on_due: Callable[[str], None] | None = None) -> None:
        self._client = client
        self._keys = keys
        self._channels = channels(keys)
        #: The layout the channels were built for: a reshard moves the shards to other channels.
        self._version = keys.version
        self._on_due = on_due
        self.state = WakeState()
        self.lock = threading.Lock()
        self._running = False
        self._generation = 0
        self._ready = threading.Event()
        #: After a failed subscription, when to try again (callers poll meanwhile).
        self._retry_at = 0.0
        self._pid = os.getpid()

    def signal(self, waiters: list[Waiter]) -> None:
        for waiter in waiters:
            cast(threading.Event, waiter.signal).set()

    def ensure_started(self) -> None:
        """Subscribe (once; again after the listener lingered out or lost its connection), and
        return once the subscription is confirmed or failed (then callers poll)."""
        if self._pid != os.getpid():
            self._forked()
        with self.lock:
            if self._running or time.monotonic() < self._retry_at:
                ready = self._ready
                starter = False
            else:
                self._running = True
                self._generation += 1
                generation = self._generation
                self._ready = ready = threading.Event()
                starter = True
                self._channels, self._version = channels(self._keys), self._keys.version
        if not starter:
            ready.wait(2 * SUBSCRIBE_TIMEOUT_S)
            return
        subs: list[Any] = []
        try:
            for conn, chans in self._groups():
                subs.append(self._subscribe(conn, chans))
        except Exception as exc:  # whatever it is, callers poll meanwhile: never worse than before blocking
            for pubsub in subs:
                with contextlib.suppress(Exception):
                    pubsub.close()
            self._down(generation, exc)
            ready.set()
            return
        with self.lock:
            self.state.subscribed = True
            self.state.down_logged = False
            self.state.seq += 1
        ready.set()
        for pubsub in subs:
            threading.Thread(
                target=self._listen, args=(pubsub, generation), name="agentstate-waker", daemon=True
            ).start()

    def _forked(self) -> None:
        """In a forked child: the parent's listener threads and connections are not ours."""
        self.lock = threading.Lock()
        self.state = WakeState()
        self._running, self._ready, self._retry_at = False, threading.Event(), 0.0
        self._generation += 1
        self._pid = os.getpid()

    def close(self) -> None:
        """Stop the listeners (each exits within ``LISTEN_S``); a later blocked caller subscribes again."""
        with self.lock:
            self._generation += 1
            self._running = False
            self.state.subscribed = False

    def _groups(self) -> list[tuple[Any, list[str]]]:
        if not _is_cluster(self._client):
            return [(self._client, self._channels)]
        by_node: dict[str, tuple[Any, list[str]]] = {}
        for channel in self._channels:
            node = self._client.get_node_from_key(channel)
            by_node.setdefault(node.name, (node.redis_connection, []))[1].append(channel)
        return list(by_node.values())

    def _subscribe(self, conn: Any, chans: list[str]) -> Any:
        pubsub = conn.pubsub()
        try:
            # One slot per SSUBSCRIBE on a cluster; one command for all on a single server.
            for group in [chans] if not _is_cluster(self._client) else [[c] for c in chans]:
                pubsub.ssubscribe(*group)
            confirmed = 0
            deadline = time.monotonic() + SUBSCRIBE_TIMEOUT_S
            while confirmed < len(chans):
                if time.monotonic() > deadline:
                    raise rex.TimeoutError("sharded subscription not confirmed")
                message = pubsub.get_message(timeout=0.5)
                if message is not None and message.get("type") in ("ssubscribe", b"ssubscribe"):
                    confirmed += 1
                elif message is not None:
                    self._on_message(message)
        except BaseException:
            with contextlib.suppress(Exception):
                pubsub.close()
            raise
        return pubsub

    def _down(self, generation: int, exc: BaseException) -> None:
        with self.lock:
            if generation != self._generation:
                return
            self._running = False
            self._generation += 1
            self._retry_at = time.monotonic() + RETRY_S
            woken = self.state.lost()
        _log_down(self.state, exc)
        self.signal(woken)

    def _on_message(self, message: dict[str, Any]) -> None:
        parsed = _parse(message)
        if parsed is None:
            return
        delay, task_id = parsed
        if delay == CANCEL:
            with self.lock:
                callbacks = self.state.cancelled(task_id or "")
            _run_callbacks(callbacks)
            return
        if delay <= 0 and task_id is not None and self._on_due is not None:
            self._on_due(task_id)
        with self.lock:
            woken = self.state.announced(delay, time.monotonic())
        self.signal(woken)

    def watch(self, task_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (on the listener thread) when ``task_id`` is cancelled, until the returned
        function is called. Subscribes in the background if not subscribed: never blocks the caller."""
        if self._pid != os.getpid():
            self._forked()
        with self.lock:
            self.state.watch(task_id, callback)
            start = not self._running and time.monotonic() >= self._retry_at
        if start:
            threading.Thread(target=self.ensure_started, name="agentstate-waker-start", daemon=True).start()

        def unwatch() -> None:
            with self.lock:
                self.state.unwatch(task_id, callback)

        return unwatch

    def _listen(self, pubsub: Any, generation: int) -> None:
        try:
            while True:
                with self.lock:
                    if generation != self._generation:
                        return
                    if self.state.idle(time.monotonic()) or self._keys.version != self._version:
                        # Lingered out, or resharded (the channels moved): a caller that wants the
                        # subscription starts it again, on the channels of the layout it now has.
                        self._running = False
                        self._generation += 1
                        self.state.subscribed = False
                        woken = self.state.lost() if self._keys.version != self._version else []
                        break
                message = pubsub.get_message(timeout=LISTEN_S)
                if message is not None:
                    if message.get("type") in ("sunsubscribe", b"sunsubscribe"):
                        raise rex.ConnectionError("a channel was unsubscribed by the server (slot moved)")
                    self._on_message(message)
        except Exception as exc:  # the connection died: every caller re-checks, the next one resubscribes
            self._down(generation, exc)
            return
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()
        self.signal(woken)

    def claim(
        self, attempt: Callable[[], ClaimNextFound], block_ms: int, now: Callable[[], float]
    ) -> tuple[ClaimNextFound, float]:
        """Attempts (``attempt``) until one claims or ``block_ms`` passes; the last attempt and when it was sent."""
        deadline = time.monotonic() + block_ms / 1000
        waiter = Waiter(threading.Event())
        state = self.state
        first, used, registered = True, False, False
        sent = now()
        found = ClaimNextFound(None, None, False)
        try:
            while True:
                self.ensure_started()
                with self.lock:
                    seq = state.seq
                    if not registered:
                        state.enter(waiter)
                        registered = True
                    # A Runner's loop of blocks: skip the probe another caller just made.
                    skip = first and block_ms > 0 and state.known_empty(time.monotonic())
                    was_woken, waiter.woken = waiter.woken, False
                    waiter.signal.clear()
                first = False
                if not skip:
                    sent = now()
                    found = attempt()
                    more: list[Waiter] = []
                    with self.lock:
                        nudged = state.probed(seq, found, time.monotonic())
                        if found.checkpoint is not None:
                            used = True
                            if was_woken or waiter.woken or found.more_due:
                                more = state.wake_one()
                    self.signal(nudged + more)
                    if found.checkpoint is not None:
                        return found, sent
                while True:
                    with self.lock:
                        t = time.monotonic()
                        if waiter.woken or state.timer_due(t):
                            break
                        if t >= deadline:
                            return found, sent
                        wait = state.wait_s(deadline, t, waiter)
                        polling = not state.subscribed
                    waiter.signal.wait(wait)
                    waiter.signal.clear()
                    if polling:
                        break
        finally:
            with self.lock:
                woken = state.leave(waiter, used=used) if registered else []
                if state.timer_at is not None and state.waiters:
                    woken.append(state.waiters[0])  # re-times itself by the timer this caller slept for
            self.signal(woken)


# ---- asyncio ------------------------------------------------------------------------------


class AsyncWaker:
    """The asyncio twin of :class:`SyncWaker`: listener tasks on the event loop of the first blocked caller."""

    def __init__(self, client: Any, keys: Keys, on_due: Callable[[str], None] | None = None) -> None:
        self._client = client
        self._keys = keys
        self._channels = channels(keys)
        #: The layout the channels were built for: a reshard moves the shards to other channels.
        self._version = keys.version
        self._on_due = on_due
        self.state = WakeState()
        self._tasks: list[asyncio.Task[None]] = []
        self._starting: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generation = 0
        self._retry_at = 0.0
        self._conns: list[Any] = []
        #: Subscriptions started by ``watch`` (referenced, so they are not collected mid-way).
        self._starters: set[asyncio.Task[None]] = set()

    @staticmethod
    def signal(waiters: list[Waiter]) -> None:
        for waiter in waiters:
            cast(asyncio.Event, waiter.signal).set()

    def _running(self) -> bool:
        loop = asyncio.get_running_loop()
        return self._loop is loop and any(not t.done() for t in self._tasks)

    async def ensure_started(self) -> None:
        """Subscribe if not subscribed; return once confirmed or failed (then callers poll)."""
        if self._running() or time.monotonic() < self._retry_at:
            return
        if self._starting is not None and self._loop is asyncio.get_running_loop() and not self._starting.done():
            await asyncio.shield(self._starting)
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._starting = loop.create_future()
        self._generation += 1
        generation = self._generation
        self._channels, self._version = channels(self._keys), self._keys.version
        starting = self._starting
        subs: list[tuple[Any, Any]] = []
        try:
            for conn, chans in await self._groups():
                subs.append((await self._subscribe(conn, chans), conn if conn is not self._client else None))
        except BaseException as exc:
            # Cancelled or failed half-way: close what was opened; callers poll meanwhile.
            for pubsub, own in subs:
                for closing in (pubsub, own):
                    if closing is not None:
                        with contextlib.suppress(Exception):
                            await asyncio.shield(closing.aclose())
            if not isinstance(exc, Exception):
                self._generation += 1  # cancelled: the next caller subscribes, at once
                raise
            self._down(generation, exc)
            return
        finally:
            if not starting.done():
                starting.set_result(None)
        self.state.subscribed = True
        self.state.down_logged = False
        self.state.seq += 1
        self._tasks = [loop.create_task(self._listen(p, c, generation), name="agentstate-waker") for p, c in subs]

    async def aclose(self) -> None:
        """Cancel the listeners and close their connections; a later blocked caller subscribes again."""
        self._generation += 1
        self.state.subscribed = False
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _groups(self) -> list[tuple[Any, list[str]]]:
        if not _is_cluster(self._client):
            return [(self._client, self._channels)]
        import redis.asyncio as aredis

        await self._client.initialize()
        by_node: dict[str, tuple[Any, list[str]]] = {}
        for channel in self._channels:
            node = self._client.get_node_from_key(channel)
            if node.name not in by_node:
                pool = aredis.ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
                by_node[node.name] = (aredis.Redis(connection_pool=pool), [])
            by_node[node.name][1].append(channel)
        return list(by_node.values())

    async def _subscribe(self, conn: Any, chans: list[str]) -> Any:
        pubsub = conn.pubsub()
        try:
            for group in [chans] if not _is_cluster(self._client) else [[c] for c in chans]:
                await pubsub.ssubscribe(*group)
            confirmed = 0
            deadline = time.monotonic() + SUBSCRIBE_TIMEOUT_S
            while confirmed < len(chans):
                if time.monotonic() > deadline:
                    raise rex.TimeoutError("sharded subscription not confirmed")
                message = await pubsub.get_message(timeout=0.5)
                if message is not None and message.get("type") in ("ssubscribe", b"ssubscribe"):
                    confirmed += 1
                elif message is not None:
                    self._on_message(message)
        except BaseException:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise
        return pubsub

    def _down(self, generation: int, exc: BaseException) -> None:
        if generation != self._generation:
            return
        self._generation += 1
        self._retry_at = time.monotonic() + RETRY_S
        _log_down(self.state, exc)
        self.signal(self.state.lost())

    def _on_message(self, message: dict[str, Any]) -> None:
        parsed = _parse(message)
        if parsed is None:
            return
        delay, task_id = parsed
        if delay == CANCEL:
            _run_callbacks(self.state.cancelled(task_id or ""))
            return
        if delay <= 0 and task_id is not None and self._on_due is not None:
            self._on_due(task_id)
        self.signal(self.state.announced(delay, time.monotonic()))

    def watch(self, task_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """The asyncio twin of :meth:`SyncWaker.watch` (``callback`` runs on the listener task); call
        it from the event loop the store is used on."""
        self.state.watch(task_id, callback)
        if (
            not self._running()
            and time.monotonic() >= self._retry_at
            and (self._starting is None or self._starting.done())
        ):
            start = asyncio.get_running_loop().create_task(self.ensure_started(), name="agentstate-waker-start")
            self._starters.add(start)
            start.add_done_callback(self._starters.discard)

        def unwatch() -> None:
            self.state.unwatch(task_id, callback)

        return unwatch

    async def _listen(self, pubsub: Any, own: Any, generation: int) -> None:
        """Read ``pubsub`` until the listener lingers out or fails; ``own``: a per-node client to close then."""
        try:
            while generation == self._generation:
                if self.state.idle(time.monotonic()):
                    self._generation += 1
                    self.state.subscribed = False
                    return
                if self._keys.version != self._version:
                    # Resharded: the channels moved; every caller probes again and one resubscribes.
                    self._generation += 1
                    self.state.subscribed = False
                    self.signal(self.state.lost())
                    return
                message = await pubsub.get_message(timeout=LISTEN_S)
                if message is not None:
                    if message.get("type") in ("sunsubscribe", b"sunsubscribe"):
                        raise rex.ConnectionError("a channel was unsubscribed by the server (slot moved)")
                    self._on_message(message)
        except asyncio.CancelledError:
            raise
        except GeneratorExit:
            # The event loop closed with the listener pending: nothing may be awaited any more.
            pubsub, own = None, None
            raise
        except Exception as exc:
            self._down(generation, exc)
        finally:
            for closing in (pubsub, own):
                if closing is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(closing.aclose())

    async def claim(
        self, attempt: Callable[[], Any], block_ms: int, now: Callable[[], float]
    ) -> tuple[ClaimNextFound, float]:
        """The asyncio twin of :meth:`SyncWaker.claim` (``attempt`` returns an awaitable)."""
        deadline = time.monotonic() + block_ms / 1000
        cancels = _cancels()
        waiter = Waiter(asyncio.Event())
        state = self.state
        first, used, registered = True, False, False
        sent = now()
        found = ClaimNextFound(None, None, False)
        try:
            while True:
                await self.ensure_started()
                _check_cancel(cancels)
                seq = state.seq
                if not registered:
                    state.enter(waiter)
                    registered = True
                skip = first and block_ms > 0 and state.known_empty(time.monotonic())
                was_woken, waiter.woken = waiter.woken, False
                waiter.signal.clear()
                first = False
                if not skip:
                    sent = now()
                    found = await attempt()
                    self.signal(state.probed(seq, found, time.monotonic()))
                    if found.checkpoint is None:
                        _check_cancel(cancels)
                    if found.checkpoint is not None:
                        used = True
                        if was_woken or waiter.woken or found.more_due:
                            self.signal(state.wake_one())
                        return found, sent
                while True:
                    t = time.monotonic()
                    if waiter.woken or state.timer_due(t):
                        break
                    if t >= deadline:
                        return found, sent
                    polling = not state.subscribed
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(waiter.signal.wait(), state.wait_s(deadline, t, waiter))
                    waiter.signal.clear()
                    if polling:
                        break
        finally:
            woken = state.leave(waiter, used=used) if registered else []
            if state.timer_at is not None and state.waiters:
                woken.append(state.waiters[0])
            self.signal(woken)
