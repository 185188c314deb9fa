"""Retention: terminal tasks expire (``terminal_ttl_ms``), pools keep a bounded message history.

Every store test runs on {fakeredis, redis-server, Redis Cluster} x {sync, async}
through the ``store``/``make`` fixtures. TTLs are short (a second or less) and
every wait polls with a generous deadline: the machine is shared and slow, so
nothing here asserts a timing, only what is there before and after.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    AsyncPoolStore,
    Checkpoint,
    CheckpointStore,
    InvalidArgument,
    MessageReceipt,
    PoolConfig,
    PoolStore,
    RunMessage,
)
from redis_agentstate.core.checkpoint import ACK_REMEMBER_MS
from redis_agentstate.keys import Keys, TaskKeys, describe_key

LEASE = 30_000
TTL = 800


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def task_keys(store: Any, tid: str) -> TaskKeys:
    return Keys(store.namespace).task(tid)


def per_task_keys(keys: TaskKeys) -> list[str]:
    """Every key of keys.py's TaskKeys that belongs to the task itself (not to its shard)."""
    out = []
    for f in dataclasses.fields(TaskKeys):
        key = getattr(keys, f.name)
        if describe_key(key)[1] == "task":
            out.append(key)
    return out


def shard_keys(keys: TaskKeys) -> list[str]:
    return [
        getattr(keys, f.name) for f in dataclasses.fields(TaskKeys) if describe_key(getattr(keys, f.name))[1] is None
    ]


def finish_claimed(store: Any, tid: str, token: str = "w") -> Checkpoint:
    """Claim the task's next cycle and commit it as completed (a worker finishing it)."""
    cp = store.claim_next(token=token, lease_ms=LEASE)
    assert cp is not None and cp.task_id == tid
    cp.cycle_index = cp.claimed_cycle
    cp.messages.append({"role": "assistant", "content": "done"})
    cp.cycles.append({"cycle": cp.cycle_index})
    cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"answer": 42}
    assert store.commit(cp, token=token, expected_revision=cp.revision)
    return cp


def new_task(store: Any, tid: str) -> None:
    assert store.create(Checkpoint(tid, status=AgentStatus.RUNNING, messages=[{"role": "user", "content": "hi"}]))


