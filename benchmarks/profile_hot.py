"""Figure 6: where a claim + commit cycle spends its time (cProfile, micro-timings, server time).

* cProfile over many sync cycles: the top functions by own time, and own time
  grouped by area (socket waits, redis-py, tenacity, this library, msgpack).
  Profiling inflates Python costs, so these are shares, not wall times.
* micro-timings (no profiler, no I/O) of each piece of per-call work on the
  hot path, so a proposed removal can be priced in microseconds.
* server time per cycle: ``INFO commandstats`` over a batch (private server
  only: it resets the server's statistics).
"""

from __future__ import annotations

import contextlib
import cProfile
import hashlib
import os
import pstats
from typing import Any

import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.codec import encode
from redis_agentstate.keys import Keys
from redis_agentstate.testing import finish, first_call, internals
from redis_agentstate.wire import RetryPolicy, new_nonce

from ._util import Settings, make_message, make_state, micro

AREAS = (
    ("socket wait (recv/send: server + wire)", ("_socket.socket",)),
    ("tenacity (retry wrapper, only on a retry)", ("tenacity",)),
    ("redis-py (pack, parse, pool, observability)", ("/redis/",)),
    ("redis_agentstate (validate, args, parse)", ("redis_agentstate",)),
    ("msgpack", ("msgpack",)),
)


def _area(filename: str, func: str) -> str:
    where = f"{filename}:{func}"
    for name, needles in AREAS:
        if any(n in where for n in needles):
            return name
    return "other (builtins, stdlib)"


class _Cycle:
    def __init__(self, store: CheckpointStore, tid: str) -> None:
        self.store, self.tid, self.n = store, tid, 0

    def __call__(self) -> None:
        self.n += 1
        cp = self.store.claim(self.tid, self.n, token="w", lease_ms=30_000)
        assert cp is not None
        cp.cycle_index = self.n
        if not self.store.commit(cp, token="w", expected_revision=cp.revision):
            raise RuntimeError("commit fenced out")


def _cprofile(cycle: _Cycle, n: int) -> dict[str, Any]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        cycle()
    prof.disable()
    stats = pstats.Stats(prof)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = 0.0
    areas: dict[str, float] = {}
    funcs = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        total += tottime
        area = _area(filename, func)
        areas[area] = areas.get(area, 0.0) + tottime
        short = filename
        for marker in ("site-packages/", "/work/main/"):
            if marker in short:
                short = short.split(marker, 1)[1]
        funcs.append(
            {
                "function": f"{short}:{line}({func})",
                "calls_per_cycle": round(ncalls / n, 2),
                "own_us_per_cycle": round(tottime / n * 1e6, 2),
                "cum_us_per_cycle": round(cumtime / n * 1e6, 2),
            }
        )
    funcs.sort(key=lambda f: -f["own_us_per_cycle"])
    return {
        "cycles": n,
        "profiled_us_per_cycle": round(total / n * 1e6, 1),
        "areas": {
            k: {"us_per_cycle": round(v / n * 1e6, 1), "share": round(v / total, 3)}
            for k, v in sorted(areas.items(), key=lambda kv: -kv[1])
        },
        "top_functions": funcs[:20],
        "python_calls_per_cycle": round(sum(v[1] for v in raw.values()) / n, 1),
    }


class _StubClient:
    """Stands in for a redis-py client to price the Python around the call, without I/O."""

    def evalsha(self, *args: Any) -> None:
        return None


