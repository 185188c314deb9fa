"""What ``agentstate stats`` reads, as sans-I/O operations (driven by a store's ``_run``).

Every read here is bounded per round trip: the task rows come a page per shard
at a time (``status_counts``), the counters and due heads are one read per
shard, and memory is *sampled*, never summed over every key:

* ``memory_estimate`` counts the owners of each kind (tasks, pools, key/value
  keys, LangGraph threads) exactly from the per-shard indexes (``ZCARD``), picks
  one owner per non-empty shard at random (``ZRANGE`` at a random rank), up to ``sample`` of
  each kind, measures every key of those owners with ``MEMORY USAGE``, and
  extrapolates: count x mean bytes per owner. The shard keys themselves (the
  indexes, counters) are measured, all of them (at most 10 per shard). The result
  is an estimate, labelled so; its error shrinks with the sample and grows with
  how unequal the owners are (one huge task among small ones).
* ``counters`` sums the per-shard counter hashes the claim and commit scripts
  keep (``KEYS[9]`` of those scripts: ``_common.lua``); rates are differences
  of two reads over the server clock between them.
* ``parked_tasks`` reads the per-shard parked indexes (their sizes and first ids).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import AgentStateError
from ..keys import Keys
from ..wire import Op, Pipe, ShardMoved, member_id, restartable
from ..wire.indexes import zset_entries
from .checkpoint import CheckpointCore
from .replies import lenient_text, time_ms
from .validate import MAX_PRIORITY, PRIORITY_BAND_MS

__all__ = [
    "COUNTER_FIELDS",
    "MemoryEstimate",
    "ParkedTasks",
    "Pulse",
    "StatusCounts",
    "counters",
    "due_head",
    "limit_rows",
    "memory_estimate",
    "parked_tasks",
    "pulse",
    "status_counts",
    "status_fields",
]

#: The fields of a shard's counter hash (``_common.lua``), in this order everywhere.
COUNTER_FIELDS = ("claims", "commits", "takeovers")
#: Task ids per shard per round trip of ``status_counts``.
STATUS_PAGE = 100
#: Owners of each kind measured by ``memory_estimate`` by default.
DEFAULT_MEMORY_SAMPLE = 32


@dataclass
class StatusCounts:
    """Tasks by status and by lease state, read a page at a time (``status_counts``)."""

    now_ms: int = 0
    tasks: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    claimable: int = 0
    live_leases: int = 0
    expired_leases: int = 0
    #: Rows found parked (poison tasks: not claimable until requeued).
    parked: int = 0
    corrupt: dict[str, str] = field(default_factory=dict)
    #: The first ``keep`` (``status_counts``) rows of tasks under a live lease, and of tasks waiting
    #: for a person, in the order met: what a dashboard lists, never more than asked.
    leased: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)


@restartable
def status_counts(core: CheckpointCore, page: int = STATUS_PAGE, keep: int = 0) -> Op[StatusCounts]:
    """Every task's status, ``page`` ids per shard per round trip (never the whole index at once);
    with ``keep``, also the rows of the first ``keep`` leased and waiting tasks.

    Each page goes through ``CheckpointCore.summaries``, which drops the index
    entries of tasks that expired (``terminal_ttl_ms``) as it meets them.
    """
    out = StatusCounts()
    index = [core.keys.shard_tasks(s) for s in range(core.keys.shards)]
    pending = {key: b"-" for key in index}
    while pending:
        keys = list(pending)
        replies = yield Pipe([("ZRANGEBYLEX", key, pending[key], b"+", "LIMIT", 0, page) for key in keys])
        pending = {}
        ids: list[str] = []
        for key, got in zip(keys, replies, strict=True):
            ids.extend(member_id(m, key) for m in got)
            if len(got) == page:
                pending[key] = b"(" + got[-1]
        now, rows = yield from core.summaries(ids)
        out.now_ms = now
        for r in rows:
            out.tasks += 1
            out.by_status[r["status"]] += 1
            if r["status"] == "corrupt":
                out.corrupt[r["task_id"]] = r["corrupt"]
                continue
            live = r["lease_state"] == "live"
            if live and len(out.leased) < keep:
                out.leased.append(r)
            if r["status"] == "wait_user" and len(out.waiting) < keep:
                out.waiting.append(r)
            out.live_leases += live
            out.expired_leases += r["lease_state"] == "expired"
            out.parked += r["parked"]
            out.claimable += r["status"] == "running" and not r["terminal"] and not live and not r["parked"]
    if not out.now_ms:
        (t,) = yield Pipe([("TIME",)])
        out.now_ms = time_ms(t)
    return out


def status_fields(counts: StatusCounts) -> dict[str, Any]:
    """The status sweep's totals as a live frame shows them (``stats --watch``, the dashboard)."""
    return {
        "tasks": counts.tasks,
        "by_status": dict(sorted(counts.by_status.items())),
        "claimable_now": counts.claimable,
        "live_leases": counts.live_leases,
        "expired_leases": counts.expired_leases,
    }


