"""``claim_next``'s scheduling: which task's next cycle a worker claims, fleet-wide, oldest first.

One pipelined peek reads every shard's ready head; the due heads are tried
oldest first; a lost race answers with the shard's next head; the other due
entries a peek saw and the tasks the wake-up subscription announced are
candidates (``_Candidates``) that the next calls claim without a peek; a shard
or task holding data the library did not write is skipped (logged once) and
raised only when nothing else is due. Nothing here does I/O.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptState
from ..models import Checkpoint
from ..wire import Call, Op, Pipe, corrupt_state, member_id, restartable, scripts
from ..wire.indexes import zset_entries
from ..wire.scripts import Reply
from .checkpoint_base import _CLAIMED, CheckpointState, check_lease, check_token
from .limits import ConcurrencyLimits
from .replies import text, time_ms
from .validate import MAX_DELAY_MS, MAX_LEASE_MS, MAX_PRIORITY, PRIORITY_BAND_MS, check_int

__all__ = ["MAX_BLOCK_MS", "ClaimNextFound", "ClaimScheduling"]

logger = logging.getLogger("redis_agentstate")

#: The codes of a claim_next reply that claimed nothing and may name the shard's head (PARKED: parked now).
_LOST_RACE = (Reply.REFUSED, Reply.PARKED)


BAND = PRIORITY_BAND_MS
#: Scores above this below now are of priority 0 (the plain times): no division on the plain path.
_HALF_BAND = PRIORITY_BAND_MS / 2


#: No entry this library writes is claimable further ahead than this (a lease, a delay: a year).
_AHEAD_MS = max(MAX_LEASE_MS, MAX_DELAY_MS) + 86_400_000


def _decode(score: float, now: int) -> tuple[int, float]:
    """``(priority, claimable at)`` of a ready entry scored ``score`` (the priorities note in
    _common.lua). A score no band explains (written outside the library: 0, say) reads as a
    priority 0 entry due long ago, so claim_next tries it and its script repairs the index."""
    if score > now - _HALF_BAND:
        return 0, score
    band = round((now - score) / BAND)
    at = score + band * BAND
    if band > MAX_PRIORITY or at > now + _AHEAD_MS:
        return 0, score
    return band, at


def _band(score: float, now: int) -> int:
    return _decode(score, now)[0]


def _time_of(score: float, now: int) -> float:
    return _decode(score, now)[1]


def _due_entries(
    entries: list[list[tuple[str, float]]], now: int
) -> tuple[list[tuple[str, float]], list[tuple[str, float]], float | None]:
    """From each shard's entries (index order: priority, then time): the first due one (the shard's
    best), the other due ones (candidates) and the earliest time of those not due yet."""
    best: list[tuple[str, float]] = []
    extra: list[tuple[str, float]] = []
    later: float | None = None
    low = now - _HALF_BAND
    for shard in entries:
        first = True
        for tid, score in shard:
            at = score if score > low else _time_of(score, now)
            if at <= now:
                (best if first else extra).append((tid, score))
                first = False
            elif later is None or at < later:
                later = at
    return best, extra, later


#: The heap score of an announced candidate (plus its announcement's sequence number): above any
#: ready score (server ms), still exact in a float.
ANNOUNCED = 2.0**52


class _Candidates:
    """Due ready entries a peek saw, shared by every caller of one store: the next claim_next tries
    the oldest of them in one round trip instead of peeking at every shard head first.

    An entry stays due until someone claims it (its score only moves on a claim, a commit or a
    release), and the claim script re-checks it anyway, so a stale one costs a refused script,
    which answers with its shard's current head (a fresh candidate). Kept for ``max_age_s`` so the
    longest-waiting-first order is never staler than that.
    """

    def __init__(self, max_age_s: float = 1.0) -> None:
        #: How long the entries of one peek are tried before the next claim_next peeks afresh.
        self.max_age_s = max_age_s
        self._heap: list[tuple[float, str]] = []
        self._queued: set[str] = set()
        self._at = 0.0
        self._announced = 0
        #: The last peek saw nothing due but what it claimed: an announcement is then the oldest due work.
        self._quiet = True
        self._lock = threading.Lock()

    def reset(self, entries: Sequence[tuple[str, float]]) -> None:
        with self._lock:
            self._heap = [(score, tid) for tid, score in entries]
            heapq.heapify(self._heap)
            self._queued = {tid for tid, _ in entries}
            self._quiet = not entries
            self._at = time.monotonic()

    def add(self, tid: str, score: float) -> None:
        with self._lock:
            self._quiet = False
            if tid not in self._queued and time.monotonic() - self._at < self.max_age_s:
                heapq.heappush(self._heap, (score, tid))
                self._queued.add(tid)

    def announce(self, tid: str) -> None:
        """A task announced due now (``notify_due``): a candidate behind those a peek saw.

        Once the peek's entries are too old, the announcement alone is a candidate only if that
        peek saw nothing else due (an idle fleet woken by new work: one round trip, no peek);
        otherwise it is dropped and the next claim peeks, so it cannot skip older due work.
        """
        with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                self._heap, self._queued = [], set()
                if not self._quiet:
                    return
                self._at = time.monotonic()
            if tid not in self._queued:
                # Behind every peeked entry (a ms timestamp is far below ANNOUNCED), and among the
                # announced in the order they were announced: a tie broken by the id would serve the
                # task that sorts first again and again (a Runner's streak cap would not let others in).
                self._announced += 1
                heapq.heappush(self._heap, (ANNOUNCED + self._announced, tid))
                self._queued.add(tid)

    def discard(self, tid: str) -> None:
        with self._lock:
            self._queued.discard(tid)  # its heap entry is skipped by take()

    def take(self) -> str | None:
        """The oldest candidate (removed), or None when there is none or they are too old."""
        with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                self._heap, self._queued = [], set()
                return None
            while self._heap:
                _, tid = heapq.heappop(self._heap)
                if tid in self._queued:
                    self._queued.discard(tid)
                    return tid
            return None

    def __bool__(self) -> bool:
        return bool(self._queued) and time.monotonic() - self._at < self.max_age_s


#: The longest ``block_ms`` of ``claim_next`` (a day; a Runner loops shorter blocks anyway).
MAX_BLOCK_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class ClaimNextFound:
    """One claim_next attempt, for a blocked caller: the claim (or None), the ms until the
    earliest ready entry not yet due (None: the index is empty), and whether more was due."""

    checkpoint: Checkpoint | None
    wait_ms: int | None
    more_due: bool


class ClaimScheduling:
    """``claim_next`` and its candidates: the checkpoint core's part that holds the scheduling state of
    one store (what a peek saw, and the corrupt data already logged)."""

    def __init__(self, state: CheckpointState, limits: ConcurrencyLimits) -> None:
        self.state = state
        self.keys = state.keys
        self.limits = limits
        self._corrupt_logged: set[str] = set()
        self._candidates = _Candidates()
        #: ``time.monotonic()`` when the earliest not-yet-due entry the last peek saw falls due (None:
        #: none): what a claim from the candidates tells a blocked caller to time itself by.
        self._later_at: float | None = None
        #: Limited candidates claim_next put off because their concurrency key was full.
        self.limited_skips = 0

    #: How many successive heads of one shard claim_next tries after losing races there.
    CLAIM_NEXT_TRIES_PER_SHARD = 4

    def claim_next(self, *, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        """Claim the next cycle of any claimable task, or return None when none is due.

        One pipelined peek reads the server clock and the head (oldest score) of
        every shard's ready index; the due heads are tried oldest first, so the
        task that has waited longest fleet-wide goes first (a task that just
        committed re-enters at the back: FIFO, fair per task, not per shard).
        The claim itself is one script on the candidate's keys, which re-checks
        the checkpoint and, when another worker won the race, answers with the
        shard's new head so the next try costs one more script, not a new peek;
        after a round of lost races a fresh peek follows, and None means a peek
        found nothing due. The other due entries a peek saw (up to
        ``CLAIM_NEXT_PEEK`` per shard) and the tasks the store's wake-up
        subscription announced are candidates: while under a second old, the
        store's next calls claim the oldest of them in one script, without a peek.
        """
        token = check_token(token)
        lease_ms = check_lease(lease_ms)
        found = yield from self.claim_next_probe(token, lease_ms)
        return found.checkpoint

    def check_block_ms(self, block_ms: object) -> int:
        """``claim_next``'s ``block_ms``: an int of ms, 0 (do not block) up to ``MAX_BLOCK_MS``."""
        return check_int(block_ms, "block_ms", 0, MAX_BLOCK_MS)

    #: Ready entries per shard a peek reads: the head decides, the rest are candidates for later calls.
    CLAIM_NEXT_PEEK = 4
    #: Candidates a claim_next tries (one script each) before it peeks.
    CLAIM_NEXT_FAST_TRIES = 3

    def _claim_next_call(
        self, tid: str, token: str, lease_ms: int, have: list[Any], permit: tuple[str, int, int] = ("", 0, 0)
    ) -> Call:
        state = self.state
        return Call(
            scripts.CLAIM_NEXT, state.wire_keys(tid).counted, [token, lease_ms, *have, state.max_attempts, *permit]
        )

    def _limited_candidate(self, tid: str, token: str, lease_ms: int, have: list[Any], ckey: str) -> Op[Any]:
        """claim_next met ``tid``, claimable but limited by concurrency key ``ckey`` (``Reply.LIMITED``):
        take a place and claim it, or, when the key is full, put it off until the key's earliest place
        expires (the limiter records it, so a place given back sooner wakes it). Returns the
        claim_next.lua reply that stands for the candidate: a claim, or a lost race."""
        took = self.limits.permit(tid, token) is None
        cap, full = yield from self.limits.take_place(tid, token, ckey, lease_ms, waiter=tid)
        if full is None:
            assert cap is not None
            reply = yield self._claim_next_call(tid, token, lease_ms, have, (ckey, cap, 0))
            if reply[0] not in _CLAIMED and took:
                yield from self.limits.give_back(tid, token)
        else:
            self.limited_skips += 1
            reply = yield self._claim_next_call(tid, token, lease_ms, have, (ckey, 0, full.retry_at_ms or 0))
        if reply[0] == Reply.LIMITED:
            # The task's key changed in between, or the put-off time had passed on its node's clock:
            # this candidate is out of this call (the next peek meets it again).
            return [Reply.REFUSED, reply[1]]
        return reply

    def _claim_candidates(self, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        """The fast path: claim the oldest candidate an earlier peek left (one script, one round trip)."""
        for _ in range(self.CLAIM_NEXT_FAST_TRIES):
            tid = self._candidates.take()
            if tid is None:
                return None
            keys = self.state.task_keys(tid)
            cached, have = self.state.cached(tid)
            try:
                reply = yield self._claim_next_call(tid, token, lease_ms, have)
                if reply[0] == Reply.LIMITED:
                    reply = yield from self._limited_candidate(tid, token, lease_ms, have, text(reply[2]))
            except CorruptState:
                continue  # the peek path meets it again, and skips or raises it there
            code = reply[0]
            if code in _CLAIMED:
                return self.state.checkpoint(tid, keys, reply, 1, cached, claim=True)
            if code not in _LOST_RACE:
                raise CorruptState(f"unexpected claim_next reply {reply[:2]!r} for task {tid!r}", task_id=tid)
            if len(reply) >= 4 and _time_of(float(reply[3]), int(reply[1])) <= int(reply[1]):
                self._candidates.add(member_id(reply[2], keys.ready), float(reply[3]))
        return None

    @property
    def claim_next_candidate_age_s(self) -> float:
        """How long claim_next tries the candidates of one peek before it peeks again (0: always peek)."""
        return self._candidates.max_age_s

    @claim_next_candidate_age_s.setter
    def claim_next_candidate_age_s(self, seconds: float) -> None:
        self._candidates.max_age_s = seconds

    def announced(self, task_id: str) -> None:
        """``task_id`` was announced due (the store's wake-up subscription): the next claim tries it first."""
        self._candidates.announce(task_id)

    @restartable
    def claim_next_probe(self, token: str, lease_ms: int) -> Op[ClaimNextFound]:
        """``claim_next`` (arguments checked already), also reporting what a blocked caller times itself by
        (started over when a reshard moves a shard it peeks at)."""
        if self._candidates:
            cp = yield from self._claim_candidates(token, lease_ms)
            if cp is not None:
                # No peek, so no fresh view of what falls due next: the last peek's, so a timer that
                # fired and was served from here keeps the next one armed (1 ms once that passed).
                at = self._later_at
                wait = None if at is None else max(1, int((at - time.monotonic()) * 1000))
                return ClaimNextFound(cp, wait, bool(self._candidates))
        peek = self.CLAIM_NEXT_PEEK - 1
        heads = [("ZRANGE", self.keys.shard_ready(s), 0, peek, "WITHSCORES") for s in range(self.keys.shards)]
        wait_ms: int | None = None
        for _round in range(self.CLAIM_NEXT_ROUNDS):
            replies = yield Pipe([("TIME",), *heads], wrongtype_ok=True, by_record=True)
            now = time_ms(replies[0])
            entries, broken = self._shard_heads(heads, replies[1:])
            entries = yield from self._past_higher_priorities(entries, now)
            due, extra, later = _due_entries(entries, now)
            # Every due entry seen is a candidate for the next calls, but the heads tried below.
            self._candidates.reset(extra)
            # The earliest entry not yet due: a lapsing lease or a delayed release, which publish nothing.
            wait_ms = max(1, int(later - now)) if later is not None else None
            self._later_at = None if wait_ms is None else time.monotonic() + wait_ms / 1000
            if not due:
                if broken is not None:
                    raise broken  # nothing else to claim: a corrupt index is never silently hidden
                return ClaimNextFound(None, wait_ms, False)
            # Oldest first fleet-wide (FIFO across shards too); shuffle only the few oldest to spread a fleet.
            due.sort(key=lambda head: head[1])
            spread = due[: self.CLAIM_NEXT_SPREAD]
            random.shuffle(spread)
            due[: self.CLAIM_NEXT_SPREAD] = spread
            cp = yield from self._claim_due(due, now, token, lease_ms)
            if cp is not None:
                return ClaimNextFound(cp, wait_ms, len(due) > 1 or bool(self._candidates))
        # Others won every race: there was work, so a blocked caller tries again at once.
        return ClaimNextFound(None, 0, True)

    def _past_higher_priorities(
        self, entries: list[list[tuple[str, float]]], now: int
    ) -> Op[list[list[tuple[str, float]]]]:
        """Each shard's peeked entries, extended past higher priorities that hid the lower ones.

        A shard's index sorts by priority, then time: when all of its first entries are of
        priorities above 0 and none is due (live leases, delayed cycles), the lower priorities
        behind them are read too, one band after another (a pipelined round per band, for the
        shards that need it). Never for a shard of priority 0 only: the plain path pays nothing.
        """
        full = self.CLAIM_NEXT_PEEK
        ended: set[int] = set()  # shards whose index was read to its end
        for _ in range(MAX_PRIORITY):
            hidden = [
                s for s, shard in enumerate(entries)
                if s not in ended and len(shard) >= full and _band(shard[-1][1], now) > 0
                and not any(_time_of(score, now) <= now for _, score in shard)
            ]  # fmt: skip
            if not hidden:
                return entries
            # The bands below the last one read: scores above the top of its band.
            cmds: list[tuple[Any, ...]] = [
                ("ZRANGEBYSCORE", self.keys.shard_ready(s), f"({now - (_band(entries[s][-1][1], now) - 0.5) * BAND}",
                 "+inf", "WITHSCORES", "LIMIT", 0, full)
                for s in hidden
            ]  # fmt: skip
            replies = yield Pipe(cmds, wrongtype_ok=True, by_record=True)
            more, _ = self._shard_heads(cmds, replies)
            for s, extra in zip(hidden, more, strict=True):
                entries[s] = entries[s] + extra
                if len(extra) < full:
                    ended.add(s)
        return entries

    def _shard_heads(
        self, heads: list[tuple[Any, ...]], replies: Sequence[Any]
    ) -> tuple[list[list[tuple[str, float]]], CorruptState | None]:
        """The peeked entries of every shard, and the first shard index found corrupt (skipped).

        A ready index of another Redis type (no script leaves one; an operator's
        mistake) must not stall the whole fleet: its shard is skipped, logged
        once, and its ``CorruptState`` raised only when nothing else is due.
        """
        entries: list[list[tuple[str, float]]] = []
        broken: CorruptState | None = None
        for cmd, reply in zip(heads, replies, strict=True):
            if isinstance(reply, Exception):
                exc = corrupt_state(cmd[1], [cmd[1]], f"is not the zset the library keeps ({reply})")
                self._skipped_corrupt(exc)
                broken = broken or exc
                entries.append([])
            else:
                entries.append(zset_entries(reply, cmd[1]))
        return entries, broken

    #: Fresh peeks claim_next makes before answering None while others keep winning the races.
    CLAIM_NEXT_ROUNDS = 8
    #: How many of the oldest due shard heads are tried in random order.
    CLAIM_NEXT_SPREAD = 1

    def _claim_due(self, due: list[tuple[str, float]], now: int, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        """Claim the first of ``due`` that can be claimed; None when others won every race.

        A task holding data we did not write is skipped (logged once), so one
        corrupt task cannot stall a fleet; its ``CorruptState`` is raised only
        when nothing else could be claimed, so it is never silently hidden.
        """
        corrupt: CorruptState | None = None
        skipped: set[str] = set()
        for i, (head, _score) in enumerate(due):
            tid: str | None = head
            for _ in range(self.CLAIM_NEXT_TRIES_PER_SHARD):
                if tid is None:
                    break
                keys = self.state.task_keys(tid)
                try:
                    cached, have = self.state.cached(tid)
                    reply = yield self._claim_next_call(tid, token, lease_ms, have)
                    if reply[0] == Reply.LIMITED:
                        reply = yield from self._limited_candidate(tid, token, lease_ms, have, text(reply[2]))
                    code = reply[0]
                    if code in _CLAIMED:
                        for other, score in due[i + 1 :]:
                            self._candidates.add(other, score)  # heads not tried: candidates of the next calls
                        return self.state.checkpoint(tid, keys, reply, 1, cached, claim=True)
                    if code not in _LOST_RACE:
                        raise CorruptState(f"unexpected claim_next reply {reply[:2]!r} for task {tid!r}", task_id=tid)
                except CorruptState as exc:
                    self._skipped_corrupt(exc)
                    corrupt = corrupt or exc
                    skipped.add(tid)
                    # The rest of the shard queues behind the corrupt task: look past the skipped ones.
                    (page,) = yield Pipe([("ZRANGEBYSCORE", keys.ready, "-inf", now, "LIMIT", 0, len(skipped) + 1)])
                    tid = next((m for m in (member_id(r, keys.ready) for r in page) if m not in skipped), None)
                    continue
                if len(reply) < 4 or _time_of(float(reply[3]), int(reply[1])) > int(reply[1]):
                    break  # nothing else due in this shard (or behind a higher priority: the next peek)
                tid = member_id(reply[2], keys.ready)
                self._candidates.discard(tid)
        if corrupt is not None:
            raise corrupt
        return None

    def _skipped_corrupt(self, exc: CorruptState) -> None:
        # Once per task per store: claim_next meets the same corrupt head on every call.
        ident = exc.task_id or exc.key or str(exc)
        if ident in self._corrupt_logged or len(self._corrupt_logged) >= 1024:
            return
        self._corrupt_logged.add(ident)
        logger.warning("claim_next skips corrupt data (fix or delete it; `agentstate list` shows tasks): %s", exc)
