"""A/B of the client side: this checkout's ``redis_agentstate`` against another commit's, in one run.

``python -m benchmarks.client_ab --base 1849eb6 [--rounds 40] [--async-rounds 6] [--window 2]``

The package at ``--base`` is extracted (``git archive``) into a temp dir as
``agentstate_base`` (its Lua read from its own copy), so both versions run in
the same process, against the same private redis-server, in the same rounds
(shuffled order per round): a neighbour's load on this shared machine hits
both alike and the ratios are taken within a round. Three figures:

* **single**: one connection, used serially: claim + commit and a steady
  commit_and_claim loop of a 1 KiB state for each side, next to the floor (2
  no-op EVALSHA through redis-py) and redis-py ``Lock`` acquire + SET 1 KiB +
  release, as in ``single.py`` (the goals' ratios: claim + commit / floor,
  Lock / commit_and_claim, and commit_and_claim / one no-op EVALSHA, its own floor);
* **async**: ``AsyncCheckpointStore`` with 64 tasks on one event loop (as in
  ``concurrency.py``), each side looping commit_and_claim, and claim + commit,
  for a window each: cycles/s and the client's CPU per cycle;
* **core**: the library's own Python per operation without I/O (a captured
  reply fed back to the operation), CPU time of the thread.

A measurement for work on the client's Python per cycle, not a figure of the main
harness. ``--quick`` is a smoke run of a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import io
import json
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import redis
import redis.asyncio as aioredis

import redis_agentstate
from redis_agentstate.embedded import start_embedded

from ._util import make_state, percentile

ROOT = Path(__file__).resolve().parent.parent
STATE_BYTES = 1024
LEASE_MS = 30_000


def load_base(commit: str) -> tuple[ModuleType, str]:
    """The ``redis_agentstate`` package of ``commit``, imported as ``agentstate_base``; and the temp dir."""
    blob = subprocess.run(
        ["git", "archive", "--format=tar", commit, "redis_agentstate"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    tmp = tempfile.mkdtemp(prefix="agentstate-base-")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp)  # our own repository's tree
    pkg = Path(tmp) / "agentstate_base"
    (Path(tmp) / "redis_agentstate").rename(pkg)
    # The script loader of either layout: wire/scripts.py reads its Lua relative to its own package;
    # an older root scripts.py named the package, which is renamed here.
    scripts = next(p for p in (pkg / "wire" / "scripts.py", pkg / "scripts.py") if p.exists())
    text = scripts.read_text("utf-8")
    needle = 'resources.files("redis_agentstate")'
    if text.count(needle) == 1:
        scripts.write_text(text.replace(needle, "resources.files(__package__)"), "utf-8")
    elif "resources.files(__package__" not in text and "_HOMES.get(name, __package__)" not in text:
        raise SystemExit(f"{commit}: {scripts.name} does not read its Lua the way this tool knows ({needle})")
    sys.path.insert(0, tmp)
    return importlib.import_module("agentstate_base"), tmp


def head_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if git("status", "--porcelain") else "")


def summary(values: list[float], digits: int = 2) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "p10": round(percentile(values, 10), digits),
        "p90": round(percentile(values, 90), digits),
    }


def fmt(s: dict[str, float], unit: str = "") -> str:
    return f"{s['median']}{unit} ({s['p10']}-{s['p90']})"


# ---- single connection ---------------------------------------------------------------------------


class ClaimCommit:
    def __init__(self, pkg: ModuleType, store: Any, tid: str, state: dict[str, Any]) -> None:
        self.store, self.tid, self.n = store, tid, 0
        store.delete(tid)
        store.create(pkg.Checkpoint(tid, shared_state=dict(state)))

    def __call__(self) -> None:
        self.n += 1
        cp = self.store.claim(self.tid, self.n, token="w", lease_ms=LEASE_MS)
        cp.cycle_index = self.n
        cp.shared_state["step"] = self.n
        if not self.store.commit(cp, token="w", expected_revision=cp.revision):
            raise RuntimeError("commit fenced out in a single-writer benchmark")


class Continue:
    def __init__(self, pkg: ModuleType, store: Any, tid: str, state: dict[str, Any]) -> None:
        self.store = store
        store.delete(tid)
        store.create(pkg.Checkpoint(tid, shared_state=dict(state)))
        self.cp = store.claim(tid, 1, token="w", lease_ms=LEASE_MS)

    def __call__(self) -> None:
        cp = self.cp
        cp.cycle_index = cp.claimed_cycle
        cp.shared_state["step"] = cp.cycle_index
        nxt = self.store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE_MS)
        if nxt is None:
            raise RuntimeError("commit_and_claim fenced out in a single-writer benchmark")
        self.cp = nxt


def single(url: str, sides: dict[str, ModuleType], rounds: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    state = make_state(STATE_BYTES)
    sha = client.script_load("return 0")
    execute = client.execute_command

    def floor() -> None:
        execute("EVALSHA", sha, 0)
        execute("EVALSHA", sha, 0)

    def floor1() -> None:
        execute("EVALSHA", sha, 0)

    lock = client.lock("ab:lock", timeout=30)
    blob = msgpack.packb(state)

    def redis_py_lock() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py Lock not acquired")
        client.set("ab:state", blob)
        lock.release()

    cycles: dict[str, Callable[[], None]] = {"floor": floor, "floor1": floor1, "lock": redis_py_lock}
    for side, pkg in sides.items():
        store = pkg.CheckpointStore(client, namespace=f"ab-{side}")
        cycles[f"{side}_claim_commit"] = ClaimCommit(pkg, store, "cc", state)
        cycles[f"{side}_continue"] = Continue(pkg, store, "cac", state)
    for fn in cycles.values():  # warm up: scripts loaded, caches filled
        for _ in range(100):
            fn()
    means: dict[str, list[float]] = {name: [] for name in cycles}
    rng = random.Random(11)
    clock = time.perf_counter
    for _ in range(rounds):
        order = list(cycles)
        rng.shuffle(order)
        for name in order:
            fn = cycles[name]
            t0 = clock()
            for _ in range(10):
                fn()
            means[name].append((clock() - t0) / 10 * 1e6)
    client.close()

    def ratio(a: str, b: str) -> dict[str, float]:
        return summary([x / y for x, y in zip(means[a], means[b], strict=True)], 3)

    out: dict[str, Any] = {"us_per_cycle": {name: summary(v, 1) for name, v in means.items()}, "ratios": {}}
    for side in sides:
        out["ratios"][f"{side}: claim + commit / floor"] = ratio(f"{side}_claim_commit", "floor")
        out["ratios"][f"{side}: Lock / commit_and_claim"] = ratio("lock", f"{side}_continue")
        out["ratios"][f"{side}: commit_and_claim / 1 no-op EVALSHA"] = ratio(f"{side}_continue", "floor1")
    if "base" in sides:
        out["ratios"]["claim + commit, base / new"] = ratio("base_claim_commit", "new_claim_commit")
        out["ratios"]["commit_and_claim, base / new"] = ratio("base_continue", "new_continue")
    return out


# ---- async, 64 tasks on one event loop -------------------------------------------------------------


async def _async_window(
    url: str, pkg: ModuleType, ns: str, n_tasks: int, window_s: float, cont: bool
) -> dict[str, float]:
    client = aioredis.Redis.from_url(url, max_connections=n_tasks + 8)
    store = pkg.AsyncCheckpointStore(client, namespace=ns)
    state = make_state(STATE_BYTES)
    ids = [f"a{i}" for i in range(n_tasks)]
    done = [0]
    stop_at = [0.0]

    async def setup(tid: str) -> None:
        await store.delete(tid)
        await store.create(pkg.Checkpoint(tid, shared_state=dict(state)))

    async def worker(tid: str) -> None:
        n = 1
        held = await store.claim(tid, 1, token="w", lease_ms=LEASE_MS) if cont else None
        while time.perf_counter() < stop_at[0]:
            if held is not None:
                held.cycle_index = held.claimed_cycle
                held = await store.commit_and_claim(held, token="w", expected_revision=held.revision, lease_ms=LEASE_MS)
                if held is None:
                    raise RuntimeError("commit_and_claim fenced out")
            else:
                cp = await store.claim(tid, n, token="w", lease_ms=LEASE_MS)
                cp.cycle_index = n
                if not await store.commit(cp, token="w", expected_revision=cp.revision):
                    raise RuntimeError("commit fenced out")
                n += 1
            done[0] += 1

    stop_at[0] = time.perf_counter() + min(0.3, window_s)  # warm-up: every connection open, scripts loaded
    await asyncio.gather(*(setup(t) for t in ids))
    await asyncio.gather(*(worker(t) for t in ids))
    await asyncio.gather(*(setup(t) for t in ids))
    done[0] = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    stop_at[0] = t0 + window_s
    await asyncio.gather(*(worker(t) for t in ids))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for tid in ids:
        await store.delete(tid)
    await client.aclose()
    return {"cycles_per_s": done[0] / wall, "cpu_us_per_cycle": cpu / max(done[0], 1) * 1e6, "cores": cpu / wall}


def async64(url: str, sides: dict[str, ModuleType], rounds: int, window_s: float, n_tasks: int) -> dict[str, Any]:
    configs = [(side, mode) for side in sides for mode in ("continue", "claim_commit")]
    raw: dict[str, list[dict[str, float]]] = {f"{s}_{m}": [] for s, m in configs}
    rng = random.Random(12)
    for r in range(rounds):
        order = list(configs)
        rng.shuffle(order)
        for side, mode in order:
            res = asyncio.run(_async_window(url, sides[side], f"abx-{side}-{r}", n_tasks, window_s, mode == "continue"))
            raw[f"{side}_{mode}"].append(res)
    out: dict[str, Any] = {"tasks": n_tasks, "window_s": window_s, "rows": {}, "ratios": {}}
    for name, runs in raw.items():
        out["rows"][name] = {key: summary([x[key] for x in runs], 2) for key in runs[0]}
    if "base" in sides:
        for mode in ("continue", "claim_commit"):
            new, base = raw[f"new_{mode}"], raw[f"base_{mode}"]
            out["ratios"][f"{mode}: cycles/s new / base"] = summary(
                [n["cycles_per_s"] / b["cycles_per_s"] for n, b in zip(new, base, strict=True)], 3
            )
            out["ratios"][f"{mode}: CPU per cycle base / new"] = summary(
                [b["cpu_us_per_cycle"] / n["cpu_us_per_cycle"] for n, b in zip(new, base, strict=True)], 3
            )
    return out


# ---- the library's own Python, no I/O ------------------------------------------------------------


def _core_ops(url: str, pkg: ModuleType, ns: str) -> dict[str, Callable[[], Any]]:
    testing = importlib.import_module(pkg.__name__ + ".testing")
    client = redis.Redis.from_url(url)
    store = pkg.CheckpointStore(client, namespace=ns)
    inside = testing.internals(store)
    core = inside.core
    state = make_state(STATE_BYTES)

    def send(op: Any) -> Any:
        call = testing.first_call(op)
        reply = inside.scripts[call.script](keys=call.keys, args=call.args, client=client)
        return reply, testing.finish(op, reply)

    store.create(pkg.Checkpoint("k", shared_state=dict(state)))
    cp = store.claim("k", 1, token="w", lease_ms=LEASE_MS)
    cp.cycle_index = 1
    cac_reply, cp = send(core.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE_MS))
    held = [cp]

    def continue_() -> None:
        cp = held[0]
        cp.cycle_index = cp.claimed_cycle
        op = core.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE_MS)
        testing.first_call(op)
        held[0] = testing.finish(op, cac_reply)  # same epoch, any lease: the steady state's reply

    store.create(pkg.Checkpoint("c", shared_state=dict(state)))
    first = store.claim("c", 1, token="w", lease_ms=LEASE_MS)
    first.cycle_index = 1
    store.commit(first, token="w", expected_revision=first.revision)
    claim_reply, claimed = send(core.claim("c", 2, token="w", lease_ms=LEASE_MS))
    claimed.cycle_index = 2
    commit_reply, _ = send(core.commit(claimed, token="w", expected_revision=claimed.revision))

    def claim_commit() -> None:
        op = core.claim("c", 2, token="w", lease_ms=LEASE_MS)
        testing.first_call(op)
        cp = testing.finish(op, claim_reply)  # the cache warm: the same reply claims again
        cp.cycle_index = 2
        op = core.commit(cp, token="w", expected_revision=cp.revision)
        testing.first_call(op)
        testing.finish(op, commit_reply)

    return {"continue": continue_, "claim_commit": claim_commit}


def core_python(url: str, sides: dict[str, ModuleType], rounds: int) -> dict[str, Any]:
    ops = {side: _core_ops(url, pkg, f"abc-{side}") for side, pkg in sides.items()}
    names = [(side, op) for side in ops for op in ops[side]]
    raw: dict[str, list[float]] = {f"{s}_{o}": [] for s, o in names}
    rng = random.Random(13)
    clock = time.thread_time
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        for side, op in order:
            fn = ops[side][op]
            t0 = clock()
            for _ in range(300):
                fn()
            raw[f"{side}_{op}"].append((clock() - t0) / 300 * 1e6)
    out: dict[str, Any] = {"us": {name: summary(v, 2) for name, v in raw.items()}, "ratios": {}}
    if "base" in sides:
        for op in ("continue", "claim_commit"):
            out["ratios"][f"{op}: base / new"] = summary(
                [b / n for b, n in zip(raw[f"base_{op}"], raw[f"new_{op}"], strict=True)], 3
            )
    return out


# ---- driver --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.client_ab", description=__doc__)
    p.add_argument("--base", help="the commit to compare with (default: none, this checkout alone)")
    p.add_argument("--rounds", type=int, default=40, help="rounds of the single-connection figure (x10 cycles)")
    p.add_argument("--async-rounds", type=int, default=6)
    p.add_argument("--window", type=float, default=2.0, help="seconds per async configuration and round")
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--only", default="single,async,core")
    p.add_argument("--json", help="write the figures to this file too")
    p.add_argument("--quick", action="store_true", help="a smoke run: a few rounds, short windows")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.async_rounds, args.window, args.tasks = 3, 1, 0.3, 8
    only = set(args.only.split(","))
    sides: dict[str, ModuleType] = {}
    tmp = None
    if args.base:
        sides["base"], tmp = load_base(args.base)
    sides["new"] = redis_agentstate
    server = start_embedded(prefer="redis-server")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result: dict[str, Any] = {"started": started, "base": args.base, "new": head_commit(), "figures": {}}
    try:
        if "single" in only:
            result["figures"]["single"] = single(server.url, sides, args.rounds * 10)
        if "async" in only:
            result["figures"]["async"] = async64(server.url, sides, args.async_rounds, args.window, args.tasks)
        if "core" in only:
            result["figures"]["core"] = core_python(server.url, sides, max(args.rounds, 5))
    finally:
        server.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), "utf-8")
    return 0


def report(result: dict[str, Any]) -> None:
    figs = result["figures"]
    print(f"client A/B, {result['started']}: base {result['base']}, new {result['new']}")
    print("medians, p10-p90 over rounds in brackets; ratios are taken within each round")
    if "single" in figs:
        f = figs["single"]
        print("\nsingle connection, us per cycle:")
        for name, s in f["us_per_cycle"].items():
            print(f"  {name:22s} {fmt(s)}")
        for name, s in f["ratios"].items():
            print(f"  {name:40s} {fmt(s, 'x')}")
    if "async" in figs:
        f = figs["async"]
        print(f"\nasync, {f['tasks']} tasks on one event loop, {f['window_s']} s windows:")
        for name, row in f["rows"].items():
            print(
                f"  {name:22s} {fmt(row['cycles_per_s'])} cycles/s, client CPU {fmt(row['cpu_us_per_cycle'])} us"
                f" per cycle, {fmt(row['cores'])} cores"
            )
        for name, s in f["ratios"].items():
            print(f"  {name:40s} {fmt(s, 'x')}")
    if "core" in figs:
        f = figs["core"]
        print("\nthe library's Python per cycle, no I/O (thread CPU us):")
        for name, s in f["us"].items():
            print(f"  {name:22s} {fmt(s)}")
        for name, s in f["ratios"].items():
            print(f"  {name:40s} {fmt(s, 'x')}")


if __name__ == "__main__":
    raise SystemExit(main())
