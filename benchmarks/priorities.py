"""What priorities cost ``claim_next``: the plain path against the commit before them, and a namespace
with priorities in play, side by side in one run.

``python -m benchmarks.priorities --base COMMIT [--rounds 9] [--calls 300]``: on a private redis-server,
in interleaved rounds (order shuffled per round), one connection per contender, each in a namespace
of its own holding 256 due tasks and 64 tasks held under live leases:

- ``base plain``: ``claim_next`` of the package at ``--base`` (extracted as ``client_ab`` does), every
  task of priority 0 (it has no priorities);
- ``plain``: this checkout, the same namespace;
- ``priorities``: this checkout, the due tasks of priorities 0-3, and the held ones of priority 5,
  four in each of 16 shards: more than a peek reads there, so those shards need the extra read
  past the higher priority on every call;
- ``limits``: this checkout, every task under one of four concurrency keys whose limit is far above
  what the run holds, so every claim takes a place in the key's limiter (its own slot) first and
  gives nothing back (the lease lapses; the place expires by itself).

Every call peeks (``claim_next_candidate_age_s = 0``: the busy path, no candidate saved from an
earlier peek) and claims one task under a ``LEASE_MS`` lease, which lapses soon after: the namespace
stays about as it was (a few dozen of its 256 due tasks held at any moment). Not 1 ms: a limited
claim takes its place first and the task's script refuses a lease that would end before the claim
(the place's expiry less ``LIMIT_SKEW_MS``), which a 1 ms lease meets whenever the clock ticks in
between. Per call: client us (wall time of the loop), server us (``INFO commandstats``, all commands)
and round trips (requests the driver sent). Medians over rounds, min in brackets.
``--readme`` rewrites the ``priorities`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import redis

import redis_agentstate
from redis_agentstate.embedded import start_embedded
from redis_agentstate.keys import shard_of

from . import report
from ._util import Sample, claim_next_sample, command_line, count_requests, interleaved_rounds, run_meta, sample_cells
from .client_ab import load_base

DUE, HELD = 256, 64
HELD_SHARDS, HELD_PER_SHARD = 16, 4


def _ids_in_shard(shard: int, n: int, prefix: str) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if shard_of(tid := f"{prefix}{i}") == shard:
            out.append(tid)
        i += 1
    return out


KEYS_IN_PLAY = 4
LEASE_MS = 20
LIMIT = 1_000_000  # never reached: the cost measured is taking a place, not waiting for one


def _setup(pkg: ModuleType, client: redis.Redis, mode: str) -> Any:
    store = pkg.CheckpointStore(client, namespace=f"pr-{uuid.uuid4().hex[:6]}")
    importlib.import_module(f"{pkg.__name__}.testing").internals(store).core.claim_next_candidate_age_s = 0
    prioritized = mode == "priorities"
    kw: Callable[[int], dict[str, Any]] = lambda i: {}  # noqa: E731
    if prioritized:
        kw = lambda i: {"priority": i % 4}  # noqa: E731
    elif mode == "limits":
        for k in range(KEYS_IN_PLAY):
            store.set_concurrency_limit(f"tenant-{k}", LIMIT)
        kw = lambda i: {"concurrency_key": f"tenant-{i % KEYS_IN_PLAY}"}  # noqa: E731
    for i in range(DUE):
        store.create(pkg.Checkpoint(f"due-{i}", **kw(i)))
    held = [t for s in range(HELD_SHARDS) for t in _ids_in_shard(s, HELD_PER_SHARD, f"held{s}-")]
    for tid in held:
        store.create(pkg.Checkpoint(tid, **({"priority": 5} if prioritized else {})))
        store.claim(tid, 1, token="holder", lease_ms=3_600_000)
    return store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.priorities", description=__doc__)
    p.add_argument("--base", required=True, help="the commit before priorities, for the plain path's A/B")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=300, help="claim_next calls per contender per round")
    p.add_argument("--readme", action="store_true", help="rewrite the priorities block of benchmarks/README.md")
    args = p.parse_args(argv)
    base, _ = load_base(args.base)
    server = start_embedded(prefer="redis-server")
    results: dict[str, dict[str, list[float]]] = {}
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.priorities", argv), admin)
        meta["base"] = args.base
        sent = {id(base): count_requests(base), id(redis_agentstate): count_requests(redis_agentstate)}
        setups = {
            "base plain": (base, "plain"),
            "plain": (redis_agentstate, "plain"),
            "priorities": (redis_agentstate, "priorities"),
            "limits": (redis_agentstate, "limits"),
        }
        stores = {name: _setup(pkg, redis.Redis.from_url(server.url), mode) for name, (pkg, mode) in setups.items()}

        def run(name: str) -> Sample:
            return claim_next_sample(stores[name], admin, sent[id(setups[name][0])], args.calls, LEASE_MS)

        # Two warm-up passes: scripts loaded, layouts read.
        results = interleaved_rounds({n: (lambda n=n: run(n)) for n in stores}, args.rounds, warmups=2)
    finally:
        server.stop()
    if args.readme:
        report.publish(meta, "priorities", results, {"rounds": args.rounds, "calls": args.calls, "base": args.base})
    return 0


LABELS = {
    "base plain": "the `--base` commit, every task of priority 0",
    "plain": "this commit, every task of priority 0",
    "priorities": "this commit, priorities 0-3 due, priority 5 held 4 deep in 16 shards",
    "limits": "this commit, every task under one of 4 concurrency keys (limit never reached)",
}


def markdown(results: dict[str, dict[str, list[float]]], params: dict[str, Any]) -> str:
    """The priorities block: per claim_next call, client us, server us and round trips."""
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    lines = [
        f"{params['rounds']} interleaved rounds of {params['calls']} `claim_next` calls per contender (every call "
        f"peeks; {DUE} due tasks, {HELD} held); median over rounds, min in brackets.",
        "",
        "| claim_next | client us per call | server us per call | round trips per call |",
        "| --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(f"| {LABELS[name]} | {sample_cells(r)} |")
    ratios = [p / b for p, b in zip(results["plain"]["client"], results["base plain"]["client"], strict=True)]
    srv = [p / b for p, b in zip(results["plain"]["server"], results["base plain"]["server"], strict=True)]
    pri = med["priorities"]["client"] / med["plain"]["client"]
    lines += [
        "",
        f"- The plain path, this commit / `{params['base']}`: {statistics.median(ratios):.3f}x client time and "
        f"{statistics.median(srv):.3f}x server time per call, medians of the per-round ratios (target: at most "
        "1.05x).",
        f"- With priorities in play: {pri:.2f}x the plain path's client time, "
        f"{med['priorities']['trips']:.2f} round trips per call against {med['plain']['trips']:.2f}.",
    ]
    if "limits" in med:
        lines.append(
            f"- With concurrency keys in play: {med['limits']['client'] / med['plain']['client']:.2f}x the plain "
            f"path's client time, {med['limits']['server'] / med['plain']['server']:.2f}x its server time, "
            f"{med['limits']['trips']:.2f} round trips per call (the place is taken in the limiter's own slot)."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
