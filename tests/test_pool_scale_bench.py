"""The pool-scale budget (issue 9, item 4): no single script above 10 ms with 1,000,000 records.

Marked ``benchmark`` (skipped unless ``pytest --benchmarks``): it fills a private redis-server with a
million records, about a minute. The same figure runs as ``python -m benchmarks --only pool_scale``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(out: Path, *args: str) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but redis-server is not on PATH")
        pytest.skip("redis-server not on PATH")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "pool_scale", "--out", str(out), "--readme", "no",
         "--no-plots", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    data: dict[str, Any] = json.loads((out / "latest.json").read_text())
    assert data["errors"] == {}
    fig: dict[str, Any] = data["figures"]["pool_scale"]
    return fig


@pytest.mark.benchmark
@pytest.mark.slow
def test_no_script_over_10ms_with_a_million_records(tmp_path: Path) -> None:
    fig = _run(tmp_path)
    assert fig["records"] >= 1_000_000
    assert fig["counts"]["records returned by watch(count=None)"] == fig["records"]
    assert fig["counts"]["messages in the snapshot"] == fig["records"] - 1 - 1_000
    assert fig["met"], fig["slowest"]
    # The contrast shows what the budget guards against: one unbounded script is far over it.
    assert fig["unbounded_script_ms"] > fig["budget_ms"]


@pytest.mark.benchmark
def test_quick_preset(tmp_path: Path) -> None:
    fig = _run(tmp_path, "--quick")
    assert fig["records"] >= 20_000 and fig["met"], fig["slowest"]
