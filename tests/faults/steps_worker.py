"""One worker of the durable-steps chaos test (``tests/test_steps_chaos.py``; never run by hand)::

    python steps_worker.py URL NAMESPACE CYCLES SEED

A ``Runner`` whose two-parameter handler runs one durable step per cycle
(``cycle.step("effect", ...)``), then works a while before its commit, so that
a SIGKILL lands either inside the step's ``fn`` (after its effect) or after the
step was recorded. Every side effect is counted in db 1 of the same server,
apart from the checkpoints:

* ``runs:<step key>``      list   the token of every run of ``fn`` (its effect happened);
* ``applied:<step key>``   string the downstream service's record: SET NX by the idempotency key;
* ``returned:<key>:<tok>`` string ``fn`` of that attempt returned (before the step recorded it);
* ``recorded:<key>:<tok>`` string the handler saw the step return: it was recorded.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from typing import Any

import redis

from redis_agentstate import AgentStatus, Checkpoint, CheckpointStore, Runner, StepResult
from redis_agentstate.runner import Cycle

LEASE_MS = 1000


def main() -> None:
    url, namespace, cycles, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    logging.basicConfig(level=logging.CRITICAL)
    store = CheckpointStore(redis.Redis.from_url(url), namespace=namespace)
    side = redis.Redis.from_url(url, db=1)

    def effect(key: str, token: str, task_id: str, cycle: int) -> dict[str, Any]:
        side.rpush(f"runs:{key}", token)
        side.set(f"applied:{key}", token, nx=True)  # the downstream service dedupes by the key
        time.sleep(rng.uniform(0.01, 0.05))  # the call's latency: a kill here is a kill inside fn
        side.set(f"returned:{key}:{token}", 1)
        return {"task": task_id, "cycle": cycle, "pad": "x" * 256}

    def handler(cp: Checkpoint, cycle: Cycle) -> StepResult:
        key, token = cycle.step_key("effect"), cycle.lease.token
        out = cycle.step("effect", effect, key, token, cp.task_id, cp.claimed_cycle)
        side.set(f"recorded:{key}:{token}", 1)
        time.sleep(rng.uniform(0.05, 0.12))  # the rest of the cycle: a kill here must not re-run the step
        assert out["cycle"] == cp.claimed_cycle
        cp.messages.append(out["cycle"])
        if cp.claimed_cycle == cycles:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, len(cp.messages)
            return StepResult(cp, done=True)
        return StepResult(cp)

    Runner(
        store, handler, lease_ms=LEASE_MS, failure_delay_ms=20, idle_min_ms=10, idle_max_ms=100,
        max_consecutive_cycles=rng.choice([1, 3, 8]),
    ).run()  # fmt: skip


if __name__ == "__main__":
    main()
