"""Corrupt LangGraph saver records (issue 19, items 1 and 2).

A thread's keys are planted, with plain Redis commands, with what the saver never writes:
length prefixes that are negative, too long or not numbers (``-3:``), truncated or random
bytes, serialized values of the wrong shape or an unknown serializer (``pickle``), index and
run members without their separator, keys of another Redis type. Every saver call must then
answer with a ``CorruptState`` naming the key (and write nothing: the DUMP of every key of the
namespace is the same after the call) or with a correct result; never loop, never block
Redis (another client's PING answers within 100 ms while the call runs), never raise
anything else (a ``BackendError`` carrying a Lua error, a raw ``ValueError``...).

The real server is a private redis-server with ``busy-reply-threshold`` at 50 ms, so a
script that loops answers BUSY to the PINGs at once; every call runs under a deadline (a
client socket timeout, SIGALRM for a Python loop, ``faulthandler`` as the last resort for a
loop in fakeredis' embedded Lua), so a regression fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import msgpack
import pytest
import redis
import redis.asyncio as aioredis
from conftest import RedisServerProcess
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from redis_agentstate import CheckpointStore, CorruptState, RetryPolicy
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver

SEP = b"\0"
#: A call this long is a hang (every call here takes milliseconds).
CALL_DEADLINE_S = 8.0
#: Another client's PING must answer within this while a call runs.
PING_BOUND_S = 0.1


# ---- the servers, and the guards against a hang -------------------------------------------------


class Hung(Exception):
    """A call ran past its deadline (SIGALRM): a loop in Python."""


@contextmanager
def deadline(seconds: float = CALL_DEADLINE_S) -> Iterator[None]:
    """Raise ``Hung`` in the caller after ``seconds``; kill the process (with a traceback) after 4x.

    SIGALRM ends a loop in Python code; a loop inside fakeredis' Lua (C code, which never
    returns to the interpreter) is ended by faulthandler, which fails the run loudly.
    """

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hung(f"the call ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds * 4, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


@dataclass
class PingWatch:
    """PINGs another connection sends in a thread while a call runs: the slowest, and any error."""

    worst: float = 0.0
    errors: list[str] = field(default_factory=list)


@dataclass
class Target:
    """A backend for the saver: fakeredis, or the module's private redis-server."""

    kind: str
    server: Any  # fakeredis.FakeServer or RedisServerProcess

    def sync_client(self) -> Any:
        if self.kind == "fake":
            return fakeredis.FakeRedis(server=self.server)
        return redis.Redis(port=self.server.port, socket_timeout=CALL_DEADLINE_S / 2)

    def async_client(self) -> Any:
        if self.kind == "fake":
            return fakeredis.FakeAsyncRedis(server=self.server)
        return aioredis.Redis(port=self.server.port, socket_timeout=CALL_DEADLINE_S / 2)

    @contextmanager
    def pings(self) -> Iterator[PingWatch]:
        watch = PingWatch()
        client = self.sync_client()
        client.ping()
        stop = threading.Event()

        def run() -> None:
            while True:
                sent = time.perf_counter()
                try:
                    client.ping()
                except Exception as exc:  # BUSY, a timeout: Redis is blocked
                    watch.errors.append(repr(exc))
                watch.worst = max(watch.worst, time.perf_counter() - sent)
                if stop.wait(0.002):
                    return

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield watch
        finally:
            stop.set()
            thread.join(CALL_DEADLINE_S)
            client.close()

    def recover(self) -> None:
        """After a hang: end the script (SCRIPT KILL), or the server if the script wrote."""
        if self.kind == "fake":
            return
        with redis.Redis(port=self.server.port, socket_timeout=2) as c:
            try:
                c.script_kill()
            except redis.ResponseError:
                pass
            except redis.RedisError:
                pass
            try:
                c.ping()
                return
            except redis.RedisError:
                pass
        self.server.proc.kill()
        self.server.proc.wait()
        self.server = RedisServerProcess.start(*GUARDED_ARGS)


GUARDED_ARGS = ("--busy-reply-threshold", "50")


