"""The Lua scripts ship inside the package and each opens with its contract."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

import redis_agentstate
from redis_agentstate import scripts

ROOT = Path(__file__).resolve().parent.parent
LUA = resources.files("redis_agentstate").joinpath("lua")


def lua_files() -> list[str]:
    return sorted(p.name for p in LUA.iterdir() if p.name.endswith(".lua"))


@pytest.mark.parametrize("name", [n for n in lua_files() if not n.startswith("_")])
def test_each_operation_file_opens_with_its_contract(name: str) -> None:
    text = LUA.joinpath(name).read_text("utf-8")
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
        # The rendered constants, then the preludes _base and _common, then the script itself.
        assert text.startswith(scripts.constants_prelude())
        assert 0 < text.index("-- _base.lua") < text.index("-- _common.lua") < text.index(f"-- {name}.lua")


def test_wheel_ships_scripts_and_py_typed(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "redis_agentstate/py.typed" in names
    for lua in lua_files():
        assert f"redis_agentstate/lua/{lua}" in names
    assert redis_agentstate.__version__ in wheel.name
