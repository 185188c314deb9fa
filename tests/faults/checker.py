"""The history checker: what the chaos workers were told, against what Redis holds at the end.

Input: the workers' JSON-lines histories (see ``chaos_worker``) and the final
state (per task: its committed ``messages``, each naming the commit
*attempt* that wrote it, ``cycle_index``, ``revision``,
terminal flag; the pool's record log). Output: a :class:`Report` with the
figures and every violation found. The rules, per task:

1. **At most one committed cycle per (task, cycle)**: the final messages hold
   each cycle once, and exactly cycles 1..cycle_index, in order.
2. **Revisions strictly increase**: two claims never got the same revision of
   a task, and a claim that completed before another was invoked got the
   lower revision (real time, one monotonic clock for all processes).
3. **Every acknowledged commit is present**: a commit that returned True is
   in the final messages with its token.
4. **A definitely rejected commit is absent**: a commit that returned False
   (fenced) or was refused before sending is not in the final messages.
5. **An unknown outcome is present or absent, never twice** (rule 1 covers
   "never twice"; unknowns are counted, and how many turned out applied).
6. **Every pool message with an idempotency key appears exactly once**, and
   every acknowledged one appears.
7. **A cancelled task gets no later commit**: it ends cancelled, at the
   revision read right after its cancel was acknowledged, and no worker
   commit invoked after that acknowledgement was acknowledged itself.
8. **Every acknowledged resume's message is present exactly once**, and no
   resume message twice (an unknown one: present once or absent).
9. **No timer fires early**: every committed cycle was claimed (server time)
   no sooner than the due time it was claimed under; a ``timer-*`` task's
   every cycle after its first was claimed under one (each commit delays the
   next).
10. **No limited key ever passes its limit**: the handler of a ``limit-*`` task records the
   stretch it held the task (from the claim's return to a ``lease.check()`` that passed, on the
   one monotonic clock), a stretch inside its live lease; at no moment do more stretches of one
   concurrency key overlap than its limit.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FinalTask", "Report", "check", "read_histories"]


@dataclass
class FinalTask:
    task_id: str
    cycle_index: int
    revision: int
    messages: list[Any]
    terminal: bool
    status: str = ""


@dataclass
class Report:
    operations: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    tasks: int = 0
    committed_cycles: int = 0
    unknown_applied: int = 0
    unknown_absent: int = 0
    pool_messages: int = 0
    cancels: int = 0
    resumes: int = 0
    timed_cycles: int = 0
    held: int = 0
    peak_by_key: dict[str, int] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        return {
            "operations": sum(self.operations.values()),
            "by_kind": dict(sorted(self.operations.items())),
            "acknowledged_commits": self.operations["commit:ok"],
            "rejected_commits": self.operations["commit:fail"],
            "unknown_commits": self.operations["commit:unknown"] + self.operations["commit:lost"],
            "unknown_applied": self.unknown_applied,
            "unknown_absent": self.unknown_absent,
            "tasks": self.tasks,
            "committed_cycles_in_final_state": self.committed_cycles,
            "pool_messages": self.pool_messages,
            "cancelled_tasks": self.cancels,
            "acknowledged_resumes": self.resumes,
            "cycles_claimed_under_a_due_time": self.timed_cycles,
            "limited_holds": self.held,
            "peak_leases_by_concurrency_key": dict(sorted(self.peak_by_key.items())),
            "violations": len(self.violations),
        }


def read_histories(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every complete line of every history (a SIGKILL may leave a torn last line)."""
    out: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    out.sort(key=lambda e: e["t"])
    return out


