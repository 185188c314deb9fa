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
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["run_python"]

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


def serve():
    reader = os.fdopen(0, "rb", buffering=0)
    for line in iter(reader.readline, b""):
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        os.write(1, json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        os.write(1, json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    raise SystemExit(0)


request = serve()
del serve
devnull = os.open(os.devnull, os.O_RDONLY)
os.dup2(devnull, 0)
os.close(devnull)
for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, fd)
    os.close(target)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
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
    """The variables an interpreter reads when it starts (``PYTHONPATH``, ``PYTHONHASHSEED``...): a
    program whose differ from the zygote's gets a new interpreter."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


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

    def run(self, args: Sequence[str], env: Mapping[str, str], cwd: str, timeout: float | None) -> tuple[int, str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock, tempfile.TemporaryDirectory(prefix="agentstate-fork-") as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            request = {"args": list(args), "env": dict(env), "cwd": cwd, "stdout": out, "stderr": err}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            pid = json.loads(self.proc.stdout.readline())["pid"]
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
        if zygote.startup == _startup_env(env):
            code, stdout, stderr = zygote.run(args, env, where, timeout)
            return subprocess.CompletedProcess([sys.executable, *args], code, stdout, stderr)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, env=env,
        cwd=where,
    )  # fmt: skip
