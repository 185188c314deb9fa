"""``claim_next``: any runnable task's next cycle, from the per-shard ready index.

The store tests run four times through the ``store`` fixture ({fakeredis, real
redis-server} x {sync, async}); the fleet test runs 8 real processes against a
private redis-server; the cluster test runs on a local 3-primary Redis Cluster.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from flows import ids_in_distinct_shards as spread_ids
from flows import ids_in_shard

from redis_agentstate import (
    AgentStatus,
    AlreadyClaimed,
    Checkpoint,
    CheckpointStore,
    CycleConflict,
    InvalidArgument,
)
from redis_agentstate.keys import DEFAULT_SHARDS, Keys, shard_of
from redis_agentstate.wire import scripts as S

LEASE = 30_000


def ids_in_one_shard(namespace: str, n: int, prefix: str = "same") -> list[str]:
    return ids_in_shard(shard_of(f"{prefix}-0"), n, f"{prefix}-")


def ids_in_distinct_shards(namespace: str, n: int) -> list[str]:
    return spread_ids(n, "spread-")


def commit_cycle(store: Any, cp: Checkpoint, token: str, **changes: Any) -> bool:
    cycle = cp.claimed_cycle
    cp.cycle_index = cycle
    cp.messages.append({"cycle": cycle, "token": token})
    for k, v in changes.items():
        setattr(cp, k, v)
    return bool(store.commit(cp, token=token, expected_revision=cp.revision))


class TestClaimNext:
    def test_nothing_to_claim(self, store: Any) -> None:
        assert store.claim_next(token="w", lease_ms=LEASE) is None

    def test_claims_every_runnable_task_once_while_leases_live(self, store: Any) -> None:
        tids = [f"task-{i}" for i in range(12)]
        for tid in tids:
            assert store.create(Checkpoint(tid, cycle_index=2, revision=5))
        got = []
        for i in range(12):
            cp = store.claim_next(token=f"w-{i}", lease_ms=LEASE)
            assert cp is not None
            assert cp.claimed_cycle == 3 and cp.cycle_index == 2 and cp.revision == 6
            assert cp.claim_token == f"w-{i}" and cp.lease_expires_at_ms is not None
            got.append(cp.task_id)
        assert sorted(got) == sorted(tids)
        assert store.claim_next(token="late", lease_ms=LEASE) is None

    def test_only_running_non_terminal_tasks_are_offered(self, store: Any) -> None:
        store.create(Checkpoint("pending", status=AgentStatus.PENDING))
        store.create(Checkpoint("waiting", status=AgentStatus.WAIT_USER))
        store.create(Checkpoint("done", status=AgentStatus.COMPLETED, terminal_result={"ok": 1}))
        store.create(Checkpoint("failed", status=AgentStatus.FAILED))
        store.create(Checkpoint("runnable"))
        store.create(Checkpoint("finalized"))
        fin = store.load("finalized")
        fin.status, fin.terminal_result = AgentStatus.COMPLETED, {"r": 1}
        assert store.finalize(fin, expected_revision=0)
        store.create(Checkpoint("deleted"))
        store.delete("deleted")
        cp = store.claim_next(token="w", lease_ms=LEASE)
        assert cp is not None and cp.task_id == "runnable"
        assert store.claim_next(token="w2", lease_ms=LEASE) is None

    def test_saved_checkpoints_follow_their_status(self, store: Any) -> None:
        store.create(Checkpoint("t", status=AgentStatus.WAIT_USER))
        assert store.claim_next(token="w", lease_ms=LEASE) is None
        store.save(Checkpoint("t", status=AgentStatus.RUNNING, cycle_index=4, revision=8))
        cp = store.claim_next(token="w", lease_ms=LEASE)
        assert cp is not None and (cp.task_id, cp.claimed_cycle, cp.revision) == ("t", 5, 9)

    def test_commit_makes_the_next_cycle_claimable(self, store: Any) -> None:
        store.create(Checkpoint("t"))
        for cycle in range(1, 4):
            cp = store.claim_next(token=f"w{cycle}", lease_ms=LEASE)
            assert cp is not None and cp.claimed_cycle == cycle
            assert store.claim_next(token="other", lease_ms=LEASE) is None
            assert commit_cycle(store, cp, f"w{cycle}")
        done = store.claim_next(token="w-last", lease_ms=LEASE)
        assert commit_cycle(store, done, "w-last", status=AgentStatus.COMPLETED, terminal_result={"n": 4})
        assert store.claim_next(token="after", lease_ms=LEASE) is None
        final = store.load("t")
        assert [m["cycle"] for m in final.messages] == [1, 2, 3, 4] and final.is_terminal

    def test_expired_lease_is_taken_over_and_the_stale_commit_fenced(self, store: Any) -> None:
        store.create(Checkpoint("t"))
        first = store.claim_next(token="slow", lease_ms=60)
        assert first is not None
        assert store.claim_next(token="fast", lease_ms=LEASE) is None
        time.sleep(0.12)
        second = store.claim_next(token="fast", lease_ms=LEASE)
        assert second is not None and second.claimed_cycle == 1 and second.revision == first.revision + 1
        assert not commit_cycle(store, first, "slow")
        assert commit_cycle(store, second, "fast")
        assert [m["token"] for m in store.load("t").messages] == ["fast"]

    def test_fifo_within_a_shard_a_hot_task_goes_to_the_back(self, store: Any, namespace: str) -> None:
        tids = ids_in_one_shard(namespace, 3)
        for tid in tids:
            store.create(Checkpoint(tid))
            time.sleep(0.003)  # distinct scores (ms) so the order is by time, not by name
        order = []
        for i in range(9):
            cp = store.claim_next(token=f"w{i}", lease_ms=LEASE)
            order.append(cp.task_id)
            time.sleep(0.003)
            assert commit_cycle(store, cp, f"w{i}")
        assert order == tids * 3

    def test_no_task_is_starved_across_shards(self, store: Any, namespace: str) -> None:
        tids = ids_in_distinct_shards(namespace, 4)
        for tid in tids:
            store.create(Checkpoint(tid))
        served: Counter[str] = Counter()
        for i in range(60):
            cp = store.claim_next(token=f"w{i}", lease_ms=LEASE)
            served[cp.task_id] += 1
            assert commit_cycle(store, cp, f"w{i}")
        # Due shards are picked uniformly at random: missing one of 4 in 60 rounds has p = 0.75**60 ~ 3e-8.
        assert set(served) == set(tids)

    def test_invalid_arguments_fail_before_any_io(self, store: Any) -> None:
        for bad in ("", 7, None, "x" * 300):
            with pytest.raises(InvalidArgument):
                store.claim_next(token=bad, lease_ms=LEASE)
        for bad in (0, -1, 1.5, True, 10**15):
            with pytest.raises(InvalidArgument):
                store.claim_next(token="w", lease_ms=bad)

    def test_claim_and_claim_next_agree(self, store: Any) -> None:
        store.create(Checkpoint("t"))
        cp = store.claim_next(token="a", lease_ms=LEASE)
        with pytest.raises(AlreadyClaimed):
            store.claim("t", 1, token="b", lease_ms=LEASE)
        with pytest.raises(CycleConflict):
            store.claim("t", 2, token="b", lease_ms=LEASE)
        # claim() re-sent by the holder returns the same claim; claim_next offers nothing.
        again = store.claim("t", 1, token="a", lease_ms=LEASE)
        assert again.revision == cp.revision
        assert store.claim_next(token="c", lease_ms=LEASE) is None


def test_resent_claim_next_returns_the_same_claim(backend: Any, namespace: str) -> None:
    """A reply lost on the wire: the same script sent again answers 'yours already' (code 2)."""
    store = CheckpointStore(backend.sync_client(), namespace=namespace)
    store.create(Checkpoint("t"))
    core, scripts, client = store._core, store._scripts, store.client
    op = core.claim_next(token="w", lease_ms=LEASE)
    peek = next(op)
    pipe = client.pipeline(transaction=False)
    for cmd in peek.commands:
        pipe.execute_command(*cmd)
    call = op.send(pipe.execute())
    assert call.script == S.CLAIM_NEXT
    first = scripts[call.script](keys=call.keys, args=call.args, client=client)
    resent = scripts[call.script](keys=call.keys, args=call.args, client=client)
    assert first[0] == 1 and resent[0] == 2
    with pytest.raises(StopIteration) as stop:
        op.send(resent)
    cp = stop.value.value
    assert cp.claim_token == "w" and cp.revision == 1 and cp.claimed_cycle == 1
    assert store.load("t").revision == 1


def test_lost_race_answers_with_the_new_head(backend: Any, namespace: str) -> None:
    """Two workers peeked the same head; the loser learns the shard's next due task in the same reply."""
    store = CheckpointStore(backend.sync_client(), namespace=namespace)
    a, b = ids_in_one_shard(namespace, 2)
    store.create(Checkpoint(a))
    time.sleep(0.003)
    store.create(Checkpoint(b))
    keys = store._core.keys.task(a).with_parked()
    won = store._scripts[S.CLAIM_NEXT](keys=keys, args=["w1", LEASE, b"", 0, 0, 0], client=store.client)
    lost = store._scripts[S.CLAIM_NEXT](keys=keys, args=["w2", LEASE, b"", 0, 0, 0], client=store.client)
    assert won[0] == 1
    assert lost[0] == 0 and lost[2] == b.encode()
    # ...and claim_next, which follows that answer, gets b.
    cp = store.claim_next(token="w2", lease_ms=LEASE)
    assert cp.task_id == b


