"""Figure (opt-in, ``--only langgraph_store``): LangGraph long-term memory stores side by side.

``python -m benchmarks --only langgraph_store [--rounds 9]``. The workload: 100 users, each a
namespace ``("memories", user)`` of 10 items of 300-byte JSON values (``{"text", "kind", "n"}``,
4 in 10 of kind ``pref``), written once before the rounds. Then, in interleaved rounds (contenders
in an order shuffled per round and per operation), each contender runs ``CALLS`` of:

* ``put``: a new key in a random user's namespace (300 bytes, of kind ``note``);
* ``get``: an existing key of a random user;
* ``filtered search``: ``search(("memories", user), filter={"kind": "pref"}, limit=10)`` (4 matches,
  among the user's 10 items and the puts' notes);
* ``list_namespaces``: ``list_namespaces(prefix=("memories",), limit=100)`` (100 namespaces);

and, for each embedding size (``DIMS``), ``SEMANTIC_CALLS`` of ``semantic search``:
``search(("docs",), query=q, limit=10)`` over one namespace of 1,000 items, on a store built with
``index={"dims", "embed", "fields": ["text"]}``, in three rounds (``SEMANTIC_OPS``): warm (ours ranks
from its cache of vectors), cold (ours' cache emptied before each call) and mixed (each call
rewrites one doc, then searches; timed whole). The embedder is a deterministic fake (a
seeded Gaussian vector per text, computed once and looked up), so the store is timed, not the
embedder. Every call is timed; p50/p99 pool the calls of every round, and the ratio to ours on
Redis 7.0 is taken within each round (medians), then summarised (median, p10-p90 over rounds).
The ``answers`` column is what the contender returned per call (found items, matches, namespaces)
next to ``InMemoryStore``'s: a fast wrong answer is not a win.

Memory per item: the server's ``used_memory`` delta across the fill of the 1,000 memories (and of
each semantic corpus), divided by the items; for a Redis contender also the ``MEMORY USAGE`` of
its own keys (found by their prefix); for ``PostgresStore`` the growth of its tables
(``pg_total_relation_size``, indexes and TOAST included).

Contenders (a missing one says why in its row):

* ``InMemoryStore``: the floor (no server, no memory figure);
* ``AgentStateStore`` on the harness's private Redis 7.0 (the reference of the ratios) and on
  Redis 7.4.1 (``../shared/tools/redis-stack.sh``, modules loaded but unused);
* ``PostgresStore`` (langgraph-checkpoint-postgres + psycopg) on two throwaway PostgreSQL clusters
  (``initdb`` in a temp dir, ``pg_ctl`` on a free port, as user ``nobody`` when run as root): one
  with ``fsync=off``, ``synchronous_commit=off`` (as the Redis servers, which have no persistence),
  one with PostgreSQL's defaults (``durable commits``: a commit waits for its WAL flush); no
  semantic search without pgvector;
* ``RedisStore`` (langgraph-checkpoint-redis) on that Redis 7.4.1 with RedisJSON + RediSearch.

``--quick`` starts no server but the harness's (the 7.4 and PostgreSQL rows say so).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._util import Settings, latency_summary, percentile, summary, version_of

USERS, ITEMS_PER_USER, VALUE_BYTES = 100, 10, 300
CALLS, SEMANTIC_CALLS = 200, 20
SEMANTIC_ITEMS = 1000
DIMS = (64, 1536)
OPS = ("put", "get", "filtered search", "list_namespaces")
SEMANTIC, SEMANTIC_COLD, SEMANTIC_MIXED = "semantic search", "semantic search, cold cache", "put + semantic search"
#: The semantic rounds: warm (ours ranks from its cache of vectors), cold (ours' cache emptied before
#: each call: it reads every vector), mixed (each call rewrites one doc, then searches: a writer
#: moves the namespace's version between two searches, so ours reads the changed vector again).
SEMANTIC_OPS = (SEMANTIC, SEMANTIC_COLD, SEMANTIC_MIXED)
REFERENCE = "AgentStateStore, Redis 7.0"
#: Ours with 8 shards rather than the default 64 (a root search or listing reads every shard's index).
SHARDS8 = "AgentStateStore, Redis 7.0, shards=8"
FLOOR = "InMemoryStore (the floor)"
STACK_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "tools",
                            "redis-stack.sh")  # fmt: skip
#: The rivals of the goals (faster than these on OPS; memory per item at most RedisStore's).
PG, PG_DURABLE = "PostgresStore, PostgreSQL", "PostgresStore, PostgreSQL, durable commits"
RIVALS = (PG, PG_DURABLE, "RedisStore, Redis 7.4 + modules")
REDIS_STORE = RIVALS[-1]


def _value(user: int, j: int) -> dict[str, Any]:
    base = {"kind": "pref" if j % 10 in (0, 3, 6, 9) else "fact", "n": j, "text": ""}
    text = f"user {user} memory {j}: " + "lorem ipsum dolor sit amet " * 20
    raw = len(_json(base))
    base["text"] = text[: VALUE_BYTES - raw]
    return base


def _json(v: Any) -> bytes:
    import json

    return json.dumps(v, separators=(",", ":")).encode()


class FakeEmbedder:
    """A seeded Gaussian vector per text (crc32 of the text as the seed), computed once, then looked up."""

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self.cache: dict[str, list[float]] = {}

    def vector(self, text: str) -> list[float]:
        v = self.cache.get(text)
        if v is None:
            rng = random.Random(zlib.crc32(text.encode()) ^ self.dims)
            v = self.cache[text] = [rng.gauss(0.0, 1.0) for _ in range(self.dims)]
        return v

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vector(t) for t in texts]


def _index(emb: FakeEmbedder) -> dict[str, Any]:
    return {"dims": emb.dims, "embed": emb, "fields": ["text"]}


# ---- servers -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def stack_server() -> Iterator[str]:
    """Redis 7.4.1 with RedisJSON + RediSearch on a free port (``redis-stack.sh``), shut down after."""
    script = os.path.normpath(STACK_SCRIPT)
    if not os.path.exists(script):
        raise RuntimeError(f"no {script}")
    port = _free_port()
    out = subprocess.run([script, str(port)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"redis-stack.sh failed: {out.stderr.strip()[-300:]}")
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=30)


@contextlib.contextmanager
def postgres_server(durable: bool = False) -> Iterator[str]:
    """A throwaway PostgreSQL cluster (``initdb`` in a temp dir, ``pg_ctl`` on a free port) as a non-root user;
    ``durable``: PostgreSQL's defaults (fsync, synchronous_commit), else both off (as Redis without persistence)."""
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"no {tool} on PATH")
    tmp = tempfile.mkdtemp(prefix="agentstate-pg-")
    port = _free_port()
    as_root = os.geteuid() == 0

    def sh(cmd: str) -> subprocess.CompletedProcess[str]:
        argv = ["su", "nobody", "-s", "/bin/sh", "-c", cmd] if as_root else ["/bin/sh", "-c", cmd]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    if as_root:
        shutil.chown(tmp, "nobody")
    data = os.path.join(tmp, "data")
    started = False
    try:
        out = sh(f"initdb -D {data} -A trust -U bench >/dev/null")
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr.strip()[-300:]}")
        opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1"
        if not durable:
            opts += " -c fsync=off -c synchronous_commit=off"
        out = sh(f"pg_ctl -D {data} -o '{opts}' -l {tmp}/log -w start")
        if out.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {out.stderr.strip()[-300:]}")
        started = True
        yield f"postgresql://bench@127.0.0.1:{port}/postgres?sslmode=disable"
    finally:
        if started:
            sh(f"pg_ctl -D {data} -m immediate stop")
        shutil.rmtree(tmp, ignore_errors=True)