@pytest.fixture(scope="module")
def guarded_server() -> Iterator[list[RedisServerProcess]]:
    try:
        server = RedisServerProcess.start(*GUARDED_ARGS)
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        pytest.skip(f"no redis-server: {exc}")
    holder = [server]
    yield holder
    holder[0].stop()


@pytest.fixture(params=[pytest.param("fake", marks=pytest.mark.fakeredis), "real"])
def target(request: pytest.FixtureRequest, guarded_server: list[RedisServerProcess]) -> Iterator[Target]:
    if request.param == "fake":
        yield Target("fake", fakeredis.FakeServer())
        return
    t = Target("real", guarded_server[0])
    t.sync_client().flushall()
    yield t
    guarded_server[0] = t.server  # recover() may have started another


# ---- a thread with everything the saver stores ---------------------------------------------------

NS = "lgc"
NO_RETRY = RetryPolicy(attempts=1)


def _ns_dump(raw: Any) -> dict[bytes, Any]:
    return {k: (raw.type(k), raw.dump(k)) for k in sorted(raw.scan_iter(match=Keys(NS).pattern() + "*", count=1000))}


def _restore(raw: Any, dump: dict[bytes, Any]) -> None:
    for k in list(raw.scan_iter(match=Keys(NS).pattern() + "*", count=1000)):
        raw.delete(k)
    for k, (_, data) in dump.items():
        raw.restore(k, 0, data)


@dataclass
class Built:
    """The configs of the thread ``t`` the fuzz corrupts (and of ``u``, another thread of run r1)."""

    latest: dict[str, Any]
    older: dict[str, Any]
    sub: dict[str, Any]


def build(saver: AgentStateSaver) -> Built:
    """Thread t: a chain in the root namespace (list tails, pending writes, two runs) and one in 'sub'."""
    cfg: dict[str, Any] = generate_config("t")
    msgs: list[str] = []
    configs = []
    for step in range(4):
        msgs = [*msgs, f"m{step}", f"n{step}"]
        version = f"{step + 1:03d}"
        cp = generate_checkpoint(
            channel_values={"msgs": msgs, "n": step},
            channel_versions={"msgs": version, "n": version},
        )
        md = generate_metadata(step=step, run_id=f"r{step % 2 + 1}")
        if step == 3:
            md["counters_since_delta_snapshot"] = {"msgs": [1, 2]}
        cfg = saver.put(cfg, cp, md, {"msgs": version, "n": version})
        configs.append(cfg)
    saver.put_writes(configs[1], [("msgs", ["w"]), ("n", 9)], "task-a")
    saver.put_writes(configs[3], [("msgs", ["x"]), ("__error__", "boom")], "task-b")
    sub: dict[str, Any] = generate_config("t", checkpoint_ns="sub")
    for step in range(2):
        cp = generate_checkpoint(channel_values={"x": step}, channel_versions={"x": f"{step + 1:03d}"})
        sub = saver.put(sub, cp, generate_metadata(step=step, run_id="r1"), {"x": f"{step + 1:03d}"})
    cp = generate_checkpoint(channel_values={"y": [1]}, channel_versions={"y": "001"})
    saver.put(generate_config("u"), cp, generate_metadata(run_id="r1"), {"y": "001"})
    return Built(configs[3], configs[1], sub)


def _next_checkpoint(built: Built) -> tuple[Any, ...]:
    msgs = [x for s in range(5) for x in (f"m{s}", f"n{s}")]
    cp = generate_checkpoint(channel_values={"msgs": msgs, "n": 4}, channel_versions={"msgs": "005", "n": "005"})
    return built.latest, cp, generate_metadata(step=4, run_id="r3"), {"msgs": "005", "n": "005"}


