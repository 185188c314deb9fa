"""What a LangGraph thread costs in each key layout, from the bytes the saver really stores.

``python -m benchmarks.lg_layouts [--steps 400] [--workload input-once|rewrite]``: on a private
redis-server, runs the langgraph figure's workload for one thread through ``AgentStateSaver``,
then copies the thread's stored checkpoints (records and pending writes) into scratch keys laid
out another way, and prints each layout's ``MEMORY USAGE`` (the values hash is the same in all):

- ``records hash + index + writes hash``: the layout of earlier versions;
- ``records in the index``: one sorted-set entry per checkpoint, ``<member>\\0<record>``, + writes hash;
- ``writes in the record``: records hash whose values carry their checkpoint's writes + index;
- ``records and writes in the index``: one sorted-set entry per checkpoint (this version's, as stored).

And the floor of any layout with one Redis entry per checkpoint (what every saver compared does),
printed under it: ``a bare entry per checkpoint`` (a sorted set of the checkpoints' 16-byte ids,
nothing else: no record, no versions, no writes), ``+ the thread's values once`` (with one string
holding every message the thread ever held, once, and its other state: what no layout can store
less of without compression), and ``+ id, parent and ts in each entry`` (each entry 40 bytes: a
record at its least, still without metadata, versions or pending writes). What a goal of "50x
smaller than the best peer" is held to.

A measurement for a design decision (which layout brings a 400-step thread under 1 MiB), not a
figure of the main harness; it prints, and writes nothing to the README.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import redis

from redis_agentstate.embedded import start_embedded
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import AgentStateSaver
from redis_agentstate.langgraph._records import _entry_member, _held_writes, _length_at

from .langgraph_savers import WORKLOADS, _graph, step_input


def _fill(client: redis.Redis, steps: int, workload: str) -> tuple[AgentStateSaver, Any]:
    saver = AgentStateSaver(client, namespace="layouts")
    graph = _graph(saver, workload)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    for step in range(1, steps + 1):
        graph.invoke(step_input(step), config)
    return saver, Keys("layouts").thread("t")


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


def floor(client: redis.Redis, keys: Any, values: dict[str, Any]) -> dict[str, int]:
    """MEMORY USAGE of the floor of a one-entry-per-checkpoint layout (see the module docstring): the
    thread's checkpoints as bare 16-byte ids, and with its channel ``values`` (its newest state: every
    message it ever held) stored once as one string (bytes)."""
    n = int(client.zcard(keys.index)) + int(client.hlen(keys.records))
    ids, linked, content = (f"{keys.records}:floor-{x}" for x in ("ids", "linked", "values"))
    client.delete(ids, linked, content)
    with client.pipeline(transaction=False) as p:
        for _ in range(n):
            p.zadd(ids, {uuid.uuid4().bytes: 0})
            # A record at its least: the id, the parent's id and the timestamp (no metadata, no versions).
            p.zadd(linked, {uuid.uuid4().bytes + uuid.uuid4().bytes + b"\0" * 8: 0})
        p.set(content, b"".join(str(v).encode() for v in (*values["messages"], values.get("other", ""))))
        p.execute()
    bare, least = (int(client.memory_usage(k, samples=0) or 0) for k in (ids, linked))
    once = int(client.memory_usage(content) or 0)
    client.delete(ids, linked, content)
    return {
        "a bare entry per checkpoint": bare,
        "+ the thread's values once": bare + once,
        "+ id, parent and ts in each entry": least + once,
    }


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
        saver, keys = _fill(client, args.steps, args.workload)
        got = layouts(client, keys)
        values = got["values (the same in every layout)"]
        print(f"{args.workload}, {args.steps} steps, MEMORY USAGE (KiB; with the values: MiB per thread):")
        for name, n in got.items():
            total = "" if name.startswith("values") else f"  -> {(n + values) / 2**20:.2f} MiB per thread"
            print(f"  {name:34s} {n / 1024:7.0f}{total}")
        state = _graph(saver, args.workload).get_state({"configurable": {"thread_id": "t"}}).values
        print("floor of one entry per checkpoint (KiB; the whole thread):")
        for name, n in floor(client, keys, state).items():
            print(f"  {name:34s} {n / 1024:7.0f}  =  {n / 2**20:.3f} MiB per thread")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
