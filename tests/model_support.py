"""The reference model of tests/test_model.py: the checkpoint store's documented semantics.

A pure-Python transcription of docs/lifecycle.md (cancel, wait_user and resume, timers,
priorities, per-key concurrency limits), docs/leases.md (durable steps) and docs/design.md's
fencing (a claim bumps the revision; a write applies only for the current token, revision and
cycle; a commit need not find its lease unexpired if nobody claimed since). Times are server
milliseconds: on fakeredis the server clock is frozen and advanced by the test (``FakeClock``),
so every deadline is exact; on a real server every lease and delay is either an hour long or
made to lapse by a renewal of 1 ms and a sleep past it and past the limiter's skew.

Where the docs leave the outcome open the model says so instead of guessing: a limiter place
whose holder's lease ended without giving it back (a cancel, a fenced write of a lease that is
not live any more) is *maybe* there, so a claim of its key may or may not be refused; a task
``claim_next`` may have put off (its key was full) may or may not be served. Everything else
is predicted exactly and checked after every step.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from redis_agentstate import (
    AlreadyClaimed,
    CheckpointTerminal,
    CycleConflict,
    NotDue,
    NotRunnable,
)
from redis_agentstate.core.validate import LIMIT_SKEW_MS

LONG_MS = 3_600_000  # an hour: never reached within a run
TERMINAL = {"completed", "failed", "max_cycles", "cancelled"}


class FakeClock:
    """Stands in for the ``time`` module inside fakeredis: its ``time()`` (the server's TIME, key
    expiry) is frozen until ``advance``; everything else is the real module's."""

    def __init__(self, start_s: float) -> None:
        self.t = start_s

    def time(self) -> float:
        return self.t

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


#: The fakeredis modules that read the clock for TIME and key expiry.
FAKEREDIS_CLOCK_MODULES = (
    "fakeredis.commands_mixins.server_mixin",
    "fakeredis._helpers",
    "fakeredis._socket._base",
)


@dataclass
class Held:
    """A worker's belief that it holds a claim (it may have been fenced out since)."""

    worker: str
    tid: str
    token: str
    cycle: int
    revision: int
    cp: Any  # the Checkpoint the claim returned


@dataclass
class Task:
    status: str = "running"
    cycle: int = 0
    revision: int = 0
    messages: list[Any] = field(default_factory=list)
    priority: int = 0
    ckey: str | None = None
    due: int | None = None
    token: str | None = None
    claimed: int | None = None
    lease_exp: int | None = None
    ready_at: int = 0  # the ready index's time (its score without the priority band)
    term: bool = False
    steps: dict[tuple[int, str], Any] = field(default_factory=dict)
    put_off_maybe: bool = False  # claim_next may have put it off while its key was full
    acked: list[str] = field(default_factory=list)  # markers of commits acknowledged True


@dataclass
class Place:
    expires: int
    certain: bool  # False: its holder's lease ended and the place may or may not be given back