# ---- the index never disagrees with the checkpoints --------------------------------------------


def _expected_index(raw: Any, namespace: str) -> tuple[dict[str, str], int]:
    sec, usec = raw.time()
    now = int(sec) * 1000 + int(usec) // 1000
    states = {}
    for key in raw.scan_iter(match=f"{namespace}:*:cp:*", count=1000):
        tid = key.decode().split("}:cp:", 1)[1]
        states[tid] = {k.decode(): v.decode() for k, v in raw.hgetall(key).items() if k != b"body"}
    return states, now


def assert_index_matches_state(raw: Any, namespace: str) -> None:
    keys = Keys(namespace)
    states, now = _expected_index(raw, namespace)
    indexed_tasks: set[str] = set()
    ready: dict[str, float] = {}
    for shard in range(DEFAULT_SHARDS):
        indexed_tasks |= {m.decode() for m in raw.zrange(keys.shard_tasks(shard), 0, -1)}
        for member, score in raw.zrange(keys.shard_ready(shard), 0, -1, withscores=True):
            tid = member.decode()
            assert keys.shard_of(tid) == shard, f"{tid} indexed in the wrong shard"
            ready[tid] = score
    assert indexed_tasks == set(states), "tasks index differs from the stored checkpoints"
    for tid, h in states.items():
        claimable_kind = h["status"] == "running" and h["term"] != "1" and h.get("parked") != "1"
        assert (tid in ready) == claimable_kind, f"{tid}: in ready={tid in ready}, state={h}"
        if not claimable_kind:
            continue
        if h["token"]:
            assert ready[tid] == float(h["lease"]), f"{tid}: ready score {ready[tid]} but lease {h['lease']}"
        else:
            assert ready[tid] <= now, f"{tid}: unclaimed but not due ({ready[tid]} > {now})"


