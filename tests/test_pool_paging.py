"""Bounded work per script, re-sends recognised by content, and the oldest-kept default (issue 9, items 4 and 8).

Every test runs through ``make``: {fakeredis, real redis-server, cluster} x {PoolStore, AsyncPoolStore}.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import require_real

from redis_agentstate import CursorExpired, NotAMember
from redis_agentstate.codec import encode as _encode
from redis_agentstate.core.pool import POOL_SNAPSHOT, PoolCore, _member_map, _message_map, _receipt_map
from redis_agentstate.keys import LAYOUT_SLOTS, Keys
from redis_agentstate.pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecordKind,
    RunMessage,
    StoredMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from redis_agentstate.pools import AsyncPoolStore, PoolStore
from redis_agentstate.wire import Call, scripts
from redis_agentstate.wire.scripts import POOL_WATCH

CONFIG = PoolConfig(message_policy={"route": "topic"})


def encode(value: Any) -> bytes:
    return _encode(value, what="test value")


def msg(i: int) -> tuple[RunMessage, MessageReceipt]:
    return RunMessage(f"m{i}", f"idem-{i}", payload={"i": i}, topic="t"), MessageReceipt(f"m{i}", recipients=["r"])


def inner(store: Any) -> Any:
    return getattr(store, "wrapped", store)


def namespace_dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace but its layout record (a new namespace's first operation writes it)."""
    record = Keys(ns).layout_key().encode()
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{ns}:*", count=1000)) if k != record}


def fill(raw: Any, ns: str, pool_id: str, *, members: int = 0, messages: int = 0, atomic: bool = False) -> int:
    """Append ``members`` joins and ``messages`` messages straight into the keys (as the scripts would
    write them, but pipelined: tens of thousands in a second). Returns the last sequence.
    ``atomic``: one MULTI/EXEC (a reader sees all or nothing; keep it small)."""
    keys = Keys(ns).pool(pool_id)
    seq = int(raw.hget(keys.state, "seq"))
    pipe = raw.pipeline(transaction=atomic)
    for i in range(members):
        m = PoolMember(f"run-{i:06d}", topics=[f"t{i % 7}"])
        blob = encode(_member_map(m))
        seq += 1
        pipe.hset(keys.members, m.run_id, blob)
        pipe.hset(keys.runs, m.run_id, str(seq))
        pipe.xadd(keys.log, {"k": "member_joined", "p": blob}, id=f"{seq}-0")
    for i in range(messages):
        m, r = msg(i)
        stored = encode({"message": _message_map(m), "receipt": _receipt_map(r)})
        seq += 1
        pipe.hset(keys.messages, m.message_id, stored)
        pipe.hset(keys.message_dedupe, m.idempotency_key, f"{seq}:".encode() + encode(_receipt_map(r)))
        pipe.xadd(keys.log, {"k": "run_message", "p": stored}, id=f"{seq}-0")
        if i % 2000 == 1999 and not atomic:
            pipe.execute()
    pipe.hset(keys.state, "seq", seq)
    pipe.execute()
    return seq


