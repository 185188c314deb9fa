"""The documentation site cannot rot: every ```python block of every docs/ page runs as written,
twice, against a private server (as README's do, ``tests/test_readme.py``); every ``agentstate``
line of their ```sh blocks parses; every public name has its API reference entry; and the site
builds with ``mkdocs build --strict`` (a broken link, anchor or docstring reference fails)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_readme import blocks, run_block

import redis_agentstate
from redis_agentstate.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
#: The guides: each shows its subject in code that runs.
GUIDES = ["quickstart", "leases", "fleet", "pools", "kv", "langgraph", "operations"]


def page_blocks(lang: str) -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(DOCS).with_suffix('').as_posix()}:{name}", code)
        for page in PAGES
        for name, code in blocks(lang, page)
    ]


PYTHON_BLOCKS = page_blocks("python")


def test_the_docs_have_the_blocks_this_file_runs() -> None:
    # A fence that stopped matching would silently stop being run.
    for page in PAGES:
        assert len(blocks("python", page)) == page.read_text("utf-8").count("```python"), page
    with_code = {name.split("/")[-1].split(":")[0] for name, _ in PYTHON_BLOCKS}
    assert set(GUIDES) <= with_code
    assert len(PYTHON_BLOCKS) >= 15


@pytest.mark.real
@pytest.mark.parametrize("code", [pytest.param(code, id=name) for name, code in PYTHON_BLOCKS])
def test_python_block_runs_twice(code: str, private_server: Any, tmp_path: Path) -> None:
    for run in (1, 2):
        proc = run_block(code, tmp_path, private_server.url)
        assert proc.returncode == 0, f"run {run}:\n{proc.stdout}\n{proc.stderr}"


def test_every_cli_command_in_the_docs_parses() -> None:
    commands = [
        line.split("#", 1)[0].strip()
        for _, body in page_blocks("sh")
        for line in body.splitlines()
        if line.strip().startswith("agentstate ")
    ]
    assert len(commands) >= 5
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])  # SystemExit(2) on an unknown flag
        assert callable(args.func), command


def test_every_public_name_has_an_api_reference_entry() -> None:
    text = "\n".join(page.read_text("utf-8") for page in sorted((DOCS / "reference").glob("*.md")))
    documented = set(re.findall(r"^::: redis_agentstate\.(\w+)$", text, re.M))
    assert set(redis_agentstate.__all__) - documented == set()
    module_docs = {"cli", "errors", "lease", "runner", "langgraph", "telemetry"}
    assert documented - set(redis_agentstate.__all__) <= module_docs


def test_the_design_brief_is_in_the_repository_and_cited_there() -> None:
    design = (DOCS / "design.md").read_text("utf-8")
    for change in ("1. **Server clock.**", "3. **Retry-safe.**", "5. **Cost grows", "7. **Bad input"):
        assert change in design  # the numbers the tests cite ("docs/design.md 3")
    stale = "DESIGN" + ".md"
    citing = [
        path
        for folder in ("redis_agentstate", "tests", "benchmarks", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if stale in path.read_text("utf-8")
    ]
    assert citing == []


def test_the_site_builds_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but mkdocs / mkdocstrings[python] are missing: pip install -e '.[docs]'")
        pytest.skip("mkdocs not installed: pip install -e '.[docs]' to build the site")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The benchmarks page is benchmarks/README.md itself, with its plots beside it.
    bench = (site / "benchmarks" / "index.html").read_text("utf-8")
    assert 'src="results/single.png"' in bench and (site / "benchmarks" / "results" / "single.png").is_file()
    # The API reference was generated from the docstrings, not left as ":::" lines.
    stores = (site / "reference" / "stores" / "index.html").read_text("utf-8")
    assert "Claim the next cycle of any runnable task" in stores and ":::" not in stores
    # Sphinx roles in docstrings become checked cross-references (docs/_hooks/sphinx_roles.py).
    runtime = (site / "reference" / "runtime" / "index.html").read_text("utf-8")
    assert 'href="../errors/#redis_agentstate.LeaseLost"' in runtime
    assert not re.search(r":(class|meth|func|attr):", runtime)
