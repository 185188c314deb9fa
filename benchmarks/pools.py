"""Figure 4: pools -- ``record_message`` and ``watch`` throughput, and watch latency from XADD to delivery.

Written against the pool API in docs/design.md (``PoolStore.open / join /
record_message / watch``). If ``redis_agentstate`` has no pool store yet, the
pool rows say so and only the raw Redis Streams floor (``XADD`` and a
blocking ``XREAD`` through redis-py) is measured.

* record_message: one connection, sequential calls, each with a new
  idempotency key (and separately a re-send of an already recorded key: the
  dedupe path);
* watch backlog: read a pool's log from a cursor in pages of ``count`` records;
* watch latency: a watcher thread blocks in ``watch(after, block_ms=...)``
  while a writer thread records one message every ~2 ms; latency is from just
  before the writer's call to the watcher holding the record (writer round
  trip included). The floor does the same with raw XADD / XREAD BLOCK.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ._util import Settings, latency_summary, summary

PAYLOAD = {"text": "p" * 160, "tool": "search", "step": 1}
PAGE = 500
BLOCK_MS = 1000


def load_pool_api() -> tuple[dict[str, Any] | None, str]:
    """The pool classes, or None and why not."""
    try:
        import redis_agentstate as ras

        names = ("PoolStore", "PoolConfig", "PoolMember", "RunMessage", "MessageReceipt")
        api = {}
        for name in names:
            obj = getattr(ras, name, None)
            if obj is None:
                from redis_agentstate import pools as pool_mod  # type: ignore[attr-defined,unused-ignore]

                obj = getattr(pool_mod, name)
            api[name] = obj
        return api, "ok"
    except Exception as exc:
        return None, f"pools not available: {type(exc).__name__}: {exc}"


class PoolBench:
    def __init__(self, settings: Settings, api: dict[str, Any]) -> None:
        self.api = api
        self.settings = settings
        self.client = settings.client()
        self.store = api["PoolStore"](self.client, namespace=settings.ns("pools"))
        self.n = 0

    def new_pool(self) -> str:
        pool = f"pool-{uuid.uuid4().hex[:8]}"
        self.store.open(pool, self.api["PoolConfig"]())
        self.store.join(pool, self.api["PoolMember"](run_id="run-a"))
        return pool

    def record(self, pool: str, key: str | None = None) -> Any:
        self.n += 1
        mid = f"m{self.n}"
        msg = self.api["RunMessage"](message_id=mid, idempotency_key=key or f"k{self.n}", payload=PAYLOAD)
        receipt = self.api["MessageReceipt"](message_id=mid, recipients=["run-a"])
        return self.store.record_message(pool, msg, receipt)

    def record_throughput(self, n: int) -> tuple[float, list[float]]:
        pool = self.new_pool()
        per = []
        clock = time.perf_counter_ns
        t0 = clock()
        for _ in range(n):
            a = clock()
            self.record(pool)
            per.append((clock() - a) / 1000)
        return n / ((clock() - t0) / 1e9), per

    def dedupe_throughput(self, n: int) -> float:
        pool = self.new_pool()
        self.record(pool, key="same")
        t0 = time.perf_counter()
        for _ in range(n):
            self.record(pool, key="same")
        return n / (time.perf_counter() - t0)

    def watch_throughput(self, n: int) -> float:
        pool = self.new_pool()
        start = self.store.watch(pool)[-1].cursor
        for _ in range(n):
            self.record(pool)
        got = 0
        after = start
        t0 = time.perf_counter()
        while got < n:
            page = self.store.watch(pool, after, count=PAGE)
            if not page:
                raise RuntimeError("watch returned nothing before the backlog was read")
            got += len(page)
            after = page[-1].cursor
        return got / (time.perf_counter() - t0)

    def watch_latency(self, n: int) -> list[float]:
        pool = self.new_pool()
        start = self.store.watch(pool)[-1].cursor
        watcher_client = self.settings.client()
        watcher = self.api["PoolStore"](watcher_client, namespace=self.settings.ns("pools"))

        def poll(after: Any) -> tuple[Any, int]:
            recs = watcher.watch(pool, after, block_ms=BLOCK_MS)
            return (recs[-1].cursor if recs else after), len(recs)

        try:
            return _latency(n, lambda: self.record(pool), poll, start)
        finally:
            watcher_client.close()

    def close(self) -> None:
        self.client.close()


def _latency(n: int, write: Callable[[], Any], poll: Callable[[Any], tuple[Any, int]], start: Any) -> list[float]:
    """Writer thread paced ~2 ms apart; watcher thread blocks; us from the write's start to delivery."""
    sent: list[int] = []
    lat: list[float] = []
    ready = threading.Event()
    failure: list[BaseException] = []

    def watcher() -> None:
        after = start
        seen = 0
        ready.set()
        deadline = time.monotonic() + 30 + n * 0.01
        try:
            while seen < n and time.monotonic() < deadline:
                after, k = poll(after)
                now = time.perf_counter_ns()
                for i in range(seen, seen + k):
                    lat.append((now - sent[i]) / 1000)
                seen += k
        except BaseException as exc:  # reported to the caller
            failure.append(exc)

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    ready.wait()
    time.sleep(0.02)  # let the watcher block first
    for _ in range(n):
        sent.append(time.perf_counter_ns())
        write()
        time.sleep(0.002)
    t.join(timeout=60)
    if failure:
        raise failure[0]
    return lat


