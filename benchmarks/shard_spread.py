"""How a namespace's shards spread over Redis Cluster primaries: 0.2's ``{ns#SS}`` tags against the
slot-aware layout, on paper and on real local Clusters of many primaries.

Each shard's keys carry one hash tag, so a shard is one slot. ``redis-cli --cluster create``
gives each of N primaries one contiguous range of 16384 / N slots. The legacy tags fall wherever
CRC16 puts them; the slot-aware ones are steered onto evenly spaced slots (keys.py), so each
primary holds its share of the shards, rounded up or down::

    python -m benchmarks.shard_spread                       # the arithmetic (instant)
    python -m benchmarks.shard_spread --cluster 24,48       # also real local Clusters (~3 min)

The arithmetic: shards per primary for N = 3 ... 96, namespace ``agentstate`` and 2,000 random
names. ``--cluster``: for each N, a local Cluster of N primaries (``tests/cluster_support``), and
on it, one namespace at a time (the cluster emptied in between): the legacy layout (64 shards) and
the slot-aware one at 64, 256 and 1,024 shards, each holding ``--tasks`` tasks, then a mixed load
of ``--seconds`` (claim_next, commit; create and delete) from one sync store. Measured per
primary: the shard indexes it owns (``CLUSTER KEYSLOT`` of each shard's ready key), its keys
(``DBSIZE``) and the commands it served under the load (``INFO commandstats``); reported as
busiest / mean and primaries left idle. ``--readme`` rewrites the ``shard_spread`` block of
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
import string
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from redis_agentstate.keys import DEFAULT_SHARDS, LAYOUT_LEGACY, LAYOUT_SLOTS

from . import report
from ._util import command_line, run_meta
from .scale import even_ranges, shard_slots

__all__ = ["main", "spread"]

PRIMARIES = (3, 6, 12, 24, 48, 96)
LAYOUTS = ((LAYOUT_LEGACY, 64), (LAYOUT_SLOTS, 64), (LAYOUT_SLOTS, 256), (LAYOUT_SLOTS, 1024))


def per_primary(slots: list[int], primaries: int) -> list[int]:
    """How many of ``slots`` each of ``primaries`` primaries holds, with redis-cli's even ranges."""
    lasts = [b for _, b in even_ranges(primaries)]
    counts = Counter(bisect.bisect_left(lasts, s) for s in slots)
    return [counts.get(p, 0) for p in range(primaries)]


def spread(namespace: str, primaries: int, layout: str = LAYOUT_SLOTS, shards: int = DEFAULT_SHARDS) -> list[int]:
    """Shards of ``namespace`` per primary (a list of ``primaries`` counts), with redis-cli's even ranges."""
    return per_primary(shard_slots(namespace, shards, layout), primaries)


def _ratio(counts: list[int]) -> float:
    return max(counts) / statistics.mean(counts)


def _random_namespace(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(4, 16)))


