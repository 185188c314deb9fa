"""tools/langgraph_suite.py: how its verdict pairs our savers' results with LangGraph's in-memory saver's.

The run itself (LangGraph's source distribution, downloaded) is ``nox -s langgraph_suite``; here
only the pairing, on a report written by hand, and the fixtures it appends, compiled.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("langgraph_suite", ROOT / "tools" / "langgraph_suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _case(name: str, outcome: str = "passed", classname: str = "tests.test_pregel") -> str:
    body = {"passed": "", "failed": "<failure message='x'/>", "skipped": "<skipped message='s'/>"}[outcome]
    return f'<testcase classname="{classname}" name="{name}" time="0.1">{body}</testcase>'


def _report(tmp_path: Path, *cases: str) -> Path:
    path = tmp_path / "junit.xml"
    body = "".join(cases)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_a_test_of_ours_is_judged_against_its_memory_twin(tmp_path: Path) -> None:
    tool = _tool()
    got = tool.verdict(
        _report(
            tmp_path,
            _case("test_a[memory]"),
            _case("test_a[agentstate]"),
            _case("test_a[agentstate_aes]", "failed"),
            _case("test_b[memory]", "failed"),  # LangGraph's own failure: not counted against us
            _case("test_b[agentstate]", "failed"),
            _case("test_c[memory]", "skipped"),
            _case("test_c[agentstate]", "skipped"),
            _case("test_plain"),  # no checkpointer parameter
        )
    )
    assert got["worse"] == ["tests.test_pregel::test_a[agentstate_aes]: memory passed, agentstate_aes failed"]
    assert got["counts"]["agentstate passed where memory passed"] == 1
    assert got["counts"]["memory passed"] == 1 and got["counts"]["memory failed"] == 1


def test_another_parameter_called_memory_does_not_confuse_the_pairing(tmp_path: Path) -> None:
    # LangGraph's cache fixture has a 'memory' parameter too: test_x[agentstate-memory] pairs
    # with test_x[memory-memory], not with itself.
    tool = _tool()
    got = tool.verdict(
        _report(
            tmp_path,
            _case("test_x[memory-memory]"),
            _case("test_x[memory-sqlite]"),
            _case("test_x[agentstate-memory]", "failed"),
            _case("test_x[agentstate-sqlite]"),
        )
    )
    assert got["worse"] == ["tests.test_pregel::test_x[agentstate-memory]: memory passed, agentstate failed"]
    assert got["counts"]["agentstate passed where memory passed"] == 1
    assert "agentstate without a memory twin" not in got["counts"]


def test_the_appended_fixtures_compile() -> None:
    compile(_tool().FIXTURES, "conftest.py (appended)", "exec")
