"""``agentstate stats`` additions: memory, the eviction warning, and the live view ``--watch``.

The live view works in any terminal, over SSH included: no curses. On a TTY
each frame first clears the screen with the ANSI sequence ``ESC [ H ESC [ 2 J``;
when stdout is a pipe or a file the frames are appended, one after the other
(``--json``: one JSON object per line). Ctrl-C ends it with exit status 0.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TextIO

from ..core.stats import memory_estimate, pulse, status_counts, status_fields
from ..wire import eviction as _eviction
from ..wire.shells import internals

__all__ = ["CLEAR", "eviction_report", "memory_report", "memory_lines", "watch"]

#: Cursor home, then clear the screen: every VT100-compatible terminal, no curses needed.
CLEAR = "\x1b[H\x1b[2J"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


#: How ``stats`` names each kind of owner the memory estimate counts.
_KIND_NAMES = {"tasks": "tasks", "pools": "agent pools", "kv": "key/value keys", "threads": "LangGraph threads"}


def memory_report(store: Any, sample: int) -> dict[str, Any]:
    """The namespace's memory estimate as ``stats --json`` shows it."""
    inside = internals(store)
    est = inside.run(memory_estimate(inside.core.keys, sample))
    return {
        "estimate_bytes": est.bytes,
        "estimated": True,
        "method": f"per kind (tasks, agent pools, key/value keys, LangGraph threads): the number stored, from "
        f"the namespace's indexes, times the mean MEMORY USAGE of up to {sample} of them picked at random; "
        "plus the indexes themselves, measured whole",
        "sampled_keys": est.sampled_keys,
        "shard_key_bytes": est.shard_bytes,
        "kinds": est.kinds,
        "unavailable": est.unavailable,
    }


def memory_lines(mem: dict[str, Any]) -> list[str]:
    """The human lines of ``memory_report``'s result."""
    if mem["estimate_bytes"] is None:
        return [f"memory: not available ({mem['unavailable']})"]
    parts = [
        f"{k['count']} {_KIND_NAMES.get(kind, kind)} x ~{_human(k['mean_bytes'])} each "
        f"(measured {k['sampled']} of them)"
        for kind, k in mem["kinds"].items()
        if k["count"]
    ]
    stored = "; ".join(parts) or "nothing stored in this namespace"
    return [
        f"memory: ~{_human(mem['estimate_bytes'])}, an estimate (not a full scan): {stored}; "
        f"plus the namespace's indexes, {_human(mem['shard_key_bytes'])}"
    ]


def eviction_report(client: Any) -> dict[str, Any]:
    """Each primary's maxmemory-policy and the warning it deserves (None when INFO is refused or silent)."""
    policies = _eviction.policies_sync(client)
    _eviction.reported(policies)  # shown by the caller: the stores need not log it too
    if policies is None:
        return {"policies": None, "warnings": []}
    warnings = [w for where, p in policies.items() if (w := _eviction.warning_text(p, where))]
    return {"policies": policies, "warnings": warnings}


def _frame(
    store: Any, previous: tuple[int, dict[str, int]] | None
) -> tuple[dict[str, Any], tuple[int, dict[str, int]]]:
    inside = internals(store)
    beat = inside.run(pulse(inside.core))
    counts = inside.run(status_counts(inside.core))
    frame = {"namespace": store.namespace, **status_fields(counts), **beat.fields(beat.rates(previous), _parked_row)}
    return frame, beat.mark


