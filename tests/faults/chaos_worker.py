"""One chaos worker process: a ``Runner`` whose every store call it records to a history file.

Run by ``tests/test_chaos.py`` (never by hand)::

    python chaos_worker.py --port P --namespace NS --history FILE --worker W [--skew-s S]

The Runner goes on with a task through ``commit_and_claim`` (recorded as a
commit and, when it applies, a claim) for up to 1, 3 or 8 cycles in a row
(chosen per process by its seed), so plain commits stay in the mix.
Poison tasks (``--max-attempts`` > 0 parks them): the handler raises on a
task named ``poison-raise-*`` (the Runner releases it with the exception as
the reason) and SIGKILLs its own process on a ``poison-kill-*`` one (a crash
on bad input: nothing is released, the lease lapses), before anything else.
A ``limit-*`` task (a ``concurrency_key`` under a limit) records the stretch it was held
(``op: hold``, checked by rule 10). The handler appends ``{"cycle": n, "token": t}`` to the
task's messages, and
records one pool message with idempotency key ``"<task>#<cycle>"``; after
``--done-at`` cycles it finalizes the task. The store is wrapped so that the
history has the outcome of every claim, commit and pool write, as seen by
this process:

* ``invoke`` written *before* the request is sent;
* ``ok`` / ``fail`` when Redis answered (``fail`` = definitely not applied:
  fenced out, or refused before sending);
* ``unknown`` when the call raised a connection error or timed out (it may
  or may not have applied). An ``invoke`` with no outcome (the process was
  SIGKILLed) is unknown too.

Each line is one JSON object with ``t`` = ``time.monotonic()`` (one clock for
every process on the machine). The file is line-buffered, so a SIGKILL loses
nothing already written. ``--skew-s`` shifts this process' wall clock
(``time.time`` / ``time.time_ns``) by that many seconds: leases are computed
from the server's TIME, so it must change nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from redis_agentstate import (
    AgentStateError,
    AgentStatus,
    BackendError,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    LeaseLost,
    RetryPolicy,
)
from redis_agentstate.pool_models import MessageReceipt, RunMessage
from redis_agentstate.pools import PoolStore
from redis_agentstate.runner import Runner, StepResult, current_lease

POOL_ID = "chaos-pool"


class History:
    def __init__(self, path: str, worker: str) -> None:
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()
        self.worker = worker

    def write(self, **entry: Any) -> None:
        entry["t"] = time.monotonic()
        entry["w"] = self.worker
        entry["pid"] = os.getpid()
        line = json.dumps(entry, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")


class RecordingStore(CheckpointStore):
    """A ``CheckpointStore`` that records claim_next and commit outcomes in the history."""

    history: History

    def claim_next(self, *, token: str, lease_ms: int, block_ms: int | None = None) -> Checkpoint | None:
        t0 = time.monotonic()
        cp = super().claim_next(token=token, lease_ms=lease_ms, block_ms=block_ms)
        if cp is not None:
            self.history.write(
                op="claim", type="ok", task=cp.task_id, cycle=cp.claimed_cycle, rev=cp.revision, token=token, t0=t0
            )
        return cp

    def commit(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        replace_history: bool = False,
        delay_ms: int | None = None,
    ) -> bool:
        op_id = uuid.uuid4().hex[:12]
        kind = "finalize" if cp.terminal_result is not None else "commit"
        last = cp.messages[-1] if cp.messages else None
        attempt = last.get("attempt") if isinstance(last, dict) else None
        base = {"op": "commit", "id": op_id, "task": cp.task_id, "cycle": cp.cycle_index, "token": token,
                "attempt": attempt}  # fmt: skip
        self.history.write(type="invoke", rev=expected_revision, final=kind == "finalize", **base)
        try:
            ok = super().commit(cp, token=token, expected_revision=expected_revision, replace_history=replace_history,
                                delay_ms=delay_ms)  # fmt: skip
        except BackendError as exc:
            self.history.write(type="unknown", error=type(exc).__name__, **base)
            raise
        except AgentStateError as exc:
            self.history.write(type="fail", error=type(exc).__name__, **base)
            raise
        self.history.write(type="ok" if ok else "fail", **base)
        return ok

    def commit_and_claim(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        lease_ms: int,
        next_token: str | None = None,
        replace_history: bool = False,
    ) -> Checkpoint | None:
        """A commit (recorded as such) that, when it applies, is also a claim of the next cycle."""
        op_id = uuid.uuid4().hex[:12]
        last = cp.messages[-1] if cp.messages else None
        attempt = last.get("attempt") if isinstance(last, dict) else None
        base = {"op": "commit", "id": op_id, "task": cp.task_id, "cycle": cp.cycle_index, "token": token,
                "attempt": attempt, "via": "commit_and_claim"}  # fmt: skip
        t0 = time.monotonic()
        self.history.write(type="invoke", rev=expected_revision, final=False, **base)
        try:
            nxt = super().commit_and_claim(
                cp, token=token, expected_revision=expected_revision, lease_ms=lease_ms, next_token=next_token,
                replace_history=replace_history,
            )  # fmt: skip
        except BackendError as exc:
            self.history.write(type="unknown", error=type(exc).__name__, **base)
            raise
        except ClaimRejected as exc:
            # Raised only for a re-send whose commit had applied; the claim was taken since.
            self.history.write(type="ok", claim_error=type(exc).__name__, **base)
            raise
        except AgentStateError as exc:
            self.history.write(type="fail", error=type(exc).__name__, **base)
            raise
        self.history.write(type="ok" if nxt is not None else "fail", **base)
        if nxt is not None:
            self.history.write(op="claim", type="ok", task=nxt.task_id, cycle=nxt.claimed_cycle, rev=nxt.revision,
                               token=nxt.claim_token, t0=t0, via="commit_and_claim")  # fmt: skip
        return nxt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--namespace", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--lease-ms", type=int, default=1000)
    p.add_argument("--done-at", type=int, default=1_000_000)
    p.add_argument("--done-at-small", type=int, default=4)
    p.add_argument("--skew-s", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zombie", action="store_true", help="also commit straight to the store, ignoring the lease")
    p.add_argument("--sentinels", default="", help="comma-separated Sentinel ports: reach the primary through them")
    p.add_argument("--service", default="agentstate-primary", help="the Sentinel service name")
    p.add_argument("--cluster-port", type=int, default=0, help="a Redis Cluster node: use a RedisCluster client")
    p.add_argument(
        "--remap", default="", help="'from:to,...': ports the Sentinel or the cluster names, reached at other ports"
    )
    p.add_argument("--wait-replicas", type=int, default=0, help="the stores' wait_replicas")
    p.add_argument("--wait-timeout-ms", type=int, default=500, help="the stores' wait_timeout_ms")
    p.add_argument("--max-attempts", type=int, default=0, help="the store's max_attempts (0: parking off)")
    args = p.parse_args(argv)

    if args.skew_s:
        real_time, real_time_ns = time.time, time.time_ns
        time.time = lambda: real_time() + args.skew_s  # type: ignore[assignment]
        time.time_ns = lambda: real_time_ns() + int(args.skew_s * 1e9)  # type: ignore[assignment]

    rng = random.Random(args.seed)
    history = History(args.history, args.worker)
    retry = Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 2)
    client: Any
    if args.sentinels:
        from redis.sentinel import Sentinel

        sentinels = [("127.0.0.1", int(port)) for port in args.sentinels.split(",")]
        remap = {int(a): int(b) for a, b in (pair.split(":") for pair in args.remap.split(",") if pair)}

        class RemappedSentinel(Sentinel):
            """The primary the Sentinels name, reached through the client-side proxy in front of it."""

            def discover_master(self, service_name: str) -> tuple[str, int]:
                host, port = super().discover_master(service_name)
                return host, remap.get(int(port), int(port))

        # A read timeout above two waits (WAIT, then WAITAOF) of wait_timeout_ms, as the stores require.
        timeout = max(1.0, 2.5 * args.wait_timeout_ms / 1000)
        client = RemappedSentinel(sentinels, socket_timeout=0.5).master_for(
            args.service, socket_timeout=timeout, socket_connect_timeout=1.0, retry=retry
        )
    elif args.cluster_port:
        from redis.cluster import RedisCluster

        timeout = max(1.0, 2.5 * args.wait_timeout_ms / 1000)
        ports = {int(a): int(b) for a, b in (pair.split(":") for pair in args.remap.split(",") if pair)}

        def address_remap(address: tuple[str, int]) -> tuple[str, int]:
            """A node the cluster announces, reached through the client-side proxy in front of it."""
            return address[0], ports.get(int(address[1]), int(address[1]))

        client = RedisCluster(
            host="127.0.0.1", port=args.cluster_port, socket_timeout=timeout, socket_connect_timeout=1.0, retry=retry,
            address_remap=address_remap,
        )  # fmt: skip
    else:
        client = redis.Redis(port=args.port, socket_timeout=1.0, socket_connect_timeout=1.0, retry=retry)
    policy = RetryPolicy(attempts=3, max_wait_s=0.2, max_delay_s=2.0)
    waits = {"wait_replicas": args.wait_replicas, "wait_timeout_ms": args.wait_timeout_ms}
    store = RecordingStore(
        client, namespace=args.namespace, retry=policy, max_attempts=args.max_attempts or None, **waits
    )
    store.history = history
    pools = PoolStore(client, namespace=args.namespace, retry=policy, **waits)
    history.write(op="start", type="ok", skew_s=args.skew_s, wall=time.time())

    def handler(cp: Checkpoint) -> StepResult:
        cycle = cp.claimed_cycle or 0
        lease = current_lease()
        assert lease is not None
        # The claim's server time and the due time it was claimed under: the checker holds every
        # committed cycle to "never claimed before it was due".
        claimed_at = (cp.lease_expires_at_ms or 0) - args.lease_ms
        seen = {"claimed_at": claimed_at, "due": cp.due_at_ms, "status": str(cp.status)}
        if cp.task_id.startswith("poison-raise-"):
            raise RuntimeError(f"poison: cannot handle {cp.task_id} (attempt {cp.attempts})")
        if cp.task_id.startswith("poison-kill-"):
            history.write(op="suicide", type="ok", task=cp.task_id, attempts=cp.attempts)
            os.kill(os.getpid(), signal.SIGKILL)
        begin = time.monotonic()
        time.sleep(rng.uniform(0.01, 0.12))  # "work"
        if cp.concurrency_key is not None:
            # A limited task: the stretch it was held, from the claim's return to a check that the lease
            # is live (rule 10 of the checker counts them per key). Only a stretch the check confirmed.
            try:
                lease.check()
            except LeaseLost:
                if not args.zombie:
                    raise
            else:
                history.write(op="hold", type="ok", task=cp.task_id, key=cp.concurrency_key, begin=begin,
                              end=time.monotonic())  # fmt: skip
        lease.check()
        key = f"{cp.task_id}#{cycle}"
        msg = RunMessage(message_id=key, idempotency_key=key, payload={"task": cp.task_id, "cycle": cycle})
        history.write(op="pool", type="invoke", key=key)
        try:
            pools.record_message(POOL_ID, msg, MessageReceipt(message_id=key, recipients=[args.worker]))
        except BackendError as exc:
            history.write(op="pool", type="unknown", key=key, error=type(exc).__name__)
            raise
        history.write(op="pool", type="ok", key=key)
        if not args.zombie:
            lease.check()
        cp.messages.append({"cycle": cycle, "token": lease.token, "attempt": uuid.uuid4().hex[:12], **seen})
        cp.cycles.append({"cycle": cycle, "w": args.worker})
        limit = args.done_at_small if cp.task_id.startswith("short-") else args.done_at
        done = cycle >= limit
        delay_ms: int | None = None
        # Lifecycle tasks: an ``ask-*`` task waits for a person every other cycle (half the time with a
        # deadline), whoever answers (the operator's resume, or the deadline); a ``timer-*`` task delays
        # each next cycle. Either way the next cycle comes back through claim_next.
        cp.status = AgentStatus.RUNNING
        # Priorities in the mix too (banded ready scores under every fault; the checker's rules hold
        # whatever order the work was served in): the lifecycle tasks, due now and then, take priority 1
        # or 2, which their commits move. Not the long tasks: always due, a higher priority there would
        # starve the rest of the fleet by design (priorities are strict).
        if cp.task_id.startswith(("ask-", "timer-")):
            cp.priority = rng.choice((1, 2))
        if cp.task_id.startswith("ask-") and cycle % 2 == 1:
            cp.status = AgentStatus.WAIT_USER
            delay_ms = rng.choice((None, 300, 800))
        elif cp.task_id.startswith("timer-"):
            delay_ms = rng.randint(50, 400)
        if done:
            cp.status = AgentStatus.COMPLETED
            cp.terminal_result = {"cycles": cycle}
            delay_ms = None
        if args.zombie:
            # A worker that ignores its lease: it writes straight away, whether or not
            # the lease is still alive (after a SIGSTOP it is not). Only the revision
            # fence in Redis stands between it and a newer claim. Then the Runner
            # writes the same cycle again (another attempt id): always fenced out.
            zombie = copy.deepcopy(cp)
            zombie.cycle_index = cycle
            store.commit(zombie, token=lease.token, expected_revision=lease.revision, delay_ms=delay_ms)
            cp.messages[-1] = dict(cp.messages[-1], attempt=uuid.uuid4().hex[:12])
        return StepResult(cp, done=done, delay_ms=delay_ms)

    runner = Runner(
        store, handler, lease_ms=args.lease_ms, idle_min_ms=20, idle_max_ms=200, failure_delay_ms=50,
        worker_id=args.worker, handle_signals=True, max_consecutive_cycles=rng.choice((1, 3, 8)),
    )  # fmt: skip
    stats = runner.run()
    history.write(op="stop", type="ok", **vars(stats))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
