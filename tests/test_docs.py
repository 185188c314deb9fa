"""The documentation site cannot rot: every ```python block of every docs/ page runs as written,
twice, against a private server (as README's do, ``tests/test_readme.py``); every ``agentstate``
line of their ```sh blocks parses and runs; every public name has its API reference entry; every
error tree drawn (README, guides, ``errors.py``) is the real class hierarchy; what the pages say
about logging and the ACL is what the code does; and the site builds with ``mkdocs build --strict``
(a broken link, anchor or docstring reference fails) without private base classes."""

from __future__ import annotations

import builtins
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from fork_support import run_python
from test_readme import README, blocks, cli_commands, run_block
from test_security import acl_setuser_line

import redis_agentstate
from redis_agentstate import Checkpoint, CheckpointStore, errors
from redis_agentstate.cli import build_parser
from redis_agentstate.pool_models import PoolConfig
from redis_agentstate.pools import PoolStore

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
#: The guides: each shows its subject in code that runs.
GUIDES = ["quickstart", "leases", "fleet", "lifecycle", "pools", "kv", "langgraph", "operations"]


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


def docs_cli_commands() -> list[str]:
    return [command for page in PAGES for command in cli_commands(page)]


def test_every_cli_command_in_the_docs_parses() -> None:
    commands = docs_cli_commands()
    assert len(commands) >= 8
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])  # SystemExit(2) on an unknown flag
        assert callable(args.func), command


@pytest.mark.real
def test_every_cli_command_in_the_docs_runs(private_server: Any) -> None:
    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace="agentstate", max_attempts=1)
    store.create(Checkpoint("TASK"))
    # Parked, so `list --parked` has a row and `requeue TASK` something to requeue.
    claim = store.claim("TASK", 1, token="docs", lease_ms=30_000)
    store.release("TASK", token="docs", expected_revision=claim.revision, reason="ValueError: docs")
    PoolStore(client, namespace="agentstate").open("POOL", PoolConfig())
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    commands = [c for c in docs_cli_commands() if shlex.split(c)[1:2] != ["demo"]]  # the demo: tests/test_cli.py
    assert {"list", "show", "watch", "stats", "requeue"} <= {w for c in commands for w in shlex.split(c)}
    for command in commands:
        argv = shlex.split(command.replace("redis://host:6379/0", private_server.url))[1:]
        argv = [private_server.url if a == "..." else a for a in argv]
        if "watch" in argv:
            argv += ["--once"]  # a pool's watch follows forever; print what is there and stop
            argv[argv.index("--from") + 1] = "0"
        proc = run_python(["-m", "redis_agentstate", *argv], timeout=60, env=env)
        assert proc.returncode == 0, f"{command}: {proc.stdout}{proc.stderr}"


def error_trees(text: str) -> list[dict[str, tuple[str | None, str]]]:
    """Each ``AgentStateError`` tree drawn in ``text``: class name -> (parent name, its line)."""
    trees = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "AgentStateError" or i + 1 == len(lines) or "├── " not in lines[i + 1]:
            continue
        col = line.index("AgentStateError")
        tree: dict[str, tuple[str | None, str]] = {"AgentStateError": (None, line)}
        stack = ["AgentStateError"]
        for row in lines[i + 1 :]:
            m = re.match(r"^[│ ]*[├└]── (\w+)", row[col:])
            if m is None:
                break
            depth = m.start(1) // 4
            del stack[depth:]
            tree[m.group(1)] = (stack[-1], row)
            stack.append(m.group(1))
        trees.append(tree)
    return trees


