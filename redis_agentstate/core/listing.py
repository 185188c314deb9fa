"""What operators read: summary rows of many tasks, every task id, and pruning index entries left behind.

For ``agentstate list``/``stats`` and ``CheckpointStore.list``: paged
pipelines over the per-shard indexes (never KEYS or SCAN); an index entry
whose checkpoint is gone (it expired: ``terminal_ttl_ms``) is dropped by the
reader that meets it (``prune``). Nothing here does I/O.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ..wire import Batch, Call, Op, Pipe, list_indexes, restart, scripts
from .checkpoint_base import CheckpointState
from .replies import text, time_ms
from .validate import check_id

__all__ = ["CheckpointListing"]

#: Entries per task in a summary.lua reply (its header gives them): a kind, then these fields.
_SUMMARY_FIELDS = (
    *scripts.HASH_FIELDS[:7],
    *scripts.HASH_FIELDS[9:12],
    scripts.HASH_FIELDS[13],
    scripts.HASH_FIELDS[14],
)
_SUMMARY_STRIDE = 1 + len(_SUMMARY_FIELDS)
_SUMMARY_NAMES = ("status", "cycle", "rev", "token", "claimed", "lease", "term", "att", "parked", "why", "due", "prio")


def _summary_row(tid: str, entry: Sequence[Any], now: int) -> dict[str, Any] | None:
    """One row of ``CheckpointCore.summaries`` from a task's entries of a summary.lua reply."""
    kind = text(entry[0])
    if kind == "missing":
        return None
    try:
        if kind != "ok":
            raise ValueError(text(entry[1]))
        values = (v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in entry[1:])
        f = dict(zip(_SUMMARY_FIELDS, values, strict=True))
        status, cycle, rev, token, claimed, lease, term, att, parked, why, due, prio = (
            f[name] for name in _SUMMARY_NAMES
        )
    except (ValueError, UnicodeDecodeError) as exc:
        return {
            "task_id": tid, "status": "corrupt", "corrupt": str(exc), "cycle_index": None, "revision": None,
            "terminal": False, "claim_token": None, "claimed_cycle": None, "lease_expires_at_ms": None,
            "lease_state": None, "lease_remaining_ms": None, "attempts": None, "parked": False,
            "last_failure": None, "due_at_ms": None, "due_in_ms": None, "priority": None,
        }  # fmt: skip
    lease_ms = int(lease) if lease else None
    return {
        "task_id": tid,
        "status": status,
        "cycle_index": int(cycle),
        "revision": int(rev),
        "terminal": term == "1",
        "claim_token": token or None,
        "claimed_cycle": int(claimed) if claimed else None,
        "lease_expires_at_ms": lease_ms,
        "lease_state": None if not token else ("live" if lease_ms and lease_ms > now else "expired"),
        "lease_remaining_ms": (lease_ms - now) if token and lease_ms else None,
        "attempts": int(att) if att else 0,
        "parked": parked == "1",
        "last_failure": why or None,
        "due_at_ms": int(due) if due else None,
        "due_in_ms": (int(due) - now) if due else None,
        "priority": int(prio) if prio else 0,
    }


