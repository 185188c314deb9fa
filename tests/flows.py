"""End-to-end flows of every store, reused wherever a backend must prove it runs them.

Each flow takes a store with a sync face (a sync store, or an async one wrapped
in ``conftest.Twin``) and asserts every step. The cluster, ACL and TLS tests
run the same flows, so "works on X" always means the same thing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from redis_agentstate import AgentStatus, AlreadyClaimed, Checkpoint, CycleConflict
from redis_agentstate.keys import Keys, shard_of
from redis_agentstate.pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecordKind,
    RunMessage,
    WakeCondition,
    WakeRegistration,
)

__all__ = ["HOSTILE_IDS", "checkpoint_flow", "claim_next_flow", "ids_on_every_shard", "kv_flow", "pool_flow"]

#: Ids that try to break out of their key: separators, hash-tag braces, glob
#: characters, another namespace's shard tag, unicode, a long one.
HOSTILE_IDS = ["a:b:c", "{x}", "}{", "{ns#01}", "*", "?[]", "ünï-cödé ✓", "cp:evil", " ", "a" * 1000, "tomb:x}:cp:y"]


def ids_in_shard(shard: int, n: int, prefix: str = "t") -> list[str]:
    """``n`` ids ``<prefix><i>`` whose keys live in ``shard``."""
    out, i = [], 0
    while len(out) < n:
        if shard_of(tid := f"{prefix}{i}") == shard:
            out.append(tid)
        i += 1
    return out


def ids_in_distinct_shards(n: int, prefix: str = "d") -> list[str]:
    """``n`` ids ``<prefix><i>``, each in a shard of its own."""
    out: list[str] = []
    seen: set[int] = set()
    i = 0
    while len(out) < n:
        if (shard := shard_of(tid := f"{prefix}{i}")) not in seen:
            seen.add(shard)
            out.append(tid)
        i += 1
    return out


def ids_on_every_shard(keys: Keys, per_shard: int = 1, prefix: str = "task") -> list[str]:
    """Ids covering each of the shards of ``keys`` ``per_shard`` times."""
    counts: Counter[int] = Counter()
    out: list[str] = []
    i = 0
    while len(out) < keys.shards * per_shard:
        tid = f"{prefix}-{i}"
        i += 1
        shard = keys.shard_of(tid)
        if counts[shard] < per_shard:
            counts[shard] += 1
            out.append(tid)
    return out


def checkpoint_flow(store: Any, tids: list[str]) -> None:
    """create, claim (and re-claim), renew, commit, fence, load, finalize, acknowledge, delete, list."""
    for tid in tids:
        assert store.create(Checkpoint(task_id=tid, messages=["hello"], shared_state={"k": tid}))
        assert not store.create(Checkpoint(task_id=tid))
    assert store.list() == sorted(tids)
    for tid in tids:
        cp = store.claim(tid, 1, token="w1", lease_ms=30_000)
        assert cp is not None and cp.claimed_cycle == 1 and cp.revision == 1
        assert cp.lease_expires_at_ms is not None
        again = store.claim(tid, 1, token="w1", lease_ms=30_000)  # a re-sent claim
        assert again is not None and again.revision == cp.revision
        with pytest.raises(AlreadyClaimed):
            store.claim(tid, 1, token="w2", lease_ms=30_000)
        assert store.renew(tid, token="w1", expected_revision=1, lease_ms=60_000)
        cp.cycle_index = 1
        cp.messages.append({"cycle": 1})
        cp.cycles.append({"n": 1})
        assert store.commit(cp, token="w1", expected_revision=1)
        assert store.commit(cp, token="w1", expected_revision=1)  # the same write re-sent: recognised
        cp.messages.append({"cycle": "again"})
        assert not store.commit(cp, token="w1", expected_revision=1)  # a different write: fenced, revision moved
        cp.messages.pop()
        with pytest.raises(CycleConflict):
            store.claim(tid, 1, token="w1", lease_ms=30_000)
        loaded = store.load(tid)
        assert loaded.revision == 2 and loaded.cycle_index == 1
        assert loaded.messages == ["hello", {"cycle": 1}] and loaded.cycles == [{"n": 1}]
        assert loaded.claim_token is None and loaded.shared_state == {"k": tid}
        loaded.status = AgentStatus.COMPLETED
        loaded.terminal_result = {"ok": tid}
        assert store.finalize(loaded, expected_revision=2)
        assert store.load(tid).terminal_result == {"ok": tid}
    half = len(tids) // 2
    for tid in tids[:half]:
        assert not store.acknowledge_terminal(tid, expected_revision=2)
        assert store.acknowledge_terminal(tid, expected_revision=3)
        assert store.load(tid) is None
    for tid in tids[half:]:
        store.delete(tid)
    assert store.list() == []


def claim_next_flow(store: Any, tids: list[str]) -> None:
    """Every runnable task, wherever its shard lives, is handed out exactly once while leases live."""
    for tid in tids:
        assert store.create(Checkpoint(task_id=tid))
    got = []
    while (cp := store.claim_next(token="fleet", lease_ms=60_000)) is not None:
        got.append(cp.task_id)
        assert cp.claimed_cycle == 1
    assert sorted(got) == sorted(tids)
    for tid in tids:
        store.delete(tid)


def pool_flow(pools: Any, pool_id: str = "pool-1") -> None:
    """open, join, message (deduped), wake (deduped), leave, snapshot, watch from a cursor."""
    cfg = PoolConfig(message_policy={"route": "topic"}, wake_policy={"on": ["message"]}, policy_refs=["p"])
    snap = pools.open(pool_id, cfg)
    assert snap.pool_id == pool_id
    pools.record_created(pool_id)
    c_join = pools.join(pool_id, PoolMember("run-1", topics=["work"], metadata={"m": 1}))
    message = RunMessage("m1", "idem-1", payload={"x": b"\x00"}, topic="work", sender="run-1")
    receipt = MessageReceipt("m1", recipients=["run-1"])
    c_msg = pools.record_message(pool_id, message, receipt)
    assert pools.record_message(pool_id, message, receipt) == c_msg  # same idempotency key: same record
    assert pools.message_receipt(pool_id, "idem-1") == receipt
    cond = WakeCondition("c1", "wk-1", run_id="run-1", filter={"topic": "work"})
    reg = WakeRegistration("c1", metadata={"r": 1})
    c_wake = pools.record_wake(pool_id, cond, {"compiled": True}, reg)
    assert pools.record_wake(pool_id, cond, {"compiled": True}, reg) == c_wake
    assert pools.wake(pool_id, "c1").registration == reg
    member, c_leave = pools.leave(pool_id, "run-1")
    assert member.run_id == "run-1" and c_leave > c_wake > c_msg > c_join
    records = pools.watch(pool_id, Cursor(0))
    assert [r.cursor.sequence for r in records] == list(range(1, len(records) + 1))
    kinds = [r.kind for r in records]
    assert kinds.count(PoolRecordKind.RUN_MESSAGE) == 1 and kinds.count(PoolRecordKind.WAKE) == 1
    assert [r.cursor for r in pools.watch(pool_id, c_msg)] == [c_wake, c_leave]
    assert pools.snapshot(pool_id).cursor == c_leave
    assert pool_id in pools.list()


def kv_flow(kv: Any, keys: list[str] | None = None) -> None:
    """set, get, exists, set_many/get_many, swap, ttl, keys, count, delete."""
    keys = keys or ["k1", "k:2", "{k3}", "ü"]
    for i, k in enumerate(keys):
        kv.set(k, f"v{i}".encode())
    assert [kv.get(k) for k in keys] == [f"v{i}".encode() for i in range(len(keys))]
    assert kv.exists(keys[0]) and not kv.exists("missing")
    kv.set_many({"m1": b"\x00", "m2": b"\xff"})
    assert kv.get_many(["m1", "missing", "m2"]) == [b"\x00", None, b"\xff"]
    assert kv.swap("m1", b"\x00", b"\x01") and not kv.swap("m1", b"\x00", b"\x02")
    assert kv.get("m1") == b"\x01"
    kv.set("ttl", b"t", ttl_ms=60_000)
    assert sorted(kv.keys()) == sorted([*keys, "m1", "m2", "ttl"])
    assert kv.count() == len(keys) + 3
    for k in [*keys, "m1", "m2", "ttl"]:
        kv.delete(k)
    assert kv.count() == 0 and list(kv.keys()) == []
