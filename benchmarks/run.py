"""One command for every figure: ``python -m benchmarks [--quick] [--url URL] [--only a,b] [--out DIR]``.

Starts a private ``redis-server`` on a free loopback port in a temp dir
(unless ``--url``), runs the figures, writes ``<out>/latest.json`` (or, for
opt-in figures alone into the default results dir, ``<out>/<figures>.json``)
and PNG plots, prints the tables, and (a run that is not ``--quick``, into the
default results dir) rewrites each figure's block of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import redis

from redis_agentstate.embedded import EmbeddedServer, start_embedded

from . import (
    concurrency,
    floor,
    history,
    langgraph_savers,
    langgraph_store,
    otel,
    payload,
    plots,
    pool_scale,
    pools,
    profile_hot,
    report,
    scale,
    single,
)
from ._util import Settings, git_state, load_average, machine_info, server_modules, server_pid_of, versions

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")

FIGURES: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "single": single.run,
    "history": history.run,
    "concurrency": concurrency.run,
    "pools": pools.run,
    "payload": payload.run,
    "profile": profile_hot.run,
    "floor": floor.run,
}
#: Figures that run only when named in ``--only`` (long set-ups, budgets rather than comparisons).
OPT_IN: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "pool_scale": pool_scale.run,
    "langgraph": langgraph_savers.run,
    "langgraph_store": langgraph_store.run,
    "scale": scale.run,
    "telemetry": otel.run,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--url",
        help="use this Redis instead of a private redis-server (keys are namespaced per run "
        "and deleted; nothing is flushed)",
    )
    p.add_argument("--quick", action="store_true", help="smoke preset: tiny sizes, one short round (a few seconds)")
    p.add_argument("--rounds", type=int, help="rounds per figure (default 9, --quick 1)")
    p.add_argument(
        "--only",
        help=f"comma-separated figures to run (default all: {','.join(FIGURES)}; opt-in: {','.join(OPT_IN)})",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for latest.json and the PNGs (default %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--readme",
        choices=("auto", "yes", "no"),
        default="auto",
        help="rewrite each measured figure's block of benchmarks/README.md (auto: unless --quick, "
        "--url, or an --out other than the default)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = [f.strip() for f in args.only.split(",")] if args.only else list(FIGURES)
    unknown = [f for f in only if f not in FIGURES and f not in OPT_IN]
    if unknown:
        print(f"unknown figure(s) {unknown}; choose from {list(FIGURES) + list(OPT_IN)}", file=sys.stderr)
        return 2
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 9)
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    server: EmbeddedServer | None = None
    if args.url:
        url, kind = args.url, "given (--url)"
    else:
        server = start_embedded(prefer="redis-server")
        url, kind = server.url, "private"
    try:
        with redis.Redis.from_url(url) as client:
            pid = server_pid_of(client)
            meta: dict[str, Any] = {
                "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "command": ("python -m benchmarks " + shlex.join(argv if argv is not None else sys.argv[1:])).strip(),
                "quick": args.quick,
                "rounds": rounds,
                "machine": machine_info(),
                "versions": versions(client),
                "git": git_state(os.path.dirname(HERE)),
                "load": {"start": load_average()},
                "server": {"kind": kind, "modules": server_modules(client), "cpu_sampled": pid is not None},
            }
        settings = Settings(
            url=url, server_pid=pid, private=server is not None, quick=args.quick, rounds=rounds, seed=args.seed
        )
        figures: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for name in only:
            t0 = time.perf_counter()
            print(f"[benchmarks] {name} ...", file=sys.stderr, flush=True)
            try:
                figures[name] = {**FIGURES, **OPT_IN}[name](settings)
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            print(f"[benchmarks] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    meta["duration_s"] = round(time.perf_counter() - started, 1)
    meta["load"]["end"] = load_average()
    results: dict[str, Any] = {"schema": 1, "meta": meta, "figures": figures, "errors": errors}
    results["targets"] = report.targets(results)
    images: list[str] = []
    if not args.no_plots:
        why = plots.available()
        if why:
            results["plots"] = why
            print(f"[benchmarks] {why}", file=sys.stderr)
        else:
            images = plots.draw(results, args.out)
            results["plots"] = images
    default_out = os.path.abspath(args.out) == DEFAULT_OUT
    # Opt-in figures alone keep their own JSON in results/, so the main run's latest.json stays its own.
    json_name = "+".join(only) + ".json" if default_out and set(only) <= set(OPT_IN) else "latest.json"
    path = os.path.join(args.out, json_name)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(report.markdown(results, images))
    write_readme = args.readme == "yes" or (args.readme == "auto" and not args.quick and not args.url and default_out)
    if write_readme:
        for name, body in report.blocks(results, images if default_out else []).items():
            report.write_block(meta, name, body, README)
    print(f"[benchmarks] wrote {path}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
