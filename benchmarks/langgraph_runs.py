"""LangGraph runs on Redis: the queue's overhead, its event latency, a fleet's throughput, crash recovery.

``python -m benchmarks.langgraph_runs [--quick] [--readme] [--out DIR]``: on one private
redis-server, side by side in one run, four measurements of ``RunQueue`` + ``GraphWorker``:

1. **Overhead.** A 3-node graph with no I/O (each node appends to a list channel), each run on a
   fresh thread: ``graph.invoke`` in-process with ``AgentStateSaver`` as its checkpointer, against
   the same graph through the queue (``queue.create`` then ``queue.join``, one in-process
   ``GraphWorker`` thread with its default ``block_ms``). Interleaved rounds (A, B, A, B...); per
   round each path's p50 and p90 ms per run, and the round's p50 ratio; medians over rounds.
   Round trips per run count every request the library sent (the client's and the worker's).
2. **Event latency.** A node writes ``time.time()`` into custom events
   (its ``writer`` parameter), paced ``--gap-ms`` apart; a consumer thread tails
   ``queue.stream(run_id)`` and records receive time - emit time. The worker is a process of its
   own (``agentstate langgraph worker``), as in a deployment.
3. **Throughput.** 1, 2 and 4 worker processes (``python -m redis_agentstate langgraph worker
   benchmarks.langgraph_runs:GRAPH``), warmed up and idle, are frozen (SIGSTOP) while
   ``--threads`` threads get one run each, then thawed together (SIGCONT): runs/s from the thaw to
   the last run's end (its ``ended_at_ms``, the server's clock, the same machine's). Server time
   per run from ``INFO commandstats`` (the creates and the execution, each between two
   ``CONFIG RESETSTAT``): all commands' usec summed, and the scripts' alone; and the server
   process's CPU time (``/proc``).
4. **Crash recovery.** Two worker processes with ``--lease-ms``; a run whose middle node sleeps;
   the worker running it is SIGKILLed inside that node; timed from the SIGKILL to the run's second
   attempt starting (its second ``metadata`` event, as a tailing client receives it) and to its
   ``end``. The dead worker is replaced before the next repetition.

``--readme`` rewrites the ``langgraph_runs`` block of benchmarks/README.md (and
``results/langgraph_runs.json``, which it is rendered from).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import logging
import operator
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import redis
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import StreamWriter

import redis_agentstate
from redis_agentstate.embedded import start_embedded
from redis_agentstate.langgraph import AgentStateSaver, GraphWorker, RunQueue

from . import report
from ._util import (
    command_line,
    count_requests,
    finish_meta,
    percentile,
    proc_cpu_seconds,
    run_meta,
    server_pid_of,
    uncount_requests,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
NAME = "langgraph_runs"
MODULE = "benchmarks.langgraph_runs"

#: The targets the block states (judged on the figures named).
OVERHEAD_TARGET = 1.3  # queue p50 / invoke p50, median of the rounds' ratios
EVENT_P99_TARGET_MS = 20.0

# ---- the graphs (module level: the worker processes import them as benchmarks.langgraph_runs:ATTR) ----


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _append(name: str) -> Callable[[State], dict[str, Any]]:
    def node(state: State) -> dict[str, Any]:
        return {"log": [name]}

    return node


def _chain(*nodes: tuple[str, Callable[[State], dict[str, Any]]]) -> Any:
    b: Any = StateGraph(State)
    for name, fn in nodes:
        b.add_node(name, fn)
    b.add_edge(START, nodes[0][0])
    for (x, _), (y, _) in itertools.pairwise(nodes):
        b.add_edge(x, y)
    b.add_edge(nodes[-1][0], END)
    return b.compile()


#: Three nodes, no I/O: each appends its name to ``log``.
GRAPH = _chain(("a", _append("a")), ("b", _append("b")), ("c", _append("c")))


def _emit(state: State, config: RunnableConfig, writer: StreamWriter) -> dict[str, Any]:
    """Writes ``events`` custom events ``{"i", "t": time.time()}``, ``gap_ms`` apart, after ``lead_ms``."""
    conf, write = config["configurable"], writer
    time.sleep(conf.get("lead_ms", 0) / 1000)  # the consumer is tailing by then
    gap = conf.get("gap_ms", 5) / 1000
    for i in range(int(conf.get("events", 10))):
        write({"i": i, "t": time.time()})
        time.sleep(gap)
    return {"log": ["emit"]}


#: One node that streams timestamped custom events (configurable ``events``, ``gap_ms``, ``lead_ms``).
EVENTS = _chain(("emit", _emit))


def _sleepy(state: State, config: RunnableConfig, writer: StreamWriter) -> dict[str, Any]:
    """Says it started (a custom event), then sleeps ``sleep_s`` (configurable): the worker is killed here."""
    writer({"node": "b", "t": time.time()})
    time.sleep(float(config["configurable"].get("sleep_s", 1.0)))
    return {"log": ["b"]}


#: a -> b (sleeps) -> c: the crash-recovery graph.
CRASH = _chain(("a", _append("a")), ("b", _sleepy), ("c", _append("c")))


# ---- worker processes ----------------------------------------------------------------------------


class WorkerProcess:
    """``python -m redis_agentstate langgraph worker benchmarks.langgraph_runs:ATTR`` (cwd: the checkout)."""

    def __init__(self, graph: str, url: str, namespace: str, *, lease_ms: int = 30_000) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="lg-runs-worker-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [sys.executable, "-m", "redis_agentstate", "langgraph", "worker", f"{MODULE}:{graph}", "--url", url,
               "--queue-namespace", namespace, "--saver-namespace", namespace, "--concurrency", "1",
               "--lease-ms", str(lease_ms)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.pid = self.proc.pid
        self.closed = False

    def stderr(self) -> str:
        return Path(self.log.name).read_text("utf-8", errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the worker printed its start line (the graph imported, its loop about to claim)."""
        deadline = time.monotonic() + timeout_s
        while "graph worker " not in self.stderr():
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited ({self.proc.returncode}):\n{self.stderr()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker did not start in {timeout_s} s:\n{self.stderr()[-2000:]}")
            time.sleep(0.05)

    def cpu_s(self) -> float:
        return proc_cpu_seconds(self.pid) or 0.0

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)  # nothing once the process is reaped (its pid may be another's by then)

    def close(self, timeout_s: float) -> str:
        """Wait for the exit asked earlier (SIGTERM: at the end of a blocked claim), else SIGKILL; the
        tracebacks the worker logged ('' for none)."""
        if self.closed:
            return ""
        self.closed = True
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        text = self.stderr()
        trouble = text[text.index("Traceback") :] if "Traceback" in text else ""
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)
        return trouble


