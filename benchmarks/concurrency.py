"""Figure 3: throughput and latency under concurrency, and where the bottleneck sits.

* async: ``AsyncCheckpointStore`` on one event loop with N concurrent tasks
  (each loops claim + commit on its own agent task; one ``redis.asyncio``
  client, its pool opens a connection per concurrent request);
* async_continued: the same with each task looping ``commit_and_claim``
  (one script per cycle, the Runner's steady state);
* procs: N worker processes, each a sync ``CheckpointStore`` on its own
  connection looping claim + commit on its own task.

Every configuration runs for a fixed window; all are interleaved in a shuffled
order within each round. CPU is sampled over the window from
``time.process_time`` (client processes) and ``/proc/<pid>/stat`` of the
redis-server, and reported in cores used (1.0 = one core busy).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import time
from typing import Any

import redis.asyncio as aioredis

from redis_agentstate import AsyncCheckpointStore, Checkpoint, CheckpointStore

from ._util import CpuWindow, Settings, latency_summary, make_state, summary

STATE_BYTES = 1024


# ---- async ---------------------------------------------------------------------


async def _async_config(
    settings: Settings, n_tasks: int, window_s: float, tag: str, *, continued: bool = False
) -> dict[str, Any]:
    """``continued``: each task loops ``commit_and_claim`` (one script per cycle) instead of claim + commit."""
    client = aioredis.Redis.from_url(settings.url, max_connections=n_tasks + 8)
    store = AsyncCheckpointStore(client, namespace=settings.ns(f"conc-{tag}"))
    state = make_state(STATE_BYTES)
    ids = [f"a{n_tasks}-{i}" for i in range(n_tasks)]
    for tid in ids:
        await store.delete(tid)
        await store.create(Checkpoint(tid, shared_state=dict(state)))
    lat: list[float] = []
    done = [0]
    stop_at = [0.0]
    clock = time.perf_counter_ns

    async def worker(tid: str) -> None:
        n = 0
        held = None
        if continued:
            held = await store.claim(tid, 1, token="w", lease_ms=30_000)
        while True:
            n += 1
            t0 = clock()
            if held is not None:
                held.cycle_index = n
                held = await store.commit_and_claim(held, token="w", expected_revision=held.revision, lease_ms=30_000)
                if held is None:
                    raise RuntimeError("commit_and_claim fenced out")
                t1 = clock()
                if t1 / 1e9 >= stop_at[0]:
                    return
                lat.append((t1 - t0) / 1000)
                done[0] += 1
                continue
            cp = await store.claim(tid, n, token="w", lease_ms=30_000)
            assert cp is not None
            cp.cycle_index = n
            if not await store.commit(cp, token="w", expected_revision=cp.revision):
                raise RuntimeError("commit fenced out")
            t1 = clock()
            if t1 / 1e9 >= stop_at[0]:
                return
            lat.append((t1 - t0) / 1000)
            done[0] += 1

    # One untimed cycle per task opens every connection the pool will need.
    stop_at[0] = 0.0
    await asyncio.gather(*(worker(t) for t in ids))
    lat.clear()
    done[0] = 0
    for tid in ids:
        await store.delete(tid)
        await store.create(Checkpoint(tid, shared_state=dict(state)))
    cpu = CpuWindow(settings.server_pid)
    cpu.start()
    stop_at[0] = time.perf_counter_ns() / 1e9 + window_s
    await asyncio.gather(*(worker(t) for t in ids))
    usage = cpu.stop()
    for tid in ids:
        await store.delete(tid)
    await client.aclose()
    wall = usage["wall_s"] or window_s
    return {"cycles": done[0], "wall_s": wall, "latencies": lat, **_cores(usage)}


# ---- processes ------------------------------------------------------------------


def _proc_worker(url: str, ns: str, idx: int, window_s: float, barrier: Any, out: Any) -> None:
    import redis

    client = redis.Redis.from_url(url)
    store = CheckpointStore(client, namespace=ns)
    tid = f"p-{idx}"
    store.delete(tid)
    store.create(Checkpoint(tid, shared_state=make_state(STATE_BYTES)))
    n = 0
    for _ in range(5):  # warm-up
        n += 1
        cp = store.claim(tid, n, token="w", lease_ms=30_000)
        assert cp is not None
        cp.cycle_index = n
        store.commit(cp, token="w", expected_revision=cp.revision)
    barrier.wait()
    cpu0 = time.process_time()
    t_start = time.perf_counter()
    stop_at = t_start + window_s
    lat: list[float] = []
    clock = time.perf_counter
    while True:
        n += 1
        t0 = clock()
        cp = store.claim(tid, n, token="w", lease_ms=30_000)
        assert cp is not None
        cp.cycle_index = n
        if not store.commit(cp, token="w", expected_revision=cp.revision):
            raise RuntimeError("commit fenced out")
        t1 = clock()
        if t1 >= stop_at:
            break
        lat.append((t1 - t0) * 1e6)
    wall = clock() - t_start
    out.put({"cycles": len(lat), "latencies": lat, "cpu_s": time.process_time() - cpu0, "wall_s": wall})
    store.delete(tid)
    client.close()


def _procs_config(settings: Settings, n_procs: int, window_s: float, tag: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n_procs + 1)
    out = ctx.Queue()
    ns = settings.ns(f"conc-{tag}")
    procs = [
        ctx.Process(target=_proc_worker, args=(settings.url, ns, i, window_s, barrier, out), daemon=True)
        for i in range(n_procs)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=60)
    cpu = CpuWindow(settings.server_pid)
    cpu.start()
    results = [out.get(timeout=60 + window_s) for _ in procs]
    usage = cpu.stop(client_cpu_s=sum(r["cpu_s"] for r in results))
    for p in procs:
        p.join(timeout=10)
    lat: list[float] = []
    for r in results:
        lat.extend(r["latencies"])
    worker_wall = max(r["wall_s"] for r in results)
    return {"cycles": sum(r["cycles"] for r in results), "wall_s": worker_wall, "latencies": lat, **_cores(usage)}


def _cores(usage: dict[str, float | None]) -> dict[str, float | None]:
    """Cores used by the client(s), the server, and everything else on the machine."""
    client, server, machine = usage["client_cores"], usage["server_cores"], usage["machine_cores"]
    other = None if machine is None else round(max(machine - (client or 0.0) - (server or 0.0), 0.0), 3)
    return {"client_cores": client, "server_cores": server, "other_cores": other}


# ---- driver ---------------------------------------------------------------------------


def _bottleneck(row: dict[str, Any], cores: int) -> str:
    client = row["client_cores"]["median"]
    server = row["server_cores"]["median"] if row.get("server_cores") else None
    other = row["other_cores"]["median"] if row.get("other_cores") else 0.0
    is_async = row["mode"].startswith("async")
    client_cap = 1.0 if is_async else min(row["n"], cores)
    total = client + (server or 0.0) + other
    if server is not None and server >= 0.85:
        return "server CPU (redis-server's one thread is saturated)"
    if total >= 0.85 * cores:
        return (
            f"machine CPU: client {client:.2f} + server {server or 0.0:.2f} + other processes {other:.2f}"
            f" of {cores} cores"
        )
    if client >= 0.85 * client_cap:
        return "client CPU" + (" (one event loop = one core)" if is_async else "")
    return "round-trip latency (neither CPU is saturated; each request waits for its reply)"


def _opt_summary(values: list[float | None]) -> dict[str, Any] | None:
    if any(v is None for v in values):
        return None
    return summary([float(v) for v in values if v is not None], 2)


def run(settings: Settings) -> dict[str, Any]:
    if settings.quick:
        async_levels, proc_levels, window = [1, 8], [1, 2], 0.4
    else:
        async_levels, proc_levels, window = [1, 8, 64, 256], [1, 2, 4, 8], 2.0
    rounds = settings.rounds if settings.quick else max(3, settings.rounds // 3)
    # async_continued: the same tasks looping commit_and_claim (the async goal is stated at 64 tasks).
    continued_levels = [8] if settings.quick else [64]
    configs = (
        [("async", n) for n in async_levels]
        + [("async_continued", n) for n in continued_levels]
        + [("procs", n) for n in proc_levels]
    )
    raw: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configs}
    rng = random.Random(settings.seed + 3)
    for r in range(rounds):
        order = list(configs)
        rng.shuffle(order)
        for mode, n in order:
            tag = f"{mode}{n}-{r}"
            if mode.startswith("async"):
                res = asyncio.run(_async_config(settings, n, window, tag, continued=mode == "async_continued"))
            else:
                res = _procs_config(settings, n, window, tag)
            raw[(mode, n)].append(res)
    cores = os.cpu_count() or 1
    rows = []
    for mode, n in configs:
        runs = raw[(mode, n)]
        lat: list[float] = []
        for x in runs:
            lat.extend(x["latencies"])
        row: dict[str, Any] = {
            "mode": mode,
            "n": n,
            "cycles_per_s": summary([x["cycles"] / x["wall_s"] for x in runs], 0),
            "latency_us": latency_summary(lat),
            "client_cores": summary([x["client_cores"] for x in runs], 2),
            "server_cores": _opt_summary([x["server_cores"] for x in runs]),
            "other_cores": _opt_summary([x["other_cores"] for x in runs]),
        }
        row["bottleneck"] = _bottleneck(row, cores)
        rows.append(row)
    return {
        "title": "Concurrency: claim + commit (async_continued: commit_and_claim) cycles/s and latency (1 KiB state)",
        "window_s": window,
        "rounds": rounds,
        "cores": cores,
        "network": "loopback only: no network in the path; the client and the server share the machine's cores",
        "rows": rows,
    }