class TestTerminalTTL:
    def test_every_key_of_a_finished_task_gets_the_expiry_and_the_shard_keys_none(
        self, make: Callable[..., Any], raw: Any
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=60_000)
        new_task(store, "t1")
        finish_claimed(store, "t1")
        keys = task_keys(store, "t1")
        mine = per_task_keys(keys)
        # keys.py's per-task keys are the checkpoint, both histories, the tombstone and the durable
        # steps' results, which the terminal write dropped: the other four exist now.
        assert set(mine) == {keys.checkpoint, keys.messages, keys.cycles, keys.tomb, keys.steps}
        assert not raw.exists(keys.steps)
        for key in set(mine) - {keys.steps}:
            ttl = raw.pttl(key)
            assert 0 < ttl <= 120_000, (key, ttl)
        # One absolute time for the task's own keys (PEXPIREAT): all of them are there, or none.
        assert len({raw.pexpiretime(k) for k in (keys.checkpoint, keys.messages, keys.cycles)}) == 1
        # The tombstone outlives the task by min(ttl, 1 h): 60 s here.
        assert raw.pttl(keys.tomb) > raw.pttl(keys.checkpoint) + 30_000
        for key in shard_keys(keys):
            assert raw.pttl(key) in (-1, -2), key  # shard indexes and counters never expire

    def test_finalize_sets_the_expiry_too(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=60_000)
        store.create(Checkpoint("f", status=AgentStatus.RUNNING, messages=["m"], cycles=[{"c": 0}]))
        cp = store.load("f")
        cp.status, cp.terminal_result = AgentStatus.FAILED, {"why": "operator"}
        assert store.finalize(cp, expected_revision=cp.revision)
        keys = task_keys(store, "f")
        for key in set(per_task_keys(keys)) - {keys.steps}:  # the step results were dropped, not kept
            assert 0 < raw.pttl(key) <= 120_000, key
        assert not raw.exists(keys.steps)

    def test_a_parked_task_finalized_leaves_the_parked_index_and_expires_whole(
        self, make: Callable[..., Any], raw: Any
    ) -> None:
        """Parking adds no key of its own to a task (the parked index is the shard's): an operator who
        closes a parked task with finalize takes it off the parked index in that script, and every key
        of the task then expires as any terminal task's does."""
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=TTL, max_attempts=1)
        assert store.create(Checkpoint("poison", status=AgentStatus.RUNNING, messages=["m"], cycles=[{"c": 0}]))
        cp = store.claim("poison", 1, token="w", lease_ms=LEASE)
        store.release("poison", token="w", expected_revision=cp.revision, reason="ValueError: never works")
        keys = task_keys(store, "poison")
        assert store.list_parked() == ["poison"] and raw.zscore(keys.parked, "poison") is not None
        parked = store.load("poison")
        assert parked.parked and parked.last_failure == "ValueError: never works"
        parked.status, parked.terminal_result = AgentStatus.FAILED, {"why": "poison, closed by an operator"}
        assert store.finalize(parked, expected_revision=parked.revision)
        assert store.list_parked() == [] and raw.zscore(keys.parked, "poison") is None
        mine = per_task_keys(keys)
        assert set(mine) == {keys.checkpoint, keys.messages, keys.cycles, keys.tomb, keys.steps}
        for key in (keys.checkpoint, keys.messages, keys.cycles):
            assert 0 < raw.pttl(key) <= TTL, key
        wait_for(lambda: not any(raw.exists(k) for k in (keys.checkpoint, keys.messages, keys.cycles)))
        assert store.load("poison") is None and store.list() == [] and store.list_parked() == []
        assert raw.zscore(keys.tasks, "poison") is None and raw.zscore(keys.ready, "poison") is None

    def test_no_ttl_without_the_option_or_while_running(self, make: Callable[..., Any], raw: Any) -> None:
        plain = make(CheckpointStore, AsyncCheckpointStore)
        new_task(plain, "a")
        finish_claimed(plain, "a")
        keys = task_keys(plain, "a")
        assert [raw.pttl(k) for k in (keys.checkpoint, keys.messages, keys.cycles)] == [-1, -1, -1]
        assert not raw.exists(keys.tomb)
        ttl_store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=60_000)
        new_task(ttl_store, "b")
        cp = ttl_store.claim_next(token="w", lease_ms=LEASE)
        cp.cycle_index = cp.claimed_cycle
        cp.messages.append("more")
        assert ttl_store.commit(cp, token="w", expected_revision=cp.revision)  # still running: no expiry
        keys = task_keys(ttl_store, "b")
        assert [raw.pttl(k) for k in (keys.checkpoint, keys.messages)] == [-1, -1]

    def test_expired_task_is_gone_and_readers_clean_its_index_entry(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=TTL)
        for tid in ("done", "live"):
            new_task(store, tid)
        done = store.claim_next(token="w", lease_ms=LEASE)
        other = "live" if done.task_id == "done" else "done"
        done.cycle_index = done.claimed_cycle
        done.status, done.terminal_result = AgentStatus.COMPLETED, {"ok": True}
        assert store.commit(done, token="w", expected_revision=done.revision)
        keys = task_keys(store, done.task_id)
        wait_for(lambda: store.load(done.task_id) is None)
        assert all(not raw.exists(k) for k in (keys.checkpoint, keys.messages, keys.cycles))
        # Nothing scanned: the entry stays in the index until a reader meets it...
        assert raw.zscore(keys.tasks, done.task_id) is not None
        assert store.list() == [other]
        # ...and that reader dropped it.
        assert raw.zscore(keys.tasks, done.task_id) is None
        assert raw.zscore(keys.ready, done.task_id) is None
        # The runnable task is unaffected; claim_next finds it.
        cp = store.claim_next(token="w2", lease_ms=LEASE)
        assert cp is not None and cp.task_id == other

    def test_summaries_skip_and_prune_expired_entries(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=TTL)
        new_task(store, "x")
        finish_claimed(store, "x")
        keys = task_keys(store, "x")
        wait_for(lambda: not raw.exists(keys.checkpoint))
        _, rows = store._summaries(["x"])
        assert rows == []
        assert raw.zscore(keys.tasks, "x") is None

    def test_claim_next_drops_a_due_entry_whose_task_is_gone(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=TTL)
        new_task(store, "gone")
        keys = task_keys(store, "gone")
        # A due entry left behind by a hash that went (eviction, a manual DEL): claim_next repairs it.
        raw.delete(keys.checkpoint)
        assert store.claim_next(token="w", lease_ms=LEASE) is None
        assert raw.zscore(keys.ready, "gone") is None

    def test_acknowledged_before_expiry_works_as_ever(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=60_000)
        new_task(store, "ack")
        cp = finish_claimed(store, "ack")
        rev = cp.revision + 1
        assert store.acknowledge_terminal("ack", expected_revision=rev) is True
        keys = task_keys(store, "ack")
        assert not any(raw.exists(k) for k in (keys.checkpoint, keys.messages, keys.cycles))
        assert raw.zscore(keys.tasks, "ack") is None
        assert 0 < raw.pttl(keys.tomb) <= ACK_REMEMBER_MS
        assert store.acknowledge_terminal("ack", expected_revision=rev) is True  # a re-send
        assert store.list() == []

    def test_acknowledge_after_expiry(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=TTL)
        new_task(store, "late")
        cp = finish_claimed(store, "late")
        rev = cp.revision + 1
        wait_for(lambda: store.load("late") is None)
        # Gone at that very revision: what acknowledging would have done -> True (a bool, as ever).
        assert store.acknowledge_terminal("late", expected_revision=rev) is True
        assert store.acknowledge_terminal("late", expected_revision=rev - 1) is False
        assert store.acknowledge_terminal("never-was", expected_revision=rev) is False
        # A re-sent terminal commit after the expiry is still recognised (the tombstone keeps the ring).
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True

    def test_save_over_an_expiring_task_keeps_it(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=TTL)
        new_task(store, "s")
        cp = finish_claimed(store, "s")
        back = Checkpoint("s", cycle_index=cp.cycle_index, status=AgentStatus.RUNNING, revision=cp.revision + 5)
        store.save(back)
        keys = task_keys(store, "s")
        assert [raw.pttl(k) for k in (keys.checkpoint,)] == [-1]
        time.sleep(TTL / 1000 + 0.3)
        assert store.load("s") is not None
        # The expiry marker in the tombstone does not stand for the live task.
        assert store.acknowledge_terminal("s", expected_revision=cp.revision + 1) is False
        assert store.list() == ["s"]

    @pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1000", 10 * 366 * 24 * 3600 * 1000 + 1])
    def test_bad_ttl_is_refused(self, make: Callable[..., Any], bad: Any) -> None:
        with pytest.raises(InvalidArgument, match="terminal_ttl_ms"):
            make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=bad)

    def test_store_reports_its_ttl(self, make: Callable[..., Any]) -> None:
        assert make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=5000).terminal_ttl_ms == 5000
        assert make(CheckpointStore, AsyncCheckpointStore).terminal_ttl_ms is None