def test_every_error_tree_is_the_class_hierarchy() -> None:
    from redis_agentstate.langgraph import errors as lg_errors

    # The library's one family: the core's errors and those an integration defines under its root.
    family = {name: getattr(errors, name) for name in errors.__all__}
    family |= {name: getattr(lg_errors, name) for name in lg_errors.__all__}
    real = {
        name: next((b.__name__ for b in cls.__bases__ if issubclass(b, errors.AgentStateError)), None)
        for name, cls in family.items()
    }
    sources = {"README.md": README.read_text("utf-8"), "errors.py": errors.__doc__ or ""}
    sources |= {f"docs/{page.relative_to(DOCS).as_posix()}": page.read_text("utf-8") for page in PAGES}
    found = {where: trees for where, text in sources.items() if (trees := error_trees(text))}
    assert len(found.get("README.md", [])) == 1 and len(found.get("errors.py", [])) == 1, sorted(found)
    for where, trees in found.items():
        for tree in trees:
            documented = {name: parent for name, (parent, _) in tree.items()}
            assert documented == real, (
                f"{where}'s error tree is not errors.py's hierarchy: missing {sorted(set(real) - set(documented))}, "
                f"not errors {sorted(set(documented) - set(real))}, misplaced "
                f"{sorted(n for n in set(real) & set(documented) if real[n] != documented[n])}"
            )
            for name, (_, line) in tree.items():  # a second base outside the family is said (ValueError)
                for base in family[name].__bases__:
                    if not issubclass(base, errors.AgentStateError) and base is not Exception:
                        assert base.__name__ in line, f"{where}: {name} does not say it is a {base.__name__}"


@pytest.mark.real
def test_the_logging_note_is_what_python_does(tmp_path: Path, private_server: Any) -> None:
    # With logging unconfigured, Python's last-resort handler prints warnings and errors (a failed
    # cycle's traceback) and drops INFO: what docs/operations.md says, not "silent".
    code = """
import uuid
import redis
from redis_agentstate import Checkpoint, CheckpointStore, Runner
from redis_agentstate.embedded import env_or_private_url

store = CheckpointStore(redis.Redis.from_url(env_or_private_url()), namespace=f"log-{uuid.uuid4().hex[:8]}",
                        max_attempts=1)
store.create(Checkpoint("t"))
def step(cp):
    raise ValueError("the handler broke")
Runner(store, step, handle_signals=False).run(stop_when_idle=True)
assert store.list_parked() == ["t"]
"""
    proc = run_block(code, tmp_path, private_server.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "handler failed" in proc.stderr and "Traceback" in proc.stderr, proc.stderr
    assert "ValueError: the handler broke" in proc.stderr
    assert "claimed (lease" not in proc.stderr  # INFO is dropped
    logging_section = (DOCS / "operations.md").read_text("utf-8").split("## Logging", 1)[1]
    assert "last-resort handler" in logging_section and "warning and error" in logging_section
    said = [README, *PAGES]
    silent = [p.name for p in said if re.search(r"silent unless|nothing is shown", p.read_text("utf-8"), re.I)]
    assert silent == [], f"these pages say an unconfigured logging shows nothing: {silent}"


def test_the_acl_line_in_the_docs_is_the_one_the_security_tests_grant() -> None:
    operations = (DOCS / "operations.md").read_text("utf-8")
    lines = [line for line in operations.splitlines() if line.startswith("ACL SETUSER ")]
    assert lines == [acl_setuser_line()]


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
    assert not re.search(r":(class|meth|func|attr|mod|ref):", runtime)
    # A "see ..." in a docstring is a link (:ref: to a guide's heading, :mod:, :meth:), never a pointer
    # to a README section or a file path, and the reference shows no private base class.
    public = set(redis_agentstate.__all__) | set(errors.__all__) | set(dir(builtins)) | {"Enum"}
    for page in sorted((site / "reference").rglob("index.html")):
        html = page.read_text("utf-8")
        text = re.sub(r"<[^>]+>", "", html)
        assert not re.search(r"see (README|docs/|the (sync twin|module docstring)|module docstring)", text), page
        for bases in re.findall(r"Bases: ([^\n]+)", text):
            shown = {re.sub(r"\[.*", "", b).strip() for b in bases.split(", ")}
            assert shown <= public, f"{page.parent.name}: private bases {sorted(shown - public)}"
    assert 'href="../../operations/#retries"' in stores and 'href="../../operations/#retention"' in stores