@pytest.mark.parametrize("seed", [1, 2])
def test_index_agrees_with_state_after_random_operations(store: Any, raw: Any, namespace: str, seed: int) -> None:
    rng = random.Random(seed)
    tids = [f"r{i}" for i in range(8)]
    claims: dict[str, Checkpoint] = {}
    statuses = list(AgentStatus)
    for step in range(160):
        tid = rng.choice(tids)
        op = rng.choice(
            ["create", "create", "save", "claim", "claim_next", "claim_next", "commit", "commit",
             "renew", "finalize", "ack", "delete", "expire"]
        )  # fmt: skip
        try:
            if op == "create":
                store.create(Checkpoint(tid, status=rng.choice([AgentStatus.RUNNING, AgentStatus.WAIT_USER])))
            elif op == "save":
                claimed = rng.random() < 0.3
                store.save(
                    Checkpoint(
                        tid, cycle_index=rng.randrange(5), status=rng.choice(statuses),
                        revision=rng.randrange(20), claim_token="adm" if claimed else None,
                        claimed_cycle=1 if claimed else None,
                        lease_expires_at_ms=int(time.time() * 1000) + rng.choice([-500, 5000]) if claimed else None,
                    )
                )  # fmt: skip
                claims.pop(tid, None)
            elif op == "claim":
                cur = store.load(tid)
                if cur is not None:
                    cp = store.claim(tid, cur.cycle_index + 1, token=f"c{step}", lease_ms=rng.choice([40, LEASE]))
                    claims[tid] = cp
            elif op == "claim_next":
                cp = store.claim_next(token=f"n{step}", lease_ms=rng.choice([40, LEASE]))
                if cp is not None:
                    claims[cp.task_id] = cp
            elif op == "commit" and claims:
                cp = claims.pop(rng.choice(sorted(claims)))
                cp.cycle_index = cp.claimed_cycle
                if rng.random() < 0.2:
                    cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"s": step}
                elif rng.random() < 0.2:
                    cp.status = AgentStatus.WAIT_USER
                store.commit(cp, token=cp.claim_token, expected_revision=cp.revision)
            elif op == "renew" and claims:
                cp = claims[rng.choice(sorted(claims))]
                store.renew(cp.task_id, token=cp.claim_token, expected_revision=cp.revision, lease_ms=LEASE)
            elif op == "finalize":
                cur = store.load(tid)
                if cur is not None:
                    cur.status, cur.terminal_result = AgentStatus.FAILED, {"f": step}
                    store.finalize(cur, expected_revision=cur.revision)
            elif op == "ack":
                cur = store.load(tid)
                if cur is not None:
                    store.acknowledge_terminal(tid, expected_revision=cur.revision)
            elif op == "delete":
                store.delete(tid)
                claims.pop(tid, None)
            elif op == "expire":
                time.sleep(0.05)
        except (AlreadyClaimed, CycleConflict) as exc:
            assert op == "claim", exc
        except Exception as exc:  # the only other rejections are ClaimRejected subclasses from claim()
            from redis_agentstate import ClaimRejected

            assert op == "claim" and isinstance(exc, ClaimRejected), f"{op}: {exc!r}"
        if step % 10 == 9:
            assert_index_matches_state(raw, namespace)
    assert_index_matches_state(raw, namespace)