# ---- contenders ------------------------------------------------------------------


@dataclass
class Contender:
    name: str
    #: A store built with ``index`` (None: no vector index).
    build: Callable[[dict[str, Any] | None], Any]
    #: Bytes the contender's server holds now (None: not measurable).
    used: Callable[[], int | None] = lambda: None
    #: ``MEMORY USAGE`` of the keys of the store built last (None: not measurable).
    own_keys: Callable[[], int | None] = lambda: None
    version: str | None = None
    status: str = "ok"
    semantic: str | None = None  # why semantic search does not run (None: it does)
    closers: list[Callable[[], Any]] = field(default_factory=list)


def _redis_used(client: Any) -> Callable[[], int]:
    return lambda: int(client.info("memory")["used_memory"])


def _keys_usage(client: Any, patterns: Sequence[str]) -> int:
    total = 0
    for pattern in patterns:
        for key in client.scan_iter(match=pattern, count=1000):
            total += int(client.memory_usage(key, samples=0) or 0)
    return total


def _ours(url: str, name: str, settings: Settings, shards: int | None = None) -> Contender:
    import redis

    from redis_agentstate.langgraph import AgentStateStore

    client = redis.Redis.from_url(url)
    made: list[str] = []

    def build(index: dict[str, Any] | None) -> Any:
        ns = settings.ns(f"store-{shards or 'default'}-{len(made)}")
        made.append(ns)
        return AgentStateStore(client, ns, index=index, shards=shards)  # type: ignore[arg-type]

    return Contender(name, build, _redis_used(client), lambda: _keys_usage(client, [f"*{made[-1]}*"]),
                     version_of("redis-agentstate"), closers=[client.close])  # fmt: skip


