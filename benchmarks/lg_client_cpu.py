"""The client's own CPU per LangGraph saver call, with no I/O.

``python -m benchmarks.lg_client_cpu [--repeat 300]``: on a private redis-server, records the saver
calls LangGraph makes over 10 invokes of the langgraph figure's workload (``input-once``) and the
replies Redis gave each, then drives the same operations (``get_tuple``, ``put``, ``put_writes``,
from the second invoke on) again and again with those replies fed in instead of sent: what the
saver's Python costs per call (checking, framing, serializing, reading the reply back), with
neither the client library nor the network in it. A measurement for the closing note of a client
change; it prints, and writes nothing to the README.
"""

from __future__ import annotations

import argparse
import collections
import copy
import time
from typing import Any

import redis

from redis_agentstate.embedded import start_embedded
from redis_agentstate.langgraph import AgentStateSaver
from redis_agentstate.testing import Call, Command, Op, StoreInternals, internals

from .langgraph_savers import _graph, step_input

STEPS = 10
METHODS = ("get_tuple", "put", "put_writes")
#: Replays run first and not counted (caches and the interpreter warm).
WARMUP = 30


def _record(url: str) -> list[tuple[str, Any, Any]]:
    """The saver calls (method, args, kwargs) of STEPS invokes of one thread, as LangGraph made them."""
    saver = AgentStateSaver(redis.Redis.from_url(url), namespace="cpu-record")
    calls: list[tuple[str, Any, Any]] = []
    for name in METHODS:
        real = getattr(saver, name)

        def wrapped(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls.append((_name, copy.deepcopy(a), copy.deepcopy(k)))
            return _real(*a, **k)

        setattr(saver, name, wrapped)
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "t"}}
    for step in range(1, STEPS + 1):
        graph.invoke(step_input(step), config)
    return calls


def _replies(inside: StoreInternals[Any], op: Op[Any]) -> list[Any]:
    """Drive ``op`` by hand (its script calls and plain commands), keeping every reply it was sent."""
    got: list[Any] = []
    try:
        req = next(op)
        while True:
            if isinstance(req, Call):
                reply = inside.scripts[req.script](keys=req.keys, args=req.args, client=inside.client)
            elif isinstance(req, Command):
                reply = inside.client.execute_command(*req.args)
            else:
                raise TypeError(f"a saver call sent {type(req).__name__}: not measured here")
            got.append(reply)
            req = op.send(reply)
    except StopIteration:
        return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lg_client_cpu", description=__doc__)
    p.add_argument("--repeat", type=int, default=300)
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        calls = _record(server.url)
        # The same calls through a second saver, each driven by hand, keeping the replies it got. The
        # first invoke's calls are left out of the timing (they read the namespace's layout as well).
        inside = internals(AgentStateSaver(redis.Redis.from_url(server.url), namespace="cpu-replay"))
        first = len(METHODS) * 2
        for name, a, k in calls[:first]:
            inside.run(getattr(inside.core, name)(*a, **k))
        work = [(name, a, k, _replies(inside, getattr(inside.core, name)(*a, **k))) for name, a, k in calls[first:]]
        spent: dict[str, float] = collections.defaultdict(float)
        for i in range(args.repeat + WARMUP):
            if i == WARMUP:
                spent.clear()
            for name, a, k, got in work:
                t0 = time.perf_counter()
                op = getattr(inside.core, name)(*a, **k)
                next(op)
                try:
                    for reply in got:
                        op.send(reply)
                except StopIteration:
                    pass
                spent[name] += time.perf_counter() - t0
        count = collections.Counter(name for name, _, _, _ in work)
        print(f"client CPU per saver call, no I/O (µs, mean of {args.repeat} replays of invokes 2-{STEPS}):")
        for name in METHODS:
            print(f"  {name:10s} {spent[name] / args.repeat / count[name] * 1e6:7.1f}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
