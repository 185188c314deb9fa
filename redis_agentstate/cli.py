"""``agentstate``: the fleet demo and operator commands.

::

    agentstate demo                      # a fleet on a private Redis: crash, freeze, takeover, fencing
    agentstate list                      # tasks: status, cycle, revision, claim
    agentstate list --parked             # parked (poison) tasks: attempts and last failure
    agentstate list --waiting            # tasks waiting for a person, with their deadline
    agentstate requeue TASK              # a parked task runs again
    agentstate cancel TASK [--reason R]  # a task ends at once (status cancelled)
    agentstate resume TASK [--message J] # a waiting task runs again, the JSON message appended
    agentstate limit KEY N|none          # at most N live leases of the tasks of concurrency key KEY
    agentstate show TASK                 # one checkpoint
    agentstate watch POOL [--from N]     # a pool's record log, then a live tail
    agentstate stats                     # tasks by status, live/expired leases, pool sizes, memory
    agentstate stats --watch             # a live view, refreshed every second (plain terminal, SSH)

``--url`` (or ``REDIS_URL``) picks the Redis; ``--namespace`` the key
namespace (default ``agentstate``; ``demo`` defaults to a fresh ``demo-<random>``;
an empty or malformed one is a usage error, never the default);
``--json`` prints machine-readable output.
Without a URL, ``demo`` starts a private server (see :ref:`the fleet demo <the-fleet-demo>`).

Exit status: 0 on success, 1 on an error (one line on stderr, ``agentstate: ...``;
with ``--json`` that line is a JSON object ``{"error": {"type": ..., "message": ...}}``
on stderr, so stdout only ever carries the data asked for), 2 on a usage error
(argparse), 130 on Ctrl-C, and 141 (128 + SIGPIPE) when the reader of stdout went
away (``agentstate list | head``), quietly, as other Unix tools do. An unexpected
exception is reported the same way; set ``AGENTSTATE_TRACEBACK=1`` to see its traceback.

Human output escapes control characters in ids and values (``\\n``, ``\\x1b``,
``\\u202e``...), so a hostile task id cannot forge a table row or drive the
terminal; ``--json`` output is exact.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from .commands.common import CliError, esc, namespace_arg
from .commands.common import Parser as _Parser
from .commands.common import dump as _dump
from .commands.common import positive as _positive
from .commands.common import whole as _whole
from .core.replies import lenient_text
from .core.stats import limit_rows
from .errors import AgentStateError, BackendUnavailable, InvalidArgument, TaskNotFound
from .fleet import cli as fleet_cli
from .keys import Keys
from .spec import StoreSpec, redact
from .wire.shells import internals

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = ["main"]

DEFAULT_NAMESPACE = "agentstate"


def _error_line(exc: BaseException) -> tuple[str, str, str]:
    """``(type, line, message)`` describing ``exc``: the human line names the type where the
    message alone would not; the ``--json`` message does not repeat its ``type``."""
    if isinstance(exc, CliError):
        return exc.kind, str(exc), str(exc)
    kind = type(exc).__name__
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, BackendUnavailable)):
        return kind, f"cannot reach Redis: {exc}", f"cannot reach Redis: {exc}"
    if isinstance(exc, redis.RedisError):
        return kind, f"Redis error: {exc}", f"Redis error: {exc}"
    if isinstance(exc, AgentStateError):
        return kind, f"{kind}: {exc}", str(exc)
    return kind, f"unexpected error: {kind}: {exc}", f"unexpected error: {exc}"


def _report_error(exc: BaseException, as_json: bool) -> None:
    kind, text, message = _error_line(exc)
    if as_json:
        line = json.dumps({"error": {"type": kind, "message": message}}, ensure_ascii=False)
    else:
        line = f"agentstate: {esc(text)}"
    print(line, file=sys.stderr, flush=True)


#: The URL schemes ``--url`` takes (redis-py's three, and Sentinel's through :class:`StoreSpec`).
URL_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://")


def _client(args: argparse.Namespace) -> redis.Redis | RedisCluster:
    url = args.url or os.environ.get("REDIS_URL")
    if not url:
        raise CliError("no Redis given: pass --url redis://host:port/0 or set REDIS_URL", "NoRedisURL")
    scheme, sep, rest = url.partition("://")
    if sep:  # schemes are case-insensitive (RFC 3986), as StoreSpec takes them; redis-py wants lower case
        url = scheme.lower() + sep + rest
    if not url.startswith(URL_SCHEMES):
        schemes = f"{', '.join(URL_SCHEMES[:-1])} or {URL_SCHEMES[-1]}"
        # redact() lower-cases the scheme it shows: name the one given.
        why = f"it must start with {schemes}"
        if sep:
            why = f"its scheme {scheme + sep!r} is none of {schemes}"
        raise CliError(f"bad Redis URL {redact(url)!r}: {why}", "BadRedisURL")
    if url.startswith("redis+sentinel:"):
        try:
            primary: redis.Redis = StoreSpec.redis(url, cluster=bool(args.cluster)).client()
            return primary
        except InvalidArgument as exc:
            raise CliError(str(exc), "BadRedisURL") from exc
    try:
        if args.cluster:
            from redis.cluster import RedisCluster

            try:
                return RedisCluster.from_url(url)
            except redis.RedisClusterException as exc:  # e.g. "Cluster mode is not enabled on this node"
                raise CliError(
                    f"--cluster: {redact(url)} is not a reachable Redis Cluster: {exc}", "NotACluster"
                ) from exc
        return redis.Redis.from_url(url)
    except ValueError as exc:  # redis-py's URL parser; the URL is shown without its password
        raise CliError(f"bad Redis URL {redact(url)!r}: {exc}", "BadRedisURL") from exc


def _namespace(args: argparse.Namespace) -> str:
    return DEFAULT_NAMESPACE if args.namespace is None else str(args.namespace)  # '' was refused by the parser


# ---- list / show / stats --------------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]{1,16}")


def task_rows(store: Any, task_ids: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
    """Server time (ms) and the scalar fields of each task (no histories): ``CheckpointCore.summaries``.

    A task whose fields this library would not have written (or whose key is
    not a hash) is a row with status ``corrupt`` and a ``corrupt`` reason: one
    bad task does not hide the others.
    """
    return store._summaries(task_ids)  # type: ignore[no-any-return]


def _store(args: argparse.Namespace) -> Any:
    from .checkpoint import CheckpointStore

    return CheckpointStore(_client(args), namespace=_namespace(args))


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.parked:
        return _list_parked(args, store)
    if args.waiting:
        return _list_waiting(args, store)
    rows, hidden = _limited_rows(store, store.list(), args.limit)
    if args.json:
        print(_dump(rows))
        return 0
    if not rows:
        print(f"no tasks in namespace {esc(repr(store.namespace))}")
        return 0
    ids_shown = [esc(r["task_id"]) for r in rows]
    width = max(4, *(len(t) for t in ids_shown))
    print(f"{'TASK'.ljust(width)}  {'STATUS':<24}  {'CYCLE':>6}  {'REV':>6}  CLAIM")
    for tid, r in zip(ids_shown, rows, strict=True):
        status = esc(r["status"]) + (" (terminal)" if r["terminal"] and r["status"] == "running" else "")
        status += " (parked)" if r.get("parked") else ""
        status += f" (p{r['priority']})" if r.get("priority") else ""
        claim = ""
        if r["claim_token"]:
            ms = r["lease_remaining_ms"] or 0
            when = f"expires in {ms / 1000:.1f}s" if ms > 0 else f"expired {-ms / 1000:.1f}s ago"
            claim = f"cycle {r['claimed_cycle']} by {esc(r['claim_token'])} ({when})"
        cycle, rev = ("?", "?") if r["status"] == "corrupt" else (r["cycle_index"], r["revision"])
        if r["status"] == "corrupt":
            claim = f"not data redis_agentstate wrote: {esc(r['corrupt'])}"
        elif r["status"] == "cancelled":
            claim = f"reason: {esc(r.get('last_failure') or '(none given)')}"
        elif not claim and r.get("due_in_ms") is not None and r["due_in_ms"] > 0:
            claim = ("deadline" if r["status"] == "wait_user" else "due") + f" in {_seconds(r['due_in_ms'])}"
        print(f"{tid.ljust(width)}  {status:<24}  {cycle:>6}  {rev:>6}  {claim}")
    if hidden:
        print(f"... and {hidden} more task(s) (--limit {args.limit}; raise or drop --limit to list them)")
    return 0


def _limited_rows(store: Any, ids: list[str], limit: int | None) -> tuple[list[dict[str, Any]], int]:
    """The rows of the first ``limit`` of ``ids`` (all without one), and how many were left out."""
    hidden = 0
    if limit is not None and len(ids) > limit:
        hidden, ids = len(ids) - limit, ids[:limit]
    return task_rows(store, ids)[1], hidden


def _table(args: argparse.Namespace, store: Any, rows: list[dict[str, Any]], what: str) -> tuple[list[str], int] | None:
    """A listing's rows as JSON, or its "no ..." line (None: printed); else the escaped ids and the
    width of the TASK column, for the table the caller prints."""
    if args.json:
        print(_dump(rows))
        return None
    if not rows:
        print(f"no {what} in namespace {esc(repr(store.namespace))}")
        return None
    ids_shown = [esc(r["task_id"]) for r in rows]
    return ids_shown, max(4, *(len(t) for t in ids_shown))


def _list_parked(args: argparse.Namespace, store: Any) -> int:
    """``list --parked``: the parked tasks (from the shards' parked indexes, paged), attempts and last failure."""
    rows, hidden = _limited_rows(store, store.list_parked(), args.limit)
    # A task requeued, finalized or deleted since it was listed is not parked any more.
    rows = [r for r in rows if r["parked"] or r["status"] == "corrupt"]
    for r in rows:
        # The cycle whose attempts failed: the one after the last committed (``cycle_index``, list's CYCLE).
        # The table's AT CYCLE and the JSON's ``at_cycle`` are this one value (as in ``stats --watch``).
        r["at_cycle"] = None if r["status"] == "corrupt" else r["cycle_index"] + 1
    table = _table(args, store, rows, "parked tasks")
    if table is None:
        return 0
    ids_shown, width = table
    print(f"{'TASK'.ljust(width)}  {'STATUS':<10}  {'AT CYCLE':>8}  {'ATTEMPTS':>8}  LAST FAILURE")
    for tid, r in zip(ids_shown, rows, strict=True):
        if r["status"] == "corrupt":
            print(f"{tid.ljust(width)}  {'corrupt':<10}  {'?':>8}  {'?':>8}  not data redis_agentstate wrote: "
                  f"{esc(r['corrupt'])}")  # fmt: skip
            continue
        why = esc(r["last_failure"] or "(none recorded)")
        print(f"{tid.ljust(width)}  {esc(r['status']):<10}  {r['at_cycle']:>8}  {r['attempts']:>8}  {why}")
    if hidden:
        print(f"... and {hidden} more parked task(s) (--limit {args.limit}; raise or drop --limit to list them)")
    print("(`agentstate requeue TASK` runs one again)")
    return 0


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f}s"


