"""The same store operations on ``InMemoryStore``, ``AgentStateStore`` and the official ``RedisStore``:
where each answers differently from ``InMemoryStore`` (LangGraph's reference semantics).

``python tools/redisstore_conformance.py [--ours URL] [--redis-stack URL]``: without ``--ours`` a
private ``redis-server`` (the system's, no modules) is started; without ``--redis-stack``,
``../shared/tools/redis-stack.sh`` on a free port (Redis 7.4.1 with RedisJSON and RediSearch, what
``RedisStore`` from langgraph-checkpoint-redis needs). Prints a markdown table, one row per
operation: ``same`` where a store answered as ``InMemoryStore``, else what it answered. Exits 1 when
ours differs anywhere (RedisStore's differences are reported, not judged).

Every store gets the same writes, in namespace (tuple) order so that InMemoryStore's order of
namespaces (the order first written) and ours (tuple order) agree; each operation's answer is
compared as plain data (namespace, key, value; scores to 4 places; namespaces as tuples).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
STACK = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "tools", "redis-stack.sh"))

DOCS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("many", f"n{i:02d}"), f"k{j}", {"i": i, "j": j, "text": f"item {i} {j}"}) for i in range(12) for j in range(2)
] + [
    (("teams", "t1"), "e", {"lang": "pt", "n": 0, "text": "a team"}),
    (("users", "u1"), "a", {"lang": "pt", "n": 3, "tags": ["x", "y"], "nest": {"k": 1}, "text": "apples and pears"}),
    (("users", "u1"), "b", {"lang": "en", "n": 5, "text": "a red car"}),
    (("users", "u2"), "c", {"lang": "pt", "n": 7.5, "nest": {"k": 2}, "text": "pears"}),
    (("users", "u2", "work"), "d", {"lang": "de", "n": -1, "text": "zebra crossing"}),
]


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic 8-d embedding: letter counts folded, plus a constant so no vector is zero."""
    out = []
    for text in texts:
        v = [0.0] * 8
        for ch in text.lower():
            v[ord(ch) % 8] += 1.0
        v[0] += 0.5
        out.append(v)
    return out


INDEX: Any = {"dims": 8, "embed": embed, "fields": ["text"]}


def _plain(result: Any) -> Any:
    if result is None:
        return None
    if isinstance(result, list):
        return [_plain(r) for r in result]
    if isinstance(result, tuple):
        return tuple(result)
    score = getattr(result, "score", None)
    out = (tuple(result.namespace), result.key, result.value)
    return (*out, round(score, 4)) if score is not None else out


#: (name, operation): each runs on a store holding DOCS and returns what is compared.
OPERATIONS: list[tuple[str, Callable[[Any], Any]]] = [
    ("get an item", lambda s: _plain(s.get(("users", "u1"), "a"))),
    ("get a missing key", lambda s: _plain(s.get(("users", "u1"), "zz"))),
    ("search a prefix", lambda s: _plain(s.search(("users",)))),
    ("search, filter equality", lambda s: _plain(s.search(("users",), filter={"lang": "pt"}))),
    ("search, filter $gt", lambda s: _plain(s.search(("users",), filter={"n": {"$gt": 3}}))),
    ("search, filter $ne", lambda s: _plain(s.search(("users",), filter={"lang": {"$ne": "pt"}}))),
    ("search, filter nested dict", lambda s: _plain(s.search(("users",), filter={"nest": {"k": 1}}))),
    ("search, filter list", lambda s: _plain(s.search(("users",), filter={"tags": ["x", "y"]}))),
    ("search, filter two keys", lambda s: _plain(s.search(("users",), filter={"lang": "pt", "n": {"$gte": 3}}))),
    ("search, limit 15 of 24", lambda s: _plain(s.search(("many",), limit=15))),
    ("search, limit 3 offset 4", lambda s: _plain(s.search(("many",), limit=3, offset=4))),
    ("search, filter matching 12 of 24", lambda s: _plain(s.search(("many",), filter={"j": 1}, limit=20))),
    ("search the root", lambda s: _plain(s.search((), limit=50))),
    ("list_namespaces", lambda s: _plain(s.list_namespaces(limit=50))),
    ("list_namespaces, prefix", lambda s: _plain(s.list_namespaces(prefix=("users",)))),
    ("list_namespaces, suffix", lambda s: _plain(s.list_namespaces(suffix=("work",)))),
    ("list_namespaces, max_depth 1", lambda s: _plain(s.list_namespaces(max_depth=1))),
    ("list_namespaces, limit 2 offset 1", lambda s: _plain(s.list_namespaces(limit=2, offset=1))),
    ("list_namespaces, 15 of them", lambda s: _plain(s.list_namespaces(limit=15))),
    ("semantic search", lambda s: _plain(s.search(("users",), query="pear"))),
    ("semantic search, filter", lambda s: _plain(s.search(("users",), query="pear", filter={"lang": "pt"}))),
    ("semantic search, limit 2 offset 1", lambda s: _plain(s.search(("users",), query="car", limit=2, offset=1))),
]


