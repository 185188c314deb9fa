"""How punctually a delayed cycle is claimed: due time to claim, with a crowd of idle blocked workers.

``python -m benchmarks.timers [--workers 200] [--timers 200] [--rounds 3]``: on a private
redis-server, ``--workers`` idle workers block in ``claim_next(block_ms=...)`` (an asyncio store:
coroutines sharing its one wake-up subscription; then a sync store: threads, likewise), and
``--timers`` tasks are created with ``delay_ms`` spread over 0.3-3 s, so they fall due one by one
while every worker sleeps. For each claim: its server time (the lease expiry the claim script set,
minus the lease) minus the task's due time (``due_at_ms``, set by the same server clock): how late
the claim came (never negative: a claim before the due time is refused in the script, and the run
fails if one is seen). Both crowds block ``BLOCK_MS`` (10 s) per call: idle, each thread re-peeks
only that often (with 1 s blocks, 200 threads re-peeking 200 times a second saturated this machine's
two cores and made the timers late by up to 400 ms). p50/p90/p99/max in ms over every timer of every round. ``--readme``
rewrites the ``timers`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import threading
import time
import uuid
from typing import Any

import redis
import redis.asyncio as aredis

from redis_agentstate import AgentStatus, AsyncCheckpointStore, Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded

from . import report
from ._util import command_line, percentile, run_meta

LEASE_MS = 30_000
BLOCK_MS = 10_000
DELAY_MIN_MS, DELAY_MAX_MS = 300, 3_000


def _pct(values: list[float], q: float) -> float:
    return percentile(values, q * 100)


def _done(cp: Checkpoint) -> Checkpoint:
    cp.cycle_index = cp.claimed_cycle or 0
    cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"on_time": True}
    return cp


def _lateness(cp: Checkpoint) -> float:
    claimed_at = (cp.lease_expires_at_ms or 0) - LEASE_MS
    assert cp.due_at_ms is not None, "a delayed task was claimed without its due time"
    late = claimed_at - cp.due_at_ms
    assert late >= 0, f"claimed {-late} ms before it was due"
    return float(late)


async def async_round(url: str, workers: int, timers: int) -> list[float]:
    ns = f"tm-{uuid.uuid4().hex[:6]}"
    client = aredis.Redis.from_url(url, socket_timeout=None)
    store = AsyncCheckpointStore(client, namespace=ns)
    late: list[float] = []
    left = timers

    async def worker(i: int) -> None:
        nonlocal left
        while left > 0:
            cp = await store.claim_next(token=f"w{i}", lease_ms=LEASE_MS, block_ms=BLOCK_MS)
            if cp is None:
                continue
            late.append(_lateness(cp))
            left -= 1
            await store.commit(_done(cp), token=f"w{i}", expected_revision=cp.revision)

    tasks = [asyncio.get_running_loop().create_task(worker(i)) for i in range(workers)]
    await asyncio.sleep(1.0)  # every worker blocked, the subscription up
    for n in range(timers):
        await store.create(Checkpoint(f"t{n}"), delay_ms=random.randint(DELAY_MIN_MS, DELAY_MAX_MS))
    while left > 0:
        await asyncio.sleep(0.05)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()
    return late


def sync_round(url: str, workers: int, timers: int) -> list[float]:
    ns = f"tm-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(url, socket_timeout=None, max_connections=workers + 8)
    store = CheckpointStore(client, namespace=ns)
    late: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    claimed = 0

    def worker(i: int) -> None:
        nonlocal claimed
        while not done.is_set():
            cp = store.claim_next(token=f"w{i}", lease_ms=LEASE_MS, block_ms=BLOCK_MS)
            if cp is None or done.is_set():
                continue
            with lock:
                late.append(_lateness(cp))
                claimed += 1
                if claimed == timers:
                    done.set()
            store.commit(_done(cp), token=f"w{i}", expected_revision=cp.revision)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    for n in range(timers):
        store.create(Checkpoint(f"t{n}"), delay_ms=random.randint(DELAY_MIN_MS, DELAY_MAX_MS))
    done.wait(60)
    for n in range(workers):  # wakes every blocked thread, which sees the round is over
        store.create(Checkpoint(f"stop-{n}"))
    for t in threads:
        t.join(5)
    client.close()
    return late


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timers", description=__doc__)
    p.add_argument("--workers", type=int, default=200, help="idle workers blocked in claim_next")
    p.add_argument("--timers", type=int, default=200, help="delayed tasks per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--readme", action="store_true", help="rewrite the timers block of benchmarks/README.md")
    args = p.parse_args(argv)
    # Closing a round's client under its lingering listener logs the subscription going down.
    logging.getLogger("redis_agentstate").setLevel(logging.ERROR)
    server = start_embedded(prefer="redis-server")
    results: dict[str, list[float]] = {"async": [], "sync": []}
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.timers", argv), admin)
        for rnd in range(args.rounds):
            a = asyncio.run(async_round(server.url, args.workers, args.timers))
            s = sync_round(server.url, args.workers, args.timers)
            results["async"] += a
            results["sync"] += s
            print(f"round {rnd + 1}: async p99 {_pct(a, 0.99):.1f} ms, sync p99 {_pct(s, 0.99):.1f} ms", flush=True)
    finally:
        server.stop()
    for name, ms in results.items():
        print(
            f"{name}: p50 {_pct(ms, 0.5):.1f} ms, p90 {_pct(ms, 0.9):.1f} ms, p99 {_pct(ms, 0.99):.1f} ms, "
            f"max {max(ms):.1f} ms late over {len(ms)} timers (earliest {min(ms):.0f} ms: never early)"
        )
    if args.readme:
        params = {"workers": args.workers, "timers": args.timers, "rounds": args.rounds}
        report.publish(meta, "timers", results, params)
    return 0


def markdown(results: dict[str, list[float]], params: dict[str, Any]) -> str:
    """The timers block: how late each kind of crowd claimed its timers."""
    labels = {
        "async": f"{params['workers']} coroutines blocked on one `AsyncCheckpointStore`",
        "sync": f"{params['workers']} threads blocked on one `CheckpointStore`",
    }
    lines = [
        f"{params['rounds']} rounds of {params['timers']} tasks created with `delay_ms` spread over "
        f"{DELAY_MIN_MS}-{DELAY_MAX_MS} ms while every worker blocks in `claim_next(block_ms=...)`; "
        "lateness = the claim's server time minus the task's due time (one server clock), ms.",
        "",
        "| idle workers | timers | p50 | p90 | p99 | max | earliest |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, ms in results.items():
        lines.append(
            f"| {labels[name]} | {len(ms)} | {_pct(ms, 0.5):.1f} | {_pct(ms, 0.9):.1f} | {_pct(ms, 0.99):.1f} | "
            f"{max(ms):.1f} | {min(ms):.0f} |"
        )
    worst = max(_pct(ms, 0.99) for ms in results.values())
    early = min(min(ms) for ms in results.values())
    lines += [
        "",
        f"- Worst p99 lateness {worst:.1f} ms (target: at most 50 ms); earliest claim {early:.0f} ms after its "
        "due time (target: never early, which the claim script enforces).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
