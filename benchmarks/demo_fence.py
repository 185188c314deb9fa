"""Does the fleet demo show the fence on a loaded machine? N runs of ``agentstate demo --json``.

Each run starts its own private server (the demo's default). ``--busy K`` adds K busy-loop
processes for the whole series, on top of whatever else the machine is doing, and the
1-minute load average is printed per run. A run "shows the fence" when it exits 0 with at
least one takeover of the frozen worker's task and at least one stale commit rejected::

    python -m benchmarks.demo_fence --runs 10 --busy 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_fence", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes added while the runs go on")
    args = parser.parse_args(argv)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    shown = 0
    try:
        print(
            "| run | load (1 min) | rc | takeovers | stale commits rejected | late commits accepted | lost | double |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for i in range(1, args.runs + 1):
            load = os.getloadavg()[0]
            proc = subprocess.run(
                [sys.executable, "-m", "redis_agentstate", "demo", "--json"],
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                out = json.loads(proc.stdout)
            except ValueError:
                out = {}
            row = [out.get(k, "?") for k in ("takeovers", "stale_commits_rejected", "late_commits_accepted")]
            row += [out.get(k, "?") for k in ("lost_commits", "double_applied")]
            ok = proc.returncode == 0 and out.get("takeovers", 0) >= 1 and out.get("stale_commits_rejected", 0) >= 1
            shown += ok
            print(f"| {i} | {load:.1f} | {proc.returncode} | " + " | ".join(str(v) for v in row) + " |", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"\nthe fence shown in {shown} of {args.runs} runs")
    return 0 if shown == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
