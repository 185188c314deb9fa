"""The agent-pool store: the seed's ``AgentPoolStore`` outcomes and docs/design.md's changes.

Every store test runs four times through ``make``:
{fakeredis, real redis-server} x {PoolStore, AsyncPoolStore}.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.exceptions as rex
from conftest import Twin, later, require_real
from faults.replies import lose_first_reply
from redis.crc import key_slot

from redis_agentstate import ConfigConflict, CorruptState, CursorExpired, InvalidArgument, NotAMember, PoolNotOpen
from redis_agentstate.keys import LAYOUT_SLOTS, Keys
from redis_agentstate.pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecordKind,
    PoolSnapshot,
    RunMessage,
    StoredMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from redis_agentstate.pools import AsyncPoolStore, PoolStore
from redis_agentstate.wire import Call, Command, Pipe

CONFIG = PoolConfig(message_policy={"route": "topic", "max": 3}, wake_policy={"on": ["message"]}, policy_refs=["p1"])


def msg(i: int, key: str | None = None, **kw: Any) -> tuple[RunMessage, MessageReceipt]:
    m = RunMessage(f"m{i}", key or f"idem-{i}", payload={"i": i, "blob": b"\x00\xff"}, topic="work", sender="s")
    return m, MessageReceipt(f"m{i}", recipients=[f"r{i}"], metadata=kw)


def wake_of(i: int, key: str | None = None, **kw: Any) -> tuple[WakeCondition, Any, WakeRegistration]:
    c = WakeCondition(f"c{i}", key or f"wk-{i}", run_id=f"r{i}", filter={"topic": "work"})
    return c, {"compiled": [i, "x"]}, WakeRegistration(f"c{i}", metadata=kw)


def namespace_dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace with its DUMP, to prove nothing changed."""
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{ns}:*", count=1000))}


def inner(store: Any) -> Any:
    return getattr(store, "wrapped", store)


@pytest.fixture
def pools(make: Callable[..., Any]) -> Any:
    return make(PoolStore, AsyncPoolStore)


@pytest.fixture
def opened(pools: Any) -> Any:
    pools.open("pool", CONFIG)
    return pools


@pytest.fixture
def build(backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop) -> Callable[..., Any]:
    """``build(client_kwargs, **store_kwargs)``: a pool store of this flavor on a client made with those kwargs."""

    def make_store(client_kw: dict[str, Any], **kw: Any) -> Any:
        kw.setdefault("namespace", namespace)
        if flavor == "sync":
            return PoolStore(backend.sync_client(**client_kw), **kw)
        return Twin(AsyncPoolStore(backend.async_client(**client_kw), **kw), twin_loop)

    return make_store


@pytest.fixture
def writer(backend: Any, namespace: str) -> PoolStore:
    """A second, sync store on the same backend and namespace (for writes from other threads)."""
    return PoolStore(backend.sync_client(), namespace=namespace)


