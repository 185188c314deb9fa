"""How soon the holder of a task learns that it was cancelled.

``python -m benchmarks.cancel_delivery [--cancels 200] [--fallback 200]``: on a private
redis-server, a worker holds a task under a lease while another client (its own store and
connection, as an operator's or the application's would be) calls ``store.cancel``. Timed
from just before the ``cancel`` call to the moment the holder's work is stopped:

- ``async, announced``: an ``AsyncLease`` (30 s lease, renewals every 7.5 s) whose ``async with``
  body awaits; timed until the body sees its ``CancelledError``;
- ``sync, announced``: a ``Lease`` (the same knobs) on its keeper thread; timed until
  ``lease.lost_event`` is set (a sync handler's result is dropped from then on);
- ``sync, renewal only``: the same with the announcement switched off (as for a user whose
  ACL lacks the channels), with a 1 s lease renewed every 250 ms, cancelled at a random point
  of the interval: the cancel is found by the next renewal.

Each cancel is of a fresh task, claimed just before; the holders' store keeps its wake-up
subscription up between them, as a worker's does. p50/p90/p99/max in ms. ``--readme``
rewrites the ``cancel_delivery`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time
import uuid
from typing import Any

import redis
import redis.asyncio as aredis

from redis_agentstate import AsyncCheckpointStore, Checkpoint, CheckpointStore, LeaseLost
from redis_agentstate.embedded import start_embedded

from . import report
from ._util import command_line, percentile, run_meta

LEASE_MS = 30_000
FALLBACK_LEASE_MS, FALLBACK_INTERVAL_MS = 1_000, 250
#: A holder not told within this long counts as a miss (it would be reported as such).
GIVE_UP_S = 10.0


def _pct(values: list[float], q: float) -> float:
    return percentile(values, q * 100)


def sync_run(url: str, n: int, *, announced: bool) -> list[float]:
    ns = f"cd-{uuid.uuid4().hex[:6]}"
    holder = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    canceller = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    knobs: dict[str, Any] = {"lease_ms": LEASE_MS}
    if not announced:
        holder._watch_cancel = None  # type: ignore[assignment]
        knobs = {"lease_ms": FALLBACK_LEASE_MS, "renew_interval_ms": FALLBACK_INTERVAL_MS}
    out: list[float] = []
    for i in range(n + 1):
        tid = f"task-{i}"
        holder.create(Checkpoint(tid))
        with holder.lease(tid, 1, **knobs) as lease:
            # The first lease starts the subscription. Without the announcement, the cancel lands at a
            # random point of the renew interval, as a real one would.
            time.sleep(0.3 if i == 0 else 0.005 if announced else random.uniform(0.005, FALLBACK_INTERVAL_MS / 1000))
            sent = time.perf_counter()
            assert canceller.cancel(tid, reason="bench")
            told = lease.lost_event.wait(GIVE_UP_S)
            took = time.perf_counter() - sent
            assert told and lease.cancelled is not None, "the holder was not told"
        if i:  # the first one warms the scripts up
            out.append(took * 1000)
    holder.client.close()
    canceller.client.close()
    return out


async def async_run(url: str, n: int) -> list[float]:
    ns = f"cd-{uuid.uuid4().hex[:6]}"
    holder = AsyncCheckpointStore(aredis.Redis.from_url(url), namespace=ns)
    canceller = AsyncCheckpointStore(aredis.Redis.from_url(url), namespace=ns)
    out: list[float] = []
    for i in range(n + 1):
        tid = f"task-{i}"
        await holder.create(Checkpoint(tid))
        stopped = 0.0
        ready = asyncio.Event()

        async def hold(task_id: str, ready: asyncio.Event) -> None:
            nonlocal stopped
            try:
                async with holder.lease(task_id, 1, lease_ms=LEASE_MS):
                    ready.set()
                    try:
                        await asyncio.sleep(GIVE_UP_S)
                    except asyncio.CancelledError:
                        stopped = time.perf_counter()
                        raise
            except LeaseLost as exc:
                assert exc.cancelled, exc

        worker = asyncio.get_running_loop().create_task(hold(tid, ready))
        await ready.wait()
        await asyncio.sleep(0.3 if i == 0 else 0.005)
        sent = time.perf_counter()
        assert await canceller.cancel(tid, reason="bench")
        await asyncio.wait_for(worker, GIVE_UP_S + 5)
        assert stopped, "the body was not cancelled"
        if i:
            out.append((stopped - sent) * 1000)
    await holder.client.aclose()
    await canceller.client.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cancel_delivery", description=__doc__)
    p.add_argument("--cancels", type=int, default=200, help="cancels per announced contender")
    p.add_argument("--fallback", type=int, default=200, help="cancels for the renewal-only contender (0: skip)")
    p.add_argument("--readme", action="store_true", help="rewrite the cancel_delivery block of benchmarks/README.md")
    args = p.parse_args(argv)
    logging.getLogger("redis_agentstate").setLevel(logging.ERROR)  # a cancelled lease logs a warning per cancel
    server = start_embedded(prefer="redis-server")
    results: dict[str, list[float]] = {}
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.cancel_delivery", argv), admin)
        results["async, announced"] = asyncio.run(async_run(server.url, args.cancels))
        results["sync, announced"] = sync_run(server.url, args.cancels, announced=True)
        if args.fallback:
            results["sync, renewal only"] = sync_run(server.url, args.fallback, announced=False)
    finally:
        server.stop()
    for name, ms in results.items():
        print(
            f"{name}: p50 {_pct(ms, 0.5):.2f} ms, p90 {_pct(ms, 0.9):.2f} ms, p99 {_pct(ms, 0.99):.2f} ms, "
            f"max {max(ms):.2f} ms over {len(ms)} cancels"
        )
    if args.readme:
        report.publish(meta, "cancel_delivery", results, {"cancels": args.cancels, "fallback": args.fallback})
    return 0


LABELS = {
    "async, announced": f"`AsyncLease` body cancelled (lease {LEASE_MS} ms, renewals every {LEASE_MS // 4} ms)",
    "sync, announced": f"`Lease.lost_event` set (lease {LEASE_MS} ms, renewals every {LEASE_MS // 4} ms)",
    "sync, renewal only": (
        f"`Lease.lost_event` set without the announcement (lease {FALLBACK_LEASE_MS} ms, "
        f"renewals every {FALLBACK_INTERVAL_MS} ms)"
    ),
}


def markdown(results: dict[str, list[float]], params: dict[str, Any]) -> str:
    """The cancel_delivery block: the delay percentiles of each contender."""
    lines = [
        "Time from `store.cancel` (another client) to the holder's work being stopped, one cancel at a time, "
        "each of a freshly claimed task; ms.",
        "",
        "| holder | cancels | p50 | p90 | p99 | max |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, ms in results.items():
        lines.append(
            f"| {LABELS[name]} | {len(ms)} | {_pct(ms, 0.5):.2f} | {_pct(ms, 0.9):.2f} | {_pct(ms, 0.99):.2f} | "
            f"{max(ms):.2f} |"
        )
    announced = [ms for name, ms in results.items() if "announced" in name]
    worst = max(_pct(ms, 0.99) for ms in announced)
    lines += ["", f"- Announced: worst p99 {worst:.2f} ms (target: at most 50 ms)."]
    if "sync, renewal only" in results:
        fb = results["sync, renewal only"]
        lines.append(
            f"- Renewal only: p99 {_pct(fb, 0.99):.0f} ms against a renew interval of {FALLBACK_INTERVAL_MS} ms "
            "(target: at most one renew interval, plus the renewal's round trip)."
        )
    lines.append(f"- Median of the announced p50s: {statistics.median(_pct(ms, 0.5) for ms in announced):.2f} ms.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
