"""Every Lua script the package ships, re-sent after a lost reply, acts once (issue 38, the structural fix).

For each script in ``redis_agentstate/lua`` (every file not starting with ``_``: the list comes
from the package, and a script without a case here fails ``test_every_shipped_script_has_a_case``),
a representative call through the public API runs twice, on two namespaces of one backend:

* the twin: as is;
* the faulted run: the reply of that script's call is lost after the server ran it
  (``faults.replies.lose_reply``: a single call or a pipelined batch), and the library's own retry
  (``RetryPolicy``) sends it again.

Then everything observable must equal one execution:

* the re-send is the same request (same keys and arguments), and the server state right after the
  re-send ran equals the state right after the lost call ran (the re-send wrote nothing; a case
  whose re-send renews a server-clock expiry, as a lease's renewal does, is compared with the
  server-clock values masked);
* the value the public call returned, what the family's public readers answer afterwards (loads,
  lists, parked and limiter places, snapshots, watched records, runs and their event streams),
  and every key of the namespace, compare equal to the twin's, with what differs between any two
  runs masked (the namespace, server-clock milliseconds, random ids and tokens).

Runs on {fake, real, cluster} x {sync, async} (the default run spreads the cases over them, the
full suite runs each case on all six).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import random
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Twin
from faults.replies import ReplyLoss, lose_reply

from redis_agentstate import AgentStatus, AsyncCheckpointStore, Checkpoint, CheckpointStore
from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore
from redis_agentstate.langgraph import scripts as lg_scripts
from redis_agentstate.pool_models import (
    MessageReceipt,
    PoolConfig,
    PoolMember,
    RunMessage,
    WakeCondition,
    WakeRegistration,
)
from redis_agentstate.pools import AsyncPoolStore, PoolStore
from redis_agentstate.wire import scripts

LEASE = 30_000


def shipped_scripts() -> list[str]:
    """Every script the package ships: each non-underscore file of its ``lua`` directory."""
    return sorted(name[: -len(".lua")] for name in scripts.lua_files() if not name.startswith("_"))


# ---- what is compared ---------------------------------------------------------------------------

_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX = re.compile(rb"(?<![0-9a-zA-Z])[0-9a-f]{16,}(?![0-9a-zA-Z])")
# Server-clock ms, and a ready score (ms less a priority band, see _common.lua): 13 to 15 digits.
_MS = re.compile(rb"(?<![0-9])-?[0-9]{13,15}(?![0-9])")
_ISO = re.compile(rb"20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]+(?:\+00:00|Z)?")
_TAG = re.compile(rb"\{NS(\.runs)?#([0-9]+)(?:/[0-9]+)?[^}]*\}")
# A lease token as the library draws one (core.lease.new_token: pid, random hex).
_TOKEN = re.compile(rb"(?<![0-9A-Za-z])[0-9]+-[0-9a-f]{12}(?![0-9A-Za-z])")
# A stream entry's sequence within its millisecond depends on timing.
_STREAM_SEQ = re.compile(rb"<ms>-[0-9]+")
# A run id's entry is in the shard of the (random) run id.
_BY_RUN_ID = re.compile(rb"\{NS\.runs#[0-9]+\}:lgrid:")


class Masks:
    """Masks what differs between two runs of one scenario: the namespace, server-clock ms, random ids."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace.encode()

    def bytes(self, b: bytes) -> bytes:
        b = b.replace(self.ns, b"NS")
        b = _TAG.sub(rb"{NS\1#\2}", b)
        b = _BY_RUN_ID.sub(b"{NS.runs#?}:lgrid:", b)
        b = _UUID.sub(b"<uuid>", b)
        b = _TOKEN.sub(b"<token>", b)
        b = _ISO.sub(b"<iso>", b)
        b = _HEX.sub(b"<hex>", b)
        return _STREAM_SEQ.sub(b"<ms>-<seq>", _MS.sub(b"<ms>", b))

    def __call__(self, v: Any) -> Any:
        if isinstance(v, bytes):
            return self.bytes(v)
        if isinstance(v, str):
            return self.bytes(v.encode()).decode("utf-8", "replace")
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, enum.Enum):
            return self(v.value)
        if isinstance(v, (int, float)):
            return "<ms>" if 10**12 <= abs(v) < 10**15 else v
        if isinstance(v, dict):
            return sorted(((repr(self(k)), self(x)) for k, x in v.items()), key=lambda kv: kv[0])
        if isinstance(v, (list, tuple)):
            return [self(x) for x in v]
        if isinstance(v, (set, frozenset)):
            return sorted(repr(self(x)) for x in v)
        if isinstance(v, BaseException):
            return (type(v).__name__, self(str(v)))
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return (type(v).__name__, self({f.name: getattr(v, f.name) for f in dataclasses.fields(v)}))
        slots = getattr(type(v), "__slots__", None)
        if slots:
            return (type(v).__name__, self({s: getattr(v, s) for s in slots if hasattr(v, s)}))
        if hasattr(v, "_asdict"):
            return (type(v).__name__, self(v._asdict()))
        return self(repr(v))


def key_dump(raw: Any, namespace: str) -> list[tuple[bytes, str, Any, bool]]:
    """Every key of the namespace (its queue namespace too): name, type, content, and whether it has a TTL."""
    out = []
    for k in raw.scan_iter(match=f"{namespace}*", count=1000):
        kind = raw.type(k).decode()
        if kind == "string":
            content: Any = raw.get(k)
        elif kind == "hash":
            content = sorted(raw.hgetall(k).items())
        elif kind == "list":
            content = raw.lrange(k, 0, -1)
        elif kind == "set":
            content = sorted(raw.smembers(k))
        elif kind == "zset":
            # By member: two runs' server-clock scores order alike only up to their masks.
            content = sorted(raw.zrange(k, 0, -1, withscores=True))
        elif kind == "stream":
            content = raw.xrange(k)
        else:  # gone between SCAN and TYPE
            continue
        out.append((k, kind, content, raw.pttl(k) > 0))
    return sorted(out, key=lambda e: e[0])


# ---- the scenarios ------------------------------------------------------------------------------


@dataclasses.dataclass
class Env:
    """One run of a scenario: stores of the test's flavor on the test's backend, on ``namespace``."""

    backend: Any
    flavor: str
    loop: asyncio.AbstractEventLoop
    namespace: str
    raw: Any
    closers: list[Callable[[], Any]] = dataclasses.field(default_factory=list)
    state: dict[str, Any] = dataclasses.field(default_factory=dict)

    def make(self, sync_cls: Any, async_cls: Any, **kw: Any) -> Any:
        """A store as users build one: on a client of the backend (``from_url`` on a real server)."""
        kw.setdefault("namespace", self.namespace)
        if self.flavor == "sync":
            return sync_cls(self.backend.sync_client(), **kw)

        async def build() -> Any:  # built on the loop: an asyncio store may bind to it
            return async_cls(self.backend.async_client(), **kw)

        return Twin(self.loop.run_until_complete(build()), self.loop)

    def tasks(self, **kw: Any) -> Any:
        return self.make(CheckpointStore, AsyncCheckpointStore, **kw)

    def observer(self, **kw: Any) -> CheckpointStore:
        """A sync store of the namespace on the raw client, for reading back (never faulted)."""
        return CheckpointStore(self.raw, namespace=self.namespace, **kw)

    def wait(self, value: Any) -> Any:
        """``value``, or what it resolves to when it is awaitable (an async object's method)."""
        return self.loop.run_until_complete(value) if inspect.isawaitable(value) else value

    def collect(self, it: Any) -> list[Any]:
        if hasattr(it, "__aiter__"):

            async def gather() -> list[Any]:
                return [x async for x in it]

            return self.loop.run_until_complete(gather())
        return list(it)

    def enter(self, cm: Any) -> Any:
        """Enter a sync or async context manager until the scenario ends."""
        if hasattr(cm, "__aenter__"):
            got = self.wait(cm.__aenter__())
            self.closers.append(lambda: self.wait(cm.__aexit__(None, None, None)))
        else:
            got = cm.__enter__()
            self.closers.append(lambda: cm.__exit__(None, None, None))
        return got

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