class TestOpen:
    def test_new_pool_appends_pool_opened(self, pools: Any) -> None:
        snap = pools.open("pool", CONFIG)
        assert snap == PoolSnapshot(
            pool_id="pool",
            created=False,
            topics=[],
            members=[],
            message_policy=CONFIG.message_policy,
            wake_policy=CONFIG.wake_policy,
            policy_refs=CONFIG.policy_refs,
            messages=[],
            wakes=[],
            cursor=Cursor(1),
        )
        assert snap.config == CONFIG
        [rec] = pools.watch("pool")
        assert (rec.pool_id, rec.cursor, rec.kind, rec.payload) == ("pool", Cursor(1), "pool_opened", CONFIG)
        assert rec.kind is PoolRecordKind.POOL_OPENED

    def test_default_config(self, pools: Any) -> None:
        snap = pools.open("pool", PoolConfig())
        assert (snap.message_policy, snap.wake_policy, snap.policy_refs) == ({}, {}, [])

    def test_reopen_with_the_same_config_appends_nothing(self, opened: Any) -> None:
        opened.join("pool", PoolMember("r1", ["t"]))
        # Same values, other dict order and 3 vs 3.0: still the same config.
        again = PoolConfig({"max": 3.0, "route": "topic"}, {"on": ["message"]}, ["p1"])
        snap = opened.open("pool", again)
        assert snap.cursor == Cursor(2) and [m.run_id for m in snap.members] == ["r1"]
        assert [r.kind for r in opened.watch("pool")] == ["pool_opened", "member_joined"]

    def test_true_is_not_1(self, pools: Any) -> None:
        """Configs compare as JSON values (as the seed's serde_json does): ``true`` is not ``1``."""
        pools.open("flags", PoolConfig({"broadcast": True, "n": 1}))
        assert pools.open("flags", PoolConfig({"broadcast": True, "n": 1.0})).cursor == Cursor(1)
        with pytest.raises(ConfigConflict):
            pools.open("flags", PoolConfig({"broadcast": 1, "n": 1}))
        with pytest.raises(ConfigConflict):
            pools.open("flags", PoolConfig({"broadcast": True, "n": True}))

    @pytest.mark.parametrize(
        "other",
        [
            PoolConfig(),
            PoolConfig({"route": "topic", "max": 4}, {"on": ["message"]}, ["p1"]),
            PoolConfig(CONFIG.message_policy, CONFIG.wake_policy, ["p1", "p2"]),
            PoolConfig(CONFIG.message_policy, {"on": []}, ["p1"]),
        ],
    )
    def test_other_config_is_a_conflict(self, opened: Any, other: PoolConfig, raw: Any) -> None:
        before = namespace_dump(raw, opened.namespace)
        with pytest.raises(ConfigConflict):
            opened.open("pool", other)
        assert namespace_dump(raw, opened.namespace) == before
        assert opened.snapshot("pool").config == CONFIG

    def test_pools_are_independent_and_listed(self, pools: Any) -> None:
        for pid in ["b", "a", "a:b", "{a}", "ü nicode"]:
            pools.open(pid, PoolConfig(policy_refs=[pid]))
        pools.join("a", PoolMember("r"))
        assert pools.snapshot("a:b").members == [] and pools.snapshot("{a}").policy_refs == ["{a}"]
        assert pools.list() == sorted(["b", "a", "a:b", "{a}", "ü nicode"])


class TestNeverOpened:
    @pytest.mark.parametrize(
        "call",
        [
            lambda s: s.snapshot("nope"),
            lambda s: s.record_created("nope"),
            lambda s: s.join("nope", PoolMember("r")),
            lambda s: s.leave("nope", "r"),
            lambda s: s.message_receipt("nope", "k"),
            lambda s: s.record_message("nope", *msg(1)),
            lambda s: s.wake_registration("nope", "k"),
            lambda s: s.wake("nope", "c"),
            lambda s: s.record_wake("nope", *wake_of(1)),
            lambda s: s.watch("nope"),
            lambda s: s.watch("nope", Cursor(3), block_ms=50),
            lambda s: s.next_event_sequence("nope"),
        ],
    )
    def test_every_operation_raises_pool_not_open(self, opened: Any, raw: Any, call: Any) -> None:
        before = namespace_dump(raw, opened.namespace)
        with pytest.raises(PoolNotOpen):
            call(opened)
        assert namespace_dump(raw, opened.namespace) == before


