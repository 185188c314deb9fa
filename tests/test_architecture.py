"""The shape of the package: no import circle between its modules, no class over 400 lines, no
class whose MRO spans more than three of the package's files (a core holds its parts instead of
inheriting them), and commit_and_claim's path within three of the checkpoint core's files.

Imports are read from the source (``ast``), not by importing it. Counted: every
``import``/``from ... import`` of a ``redis_agentstate`` module, at module level
and inside functions (a lazy import inside a function still ties the two modules
together: the circles this test was written against were held by such imports),
except those under ``if TYPE_CHECKING:``, which never run. Importing ``a.b.c``
also loads the package ``a.b``; a module's own enclosing packages are loaded
before it anyway, so they are not an edge (``from . import x`` is an edge to
``x``, and to the package only when it takes a name defined in its
``__init__``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import redis_agentstate

PACKAGE = Path(redis_agentstate.__file__).parent

#: The longest class the package may hold, in lines (``class`` line to its last line).
MAX_CLASS_LINES = 400


def modules(root: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: list[ast.AST], *, type_only: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth; under ``if TYPE_CHECKING:`` too when
    ``type_only`` (an import a type checker follows still ties the two modules together)."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node) and not type_only:
            yield from _imports(list(node.orelse))
        else:
            yield from _imports(list(ast.iter_child_nodes(node)), type_only=type_only)


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``node`` (in module ``name``) loads."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
        enclosing = (name + ".").startswith(source + ".")
        wanted = [*subs, *([source] if not enclosing or len(subs) < len(node.names) else [])]
    out: set[str] = set()
    for target in wanted:
        parts = target.split(".")
        # Importing a.b.c loads the package a.b too (not the root: every module here needs it first).
        for i in range(2, len(parts) + 1):
            loaded = ".".join(parts[:i])
            if loaded in known and not (name + ".").startswith(loaded + "."):
                out.add(loaded)
        if target in known and "." not in target and target != name:
            out.add(target)
    out.discard(name)
    return out


def import_graph(root: Path = PACKAGE, *, type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for what counts; with
    ``type_only``, the imports under ``if TYPE_CHECKING:`` too)."""
    found = modules(root)
    known = set(found)
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, (path, is_package) in found.items():
        tree = ast.parse(path.read_text("utf-8"), str(path))
        for node in _imports(list(tree.body), type_only=type_only):
            graph[name] |= _targets(name, is_package, node, known)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), i.e. the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def class_sizes(root: Path = PACKAGE) -> dict[str, int]:
    """``module.Class`` (nested classes too) -> its length in lines."""
    out: dict[str, int] = {}
    for name, (path, _) in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                out[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def _describe(graph: dict[str, set[str]], circle: frozenset[str]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(circle) for b in sorted(graph[a] & circle)]
    return "; ".join(edges)


# ---- the package ------------------------------------------------------------------------------


def test_no_import_circle() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles: " + " | ".join(_describe(graph, c) for c in found)


def test_no_import_circle_even_through_type_only_imports() -> None:
    graph = import_graph(type_only=True)
    found = cycles(graph)
    assert not found, "import circles (type-only imports counted): " + " | ".join(_describe(graph, c) for c in found)


# ---- the tiers: the core names no integration; only a store reaches into a store ------------------

#: The integrations and tools, each a folder (or module) on top of the core.
INTEGRATIONS = ("langgraph", "server", "fleet", "cli", "commands", "embedded")
#: The core: the I/O-free cores, the I/O floor, and the public modules of the package root that the
#: stores are made of (every root module but the tools' entry points).
ROOT_TOOLS = {"cli", "embedded", "__main__"}


def core_modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for name, found in modules().items():
        rel = name.split(".")[1:]
        if not rel or rel[0] in ("core", "wire") or (len(rel) == 1 and rel[0] not in ROOT_TOOLS | set(INTEGRATIONS)):
            out[name] = found
    return out


def test_the_core_names_no_integration() -> None:
    """No module of the core imports an integration or a tool (type-only imports counted), nor names
    one's module in a string (an import by name); an integration plugs in instead (its script family,
    its errors, its telemetry: ``wire/scripts.py``'s ``register_family``)."""
    graph = import_graph(type_only=True)
    banned = tuple(f"{PACKAGE.name}.{i}" for i in INTEGRATIONS)
    core = core_modules()
    assert {"redis_agentstate.core.checkpoint", "redis_agentstate.wire.scripts", "redis_agentstate.kv"} <= set(core)

    def integration(target: str) -> bool:
        return any(target == b or target.startswith(b + ".") for b in banned)

    wrong = {name: sorted(t for t in graph[name] if integration(t)) for name in core}
    assert not {k: v for k, v in wrong.items() if v}, wrong
    for name, (path, _) in core.items():
        if name == "redis_agentstate.errors":
            continue  # hands out an integration's errors by their old path, importing it only when asked
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not integration(node.value), f"{name} names {node.value!r}"


def _defines_a_store(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Subscript) and getattr(b.value, "id", "").endswith("Shell") for b in node.bases)
        for node in tree.body
    )