@dataclasses.dataclass(frozen=True)
class Case:
    """A representative public call of ``script`` (``act``), after ``setup``; ``observe``: what the
    family's public readers answer afterwards. ``nth``: the call of the script (within ``act``)
    whose reply is lost. ``renews``: a re-send that renews a server-clock expiry (a lease), so the
    state after it equals the state after the first run with server-clock values masked."""

    script: str
    act: Callable[[Env], Any]
    setup: Callable[[Env], Any] = lambda env: None
    observe: Callable[[Env], Any] | None = None
    nth: int = 1
    renews: bool = False
    #: False: the call changes nothing (a refusal, or the same state again), its re-send neither.
    changes: bool = True
    #: Keys (a regex on the masked name) left out of the twin comparison: data a graph wrote,
    #: packed with ids and clocks that no mask reaches (what it means is compared by ``observe``).
    opaque: bytes | None = None


CASES: dict[str, Case] = {}


def case(script: str, *, id: str | None = None, **kw: Any) -> Callable[[Callable[[Env], Any]], Callable[[Env], Any]]:
    def register(act: Callable[[Env], Any]) -> Callable[[Env], Any]:
        name = id or script
        assert name not in CASES, name
        CASES[name] = Case(script, act, **kw)
        return act

    return register


# ---- checkpoints, lifecycle, steps --------------------------------------------------------------


def observe_tasks(env: Env) -> Any:
    obs = env.observer()
    ids = obs.list()
    return {"list": ids, "loads": [obs.load(t) for t in ids], "parked": obs.list_parked(),
            "limits": obs.concurrency_limits()}  # fmt: skip


def created(*ids: str, **kw: Any) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        store = env.state["store"] = env.tasks(**kw)
        for tid in ids:
            assert store.create(Checkpoint(tid, messages=[f"hello {tid}"], shared_state={"n": 0}))

    return setup


def claimed(*ids: str, **kw: Any) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        created(*ids, **kw)(env)
        env.state["cp"] = env.state["store"].claim(ids[0], 1, token="w", lease_ms=LEASE)

    return setup


def next_cycle(env: Env, message: str = "cycle 1", **kw: Any) -> Checkpoint:
    cp: Checkpoint = env.state["cp"]
    return dataclasses.replace(cp, cycle_index=1, messages=[*cp.messages, message], **kw)


T = dict(observe=observe_tasks)


@case("create", **T)
def _create(env: Env) -> Any:
    env.state["store"] = store = env.tasks()
    return store.create(Checkpoint("t1", messages=["hi"], shared_state={"k": 1}), delay_ms=60_000)


@case("save", setup=claimed("t1"), **T)
def _save(env: Env) -> Any:
    return env.state["store"].save(Checkpoint("t1", cycle_index=4, messages=["imported"], priority=3))


@case("load", setup=claimed("t1"), **T)
def _load(env: Env) -> Any:
    return env.state["store"].load("t1")


@case("summary", setup=claimed("t1", "t2"), **T)
def _summary(env: Env) -> Any:
    # What `agentstate list` and `agentstate stats` show (cli.py reads it so).
    now, rows = env.state["store"]._summaries(["t1", "t2", "never"])
    # How long is left is counted from the reading: only whether there is some is compared.
    relative = ("lease_remaining_ms", "due_in_ms")
    return now, [{k: (v is not None if k in relative else v) for k, v in row.items()} for row in rows]


@case("claim", setup=created("t1"), **T)
def _claim(env: Env) -> Any:
    return env.state["store"].claim("t1", 1, token="w", lease_ms=LEASE)


def _one_due(env: Env) -> None:
    created("t1")(env)
    # Another task, not due yet: which task is claimed must not depend on the milliseconds between creates.
    assert env.state["store"].create(Checkpoint("t2"), delay_ms=3_600_000)


@case("claim_next", setup=_one_due, **T)
def _claim_next(env: Env) -> Any:
    return env.state["store"].claim_next(token="w", lease_ms=LEASE)


@case("commit", setup=claimed("t1"), **T)
def _commit(env: Env) -> Any:
    cp = next_cycle(env, cycles=[{"n": 1}], shared_state={"n": 1})
    return env.state["store"].commit(cp, token="w", expected_revision=env.state["cp"].revision)


@case("commit_and_claim", setup=claimed("t1"), **T)
def _commit_and_claim(env: Env) -> Any:
    cp = next_cycle(env)
    return env.state["store"].commit_and_claim(cp, token="w", expected_revision=env.state["cp"].revision,
                                               lease_ms=LEASE, next_token="w2")  # fmt: skip


@case("renew", setup=claimed("t1"), renews=True, **T)
def _renew(env: Env) -> Any:
    return env.state["store"].renew("t1", token="w", expected_revision=env.state["cp"].revision, lease_ms=LEASE)


@case("finalize", setup=created("t1"), **T)
def _finalize(env: Env) -> Any:
    done = Checkpoint("t1", messages=["hello t1", "bye"], status=AgentStatus.COMPLETED, terminal_result={"ok": 1})
    return env.state["store"].finalize(done, expected_revision=0)


def _terminal(env: Env) -> None:
    env.state["store"] = store = env.tasks()
    assert store.create(Checkpoint("t1", status=AgentStatus.FAILED, terminal_result="x"))
    assert store.create(Checkpoint("t2"))


@case("acknowledge_terminal", setup=_terminal, **T)
def _acknowledge(env: Env) -> Any:
    return env.state["store"].acknowledge_terminal("t1", expected_revision=0)


@case("delete", setup=claimed("t1", "t2"), **T)
def _delete(env: Env) -> Any:
    return env.state["store"].delete("t1")


@case("release", setup=claimed("t1", max_attempts=3), **T)
def _release(env: Env) -> Any:
    store = env.state["store"]
    return store.release("t1", token="w", expected_revision=env.state["cp"].revision, reason="ValueError: boom")


def _parked(env: Env) -> None:
    claimed("t1", "t2", max_attempts=1)(env)
    assert env.state["store"].release("t1", token="w", expected_revision=1, reason="boom")
    assert env.state["store"].list_parked() == ["t1"]


@case("requeue", setup=_parked, **T)
def _requeue(env: Env) -> Any:
    return env.state["store"].requeue("t1")


@case("cancel", setup=claimed("t1"), **T)
def _cancel(env: Env) -> Any:
    return env.state["store"].cancel("t1", reason="operator stop")


def _waiting(env: Env) -> None:
    claimed("t1")(env)
    cp = next_cycle(env, "question?", status=AgentStatus.WAIT_USER)
    assert env.state["store"].commit(cp, token="w", expected_revision=env.state["cp"].revision)


@case("resume", setup=_waiting, **T)
def _resume(env: Env) -> Any:
    return env.state["store"].resume("t1", message={"answer": 42})


def _gone_checkpoint(env: Env) -> None:
    created("t1", "t2", "t3")(env)
    # What a terminal_ttl_ms expiry leaves: index entries whose checkpoint is gone.
    for tid in ("t2", "t3"):
        env.raw.delete(env.state["store"]._core.keys.task(tid).checkpoint)


@case("prune", setup=_gone_checkpoint, **T)
def _prune(env: Env) -> Any:
    return env.state["store"].list()


def _leased(recorded: bool) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        created("t1")(env)
        lease = env.enter(env.state["store"].lease("t1", 1, token="w", lease_ms=LEASE))
        env.state["lease"] = lease
        env.state["ran"] = []
        if recorded:
            assert env.wait(lease.step("fetch", _step_fn(env), 7)) == {"fetched": 7}

    return setup


