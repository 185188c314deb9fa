"""How a namespace's 64 shards spread over Redis Cluster primaries.

Each shard's keys carry the hash tag ``{ns#SS}``, so a shard is one slot, and a namespace is 64
slots. ``redis-cli --cluster create`` gives each of N primaries one contiguous range of
16384 / N slots; this counts the shards per primary for N = 3, 6, 12 (and 24, 48), for the
namespace ``agentstate`` and over many random namespaces, and, with ``--check``, reads the
slot map of a real local 3-primary cluster (``tests/cluster_support.LocalCluster``)::

    python -m benchmarks.shard_spread            # the arithmetic (instant)
    python -m benchmarks.shard_spread --check    # also starts a local cluster (~10 s)

``--readme`` rewrites the ``shard_spread`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from redis_agentstate.keys import SHARDS, Keys

# One slot arithmetic for both figures: benchmarks.scale's (checked against redis-cli's ranges in the tests).
from . import report
from ._util import command_line, run_meta
from .scale import even_ranges, shard_slots

__all__ = ["main", "spread"]


def spread(namespace: str, primaries: int) -> list[int]:
    """Shards of ``namespace`` per primary (a list of ``primaries`` counts), with redis-cli's even ranges."""
    ranges = even_ranges(primaries)
    counts = Counter(next(i for i, (a, b) in enumerate(ranges) if a <= s <= b) for s in shard_slots(namespace))
    return [counts.get(p, 0) for p in range(primaries)]


def _random_namespace(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(4, 16)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--check", action="store_true", help="read the slot map of a local 3-primary cluster")
    parser.add_argument("--readme", action="store_true", help="rewrite the shard_spread block of benchmarks/README.md")
    args = parser.parse_args(argv)
    meta = run_meta(command_line("python -m benchmarks.shard_spread", argv))
    rng = random.Random(11)
    names = [_random_namespace(rng) for _ in range(args.namespaces)]
    out: dict[str, Any] = {"distinct_slots_agentstate": len(set(shard_slots("agentstate")))}
    for n in (3, 6, 12, 24, 48):
        fair = SHARDS / n
        mine = spread("agentstate", n)
        worst = [max(spread(ns, n)) for ns in names]
        idle = [sum(1 for c in spread(ns, n) if c == 0) for ns in names]
        out[f"{n}_primaries"] = {
            "fair_share": round(fair, 2),
            "agentstate": " ".join(map(str, mine)),
            "agentstate_max_over_fair": round(max(mine) / fair, 2),
            "random_ns_max_over_fair_p50": round(sorted(worst)[len(worst) // 2] / fair, 2),
            "random_ns_max_over_fair_p99": round(sorted(worst)[int(len(worst) * 0.99)] / fair, 2),
            "random_ns_primaries_with_no_shard_mean": round(sum(idle) / len(idle), 2),
        }
    if args.check:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from cluster_support import LocalCluster

        cluster = LocalCluster.start()
        try:
            client = cluster.sync_client()
            keys = Keys("agentstate")
            owners = Counter(client.get_node_from_key(keys.shard_ready(s)).name for s in range(SHARDS))
            out["local_cluster_3_primaries_agentstate"] = sorted(owners.values())
            client.close()
        finally:
            cluster.stop()
    print(json.dumps(out, indent=2))
    if args.readme:
        report.publish(meta, "shard_spread", out, {"namespaces": args.namespaces, "check": args.check})


def markdown(out: dict[str, Any], params: dict[str, Any]) -> str:
    """The shard_spread block: shards per primary for namespace ``agentstate`` and random names."""
    namespaces = params["namespaces"]
    lines = [
        f"{SHARDS} shards (one slot each) over N primaries with `redis-cli --cluster create`'s even slot ranges; "
        f"namespace `agentstate` and {namespaces:,} random namespace names. Busiest / fair: the most shards "
        "one primary holds against 64 / N (1.00 = even).",
        "",
        "| primaries | fair share | `agentstate` shards per primary | busiest / fair: `agentstate` "
        "| random names, p50 | random names, p99 | primaries left without a shard (random, mean) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, row in out.items():
        if not key.endswith("_primaries"):
            continue
        counts = [int(c) for c in row["agentstate"].split()]
        mine = row["agentstate"] if len(counts) <= 12 else f"{min(counts)}-{max(counts)}"
        lines.append(
            f"| {key.split('_')[0]} | {row['fair_share']:.1f} | {mine} "
            f"| {row['agentstate_max_over_fair']:.2f} | {row['random_ns_max_over_fair_p50']:.2f} "
            f"| {row['random_ns_max_over_fair_p99']:.2f} | {row['random_ns_primaries_with_no_shard_mean']:.1f} |"
        )
    local = out.get("local_cluster_3_primaries_agentstate")
    lines.append("")
    if local is not None:
        lines.append(
            f"Read back from a real local 3-primary Cluster: `agentstate`'s {SHARDS} shard keys land "
            f"{' / '.join(map(str, local))} per primary (sorted)."
        )
    else:
        lines.append("Not read back from a real cluster (run with `--check`).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
