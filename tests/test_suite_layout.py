"""The default run and the full suite (tests/conftest.py): the split is checked, so it cannot rot.

``python -m pytest`` runs the fast default suite; ``AGENTSTATE_FULL_SUITE=1`` or ``--full``
(and ``CI=true``, as in ``.ci/run``) adds the long tail. One collection of the whole suite, with
a probe plugin recording the items before and after conftest's collection hook, checks the
rules: every test left out entirely is long tail (a scale, benchmark-smoke or many-process file,
marked ``slow``, or the Cluster matrix: marked ``cluster`` or on ``redis_cluster``); every other store test runs each of
its cases once, on fakeredis or a real server, sync or async; each file runs every one of those
store x flavor pairs it has, and a fault-injection run stays. Small collections check that the
switch turns the long tail on, and that a file named on the command line runs whole. The
whole-suite check is itself long tail: the full suite (``.ci/run``) runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import FULL_SUITE_ENV, LONG_TAIL_FILES, STORE_PARAMS, full_suite

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os
import pytest

STORE = ("backend", "flavor")

def _record(items):
    out = []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        out.append({
            "id": item.nodeid,
            "base": item.nodeid.split("[")[0],
            "file": item.path.name,
            "markers": sorted({m.name for m in item.iter_markers()}),
            "fixtures": sorted(getattr(item, "fixturenames", ())),
            "store": {k: str(v) for k, v in params.items() if k in STORE},
            # A case is its parameter objects: one parametrize list serves every variant.
            "case": {k: id(v) for k, v in params.items() if k not in STORE},
        })
    return out

@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, config, items):
    before = _record(items)
    result = yield
    with open(os.environ["LAYOUT_PROBE_OUT"], "w") as f:
        json.dump({"before": before, "after": _record(items)}, f)
    return result
"""


def _collect(tmp_path: Path, *args: str, full: str) -> tuple[str, dict[str, Any]]:
    (tmp_path / "layout_probe.py").write_text(PROBE)
    out = tmp_path / "layout.json"
    env = {**os.environ, FULL_SUITE_ENV: full, "LAYOUT_PROBE_OUT": str(out)}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*cmd, "-p", "layout_probe", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _is_long_tail(item: dict[str, Any]) -> bool:
    markers = item["markers"]
    cluster = "cluster" in markers or "redis_cluster" in item["fixtures"] or item["store"].get("backend") == "cluster"
    return item["file"] in LONG_TAIL_FILES or "slow" in markers or cluster


@pytest.mark.slow  # a collection of the whole suite (~15 s): the full suite, and so .ci/run, checks the default run
def test_the_default_run_leaves_out_the_long_tail_and_keeps_every_store_variant_and_case(tmp_path: Path) -> None:
    _, layout = _collect(tmp_path, full="0")
    before, after = layout["before"], layout["after"]
    kept = {i["id"] for i in after}
    assert len(after) < 0.4 * len(before), (len(after), len(before))

    by_base: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in before:
        by_base[item["base"]].append(item)
    dropped_whole = {base for base, items in by_base.items() if not any(i["id"] in kept for i in items)}
    # Only the long tail leaves the default run whole; and the long tail is there to leave.
    assert dropped_whole and all(_is_long_tail(i) for base in dropped_whole for i in by_base[base])
    assert all(not _is_long_tail(i) for i in after)
    for name in LONG_TAIL_FILES:
        assert any(i["file"] == name for i in before) and not any(i["file"] == name for i in after), name
    for base in ("tests/test_failover_chaos.py::test_failover_bounded", "tests/test_chaos.py::test_chaos_fleet"):
        assert any(i["base"] == base for i in before) and not any(i["base"] == base for i in after), base
    assert any(i["store"].get("backend") == "cluster" for i in before)
    assert any("chaos" in i["markers"] for i in after)  # a short fault-injection run stays
    assert any(i["file"] == "test_readme.py" for i in after) and any(i["file"] == "test_docs.py" for i in after)

    def variant_of(i: dict[str, Any]) -> tuple[str | None, str | None]:
        return i["store"].get("backend"), i["store"].get("flavor")

    def case_of(i: dict[str, Any]) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(i["case"].items()))

    # Every other store test runs each of its cases, on one variant (a variant a file would
    # otherwise miss comes back once): fakeredis or a real server, sync or async.
    cases = extra = 0
    per_file_extra: dict[str, int] = defaultdict(int)
    for base, items in by_base.items():
        if base in dropped_whole or not items[0]["store"]:
            continue
        fast = [i for i in items if i["id"] in kept]
        wanted = {case_of(i) for i in items if not _is_long_tail(i)}
        assert {case_of(i) for i in fast} == wanted, base
        assert "cluster" not in {variant_of(i)[0] for i in fast}, base
        cases += len(wanted)
        extra += len(fast) - len(wanted)
        per_file_extra[items[0]["file"]] += len(fast) - len(wanted)
    assert cases > 0 and all(n <= 4 for n in per_file_extra.values()), per_file_extra
    # The store tests shrink to about one variant in six of the full matrix.
    store_before = sum(1 for i in before if i["store"])
    assert cases + extra < 0.3 * store_before, (cases, extra, store_before)

    # Every file with store tests takes part with every store x flavor it has outside the Cluster
    # matrix, and the default run has all of them: {fake, real} x {sync, async}.
    for name in {i["file"] for i in before if i["store"] and not _is_long_tail(i)}:
        full_variants = {variant_of(i) for i in before if i["file"] == name and i["store"] and not _is_long_tail(i)}
        assert {variant_of(i) for i in after if i["file"] == name and i["store"]} == full_variants, name
    variants = {variant_of(i) for i in after if set(i["store"]) == set(STORE_PARAMS)}
    assert variants == {(b, f) for b in ("fake", "real") for f in ("sync", "async")}


def test_the_switch_runs_the_long_tail_and_a_file_named_runs_whole(tmp_path: Path) -> None:
    files = ["tests/test_checkpoint_scale.py", "tests/test_corrupt_state.py"]
    testpaths = ["-o", "testpaths=" + " ".join(files)]  # the default run's shape: no file named
    _, fast = _collect(tmp_path, *testpaths, full="0")
    assert 0 < len(fast["after"]) < len(fast["before"])
    assert not any(i["file"] == "test_checkpoint_scale.py" for i in fast["after"])
    for env, args in (("1", testpaths), ("0", [*testpaths, "--full"]), ("0", files)):
        stdout, full = _collect(tmp_path, *args, full=env)
        # Every test; conftest runs the slow ones first, so the order is not compared.
        assert sorted(i["id"] for i in full["after"]) == sorted(i["id"] for i in fast["before"]), (env, args)
        assert "deselected" not in stdout, stdout[-500:]


@pytest.mark.parametrize(
    ("env", "option", "expected"),
    [
        ({}, False, False),
        ({"CI": "true"}, False, True),
        ({"CI": "true", FULL_SUITE_ENV: "0"}, False, False),
        ({FULL_SUITE_ENV: "1"}, False, True),
        ({FULL_SUITE_ENV: "yes"}, False, True),
        ({FULL_SUITE_ENV: "false"}, False, False),
        ({FULL_SUITE_ENV: "0"}, True, True),
    ],
)
def test_what_turns_the_full_suite_on(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], option: bool, expected: bool
) -> None:
    for name in ("CI", FULL_SUITE_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config: Any = SimpleNamespace(getoption=lambda name: option if name == "--full" else None)
    assert full_suite(config) is expected