def _step_fn(env: Env) -> Callable[[int], Any]:
    def fetch(n: int) -> Any:
        env.state["ran"].append(n)
        return {"fetched": n}

    return fetch


def observe_steps(env: Env) -> Any:
    return {"tasks": observe_tasks(env), "ran": env.state["ran"]}


@case("step_load", setup=_leased(recorded=True), observe=observe_steps)
def _step_load(env: Env) -> Any:
    return env.wait(env.state["lease"].step("fetch", _step_fn(env), 8))


@case("step_record", setup=_leased(recorded=False), observe=observe_steps)
def _step_record(env: Env) -> Any:
    return env.wait(env.state["lease"].step("fetch", _step_fn(env), 7))


# Variants: other paths through the same scripts.


@case("commit", id="commit-terminal", setup=claimed("t1"), **T)
def _commit_terminal(env: Env) -> Any:
    cp = next_cycle(env, status=AgentStatus.COMPLETED, terminal_result={"answer": 42})
    return env.state["store"].commit(cp, token="w", expected_revision=env.state["cp"].revision)


@case("commit", id="commit-delayed-history-replaced", setup=claimed("t1"), **T)
def _commit_delayed(env: Env) -> Any:
    cp = dataclasses.replace(env.state["cp"], cycle_index=1, messages=["summary"], priority=5)
    return env.state["store"].commit(cp, token="w", expected_revision=env.state["cp"].revision,
                                     replace_history=True, delay_ms=60_000)  # fmt: skip


@case("release", id="release-give-back", setup=claimed("t1", max_attempts=3), **T)
def _release_give_back(env: Env) -> Any:
    return env.state["store"].release("t1", token="w", expected_revision=env.state["cp"].revision, after_ms=5_000)


@case("release", id="release-parks", setup=claimed("t1", max_attempts=1), **T)
def _release_parks(env: Env) -> Any:
    return env.state["store"].release("t1", token="w", expected_revision=env.state["cp"].revision, reason="boom")


def _lapsed(env: Env) -> None:
    created("t1")(env)
    env.state["store"].claim("t1", 1, token="dead", lease_ms=50)
    time.sleep(0.15)


@case("claim", id="claim-takeover", setup=_lapsed, **T)
def _claim_takeover(env: Env) -> Any:
    return env.state["store"].claim("t1", 1, token="w", lease_ms=LEASE)


@case("claim_next", id="claim_next-takeover", setup=_lapsed, **T)
def _claim_next_takeover(env: Env) -> Any:
    return env.state["store"].claim_next(token="w", lease_ms=LEASE)


@case("cancel", id="cancel-waiting", setup=_waiting, **T)
def _cancel_waiting(env: Env) -> Any:
    return env.state["store"].cancel("t1")


@case("cancel", id="cancel-parked", setup=_parked, **T)
def _cancel_parked(env: Env) -> Any:
    return env.state["store"].cancel("t1", reason="poison")


@case("create", id="create-limited-priority", **T)
def _create_limited(env: Env) -> Any:
    env.state["store"] = store = env.tasks()
    store.set_concurrency_limit("k", 1)
    return store.create(Checkpoint("t1", priority=7, concurrency_key="k", messages=[{"m": b"\x00"}]))


@case("save", id="save-over-a-terminal", setup=_terminal, **T)
def _save_terminal(env: Env) -> Any:
    return env.state["store"].save(Checkpoint("t1", messages=["again"]))


@case("finalize", id="finalize-replace-history", setup=claimed("t1"), **T)
def _finalize_replace(env: Env) -> Any:
    store, cp = env.state["store"], env.state["cp"]
    assert store.release("t1", token="w", expected_revision=cp.revision)
    done = Checkpoint("t1", messages=["only"], status=AgentStatus.FAILED, terminal_result="x")
    return store.finalize(done, expected_revision=store.load("t1").revision, replace_history=True)


@case("acknowledge_terminal", id="acknowledge_terminal-cancelled", setup=claimed("t1"), **T)
def _acknowledge_cancelled(env: Env) -> Any:
    store = env.state["store"]
    assert store.cancel("t1")
    return store.acknowledge_terminal("t1", expected_revision=store.load("t1").revision)


@case("delete", id="delete-with-steps", setup=_leased(recorded=True), observe=observe_steps)
def _delete_with_steps(env: Env) -> Any:
    return env.state["store"].delete("t1")


def _many(env: Env) -> None:
    created(*(f"t{i}" for i in range(12)))(env)
    for i in range(0, 12, 2):  # what expiry leaves, on several shards: a batch of prune calls
        env.raw.delete(env.state["store"]._core.keys.task(f"t{i}").checkpoint)


@case("prune", id="prune-2nd-of-a-batch", nth=2, setup=_many, **T)
def _prune_batch(env: Env) -> Any:
    return env.state["store"].list()


@case("summary", id="summary-2nd-of-a-batch", nth=2, setup=created(*(f"t{i}" for i in range(12))), **T)
def _summary_batch(env: Env) -> Any:
    store = env.state["store"]
    store.SUMMARY_CHUNK = 2  # several calls per shard, in one batch
    now, rows = store._summaries([f"t{i}" for i in range(12)])
    return now, [{k: v for k, v in row.items() if k not in ("lease_remaining_ms", "due_in_ms")} for row in rows]


@case("step_load", id="step_load-miss", setup=_leased(recorded=False), observe=observe_steps)
def _step_load_miss(env: Env) -> Any:
    return env.wait(env.state["lease"].step("fetch", _step_fn(env), 5))


@case("step_record", id="step_record-2nd-step", nth=1, setup=_leased(recorded=True), observe=observe_steps)
def _step_record_second(env: Env) -> Any:
    lease = env.state["lease"]
    first = env.wait(lease.step("fetch", _step_fn(env), 9))
    return first, env.wait(lease.step("other", _step_fn(env), 10))


# ---- concurrency limits -------------------------------------------------------------------------


def _limited(put_off: bool) -> Callable[[Env], Any]:
    """Key ``k`` limited to 1; tasks a and b under it; a claimed (holds the place); with ``put_off``,
    b was met by claim_next while the key was full (put off, recorded in the limiter)."""

    def setup(env: Env) -> None:
        env.state["store"] = store = env.tasks()
        store.set_concurrency_limit("k", 1)
        for tid in ("a", "b"):
            assert store.create(Checkpoint(tid, messages=[tid], concurrency_key="k"))
        if put_off:
            first = store.claim_next(token="w", lease_ms=LEASE)
            env.state["cp"] = first
            assert store.claim_next(token="w2", lease_ms=LEASE) is None

    return setup


def _limited_commit(env: Env) -> Any:
    cp: Checkpoint = env.state["cp"]
    nxt = dataclasses.replace(cp, cycle_index=1, messages=[*cp.messages, "done"])
    return env.state["store"].commit(nxt, token="w", expected_revision=cp.revision)


case("limit_release", setup=_limited(put_off=True), **T)(_limited_commit)
case("limit_wake", setup=_limited(put_off=True), **T)(_limited_commit)


@case("limit_acquire", setup=_limited(put_off=False), renews=True, **T)
def _limit_acquire(env: Env) -> Any:
    return env.state["store"].claim("a", 1, token="w", lease_ms=LEASE)


@case("limit_acquire", id="limit_acquire-claim_next", setup=_limited(put_off=False), renews=True, **T)
def _limit_acquire_next(env: Env) -> Any:
    return env.state["store"].claim_next(token="w", lease_ms=LEASE)


def _limited_claimed(env: Env) -> None:
    _limited(put_off=False)(env)
    env.state["cp"] = env.state["store"].claim("a", 1, token="w", lease_ms=LEASE)


@case("limit_acquire", id="limit_acquire-renew", setup=_limited_claimed, renews=True, **T)
def _limit_acquire_renew(env: Env) -> Any:
    return env.state["store"].renew("a", token="w", expected_revision=env.state["cp"].revision, lease_ms=LEASE)


