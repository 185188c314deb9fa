"""README's examples run as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_takeover_example_runs_on_an_embedded_server() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "takeover.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    assert "B cannot claim cycle 2 while A's lease is live" in out
    assert "A's stale commit accepted? False" in out
    assert "day 2: Belém (by B)" in out and "Sintra" not in out.split("final:")[1]


def test_langgraph_two_workers_example_runs_in_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "langgraph_two_workers.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    assert "answer to 'make it three, actually' (having seen 3 messages)" in out
    assert "gets ThreadBusy at once" in out
    assert "6 checkpoints, chain linear: True" in out


def test_langgraph_fleet_example_serves_double_texted_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "langgraph_fleet.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    ).stdout
    assert "first run: success (4 events, none missed or repeated)" in out
    assert "'for two': interrupted (interrupt)" in out
    assert "'make it three, actually': success" in out
    assert "runs: ['success', 'interrupted', 'success']" in out
