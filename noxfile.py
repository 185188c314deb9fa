"""The test suite on every supported Python (``requires-python = ">=3.10"``).

``nox`` runs ``tests`` on 3.10, 3.11, 3.12 and 3.13, each in its own virtualenv
with the project's test extras. 3.11 runs README's test command, as ``.ci/run`` does:
the fast default suite, or the whole suite with ``AGENTSTATE_FULL_SUITE=1`` (or
``CI=true``; tests/conftest.py), which the session inherits from the environment.
The others run ``SUBSET``: the fast default suite whatever the environment says,
less its fakeredis variants (marked ``fakeredis``), the fault-injection run, the docs
site build and the split's own check: the store tests that fall on the real server,
sync and async in each file, with the CLI, README, guides, TLS, Valkey and packaging
tests. The interpreter runs our code the same on any backend; the whole matrix runs
on 3.11.
Arguments after ``--`` replace the pytest arguments: ``nox -s tests-3.13 -- tests/test_kv.py -x``.

Interpreters come from pyenv first (``$PYENV_ROOT/versions/3.X.*``, where a
shim for a version that is not pyenv's global one does not run), then from
``python3.X`` on PATH. Nothing is downloaded: a missing interpreter is an
error under ``CI`` (nox's default there) and a skip elsewhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
FULL = "3.11"
# SUBSET: the fast default suite (AGENTSTATE_FULL_SUITE=0 in the session, whatever .ci/run
# exports), less what 3.11 runs for every version: the fakeredis variants (fakeredis runs the
# Lua in Python, the same on every interpreter), the fault-injection run (processes SIGKILLed on
# a timer, side by side with two other sessions on two cores), the docs site (built once, on
# 3.11 with the docs extra; the guides' code runs on every version) and the split's check.
SUBSET = [
    # One process each, not pyproject's xdist workers: .ci/run runs the three subset sessions
    # side by side, and six workers on two cores starved the timing tests (socket timeouts, TTLs).
    "-n",
    "0",
    "-m",
    "not chaos and not fakeredis",
    "--deselect=tests/test_docs.py::test_the_site_builds_strict",
    # The fast/full split is checked by collecting the suite, the same on every interpreter.
    "--ignore=tests/test_suite_layout.py",
]
FULL_SUITE_ENV = "AGENTSTATE_FULL_SUITE"

nox.options.sessions = ["tests"]
nox.options.download_python = "never"
nox.options.reuse_venv = "yes"


def _pyenv_bins(versions: list[str]) -> list[str]:
    """The ``bin`` folder of pyenv's newest patch release of each version, where pyenv has one."""
    versions_dir = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    bins = []
    for version in versions:
        found = []
        for path in versions_dir.glob(f"{version}.*"):
            match = re.fullmatch(re.escape(version) + r"\.(\d+)", path.name)
            if match and (path / "bin" / f"python{version}").is_file():
                found.append((int(match.group(1)), path / "bin"))
        if found:
            bins.append(str(max(found)[1]))
    return bins


os.environ["PATH"] = os.pathsep.join([*_pyenv_bins(PYTHONS), os.environ.get("PATH", "")])


@nox.session(python=PYTHONS, allow_parallel=True)  # private servers and ports: safe side by side
def tests(session: nox.Session) -> None:
    """README's test command on 3.11 (``AGENTSTATE_FULL_SUITE`` applies), ``SUBSET`` on the other versions."""
    # The interpreter discovery picks by name; make sure the session runs the version it is named for.
    wanted = tuple(int(part) for part in str(session.python).split("."))
    check = f"import sys; sys.exit(0 if sys.version_info[:2] == {wanted!r} else 'this is ' + sys.version)"
    session.run("python", "-c", check, silent=True)
    session.install("-e", ".[test]")
    if session.python == FULL or session.posargs:
        session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *(session.posargs or []))
        return
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *SUBSET, env={FULL_SUITE_ENV: "0"})


#: LangGraph's own test dependencies (its pyproject's ``test`` group) that its checkpointer
#: tests import: the conftest imports the SQLite and Postgres savers even when none runs.
LANGGRAPH_SUITE_DEPS = [
    "pytest",
    "pytest-mock",
    "pytest-xdist",
    "pytest-repeat",
    "pytest-dotenv",
    "syrupy",
    "httpx",
    "langchain-core>=1.0.0",
    "langgraph-prebuilt",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg[binary]",
    "psycopg-pool",
    "pycryptodome",
    "langgraph-sdk",
    # tools/langgraph_suite.py fetches LangGraph's sources with `pip download`; a uv-made session has no pip.
    "pip",
]


@nox.session(python=FULL, default=False)
def langgraph_suite(session: nox.Session) -> None:
    """LangGraph's own checkpointer tests with our savers beside its in-memory one (tools/langgraph_suite.py).

    Not part of ``.ci/run``: it downloads LangGraph's source distribution. ``nox -s langgraph_suite``;
    ``-- --workers 1`` and other arguments go to the script.
    """
    # Not the test extra: LangGraph's suite runs under anyio, as in its own environment, without
    # pytest-asyncio. The langgraph extra is the version the judgement is about.
    session.install("-e", ".[langgraph]", *LANGGRAPH_SUITE_DEPS)
    session.run("python", "tools/langgraph_suite.py", *session.posargs)
