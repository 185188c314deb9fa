"""``agentstate demo``: the fence shown every run, a refused namespace starts nothing, every
started server and worker is stopped, and an interrupted run leaves the progress bar's line."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from redis_agentstate.errors import InvalidArgument
from redis_agentstate.fleet import demo as demo_mod
from redis_agentstate.fleet.demo import DemoConfig, run_demo


def agentstate(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "redis_agentstate", *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def _processes_in(directory: Path) -> list[int]:
    """Live processes whose working directory is under ``directory`` (Linux ``/proc``): a
    redis-server runs in its ``--dir`` (its command line it rewrites, so that cannot tell)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(directory) + os.sep):
            found.append(int(entry))
    return found


# ---- the fence, every run ----------------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.slow
def test_the_frozen_workers_task_is_taken_over_before_it_wakes_so_the_fence_shows(private_server: Any) -> None:
    """One free worker (3: one killed, one frozen) with a queue of older tasks in front of the
    frozen one: nobody can take it over within a fixed pause of 2 leases. The demo keeps the
    worker frozen until the takeover is seen in Redis, so its late commit is always refused."""
    args = ["--workers", "3", "--tasks", "10", "--cycles", "4", "--step-ms", "150", "--lease-ms", "800",
            "--timeout", "90", "--url", private_server.url, "--json"]  # fmt: skip
    proc = agentstate("demo", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["double_applied"] == 0 and report["lost_commits"] == 0, report
    assert report["stale_commits_rejected"] >= 1, (report, proc.stderr)
    assert report["takeovers"] >= 2, report
    assert re.search(r"taken over by w2\)$", report["frozen"]), report["frozen"]
    assert "chaos: SIGCONT w1 after" in proc.stderr and "taken over by w2 while w1 was frozen" in proc.stderr


def test_the_table_has_a_late_commits_accepted_row() -> None:
    report = demo_mod.DemoReport(tasks=1, late_commits_accepted=3)
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in demo_mod.report_table(report).splitlines()
        if "|" in line
    }
    assert rows["late commits accepted (no takeover)"] == "3"
    assert rows["stale commits rejected by fencing"] == "0"


# ---- nothing left behind -----------------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("namespace", ["bad{", "", "a*b"])
def test_a_refused_namespace_starts_no_server_and_leaves_none(namespace: str, tmp_path: Path) -> None:
    if shutil.which("redis-server") is None or not os.path.isdir("/proc"):
        pytest.skip("needs redis-server on PATH and Linux /proc")
    # The private server's --dir is under TMPDIR: a survivor runs in tmp_path.
    proc = agentstate("demo", "--namespace", namespace, "--embedded", "redis-server", env={"TMPDIR": str(tmp_path)})
    survivors = _processes_in(tmp_path)
    for pid in survivors:  # started by this test: stop them, then fail
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "namespace" in proc.stderr, proc.stderr
    assert "Redis: started" not in proc.stderr


def test_run_demo_refuses_a_bad_namespace_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(demo_mod, "start_embedded", lambda *a, **k: started.append(a) or pytest.fail("started"))
    for bad in ("bad{", "", "x" * 200):
        with pytest.raises(InvalidArgument):
            run_demo(DemoConfig(), namespace=bad, out=io.StringIO())
    assert started == []


def test_a_server_started_for_the_demo_is_stopped_when_the_demo_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[bool] = []

    class Server:
        url = "redis://127.0.0.1:1/0"
        description = "stand-in"

        def stop(self) -> None:
            stopped.append(True)

    def broken_store(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the store could not be built")

    monkeypatch.setattr(demo_mod, "start_embedded", lambda *a, **k: Server())
    monkeypatch.setattr(demo_mod, "CheckpointStore", broken_store)
    with pytest.raises(RuntimeError, match="could not be built"):
        run_demo(DemoConfig(), out=io.StringIO())
    assert stopped == [True]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.real
def test_ctrl_c_prints_the_worker_logs_line_on_a_line_of_its_own(
    private_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    show = demo_mod._Progress.show

    def show_then_ctrl_c(self: Any, *args: Any, **kwargs: Any) -> None:
        show(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_mod._Progress, "show", show_then_ctrl_c)
    out = _Terminal()
    with pytest.raises(KeyboardInterrupt):
        run_demo(DemoConfig(workers=2, tasks=2, cycles=2, chaos=False), url=private_server.url, out=out)
    text = out.getvalue()
    assert "cycles 0/4" in text or "cycles " in text
    logs = re.search(r"worker logs kept in (\S+)\n", text)
    assert logs is not None, text
    assert text[logs.start() - 1] == "\n", repr(text[-300:])  # not written onto the bar
    assert text.rstrip("\n").splitlines()[-1].startswith("worker logs kept in ")
    for p in Path(logs.group(1)).glob("w*.log"):
        p.unlink()
    Path(logs.group(1)).rmdir()