class Fleet:
    """The workers a run started. ``stop`` asks them to end (SIGTERM; an idle worker leaves at the end of
    its blocked claim, up to its ``block_ms``) and goes on; ``reap`` waits until every stopped one is
    gone, so none exits during the next measurement, while the next workers start."""

    def __init__(self) -> None:
        self.procs: list[WorkerProcess] = []
        self.stopping: list[WorkerProcess] = []
        self.threads: list[threading.Thread] = []
        #: What stops the in-process workers a measurement started (``close_threads``).
        self.on_close: list[Callable[[], None]] = []
        #: Worker processes that logged a traceback (a run's turn that failed), with its text.
        self.problems: list[str] = []

    def start(self, graph: str, url: str, namespace: str, n: int, **kw: Any) -> list[WorkerProcess]:
        started = [WorkerProcess(graph, url, namespace, **kw) for _ in range(n)]
        self.procs += started
        for w in started:
            w.wait_ready()
        return started

    def stop(self, workers: list[WorkerProcess]) -> None:
        for w in workers:
            w.signal(signal.SIGCONT)
            w.signal(signal.SIGTERM)
            if w not in self.stopping:
                self.stopping.append(w)

    def stop_thread(self, worker: GraphWorker, thread: threading.Thread) -> None:
        worker.stop()
        self.threads.append(thread)

    def close_threads(self) -> None:
        while self.on_close:
            self.on_close.pop()()

    def reap(self) -> None:
        for t in self.threads:
            t.join(30)
        self.threads.clear()
        for w in self.stopping:
            trouble = w.close(15.0)
            if trouble:
                self.problems.append(trouble[-3000:])
                print(f"[benchmarks] worker {w.pid} logged:\n{trouble[-3000:]}", file=sys.stderr)
        self.stopping.clear()

    def close(self) -> None:
        self.stop([w for w in self.procs if not w.closed])
        self.reap()


def _pid_of(worker_name: str) -> int:
    """A worker's pid from its name (``host:pid:suffix``)."""
    return int(worker_name.rsplit(":", 2)[-2])


def _ns(what: str) -> str:
    return f"lgr-{uuid.uuid4().hex[:6]}-{what}"


