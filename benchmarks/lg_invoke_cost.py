"""Where an invoke's time goes at steps 1-10, for each LangGraph saver on plain Redis.

``python -m benchmarks.lg_invoke_cost [--rounds 30] [--base COMMIT] [--url URL]``: on a private
redis-server (or the server at ``--url``: a Redis 7.4 from ``../shared/tools/redis-stack.sh``), the langgraph
figure's workload (``input-once``) in fresh threads of 10 invokes, the savers interleaved in a
shuffled order per round. For each saver, per invoke (medians over rounds):

- ``ms/invoke``: the wall time of ``graph.invoke``;
- ``server µs`` and ``commands``: the CPU time the server's main thread spent (its schedstat:
  the commands, scripts with what they run, and the network reads and writes; the server runs
  nothing else) and the commands it processed (a script's own commands included:
  ``AgentStateSaver`` sends 6 per invoke, one script each);
- ``the rest, ms``: the Python that runs the graph and the saver's client side, and the
  waits (LangGraph's own work is the same for every saver).

On the private server, our saver's server time split (``INFO commandstats``): its scripts' time,
of which the commands they ran, and the rest, the scripts' own.

Then each peer's time per invoke over ours, taken within each round (median and p10-p90 over
rounds). ``--base COMMIT`` adds that commit's ``AgentStateSaver`` (loaded as ``client_ab`` loads a
base) to the same rounds, so a change to the saver is priced side by side with what it changes.

Then the client libraries' own cost per round trip, the same command through each (redis-py,
which ``AgentStateSaver`` takes, and valkey-py, which ``ValkeySaver`` takes): what one
command costs before any saver work. A measurement for the closing note of a design question (why
one saver is faster at steps 1-10); it prints, and writes nothing to the README.
"""

from __future__ import annotations

import argparse
import importlib
import random
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from redis_agentstate.embedded import start_embedded

from ._util import Settings, main_thread_cpu_seconds, percentile, server_pid_of, time_batch
from .client_ab import load_base
from .langgraph_savers import CONTENDERS, _graph, step_input

STEPS = 10
OURS = "redis_agentstate AgentStateSaver"
BASE = "redis_agentstate AgentStateSaver, base"


def _savers(url: str, pid: int | None, private: bool, base: Any) -> dict[str, Any]:
    """The langgraph figure's contenders that run on this server (the official saver needs modules)."""
    settings = Settings(url=url, server_pid=pid, private=private)
    out = {}
    for name, factory in CONTENDERS.items():
        try:
            out[name] = factory(settings)[0]
        except Exception:  # a peer not installed, or one this server cannot run
            continue
    if base is not None:
        out[BASE] = importlib.import_module(base.__name__ + ".langgraph").AgentStateSaver(
            settings.client(), namespace=settings.ns("langgraph-base")
        )
    return out


def _thread(graph: Any, admin: redis.Redis, pid: int | None) -> tuple[float, float, float]:
    """(ms, server CPU µs, commands) per invoke over one fresh thread of STEPS invokes."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    commands = int(admin.info("stats")["total_commands_processed"])
    cpu = main_thread_cpu_seconds(pid)
    t0 = time.perf_counter()
    for step in range(1, STEPS + 1):
        graph.invoke(step_input(step), config)
    ms = (time.perf_counter() - t0) * 1000 / STEPS
    cpu = main_thread_cpu_seconds(pid) - cpu
    # Less the two INFO calls of this harness.
    commands = int(admin.info("stats")["total_commands_processed"]) - commands - 1
    return ms, cpu * 1e6 / STEPS, commands / STEPS


def _script_split(graph: Any, admin: redis.Redis, threads: int = 10) -> tuple[float, float, float]:
    """Our saver's server time per invoke from ``INFO commandstats`` (the private server's stats are
    reset): (µs in its EVALSHAs, of which µs in the commands the scripts ran, those commands)."""
    admin.config_resetstat()
    for _ in range(threads):
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        for step in range(1, STEPS + 1):
            graph.invoke(step_input(step), config)
    stats = admin.info("commandstats")
    n = threads * STEPS
    inner = {k: v for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_config", "cmdstat_info")}
    return (
        stats["cmdstat_evalsha"]["usec"] / n,
        sum(v["usec"] for v in inner.values()) / n,
        sum(v["calls"] for v in inner.values()) / n,
    )


def _round_trip(fn: Callable[[], Any], n: int = 2000) -> float:
    return statistics.median(time_batch(fn, n)[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lg_invoke_cost", description=__doc__)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--base", help="a commit whose AgentStateSaver runs in the same rounds")
    p.add_argument("--url", help="an existing server (its keys namespaced; never flushed)")
    args = p.parse_args(argv)
    base, tmp = load_base(args.base) if args.base else (None, None)
    server = None if args.url else start_embedded(prefer="redis-server")
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        admin = redis.Redis.from_url(url)
        pid = server_pid_of(admin)
        print(f"server: redis {admin.info('server')['redis_version']} at {url}")
        graphs = {name: _graph(saver) for name, saver in _savers(url, pid, server is not None, base).items()}
        for graph in graphs.values():
            _thread(graph, admin, pid)  # warm-up: scripts loaded, connections open
        rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in graphs}
        rng = random.Random(7)
        for _ in range(args.rounds):
            order = list(graphs)
            rng.shuffle(order)
            for name in order:
                rows[name].append(_thread(graphs[name], admin, pid))
        print(f"steps 1-{STEPS}, {args.rounds} fresh threads per saver, interleaved; medians per invoke:")
        print(f"  {'saver':44s} {'ms/invoke':>9s} {'server CPU µs':>13s} {'commands':>8s} {'the rest, ms':>12s}")
        for name, samples in rows.items():
            ms, us, calls = (statistics.median(s[i] for s in samples) for i in range(3))
            print(f"  {name:44s} {ms:9.2f} {us:13.0f} {calls:8.1f} {ms - us / 1000:12.2f}")
        print("ms per invoke over ours, per round (median, p10-p90 over rounds):")
        for name, samples in rows.items():
            if name == OURS or OURS not in rows:
                continue
            ratios = [s[0] / o[0] for s, o in zip(samples, rows[OURS], strict=True)]
            print(
                f"  {name + ' / ours':62s} {statistics.median(ratios):.3f}x"
                f" ({percentile(ratios, 10):.3f}-{percentile(ratios, 90):.3f})"
            )
        if server is not None and OURS in graphs:
            script_us, inner_us, inner_calls = _script_split(graphs[OURS], admin)
            print(
                f"ours, INFO commandstats per invoke: {script_us:.0f} µs in its 6 EVALSHAs, of which {inner_us:.0f} µs"
                f" in the {inner_calls:.1f} commands they ran; {script_us - inner_us:.0f} µs is the scripts' own"
                " (Lua, and handing each command's arguments and reply across)"
            )
        client = redis.Redis.from_url(url)
        sha = client.script_load("return 1")
        keys = [f"k{i}" * 12 for i in range(9)]
        trips = {"redis-py": client}
        try:
            from valkey import Valkey

            trips["valkey-py"] = Valkey.from_url(url)
        except ImportError:
            pass
        print("one round trip through each client library (µs, median of 2,000; the same server):")
        for name, c in trips.items():
            ping = _round_trip(c.ping)
            script = _round_trip(lambda c=c: c.evalsha(sha, 9, *keys, *["x" * 40] * 8))
            print(f"  {name:10s} PING {ping:6.1f}   EVALSHA of 'return 1' with 9 keys and 8 args {script:6.1f}")
    finally:
        if server is not None:
            server.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