def _list_waiting(args: argparse.Namespace, store: Any) -> int:
    """``list --waiting``: the tasks waiting for a person (status wait_user), with their deadline if any."""
    # Every task's scalar fields, as `list` reads them (a wait is no index of its own): O(tasks).
    _, every = task_rows(store, store.list())
    rows = [r for r in every if r["status"] in ("wait_user", "corrupt")]
    hidden = 0
    if args.limit is not None and len(rows) > args.limit:
        hidden, rows = len(rows) - args.limit, rows[: args.limit]
    table = _table(args, store, rows, "tasks waiting for a person")
    if table is None:
        return 0
    ids_shown, width = table
    print(f"{'TASK'.ljust(width)}  {'CYCLE':>6}  DEADLINE")
    for tid, r in zip(ids_shown, rows, strict=True):
        if r["status"] == "corrupt":
            print(f"{tid.ljust(width)}  {'?':>6}  not data redis_agentstate wrote: {esc(r['corrupt'])}")
            continue
        due = r["due_in_ms"]
        if due is None:
            deadline = "none (waits for `agentstate resume`)"
        elif r["claim_token"]:
            deadline = f"passed: handled by {esc(r['claim_token'])}"
        else:
            deadline = f"in {_seconds(due)}" if due > 0 else f"passed {_seconds(-due)} ago (due to run)"
        print(f"{tid.ljust(width)}  {r['cycle_index']:>6}  {deadline}")
    if hidden:
        print(f"... and {hidden} more waiting task(s) (--limit {args.limit}; raise or drop --limit to list them)")
    print("(`agentstate resume TASK --message JSON` answers one)")
    return 0