class TestStateChanges:
    def test_record_created(self, opened: Any) -> None:
        assert opened.record_created("pool") == Cursor(2)
        assert opened.snapshot("pool").created is True
        assert [(r.kind, r.payload) for r in opened.watch("pool", Cursor(1))] == [("pool_created", None)]

    def test_join_and_leave(self, opened: Any) -> None:
        a = PoolMember("run-b", topics=["x", "y"], metadata={"role": "critic"})
        b = PoolMember("run-a", topics=["y", "z"])
        assert opened.join("pool", a) == Cursor(2)
        assert opened.join("pool", b) == Cursor(3)
        snap = opened.snapshot("pool")
        assert snap.members == [b, a]  # ordered by run id, like the seed's BTreeMap
        assert snap.topics == ["x", "y", "z"]
        member, cursor = opened.leave("pool", "run-b")
        assert (member, cursor) == (a, Cursor(4))
        recs = opened.watch("pool", Cursor(1))
        assert [(r.kind, r.payload) for r in recs] == [("member_joined", a), ("member_joined", b), ("member_left", a)]
        assert opened.snapshot("pool").members == [b]

    def test_rejoin_replaces_the_member_and_appends(self, opened: Any) -> None:
        opened.join("pool", PoolMember("r", ["old"]))
        opened.join("pool", PoolMember("r", ["new"]))
        assert opened.snapshot("pool").members == [PoolMember("r", ["new"])]
        assert opened.snapshot("pool").cursor == Cursor(3)

    def test_leave_by_a_non_member(self, opened: Any, raw: Any) -> None:
        opened.join("pool", PoolMember("r"))
        first = opened.leave("pool", "r")
        before = namespace_dump(raw, opened.namespace)
        # "r" already left: a leave of it again is that leave re-sent (see TestCallerResends).
        assert opened.leave("pool", "r") == first
        with pytest.raises(NotAMember):
            opened.leave("pool", "never")
        assert namespace_dump(raw, opened.namespace) == before

    def test_next_event_sequence_counts_without_records(self, opened: Any) -> None:
        assert [opened.next_event_sequence("pool") for _ in range(3)] == [1, 2, 3]
        assert opened.snapshot("pool").cursor == Cursor(1)
        opened.open("other", CONFIG)
        assert opened.next_event_sequence("other") == 1

    def test_payloads_round_trip(self, opened: Any) -> None:
        payload = {"text": "héllo", "bytes": b"\x00\x01\xff", "n": [1, 2.5, None, True, -(2**63)], 7: {"k": []}}
        m = RunMessage("m", "k", payload=payload, topic=None, sender=None)
        opened.record_message("pool", m, MessageReceipt("m"))
        [rec] = opened.watch("pool", Cursor(1))
        assert rec.payload == StoredMessage(m, MessageReceipt("m"))
        assert opened.snapshot("pool").messages == [StoredMessage(m, MessageReceipt("m"))]


class TestDedupe:
    def test_record_message_twice_writes_nothing_and_returns_the_first_cursor(self, opened: Any, raw: Any) -> None:
        m, r = msg(1, by="first")
        first = opened.record_message("pool", m, r)
        assert first == Cursor(2)
        opened.join("pool", PoolMember("r"))
        before = namespace_dump(raw, opened.namespace)
        # Same key, other content: still the first record's cursor, nothing written.
        m2 = RunMessage("m-other", m.idempotency_key, payload="other")
        assert opened.record_message("pool", m2, MessageReceipt("m-other", metadata={"by": "second"})) == first
        assert opened.record_message("pool", m, r) == first
        assert namespace_dump(raw, opened.namespace) == before
        assert opened.message_receipt("pool", m.idempotency_key) == r
        assert opened.message_receipt("pool", "unknown") is None
        snap = opened.snapshot("pool")
        assert snap.messages == [StoredMessage(m, r)]
        kinds = [x.kind for x in opened.watch("pool")]
        assert kinds == ["pool_opened", "run_message", "member_joined"]

    def test_messages_are_keyed_by_message_id(self, opened: Any) -> None:
        m1, r1 = msg(1)
        opened.record_message("pool", m1, r1)
        m1b = RunMessage("m1", "another-key", payload="replaced")
        opened.record_message("pool", m1b, MessageReceipt("m1"))
        assert opened.snapshot("pool").messages == [StoredMessage(m1b, MessageReceipt("m1"))]
        assert opened.message_receipt("pool", "idem-1") == r1
        assert opened.message_receipt("pool", "another-key") == MessageReceipt("m1")

    def test_record_wake_twice_writes_nothing_and_returns_the_first_cursor(self, opened: Any, raw: Any) -> None:
        cond, compiled, reg = wake_of(1, by="first")
        first = opened.record_wake("pool", cond, compiled, reg)
        assert first == Cursor(2)
        before = namespace_dump(raw, opened.namespace)
        cond2, compiled2, reg2 = wake_of(2, key=cond.idempotency_key, by="second")
        assert opened.record_wake("pool", cond2, compiled2, reg2) == first
        assert namespace_dump(raw, opened.namespace) == before
        assert opened.wake_registration("pool", cond.idempotency_key) == reg
        assert opened.wake_registration("pool", "unknown") is None
        assert opened.wake("pool", "c1") == StoredWake(cond, compiled, reg)
        assert opened.wake("pool", "c2") is None
        assert opened.snapshot("pool").wakes == [StoredWake(cond, compiled, reg)]
        [rec] = opened.watch("pool", Cursor(1))
        assert (rec.kind, rec.payload) == ("wake", StoredWake(cond, compiled, reg))

    def test_dedupe_survives_retention(self, make: Callable[..., Any]) -> None:
        s = make(PoolStore, AsyncPoolStore, max_records=2)
        s.open("pool", CONFIG)
        first = s.record_message("pool", *msg(1))
        for i in range(2, 6):
            s.record_message("pool", *msg(i))
        assert s.record_message("pool", *msg(1)) == first
        assert s.snapshot("pool").cursor == Cursor(6)


