"""LangGraph runs under faults: workers SIGKILLed and SIGSTOPped, Redis restarted, double-texts and cancels.

Three worker processes (``faults/lg_runs_worker.py``, two threads or tasks each, one of them on
asyncio, 1.5 s leases) execute the
runs of 12 threads, which a client keeps creating (``enqueue`` mostly, some ``interrupt``,
``rollback`` and ``reject``) and now and then cancelling, while a nemesis kills or freezes a
worker or restarts Redis (AOF, fsync always: a restart keeps what was acknowledged). Then the
fleet settles and the checker holds, from the workers' histories and what Redis keeps:

1. **Every run reaches one final status**: each run created is final (or gone, only if a rollback
   asked for it), and its stream holds exactly one ``end`` event, last, saying that status.
2. **No saved node runs again, none is lost**: each node execution appends its own id to the
   thread's log; the final log holds each (run, node) at most once, every node of a ``success``
   run exactly once, none of a rolled-back run, and no execution of a (run, node) started after
   the saved one ended.
3. **No run executes on two workers at once**: the saved executions of one thread never overlap
   in time (one monotonic clock for every process), and runs of a thread are saved in creation
   order.
4. **No event is lost or duplicated**: a stream read from the start has unique, increasing ids;
   each attempt opens with one ``metadata`` event, attempts counted 1, 2, ... in order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServerProcess

from redis_agentstate import BackendError, RetryPolicy
from redis_agentstate.langgraph import AgentStateSaver, RunNotFound, RunQueue, RunRejected

WORKER = Path(__file__).parent / "faults" / "lg_runs_worker.py"
NODES = "abcd"
WORKERS = 3
#: This one runs on asyncio (AsyncRunQueue, AsyncAgentStateSaver, astream), beside two sync ones.
ASYNC_WORKER = 2
THREADS = [f"th-{i:02d}" for i in range(12)]
SERVER_ARGS = ("--appendonly", "yes", "--appendfsync", "always")
CHAOS_S = float(os.environ.get("LG_RUNS_CHAOS_SECONDS", "25"))


class Fleet:
    def __init__(self, base: Path, ns: str) -> None:
        self.base, self.ns = base, ns
        (base / "redis").mkdir()
        self.server = RedisServerProcess.start(*SERVER_ARGS, dir=str(base / "redis"))
        self.port = self.server.port
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.spawns: dict[int, int] = {}
        self.faults: dict[str, int] = defaultdict(int)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def spawn(self, i: int) -> None:
        self.spawns[i] = self.spawns.get(i, 0) + 1
        name = f"w{i}.{self.spawns[i]}"
        log = open(self.base / f"worker-{i}.log", "ab")  # noqa: SIM115 - handed to the child
        args = [sys.executable, str(WORKER), self.url, self.ns, str(self.base / f"history-{name}.jsonl"), name,
                str(i * 1000 + self.spawns[i]), "async" if i == ASYNC_WORKER else "sync"]  # fmt: skip
        self.procs[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def restart_redis(self) -> None:
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()
        self.server = RedisServerProcess.start(*SERVER_ARGS, port=self.port, dir=str(self.base / "redis"))

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
        self.server.stop(remove=False)


def _busy(fleet: Fleet) -> list[int]:
    """The workers with a node under way: the last line of their history is a node's start."""
    busy = []
    for i, spawn in fleet.spawns.items():
        path = fleet.base / f"history-w{i}.{spawn}.jsonl"
        with contextlib.suppress(OSError):
            lines = path.read_bytes()[-400:].splitlines()
            if lines and b'"kind": "start"' in lines[-1]:
                busy.append(i)
    return busy


def _nemesis(fleet: Fleet, rng: random.Random, deadline: float) -> None:
    plan = ["kill", "pause", "redis_restart"]
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1.0, 2.0))
        kind = plan.pop(0) if plan else rng.choice(("kill", "kill", "pause", "pause", "redis_restart"))
        fleet.faults[kind] += 1
        # Mostly a worker inside a node, so that a fault lands on a run (on a loaded machine the
        # workers idle more, and a run of faults that all missed left nothing to take over); now and
        # then any worker, so that freezes between two nodes and of idle workers happen too.
        busy = _busy(fleet)
        i = rng.choice(busy) if busy and rng.random() < 0.75 else rng.randrange(WORKERS)
        if kind == "kill":
            fleet.procs[i].send_signal(signal.SIGKILL)
            fleet.procs[i].wait()
            fleet.spawn(i)
        elif kind == "pause":
            fleet.procs[i].send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(2.0, 3.5))  # past the 1.5 s lease: its runs are taken over meanwhile
            fleet.procs[i].send_signal(signal.SIGCONT)
        else:
            fleet.restart_redis()


