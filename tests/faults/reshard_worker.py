"""One reshard of the operator-race test (``tests/test_reshard_races.py``; never run by hand)::

    python reshard_worker.py TARGET NAMESPACE SHARDS PHASE LEASE_MS BATCH

``TARGET``: a ``redis://`` URL, or ``cluster://host:port`` for a local Cluster. Runs
``CheckpointStore.reshard(SHARDS)`` with a lease of ``LEASE_MS`` and batches of ``BATCH`` keys.
With a ``PHASE`` other than ``-`` it stops at that point between two of the reshard's steps,
prints ``PHASE <name>`` and waits for a line on stdin (the test kills it there, or freezes it
with SIGSTOP and wakes it later):

* ``record``: after the record says the reshard started;  ``seal``: after the first seal;
* ``dumped``: with old shard 0 read (DUMP), before its first copy is written;
* ``copy``: after the first copy was written;  ``drop``: after the first delete batch;
* ``final``: before the record says the reshard is done.

Prints ``DONE <moved> <keys>`` and exits 0, or prints ``CONFLICT <message>`` and exits 3 on a
``ConfigConflict`` (another reshard holds the namespace, or fenced this one out).
"""

from __future__ import annotations

import sys
from typing import Any

import redis
from redis.cluster import RedisCluster

from redis_agentstate import CheckpointStore, ConfigConflict
from redis_agentstate.core import reshard as _reshard
from redis_agentstate.core.reshard import reshard


def _client(target: str) -> Any:
    if target.startswith("cluster://"):
        host, _, port = target.removeprefix("cluster://").rpartition(":")
        return RedisCluster(host=host, port=int(port))
    return redis.Redis.from_url(target)


def _phase_of(req: Any, reply: Any, before: bool, shards: int) -> str | None:
    script = getattr(req, "script", None)
    probe = script == "reshard_restore" and any(b"reshard-probe" in _bytes(k) for k in req.keys)
    if before:
        if script == "reshard_restore" and not probe:
            return "dumped"
        if script == "reshard_record" and str(req.args[-1]) == f"slots {shards}":
            return "final"
        return None
    if script == "reshard_record" and str(req.args[-1]).endswith(" 0"):
        return "record"
    if script == "reshard_seal":
        return "seal"
    if script == "reshard_restore" and not probe:
        return "copy"
    if script == "reshard_drop":
        return "drop"
    return None


def _bytes(key: Any) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode()


def _watched(op: Any, stop_at: str, shards: int) -> Any:
    """``op``, stopping once at ``stop_at`` (see the module docstring)."""
    stopped = False

    def maybe(req: Any, reply: Any, before: bool) -> None:
        nonlocal stopped
        if not stopped and _phase_of(req, reply, before, shards) == stop_at:
            stopped = True
            print(f"PHASE {stop_at}", flush=True)
            sys.stdin.readline()

    try:
        req = next(op)
    except StopIteration as stop:
        return stop.value
    while True:
        maybe(req, None, True)
        try:
            reply = yield req
        except BaseException as exc:
            try:
                req = op.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        maybe(req, reply, False)
        try:
            req = op.send(reply)
        except StopIteration as stop:
            return stop.value


def main() -> None:
    target, namespace, shards, phase = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    _reshard.LEASE_MS = int(sys.argv[5])
    _reshard._BATCH_KEYS = int(sys.argv[6])
    store = CheckpointStore(_client(target), namespace=namespace)
    try:
        if phase == "-":
            report = store.reshard(shards)
        else:
            report = store._reshard(
                lambda keys, cluster: _watched(reshard(keys, shards, cluster=cluster), phase, shards)
            )
    except ConfigConflict as exc:
        print(f"CONFLICT {exc}", flush=True)
        sys.exit(3)
    print(f"DONE {report.moved} {report.keys}", flush=True)


if __name__ == "__main__":
    main()