class TestWatch:
    def test_exactly_the_records_after_the_cursor(self, opened: Any) -> None:
        for i in range(1, 10):
            opened.record_message("pool", *msg(i))
        everything = opened.watch("pool")
        assert [r.cursor.sequence for r in everything] == list(range(1, 11))
        assert opened.watch("pool", Cursor(0)) == everything
        for k in range(11):
            assert opened.watch("pool", Cursor(k)) == everything[k:]
        assert opened.watch("pool", Cursor(3), count=2) == everything[3:5]
        assert opened.watch("pool", Cursor(10)) == []

    def test_a_cursor_ahead_of_the_log_is_refused_not_waited_on(self, opened: Any) -> None:
        """After a restart without persistence the log restarts at 1: never skip its new records."""
        opened.record_created("pool")
        for kwargs in ({}, {"block_ms": 200}):
            with pytest.raises(CursorExpired, match="ahead of its log"):
                opened.watch("pool", Cursor(99), **kwargs)

    def test_resumable_from_a_saved_cursor_after_a_restart(self, opened: Any, make: Callable[..., Any]) -> None:
        for i in range(5):
            opened.record_message("pool", *msg(i))
        saved = opened.watch("pool", count=3)[-1].cursor
        fresh = make(PoolStore, AsyncPoolStore)  # a new process: nothing but the cursor survives
        rest = fresh.watch("pool", Cursor(saved.sequence))
        assert [r.cursor.sequence for r in rest] == [4, 5, 6]
        assert [r.payload.message.message_id for r in rest] == ["m2", "m3", "m4"]

    def test_cursors_order(self) -> None:
        assert Cursor(1) < Cursor(2) and sorted([Cursor(3), Cursor(1)]) == [Cursor(1), Cursor(3)]
        assert len({Cursor(1), Cursor(1)}) == 1

    def test_retention_raises_cursor_expired_instead_of_a_gap(self, make: Callable[..., Any], raw: Any) -> None:
        s = make(PoolStore, AsyncPoolStore, max_records=5)
        s.open("pool", CONFIG)
        for i in range(10):
            s.record_message("pool", *msg(i))
        log = Keys(s.namespace).pool("pool").log
        assert raw.xlen(log) == 5
        kept = s.watch("pool", Cursor(6))
        assert [r.cursor.sequence for r in kept] == [7, 8, 9, 10, 11]
        assert s.watch("pool") == kept  # no cursor: from the oldest record kept
        for stale in [Cursor(0), Cursor(3), Cursor(5)]:
            with pytest.raises(CursorExpired) as info:
                s.watch("pool", stale)
            assert info.value.key == log
        with pytest.raises(CursorExpired):
            s.watch("pool", Cursor(5), block_ms=50)
        assert s.watch("pool", Cursor(11)) == []
        assert len(s.snapshot("pool").messages) == 10  # state is kept whole; only the log is trimmed

    def test_blocking_watch_wakes_on_a_new_record(self, opened: Any, writer: PoolStore) -> None:
        t0 = time.monotonic()
        with later(0.3, lambda: writer.join("pool", PoolMember("late"))):
            got = opened.watch("pool", Cursor(1), block_ms=10_000)
        elapsed = time.monotonic() - t0
        assert [(r.cursor, r.kind) for r in got] == [(Cursor(2), "member_joined")]
        assert 0.25 < elapsed < 3, elapsed

    def test_blocking_watch_returns_at_once_when_records_exist(self, opened: Any) -> None:
        t0 = time.monotonic()
        assert len(opened.watch("pool", block_ms=10_000)) == 1
        assert time.monotonic() - t0 < 1

    def test_blocking_watch_times_out_empty(self, opened: Any) -> None:
        t0 = time.monotonic()
        assert opened.watch("pool", Cursor(1), block_ms=300) == []
        assert 0.25 < time.monotonic() - t0 < 2

    @pytest.mark.parametrize("protocol", [2, 3])
    def test_blocking_watch_on_both_protocols(self, build: Any, writer: PoolStore, protocol: int) -> None:
        s = build({"protocol": protocol})
        s.open("pool", CONFIG)
        with later(0.2, lambda: writer.record_message("pool", *msg(7))):
            got = s.watch("pool", Cursor(1), count=10, block_ms=5_000)
        assert [(r.cursor, r.payload.message.message_id) for r in got] == [(Cursor(2), "m7")]

    def test_block_longer_than_the_socket_timeout(self, build: Any, writer: PoolStore) -> None:
        s = build({"socket_timeout": 0.2})
        s.open("pool", CONFIG)
        t0 = time.monotonic()
        assert s.watch("pool", Cursor(1), block_ms=900) == []  # no TimeoutError: waits in slices
        assert 0.85 < time.monotonic() - t0 < 3
        with later(0.7, lambda: writer.record_created("pool")):
            got = s.watch("pool", Cursor(1), block_ms=5_000)
        assert [r.kind for r in got] == ["pool_created"]

    def test_the_socket_timeout_would_fire_on_one_long_block(self, real_server: Any) -> None:
        """The control for the test above: one XREAD BLOCK past socket_timeout does fail on a real
        server (fakeredis answers in-process and has no socket to time out, so: real only)."""
        with (
            redis.Redis.from_url(require_real(real_server), socket_timeout=0.2) as client,
            pytest.raises(rex.TimeoutError),
        ):
            client.execute_command("XREAD", "BLOCK", 900, "STREAMS", "no-such-stream", "$")

    def test_blocking_xread_is_one_command_not_polling(self, real_server: Any, namespace: str) -> None:
        """Counted by the real server (INFO commandstats), so this runs on the real backend only."""
        raw = redis.Redis.from_url(require_real(real_server))
        opened = PoolStore(raw, namespace=namespace)
        opened.open("pool", CONFIG)

        def calls(name: str) -> int:
            return int(raw.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))

        before_xread, before_eval = calls("xread"), calls("evalsha")
        t0 = time.monotonic()
        assert opened.watch("pool", Cursor(1), block_ms=1_000) == []
        assert time.monotonic() - t0 >= 0.95
        assert calls("xread") - before_xread == 1
        assert calls("evalsha") - before_eval <= 2  # the non-blocking read first (+ a NOSCRIPT reload)
        raw.close()

    def test_async_block_leaves_the_event_loop_free(self, backend: Any, namespace: str, twin_loop: Any) -> None:
        async def scenario() -> tuple[list[Any], float]:
            s = AsyncPoolStore(backend.async_client(), namespace=namespace)
            await s.open("pool", CONFIG)

            async def write_soon() -> None:
                await asyncio.sleep(0.2)
                await s.join("pool", PoolMember("from-the-same-loop"))

            t0 = time.monotonic()
            got, _ = await asyncio.gather(s.watch("pool", Cursor(1), block_ms=10_000), write_soon())
            return got, time.monotonic() - t0

        got, elapsed = twin_loop.run_until_complete(scenario())
        assert [r.payload.run_id for r in got] == ["from-the-same-loop"]
        assert elapsed < 3


