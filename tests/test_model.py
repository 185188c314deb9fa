"""Model-based test: the checkpoint store with lifecycle, limits, steps, timers and reshards.

A hypothesis ``RuleBasedStateMachine`` drives two operators (two clients, two
``CheckpointStore``s on one namespace, each with its own worker identity) through
create / claim / claim_next / commit (running, wait_user with or without a deadline,
terminal; delayed; reprioritised; stale) / renew / release / lease lapses / cancel /
resume / set_concurrency_limit / durable steps (``Lease.step``) / reshard (to twice the
shards, with the other operator working between the moves, or resharding too), with lost
replies (``tests/faults/replies.py``: the script applies, its reply is lost, the library
re-sends) on every writing rule, and checks each answer against ``model_support.Model``.
tests/test_fuzz.py does the same for the seed's operations with hostile arguments; this one
is about the capabilities added since and their interleavings.

Checked after every step (``invariants``), on a third client that caches nothing:
- every task is as the model says (status, cycle, revision, messages, priority, key, claim,
  lease, due time), and ``list()`` is the model's tasks;
- one live holder per task among the workers' claims;
- no acknowledged commit lost, none applied twice (each commit's marker once in messages);
- live leases per concurrency key <= its limit (or the leases live when it was lowered);
Checked in the rules: a cancelled task is never claimed, committed or stepped again; a
recorded step never re-runs (its function is not called again for that task and cycle).

The server clock: on fakeredis TIME is frozen and advanced by the ``advance`` rule (leases
of 1 s and delays of 0.5 s lapse exactly when the model says); on the real server leases
and delays are an hour, and ``lapse`` renews a lease to 200 ms and sleeps 0.5 s (past the
limiter's 250 ms skew). The real server's clock moves on its own, so a failure there may not
replay exactly (hypothesis then reports it as flaky, with the original error): the fakeredis
run is the exact one.

Reproducing a failure: runs are seeded (``MODEL_SEED``, or ``AGENTSTATE_MODEL_SEED=<n>`` to
explore another), with hypothesis' example database off, so the same command replays the same
examples: ``AGENTSTATE_MODEL_SEED=<n> python -m pytest tests/test_model.py -k <test> -n 0``;
hypothesis prints the shrunk failing sequence of rules. ``AGENTSTATE_FULL_SUITE=1`` runs the
long version.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import itertools
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import fakeredis
import pytest
import redis
import redis.asyncio as aioredis
from conftest import RedisServerProcess, Twin, full_suite
from faults.replies import lose_first_reply
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from model_support import FAKEREDIS_CLOCK_MODULES, LONG_MS, FakeClock, Held, Model, Place, Task

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    ConcurrencyLimited,
    ConfigConflict,
    LeaseLost,
    NotWaiting,
    TaskNotFound,
)
from redis_agentstate.core.validate import LIMIT_SKEW_MS
from redis_agentstate.lease import AsyncLease, Lease

MODEL_SEED = 38
TIDS = ["a", "b", "c", "d"]
CKEYS = [None, "k", "k", "j"]  # "k" most: its limit is the one contended
WORKERS = ["A", "B"]
START_SHARDS = 2
MAX_SHARDS = 16
LIMIT_CHOICES = [None, 1, 1, 2]
# On a real server a rule takes its choices from POOL integers drawn when it starts (``Draws``).
POOL = 16
# The lapse rule renews a lease to LAPSE_MS, then waits LAPSE_WAIT_MS: past the lease and its place
# (LIMIT_SKEW_MS more). A limited lease's renewal is two scripts (its place, then the lease, capped
# at the place's expiry minus the skew): on a real server the lease must outlast the time between
# them, or the renewal is refused (its cap already passed) on a loaded machine. The frozen clock
# of fakeredis needs no margin.
LAPSE_MS = {True: 1, False: 200}
LAPSE_WAIT_MS = {True: 300, False: 500}


class Draws:
    """A rule's choices. On fakeredis they are drawn from hypothesis as the rule goes. On a real
    server, whose clock runs on its own, the same choices can meet other answers (which of two due
    tasks ``claim_next`` serves, say) and so other rules and draws; hypothesis, replaying a choice
    sequence, calls that flaky (``FlakyStrategyDefinition``) and stops. So there every rule draws
    ``POOL`` integers when it starts and takes its choices from them: the shape of what hypothesis
    draws no longer depends on what the server answered."""

    def __init__(self, data: st.DataObject, *, pooled: bool) -> None:
        self.data = data
        self.pool = [data.draw(st.integers(0, 2**16 - 1)) for _ in range(POOL)] if pooled else None

    def _next(self, n: int) -> int:
        assert self.pool, f"a rule took more than POOL={POOL} choices: raise POOL"
        return self.pool.pop(0) % n

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi)) if self.pool is None else lo + self._next(hi - lo + 1)

    def bool(self) -> bool:
        return self.data.draw(st.booleans()) if self.pool is None else self._next(2) == 1

    def pick(self, seq: list[Any]) -> Any:
        return self.data.draw(st.sampled_from(seq)) if self.pool is None else seq[self._next(len(seq))]


def held_or_real(machine: ModelMachine) -> bool:
    """A rule on a held claim: on fakeredis only when one is held; on a real server always (a
    precondition that depends on the server's answers changes what hypothesis draws: ``Draws``),
    the rule doing nothing when nothing is held."""
    return not machine.fake or bool(machine.held)


def current_or_real(machine: ModelMachine) -> bool:
    return not machine.fake or any(machine.model.current(h) for h in machine.held)


class ModelMachine(RuleBasedStateMachine):
    make_client: Callable[[], Any] = staticmethod(lambda: None)
    make_async_client: Callable[[], Any] = staticmethod(lambda: None)
    clock: FakeClock | None = None  # fakeredis: the frozen server clock; None: a real server
    #: What the rules did, summed over a run's examples (printed: how much each was exercised).
    stats: ClassVar[Counter[str]] = Counter()
    steps_run = 0

    def __init__(self) -> None:
        super().__init__()
        self.ns = f"md-{uuid.uuid4().hex[:10]}"
        self.clients = [type(self).make_client() for _ in range(2)]
        # Operator A is sync, operator B async (its coroutines run to completion on a loop of its
        # own, conftest's Twin): the two shells over one sans-I/O core, interleaved.
        self.loop = asyncio.new_event_loop()
        self.async_client = type(self).make_async_client()
        # A sets the namespace's count (its first call, ``start``); B and the reader take the stored
        # one: a store that asks for a count must meet it (ConfigConflict after a reshard otherwise).
        self.stores: dict[str, Any] = {
            "A": CheckpointStore(self.clients[0], namespace=self.ns, shards=START_SHARDS),
            "B": Twin(AsyncCheckpointStore(self.async_client, namespace=self.ns), self.loop),
        }
        for s in self.stores.values():
            s._core.claim_next_candidate_age_s = 0  # every claim_next peeks: its order is exact
        self.reader = CheckpointStore(self.clients[1], namespace=self.ns, history_cache=0)
        self.model = Model(now=self._server_ms())
        self.held: list[Held] = []
        self.shards = START_SHARDS
        self.tokens = itertools.count()
        self.step_calls: dict[tuple[str, int, str], int] = {}
        self.mp = pytest.MonkeyPatch()
        self._armed: list[tuple[str, list[Any]]] = []

    def teardown(self) -> None:
        self.mp.undo()
        for c in self.clients:
            c.close()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()

        async def drain() -> None:
            await asyncio.gather(*pending, return_exceptions=True)

        self.loop.run_until_complete(drain())
        self.loop.run_until_complete(self.async_client.aclose())
        self.loop.close()

    # ---- time ------------------------------------------------------------------------

    @property
    def fake(self) -> bool:
        return type(self).clock is not None

    def _server_ms(self) -> int:
        sec, usec = self.clients[1].time()
        return int(sec) * 1000 + int(usec) // 1000

    def _advance(self, ms: int) -> None:
        clock = type(self).clock
        if clock is not None:
            clock.t += ms / 1000
        else:
            time.sleep(ms / 1000 + 0.002)
        self.model.now += ms

    def _lease_ms(self, data: Draws) -> int:
        return data.pick([LONG_MS, 1000]) if self.fake else LONG_MS

    def _draws(self, hdata: st.DataObject) -> Draws:
        return Draws(hdata, pooled=not self.fake)

    def _nothing_held(self, rule: str, held: list[Held], data: Draws) -> bool:
        """True when ``held`` is empty (only on a real server, ``held_or_real``): the step then
        goes to a ``claim_next`` by either worker, so that it still does something."""
        if held:
            return False
        self._note(f"{rule}: nothing held, claim_next instead")
        self._claim_next(data.pick(WORKERS), LONG_MS, data.int(0, 3) == 0)
        return True

    def _delay(self, data: Draws) -> int | None:
        choices: list[int | None] = [None, 0, LONG_MS] + ([500] if self.fake else [])
        return data.pick(choices)

    # ---- lost replies ----------------------------------------------------------------

    def _maybe_lose(self, data: Draws, worker: str, scripts: list[str]) -> str | None:
        """Maybe make the next call of one of ``scripts`` (of ``worker``'s store) lose its reply."""
        if data.int(0, 3) != 0:
            return None
        name = data.pick(scripts)
        self._armed.append((name, lose_first_reply(self.stores[worker]._scripts[name], self.mp)))
        return name

    def _restore(self) -> None:
        self.mp.undo()
        for name, sent in self._armed:
            if len(sent) > 1:  # applied, reply lost, re-sent by the library
                self.stats[f"lost reply re-sent: {name}"] += 1
        self._armed.clear()

    # ---- helpers ---------------------------------------------------------------------

    def _note(self, what: str, *, lost: Any = None, delay: int | None = None) -> None:
        self.stats[what] += 1
        if delay:
            self.stats[f"delay {'long' if delay >= LONG_MS else 'short'}"] += 1

    def _token(self, worker: str) -> str:
        return f"{worker}{next(self.tokens)}"

    def _check_claim(self, cp: Checkpoint, t: Task, token: str) -> None:
        assert cp.claim_token == token and cp.claimed_cycle == t.claimed
        assert cp.revision == t.revision and cp.cycle_index == t.cycle
        assert cp.messages == t.messages and cp.priority == t.priority

    def _adopt_claim(self, worker: str, cp: Checkpoint, token: str, lease_ms: int) -> None:
        t = self.model.tasks[cp.task_id]
        assert not t.term, f"a terminal (cancelled?) task {cp.task_id} was claimed"
        self.model.claimed(cp.task_id, token, lease_ms)
        if self.fake:
            assert cp.lease_expires_at_ms == t.lease_exp
        self._check_claim(cp, t, token)
        self.held.append(Held(worker, cp.task_id, token, t.claimed or 0, t.revision, cp))

    def _drop_held(self, h: Held) -> None:
        if h in self.held:
            self.held.remove(h)

    # ---- rules -----------------------------------------------------------------------

    @initialize(
        prios=st.lists(st.integers(0, 3), min_size=3, max_size=3),
        ckeys=st.lists(st.sampled_from(CKEYS), min_size=3, max_size=3),
        limit=st.sampled_from(LIMIT_CHOICES),
    )
    def start(self, prios: list[int], ckeys: list[str | None], limit: int | None) -> None:
        """Three tasks to work on (``d`` is left to ``create``), and maybe a limit on key ``k``."""
        for tid, prio, ckey in zip(TIDS, prios, ckeys, strict=False):  # d: left to create
            assert self.stores["A"].create(Checkpoint(tid, priority=prio, concurrency_key=ckey))
            self.model.tasks[tid] = Task(priority=prio, ckey=ckey, ready_at=self.model.now)
        if limit is not None:
            self.stores["A"].set_concurrency_limit("k", limit)
            self.model.set_limit("k", limit)

    @rule(
        hdata=st.data(),
        worker=st.sampled_from(WORKERS),
        tid=st.sampled_from(TIDS),
        action=st.sampled_from(["create", "create", "resume", "resume", "set_limit", "cancel"]),
    )
    def operate(self, hdata: st.DataObject, worker: str, tid: str, action: str) -> None:
        """An operator's (or the application's) call: one rule, so that their mix is weighted."""
        data = self._draws(hdata)
        waiting = sorted(t for t, task in self.model.tasks.items() if task.status == "wait_user" and not task.term)
        if action == "set_limit":
            self.set_limit(data, worker, data.pick(["k", "k", "j"]), data.pick(LIMIT_CHOICES))
        elif action == "resume" and waiting and data.bool():
            self.resume(data, worker, data.pick(waiting))  # an answer, mostly in time
        else:
            getattr(self, action)(data, worker, tid)

    def create(self, data: Draws, worker: str, tid: str) -> None:
        prio = data.int(0, 3)
        ckey = data.pick(CKEYS)
        delay = self._delay(data)
        self._maybe_lose(data, worker, ["create"])
        created = self.stores[worker].create(Checkpoint(tid, priority=prio, concurrency_key=ckey), delay_ms=delay)
        self._restore()
        assert created == (tid not in self.model.tasks)
        self._note(f"create {'new' if created else 'exists'}", delay=delay)
        if created:
            now = self.model.now
            due = now + delay if delay else None
            self.model.tasks[tid] = Task(priority=prio, ckey=ckey, due=due, ready_at=max(now, due or now))

    def _claim(self, worker: str, tid: str, cycle: int, lease_ms: int, lost: bool) -> None:
        t = self.model.tasks.get(tid)
        token = self._token(worker)
        store = self.stores[worker]
        if lost:
            self._armed.append(("claim", lose_first_reply(store._scripts["claim"], self.mp)))
        try:
            cp = store.claim(tid, cycle, token=token, lease_ms=lease_ms)
        except ClaimRejected as exc:
            assert t is not None
            reasons = self.model.claim_reasons(t, cycle)
            limit = self.model.limit_state(t.ckey)
            allowed = reasons | ({ConcurrencyLimited} if limit != "free" else set())
            assert type(exc) in allowed, f"claim of {tid} raised {exc!r}; expected one of {allowed} or a claim"
            self._note(f"claim refused {type(exc).__name__}", lost=lost)
            return
        finally:
            self._restore()
        if t is None:
            assert cp is None
            return
        assert cp is not None
        reasons = self.model.claim_reasons(t, cycle)
        assert not reasons, f"claim of {tid} cycle {cycle} was granted; expected one of {reasons}"
        assert self.model.limit_state(t.ckey) != "full", (
            f"claim of {tid} granted with concurrency key {t.ckey!r} full: "
            f"{self.model.place_counts(t.ckey or '')} places of limit {self.model.limits.get(t.ckey or '')}"
        )
        self._adopt_claim(worker, cp, token, lease_ms)
        self._note("claim granted" + (" limited" if t.ckey and m_limit(self.model, t.ckey) else ""), lost=lost)

    @rule(hdata=st.data(), worker=st.sampled_from(WORKERS), tid=st.sampled_from(TIDS))
    def claim(self, hdata: st.DataObject, worker: str, tid: str) -> None:
        data = self._draws(hdata)
        t = self.model.tasks.get(tid)
        cycle = (t.cycle + 1) if t else 1
        if data.int(0, 5) == 0:
            cycle = data.pick([1, 2, cycle + 1])
        self._claim(worker, tid, cycle, self._lease_ms(data), data.int(0, 3) == 0)

    def _claim_next(self, worker: str, lease_ms: int, lost: bool) -> None:
        m = self.model
        surely, maybe = [], []
        for tid, t in m.tasks.items():
            if not m.servable(t):
                continue
            limit = m.limit_state(t.ckey)
            if limit == "free" and not t.put_off_maybe:
                surely.append(tid)
            elif limit != "full" or t.put_off_maybe:
                maybe.append(tid)
        token = self._token(worker)
        store = self.stores[worker]
        if lost:
            self._armed.append(("claim_next", lose_first_reply(store._scripts["claim_next"], self.mp)))
        try:
            cp = store.claim_next(token=token, lease_ms=lease_ms)
        finally:
            self._restore()
        # Tasks it may have met while their key was full are put off until a place frees.
        for t in m.tasks.values():
            if m.servable(t) and m.limit_state(t.ckey) != "free":
                t.put_off_maybe = True
        if cp is None:
            assert not surely, f"claim_next found nothing while {surely} were due"
            self._note("claim_next none", lost=lost)
            return
        tid = cp.task_id
        assert tid in surely or tid in maybe, (
            f"claim_next served {tid}, which is not due or whose key is full "
            f"(due: {surely}, maybe due: {maybe}; places {m.places}, limits {m.limits})"
        )
        if surely:
            top = max(m.tasks[s].priority for s in surely)
            assert m.tasks[tid].priority >= top, f"claim_next served {tid} before a higher priority in {surely}"
            if self.fake and tid in surely:
                oldest = min(m.tasks[s].ready_at for s in surely if m.tasks[s].priority == top)
                assert m.tasks[tid].ready_at <= oldest, f"claim_next served {tid} before an older task: " + ", ".join(
                    f"{s} prio {m.tasks[s].priority} at {m.tasks[s].ready_at}" for s in surely
                )
        self._adopt_claim(worker, cp, token, lease_ms)
        self._note(f"claim_next served{' (of several due)' if len(surely) > 1 else ''}", lost=lost)

    @rule(hdata=st.data(), worker=st.sampled_from(WORKERS))
    def claim_next(self, hdata: st.DataObject, worker: str) -> None:
        data = self._draws(hdata)
        self._claim_next(worker, self._lease_ms(data), data.int(0, 3) == 0)

    def _commit(self, data: Draws, h: Held) -> None:
        m = self.model
        t = m.tasks[h.tid]
        stale = data.int(0, 4) == 0
        expected = h.revision + data.pick([-1, 1]) if stale else h.revision
        if expected < 0:
            expected = h.revision + 1
        status = data.pick(["running", "running", "wait_user", "completed"])
        marker = f"{h.tid}:{h.cycle}:{h.token}:{'stale' if stale else 'ok'}"
        cp = copy.deepcopy(h.cp)
        cp.cycle_index = h.cycle
        cp.messages = [*copy.deepcopy(t.messages if not stale else h.cp.messages), marker]
        cp.status = AgentStatus(status)
        cp.priority = data.int(0, 3)
        cp.claim_token = cp.claimed_cycle = cp.lease_expires_at_ms = None
        delay = None
        if status == "completed":
            cp.terminal_result = {"done": marker}
        else:
            delay = self._delay(data)
        fence = m.fence_holds(h) and expected == h.revision
        was_live = m.current(h)
        if status == "running" and not delay and data.bool():
            return self._commit_and_claim(data, h, cp, expected, fence, was_live, stale)
        lost = self._maybe_lose(data, h.worker, ["commit", "limit_release"])
        try:
            ok = self.stores[h.worker].commit(cp, token=h.token, expected_revision=expected, delay_ms=delay)
        finally:
            self._restore()
        assert ok == fence, f"commit of {cp.messages[-1]} answered {ok}; the model says {fence} (lost reply: {lost})"
        self._note(f"commit {status if ok else 'fenced'}{' stale' if stale else ''}", lost=lost, delay=delay)
        if not ok:
            self._fenced(h, was_live)
            return
        self._committed(h, cp, delay)

    def _fenced(self, h: Held, was_live: bool) -> None:
        """``h``'s write was refused: a live holder keeps its place (only it may give it back), a
        lease that is over may have given it back (or not: its place expires)."""
        t = self.model.tasks[h.tid]
        if not (was_live and (t.token, t.claimed) == (h.token, h.cycle)):
            self.model.give_back(h.tid, h.token, t.ckey, certain=False)
            self._drop_held(h)

    def _committed(self, h: Held, cp: Checkpoint, delay: int | None) -> None:
        m = self.model
        t = m.tasks[h.tid]
        status, marker = AgentStatus(cp.status).value, cp.messages[-1]
        now = m.now
        t.revision += 1
        t.cycle, t.status, t.priority = h.cycle, status, cp.priority
        t.messages = cp.messages
        t.token = t.claimed = t.lease_exp = None
        t.term = status == "completed"
        t.due = now + delay if delay else None
        t.ready_at, t.put_off_maybe = max(now, t.due or now), False
        t.steps.clear()
        t.acked.append(marker)
        m.give_back(h.tid, h.token, t.ckey, certain=True)
        self._drop_held(h)

    def _commit_and_claim(
        self, data: Draws, h: Held, cp: Checkpoint, expected: int, fence: bool, was_live: bool, stale: bool
    ) -> None:
        """The commit continued in the same script by a claim of the next cycle, for a new token."""
        m = self.model
        next_token = self._token(h.worker)
        lease_ms = self._lease_ms(data)
        self._maybe_lose(data, h.worker, ["commit_and_claim", "limit_acquire", "limit_release"])
        try:
            nxt = self.stores[h.worker].commit_and_claim(
                cp, token=h.token, expected_revision=expected, lease_ms=lease_ms, next_token=next_token
            )
        except ConcurrencyLimited:
            # Only a lease without a live place of its own (taken while its key had no limit, or
            # run out with a lapsed lease) takes a new one. The real server's clock is ahead of
            # the model's (which moves by the sleeps alone): a place may be over there already.
            t = m.tasks[h.tid]
            place = m.places.get(t.ckey or "", {}).get((h.tid, h.token))
            now = m.now if self.fake else self._server_ms()
            own = place is not None and place.certain and place.expires > now
            assert m.limit_state(t.ckey) != "free" and not own, f"{h}: refused a next place, holding {place}"
            self._note("commit_and_claim limited")
            return
        finally:
            self._restore()
        assert (nxt is not None) == fence, f"commit_and_claim of {cp.messages[-1]} answered {nxt}; model: {fence}"
        self._note(f"commit_and_claim {'continued' if nxt else 'fenced'}{' stale' if stale else ''}")
        if nxt is None:
            t = m.tasks[h.tid]
            if t.ckey is not None:
                # The next lease's place was taken first, in place of this lease's: both are the
                # library's to give back (or to let expire); the live leases are what is checked.
                m.places.setdefault(t.ckey, {})[(h.tid, next_token)] = Place(m.now + lease_ms + LIMIT_SKEW_MS, False)
                m.give_back(h.tid, h.token, t.ckey, certain=False)
            self._fenced(h, was_live)
            return
        self._committed(h, cp, None)
        self._adopt_claim(h.worker, nxt, next_token, lease_ms)

    @precondition(held_or_real)
    @rule(hdata=st.data())
    def commit(self, hdata: st.DataObject) -> None:
        data = self._draws(hdata)
        if not self._nothing_held("commit", self.held, data):
            self._commit(data, data.pick(self.held))

    @precondition(held_or_real)
    @rule(hdata=st.data())
    def renew(self, hdata: st.DataObject) -> None:
        data = self._draws(hdata)
        m = self.model
        if self._nothing_held("renew", self.held, data):
            return
        h = data.pick(self.held)
        t = m.tasks[h.tid]
        stale = data.int(0, 3) == 0
        rev = h.revision + 1 if stale else h.revision
        lease_ms = self._lease_ms(data)
        was_live = m.current(h)
        self._maybe_lose(data, h.worker, ["renew", "limit_acquire"])
        try:
            ok = self.stores[h.worker].renew(h.tid, token=h.token, expected_revision=rev, lease_ms=lease_ms)
        finally:
            self._restore()
        assert ok == (was_live and not stale), f"renew of {h} answered {ok}"
        self._note(f"renew {'ok' if ok else 'refused'}")
        if ok:
            t.lease_exp = t.ready_at = m.now + lease_ms
            m.take_place(h.tid, h.token, t.ckey, t.lease_exp)
        elif not was_live:
            # A limited lease's renewal moves its place on before the lease (which is then refused):
            # whether that place is given back again is the library's business, not the limit's.
            if t.ckey is not None:
                m.places.setdefault(t.ckey, {})[(h.tid, h.token)] = Place(m.now + lease_ms + LIMIT_SKEW_MS, False)
            self._drop_held(h)

    @precondition(held_or_real)
    @rule(hdata=st.data())
    def release(self, hdata: st.DataObject) -> None:
        data = self._draws(hdata)
        m = self.model
        if self._nothing_held("release", self.held, data):
            return
        h = data.pick(self.held)
        t = m.tasks[h.tid]
        was_live = m.current(h)
        self._maybe_lose(data, h.worker, ["release", "limit_release"])
        try:
            ok = self.stores[h.worker].release(h.tid, token=h.token, expected_revision=h.revision)
        finally:
            self._restore()
        if was_live:
            assert ok, f"release of the live holder {h} refused"
        self._note(f"release {'ok' if ok else 'refused'}")
        if ok:
            assert m.fence_holds(h), f"release of {h} applied, but it is not the holder"
            t.lease_exp = t.ready_at = m.now + 1
            m.give_back(h.tid, h.token, t.ckey, certain=True)
            self._advance(2)  # the released cycle is claimable 1 ms later
        else:
            m.give_back(h.tid, h.token, t.ckey, certain=False)
        self._drop_held(h)

    @precondition(current_or_real)
    @rule(hdata=st.data())
    def lapse(self, hdata: st.DataObject) -> None:
        """A holder stalls: its lease (renewed to a short one) runs out, and its limiter place after it."""
        data = self._draws(hdata)
        m = self.model
        current = [h for h in self.held if m.current(h)]
        if self._nothing_held("lapse", current, data):
            return
        h = data.pick(current)
        short = LAPSE_MS[self.fake]
        assert self.stores[h.worker].renew(h.tid, token=h.token, expected_revision=h.revision, lease_ms=short)
        t = m.tasks[h.tid]
        t.lease_exp = t.ready_at = m.now + short
        m.take_place(h.tid, h.token, t.ckey, t.lease_exp)
        self._advance(LAPSE_WAIT_MS[self.fake])
        self._note("lapse")

    @precondition(lambda self: self.fake)
    @rule(ms=st.sampled_from([1, 300, 600, 1100]))
    def advance(self, ms: int) -> None:
        self._advance(ms)

    def cancel(self, data: Draws, worker: str, tid: str) -> None:
        t = self.model.tasks.get(tid)
        self._maybe_lose(data, worker, ["cancel"])
        try:
            if t is None:
                with pytest.raises(TaskNotFound):
                    self.stores[worker].cancel(tid)
                return
            cancelled = self.stores[worker].cancel(tid, reason="model")
        finally:
            self._restore()
        assert cancelled == (not t.term)
        self._note(f"cancel {'held' if t.token else ''} {cancelled}")
        if cancelled:
            t.status, t.term, t.revision = "cancelled", True, t.revision + 1
            t.token = t.claimed = t.lease_exp = None

    def resume(self, data: Draws, worker: str, tid: str) -> None:
        t = self.model.tasks.get(tid)
        message = {"answer": data.int(0, 99)}
        self._maybe_lose(data, worker, ["resume"])
        try:
            if t is None:
                with pytest.raises(TaskNotFound):
                    self.stores[worker].resume(tid, message=message)
                return
            if t.status != "wait_user" or t.term:
                with pytest.raises(NotWaiting):
                    self.stores[worker].resume(tid, message=message)
                return
            assert self.stores[worker].resume(tid, message=message) is True
        finally:
            self._restore()
        self._note("resume" + (" held" if t.token else ""))
        t.messages = [*t.messages, message]
        t.status, t.revision, t.due = "running", t.revision + 1, None
        t.token = t.claimed = t.lease_exp = None
        t.ready_at, t.put_off_maybe = self.model.now, False

    def set_limit(self, data: Draws, worker: str, ckey: str, limit: int | None) -> None:
        self._maybe_lose(data, worker, ["limit_set", "limit_register"])
        try:
            self.stores[worker].set_concurrency_limit(ckey, limit)
        finally:
            self._restore()
        self.model.set_limit(ckey, limit)
        # A raised limit wakes the tasks it put off; they stay "maybe" (the wake is best effort).
        for place in self.model.places.get(ckey, {}).values():
            if limit is None:
                place.certain = False  # a place taken without a limit counts or not

    @precondition(held_or_real)
    @rule(hdata=st.data(), name=st.sampled_from(["llm", "charge"]))
    def step(self, hdata: st.DataObject, name: str) -> None:
        data = self._draws(hdata)
        m = self.model
        if self._nothing_held("step", self.held, data):
            return
        h = data.pick(self.held)
        t = m.tasks[h.tid]
        key = (h.tid, h.cycle, name)
        store = self.stores[h.worker]
        # The claim this worker holds, as a lease without a keeper (nothing renews behind the model).
        if isinstance(store, Twin):
            alease = AsyncLease(store.wrapped, h.tid, h.cycle, token=h.token, lease_ms=LONG_MS,
                                release_on_exit=False, cancel_on_loss=False)  # fmt: skip
            alease._adopt(h.cp, alease._clock.now())
            lease: Any = Twin(alease, self.loop)
        else:
            lease = Lease(store, h.tid, h.cycle, token=h.token, lease_ms=LONG_MS, release_on_exit=False)
            lease._adopt(h.cp, lease._clock.now())

        def effect() -> str:
            self.step_calls[key] = self.step_calls.get(key, 0) + 1
            return f"{h.tid}/{h.cycle}/{name}/{self.step_calls[key]}"

        current = m.current(h)
        recorded = t.steps.get((h.cycle, name))
        calls = self.step_calls.get(key, 0)
        self._maybe_lose(data, h.worker, ["step_record", "step_load"])
        try:
            if not current:
                with pytest.raises(LeaseLost):
                    lease.step(name, effect)
                assert self.step_calls.get(key, 0) == calls, "a step ran under a lease that is not current"
                self._note("step refused")
                return
            got = lease.step(name, effect)
        finally:
            self._restore()
        assert not t.term, f"a step ran on terminal (cancelled?) task {h.tid}"
        self._note("step replayed" if recorded is not None else "step ran")
        if recorded is not None:
            assert got == recorded and self.step_calls[key] == calls, f"recorded step {key} ran again"
        else:
            assert self.step_calls[key] == calls + 1 and got == f"{h.tid}/{h.cycle}/{name}/{calls + 1}"
            t.steps[(h.cycle, name)] = got

    @precondition(lambda self: self.shards < MAX_SHARDS)
    @rule(
        hdata=st.data(),
        worker=st.sampled_from(WORKERS),
        meanwhile=st.sampled_from(["nothing", "claim_next", "commit", "cancel", "reshard"]),
    )
    def reshard(self, hdata: st.DataObject, worker: str, meanwhile: str) -> None:
        """One operator grows the namespace; the other works (or reshards too) between its moves."""
        data = self._draws(hdata)
        other = WORKERS[1 - WORKERS.index(worker)]
        target = self.shards * 2
        done: list[str] = []
        finished: list[str] = []

        def between(moved: int, of: int) -> None:
            if done or moved == of:
                return
            done.append(meanwhile)
            if meanwhile == "claim_next":
                self._claim_next(other, LONG_MS, False)
            elif meanwhile == "commit" and any(h.worker == other for h in self.held):
                self._commit(data, data.pick([h for h in self.held if h.worker == other]))
            elif meanwhile == "cancel":
                self.cancel(data, other, data.pick(TIDS))
            elif meanwhile == "reshard":
                # A second operator reruns the same reshard while the first is between two moves:
                # it may finish the job, or be refused while the first one runs; never lose anything.
                try:
                    report = self.stores[other].reshard(target)
                except ConfigConflict:
                    return
                assert report.to_shards == target
                finished.append(other)

        if data.int(0, 3) == 0:
            # The reshard's scripts are its own (registered per call): the next script call of this
            # store's kind, its first one, loses its reply.
            lost = lose_first_reply(self.stores[worker]._scripts["load"], self.mp, any_script=True)
            self._armed.append(("reshard's first script", lost))
        try:
            report = self.stores[worker].reshard(target, progress=between)
        except ConfigConflict:
            # Only when the other operator's rerun finished the reshard under it.
            assert finished, "reshard refused with ConfigConflict though no other reshard ran"
        else:
            assert report.to_shards == target
        finally:
            self._restore()
        self.shards = target
        self._note(f"reshard meanwhile {done[0] if done else 'nothing'}")
        # The namespace has the new count, whoever finished it.
        CheckpointStore(self.clients[1], namespace=self.ns, shards=target).list()

    # ---- invariants ------------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        type(self).steps_run += 1
        m = self.model
        now = m.now if self.fake else self._server_ms()
        assert self.reader.list() == sorted(m.tasks)
        for tid, t in m.tasks.items():
            cp = self.reader.load(tid)
            assert cp is not None, f"task {tid} is gone"
            got = (AgentStatus(cp.status).value, cp.cycle_index, cp.revision, cp.priority, cp.concurrency_key)
            assert got == (t.status, t.cycle, t.revision, t.priority, t.ckey), f"{tid}: {got} != model {t}"
            assert cp.messages == t.messages, f"{tid}: messages {cp.messages} != model {t.messages}"
            assert (cp.claim_token, cp.claimed_cycle) == (t.token, t.claimed), f"{tid}: claim {cp} != model {t}"
            live = cp.claim_token is not None and (cp.lease_expires_at_ms or 0) > now
            if self.fake:
                assert cp.lease_expires_at_ms == t.lease_exp and cp.due_at_ms == t.due, f"{tid}: {cp} != model {t}"
            else:
                assert (cp.due_at_ms is None) == (t.due is None), f"{tid}: {cp} != model {t}"
            assert live == m.live(t), f"{tid}: lease live {live}, model {m.live(t)}"
            # No acknowledged commit lost, none applied twice.
            for marker in t.acked:
                assert cp.messages.count(marker) == 1, f"{tid}: acknowledged commit {marker} lost or doubled"
            # One live holder among the workers' claims.
            holders = [h for h in self.held if h.tid == tid and m.current(h)]
            assert len(holders) <= 1 and (not holders or live), f"{tid}: live holders {holders}"
        for ckey in ("k", "j"):
            live_n, allowed = m.limit_holds(ckey)
            assert live_n <= allowed, f"{ckey}: {live_n} live leases, limit {m.limits.get(ckey)}"


# ---- runners -------------------------------------------------------------------------------


def m_limit(model: Model, ckey: str) -> bool:
    return model.limits.get(ckey) is not None


def _settings(config: pytest.Config, *, real: bool) -> settings:
    full = full_suite(config)
    if real:
        examples, steps = (40, 50) if full else (8, 30)
    else:
        examples, steps = (300, 60) if full else (20, 40)
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        phases=_phases(),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def _phases() -> list[Phase]:
    """``AGENTSTATE_MODEL_SHRINK=0``: report the first failing sequence as found (shrinking a long
    one can take minutes); by default hypothesis shrinks it to a minimal one."""
    if os.environ.get("AGENTSTATE_MODEL_SHRINK", "1") == "0":
        return [Phase.explicit, Phase.reuse, Phase.generate]
    return list(Phase)


def _seed() -> int:
    return int(os.environ.get("AGENTSTATE_MODEL_SEED", MODEL_SEED))


def _run(machine: type[ModelMachine], config: pytest.Config) -> None:
    chosen = _seed()
    s = _settings(config, real=machine.clock is None)
    print(f"model seed {chosen}: {s.max_examples} examples x {s.stateful_step_count} steps")
    machine.stats = Counter()
    machine.steps_run = 0
    try:
        run_state_machine_as_test(seed(chosen)(machine), settings=s)
    finally:
        print(f"{machine.steps_run} rules run; by outcome:")
        for what, n in sorted(machine.stats.items()):
            print(f"  {n:6d}  {what}")


@pytest.fixture(scope="module")
def model_server() -> Iterator[RedisServerProcess | None]:
    if shutil.which("redis-server") is None:
        yield None
        return
    server = RedisServerProcess.start()
    yield server
    server.stop()


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock(1_900_000_000.0)
    for name in FAKEREDIS_CLOCK_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "time", clock)
    return clock


@pytest.mark.fakeredis
def test_model_fakeredis(frozen_clock: FakeClock, pytestconfig: pytest.Config) -> None:
    server = fakeredis.FakeServer()

    class OnFake(ModelMachine):
        make_client = staticmethod(lambda: fakeredis.FakeRedis(server=server))
        make_async_client = staticmethod(lambda: fakeredis.FakeAsyncRedis(server=server))
        clock = frozen_clock

    _run(OnFake, pytestconfig)


@pytest.mark.real
def test_model_real_redis(model_server: RedisServerProcess | None, pytestconfig: pytest.Config) -> None:
    if model_server is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no redis-server")
        pytest.skip("redis-server not on PATH")
    port = model_server.port

    class OnReal(ModelMachine):
        make_client = staticmethod(lambda: redis.Redis(port=port))
        make_async_client = staticmethod(lambda: aioredis.Redis(port=port))
        clock = None

    _run(OnReal, pytestconfig)
