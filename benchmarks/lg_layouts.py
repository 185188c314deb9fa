"""What a LangGraph thread costs in each key layout, from the bytes the saver really stores.

``python -m benchmarks.lg_layouts [--steps 400] [--workload input-once|rewrite]``: on a private
redis-server, runs the langgraph figure's workload for one thread through ``AgentStateSaver``,
then copies the thread's stored checkpoints (records and pending writes) into scratch keys laid
out another way, and prints each layout's ``MEMORY USAGE`` (the values hash is the same in all):

- ``records hash + index + writes hash``: the layout of earlier versions;
- ``records in the index``: one sorted-set entry per checkpoint, ``<member>\\0<record>``, + writes hash;
- ``writes in the record``: records hash whose values carry their checkpoint's writes + index;
- ``records and writes in the index``: one sorted-set entry per checkpoint (this version's, as stored).

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
from redis_agentstate.langgraph._records import _entry_member, _held_writes, _length_at

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
    """MEMORY USAGE of the thread's checkpoints (records and writes) in each layout (bytes)."""
    records: dict[bytes, bytes] = {}
    writes: dict[bytes, bytes] = dict(client.hgetall(keys.writes))
    for entry in client.zrange(keys.index, 0, -1):
        member = _entry_member(entry)
        stored = entry[len(member) + 1 :]
        held, body_at = _held_writes(stored, keys.index)
        head = _length_at(stored, 0)
        assert head is not None
        records[member] = stored[: head[1] + head[0]] + stored[body_at:]
        if held:
            writes[member] = held

    def usage(*names: str) -> int:
        return sum(int(client.memory_usage(n, samples=0) or 0) for n in names)

    h, z, w, hw, zr, zrw = (f"{keys.records}:x{i}" for i in range(6))
    client.delete(h, z, w, hw, zr, zrw)
    with client.pipeline(transaction=False) as p:
        for member, record in records.items():
            held = writes.get(member, b"")
            p.hset(h, member, record)
            p.zadd(z, {member: 0})
            if held:
                p.hset(w, member, held)
            p.hset(hw, member, _with(record, held))
            p.zadd(zr, {member + b"\0" + record: 0})
            p.zadd(zrw, {member + b"\0" + _with(record, held): 0})
        p.execute()
    out = {
        "records hash + index + writes hash": usage(h, z, w),
        "records in the index": usage(zr, w),
        "writes in the record": usage(hw, z),
        "records and writes in the index": usage(zrw),
        "as stored": usage(keys.index, keys.records, keys.writes),
        "values (the same in every layout)": usage(keys.blobs),
    }
    client.delete(h, z, w, hw, zr, zrw)
    return out


def _with(record: bytes, held: bytes) -> bytes:
    head = _length_at(record, 0)
    assert head is not None
    at = head[1] + head[0]
    return record[:at] + (b"W%d:%s" % (len(held), held) if held else b"") + record[at:]


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
