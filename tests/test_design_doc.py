"""docs/design.md opens with the architecture: a picture of the layers and a table naming, for every
module of the package, its layer and its concern. These tests keep that map true: every module it
names exists, and every module of the package is in the table, so a split, a rename or a new module
fails here with the names to fix."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "redis_agentstate"
DESIGN = ROOT / "docs" / "design.md"
HEADING = "## Architecture in one picture"
LAYERS = {"shell", "core", "driver", "Lua", "keys"}
#: A file name as the picture and the table write it: ``kv.py``, ``langgraph/saver.py``, ``lua/_kv.lua``.
FILE = re.compile(r"(?<![\w/.<>-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.(?:py|lua))(?!\w)")
ROW = re.compile(r"^\| `([^`]+)` \| (\w+) \| (.+) \|$", re.M)


def architecture() -> str:
    text = DESIGN.read_text("utf-8")
    assert HEADING in text, f"docs/design.md lost its {HEADING!r} section"
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end != -1 else len(text)]


def package_modules() -> set[str]:
    """Every module of the package as the table names it: ``x.py``; a subpackage ``x/`` (its
    ``__init__.py``) and its modules ``x/y.py``; and the ``lua/`` folder."""
    found = {"lua/", "langgraph/lua/"}
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).as_posix()
        if "__pycache__" in name:
            continue
        found.add(name[: -len("__init__.py")] if name.endswith("/__init__.py") else name)
    return found


def table() -> list[tuple[str, str, str]]:
    return ROW.findall(architecture())


def test_the_design_page_opens_with_the_architecture() -> None:
    text = DESIGN.read_text("utf-8")
    first = re.search(r"^## .+$", text, re.M)
    assert first is not None and first.group(0) == HEADING
    section = architecture()
    assert "```text" in section, "the picture of the layers is gone"
    for layer in ("public shells", "sans-I/O cores", "drivers", "Lua scripts", "Redis keys"):
        assert layer in section, layer


def test_every_module_the_architecture_names_exists() -> None:
    section = architecture()
    named = set(FILE.findall(section)) | {name for name, _, _ in table()}
    assert len(named) >= 30, sorted(named)
    stale = sorted(n for n in named if not (PACKAGE / n).exists() and not (ROOT / n).exists())
    assert not stale, (
        "docs/design.md's architecture names modules that do not exist (renamed, moved or split? "
        f"update the picture and the table): {', '.join(stale)}"
    )


def test_every_module_of_the_package_is_in_the_architecture_table() -> None:
    rows = [name for name, _, _ in table()]
    duplicated = sorted({n for n in rows if rows.count(n) > 1})
    assert not duplicated, f"docs/design.md's table has more than one row for: {', '.join(duplicated)}"
    unnamed = sorted(package_modules() - set(rows))
    assert not unnamed, (
        "modules missing from docs/design.md's architecture table "
        f"(add a row for each: | `module` | layer | concern |): {', '.join(unnamed)}"
    )


def test_every_row_says_its_layer_and_concern() -> None:
    for name, layer, concern in table():
        assert layer in LAYERS, f"{name}: layer {layer!r} is none of {sorted(LAYERS)}"
        assert len(concern.strip()) > 10, name