@case("limit_acquire", id="limit_acquire-refused", setup=_limited(put_off=True), changes=False, **T)
def _limit_acquire_refused(env: Env) -> Any:
    # The key is full: the claim raises ConcurrencyLimited (compared with the twin's), b is put off.
    return env.state["store"].claim("b", 1, token="w2", lease_ms=LEASE)


@case("claim_next", id="claim_next-puts-off", setup=_limited(put_off=False), **T)
def _claim_next_puts_off(env: Env) -> Any:
    store = env.state["store"]
    assert store.claim("a", 1, token="w", lease_ms=LEASE)
    return store.claim_next(token="w2", lease_ms=LEASE)


@case("limit_release", id="limit_release-release", setup=_limited(put_off=True), **T)
def _limit_release_release(env: Env) -> Any:
    cp = env.state["cp"]
    return env.state["store"].release(cp.task_id, token="w", expected_revision=cp.revision)


@case("limit_release", id="limit_release-commit_and_claim", setup=_limited(put_off=True), **T)
def _limit_release_continue(env: Env) -> Any:
    cp: Checkpoint = env.state["cp"]
    nxt = dataclasses.replace(cp, cycle_index=1, messages=[*cp.messages, "done"], concurrency_key=None)
    return env.state["store"].commit_and_claim(nxt, token="w", expected_revision=cp.revision, lease_ms=LEASE)


@case("limit_set", id="limit_set-removed", setup=_limited(put_off=True), **T)
def _limit_removed(env: Env) -> Any:
    store = env.state["store"]
    store.set_concurrency_limit("k", None)
    return store.concurrency_limits()


def _kept_lease(env: Env) -> Any:
    """A lease on the limited task a, kept by its keeper: wait for its first renewal (in the faulted
    run, until the lost one was re-sent: a place moved, then the lease), then release it."""
    lease = env.enter(env.state["store"].lease("a", 1, token="w", lease_ms=3_000, renew_interval_ms=300))
    loss: ReplyLoss | None = env.state.get("loss")
    deadline = time.monotonic() + (10.0 if loss else 0.6)
    while time.monotonic() < deadline and not (loss and loss.resent):
        env.wait(asyncio.sleep(0.05))
    lost = lease.lost_event.is_set() if hasattr(lease, "lost_event") else lease.lost
    env.close()  # released: the place is given back
    return {"lost": lost}


case("renew", id="renew-lease-keeper", setup=_limited(put_off=False), renews=True, **T)(_kept_lease)
case("limit_acquire", id="limit_acquire-lease-keeper", setup=_limited(put_off=False), renews=True, nth=2, **T)(
    _kept_lease
)


def _limit_set(env: Env) -> Any:
    store = env.state["store"]
    store.set_concurrency_limit("k", 2)
    return store.concurrency_limits()


case("limit_set", setup=_limited(put_off=True), **T)(_limit_set)
case("limit_register", setup=_limited(put_off=True), **T)(_limit_set)


# ---- layout and reshard -------------------------------------------------------------------------


@case("layout_init", **T)
def _layout_init(env: Env) -> Any:
    # A store's first call on a namespace nobody used yet records its layout.
    env.state["store"] = store = env.tasks(shards=4)
    return store.create(Checkpoint("t1"))


def _before_reshard(env: Env) -> None:
    env.state["store"] = store = env.tasks(shards=2)
    for i in range(12):  # on both old shards
        assert store.create(Checkpoint(f"t{i}", messages=[f"m{i}"]))
    store.claim("t0", 1, token="w", lease_ms=LEASE)
    kv = env.make(KeyValueStore, AsyncKeyValueStore, shards=2)
    kv.set("a", b"1")
    kv.set("b", b"2", ttl_ms=3_600_000)


def observe_reshard(env: Env) -> Any:
    kv = KeyValueStore(env.raw, namespace=env.namespace)
    return {"tasks": observe_tasks(env), "kv": kv.get_many(["a", "b"]), "count": kv.count()}


def _reshard(env: Env) -> Any:
    report = env.state["store"].reshard(4)
    return {f.name: getattr(report, f.name) for f in dataclasses.fields(report)
            if f.name not in ("seconds", "worst_pause_ms")}  # fmt: skip


for _name in scripts.RESHARD_SCRIPTS:
    # A mover's lease, where the reshard takes one, is taken again by its re-send: a new expiry.
    case(_name, setup=_before_reshard, renews="lease" in _name, observe=observe_reshard)(_reshard)
# The second old shard's (its copy, restore and drop come after the first one's were done).
for _name in (scripts.RESHARD_SEAL, scripts.RESHARD_RESTORE, scripts.RESHARD_DROP):
    case(_name, id=f"{_name}-2nd", nth=2, setup=_before_reshard, observe=observe_reshard)(_reshard)


# ---- key/value ----------------------------------------------------------------------------------


def _kv(env: Env) -> None:
    env.state["kv"] = kv = env.make(KeyValueStore, AsyncKeyValueStore)
    kv.set_many({"a": b"1", "b": b"2"})
    kv.set("t", b"x", ttl_ms=3_600_000)


def observe_kv(env: Env) -> Any:
    kv = KeyValueStore(env.raw, namespace=env.namespace)
    return {"values": kv.get_many(["a", "b", "c", "t"]), "keys": kv.keys_page(limit=10), "count": kv.count()}


@case("kv_set", setup=_kv, observe=observe_kv)
def _kv_set(env: Env) -> Any:
    return env.state["kv"].set_many({"a": b"10", "c": b"3"})


@case("kv_delete", setup=_kv, observe=observe_kv)
def _kv_delete(env: Env) -> Any:
    return env.state["kv"].delete("b")


@case("kv_keys", setup=_kv, observe=observe_kv)
def _kv_keys(env: Env) -> Any:
    return env.state["kv"].keys_page(limit=10)


@case("kv_count", setup=_kv, observe=observe_kv)
def _kv_count(env: Env) -> Any:
    return env.state["kv"].count()


@case("kv_set", id="kv_set-2nd-shard-ttl", nth=2, setup=_kv, renews=True, observe=observe_kv)
def _kv_set_batch(env: Env) -> Any:
    return env.state["kv"].set_many({f"k{i}": bytes([i]) for i in range(10)}, ttl_ms=3_600_000)


@case("kv_delete", id="kv_delete-missing", setup=_kv, changes=False, observe=observe_kv)
def _kv_delete_missing(env: Env) -> Any:
    return env.state["kv"].delete("never")


@case("kv_swap", setup=_kv, observe=observe_kv)
def _kv_swap(env: Env) -> Any:
    return env.state["kv"].swap("a", b"1", b"11")


@case("kv_swap", id="kv_swap-absent", setup=_kv, observe=observe_kv)
def _kv_swap_absent(env: Env) -> Any:
    return env.state["kv"].swap("c", None, b"3")


# ---- agent pools --------------------------------------------------------------------------------

POOL = PoolConfig(message_policy={"route": "topic"}, wake_policy={"on": ["message"]}, policy_refs=["p1"])


def _message(i: int) -> tuple[RunMessage, MessageReceipt]:
    m = RunMessage(f"m{i}", f"idem-{i}", payload={"i": i, "blob": b"\x00\xff"}, topic="work", sender="s")
    return m, MessageReceipt(f"m{i}", recipients=[f"r{i}"], metadata={"i": i})


def _pool(joined: bool = True, message: bool = False) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        env.state["pools"] = pools = env.make(PoolStore, AsyncPoolStore)
        pools.open("p", POOL)
        if joined:
            pools.join("p", PoolMember("r1", ["work"], {"role": "a"}))
        if message:
            pools.record_message("p", *_message(1))

    return setup