@dataclass
class Model:
    now: int
    tasks: dict[str, Task] = field(default_factory=dict)
    limits: dict[str, int | None] = field(default_factory=dict)
    grandfathered: dict[str, set[str]] = field(default_factory=dict)  # live when the limit was lowered
    places: dict[str, dict[tuple[str, str], Place]] = field(default_factory=dict)

    # ---- leases and places -----------------------------------------------------------

    def live(self, t: Task) -> bool:
        return t.token is not None and t.lease_exp is not None and t.lease_exp > self.now and not t.term

    def current(self, h: Held) -> bool:
        """Whether ``h`` is the task's live holder (its writes and steps are accepted)."""
        t = self.tasks.get(h.tid)
        return t is not None and self.live(t) and (t.token, t.revision, t.claimed) == (h.token, h.revision, h.cycle)

    def fence_holds(self, h: Held) -> bool:
        """Whether a commit of ``h`` applies: token, revision and cycle current (the lease may have run out)."""
        t = self.tasks.get(h.tid)
        return t is not None and not t.term and (t.token, t.revision, t.claimed) == (h.token, h.revision, h.cycle)

    def live_of(self, ckey: str) -> list[str]:
        return [tid for tid, t in self.tasks.items() if t.ckey == ckey and self.live(t)]

    def place_counts(self, ckey: str) -> tuple[int, int]:
        """(places surely held, places maybe held) of ``ckey``'s limiter now."""
        sure = maybe = 0
        for p in self.places.get(ckey, {}).values():
            if p.expires > self.now:
                if p.certain:
                    sure += 1
                else:
                    maybe += 1
        return sure, maybe

    def limit_state(self, ckey: str | None) -> str:
        """'free', 'maybe' or 'full': whether a new place of ``ckey`` is granted."""
        if ckey is None or self.limits.get(ckey) is None:
            return "free"
        limit = self.limits[ckey]
        assert limit is not None
        sure, maybe = self.place_counts(ckey)
        if sure >= limit:
            return "full"
        return "maybe" if sure + maybe >= limit else "free"

    def take_place(self, tid: str, token: str, ckey: str | None, lease_exp: int) -> None:
        if ckey is not None:
            # Without a limit the claim still takes a place (or not): nothing to count on.
            certain = self.limits.get(ckey) is not None
            self.places.setdefault(ckey, {})[(tid, token)] = Place(lease_exp + LIMIT_SKEW_MS, certain)

    def give_back(self, tid: str, token: str, ckey: str | None, *, certain: bool) -> None:
        if ckey is None:
            return
        held = self.places.get(ckey, {})
        if (tid, token) in held:
            if certain:
                del held[(tid, token)]
            else:
                held[(tid, token)].certain = False

    # ---- claims ----------------------------------------------------------------------

    def claimable_status(self, t: Task) -> bool:
        return t.status == "running" or (t.status == "wait_user" and t.due is not None and t.due <= self.now)

    def claim_reasons(self, t: Task, cycle: int) -> set[type[Exception]]:
        """The refusals that surely apply to a claim of ``cycle`` by a new token (the limit aside)."""
        reasons: set[type[Exception]] = set()
        if t.term:
            return {CheckpointTerminal}
        if not self.claimable_status(t):
            reasons.add(NotRunnable)
        if t.cycle != cycle - 1:
            reasons.add(CycleConflict)
        if self.live(t):
            reasons.add(AlreadyClaimed)
        if t.status == "running" and t.due is not None and t.due > self.now:
            reasons.add(NotDue)
        return reasons

    def servable(self, t: Task) -> bool:
        """Due and claimable by ``claim_next`` now, the limit aside."""
        return (
            not t.term
            and self.claimable_status(t)
            and not self.live(t)
            and (t.due is None or t.due <= self.now)
            and t.ready_at <= self.now
        )

    def claimed(self, tid: str, token: str, lease_ms: int) -> Task:
        t = self.tasks[tid]
        t.revision += 1
        t.token, t.claimed, t.lease_exp = token, t.cycle + 1, self.now + lease_ms
        t.ready_at, t.put_off_maybe = t.lease_exp, False
        self.take_place(tid, token, t.ckey, t.lease_exp)
        return t

    def limit_holds(self, ckey: str) -> tuple[int, int]:
        """(live leases of ``ckey``, the most allowed: its limit, or the leases live when it was lowered)."""
        live = self.live_of(ckey)
        limit = self.limits.get(ckey)
        if limit is None:
            return len(live), len(live)
        kept = len(self.grandfathered.get(ckey, set()) & set(live))
        return len(live), max(limit, kept)

    def set_limit(self, ckey: str, limit: int | None) -> None:
        self.limits[ckey] = limit
        live = set(self.live_of(ckey))
        self.grandfathered[ckey] = live if limit is not None and len(live) > limit else set()


def run_seeded(machine: Any, *, examples: int, steps: int, default_seed: int) -> Counter[str]:
    """Run a hypothesis state machine whose rules count what they did in ``machine.stats``: seeded
    (``AGENTSTATE_MODEL_SEED``, else ``default_seed``) with the example database off, so the same command
    replays the same examples; prints the seed and the counts, and returns the counts."""
    from hypothesis import HealthCheck, seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    chosen = int(os.environ.get("AGENTSTATE_MODEL_SEED", default_seed))
    machine.stats = Counter()
    s = settings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
    try:
        run_state_machine_as_test(seed(chosen)(machine), settings=s)
    finally:
        print(f"model seed {chosen}; rules run: " + ", ".join(f"{k} {n}" for k, n in sorted(machine.stats.items())))
    return Counter(machine.stats)