class StreamFloor:
    """Raw Redis Streams through redis-py: what any pool store on Streams pays."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = settings.client()
        self.ns = settings.ns("streams")

    def key(self) -> str:
        return f"{self.ns}:{uuid.uuid4().hex[:8]}"

    def xadd_throughput(self, n: int) -> float:
        key = self.key()
        fields = {"k": "x", "p": repr(PAYLOAD)}
        t0 = time.perf_counter()
        for _ in range(n):
            self.client.xadd(key, fields)  # type: ignore[arg-type]
        rate = n / (time.perf_counter() - t0)
        self.client.delete(key)
        return rate

    def latency(self, n: int) -> list[float]:
        key = self.key()
        fields = {"k": "x", "p": repr(PAYLOAD)}
        reader = self.settings.client()

        def poll(after: Any) -> tuple[Any, int]:
            got: Any = reader.xread({key: after}, block=BLOCK_MS)
            if not got:
                return after, 0
            entries = got[0][1] if isinstance(got, list) else next(iter(got.values()))[0]
            return entries[-1][0], len(entries)

        try:
            return _latency(n, lambda: self.client.xadd(key, fields), poll, "0-0")  # type: ignore[arg-type]
        finally:
            reader.close()
            self.client.delete(key)

    def close(self) -> None:
        self.client.close()


def run(settings: Settings) -> dict[str, Any]:
    api, status = load_pool_api()
    n = 100 if settings.quick else 1000
    n_lat = 50 if settings.quick else 300
    rounds = settings.rounds if settings.quick else max(3, settings.rounds // 3)
    floor = StreamFloor(settings)
    bench = PoolBench(settings, api) if api is not None else None
    results: dict[str, list[float]] = {k: [] for k in ("record", "dedupe", "watch", "xadd")}
    record_lat: list[float] = []
    watch_lat: list[float] = []
    floor_lat: list[float] = []
    errors: list[str] = []
    jobs: list[tuple[str, Callable[[], None]]] = [
        ("xadd", lambda: results["xadd"].append(floor.xadd_throughput(n))),
        ("floor_lat", lambda: floor_lat.extend(floor.latency(n_lat))),
    ]
    if bench is not None:

        def rec() -> None:
            rate, per = bench.record_throughput(n)
            results["record"].append(rate)
            record_lat.extend(per)

        jobs += [
            ("record", rec),
            ("dedupe", lambda: results["dedupe"].append(bench.dedupe_throughput(n))),
            ("watch", lambda: results["watch"].append(bench.watch_throughput(n))),
            ("watch_lat", lambda: watch_lat.extend(bench.watch_latency(n_lat))),
        ]
    rng = random.Random(settings.seed + 4)
    for _ in range(rounds):
        order = list(jobs)
        rng.shuffle(order)
        for name, job in order:
            try:
                job()
            except Exception as exc:
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                if bench is not None and name in ("record", "dedupe", "watch", "watch_lat"):
                    status = f"pools failed: {errors[-1]}"
    floor.close()
    if bench is not None:
        bench.close()
    pools_ok = bench is not None and status == "ok"

    def rate(k: str) -> dict[str, Any] | None:
        return summary(results[k], 0) if results[k] else None

    rows = [
        {
            "name": "record_message",
            "status": status,
            "ops_per_s": rate("record") if pools_ok else None,
            "latency_us": latency_summary(record_lat) if pools_ok and record_lat else None,
        },
        {"name": "record_message (dedupe hit)", "status": status, "ops_per_s": rate("dedupe") if pools_ok else None},
        {
            "name": f"watch backlog (count={PAGE})",
            "status": status,
            "records_per_s": rate("watch") if pools_ok else None,
        },
        {
            "name": f"watch latency XADD->delivery (block_ms={BLOCK_MS})",
            "status": status,
            "latency_us": latency_summary(watch_lat) if pools_ok and watch_lat else None,
        },
        {"name": "floor: raw XADD (redis-py)", "status": "ok", "ops_per_s": rate("xadd")},
        {
            "name": f"floor: raw XADD -> XREAD BLOCK {BLOCK_MS} latency",
            "status": "ok",
            "latency_us": latency_summary(floor_lat) if floor_lat else None,
        },
    ]
    return {
        "title": "Pools: record_message / watch throughput and watch latency",
        "available": pools_ok,
        "status": status,
        "rounds": rounds,
        "records_per_round": n,
        "latency_samples_per_round": n_lat,
        "errors": errors[:5],
        "rows": rows,
    }
