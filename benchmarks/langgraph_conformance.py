"""LangGraph's conformance suite (langgraph-checkpoint-conformance) on every Redis checkpointer we compare.

``python -m benchmarks.langgraph_conformance [--stack-url URL] [--readme]``: each saver runs
LangGraph's ``validate`` (base capabilities put, put_writes, get_tuple, list, delete_thread;
extended delete_for_runs, copy_thread, prune), and the table gives, per capability, the tests
it passed and failed, or that the saver does not implement it. Ours (sync and async),
``langgraph-checkpoint-plainredis`` and the ``langgraph-checkpoint-aws`` ``ValkeySaver`` run on a
private redis-server (the two sync-only ones through ``on_threads``, their sync methods
run on a thread for the suite's async calls); ``langgraph-checkpoint-redis`` needs RedisJSON and RediSearch, so it runs
on ``--stack-url`` (``../shared/tools/redis-stack.sh`` starts one) and says so in its row
without one. A saver whose package is missing says so in its row.
``--readme`` rewrites the ``langgraph_conformance`` block of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis

from redis_agentstate.embedded import start_embedded

from . import report
from ._util import command_line, has_json_and_search, run_meta, version_of

#: The capabilities in LangGraph's order: base, then extended.
CAPABILITIES = ("put", "put_writes", "get_tuple", "list", "delete_thread", "delete_for_runs", "copy_thread", "prune")
BASE = CAPABILITIES[:5]


def _ns() -> str:
    return f"conf-{uuid.uuid4().hex[:8]}"


def _ours_sync(url: str) -> Callable[[], AsyncIterator[Any]]:
    async def factory() -> AsyncIterator[Any]:
        from redis_agentstate.langgraph import AgentStateSaver

        client = redis.Redis.from_url(url)
        try:
            yield AgentStateSaver(client, namespace=_ns())
        finally:
            client.close()

    return factory


def _ours_async(url: str) -> Callable[[], AsyncIterator[Any]]:
    async def factory() -> AsyncIterator[Any]:
        import redis.asyncio as aioredis

        from redis_agentstate.langgraph import AsyncAgentStateSaver

        client = aioredis.Redis.from_url(url)
        try:
            yield AsyncAgentStateSaver(client, namespace=_ns())
        finally:
            await client.aclose()

    return factory


#: Each async method of LangGraph's saver interface and the sync one it runs on a thread.
_TWINS = {"aput": "put", "aput_writes": "put_writes", "aget_tuple": "get_tuple", "adelete_thread": "delete_thread",
          "adelete_for_runs": "delete_for_runs", "acopy_thread": "copy_thread", "aprune": "prune"}  # fmt: skip


def on_threads(saver: Any) -> Any:
    """A sync-only saver, its async methods run on a thread: the suite calls only those.

    plainredis and ValkeySaver implement the sync API alone (their a-methods raise), so without
    this they fail every test for that reason only; with it the suite judges their storage. Only
    the methods the saver implements get an async twin, so a capability it lacks stays "not
    implemented".
    """
    from langgraph.checkpoint.base import BaseCheckpointSaver

    cls = type(saver)
    methods: dict[str, Any] = {}
    for name, sync in _TWINS.items():
        if getattr(cls, sync) is not getattr(BaseCheckpointSaver, sync):

            async def twin(self: Any, *args: Any, _sync: str = sync, **kwargs: Any) -> Any:
                return await asyncio.to_thread(getattr(saver, _sync), *args, **kwargs)

            methods[name] = twin

    async def alist(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        for item in await asyncio.to_thread(lambda: list(saver.list(*args, **kwargs))):
            yield item

    methods["alist"] = alist
    methods["get_next_version"] = lambda self, current, channel: saver.get_next_version(current, channel)
    adapted = type(f"{cls.__name__}OnThreads", (BaseCheckpointSaver,), methods)
    return adapted(serde=saver.serde)


def _plainredis(url: str) -> Callable[[], AsyncIterator[Any]]:
    from langgraph_checkpoint_plainredis import RedisSaver

    async def factory() -> AsyncIterator[Any]:
        client = redis.Redis.from_url(url)
        try:
            yield on_threads(RedisSaver(client, prefix=_ns()))
        finally:
            client.close()

    return factory


def _valkey(url: str) -> Callable[[], AsyncIterator[Any]]:
    from langgraph_checkpoint_aws import ValkeySaver
    from valkey import Valkey

    async def factory() -> AsyncIterator[Any]:
        client = Valkey.from_url(url)
        try:
            yield on_threads(ValkeySaver(client))
        finally:
            client.close()

    return factory


def _official(url: str) -> Callable[[], AsyncIterator[Any]]:
    from langgraph.checkpoint.redis.aio import AsyncRedisSaver

    with redis.Redis.from_url(url) as client:
        if not has_json_and_search(client):
            raise RuntimeError("needs RedisJSON+RediSearch (give --stack-url)")

    async def factory() -> AsyncIterator[Any]:
        async with AsyncRedisSaver.from_conn_string(url) as saver:
            await saver.asetup()
            yield saver

    return factory


#: label -> (distribution, factory of the saver factory, runs on the stack server)
SAVERS: dict[str, tuple[str, Callable[[str], Callable[[], AsyncIterator[Any]]], bool]] = {
    "redis_agentstate AgentStateSaver": ("redis-agentstate", _ours_sync, False),
    "redis_agentstate AsyncAgentStateSaver": ("redis-agentstate", _ours_async, False),
    "langgraph-checkpoint-plainredis RedisSaver": ("langgraph-checkpoint-plainredis", _plainredis, False),
    "langgraph-checkpoint-aws ValkeySaver": ("langgraph-checkpoint-aws", _valkey, False),
    "langgraph-checkpoint-redis AsyncRedisSaver": ("langgraph-checkpoint-redis", _official, True),
}


def judge(label: str, factory: Callable[[], AsyncIterator[Any]]) -> dict[str, Any]:
    """LangGraph's ``validate`` of one saver: per capability passed/failed counts, None where not implemented."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    registered = checkpointer_test(name=label)(factory)
    got = asyncio.run(validate(registered))
    caps: dict[str, Any] = {}
    for name, result in got.results.items():
        caps[str(name)] = (
            None
            if result.passed is None
            else {"passed": result.tests_passed, "failed": result.tests_failed, "ok": bool(result.passed)}
        )
    return {"status": "ok", "capabilities": caps, "base_ok": bool(got.passed_all_base())}


