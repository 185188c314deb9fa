"""The Lua scripts ship inside the package and each opens with its contract."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

import redis_agentstate
import redis_agentstate.langgraph
from redis_agentstate.wire import scripts

ROOT = Path(__file__).resolve().parent.parent


def lua_files() -> list[str]:
    return sorted(scripts.lua_files())


@pytest.mark.parametrize("name", [n for n in lua_files() if not n.startswith("_")])
def test_each_operation_file_opens_with_its_contract(name: str) -> None:
    text = scripts.lua_files()[name].read_text("utf-8")
    first = text.splitlines()[0]
    assert first.startswith(f"-- {name}:"), f"{name} must open with '-- {name}: <what it does>'"
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    assert re.search(r"KEYS\[", header), f"{name} documents no KEYS"
    assert re.search(r"[Rr]eturns", header), f"{name} documents no return value"


def test_checkpoint_script_constants_match_files() -> None:
    for name in scripts.CHECKPOINT_SCRIPTS:
        assert getattr(scripts, name.upper()) == name
        assert f"{name}.lua" in lua_files()
        text = scripts.script_text(name)
        # The statements it uses of the rendered constants and the preludes _base and _common (in that
        # order: tests/test_contracts.py checks them), then the script itself.
        assert scripts.PRELUDES[name][:3] == ("_base", "_moved", "_common")
        assert text.endswith("\n" + scripts._read(name)) and text.index(f"-- {name}.lua") > 0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # pyproject's build backend through its PEP 517 hook, as a frontend calls it: a virtualenv made
    # by uv (nox's uv backend, as .ci/run uses) has no pip, and hatchling is in the test extra.
    subprocess.run(
        [sys.executable, "-c", "import sys, hatchling.build as b; b.build_wheel(sys.argv[1])", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("*.whl")
    return built


def test_wheel_ships_scripts_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "redis_agentstate/py.typed" in names
    for lua in lua_files():
        path = Path(str(scripts.lua_files()[lua])).relative_to(Path(redis_agentstate.__file__).parent.parent)
        assert path.as_posix() in names
    assert redis_agentstate.__version__ in wheel.name


def noxfile_constant(name: str) -> object:
    """A module-level constant of noxfile.py, read without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py defines no {name}")


def test_every_supported_python_is_classified_tested_and_run_in_ci(wheel: Path) -> None:
    """requires-python, the wheel's classifiers, the nox sessions and .ci/run name the same Pythons."""
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = HeaderParser().parsestr(zf.read(meta_name).decode("utf-8"))
    classified = [
        c.rsplit(" :: ", 1)[1]
        for c in meta.get_all("Classifier", [])
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    pythons = noxfile_constant("PYTHONS")
    assert isinstance(pythons, list)
    assert classified == pythons, "pyproject classifiers and noxfile.PYTHONS disagree"

    minors = [int(v.split(".")[1]) for v in pythons]
    assert minors == list(range(minors[0], minors[-1] + 1)), "a version is missing between the oldest and newest"
    requires = SpecifierSet(meta["Requires-Python"])
    assert all(requires.contains(f"{v}.0") for v in pythons)
    assert not requires.contains(f"3.{minors[0] - 1}.99"), "requires-python admits a Python no session tests"
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in pythons, "this interpreter is not a supported one"

    full = noxfile_constant("FULL")
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert set(re.findall(r"\btests-(3\.\d+)\b", ci)) == set(pythons) - {full}, (
        ".ci/run runs the full suite on noxfile.FULL and the nox session of every other version"
    )


#: Modules of the package root that are not the library core: the CLI (which registers the demo's
#: commands), ``python -m``, and the documented ``redis_agentstate.embedded`` import path.
_NOT_CORE = {"cli.py", "__main__.py", "embedded.py"}


def _relative_imports(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text("utf-8"))
    return {
        (node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
    }


def test_fleet_tooling_sits_apart_from_the_library_core() -> None:
    package = Path(redis_agentstate.__file__).parent
    core = sorted(p for p in package.glob("*.py") if p.name not in _NOT_CORE)
    assert core, package
    for path in core:
        assert not _relative_imports(path) & {"fleet", "demo", "embedded"}, path.name
    assert {p.name for p in (package / "fleet").glob("*.py")} >= {"demo.py", "embedded.py", "cli.py"}
    assert not (package / "demo.py").exists()

    # The documented import path still works, and is the fleet module's code, not a copy.
    from redis_agentstate import embedded
    from redis_agentstate.fleet import embedded as fleet_embedded

    for name in embedded.__all__:
        assert getattr(embedded, name) is getattr(fleet_embedded, name)


def test_mypy_checks_the_client_protocols_against_the_real_clients() -> None:
    """``tests/typing_clients.py`` is where mypy proves redis-py's and fakeredis' clients satisfy
    ``redis_agentstate.clients``; it only proves it while CI's mypy run includes it."""
    # pyproject's [tool.mypy] block, read without tomllib (Python 3.10 has none).
    mypy = (ROOT / "pyproject.toml").read_text("utf-8").split("[tool.mypy]\n", 1)[1].split("\n[", 1)[0]
    files = re.search(r"^files = \[(.*)\]$", mypy, re.M)
    assert files is not None and '"tests/typing_clients.py"' in files.group(1)
    assert re.search(r"^strict = true$", mypy, re.M)
    text = (ROOT / "tests" / "typing_clients.py").read_text("utf-8")
    for client in ("redis.Redis", "redis.cluster.RedisCluster", "fakeredis.FakeRedis"):
        assert client in text
    for client in ("redis.asyncio.Redis", "redis.asyncio.cluster.RedisCluster", "fakeredis.FakeAsyncRedis"):
        assert client in text


def test_only_the_langgraph_subpackage_imports_langgraph() -> None:
    """The core package works without the ``langgraph`` extra: no module outside
    ``redis_agentstate/langgraph/`` imports LangGraph, and importing the package loads none of it."""
    import ast

    package = Path(redis_agentstate.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if "langgraph" in path.relative_to(package).parts[:-1]:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] in ("langgraph", "langchain_core") for n in names):
                offenders.append(str(path.relative_to(package)))
    assert offenders == []
    probe = "import sys, redis_agentstate; print(sorted(m for m in sys.modules if m.startswith('lang')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_lua_folder_of_the_package_is_a_registered_family() -> None:
    """The loader finds a script in its family's ``lua/`` folder: a folder no family registered would
    ship scripts nothing can load (and that every contract test here would miss)."""
    package = Path(redis_agentstate.__file__).parent
    on_disk = {p.name for p in package.rglob("lua/*.lua")}
    assert on_disk == set(scripts.lua_files())