def test_only_a_store_reaches_into_a_store() -> None:
    """``x._run(...)`` and ``x._core`` on anything but ``self`` only in a module that defines a store
    (its own lease and helper classes) and in ``wire/shells.py``, whose ``internals`` is the one
    documented way in for the library's own tools (the CLI, the dashboard, the worker, the server)."""
    found = []
    for name, (path, _) in modules().items():
        tree = ast.parse(path.read_text("utf-8"))
        if name == "redis_agentstate.wire.shells" or _defines_a_store(tree):
            continue
        for node in ast.walk(tree):
            reaching = isinstance(node, ast.Attribute) and node.attr in ("_run", "_core")
            if reaching and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"{name}:{node.lineno} .{node.attr}")
    assert not found, found


def test_no_class_over_400_lines() -> None:
    sizes = class_sizes()
    over = {name: n for name, n in sizes.items() if n > MAX_CLASS_LINES}
    assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}"


def test_the_graph_sees_the_imports() -> None:
    """Not vacuous: module-level, relative, subpackage and function-level imports are all edges."""
    graph = import_graph()
    assert "redis_agentstate.core.checkpoint" in graph["redis_agentstate.checkpoint"]
    assert {"redis_agentstate.wire", "redis_agentstate.wire.shells"} <= graph["redis_agentstate.telemetry"]
    assert "redis_agentstate.wire.requests" in graph["redis_agentstate.wire.drivers"]
    # CheckpointStore.lease() imports lease.py inside the method; lease.py imports checkpoint.py
    # only under TYPE_CHECKING, which is no edge.
    assert "redis_agentstate.lease" in graph["redis_agentstate.checkpoint"]
    assert "redis_agentstate.checkpoint" not in graph["redis_agentstate.lease"]
    sizes = class_sizes()
    assert sizes["redis_agentstate.core.checkpoint.CheckpointCore"] > 10


# ---- the analysis itself, on small packages ----------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


#: A module whose import of ``pkg.a`` sits inside a method's ``try``: still an edge.
_NESTED = "class C:\n    def f(self):\n        try:\n            import pkg.a\n        finally:\n            pass\n"
_TYPING_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n"


@pytest.mark.parametrize(
    ("a", "b", "circle"),
    [
        ("from .b import x\n", "from .a import y\n", True),
        ("from . import b\n", "def f():\n    from . import a\n", True),  # function-level counts
        ("from .b import x\n", _TYPING_ONLY, False),
        ("from .b import x\n", _NESTED, True),
        ("from .sub import x\n", "", False),
    ],
)
def test_cycle_finder(tmp_path: Path, a: str, b: str, circle: bool) -> None:
    root = _package(tmp_path, {"a.py": a, "b.py": b, "sub/__init__.py": "from .m import x\n", "sub/m.py": "x = 1\n"})
    found = cycles(import_graph(root))
    assert (frozenset({"pkg.a", "pkg.b"}) in found) is circle
    assert all(len(c) > 1 for c in found)


