"""LangGraph's own store tests as the judge of ``AgentStateStore``: ``python tools/langgraph_store_suite.py``.

langgraph-checkpoint's ``tests/test_store.py`` is written for ``InMemoryStore`` and builds it
directly (``InMemoryStore(index=...)``) rather than through a fixture: the construction is the
fixture. This script fetches the source distribution of the installed ``langgraph-checkpoint``
(its tests are not in the wheel; ``pip download``, as tools/langgraph_suite.py fetches langgraph),
and runs that file twice, on a private redis-server:

* ``in_memory``: as shipped, the reference;
* ``agentstate``: a copy whose one change is its import line, so that ``InMemoryStore(**kwargs)``
  builds an ``AgentStateStore(redis.Redis(...), <a namespace of its own>, **kwargs)``.

The verdict pairs the two runs test by test: every test that passes with ``in_memory`` must
pass with ours. Tests that never construct a store (``get_text_at_path``, the batching helpers,
namespace validation through a mock) run in both and pass the same; they are counted, not hidden.
It exits non-zero if a test passed with ``in_memory`` and not with ours.

``--pregel`` runs the other judge: every test of the langgraph sdist that takes LangGraph's
``sync_store`` / ``async_store`` fixture (``tests/test_pregel.py``, ``tests/test_pregel_async.py``),
with those fixtures redefined (appended to its conftest, after tools/langgraph_suite.py's savers)
to ``in_memory`` and ``agentstate_store``, and each test with ours paired with the same test with
``in_memory`` (the checkpointer parameter alike).

``python tools/langgraph_store_suite.py [--keep DIR] [-- PYTEST ARGS]`` needs the package and
``pytest``, ``pytest-asyncio``, ``pytest-mock`` in the current interpreter.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from langgraph_suite import _free_port, _outcome

IMPORT = "from langgraph.store.memory import InMemoryStore\n"
#: Replaces IMPORT in the copy run against our store.
FACTORY = '''import itertools as _as_itertools
import os as _as_os

import redis as _as_redis

from redis_agentstate.langgraph import AgentStateStore as _AsStore

_AS_COUNTER = _as_itertools.count()


class InMemoryStore(_AsStore):
    """An AgentStateStore on the suite's redis-server, in a namespace of its own per store (a class, as
    the tests also spy on ``InMemoryStore.batch``)."""

    def __init__(self, **kwargs):
        client = _as_redis.Redis.from_url(_as_os.environ["AGENTSTATE_SUITE_URL"])
        super().__init__(client, f"lgstore-{_as_os.getpid()}-{next(_AS_COUNTER)}", **kwargs)
'''


#: Appended to langgraph's tests/conftest.py (after langgraph_suite.FIXTURES) by ``--pregel``.
STORE_FIXTURES = '''

# ---- appended by redis_agentstate tools/langgraph_store_suite.py ------------------------------
from redis_agentstate.langgraph import AgentStateStore as _AsStore
from redis_agentstate.langgraph import AsyncAgentStateStore as _AsAsyncStore


@pytest.fixture(scope="function", params=["in_memory", "agentstate_store"])
def sync_store(request):
    if request.param == "in_memory":
        with _store_memory() as store:
            yield store
        return
    client = _as_redis.Redis.from_url(_AS_URL)
    try:
        yield _AsStore(client, "lgstore-" + _as_secrets.token_hex(5))
    finally:
        client.close()


@pytest.fixture(scope="function", params=["in_memory", "agentstate_store"])
async def async_store(request):
    if request.param == "in_memory":
        with _store_memory() as store:
            yield store
        return
    client = _as_aioredis.Redis.from_url(_AS_URL)
    try:
        async with _AsAsyncStore(client, "lgstore-" + _as_secrets.token_hex(5)) as store:
            yield store
    finally:
        await client.aclose()


def pytest_collection_modifyitems(config, items):
    """Only the tests that take a store."""
    keep = [i for i in items if {"sync_store", "async_store"} & set(getattr(i, "fixturenames", ()))]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
'''


def pregel(work: Path, env: dict[str, str], extra: list[str]) -> dict[str, object]:
    """langgraph's tests that take a store, with ours beside ``in_memory``, paired test by test."""
    from langgraph_suite import fetch as fetch_langgraph

    root = fetch_langgraph(importlib.metadata.version("langgraph"), work)
    conftest = root / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + STORE_FIXTURES)
    junit = root / "junit-pregel.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_pregel.py", "tests/test_pregel_async.py", "-q",
         "-p", "no:cacheprovider", "-n", "1", f"--junitxml={junit}", *extra],
        cwd=root, env={**env, "NO_DOCKER": "true"}, check=False,
    )  # fmt: skip
    outcome = {
        f"{c.get('classname')}::{c.get('name')}": _outcome(c) for c in ET.parse(junit).getroot().iter("testcase")
    }
    reference = {t.replace("agentstate_store", "in_memory"): o for t, o in outcome.items() if "agentstate_store" in t}
    memory = {t: o for t, o in outcome.items() if "in_memory" in t}
    return verdict(memory, reference)


