"""``agentstate demo``: a fleet of worker processes on one Redis, with a crash and a freeze.

The supervisor creates ``tasks`` agent tasks of ``cycles`` cycles, starts
``workers`` processes (each a :class:`~redis_agentstate.runner.Runner`), and
while they work it SIGKILLs one worker in the middle of a cycle and SIGSTOPs
another in the middle of a cycle, keeping it stopped until its lease lapsed and
another worker claimed that task (seen in Redis: the task's revision moved on),
then SIGCONTs it: its late commit meets the fence every run, however loaded the
machine. Each simulated agent step appends
one message naming ``(task, cycle, worker)``; each acknowledged commit is
also recorded by the worker in a side list.

At the end the supervisor reads every task back and checks, from the stored
histories alone:

* double-applied cycles: a ``(task, cycle)`` with more than one message;
* lost commits: a commit Redis acknowledged to a worker whose message is not
  in the history (or a finished task missing a cycle);
* takeovers: claims beyond the 2 revisions per cycle a clean run needs (every
  claim bumps the revision), summed over tasks;
* stale commits rejected by fencing: a worker whose lease was lost still
  tries its commit (as a worker without a lease keeper would) and counts
  Redis's refusal;
* late commits accepted: the same, when nobody had claimed the task since the
  lease lapsed (the revision had not moved, so the fence lets it through:
  nothing was lost or applied twice). A worker starved past its lease on a
  loaded machine can do this; the frozen one cannot.

The exit status is non-zero if any invariant broke.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import redis

from ..checkpoint import CheckpointStore
from ..keys import DEMO_KEYS, Keys, validate_namespace
from ..models import AgentStatus, Checkpoint
from ..runner import Runner, StepResult, current_lease
from ..spec import StoreSpec, redact
from .embedded import EmbeddedServer, start_embedded

__all__ = ["DemoConfig", "DemoReport", "run_demo", "run_worker", "verify"]


@dataclass
class DemoConfig:
    workers: int = 4
    tasks: int = 24
    cycles: int = 8
    step_ms: int = 40
    lease_ms: int = 1_000
    chaos: bool = True
    timeout_s: float = 120.0
    keep: bool = False
    #: Serve the dashboard (``agentstate serve``, read-only, loopback) on this port while the demo runs.
    dashboard_port: int | None = None
    #: With the dashboard: keep it (and the demo's tasks) up after the report until Ctrl-C.
    linger: bool = False


@dataclass
class DemoReport:
    """What the demo measured; every invariant figure is derived from stored state."""

    tasks: int
    namespace: str = ""
    tasks_done: int = 0
    cycles_expected: int = 0
    cycles_committed: int = 0
    takeovers: int = 0
    stale_commits_rejected: int = 0
    late_commits_accepted: int = 0
    double_applied: int = 0
    lost_commits: int = 0
    acked_commits: int = 0
    elapsed_s: float = 0.0
    cycles_per_s: float = 0.0
    killed: str | None = None
    frozen: str | None = None
    worker_failures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _keys(ns: str) -> dict[str, str]:
    keys = Keys.unresolved(ns)  # the demo's keys are outside the shard tags: no layout needed
    return {name: keys.demo(name) for name in DEMO_KEYS}


# ---- verification (pure) -------------------------------------------------------------------------


def verify(
    checkpoints: Mapping[str, Checkpoint | None],
    acks: Sequence[Mapping[str, Any]],
    cycles: int,
) -> DemoReport:
    """Derive the invariant figures from stored checkpoints and the workers' acknowledged commits."""
    report = DemoReport(tasks=len(checkpoints), cycles_expected=len(checkpoints) * cycles)
    applied: Counter[tuple[str, int]] = Counter()
    writer: dict[tuple[str, int], str] = {}
    for tid, cp in checkpoints.items():
        if cp is None:
            report.problems.append(f"task {tid} vanished")
            continue
        seen = []
        for m in cp.messages:
            if isinstance(m, dict) and m.get("task") == tid and isinstance(m.get("cycle"), int):
                applied[(tid, m["cycle"])] += 1
                writer[(tid, m["cycle"])] = str(m.get("worker"))
                seen.append(m["cycle"])
        if seen != sorted(seen):
            report.problems.append(f"task {tid}: cycles out of order {seen}")
        if cp.is_terminal and cp.cycle_index == cycles:
            report.tasks_done += 1
            missing = [c for c in range(1, cycles + 1) if applied[(tid, c)] == 0]
            if missing:
                report.lost_commits += len(missing)
                report.problems.append(f"task {tid} finished without cycles {missing}")
        report.takeovers += max(0, cp.revision - 2 * cp.cycle_index)
    report.cycles_committed = len(applied)
    report.double_applied = sum(n - 1 for n in applied.values() if n > 1)
    report.acked_commits = len(acks)
    # Two acknowledged commits of one cycle mean it was applied twice, whatever the history shows.
    acked = Counter((str(a["task"]), int(a["cycle"])) for a in acks)
    twice = sum(n - 1 for n in acked.values() if n > 1)
    if twice:
        report.double_applied += twice
        report.problems.append(f"{twice} cycle(s) acknowledged to more than one commit")
    for ack in acks:
        key = (str(ack["task"]), int(ack["cycle"]))
        if applied[key] == 0:
            report.lost_commits += 1
            report.problems.append(f"acknowledged commit of {key} by {ack['worker']} is not in the history")
        elif writer[key] != ack["worker"]:
            report.problems.append(f"{key} acknowledged to {ack['worker']} but written by {writer[key]}")
    if report.double_applied:
        report.problems.append(f"{report.double_applied} cycle(s) applied twice")
    if report.tasks_done != report.tasks:
        report.problems.append(f"only {report.tasks_done} of {report.tasks} tasks finished")
    return report


