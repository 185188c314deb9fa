"""Scale on paper, from measurements: ``python -m benchmarks --only scale``.

Three parts:

1. **Server CPU per cycle.** Worker threads drive the server through the
   paths a fleet uses (``claim_next`` + ``commit`` of whatever is due;
   ``commit_and_claim`` in a steady loop; the Runner's default chain of one
   ``claim_next``, seven ``commit_and_claim`` and a closing ``commit``), with a
   1 KiB state. The server's *main thread* CPU (``INFO cpu``
   ``used_cpu_{sys,user}_main_thread``: scripts, parsing and socket I/O, all
   of which run on that one thread) is divided by the cycles done. The
   clients are Python threads, so the server is never saturated: this is
   the cost of a cycle, not a throughput record, and a saturated server only
   gets cheaper per request (more replies per ``write``).
2. **Capacity on paper.** Cycles/s one primary sustains = 1 / CPU per cycle
   (at 100% of its main thread, and at 70% to leave room for bursts,
   replication and ``BGSAVE`` forks); agents that fit at one cycle per 2 s
   per agent (an LLM call per cycle).
3. **Cluster spread.** A namespace's shards are hash tags, so slots; a
   primary's share of the namespace's load is the share of those slots it
   owns. For 3 to 100 primaries with ``redis-cli --cluster create``'s even
   slot ranges, the hottest primary's share against the fair one (1/N) over
   1,000 namespace names: 0.2's ``{ns#SS}`` tags (64 shards), and the
   slot-aware layout (keys.py) at 64, 256 and 1,024 shards; times one
   primary's agents, the agents one namespace holds. The 3-primary case is
   checked on a real local Cluster (the test suite's
   ``tests/cluster_support.py``): which node each shard key lands on, as the
   cluster itself answers.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

import redis
from redis.crc import key_slot

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.keys import DEFAULT_SHARDS, LAYOUT_LEGACY, LAYOUT_SLOTS, SLOTS, Keys, shard_tags

from ._util import Settings, make_state, summary

AGENT_PERIOD_S = 2.0  # one cycle per agent every 2 s: an LLM call per cycle
HEADROOM = 0.7
PRIMARIES = (3, 6, 12, 24, 48, 100)
LAYOUTS = ((LAYOUT_LEGACY, 64), (LAYOUT_SLOTS, 64), (LAYOUT_SLOTS, 256), (LAYOUT_SLOTS, 1024))
#: The path whose capacity the agents-per-namespace column multiplies out: a Runner's default chain.
NAMESPACE_PATH = "runner chain (claim_next, 7 x commit_and_claim, commit)"


# ---- 1. server CPU per cycle ----------------------------------------------


def _main_thread_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    if "used_cpu_sys_main_thread" in info:
        return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _worker_loop(kind: str, store: CheckpointStore, state: dict[str, Any], stop: threading.Event, own: str) -> int:
    """Cycles of ``kind`` until ``stop``; returns how many were written."""
    token = uuid.uuid4().hex
    # Cycles per claim: 1 (claim_next, commit), unbounded (one task's commit_and_claim loop), or the
    # Runner's default max_consecutive_cycles=8 (claim_next, 7 x commit_and_claim, commit).
    chain = {"claim_next + commit": 1, "commit_and_claim": None, "runner": 8}[kind]
    cp = None
    if chain is None:
        last = store.load(own)
        assert last is not None
        cp = store.claim(own, last.cycle_index + 1, token=token, lease_ms=30_000)
    done = links = 0
    while not stop.is_set():
        if cp is None:
            cp = store.claim_next(token=token, lease_ms=30_000)
            links = 0
            if cp is None:
                continue
        cp.cycle_index = cp.claimed_cycle or 0
        cp.shared_state = state
        links += 1
        if chain is not None and links >= chain:
            done += bool(store.commit(cp, token=token, expected_revision=cp.revision))
            cp = None
        else:
            cp = store.commit_and_claim(cp, token=token, expected_revision=cp.revision, lease_ms=30_000)
            done += cp is not None
    if cp is not None:  # give the claim back, so the next window's workers find the task due
        cp.cycle_index = cp.claimed_cycle or 0
        done += bool(store.commit(cp, token=token, expected_revision=cp.revision))
    return done


def _measure(settings: Settings, kind: str, threads: int, seconds: float) -> dict[str, Any]:
    ns = settings.ns(f"scale-{uuid.uuid4().hex[:6]}")
    state = make_state(1024)
    setup = settings.client()
    store = CheckpointStore(setup, ns)
    # A fleet's namespace: far more tasks than workers, so claim_next always finds one due.
    tasks = threads if kind == "commit_and_claim" else 64 * threads
    for i in range(tasks):
        store.create(Checkpoint(task_id=f"t{i:05d}", shared_state=state))
    clients = [settings.client() for _ in range(threads)]
    stores = [CheckpointStore(c, ns) for c in clients]
    stop = threading.Event()
    counts = [0] * threads

    def work(i: int) -> None:
        counts[i] = _worker_loop(kind, stores[i], state, stop, f"t{i:05d}")

    # Warm the script cache and the connections before the window.
    warm = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in warm:
        t.start()
    time.sleep(0.3)
    stop.set()
    for t in warm:
        t.join()
    stop.clear()
    counts = [0] * threads
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    cpu0 = _main_thread_cpu(setup)
    usec0 = _script_usec(setup)
    wall0 = time.perf_counter()
    for t in workers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join()
    wall = time.perf_counter() - wall0
    cpu = _main_thread_cpu(setup) - cpu0
    usec = _script_usec(setup) - usec0
    cycles = sum(counts)
    _drop(setup, ns)
    for c in clients:
        c.close()
    setup.close()
    return {
        "kind": kind,
        "threads": threads,
        "cycles": cycles,
        "wall_s": round(wall, 2),
        "cycles_per_s_driven": round(cycles / wall, 0),
        "server_cpu_us_per_cycle": round(cpu * 1e6 / cycles, 2) if cycles else None,
        "script_us_per_cycle": round(usec / cycles, 2) if cycles else None,
        "server_main_thread_cores": round(cpu / wall, 3),
    }


def _script_usec(client: redis.Redis) -> float:
    stats = client.info("commandstats")
    return float(sum(v.get("usec", 0) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")))


def _drop(client: redis.Redis, ns: str) -> None:
    batch = []
    for key in client.scan_iter(match=f"{ns}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


# ---- 3. cluster spread -------------------------------------------------------


def even_ranges(primaries: int) -> list[tuple[int, int]]:
    """The slot ranges ``redis-cli --cluster create`` gives ``primaries`` primaries (its own arithmetic)."""
    per = SLOTS / primaries
    ranges = []
    first, cursor = 0, 0.0
    for i in range(primaries):
        last = round(cursor + per - 1)
        if last > SLOTS - 1 or i == primaries - 1:
            last = SLOTS - 1
        ranges.append((first, last))
        first = last + 1
        cursor += per
    return ranges


def shard_slots(namespace: str, shards: int = DEFAULT_SHARDS, layout: str = LAYOUT_SLOTS) -> list[int]:
    """The slot of each shard's hash tag in ``layout`` (keys.py's tags, as a store of that layout builds them)."""
    return [key_slot(tag.encode("utf-8")) for tag in shard_tags(namespace, shards, layout)]


def hottest_share(slots: list[int], ranges: list[tuple[int, int]]) -> float:
    """The hottest primary's share of the shards over the fair share (1.0 = perfectly even)."""
    lasts = [b for _, b in ranges]
    per_node = Counter(bisect.bisect_left(lasts, s) for s in slots)
    return max(per_node.values()) / (len(slots) / len(ranges))