def _redis_store(url: str, settings: Settings) -> Contender:
    import redis
    from langgraph.store.redis import RedisStore

    client = redis.Redis.from_url(url)
    made: list[str] = []

    def build(index: dict[str, Any] | None) -> Any:
        prefix = f"rs{settings.run_id}x{len(made)}"
        made.append(prefix)
        store = RedisStore(client, index=index, store_prefix=prefix, vector_prefix=prefix + "_vectors")  # type: ignore[arg-type]
        store.setup()
        return store

    return Contender("RedisStore, Redis 7.4 + modules", build, _redis_used(client),
                     lambda: _keys_usage(client, [f"{made[-1]}:*", f"{made[-1]}_vectors:*"]),
                     version_of("langgraph-checkpoint-redis"), closers=[client.close])  # fmt: skip


def _postgres(url: str, name: str) -> Contender:
    import psycopg
    from langgraph.store.postgres import PostgresStore
    from psycopg.rows import dict_row

    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)

    def build(index: dict[str, Any] | None) -> Any:
        if index is not None:
            raise RuntimeError("PostgresStore's semantic search needs pgvector")
        store = PostgresStore(conn)  # type: ignore[arg-type]
        store.setup()
        return store

    def used() -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_total_relation_size('store') AS n")
            row = cur.fetchone()
            return int(row["n"]) if row else 0  # type: ignore[call-overload]

    return Contender(name, build, used, lambda: None,
                     version_of("langgraph-checkpoint-postgres"), semantic="no pgvector on this machine",
                     closers=[conn.close])  # fmt: skip


def _in_memory() -> Contender:
    from langgraph.store.memory import InMemoryStore

    return Contender(FLOOR, lambda index: InMemoryStore(index=index),  # type: ignore[arg-type]
                     version=version_of("langgraph-checkpoint"))  # fmt: skip


def _not_run(name: str, exc: BaseException) -> Contender:
    return Contender(name, lambda _i: None, status=f"not run: {type(exc).__name__}: {exc}"[:240])


# ---- the workload ------------------------------------------------------------------


def _fill(store: Any, users: int, items: int) -> None:
    from langgraph.store.base import PutOp

    for u in range(users):
        store.batch([PutOp(("memories", f"user-{u}"), f"m{j}", _value(u, j)) for j in range(items)])


def _fill_docs(store: Any, n: int) -> None:
    from langgraph.store.base import PutOp

    for start in range(0, n, 100):
        store.batch(
            [PutOp(("docs",), f"d{j}", {"text": f"doc {j}", "n": j}) for j in range(start, min(n, start + 100))]
        )


def _warm_build(c: Contender, index: dict[str, Any] | None) -> Any:
    """A store of ``c`` after one of each operation on a store of its own, so the memory measured next
    counts the items, not the server's first scripts, indexes or tables."""
    warm = c.build(index)
    warm.put(("warm", "up"), "k", {"text": "warm up", "kind": "pref", "n": 0})
    warm.get(("warm", "up"), "k")
    warm.search(("warm",), filter={"kind": "pref"}, limit=10)
    warm.list_namespaces(prefix=("warm",), limit=10)
    if index is not None:
        warm.search(("warm",), query="warm up", limit=10)
    return c.build(index)


