"""Two OS processes race one LangGraph thread on a real redis-server.

With leases exactly one runs; a holder frozen with SIGSTOP past its lease is
taken over and its late write on resume is refused; the checkpoint chain stays
linear. Without leases the same race forks the thread (what the lease prevents).
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import require_real

from redis_agentstate.langgraph import AgentStateSaver

pytestmark = [pytest.mark.real, pytest.mark.slow]

WORKER = Path(__file__).with_name("langgraph_race_worker.py")


def _spawn(url: str, namespace: str, name: str, mode: str, *, lease_ms: int = 30_000, sleep_s: float = 1.0) -> Any:
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, namespace, "thread-1", name, mode, str(lease_ms), str(sleep_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: Any) -> list[str]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.split()


def _forks(url: str, namespace: str) -> tuple[int, list[Any]]:
    """(checkpoints that have more than one child, every checkpoint newest first)."""
    saver = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
    history = list(saver.list({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}}))
    children = collections.Counter(
        t.parent_config["configurable"]["checkpoint_id"] for t in history if t.parent_config is not None
    )
    return sum(1 for n in children.values() if n > 1), history


def _linear(history: list[Any]) -> bool:
    return all(
        newer.parent_config is not None
        and newer.parent_config["configurable"]["checkpoint_id"] == older.config["configurable"]["checkpoint_id"]
        for newer, older in itertools.pairwise(history)
    )


@pytest.fixture
def url(real_server: Any) -> str:
    return require_real(real_server)


def _seed(url: str, namespace: str) -> None:
    proc = _spawn(url, namespace, "seed", "nolease", sleep_s=0)
    assert "DONE" in _finish(proc)


def test_with_leases_exactly_one_runs(url: str, namespace: str):
    _seed(url, namespace)
    # Each holds its step 5 s: the two must overlap, and under the full suite's load one process started
    # more than 1 s after the other had finished its step (CI: both ran, one after the other).
    procs = [_spawn(url, namespace, name, "lease", sleep_s=5.0) for name in ("a", "b")]
    outs = [_finish(p) for p in procs]
    ran = [o for o in outs if "DONE" in o]
    busy = [o for o in outs if "BUSY" in o]
    assert len(ran) == 1 and len(busy) == 1, outs
    assert "RAN" not in busy[0]
    forks, history = _forks(url, namespace)
    assert forks == 0 and _linear(history)


def test_a_frozen_holder_is_taken_over_and_its_late_write_refused(url: str, namespace: str):
    _seed(url, namespace)
    a = _spawn(url, namespace, "a", "lease", lease_ms=600, sleep_s=0.5)
    assert a.stdout.readline().split() == ["RAN", "a"]  # A holds the lease and is inside its step
    os.kill(a.pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # A's 600 ms lease runs out on the server's clock
        b = _spawn(url, namespace, "b", "lease", sleep_s=0)
        assert _finish(b) == ["RAN", "b", "DONE"]
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert _finish(a) == ["LEASE_LOST"]
    forks, history = _forks(url, namespace)
    assert forks == 0 and _linear(history)
    messages = history[0].checkpoint["channel_values"]["messages"]
    assert any(m.startswith("by b") for m in messages)
    # A's input checkpoint was written under its live lease; its step's result, late, was refused.
    assert not any(m.startswith("by a") for m in messages)
    assert all(not m.startswith("by a") for t in history for m in t.checkpoint["channel_values"].get("messages", []))


def test_without_leases_the_same_race_forks_the_thread(url: str, namespace: str):
    _seed(url, namespace)
    procs = [_spawn(url, namespace, name, "together", sleep_s=0.1) for name in ("a", "b")]
    outs = [_finish(p) for p in procs]
    assert all("DONE" in o for o in outs)
    forks, history = _forks(url, namespace)
    assert forks >= 1 and not _linear(history)
