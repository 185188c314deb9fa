"""Shared pieces of the harness: the private server, settings, statistics, CPU sampling, payloads."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any
from urllib.parse import urlparse

import redis

# ---- settings --------------------------------------------------------------


@dataclass
class Settings:
    """How much to measure. ``quick`` is the smoke-test preset (a few seconds in all)."""

    url: str
    server_pid: int | None
    private: bool
    quick: bool = False
    rounds: int = 9
    seed: int = 0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def ns(self, what: str) -> str:
        """A namespace unique to this run, so ``--url`` servers never see collisions."""
        return f"bench-{self.run_id}-{what}"

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kw)


# ---- the private server ------------------------------------------------------


def host_port(url: str) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname or "127.0.0.1", u.port or 6379


# ---- statistics -------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of ``values``."""
    if not values:
        return float("nan")
    s = sorted(values)
    if len(s) == 1:
        return float(s[0])
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def summary(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """Median with p10/p90 spread, rounded for a small JSON."""
    return {
        "median": round(percentile(values, 50), digits),
        "p10": round(percentile(values, 10), digits),
        "p90": round(percentile(values, 90), digits),
        "n": len(values),
    }


def latency_summary(values_us: Sequence[float]) -> dict[str, Any]:
    return {
        "p50": round(percentile(values_us, 50), 1),
        "p90": round(percentile(values_us, 90), 1),
        "p99": round(percentile(values_us, 99), 1),
        "n": len(values_us),
    }


def time_batch(fn: Callable[[], Any], n: int) -> tuple[float, list[float]]:
    """Run ``fn`` ``n`` times; (mean us per call, per-call us)."""
    per: list[float] = []
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        a = clock()
        fn()
        per.append((clock() - a) / 1000.0)
    return (clock() - t0) / 1000.0 / n, per


def micro(fn: Callable[[], Any], n: int, repeat: int = 5) -> float:
    """Median over ``repeat`` batches of the mean us per call of ``fn`` (pure-CPU costs)."""
    results = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        results.append((time.perf_counter_ns() - t0) / 1000.0 / n)
    return round(percentile(results, 50), 3)


# ---- CPU sampling ------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of process ``pid`` from /proc (None where unavailable)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def main_thread_cpu_seconds(pid: int | None) -> float:
    """CPU seconds process ``pid``'s main thread has run, from /proc's schedstat (nanoseconds, where
    utime and stime tick in 10 ms); ``proc_cpu_seconds`` where there is no schedstat, 0 without /proc."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return proc_cpu_seconds(pid) or 0.0


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes of the machine have spent busy (/proc/stat), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    ticks = [int(x) for x in parts[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    # guest time is already counted in user/nice
    return (sum(ticks[:8]) - idle) / _TICKS


class CpuWindow:
    """Cores used by this process, by the server and by the whole machine between ``start`` and ``stop``."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._self = time.process_time()
        self._server = proc_cpu_seconds(self.server_pid)
        self._machine = machine_busy_seconds()

    def stop(self, client_cpu_s: float | None = None) -> dict[str, float | None]:
        """``client_cpu_s`` overrides this process's CPU time (for worker processes)."""
        wall = time.perf_counter() - self._wall
        mine = (time.process_time() - self._self) if client_cpu_s is None else client_cpu_s
        end = proc_cpu_seconds(self.server_pid)
        server = None if end is None or self._server is None else (end - self._server) / wall
        m_end = machine_busy_seconds()
        machine = None if m_end is None or self._machine is None else (m_end - self._machine) / wall
        return {
            "wall_s": round(wall, 3),
            "client_cores": round(mine / wall, 3),
            "server_cores": _r3(server),
            "machine_cores": _r3(machine),
        }


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def server_pid_of(client: redis.Redis) -> int | None:
    """The server's pid if it runs on this machine (INFO server process_id), else None."""
    try:
        pid = int(client.info("server")["process_id"])
    except Exception:
        return None
    return pid if os.path.exists(f"/proc/{pid}/stat") else None


# ---- payloads ----------------------------------------------------------------


def make_state(target_bytes: int, seed: int = 0) -> dict[str, Any]:
    """A shared_state of about ``target_bytes`` msgpack bytes shaped like agent state.

    Many small fields (notes with ids, text, scores, tags), not one big string,
    so codec costs are realistic.
    """
    import msgpack

    notes: list[dict[str, Any]] = []
    state: dict[str, Any] = {"step": seed, "plan": "summarise the findings", "notes": notes}
    i = 0
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
    while len(msgpack.packb(state)) < target_bytes - 80:
        notes.append(
            {"id": i, "text": " ".join(words[(i + k) % 8] for k in range(6)), "score": i * 0.5, "tags": ["t", "u"]}
        )
        i += 1
    pad = target_bytes - len(msgpack.packb(state)) - 8
    state["pad"] = "p" * max(pad, 0)
    return state


def make_message(i: int, size: int = 200) -> dict[str, Any]:
    """A chat-message-like history entry of roughly ``size`` bytes."""
    return {"role": "user" if i % 2 else "assistant", "n": i, "content": ("m" * size)[: max(size - 30, 1)]}


# ---- environment -------------------------------------------------------------


#: What the harness itself rewrites: a tree changed only there still measures its commit's code.
OUTPUTS = ("benchmarks/README.md", "benchmarks/results")


def git_state(repo: str) -> dict[str, Any]:
    """The commit measured; ``dirty`` if the tree differs from it anywhere but in the harness's outputs."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    dirty = git("status", "--porcelain", "--", ".", *(f":(exclude){p}" for p in OUTPUTS))
    library = git("status", "--porcelain", "--", "redis_agentstate")
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(dirty) if dirty is not None else None,
        "library_uncommitted_changes": bool(library) if library is not None else None,
    }


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def run_meta(command: str, client: redis.Redis | None = None, **extra: Any) -> dict[str, Any]:
    """What every README block's header states: command, start (UTC), commit, machine, load.

    For the commands outside ``python -m benchmarks``; :func:`finish_meta` adds the duration and
    the load at the end.
    """
    from datetime import datetime, timezone

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    meta: dict[str, Any] = {
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": machine_info(),
        "git": git_state(repo),
        "load": {"start": load_average()},
        "t0": time.perf_counter(),
        **extra,
    }
    if client is not None:
        meta["versions"] = {"redis-server": client.info("server").get("redis_version")}
        meta["server"] = {"kind": "private", "modules": server_modules(client)}
    return meta


def finish_meta(meta: dict[str, Any]) -> dict[str, Any]:
    meta["duration_s"] = round(time.perf_counter() - meta.pop("t0", time.perf_counter()), 1)
    meta.setdefault("load", {})["end"] = load_average()
    return meta


def command_line(prog: str, argv: list[str] | None) -> str:
    import shlex

    return f"{prog} {shlex.join(sys.argv[1:] if argv is None else argv)}".strip()


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def versions(client: redis.Redis) -> dict[str, Any]:
    info = client.info("server")
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "redis-server": info.get("redis_version"),
        "redis-py": version_of("redis"),
        "hiredis": version_of("hiredis"),
        "msgpack": version_of("msgpack"),
        "tenacity": version_of("tenacity"),
        "redis-agentstate": version_of("redis-agentstate"),
    }
    for dist in ("python-redis-lock", "pottery", "langgraph-checkpoint-redis", "matplotlib"):
        out[dist] = version_of(dist)
    try:
        rb = subprocess.run(["redis-benchmark", "--version"], capture_output=True, text=True, timeout=5)
        out["redis-benchmark"] = rb.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        out["redis-benchmark"] = None
    return out


def has_json_and_search(client: redis.Redis) -> bool:
    """True if the server has loaded RedisJSON and RediSearch (what langgraph-checkpoint-redis needs)."""
    mods = {m.lower() for m in server_modules(client)}
    return bool({"rejson", "redisjson", "json"} & mods and {"search", "ft", "redisearch"} & mods)


def server_modules(client: redis.Redis) -> list[str]:
    try:
        mods = client.execute_command("MODULE", "LIST")
    except redis.ResponseError:
        return []
    names = []
    for m in mods or []:
        if isinstance(m, dict):
            name = m.get(b"name", m.get("name"))
        else:
            pairs = dict(zip(m[::2], m[1::2], strict=False))
            name = pairs.get(b"name", pairs.get("name"))
        if isinstance(name, bytes):
            name = name.decode()
        if name:
            names.append(str(name))
    return names


# ---- claim_next A/B rounds (benchmarks.priorities, benchmarks.shard_count) -------------------------

#: One contender's run of calls: (client us, server us, round trips) per call.
Sample = tuple[float, float, float]


def server_usec(admin: redis.Redis) -> float:
    """The server's time in every command since the last ``CONFIG RESETSTAT`` (``INFO commandstats``)."""
    return sum(float(v.get("usec", 0)) for v in admin.info("commandstats").values() if isinstance(v, dict))


def _drivers_of(pkg: Any) -> Any:
    # A package of either layout (a base commit's may predate wire/): its drivers module.
    try:
        return importlib.import_module(f"{pkg.__name__}.wire.drivers")
    except ModuleNotFoundError:
        return importlib.import_module(f"{pkg.__name__}._ops.drivers")


def count_requests(pkg: Any) -> list[int]:
    """Counts the requests ``pkg``'s sync driver sends (one per round trip): ``[n]``, updated in place
    (``uncount_requests`` puts the driver back)."""
    drivers = _drivers_of(pkg)
    send = drivers._send_sync
    sent = [0]

    def counted(client: Any, scripts: Any, req: Any) -> Any:
        sent[0] += 1
        return send(client, scripts, req)

    counted.uncounted = send  # type: ignore[attr-defined]
    drivers._send_sync = counted
    return sent


def uncount_requests(*pkgs: Any) -> None:
    """The sync drivers of ``pkgs`` as they were before ``count_requests``."""
    for pkg in pkgs:
        drivers = _drivers_of(pkg)
        drivers._send_sync = getattr(drivers._send_sync, "uncounted", drivers._send_sync)


def claim_next_sample(store: Any, admin: redis.Redis, sent: list[int], calls: int, lease_ms: int) -> Sample:
    """``calls`` busy ``claim_next`` calls of ``store`` (each must claim), timed: a :data:`Sample` per call
    (``sent``: the counter of :func:`count_requests` for the store's package)."""
    admin.config_resetstat()
    before, t0 = sent[0], time.perf_counter()
    for i in range(calls):
        assert store.claim_next(token=f"w{i}", lease_ms=lease_ms) is not None
    wall = time.perf_counter() - t0
    return wall / calls * 1e6, server_usec(admin) / calls, (sent[0] - before) / calls


def interleaved_rounds(
    contenders: dict[str, Callable[[], Sample]], rounds: int, warmups: int = 1
) -> dict[str, dict[str, list[float]]]:
    """``warmups`` passes over every contender, then ``rounds`` rounds in an order shuffled per round;
    per contender, the client us, server us and round trips of each round (printed as they come)."""
    results: dict[str, dict[str, list[float]]] = {n: {"client": [], "server": [], "trips": []} for n in contenders}
    for _ in range(warmups):
        for fn in contenders.values():
            fn()
    for rnd in range(rounds):
        order = list(contenders)
        random.shuffle(order)
        got = {name: contenders[name]() for name in order}
        for name, (wall, srv, trips) in got.items():
            results[name]["client"].append(wall)
            results[name]["server"].append(srv)
            results[name]["trips"].append(trips)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {w:.0f} us ({s:.0f} server, {t:.2f} trips)"
                                               for k, (w, s, t) in got.items()), flush=True)  # fmt: skip
    for name, r in results.items():
        print(f"{name}: median {statistics.median(r['client']):.0f} us per call, server "
              f"{statistics.median(r['server']):.1f} us, {statistics.median(r['trips']):.2f} round trips")  # fmt: skip
    return results


