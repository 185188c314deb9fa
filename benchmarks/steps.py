"""What a durable step costs, next to the commit every cycle pays anyway.

``python -m benchmarks.steps [--rounds 9] [--steps 300]``: on a private
redis-server, in interleaved rounds (order shuffled per round), through a
``Lease`` of ``CheckpointStore`` (one connection):

- ``step``: ``lease.step(name, fn)`` the first time for each name: ``fn``
  returns 1 KiB, which is loaded (not stored yet: one script), then recorded
  under the lease (a second script);
- ``step replay``: the same names again, as a retry of the cycle would: the
  stored result comes back from one script and ``fn`` is not called;
- ``commit_and_claim``: the Runner's steady cycle with 1 KiB of state and one
  message (a bare commit, with the next cycle's claim in the same script).

For each: client us per operation (wall time of the loop over its count) and
server us per operation (``INFO commandstats``: EVALSHA usec over the
contender's operations, so a step's two scripts count as one step). Medians
over the rounds, min in brackets. ``--readme`` rewrites the ``steps`` block of
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded

from . import report
from ._util import command_line, run_meta

RESULT_BYTES = 1024


def _evalsha_usec(admin: redis.Redis) -> float:
    stats = admin.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.steps", description=__doc__)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=300, help="operations per contender per round")
    p.add_argument("--readme", action="store_true", help="rewrite the steps block of benchmarks/README.md")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.steps", argv), admin)
        client = redis.Redis.from_url(server.url)
        store = CheckpointStore(client, namespace=f"steps-{uuid.uuid4().hex[:6]}")
        result, body, message = os.urandom(RESULT_BYTES), os.urandom(RESULT_BYTES), os.urandom(200)
        n = args.steps
        names = [f"step-{i}" for i in range(n)]
        # The replay contender reads what the latest ``step`` run recorded, under that run's lease.
        recorded: dict[str, Any] = {}

        def model_call() -> bytes:
            return result

        def timed(loop: Callable[[], None]) -> tuple[float, float]:
            admin.config_resetstat()
            t0 = time.perf_counter()
            loop()
            wall = time.perf_counter() - t0
            return wall / n * 1e6, _evalsha_usec(admin) / n

        def run_step() -> tuple[float, float]:
            old = recorded.pop("lease", None)
            if old is not None:
                old.close()
            tid = uuid.uuid4().hex
            store.create(Checkpoint(tid))
            lease = store.lease(tid, 1, lease_ms=120_000)
            lease.__enter__()
            recorded["lease"] = lease

            def loop() -> None:
                for name in names:
                    lease.step(name, model_call)

            return timed(loop)

        def run_replay() -> tuple[float, float]:
            lease = recorded["lease"]

            def loop() -> None:
                for name in names:
                    lease.step(name, model_call)

            return timed(loop)

        def run_commit_and_claim() -> tuple[float, float]:
            tid = uuid.uuid4().hex
            store.create(Checkpoint(tid))
            cp = store.claim(tid, 1, token="w", lease_ms=120_000)

            def loop() -> None:
                nonlocal cp
                for _ in range(n):
                    assert cp is not None
                    cp.cycle_index = cp.claimed_cycle or 0
                    cp.shared_state["blob"] = body
                    cp.messages.append(message)
                    cp = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=120_000)

            return timed(loop)

        contenders: dict[str, Callable[[], tuple[float, float]]] = {
            "step": run_step,
            "step replay": run_replay,
            "commit_and_claim": run_commit_and_claim,
        }
        results: dict[str, dict[str, list[float]]] = {name: {"client": [], "server": []} for name in contenders}

        def one_round() -> dict[str, tuple[float, float]]:
            # A replay reads the latest step run's results: it goes right after it, the pair's place shuffled.
            order: list[list[str]] = [["step", "step replay"], ["commit_and_claim"]]
            random.shuffle(order)
            return {name: contenders[name]() for pair in order for name in pair}

        for _ in range(2):  # warm-up: scripts loaded, allocator settled
            one_round()
        for rnd in range(args.rounds):
            got = one_round()
            for name, (wall, srv) in got.items():
                results[name]["client"].append(wall)
                results[name]["server"].append(srv)
            print(
                f"round {rnd + 1}: " + ", ".join(f"{k} {w:.0f} us ({s:.1f} server)" for k, (w, s) in got.items()),
                flush=True,
            )
        lease = recorded.pop("lease", None)
        if lease is not None:
            lease.close()
        print()
        for name, r in results.items():
            print(
                f"{name}: median {statistics.median(r['client']):.0f} us per op (min {min(r['client']):.0f}), "
                f"server {statistics.median(r['server']):.1f} us (min {min(r['server']):.1f})"
            )
    finally:
        server.stop()
    if args.readme:
        report.publish(meta, "steps", results, {"rounds": args.rounds, "steps": args.steps})
    return 0


LABELS = {
    "step": "`lease.step` run the first time: load (absent), `fn`, record 1 KiB (2 scripts)",
    "step replay": "`lease.step` on a retry: the stored 1 KiB returned, `fn` not called (1 script)",
    "commit_and_claim": "a bare cycle commit: `commit_and_claim` with 1 KiB of state and 1 message (1 script)",
}


def markdown(results: dict[str, dict[str, list[float]]], params: dict[str, Any]) -> str:
    """The steps block: client and server us per operation of each contender."""
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    lines = [
        f"{params['rounds']} interleaved rounds of {params['steps']} operations per contender, one connection; "
        "client us per operation (wall time of the loop) and server us per operation (EVALSHA usec from "
        "`INFO commandstats`); median over rounds, min in brackets.",
        "",
        "| operation | client us per op | server us per op |",
        "| --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {LABELS[name]} | {med[name]['client']:.0f} ({min(r['client']):.0f}) | "
            f"{med[name]['server']:.1f} ({min(r['server']):.1f}) |"
        )
    base = med["commit_and_claim"]
    first, replay = med["step"], med["step replay"]
    lines += [
        "",
        f"- A first-run step costs {first['client'] / base['client']:.2f}x a cycle's commit on the client "
        f"and {first['server'] / base['server']:.2f}x on the server; a replayed one "
        f"{replay['client'] / base['client']:.2f}x and {replay['server'] / base['server']:.2f}x.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