@restartable
def counters(keys: Keys) -> Op[tuple[int, dict[str, int]]]:
    """Server time (ms) and the namespace's claims, commits and takeovers since the counters began."""
    replies = yield Pipe([("TIME",), *(("HMGET", keys.shard_counters(s), *COUNTER_FIELDS) for s in range(keys.shards))])
    totals = dict.fromkeys(COUNTER_FIELDS, 0)
    for values in replies[1:]:
        for name, value in zip(COUNTER_FIELDS, values, strict=True):
            if value is not None and (text := lenient_text(value)).isdigit():
                totals[name] += int(text)
    return time_ms(replies[0]), totals


@restartable
def due_head(keys: Keys) -> Op[tuple[int, int, tuple[str, int] | None]]:
    """Server time, the number of tasks due now, and the oldest due task with how long it has waited (ms)."""
    n = keys.shards
    shards = range(n)
    replies = yield Pipe([("TIME",)])
    now = time_ms(replies[0])
    # Priority p scores a time t as t - p * band (the priorities note in _common.lua): what is due in
    # band p lies in (now - (p + 1/2) * band, now - p * band]. Band 0 for every shard; the others only
    # for the shards that hold entries of a priority above 0.
    half = PRIORITY_BAND_MS / 2
    first = [("ZRANGEBYSCORE", keys.shard_ready(s), f"({now - half}", now, "WITHSCORES", "LIMIT", 0, 1) for s in shards]
    counts = [("ZCOUNT", keys.shard_ready(s), f"({now - half}", now) for s in shards]
    banded = [("ZCOUNT", keys.shard_ready(s), "-inf", f"({now - half}") for s in shards]
    replies = yield Pipe([*first, *counts, *banded])
    heads, due_counts, higher = replies[:n], replies[n : 2 * n], replies[2 * n :]
    cmds: list[tuple[Any, ...]] = list(first)
    for s in (s for s in shards if int(higher[s])):
        for p in range(1, MAX_PRIORITY + 1):
            lo, hi = now - (p + 0.5) * PRIORITY_BAND_MS, now - p * PRIORITY_BAND_MS
            cmds.append(("ZRANGEBYSCORE", keys.shard_ready(s), f"({lo}", hi, "WITHSCORES", "LIMIT", 0, 1))
            cmds.append(("ZCOUNT", keys.shard_ready(s), f"({lo}", hi))
    extra = (yield Pipe(cmds[n:])) if len(cmds) > n else []
    due = sum(int(n) for n in due_counts) + sum(int(n) for n in extra[1::2])
    oldest: tuple[str, int] | None = None
    for cmd, reply in zip([*first, *cmds[n::2]], [*heads, *extra[0::2]], strict=True):
        entries = zset_entries(reply, cmd[1])
        if not entries:
            continue
        tid, score = entries[0]
        waited = int(now - (score + round((now - score) / PRIORITY_BAND_MS) * PRIORITY_BAND_MS))
        if oldest is None or waited > oldest[1]:
            oldest = (tid, waited)
    return now, due, oldest


@dataclass
class ParkedTasks:
    """The namespace's parked (poison) tasks, as ``parked_tasks`` read them."""

    #: How many ids the shards' parked indexes hold.
    count: int
    #: The first of them in id order (at most ``show``): summary rows (``CheckpointCore.summaries``:
    #: task_id, cycle_index, attempts, last_failure, ...), a task requeued since it was listed left out.
    first: list[dict[str, Any]]


