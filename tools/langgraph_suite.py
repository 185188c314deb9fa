"""LangGraph's own test suite as the judge of our savers: ``nox -s langgraph_suite``.

LangGraph parametrizes much of its suite over two fixtures, ``sync_checkpointer`` and
``async_checkpointer`` (its ``tests/conftest.py``: an in-memory saver, SQLite, Postgres).
This script fetches the source distribution of the installed ``langgraph`` (its tests
are not in the wheel), appends to that conftest a redefinition of both fixtures with
three parameters, and runs every test that uses one of them:

* ``memory``: LangGraph's own ``MemorySaverAssertImmutable``, the reference;
* ``agentstate``: ``AgentStateSaver`` / ``AsyncAgentStateSaver`` on a private redis-server
  (one namespace per test);
* ``agentstate_aes`` (sync): the same with LangGraph's ``EncryptedSerializer`` (AES), as
  LangGraph runs ``sqlite_aes``.

The verdict compares outcomes test by test: each test that passes with ``memory`` must
pass with ours. A test that fails with ``memory`` too is LangGraph's own problem on this
machine (missing service, flaky timing) and is reported apart, not counted against us.
It exits non-zero if any test passed with ``memory`` and not with ours.

``python tools/langgraph_suite.py [--workers N] [--keep DIR] [-- PYTEST ARGS]`` runs it in the
current interpreter, which needs LangGraph's test dependencies (``noxfile.LANGGRAPH_SUITE_DEPS``);
the nox session installs them in a virtualenv of its own.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: Appended to LangGraph's tests/conftest.py: later definitions of a module's fixtures win.
FIXTURES = '''

# ---- appended by redis_agentstate tools/langgraph_suite.py -----------------------------------
import secrets as _as_secrets

import redis as _as_redis
import redis.asyncio as _as_aioredis

from redis_agentstate.langgraph import AgentStateSaver as _AsSaver
from redis_agentstate.langgraph import AsyncAgentStateSaver as _AsAsyncSaver
from tests.conftest_checkpointer import STRICT_MSGPACK as _AS_STRICT
from tests.conftest_checkpointer import _checkpointer_memory as _as_memory
from tests.conftest_checkpointer import _strict_msgpack_serde as _as_strict_serde

_AS_URL = os.environ["AGENTSTATE_SUITE_URL"]


def _as_serde(aes):
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    if aes:
        return EncryptedSerializer.from_pycryptodome_aes(key=b"1234567890123456")
    # LANGGRAPH_STRICT_MSGPACK=true gives the in-memory saver a strict serde: ours gets the same.
    return _as_strict_serde() if _AS_STRICT else None


def _as_namespace():
    # Not uuid4: tests with LangGraph's deterministic_uuids fixture count the uuid4 calls they see.
    return "lgsuite-" + _as_secrets.token_hex(5)


@pytest.fixture(scope="function", params=["memory", "agentstate", "agentstate_aes"])
def sync_checkpointer(request):
    if request.param == "memory":
        with _as_memory() as checkpointer:
            yield checkpointer
        return
    client = _as_redis.Redis.from_url(_AS_URL)
    try:
        yield _AsSaver(client, namespace=_as_namespace(), serde=_as_serde(request.param == "agentstate_aes"))
    finally:
        client.close()


@pytest.fixture(scope="function", params=["memory", "agentstate"])
async def async_checkpointer(request):
    if request.param == "memory":
        with _as_memory() as checkpointer:
            yield checkpointer
        return
    client = _as_aioredis.Redis.from_url(_AS_URL)
    try:
        yield _AsAsyncSaver(client, namespace=_as_namespace(), serde=_as_serde(False))
    finally:
        await client.aclose()


def pytest_collection_modifyitems(config, items):
    """Only the tests that take a checkpointer: the rest of LangGraph's suite does not reach a saver."""
    keep = [i for i in items if {"sync_checkpointer", "async_checkpointer"} & set(getattr(i, "fixturenames", ()))]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
