"""Stateful fuzzing: random operation sequences against a model of the seed's semantics.

A hypothesis ``RuleBasedStateMachine`` drives one ``CheckpointStore`` with
create / save / load / claim / commit / renew / finalize / acknowledge_terminal
/ delete / list, with random and hostile arguments (ids with separators,
braces, globs, unicode; wrong tokens and revisions; out-of-range numbers;
values msgpack cannot hold), and checks every result against ``Model``, a
pure-Python transcription of the seed (``003_*``) plus docs/design.md's changes
(server-clock leases, append-only history, re-sent claims, writes named by
their content: a commit/finalize/acknowledge identical to one that applied
is answered True, from the task's write ring or its tombstone). Leases are an
hour long and fixed expiries are either far past or far future, so the
model needs no clock.

Any exception other than the documented ones (``InvalidArgument`` for bad
input, the ``ClaimRejected`` family from ``claim``) fails the run; after an
``InvalidArgument`` the state must be unchanged. Runs on fakeredis and on a
private real redis-server (the fakeredis run is ``slow``: the full suite's); ``max_examples``
is kept small for CI.
"""

from __future__ import annotations

import copy
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis
from conftest import RedisServerProcess
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from redis_agentstate import (
    AgentStatus,
    AlreadyClaimed,
    Checkpoint,
    CheckpointStore,
    CheckpointTerminal,
    CycleConflict,
    InvalidArgument,
    NotRunnable,
    NotWaiting,
    TaskNotFound,
)
from redis_agentstate.codec import encode
from redis_agentstate.models import TERMINAL_STATUSES

LEASE_MS = 3_600_000
FAR_FUTURE_MS = 2**46  # year ~4200
FAR_PAST_MS = 1

# ---- strategies ----------------------------------------------------------------

IDS = ["t", "a:b", "{x}", "}{", "*", "?[a]", "ü✓", "cp:t", " ", "x" * 300, "{agentstate#01}:cp:t"]
TOKENS = ["w1", "w2", "tok:{1}", "ü"]
ids = st.sampled_from(IDS)
tokens = st.sampled_from(TOKENS)
statuses = st.sampled_from(list(AgentStatus))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)
small = st.integers(0, 6)
bad_ids = st.one_of(st.just(""), st.just("x" * 1025), st.integers(), st.none(), st.just("\ud800"))
bad_ints = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**53), st.booleans(), st.floats(), st.text())
bad_values = st.one_of(st.integers(min_value=2**64), st.integers(max_value=-(2**63) - 1), st.just(object()))


# ---- the model -------------------------------------------------------------------


@dataclass
class Task:
    cycle_index: int
    status: str
    revision: int
    messages: list[Any]
    cycles: list[Any]
    shared_state: dict[Any, Any]
    terminal_result: Any
    budget_usage: Any
    term: bool
    token: str | None = None
    claimed: int | None = None
    live: bool = False  # the lease: far future (True) or expired (False)
    priority: int = 0
    ring: list[Any] = field(default_factory=list)  # identities of the last writes, newest first


#: Entries the write ring surely keeps (840 bytes, entries of at most 33): older ones may be gone.
RING_KEEPS = 24


def identity(kind: str, token: str, rev: int, cp: Checkpoint) -> tuple[Any, ...]:
    """What names a fenced write (the store digests the same things; encoded, as msgpack compares)."""
    body = encode([cp.shared_state, cp.terminal_result, cp.budget_usage], what="body")
    history = encode([cp.messages, cp.cycles], what="history")
    return (kind, token, rev, cp.cycle_index, AgentStatus(cp.status).value, cp.terminal_result is not None, body,
            history)  # fmt: skip