def test_a_stale_index_entry_is_repaired_not_claimed(store: Any, raw: Any, namespace: str) -> None:
    """If something outside the library wrote the index, claim_next fixes it instead of trusting it."""
    keys = Keys(namespace)
    store.create(Checkpoint("waiting", status=AgentStatus.WAIT_USER))
    raw.zadd(keys.task("waiting").ready, {"waiting": 0})
    raw.zadd(keys.task("ghost").ready, {"ghost": 0})
    assert store.claim_next(token="w", lease_ms=LEASE) is None
    assert raw.zscore(keys.task("waiting").ready, "waiting") is None
    assert raw.zscore(keys.task("ghost").ready, "ghost") is None
    assert_index_matches_state(raw, namespace)


# ---- a fleet of processes -------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, sys, time
    import redis
    from redis_agentstate import AgentStatus, CheckpointStore

    url, ns, wid, cycles, lease_ms, hang_after = sys.argv[1:7]
    cycles, lease_ms, hang_after = int(cycles), int(lease_ms), int(hang_after)
    client = redis.Redis.from_url(url)
    store = CheckpointStore(client, namespace=ns)
    n = 0
    while not client.exists(ns + ":stop"):
        token = f"{wid}:{n}"
        cp = store.claim_next(token=token, lease_ms=lease_ms)
        if cp is None:
            time.sleep(0.01)
            continue
        cycle = cp.claimed_cycle
        if 0 <= hang_after <= n:
            print(json.dumps(["HANG", cp.task_id, cycle]), flush=True)
            time.sleep(3600)
        cp.cycle_index = cycle
        cp.messages.append({"cycle": cycle, "worker": wid})
        if cycle == cycles:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"by": wid}
        ok = store.commit(cp, token=token, expected_revision=cp.revision)
        print(json.dumps(["COMMIT" if ok else "REJECTED", cp.task_id, cycle]), flush=True)
        n += 1
    """
)


@pytest.mark.real
@pytest.mark.slow
def test_fleet_of_8_processes_commits_every_cycle_exactly_once(private_server: Any) -> None:
    tasks, cycles, lease_ms, ns = 200, 10, 600, "fleet"
    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace=ns)
    for i in range(tasks):
        assert store.create(Checkpoint(f"task-{i:03d}"))
    hang_after = {2: 5, 5: 25}  # two victims claim one more cycle, hang holding it, and are SIGKILLed
    procs = []
    outputs: dict[int, list[list[Any]]] = {w: [] for w in range(8)}

    def reader(w: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            outputs[w].append(json.loads(line))

    for w in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, private_server.url, ns, f"w{w}", str(cycles), str(lease_ms),
             str(hang_after.get(w, -1))],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(proc)
        threading.Thread(target=reader, args=(w, proc), daemon=True).start()
    try:
        hung: dict[int, tuple[str, int]] = {}
        deadline = time.monotonic() + 60
        while len(hung) < len(hang_after) and time.monotonic() < deadline:
            for w in hang_after:
                for rec in outputs[w]:
                    if rec[0] == "HANG" and w not in hung:
                        hung[w] = (rec[1], rec[2])
                        procs[w].send_signal(signal.SIGKILL)  # dies holding a live claim, mid-cycle
            time.sleep(0.02)
        assert len(hung) == len(hang_after), f"victims never hung: {outputs}"
        while time.monotonic() < deadline:
            done = sum(1 for i in range(tasks) if store.load(f"task-{i:03d}").is_terminal)
            if done == tasks:
                break
            time.sleep(0.3)
        client.set(f"{ns}:stop", 1)
        for w, proc in enumerate(procs):
            if w not in hang_after:
                assert proc.wait(20) == 0
    finally:
        client.set(f"{ns}:stop", 1)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    commits = Counter((r[1], r[2]) for w in outputs for r in outputs[w] if r[0] == "COMMIT")
    assert len(commits) == tasks * cycles, f"{tasks * cycles - len(commits)} cycles were never committed"
    assert max(commits.values()) == 1, "a cycle was committed twice"
    for i in range(tasks):
        cp = store.load(f"task-{i:03d}")
        assert cp.is_terminal and cp.cycle_index == cycles
        assert [m["cycle"] for m in cp.messages] == list(range(1, cycles + 1)), cp.task_id
    for w, (tid, cycle) in hung.items():
        # The victim's cycle was finished by someone else after its lease ran out.
        cp = store.load(tid)
        assert cp.messages[cycle - 1]["worker"] != f"w{w}"
        assert cp.revision > 2 * cycles, "the takeover claim should show in the revision"


# ---- Redis Cluster ----------------------------------------------------------------------------------

try:
    from cluster_support import redis_cluster
except ImportError:  # pragma: no cover - the cluster harness is optional
    redis_cluster = None


@pytest.mark.real
@pytest.mark.cluster
@pytest.mark.skipif(redis_cluster is None, reason="tests/cluster_support.py is not available")
def test_claim_next_on_redis_cluster(redis_cluster: Any, twin_loop: Any) -> None:
    """Tasks on all 64 shards, so on every primary: each cycle is claimed exactly once, sync and async."""
    from conftest import Twin

    from redis_agentstate import AsyncCheckpointStore

    ns = f"cn-{os.urandom(4).hex()}"
    stores = [
        CheckpointStore(redis_cluster.sync_client(), namespace=ns),
        Twin(AsyncCheckpointStore(redis_cluster.async_client(), namespace=ns), twin_loop),
    ]
    tids = ids_in_distinct_shards(ns, DEFAULT_SHARDS)
    for tid in tids:
        assert stores[0].create(Checkpoint(tid))
    for cycle in (1, 2):
        held = []
        for k in range(len(tids)):
            cp = stores[k % 2].claim_next(token=f"w{cycle}-{k}", lease_ms=LEASE)
            assert cp is not None, f"cycle {cycle}: nothing claimable after {k} claims"
            assert cp.claimed_cycle == cycle
            held.append((k % 2, cp))
        assert sorted(cp.task_id for _, cp in held) == sorted(tids)
        assert stores[0].claim_next(token="none-left", lease_ms=LEASE) is None
        for which, cp in held:
            assert commit_cycle(stores[which], cp, cp.claim_token)
    for tid in tids:
        assert [m["cycle"] for m in stores[0].load(tid).messages] == [1, 2]


def test_announced_candidates_are_served_in_announcement_order_behind_peeked_ones() -> None:
    from redis_agentstate.core.claim_next import _Candidates

    c = _Candidates(max_age_s=60)
    c.reset([("old", 100.0)])
    for tid in ("b", "a", "c"):  # a tie broken by the id would serve "a" first, every time
        c.announce(tid)
    assert [c.take() for _ in range(5)] == ["old", "b", "a", "c", None]


def test_an_announcement_after_a_busy_peek_aged_out_waits_for_the_next_peek() -> None:
    from redis_agentstate.core.claim_next import _Candidates

    busy = _Candidates(max_age_s=0)
    busy.reset([])
    busy.add("due-elsewhere", 100.0)  # the peek saw more due work than it claimed
    busy.announce("t")
    assert busy.take() is None  # not "t": the next claim peeks, and serves the oldest due first
    quiet = _Candidates(max_age_s=0.5)
    quiet.reset([])  # the peek saw nothing due: an announcement is the oldest due work there is
    time.sleep(0.6)
    quiet.announce("t")
    assert quiet.take() == "t"