class TestSnapshot:
    def test_snapshot_is_one_moment(self, opened: Any, writer: PoolStore) -> None:
        """Joins and messages land while snapshots are taken: each snapshot adds up to its cursor."""
        stop = threading.Event()

        def churn() -> None:
            i = 0
            while not stop.is_set():
                writer.join("pool", PoolMember(f"r{i}", [f"t{i % 3}"]))
                writer.record_message("pool", *msg(i))
                i += 1

        t = threading.Thread(target=churn)
        t.start()
        try:
            seen: set[int] = set()
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline or len(seen) < 3:
                snap = opened.snapshot("pool")
                assert snap.cursor is not None
                assert snap.cursor.sequence == 1 + len(snap.members) + len(snap.messages)
                seen.add(snap.cursor.sequence)
        finally:
            stop.set()
            t.join()
        assert len(seen) >= 3


class TestBadInput:
    @pytest.mark.parametrize(
        "call",
        [
            lambda s: s.open("", CONFIG),
            lambda s: s.open(None, CONFIG),
            lambda s: s.open("p2", {"message_policy": {}}),
            lambda s: s.open("p2", PoolConfig(message_policy=[])),
            lambda s: s.open("p2", PoolConfig(policy_refs={"a"})),
            lambda s: s.open("p2", PoolConfig(message_policy={"x": object()})),
            lambda s: s.open("pool", PoolConfig(wake_policy={"big": 2**70})),
            lambda s: s.open("x" * 1025, CONFIG),
            lambda s: s.open("\ud800", CONFIG),
            lambda s: s.snapshot(""),
            lambda s: s.record_created(b"pool"),
            lambda s: s.join("pool", "r1"),
            lambda s: s.join("pool", PoolMember("")),
            lambda s: s.join("pool", PoolMember(1)),
            lambda s: s.join("pool", PoolMember("r", topics="t")),
            lambda s: s.join("pool", PoolMember("r", topics=["t", ""])),
            lambda s: s.join("pool", PoolMember("r", metadata=[])),
            lambda s: s.join("pool", PoolMember("r", metadata={"x": {1, 2}})),
            lambda s: s.join("pool", PoolMember("r", metadata={"big": "x" * 5000})),
            lambda s: s.leave("pool", ""),
            lambda s: s.leave("pool", 7),
            lambda s: s.message_receipt("pool", ""),
            lambda s: s.message_receipt("", "k"),
            lambda s: s.record_message("pool", RunMessage("", "k"), MessageReceipt("")),
            lambda s: s.record_message("pool", RunMessage("m", ""), MessageReceipt("m")),
            lambda s: s.record_message("pool", RunMessage("m", "k", topic=""), MessageReceipt("m")),
            lambda s: s.record_message("pool", RunMessage("m", "k", sender=3), MessageReceipt("m")),
            lambda s: s.record_message("pool", RunMessage("m", "k", payload=object()), MessageReceipt("m")),
            lambda s: s.record_message("pool", RunMessage("m", "k", payload=b"x" * 5000), MessageReceipt("m")),
            lambda s: s.record_message("pool", RunMessage("m", "k"), MessageReceipt("other")),
            lambda s: s.record_message("pool", RunMessage("m", "k"), MessageReceipt("m", recipients="r")),
            lambda s: s.record_message("pool", RunMessage("m", "k"), MessageReceipt("m", metadata=None)),
            lambda s: s.record_message("pool", RunMessage("m", "k"), None),
            lambda s: s.record_message("pool", ("m", "k"), MessageReceipt("m")),
            lambda s: s.wake_registration("pool", None),
            lambda s: s.wake("pool", ""),
            lambda s: s.record_wake("pool", WakeCondition("", "k", "r"), {}, WakeRegistration("")),
            lambda s: s.record_wake("pool", WakeCondition("c", "", "r"), {}, WakeRegistration("c")),
            lambda s: s.record_wake("pool", WakeCondition("c", "k", ""), {}, WakeRegistration("c")),
            lambda s: s.record_wake("pool", WakeCondition("c", "k", "r", filter=[]), {}, WakeRegistration("c")),
            lambda s: s.record_wake("pool", WakeCondition("c", "k", "r"), object(), WakeRegistration("c")),
            lambda s: s.record_wake("pool", WakeCondition("c", "k", "r"), "f" * 5000, WakeRegistration("c")),
            lambda s: s.record_wake("pool", WakeCondition("c", "k", "r"), {}, WakeRegistration("other")),
            lambda s: s.record_wake("pool", WakeCondition("c", "k", "r"), {}, {"condition_id": "c"}),
            lambda s: s.watch("pool", 3),
            lambda s: s.watch("pool", Cursor(-1)),
            lambda s: s.watch("pool", Cursor("1")),
            lambda s: s.watch("pool", Cursor(True)),
            lambda s: s.watch("pool", count=0),
            lambda s: s.watch("pool", count="5"),
            lambda s: s.watch("pool", block_ms=-1),
            lambda s: s.watch("pool", block_ms=1.5),
            lambda s: s.watch("", block_ms=10),
            lambda s: s.next_event_sequence(""),
        ],
    )
    def test_rejected_before_any_write(self, make: Callable[..., Any], raw: Any, call: Any) -> None:
        s = make(PoolStore, AsyncPoolStore, max_record_bytes=4096)
        s.open("pool", CONFIG)
        s.join("pool", PoolMember("keep", ["t"]))
        s.record_message("pool", *msg(1))
        before_snap = s.snapshot("pool")
        before_log = s.watch("pool")
        before = namespace_dump(raw, s.namespace)
        with pytest.raises(InvalidArgument) as info:
            call(s)
        assert isinstance(info.value, ValueError)
        assert namespace_dump(raw, s.namespace) == before
        assert s.snapshot("pool") == before_snap
        assert s.watch("pool") == before_log

    @pytest.mark.parametrize(
        "kw", [{"max_records": 0}, {"max_records": "5"}, {"max_record_bytes": 0}, {"namespace": "a{b}"}]
    )
    def test_bad_store_arguments(self, make: Callable[..., Any], kw: dict[str, Any]) -> None:
        with pytest.raises(InvalidArgument):
            make(PoolStore, AsyncPoolStore, **kw)

    def test_decode_responses_client_is_refused(self, backend: Any) -> None:
        with pytest.raises(InvalidArgument):
            PoolStore(backend.sync_client(decode_responses=True))