#: Appended to a copy of langgraph-checkpoint-postgres's tests/test_store.py by ``--postgres``: its
#: fixtures (``store``, ``vector_store``, and the ``_create_vector_store`` builder the vector tests
#: call) redefined to build AgentStateStores; later definitions of a module's names win.
POSTGRES_FIXTURES = """

# ---- appended by redis_agentstate tools/langgraph_store_suite.py ------------------------------
import os as _as_os
import secrets as _as_secrets

import redis as _as_redis

from redis_agentstate.langgraph import AgentStateStore as _AsStore


@pytest.fixture(scope="function", autouse=True)
def clear_test_db():
    # The conftest's Postgres cleanup, not needed: each store has a namespace of its own.
    return None


def _as_store(**kwargs):
    client = _as_redis.Redis.from_url(_as_os.environ["AGENTSTATE_SUITE_URL"])
    return _AsStore(client, "lgpg-" + _as_secrets.token_hex(5), **kwargs)


@pytest.fixture(scope="function", params=["agentstate"])
def store(request):
    s = _as_store(ttl={"default_ttl": TTL_MINUTES, "refresh_on_read": True, "sweep_interval_minutes": TTL_MINUTES / 2})
    s.start_ttl_sweeper()
    yield s
    s.stop_ttl_sweeper()


@contextmanager
def _create_vector_store(vector_type, distance_type, fake_embeddings, text_fields=None, enable_ttl=True):
    index = {"dims": fake_embeddings.dims, "embed": fake_embeddings, "fields": text_fields}
    ttl = {"default_ttl": 2, "refresh_on_read": True} if enable_ttl else None
    yield _as_store(index=index, ttl=ttl)
"""


#: The same for a copy of its tests/test_async_store.py (an AsyncAgentStateStore per test).
POSTGRES_ASYNC_FIXTURES = """

# ---- appended by redis_agentstate tools/langgraph_store_suite.py ------------------------------
import os as _as_os
import secrets as _as_secrets

import redis.asyncio as _as_aioredis

from redis_agentstate.langgraph import AsyncAgentStateStore as _AsAsyncStore


@pytest.fixture(scope="function", autouse=True)
def clear_test_db():
    # The conftest's Postgres cleanup, not needed: each store has a namespace of its own.
    return None


@asynccontextmanager
async def _as_store(**kwargs):
    client = _as_aioredis.Redis.from_url(_as_os.environ["AGENTSTATE_SUITE_URL"])
    try:
        async with _AsAsyncStore(client, "lgpga-" + _as_secrets.token_hex(5), **kwargs) as s:
            yield s
    finally:
        await client.aclose()


@pytest.fixture(scope="function", params=["agentstate"])
async def store(request):
    ttl = {"default_ttl": TTL_MINUTES, "refresh_on_read": True, "sweep_interval_minutes": TTL_MINUTES / 2}
    async with _as_store(ttl=ttl) as s:
        await s.start_ttl_sweeper()
        yield s


@asynccontextmanager
async def _create_vector_store(vector_type, distance_type, fake_embeddings, text_fields=None):
    index = {"dims": fake_embeddings.dims, "embed": fake_embeddings, "fields": text_fields}
    async with _as_store(index=index) as s:
        yield s
"""