def run(url: str, stack_url: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, (dist, make, needs_stack) in SAVERS.items():
        target = stack_url if needs_stack else url
        row: dict[str, Any] = {"version": version_of(dist), "server": "stack" if needs_stack else "plain"}
        try:
            if target is None:
                raise RuntimeError("needs RedisJSON+RediSearch (give --stack-url)")
            row.update(judge(label, make(target)))
        except Exception as exc:  # a missing package or module: said in its row
            row["status"] = f"not run: {type(exc).__name__}: {exc}"
        out[label] = row
        print(f"{label}: {row.get('capabilities', row['status'])}", flush=True)
    return out


def _cell(cap: Any) -> str:
    if cap is None:
        return "not implemented"
    mark = "pass" if cap["ok"] else "**FAIL**"
    return f"{mark} {cap['passed']}/{cap['passed'] + cap['failed']}"


def markdown(data: dict[str, Any], params: dict[str, Any]) -> str:
    """The langgraph_conformance block: one row per saver, one column per capability."""
    servers = f"redis-server {params['plain_server']}" + (
        f"; langgraph-checkpoint-redis on Redis {params['stack_server']} with RedisJSON + RediSearch"
        if params.get("stack_server")
        else ""
    )
    lines = [
        f"LangGraph's conformance suite (langgraph-checkpoint-conformance {params['suite']}), each saver on a "
        f"fresh namespace; {servers}. A cell is the capability's verdict and its tests passed / run.",
        "",
        "| saver | " + " | ".join(CAPABILITIES) + " | base 5/5 | capabilities passed |",
        "| --- | " + " | ".join("---" for _ in CAPABILITIES) + " | --- | --- |",
    ]
    for label, row in data.items():
        name = f"{label} {row['version']}" if row.get("version") else label
        if row["status"] != "ok":
            lines.append(f"| {name} | {row['status']} | " + " | ".join("-" for _ in CAPABILITIES[1:]) + " | - | - |")
            continue
        caps = row["capabilities"]
        passed = sum(1 for c in CAPABILITIES if caps.get(c) and caps[c]["ok"])
        base = sum(1 for c in BASE if caps.get(c) and caps[c]["ok"])
        lines.append(
            f"| {name} | "
            + " | ".join(_cell(caps.get(c)) for c in CAPABILITIES)
            + f" | {'yes' if row['base_ok'] else 'no'} ({base}/5) | {passed}/{len(CAPABILITIES)} |"
        )
    return "\n".join(lines)


def _server_version(url: str) -> str:
    with redis.Redis.from_url(url) as client:
        return str(client.info("server")["redis_version"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.langgraph_conformance", description=__doc__)
    p.add_argument("--stack-url", help="a Redis with RedisJSON + RediSearch, for langgraph-checkpoint-redis")
    p.add_argument("--readme", action="store_true", help="rewrite the langgraph_conformance block")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        meta = run_meta(
            command_line("python -m benchmarks.langgraph_conformance", argv), redis.Redis.from_url(server.url)
        )
        data = run(server.url, args.stack_url)
        params = {
            "suite": version_of("langgraph-checkpoint-conformance"),
            "plain_server": _server_version(server.url),
            "stack_server": _server_version(args.stack_url) if args.stack_url else None,
        }
    finally:
        server.stop()
    print()
    print(markdown(data, params))
    if args.readme:
        report.publish(meta, "langgraph_conformance", data, params)
    ours = [r for label, r in data.items() if label.startswith("redis_agentstate")]
    return 0 if all(r["status"] == "ok" and r["base_ok"] for r in ours) else 1


if __name__ == "__main__":
    raise SystemExit(main())
