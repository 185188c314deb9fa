"""How far commit_and_claim's server time is from the least any fenced commit + claim must do.

``python -m benchmarks.script_floor [--rounds 9] [--cycles 500]``: on a private
redis-server, in interleaved rounds (order shuffled per round), ``INFO
commandstats`` usec per EVALSHA of:

- ``noop``: ``return 1`` (the floor of any script call);
- ``noop_shaped``: ``return 1`` sent commit_and_claim's 8 KEYS and 16 ARGV
  (what receiving the arguments costs);
- ``essential``: the commands a fenced commit + claim of a 1 KiB state cannot
  do without, and nothing else: read the fence (HMGET), append one message and
  one cycle record (2 RPUSH), read the clock, move the task in the ready index
  (ZADD), write the hash (HSET). No preludes, no validation, no retry
  identity, no history epochs, no attempts: a lower bound, not a design;
- ``commit_and_claim``: the store's steady loop (1 KiB of state and one message
  per cycle), through ``CheckpointStore``;
- ``claim + commit``: the two scripts of a cycle, per script (x2 is the cycle).

The goals are commit_and_claim <= 10 us and claim + commit <= 15 us per
cycle; this says how much of the gap is the work itself (``essential``) and
how much is ours (the rest). ``--readme`` rewrites the ``script_floor`` block
of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import uuid
from collections.abc import Callable
from typing import Any

import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded

from . import report
from ._util import command_line, run_meta

NOOP = "return 1"

ESSENTIAL = """
local h = redis.call('HMGET', KEYS[1], 'rev', 'token', 'claimed')
local rev = tonumber(h[1]) or 0
if h[2] and h[2] ~= ARGV[2] then return {0} end
redis.call('RPUSH', KEYS[2], ARGV[5])
redis.call('RPUSH', KEYS[3], ARGV[6])
local t = redis.call('TIME')
local lease = t[1] * 1000 + math.floor(t[2] / 1000) + 30000
redis.call('ZADD', KEYS[4], lease, ARGV[7])
redis.call('HSET', KEYS[1], 'cycle', ARGV[1], 'rev', rev + 2, 'token', ARGV[2], 'claimed', ARGV[1] + 1,
  'lease', lease, 'body', ARGV[4])
