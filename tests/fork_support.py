"""``python ARGS`` as a process of its own without paying for a new interpreter each time.

The README and guide blocks (``tests/test_readme.py``, ``tests/test_docs.py``) and the CLI tests
(``tests/test_cli.py``) run a hundred and more short Python programs: each a fresh interpreter
that imports redis, the package and, for some, LangGraph before doing a few milliseconds of work.
``run_python`` gives each the same process boundary (its own pid, file descriptors 0-2 on
/dev/null and files, its environment and working directory, ``sys.argv``, ``__main__``, the
interpreter's own exit: non-daemon threads joined, atexit handlers, exit status), forked from a
zygote: one interpreter per pytest process that imported those modules once and does nothing
else (no thread, no event loop, no logging handler) and forks a child per program. A program
still starts from imports done in a clean interpreter, never from the test process's state.
``fresh=True`` runs a new interpreter, as ``subprocess.run`` does: the tests about the
interpreter's start itself keep it; so does a program whose ``PYTHON*`` variables (read when an
interpreter starts: ``PYTHONPATH``, ``PYTHONHASHSEED``...) differ from the zygote's.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["Spawned", "popen_python", "run_python"]

#: What the programs import, imported once in the zygote (each a fresh interpreter's cost: about
#: 0.3 s of CPU for the package, 1.5 s with LangGraph).
PRELOAD = (
    "redis",
    "redis.asyncio",
    "redis_agentstate",
    "redis_agentstate.cli",
    "redis_agentstate.embedded",
    "redis_agentstate.langgraph",
    "redis_agentstate.langgraph.cli",
    "langgraph.graph",
    # `agentstate serve` (tests/test_serve*.py): the app, its server and the SDK's models.
    "redis_agentstate.server",
    "uvicorn",
    "starlette.applications",
)

ZYGOTE = r"""
import importlib, json, os, sys, threading

for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # an extra not installed: the program imports it itself, and fails as it would anyway
# Forking is only sound from a single-threaded process.
assert threading.active_count() == 1, threading.enumerate()
# What is imported stays out of the collector's way: every child shares those pages unwritten.
import gc
gc.freeze()
os.write(1, b"ready\n")


# The top-level names it imported: a program given more PYTHONPATH entries is run here only when
# they shadow none of them.
os.write(1, json.dumps(sorted({name.split(".")[0] for name in sys.modules})).encode() + b"\n")


