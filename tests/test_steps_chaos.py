"""Durable steps under SIGKILL (issue 25): a step's side effect is not done again by the retry.

3 ``Runner`` processes (``faults/steps_worker.py``) take TASKS tasks through CYCLES cycles, one
durable step per cycle whose every run is counted in db 1; one worker is SIGKILLed about every
1.5 s for ``STEPS_CHAOS_SECONDS`` (default 10) and respawned. Each re-run of a step's ``fn``
is classified by what the attempt before it got to:

* it saw its step recorded: the retry must not have run ``fn`` (``after_recorded``, must be 0);
* it was killed inside ``fn``, after its effect (``inside_fn``): the one case a durable step
  cannot cover; the downstream service, given the step's idempotency key, dedupes it, so the
  effects it applied (``applied``: SET NX by the key) are exactly one per step;
* ``fn`` returned but the worker died before the record's round trip answered (``in_record``).

The figures are printed (run with ``-s``)::

    .venv/bin/python -m pytest tests/test_steps_chaos.py -n 0 -s -m chaos
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_agentstate import Checkpoint, CheckpointStore

WORKER = Path(__file__).parent / "faults" / "steps_worker.py"
TASKS = 40
CYCLES = 5
WORKERS = 3


def classify(side: redis.Redis) -> dict[str, int]:
    """Counts of step runs, split by why a step ran more than once (see the module docstring)."""
    out = {"steps": 0, "runs": 0, "after_recorded": 0, "inside_fn": 0, "in_record": 0, "applied": 0}
    for raw_key in side.scan_iter("runs:*", count=1000):
        key = raw_key.decode()[len("runs:") :]
        tokens = [t.decode() for t in side.lrange(raw_key, 0, -1)]
        out["steps"] += 1
        out["runs"] += len(tokens)
        for token in tokens[:-1]:  # every run but the last was followed by another
            if side.exists(f"recorded:{key}:{token}"):
                out["after_recorded"] += 1
            elif side.exists(f"returned:{key}:{token}"):
                out["in_record"] += 1
            else:
                out["inside_fn"] += 1
    out["applied"] = sum(1 for _ in side.scan_iter("applied:*", count=1000))
    return out


# Not slow: ten seconds of SIGKILLs, the default run's fault-injection run (the chaos fleet and the
# failover series are the full suite's).
@pytest.mark.chaos
@pytest.mark.real
def test_steps_are_not_run_again_after_a_sigkill(private_server: Any, tmp_path: Path) -> None:
    seconds = float(os.environ.get("STEPS_CHAOS_SECONDS", "10"))
    rng = random.Random(int(os.environ.get("STEPS_CHAOS_SEED", "25")))
    ns = f"steps-chaos-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(private_server.url)
    side = redis.Redis.from_url(private_server.url, db=1)
    store = CheckpointStore(client, namespace=ns)
    for i in range(TASKS):
        store.create(Checkpoint(f"task-{i}"))
    procs: dict[int, subprocess.Popen[bytes]] = {}
    spawned = 0

    def spawn(i: int) -> None:
        nonlocal spawned
        spawned += 1
        log = open(tmp_path / f"worker-{i}-{spawned}.log", "wb")  # noqa: SIM115 (the child owns it)
        args = [sys.executable, str(WORKER), private_server.url, ns, str(CYCLES), str(spawned)]
        procs[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def finished() -> bool:
        return all((cp := store.load(f"task-{i}")) is not None and cp.is_terminal for i in range(TASKS))

    kills = 0
    started = time.monotonic()
    try:
        for i in range(WORKERS):
            spawn(i)
        while time.monotonic() - started < seconds and not finished():
            time.sleep(rng.uniform(1.0, 2.0))
            victim = rng.randrange(WORKERS)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills += 1
            spawn(victim)
        deadline = time.monotonic() + 120
        while not finished():
            assert time.monotonic() < deadline, "the fleet did not finish the tasks"
            time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    counts = classify(side)
    report = {"kills": kills, "seconds": round(elapsed, 1), **counts}
    print("\nsteps chaos:", json.dumps(report))
    for i in range(TASKS):
        cp = store.load(f"task-{i}")
        assert cp is not None and cp.messages == list(range(1, CYCLES + 1)), cp
    assert counts["steps"] == TASKS * CYCLES
    assert counts["after_recorded"] == 0, report  # a recorded step never runs again
    assert counts["applied"] == TASKS * CYCLES, report  # the idempotency key dedupes the rest downstream
    assert kills >= 3
    client.close()
    side.close()