class TestCorruptState:
    def test_undecodable_bytes_name_the_key(self, opened: Any, raw: Any) -> None:
        keys = Keys(opened.namespace).pool("pool")
        opened.join("pool", PoolMember("r"))
        opened.record_message("pool", *msg(1))
        raw.hset(keys.members, "r", b"\x09not ours")
        with pytest.raises(CorruptState) as info:
            opened.snapshot("pool")
        assert info.value.key == keys.members
        raw.hset(keys.members, "r", b"\x01\x93\x01\x02\x03")  # valid msgpack, wrong shape
        with pytest.raises(CorruptState) as info:
            opened.snapshot("pool")
        assert info.value.key == keys.members
        raw.hset(keys.message_dedupe, "idem-1", b"3:\xff")
        with pytest.raises(CorruptState) as info:
            opened.message_receipt("pool", "idem-1")
        assert info.value.key == keys.message_dedupe
        raw.hset(keys.message_dedupe, "idem-1", b"no seq here")
        with pytest.raises(CorruptState) as info:
            opened.message_receipt("pool", "idem-1")
        assert info.value.key == keys.message_dedupe

    def test_malformed_dedupe_entries_on_write_name_the_key(self, opened: Any, raw: Any) -> None:
        keys = Keys(opened.namespace).pool("pool")
        raw.hset(keys.message_dedupe, "idem-1", b"no seq here")
        with pytest.raises(CorruptState) as info:
            opened.record_message("pool", *msg(1))
        assert info.value.key == keys.message_dedupe
        raw.hset(keys.wake_dedupe, "wk-1", b"no seq here")
        with pytest.raises(CorruptState) as info:
            opened.record_wake("pool", *wake_of(1))
        assert info.value.key == keys.wake_dedupe
        assert opened.snapshot("pool").cursor == Cursor(1)  # nothing appended

    def test_undecodable_record_names_the_log(self, opened: Any, raw: Any) -> None:
        keys = Keys(opened.namespace).pool("pool")
        seq = raw.hincrby(keys.state, "seq", 1)
        raw.xadd(keys.log, {"k": "run_message", "p": b"\x01\xc1"}, id=f"{seq}-0")
        with pytest.raises(CorruptState) as info:
            opened.watch("pool", Cursor(1))
        assert info.value.key == keys.log
        seq = raw.hincrby(keys.state, "seq", 1)
        raw.xadd(keys.log, {"k": "no_such_kind", "p": b"\x01\xc0"}, id=f"{seq}-0")
        with pytest.raises(CorruptState) as info:
            opened.watch("pool", Cursor(2))
        assert info.value.key == keys.log

    def test_bad_config_names_the_state_key(self, opened: Any, raw: Any) -> None:
        keys = Keys(opened.namespace).pool("pool")
        raw.hset(keys.state, "cfg", b"\x01\xa3abc")
        with pytest.raises(CorruptState) as info:
            opened.snapshot("pool")
        assert info.value.key == keys.state