def _json_arg(option: str, text: str) -> Any:
    """The JSON value ``text`` an option gave: InvalidArgument for what json.loads refuses, or nests
    deeper than it (or the store's codec) can go: RecursionError, which is no ValueError."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{option} is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgument(f"{option} is JSON nested too deeply (arrays or objects within each other)") from None


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume TASK [--message JSON]``: a task waiting for a person runs again, the message appended."""
    # The argument is checked before Redis is reached: nothing is written for a bad one.
    message = None if args.message is None else _json_arg("--message", args.message)
    store = _store(args)
    store.resume(args.task, message=message)  # TaskNotFound / NotWaiting: exit status 1, one line
    data = {"task_id": args.task, "resumed": True}
    if args.json:
        print(_dump(data))
        return 0
    with_message = "" if message is None else ", the message appended"
    print(f"resumed {esc(args.task)}: due now{with_message}")
    return 0


def cmd_limit(args: argparse.Namespace) -> int:
    """``limit KEY N|none``: at most N live leases of the tasks whose concurrency key is KEY."""
    raw = args.limit.strip().lower()
    if raw == "none":
        limit = None
    elif _DIGITS.fullmatch(raw):
        limit = int(raw)  # ASCII digits, few enough for int(): the store refuses it out of range
    else:
        # isdigit() took '²' (int() then raised a raw ValueError) and other scripts' digits (Arabic-Indic ones).
        raise InvalidArgument(
            f"the limit must be a whole number of leases in ASCII digits (0-9), or 'none'; got {args.limit!r}"
        )
    store = _store(args)
    store.set_concurrency_limit(args.key, limit)  # InvalidArgument (0, too large, a bad key): exit status 1
    data: dict[str, Any] = {"key": args.key, "limit": limit}
    if limit is not None:
        data["live"] = next((s.live for s in store.concurrency_limits() if s.key == args.key), 0)
    if args.json:
        print(_dump(data))
        return 0
    if limit is None:
        print(f"concurrency key {esc(args.key)}: no limit")
    else:
        print(f"concurrency key {esc(args.key)}: at most {limit} live lease(s); {data['live']} live now")
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    """``requeue TASK``: a parked task becomes runnable again, its attempts counted from 0."""
    store = _store(args)
    _, rows = task_rows(store, [args.task])
    store.requeue(args.task)  # TaskNotFound / NotParked: exit status 1, one line
    row = rows[0] if rows else {}
    data = {"task_id": args.task, "requeued": True, "attempts": row.get("attempts"),
            "last_failure": row.get("last_failure")}  # fmt: skip
    if args.json:
        print(_dump(data))
        return 0
    why = esc(data["last_failure"] or "(none recorded)")
    cycle = (row.get("cycle_index") or 0) + 1
    print(f"requeued {esc(args.task)}: runnable again at cycle {cycle} (it had {data['attempts']} attempt(s); "
          f"last failure: {why})")  # fmt: skip
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """``cancel TASK [--reason ...]``: the task ends at once, status cancelled; its holder is fenced out."""
    store = _store(args)
    cancelled = store.cancel(args.task, reason=args.reason)  # TaskNotFound: exit status 1, one line
    data = {"task_id": args.task, "cancelled": cancelled}
    if args.json:
        print(_dump(data))
        return 0
    if cancelled:
        print(f"cancelled {esc(args.task)}: it will not be claimed again (its holder's next write is refused)")
    else:
        print(f"{esc(args.task)} was terminal already: nothing changed")
    return 0