# ---- 1. overhead ---------------------------------------------------------------------------------


def _queue_path(lib: Any, url: str, fleet: Fleet, what: str) -> Callable[[], None]:
    """``queue.create`` + ``queue.join`` on a fresh thread, executed by an in-process ``GraphWorker`` of
    ``lib`` (this checkout's ``redis_agentstate``, or a base commit's)."""
    ns, seq = _ns(what), itertools.count()
    queue = lib.RunQueue(redis.Redis.from_url(url), namespace=ns)
    worker = lib.GraphWorker(GRAPH, lib.RunQueue(redis.Redis.from_url(url), namespace=ns),
                             lib.AgentStateSaver(redis.Redis.from_url(url), namespace=ns),
                             name=f"bench:{os.getpid()}:{what}")  # fmt: skip
    thread = threading.Thread(target=worker.run, name=f"bench-graph-worker-{what}", daemon=True)
    thread.start()
    fleet.on_close.append(lambda: fleet.stop_thread(worker, thread))

    def through_queue() -> None:
        run = queue.create(f"q-{next(seq)}", {"log": ["in"]})
        done = queue.join(run.run_id, timeout_s=60)
        assert done.status == "success", done

    return through_queue


def overhead(url: str, fleet: Fleet, rounds: int, runs: int, base: Any = None) -> dict[str, Any]:
    """Interleaved rounds of ``graph.invoke`` (A) and ``queue.create`` + ``queue.join`` (B); with
    ``base`` (a base commit's package, ``--base``) the same queue path on it too (C)."""
    import redis_agentstate.langgraph as lib

    graph = GRAPH.copy(update={"checkpointer": AgentStateSaver(redis.Redis.from_url(url), namespace=_ns("invoke"))})
    seq = itertools.count()
    want = ["in", "a", "b", "c"]

    def invoke() -> None:
        out = graph.invoke({"log": ["in"]}, {"configurable": {"thread_id": f"inv-{next(seq)}"}})
        assert out["log"] == want, out

    paths: dict[str, Callable[[], None]] = {"invoke": invoke, "queue": _queue_path(lib, url, fleet, "queue")}
    # The requests each library sent (one a round trip), the client's and its in-process worker's.
    sent = {"invoke": count_requests(redis_agentstate)}
    sent["queue"] = sent["invoke"]
    if base is not None:
        paths["base"] = _queue_path(importlib.import_module(f"{base.__name__}.langgraph"), url, fleet, "base")
        sent["base"] = count_requests(base)
    out: dict[str, Any] = {"rounds": []}
    try:
        for fn in paths.values():  # warm-up: scripts loaded, connections and the worker's wake-up up
            for _ in range(5):
                fn()
        for _ in range(rounds):
            rnd: dict[str, Any] = {}
            for name, fn in paths.items():  # A, B, (C,) A, B...
                ms: list[float] = []
                before = sent[name][0]
                for _ in range(runs):
                    t0 = time.perf_counter()
                    fn()
                    ms.append((time.perf_counter() - t0) * 1000)
                rnd[name] = {"p50": round(percentile(ms, 50), 3), "p90": round(percentile(ms, 90), 3),
                             "trips": round((sent[name][0] - before) / runs, 2)}  # fmt: skip
            rnd["ratio"] = round(rnd["queue"]["p50"] / rnd["invoke"]["p50"], 3)
            if base is not None:
                rnd["base_ratio"] = round(rnd["base"]["p50"] / rnd["invoke"]["p50"], 3)
            out["rounds"].append(rnd)
            note = "" if base is None else f", base p50 {rnd['base']['p50']:.2f} ms ({rnd['base_ratio']:.2f}x)"
            print(f"overhead round {len(out['rounds'])}: invoke p50 {rnd['invoke']['p50']:.2f} ms, "
                  f"queue p50 {rnd['queue']['p50']:.2f} ms ({rnd['ratio']:.2f}x){note}", flush=True)  # fmt: skip
    finally:
        uncount_requests(redis_agentstate, *(() if base is None else (base,)))
        fleet.close_threads()  # joined while the next workers start: each leaves at its claim's end
    return out


# ---- 2. event latency ----------------------------------------------------------------------------