def check(
    history: list[dict[str, Any]],
    final: dict[str, FinalTask],
    pool_keys: list[str],
    cancelled: dict[str, dict[str, Any]] | None = None,
    limits: dict[str, int] | None = None,
) -> Report:
    """``cancelled``: task -> ``{"status", "revision"}`` as read right after its cancel was acknowledged
    (rule 7); the operator's ``cancel``/``resume`` entries are in ``history``. ``limits``: concurrency
    key -> its limit (rule 10)."""
    r = Report(tasks=len(final))
    v = r.violations

    # ---- commits: pair each invoke with its outcome --------------------------
    invokes: dict[str, dict[str, Any]] = {}
    outcome: dict[str, str] = {}
    claims: dict[str, list[dict[str, Any]]] = defaultdict(list)
    pool_ok: set[str] = set()
    for e in history:
        op, kind = e.get("op"), e.get("type")
        if op == "commit":
            if kind == "invoke":
                invokes[e["id"]] = e
            else:
                outcome[e["id"]] = kind
        elif op == "claim":
            claims[e["task"]].append(e)
            r.operations["claim:ok"] += 1
        elif op == "pool":
            r.operations[f"pool:{kind}"] += 1
            if kind == "ok":
                pool_ok.add(e["key"])
    for op_id in invokes:
        r.operations[f"commit:{outcome.get(op_id, 'lost')}"] += 1

    # ---- rule 1: each cycle at most once, 1..cycle_index in order ------------
    present: dict[str, dict[int, str]] = {}
    for tid, t in final.items():
        cycles = [m["cycle"] for m in t.messages if isinstance(m, dict) and "cycle" in m]
        dupes = [c for c, n in Counter(cycles).items() if n > 1]
        if dupes:
            v.append(f"{tid}: cycles committed more than once: {dupes}")
        if cycles != list(range(1, t.cycle_index + 1)):
            v.append(f"{tid}: committed cycles {cycles[:10]}... are not 1..{t.cycle_index} in order")
        present[tid] = {m["cycle"]: m.get("attempt") for m in t.messages if isinstance(m, dict) and "cycle" in m}
        r.committed_cycles += len(cycles)
        # A committed cycle bumps the revision once, its claim once more: never fewer.
        if t.revision < 2 * t.cycle_index:
            v.append(f"{tid}: revision {t.revision} < 2 x cycle_index {t.cycle_index}")

    # ---- rules 3, 4, 5: outcomes against the final state ---------------------
    for op_id, inv in invokes.items():
        tid, cycle, attempt = inv["task"], inv["cycle"], inv["attempt"]
        got = outcome.get(op_id, "lost")
        holder = present.get(tid, {}).get(cycle)
        if tid not in final:
            v.append(f"{tid}: task missing from the final state")
            continue
        if got == "ok" and holder != attempt:
            v.append(f"{tid} cycle {cycle}: acknowledged commit {attempt} missing (final has {holder})")
        elif got == "fail" and holder == attempt:
            v.append(f"{tid} cycle {cycle}: rejected commit {attempt} is present")
        elif got in ("unknown", "lost"):
            if holder == attempt:
                r.unknown_applied += 1
            else:
                r.unknown_absent += 1

    # ---- rule 2: revisions strictly increase ---------------------------------
    for tid, cs in claims.items():
        revs = Counter(c["rev"] for c in cs)
        same = [rev for rev, n in revs.items() if n > 1]
        if same:
            v.append(f"{tid}: revision(s) {same} granted to more than one claim")
        ordered = sorted(cs, key=lambda c: c["t0"])
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if a["t"] < b["t0"] and not a["rev"] < b["rev"]:
                    v.append(f"{tid}: claim rev {a['rev']} finished before claim rev {b['rev']} began")
        final_rev = final[tid].revision if tid in final else None
        if final_rev is not None and cs and max(c["rev"] for c in cs) > final_rev:
            v.append(f"{tid}: a claim saw revision {max(c['rev'] for c in cs)} > final {final_rev}")
    # Two claims of the same cycle may both be granted (after a lease expired), but
    # then never both committed: rule 1 checks that on the final state.

    # ---- rule 7: a cancelled task gets no later commit -------------------------
    for e in history:
        if e.get("op") == "cancel" and e.get("type") == "ok":
            tid, acked = e["task"], e["t"]
            r.cancels += 1
            after = (cancelled or {}).get(tid)
            if after is None or after["status"] != "cancelled":
                v.append(f"{tid}: cancel acknowledged but the task read after it was {after}")
            elif final[tid].revision != after["revision"]:
                v.append(f"{tid}: revision {after['revision']} after the cancel, {final[tid].revision} at the end")
            if final[tid].status != "cancelled":
                v.append(f"{tid}: cancelled, but ends {final[tid].status}")
            late = [i for i, inv in invokes.items() if inv["task"] == tid and inv["t"] > acked
                    and outcome.get(i) == "ok"]  # fmt: skip
            if late:
                v.append(f"{tid}: {len(late)} commit(s) invoked after its cancel were acknowledged")

    # ---- rule 8: each acknowledged resume's message exactly once --------------
    resumed = Counter(m["resume"] for t in final.values() for m in t.messages if isinstance(m, dict) and "resume" in m)
    for key, n in resumed.items():
        if n > 1:
            v.append(f"resume message {key} appended {n} times")
    for e in history:
        if e.get("op") == "resume" and e.get("type") == "ok":
            r.resumes += 1
            if resumed.get(e["key"], 0) != 1:
                v.append(f"{e['task']}: acknowledged resume {e['key']} appears {resumed.get(e['key'], 0)} times")

    # ---- rule 9: no timer fires early -----------------------------------------
    for tid, t in final.items():
        for m in t.messages:
            if not (isinstance(m, dict) and "cycle" in m and "claimed_at" in m):
                continue
            if m.get("due") is not None:
                r.timed_cycles += 1
                if m["claimed_at"] < m["due"]:
                    v.append(f"{tid} cycle {m['cycle']}: claimed at {m['claimed_at']}, before it was due ({m['due']})")
            elif tid.startswith("timer-") and m["cycle"] > 1:
                v.append(f"{tid} cycle {m['cycle']}: claimed with no due time after a delayed commit")

    # ---- rule 10: no limited key passes its limit ---------------------------------
    stretches: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in history:
        if e.get("op") == "hold":
            r.held += 1
            # An end sorts before a begin at the same instant: touching stretches do not overlap.
            stretches[e["key"]] += [(e["begin"], 1), (e["end"], -1)]
    for key, edges in stretches.items():
        live = peak = 0
        for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
            live += step
            peak = max(peak, live)
        r.peak_by_key[key] = peak
        limit = (limits or {}).get(key)
        if limit is None:
            v.append(f"concurrency key {key!r}: held, but the run set no limit for it")
        elif peak > limit:
            v.append(f"concurrency key {key!r}: {peak} leases held at once, limit {limit}")

    # ---- rule 6: pool messages exactly once ----------------------------------
    counts = Counter(pool_keys)
    r.pool_messages = len(pool_keys)
    for key, n in counts.items():
        if n > 1:
            v.append(f"pool message {key!r} recorded {n} times")
    for key in pool_ok:
        if key not in counts:
            v.append(f"acknowledged pool message {key!r} missing")
    return r