'''

OURS = ("agentstate", "agentstate_aes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(version: str, into: Path) -> Path:
    """LangGraph's source distribution of ``version``, unpacked in ``into``: its root folder."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"langgraph=={version}", "--no-binary", ":all:", "--no-deps",
         "--quiet", "-d", str(into)],
        check=True,
    )  # fmt: skip
    (archive,) = into.glob("langgraph-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    root = into / f"langgraph-{version}"
    conftest = root / "tests" / "conftest.py"
    text = conftest.read_text()
    helpers = (root / "tests" / "conftest_checkpointer.py").read_text()
    for needed, where in (("def sync_checkpointer", text), ("def async_checkpointer", text),
                          ("def _checkpointer_memory(", helpers), ("def _strict_msgpack_serde(", helpers),
                          ("STRICT_MSGPACK =", helpers)):  # fmt: skip
        if needed not in where:
            raise SystemExit(
                f"langgraph {version}'s conftest has no {needed!r}: tools/langgraph_suite.py needs updating"
            )
    conftest.write_text(text + FIXTURES)
    return root


def _outcome(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    return "skipped" if case.find("skipped") is not None else "passed"


def verdict(junit: Path) -> dict[str, object]:
    """Each test's outcome per checkpointer, and the tests that passed with ``memory`` but not with ours.

    A test of ours is paired with the one whose id has ``memory`` in the place of ours
    (``test_x[agentstate-sqlite]`` with ``test_x[memory-sqlite]``: another fixture's
    parameter may be called ``memory`` too, LangGraph's cache is).
    """
    outcome = {
        f"{c.get('classname')}::{c.get('name')}": _outcome(c) for c in ET.parse(junit).getroot().iter("testcase")
    }
    counts: Counter[str] = Counter()
    worse: list[str] = []
    for test, got in sorted(outcome.items()):
        match = re.search(r"\[(.*)\]$", test)
        if not match:
            continue
        parts = match.group(1).split("-")
        for i, part in enumerate(parts):
            if part == "memory" and any(
                f"{test[: match.start()]}[{'-'.join([*parts[:i], ours, *parts[i + 1 :]])}]" in outcome for ours in OURS
            ):
                counts[f"memory {got}"] += 1
            if part not in OURS:
                continue
            reference = f"{test[: match.start()]}[{'-'.join([*parts[:i], 'memory', *parts[i + 1 :]])}]"
            ref = outcome.get(reference)
            counts[f"{part} {got}"] += 1
            if ref is None:
                counts[f"{part} without a memory twin"] += 1
            elif ref == "passed" and got != "passed":
                worse.append(f"{test}: memory passed, {part} {got}")
            elif ref == "passed":
                counts[f"{part} passed where memory passed"] += 1
    return {"counts": dict(sorted(counts.items())), "worse": worse}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="auto", help="pytest-xdist workers (default: auto)")
    parser.add_argument("--keep", type=Path, help="unpack and run in this folder, and keep it")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    version = importlib.metadata.version("langgraph")
    work = args.keep or Path(tempfile.mkdtemp(prefix="agentstate-lgsuite-"))
    work.mkdir(parents=True, exist_ok=True)
    redis_dir = Path(tempfile.mkdtemp(prefix="agentstate-lgsuite-redis-"))
    port = _free_port()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(redis_dir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        root = fetch(version, work)
        junit = work / "junit.xml"
        env = {**os.environ, "AGENTSTATE_SUITE_URL": f"redis://127.0.0.1:{port}/0", "NO_DOCKER": "true"}
        started = time.monotonic()
        # LangGraph's own pytest settings (its pyproject) apply: it runs from its root.
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-n", args.workers,
             f"--junitxml={junit}", *args.pytest_args],
            cwd=root, env=env,
        )  # fmt: skip
        took = time.monotonic() - started
        if not junit.exists():
            print(f"langgraph {version}: pytest exited {run.returncode} without a report", file=sys.stderr)
            return 2
        result = verdict(junit)
        print(f"\nlanggraph {version}'s own checkpointer tests, {took:.0f} s (pytest exit {run.returncode}):")
        for key, n in result["counts"].items():  # type: ignore[union-attr]
            print(f"  {key}: {n}")
        worse = result["worse"]
        assert isinstance(worse, list)
        for line in worse:
            print(f"  WORSE THAN MEMORY: {line}")
        print(f"verdict: {'PASS' if not worse else 'FAIL'}: {len(worse)} test(s) passed with memory and not with ours")
        return 0 if not worse else 1
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(redis_dir, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