@dataclass
class Model:
    tasks: dict[str, Task] = field(default_factory=dict)
    tombs: dict[str, list[Any]] = field(default_factory=dict)  # the ring of an acknowledged task

    def recalls(self, tid: str, key: Any) -> bool | None:
        """True/False: whether ``key`` applied (ring or tombstone); None: too old to say."""
        rings = [self.tasks[tid].ring if tid in self.tasks else [], self.tombs.get(tid, [])]
        if any(key in ring[:RING_KEEPS] for ring in rings):
            return True
        if any(key in ring[RING_KEEPS:] for ring in rings):
            return None
        return False

    @staticmethod
    def from_cp(cp: Checkpoint) -> Task:
        live = cp.claim_token is not None and (cp.lease_expires_at_ms or 0) > FAR_PAST_MS
        return Task(
            cp.cycle_index, AgentStatus(cp.status).value, cp.revision, copy.deepcopy(cp.messages),
            copy.deepcopy(cp.cycles), copy.deepcopy(cp.shared_state), copy.deepcopy(cp.terminal_result),
            copy.deepcopy(cp.budget_usage), cp.terminal_result is not None, cp.claim_token, cp.claimed_cycle, live,
            priority=cp.priority,
        )  # fmt: skip

    def claim(self, tid: str, cycle: int, token: str) -> Task | type[Exception] | None:
        t = self.tasks.get(tid)
        if t is None:
            return None
        if t.term or AgentStatus(t.status) in TERMINAL_STATUSES:
            return CheckpointTerminal
        if t.status != "running":
            return NotRunnable
        if t.cycle_index != cycle - 1:
            return CycleConflict
        if t.token and t.live:
            if t.token != token or t.claimed != cycle:
                return AlreadyClaimed
            return t  # a re-sent claim: the same claim, revision unchanged
        t.revision += 1
        t.token, t.claimed, t.live = token, cycle, True
        return t

    def write(self, tid: str, cp: Checkpoint, *, final: bool = False) -> None:
        t = self.tasks[tid]
        if not final:  # a commit writes the priority; a finalize keeps the stored one
            t.priority = cp.priority
        n_m, n_c = len(t.messages), len(t.cycles)
        t.messages = t.messages + copy.deepcopy(cp.messages[n_m:])
        t.cycles = t.cycles + copy.deepcopy(cp.cycles[n_c:])
        t.cycle_index, t.status = cp.cycle_index, AgentStatus(cp.status).value
        t.shared_state = copy.deepcopy(cp.shared_state)
        t.terminal_result, t.budget_usage = copy.deepcopy(cp.terminal_result), copy.deepcopy(cp.budget_usage)
        t.term = cp.terminal_result is not None
        t.revision += 1
        t.token, t.claimed, t.live = None, None, False

    def acknowledge(self, tid: str, rev: int) -> None:
        self.tombs[tid] = [("ack", rev), *self.tasks.pop(tid).ring]

    def shrinks(self, tid: str, cp: Checkpoint) -> bool:
        t = self.tasks[tid]
        return len(cp.messages) < len(t.messages) or len(cp.cycles) < len(t.cycles)


def same(cp: Checkpoint | None, t: Task | None) -> None:
    if t is None:
        assert cp is None
        return
    assert cp is not None
    assert (cp.cycle_index, AgentStatus(cp.status).value, cp.revision) == (t.cycle_index, t.status, t.revision)
    assert cp.messages == t.messages and cp.cycles == t.cycles
    assert cp.shared_state == t.shared_state and cp.budget_usage == t.budget_usage
    assert cp.terminal_result == (t.terminal_result if t.term else None)
    assert (cp.claim_token, cp.claimed_cycle) == (t.token, t.claimed)
    assert cp.priority == t.priority
    if t.token is not None and t.live:
        assert cp.lease_expires_at_ms is not None and cp.lease_expires_at_ms > FAR_PAST_MS