class TestRetrySafety:
    @staticmethod
    def lose_first_reply(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
        """Make the next script call apply on the server, then fail as if its reply was lost."""
        return lose_first_reply(next(iter(inner(store)._scripts.values())), monkeypatch, any_script=True)

    def test_leave_resent_after_a_lost_reply_is_not_a_non_member(
        self, opened: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        opened.join("pool", PoolMember("r", ["t"]))
        calls = self.lose_first_reply(opened, monkeypatch)
        assert opened.leave("pool", "r") == (PoolMember("r", ["t"]), Cursor(3))
        assert len(calls) == 2
        assert [r.kind for r in opened.watch("pool")].count("member_left") == 1

    @pytest.mark.parametrize(
        "call, kind",
        [
            (lambda s: s.join("pool", PoolMember("r")), "member_joined"),
            (lambda s: s.record_created("pool"), "pool_created"),
            (lambda s: s.record_message("pool", *msg(1)), "run_message"),
            (lambda s: s.record_wake("pool", *wake_of(1)), "wake"),
        ],
    )
    def test_writes_resent_after_a_lost_reply_append_once(
        self, opened: Any, monkeypatch: pytest.MonkeyPatch, call: Any, kind: str
    ) -> None:
        calls = self.lose_first_reply(opened, monkeypatch)
        assert call(opened) == Cursor(2)
        assert len(calls) == 2
        assert [r.kind for r in opened.watch("pool")] == ["pool_opened", kind]

    def test_open_resent_after_a_lost_reply(self, pools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        pools.list()  # the store's first operation reads the namespace's layout first: not the call under test
        calls = self.lose_first_reply(pools, monkeypatch)
        assert pools.open("pool", CONFIG).cursor == Cursor(1)
        assert len(calls) == 2 and len(pools.watch("pool")) == 1


class TestRequests:
    """Sans-I/O checks of what each operation sends (no backend needed)."""

    def requests(self, op: Any, replies: list[Any]) -> list[Any]:
        sent = [next(op)]
        for reply in replies:
            try:
                sent.append(op.send(reply))
            except StopIteration:
                break
        return sent

    def test_every_operation_is_one_request_in_one_slot(self) -> None:
        from redis_agentstate.core.pool import PoolCore

        core = PoolCore("ns", max_records=None, max_record_bytes=2**20)
        core.keys.configure(64, LAYOUT_SLOTS)  # what a store's first operation reads
        ops = [
            core.open("p:{x}", CONFIG),
            core.snapshot("p:{x}"),
            core.record_created("p:{x}"),
            core.join("p:{x}", PoolMember("r")),
            core.leave("p:{x}", "r"),
            core.message_receipt("p:{x}", "k"),
            core.record_message("p:{x}", *msg(1)),
            core.wake_registration("p:{x}", "k"),
            core.wake("p:{x}", "c"),
            core.record_wake("p:{x}", *wake_of(1)),
            core.watch("p:{x}"),
            core.next_event_sequence("p:{x}"),
        ]
        for op in ops:
            req = next(op)
            if isinstance(req, Call):
                keys = list(req.keys)
            else:
                assert isinstance(req, Pipe)
                keys = [c[1] for c in req.commands]
            assert len({key_slot(k.encode()) for k in keys}) == 1, keys

    def test_blocking_watch_is_xread_block_in_slices(self) -> None:
        from redis_agentstate.core.pool import PoolCore

        core = PoolCore("ns", max_records=None, max_record_bytes=2**20)
        core.keys.configure(64, LAYOUT_SLOTS)  # what a store's first operation reads
        op = core.watch("p", Cursor(4), count=10, block_ms=5_000, slice_ms=1_000)
        first = next(op)
        assert isinstance(first, Call) and list(first.args) == ["5-0", 10]
        xread = op.send([1, 4])
        assert isinstance(xread, Command)
        log = Keys("ns").pool("p").log
        assert list(xread.args) == ["XREAD", "COUNT", 10, "BLOCK", 1000, "STREAMS", log, "4-0"]
        again = op.send(None)  # the slice timed out: block again, never a busy loop
        assert isinstance(again, Command) and again.args[4] == 1000