def postgres(work: Path, env: dict[str, str], extra: list[str]) -> dict[str, str]:
    """langgraph-checkpoint-postgres's store tests against AgentStateStore: each test's outcome."""
    version = importlib.metadata.version("langgraph-checkpoint-postgres")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"langgraph-checkpoint-postgres=={version}", "--no-binary",
         ":all:", "--no-deps", "--quiet", "-d", str(work)],
        check=True,
    )  # fmt: skip
    (archive,) = work.glob("langgraph_checkpoint_postgres-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    root = work / f"langgraph_checkpoint_postgres-{version}"
    outcome: dict[str, str] = {}
    for name, appended in (("test_store", POSTGRES_FIXTURES), ("test_async_store", POSTGRES_ASYNC_FIXTURES)):
        text = (root / "tests" / f"{name}.py").read_text()
        (root / "tests" / f"{name}_agentstate.py").write_text(text + appended)
        got = run(root, f"{name}_agentstate", env, extra)
        outcome.update({f"{name}.py::{test}": o for test, o in got.items()})
    return outcome


def fetch(version: str, into: Path) -> Path:
    """langgraph-checkpoint's source distribution of ``version``, unpacked in ``into``: its root folder,
    with ``tests/test_store_agentstate.py`` beside ``tests/test_store.py``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"langgraph-checkpoint=={version}", "--no-binary", ":all:",
         "--no-deps", "--quiet", "-d", str(into)],
        check=True,
    )  # fmt: skip
    (archive,) = into.glob("langgraph_checkpoint-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    root = into / f"langgraph_checkpoint-{version}"
    original = root / "tests" / "test_store.py"
    text = original.read_text()
    if text.count(IMPORT) != 1:
        raise SystemExit(f"langgraph-checkpoint {version}'s test_store.py does not import InMemoryStore as expected")
    (root / "tests" / "test_store_agentstate.py").write_text(text.replace(IMPORT, FACTORY))
    return root


def run(root: Path, name: str, env: dict[str, str], extra: list[str]) -> dict[str, str]:
    junit = root / f"junit-{name}.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", f"tests/{name}.py", "-p", "no:cacheprovider", "-q", "--junitxml",
         str(junit), "-o", "asyncio_mode=auto", *extra],
        cwd=root, env=env, check=False,
    )  # fmt: skip
    return {c.get("name", ""): _outcome(c) for c in ET.parse(junit).getroot().iter("testcase")}


def verdict(reference: dict[str, str], ours: dict[str, str]) -> dict[str, object]:
    both = sorted(set(reference) | set(ours))
    passed_ref = [t for t in both if reference.get(t) == "passed"]
    worse = [
        f"{t}: in_memory passed, agentstate {ours.get(t, 'missing')}" for t in passed_ref if ours.get(t) != "passed"
    ]
    return {
        "tests": len(both),
        "in_memory passed": len(passed_ref),
        "agentstate passed where in_memory passed": len(passed_ref) - len(worse),
        "in_memory not passed": sorted(f"{t}: {reference.get(t, 'missing')}" for t in both if t not in passed_ref),
        "worse": worse,
    }


#: The tests of langgraph-checkpoint-postgres's store suites that cannot apply to ours, by name (a
#: prefix of it), with the reason; any other test that does not pass fails the run.
POSTGRES_NOT_APPLICABLE = {
    "test_store.py::test_omit_expired_": "expires rows through Postgres internals (store._cursor(), SQL updates)",
    "test_async_store.py::test_omit_expired_": "expires rows through Postgres internals (store._cursor(), SQL updates)",
    "test_async_store.py::test_abatch_uses_single_pool_checkout": "builds a PostgresStore of its own and counts its "
    "connection pool's checkouts",
    "test_store.py::test_scores[": "only its halfvec-l2 cases: they rank by L2 distance; ours, as InMemoryStore, by "
    "cosine",
}


def postgres_report(outcome: dict[str, str]) -> dict[str, object]:
    """Counts, the tests that cannot apply (each with its reason) and the failures nothing explains."""
    not_applicable: dict[str, str] = {}
    unexplained: list[str] = []
    for test, result in sorted(outcome.items()):
        if result == "passed":
            continue
        reason = next((why for prefix, why in POSTGRES_NOT_APPLICABLE.items() if test.startswith(prefix)), None)
        if reason is not None and (not test.startswith("test_store.py::test_scores[") or "halfvec-l2" in test):
            not_applicable[test] = f"{result}: {reason}"
        else:
            unexplained.append(f"{test}: {result}")
    return {
        "tests": len(outcome),
        "agentstate passed": sum(o == "passed" for o in outcome.values()),
        "not applicable": not_applicable,
        "worse": unexplained,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="unpack and run in this folder, and keep it")
    parser.add_argument("--pregel", action="store_true", help="langgraph's tests that take a store, not test_store.py")
    parser.add_argument("--postgres", action="store_true", help="langgraph-checkpoint-postgres's tests/test_store.py")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    version = importlib.metadata.version("langgraph-checkpoint")
    work = args.keep or Path(tempfile.mkdtemp(prefix="agentstate-lgstore-"))
    work.mkdir(parents=True, exist_ok=True)
    redis_dir = Path(tempfile.mkdtemp(prefix="agentstate-lgstore-redis-"))
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    port = _free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(redis_dir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(0.3)
        env = {**os.environ, "AGENTSTATE_SUITE_URL": f"redis://127.0.0.1:{port}/0"}
        if args.pregel:
            report = pregel(work, env, args.pytest_args)
        elif args.postgres:
            pg = postgres_report(postgres(work, env, args.pytest_args))
            print(json.dumps(pg, indent=2))
            return 1 if pg["worse"] or not pg["agentstate passed"] else 0
        else:
            root = fetch(version, work)
            reference = run(root, "test_store", env, args.pytest_args)
            ours = run(root, "test_store_agentstate", env, args.pytest_args)
            report = verdict(reference, ours)
        print(json.dumps(report, indent=2))
        if not report["in_memory passed"]:
            # A judge that ran nothing (a missing test dependency such as pytest-mock) is no verdict.
            print("no reference test passed: the suite did not run (see pytest's output above)", file=sys.stderr)
            return 1
        return 1 if report["worse"] else 0
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(redis_dir, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
