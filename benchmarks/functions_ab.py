"""A/B of the server time of commit_and_claim as EVALSHA against the same script as a Redis Function.

``python -m benchmarks.functions_ab [--rounds 15] [--cycles 300]``: an EVALSHA
re-runs the constants and the preludes (``_base.lua``, ``_common.lua``: about
30 closures and tables) on every call; a Function library runs them once, at
``FUNCTION LOAD``. This loads the scripts of a cycle as one library on a
private redis-server, then drives the same commit_and_claim loop through a
``CheckpointStore`` in interleaved rounds, sending EVALSHA or rewriting it to
FCALL of the same body, and compares ``INFO commandstats`` usec per call.
A measurement for a design decision (would moving to Functions meet the goal
of 10 us per commit_and_claim?), not a figure of the main harness.
``--readme`` rewrites the ``functions_ab`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from typing import Any

import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded
from redis_agentstate.testing import internals
from redis_agentstate.wire import scripts as S

from . import report
from ._util import command_line, run_meta

NAMES = (S.COMMIT_AND_CLAIM, S.CLAIM, S.COMMIT)


def library() -> str:
    """The scripts of a cycle as one Function library: constants and preludes once, each body a function."""
    preludes: list[str] = []
    for name in NAMES:
        preludes += [p for p in S.PRELUDES.get(name, ()) if p not in preludes and p != "_moved"]
    parts = ["#!lua name=agentstate_ab", S.constants_prelude(), *(S._read(p) for p in preludes)]
    # The seal check reads KEYS, so it opens each function's body (as it opens each script).
    parts += [f"redis.register_function('{n}', function(KEYS, ARGV)\nlocal SEALED_READS = false\n"
              f"{S._read('_moved')}\n{S._read(n)}\nend)" for n in NAMES]  # fmt: skip
    return "\n".join(parts)


class _Rewriting(redis.Redis):
    """Sends a known script's EVALSHA as FCALL of the function of the same body when ``fcall`` is on."""

    fcall = False
    functions: dict[str, str] = {}  # noqa: RUF012 - set once before use

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.fcall and args and args[0] == "EVALSHA" and args[1] in self.functions:
            args = ("FCALL", self.functions[args[1]], *args[2:])
        return super().execute_command(*args, **options)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.functions_ab", description=__doc__)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cycles", type=int, default=300)
    p.add_argument("--readme", action="store_true", help="rewrite the functions_ab block of benchmarks/README.md")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.functions_ab", argv), admin)
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", library())
        client = _Rewriting.from_url(server.url)
        store = CheckpointStore(client, "ab")
        _Rewriting.functions = {internals(store).scripts[n].sha: n for n in NAMES}
        store.create(Checkpoint("t", shared_state={"x": "y" * 900}))
        token = uuid.uuid4().hex
        cp = store.claim("t", 1, token=token, lease_ms=60_000)
        assert cp is not None
        usec: dict[str, list[float]] = {"EVALSHA": [], "FCALL": []}
        for r in range(args.rounds):
            for mode in ("EVALSHA", "FCALL") if r % 2 else ("FCALL", "EVALSHA"):
                client.fcall = mode == "FCALL"
                admin.config_resetstat()
                for _ in range(args.cycles):
                    cp.cycle_index = cp.claimed_cycle or 0
                    cp = store.commit_and_claim(cp, token=token, expected_revision=cp.revision, lease_ms=60_000)
                    assert cp is not None
                stats = admin.info("commandstats")[f"cmdstat_{mode.lower()}"]
                usec[mode].append(stats["usec"] / stats["calls"])
        for mode, values in usec.items():
            print(f"{mode}: median {statistics.median(values):.2f} us per commit_and_claim, min {min(values):.2f}")
        ratio = statistics.median(usec["EVALSHA"]) / statistics.median(usec["FCALL"])
        print(f"EVALSHA / FCALL (medians of {args.rounds} interleaved rounds of {args.cycles}): {ratio:.2f}x")
    finally:
        server.stop()
    if args.readme:
        report.publish(meta, "functions_ab", usec, {"rounds": args.rounds, "cycles": args.cycles})
    return 0


def markdown(usec: dict[str, list[float]], params: dict[str, Any]) -> str:
    """The functions_ab block: server us per commit_and_claim as EVALSHA and as FCALL."""
    rounds, cycles = params["rounds"], params["cycles"]
    lines = [
        f"{rounds} interleaved rounds of {cycles} commit_and_claim calls (1 KiB state), alternating which goes "
        "first; server us per call from `INFO commandstats`.",
        "",
        "| sent as | server us per commit_and_claim, median (min) |",
        "| --- | --- |",
    ]
    for mode, values in usec.items():
        lines.append(f"| {mode} | {statistics.median(values):.2f} ({min(values):.2f}) |")
    per_round = sorted(a / b for a, b in zip(usec["EVALSHA"], usec["FCALL"], strict=True))
    lines += [
        "",
        f"EVALSHA / FCALL per round: median {statistics.median(per_round):.2f}x "
        f"(min {per_round[0]:.2f}x, max {per_round[-1]:.2f}x).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