def sample_cells(r: dict[str, list[float]]) -> str:
    """A contender's rounds as table cells: client us, server us (medians, min in brackets), round trips."""
    client, server = r["client"], r["server"]
    return (f"{statistics.median(client):.0f} ({min(client):.0f}) | {statistics.median(server):.1f} "
            f"({min(server):.1f}) | {statistics.median(r['trips']):.2f}")  # fmt: skip


def count_round_trips() -> Callable[[], int]:
    """Counts every command or pipeline a redis-py connection of this process writes, sync or asyncio
    (one write, one round trip: connection handshakes and pub/sub subscriptions included, as they are
    round trips too); the counter's reader."""
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    lock, sent = threading.Lock(), [0]

    def one() -> None:
        with lock:
            sent[0] += 1

    sync_send, async_send = sconn.AbstractConnection.send_packed_command, aconn.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        one()
        sync_send(self, command, check_health)

    async def acounted(self: Any, command: Any, check_health: bool = True) -> None:
        one()
        await async_send(self, command, check_health)

    sconn.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    aconn.AbstractConnection.send_packed_command = acounted  # type: ignore[method-assign]
    return lambda: sent[0]


#: ``python -c SERVE_COUNTED FILE serve ...``: ``agentstate serve`` with its round trips counted
#: (``count_round_trips``), the count written to FILE as "<count> <unix time>" every 10 ms.
SERVE_COUNTED = (
    "import os, sys, threading, time\n"
    "from benchmarks._util import count_round_trips\n"
    "trips, path = count_round_trips(), sys.argv[1]\n"
    "def keep():\n"
    "    while True:\n"
    "        with open(path + '.tmp', 'w') as f: f.write(f'{trips()} {time.time()}')\n"
    "        os.replace(path + '.tmp', path)\n"
    "        time.sleep(0.01)\n"
    "threading.Thread(target=keep, daemon=True).start()\n"
    "from redis_agentstate.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def counted_trips(path: str, after: float, timeout_s: float = 5.0) -> int:
    """The count a ``SERVE_COUNTED`` process wrote to ``path`` at a time past ``after`` (unix seconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError):
            with open(path, encoding="utf-8") as f:
                count, at = f.read().split()
            if float(at) > after:
                return int(count)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: no round-trip count written after {after}")
        time.sleep(0.005)