def event_latency(url: str, fleet: Fleet, events: int, per_run: int, gap_ms: float) -> dict[str, Any]:
    """Custom events' receive - emit times, ms, through a worker process and a tailing consumer thread."""
    ns = _ns("events")
    workers = fleet.start("EVENTS", url, ns, 1)
    fleet.reap()
    queue = RunQueue(redis.Redis.from_url(url), namespace=ns)
    reader = RunQueue(redis.Redis.from_url(url), namespace=ns)
    latencies: list[float] = []
    runs = [min(per_run, events - k) for k in range(0, events, per_run)]
    try:
        for k, n in enumerate([3, *runs]):  # the first run warms the worker and the reader up
            conf = {"configurable": {"events": n, "gap_ms": gap_ms, "lead_ms": 300}}
            run = queue.create(f"ev-{k}", {"log": []}, stream_mode="custom", config=conf)
            got: list[float] = []

            def tail(run_id: str = run.run_id, got: list[float] = got) -> None:
                for ev in reader.stream(run_id):
                    if ev.event == "custom":
                        got.append((time.time() - ev.data["t"]) * 1000)

            consumer = threading.Thread(target=tail, name="bench-event-consumer", daemon=True)
            consumer.start()
            consumer.join(120)
            done = queue.join(run.run_id, timeout_s=60)
            assert done.status == "success" and len(got) == n, (done, len(got), n)
            if k:
                latencies += got
    finally:
        fleet.stop(workers)
    return {"latencies_ms": [round(x, 3) for x in latencies], "runs": len(runs)}


# ---- 3. throughput -------------------------------------------------------------------------------