def arithmetic(names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for layout, shards in LAYOUTS:
        ours = shard_slots("agentstate", shards, layout)
        theirs = [shard_slots(ns, shards, layout) for ns in names]
        for n in PRIMARIES:
            mine = per_primary(ours, n)
            per_name = [per_primary(slots, n) for slots in theirs]
            worst = sorted(_ratio(c) for c in per_name)
            rows.append({
                "layout": layout, "shards": shards, "primaries": n,
                "agentstate": round(_ratio(mine), 3), "agentstate_idle": mine.count(0),
                "names_p50": round(worst[len(worst) // 2], 3), "names_max": round(worst[-1], 3),
                "names_idle_mean": round(statistics.mean(c.count(0) for c in per_name), 2),
            })  # fmt: skip
    return rows


def _on_cluster(primaries: int, tasks: int, seconds: float) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from cluster_support import LocalCluster

    from redis_agentstate import Checkpoint, CheckpointStore
    from redis_agentstate.testing import internals

    t0 = time.monotonic()
    cluster = LocalCluster.start(primaries, timeout=120.0)
    started = time.monotonic() - t0
    rows = []
    try:
        client = cluster.sync_client()
        nodes = {n.name: client.get_redis_connection(n) for n in client.get_primaries()}
        assert len(nodes) == primaries, f"{len(nodes)} primaries, {primaries} asked for"
        for layout, shards in LAYOUTS:
            for conn in nodes.values():
                conn.flushall()
            ns = "agentstate"
            store = CheckpointStore(client, namespace=ns, shards=None if layout == LAYOUT_LEGACY else shards)
            keys = internals(store).core.keys  # (internals reads the layout: a new namespace, "slots N")
            if layout == LAYOUT_LEGACY:
                keys.configure(DEFAULT_SHARDS, LAYOUT_LEGACY)  # as 0.2 built its keys
            owner = Counter(client.get_node_from_key(keys.shard_ready(s)).name for s in range(shards))
            index_counts = [owner.get(name, 0) for name in nodes]
            t1 = time.monotonic()
            for i in range(tasks):
                store.create(Checkpoint(f"task-{i}"))
            create_s = time.monotonic() - t1
            key_counts = [int(conn.dbsize()) for conn in nodes.values()]
            for conn in nodes.values():
                conn.config_resetstat()
            rng = random.Random(7)
            cycles, until, i = 0, time.monotonic() + seconds, tasks
            while time.monotonic() < until:
                cp = store.claim_next(token="w", lease_ms=30_000)
                if cp is not None:
                    cp.cycle_index = cp.claimed_cycle or 1
                    store.commit(cp, token="w", expected_revision=cp.revision)
                    cycles += 1
                if rng.random() < 0.2:  # churn: a task made, another dropped
                    store.create(Checkpoint(f"task-{i}"))
                    store.delete(f"task-{rng.randrange(i)}")
                    i += 1
            calls = []
            for conn in nodes.values():
                stats = conn.info("commandstats")
                ours = (v for k, v in stats.items() if k not in ("cmdstat_config", "cmdstat_info"))
                calls.append(sum(int(v["calls"]) for v in ours))
            rows.append({
                "primaries": primaries, "layout": layout, "shards": shards, "tasks": tasks,
                "index_ratio": round(_ratio(index_counts), 3), "index_idle": index_counts.count(0),
                "keys_ratio": round(_ratio(key_counts), 3), "keys_idle": key_counts.count(0),
                "calls_ratio": round(_ratio(calls), 3), "calls_idle": calls.count(0),
                "cycles": cycles, "create_s": round(create_s, 1), "cluster_start_s": round(started, 1),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        client.close()
    finally:
        cluster.stop()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--cluster", default="", help="primaries of the real local Clusters to measure, e.g. 24,48")
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per namespace on a real Cluster")
    parser.add_argument("--seconds", type=float, default=5.0, help="the mixed load per namespace on a real Cluster")
    parser.add_argument("--readme", action="store_true", help="rewrite the shard_spread block of benchmarks/README.md")
    args = parser.parse_args(argv)
    meta = run_meta(command_line("python -m benchmarks.shard_spread", argv))
    rng = random.Random(11)
    names = [_random_namespace(rng) for _ in range(args.namespaces)]
    out: dict[str, Any] = {"arithmetic": arithmetic(names), "cluster": []}
    for n in (int(p) for p in args.cluster.split(",") if p.strip()):
        out["cluster"] += _on_cluster(n, args.tasks, args.seconds)
    print(json.dumps(out, indent=1))
    if args.readme:
        report.publish(meta, "shard_spread", out, {"namespaces": args.namespaces, "cluster": args.cluster,
                                                   "tasks": args.tasks, "seconds": args.seconds})  # fmt: skip


def _label(layout: str, shards: int) -> str:
    return "0.2's `{ns#SS}` tags, 64 shards" if layout == LAYOUT_LEGACY else f"slot-aware, {shards:,} shards"


def markdown(out: dict[str, Any], params: dict[str, Any]) -> str:
    """The shard_spread block: busiest / mean per layout and primaries, on paper and on real Clusters."""
    lines = [
        f"On paper: shards per primary with `redis-cli --cluster create`'s even slot ranges, busiest / mean "
        f"(1.00 = even; primaries left without a shard in brackets), namespace `agentstate` and the median "
        f"and worst of {params['namespaces']:,} random namespace names.",
        "",
        "| layout | " + " | ".join(f"{n} primaries" for n in PRIMARIES) + " |",
        "| --- |" + " --- |" * len(PRIMARIES),
    ]
    by = {(r["layout"], r["shards"], r["primaries"]): r for r in out["arithmetic"]}
    for layout, shards in LAYOUTS:
        cells = []
        for n in PRIMARIES:
            r = by[(layout, shards, n)]
            idle = f" ({r['agentstate_idle']} idle)" if r["agentstate_idle"] else ""
            cells.append(f"{r['agentstate']:.2f}{idle}; {r['names_p50']:.2f} / {r['names_max']:.2f}")
        lines.append(f"| {_label(layout, shards)} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: `agentstate`; random names median / worst."]
    if out["cluster"]:
        lines += [
            "",
            f"On real local Clusters (`tests/cluster_support.LocalCluster`), namespace `agentstate` holding "
            f"{params['tasks']:,} tasks, then {params['seconds']:g} s of mixed load (claim_next + commit, create + "
            "delete) from one store: busiest / mean per primary of the shard indexes it owns, its keys (`DBSIZE`) "
            "and the commands it served (`INFO commandstats`); idle primaries in brackets.",
            "",
            "| primaries | layout | shard indexes | keys | commands under load | cycles in the load |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in out["cluster"]:

            def cell(name: str, r: dict[str, Any] = r) -> str:
                idle = r[f"{name}_idle"]
                return f"{r[f'{name}_ratio']:.2f}" + (f" ({idle} idle)" if idle else "")

            lines.append(f"| {r['primaries']} | {_label(r['layout'], r['shards'])} | {cell('index')} | "
                         f"{cell('keys')} | {cell('calls')} | {r['cycles']:,} |")  # fmt: skip
    else:
        lines += ["", "Not measured on a real Cluster (run with `--cluster 24,48`)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