def observe_pool(env: Env) -> Any:
    pools = PoolStore(env.raw, namespace=env.namespace)
    return {"snapshot": pools.snapshot("p"), "records": pools.watch("p"), "list": pools.list(),
            "receipt": pools.message_receipt("p", "idem-1")}  # fmt: skip


P = dict(observe=observe_pool)


@case("pool_open", setup=lambda env: env.state.update(pools=env.make(PoolStore, AsyncPoolStore)), **P)
def _pool_open(env: Env) -> Any:
    return env.state["pools"].open("p", POOL)


@case("pool_snapshot", setup=_pool(message=True), **P)
def _pool_snapshot(env: Env) -> Any:
    return env.state["pools"].snapshot("p")


@case("pool_record_created", setup=_pool(), **P)
def _pool_record_created(env: Env) -> Any:
    return env.state["pools"].record_created("p")


@case("pool_join", setup=_pool(joined=False), **P)
def _pool_join(env: Env) -> Any:
    return env.state["pools"].join("p", PoolMember("r2", ["work", "chat"], {"role": "b"}))


@case("pool_leave", setup=_pool(), **P)
def _pool_leave(env: Env) -> Any:
    return env.state["pools"].leave("p", "r1")


@case("pool_record_message", setup=_pool(), **P)
def _pool_record_message(env: Env) -> Any:
    return env.state["pools"].record_message("p", *_message(1))


@case("pool_record_wake", setup=_pool(), **P)
def _pool_record_wake(env: Env) -> Any:
    condition = WakeCondition("c1", "wk-1", run_id="r1", filter={"topic": "work"})
    return env.state["pools"].record_wake("p", condition, {"compiled": [1]}, WakeRegistration("c1", metadata={}))


@case("pool_next_event_sequence", setup=_pool(), **P)
def _pool_next_event_sequence(env: Env) -> Any:
    return env.state["pools"].next_event_sequence("p")


@case("pool_watch", setup=_pool(message=True), **P)
def _pool_watch(env: Env) -> Any:
    return env.state["pools"].watch("p")


@case("pool_get", setup=_pool(message=True), **P)
def _pool_get(env: Env) -> Any:
    return env.state["pools"].message_receipt("p", "idem-1")


def _pool_small(env: Env) -> None:
    env.state["pools"] = pools = env.make(PoolStore, AsyncPoolStore, page_size=2, max_messages=3, max_records=50)
    pools.open("p", POOL)
    # A value over 64 bytes: a hashtable, not a listpack, whose HSCAN returns it all at once. And 40 of
    # them: an HSCAN of COUNT 2 visits at most 21 buckets, and a table of 5 had 8, which the server's
    # random hash seed could lay out so that the first call read them all (1 of 40 fresh servers did).
    for i in range(40):
        pools.join("p", PoolMember(f"r{i}", ["work"], {"pad": "x" * 100}))
    for i in range(1, 5):
        pools.record_message("p", *_message(i))


@case("pool_snapshot", id="pool_snapshot-2nd-page", nth=2, setup=_pool_small, **P)
def _pool_snapshot_paged(env: Env) -> Any:
    return env.state["pools"].snapshot("p")


@case("pool_watch", id="pool_watch-2nd-page", nth=2, setup=_pool_small, **P)
def _pool_watch_paged(env: Env) -> Any:
    return env.state["pools"].watch("p")


@case("pool_record_message", id="pool_record_message-trims", setup=_pool_small, **P)
def _pool_record_message_trims(env: Env) -> Any:
    return env.state["pools"].record_message("p", *_message(9))


@case("pool_join", id="pool_join-replaces", setup=_pool(), **P)
def _pool_rejoin(env: Env) -> Any:
    return env.state["pools"].join("p", PoolMember("r1", ["other"], {"role": "c"}))


@case("pool_open", id="pool_open-again", setup=_pool(), changes=False, **P)
def _pool_open_again(env: Env) -> Any:
    return env.state["pools"].open("p", POOL)


# ---- the LangGraph saver ------------------------------------------------------------------------


def _saver(env: Env) -> Any:
    from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver

    return env.make(AgentStateSaver, AsyncAgentStateSaver)


def lg(env: Env, saver: Any, name: str, *a: Any, **k: Any) -> Any:
    """A saver method, sync or (an async saver's ``a<name>``) awaited; ``list`` collected."""
    if env.flavor == "async":
        method = getattr(saver.wrapped, "a" + name)
        return env.collect(method(*a, **k)) if name == "list" else env.wait(method(*a, **k))
    result = getattr(saver, name)(*a, **k)
    return list(result) if name == "list" else result


def lg_checkpoint(i: int) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["id"] = f"1f0c0000-0000-6000-8000-{i:012d}"
    cp["ts"] = f"2026-01-01T00:00:{i:02d}+00:00"
    cp["channel_values"] = {"log": [f"step {j}" for j in range(i + 1)], "blob": b"\x00" * i}
    cp["channel_versions"] = {"log": f"{i + 1:032d}.0", "blob": f"{i + 1:032d}.0"}
    cp["versions_seen"] = {"node": {"log": f"{i:032d}.0"}}
    return cp