def limit_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``concurrency limits`` and a ``key  live/limit`` line per limited key (none: no line at all)."""
    if not rows:
        return []
    width = max(len(r["key"]) for r in rows)
    return [f"concurrency limits ({len(rows)} key(s)): live/limit"] + [
        f"  {r['key']:<{width}}  {r['live']}/{r['limit'] if r['limit'] is not None else 'none'}"
        + ("   (full: claims of this key wait)" if r["limit"] is not None and r["live"] >= r["limit"] else "")
        for r in rows
    ]


def _parked_row(r: dict[str, Any]) -> dict[str, Any]:
    """A parked task as the live view shows it; AT CYCLE as ``list --parked`` (the cycle whose attempts failed)."""
    if r["status"] == "corrupt":
        return {"task_id": r["task_id"], "at_cycle": None, "attempts": None, "last_failure": None,
                "corrupt": r["corrupt"]}  # fmt: skip
    return {"task_id": r["task_id"], "at_cycle": r["cycle_index"] + 1, "attempts": r["attempts"],
            "last_failure": r["last_failure"]}  # fmt: skip


#: A failure reason longer than this is cut in the live view (``list --parked`` shows it whole).
REASON_SHOWN = 100


def _cut(text: str) -> str:
    return text if len(text) <= REASON_SHOWN else text[: REASON_SHOWN - 3] + "..."


def _parked_line(p: dict[str, Any], esc: Callable[[object], str]) -> str:
    if p.get("corrupt"):
        return f"  {esc(p['task_id'])}: not data redis_agentstate wrote: {esc(_cut(p['corrupt']))}"
    why = _cut(p["last_failure"] or "(none recorded)")
    return f"  {esc(p['task_id'])}: cycle {p['at_cycle']}, {p['attempts']} attempt(s), last failure: {esc(why)}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _render(frame: dict[str, Any], interval: float, esc: Callable[[object], str]) -> str:
    when = datetime.fromtimestamp(frame["server_time_ms"] / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    r = frame["per_second"]
    statuses = "  ".join(f"{esc(s)} {n}" for s, n in frame["by_status"].items()) or "none"
    parked = frame["parked"]
    shown = frame["parked_tasks"]
    oldest = frame["oldest_due"]
    lines = [
        f"agentstate stats --watch: namespace {esc(repr(frame['namespace']))}  {when}  "
        f"(every {interval:g}s; Ctrl-C to stop)",
        f"tasks      {frame['tasks']}: {statuses}",
        f"leases     live {frame['live_leases']}  expired {frame['expired_leases']}  "
        f"claimable now {frame['claimable_now']}",
        f"per second claims {_rate(r['claims'])}  commits {_rate(r['commits'])}  takeovers {_rate(r['takeovers'])}"
        + ("" if r["claims"] is not None else "   (rates from the second frame on)"),
        "totals     " + "  ".join(f"{name} {n}" for name, n in frame["counters"].items()),
        "parked     " + str(parked) + ("" if not parked else "   (`agentstate list --parked`; `requeue TASK`)"),
        *(_parked_line(p, esc) for p in shown),
        *([f"  ... and {parked - len(shown)} more"] if parked > len(shown) else []),
        f"due now    {frame['due_now']}"
        + ("" if oldest is None else f"; oldest {esc(oldest['task_id'])} waiting {oldest['wait_ms'] / 1000:.1f}s"),
        *(esc(line) for line in limit_lines(frame["concurrency_limits"])),
        *(f"WARNING: {esc(w)}" for w in frame.get("eviction_warnings", [])),
    ]
    return "\n".join(lines) + "\n"


def watch(
    store: Any,
    *,
    interval: float,
    iterations: int | None,
    as_json: bool,
    out: TextIO | None = None,
    esc: Callable[[object], str] = str,
    sleep: Callable[[float], None] = time.sleep,
    warnings: list[str] | None = None,
) -> int:
    """Print a frame every ``interval`` seconds, ``iterations`` times (None: until Ctrl-C); exit status.

    ``warnings``: the eviction warnings to repeat in every frame (default: read them now).
    """
    out = out or sys.stdout
    tty = out.isatty() and not as_json
    if warnings is None:
        warnings = eviction_report(store.client)["warnings"]
    previous: tuple[int, dict[str, int]] | None = None
    n = 0
    try:
        while iterations is None or n < iterations:
            started = time.monotonic()
            frame, previous = _frame(store, previous)
            frame["eviction_warnings"] = warnings
            if as_json:
                out.write(json.dumps(frame, ensure_ascii=False) + "\n")
            else:
                text = _render(frame, interval, esc)
                out.write(CLEAR + text if tty else ("\n" if n else "") + text)
            out.flush()
            n += 1
            if iterations is None or n < iterations:
                sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        if tty:
            out.write("\n")
        return 0
    return 0
