"""What the shard count costs ``claim_next``: namespaces of 64, 256 and 1,024 shards side by side.

``python -m benchmarks.shard_count [--rounds 9] [--calls 300] [--tasks 4096]``: on a private
redis-server, in interleaved rounds (order shuffled per round), one store per contender, each in
a namespace of its own holding ``--tasks`` due tasks. Two ways of calling, each at every count:

- ``busy``: the store as a worker runs it (candidates kept from a peek are claimed in one script
  each while under ``claim_next_candidate_age_s`` old, then the next peek);
- ``peek every call``: ``claim_next_candidate_age_s = 0``, so every call pipelines a read of every
  shard's ready index first (what an idle worker's probe and a fresh store's first call cost).

Every call claims one task under a ``LEASE_MS`` lease, which lapses soon after: the namespace stays
about as it was. Per call: client us (wall time of the loop), server us (``INFO commandstats``, all
commands) and round trips (requests the driver sent). Medians over rounds, min in brackets.
``--readme`` rewrites the ``shard_count`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from typing import Any

import redis

import redis_agentstate
from redis_agentstate.embedded import start_embedded
from redis_agentstate.testing import internals

from . import report
from ._util import Sample, claim_next_sample, command_line, count_requests, interleaved_rounds, run_meta, sample_cells

SHARD_COUNTS = (64, 256, 1024)
LEASE_MS = 20


def _setup(client: redis.Redis, shards: int, tasks: int, peek_every_call: bool) -> Any:
    store = redis_agentstate.CheckpointStore(client, namespace=f"sc-{uuid.uuid4().hex[:6]}", shards=shards)
    if peek_every_call:
        internals(store).core.claim_next_candidate_age_s = 0
    for i in range(tasks):
        store.create(redis_agentstate.Checkpoint(f"task-{i}"))
    return store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shard_count", description=__doc__)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=300, help="claim_next calls per contender per round")
    p.add_argument("--tasks", type=int, default=4096, help="due tasks per namespace")
    p.add_argument("--readme", action="store_true", help="rewrite the shard_count block of benchmarks/README.md")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    results: dict[str, dict[str, list[float]]] = {}
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.shard_count", argv), admin)
        sent = count_requests(redis_agentstate)
        stores = {
            f"{mode} {n}": _setup(redis.Redis.from_url(server.url), n, args.tasks, mode == "peek")
            for mode in ("busy", "peek")
            for n in SHARD_COUNTS
        }

        def run(name: str) -> Sample:
            return claim_next_sample(stores[name], admin, sent, args.calls, LEASE_MS)

        # The warm-up pass loads the scripts and reads each namespace's layout.
        results = interleaved_rounds({n: (lambda n=n: run(n)) for n in stores}, args.rounds)
    finally:
        server.stop()
    if args.readme:
        report.publish(meta, "shard_count", results, {"rounds": args.rounds, "calls": args.calls, "tasks": args.tasks})
    return 0


def markdown(results: dict[str, dict[str, list[float]]], params: dict[str, Any]) -> str:
    """The shard_count block: per claim_next call at each shard count, client us, server us, round trips."""
    lines = [
        f"{params['rounds']} interleaved rounds of {params['calls']} `claim_next` calls per contender, each "
        f"namespace holding {params['tasks']:,} due tasks; median over rounds, min in brackets.",
        "",
        "| claim_next | shards | client us per call | server us per call | round trips per call |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        mode, shards = name.split()
        label = "busy (candidates kept between peeks)" if mode == "busy" else "peek every call"
        lines.append(f"| {label} | {int(shards):,} | {sample_cells(r)} |")
    lines.append("")
    for mode in ("busy", "peek"):
        base = results[f"{mode} 64"]["server"]
        ratios = []
        for n in SHARD_COUNTS[1:]:
            per_round = [a / b for a, b in zip(results[f"{mode} {n}"]["server"], base, strict=True)]
            ratios.append(f"{statistics.median(per_round):.2f}x at {n:,}")
        lines.append(f"- {'Busy' if mode == 'busy' else 'Peek every call'}: server time against 64 shards, "
                     f"medians of the per-round ratios: {', '.join(ratios)}.")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