def test_a_subpackage_init_that_imports_back_is_a_circle(tmp_path: Path) -> None:
    # sub/m.py imports a.py, which imports sub (its __init__ loads sub/m.py): a circle through the package.
    root = _package(tmp_path, {"a.py": "from .sub import x\n", "sub/__init__.py": "from .m import x\n",
                               "sub/m.py": "from .. import a\nx = 1\n"})  # fmt: skip
    assert cycles(import_graph(root)) == {frozenset({"pkg.a", "pkg.sub", "pkg.sub.m"})}


def test_class_sizes(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": "class A:\n" + "    x = 1\n" * 9 + "\n\nclass B:\n    pass\n"})
    assert class_sizes(root) == {"pkg.a.A": 10, "pkg.a.B": 2}


def test_every_kind_of_key_built_is_one_the_package_knows() -> None:
    """A kind of key built in keys.py (``p + "kind:"``) but missing from ``keys.KEY_TYPES`` is a key the
    resharder counts unknown and leaves under the old tag, and that corrupt-data errors cannot name
    (a run's stop signal once was one)."""
    import re

    from redis_agentstate.keys import KEY_TYPES

    built = set(re.findall(r'\+ "([a-z-]+):"', (PACKAGE / "keys.py").read_text()))
    assert len(built) > 30
    assert built - set(KEY_TYPES) == set()


# ---- one lease keeper ------------------------------------------------------------------------------

#: What a lease renewal loop calls on each turn: the keeper state machine's next step, or the
#: recording of a renewal's outcome (``LeaseState``'s methods and the leases' wrappers of them).
_RENEWAL_STEPS = frozenset(
    {"next_step", "_next_step", "renewed", "renew_failed", "_on_renew_reply", "_on_renew_error", "_renew_outcome"}
)


def renewal_loops(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> its functions that run a lease renewal loop: a loop whose body takes a step of the
    keeper's state machine, or any function named ``_keep`` (what a hand-written keeper is called)."""
    found: dict[str, set[str]] = {}
    for name, (path, _) in modules(root).items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            loops = [n for n in ast.walk(fn) if isinstance(n, (ast.While, ast.For, ast.AsyncFor))]
            steps = {
                c.func.attr
                for loop in loops
                for c in ast.walk(loop)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            }
            if fn.name == "_keep" or steps & _RENEWAL_STEPS:
                found.setdefault(name, set()).add(fn.name)
    return found


def test_one_module_keeps_leases() -> None:
    """The store's leases and LangGraph's thread leases are renewed by the one keeper (a thread and a task
    twin), so they share its deadline-bounded renewal, its lost-lease handling and its clock: a second
    renewal loop anywhere else is a second keeper, which would drift from the first."""
    from redis_agentstate.wire import keeper as _lease_keeper

    assert renewal_loops() == {_lease_keeper.__name__: {"_run"}}
    assert {"ThreadKeeper", "TaskKeeper"} <= set(dir(_lease_keeper))


@pytest.mark.parametrize(
    ("source", "keeper"),
    [
        # A thread lease's own keeper, renewing inline: what the rule exists to refuse.
        ("class L:\n    def _keep(self):\n        while True:\n            step, d = self._next_step()\n", True),
        ("async def run(s):\n    while s:\n        if not lease._on_renew_reply(1, r):\n            return\n", True),
        ("def renew_all(ls):\n    for x in ls:\n        x.state.renewed(1, 2, 3)\n", True),
        ("def _keep(self):\n    pass\n", True),  # by its name alone
        ("def f(ls):\n    for x in ls:\n        x.renew()\n    return ls.next_step(1)\n", False),  # not in a loop
    ],
)
def test_the_renewal_loop_finder(tmp_path: Path, source: str, keeper: bool) -> None:
    found = renewal_loops(_package(tmp_path, {"a.py": source}))
    assert ("pkg.a" in found) is keeper


# ---- composed cores: short class chains, short operation paths ------------------------------------

#: The most files of the package one class's MRO may span (the class's own module included).
MAX_CHAIN_FILES = 3
#: The most modules of the checkpoint core (the core's, its state's and its parts') one operation's
#: Python runs, from the shell's call down to the script call that names its Lua.
MAX_PATH_FILES = 3


def class_chains() -> dict[str, list[str]]:
    """``module.Class`` -> the package files its MRO is defined in, for every class of every module.

    Modules are imported (an MRO is only known then); ``__main__`` runs the command line when
    imported, so it is read instead, and must define no class."""
    import importlib
    import inspect

    out: dict[str, list[str]] = {}
    for name, (path, _) in modules().items():
        if name.rsplit(".", 1)[-1] == "__main__":
            tree = ast.parse(path.read_text("utf-8"), str(path))
            assert not any(isinstance(n, ast.ClassDef) for n in ast.walk(tree)), f"{name} defines a class"
            continue
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__ == name:
                files = {
                    str(Path(inspect.getfile(c)).relative_to(PACKAGE))
                    for c in obj.__mro__
                    if c.__module__.split(".")[0] == PACKAGE.name
                }
                out[f"{name}.{obj.__qualname__}"] = sorted(files)
    return out


def test_no_class_chain_spans_more_than_three_files() -> None:
    chains = class_chains()
    # Not vacuous: the stores' classes are seen, over their shells' module.
    assert chains["redis_agentstate.checkpoint.CheckpointStore"] == ["checkpoint.py", "wire/shells.py"]
    over = {name: files for name, files in chains.items() if len(files) > MAX_CHAIN_FILES}
    assert not over, f"class chains over {MAX_CHAIN_FILES} files: {over}"


def _core_modules(core: object) -> set[str]:
    """The files of the checkpoint core: its own class's, its state's and each part's (every attribute
    holding that same state)."""
    import inspect

    state = core.state  # type: ignore[attr-defined]
    held = [core, state, *(v for v in vars(core).values() if getattr(v, "state", None) is state)]
    return {str(Path(inspect.getfile(type(v))).relative_to(PACKAGE)) for v in held}


def _traced(run: Any) -> tuple[Any, set[str]]:
    """``run()``'s result and the package files whose Python ran in it (this thread)."""
    import sys

    seen: set[str] = set()
    root = str(PACKAGE) + "/"

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.add(frame.f_code.co_filename[len(root) :])

    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return result, seen


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
def test_commit_and_claims_path_is_three_files(make: Any, limited: bool) -> None:
    """A reader finds commit_and_claim's whole path, Python down to the script call, in at most three
    of the checkpoint core's files (a limited task's included: it takes a place first); the Lua it
    calls is one script of that name (its preludes are shared by every checkpoint script)."""
    from dataclasses import replace

    from redis_agentstate import AsyncCheckpointStore, Checkpoint, CheckpointStore
    from redis_agentstate.wire import scripts as S

    store = make(CheckpointStore, AsyncCheckpointStore)
    inner = getattr(store, "wrapped", store)
    key = "k" if limited else None
    if limited:
        store.set_concurrency_limit("k", 2)
    store.create(Checkpoint("t", concurrency_key=key))
    cp = store.claim("t", 1, token="w", lease_ms=30_000)
    sent: list[str] = []
    commit_and_claim = inner._core.commit_and_claim

    def recorded(*args: Any, **kw: Any) -> Any:
        op = commit_and_claim(*args, **kw)
        reply = None
        try:
            while True:
                call = op.send(reply)
                sent.append(call.script)
                reply = yield call
        except StopIteration as stop:
            return stop.value

    inner._core.commit_and_claim = recorded
    try:
        got, seen = _traced(lambda: store.commit_and_claim(replace(cp, cycle_index=1), token="w",
                                                           expected_revision=cp.revision, lease_ms=30_000))  # fmt: skip
    finally:
        inner._core.commit_and_claim = commit_and_claim
    assert got is not None and got.claimed_cycle == 2
    assert sent[-1] == S.COMMIT_AND_CLAIM and f"{S.COMMIT_AND_CLAIM}.lua" in S.lua_files()
    if limited:
        assert S.LIMIT_ACQUIRE in sent  # the limited path was taken
    path = seen & _core_modules(inner._core)
    assert "core/writes.py" in path  # not vacuous: the tracer saw the core's Python
    assert len(path) <= MAX_PATH_FILES, f"commit_and_claim runs {sorted(path)}"
