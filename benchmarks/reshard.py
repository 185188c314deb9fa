"""Growing a live namespace: how long a reshard takes, and what the workers see while it runs.

``python -m benchmarks.reshard [--rounds 3] [--tasks 10000] [--from 64] [--to 256] [--workers 4] [--cluster 3]``:
on a private redis-server, then on a local Cluster of ``--cluster`` primaries (``tests/cluster_support``;
0: none), per round a fresh namespace of ``--tasks`` tasks (each with 4 messages
and a small shared state) at ``--from`` shards; ``--workers`` threads, each with a client of its
own, claim and commit (``claim_next``, then ``commit``) for a second, then ``CheckpointStore.reshard``
grows the namespace to ``--to`` shards while they go on, and they stop a second after it finished.

Per round: the reshard's seconds (and per 10,000 tasks), the keys it copied, the server time its
``SCAN`` took (on one server each old shard's keys are listed by a scan of the keyspace; a Cluster
lists the shard's slot instead), the longest an old shard stayed sealed
(``ReshardReport.worst_pause_ms``), and from the workers' side the slowest claim + commit cycle
during the reshard against the p99 before it; then every task is read back:
its messages are exactly the commits acknowledged for it (none lost, none applied twice).
Medians over rounds, min and max after them, one column per topology. ``--readme`` rewrites the ``reshard`` block of
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.cluster

import redis_agentstate
from redis_agentstate.embedded import start_embedded

from . import report
from ._util import command_line, percentile, run_meta


def _round(connect: Callable[[], Any], tasks: int, src: int, dst: int, workers: int) -> dict[str, float]:
    ns = f"rs-{uuid.uuid4().hex[:6]}"
    seed = redis_agentstate.CheckpointStore(connect(), namespace=ns, shards=src)
    for i in range(tasks):
        msgs = [{"role": "user", "content": f"message {j} of task {i}"} for j in range(4)]
        seed.create(redis_agentstate.Checkpoint(f"agent-{i}", messages=msgs, shared_state={"step": 0, "i": i}))
    acked: dict[str, int] = {}
    cycles: list[tuple[float, float]] = []  # (finished at, seconds) of each claim + commit
    lock = threading.Lock()
    stop = threading.Event()

    def work(n: int) -> None:
        store = redis_agentstate.CheckpointStore(connect(), namespace=ns)
        while not stop.is_set():
            t = time.monotonic()
            cp = store.claim_next(token=f"w{n}", lease_ms=30_000)
            if cp is None:
                continue
            msg = {"role": "assistant", "content": f"cycle {cp.claimed_cycle}"}
            done = dataclasses.replace(cp, cycle_index=cp.claimed_cycle, messages=[*cp.messages, msg])
            ok = store.commit(done, token=f"w{n}", expected_revision=cp.revision)
            end = time.monotonic()
            with lock:
                cycles.append((end, end - t))
                if ok:
                    acked[cp.task_id] = acked.get(cp.task_id, 0) + 1

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(workers)]
    for th in threads:
        th.start()
    time.sleep(1.0)
    mover = redis_agentstate.CheckpointStore(connect(), namespace=ns)
    scanned = _scan_usec(mover.client)
    began = time.monotonic()
    rep = mover.reshard(dst)
    ended = time.monotonic()
    scanned = _scan_usec(mover.client) - scanned
    time.sleep(1.0)
    stop.set()
    for th in threads:
        th.join(30)
    check = redis_agentstate.CheckpointStore(connect(), namespace=ns)
    wrong = 0
    for i in range(tasks):
        cp = check.load(f"agent-{i}")
        if cp is None or len(cp.messages) != 4 + acked.get(f"agent-{i}", 0):
            wrong += 1
    before = [s for at, s in cycles if at < began]
    during = [s for at, s in cycles if began <= at <= ended + 0.2]
    return {
        "seconds": ended - began,
        "per_10k_s": (ended - began) * 10_000 / tasks,
        "keys": rep.keys,
        "worst_seal_ms": rep.worst_pause_ms,
        "scan_server_ms": scanned / 1000,
        "p99_before_ms": percentile(before, 99) * 1000 if before else 0.0,
        "worst_during_ms": max(during) * 1000 if during else 0.0,
        "cycles_during": len(during),
        "commits": sum(acked.values()),
        "wrong": wrong,
        "shards_after": check.shards or 0,
    }


def _scan_usec(client: Any) -> float:
    """Server time spent in SCAN so far (only the reshard sends it: it lists each old shard's keys on
    one server; a Cluster's reshard lists each shard's slot, and sends no SCAN)."""
    if isinstance(client, redis.cluster.RedisCluster):
        return 0.0
    return float(client.info("commandstats").get("cmdstat_scan", {}).get("usec", 0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reshard", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--from", dest="src", type=int, default=64)
    p.add_argument("--to", dest="dst", type=int, default=256)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--cluster", type=int, default=3, help="primaries of the local Cluster also measured (0: none)")
    p.add_argument("--readme", action="store_true", help="rewrite the reshard block of benchmarks/README.md")
    args = p.parse_args(argv)
    data: dict[str, dict[str, list[float]]] = {}
    server = start_embedded(prefer="redis-server")
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.reshard", argv), admin)
        data["one redis-server"] = _rounds(lambda: redis.Redis.from_url(server.url), admin.flushall, args)
    finally:
        server.stop()
    if args.cluster:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from cluster_support import LocalCluster

        cluster = LocalCluster.start(args.cluster, timeout=120.0)
        try:
            nodes = cluster.sync_client()

            def flush() -> None:
                for node in nodes.get_primaries():
                    nodes.get_redis_connection(node).flushall()

            data[f"{args.cluster}-primary Cluster"] = _rounds(cluster.sync_client, flush, args)
        finally:
            cluster.stop()
    params = {"rounds": args.rounds, "tasks": args.tasks, "from": args.src, "to": args.dst, "workers": args.workers}
    print(markdown(data, params))
    if args.readme:
        report.publish(meta, "reshard", data, params)
    return 0


def _rounds(connect: Callable[[], Any], flush: Callable[[], Any], args: argparse.Namespace) -> dict[str, list[float]]:
    rounds = []
    for _ in range(args.rounds):
        rounds.append(_round(connect, args.tasks, args.src, args.dst, args.workers))
        flush()
        print({k: round(v, 1) for k, v in rounds[-1].items()}, flush=True)
    return {k: [r[k] for r in rounds] for k in rounds[0]}


def _cell(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


#: The rows of the block: (label, measure, decimals).
ROWS = [
    ("reshard, seconds", "seconds", 2),
    ("seconds per 10,000 tasks moved", "per_10k_s", 2),
    ("keys copied", "keys", 0),
    ("server time in SCAN (listing each old shard's keys), ms", "scan_server_ms", 0),
    ("longest an old shard stayed sealed, ms", "worst_seal_ms", 0),
    ("workers' claim + commit p99 before the reshard, ms", "p99_before_ms", 1),
    ("workers' slowest claim + commit during it, ms", "worst_during_ms", 0),
    ("claim + commit cycles completed during it", "cycles_during", 0),
    ("tasks whose messages are not exactly their acknowledged commits", "wrong", 0),
]


def markdown(data: dict[str, dict[str, list[float]]], params: dict[str, Any]) -> str:
    """The reshard block: the reshard's time, its seals, and the workers' slowest cycle, per topology."""
    names = list(data)
    lines = [
        f"{params['rounds']} rounds per topology, each a fresh namespace of {params['tasks']:,} tasks grown from "
        f"{params['from']} to {params['to']} shards while {params['workers']} workers claim and commit; "
        "median (min-max) over rounds. On a Cluster each old shard's keys are listed by its slot, so no SCAN.",
        "",
        "| measure | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for label, key, digits in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(data[n][key], digits) for n in names) + " |")
    return "\n".join(lines) + "\n\n"


if __name__ == "__main__":
    raise SystemExit(main())