def spy_replies(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record (script name, reply length) of every script call the store makes."""
    names = {id(script): name for name, script in inner(store)._scripts.items()}
    script = next(iter(inner(store)._scripts.values()))
    original = type(script).__call__
    seen: list[tuple[str, int]] = []

    def spy(self_: Any, *a: Any, **k: Any) -> Any:
        result = original(self_, *a, **k)
        name = names.get(id(self_), "?")
        if hasattr(result, "__await__"):

            async def wait() -> Any:
                reply = await result
                seen.append((name, len(reply)))
                return reply

            return wait()
        seen.append((name, len(result)))
        return result

    monkeypatch.setattr(type(script), "__call__", spy)
    return seen


def fold(records: list[Any]) -> dict[str, Any]:
    """The pool's state rebuilt from its whole log: the oracle for a snapshot at the last record."""
    members: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    wakes: dict[str, Any] = {}
    created = False
    for rec in records:
        if rec.kind is PoolRecordKind.MEMBER_JOINED:
            members[rec.payload.run_id] = rec.payload
        elif rec.kind is PoolRecordKind.MEMBER_LEFT:
            members.pop(rec.payload.run_id)
        elif rec.kind is PoolRecordKind.RUN_MESSAGE:
            messages[rec.payload.message.message_id] = rec.payload
        elif rec.kind is PoolRecordKind.WAKE:
            wakes[rec.payload.condition.condition_id] = rec.payload
        elif rec.kind is PoolRecordKind.POOL_CREATED:
            created = True
    return {
        "created": created,
        "members": [members[k] for k in sorted(members)],
        "messages": [messages[k] for k in sorted(messages)],
        "wakes": [wakes[k] for k in sorted(wakes)],
    }


# ---- item 4: no script reads an unbounded range ----------------------------------------------------


class TestBoundedScripts:
    PAGE = 50

    @pytest.mark.slow  # a scale test: the full suite runs it (tests/conftest.py)
    def test_watch_and_snapshot_of_20000_records_read_bounded_pages(
        self, make: Callable[..., Any], raw: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        s = make(PoolStore, AsyncPoolStore, page_size=self.PAGE)
        s.open("big", CONFIG)
        head = fill(raw, s.namespace, "big", members=2_000, messages=18_000)
        assert head == 20_001
        seen = spy_replies(s, monkeypatch)

        everything = s.watch("big")  # count=None: every record, in pages
        assert [r.cursor.sequence for r in everything] == list(range(1, head + 1))
        assert everything[-1].payload == StoredMessage(*msg(17_999))
        assert s.watch("big", Cursor(19_990), count=4) == everything[19_990:19_994]
        watch_pages = [n for name, n in seen if name == POOL_WATCH]
        assert len(watch_pages) > head // self.PAGE
        assert max(watch_pages) <= 2 + 3 * self.PAGE

        seen.clear()
        snap = s.snapshot("big")
        assert snap.cursor == Cursor(head) and len(snap.members) == 2_000 and len(snap.messages) == 18_000
        assert snap.topics == [f"t{i}" for i in range(7)]
        assert snap == s.open("big", CONFIG)  # open of an existing pool pages the same way
        snapshot_pages = [n for name, n in seen if name == POOL_SNAPSHOT]
        assert len(snapshot_pages) > 18_000 // (2 * self.PAGE)
        # HSCAN's COUNT is a hint (a hash bucket is returned whole): allow twice the page per hash.
        assert max(snapshot_pages) <= 10 + 3 * 2 * (2 * self.PAGE)
        assert max(n for _, n in seen) <= 10 + 3 * 2 * (2 * self.PAGE)

    def test_watch_count_none_stops_at_the_head_it_saw(self, make: Callable[..., Any], raw: Any) -> None:
        """A reader paging a long log is not dragged along forever by a writer that never stops."""
        s = make(PoolStore, AsyncPoolStore, page_size=10)
        s.open("pool", CONFIG)
        fill(raw, s.namespace, "pool", messages=95)
        core = PoolCore(s.namespace, max_records=None, max_record_bytes=2**20, page_size=10)
        core.keys.configure(64, LAYOUT_SLOTS)  # what a store's first operation reads
        script = raw.register_script(scripts.script_text(POOL_WATCH))
        op = core.watch("pool")
        req = next(op)
        replies = 0
        while True:
            assert isinstance(req, Call) and req.script == POOL_WATCH
            reply = script(keys=req.keys, args=req.args)
            replies += 1
            if replies == 3:  # a writer appends while the reader pages
                fill(raw, s.namespace, "pool", messages=50)
            try:
                req = op.send(reply)
            except StopIteration as stop:
                got = stop.value
                break
        assert [r.cursor.sequence for r in got] == list(range(1, 97))
        assert len(s.watch("pool", Cursor(96))) == 50

    def test_blocking_watch_returns_a_whole_burst_in_pages(
        self, make: Callable[..., Any], raw: Any, backend: Any, namespace: str
    ) -> None:
        s = make(PoolStore, AsyncPoolStore, page_size=5)
        s.open("pool", CONFIG)
        writer = PoolStore(backend.sync_client(), namespace=namespace)
        burst = threading.Timer(0.3, lambda: fill(raw, namespace, "pool", messages=23, atomic=True))
        burst.start()
        try:
            got = s.watch("pool", Cursor(1), block_ms=5_000)
        finally:
            burst.join()
        assert [r.cursor.sequence for r in got] == list(range(2, 25))
        assert writer.watch("pool", Cursor(1), count=3) == got[:3]


class TestPagedSnapshot:
    def test_snapshot_is_the_state_at_its_cursor_while_writes_land_between_pages(
        self, make: Callable[..., Any], backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Pages of 3 fields; joins, leaves, messages, wakes and record_created land meanwhile. Each
        snapshot must equal the state rebuilt from the log up to its cursor."""
        s = make(PoolStore, AsyncPoolStore, page_size=3)
        s.open("pool", CONFIG)
        writer = PoolStore(backend.sync_client(), namespace=namespace)
        for i in range(30):
            writer.join("pool", PoolMember(f"base-{i:02d}", [f"b{i % 4}"]))
            writer.record_message("pool", *msg(1000 + i))
        seen = spy_replies(s, monkeypatch)
        stop = threading.Event()

        def churn() -> None:
            i = 0
            while not stop.is_set():
                writer.join("pool", PoolMember(f"r{i:04d}", [f"t{i % 3}"], {"i": i}))
                writer.record_message("pool", *msg(i))
                if i >= 2:
                    writer.leave("pool", f"r{i - 2:04d}")
                if i % 3 == 0:
                    writer.join("pool", PoolMember(f"base-{i % 30:02d}", ["moved"], {"i": i}))
                    cond = WakeCondition(f"c{i}", f"wk-{i}", run_id=f"r{i:04d}")
                    writer.record_wake("pool", cond, {"f": i}, WakeRegistration(f"c{i}"))
                if i == 5:
                    writer.record_created("pool")
                i += 1

        t = threading.Thread(target=churn)
        t.start()
        snaps = []
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline or len(snaps) < 5:
                snaps.append(s.snapshot("pool"))
        finally:
            stop.set()
            t.join()
        replays = sum(1 for name, _ in seen if name == POOL_WATCH)
        assert replays > 0, "no write landed between pages: the test did not exercise the replay"
        for snap in snaps:
            assert snap.cursor is not None
            want = fold(writer.watch("pool", count=snap.cursor.sequence))
            got = {"created": snap.created, "members": snap.members, "messages": snap.messages, "wakes": snap.wakes}
            assert got == want, snap.cursor
            assert snap.topics == sorted({t for m in snap.members for t in m.topics})

    def test_trimmed_replay_starts_again(self) -> None:
        """Sans-I/O: when retention trimmed the records a snapshot must replay, it reads again from scratch."""
        core = PoolCore("ns", max_records=3, max_record_bytes=2**20, page_size=1)
        core.keys.configure(64, LAYOUT_SLOTS)  # what a store's first operation reads
        cfg = encode({"message_policy": {}, "wake_policy": {}, "policy_refs": []})
        m = encode(_member_map(PoolMember("a")))

        def page(seq: int, cursor: bytes) -> list[Any]:
            return [1, cfg, b"0", str(seq).encode(), cursor, 2, b"a", m, b"", 0, b"", 0]

        op = core.snapshot("p")
        first = next(op)
        assert isinstance(first, Call) and list(first.args) == ["0", "0", "0", 1]
        nxt = op.send(page(5, b"17"))
        assert isinstance(nxt, Call) and nxt.script == POOL_SNAPSHOT and list(nxt.args) == ["17", "", "", 1]
        replay = op.send(page(9, b""))  # 4 records landed between the pages
        assert isinstance(replay, Call) and replay.script == POOL_WATCH and list(replay.args) == ["6-0", 1]
        again = op.send([1, b"9", b"8", b"member_joined", m])  # record 6 was trimmed: the oldest is 8
        assert isinstance(again, Call) and again.script == POOL_SNAPSHOT and list(again.args) == ["0", "0", "0", 1]
        try:
            op.send(page(9, b""))
        except StopIteration as stop:
            snap = stop.value
        else:
            raise AssertionError("expected the snapshot")
        assert snap.cursor == Cursor(9) and [x.run_id for x in snap.members] == ["a"]


# ---- item 8b: no cursor means from the oldest kept record --------------------------------------------


class TestOldestKept:
    def test_watch_without_a_cursor_on_a_trimmed_pool(self, make: Callable[..., Any]) -> None:
        s = make(PoolStore, AsyncPoolStore, max_records=5, page_size=2)
        s.open("pool", CONFIG)
        for i in range(10):
            s.record_message("pool", *msg(i))
        kept = s.watch("pool")
        assert [r.cursor.sequence for r in kept] == [7, 8, 9, 10, 11]
        assert s.watch("pool", count=2) == kept[:2]
        assert s.watch("pool", block_ms=100) == kept
        with pytest.raises(CursorExpired):
            s.watch("pool", Cursor(0))  # an explicit cursor still expires

    def test_cli_watch_without_from_on_a_trimmed_pool(self, real_server: Any, namespace: str, capsys: Any) -> None:
        from redis_agentstate import cli

        url = require_real(real_server)
        s = PoolStore(redis.Redis.from_url(url), namespace=namespace, max_records=3)
        s.open("pool", CONFIG)
        for i in range(5):
            s.record_message("pool", *msg(i))
        assert cli.main(["watch", "pool", "--once", "--url", url, "--namespace", namespace]) == 0
        assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["4", "5", "6"]


# ---- item 8a: no per-call keys; caller re-sends recognised by content ------------------------------


class TestNoPerCallKeys:
    def test_join_and_leave_leave_no_keys_behind(self, make: Callable[..., Any], raw: Any) -> None:
        s = make(PoolStore, AsyncPoolStore)
        inner(s)._core.remember_leaves = 20
        s.open("pool", CONFIG)
        before = set(raw.scan_iter(match=f"{s.namespace}:*", count=1000))
        for i in range(150):
            s.join("pool", PoolMember(f"run-{i}"))
            s.leave("pool", f"run-{i}")
        keys = Keys(s.namespace).pool("pool")
        after = set(raw.scan_iter(match=f"{s.namespace}:*", count=1000))
        assert after - before <= {keys.runs.encode(), keys.left.encode()}
        assert raw.hlen(keys.runs) == 20 and raw.zcard(keys.left) == 20
        assert not [k for k in after if raw.pttl(k) > 0]  # nothing waits for a TTL to go away
        # The remembered leaves are the latest ones: a re-send of one is recognised, an older one is not.
        assert s.leave("pool", "run-149")[1] == Cursor(301)
        with pytest.raises(NotAMember):
            s.leave("pool", "run-100")

    def test_2000_joins_and_leaves_as_in_the_issue(self, real_server: Any, namespace: str) -> None:
        raw = redis.Redis.from_url(require_real(real_server))
        s = PoolStore(raw, namespace=namespace)
        s.open("pool", CONFIG)
        for i in range(2_000):
            s.join("pool", PoolMember(f"run-{i}"))
            s.leave("pool", f"run-{i}")
        names = {k.decode().split(":", 2)[2].split(":", 1)[0] for k in raw.scan_iter(match=f"{namespace}:*")}
        assert names == {"pool", "pool-log", "pools", "pool-runs", "pool-left", "layout"}
        keys = Keys(namespace).pool("pool")
        assert raw.hlen(keys.runs) == raw.zcard(keys.left) == 1_000
        raw.close()


class TestCallerResends:
    """A re-send by the caller (after BackendUnavailable) is the same write: same answer, nothing written."""

    def test_join_of_the_member_already_joined(self, make: Callable[..., Any], raw: Any) -> None:
        s = make(PoolStore, AsyncPoolStore)
        s.open("pool", CONFIG)
        member = PoolMember("r", ["t"], {"role": "critic"})
        first = s.join("pool", member)
        s.record_message("pool", *msg(1))
        before = namespace_dump(raw, s.namespace)
        assert s.join("pool", PoolMember("r", ["t"], {"role": "critic"})) == first
        assert namespace_dump(raw, s.namespace) == before
        # Another member under the run id is another write: it replaces and appends (as in the seed).
        moved = s.join("pool", PoolMember("r", ["u"]))
        assert moved == Cursor(4)
        assert s.join("pool", PoolMember("r", ["u"])) == moved
        assert s.join("pool", member) == Cursor(5)  # back to the first content: a new write again
        assert [r.kind for r in s.watch("pool")].count("member_joined") == 3

    def test_leave_resent(self, make: Callable[..., Any], raw: Any) -> None:
        s = make(PoolStore, AsyncPoolStore)
        s.open("pool", CONFIG)
        s.join("pool", PoolMember("r", ["t"]))
        first = s.leave("pool", "r")
        assert first == (PoolMember("r", ["t"]), Cursor(3))
        before = namespace_dump(raw, s.namespace)
        assert s.leave("pool", "r") == first
        assert namespace_dump(raw, s.namespace) == before
        s.join("pool", PoolMember("r"))
        assert s.leave("pool", "r") == (PoolMember("r"), Cursor(5))  # a rejoin makes the next leave new
        with pytest.raises(NotAMember):
            s.leave("pool", "never-joined")

    def test_record_created_resent(self, make: Callable[..., Any], raw: Any) -> None:
        s = make(PoolStore, AsyncPoolStore)
        s.open("pool", CONFIG)
        first = s.record_created("pool")
        s.join("pool", PoolMember("r"))
        before = namespace_dump(raw, s.namespace)
        assert s.record_created("pool") == first == Cursor(2)
        assert namespace_dump(raw, s.namespace) == before
        assert [r.kind for r in s.watch("pool")].count("pool_created") == 1

    def test_message_and_wake_resent(self, make: Callable[..., Any], raw: Any) -> None:
        s = make(PoolStore, AsyncPoolStore)
        s.open("pool", CONFIG)
        first = s.record_message("pool", *msg(1))
        cond = WakeCondition("c", "wk", run_id="r")
        wake = s.record_wake("pool", cond, {"f": 1}, WakeRegistration("c"))
        before = namespace_dump(raw, s.namespace)
        assert s.record_message("pool", *msg(1)) == first
        assert s.record_wake("pool", cond, {"f": 1}, WakeRegistration("c")) == wake
        assert namespace_dump(raw, s.namespace) == before
        assert s.snapshot("pool").wakes == [StoredWake(cond, {"f": 1}, WakeRegistration("c"))]