def _after_writes(s: Any) -> Any:
    """An update keeps created_at and moves updated_at; a delete leaves nothing."""
    s.put(("users", "u1"), "b", {"lang": "en", "n": 6, "text": "a red car"})
    item = s.get(("users", "u1"), "b")
    s.delete(("teams", "t1"), "e")
    gone = s.get(("teams", "t1"), "e")
    return {"updated": None if item is None else item.value, "kept created_at": None if item is None else
            item.updated_at >= item.created_at, "deleted": gone}  # fmt: skip


OPERATIONS.append(("update, then delete", _after_writes))


def fill(store: Any) -> Any:
    for ns, key, value in DOCS:
        store.put(ns, key, value)
    return store


def answers(store: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, op in OPERATIONS:
        try:
            out[name] = op(store)
        except Exception as exc:  # an error is an answer too
            out[name] = f"{type(exc).__name__}: {exc}"[:160]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("no redis-server on PATH")
    port, tmp = _free_port(), tempfile.mkdtemp(prefix="conformance-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def redis_stack() -> Iterator[str]:
    port = _free_port()
    out = subprocess.run([STACK, str(port)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"redis-stack.sh failed: {out.stderr.strip()[-300:]}")
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=30)


def ours(url: str) -> Any:
    import redis

    from redis_agentstate.langgraph import AgentStateStore

    return fill(AgentStateStore(redis.Redis.from_url(url), f"conf-{uuid.uuid4().hex[:8]}", index=INDEX))


def redis_store(url: str) -> Any:
    import redis
    from langgraph.store.redis import RedisStore

    prefix = f"conf{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis.Redis.from_url(url), index=INDEX, store_prefix=prefix, vector_prefix=prefix + "_v")
    store.setup()
    return fill(store)


def compare(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, str]:
    return {name: "same" if other[name] == reference[name] else f"{other[name]!r:.200}" for name in reference}


def report(columns: dict[str, dict[str, str]], reference: dict[str, Any]) -> str:
    names = list(columns)
    lines = ["| operation | InMemoryStore answers | " + " | ".join(names) + " |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " |"]  # fmt: skip
    for op in reference:
        cells = [columns[n][op].replace("|", "\\|") for n in names]
        lines.append(f"| {op} | {str(reference[op])[:80].replace('|', chr(92) + '|')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from langgraph.store.memory import InMemoryStore

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", default=None, help="a Redis URL for AgentStateStore (default: a private server)")
    parser.add_argument("--redis-stack", default=None, help="a Redis Stack URL for RedisStore (default: started)")
    args = parser.parse_args(argv)
    reference = answers(fill(InMemoryStore(index=INDEX)))
    columns: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        url = args.ours or stack.enter_context(private_redis())
        columns["AgentStateStore"] = compare(reference, answers(ours(url)))
        try:
            stack_url = args.redis_stack or stack.enter_context(redis_stack())
            columns["RedisStore (langgraph-checkpoint-redis)"] = compare(reference, answers(redis_store(stack_url)))
        except Exception as exc:  # reported: the rest of the table still stands
            print(f"RedisStore not run: {type(exc).__name__}: {exc}", file=sys.stderr)
    print(report(columns, reference))
    return 0 if all(v == "same" for v in columns["AgentStateStore"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