# ---- the machine -----------------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    make_client: Any = None  # set per backend before the run

    def __init__(self) -> None:
        super().__init__()
        self.client = type(self).make_client()
        ns = f"fz-{uuid.uuid4().hex[:10]}"
        self.store = CheckpointStore(self.client, namespace=ns)
        self.fresh = CheckpointStore(self.client, namespace=ns, history_cache=0)  # reads Redis, never a cache
        self.model = Model()

    def teardown(self) -> None:
        self.client.close()

    @initialize()
    def start_with_one_task(self) -> None:
        assert self.store.create(Checkpoint("t"))
        self.model.tasks["t"] = Model.from_cp(Checkpoint("t"))

    # -- helpers --
    def _cp(self, data: st.DataObject, tid: str, *, with_claim: bool) -> Checkpoint:
        cp = Checkpoint(
            tid,
            cycle_index=data.draw(small),
            status=data.draw(statuses),
            messages=data.draw(st.lists(values, max_size=3)),
            cycles=data.draw(st.lists(values, max_size=2)),
            shared_state=data.draw(st.dictionaries(st.text(max_size=5), values, max_size=3)),
            revision=data.draw(small),
            terminal_result=data.draw(st.one_of(st.none(), values)),
            budget_usage=data.draw(st.one_of(st.none(), values)),
            priority=data.draw(st.integers(0, 9)),
        )
        if with_claim and data.draw(st.booleans()):
            cp.claim_token = data.draw(tokens)
            cp.claimed_cycle = data.draw(st.integers(1, 6))
            cp.lease_expires_at_ms = data.draw(st.sampled_from([FAR_PAST_MS, FAR_FUTURE_MS]))
        return cp

    def _next_cp(self, data: st.DataObject, tid: str) -> Checkpoint:
        """A plausible next checkpoint: the stored one with history appended (or, rarely, shrunk)."""
        t = self.model.tasks[tid]
        cp = Checkpoint(
            tid, cycle_index=t.claimed or t.cycle_index + 1, status=data.draw(statuses),
            messages=copy.deepcopy(t.messages) + data.draw(st.lists(values, max_size=3)),
            cycles=copy.deepcopy(t.cycles) + data.draw(st.lists(values, max_size=2)),
            shared_state=data.draw(st.dictionaries(st.text(max_size=5), values, max_size=3)),
            priority=data.draw(st.integers(0, 9)),
        )  # fmt: skip
        if data.draw(st.integers(0, 9)) == 0 and cp.messages:
            cp.messages = cp.messages[:-1] if len(t.messages) == 0 else cp.messages[: len(t.messages) - 1]
        if data.draw(st.integers(0, 5)) == 0:
            cp.cycle_index = data.draw(small)
        return cp

    # -- rules --
    @rule(data=st.data(), tid=ids)
    def create(self, data: st.DataObject, tid: str) -> None:
        cp = self._cp(data, tid, with_claim=True)
        created = self.store.create(cp)
        assert created == (tid not in self.model.tasks)
        if created:
            self.model.tasks[tid] = Model.from_cp(cp)
            self.model.tasks[tid].ring = [object()]  # a per-call nonce

    @rule(data=st.data(), tid=ids)
    def save(self, data: st.DataObject, tid: str) -> None:
        cp = self._cp(data, tid, with_claim=True)
        self.store.save(cp)
        old = self.model.tasks.get(tid)
        self.model.tasks[tid] = Model.from_cp(cp)
        self.model.tasks[tid].ring = [object(), *(old.ring if old else [])]

    @rule(tid=ids)
    def load(self, tid: str) -> None:
        same(self.store.load(tid), self.model.tasks.get(tid))

    @rule(tid=ids, data=st.data(), token=tokens)
    def claim(self, tid: str, data: st.DataObject, token: str) -> None:
        t = self.model.tasks.get(tid)
        cycle = data.draw(st.sampled_from([(t.cycle_index if t else 0) + 1, 1, 2, 5]))
        before = copy.deepcopy(self.model)
        expected = self.model.claim(tid, cycle, token)
        if isinstance(expected, type):
            self.model = before
            with pytest.raises(expected):
                self.store.claim(tid, cycle, token=token, lease_ms=LEASE_MS)
            return
        same(self.store.claim(tid, cycle, token=token, lease_ms=LEASE_MS), expected)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), token=tokens)
    def commit(self, data: st.DataObject, token: str) -> None:
        tid = data.draw(st.sampled_from(sorted(self.model.tasks)))
        t = self.model.tasks[tid]
        if t.token is not None and data.draw(st.booleans()):
            token = t.token  # mostly the holder's: a commit that can succeed
        cp = self._next_cp(data, tid)
        expected_rev = data.draw(st.sampled_from([t.revision, t.revision, t.revision - 1, t.revision + 1]))
        if expected_rev < 0:
            return
        fenced = not (t.revision == expected_rev and t.token == token and t.claimed == cp.cycle_index)
        if not fenced and self.model.shrinks(tid, cp):
            with pytest.raises(InvalidArgument):
                self.store.commit(cp, token=token, expected_revision=expected_rev)
            return
        key = identity("commit", token, expected_rev, cp)
        try:
            ok = self.store.commit(cp, token=token, expected_revision=expected_rev)
        except InvalidArgument:
            # Refused on the client's cached history length before sending: only when shrinking.
            assert self.model.shrinks(tid, cp)
            return
        if fenced:
            # Fenced out, unless this very write applied before (then True, nothing written).
            recalled = self.model.recalls(tid, key)
            assert recalled is None or ok == recalled
        else:
            assert ok
            self.model.write(tid, cp)
            t.ring.insert(0, key)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), token=tokens)
    def renew(self, data: st.DataObject, token: str) -> None:
        tid = data.draw(st.sampled_from(sorted(self.model.tasks)))
        t = self.model.tasks[tid]
        rev = data.draw(st.sampled_from([t.revision, t.revision + 1]))
        ok = self.store.renew(tid, token=token, expected_revision=rev, lease_ms=LEASE_MS)
        assert ok == (t.revision == rev and t.token == token and t.live)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), result=values)
    def finalize(self, data: st.DataObject, result: Any) -> None:
        tid = data.draw(st.sampled_from(sorted(self.model.tasks)))
        t = self.model.tasks[tid]
        cp = self._next_cp(data, tid)
        cp.terminal_result = {"r": result}
        cp.status = data.draw(st.sampled_from([AgentStatus.COMPLETED, AgentStatus.FAILED, AgentStatus.MAX_CYCLES]))
        rev = data.draw(st.sampled_from([t.revision, t.revision - 1]))
        if rev < 0:
            return
        refused = t.revision != rev or t.token is not None or t.term
        if not refused and self.model.shrinks(tid, cp):
            with pytest.raises(InvalidArgument):
                self.store.finalize(cp, expected_revision=rev)
            return
        key = identity("finalize", "", rev, cp)
        try:
            ok = self.store.finalize(cp, expected_revision=rev)
        except InvalidArgument:
            assert self.model.shrinks(tid, cp)
            return
        if refused:
            recalled = self.model.recalls(tid, key)
            assert recalled is None or ok == recalled
        else:
            assert ok
            self.model.write(tid, cp, final=True)
            t.ring.insert(0, key)

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.model.tasks)))
        t = self.model.tasks[tid]
        rev = data.draw(st.sampled_from([t.revision, t.revision + 1]))
        ok = self.store.acknowledge_terminal(tid, expected_revision=rev)
        if t.revision == rev and (t.term or t.status == AgentStatus.CANCELLED.value):
            assert ok
            self.model.acknowledge(tid, rev)
        else:
            # Nothing to delete: True only for an acknowledgement of this revision that applied already.
            assert ok == (("ack", rev) in self.model.tombs.get(tid, []))

    @rule(tid=ids)
    def cancel(self, tid: str) -> None:
        t = self.model.tasks.get(tid)
        if t is None:
            with pytest.raises(TaskNotFound):
                self.store.cancel(tid)
            return
        cancelled = self.store.cancel(tid, reason="fuzz")
        if t.term or AgentStatus(t.status) in TERMINAL_STATUSES:
            assert cancelled is False
            return
        assert cancelled is True
        t.status, t.revision, t.token, t.claimed, t.live = (
            AgentStatus.CANCELLED.value,
            t.revision + 1,
            None,
            None,
            False,
        )
        t.ring.insert(0, object())  # the cancel's nonce takes a place in the ring

    @rule(tid=ids, message=st.one_of(st.none(), values))
    def resume(self, tid: str, message: Any) -> None:
        t = self.model.tasks.get(tid)
        if t is None:
            with pytest.raises(TaskNotFound):
                self.store.resume(tid, message=message)
            return
        if t.status != AgentStatus.WAIT_USER.value or t.term:
            with pytest.raises(NotWaiting):
                self.store.resume(tid, message=message)
            return
        assert self.store.resume(tid, message=message) is True
        if message is not None:
            t.messages = [*t.messages, copy.deepcopy(message)]
        t.status, t.revision, t.token, t.claimed, t.live = "running", t.revision + 1, None, None, False
        t.ring.insert(0, object())

    @rule(tid=ids)
    def delete(self, tid: str) -> None:
        self.store.delete(tid)
        self.model.tasks.pop(tid, None)
        self.model.tombs.pop(tid, None)  # delete removes the tombstone too

    @rule(data=st.data())
    def hostile_arguments_change_nothing(self, data: st.DataObject) -> None:
        """Every bad argument is an InvalidArgument, raised before anything is written."""
        tid = data.draw(st.sampled_from(sorted(self.model.tasks) or ["t"]))
        bad_call = data.draw(
            st.sampled_from(["id", "token", "cycle", "lease", "revision", "value", "checkpoint", "no_result"])
        )
        s = self.store
        with pytest.raises(InvalidArgument):
            if bad_call == "id":
                op = data.draw(st.sampled_from(["load", "claim", "delete", "ack"]))
                bad = data.draw(bad_ids)
                {
                    "load": lambda: s.load(bad),
                    "claim": lambda: s.claim(bad, 1, token="w1", lease_ms=LEASE_MS),
                    "delete": lambda: s.delete(bad),
                    "ack": lambda: s.acknowledge_terminal(bad, expected_revision=0),
                }[op]()
            elif bad_call == "token":
                s.claim(tid, 1, token=data.draw(st.one_of(bad_ids, st.just("x" * 257))), lease_ms=LEASE_MS)
            elif bad_call == "cycle":
                s.claim(tid, data.draw(st.one_of(st.just(0), bad_ints)), token="w1", lease_ms=LEASE_MS)
            elif bad_call == "lease":
                s.renew(tid, token="w1", expected_revision=0, lease_ms=data.draw(st.one_of(st.just(0), bad_ints)))
            elif bad_call == "revision":
                s.acknowledge_terminal(tid, expected_revision=data.draw(bad_ints))
            elif bad_call == "value":
                s.create(Checkpoint(tid + "-new", shared_state={"v": data.draw(bad_values)}))
            elif bad_call == "checkpoint":
                s.save(data.draw(st.sampled_from([None, "cp", Checkpoint(tid, status="nope"),  # type: ignore[arg-type]
                                                  Checkpoint(tid, messages="x"), Checkpoint(tid, cycle_index=-1)])))  # fmt: skip # noqa: E501
            else:
                s.finalize(Checkpoint(tid), expected_revision=0)

    @invariant()
    def listing_and_every_task_match(self) -> None:
        assert self.store.list() == sorted(self.model.tasks)
        for tid in self.model.tasks:
            same(self.store.load(tid), self.model.tasks[tid])
            same(self.fresh.load(tid), self.model.tasks[tid])