class Client:
    """Creates runs and cancels some, recording what it was told (unknown outcomes included)."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.queue = RunQueue(redis.Redis.from_url(fleet.url, socket_timeout=3), namespace=fleet.ns,
                              retry=RetryPolicy(attempts=3, max_wait_s=0.3))  # fmt: skip
        self.rng = rng
        #: run id -> (thread, strategy, created at)
        self.created: dict[str, tuple[str, str, float]] = {}
        self.rejected = 0
        self.unknown = 0
        self.rollbacks: dict[str, list[float]] = defaultdict(list)  # thread -> when a rollback was asked
        self.cancelled: dict[str, str] = {}

    def act(self) -> None:
        tid = self.rng.choice(THREADS)
        strategy = self.rng.choices(("enqueue", "interrupt", "rollback", "reject"), (6, 1, 1, 1))[0]
        try:
            if self.created and self.rng.random() < 0.1:
                rid = self.rng.choice(list(self.created))
                action = self.rng.choice(("interrupt", "rollback"))
                if action == "rollback":
                    self.rollbacks[self.created[rid][0]].append(time.monotonic())
                self.queue.cancel(rid, action=action)
                self.cancelled[rid] = action
                return
            if strategy == "rollback":
                self.rollbacks[tid].append(time.monotonic())
            run = self.queue.create(tid, {"log": []}, multitask_strategy=strategy, stream_mode=["updates"])
            self.created[run.run_id] = (tid, strategy, time.monotonic())
        except RunRejected:
            self.rejected += 1
        except (BackendError, RunNotFound):
            self.unknown += 1  # Redis restarting: the create may or may not have applied


def _histories(base: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(base.glob("history-*.jsonl")):
        for line in path.read_text("utf-8").splitlines():
            if line.endswith("}"):  # a SIGKILL may cut the last line short
                out.append(json.loads(line))
    return out


def check(queue: RunQueue, saver: AgentStateSaver, client: Client, histories: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    execs: dict[str, dict[str, Any]] = {}
    for h in histories:
        execs.setdefault(h["exec"], {}).update({k: v for k, v in h.items() if k != "t"}, **{h["kind"]: h["t"]})
    runs = {rid: queue.get(rid) for rid in client.created}
    # 1. every run final, one end event, last
    for rid, run in runs.items():
        tid, _strategy, _at = client.created[rid]
        if run is None:
            if not client.rollbacks.get(tid):
                errors.append(f"run {rid} of {tid} is gone without a rollback")
            continue
        if not run.done:
            errors.append(f"run {rid} is {run.status}, not final")
            continue
        evs = list(queue.stream(rid, block_ms=0))
        ends = [e for e in evs if e.event == "end"]
        if len(ends) != 1 or evs[-1].event != "end" or ends[0].data["status"] != run.status:
            errors.append(f"run {rid}: {len(ends)} end events, last {evs[-1].event if evs else None}")
        ids = [e.id for e in evs]
        key = [tuple(int(x) for x in i.split("-")) for i in ids]
        if len(set(ids)) != len(ids) or key != sorted(key):
            errors.append(f"run {rid}: stream ids repeat or go back")
        attempts = [e.data["attempt"] for e in evs if e.event == "metadata"]
        if attempts != list(range(1, len(attempts) + 1)) or (attempts and attempts[-1] != run.attempt):
            errors.append(f"run {rid}: attempts {attempts}, run says {run.attempt}")
    # 2 and 3: the saved executions, thread by thread
    for tid in THREADS:
        tup = saver.get_tuple({"configurable": {"thread_id": tid}})
        log = [] if tup is None else list(tup.checkpoint["channel_values"].get("log", []))
        saved: dict[tuple[str, str], str] = {}
        order: list[str] = []
        for entry in log:
            rid, node, exec_id = entry.split(":")
            if (rid, node) in saved:
                errors.append(f"{tid}: node {node} of run {rid} saved twice")
            saved[(rid, node)] = exec_id
            if not order or order[-1] != rid:
                order.append(rid)
        if len(order) != len(set(order)):
            errors.append(f"{tid}: runs interleave in the saved log: {order}")
        created_order = sorted((r for r in order if r in client.created), key=lambda r: client.created[r][2])
        if [r for r in order if r in client.created] != created_order:
            errors.append(f"{tid}: runs saved out of creation order")
        for rid in order:
            run = runs.get(rid)
            if run is None and rid in client.created and not client.rollbacks.get(tid):
                errors.append(f"{tid}: run {rid} has saved nodes but is gone")
        for rid, run in runs.items():
            if run is not None and run.thread_id == tid and run.status == "success":
                missing = [n for n in NODES if (rid, n) not in saved]
                if missing:
                    errors.append(f"{tid}: success run {rid} lacks saved nodes {missing}")
        intervals = []
        for (rid, node), exec_id in saved.items():
            e = execs.get(exec_id)
            if e is None or "end" not in e:
                errors.append(f"{tid}: saved execution {exec_id} ({rid}:{node}) has no recorded end")
                continue
            intervals.append((e["start"], e["end"], exec_id))
            later = [x for x in execs.values() if x.get("run") == rid and x.get("node") == node
                     and x["exec"] != exec_id and x.get("start", 0) > e["end"]]  # fmt: skip
            if later:
                errors.append(f"{tid}: node {node} of run {rid} ran again after its saved execution")
        intervals.sort()
        for (_s1, e1, x1), (s2, _e2, x2) in itertools.pairwise(intervals):
            if s2 < e1:
                errors.append(f"{tid}: saved executions {x1} and {x2} overlap")
    return errors


@pytest.mark.real
@pytest.mark.slow
def test_runs_survive_kills_freezes_and_redis_restarts(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("LG_RUNS_CHAOS_SEED", "7")))
    fleet = Fleet(tmp_path, f"lgchaos-{rng.randrange(10**6)}")
    try:
        for i in range(WORKERS):
            fleet.spawn(i)
        client = Client(fleet, rng)
        deadline = time.monotonic() + CHAOS_S
        nemesis = threading.Thread(target=_nemesis, args=(fleet, random.Random(rng.random()), deadline))
        nemesis.start()
        while time.monotonic() < deadline:
            client.act()
            time.sleep(rng.uniform(0.02, 0.15))
        nemesis.join()
        for i, p in fleet.procs.items():
            if p.poll() is not None:
                fleet.spawn(i)
        queue = RunQueue(redis.Redis.from_url(fleet.url), namespace=fleet.ns)
        settle = time.monotonic() + 90
        for rid in list(client.created):
            with contextlib.suppress(RunNotFound):  # rolled back
                queue.join(rid, timeout_s=max(1.0, settle - time.monotonic()))
        histories = _histories(tmp_path)
        saver = AgentStateSaver(redis.Redis.from_url(fleet.url), namespace=fleet.ns)
        errors = check(queue, saver, client, histories)
        statuses = defaultdict(int)
        for rid in client.created:
            run = queue.get(rid)
            statuses["gone" if run is None else run.status] += 1
        taken_over = sum(1 for rid in client.created if (r := queue.get(rid)) is not None and r.attempt > 1)
        print(f"\nruns {len(client.created)} ({dict(statuses)}), rejected {client.rejected}, unknown "
              f"{client.unknown}, cancels {len(client.cancelled)}, taken over {taken_over}, node executions "
              f"{sum(1 for h in histories if h['kind'] == 'start')}, faults {dict(fleet.faults)}")  # fmt: skip
        assert not errors, "\n".join(errors[:30])
        assert len(client.created) >= 50 and statuses["success"] >= 20
        assert fleet.faults["kill"] and fleet.faults["pause"] and fleet.faults["redis_restart"]
        assert taken_over >= 1, "no run was taken over: the faults missed every run"
    finally:
        fleet.stop()
