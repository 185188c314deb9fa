"""A/B of the server time of the scripts as sent (only the prelude statements each uses) against whole preludes.

``python -m benchmarks.prelude_ab [--rounds 9] [--calls 300]``: every EVALSHA
re-runs its whole text, so each ``local function`` of a prelude is a new
closure on every call. ``scripts.script_text`` sends each script with only
the statements of the constants and its preludes that it uses (a tree-shaker
at build time); the whole preludes are what it sent before. On a private
redis-server, in interleaved rounds, the same calls go through the library,
with each EVALSHA sent as is or rewritten to the SHA of the same script with
its whole preludes (loaded beside it), and ``INFO commandstats`` gives usec
per call. Workloads: a cycle's ``commit_and_claim`` (1 KiB state), and
LangGraph's ``get_tuple`` of a thread's newest checkpoint and a whole
``invoke`` of a one-node graph (6 scripts: get, 3 puts, 2 put_writes).
``--readme`` rewrites the ``prelude_ab`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from collections.abc import Callable
from typing import Any

import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded
from redis_agentstate.wire import scripts as S

from . import report
from ._util import command_line, run_meta


def whole_text(name: str) -> str:
    """A script as it was sent before: the constants and every statement of its preludes."""
    reads = f"local SEALED_READS = {'true' if name in S.READS else 'false'}\n"
    return "\n".join([S.constants_prelude() + reads, *(S._read(p) for p in S.PRELUDES.get(name, ())), S._read(name)])


class _Rewriting(redis.Redis):
    """Sends a script's EVALSHA as the SHA of its whole-prelude twin when ``whole`` is on."""

    whole = False
    twins: dict[str, str] = {}  # noqa: RUF012 - set once before use

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.whole and args and args[0] == "EVALSHA" and args[1] in self.twins:
            args = ("EVALSHA", self.twins[args[1]], *args[2:])
        return super().execute_command(*args, **options)


def _load_twins(admin: redis.Redis) -> dict[str, str]:
    import hashlib

    twins = {}
    for name in S.PRELUDES:
        sha = hashlib.sha1(S.script_text(name).encode()).hexdigest()
        twins[sha] = admin.script_load(whole_text(name))
    return twins


def _workloads(client: _Rewriting, calls: int) -> dict[str, Callable[[], None]]:
    store = CheckpointStore(client, "ab")
    store.create(Checkpoint("t", shared_state={"x": "y" * 900}))
    token = uuid.uuid4().hex
    state = {"cp": store.claim("t", 1, token=token, lease_ms=60_000)}

    def cycle() -> None:
        for _ in range(calls):
            cp = state["cp"]
            assert cp is not None
            cp.cycle_index = cp.claimed_cycle or 0
            state["cp"] = store.commit_and_claim(cp, token=token, expected_revision=cp.revision, lease_ms=60_000)

    from redis_agentstate.langgraph import AgentStateSaver

    from .langgraph_savers import MESSAGE, OTHER, _graph

    saver = AgentStateSaver(client, namespace="ab-lg")
    graph = _graph(saver, "rewrite")
    config = {"configurable": {"thread_id": "lg"}}
    graph.invoke({"messages": ["first"], "other": OTHER}, config)
    steps = {"n": 0}

    def get_tuple() -> None:
        for _ in range(calls):
            saver.get_tuple(config)

    def invoke() -> None:
        for _ in range(max(1, calls // 6)):
            steps["n"] += 1
            graph.invoke({"messages": [f"user {steps['n']:05d} " + "u" * (MESSAGE - 11)]}, config)

    return {
        "commit_and_claim (1 KiB state)": cycle,
        "LangGraph get_tuple, newest checkpoint": get_tuple,
        "LangGraph invoke, per script (get, 3 puts, 2 put_writes)": invoke,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prelude_ab", description=__doc__)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--readme", action="store_true", help="rewrite the prelude_ab block of benchmarks/README.md")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line("python -m benchmarks.prelude_ab", argv), admin)
        client = _Rewriting.from_url(server.url)
        _Rewriting.twins = _load_twins(admin)
        work = _workloads(client, args.calls)
        usec: dict[str, dict[str, list[float]]] = {w: {"whole": [], "shaken": []} for w in work}
        for r in range(args.rounds):
            for name, run in work.items():
                for mode in ("whole", "shaken") if r % 2 else ("shaken", "whole"):
                    client.whole = mode == "whole"
                    admin.config_resetstat()
                    run()
                    stats = admin.info("commandstats")["cmdstat_evalsha"]
                    usec[name][mode].append(stats["usec"] / stats["calls"])
        for name, modes in usec.items():
            w, s = statistics.median(modes["whole"]), statistics.median(modes["shaken"])
            print(f"{name}: whole preludes {w:.2f} us, as sent {s:.2f} us per script: {w / s:.2f}x")
    finally:
        server.stop()
    if args.readme:
        report.publish(meta, "prelude_ab", usec, {"rounds": args.rounds, "calls": args.calls})
    return 0


def markdown(usec: dict[str, dict[str, list[float]]], params: dict[str, Any]) -> str:
    """The prelude_ab block: server us per script with whole preludes and as sent."""
    lines = [
        f"{params['rounds']} interleaved rounds of {params['calls']} calls per workload (alternating which goes "
        "first); server us per EVALSHA from `INFO commandstats`, median of rounds (min in brackets).",
        "",
        "| workload | whole preludes, us | as sent (the statements it uses), us | whole / as sent, per round |",
        "| --- | --- | --- | --- |",
    ]
    for name, modes in usec.items():
        w, s = modes["whole"], modes["shaken"]
        ratio = statistics.median(a / b for a, b in zip(w, s, strict=True))
        lines.append(
            f"| {name} | {statistics.median(w):.2f} ({min(w):.2f}) | {statistics.median(s):.2f} ({min(s):.2f}) | "
            f"{ratio:.2f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