def cmd_reshard(args: argparse.Namespace) -> int:
    """``reshard --shards N``: grow the namespace to N shards (a multiple of its count) while it runs."""
    store = _store(args)
    quiet = args.json

    def progress(moved: int, of: int) -> None:
        if not quiet:
            print(f"  moved {moved}/{of} old shards", file=sys.stderr, flush=True)

    report = store.reshard(args.shards, progress=progress)
    data = {"namespace": report.namespace, "from_shards": report.from_shards, "to_shards": report.to_shards,
            "moved_shards": report.moved, "keys": report.keys, "seconds": round(report.seconds, 3),
            "worst_pause_ms": round(report.worst_pause_ms, 1), "unknown_keys": report.unknown}  # fmt: skip
    if args.json:
        print(_dump(data))
        return 0
    if not report.moved:
        print(f"namespace {esc(report.namespace)} has {report.to_shards} shards already: nothing moved")
        return 0
    print(f"namespace {esc(report.namespace)}: {report.from_shards} -> {report.to_shards} shards; moved "
          f"{report.moved} old shard(s), {report.keys} key(s) in {report.seconds:.2f} s; the longest a shard "
          f"was sealed: {report.worst_pause_ms:.0f} ms")  # fmt: skip
    if report.unknown:
        print(f"left {report.unknown} key(s) under the old shards' tags that this library did not write")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    cp = store.load(args.task)
    if cp is None:
        # Worded and typed as requeue's (the store's) TaskNotFound.
        raise TaskNotFound(f"no task {args.task!r} in namespace {store.namespace!r}", task_id=args.task)
    if args.json:
        print(_dump(cp))
        return 0
    fields = ["task_id", "status", "cycle_index", "revision", "claim_token", "claimed_cycle",
              "lease_expires_at_ms", "terminal_result", "budget_usage", "shared_state",
              "attempts", "parked", "last_failure", "due_at_ms", "priority", "concurrency_key"]  # fmt: skip
    for name in fields:
        print(f"{name:>20}: {esc(_dump(getattr(cp, name)))}")
    print(f"{'cycles':>20}: {len(cp.cycles)} record(s)")
    shown = cp.messages[-args.messages :] if args.messages else []
    print(f"{'messages':>20}: {len(cp.messages)} (last {len(shown)} below)")
    for i, m in enumerate(shown, start=len(cp.messages) - len(shown)):
        print(f"{i:>20}: {esc(_dump(m))}")
    return 0


