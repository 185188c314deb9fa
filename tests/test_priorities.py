"""``Checkpoint.priority``: among the tasks due when ``claim_next`` looks, a higher priority first,
fleet-wide and across shards; within one priority the longest-waiting first; a higher priority that
is not due (held, delayed) never hides a lower one that is; on every backend, sync and async."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from flows import ids_in_distinct_shards, ids_in_shard

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    Checkpoint,
    CheckpointStore,
    CorruptState,
    InvalidArgument,
    NotDue,
    Runner,
    StepResult,
)
from redis_agentstate.core.stats import due_head
from redis_agentstate.core.validate import PRIORITY_BAND_MS
from redis_agentstate.keys import Keys

LONG_MS = 30_000


def drain(store: Any) -> list[str]:
    order = []
    while (cp := store.claim_next(token="w", lease_ms=LONG_MS)) is not None:
        order.append(cp.task_id)
    return order


class TestPriorities:
    def test_higher_first_across_shards_then_oldest_first(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        tids = ids_in_distinct_shards(8)
        prios = [0, 3, 1, 3, 0, 9, 1, 0]
        for tid, prio in zip(tids, prios, strict=True):
            store.create(Checkpoint(tid, priority=prio))
            time.sleep(0.003)  # distinct creation times: "oldest first" within a priority is observable
        expected = [t for _, _, t in sorted(zip([-p for p in prios], range(8), tids, strict=True))]
        assert drain(store) == expected

    def test_within_one_shard_too(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        tids = ids_in_shard(5, 6)
        prios = [0, 2, 0, 7, 2, 0]
        for tid, prio in zip(tids, prios, strict=True):
            store.create(Checkpoint(tid, priority=prio))
            time.sleep(0.003)
        expected = [t for _, _, t in sorted(zip([-p for p in prios], range(6), tids, strict=True))]
        assert drain(store) == expected
        assert store.load(tids[3]).priority == 7

    def test_held_higher_priorities_never_hide_a_due_lower_one(self, make: Callable[..., Any]) -> None:
        """A shard whose first index entries are all live leases of priority 5 (more than claim_next's
        peek reads) still serves the priority 0 task behind them."""
        store = make(CheckpointStore, AsyncCheckpointStore)
        *held, low = ids_in_shard(9, 7)
        for tid in held:
            store.create(Checkpoint(tid, priority=5))
        assert sorted(drain(store)) == sorted(held)  # all six held now, with live leases
        store.create(Checkpoint(low))
        cp = store.claim_next(token="w", lease_ms=LONG_MS)
        assert cp is not None and cp.task_id == low and cp.priority == 0

    def test_a_delayed_higher_priority_waits_and_a_due_lower_one_goes(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        urgent, normal = ids_in_shard(3, 2)
        store.create(Checkpoint(urgent, priority=9), delay_ms=LONG_MS)
        store.create(Checkpoint(normal))
        assert drain(store) == [normal]
        with pytest.raises(NotDue):
            store.claim(urgent, 1, token="w", lease_ms=LONG_MS)

    def test_a_commit_changes_the_priority_and_the_lease_keeps_its_band(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        a, b = ids_in_distinct_shards(2, prefix="c")
        store.create(Checkpoint(a))
        store.create(Checkpoint(b, priority=1))
        cp = store.claim(a, 1, token="w", lease_ms=LONG_MS)
        score = raw.zscore(Keys(namespace).task(a).ready, a)
        assert score == cp.lease_expires_at_ms  # priority 0: the plain time
        cp.cycle_index, cp.priority = 1, 4
        nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LONG_MS)
        assert nxt.priority == 4 and store.load(a).priority == 4
        assert raw.zscore(Keys(namespace).task(a).ready, a) == nxt.lease_expires_at_ms - 4 * PRIORITY_BAND_MS
        nxt.cycle_index = 2
        assert store.commit(nxt, token="w", expected_revision=nxt.revision)
        assert drain(store) == [a, b]  # 4 before 1

    @pytest.mark.parametrize("bad", [-1, 10, 1.5, math.nan, True, "3", None])
    def test_a_priority_out_of_range_is_refused_before_anything_is_written(
        self, make: Callable[..., Any], bad: Any
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        with pytest.raises(InvalidArgument, match="priority"):
            store.create(Checkpoint("t", priority=bad))
        assert store.load("t") is None
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index, cp.priority = 1, bad
        with pytest.raises(InvalidArgument, match="priority"):
            store.commit(cp, token="w", expected_revision=cp.revision)
        assert store.load("t").revision == cp.revision

    @pytest.mark.parametrize("stored", ["10", "-1", "x", "1.5", "01"])
    def test_a_corrupt_priority_is_corrupt_state(
        self, make: Callable[..., Any], raw: Any, namespace: str, stored: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        raw.hset(Keys(namespace).task("t").checkpoint, "prio", stored)
        with pytest.raises(CorruptState):
            store.load("t")
        with pytest.raises(CorruptState):
            store.claim("t", 1, token="w", lease_ms=LONG_MS)

    def test_stats_count_what_is_due_in_every_priority(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        for i, prio in enumerate([0, 0, 3, 9]):
            store.create(Checkpoint(f"s{i}", priority=prio))
        store.create(Checkpoint("later", priority=3), delay_ms=LONG_MS)
        time.sleep(0.01)
        sync = store if isinstance(store, CheckpointStore) else None
        if sync is None:
            loop = store._loop
            _, due, oldest = loop.run_until_complete(store.wrapped._run(due_head(store.wrapped._core.keys)))
        else:
            _, due, oldest = sync._run(due_head(sync._core.keys))
        assert due == 4 and oldest is not None and oldest[0] == "s0" and 0 <= oldest[1] < 10_000


def test_the_runner_serves_the_higher_priority_first(sync_store: CheckpointStore) -> None:
    store = sync_store
    tids = ids_in_distinct_shards(6, prefix="r")
    for tid, prio in zip(tids, [0, 5, 0, 5, 2, 0], strict=True):
        store.create(Checkpoint(tid, priority=prio))
    served: list[str] = []

    def step(cp: Checkpoint) -> StepResult:
        served.append(cp.task_id)
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"ok": True}
        return StepResult(cp, done=True)

    Runner(store, step, lease_ms=LONG_MS, handle_signals=False).run(stop_when_idle=True)
    # Created in the same millisecond or not, the two of priority 5 come first, then the 2, then the 0s.
    assert set(served[:2]) == {tids[1], tids[3]} and served[2] == tids[4]
    assert sorted(served[3:]) == sorted([tids[0], tids[2], tids[5]])


def test_a_shard_of_held_higher_priorities_is_read_to_its_end_once(
    sync_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing due behind a shard's held priority 5 tasks: one extra read finds the index's end, and
    claim_next answers None after it (not a read per lower priority)."""
    from redis_agentstate import wire as _ops

    store = sync_store
    store._core.claim_next_candidate_age_s = 0
    for tid in ids_in_shard(11, 4, prefix="h"):
        store.create(Checkpoint(tid, priority=5))
        assert store.claim(tid, 1, token="holder", lease_ms=LONG_MS) is not None
    send, sent = _ops.drivers._send_sync, []

    def counted(client: Any, scripts: Any, req: Any) -> Any:
        sent.append(req)
        return send(client, scripts, req)

    monkeypatch.setattr(_ops.drivers, "_send_sync", counted)
    assert store.claim_next(token="w", lease_ms=LONG_MS) is None
    assert len(sent) == 2  # the peek of every shard, then the read past shard 11's priority 5


def test_cli_list_shows_the_priority(private_server: Any, capsys: Any) -> None:
    import json

    import redis

    from redis_agentstate import cli as cli_mod

    url, ns = private_server.url, "priocli"
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    store.create(Checkpoint("plain"))
    store.create(Checkpoint("urgent", priority=7))
    store.create(Checkpoint("broken"))
    store.client.hset(Keys(ns).task("broken").checkpoint, "prio", "12")
    base = ["--url", url, "--namespace", ns]
    assert cli_mod.main(["list", *base]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "running (p7)" in rows["urgent"] and "(p" not in rows["plain"]
    assert "malformed prio" in rows["broken"]
    assert cli_mod.main(["list", "--json", *base]) == 0
    by_id = {r["task_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert (by_id["urgent"]["priority"], by_id["plain"]["priority"], by_id["broken"]["status"]) == (7, 0, "corrupt")
    store.client.close()