#: Parked tasks ``agentstate stats --watch`` names, with their attempts and last failure.
PARKED_SHOWN = 5


@restartable
def parked_tasks(core: CheckpointCore, show: int = PARKED_SHOWN) -> Op[ParkedTasks]:
    """How many tasks are parked, and the first ``show`` of them (id order) with their last failure.

    One pipeline over the shards' parked indexes (``Keys.shard_parked``: a ``ZCARD`` and the
    first ``show`` ids of each), then one ``summaries`` call for those ids: two round trips
    whatever the namespace holds; ``agentstate list --parked`` lists them all.
    """
    keys = core.keys
    commands: list[Sequence[Any]] = []
    for s in range(keys.shards):
        commands += [("ZCARD", keys.shard_parked(s)), ("ZRANGE", keys.shard_parked(s), 0, show - 1)]
    replies = yield Pipe(commands)
    count = sum(int(n) for n in replies[0::2])
    ids = sorted(member_id(m, keys.shard_parked(s)) for s, got in enumerate(replies[1::2]) for m in got or [])[:show]
    rows: list[dict[str, Any]] = []
    if ids:
        _, rows = yield from core.summaries(ids)
    return ParkedTasks(count, [r for r in rows if r["parked"] or r["status"] == "corrupt"])


@dataclass
class MemoryEstimate:
    """A sampled estimate of the namespace's memory (``memory_estimate``); ``bytes`` None: not measurable."""

    bytes: int | None
    #: Per kind: owners counted, owners sampled, mean bytes per sampled owner.
    kinds: dict[str, dict[str, int]]
    #: Bytes of the shard keys (indexes, counters), measured, not sampled.
    shard_bytes: int
    sampled_keys: int
    #: Why there is no estimate (the server lacks MEMORY USAGE, or refused it).
    unavailable: str | None = None


def _owner_keys(keys: Keys, kind: str, ident: str) -> list[str]:
    if kind == "tasks":
        k = keys.task(ident)
        return [k.checkpoint, k.messages, k.cycles, k.tomb]
    if kind == "pools":
        p = keys.pool(ident)
        return [key for key in p.as_list() if key != p.pools]
    if kind == "kv":
        return [keys.kv(ident)]
    t = keys.thread(ident)
    return [key for key in t.as_list() if key not in (t.shard_threads, t.shard_runs)]


def _indexes(keys: Keys, shard: int) -> dict[str, str]:
    """The index of every kind of owner in ``shard``."""
    return {
        "tasks": keys.shard_tasks(shard),
        "pools": keys.shard_pools(shard),
        "kv": keys.kv_index(shard)[0],
        "threads": keys.shard_threads(shard),
    }


def _shard_keys(keys: Keys, shard: int) -> list[str]:
    kvkeys, kvttl = keys.kv_index(shard)
    return [keys.shard_tasks(shard), keys.shard_ready(shard), keys.shard_parked(shard), keys.shard_gen(shard),
            keys.shard_counters(shard), keys.shard_pools(shard), kvkeys, kvttl, keys.shard_threads(shard),
            keys.shard_runs(shard)]  # fmt: skip