#: Every saver call the fuzz makes on the corrupted thread: name -> call(saver, built).
OPS: dict[str, Callable[[Any, Built], Any]] = {
    "get_tuple": lambda s, b: s.get_tuple(generate_config("t")),
    "get_tuple_older": lambda s, b: s.get_tuple(b.older),
    "get_tuple_sub": lambda s, b: s.get_tuple(generate_config("t", checkpoint_ns="sub")),
    "list_thread": lambda s, b: list(s.list(generate_config("t"))),
    "list_filtered": lambda s, b: list(s.list(generate_config("t"), filter={"run_id": "r2"})),
    "list_all": lambda s, b: list(s.list(None)),
    "put": lambda s, b: s.put(*_next_checkpoint(b)),
    "put_writes": lambda s, b: s.put_writes(b.latest, [("msgs", ["z"])], "task-c"),
    "put_writes_again": lambda s, b: s.put_writes(b.latest, [("msgs", ["x"])], "task-b"),
    "delete_for_runs": lambda s, b: s.delete_for_runs(["r1"]),
    "copy_thread": lambda s, b: s.copy_thread("t", "t-copy"),
    "prune": lambda s, b: s.prune(["t"]),
    "prune_delete": lambda s, b: s.prune(["t"], strategy="delete"),
    "delete_thread": lambda s, b: s.delete_thread("t"),
}


def _well_formed(result: Any) -> bool:
    """A successful call's result has the shape LangGraph relies on."""
    tuples = result if isinstance(result, list) else [result] if isinstance(result, CheckpointTuple) else []
    for t in tuples:
        if not isinstance(t, CheckpointTuple) or not isinstance(t.checkpoint, dict):
            return False
        if not isinstance(t.checkpoint.get("channel_values"), dict) or not isinstance(t.metadata, dict):
            return False
        if not all(isinstance(w, tuple) and len(w) == 3 for w in t.pending_writes or []):
            return False
    return True


class Harness:
    """Runs saver calls on one target under the guards, and checks what each call did."""

    def __init__(self, target: Target, flavor: str) -> None:
        self.target = target
        self.flavor = flavor
        self.raw = target.sync_client()
        self.loop = asyncio.new_event_loop()
        self.keys = Keys(NS).thread("t")
        self.failures: list[str] = []

    def close(self) -> None:
        self.loop.close()

    def saver(self) -> Any:
        """A new saver (no list cache): sync, or the async one driven through its sync face... as LangGraph's
        async graphs would call it, by awaiting its a-methods on our loop."""
        if self.flavor == "sync":
            return AgentStateSaver(self.target.sync_client(), namespace=NS, retry=NO_RETRY)
        return _AsyncFace(
            AsyncAgentStateSaver(self.target.async_client(), namespace=NS, retry=NO_RETRY), self.loop
        )

    def run(self, label: str, op: Callable[[], Any]) -> Any:
        """Run ``op``; record a failure unless it succeeded or raised CorruptState with nothing written."""
        before = _ns_dump(self.raw)
        outcome: Any = None
        for attempt in range(2):
            err: BaseException | None = None
            started = time.perf_counter()
            with self.target.pings() as watch:
                try:
                    with deadline():
                        outcome = op()
                except BaseException as exc:
                    err = exc
            took = time.perf_counter() - started
            if isinstance(err, Hung) or watch.errors or took > CALL_DEADLINE_S / 2:
                self.target.recover()
                self.raw = self.target.sync_client()
                self.failures.append(f"{label}: hung or blocked Redis ({took:.1f} s; {err!r}; pings {watch.errors[:1]})")
                return None
            if watch.worst <= PING_BOUND_S:
                break
            if attempt == 1:  # slow twice: not the machine's load
                self.failures.append(f"{label}: another client's PING took {watch.worst * 1000:.0f} ms")
            else:
                _restore(self.raw, before)
        if err is None:
            if not _well_formed(outcome):
                self.failures.append(f"{label}: returned a malformed result {outcome!r:.200}")
            return outcome
        if not isinstance(err, CorruptState):
            self.failures.append(f"{label}: raised {type(err).__name__}: {err}"[:400])
            return None
        after = _ns_dump(self.raw)
        if after != before:
            changed = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
            self.failures.append(f"{label}: CorruptState after a partial write to {changed}")
        if not isinstance(err.key, str) or not err.key.startswith(NS + ":"):
            self.failures.append(f"{label}: CorruptState names no key of the namespace: {err.key!r}")
        return err


class _AsyncFace:
    """The async saver's a-methods, run to completion on a private loop (as ``ainvoke`` awaits them)."""

    def __init__(self, saver: AsyncAgentStateSaver, loop: asyncio.AbstractEventLoop) -> None:
        self.saver, self.loop = saver, loop

    def list(self, *a: Any, **k: Any) -> list[Any]:
        async def collect() -> list[Any]:
            return [t async for t in self.saver.alist(*a, **k)]

        return self.loop.run_until_complete(collect())

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.saver, "a" + name)
        return lambda *a, **k: self.loop.run_until_complete(method(*a, **k))