# ---- pools ----------------------------------------------------------------------------------------


def msg(i: int | str) -> tuple[RunMessage, MessageReceipt]:
    return RunMessage(message_id=f"m{i}", idempotency_key=f"k{i}", payload={"i": str(i)}), MessageReceipt(f"m{i}")


def sizes(raw: Any, pools: Any, pool_id: str) -> tuple[int, int, int]:
    k = Keys(pools.namespace).pool(pool_id)
    return raw.hlen(k.messages), raw.hlen(k.message_dedupe), raw.zcard(k.message_order)


class TestPoolRetention:
    @pytest.mark.slow  # a scale test (10,000 records): the other Pythons' subset leaves it to 3.11
    def test_max_messages_bounds_the_hashes_over_10k_records(self, make: Callable[..., Any], raw: Any) -> None:
        pools = make(PoolStore, AsyncPoolStore, max_messages=50)
        pools.open("p", PoolConfig())
        for i in range(10_000):
            pools.record_message("p", *msg(i))
            if i % 2500 == 0:
                assert max(sizes(raw, pools, "p")) <= 50
        assert sizes(raw, pools, "p") == (50, 50, 50)
        snap = pools.snapshot("p")
        assert sorted(m.message.message_id for m in snap.messages) == sorted(f"m{i}" for i in range(9_950, 10_000))
        assert pools.message_receipt("p", "k9999") is not None and pools.message_receipt("p", "k0") is None

    def test_message_ttl_drops_old_messages_a_few_per_write(self, make: Callable[..., Any], raw: Any) -> None:
        pools = make(PoolStore, AsyncPoolStore, message_ttl_ms=300)
        pools.open("p", PoolConfig())
        for i in range(20):
            pools.record_message("p", *msg(i))
        assert sizes(raw, pools, "p") == (20, 20, 20)
        time.sleep(0.6)
        # Each write drops at most 4 expired ones: bounded work, and 5 writes drop all 20.
        pools.record_message("p", *msg("new-0"))
        assert sizes(raw, pools, "p")[0] == 17
        for j in range(1, 5):
            pools.record_message("p", *msg(f"new-{j}"))
        assert sizes(raw, pools, "p") == (5, 5, 5)

    def test_a_lowered_limit_converges(self, make: Callable[..., Any], raw: Any) -> None:
        wide = make(PoolStore, AsyncPoolStore, max_messages=100)
        wide.open("p", PoolConfig())
        for i in range(100):
            wide.record_message("p", *msg(i))
        narrow = make(PoolStore, AsyncPoolStore, max_messages=10)
        for i in range(100, 130):
            narrow.record_message("p", *msg(i))
            assert sizes(raw, narrow, "p")[0] <= 100
        assert sizes(raw, narrow, "p") == (10, 10, 10)

    def test_resend_after_expiry_is_recorded_again(self, make: Callable[..., Any], raw: Any) -> None:
        pools = make(PoolStore, AsyncPoolStore, max_messages=3)
        pools.open("p", PoolConfig())
        first = pools.record_message("p", *msg(0))
        assert pools.record_message("p", *msg(0)) == first  # retained: deduplicated as ever
        for i in range(1, 4):
            pools.record_message("p", *msg(i))
        assert pools.message_receipt("p", "k0") is None
        again = pools.record_message("p", *msg(0))
        assert again > first  # a new record, a new cursor
        assert pools.record_message("p", *msg(0)) == again  # and deduplicated from there on
        # The newest three are kept, m0 among them, however many were recorded in one millisecond
        # (the order zset breaks a tie of scores by the record sequence in the member, not by id).
        assert {m.message.message_id for m in pools.snapshot("p").messages} == {"m2", "m3", "m0"}
        kinds = [r.kind for r in pools.watch("p", first)]
        assert kinds.count("run_message") == 4  # m1..m3 and m0 again
        assert "m0" in {m.message.message_id for m in pools.snapshot("p").messages}

    def test_no_retention_writes_no_order_key(self, make: Callable[..., Any], raw: Any) -> None:
        pools = make(PoolStore, AsyncPoolStore)
        pools.open("p", PoolConfig())
        for i in range(5):
            pools.record_message("p", *msg(i))
        assert sizes(raw, pools, "p") == (5, 5, 0)

    @pytest.mark.parametrize("option", ["max_messages", "message_ttl_ms"])
    @pytest.mark.parametrize("bad", [0, -5, True, 2.5, "10"])
    def test_bad_retention_is_refused(self, make: Callable[..., Any], option: str, bad: Any) -> None:
        with pytest.raises(InvalidArgument, match=option):
            make(PoolStore, AsyncPoolStore, **{option: bad})