def _script_usec(stats: dict[str, Any]) -> float:
    return sum(float(v.get("usec", 0)) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def _script_calls(stats: dict[str, Any]) -> float:
    return sum(float(v.get("calls", 0)) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def _all_usec(stats: dict[str, Any]) -> float:
    return sum(float(v.get("usec", 0)) for v in stats.values() if isinstance(v, dict))


def _warm(queue: RunQueue, workers: list[WorkerProcess]) -> int:
    """Runs on throw-away threads until every worker process has executed one; how many it took."""
    pids, n = {w.pid for w in workers}, 0
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while seen != pids:
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers {sorted(pids - seen)} took no warm-up run in 60 s")
        batch = [queue.create(f"warm-{n + i}", {"log": ["in"]}) for i in range(len(pids))]
        n += len(batch)
        for run in batch:
            seen.add(_pid_of(queue.join(run.run_id, timeout_s=60).worker))
    return n


def throughput(url: str, fleet: Fleet, n_workers: int, threads: int) -> dict[str, Any]:
    """``threads`` runs created while ``n_workers`` warm worker processes are frozen, then executed."""
    ns = _ns(f"tp{n_workers}")
    admin = redis.Redis.from_url(url)
    server_pid = server_pid_of(admin)
    workers = fleet.start("GRAPH", url, ns, n_workers)
    queue = RunQueue(redis.Redis.from_url(url), namespace=ns)
    try:
        warm = _warm(queue, workers)
        fleet.reap()
        time.sleep(0.2)  # the warm-up's last turns put their threads back
        for w in workers:
            w.signal(signal.SIGSTOP)
        admin.config_resetstat()
        cpu0 = proc_cpu_seconds(server_pid)
        t0 = time.perf_counter()
        ids = [queue.create(f"t-{i}", {"log": ["in"]}).run_id for i in range(threads)]
        create_s = time.perf_counter() - t0
        create_stats, create_cpu = admin.info("commandstats"), proc_cpu_seconds(server_pid)
        admin.config_resetstat()
        cpu1, wcpu0 = proc_cpu_seconds(server_pid), sum(w.cpu_s() for w in workers)
        thawed = time.time()
        for w in workers:
            w.signal(signal.SIGCONT)
        polls, i = 0, 0
        while i < len(ids):  # wait, cheaply: a run is looked at until it ended
            polls += 1
            run = queue.get(ids[i])
            if run is not None and run.done:
                i += 1
            else:
                time.sleep(0.02)
        exec_stats, cpu2 = admin.info("commandstats"), proc_cpu_seconds(server_pid)
        wcpu = sum(w.cpu_s() for w in workers) - wcpu0
    finally:
        fleet.stop(workers)
    ran = [queue.get(rid) for rid in ids]
    statuses = [r.status if r is not None else "missing" for r in ran]
    ended = max(r.ended_at_ms or 0 for r in ran if r is not None) / 1000
    started = min(r.started_at_ms or 0 for r in ran if r is not None) / 1000
    seconds = ended - thawed
    by_worker = sorted(sum(1 for r in ran if r is not None and _pid_of(r.worker) == w.pid) for w in workers)
    row = {
        "workers": n_workers,
        "runs": threads,
        "warm_up_runs": warm,
        "failed": sum(1 for s in statuses if s != "success"),
        "seconds": round(seconds, 3),
        "runs_per_s": round(threads / seconds, 1),
        "first_start_after_thaw_ms": round((started - thawed) * 1000, 1),
        "runs_per_worker": by_worker,
        "create_ms_per_run": round(create_s * 1000 / threads, 3),
        "worker_cpu_ms_per_run": round(wcpu * 1000 / threads, 3),
        "server_usec_all_create": round(_all_usec(create_stats) / threads, 1),
        "server_usec_all_exec": round(_all_usec(exec_stats) / threads, 1),
        "server_usec_scripts_create": round(_script_usec(create_stats) / threads, 1),
        "server_usec_scripts_exec": round(_script_usec(exec_stats) / threads, 1),
        "scripts_per_run": round((_script_calls(create_stats) + _script_calls(exec_stats)) / threads, 2),
        "server_cpu_us_create": (
            None if cpu0 is None or create_cpu is None else round((create_cpu - cpu0) * 1e6 / threads, 1)
        ),
        "server_cpu_us_exec": None if cpu1 is None or cpu2 is None else round((cpu2 - cpu1) * 1e6 / threads, 1),
        "polls": polls,
    }  # fmt: skip
    print(f"throughput, {n_workers} worker process(es): {row['runs_per_s']:.0f} runs/s over {threads} runs "
          f"({row['failed']} failed), runs per worker {by_worker}", flush=True)  # fmt: skip
    return row


# ---- 4. crash recovery ---------------------------------------------------------------------------


def recovery(url: str, fleet: Fleet, reps: int, lease_ms: int, sleep_s: float) -> list[dict[str, Any]]:
    """SIGKILL the worker inside node b; time to the run's second attempt and to its end."""
    ns = _ns("crash")
    workers = fleet.start("CRASH", url, ns, 2, lease_ms=lease_ms)
    queue = RunQueue(redis.Redis.from_url(url), namespace=ns)
    reader = RunQueue(redis.Redis.from_url(url), namespace=ns)
    conf = {"configurable": {"sleep_s": sleep_s}}
    out: list[dict[str, Any]] = []
    try:
        warm = queue.create("crash-warm", {"log": ["in"]}, config={"configurable": {"sleep_s": 0}})
        assert queue.join(warm.run_id, timeout_s=60).status == "success"
        fleet.reap()
        for k in range(reps):
            run = queue.create(f"crash-{k}", {"log": ["in"]}, stream_mode=["custom", "updates"], config=conf)
            seen: list[tuple[float, Any]] = []
            in_b = threading.Event()

            def tail(
                run_id: str = run.run_id, seen: list[tuple[float, Any]] = seen, in_b: threading.Event = in_b
            ) -> None:
                for ev in reader.stream(run_id):
                    seen.append((time.time(), ev))
                    if ev.event == "custom" and ev.data.get("node") == "b":
                        in_b.set()

            consumer = threading.Thread(target=tail, name="bench-crash-consumer", daemon=True)
            consumer.start()
            assert in_b.wait(60), "node b never started"
            first = queue.get(run.run_id)
            assert first is not None and first.status == "running" and first.attempt == 1, first
            victim = next(w for w in workers if w.pid == _pid_of(first.worker))
            killed = time.time()
            victim.signal(signal.SIGKILL)
            consumer.join(60 + 3 * lease_ms / 1000)
            done = queue.get(run.run_id)
            assert done is not None and done.status == "success" and done.attempt == 2, done
            metas = [(at, ev) for at, ev in seen if ev.event == "metadata"]
            ends = [(at, ev) for at, ev in seen if ev.event == "end"]
            assert len(metas) == 2 and metas[1][1].data.get("attempt") == 2 and ends, [ev.event for _, ev in seen]
            second_at, second = metas[1]
            out.append({
                "to_second_attempt_s": round(second_at - killed, 3),
                "to_second_attempt_server_s": round(int(second.id.split("-")[0]) / 1000 - killed, 3),
                "to_end_s": round(ends[-1][0] - killed, 3),
                "other_worker": _pid_of(done.worker) != victim.pid,
            })  # fmt: skip
            print(f"recovery {k + 1}: second attempt {out[-1]['to_second_attempt_s']:.2f} s after the SIGKILL, "
                  f"ended after {out[-1]['to_end_s']:.2f} s", flush=True)  # fmt: skip
            victim.proc.wait(10)
            workers.remove(victim)
            if k + 1 < reps:  # a replacement, so two workers wait again (started after the run: no CPU contention)
                workers += fleet.start("CRASH", url, ns, 1, lease_ms=lease_ms)
    finally:
        fleet.stop(workers)
    return out


# ---- the command ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.langgraph_runs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="smoke preset: tiny sizes, one repetition of each")
    p.add_argument("--rounds", type=int, help="overhead: interleaved rounds (default 9; --quick 2)")
    p.add_argument("--runs", type=int, help="overhead: runs per path per round (default 50; --quick 10)")
    p.add_argument("--events", type=int, help="event latency: events measured (default 300; --quick 30)")
    p.add_argument("--gap-ms", type=float, default=5.0, help="event latency: ms between two events (default 5)")
    p.add_argument("--threads", type=int, help="throughput: threads, one run each (default 1000; --quick 100)")
    p.add_argument("--workers", default="1,2,4", help="throughput: worker process counts (default 1,2,4)")
    p.add_argument("--repetitions", type=int, help="crash recovery: SIGKILLs (default 5; --quick 1)")
    p.add_argument("--lease-ms", type=int, default=2000, help="crash recovery: the workers' --lease-ms (default 2000)")
    p.add_argument("--sleep-s", type=float, default=1.0, help="crash recovery: the middle node's sleep (default 1)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory of langgraph_runs.json (default %(default)s)")
    p.add_argument("--readme", action="store_true", help="rewrite the langgraph_runs block of benchmarks/README.md")
    p.add_argument("--base", metavar="COMMIT", help="overhead: the same queue path on COMMIT's package too, in the "
                   "same rounds (C), loaded as client_ab loads it")  # fmt: skip
    p.add_argument("--only", help="the measurements to run, comma-separated (overhead, events, throughput, "
                   "recovery; default all; --readme needs all)")  # fmt: skip
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    if only is not None and args.readme:
        p.error("--readme rewrites the whole block: run every measurement (no --only)")
    q = args.quick
    params: dict[str, Any] = {
        "quick": q,
        "rounds": args.rounds or (2 if q else 9),
        "runs": args.runs or (10 if q else 50),
        "events": args.events or (30 if q else 300),
        "events_per_run": 100,
        "gap_ms": args.gap_ms,
        "threads": args.threads or (100 if q else 1000),
        "workers": [int(n) for n in args.workers.split(",")],
        "repetitions": args.repetitions or (1 if q else 5),
        "lease_ms": args.lease_ms,
        "sleep_s": args.sleep_s,
        "cores": os.cpu_count(),
        "base": None,
    }
    base_pkg = None
    if args.base:
        from .client_ab import load_base

        base_pkg, _ = load_base(args.base)
        params["base"] = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True,
                                        text=True, check=True).stdout.strip()  # fmt: skip
    lib_log = logging.getLogger("redis_agentstate")
    level = lib_log.level
    lib_log.setLevel(logging.ERROR)  # the in-process worker's warnings (its lease ending with the server)
    server = start_embedded(prefer="redis-server")
    fleet = Fleet()
    data: dict[str, Any] = {}
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line(f"python -m {MODULE}", argv), admin)
        sections: dict[str, Callable[[], Any]] = {
            "overhead": lambda: overhead(server.url, fleet, params["rounds"], params["runs"], base_pkg),
            "events": lambda: event_latency(server.url, fleet, params["events"], params["events_per_run"],
                                            args.gap_ms),
            "throughput": lambda: [throughput(server.url, fleet, n, params["threads"]) for n in params["workers"]],
            "recovery": lambda: recovery(server.url, fleet, params["repetitions"], args.lease_ms, args.sleep_s),
        }  # fmt: skip
        for name, measure in sections.items():
            if only is not None and name not in only:
                continue
            t0 = time.perf_counter()
            data[name] = measure()
            print(f"[benchmarks] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        try:
            fleet.close()
        finally:
            server.stop()
            lib_log.setLevel(level)
    data["worker_tracebacks"] = len(fleet.problems)
    results = {"schema": 1, "meta": finish_meta(meta), "standalone": {"name": NAME, "data": data, "params": params}}
    results = json.loads(json.dumps(results))  # rendered as the saved JSON will be
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{NAME}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    if only is None:
        print(markdown(results["standalone"]["data"], results["standalone"]["params"]))
    elif "overhead" in data:
        print("\n".join(_overhead_lines(data, params)))
    print(f"[benchmarks] wrote {path}", file=sys.stderr)
    if args.readme:
        for block, body in report.blocks(results, []).items():
            report.write_block(results["meta"], block, body)
    elif Path(path).resolve() == (DEFAULT_OUT / f"{NAME}.json").resolve():
        print(f"[benchmarks] {path} no longer matches the README block until a --readme run", file=sys.stderr)
    return 0


# ---- the block -----------------------------------------------------------------------------------


def _med(values: Iterator[float] | list[float]) -> float:
    return float(statistics.median(list(values)))


def _server_cpu(r: dict[str, Any]) -> float | None:
    a, b = r["server_cpu_us_create"], r["server_cpu_us_exec"]
    return None if a is None or b is None else float(a + b)


def _ratio(r: dict[str, Any], base: dict[str, Any]) -> str:
    a, b = _server_cpu(r), _server_cpu(base)
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def targets(data: dict[str, Any]) -> dict[str, Any]:
    """The figures the targets are judged on, and whether each is met."""
    rounds = data["overhead"]["rounds"]
    ratio = _med(r["ratio"] for r in rounds)
    if "events" not in data:
        return {"overhead_ratio": ratio, "overhead_met": ratio <= OVERHEAD_TARGET}
    lat = data["events"]["latencies_ms"]
    p99 = percentile(lat, 99)
    return {
        "overhead_ratio": ratio,
        "overhead_met": ratio <= OVERHEAD_TARGET,
        "event_p99_ms": p99,
        "event_met": p99 <= EVENT_P99_TARGET_MS,
    }


def _spread(values: list[float]) -> str:
    """Median (p10-p90) of per-round ratios."""
    return f"{_med(values):.2f}x ({percentile(values, 10):.2f}-{percentile(values, 90):.2f})"


def _overhead_lines(data: dict[str, Any], params: dict[str, Any]) -> list[str]:
    tg = targets(data)
    rounds = data["overhead"]["rounds"]
    base = params.get("base") if all("base" in r for r in rounds) else None

    def cell(path: str, key: str) -> str:
        vals = [r[path][key] for r in rounds]
        return f"{_med(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    def trips(path: str) -> str:
        return f"{_med(r[path]['trips'] for r in rounds):.1f}"

    order = "A, B, C, A, B, C..." if base else "A, B, A, B..."
    lines = [
        f"**Overhead.** A 3-node graph with no I/O, each run on a fresh thread; {len(rounds)} interleaved rounds "
        f"({order}) of {params['runs']} runs per path; ms per run, median (min-max) over rounds of each "
        "round's p50 and p90. Round trips: requests the library sent per run, the client's and the worker's.",
        "",
        "| path | p50 ms | p90 ms | round trips per run |",
        "| --- | --- | --- | --- |",
        f"| A: `graph.invoke` in-process, `AgentStateSaver` as checkpointer | {cell('invoke', 'p50')} | "
        f"{cell('invoke', 'p90')} | {trips('invoke')} |",
        f"| B: `queue.create` + `queue.join`, one in-process `GraphWorker` (default `block_ms`) | "
        f"{cell('queue', 'p50')} | {cell('queue', 'p90')} | {trips('queue')} |",
    ]
    if base:
        lines.append(f"| C: B on the base commit {base} (its package loaded beside this one) | {cell('base', 'p50')} "
                     f"| {cell('base', 'p90')} | {trips('base')} |")  # fmt: skip
    lines += [
        "",
        f"- B / A, median (p10-p90) of the rounds' p50 ratios: {_spread([r['ratio'] for r in rounds])} (target: at "
        f"most {OVERHEAD_TARGET:g}x): {_met(tg['overhead_met'])}.",
    ]
    if base:
        lines.append(f"- C / A, the same for the base commit: {_spread([r['base_ratio'] for r in rounds])}; C / B: "
                     f"{_spread([r['base']['p50'] / r['queue']['p50'] for r in rounds])}.")  # fmt: skip
    return [*lines, ""]


def markdown(data: dict[str, Any], params: dict[str, Any]) -> str:
    """The langgraph_runs block: overhead, event latency, throughput and crash recovery, with the targets."""
    tg = targets(data)
    lines = [
        f"One private redis-server; the client, the workers and the server share the machine's "
        f"{params['cores']} cores.",
        "",
        *_overhead_lines(data, params),
    ]
    lat = data["events"]["latencies_ms"]
    lines += [
        f"**Event latency.** Custom events written by a node (its `writer` parameter, `time.time()` in the event) "
        f"{params['gap_ms']:g} ms apart, over {data['events']['runs']} run(s), executed by a worker process; a "
        "consumer thread tails `queue.stream(run_id)`; receive time - emit time, ms.",
        "",
        "| events | p50 | p90 | p99 | max |",
        "| --- | --- | --- | --- | --- |",
        f"| {len(lat)} | {percentile(lat, 50):.2f} | {percentile(lat, 90):.2f} | {percentile(lat, 99):.2f} | "
        f"{max(lat):.2f} |",
        "",
        f"- p99 {tg['event_p99_ms']:.2f} ms (target: at most {EVENT_P99_TARGET_MS:g} ms): {_met(tg['event_met'])}.",
        "",
    ]
    tp = data["throughput"]
    base = tp[0]["runs_per_s"] / tp[0]["workers"]
    lines += [
        f"**Throughput.** {params['threads']:,} threads with one run each of the 3-node graph, created while the "
        "worker processes (`agentstate langgraph worker`, concurrency 1, warmed up) are frozen, then thawed at "
        "once; runs/s from the thaw to the last run's end. Server time per run, the creates' + the "
        "execution's: `INFO commandstats` usec of every command summed (a command a script runs is counted "
        "in the script's usec and again on its own line, so this sum overstates), of the scripts alone, and the "
        "server process's CPU time.",
        "",
        "| worker processes | runs/s | per process, x 1 process | worker CPU ms per run | scripts per run "
        "| server usec per run, all commands | server usec per run, scripts | server CPU us per run | failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in tp:
        cpu = "-" if _server_cpu(r) is None else f"{_server_cpu(r):.0f}"
        lines.append(
            f"| {r['workers']} | {r['runs_per_s']:,.0f} | {r['runs_per_s'] / r['workers'] / base:.2f} | "
            f"{r['worker_cpu_ms_per_run']:.2f} | {r['scripts_per_run']:.1f} | "
            f"{r['server_usec_all_create'] + r['server_usec_all_exec']:.0f} | "
            f"{r['server_usec_scripts_create'] + r['server_usec_scripts_exec']:.0f} | {cpu} | {r['failed']} |"
        )
    best = max(tp, key=lambda r: r["runs_per_s"])
    last = tp[-1]
    lines += [
        "",
        f"- Most runs/s: {best['runs_per_s']:,.0f} with {best['workers']} worker process(es); "
        f"{sum(r['failed'] for r in tp)} of {sum(r['runs'] for r in tp):,} runs did not end in `success`; "
        f"tracebacks logged by the workers of the whole command: {data.get('worker_tracebacks', 0)}.",
        f"- {last['workers']} processes against 1, per run: worker CPU "
        f"{last['worker_cpu_ms_per_run'] / tp[0]['worker_cpu_ms_per_run']:.2f}x, scripts "
        f"{last['scripts_per_run'] / tp[0]['scripts_per_run']:.2f}x (a claim lost to another worker is one more), "
        f"server CPU {_ratio(last, tp[0])}; the machine has {params['cores']} cores for the server, the workers "
        "and the waiting client.",
        "",
    ]
    rec = data["recovery"]
    to_second = [r["to_second_attempt_s"] for r in rec]
    to_end = [r["to_end_s"] for r in rec]
    lines += [
        f"**Crash recovery.** Two worker processes with `--lease-ms {params['lease_ms']}`; the one running a run "
        f"is SIGKILLed inside its middle node (which sleeps {params['sleep_s']:g} s); {len(rec)} repetition(s), "
        "timed from the SIGKILL as a client tailing the run receives its events; seconds, p50 (max).",
        "",
        "| SIGKILL -> the second attempt starts (its `metadata` event) | SIGKILL -> the run's `end` |",
        "| --- | --- |",
        f"| {_med(to_second):.2f} ({max(to_second):.2f}) | {_med(to_end):.2f} ({max(to_end):.2f}) |",
        "",
        f"- Bounded by the lease: nothing notices a dead worker until its thread's lease lapses, at most "
        f"{params['lease_ms']:,} ms after its last renewal; the next worker's `claim_next` then takes the thread "
        "over and resumes the run from its last checkpoint. The run's end comes after the rest of its work: "
        f"node b again (its writes were never saved, so it sleeps {params['sleep_s']:g} s once more), then c.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