def _measured_fill(c: Contender, store: Any, fill: Callable[[], None], items: int) -> dict[str, Any]:
    before = c.used()
    fill()
    after = c.used()
    own = c.own_keys()
    return {
        "items": items,
        "used_per_item": None if before is None or after is None else round((after - before) / items, 1),
        "own_keys_per_item": None if own is None else round(own / items, 1),
    }


def _answer(op: str, result: Any) -> float:
    if op == "put":  # returns nothing
        return 0.0
    if op == "get":
        return 1.0 if result is not None else 0.0
    return float(len(result))


def _calls(op: str, users: int, items: int, rnd: int, n: int, rng: random.Random) -> list[Callable[[Any], Any]]:
    """``n`` calls of ``op`` (the same for every contender of a round)."""
    out: list[Callable[[Any], Any]] = []
    for i in range(n):
        u, j = rng.randrange(users), rng.randrange(items)
        ns = ("memories", f"user-{u}")
        if op == "put":
            # Of a kind the filtered search does not ask for: its matches stay 4 per user round after round.
            key, value = f"r{rnd}-{i}", {**_value(u, 100 + i), "kind": "note"}
            out.append(lambda s, ns=ns, key=key, value=value: s.put(ns, key, value))
        elif op == "get":
            out.append(lambda s, ns=ns, key=f"m{j}": s.get(ns, key))
        elif op == "filtered search":
            out.append(lambda s, ns=ns: s.search(ns, filter={"kind": "pref"}, limit=10))
        elif op == "list_namespaces":
            out.append(lambda s: s.list_namespaces(prefix=("memories",), limit=100))
        elif op == SEMANTIC_COLD:
            out.append(lambda s, q=f"query {rnd}-{i}": (_drop_cache(s), s.search(("docs",), query=q, limit=10))[1])
        elif op == SEMANTIC_MIXED:
            key, text = _mixed(rnd, i, items)
            out.append(lambda s, q=f"query {rnd}-{i}", key=key, text=text: (
                s.put(("docs",), key, {"text": text, "n": -1}), s.search(("docs",), query=q, limit=10))[1])  # fmt: skip
        else:  # semantic search
            out.append(lambda s, q=f"query {rnd}-{i}": s.search(("docs",), query=q, limit=10))
    return out


def _mixed(rnd: int, i: int, items: int) -> tuple[str, str]:
    """The doc a mixed call rewrites (a new text: a new vector) before it searches."""
    return f"d{(rnd * 7919 + i * 104729) % items}", f"doc rewritten {rnd}-{i}"


def _drop_cache(store: Any) -> None:
    """Empty ours' cache of vectors (the others keep none), so the search after it reads every vector."""
    core = getattr(store, "_core", None)
    if core is not None and hasattr(core, "cache"):
        core.cache.clear()


def _time(store: Any, calls: list[Callable[[Any], Any]], op: str) -> tuple[list[float], float]:
    per: list[float] = []
    answers = 0.0
    clock = time.perf_counter_ns
    for call in calls:
        t0 = clock()
        result = call(store)
        per.append((clock() - t0) / 1000.0)
        answers += _answer(op, result)
    return per, answers / max(len(calls), 1)


