"""What a LangGraph thread would cost in other key layouts, from the bytes the saver really stores.

``python -m benchmarks.lg_layouts [--steps 400] [--workload input-once|rewrite]``: on a private
redis-server, runs the langgraph figure's workload for one thread through ``AgentStateSaver``,
then copies the thread's stored records, index and pending writes into scratch keys laid out
another way, and prints each layout's ``MEMORY USAGE`` (the values hash is the same in all):

- ``as stored``: records hash + index sorted set + writes hash (the saver's layout);
- ``records in the index``: one sorted-set entry per checkpoint, ``<member>\\0<record>``, + writes hash;
- ``writes in the record``: records hash whose values carry their checkpoint's writes + index;
- ``both``: one sorted-set entry per checkpoint holding its record and its writes.

A measurement for a design decision (which layout brings a 400-step thread under 1 MiB), not a
figure of the main harness; it prints, and writes nothing to the README.
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from redis_agentstate.embedded import start_embedded
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import AgentStateSaver

from .langgraph_savers import MESSAGE, OTHER, WORKLOADS, _graph


def _fill(client: redis.Redis, steps: int, workload: str) -> Keys:
    saver = AgentStateSaver(client, namespace="layouts")
    graph = _graph(saver, workload)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    for step in range(1, steps + 1):
        payload: dict[str, Any] = {"messages": [f"user {step:05d} " + "u" * (MESSAGE - 11)]}
        if step == 1:
            payload["other"] = OTHER
        graph.invoke(payload, config)
    return Keys("layouts")


def layouts(client: redis.Redis, keys: Any) -> dict[str, int]:
    """MEMORY USAGE of the thread's records, index and writes in each layout (bytes)."""
    records: dict[bytes, bytes] = client.hgetall(keys.records)
    writes: dict[bytes, bytes] = client.hgetall(keys.writes)

    def usage(*names: str) -> int:
        return sum(int(client.memory_usage(n, samples=0) or 0) for n in names)

    scratch = [f"{keys.records}:x{i}" for i in range(4)]
    client.delete(*scratch)
    with client.pipeline(transaction=False) as p:
        for member, record in records.items():
            w = writes.get(member, b"")
            p.zadd(scratch[0], {member + b"\0" + record: 0})
            p.hset(scratch[1], member, record + w)
            p.zadd(scratch[2], {member + b"\0" + record + w: 0})
        p.execute()
    out = {
        "as stored": usage(keys.records, keys.index, keys.writes),
        "records in the index": usage(scratch[0], keys.writes),
        "writes in the record": usage(scratch[1], keys.index),
        "both": usage(scratch[2]),
        "values (the same in every layout)": usage(keys.blobs),
    }
    client.delete(*scratch)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lg_layouts", description=__doc__)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--workload", choices=WORKLOADS, default="input-once")
    args = p.parse_args(argv)
    server = start_embedded(prefer="redis-server")
    try:
        client = redis.Redis.from_url(server.url)
        keys = _fill(client, args.steps, args.workload).thread("t")
        got = layouts(client, keys)
        values = got["values (the same in every layout)"]
        print(f"{args.workload}, {args.steps} steps, MEMORY USAGE (KiB; with the values: MiB per thread):")
        for name, n in got.items():
            total = "" if name.startswith("values") else f"  -> {(n + values) / 2**20:.2f} MiB per thread"
            print(f"  {name:34s} {n / 1024:7.0f}{total}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