def lg_config(tid: str, parent: int | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": tid, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = lg_checkpoint(parent)["id"]
    return {"configurable": conf}


def lg_put(env: Env, saver: Any, tid: str, i: int, run: str = "run-1") -> Any:
    cp = lg_checkpoint(i)
    return lg(env, saver, "put", lg_config(tid, i - 1 if i else None), cp,
              {"source": "loop", "step": i, "run_id": run}, dict(cp["channel_versions"]))  # fmt: skip


def _threads(n: int = 3) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        env.state["saver"] = saver = _saver(env)
        for i in range(n):
            lg_put(env, saver, "th", i, run=f"run-{i % 2}")
        lg(env, saver, "put_writes", {"configurable": {**lg_config("th", n - 1)["configurable"]}},
           [("log", "pending")], "task-1")  # fmt: skip

    return setup


def observe_saver(env: Env) -> Any:
    from redis_agentstate.langgraph import AgentStateSaver

    saver = AgentStateSaver(env.raw, namespace=env.namespace)
    return {tid: [(t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
                  for t in saver.list(lg_config(tid))] for tid in ("th", "copy")}  # fmt: skip


L = dict(observe=observe_saver)


@case("lg_put", setup=_threads(2), **L)
def _lg_put(env: Env) -> Any:
    return lg_put(env, env.state["saver"], "th", 2)


@case("lg_put_writes", setup=_threads(2), **L)
def _lg_put_writes(env: Env) -> Any:
    return lg(env, env.state["saver"], "put_writes", lg_config("th", 1), [("log", "w1"), ("blob", b"\x01")], "task-2")


@case("lg_get", setup=_threads(), **L)
def _lg_get(env: Env) -> Any:
    return lg(env, env.state["saver"], "get_tuple", lg_config("th"))


@case("lg_list", setup=_threads(), **L)
def _lg_list(env: Env) -> Any:
    return lg(env, env.state["saver"], "list", lg_config("th"))


@case("lg_delete_thread", setup=_threads(), **L)
def _lg_delete_thread(env: Env) -> Any:
    return lg(env, env.state["saver"], "delete_thread", "th")


@case("lg_delete_runs", setup=_threads(), **L)
def _lg_delete_runs(env: Env) -> Any:
    return lg(env, env.state["saver"], "delete_for_runs", ["run-1"])


@case("lg_prune", setup=_threads(), **L)
def _lg_prune(env: Env) -> Any:
    return lg(env, env.state["saver"], "prune", ["th"], strategy="keep_latest")


def _copy(env: Env) -> Any:
    return lg(env, env.state["saver"], "copy_thread", "th", "copy")


case("lg_dump", setup=_threads(), **L)(_copy)
case("lg_import", setup=_threads(), **L)(_copy)


def observe_lease(env: Env) -> Any:
    from redis_agentstate.langgraph import AgentStateSaver

    other = AgentStateSaver(env.raw, namespace=env.namespace)
    lease = other.lease("th", lease_ms=LEASE)
    try:
        lease.__enter__()
    except Exception as exc:  # ThreadBusy: the thread is held
        return {"other": exc, "saver": observe_saver(env)}
    lease.release()
    return {"other": "free", "saver": observe_saver(env)}


@case("lg_lease", setup=_threads(1), renews=True, observe=observe_lease)
def _lg_lease(env: Env) -> Any:
    lease = env.enter(env.state["saver"].lease("th", lease_ms=LEASE))
    env.state["lease"] = lease
    return lg_put(env, env.state["saver"], "th", 1)


def _lg_held(env: Env) -> None:
    _threads(1)(env)
    env.state["lease"] = env.state["saver"].lease("th", lease_ms=LEASE)
    env.wait(env.state["lease"].__aenter__() if env.flavor == "async" else env.state["lease"].__enter__())


@case("lg_release", setup=_lg_held, observe=observe_lease)
def _lg_release(env: Env) -> Any:
    lease = env.state["lease"]
    return env.wait(lease.release())


@case("lg_renew", setup=_threads(1), renews=True, observe=observe_lease)
def _lg_renew(env: Env) -> Any:
    # The keeper renews the lease a third of it in: wait for its first renewal (in the faulted run,
    # until the lost one was re-sent), then release.
    lease = env.enter(env.state["saver"].lease("th", lease_ms=3_000))
    loss: ReplyLoss | None = env.state.get("loss")
    deadline = time.monotonic() + (10.0 if loss else 1.0)
    while time.monotonic() < deadline and not (loss and loss.resent):
        env.wait(asyncio.sleep(0.05))
    lost = lease.lost
    env.close()  # released: what is left is the thread's data
    return {"lost": lost}


def _lg_leased(env: Env) -> None:
    _threads(2)(env)
    env.state["lease"] = env.enter(env.state["saver"].lease("th", lease_ms=LEASE))


@case("lg_put", id="lg_put-leased", setup=_lg_leased, observe=observe_lease)
def _lg_put_leased(env: Env) -> Any:
    return lg_put(env, env.state["saver"], "th", 2)


@case("lg_put_writes", id="lg_put_writes-leased", setup=_lg_leased, observe=observe_lease)
def _lg_put_writes_leased(env: Env) -> Any:
    return lg(env, env.state["saver"], "put_writes", lg_config("th", 1), [("log", "w2")], "task-3")


@case("lg_delete_thread", id="lg_delete_thread-leased", setup=_lg_leased, observe=observe_lease)
def _lg_delete_leased(env: Env) -> Any:
    return lg(env, env.state["saver"], "delete_thread", "th")


@case("lg_prune", id="lg_prune-delete", setup=_threads(), **L)
def _lg_prune_delete(env: Env) -> Any:
    return lg(env, env.state["saver"], "prune", ["th"], strategy="delete")


@case("lg_list", id="lg_list-every-thread", setup=_threads(), **L)
def _lg_list_all(env: Env) -> Any:
    return lg(env, env.state["saver"], "list", None)


# ---- the LangGraph run queue --------------------------------------------------------------------


def _queue(env: Env) -> Any:
    from redis_agentstate.langgraph import AsyncRunQueue, RunQueue

    env.state["queue"] = queue = env.make(RunQueue, AsyncRunQueue)
    return queue


def _runs(pending: int = 1, ended: bool = False) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        queue = _queue(env)
        runs = env.state["runs"] = [
            queue.create("th", {"log": [f"in {i}"]}, multitask_strategy="enqueue", stream_mode=["values", "custom"])
            for i in range(pending)
        ]
        if ended:
            assert queue.cancel(runs[0].run_id)

    return setup


def observe_runs(env: Env) -> Any:
    from redis_agentstate.langgraph import AgentStateSaver, RunQueue

    queue = RunQueue(env.raw, namespace=env.namespace)
    # In the order they were created (their inputs differ): two runs of one millisecond list in
    # the order of their random ids.
    runs = sorted(queue.list("th"), key=lambda r: repr(r.input))
    events = [[(e.event, e.data) for e in queue.stream(r.run_id, block_ms=1)] for r in runs]
    tasks = CheckpointStore(env.raw, namespace=queue.queue_namespace)
    saver = AgentStateSaver(env.raw, namespace=env.namespace)
    checkpoints = [(t.checkpoint["channel_values"], t.metadata.get("step"), t.metadata.get("source"))
                   for t in saver.list(lg_config("th"))]  # fmt: skip
    return {"runs": runs, "events": events, "threads": [tasks.load(t) for t in tasks.list()],
            "checkpoints": checkpoints}  # fmt: skip


R = dict(observe=observe_runs)


def _run_create(env: Env) -> Any:
    return env.state["queue"].create("th", {"log": ["new"]}, multitask_strategy="enqueue", stream_mode="values")


case("lg_run_create", setup=_runs(1), **R)(_run_create)
case("lg_run_index", setup=_runs(1), **R)(_run_create)


def _worker_turn(env: Env) -> Any:
    import lg_run_graphs as graphs

    from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver, GraphWorker

    queue = env.state["queue"]
    saver = env.make(AgentStateSaver, AsyncAgentStateSaver)
    inner = getattr(queue, "wrapped", queue)
    worker = GraphWorker(graphs.steps, inner, getattr(saver, "wrapped", saver), name="w1", lease_ms=LEASE)
    turn = worker.arun_once(block_ms=None) if env.flavor == "async" else worker.run_once(block_ms=None)
    return {"ran": env.wait(turn), "finished": worker.finished}


for _name in (lg_scripts.LG_RUN_BEGIN, lg_scripts.LG_RUN_EMIT, lg_scripts.LG_RUN_FINISH, lg_scripts.LG_RUN_WAKE):
    case(_name, setup=_runs(1), opaque=rb"^NS:\{NS#[0-9]+\}:lg", **R)(_worker_turn)
# A node's events, not the run's first (its metadata, sent by begin's worker before the graph runs).
for _n in (2, 3):
    case(lg_scripts.LG_RUN_EMIT, id=f"lg_run_emit-{_n}", nth=_n, setup=_runs(1), opaque=rb"^NS:\{NS#[0-9]+\}:lg", **R)(
        _worker_turn
    )


@case("lg_run_cancel", setup=_runs(2), **R)
def _run_cancel(env: Env) -> Any:
    return env.state["queue"].cancel(env.state["runs"][0].run_id)


@case("lg_run_delete", setup=_runs(2, ended=True), **R)
def _run_delete(env: Env) -> Any:
    return env.state["queue"].delete(env.state["runs"][0].run_id)


# ---- the LangGraph store ------------------------------------------------------------------------


def _st(env: Env, name: str, *args: Any, **kw: Any) -> Any:
    """``store.<name>`` of the case's store (its ``a``-method for the async flavor), items as plain
    tuples with ISO times (which the masks reach)."""
    store = env.state["store"]
    return _plain(env.wait(getattr(store, ("a" + name) if env.flavor == "async" else name)(*args, **kw)))


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "created_at") and hasattr(value, "key"):
        times = (value.created_at.isoformat(), value.updated_at.isoformat())
        return (tuple(value.namespace), value.key, value.value, *times, getattr(value, "score", None))
    return value


def _items(ttl: Any = None) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        from redis_agentstate.langgraph import AgentStateStore, AsyncAgentStateStore

        env.state["store"] = env.make(AgentStateStore, AsyncAgentStateStore, ttl=ttl)
        for ns, key in [(("u", "1"), "a"), (("u", "1"), "b"), (("u", "2"), "c")]:
            _st(env, "put", ns, key, {"key": key, "n": ord(key)})

    return setup


def observe_store(env: Env) -> Any:
    from redis_agentstate.langgraph import AgentStateStore

    store = AgentStateStore(env.raw, env.namespace)
    found = [(tuple(i.namespace), i.key, i.value) for i in store.search((), limit=100)]
    return {"items": found, "namespaces": store.list_namespaces()}


@case("lgs_put", setup=_items(), observe=observe_store)
def _lgs_put(env: Env) -> Any:
    from langgraph.store.base import PutOp

    ops = [PutOp(("u", "1"), "a", {"new": 1}), PutOp(("u", "3"), "d", {"n": 4}), PutOp(("u", "2"), "c", None)]
    return _st(env, "batch", ops)


@case("lgs_put", id="lgs_put-delete-last", setup=_items(), observe=observe_store)
def _lgs_delete(env: Env) -> Any:
    return _st(env, "delete", ("u", "2"), "c")


@case("lgs_get", setup=_items(), changes=False, observe=observe_store)
def _lgs_get(env: Env) -> Any:
    return _st(env, "get", ("u", "1"), "b")


@case("lgs_get", id="lgs_get-refresh-ttl", setup=_items({"default_ttl": 60}), renews=True, observe=observe_store)
def _lgs_get_refresh(env: Env) -> Any:
    time.sleep(0.005)  # the refreshed expiry is later than the one the put wrote
    return _st(env, "get", ("u", "1"), "b")


@case("lgs_search", setup=_items(), observe=observe_store)
def _lgs_search(env: Env) -> Any:
    return _st(env, "search", ("u",), filter={"n": {"$gte": 98}})


@case("lgs_namespaces", setup=_items(), observe=observe_store)
def _lgs_namespaces(env: Env) -> Any:
    return _st(env, "list_namespaces", prefix=("u",))


# The second lgs_namespaces call of a prefix listing: the paths of other shards, checked in their own.
@case("lgs_namespaces", id="lgs_namespaces-check", nth=2, setup=_items(), observe=observe_store)
def _lgs_namespaces_check(env: Env) -> Any:
    return _st(env, "list_namespaces", prefix=("u",))


@case("lgs_prefix", setup=_items(), observe=observe_store)
def _lgs_prefix(env: Env) -> Any:
    return _st(env, "search", ("u", "1"), filter={"n": {"$gte": 98}})


# A new namespace is listed in its prefix's shard; a namespace emptied, unlisted there.
@case("lgs_index", setup=_items(), observe=observe_store)
def _lgs_index(env: Env) -> Any:
    return _st(env, "put", ("u", "9"), "z", {"n": 9})


@case("lgs_index", id="lgs_index-unlist", setup=_items(), observe=observe_store)
def _lgs_index_unlist(env: Env) -> Any:
    return _st(env, "delete", ("u", "2"), "c")


# The vector index of a namespace (_store_ann.py): the 4th vector trains it (lgs_train 'train', then
# lgs_assign moving the first three, then lgs_train 'finish'); a search above the exact limit counts
# (lgs_count) and reads the nearest lists (lgs_probe). Its k-means is deterministic on the same vectors.
def _indexed(count: int) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        from redis_agentstate.langgraph import AgentStateStore, AsyncAgentStateStore

        index = {"dims": 2, "embed": lambda texts: [[1.0, float(len(t))] for t in texts], "fields": ["t"]}
        store = env.state["store"] = env.make(AgentStateStore, AsyncAgentStateStore, index=index)
        store._core.ann.index_at = 4
        store._core.max_exact = 2
        for i in range(count):
            _st(env, "put", ("d",), f"k{i}", {"t": "x" * (i + 1)})

    return setup


def _train(env: Env) -> Any:
    return _st(env, "put", ("d",), "k3", {"t": "xxxx"})


def _near(env: Env) -> Any:
    return _st(env, "search", ("d",), query="xx", limit=3)


case("lgs_train", setup=_indexed(3), observe=observe_store)(_train)
case("lgs_train", id="lgs_train-finish", nth=2, setup=_indexed(3), observe=observe_store)(_train)
case("lgs_assign", setup=_indexed(3), renews=True, observe=observe_store)(_train)
case("lgs_count", setup=_indexed(4), changes=False, observe=observe_store)(_near)
case("lgs_probe", setup=_indexed(4), changes=False, observe=observe_store)(_near)


# A search from the client's cache of vectors (_store_cache.py): the first scans the namespace
# (lgs_scan), then reads the items it picked where the write version is the one scanned (lgs_pick,
# refreshing their TTL when the store's ttl config asks).
def _cached(ttl: Any = None) -> Callable[[Env], Any]:
    def setup(env: Env) -> None:
        from redis_agentstate.langgraph import AgentStateStore, AsyncAgentStateStore

        index = {"dims": 2, "embed": lambda texts: [[1.0, float(len(t))] for t in texts], "fields": ["t"]}
        env.state["store"] = env.make(AgentStateStore, AsyncAgentStateStore, index=index, ttl=ttl)
        for i in range(4):
            _st(env, "put", ("d",), f"k{i}", {"t": "x" * (i + 1)})

    return setup


def _cached_search(env: Env) -> Any:
    time.sleep(0.005)  # a refreshed expiry is later than the one the put wrote
    return _st(env, "search", ("d",), query="xx", limit=2, offset=1)


case("lgs_scan", setup=_cached(), changes=False, observe=observe_store)(_cached_search)
case("lgs_pick", setup=_cached(), changes=False, observe=observe_store)(_cached_search)
case("lgs_pick", id="lgs_pick-refresh-ttl", setup=_cached({"default_ttl": 60}), renews=True, observe=observe_store)(
    _cached_search
)


# ---- cron schedules (agentstate serve) ------------------------------------------------------------

_T0 = 1_700_000_000_000


def _crons(env: Env) -> None:
    from redis_agentstate.langgraph.crons import AsyncCronStore, CronStore

    env.state["crons"] = env.make(CronStore, AsyncCronStore)
    for i in (1, 2):
        env.wait(env.state["crons"].create(f"c{i}", {"schedule": "* * * * *", "n": i}, due_ms=_T0 + i * 60_000,
                                           created_ms=_T0 + i))  # fmt: skip


def observe_crons(env: Env) -> Any:
    from redis_agentstate.langgraph.crons import CronStore

    crons = CronStore(env.raw, env.namespace)
    return {"crons": crons.every(), "due": crons.due(_T0 + 10 * 60_000)}


@case("cron_put", setup=_crons, observe=observe_crons)
def _cron_create(env: Env) -> Any:
    return env.wait(env.state["crons"].create("c3", {"schedule": "0 * * * *"}, due_ms=_T0 + 3_600_000,
                                              created_ms=_T0 + 3))  # fmt: skip


@case("cron_put", id="cron_put-update", setup=_crons, observe=observe_crons)
def _cron_update(env: Env) -> Any:
    return env.wait(env.state["crons"].update("c1", {"schedule": "*/5 * * * *", "n": 1}, due_ms=_T0 + 300_000))


@case("cron_advance", setup=_crons, observe=observe_crons)
def _cron_advance(env: Env) -> Any:
    return env.wait(env.state["crons"].advance("c1", _T0 + 60_000, _T0 + 120_000))


@case("cron_advance", id="cron_advance-ended", setup=_crons, observe=observe_crons)
def _cron_advance_ended(env: Env) -> Any:
    return env.wait(env.state["crons"].advance("c2", _T0 + 120_000, None))


@case("cron_delete", setup=_crons, observe=observe_crons)
def _cron_delete(env: Env) -> Any:
    return env.wait(env.state["crons"].delete("c1"))


# ---- the test -----------------------------------------------------------------------------------


def test_every_shipped_script_has_a_case() -> None:
    """The scripts come from the package: a new script cannot land without its re-send case."""
    shipped = shipped_scripts()
    assert shipped, "no scripts found in the package"
    assert sorted({c.script for c in CASES.values()}) == shipped
    # Every script is declared a read or a write (wire/scripts.py), and each case knows which it is.
    assert sorted(scripts.READS | scripts.WRITES) == shipped
    assert not scripts.READS & scripts.WRITES


Outcome = tuple[Any, Any, Any, ReplyLoss | None, Any]


def run_scenario(c: Case, env: Env, monkeypatch: pytest.MonkeyPatch | None) -> Outcome:
    """Setup, then act (with ``c.script``'s reply lost when ``monkeypatch`` is given), then observe."""
    # LangGraph channel versions end with a random suffix: drawn alike in both runs.
    import redis_agentstate.langgraph._put as put

    with pytest.MonkeyPatch.context() as m:
        m.setattr(put, "random", random.Random(38))
        return _run_scenario(c, env, monkeypatch)


def _run_scenario(c: Case, env: Env, monkeypatch: pytest.MonkeyPatch | None) -> Outcome:
    loss = None
    try:
        c.setup(env)
        if monkeypatch is None:
            try:
                result: Any = c.act(env)
            except Exception as exc:  # an error the call raises must be the faulted run's, too
                result = exc
        else:
            env.state["before"] = key_dump(env.raw, env.namespace)
            with monkeypatch.context() as m:
                loss = lose_reply(m, c.script, nth=c.nth, snapshot=lambda: key_dump(env.raw, env.namespace))
                env.state["loss"] = loss
                try:
                    result = c.act(env)
                except Exception as exc:  # compared with the twin's outcome: an error must be the same one
                    result = exc
        observed = c.observe(env) if c.observe else None
    finally:
        env.close()
    return result, observed, key_dump(env.raw, env.namespace), loss, env.state.get("before")


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resent_script_acts_once(
    name: str,
    backend: Any,
    flavor: str,
    namespace: str,
    raw: Any,
    twin_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = CASES[name]
    if name == "lg_run_emit-3" and flavor == "async" and sys.version_info < (3, 11):
        # LangGraph's async context needs 3.11: there the steps graph fails at its first custom event
        # ("Called get_config outside of a runnable context"), so its run sends two emits, not three.
        pytest.skip("the steps graph's custom events need Python 3.11 under asyncio (LangGraph)")
    twin_ns, faulted_ns = f"{namespace}-1", f"{namespace}-2"
    twin = run_scenario(c, Env(backend, flavor, twin_loop, twin_ns, raw), None)
    got = run_scenario(c, Env(backend, flavor, twin_loop, faulted_ns, raw), monkeypatch)
    loss = got[3]
    assert loss is not None
    assert loss.lost is not None, f"{c.script} was not called {c.nth} time(s) by the case: {loss.calls}"
    assert loss.resent is not None, f"the library did not re-send {c.script} after its reply was lost: {loss.calls}"

    def own(dump: Any, masks: Masks) -> list[Any]:
        """``dump`` less the keys the case leaves out (a graph's own writes, made beside the call)."""
        return [e for e in dump if not (c.opaque and re.search(c.opaque, masks(e[0])))]

    # The case sends the script as it means to: a read finds the state as it was and writes
    # nothing, and a re-sent read answers the same; a write changes the state (it applied).
    masks = Masks(faulted_ns)
    before, after_lost, after_resent = (own(d, masks) for d in (got[4], loss.after_lost, loss.after_resent))
    if c.script in scripts.READS:
        assert after_lost == before, "a read changed the state"
        # (the server clock a reply carries, as summary's, masked)
        assert masks(loss.resent_reply) == masks(loss.lost_reply), "a re-sent read answered otherwise"
    else:
        assert c.script in scripts.WRITES
        assert (after_lost != before) == c.changes, f"the case's {c.script} wrote nothing: it does not show a re-send"
    # The re-send wrote nothing (a renewal only moved server-clock expiries).
    if c.renews:
        assert masks(after_resent) == masks(after_lost), "the re-send changed more than expiries"
    else:
        assert after_resent == after_lost, "the re-send changed the state"
    # What the caller got, what the readers answer and every key: as after one execution.
    twin_masks = Masks(twin_ns)
    assert masks(got[0]) == twin_masks(twin[0]), "the public call returned another value"
    assert masks(got[1]) == twin_masks(twin[1]), "the readers answer otherwise"

    def compared(dump: Any, masks: Masks) -> list[str]:
        # A reshard's probe key expires a second after it is written (core.reshard._probe): whether a
        # dump still finds it is a matter of how long each run took (CI: in one run, not the twin).
        kept = [e for e in own(dump, masks) if not e[0].endswith(b":reshard-probe")]
        return sorted(repr(e) for e in masks(kept))

    assert compared(got[2], masks) == compared(twin[2], twin_masks), "the stored keys differ"


# ---- what the re-send test found (issue 38's closing note): each fix's focused regression test -----


@pytest.fixture
def env(backend: Any, flavor: str, namespace: str, raw: Any, twin_loop: asyncio.AbstractEventLoop) -> Any:
    e = Env(backend, flavor, twin_loop, namespace, raw)
    yield e
    e.close()


def test_a_thread_lease_release_resent_after_a_lost_reply_answers_true(env: Env, monkeypatch: pytest.MonkeyPatch):
    """lg_release: the re-send found the lease gone and answered REFUSED, so ``release()`` said
    False ("not ours any more") for a release that had applied."""
    from redis_agentstate.langgraph import AgentStateSaver

    saver = _saver(env)
    lease = saver.lease("th", lease_ms=LEASE)
    env.wait(lease.__aenter__() if env.flavor == "async" else lease.__enter__())
    loss = lose_reply(monkeypatch, "lg_release")
    assert env.wait(lease.release()) is True
    assert loss.resent is not None
    monkeypatch.undo()
    # The thread is free: another writer leases it at once, and its own release is its own.
    other = AgentStateSaver(env.raw, namespace=env.namespace)
    with other.lease("th", lease_ms=LEASE, wait_ms=0) as taken:
        cp = lg_checkpoint(0)
        other.put(lg_config("th"), cp, {"step": 0}, dict(cp["channel_versions"]))
        assert env.wait(lease.release()) is False  # the first holder's release, again: not its lease now
    assert taken.release() is False  # released on exit already


def test_copy_thread_resent_after_a_lost_reply_copies_once(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """lg_import: the re-send met the copy it had made and refused it as 'exists' (InvalidArgument)."""
    from redis_agentstate import InvalidArgument

    _threads()(env)
    saver = env.state["saver"]
    loss = lose_reply(monkeypatch, "lg_import")
    assert lg(env, saver, "copy_thread", "th", "copy") is None
    assert loss.resent is not None and loss.after_resent == loss.after_lost
    monkeypatch.undo()

    def ids(tid: str) -> list[Any]:
        return [(t.checkpoint["id"], t.pending_writes) for t in lg(env, saver, "list", lg_config(tid))]

    assert ids("copy") == ids("th") and len(ids("copy")) == 3
    # A target with a history of its own is still refused, nothing written.
    lg_put(env, saver, "own", 0)
    with pytest.raises(InvalidArgument, match="already has checkpoints"):
        lg(env, saver, "copy_thread", "th", "own")
    assert len(ids("own")) == 1


def test_next_event_sequence_resent_after_a_lost_reply_gets_its_number_again(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pool_next_event_sequence: the re-send incremented the counter again (1 was never given, 2 was)."""
    pools = env.make(PoolStore, AsyncPoolStore)
    pools.open("p", POOL)
    loss = lose_reply(monkeypatch, "pool_next_event_sequence")
    assert pools.next_event_sequence("p") == 1
    assert loss.resent is not None
    monkeypatch.undo()
    assert [pools.next_event_sequence("p") for _ in range(20)] == list(range(2, 22))
    # The numbers given are remembered for the latest 16 calls only.
    kept = env.raw.hget(getattr(pools, "wrapped", pools)._core.keys.pool("p").state, "evtids")
    assert kept.count(b";") == 16