# ---- the worker process ------------------------------------------------------------------------


def run_worker(url: str, namespace: str, worker_id: str, *, cycles: int, step_ms: int, lease_ms: int) -> int:
    """One demo worker: a Runner whose handler simulates an agent step. Runs until SIGTERM."""
    stop_requested: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.append(signum))  # until the Runner runs
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {worker_id} %(levelname)s %(message)s"
    )
    client = StoreSpec.redis(url).client()  # redis://, rediss://, unix:// or redis+sentinel://
    store = CheckpointStore(client, namespace=namespace)
    keys = _keys(namespace)
    rng = random.Random()

    def handler(cp: Checkpoint) -> StepResult:
        cycle = cp.claimed_cycle or 0
        lease = current_lease()
        client.hset(keys["busy"], worker_id, f"{cp.task_id}:{cycle}")
        # Every claim bumps the revision; beyond 2 per cycle, earlier claims were abandoned.
        abandoned = cp.revision - (2 * cycle - 1)
        if abandoned > int(cp.shared_state.get("takeovers", 0)):
            client.hincrby(keys["stats"], "takeovers", abandoned - int(cp.shared_state.get("takeovers", 0)))
            cp.shared_state["takeovers"] = abandoned
            logging.warning("took over %s cycle %d (an earlier claim was abandoned)", cp.task_id, cycle)
        time.sleep(step_ms * rng.uniform(0.5, 1.5) / 1000)  # the "model call"
        cp.messages.append(
            {"role": "assistant", "task": cp.task_id, "cycle": cycle, "worker": worker_id,
             "token": lease.token if lease else None, "content": f"step {cycle} of {cp.task_id}"}
        )  # fmt: skip
        cp.cycles.append({"cycle": cycle, "worker": worker_id})
        client.hdel(keys["busy"], worker_id)
        if cycle >= cycles:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"cycles": cycle, "finished_by": worker_id}
            return StepResult(cp, done=True)
        return StepResult(cp)

    def ack(cp: Checkpoint, how: str) -> None:
        client.rpush(keys["acks"], json.dumps({"task": cp.task_id, "cycle": cp.cycle_index, "worker": worker_id}))
        client.hincrby(keys["stats"], "cycles", 1)
        if how == "finalized":
            client.hincrby(keys["stats"], "done", 1)

    def on_written(lease: Any, cp: Checkpoint, done: bool) -> None:
        ack(cp, "finalized" if done else "committed")

    def on_lease_lost(lease: Any, cp: Checkpoint | None) -> None:
        if cp is None:
            return
        # What a worker without a lease keeper would do: commit anyway. The fence decides.
        if store.commit(cp, token=lease.token, expected_revision=lease.revision):
            logging.warning("late commit of %s cycle %d accepted: nobody had taken over", cp.task_id, cp.cycle_index)
            client.hincrby(keys["stats"], "late_accepted", 1)
            ack(cp, "finalized" if cp.terminal_result is not None else "committed")
        else:
            logging.warning("stale commit of %s cycle %d rejected by the fence", cp.task_id, cp.cycle_index)
            client.hincrby(keys["stats"], "stale_rejected", 1)

    runner = Runner(
        store, handler, lease_ms=lease_ms, idle_min_ms=10, idle_max_ms=100, worker_id=worker_id,
        on_lease_lost=on_lease_lost, on_written=on_written,
    )  # fmt: skip
    if stop_requested:
        return 0
    client.hset(keys["ready"], worker_id, os.getpid())
    stats = runner.run()  # installs its own SIGTERM/SIGINT handlers: graceful stop
    logging.info("stopped: %s", stats)
    return 0