# ---- runners -------------------------------------------------------------------------

FUZZ = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[RedisServerProcess | None]:
    if shutil.which("redis-server") is None:
        yield None
        return
    server = RedisServerProcess.start()
    yield server
    server.stop()


# The fakeredis twin of test_fuzz_real_redis, with five times its CPU (fakeredis runs the Lua in
# Python): the default run fuzzes on the real server, the full suite on both.
@pytest.mark.slow
def test_fuzz_fakeredis() -> None:
    server = fakeredis.FakeServer()
    StoreMachine.make_client = staticmethod(lambda: fakeredis.FakeRedis(server=server))
    run_state_machine_as_test(StoreMachine, settings=FUZZ)


@pytest.mark.real
def test_fuzz_real_redis(fuzz_server: RedisServerProcess | None) -> None:
    if fuzz_server is None:
        pytest.skip("redis-server not on PATH")
    port = fuzz_server.port
    StoreMachine.make_client = staticmethod(lambda: redis.Redis(port=port))
    run_state_machine_as_test(StoreMachine, settings=FUZZ)


def test_rewritten_old_entry_is_not_what_this_client_reads_back() -> None:
    """History is append-only: a commit whose *old* entries differ from Redis' keeps Redis' entries.

    Redis does (the script appends only the new entries), but the writing
    store caches the caller's list, so its own later ``load`` returns the
    rewritten entry while every other client reads the stored one. Fixed in
    ``core.writes.CheckpointWrites._fenced_write``: it caches ``known[:base] + new`` unless
    the caller's list is the one the store handed out (and drops the entry when
    the full lists were sent).
    """
    client = fakeredis.FakeRedis()
    store = CheckpointStore(client, namespace="rw")
    store.create(Checkpoint("t", messages=["a"]))
    cp = store.load("t")
    cp.messages = [{"rewritten": True}, "b"]
    cp.status, cp.terminal_result = AgentStatus.COMPLETED, 1
    assert store.finalize(cp, expected_revision=0)
    assert CheckpointStore(client, namespace="rw", history_cache=0).load("t").messages == ["a", "b"]
    assert store.load("t").messages == ["a", "b"]
