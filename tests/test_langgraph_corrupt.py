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
loop in fakeredis' embedded Lua), so a regression fails the test instead of hanging it. A
PING over 100 ms (without BUSY) is measured once more on the same data before it counts:
a loaded machine can stall the pinging thread, a script that blocks Redis stalls it twice.
The fuzz is seeded (``FUZZ_CASES`` plantings per backend and flavor, each met by every
saver call), so a failure names a case that replays.
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
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from redis_agentstate import CheckpointStore, CorruptState, RetryPolicy
from redis_agentstate.keys import Keys, shard_of
from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver
from redis_agentstate.langgraph._records import _held_writes

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

    armed = [True]

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:  # a handler Python runs late, after the block, must not fail what follows
            raise Hung(f"the call ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds * 4, exit=True)
    try:
        yield
    finally:
        armed[0] = False
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


def _content(raw: Any, key: bytes) -> Any:
    """What ``key`` holds, by value (a hash's DUMP changes with its table's order, which a read may rehash)."""
    kind = raw.type(key)
    if kind == b"hash":
        return kind, raw.hgetall(key)
    if kind == b"zset":
        return kind, raw.zrange(key, 0, -1, withscores=True)
    if kind == b"list":
        return kind, raw.lrange(key, 0, -1)
    return kind, raw.dump(key)


def _ns_dump(raw: Any) -> dict[bytes, Any]:
    """Every key of the namespace and what it holds: equal before and after a call means it wrote nothing."""
    return {k: _content(raw, k) for k in sorted(raw.scan_iter(match=Keys(NS).pattern() + "*", count=1000))}


def _restore(raw: Any, dump: dict[bytes, Any]) -> None:
    for k in list(raw.scan_iter(match=Keys(NS).pattern() + "*", count=1000)):
        raw.delete(k)
    for k, (kind, data) in dump.items():
        if kind == b"hash":
            raw.hset(k, mapping=data)
        elif kind == b"zset":
            raw.zadd(k, dict(data))
        elif kind == b"list":
            raw.rpush(k, *data)
        else:
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
    "list_any_ns": lambda s, b: list(s.list({"configurable": {"thread_id": "t"}})),
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

    def __init__(self, target: Target, flavor: str, layout: str = "index") -> None:
        self.target = target
        self.flavor = flavor
        #: "index": a checkpoint's record and writes in its index entry (this version); "hash": the
        #: records and writes hashes of earlier versions, which this version still reads.
        self.layout = layout
        self.raw = target.sync_client()
        self.loop = asyncio.new_event_loop()
        self.keys = Keys(NS).thread("t")
        self.failures: list[str] = []
        self.clients: list[Any] = []

    def close(self) -> None:
        for client in self.clients:
            if self.flavor == "sync":
                client.close()
            else:
                self.loop.run_until_complete(client.aclose())
        self.loop.close()

    def saver(self) -> Any:
        """A new saver (no list cache): the sync one, or the async one's a-methods awaited on our loop
        (as ``graph.ainvoke`` calls them)."""
        if self.flavor == "sync":
            client = self.target.sync_client()
            self.clients.append(client)
            return AgentStateSaver(client, namespace=NS, retry=NO_RETRY)
        client = self.target.async_client()
        self.clients.append(client)
        return _AsyncFace(AsyncAgentStateSaver(client, namespace=NS, retry=NO_RETRY), self.loop)

    def run(self, label: str, op: Callable[[], Any], before: dict[bytes, Any] | None = None) -> Any:
        """Run ``op``; record a failure unless it succeeded or raised CorruptState with nothing written.

        ``before``: what the namespace holds now, if the caller knows (it just restored it).
        """
        before = _ns_dump(self.raw) if before is None else before
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
                self.failures.append(
                    f"{label}: hung or blocked Redis ({took:.1f} s; {err!r}; pings {watch.errors[:1]})"
                )
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


@pytest.fixture(params=["sync-index", "async-index", "sync-hash"])
def harness(request: pytest.FixtureRequest, target: Target) -> Iterator[Harness]:
    flavor, layout = request.param.split("-")
    h = Harness(target, flavor, layout)
    yield h
    h.close()


def _setup(h: Harness) -> Built:
    h.raw.flushall()
    built = build(AgentStateSaver(h.target.sync_client(), namespace=NS))
    if h.layout == "hash":
        for tid in ("t", "u"):
            _to_hash_layout(h.raw, Keys(NS).thread(tid))
    return built


def _split_entry(entry: bytes) -> tuple[bytes, bytes | None]:
    first = entry.find(b"\0")
    second = entry.find(b"\0", first + 1) if first >= 0 else -1
    return (entry, None) if second < 0 else (entry[:second], entry[second + 1 :])


def _to_hash_layout(raw: Any, k: Any) -> None:
    """Thread ``k`` as earlier versions stored it: records in the records hash, plain members in the
    index, each checkpoint's writes in the writes hash."""
    for entry in raw.zrange(k.index, 0, -1):
        member, stored = _split_entry(entry)
        if stored is None:
            continue
        held, body_at = _held_writes(stored, k.index)
        raw.zrem(k.index, entry)
        raw.zadd(k.index, {member: 0})
        raw.hset(k.records, member, _split(stored)[0] + stored[body_at:])
        if held:
            raw.hset(k.writes, member, held)


def _member(built: Built) -> bytes:
    return ("\0" + built.latest["configurable"]["checkpoint_id"]).encode()


def _record_of(h: Harness, built: Built) -> tuple[bytes, bytes]:
    """The newest checkpoint's member and stored form, wherever the layout keeps it."""
    member = _member(built)
    if h.layout == "hash":
        return member, h.raw.hget(h.keys.records, member)
    entry = h.raw.zrangebylex(h.keys.index, b"[" + member + b"\0", b"(" + member + b"\1")[0]
    return member, entry[len(member) + 1 :]


def _set_record(h: Harness, member: bytes, stored: bytes) -> None:
    """Store ``stored`` as checkpoint ``member``'s record, where the layout keeps it."""
    if h.layout == "hash":
        h.raw.hset(h.keys.records, member, stored)
        return
    for entry in h.raw.zrangebylex(h.keys.index, b"[" + member + b"\0", b"(" + member + b"\1"):
        h.raw.zrem(h.keys.index, entry)
    h.raw.zadd(h.keys.index, {member + b"\0" + stored: 0})


def _writes_of(h: Harness, member: bytes) -> bytes:
    if h.layout == "hash":
        return h.raw.hget(h.keys.writes, member)
    return _held_writes(_record_of_member(h, member), h.keys.index)[0]


def _record_of_member(h: Harness, member: bytes) -> bytes:
    entry = h.raw.zrangebylex(h.keys.index, b"[" + member + b"\0", b"(" + member + b"\1")[0]
    return entry[len(member) + 1 :]


def _set_writes(h: Harness, member: bytes, packed: bytes) -> None:
    """Checkpoint ``member``'s packed writes replaced by ``packed``, where the layout keeps them."""
    if h.layout == "hash":
        h.raw.hset(h.keys.writes, member, packed)
        return
    stored = _record_of_member(h, member)
    _, body_at = _held_writes(stored, h.keys.index)
    _set_record(h, member, _split(stored)[0] + b"W%d:%s" % (len(packed), packed) + stored[body_at:])


def _held_key(h: Harness, attr: str) -> str:
    """The key a CorruptState about a record (or a checkpoint's writes) names in the harness's layout."""
    if h.layout == "index" and attr in ("records", "held-writes"):
        return h.keys.index
    return getattr(h.keys, "writes" if attr == "held-writes" else attr)


# ---- item 1: the hang ------------------------------------------------------------------------------


def _with_field_length(stored: bytes, token: bytes) -> bytes:
    """``stored`` with its first blob field's length prefix replaced by ``token`` (the outer prefix kept right)."""
    colon = stored.index(b":")
    n = int(stored[:colon])
    reads, rest = stored[colon + 1 : colon + 1 + n], stored[colon + 1 + n :]
    inner = reads.index(b":")
    reads = token + reads[inner:]
    return b"%d:" % len(reads) + reads + rest


def _each_op(harness: Harness, built: Built, ops: list[str]) -> dict[str, Any]:
    """Every call of ``ops`` on the same stored data (restored between calls): name -> result or error."""
    damaged = _ns_dump(harness.raw)
    got = {}
    for op in ops:
        _restore(harness.raw, damaged)
        got[op] = harness.run(op, lambda op=op: OPS[op](harness.saver(), built), damaged)
    return got


def test_a_negative_blob_field_length_is_corrupt_state_not_a_hang(harness: Harness) -> None:
    """The issue's record: a blob-field list reading '-3:' looped the scripts' parser for ever."""
    built = _setup(harness)
    member, stored = _record_of(harness, built)
    _set_record(harness, member, _with_field_length(stored, b"-3"))
    got = _each_op(harness, built, sorted(OPS))
    assert not harness.failures, "\n".join(harness.failures)
    # The calls that read the newest checkpoint; the others never parse it and succeed.
    reads = {"get_tuple", "list_thread", "list_any_ns", "list_all", "list_filtered", "prune", "delete_for_runs"}
    for op, result in got.items():
        corrupt = isinstance(result, CorruptState) and result.key == _held_key(harness, "records")
        assert corrupt == (op in reads | {"copy_thread"}), (op, result)


def test_a_negative_pending_write_length_is_corrupt_state_not_a_hang(harness: Harness) -> None:
    """The same value in a checkpoint's pending writes looped the client's parser (and put_writes' script)."""
    built = _setup(harness)
    member, _ = _record_of(harness, built)
    packed = _writes_of(harness, member)
    _set_writes(harness, member, b"-3:" + packed.split(b":", 1)[1])
    got = _each_op(harness, built, ["get_tuple", "list_thread", "put_writes", "put_writes_again", "copy_thread"])
    assert not harness.failures, "\n".join(harness.failures)
    for op, result in got.items():
        assert isinstance(result, CorruptState) and result.key == _held_key(harness, "held-writes"), (op, result)


# ---- item 2: the shard's history-epoch counter ------------------------------------------------------


@pytest.mark.parametrize("value", [b"not a number", b"1e400", b"-", b"99999999999999999999", b"2.5"])
def test_a_shard_gen_counter_that_is_not_an_integer_does_not_break_other_tasks(target: Target, value: bytes) -> None:
    """``gen`` is shared by a shard's tasks: one value INCR refuses used to fail every create there."""
    from redis_agentstate import Checkpoint

    raw = target.sync_client()
    raw.flushall()
    store = CheckpointStore(target.sync_client(), namespace=NS, retry=NO_RETRY)
    assert store.create(Checkpoint("a", status="running", messages=["m"]))
    other = next(f"b{i}" for i in range(10_000) if shard_of(f"b{i}") == shard_of("a"))
    gen = Keys(NS).task("a").gen
    epoch = raw.hget(Keys(NS).task("a").checkpoint, "epoch")
    raw.set(gen, value)
    assert store.create(Checkpoint(other, status="running", messages=["m1", "m2"]))
    got = store.load(other)
    assert got is not None and got.messages == ["m1", "m2"]
    assert int(raw.get(gen)) > 0  # recovered: the next rewrite counts on from it
    assert raw.hget(Keys(NS).task(other).checkpoint, "epoch") != epoch
    assert store.load("a") is not None


# ---- item 2: corrupt saver data is CorruptState, whatever the call -----------------------------------


def _pack(*items: Any) -> bytes:
    return bytes(msgpack.packb(list(items), use_bin_type=True))


def _split(stored: bytes) -> tuple[bytes, bytes]:
    """A stored checkpoint's '<n>:' + list of blob fields, and its msgpack record."""
    colon = stored.index(b":")
    end = colon + 1 + int(stored[:colon])
    return stored[:end], stored[end:]


def _with_body(stored: bytes, body: bytes) -> bytes:
    return _split(stored)[0] + body


#: Named plantings: (what, key attribute, how) -> the saver calls that read it must raise CorruptState.
NAMED: dict[str, tuple[str, Callable[[Harness, Built], None], list[str]]] = {
    "record-pickle": (
        "records",
        lambda h, b: _set_record(
            h,
            _record_of(h, b)[0],
            _with_body(_record_of(h, b)[1], _pack(None, "pickle", b"x", "json", b"{}")),
        ),
        ["get_tuple", "list_thread"],
    ),
    "record-not-utf8-metadata": (
        "records",
        lambda h, b: _set_record(
            h,
            _record_of(h, b)[0],
            _with_body(_record_of(h, b)[1], _pack(None, "json", b"{}", "json", b"\xff\xfe")),
        ),
        ["get_tuple", "list_thread", "list_filtered", "prune"],
    ),
    "record-metadata-a-list": (
        "records",
        lambda h, b: _set_record(
            h,
            _record_of(h, b)[0],
            _with_body(_record_of(h, b)[1], _pack(None, "json", b"{}", "json", b"[1]")),
        ),
        ["get_tuple", "list_thread", "list_filtered", "prune"],
    ),
    "record-no-colon": (
        "records",
        lambda h, b: _set_record(h, _record_of(h, b)[0], b"garbage"),
        ["get_tuple", "list_thread", "list_filtered", "prune", "delete_for_runs"],
    ),
    "blob-field-without-separators": (
        "records",
        lambda h, b: _set_record(h, _record_of(h, b)[0], b"6:4:abcd" + _split(_record_of(h, b)[1])[1]),
        ["get_tuple", "list_thread"],
    ),
    "tail-negative-length": (
        "blobs",
        lambda h, b: h.raw.hset(h.keys.blobs, b"\0msgs\x00004", b"T-3:003" + _pack("json", b"[]")),
        ["get_tuple", "list_thread", "prune", "delete_for_runs"],
    ),
    "tail-not-a-list": (
        "blobs",
        lambda h, b: h.raw.hset(h.keys.blobs, b"\0msgs\x00004", b"T3:003" + _pack("json", b"7")),
        ["get_tuple", "list_thread"],
    ),
    "blob-neither-full-nor-tail": (
        "blobs",
        lambda h, b: h.raw.hset(h.keys.blobs, b"\0n\x00004", b"X" + _pack("json", b"7")),
        ["get_tuple", "list_thread", "prune", "delete_for_runs"],
    ),
    "blob-pickle": (
        "blobs",
        lambda h, b: h.raw.hset(h.keys.blobs, b"\0n\x00004", b"F" + _pack("pickle", b"\x80\x04K\x07.")),
        ["get_tuple", "list_thread"],
    ),
    "write-wrong-shape": (
        "writes",
        lambda h, b: h.raw.hset(h.keys.writes, _record_of(h, b)[0], b"3:k\0001%d:%s" % (len(_pack(1, 2)), _pack(1, 2))),
        ["get_tuple", "list_thread"],
    ),
    "write-idx-a-str": (
        "writes",
        lambda h, b: h.raw.hset(
            h.keys.writes,
            _record_of(h, b)[0],
            b"3:k\0001%d:%s" % (len(_pack("k", "x", "", "c", "json", b"1")), _pack("k", "x", "", "c", "json", b"1")),
        ),
        ["get_tuple", "list_thread"],
    ),
    "write-pickle": (
        "writes",
        lambda h, b: h.raw.hset(
            h.keys.writes,
            _record_of(h, b)[0],
            b"3:k\0001%d:%s" % (len(_pack("k", 1, "", "c", "pickle", b"x")), _pack("k", 1, "", "c", "pickle", b"x")),
        ),
        ["get_tuple", "list_thread"],
    ),
    "write-truncated": (
        "held-writes",
        lambda h, b: _set_writes(h, _record_of(h, b)[0], _writes_of(h, _record_of(h, b)[0])[:-4]),
        ["get_tuple", "list_thread", "put_writes", "put_writes_again"],
    ),
    "index-member-without-separator": (
        "index",
        lambda h, b: _plant_member(h, b, b"zz-no-separator"),
        ["list_any_ns", "prune"],
    ),
    "index-member-not-utf8": (
        "index",
        lambda h, b: _plant_member(h, b, b"\0\xff\xfe"),
        ["get_tuple", "list_thread", "prune"],
    ),
    "run-member-without-separator": (
        "runs",
        lambda h, b: h.raw.zadd(h.keys.runs, {b"r1-no-separator": 0}),
        # copy_thread does not read the runs: a copy does not join the source's runs.
        ["prune", "prune_delete", "delete_thread", "delete_for_runs"],
    ),
    "shard-run-member-without-separator": (
        "shard_runs",
        lambda h, b: h.raw.zadd(h.keys.shard_runs, {b"r1\0": 0}),
        ["delete_for_runs"],
    ),
    "shard-thread-not-utf8": (
        "shard_threads",
        lambda h, b: h.raw.zadd(h.keys.shard_threads, {b"\xff": 0}),
        ["list_all"],
    ),
    "shard-thread-with-nul": (
        "shard_threads",
        lambda h, b: h.raw.zadd(h.keys.shard_threads, {b"a\0b": 0}),
        ["list_all"],
    ),
    "parent-loop-with-a-huge-delta-depth": (
        "records",
        lambda h, b: _plant_parent_loop(h, b),
        ["prune"],
    ),
}


def _plant_member(h: Harness, b: Built, member: bytes) -> None:
    """A checkpoint under an index member the saver would not write (a copy of the newest one's record)."""
    stored = _record_of(h, b)[1]
    if h.layout == "hash":
        h.raw.zadd(h.keys.index, {member: 0})
        h.raw.hset(h.keys.records, member, stored)
    else:
        h.raw.zadd(h.keys.index, {member + b"\0" + stored: 0})


def _plant_parent_loop(h: Harness, b: Built) -> None:
    """The newest checkpoint names itself as its parent and claims 10**15 DeltaChannel steps to replay."""
    member, stored = _record_of(h, b)
    ck_kind, ck_data = JsonPlusSerializer().dumps_typed(generate_checkpoint())
    md = {"source": "loop", "step": 3, "parents": {}, "counters_since_delta_snapshot": {"msgs": [1, 10**15]}}
    md_kind, md_data = JsonPlusSerializer().dumps_typed(md)
    body = _pack(b.latest["configurable"]["checkpoint_id"], ck_kind, ck_data, md_kind, md_data)
    _set_record(h, member, _with_body(stored, body))


@pytest.mark.parametrize("case", sorted(NAMED))
def test_corrupt_saver_data_is_corrupt_state_naming_the_key(harness: Harness, case: str) -> None:
    attr, plant, ops = NAMED[case]
    built = _setup(harness)
    plant(harness, built)
    for op in ops:
        snapshot = _ns_dump(harness.raw)
        got = harness.run(f"{case}/{op}", lambda op=op: OPS[op](harness.saver(), built))
        if not isinstance(got, CorruptState):
            harness.failures.append(f"{case}/{op}: no CorruptState, got {got!r:.200}")
        elif got.key != _held_key(harness, attr):
            harness.failures.append(f"{case}/{op}: CorruptState names {got.key!r}, not the {attr} key")
        elif "LangGraph thread 't'" not in str(got) and attr not in ("shard_runs", "shard_threads"):
            harness.failures.append(f"{case}/{op}: the message names no thread: {got}")
        _restore(harness.raw, snapshot)
    assert not harness.failures, "\n".join(harness.failures)


# ---- item 1: the fuzz ------------------------------------------------------------------------------------

#: Cases per (backend, flavor): seeded, so a failure names a case that replays.
FUZZ_CASES = 16
#: Length tokens a corrupt prefix may carry.
BAD_LENGTHS = [b"-3", b"-1", b"0", b"1", b"99999999", b"4294967296", b"", b"x", b" 3", b"+3", b"1e3", b"0x10", b"3.0"]


def _bytes_mutation(rng: random.Random, value: bytes) -> tuple[str, bytes]:
    """A damaged copy of ``value``: truncated, random bytes, a flipped byte, a length prefix replaced."""
    how = rng.choice(["truncate", "random", "flip", "prefix", "inner-prefix", "append", "empty"])
    if how == "truncate" and value:
        cut = rng.randrange(len(value))
        return f"truncate@{cut}", value[:cut]
    if how == "random":
        return "random", rng.randbytes(rng.randrange(0, 40))
    if how == "flip" and value:
        i = rng.randrange(len(value))
        return f"flip@{i}", value[:i] + bytes([rng.randrange(256)]) + value[i + 1 :]
    colons = [i for i, c in enumerate(value) if c == ord(":")]
    if how in ("prefix", "inner-prefix") and colons:
        colon = colons[0] if how == "prefix" else rng.choice(colons)
        start = colon
        while start > 0 and chr(value[start - 1]).isdigit():
            start -= 1
        token = rng.choice(BAD_LENGTHS)
        return f"{how}@{start}={token!r}", value[:start] + token + value[colon:]
    if how == "append":
        return "append", value + rng.choice([b"-3:", b"5:ab", b"\0", b"F", b"T-3:x"])
    return "empty", b""


def _plant_fuzz(h: Harness, built: Built, rng: random.Random) -> str:
    """One random corruption of thread t's stored data; returns what it did (to name the case)."""
    k = h.keys
    target = rng.choice(["records", "records", "blobs", "blobs", "writes", "writes", "index", "runs", "shard", "type"])
    if target in ("records", "writes") and h.layout == "index":
        # The index entries hold the records and the writes: damage one's record, or the writes it holds.
        entries = [_split_entry(e) for e in h.raw.zrange(k.index, 0, -1)]
        if target == "writes":
            entries = [(m, st) for m, st in entries if st and _held_writes(st, k.index)[0]]
        member, stored = rng.choice(sorted(e for e in entries if e[1]))
        assert stored is not None
        if target == "writes":
            how, new = _bytes_mutation(rng, _held_writes(stored, k.index)[0])
            _set_writes(h, member, new)
        else:
            how, new = _bytes_mutation(rng, stored)
            _set_record(h, member, new)
        return f"index entry {member!r} {target} {how}"
    if target in ("records", "blobs", "writes"):
        key = getattr(k, target)
        fields = sorted(h.raw.hkeys(key))
        fld = rng.choice(fields)
        value = h.raw.hget(key, fld)
        shape = rng.random()
        if target == "records" and shape < 0.3:
            how, body = rng.choice(
                [
                    ("body-pickle", _pack(None, "pickle", b"x", "json", b"{}")),
                    ("body-short", _pack(None, "json")),
                    ("body-not-a-list", _pack(7)[1:]),
                    ("body-parent-int", _pack(7, "json", b"{}", "json", b"{}")),
                    ("body-checkpoint-int", _pack(None, "json", b"7", "json", b"{}")),
                    ("body-bad-json", _pack(None, "json", b"{", "json", b"{}")),
                    ("body-random", rng.randbytes(12)),
                ]
            )
            new = _with_body(value, body)
        elif target == "blobs" and shape < 0.3:
            how, new = rng.choice(
                [
                    (
                        "tail-self",
                        b"T%d:%s" % (len(fld.rsplit(SEP, 1)[1]), fld.rsplit(SEP, 1)[1]) + _pack("json", b"[]"),
                    ),
                    ("tail-missing-base", b"T3:zzz" + _pack("json", b"[]")),
                    ("full-pickle", b"F" + _pack("pickle", b"\x80\x04K\x07.")),
                    ("full-unknown-kind", b"F" + _pack("nope", b"1")),
                    ("full-not-msgpack", b"F\xc1\xc1"),
                ]
            )
        elif target == "writes" and shape < 0.3:
            write = rng.choice(
                [_pack(1, 2), _pack("k", "1", "", "c", "json", b"1"), _pack("k", 1, "", "c", "pickle", b"x"), b"\xc1"]
            )
            how, new = "write-shape", b"3:k\0001%d:%s" % (len(write), write)
        else:
            how, new = _bytes_mutation(rng, value)
        h.raw.hset(key, fld, new)
        return f"{target}[{fld!r}] {how}"
    if target == "index":
        member = rng.choice([b"no-separator", b"\0\xff", b"\0a\0b", b"", b"sub\0"])
        _plant_member(h, built, member)
        return f"index member {member!r}"
    if target == "runs":
        member = rng.choice([b"no-separator", b"r1", b"\xff", b"r1\0\0missing"])
        h.raw.zadd(k.runs, {member: 0})
        return f"runs member {member!r}"
    if target == "shard":
        key, member = rng.choice(
            [
                (k.shard_runs, b"r1"),
                (k.shard_runs, b"r1\0"),
                (k.shard_runs, b"r1\0a\0b"),
                (k.shard_runs, b"r1\0\xff"),
                (k.shard_threads, b"\xff"),
                (k.shard_threads, b"a\0b"),
                (k.shard_threads, b"x" * 600),
            ]
        )
        h.raw.zadd(key, {member: 0})
        return f"{key} member {member!r}"
    attr = rng.choice(
        ["meta", "records", "index", "blobs", "writes", "runs", "released", "shard_threads", "shard_runs"]
    )
    key = getattr(k, attr)
    h.raw.delete(key)
    h.raw.set(key, b"not ours") if rng.random() < 0.7 else h.raw.rpush(key, b"not ours")
    return f"{attr} of another type"


def test_fuzz_corrupt_saver_records(harness: Harness) -> None:
    """Random damage to every kind of stored record: each call is CorruptState (nothing written) or a result."""
    seed = (
        {"fake": 19_1, "real": 19_2}[harness.target.kind]
        + (harness.flavor == "async")
        + 10 * (harness.layout == "hash")
    )
    rng = random.Random(seed)
    for case in range(FUZZ_CASES):
        built = _setup(harness)
        what = _plant_fuzz(harness, built, rng)
        damaged = _ns_dump(harness.raw)
        for name in sorted(OPS):
            _restore(harness.raw, damaged)
            label = f"seed {seed} case {case} ({what}) / {name}"
            harness.run(label, lambda name=name, built=built: OPS[name](harness.saver(), built), damaged)
    assert not harness.failures, "\n".join(harness.failures[:20])
