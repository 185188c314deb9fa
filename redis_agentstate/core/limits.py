"""Per-key concurrency limits: the places a limited lease holds in its key's limiter.

A task with a ``concurrency_key`` is limited: at most ``limit`` live leases of that key at any
moment, fleet-wide. The key's limiter (``keys.LimiterKeys``) lives in the key's own slot, which
on a Cluster is not the slot of most of its tasks, so no one script can check both. The
protocol (``_common.lua``'s limits note) spans them in an order that a crash at any point
cannot turn into an excess, nor into a leak longer than one lease:

1. take a place (``limit_acquire.lua``): a sorted-set entry ``<task>\\0<token>`` that expires
   ``lease_ms + LIMIT_SKEW_MS`` from now (limiter clock); refused when the key has ``limit``
   places that have not expired;
2. claim (or renew) with the place's expiry as a *permit*: the task's script refuses a limited
   task without one (``Reply.LIMITED``) and caps the lease at the expiry minus
   ``LIMIT_SKEW_MS``, so the lease never outlives its place;
3. give the place back after the commit, finalize or release (``limit_release.lua``), and wake
   one task ``claim_next`` put off while the key was full (``limit_wake.lua``). Only a lease that
   ended gives its place back: a write that applied, or one whose refusal shows the token holds
   no live lease of the task (taken over, lapsed, the task gone or terminal). A refusal of a
   lease that stays live (a stale revision or cycle) carries how long it still runs, and its
   place is kept (``refused_write``): else the key would have more live leases than its limit.

A client that dies after 1 leaks the place until it expires (one lease); one that dies after
2 holds a lease whose place lives as long. A renewal moves the place first, then the lease.
``claim_next`` that meets a limited candidate whose key is full puts it off in its shard until
the earliest place of the key expires, and records it in the limiter so that the release of a
place makes it due at once. ``ConcurrencyLimits`` is the checkpoint core's part that holds the
places (``permits``); the writes, claims and releases call it by name. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConcurrencyLimited, CorruptState
from ..wire import Call, Op, Pipe, scripts
from ..wire.scripts import Reply
from .checkpoint_base import CheckpointState
from .replies import text
from .validate import LIMIT_SKEW_MS, MAX_CONCURRENCY_LIMIT, check_concurrency_key, check_int

__all__ = ["MAX_PERMITS", "WAKE_ON_SET", "WAKE_TRIES", "ConcurrencyLimits", "LimitState"]

#: How many put-off tasks a freed place wakes at most per call (a stale one, finished since it
#: was put off, is skipped: the next is tried).
WAKE_TRIES = 4
#: How many put-off tasks a raised (or removed) limit wakes at most; the rest fall due when the
#: places they were put off for expire.
WAKE_ON_SET = 1000
#: The places this core remembers holding (oldest forgotten first: a forgotten place expires).
MAX_PERMITS = 65_536


class LimitState:
    """One limited key as ``agentstate stats`` shows it: its limit and how many places are live."""

    __slots__ = ("key", "limit", "live")

    def __init__(self, key: str, limit: int | None, live: int) -> None:
        self.key = key
        self.limit = limit
        self.live = live

    def __repr__(self) -> str:
        return f"LimitState(key={self.key!r}, limit={self.limit!r}, live={self.live!r})"


def _holder(task_id: str, token: str) -> str:
    return f"{task_id}\0{token}"


class ConcurrencyLimits:
    """Taking, keeping and giving back limiter places; the limits themselves."""

    def __init__(self, state: CheckpointState) -> None:
        self.state = state
        self.keys = state.keys
        self.wire_keys = state.wire_keys
        #: (task id, token) -> the concurrency key whose limiter place that lease holds through this
        #: core: given back when the lease ends. Empty while no task is limited (the writes test it
        #: before calling here, so the unlimited path makes no call).
        self.permits: dict[tuple[str, str], str] = {}

    def set_concurrency_limit(self, key: str, limit: int | None) -> Op[None]:
        """At most ``limit`` live leases of tasks with concurrency key ``key`` (None: no limit).

        Live leases are kept when a limit is lowered below them: new claims of the key are
        refused until fewer are live. Tasks ``claim_next`` put off while the key was full are
        woken when the new limit has room for them.
        """
        ckey = check_concurrency_key(key, "key")
        arg = "" if limit is None else str(check_int(limit, "limit", 1, MAX_CONCURRENCY_LIMIT))
        reply = yield Call(scripts.LIMIT_SET, self.keys.limiter(ckey).as_list(), [arg, WAKE_ON_SET])
        yield Call(scripts.LIMIT_REGISTER, [self.keys.limits()], [ckey, arg])
        yield from self.woke_one(ckey, reply[1:])
        return None

    def concurrency_limits(self) -> Op[list[LimitState]]:
        """Every limited key of the namespace (the registry), with its limit and live places, by key."""
        registry = self.keys.limits()
        (entries,) = yield Pipe([("HGETALL", registry)])
        pairs = entries.items() if isinstance(entries, dict) else zip(entries[::2], entries[1::2], strict=True)
        keys = sorted(text(k) for k, _ in pairs)
        if not keys:
            return []
        limiters = [self.keys.limiter(ckey) for ckey in keys]
        replies = yield Pipe([("TIME",), *(("GET", lk.limit) for lk in limiters)])
        now = int(replies[0][0]) * 1000 + int(replies[0][1]) // 1000
        counts = yield Pipe([("ZCOUNT", lk.holders, f"({now}", "+inf") for lk in limiters])
        out = []
        for ckey, lk, raw, live in zip(keys, limiters, replies[1:], counts, strict=True):
            limit = None if raw is None else text(raw)
            if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= MAX_CONCURRENCY_LIMIT):
                raise CorruptState(f"the limit of concurrency key {ckey!r} at {lk.limit!r} is malformed: {limit!r}",
                                   key=lk.limit)  # fmt: skip
            out.append(LimitState(ckey, None if limit is None else int(limit), int(live)))
        return out

    # ---- places -------------------------------------------------------------------

    def take_place(
        self, tid: str, token: str, ckey: str, lease_ms: int, *, replaces: str = "", waiter: str = ""
    ) -> Op[tuple[int | None, ConcurrencyLimited | None]]:
        """Take (or keep) the place of lease ``token`` of ``tid`` in ``ckey``'s limiter: ``(its expiry,
        None)``, or ``(None, the ConcurrencyLimited to raise)`` when the key is full. ``replaces``: the
        token whose place this one takes over; ``waiter``: record ``tid`` as put off when full."""
        old = _holder(tid, replaces) if replaces else ""
        limiter = self.keys.limiter(ckey).as_list()
        reply = yield Call(scripts.LIMIT_ACQUIRE, limiter, [_holder(tid, token), lease_ms + LIMIT_SKEW_MS, old, waiter])
        if reply[0] == Reply.DONE:
            if len(self.permits) >= MAX_PERMITS:
                del self.permits[next(iter(self.permits))]
            self.permits[(tid, token)] = ckey
            if replaces and replaces != token:
                self.permits.pop((tid, replaces), None)
            return int(reply[1]), None
        retry_at, live, limit = (int(x) for x in reply[1:4])
        return None, ConcurrencyLimited(
            f"task {tid!r} has concurrency key {ckey!r}, which has {live} live lease(s) of {limit} allowed "
            f"(the earliest runs out at {retry_at}, server ms, unless released sooner); nothing was written",
            task_id=tid,
            concurrency_key=ckey,
            limit=limit,
            live=live,
            retry_at_ms=retry_at,
        )

    def give_back(self, tid: str, token: str, ckey: str | None = None) -> Op[None]:
        """Give back the place lease ``token`` of ``tid`` holds, if this core took one (or its place in
        ``ckey``'s limiter), and wake a task put off for it. Callers check ``self.permits`` first: the
        unlimited path makes no call."""
        if ckey is None:
            ckey = self.permits.pop((tid, token), None)
        elif self.permits.get((tid, token)) == ckey:
            del self.permits[(tid, token)]
        if ckey is None:
            return None
        limiter = self.keys.limiter(ckey).as_list()
        holder = _holder(tid, token)
        for _ in range(WAKE_TRIES):
            reply = yield Call(scripts.LIMIT_RELEASE, limiter, [holder, 1])
            if not (yield from self.woke_one(ckey, reply[1:])):
                return None
        return None

    @staticmethod
    def lease_left(reply: Sequence[Any], token: str | None) -> int | None:
        """How long (ms) the lease ``token`` still runs, from the reply of a write or renewal of it that
        was refused; None when the reply shows it has no live lease of the task (or applied: its lease
        ended). Only a lease that ended gives its place back: a stale write of a live lease must not
        (the refusal replies in commit.lua, release.lua, ...; finalize.lua names the live holder)."""
        code = reply[0]
        if code == Reply.REFUSED and len(reply) > 1:
            if len(reply) > 2 and text(reply[2]) != token:
                return None  # finalize.lua: a live claim is held, not by this token
            return int(reply[1])
        if code == Reply.LIMITED and len(reply) > 2:  # commit_and_claim.lua: the fence passed, no place came
            return int(reply[2])
        return None

    def refused_write(self, tid: str, token: str | None, reply: Sequence[Any], *, moved: bool = False) -> Op[None]:
        """After a fenced write or renewal sent with ``token`` that did not renew: give back its place
        when its lease ended (applied, or the reply shows no live lease of ``token``); else the lease
        goes on, and so does its place. ``moved``: the place was moved on for a renewal that was then
        refused, maybe to a shorter lease than is left: it is moved past the lease's end again."""
        if not self.permits or token is None:
            return None
        left = self.lease_left(reply, token)
        if left is None:
            yield from self.give_back(tid, token)
            return None
        ckey = self.permits.get((tid, token))
        if moved and ckey is not None:
            yield from self.take_place(tid, token, ckey, left)
        return None

    def woke_one(self, ckey: str, waiters: Sequence[Any]) -> Op[bool]:
        """Wake the put-off tasks ``waiters`` (task id, ms put off, ...); True when there was one and it
        was stale (finished or claimed since: try the next)."""
        if not waiters:
            return False
        stale = False
        for tid, since in zip(waiters[::2], waiters[1::2], strict=True):
            woken = yield Call(scripts.LIMIT_WAKE, self.wire_keys(text(tid)).listed, [ckey, int(float(since))])
            stale = stale or woken != Reply.DONE
        return stale

    def permit(self, tid: str, token: str) -> str | None:
        """The concurrency key of the place lease ``token`` of ``tid`` holds through this core, if any."""
        return self.permits.get((tid, token)) if self.permits else None
