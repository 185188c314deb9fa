"""Figure 2: cost of a commit against the length of the stored history (2 new messages per commit).

For each history length H a fresh task is created holding H messages (not
timed), then claim + commit cycles run, each commit appending 2 messages; the
claim and the commit are timed separately. The lengths are interleaved in a
shuffled order within every round. Memory is the ``MEMORY USAGE`` of the
task's own keys (checkpoint hash, message list, cycle list) right after
creation, and the server's ``used_memory`` delta across the creation.
"""

from __future__ import annotations

import random
import time
from typing import Any

import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.testing import internals

from ._util import Settings, latency_summary, make_message, make_state, percentile, summary

MESSAGE_BYTES = 200


def _memory(client: redis.Redis, keys: list[str]) -> int:
    total = 0
    for k in keys:
        used = client.memory_usage(k, samples=0)
        total += int(used or 0)
    return total


def _fill(store: CheckpointStore, task_id: str, h: int) -> None:
    store.delete(task_id)
    store.create(
        Checkpoint(task_id, messages=[make_message(i, MESSAGE_BYTES) for i in range(h)], shared_state=make_state(1024))
    )


def run(settings: Settings) -> dict[str, Any]:
    client = settings.client()
    store = CheckpointStore(client, namespace=settings.ns("history"))
    sizes = [10, 1000] if settings.quick else [10, 100, 1_000, 10_000, 100_000]
    cycles = 20 if settings.quick else 40
    rounds = settings.rounds
    rng = random.Random(settings.seed + 2)
    commit_means: dict[int, list[float]] = {h: [] for h in sizes}
    claim_means: dict[int, list[float]] = {h: [] for h in sizes}
    commit_all: dict[int, list[float]] = {h: [] for h in sizes}
    memory: dict[int, dict[str, int]] = {}
    clock = time.perf_counter_ns
    for r in range(rounds):
        order = list(sizes)
        rng.shuffle(order)
        for h in order:
            tid = f"hist-{h}"
            before = int(client.info("memory")["used_memory"])
            _fill(store, tid, h)
            if r == 0:
                keys = internals(store).core.keys.task(tid)
                memory[h] = {
                    "task_keys_bytes": _memory(client, [keys.checkpoint, keys.messages, keys.cycles]),
                    "used_memory_delta": int(client.info("memory")["used_memory"]) - before,
                }
            claims: list[float] = []
            commits: list[float] = []
            cp = store.load(tid)
            assert cp is not None
            n = cp.cycle_index
            token = "w-hist"
            for i in range(cycles + 2):  # the first two are warm-up
                n += 1
                t0 = clock()
                cp = store.claim(tid, n, token=token, lease_ms=30_000)
                t1 = clock()
                assert cp is not None
                cp.cycle_index = n
                cp.messages.append(make_message(2 * n, MESSAGE_BYTES))
                cp.messages.append(make_message(2 * n + 1, MESSAGE_BYTES))
                t2 = clock()
                if not store.commit(cp, token=token, expected_revision=cp.revision):
                    raise RuntimeError("commit fenced out in a single-writer benchmark")
                t3 = clock()
                if i >= 2:
                    claims.append((t1 - t0) / 1000)
                    commits.append((t3 - t2) / 1000)
            commit_means[h].append(sum(commits) / len(commits))
            claim_means[h].append(sum(claims) / len(claims))
            commit_all[h].extend(commits)
            store.delete(tid)
    client.close()
    rows = []
    base = sizes[0]
    for h in sizes:
        rows.append(
            {
                "history": h,
                "commit_us": summary(commit_means[h], 1),
                "claim_us": summary(claim_means[h], 1),
                "commit_latency_us": latency_summary(commit_all[h]),
                "commit_vs_smallest": summary(
                    [a / b for a, b in zip(commit_means[h], commit_means[base], strict=True)], 3
                ),
                **memory[h],
            }
        )
    target_h = 10_000 if 10_000 in sizes else sizes[-1]
    return {
        "title": "History growth: commit time and memory against stored history (2 new messages per commit)",
        "unit": "us per commit (mean of a batch; median and p10/p90 over rounds)",
        "message_bytes": MESSAGE_BYTES,
        "cycles_per_round": cycles,
        "rounds": rounds,
        "note": f"each timed batch starts at H stored messages and adds {2 * cycles} by its end",
        "rows": rows,
        "ratio_target_history": target_h,
        "ratio": {
            **summary([a / b for a, b in zip(commit_means[target_h], commit_means[base], strict=True)], 3),
            "quiet": round(percentile(commit_means[target_h], 10) / percentile(commit_means[base], 10), 3),
        },
    }