#: Pools sized per pipeline by ``stats``.
_POOL_BATCH = 500


def pool_sizes(
    client: redis.Redis | RedisCluster, keys: Keys, pool_ids: Sequence[str]
) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Members, messages, wakes and records of each pool: O(1) counts (HLEN), never the pool's contents.

    A pool whose keys or sequence are not ours is returned apart, with the
    reason, so one corrupt pool does not hide the others. ``keys``: a store's, resolved (the
    namespace's layout read).
    """
    sizes: dict[str, dict[str, int]] = {}
    corrupt: dict[str, str] = {}
    for i in range(0, len(pool_ids), _POOL_BATCH):
        batch = pool_ids[i : i + _POOL_BATCH]
        pipe = client.pipeline(transaction=False)
        for pool_id in batch:
            k = keys.pool(pool_id)
            for key in (k.members, k.messages, k.wakes):
                pipe.execute_command("HLEN", key)
            pipe.execute_command("HGET", k.state, "seq")
        replies = pipe.execute(raise_on_error=False)
        for j, pool_id in enumerate(batch):
            members, messages, wakes, seq = replies[4 * j : 4 * j + 4]
            failed = next((r for r in (members, messages, wakes, seq) if isinstance(r, Exception)), None)
            if failed is not None:
                corrupt[pool_id] = f"a key of agent pool {pool_id!r} is not data redis_agentstate wrote: {failed}"
            elif seq is not None and not _DIGITS.fullmatch(lenient_text(seq)):
                corrupt[pool_id] = f"agent pool {pool_id!r} holds a malformed seq {seq!r}"
            else:
                sizes[pool_id] = {"members": int(members), "messages": int(messages), "wakes": int(wakes),
                                  "records": int(seq or 0)}  # fmt: skip
    return sizes, corrupt


def cmd_stats(args: argparse.Namespace) -> int:
    from .commands import stats_view as _stats_view

    store = _store(args)
    eviction = _stats_view.eviction_report(store.client)  # first: it is printed here, not logged by the store
    if args.watch:
        return _stats_view.watch(
            store, interval=args.interval, iterations=args.iterations, as_json=bool(args.json), esc=esc,
            warnings=eviction["warnings"],
        )  # fmt: skip
    now, rows = task_rows(store, store.list())
    by_status = Counter(r["status"] for r in rows)
    live = sum(1 for r in rows if r["lease_state"] == "live")
    expired = sum(1 for r in rows if r["lease_state"] == "expired")
    parked = sum(1 for r in rows if r.get("parked"))
    claimable = sum(
        1
        for r in rows
        if r["status"] == "running" and not r["terminal"] and r["lease_state"] != "live" and not r.get("parked")
    )
    pools: dict[str, dict[str, int]] = {}
    corrupt_pools: dict[str, str] = {}
    try:
        from .pools import PoolStore
    except ImportError:  # pragma: no cover - pools not built into this install
        PoolStore = None  # type: ignore[assignment,misc]
    if PoolStore is not None:
        pool_store = PoolStore(store.client, namespace=store.namespace)
        pool_ids = pool_store.list()
        pools, corrupt_pools = pool_sizes(store.client, internals(pool_store).core.keys, pool_ids)
    data = {
        "namespace": store.namespace,
        "shards": store.shards,
        "layout": (keys := internals(store).core.keys).layout,
        # A reshard under way (agentstate reshard): the count it grows to and the old shards moved so far.
        "resharding": None if not keys.target else {"to": keys.target, "moved": keys.moved},
        "server_time_ms": now,
        "tasks": len(rows),
        "by_status": dict(sorted(by_status.items())),
        "claimable_now": claimable,
        "live_leases": live,
        "expired_leases": expired,
        "parked": parked,
        "pools": pools,
        "corrupt_tasks": {r["task_id"]: r["corrupt"] for r in rows if r["status"] == "corrupt"},
        "corrupt_pools": corrupt_pools,
        "concurrency_limits": limit_rows(store.concurrency_limits()),
        "memory": _stats_view.memory_report(store, args.memory_sample),
        "eviction": eviction,
    }
    if args.json:
        print(_dump(data))
        return 0
    growing = data["resharding"]
    print(
        f"namespace {esc(repr(store.namespace))}: {len(rows)} task(s), {store.shards} shards ({data['layout']} layout)"
        + (f"; resharding to {growing['to']}: {growing['moved']} of {store.shards} moved" if growing else "")
    )
    for status, n in sorted(by_status.items()):
        print(f"  {esc(status):<24} {n}")
    print(f"  claimable now            {claimable}")
    print(f"  live leases              {live}")
    print(f"  expired leases           {expired}   (claimable by the next worker)")
    print(f"  parked                   {parked}   (poison tasks: `agentstate list --parked`)")
    for what, bad in (("task", data["corrupt_tasks"]), ("pool", corrupt_pools)):
        for ident, reason in bad.items():
            print(f"  corrupt {what} {esc(ident)}: {esc(reason)}")
    for line in _stats_view.limit_lines(data["concurrency_limits"]):
        print(esc(line))
    print(f"{len(pools)} pool(s)")
    for pool_id, p in pools.items():
        print(
            f"  {esc(pool_id)}: {p['members']} member(s), {p['messages']} message(s), {p['wakes']} wake(s), "
            f"{p['records']} record(s)"
        )
    for line in _stats_view.memory_lines(data["memory"]):
        print(esc(line))
    for warning in data["eviction"]["warnings"]:
        print(f"WARNING: {esc(warning)}")
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
                    print(f"{rec.cursor.sequence:>8}  {esc(rec.kind):<14} {esc(_dump(rec.payload))}", flush=True)
                after = rec.cursor
            if args.once and len(records) < count:
                return 0
    except KeyboardInterrupt:
        return 0


# ---- parser ----------------------------------------------------------------------------------------


#: Seconds on the command line: ASCII digits with an optional fraction (float() also takes 'nan',
#: '1_0', ' 5' and other scripts' digits).
_SECONDS = re.compile(r"[0-9]{1,5}(\.[0-9]{0,6})?|\.[0-9]{1,6}")


def _positive_seconds(value: str) -> float:
    if not _SECONDS.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not a number of seconds (ASCII digits, as 0.5 or 2): {value!r}")
    n = float(value)
    if not 0.01 <= n <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.01 and 3600 seconds, got {value}")
    return n


def build_parser() -> argparse.ArgumentParser:
    """The ``agentstate`` argument parser; each command's namespace carries its handler as ``func``."""
    # The demo's parent lacks --namespace (its default differs) and --cluster (it runs on one Redis).
    demo_common = _Parser(add_help=False)
    demo_common.add_argument("--url", default=argparse.SUPPRESS, help="Redis URL (default: $REDIS_URL)")
    demo_common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    common = _Parser(add_help=False, parents=[demo_common])
    common.add_argument("--namespace", type=namespace_arg, default=argparse.SUPPRESS,
                        help=f"key namespace (default: {DEFAULT_NAMESPACE})")  # fmt: skip
    common.add_argument("--cluster", action="store_true", default=argparse.SUPPRESS, help="the URL is a Redis Cluster")

    parser = _Parser(
        prog="agentstate", description="Durable, fenced state for fleets of AI-agent workers on Redis.",
        parents=[common],
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fleet_cli.add_demo(sub, demo_common)

    lst = sub.add_parser("list", parents=[common], help="list tasks with status, cycle, revision and claim")
    lst.add_argument("--limit", type=_positive, default=None, metavar="N",
                     help="list at most N tasks (in id order) and say how many more there are")  # fmt: skip
    kind = lst.add_mutually_exclusive_group()
    kind.add_argument("--parked", action="store_true",
                      help="only the parked (poison) tasks, with their attempts and last failure")  # fmt: skip
    kind.add_argument("--waiting", action="store_true",
                      help="only the tasks waiting for a person (wait_user), with their deadline")  # fmt: skip
    lst.set_defaults(func=cmd_list)

    requeue = sub.add_parser("requeue", parents=[common], help="make a parked (poison) task runnable again")
    requeue.add_argument("task")
    requeue.set_defaults(func=cmd_requeue)

    cancel = sub.add_parser("cancel", parents=[common], help="end a task at once (status cancelled)")
    cancel.add_argument("task")
    cancel.add_argument("--reason", default=None, help="kept as the task's last failure (`show` prints it)")
    cancel.set_defaults(func=cmd_cancel)

    resume = sub.add_parser("resume", parents=[common], help="answer a task waiting for a person: it runs again")
    resume.add_argument("task")
    resume.add_argument("--message", default=None, metavar="JSON",
                        help="appended to the task's messages (a JSON value)")  # fmt: skip
    resume.set_defaults(func=cmd_resume)

    limit = sub.add_parser("limit", parents=[common],
                           help="cap the live leases of one concurrency key (a tenant, an API key)")  # fmt: skip
    limit.add_argument("key", help="the concurrency key (Checkpoint.concurrency_key)")
    limit.add_argument("limit", help="the most live leases at once, or 'none' to remove the limit")
    limit.set_defaults(func=cmd_limit)

    reshard = sub.add_parser("reshard", parents=[common],
                             help="grow the namespace to more shards while workers keep working")  # fmt: skip
    reshard.add_argument("--shards", type=_positive, required=True, metavar="N",
                         help="the new shard count: a multiple of the current one, at most 16384")  # fmt: skip
    reshard.set_defaults(func=cmd_reshard)

    show = sub.add_parser("show", parents=[common], help="show one task's checkpoint")
    show.add_argument("task")
    show.add_argument("--messages", type=_whole, default=10, help="how many of the last messages to print")
    show.set_defaults(func=cmd_show)

    watch = sub.add_parser("watch", parents=[common], help="print a pool's records, then follow new ones")
    watch.add_argument("pool")
    watch.add_argument("--from", dest="from_", type=_whole, default=None, metavar="CURSOR",
                       help="start after this cursor sequence (default: from the oldest record kept)")  # fmt: skip
    watch.add_argument("--count", type=_positive, default=None, help=f"records per read (default {WATCH_PAGE})")
    watch.add_argument("--once", action="store_true", help="print what is there and exit (no live tail)")
    watch.set_defaults(func=cmd_watch)

    stats = sub.add_parser("stats", parents=[common], help="tasks by status, live/expired leases, pool sizes")
    stats.add_argument(
        "--watch",
        action="store_true",
        help="a live view: tasks by status, claims/commits/takeovers per second, parked, oldest due",
    )
    stats.add_argument(
        "--interval",
        type=_positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="--watch: seconds between frames (default 1)",
    )
    stats.add_argument(
        "--iterations",
        type=_positive,
        default=None,
        metavar="N",
        help="--watch: stop after N frames (default: until Ctrl-C)",
    )
    stats.add_argument(
        "--memory-sample",
        type=_positive,
        default=32,
        metavar="N",
        help="owners of each kind measured with MEMORY USAGE for the memory estimate (default 32)",
    )
    stats.set_defaults(func=cmd_stats)

    _add_langgraph(sub, common)
    serve = sub.add_parser("serve", parents=[common],
                           help="LangGraph's server API (langgraph-sdk, RemoteGraph) over the runs")  # fmt: skip
    serve.add_argument("--graph", action="append", default=[], metavar="NAME=MODULE:ATTR",
                       help="a graph to serve (repeatable); its runs and threads are in namespace NS.NAME; "
                       "none: the dashboard alone")  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token)")
    serve.add_argument("--port", type=_positive, default=2024, help="port (default 2024)")
    serve.add_argument("--token", default=None,
                       help="every route but /ok needs it (x-api-key or Authorization: Bearer; the dashboard: "
                       "a login form); $AGENTSTATE_TOKEN")  # fmt: skip
    serve.add_argument("--workers", type=_whole, default=1, metavar="N",
                       help="runs each graph executes at once in this process (0: a fleet elsewhere does)")  # fmt: skip
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="a browser origin allowed to call the API, e.g. http://localhost:3000 (repeatable; "
                       "'*': any; default: none)")  # fmt: skip
    serve.add_argument("--lease-ms", type=_positive, default=30_000, metavar="MS",
                       help="the runs' thread lease: a crashed server's runs are taken over after it "
                       "(default 30000, at least 1000)")  # fmt: skip
    serve.set_defaults(func=_cmd_serve)
    serve.add_argument("--webhook-allow-private", action="store_true",
                       help="let runs' webhooks reach loopback, private and link-local addresses "
                            "(refused by default: LangChain's SSRF guard)")  # fmt: skip
    serve.add_argument("--tenant-limit", default=None, metavar="KEY=N",
                       help="at most N threads of one tenant run at once, fleet-wide: a run's tenant is its "
                            "metadata[KEY] (e.g. user_id=4)")  # fmt: skip
    return parser


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server.cli import cmd_serve
    except ModuleNotFoundError as exc:
        # The package imports its server (Starlette) and LangGraph only when the command runs.
        raise CliError(f"agentstate serve needs the serve extra: pip install 'redis-agentstate[serve]' "
                       f"(missing: {exc.name})", "MissingExtra") from exc  # fmt: skip

    url = args.url or os.environ.get("REDIS_URL")
    if not url:
        raise CliError("no Redis given: pass --url redis://host:port/0 or set REDIS_URL", "NoRedisURL")
    _client(args)  # the URL checked as every command checks it (its errors never show the password)
    return cmd_serve(args, url, bool(args.cluster))


