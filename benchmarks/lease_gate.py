"""What GraphWorker's lease gate costs a run, and the window it leaves.

``python -m benchmarks.lease_gate [--rounds 9] [--runs 300]``: in-process, no Redis, a three-node
graph (each node appends to a list channel) invoked with no checkpointer, so that the gate's
cost is not lost in round trips:

1. **Cost.** The graph's ``invoke`` with an empty config, against the same with the worker's
   ``_LeaseGate`` in its callbacks (two leases, never lost, as the worker's task and thread
   leases). Interleaved rounds (A, B, A, B...) of ``--runs`` invokes each; per round each
   path's microseconds per invoke; medians over rounds, and the difference.
2. **Window.** From the gate's last lease check to the first line of the node it let start (a
   freeze inside that window is the one the gate cannot see): median and p99 over every node
   start of the gated rounds.

A measurement for the closing note of the lease gate (docs/langgraph-runs.md, "Crash recovery");
it prints, and writes nothing to the README.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Any

from benchmarks._lg_steps import State, chain
from redis_agentstate.langgraph.worker import _LeaseGate


class _Held:
    """A lease that is never lost, noting when it was last asked."""

    def __init__(self, checked: list[float]) -> None:
        self.checked = checked

    @property
    def lost(self) -> bool:
        self.checked.append(time.perf_counter())
        return False


def _graph(gaps: list[float], checked: list[float]) -> Any:
    def node(name: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            if checked:
                gaps.append(time.perf_counter() - checked[-1])
                checked.clear()
            return {"log": [name]}

        return run

    return chain(node)


def _per_invoke_us(graph: Any, config: dict[str, Any], runs: int) -> float:
    started = time.perf_counter()
    for _ in range(runs):
        graph.invoke({"log": []}, config)
    return (time.perf_counter() - started) / runs * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lease_gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    p.add_argument("--runs", type=int, default=300, help="invokes per path per round (default 300)")
    args = p.parse_args(argv)
    gaps: list[float] = []
    checked: list[float] = []
    graph = _graph(gaps, checked)
    # The attempt as the gate reads it: not halted by a cancel, its run's ids for the messages.
    attempt: Any = SimpleNamespace(halted=False, run=SimpleNamespace(run_id="r", thread_id="t"))
    gated = {"callbacks": [_LeaseGate(attempt, (_Held(checked), _Held(checked)))]}
    plain_us, gated_us = [], []
    for _ in range(args.rounds):
        plain_us.append(_per_invoke_us(graph, {}, args.runs))
        gated_us.append(_per_invoke_us(graph, gated, args.runs))
    plain, with_gate = statistics.median(plain_us), statistics.median(gated_us)
    print(f"three-node invoke, no checkpointer, {args.rounds} rounds of {args.runs}:")
    print(f"  without the gate: median {plain:.0f} us per invoke")
    print(f"  with the gate: median {with_gate:.0f} us per invoke")
    print(f"  difference: {with_gate - plain:+.0f} us per invoke ({(with_gate / plain - 1) * 100:+.1f}%)")
    gaps.sort()
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
    print(f"window, the gate's check to the node's first line: median {statistics.median(gaps) * 1e6:.0f} us, "
          f"p99 {p99 * 1e6:.0f} us over {len(gaps)} node starts")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