def _rounds(stores: dict[str, Any], ops: Sequence[str], n_of: Callable[[str], int], rounds: int, users: int,
            items: int, rng: random.Random) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per op and contender: every call's us, each round's median and answers per call."""
    data: dict[str, dict[str, Any]] = {
        op: {name: {"us": [], "round_p50": [], "answers": []} for name in stores} for op in ops
    }
    for rnd in range(-1, rounds):  # round -1 warms up (scripts loaded, caches filled); not recorded
        for op in ops:
            calls = _calls(op, users, items, rnd, n_of(op) if rnd >= 0 else 3, rng)
            order = list(stores)
            rng.shuffle(order)
            for name in order:
                per, answers = _time(stores[name], calls, op)
                if rnd >= 0:
                    cell = data[op][name]
                    cell["us"] += per
                    cell["round_p50"].append(percentile(per, 50))
                    cell["answers"].append(answers)
    return data


def _summarise(data: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for op, by in data.items():
        ref = by.get(REFERENCE)
        out[op] = {}
        for name, cell in by.items():
            row: dict[str, Any] = {"latency_us": latency_summary(cell["us"]),
                                   "answers": round(statistics.median(cell["answers"]), 2)}  # fmt: skip
            if ref is not None and ref["round_p50"]:
                row["over_ours"] = summary([a / b for a, b in zip(cell["round_p50"], ref["round_p50"], strict=True)])
            out[op][name] = row
    return out


def run(settings: Settings) -> dict[str, Any]:
    quick = settings.quick
    users, items = (10, 10) if quick else (USERS, ITEMS_PER_USER)
    calls, sem_calls = (5, 2) if quick else (CALLS, SEMANTIC_CALLS)
    sem_items = 50 if quick else SEMANTIC_ITEMS
    rounds = 1 if quick else settings.rounds
    rng = random.Random(settings.seed + 40)
    with contextlib.ExitStack() as stack:
        contenders: list[Contender] = [_in_memory(), _ours(settings.url, REFERENCE, settings),
                                       _ours(settings.url, SHARDS8, settings, shards=8)]  # fmt: skip
        servers: dict[str, str] = {"redis 7.0": settings.url}
        stack_url: str | None = None
        try:
            if quick:
                raise RuntimeError("--quick starts no server but the harness's")
            stack_url = stack.enter_context(stack_server())
            servers["redis 7.4 + modules"] = stack_url
            contenders.append(_ours(stack_url, "AgentStateStore, Redis 7.4", settings))
        except Exception as exc:
            contenders.append(_not_run("AgentStateStore, Redis 7.4", exc))
        for pg_name, durable in ((PG, False), (PG_DURABLE, True)):
            try:
                if quick:
                    raise RuntimeError("--quick starts no server but the harness's")
                import psycopg  # noqa: F401  (checked before a server is started for nothing)
                from langgraph.store.postgres import PostgresStore  # noqa: F401

                pg_url = stack.enter_context(postgres_server(durable))
                contenders.append(_postgres(pg_url, pg_name))
            except Exception as exc:
                contenders.append(_not_run(pg_name, exc))
        try:
            if stack_url is None:
                raise RuntimeError("no Redis 7.4 with modules")
            contenders.append(_redis_store(stack_url, settings))
        except Exception as exc:
            contenders.append(_not_run("RedisStore, Redis 7.4 + modules", exc))
        for c in contenders:
            stack.callback(lambda c=c: [f() for f in c.closers])

        # -- put / get / filtered search / list_namespaces, no vector index
        stores: dict[str, Any] = {}
        memory: dict[str, Any] = {}
        for c in contenders:
            if c.status != "ok":
                continue
            try:
                store = _warm_build(c, None)
                memory[c.name] = _measured_fill(c, store, lambda s=store: _fill(s, users, items), users * items)
                stores[c.name] = store
            except Exception as exc:
                c.status = f"not run: {type(exc).__name__}: {exc}"[:240]
        kv = _summarise(_rounds(stores, OPS, lambda _op: calls, rounds, users, items, rng))

        # -- semantic search, one store per embedding size
        semantic: dict[str, Any] = {}
        for dims in DIMS:
            emb = FakeEmbedder(dims)
            for j in range(sem_items):
                emb.vector(f"doc {j}")
            for rnd in range(-1, rounds):
                for i in range(max(sem_calls, 3)):
                    emb.vector(f"query {rnd}-{i}")
                    emb.vector(_mixed(rnd, i, sem_items)[1])
            sem_stores: dict[str, Any] = {}
            sem_memory: dict[str, Any] = {}
            skipped: dict[str, str] = {}
            for c in contenders:
                if c.status != "ok":
                    continue
                if c.semantic:
                    skipped[c.name] = c.semantic
                    continue
                try:
                    store = _warm_build(c, _index(emb))
                    sem_memory[c.name] = _measured_fill(c, store, lambda s=store: _fill_docs(s, sem_items), sem_items)
                    sem_stores[c.name] = store
                except Exception as exc:
                    skipped[c.name] = f"{type(exc).__name__}: {exc}"[:240]
            res = _summarise(_rounds(sem_stores, SEMANTIC_OPS, lambda _op: sem_calls, rounds, 1, sem_items, rng))
            semantic[str(dims)] = {"rows": res[SEMANTIC], "cold": res[SEMANTIC_COLD], "mixed": res[SEMANTIC_MIXED],
                                   "memory": sem_memory, "skipped": skipped}  # fmt: skip
    return {
        "users": users, "items_per_user": items, "value_bytes": VALUE_BYTES, "calls": calls,
        "semantic_calls": sem_calls, "semantic_items": sem_items, "rounds": rounds,
        "contenders": {c.name: {"status": c.status, "version": c.version} for c in contenders},
        "ops": kv, "memory": memory, "semantic": semantic,
    }  # fmt: skip


# ---- the tables ------------------------------------------------------------------------


def _lat(row: dict[str, Any] | None) -> str:
    if not row:
        return "- | - | -"
    lat, r = row["latency_us"], row.get("over_ours")
    ratio = f"{r['median']:.2f} ({r['p10']:.2f}-{r['p90']:.2f})" if r else "-"
    return f"{_us(lat['p50'])} | {_us(lat['p99'])} | {ratio}"


def _us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def _b(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f} B"


def markdown(fig: dict[str, Any]) -> str:
    names = list(fig["contenders"])
    lines = [
        f"{fig['users']} users x {fig['items_per_user']} items of {fig['value_bytes']} bytes; "
        f"{fig['rounds']} interleaved rounds of {fig['calls']} calls per operation and contender; "
        "p50/p99 pool every call; `x ours` is the contender's round median over ours on Redis 7.0 in the same "
        "round (median, p10-p90 over rounds); "
        f"`answers`: items found per get, matches per search, namespaces per list.",
        "",
        "| contender | version | " + " | ".join(f"{op} p50 | p99 | x ours | answers" for op in OPS) + " |",
        "| --- | --- | " + " | ".join("--- | --- | --- | ---" for _ in OPS) + " |",
    ]
    for name in names:
        c = fig["contenders"][name]
        if c["status"] != "ok" or name not in fig["ops"][OPS[0]]:
            lines.append(f"| {name} | {c['version'] or '-'} | {c['status']} |" + " |" * (4 * len(OPS) - 1))
            continue
        cells = [
            f"{_lat(fig['ops'][op][name])} | " + ("-" if op == "put" else f"{fig['ops'][op][name]['answers']:g}")
            for op in OPS
        ]
        lines.append(f"| {name} | {c['version'] or '-'} | " + " | ".join(cells) + " |")
    lines += ["", f"Memory per item (the {fig['users'] * fig['items_per_user']:,} memories; semantic corpora of "
              f"{fig['semantic_items']:,} items with their vectors):", "",
              "| contender | memories: server delta | own keys | "
              + " | ".join(f"{d}-d corpus: server delta | own keys" for d in fig["semantic"]) + " |",
              "| --- | --- | --- | " + " | ".join("--- | ---" for _ in fig["semantic"]) + " |"]  # fmt: skip
    for name in names:
        m = fig["memory"].get(name)
        if m is None:
            continue
        cells = [_b(m["used_per_item"]), _b(m["own_keys_per_item"])]
        for sem in fig["semantic"].values():
            sm = sem["memory"].get(name)
            cells += [_b(sm["used_per_item"]), _b(sm["own_keys_per_item"])] if sm else ["-", "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for variant, title in (("rows", "warm: ours ranks from its cache of vectors"),
                           ("cold", "cold cache: ours' cache emptied before each call, so it reads every vector"),
                           ("mixed", "a writer between searches: each call rewrites one doc (a new vector), "
                                     "then searches; the call is timed whole, put included")):  # fmt: skip
        lines += ["", f"Semantic search, {title} (`search((\"docs\",), query=..., limit=10)` over "
                  f"{fig['semantic_items']:,} items, {fig['semantic_calls']} calls per round and contender):", "",
                  "| contender | " + " | ".join(f"{d}-d p50 | p99 | x ours | answers" for d in fig["semantic"]) + " |",
                  "| --- | " + " | ".join("--- | --- | --- | ---" for _ in fig["semantic"]) + " |"]  # fmt: skip
        for name in names:
            if fig["contenders"][name]["status"] != "ok":
                continue
            cells = []
            for sem in fig["semantic"].values():
                row = sem.get(variant, {}).get(name)
                if row is None:
                    cells.append(f"not run: {sem['skipped'].get(name, '-')} | | |")
                else:
                    cells.append(f"{_lat(row)} | {row['answers']:g}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *(f"- {t}" for t in targets(fig))]
    return "\n".join(lines) + "\n"


def _label(name: str) -> str:
    return name.removeprefix("AgentStateStore, ")


def _vs(mine: str, p50: float, theirs: float) -> str:
    if p50 < theirs:
        return f"{_label(mine)} {_us(p50)} (met, {theirs / p50:.2f}x faster)"
    return f"{_label(mine)} {_us(p50)} (missed, {p50 / theirs:.2f}x slower)"


def targets(fig: dict[str, Any]) -> list[str]:
    """Issue 40's goals, judged on this run's p50s: faster than PostgresStore and RedisStore on the four
    operations; semantic search within 3x of RedisStore at 1,000 items; memory per item at most
    RedisStore's. A rival that answered otherwise than InMemoryStore is named as such."""
    out: list[str] = []
    ours = [n for n in fig["contenders"] if n.startswith("AgentStateStore") and n in fig["ops"][OPS[0]]]
    for rival in RIVALS:
        if rival not in fig["ops"][OPS[0]]:
            out.append(f"{rival}: {fig['contenders'].get(rival, {}).get('status', 'not run')}: no verdict")
            continue
        for op in OPS:
            theirs = fig["ops"][op][rival]["latency_us"]["p50"]
            parts = [_vs(mine, fig["ops"][op][mine]["latency_us"]["p50"], theirs) for mine in ours]
            line = f"faster than {rival} on {op} ({_us(theirs)}): " + "; ".join(parts)
            floor = fig["ops"][op].get(FLOOR)
            if floor is not None and op != "put" and fig["ops"][op][rival]["answers"] != floor["answers"]:
                line += (f" · but {rival.split(',')[0]} answered {fig['ops'][op][rival]['answers']:g} per call where "
                         f"InMemoryStore answers {floor['answers']:g}")  # fmt: skip
            out.append(line)
    for variant, what in (("rows", "warm"), ("cold", "cold cache"), ("mixed", "put + search")):
        for dims, sem in fig["semantic"].items():
            rs_row = sem.get(variant, {}).get(REDIS_STORE)
            if rs_row is None:
                out.append(f"semantic search within 3x of RedisStore ({dims}-d, {what}): RedisStore not measured: "
                           "no verdict")  # fmt: skip
                continue
            theirs = rs_row["latency_us"]["p50"]
            parts = []
            for mine in ours:
                row = sem[variant].get(mine)
                if row is not None:
                    x = row["latency_us"]["p50"] / theirs
                    parts.append(
                        f"{_label(mine)} {_us(row['latency_us']['p50'])} ({'met' if x <= 3 else 'missed'}, {x:.1f}x)"
                    )
            out.append(f"semantic search within 3x of RedisStore ({dims}-d, {what}, {fig['semantic_items']:,} items, "
                       f"{_us(theirs)}): " + "; ".join(parts))  # fmt: skip
    rs = fig["memory"].get(REDIS_STORE)
    if rs is None or rs["used_per_item"] is None:
        out.append("memory per item at most RedisStore's: RedisStore not measured: no verdict")
    else:
        parts = []
        for mine in ours:
            m = fig["memory"][mine]["used_per_item"]
            parts.append(
                f"{_label(mine)} {_b(m)} ({'met' if m is not None and m <= rs['used_per_item'] else 'missed'})"
            )
        out.append(
            f"memory per item at most RedisStore's ({_b(rs['used_per_item'])}, server delta): " + "; ".join(parts)
        )
    return out
