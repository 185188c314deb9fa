"""Semantic search of LangGraph stores at 1,000 and 100,000 items: p50/p99, recall@10, memory per item.

``python -m benchmarks.langgraph_store_ann [--sizes 1000x64,100000x64,1000x1536,10000x1536]
[--queries 20] [--contenders ours,memory,redisstore] [--readme]`` (``--readme``: keep the run in
``results/langgraph_store_ann.json`` and rewrite its block of benchmarks/README.md)

One namespace ``("docs",)`` of ``items`` items (``{"text": ..., "n": i}``), put in batches of 500,
then ``queries`` calls of ``search(("docs",), query=q, limit=10)`` per contender, interleaved
(the contenders in a shuffled order per query). The embedder is a deterministic fake with topic
structure, as text embeddings have: a text's vector is one of ``TOPICS`` seeded Gaussian centres
plus seeded Gaussian noise (``NOISE`` of the centre's scale), computed from the text alone, never
cached; a query is a new text of a random topic. (Structureless random vectors are the worst case
of any clustered index and unlike embeddings of text: not what this measures.) recall@10 is
against the exact top 10 by cosine (numpy over the float32 vectors, InMemoryStore's ranking).

Contenders: ``AgentStateStore`` on a private Redis 7.0 (``redis-server`` on PATH, no modules:
exact up to ``MAX_EXACT`` items, the IVF index of ``_store_ann.py`` above); ``InMemoryStore``
(exact, the floor; left out where its Python lists of floats would not fit this machine's memory);
the official ``RedisStore`` (langgraph-checkpoint-redis) on Redis 7.4.1 with RedisJSON +
RediSearch (``../shared/tools/redis-stack.sh``; its vector index is exact, FLAT).

Memory per item: the server's ``used_memory`` delta across the fill, divided by the items. Script
bound: the private server's SLOWLOG (threshold 1 ms) across the fill and the searches: the longest
``EVALSHA`` (every script of ours) and the longest command of any kind, in ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ._util import percentile

TOPICS = 200
NOISE = 1.5
FILL_BATCH = 500
LIMIT = 10
#: InMemoryStore keeps each vector as a Python list of floats (about 32 bytes a dimension): above
#: this many floats in all it is left out (the reason is in its row).
MEMORY_FLOATS = 40_000_000
#: The pid of each private server this module started, by URL (its main thread's CPU clock).
PIDS: dict[str, int] = {}


class TopicEmbedder:
    """A text's vector: centre of topic ``crc32(text) % TOPICS`` (or the ``t<k>:`` prefix's) plus noise."""

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self.centres = np.random.default_rng(dims).standard_normal((TOPICS, dims))

    def vector(self, text: str) -> np.ndarray:
        seed = zlib.crc32(text.encode())
        topic = int(text[1:].split(":")[0]) if text.startswith("t") and ":" in text else seed % TOPICS
        noise = np.random.default_rng(seed).standard_normal(self.dims) * NOISE
        return np.asarray(self.centres[topic % TOPICS] + noise, dtype=np.float32)

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vector(t).tolist() for t in texts]


def _text(i: int) -> str:
    return f"t{(i * 7919) % TOPICS}:doc {i}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis70() -> Iterator[str]:
    """A private redis-server (the system's 7.0) in a temp dir, no persistence."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("no redis-server on PATH")
    port, tmp = _free_port(), tempfile.mkdtemp(prefix="ann-bench-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                break
            time.sleep(0.05)
        PIDS[f"redis://127.0.0.1:{port}/0"] = proc.pid
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def stack() -> Iterator[str]:
    from .langgraph_store import stack_server

    with stack_server() as url:
        yield url


def _used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def run_size(items: int, dims: int, queries: int, contenders: list[str], urls: dict[str, str]) -> dict[str, Any]:
    import redis
    from langgraph.store.base import PutOp
    from langgraph.store.memory import InMemoryStore

    from redis_agentstate.langgraph import AgentStateStore

    emb = TopicEmbedder(dims)
    index: Any = {"dims": dims, "embed": emb, "fields": ["text"]}
    stores: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    clients: list[Any] = []
    run = f"{items}x{dims}x{random.randrange(10**6)}"
    if "ours" in contenders:
        client = redis.Redis.from_url(urls["ours"])
        clients.append(client)
        client.config_set("slowlog-log-slower-than", 1000)
        client.config_set("slowlog-max-len", 100000)
        client.slowlog_reset()
        stores["AgentStateStore, Redis 7.0"] = (AgentStateStore(client, f"ann-{run}", index=index), client)
    if "memory" in contenders:
        if items * dims > MEMORY_FLOATS:
            gib = items * dims * 32 / 2**30
            why = f"{items:,} x {dims} floats as Python lists: about {gib:.1f} GiB, more than this machine spares"
            rows["InMemoryStore (exact)"] = {"skipped": why}
        else:
            stores["InMemoryStore (exact)"] = (InMemoryStore(index=index), None)
    if "redisstore" in contenders:
        if "redisstore" not in urls:
            rows["RedisStore, Redis 7.4 + modules"] = {"skipped": urls.get("redisstore_error", "not started")}
        else:
            from langgraph.store.redis import RedisStore

            client = redis.Redis.from_url(urls["redisstore"])
            clients.append(client)
            store = RedisStore(client, index=index, store_prefix=f"rs{run}", vector_prefix=f"rs{run}_vectors")
            store.setup()
            stores["RedisStore, Redis 7.4 + modules"] = (store, client)
    truth = np.zeros((items, dims), dtype=np.float32)
    for name, (store, client) in stores.items():
        before = _used(client) if client is not None else 0
        start = time.perf_counter()
        for i in range(0, items, FILL_BATCH):
            ops = [PutOp(("docs",), f"k{j}", {"text": _text(j), "n": j}) for j in range(i, min(items, i + FILL_BATCH))]
            store.batch(ops)
        fill_s = time.perf_counter() - start
        per_item = round((_used(client) - before) / items) if client is not None else None
        rows[name] = {"fill_s": round(fill_s, 1), "bytes_per_item": per_item}
        print(f"  filled {name}: {fill_s:.1f} s", file=sys.stderr, flush=True)
    for j in range(items):
        truth[j] = emb.vector(_text(j))
    unit = truth / np.linalg.norm(truth, axis=1, keepdims=True)
    rng = random.Random(items * 31 + dims)
    times: dict[str, list[float]] = {n: [] for n in stores}
    recalls: dict[str, list[float]] = {n: [] for n in stores}
    for q in range(queries):
        text = f"t{rng.randrange(TOPICS)}:query {q}"
        qv = emb.vector(text)
        exact = np.argsort(-(unit @ (qv / np.linalg.norm(qv))), kind="stable")[:LIMIT]
        want = {f"k{int(j)}" for j in exact}
        order = list(stores)
        rng.shuffle(order)
        for name in order:
            store = stores[name][0]
            t0 = time.perf_counter()
            got = store.search(("docs",), query=text, limit=LIMIT)
            times[name].append((time.perf_counter() - t0) * 1e3)
            recalls[name].append(len({g.key for g in got} & want) / LIMIT)
    for name in stores:
        rows[name].update(p50_ms=round(percentile(times[name], 50), 2), p99_ms=round(percentile(times[name], 99), 2),
                          recall10=round(sum(recalls[name]) / len(recalls[name]), 3), n=len(times[name]))  # fmt: skip
    if "AgentStateStore, Redis 7.0" in stores:
        client = stores["AgentStateStore, Redis 7.0"][1]
        log = client.slowlog_get(100000)
        scripts = [e["duration"] / 1000 for e in log if bytes(e["command"]).upper().startswith(b"EVALSHA")]
        rows["AgentStateStore, Redis 7.0"].update(
            slowest_script_ms=round(max(scripts, default=0.0), 2),
            slowest_command_ms=round(max((e["duration"] / 1000 for e in log), default=0.0), 2),
            scripts_over_10ms=sum(1 for s in scripts if s > 10),
        )
        from redis_agentstate.testing import internals

        keys = internals(stores["AgentStateStore, Redis 7.0"][0]).core.keys
        state = client.hgetall(keys.store("docs").centroids)
        rows["AgentStateStore, Redis 7.0"]["index"] = {
            "version": int(state.get(b"v", 0)),
            "lists": int(state.get(b"k:" + state.get(b"v", b"0"), 0) or 0),
        }
    for c in clients:
        with contextlib.suppress(Exception):
            c.flushall()
        c.close()
    return {"items": items, "dims": dims, "queries": queries, "rows": rows}


def script_cpu(items: int, dims: int, searches: int = 10) -> dict[str, dict[str, float]]:
    """The server CPU time of every script call of ours over a fill of ``items`` and ``searches`` semantic
    searches (with and without a filter): the private server's main thread's time on CPU
    (``/proc/<pid>/task/<pid>/schedstat``) across each call, sent alone. Unlike SLOWLOG's wall time,
    it leaves out the time the shared machine's load kept the server off the CPU."""
    import redis
    from langgraph.store.base import PutOp

    from redis_agentstate.langgraph import AgentStateStore
    from redis_agentstate.wire import Batch, drivers

    calls: dict[str, list[float]] = {}
    with redis70() as url:
        stat = f"/proc/{PIDS[url]}/task/{PIDS[url]}/schedstat"

        def on_cpu_ns() -> int:
            with open(stat) as f:
                return int(f.read().split()[0])

        send = drivers._send_sync

        def alone(client: Any, scripts: Any, req: Any) -> Any:
            if not hasattr(req, "calls") and not hasattr(req, "script"):
                return send(client, scripts, req)
            out = []
            for call in getattr(req, "calls", None) or [req]:
                before = on_cpu_ns()
                out.extend(send(client, scripts, Batch([call])))
                calls.setdefault(call.script, []).append((on_cpu_ns() - before) / 1e6)
            return out if hasattr(req, "calls") else out[0]

        client = redis.Redis.from_url(url)
        emb = TopicEmbedder(dims)
        store = AgentStateStore(client, "cpu", index={"dims": dims, "embed": emb, "fields": ["text"]})
        drivers._send_sync = alone  # type: ignore[assignment]
        try:
            for i in range(0, items, FILL_BATCH):
                store.batch(
                    [
                        PutOp(("docs",), f"k{j}", {"text": _text(j), "n": j})
                        for j in range(i, min(items, i + FILL_BATCH))
                    ]
                )
            for q in range(searches):
                store.search(("docs",), query=f"t{q}:query {q}", limit=LIMIT)
                store.search(("docs",), query=f"t{q}:query {q}", limit=LIMIT, filter={"n": {"$gte": 0}})
        finally:
            drivers._send_sync = send  # type: ignore[assignment]
            client.close()
    return {name: {"max_ms": round(max(v), 2), "median_ms": round(sorted(v)[len(v) // 2], 2), "calls": len(v)}
            for name, v in sorted(calls.items())}  # fmt: skip


def markdown(fig: dict[str, Any], params: dict[str, Any] | None = None) -> str:
    """The block: one row per size and contender."""
    results: list[dict[str, Any]] = fig["runs"]
    lines = ["| items x dims | contender | p50 ms | p99 ms | recall@10 | bytes/item | slowest script ms (SLOWLOG) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for res in results:
        for name, row in res["rows"].items():
            size = f"{res['items']:,} x {res['dims']}"
            if "skipped" in row:
                lines.append(f"| {size} | {name} | - | - | - | - | not run: {row['skipped']} |")
                continue
            slow = row.get("slowest_script_ms")
            lines.append(f"| {size} | {name} | {row['p50_ms']} | {row['p99_ms']} | {row['recall10']} | "
                         f"{row['bytes_per_item'] if row['bytes_per_item'] is not None else '-'} | "
                         f"{slow if slow is not None else '-'} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from . import report
    from ._util import command_line, run_meta

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000x64,100000x64,1000x1536,10000x1536", help="items x dims, ...")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--contenders", default="ours,memory,redisstore")
    parser.add_argument("--out", default=None)
    parser.add_argument("--readme", action="store_true")
    parser.add_argument("--script-cpu", default=None, help="items x dims: print each script's server CPU time")
    args = parser.parse_args(argv)
    if args.script_cpu:
        items, dims = (int(x) for x in args.script_cpu.split("x"))
        for name, row in script_cpu(items, dims).items():
            print(f"{name}: max {row['max_ms']} ms, median {row['median_ms']} ms, {row['calls']} calls")
        return
    meta = run_meta(command_line("python -m benchmarks.langgraph_store_ann", argv))
    contenders = args.contenders.split(",")
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack_:
        urls: dict[str, str] = {}
        if "ours" in contenders:
            urls["ours"] = stack_.enter_context(redis70())
        if "redisstore" in contenders:
            try:
                urls["redisstore"] = stack_.enter_context(stack())
            except Exception as exc:  # reported in its rows
                urls["redisstore_error"] = f"{type(exc).__name__}: {exc}"[:200]
        for size in args.sizes.split(","):
            items, dims = (int(x) for x in size.split("x"))
            print(f"{items} x {dims}", file=sys.stderr, flush=True)
            results.append(run_size(items, dims, args.queries, contenders, urls))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    params = {"sizes": args.sizes, "queries": args.queries, "contenders": contenders}
    if args.readme:
        report.publish(meta, "langgraph_store_ann", {"runs": results}, params)
    print(markdown({"runs": results}, params))


if __name__ == "__main__":
    main()