def serve():
    reader = os.fdopen(0, "rb", buffering=0)
    ended = {}  # pid -> exit code of the programs started with "spawn", reaped
    for line in iter(reader.readline, b""):
        request = json.loads(line)
        if "poll" in request:
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                ended[pid] = os.waitstatus_to_exitcode(status)
            os.write(1, json.dumps({"status": ended.get(request["poll"])}).encode() + b"\n")
            continue
        pid = os.fork()
        if pid == 0:
            return request
        os.write(1, json.dumps({"pid": pid}).encode() + b"\n")
        if request.get("spawn"):
            continue
        _, status = os.waitpid(pid, 0)
        os.write(1, json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    raise SystemExit(0)


request = serve()
del serve
devnull = os.open(os.devnull, os.O_RDONLY)
os.dup2(devnull, 0)
os.close(devnull)
for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    flags = os.O_WRONLY | os.O_APPEND if request.get("spawn") else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    target = os.open(path, flags, 0o600)
    os.dup2(target, fd)
    os.close(target)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.path[1:1] = request["path"]  # PYTHONPATH's entries before the zygote's, as an interpreter puts them
# What the zygote's imports may have read from its own environment, read again from the program's.
import tempfile

tempfile.tempdir = None
args = request["args"]


def program():
    import runpy

    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


# The interpreter's exit, less the teardown of every module object: non-daemon threads joined,
# atexit handlers run, a SystemExit's code or an uncaught exception's traceback, streams flushed.
try:
    program()
    code = 0
except SystemExit as stop:
    if stop.code is None or isinstance(stop.code, int):
        code = stop.code or 0
    else:
        print(stop.code, file=sys.stderr)
        code = 1
except BaseException as exc:
    # The traceback from the program's own frames on, as the interpreter prints it.
    import runpy

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals in (globals(), vars(runpy)):
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    code = 1
threading._shutdown()
import atexit
atexit._run_exitfuncs()
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        code = code or 120
os._exit(code)
"""


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables an interpreter reads when it starts (``PYTHONHASHSEED``, ``PYTHONPATH``...): a
    program whose differ from the zygote's gets a new interpreter (entries put before the zygote's
    ``PYTHONPATH`` excepted: see ``_Zygote.extra_path``)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}


class _Zygote:
    def __init__(self) -> None:
        self.startup = _startup_env(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, *PRELOAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.lock = threading.Lock()
        if self.proc.stdout.readline() != b"ready\n":
            self.proc.wait(10)
            raise RuntimeError(f"the zygote did not start (exit {self.proc.returncode})")
        self.path = os.environ.get("PYTHONPATH", "")
        self.imported = set(json.loads(self.proc.stdout.readline()))

    def extra_path(self, env: Mapping[str, str]) -> list[str] | None:
        """The ``PYTHONPATH`` entries ``env`` puts before the zygote's, or None when a program with it
        cannot be run from here: other entries, or one holding a module the zygote imported."""
        wanted, base = env.get("PYTHONPATH", ""), self.path
        if wanted == base:
            return []
        suffix = os.pathsep + base  # an unset one: the empty entry that os.pathsep.join([..., ""]) leaves
        if not wanted.endswith(suffix):
            return None
        extra = [p for p in wanted[: -len(suffix)].split(os.pathsep) if p]
        for entry in extra:
            names = {Path(n).stem for n in os.listdir(entry)} if os.path.isdir(entry) else set()
            if names & self.imported:
                return None
        return extra

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        return dict(json.loads(self.proc.stdout.readline()))

    def spawn(self, args: Sequence[str], env: Mapping[str, str], path: list[str], out: str, err: str) -> int:
        request = {"args": list(args), "env": dict(env), "path": path, "cwd": os.getcwd(), "stdout": out,
                   "stderr": err, "spawn": True}  # fmt: skip
        with self.lock:
            return int(self.ask(request)["pid"])

    def status(self, pid: int) -> int | None:
        with self.lock:
            return self.ask({"poll": pid})["status"]  # type: ignore[no-any-return]

    def run(
        self, args: Sequence[str], env: Mapping[str, str], path: list[str], cwd: str, timeout: float | None
    ) -> tuple[int, str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock, tempfile.TemporaryDirectory(prefix="agentstate-fork-") as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            request = {"args": list(args), "env": dict(env), "path": path, "cwd": cwd, "stdout": out, "stderr": err}
            pid = self.ask(request)["pid"]
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            timed_out = not ready
            if timed_out:
                os.kill(pid, signal.SIGKILL)
            code = json.loads(self.proc.stdout.readline())["status"]
            stdout, stderr = (_text(Path(p).read_bytes()) if os.path.exists(p) else "" for p in (out, err))
        if timed_out:
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout or 0, stdout, stderr)
        return code, stdout, stderr


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: the locale's UTF-8, universal newlines."""
    return data.decode("utf-8", errors="strict").replace("\r\n", "\n").replace("\r", "\n")


_zygote: _Zygote | None = None


def _the_zygote() -> _Zygote:
    global _zygote
    if _zygote is None or not _zygote.alive():
        _zygote = _Zygote()
        atexit.register(_zygote.close)
    return _zygote


def run_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, stdin=DEVNULL, ...)``;
    ``args`` is a script and its arguments, ``-m module ...`` or ``-c code ...``."""
    env = dict(os.environ if env is None else env)
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    if not fresh:
        zygote = _the_zygote()
        path = zygote.extra_path(env)
        if zygote.startup == _startup_env(env) and path is not None:
            code, stdout, stderr = zygote.run(args, env, path, where, timeout)
            return subprocess.CompletedProcess([sys.executable, *args], code, stdout, stderr)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, env=env,
        cwd=where,
    )  # fmt: skip


class Spawned:
    """A program forked from the zygote and left running: what the tests use of ``subprocess.Popen``."""

    def __init__(self, zygote: _Zygote, pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen_python(args: Sequence[str], *, env: Mapping[str, str], stdout: IO[bytes], stderr: IO[bytes]) -> Any:
    """``subprocess.Popen([sys.executable, *args], env=env, stdout=stdout, stderr=stderr)`` forked from the
    zygote (a ``Spawned``; ``stdout`` and ``stderr`` are files, written through /proc), or the Popen
    itself where the zygote cannot run it (``run_python``'s rule)."""
    zygote = _the_zygote()
    path = zygote.extra_path(env)
    if zygote.startup != _startup_env(env) or path is None:
        return subprocess.Popen([sys.executable, *args], env=dict(env), stdout=stdout, stderr=stderr)
    out, err = (f"/proc/{os.getpid()}/fd/{f.fileno()}" for f in (stdout, stderr))
    return Spawned(zygote, zygote.spawn(args, env, path, out, err), [sys.executable, *args])