@pytest.fixture(params=["sync", "async"])
def harness(request: pytest.FixtureRequest, target: Target) -> Iterator[Harness]:
    h = Harness(target, request.param)
    yield h
    h.close()


def _setup(h: Harness) -> Built:
    h.raw.flushall()
    return build(AgentStateSaver(h.target.sync_client(), namespace=NS))


def _record_of(h: Harness, built: Built) -> tuple[bytes, bytes]:
    member = ("\0" + built.latest["configurable"]["checkpoint_id"]).encode()
    return member, h.raw.hget(h.keys.records, member)


# ---- item 1: the hang ------------------------------------------------------------------------------


def _with_field_length(stored: bytes, token: bytes) -> bytes:
    """``stored`` with its first blob field's length prefix replaced by ``token`` (the outer prefix kept right)."""
    colon = stored.index(b":")
    n = int(stored[:colon])
    reads, rest = stored[colon + 1 : colon + 1 + n], stored[colon + 1 + n :]
    inner = reads.index(b":")
    reads = token + reads[inner:]
    return b"%d:" % len(reads) + reads + rest


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_negative_blob_field_length_is_corrupt_state_not_a_hang(harness: Harness, op: str) -> None:
    """The issue's record: a blob-field list reading '-3:' looped the scripts' parser for ever."""
    built = _setup(harness)
    member, stored = _record_of(harness, built)
    harness.raw.hset(harness.keys.records, member, _with_field_length(stored, b"-3"))
    got = harness.run(op, lambda: OPS[op](harness.saver(), built))
    assert not harness.failures, harness.failures
    if op in ("get_tuple", "list_thread", "prune", "delete_for_runs"):
        assert isinstance(got, CorruptState) and got.key == harness.keys.records, got


@pytest.mark.parametrize("op", ["get_tuple", "list_thread", "put_writes", "put_writes_again"])
def test_a_negative_pending_write_length_is_corrupt_state_not_a_hang(harness: Harness, op: str) -> None:
    """The same value in a checkpoint's pending writes looped the client's parser (and put_writes' script)."""
    built = _setup(harness)
    member, _ = _record_of(harness, built)
    packed = harness.raw.hget(harness.keys.writes, member)
    harness.raw.hset(harness.keys.writes, member, b"-3:" + packed.split(b":", 1)[1])
    got = harness.run(op, lambda: OPS[op](harness.saver(), built))
    assert not harness.failures, harness.failures
    assert isinstance(got, CorruptState) and got.key == harness.keys.writes, got


# ---- item 2: the shard's history-epoch counter ------------------------------------------------------


@pytest.mark.parametrize("value", [b"not a number", b"1e400", b"-", b"99999999999999999999", b"2.5"])
def test_a_shard_gen_counter_that_is_not_an_integer_does_not_break_other_tasks(
    target: Target, value: bytes
) -> None:
    """``gen`` is shared by a shard's tasks: one value INCR refuses used to fail every create there."""
    from redis_agentstate import Checkpoint

    raw = target.sync_client()
    raw.flushall()
    store = CheckpointStore(target.sync_client(), namespace=NS, retry=NO_RETRY)
    assert store.create(Checkpoint("a", status="running", messages=["m"]))
    other = next(f"b{i}" for i in range(10_000) if Keys.shard_of(f"b{i}") == Keys.shard_of("a"))
    gen = Keys(NS).task("a").gen
    epoch = raw.hget(Keys(NS).task("a").checkpoint, "epoch")
    raw.set(gen, value)
    assert store.create(Checkpoint(other, status="running", messages=["m1", "m2"]))
    got = store.load(other)
    assert got is not None and got.messages == ["m1", "m2"]
    assert int(raw.get(gen)) > 0  # recovered: the next rewrite counts on from it
    assert raw.hget(Keys(NS).task(other).checkpoint, "epoch") != epoch
    assert store.load("a") is not None
