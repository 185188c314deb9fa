"""tools/suite_cpu.py, the per-test CPU plugin issue 39's measurements use: run on a small session of
its own (one test that burns CPU, one that runs a child, one that sleeps) and summed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import suite_cpu  # noqa: E402

SESSION = """
import subprocess, sys, time

BURN = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"

def test_burns_cpu():
    exec(BURN)

def test_runs_a_child():
    subprocess.run([sys.executable, "-c", BURN], check=True)

def test_sleeps():
    time.sleep(0.3)
"""


def test_the_plugin_counts_each_tests_cpu_and_its_childrens(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SESSION, "utf-8")
    out = tmp_path / "cpu"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), "SUITE_CPU_DIR": str(out)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "suite_cpu", "-p", "no:cacheprovider",
                    "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                   check=True, env=env, cwd=tmp_path, capture_output=True)  # fmt: skip
    rows = {node.split("::")[-1]: (me, kids, wall) for node, me, kids, wall in suite_cpu.read_rows(out)}
    assert set(rows) == {"test_burns_cpu", "test_runs_a_child", "test_sleeps"}
    assert rows["test_burns_cpu"][0] >= 0.25 and rows["test_burns_cpu"][1] == 0
    assert rows["test_runs_a_child"][1] >= 0.25 and rows["test_runs_a_child"][0] < 0.25
    assert rows["test_sleeps"][2] >= 0.3 and rows["test_sleeps"][0] + rows["test_sleeps"][1] < 0.1
    table = suite_cpu.summarize(suite_cpu.read_rows(out))
    assert table.startswith("3 tests: ") and "| test_sample.py | " in table and "| none | " in table
