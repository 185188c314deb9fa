"""Idle cost and wake-up latency of ``claim_next(block_ms=...)`` against the polling Runner loop it replaced.

Opt-in, on a private ``redis-server`` (never a shared one)::

    python -m benchmarks.blocking                 # ~2 min
    python -m benchmarks.blocking --window 5 --rounds 1 --samples 40   # quick

Measured side by side in one run, alternating per round:

* **idle**: 200 idle async workers in one process (one ``AsyncCheckpointStore``), for ``--window`` s:
  *polling* is the Runner's former idle loop (``claim_next`` without blocking, then a jittered
  exponential sleep of 50..2000 ms); *blocking* is today's (``claim_next(block_ms=2000)`` in a
  loop). Server CPU is the ``used_cpu_sys + used_cpu_user`` delta of ``INFO CPU`` over the window,
  as % of one core.
* **latency**: 20 blocked workers; a second client creates one task every 50 ms; the time from
  just before ``create`` to the ``claim_next`` that returns it (same process, monotonic clock).
* **claim_next when due** (100 and 10,000 due tasks): server us per call from ``INFO commandstats``
  (see ``_server_us``) and client p50, for the candidate path (today: one script) against the peek
  path (forced: 64 shard heads, then a script), and a no-op EVALSHA as the floor.
* **cycle_server_us_1kib**: server us per cycle of one task with 1 KiB of state, claim + commit and
  commit_and_claim.
* **no_workers**: the idle server's own CPU over the same window (its cron), for reference.

``--readme`` rewrites the ``blocking`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import redis
import redis.asyncio as aioredis

from redis_agentstate import AgentStatus, AsyncCheckpointStore, Checkpoint, CheckpointStore
from redis_agentstate.testing import internals

from . import report
from ._util import command_line, make_state, percentile, run_meta

__all__ = ["main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _running(tid: str) -> Checkpoint:
    return Checkpoint(task_id=tid, cycle_index=0, status=AgentStatus.RUNNING)


async def _idle(url: str, mode: str, workers: int, window: float) -> float:
    """Server CPU (% of a core) of ``workers`` idle workers over ``window`` seconds."""
    client = aioredis.Redis.from_url(url)
    store = AsyncCheckpointStore(client, namespace=f"idle{uuid.uuid4().hex[:8]}")
    probe = redis.Redis.from_url(url)
    stop = asyncio.Event()

    async def worker() -> None:
        polls = 0
        while not stop.is_set():
            if mode == "blocking":
                await store.claim_next(token=uuid.uuid4().hex, lease_ms=30_000, block_ms=2_000)
            else:
                await store.claim_next(token=uuid.uuid4().hex, lease_ms=30_000)
                cap = min(2_000, 50 * 2 ** min(polls, 30))
                polls += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), random.uniform(50, cap) / 1000)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    await asyncio.sleep(3)  # warm up: connections made, backoffs at their cap, subscription up
    cpu0, t0 = _server_cpu(probe), time.monotonic()
    await asyncio.sleep(window)
    cpu1, t1 = _server_cpu(probe), time.monotonic()
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()
    probe.close()
    return 100 * (cpu1 - cpu0) / (t1 - t0)


async def _latency(url: str, mode: str, samples: int) -> list[float]:
    """ms from create to claimed, ``samples`` tasks, 20 workers."""
    client = aioredis.Redis.from_url(url)
    ns = f"lat{uuid.uuid4().hex[:8]}"
    store = AsyncCheckpointStore(client, namespace=ns)
    peer = AsyncCheckpointStore(aioredis.Redis.from_url(url), namespace=ns)
    created: dict[str, float] = {}
    took: list[float] = []

    stop = asyncio.Event()

    async def worker() -> None:
        # A flag, not only cancel(): redis-py 8.1 on Python 3.11 sometimes swallows a cancel that
        # lands during a round trip (the call returns normally), and the loop would go on.
        polls = 0
        while not stop.is_set():
            if mode == "blocking":
                cp = await store.claim_next(token=uuid.uuid4().hex, lease_ms=60_000, block_ms=2_000)
            else:
                cp = await store.claim_next(token=uuid.uuid4().hex, lease_ms=60_000)
                if cp is None:
                    cap = min(2_000, 50 * 2 ** min(polls, 30))
                    polls += 1
                    await asyncio.sleep(random.uniform(50, cap) / 1000)
                    continue
            if cp is not None:
                polls = 0
                took.append((time.monotonic() - created[cp.task_id]) * 1000)

    tasks = [asyncio.create_task(worker()) for _ in range(20)]
    await asyncio.sleep(3)
    for i in range(samples):
        tid = f"t{i}"
        created[tid] = time.monotonic()
        await peer.create(_running(tid))
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + 10
    while len(took) < samples and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()
    await peer.client.aclose()
    return took


def _server_us(stats: dict[str, Any], calls: int) -> float:
    """Server us per call from ``INFO commandstats`` over ``calls`` claim_next calls.

    Redis 7 also counts the commands a script runs under their own names, and EVALSHA's usec
    already includes them: so EVALSHA's usec, plus ZRANGE's (only the peek sends it here: a
    claim's script needs none when it wins), plus the client's TIME (one per peek; every
    script reads TIME once, and those are inside EVALSHA's usec).
    """
    evalsha = stats.get("cmdstat_evalsha", {"usec": 0, "calls": 0})
    zrange = stats.get("cmdstat_zrange", {"usec": 0, "calls": 0})
    time_ = stats.get("cmdstat_time", {"usec": 0, "calls": 0})
    client_time = max(0, int(time_["calls"]) - int(evalsha["calls"]))
    time_us = float(time_["usec"]) / max(1, int(time_["calls"])) * client_time
    return (float(evalsha["usec"]) + float(zrange["usec"]) + time_us) / calls


def _busy(url: str, n_tasks: int, calls: int, rounds: int) -> dict[str, Any]:
    """claim_next with ``n_tasks`` due: the candidate path (today) against the peek path (forced), a no-op floor.

    Interleaved per round on one connection; per round: server us per call and client p50 ms.
    """
    client = redis.Redis.from_url(url)
    store = CheckpointStore(client, namespace=f"us{uuid.uuid4().hex[:8]}")
    for i in range(n_tasks):
        store.create(_running(f"t{i}"))
    noop = client.register_script("return 1")
    noop()
    out: dict[str, dict[str, list[float]]] = {
        k: {"server_us": [], "p50_ms": [], "round_trips": []} for k in ("candidates", "peek", "noop_evalsha")
    }
    core = internals(store).core  # the one knob: forcing the peek path for the side-by-side row
    for _ in range(rounds):
        for mode in random.sample(list(out), 3):
            core.claim_next_candidate_age_s = 0.0 if mode == "peek" else 1.0
            store.claim_next(token="warm", lease_ms=1)  # a peek: candidates fresh for the next calls
            client.config_resetstat()
            lat = []
            for _ in range(calls):
                t0 = time.perf_counter()
                if mode == "noop_evalsha":
                    noop()
                else:
                    # A 1 ms lease: the task is due again at once, so the namespace keeps n_tasks due.
                    assert store.claim_next(token=uuid.uuid4().hex, lease_ms=1) is not None
                lat.append((time.perf_counter() - t0) * 1000)
            stats = client.info("commandstats")
            out[mode]["server_us"].append(round(_server_us(stats, calls), 1))
            out[mode]["p50_ms"].append(round(percentile(lat, 50), 3))
            pipelines = int(stats.get("cmdstat_time", {"calls": 0})["calls"]) - int(
                stats.get("cmdstat_evalsha", {"calls": 0})["calls"]
            )
            out[mode]["round_trips"].append(round(1 + max(0, pipelines) / calls, 2) if mode != "noop_evalsha" else 1)
    core.claim_next_candidate_age_s = 1.0
    client.close()
    return {"tasks": n_tasks, "calls_per_round": calls, **out}


def _cycle_costs(url: str, cycles: int, rounds: int) -> dict[str, list[float]]:
    """Server us per cycle of one task with 1 KiB of state: claim + commit, and commit_and_claim (part 5)."""
    client = redis.Redis.from_url(url)
    store = CheckpointStore(client, namespace=f"cyc{uuid.uuid4().hex[:8]}")
    out: dict[str, list[float]] = {"claim_plus_commit": [], "commit_and_claim": []}
    for r in range(rounds):
        for mode in random.sample(list(out), 2):
            tid = f"{mode}-{r}"
            store.create(_running(tid))
            cp = store.claim(tid, 1, token="w", lease_ms=60_000)
            assert cp is not None
            client.config_resetstat()
            for _ in range(cycles):
                cp.cycle_index = cp.claimed_cycle or 0
                cp.shared_state = make_state(1024, seed=cp.cycle_index)
                if mode == "commit_and_claim":
                    nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=60_000)
                else:
                    assert store.commit(cp, token="w", expected_revision=cp.revision)
                    nxt = store.claim(tid, cp.cycle_index + 1, token="w", lease_ms=60_000)
                assert nxt is not None
                cp = nxt
            stats = client.info("commandstats")
            out[mode].append(round(_server_us(stats, cycles), 1))
    client.close()
    return out


async def _baseline(url: str, window: float) -> float:
    probe = redis.Redis.from_url(url)
    cpu0, t0 = _server_cpu(probe), time.monotonic()
    await asyncio.sleep(window)
    cpu1, t1 = _server_cpu(probe), time.monotonic()
    probe.close()
    return 100 * (cpu1 - cpu0) / (t1 - t0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--readme", action="store_true", help="rewrite the blocking block of benchmarks/README.md")
    args = parser.parse_args(argv)
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server must be on PATH")
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="agentstate-bench-")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        meta = run_meta(command_line("python -m benchmarks.blocking", argv), redis.Redis.from_url(url))
        idle: dict[str, list[float]] = {"polling": [], "blocking": [], "no_workers": []}
        latency: dict[str, list[float]] = {"polling": [], "blocking": []}
        for _ in range(args.rounds):
            for mode in random.sample(["polling", "blocking", "no_workers"], 3):
                if mode == "no_workers":
                    idle[mode].append(asyncio.run(_baseline(url, args.window)))
                else:
                    idle[mode].append(asyncio.run(_idle(url, mode, args.workers, args.window)))
            for mode in random.sample(["polling", "blocking"], 2):
                latency[mode].extend(asyncio.run(_latency(url, mode, args.samples)))
        busy = [_busy(url, n, 300, args.rounds) for n in (100, 10_000)]
        cycle = _cycle_costs(url, 300, args.rounds)
        out: dict[str, Any] = {
            "idle_server_cpu_pct": {m: [round(v, 3) for v in vs] for m, vs in idle.items()},
            "idle_ratio_polling_over_blocking": [
                round(p / b, 1) if b > 0 else None for p, b in zip(idle["polling"], idle["blocking"], strict=True)
            ],
            "create_to_claimed_ms": {
                m: {"n": len(v), "p50": round(percentile(v, 50), 2), "p99": round(percentile(v, 99), 2)}
                for m, v in latency.items()
                if v
            },
            "claim_next_when_due": busy,
            "cycle_server_us_1kib": cycle,
        }
        print(json.dumps(out, indent=2))
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.readme:
        params = {"rounds": args.rounds, "workers": args.workers, "window": args.window}
        report.publish(meta, "blocking", out, params)


def _vals(values: list[float], digits: int = 1) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def markdown(out: dict[str, Any], params: dict[str, Any]) -> str:
    """The blocking block: every row side by side in one run, per-round values in run order."""
    args = argparse.Namespace(**params)
    idle, lat = out["idle_server_cpu_pct"], out["create_to_claimed_ms"]
    med = {m: percentile(v, 50) for m, v in idle.items()}
    b, p = lat.get("blocking", {}), lat.get("polling", {})
    lines = [
        f"{args.rounds} round(s), the contenders of a row interleaved in shuffled order per round; per-round "
        "values in run order. *Polling* is the Runner's former idle loop (claim_next without blocking, then a "
        "full-jitter sleep growing from 50 ms to 2 s) for the idle and latency rows, and the peek path (64 "
        "shard heads, then a script; forced) for the rows with work due.",
        "",
        "| figure | goal | blocking: claim_next(block_ms=) | polling | per-round ratio | met |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| server CPU of {args.workers} idle async workers in one process, % of a core over {args.window:g} s "
        f"| <= 2% | {_vals(idle['blocking'], 3)} | {_vals(idle['polling'], 3)} "
        f"| polling / blocking {_vals([r or 0 for r in out['idle_ratio_polling_over_blocking']])}x "
        f"| {_yes(med['blocking'] <= 2)} |",
        f"| the same server with no workers (its own cron), for reference | - | {_vals(idle['no_workers'], 3)} "
        "| | | - |",
    ]
    if b and p:
        lines.append(
            f"| create -> claimed, 20 blocked workers, a create every 50 ms ({b['n']} samples), ms "
            f"| p50 <= 10, p99 <= 50 | p50 {b['p50']:.2f}, p99 {b['p99']:.2f} | p50 {p['p50']:.2f}, p99 {p['p99']:.2f} "
            f"| p50 {p['p50'] / b['p50']:.1f}x, p99 {p['p99'] / b['p99']:.1f}x "
            f"| {_yes(b['p50'] <= 10 and b['p99'] <= 50)} |"
        )
    for due in out["claim_next_when_due"]:
        cand, peek, noop = due["candidates"], due["peek"], due["noop_evalsha"]
        n = f"{due['tasks']:,} due tasks"
        rt = percentile(cand["round_trips"], 50)
        lines.append(
            f"| claim_next with work due, round trips per call, {n} | 1 | {_vals(cand['round_trips'], 2)} "
            f"| {_vals(peek['round_trips'], 2)} | | {_yes(rt <= 1.05)} |"
        )
        ratios = [pk / c for pk, c in zip(peek["server_us"], cand["server_us"], strict=True)]
        lines.append(
            f"| claim_next with work due, server us per call, {n} | <= 20 | {_vals(cand['server_us'])} "
            f"| {_vals(peek['server_us'])} | peek / candidates {_vals(ratios)}x "
            f"| {_yes(percentile(cand['server_us'], 50) <= 20)} |"
        )
        lines.append(
            f"| claim_next with work due, client p50 ms, {n} | - | {_vals(cand['p50_ms'], 3)} "
            f"| {_vals(peek['p50_ms'], 3)} | | - |"
        )
        lines.append(
            f"| no-op EVALSHA in the same rounds (floor), {n}: server us; client p50 ms | - "
            f"| {_vals(noop['server_us'])}; {_vals(noop['p50_ms'], 3)} | | | - |"
        )
    cyc = out["cycle_server_us_1kib"]
    lines += [
        "",
        "Server us per cycle of one task with 1 KiB of state (300 cycles per round, per round): "
        f"claim + commit {_vals(cyc['claim_plus_commit'])}; commit_and_claim {_vals(cyc['commit_and_claim'])}. "
        "Server us per claim_next is EVALSHA's usec from `INFO commandstats` (which includes the commands its "
        "script runs) plus the peek's ZRANGEs and its TIME.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