return {1, rev + 2, lease}
"""


def _stat(admin: redis.Redis, command: str = "evalsha") -> float:
    stats = admin.info("commandstats")
    return float(stats[f"cmdstat_{command}"]["usec_per_call"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.script_floor", description=__doc__)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--cycles", type=int, default=500)
    p.add_argument("--readme", action="store_true", help="rewrite the script_floor block of benchmarks/README.md")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.script_floor", argv), admin)
        client = redis.Redis.from_url(server.url)
        body = os.urandom(1024)
        message, record = os.urandom(200), os.urandom(100)
        noop, essential = client.register_script(NOOP), client.register_script(ESSENTIAL)
        keys8 = [f"{{f}}:k{i}" for i in range(8)]
        ess_keys = ["{e}:cp", "{e}:msgs", "{e}:cycles", "{e}:ready"]
        store = CheckpointStore(client, namespace=f"floor-{uuid.uuid4().hex[:6]}")

        def run_noop() -> None:
            for _ in range(args.cycles):
                noop(keys=[], args=[])

        def run_noop_shaped() -> None:
            shaped = ["x" * 16] * 15 + [body]
            for _ in range(args.cycles):
                noop(keys=keys8, args=shaped)

        def run_essential() -> None:
            client.delete(*ess_keys)
            for i in range(args.cycles):
                essential(keys=ess_keys, args=[i, "w", i, body, message, record, "task"])

        def run_commit_and_claim() -> None:
            tid = uuid.uuid4().hex
            store.create(Checkpoint(tid))
            cp = store.claim(tid, 1, token="w", lease_ms=30_000)
            admin.config_resetstat()  # count only the steady loop
            for _ in range(args.cycles):
                assert cp is not None
                cp.cycle_index = cp.claimed_cycle or 0
                cp.shared_state["blob"] = body
                cp.messages.append(message)
                cp = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=30_000)

        def run_claim_commit() -> None:
            tid = uuid.uuid4().hex
            store.create(Checkpoint(tid))
            admin.config_resetstat()
            for cycle in range(1, args.cycles // 2 + 1):
                cp = store.claim(tid, cycle, token="w", lease_ms=30_000)
                assert cp is not None
                cp.cycle_index = cycle
                cp.shared_state["blob"] = body
                cp.messages.append(message)
                assert store.commit(cp, token="w", expected_revision=cp.revision)

        contenders: dict[str, Callable[[], None]] = {
            "noop": run_noop,
            "noop_shaped": run_noop_shaped,
            "essential": run_essential,
            "commit_and_claim": run_commit_and_claim,
            "claim + commit (per script)": run_claim_commit,
        }
        results: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(2):  # warm-up: scripts loaded, allocator settled
            for fn in contenders.values():
                fn()
        for rnd in range(args.rounds):
            order = list(contenders)
            random.shuffle(order)
            for name in order:
                admin.config_resetstat()
                contenders[name]()
                results[name].append(_stat(admin))
            ess = results["essential"][-1]
            print(
                f"round {rnd + 1}: "
                + ", ".join(f"{n} {results[n][-1]:.1f}" for n in contenders)
                + f" | commit_and_claim / essential {results['commit_and_claim'][-1] / ess:.2f}x",
                flush=True,
            )
        print()
        for name, values in results.items():
            print(f"{name}: median {statistics.median(values):.1f} us per call (min {min(values):.1f})")
        for name in ("commit_and_claim", "claim + commit (per script)"):
            ratios = [a / b for a, b in zip(results[name], results["essential"], strict=True)]
            print(f"{name} / essential: median {statistics.median(ratios):.2f}x per round")
        shaped = [a - b for a, b in zip(results["noop_shaped"], results["noop"], strict=True)]
        print(f"receiving 8 KEYS + 16 ARGV: median {statistics.median(shaped):.1f} us")
    finally:
        server.stop()
    if args.readme:
        report.publish(meta, "script_floor", results, {"rounds": args.rounds, "cycles": args.cycles})
    return 0


LABELS = {
    "noop": "no-op script (`return 1`), no KEYS or ARGV",
    "noop_shaped": "no-op script sent commit_and_claim's 8 KEYS and 16 ARGV",
    "essential": "the essential commands only (HMGET, 2 RPUSH, TIME, ZADD, HSET; no checks, no preludes)",
    "commit_and_claim": "commit_and_claim through the store (1 KiB state, 1 message)",
    "claim + commit (per script)": "claim + commit through the store, per script (a cycle is two)",
}


def markdown(results: dict[str, list[float]], params: dict[str, Any]) -> str:
    """The script_floor block: server us per call of each contender, and the goals."""
    rounds, cycles = params["rounds"], params["cycles"]
    med = {n: statistics.median(v) for n, v in results.items()}

    def per_round(name: str) -> str:
        r = sorted(a / b for a, b in zip(results[name], results["essential"], strict=True))
        return f"{statistics.median(r):.2f}x ({r[0]:.2f}-{r[-1]:.2f})"

    lines = [
        f"{rounds} interleaved rounds of {cycles} calls per contender (order shuffled per round); server us "
        "per EVALSHA from `INFO commandstats` (median over rounds, min in brackets).",
        "",
        "| contender | server us per call | / essential, per round (min-max) |",
        "| --- | --- | --- |",
    ]
    for name, values in results.items():
        ratio = per_round(name) if name in ("commit_and_claim", "claim + commit (per script)") else "-"
        lines.append(f"| {LABELS[name]} | {med[name]:.1f} ({min(values):.1f}) | {ratio} |")
    shaped = statistics.median(a - b for a, b in zip(results["noop_shaped"], results["noop"], strict=True))
    cycle = 2 * med["claim + commit (per script)"]
    lines += [
        "",
        f"- Receiving 8 KEYS and 16 ARGV costs {shaped:.1f} us of a call (shaped no-op minus no-op).",
        f"- commit_and_claim: {med['commit_and_claim']:.1f} us per cycle (goal <= 10 us: "
        f"{'met' if med['commit_and_claim'] <= 10 else '**not met**'}); the essential commands alone take "
        f"{med['essential']:.1f} us.",
        f"- claim + commit: {cycle:.1f} us per cycle (goal <= 15 us: {'met' if cycle <= 15 else '**not met**'}).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