@restartable
def memory_estimate(
    keys: Keys, sample: int = DEFAULT_MEMORY_SAMPLE, rng: random.Random | None = None
) -> Op[MemoryEstimate]:
    """The namespace's memory, estimated from ``sample`` owners of each kind (see the module docstring)."""
    rng = rng or random.Random()
    kinds = ("tasks", "pools", "kv", "threads")
    reads: list[tuple[str, str]] = []
    commands: list[Sequence[Any]] = []
    for s in range(keys.shards):
        for kind, index in _indexes(keys, s).items():
            reads.append((kind, index))
            commands.append(("ZCARD", index))
    sizes_of = yield Pipe(commands)
    counted: Counter[str] = Counter()
    ranks: list[tuple[str, str, int]] = []
    for (kind, index), n in zip(reads, sizes_of, strict=True):
        counted[kind] += int(n)
        if int(n):
            ranks.append((kind, index, rng.randrange(int(n))))
    # One owner per non-empty shard (a random rank of its index), then up to ``sample`` of them per kind.
    got: list[Any] = []
    if ranks:
        got = yield Pipe([("ZRANGE", index, rank, rank) for _, index, rank in ranks])
    picked: dict[str, list[str]] = {kind: [] for kind in kinds}
    for (kind, index, _), members in zip(ranks, got, strict=True):
        picked[kind].extend(member_id(m, index) for m in members or [])
    owners: list[tuple[str, str]] = []
    for kind in kinds:
        rng.shuffle(picked[kind])
        owners += [(kind, ident) for ident in picked[kind][:sample]]
    owner_keys = [_owner_keys(keys, kind, ident) for kind, ident in owners]
    shard_keys = [key for s in range(keys.shards) for key in _shard_keys(keys, s)]
    measure = [key for group in owner_keys for key in group] + shard_keys
    try:
        sizes = yield Pipe([("MEMORY", "USAGE", key) for key in measure])
    except ShardMoved:
        raise
    except AgentStateError as exc:
        return MemoryEstimate(None, {}, 0, 0, f"the server does not answer MEMORY USAGE ({exc})")
    at = 0
    per_kind: dict[str, list[int]] = {kind: [] for kind in kinds}
    for (kind, _), group in zip(owners, owner_keys, strict=True):
        per_kind[kind].append(sum(int(v or 0) for v in sizes[at : at + len(group)]))
        at += len(group)
    shard_bytes = sum(int(v or 0) for v in sizes[at:])
    total = shard_bytes
    table: dict[str, dict[str, int]] = {}
    for kind in kinds:
        got = per_kind[kind]
        mean = sum(got) // len(got) if got else 0
        table[kind] = {"count": counted[kind], "sampled": len(got), "mean_bytes": mean}
        total += counted[kind] * mean
    return MemoryEstimate(total, table, shard_bytes, len(measure))


def limit_rows(limits: list[Any]) -> list[dict[str, Any]]:
    """The limited keys (``LimitState``) as ``stats`` reports them: key, live leases, limit."""
    return [{"key": s.key, "live": s.live, "limit": s.limit} for s in limits]


@dataclass
class Pulse:
    """What a live view reads every beat (``pulse``): bounded reads, whatever the namespace holds."""

    now_ms: int
    #: The counter totals (``counters``).
    totals: dict[str, int]
    due: int
    #: The oldest due task and how long it has waited (ms), if any is due.
    oldest: tuple[str, int] | None
    parked: ParkedTasks
    limits: list[dict[str, Any]]

    def rates(self, previous: tuple[int, dict[str, int]] | None) -> dict[str, float | None]:
        """Per-second rates of the counters since ``previous`` (an earlier pulse's ``mark``); None without one."""
        if previous is None or self.now_ms <= previous[0]:
            return dict.fromkeys(COUNTER_FIELDS)
        seconds = (self.now_ms - previous[0]) / 1000
        return {n: max(0, self.totals[n] - previous[1][n]) / seconds for n in COUNTER_FIELDS}

    @property
    def mark(self) -> tuple[int, dict[str, int]]:
        """What the next pulse's ``rates`` measures from."""
        return self.now_ms, self.totals

    def fields(self, rates: dict[str, float | None], row: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """The frame's fields of this pulse, each parked task shaped by ``row``."""
        oldest = self.oldest
        return {
            "server_time_ms": self.now_ms,
            "counters": self.totals,
            "per_second": rates,
            "parked": self.parked.count,
            "parked_tasks": [row(r) for r in self.parked.first],
            "due_now": self.due,
            "oldest_due": None if oldest is None else {"task_id": oldest[0], "wait_ms": oldest[1]},
            "concurrency_limits": self.limits,
        }


def pulse(core: CheckpointCore, parked_shown: int = PARKED_SHOWN) -> Op[Pulse]:
    """One beat of a live view: counters, the due head, the parked tasks and the concurrency limits."""
    now, totals = yield from counters(core.keys)
    _, due, oldest = yield from due_head(core.keys)
    parked = yield from parked_tasks(core, parked_shown)
    limits = limit_rows((yield from core.concurrency_limits()))
    return Pulse(now, totals, due, oldest, parked, limits)