def _add_langgraph(sub: Any, common: argparse.ArgumentParser) -> None:
    """``agentstate langgraph worker|runs|tail|cancel`` (the ``langgraph`` extra, imported when run)."""
    lg = sub.add_parser("langgraph", help="LangGraph runs: a worker, a thread's runs, a run's live events, cancel")
    lg_sub = lg.add_subparsers(dest="lg_command", required=True, metavar="COMMAND")
    queue_ns = _Parser(add_help=False)
    queue_ns.add_argument("--queue-namespace", default=None, metavar="NS", dest="queue_namespace",
                          type=namespace_arg, help="the RunQueue's namespace (default: --namespace, else agentstate; "
                          "agentstate serve's graph NAME: <ns>.<NAME>)")  # fmt: skip

    def handler(name: str) -> Any:
        def run(args: argparse.Namespace) -> int:
            try:
                from .langgraph import cli as lg_cli
            except ImportError as exc:
                raise CliError(f"agentstate langgraph needs the langgraph extra: {exc}", "MissingExtra") from exc
            return int(getattr(lg_cli, name)(args, lambda: _client(args)))

        return run

    worker = lg_sub.add_parser("worker", parents=[common, queue_ns], help="execute the queue's runs with a graph")
    worker.add_argument("graph", metavar="MODULE:ATTR", help="a compiled graph (or a StateGraph, compiled)")
    worker.add_argument("--concurrency", type=_positive, default=1, metavar="N", help="runs at once (asyncio tasks)")
    worker.add_argument("--lease-ms", type=_positive, default=30_000, metavar="MS",
                        help="the thread lease: a dead worker's runs are taken over after about this long")  # fmt: skip
    worker.add_argument("--saver-namespace", default=None, metavar="NS", type=namespace_arg,
                        help="the AgentStateSaver's namespace (default: --namespace, else agentstate)")  # fmt: skip
    worker.add_argument("--store-namespace", default=None, metavar="NS", type=namespace_arg,
                        help="the LangGraph store given to the graph (default: <ns>.store for --namespace "
                        "<ns>.<NAME>, as agentstate serve's; else none)")  # fmt: skip
    worker.add_argument("--graph-id", default=None, metavar="NAME",
                        help="the graph's name: runs whose metadata graph_id names another end as errors "
                        "(default: NAME for --namespace <ns>.<NAME>, as agentstate serve names it; "
                        "else ATTR)")  # fmt: skip
    worker.set_defaults(func=handler("cmd_worker"))
    runs = lg_sub.add_parser("runs", parents=[common, queue_ns], help="a thread's runs, newest first")
    runs.add_argument("thread")
    runs.add_argument("--limit", type=_positive, default=20, metavar="N")
    runs.set_defaults(func=handler("cmd_runs"))
    tail = lg_sub.add_parser("tail", parents=[common, queue_ns], help="a run's events, live until it ends")
    tail.add_argument("run")
    tail.add_argument("--after", default=None, metavar="EVENT_ID", help="start after this event id")
    tail.set_defaults(func=handler("cmd_tail"))
    cancel = lg_sub.add_parser("cancel", parents=[common, queue_ns], help="stop a run, pending or running")
    cancel.add_argument("run")
    cancel.add_argument("--rollback", action="store_true", help="also delete the run and the checkpoints it wrote")
    cancel.set_defaults(func=handler("cmd_cancel"))


#: Exit status when stdout's reader went away: 128 + SIGPIPE, what a shell reports for a
#: tool killed by SIGPIPE (``yes | head``).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agentstate`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in argv
    if argv[:1] == [fleet_cli.DEMO_WORKER]:  # internal, so not a choice of the user-facing parser
        args = fleet_cli.demo_worker_parser().parse_args(argv[1:])
    else:
        args = build_parser().parse_args(argv)
    # Common options may come before or after the command; unset ones default here (the parsers
    # share their actions, so per-parser defaults would overwrite each other).
    for name, default in (("url", None), ("namespace", None), ("json", False), ("cluster", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # inside the try: a closed pipe must surface here, not at exit
        return code
    except BrokenPipeError:
        # The Python docs' "Note on SIGPIPE": point stdout at devnull so the interpreter's own
        # flush at exit cannot raise again, and exit quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("AGENTSTATE_TRACEBACK"):
            raise
        _report_error(exc, bool(args.json))
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