class CheckpointListing:
    """summaries, list, live and prune: what operators read, a part of the checkpoint core."""

    def __init__(self, state: CheckpointState) -> None:
        self.state = state
        self.keys = state.keys
        self.task_keys = state.task_keys

    #: Tasks per summary.lua call (one call per shard and chunk, all in one pipeline).
    SUMMARY_CHUNK = 500

    def summaries(self, task_ids: Sequence[str]) -> Op[tuple[int, builtins.list[dict[str, Any]]]]:
        """Server time (ms) and one row of scalar fields per task, in ``task_ids`` order (no histories).

        For operator tooling (``agentstate list``/``stats``). One pipeline of
        ``summary.lua`` calls, one per shard (and chunk). A task whose fields
        this library would not have written, or whose key is not a hash, is a
        row with status ``corrupt`` and a ``corrupt`` reason (the scripts' own
        check, ``bad_field``): one bad task does not hide the others. A task
        deleted since it was listed has no row.
        """
        ids = [check_id(t, "task_id") for t in task_ids]
        # A reshard may split a shard between the chunk's tasks: then the whole read starts over.
        return (yield from restart(lambda: self._summaries(ids)))

    def _summaries(self, ids: builtins.list[str]) -> Op[tuple[int, builtins.list[dict[str, Any]]]]:
        by_shard: dict[int, builtins.list[int]] = {}
        for i, tid in enumerate(ids):
            by_shard.setdefault(self.keys.shard_of(tid), []).append(i)
        chunks = [
            idx[j : j + self.SUMMARY_CHUNK] for idx in by_shard.values() for j in range(0, len(idx), self.SUMMARY_CHUNK)
        ]
        calls = [Call(scripts.SUMMARY, [self.task_keys(ids[i]).checkpoint for i in chunk], []) for chunk in chunks]
        if not calls:
            (reply,) = yield Pipe([("TIME",)])
            return time_ms(reply), []
        replies = yield Batch(calls)
        now = int(replies[0][0])
        rows: dict[int, dict[str, Any]] = {}
        missing: builtins.list[str] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            for n, i in enumerate(chunk):
                row = _summary_row(ids[i], reply[1 + n * _SUMMARY_STRIDE : 1 + (n + 1) * _SUMMARY_STRIDE], now)
                if row is not None:
                    rows[i] = row
                else:
                    missing.append(ids[i])
        yield from self.prune(missing)
        return now, [rows[i] for i in sorted(rows)]

    #: Task ids per EXISTS pipeline of ``list`` (and per prune.lua call).
    LIST_CHECK_CHUNK = 1000

    def list(self) -> Op[list[str]]:
        """Every task id, from the per-shard indexes, paged (never KEYS or SCAN).

        An index entry whose checkpoint is gone (it expired: ``terminal_ttl_ms``)
        is left out and dropped from the indexes (``prune``): one pipelined
        ``EXISTS`` per id, by pages, so the cost stays that of the listing.
        """
        ids = yield from restart(lambda: list_indexes([self.keys.shard_tasks(s) for s in range(self.keys.shards)]))
        return (yield from self.live(ids))

    def live(self, ids: Sequence[str]) -> Op[builtins.list[str]]:
        """``ids`` (indexed task ids) whose checkpoint exists, in order; the others are pruned."""
        out: builtins.list[str] = []
        missing: builtins.list[str] = []
        step = self.LIST_CHECK_CHUNK
        for j in range(0, len(ids), step):
            page = ids[j : j + step]
            found = yield Pipe([("EXISTS", self.task_keys(tid).checkpoint) for tid in page])
            for tid, n in zip(page, found, strict=True):
                (out if int(n) else missing).append(tid)
        yield from self.prune(missing)
        return out

    def prune(self, missing: Sequence[str]) -> Op[int]:
        """Drop the index entries of tasks a reader found without a checkpoint (prune.lua, by shard)."""
        if not missing:
            return 0
        return (yield from restart(lambda: self._prune(missing)))

    def _prune(self, missing: Sequence[str]) -> Op[int]:
        by_shard: dict[int, builtins.list[str]] = {}
        for tid in missing:
            by_shard.setdefault(self.keys.shard_of(tid), []).append(tid)
        step = self.LIST_CHECK_CHUNK
        calls = [
            Call(scripts.PRUNE, [self.keys.shard_tasks(s), self.keys.shard_ready(s), self.keys.shard_parked(s),
                           *(self.task_keys(t).checkpoint for t in tids[j : j + step])], [])
            for s, tids in by_shard.items()
            for j in range(0, len(tids), step)
        ]  # fmt: skip
        replies = yield Batch(calls)
        return sum(int(r) for r in replies)