def spread(names: int) -> list[dict[str, Any]]:
    rows = []
    for layout, shards in LAYOUTS:
        ours = shard_slots("agentstate", shards, layout)
        theirs = [shard_slots(f"ns-{i:04d}", shards, layout) for i in range(names)]
        for primaries in PRIMARIES:
            ranges = even_ranges(primaries)
            shares = [hottest_share(slots, ranges) for slots in theirs]
            rows.append(
                {
                    "layout": layout,
                    "shards": shards,
                    "primaries": primaries,
                    "hottest_over_fair": summary(shares, 2),
                    "worst": round(max(shares), 2),
                    "agentstate": round(hottest_share(ours, ranges), 2),
                }
            )
    return rows


def check_on_cluster() -> dict[str, Any]:
    """Where each of namespace ``agentstate``'s 64 shard keys lands on a real local 3-primary Cluster."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(here), "tests"))
    try:
        from cluster_support import LocalCluster
    except Exception as exc:  # the sdist ships tests/; a bare checkout of benchmarks/ alone may not
        return {"status": f"not run: {exc!r}"}
    finally:
        sys.path.pop(0)
    try:
        cluster = LocalCluster.start(3)
    except Exception as exc:
        return {"status": f"not run: {exc!r}"}
    try:
        keys = Keys("agentstate")
        by_node: Counter[str] = Counter()
        mismatches = 0
        owners = {}
        with redis.Redis(*cluster.startup) as c:
            for start, end, node, *_ in c.execute_command("CLUSTER", "SLOTS"):
                owners[(int(start), int(end))] = f"{node[0].decode()}:{int(node[1])}"
            for s in range(keys.shards):
                key = keys.shard_tasks(s)
                slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
                mismatches += slot != key_slot(key.encode())
                owner = next(o for (a, b), o in owners.items() if a <= slot <= b)
                by_node[owner] += 1
        ranges = sorted(owners)
        predicted = Counter(
            next(i for i, (a, b) in enumerate(ranges) if a <= s <= b) for s in shard_slots("agentstate")
        )
        return {
            "status": "ok",
            "shards_per_primary": sorted(by_node.values(), reverse=True),
            "predicted_per_primary": sorted(predicted.values(), reverse=True),
            "slot_ranges": ranges,
            "keyslot_mismatches": mismatches,
        }
    finally:
        cluster.stop()


# ---- the figure ----------------------------------------------------------------

KINDS = ("claim_next + commit", "commit_and_claim", "runner chain (claim_next, 7 x commit_and_claim, commit)")


def run(settings: Settings) -> dict[str, Any]:
    seconds = 1.0 if settings.quick else 6.0
    rounds = 1 if settings.quick else max(1, min(settings.rounds, 3))
    threads = 2 if settings.quick else 4
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:  # interleaved: each round measures every kind under the same load
            loop_kind = "runner" if kind.startswith("runner") else kind
            runs[kind].append({**_measure(settings, loop_kind, threads, seconds), "kind": kind})
    rows = []
    for kind, samples in runs.items():
        cpu = [s["server_cpu_us_per_cycle"] for s in samples if s["server_cpu_us_per_cycle"]]
        script = [s["script_us_per_cycle"] for s in samples if s["script_us_per_cycle"]]
        best = min(cpu) if cpu else None
        per_primary = 1e6 / best if best else None
        rows.append(
            {
                "kind": kind,
                "threads": threads,
                "server_cpu_us_per_cycle": summary(cpu, 2),
                "script_us_per_cycle": summary(script, 2),
                "cycles_per_s_driven": summary([s["cycles_per_s_driven"] for s in samples], 0),
                "primary_cycles_per_s": round(per_primary) if per_primary else None,
                "primary_cycles_per_s_at_70": round(per_primary * HEADROOM) if per_primary else None,
                "agents_per_primary_at_70": round(per_primary * HEADROOM * AGENT_PERIOD_S) if per_primary else None,
            }
        )
    return {
        "title": "Scale on paper: server CPU per cycle, one primary's capacity, and the Cluster spread",
        "rounds": rounds,
        "seconds": seconds,
        "rows": rows,
        "spread": spread(100 if settings.quick else 1000),
        "cluster_check": {"status": "skipped (--quick)"} if settings.quick else check_on_cluster(),
    }


def _f(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def markdown(fig: dict[str, Any]) -> list[str]:
    lines = [
        f"#### {fig['title']}",
        "",
        f"{fig['rounds']} interleaved round(s) of {fig['seconds']:.0f} s per path. Server CPU is the main "
        "thread's (`INFO cpu`), divided by the cycles done: scripts, parsing and socket I/O. Capacity is the "
        "lowest (best) round's CPU per cycle: a loaded shared machine only inflates it. Agents at one "
        f"cycle per {AGENT_PERIOD_S:.0f} s, at {HEADROOM:.0%} of the main thread.",
        "",
        "| path | server CPU us/cycle (median, p10-p90) | in scripts us/cycle | one primary, cycles/s at 100% "
        "| at 70% | agents per primary (70%) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in fig["rows"]:
        cpu, script = r["server_cpu_us_per_cycle"], r["script_us_per_cycle"]
        cpu_s = f"{cpu['median']:.1f} ({cpu['p10']:.1f}-{cpu['p90']:.1f})" if cpu else "-"
        lines.append(
            f"| {r['kind']} | {cpu_s} | {_f(script['median'] if script else None, 1)} "
            f"| {_f(r['primary_cycles_per_s'])} | {_f(r['primary_cycles_per_s_at_70'])} "
            f"| {_f(r['agents_per_primary_at_70'])} |"
        )
    per_primary = next((r["agents_per_primary_at_70"] for r in fig["rows"] if r["kind"] == NAMESPACE_PATH), None)
    lines += [
        "",
        "How a namespace's shards spread over even slot ranges (`redis-cli --cluster create`), over 1,000 "
        "namespace names: the hottest primary's share of the namespace against the fair share (1.00 = even). "
        "The Cluster's capacity for one namespace is the hottest primary's: N primaries give N / hottest times "
        "one primary. Agents per namespace: that many primaries times one primary's agents on the Runner's "
        "chain at 70% (above), at one cycle per 2 s.",
        "",
        "| layout | shards | primaries | hottest / fair (median) | worst name | namespace `agentstate` "
        "| effective primaries | agents per namespace |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in fig["spread"]:
        h = r["hottest_over_fair"]
        effective = r["primaries"] / h["median"]
        agents = _f(per_primary * effective) if per_primary else "-"
        layout = "0.2 `{ns#SS}`" if r.get("layout", LAYOUT_LEGACY) == LAYOUT_LEGACY else "slot-aware"
        lines.append(
            f"| {layout} | {r['shards']} | {r['primaries']} | {h['median']:.2f} "
            f"| {r['worst']:.2f} | {r['agentstate']:.2f} | {effective:.1f} | {agents} |"
        )
    check = fig["cluster_check"]
    lines.append("")
    if check.get("status") == "ok":
        lines.append(
            f"Checked on a real local 3-primary Cluster: namespace `agentstate`'s 64 slot-aware shard keys land "
            f"{check['shards_per_primary']} per primary (predicted from the slot arithmetic: "
            f"{check['predicted_per_primary']}; CLUSTER KEYSLOT disagreed with redis-py's CRC16 on "
            f"{check['keyslot_mismatches']} keys)."
        )
    else:
        lines.append(f"Cluster check: {check.get('status')}.")
    lines.append("")
    return lines