# ---- the supervisor ------------------------------------------------------------------------------


class _Progress:
    def __init__(self, out: IO[str], total: int, tasks: int) -> None:
        self.out = out
        self.total = total
        self.tasks = tasks
        self.tty = out.isatty()
        self.last = 0.0
        #: On a TTY, the bar is the line the cursor is on: anything else printed starts a new line first.
        self.on_bar = False

    def end_line(self) -> None:
        """Move off the progress bar (on a TTY), so the next line does not overwrite it."""
        if self.on_bar:
            self.out.write("\n")
            self.out.flush()
            self.on_bar = False

    def event(self, text: str, t0: float) -> None:
        if self.tty:
            self.out.write("\r\033[K")
            self.on_bar = False
        self.out.write(f"[{time.monotonic() - t0:5.1f}s] {text}\n")
        self.out.flush()

    def show(self, stats: Mapping[Any, Any], t0: float, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and not self.tty and now - self.last < 1.0:
            return
        self.last = now
        cycles = int(stats.get(b"cycles", 0))
        done = int(stats.get(b"done", 0))
        width = 24
        filled = width * cycles // max(1, self.total)
        line = (
            f"[{now - t0:5.1f}s] [{'#' * filled}{'.' * (width - filled)}] cycles {cycles}/{self.total}  "
            f"tasks done {done}/{self.tasks}  takeovers {int(stats.get(b'takeovers', 0))}  "
            f"stale rejected {int(stats.get(b'stale_rejected', 0))}"
        )
        if self.tty:
            self.out.write("\r\033[K" + line)
            self.on_bar = True
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _wait_ready(
    client: redis.Redis, ready_key: str, procs: Sequence[subprocess.Popen[bytes]], logdir: str, *, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while client.hlen(ready_key) < len(procs):
        for i, p in enumerate(procs):
            if p.poll() is not None:
                raise RuntimeError(f"worker w{i} exited with {p.returncode} while starting; see {logdir}/w{i}.log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers did not start within {timeout:.0f}s; see {logdir}")
        time.sleep(0.02)


def _stopped(pid: int, timeout: float = 2.0) -> None:
    """Return once ``pid`` is stopped (Linux: state ``T`` in ``/proc``; elsewhere a short wait),
    then a little longer: a request it wrote just before SIGSTOP has reached Redis by then."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] in (b"T", b"t"):
                    break
            time.sleep(0.005)
    except (OSError, IndexError):
        time.sleep(0.05)
    time.sleep(0.05)


@dataclass
class _Held:
    """A claim a stopped worker holds: where it is, and what Redis showed once the worker stood still."""

    task_id: str
    cycle: int
    token: str
    revision: int

    def __str__(self) -> str:
        return f"{self.task_id} cycle {self.cycle}"


def _freeze_holding_claim(
    client: redis.Redis, store: CheckpointStore, busy_key: str, proc: subprocess.Popen[bytes], worker_id: str
) -> _Held | None:
    """SIGSTOP ``proc`` if it is in the middle of a cycle, and keep it stopped only if it
    still holds that cycle's claim (checked in Redis once it cannot move); else SIGCONT, None."""
    busy = client.hget(busy_key, worker_id)
    if not busy:
        return None
    proc.send_signal(signal.SIGSTOP)
    _stopped(proc.pid)
    task_id, _, cycle = (busy.decode() if isinstance(busy, bytes) else busy).rpartition(":")
    cp = store.load(task_id)
    if cp is not None and (cp.claim_token or "").startswith(f"{worker_id}:") and str(cp.claimed_cycle) == cycle:
        return _Held(task_id, int(cycle), cp.claim_token or "", cp.revision)
    proc.send_signal(signal.SIGCONT)  # it finished that cycle in between: try again later
    return None


def _taken_over(store: CheckpointStore, held: _Held) -> str | None:
    """Who took ``held`` over since (its worker being stopped, any change of the task is someone
    else's claim or write), or None while the stopped worker's claim is still the last word."""
    cp = store.load(held.task_id)
    if cp is not None and cp.revision == held.revision and cp.claim_token == held.token:
        return None
    if cp is not None and cp.claim_token:
        return cp.claim_token.partition(":")[0]
    return "another worker"


def run_demo(
    config: DemoConfig,
    *,
    url: str | None = None,
    namespace: str | None = None,
    embedded: str | None = None,
    out: IO[str] | None = None,
) -> DemoReport:
    """Run the whole demo and return its report (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        return _run_demo(config, url=url, namespace=namespace, embedded=embedded, out=out)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwind through the finally blocks: stop workers and server

    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        return _run_demo(config, url=url, namespace=namespace, embedded=embedded, out=out)
    finally:
        signal.signal(signal.SIGTERM, previous_term)


def _run_demo(
    config: DemoConfig,
    *,
    url: str | None,
    namespace: str | None,
    embedded: str | None,
    out: IO[str] | None,
) -> DemoReport:
    out = out or sys.stderr
    # Every argument is checked before a server or a worker starts: nothing to clean up after a refusal.
    ns = validate_namespace(namespace) if namespace is not None else f"demo-{os.urandom(3).hex()}"
    server: EmbeddedServer | None = None
    client: redis.Redis | None = None
    logdir: str | None = None
    procs: list[subprocess.Popen[bytes]] = []
    frozen_pid: int | None = None
    progress: _Progress | None = None
    dash: subprocess.Popen[bytes] | None = None
    clean = False  # the worker logs are kept, and named, unless a report comes back clean
    if config.dashboard_port is not None:
        _check_port(config.dashboard_port)
    try:
        if url is None:
            server = start_embedded(embedded)
            url = server.url
            out.write(f"Redis: started a private {server.description}\n")
        else:
            out.write(f"Redis: {redact(url)}\n")
        logdir = tempfile.mkdtemp(prefix="agentstate-demo-")
        client = StoreSpec.redis(url).client()  # redis://, rediss://, unix:// or redis+sentinel://
        store = CheckpointStore(client, namespace=ns)
        keys = _keys(ns)
        tids = [f"task-{i:03d}" for i in range(config.tasks)]
        if any(store.load(tid) is not None for tid in tids[:1]) or client.exists(*keys.values()):
            raise RuntimeError(f"namespace {ns!r} already holds demo data; pick another --namespace")
        out.write(
            f"namespace {ns!r}: {config.tasks} tasks x {config.cycles} cycles, {config.workers} worker processes, "
            f"lease {config.lease_ms} ms, step ~{config.step_ms} ms\n"
        )
        total = config.tasks * config.cycles
        if config.dashboard_port is not None:
            dash = _start_dashboard(url, ns, config.dashboard_port, logdir)
            out.write(f"dashboard: http://127.0.0.1:{config.dashboard_port}/ (read-only)\n")
        for i in range(config.workers):
            log = open(os.path.join(logdir, f"w{i}.log"), "wb")  # noqa: SIM115 - closed with the process
            argv = [sys.executable, "-m", "redis_agentstate", "_demo-worker", "--url", url, "--namespace", ns,
                    "--worker-id", f"w{i}", "--cycles", str(config.cycles), "--step-ms", str(config.step_ms),
                    "--lease-ms", str(config.lease_ms)]  # fmt: skip
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        _wait_ready(client, keys["ready"], procs, logdir, timeout=30.0)
        # The clock starts when the whole fleet is up and the work appears.
        for tid in tids:
            if not store.create(Checkpoint(tid, shared_state={"goal": f"simulated agent task {tid}"})):
                raise RuntimeError(f"task {tid} already exists in namespace {ns!r}; pick another --namespace")
        t0 = time.monotonic()
        progress = _Progress(out, total, config.tasks)
        report_killed: str | None = None
        report_frozen: str | None = None
        kill_idx = 0 if config.chaos and config.workers >= 2 else None
        stop_idx = 1 if config.chaos and config.workers >= 3 else None
        if config.chaos and config.workers < 3:
            progress.event("fewer than 3 workers: skipping the freeze (and the kill below 2)", t0)
        held: _Held | None = None  # the frozen worker's claim, until another worker took that task over
        frozen_at = 0.0
        deadline = t0 + config.timeout_s
        stats: Mapping[Any, Any] = {}
        while True:
            stats = client.hgetall(keys["stats"])
            cycles_done = int(stats.get(b"cycles", 0))
            if int(stats.get(b"done", 0)) >= config.tasks:
                break
            if time.monotonic() > deadline:
                progress.event(f"timed out after {config.timeout_s:.0f}s", t0)
                break
            if kill_idx is not None and report_killed is None and cycles_done >= total * 0.15:
                where = _freeze_holding_claim(client, store, keys["busy"], procs[kill_idx], f"w{kill_idx}")
                if where:
                    procs[kill_idx].send_signal(signal.SIGKILL)
                    report_killed = f"w{kill_idx} (SIGKILL mid-cycle of {where})"
                    progress.event(f"chaos: SIGKILL {report_killed}", t0)
            if stop_idx is not None and report_frozen is None and cycles_done >= total * 0.3:
                held = _freeze_holding_claim(client, store, keys["busy"], procs[stop_idx], f"w{stop_idx}")
                if held:
                    frozen_pid, frozen_at = procs[stop_idx].pid, time.monotonic()
                    report_frozen = f"w{stop_idx} (SIGSTOP mid-cycle of {held}, never taken over)"
                    progress.event(
                        f"chaos: SIGSTOP w{stop_idx} mid-cycle of {held}: frozen until its lease lapses and "
                        "another worker takes the task over",
                        t0,
                    )
            # The frozen worker wakes only once its task was claimed by another worker, so its late
            # commit always meets the fence (a fixed pause could end before anyone took the task).
            if held is not None and frozen_pid is not None and (by := _taken_over(store, held)) is not None:
                paused = time.monotonic() - frozen_at
                report_frozen = f"w{stop_idx} (SIGSTOP for {paused:.1f}s mid-cycle of {held}, taken over by {by})"
                progress.event(f"chaos: {held} taken over by {by} while w{stop_idx} was frozen", t0)
                os.kill(frozen_pid, signal.SIGCONT)
                frozen_pid, held = None, None
                progress.event(f"chaos: SIGCONT w{stop_idx} after {paused:.1f}s: it wakes up with a lost lease", t0)
            progress.show(stats, t0)
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        progress.show(client.hgetall(keys["stats"]), t0, force=True)
        progress.end_line()
        failures = _stop_workers(procs, frozen_pid, kill_idx if report_killed else None)
        frozen_pid = None
        stats = client.hgetall(keys["stats"])
        acks = [json.loads(a) for a in client.lrange(keys["acks"], 0, -1)]
        report = verify({tid: store.load(tid) for tid in tids}, acks, config.cycles)
        report.namespace = ns
        report.elapsed_s = elapsed
        report.cycles_per_s = report.cycles_committed / elapsed if elapsed > 0 else 0.0
        report.stale_commits_rejected = int(stats.get(b"stale_rejected", 0))
        report.late_commits_accepted = int(stats.get(b"late_accepted", 0))
        report.killed, report.frozen = report_killed, report_frozen
        report.worker_failures = failures
        report.problems += [f"worker {f}" for f in failures]
        clean = not report.problems
        if dash is not None and config.linger:
            out.write(f"{_summary_line(report)}; the dashboard stays up on the demo's tasks: Ctrl-C to stop\n")
            with contextlib.suppress(KeyboardInterrupt):
                dash.wait()
        if not config.keep:
            for tid in tids:
                store.delete(tid)
            client.delete(*keys.values())
        return report
    finally:
        if progress is not None:
            progress.end_line()  # a Ctrl-C or an error must not print onto the progress bar
        if frozen_pid is not None:
            os.kill(frozen_pid, signal.SIGCONT)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if dash is not None and dash.poll() is None:
            dash.terminate()
            try:
                dash.wait(10)
            except subprocess.TimeoutExpired:
                dash.kill()
                dash.wait()
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
        if logdir is not None:
            if clean or not procs:
                shutil.rmtree(logdir, ignore_errors=True)
            else:  # a broken invariant, a failed worker, or the demo itself failed: the logs say why
                out.write(f"worker logs kept in {logdir}\n")


def _summary_line(report: DemoReport) -> str:
    return "every cycle committed exactly once" if not report.problems else "INVARIANTS BROKEN (see below)"


def _check_port(port: int) -> None:
    """Before anything starts: a dashboard port already taken is the demo's one-line error, naming a
    free port to pass instead."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return
        except OSError:
            pass
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        other = free.getsockname()[1]
    raise RuntimeError(f"port {port} is taken, so the dashboard cannot listen there: pass another, "
                       f"e.g. --dashboard {other}")  # fmt: skip


def _start_dashboard(url: str, ns: str, port: int, logdir: str) -> subprocess.Popen[bytes]:
    """``agentstate serve`` on the demo's namespace (read-only, loopback), up and answering."""
    path = os.path.join(logdir, "dashboard.log")
    with open(path, "wb") as log:
        argv = [sys.executable, "-m", "redis_agentstate", "serve", "--url", url, "--namespace", ns,
                "--port", str(port), "--workers", "0"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_TOKEN"}  # the demo's page is read-only
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/ok", timeout=1) as r:
            if r.status == 200:
                return proc
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    with open(path, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-600:].strip()
    raise RuntimeError(f"the dashboard did not start on port {port}: {tail or 'no output'}")


def _stop_workers(procs: list[subprocess.Popen[bytes]], frozen_pid: int | None, killed: int | None) -> list[str]:
    """SIGTERM every live worker (graceful: finish the cycle in flight); report unexpected exits."""
    if frozen_pid is not None:
        os.kill(frozen_pid, signal.SIGCONT)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    failures = []
    for i, p in enumerate(procs):
        try:
            code = p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            failures.append(f"w{i} did not stop within 15s of SIGTERM")
            continue
        if i == killed:
            if code != -signal.SIGKILL:
                failures.append(f"w{i} was SIGKILLed but exited with {code}")
        elif code != 0:
            failures.append(f"w{i} exited with status {code}")
    return failures


def report_table(report: DemoReport) -> str:
    rows = [
        ("tasks done", f"{report.tasks_done}/{report.tasks}"),
        ("cycles committed", f"{report.cycles_committed}/{report.cycles_expected}"),
        ("takeovers", str(report.takeovers)),
        ("stale commits rejected by fencing", str(report.stale_commits_rejected)),
        ("late commits accepted (no takeover)", str(report.late_commits_accepted)),
        ("double-applied cycles (must be 0)", str(report.double_applied)),
        ("lost commits (must be 0)", str(report.lost_commits)),
        ("cycles/s", f"{report.cycles_per_s:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    lines = [f"+-{'-' * width}-+-{'-' * vwidth}-+"]
    lines += [f"| {k.ljust(width)} | {v.rjust(vwidth)} |" for k, v in rows]
    lines.append(lines[0])
    return "\n".join(lines)


def report_json(report: DemoReport) -> dict[str, Any]:
    data = asdict(report)
    data["ok"] = report.ok
    return data