def _micro(store: CheckpointStore, client: redis.Redis, quick: bool) -> dict[str, float]:
    n = 300 if quick else 5000
    inside = internals(store)
    core = inside.core
    tid = "prof-micro"
    store.delete(tid)
    state = make_state(1024)
    store.create(Checkpoint(tid, shared_state=dict(state)))
    claim_op = core.claim(tid, 1, token="w", lease_ms=30_000)
    claim_req = first_call(claim_op)
    claim_reply = inside.scripts["claim"](keys=claim_req.keys, args=claim_req.args, client=client)
    cp = finish(claim_op, claim_reply)
    assert cp is not None
    cp.cycle_index = 1
    commit_op = core.commit(cp, token="w", expected_revision=cp.revision)
    commit_req = first_call(commit_op)
    commit_op.close()
    commit_reply = [1, b"1"]
    out: dict[str, float] = {}
    policy = RetryPolicy()

    def tenacity_once() -> None:
        for attempt in policy.sync():
            with attempt:
                pass

    out["tenacity: build Retrying + one attempt (now only paid on a retry)"] = micro(tenacity_once, n)
    stub = _StubClient()
    script = inside.scripts["commit"]
    keys, args = list(commit_req.keys), list(commit_req.args)
    out["Script.__call__ around evalsha (per request)"] = micro(lambda: script(keys=keys, args=args, client=stub), n)
    out["direct stub.evalsha(sha, n, *keys, *args) (per request)"] = micro(
        lambda: stub.evalsha(script.sha, len(keys), *keys, *args), n
    )
    out["Keys.task(task_id).as_list() uncached (the core now caches it)"] = micro(
        lambda: core.keys.task(tid).as_list(), n
    )
    out["new_nonce() (per create/save)"] = micro(new_nonce, n)
    blob = encode(body_value := [cp.shared_state, cp.terminal_result, cp.budget_usage], what="b")
    prefix = hashlib.blake2b(digest_size=16)

    def write_identity() -> None:
        hm = prefix.copy()
        hm.update(blob)
        core.writes.write_id("commit", cp, "w", cp.revision, False, blob, (1, 0), hm, prefix)

    out["write identity: digest of a commit, 1 KiB body (per commit)"] = micro(write_identity, n)
    out["validate(cp) (per commit)"] = micro(lambda: core.validate(cp), n)
    body = body_value
    out["encode body, 1 KiB (per commit)"] = micro(lambda: encode(body, what="b"), n)

    def claim_build() -> None:
        op = core.claim(tid, 1, token="w", lease_ms=30_000)
        next(op)
        op.close()

    def claim_parse() -> None:
        op = core.claim(tid, 1, token="w", lease_ms=30_000)
        next(op)
        with contextlib.suppress(StopIteration):
            op.send(claim_reply)

    def commit_full() -> None:
        op = core.commit(cp, token="w", expected_revision=cp.revision)
        next(op)
        with contextlib.suppress(StopIteration):
            op.send(commit_reply)

    out["claim: checks + request (no I/O)"] = micro(claim_build, n)
    out["claim: checks + request + reply parse (no I/O)"] = micro(claim_parse, n)
    out["commit: checks + request + reply (no I/O)"] = micro(commit_full, n)
    conn = client.connection_pool.get_connection()
    try:
        out["redis-py pack_command, claim request"] = micro(
            lambda: conn.pack_command("EVALSHA", script.sha, len(claim_req.keys), *claim_req.keys, *claim_req.args), n
        )
        out["redis-py pack_command, commit request"] = micro(
            lambda: conn.pack_command("EVALSHA", script.sha, len(keys), *keys, *args), n
        )
        out["redis-py pack_command, no-op EVALSHA"] = micro(lambda: conn.pack_command("EVALSHA", script.sha, 0), n)
    finally:
        client.connection_pool.release(conn)
    msgs = [make_message(i) for i in range(10_000)]
    out["3 list copies of a 10,000-message history (what the shared history cache removed)"] = micro(
        lambda: (list(msgs[:10_000]), list(msgs), list(msgs)), max(20, n // 50)
    )
    store.delete(tid)
    return out


def _server_time(store: CheckpointStore, client: redis.Redis, n: int) -> dict[str, float]:
    """Server-side microseconds per cycle from INFO commandstats (resets the private server's stats)."""
    tid = "prof-server"
    store.delete(tid)
    store.create(Checkpoint(tid, shared_state=make_state(1024)))
    cycle = _Cycle(store, tid)
    cycle()
    client.config_resetstat()
    for _ in range(n):
        cycle()
    stats = client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    noop = client.script_load("return 0")
    client.config_resetstat()
    for _ in range(n):
        client.evalsha(noop, 0)
    noop_stats = client.info("commandstats").get("cmdstat_evalsha", {})
    store.delete(tid)
    return {
        "scripts_us_per_cycle": round(float(evalsha.get("usec", 0)) / n, 2),
        "noop_evalsha_us": round(float(noop_stats.get("usec_per_call", 0)), 2),
        "calls_per_cycle": round(float(evalsha.get("calls", 0)) / n, 2),
    }


#: The statement that keeps the per-shard counters (_common.lua's ``count``), and what the
#: counters-off scripts of ``_counter_cost`` put in its place.
_COUNT_STMT = "redis.pcall('HINCRBY', counters_key, field, 1)"


def _server_us_per_cycle(store: CheckpointStore, client: redis.Redis, tid: str, n: int) -> float:
    cycle = _Cycle(store, tid)
    store.delete(tid)
    store.create(Checkpoint(tid, shared_state=make_state(1024)))
    cycle()
    client.config_resetstat()
    for _ in range(n):
        cycle()
    usec = float(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
    store.delete(tid)
    return usec / n


def _counter_cost(client: redis.Redis, ns: str, n: int, rounds: int) -> dict[str, Any]:
    """Server time per claim + commit cycle with the stats counters and without, side by side.

    The counters-off store runs the very same scripts with the counter statement
    replaced by a no-op; rounds alternate so drift hits both alike.
    """
    from redis_agentstate.wire import scripts as S

    on = CheckpointStore(client, namespace=ns)
    off = CheckpointStore(client, namespace=ns)
    off_scripts = internals(off).scripts
    assert isinstance(off_scripts, dict)  # the store's own table: swapped for this store only
    for name in (S.CLAIM, S.CLAIM_NEXT, S.COMMIT, S.COMMIT_AND_CLAIM):
        text = S.script_text(name)
        assert _COUNT_STMT in text, "the counter statement moved: update benchmarks/profile_hot.py"
        off_scripts[name] = client.register_script(text.replace(_COUNT_STMT, "local _ = counters_key"))
    with_c: list[float] = []
    without: list[float] = []
    for r in range(rounds):
        for store, out in ((on, with_c), (off, without)) if r % 2 == 0 else ((off, without), (on, with_c)):
            out.append(_server_us_per_cycle(store, client, "prof-counters", n))
    med_on, med_off = sorted(with_c)[len(with_c) // 2], sorted(without)[len(without) // 2]
    # The statement alone, priced below the noise of whole cycles: a script of only the
    # counter update against a no-op script, alternating, usec per call from commandstats.
    counter_key = Keys(ns).shard_counters(0)
    bump = client.register_script(f"local counters_key, field = KEYS[1], 'claims' {_COUNT_STMT} return 0")
    noop = client.register_script("local k = KEYS[1] return 0")
    bump_us: list[float] = []
    noop_us: list[float] = []
    for r in range(rounds):
        for script, out in ((bump, bump_us), (noop, noop_us)) if r % 2 == 0 else ((noop, noop_us), (bump, bump_us)):
            script(keys=[counter_key])
            client.config_resetstat()
            for _ in range(n):
                script(keys=[counter_key])
            out.append(float(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec_per_call", 0)))
    client.delete(counter_key)
    statement_us = sorted(b - o for b, o in zip(bump_us, noop_us, strict=True))[rounds // 2]
    return {
        "with_counters_us_per_cycle": round(med_on, 2),
        "without_counters_us_per_cycle": round(med_off, 2),
        "counters_extra_us_per_cycle": round(med_on - med_off, 2),
        "ratio": round(med_on / med_off, 3) if med_off else 0.0,
        "rounds": rounds,
        "counter_statement_us": round(statement_us, 2),
        "with_rounds_us": [round(v, 2) for v in with_c],
        "without_rounds_us": [round(v, 2) for v in without],
    }


def run(settings: Settings) -> dict[str, Any]:
    client = settings.client()
    store = CheckpointStore(client, namespace=settings.ns("profile"))
    tid = "prof-1"
    store.delete(tid)
    store.create(Checkpoint(tid, shared_state=make_state(1024), messages=[make_message(i) for i in range(10)]))
    cycle = _Cycle(store, tid)
    for _ in range(50):
        cycle()
    n = 200 if settings.quick else 3000
    result: dict[str, Any] = {
        "title": "Hot path of claim + commit (1 KiB shared_state)",
        "cprofile": _cprofile(cycle, n),
        "micro_us": _micro(store, client, settings.quick),
        "pid": os.getpid(),
    }
    if settings.private:
        result["server"] = _server_time(store, client, 100 if settings.quick else 2000)
        result["server"]["counters"] = _counter_cost(
            client, settings.ns("profile-counters"), 100 if settings.quick else 2000, 1 if settings.quick else 7
        )
    else:
        result["server"] = None
    store.delete(tid)
    client.close()
    return result
