"""The LangGraph API servers that the benchmarks, the JavaScript-client check and the serve tests start.

Not a benchmark: the launchers ``benchmarks/serve.py``, ``tools/js_client_check.py`` and
``tests/serve_support.py`` share, each a context manager that yields the server's base URL once it
answers, and stops the server (SIGTERM, SIGKILL after 20 s) on exit:

- ``agentstate_serve``: ``python -m redis_agentstate serve`` as a subprocess on a Redis URL.
- ``langgraph_dev``: LangChain's own in-memory server, ``langgraph dev`` (``pip install
  "langgraph-cli[inmem]"`` in a virtualenv of its own), with a ``langgraph.json`` written for it.
- ``aegra``: Aegra (``pip install aegra-api greenlet`` in a virtualenv of its own), the Apache-2.0
  server of the same API on PostgreSQL, under uvicorn, on a throwaway PostgreSQL (``postgres``).

A server that exits before it answers, or does not answer in time, raises ``ServerError`` with the
tail of its output. ``aegra_missing`` says why Aegra cannot be started here (None when it can).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "ServerError",
    "aegra",
    "aegra_missing",
    "aegra_python",
    "agentstate_serve",
    "free_port",
    "langgraph_dev",
    "postgres",
    "postgres_version",
    "process",
    "version_in",
]

ROOT = Path(__file__).resolve().parent.parent


class ServerError(RuntimeError):
    """A server did not come up: it exited, or did not answer in time (the message ends with its output)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=3).status_code == 200
    return False


@contextlib.contextmanager
def process(args: Sequence[str], ready: str, *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 120) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """``args`` running until ``GET ready`` answers 200 (``timeout`` s at most); stopped on exit."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(list(args), cwd=cwd, env=None if env is None else dict(env), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip

        def tail() -> str:
            out.seek(0)
            return out.read().decode(errors="replace")[-3000:]

        try:
            deadline = time.monotonic() + timeout
            while not _answers(ready):
                if proc.poll() is not None:
                    raise ServerError(f"{Path(args[0]).name} exited {proc.returncode}: {tail()}")
                if time.monotonic() > deadline:
                    raise ServerError(f"{' '.join(args)} did not answer {ready} in {timeout:g} s: {tail()}")
                time.sleep(0.1)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _foreign_env(**extra: str) -> dict[str, str]:
    """This environment without what points Python at our virtualenv or our sources: another
    virtualenv's server must import its own pins."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


@contextlib.contextmanager
def agentstate_serve(redis_url: str, graphs: Mapping[str, str], *, namespace: str, token: str | None = None,
                     pythonpath: Sequence[str | Path] = (), extra: Sequence[str] = (),
                     launch: Sequence[str] = ("-m", "redis_agentstate"),
                     ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # fmt: skip
    """``agentstate serve`` (this interpreter's) on ``redis_url`` serving ``graphs`` (name -> ``MODULE:ATTR``,
    importable from ``pythonpath`` and the repository); ``(base URL, process)``. ``launch``: the
    interpreter's arguments before ``serve`` (a ``-c`` program that wraps the CLI, say)."""
    port = free_port()
    args = [sys.executable, *launch, "serve", "--url", redis_url, "--namespace", namespace,
            "--port", str(port), *extra]  # fmt: skip
    for name, ref in graphs.items():
        args += ["--graph", f"{name}={ref}"]
    paths = [*map(str, pythonpath), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    if token is not None:
        env["AGENTSTATE_TOKEN"] = token
    base = f"http://127.0.0.1:{port}"
    with process(args, base + "/ok", cwd=ROOT, env=env, timeout=60) as proc:
        yield base, proc


@contextlib.contextmanager
def langgraph_dev(cli: str | Path, graphs: Mapping[str, str], dependencies: Sequence[str | Path] = (),
                  **config: Any) -> Iterator[str]:  # fmt: skip
    """``langgraph dev`` (``cli``: the ``langgraph`` command of ``langgraph-cli[inmem]``) serving ``graphs``
    (name -> ``FILE.py:ATTR``, absolute); ``config``: more keys of its ``langgraph.json`` (e.g. ``webhooks``)."""
    port = free_port()
    spec = {"graphs": dict(graphs), "dependencies": [str(d) for d in dependencies] or ["."], **config}
    with tempfile.TemporaryDirectory() as d:
        Path(d, "langgraph.json").write_text(json.dumps(spec))
        args = [str(cli), "dev", "--port", str(port), "--no-browser", "--no-reload"]
        base = f"http://127.0.0.1:{port}"
        with process(args, base + "/ok", cwd=d, env=_foreign_env()):
            yield base


# ---- Aegra on a throwaway PostgreSQL -------------------------------------------------------------


def aegra_python(path: str | Path) -> Path:
    """The interpreter of Aegra's virtualenv from ``path``: that interpreter, or its ``bin/`` directory."""
    p = Path(path)
    return p / "python" if p.is_dir() else p


def _pg_bin(name: str) -> str | None:
    """A PostgreSQL server binary: on ``PATH``, else in Debian's ``/usr/lib/postgresql/<major>/bin``."""
    found = shutil.which(name)
    if found:
        return found
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).is_file():
            return str(d / name)
    return None


def aegra_missing(path: str | Path) -> str | None:
    """Why Aegra cannot be started from ``path`` (see ``aegra_python``); None when it can."""
    python = aegra_python(path)
    if not python.is_file():
        return f"{python} does not exist (pip install aegra-api greenlet in a virtualenv)"
    probe = "import aegra_api, greenlet, uvicorn"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120,
                          env=_foreign_env())  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"`{python} -c {probe!r}` failed: {last}"
    missing = [b for b in ("initdb", "pg_ctl") if _pg_bin(b) is None]
    if missing:
        return f"no PostgreSQL server binaries ({', '.join(missing)}): apt-get install postgresql"
    return None


def postgres_version() -> str | None:
    """The version of the PostgreSQL server ``postgres`` starts (``15.20``)."""
    pg_ctl = _pg_bin("pg_ctl")
    if pg_ctl is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        words = subprocess.run([pg_ctl, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
        return words[2] if len(words) > 2 else None
    return None


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL on a free loopback port, its data in a temporary directory; its URL (user
    ``postgres``, no password, database ``postgres``). Durability is off (``fsync=off``), like the
    benchmarks' private redis-server, which saves nothing. PostgreSQL refuses to run as root: as root,
    it runs as ``nobody`` (``runuser``)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise ServerError("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql")
    as_user: list[str] = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="agentstate-pg-") as d:
        if as_user:
            shutil.chown(d, user="nobody")
        data = str(Path(d, "data"))

        def run(args: list[str]) -> None:
            done = subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120, cwd=d)
            if done.returncode != 0:
                raise ServerError(f"{' '.join(args)} failed: {(done.stdout + done.stderr)[-2000:]}")

        run([initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        opts = f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off"
        run([pg_ctl, "-D", data, "-l", str(Path(d, "postgres.log")), "-o", opts, "-w", "-t", "60", "start"])
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "fast", "-w", "stop"], capture_output=True,
                           timeout=60, cwd=d)  # fmt: skip


#: Aegra 0.6.0 executes a graph file without entering it in ``sys.modules``, so a ``TypedDict`` state
#: under ``from __future__ import annotations`` cannot resolve its hints there (every run fails with
#: "name 'Annotated' is not defined", and ``runs.wait`` answers 200 ``{}``). Each graph is reached
#: through this stub, which loads the same file as a module of its own.
_STUB = """import importlib.util, sys
spec = importlib.util.spec_from_file_location({module!r}, {file!r})
module = importlib.util.module_from_spec(spec)
sys.modules[{module!r}] = module
spec.loader.exec_module(module)
{attr} = getattr(module, {attr!r})
"""


@contextlib.contextmanager
def aegra(path: str | Path, graphs: Mapping[str, str]) -> Iterator[str]:
    """Aegra (``aegra_api.main:app`` under uvicorn, from the virtualenv of ``path``: see ``aegra_python``)
    serving ``graphs`` (name -> ``FILE.py:ATTR``, absolute) on a throwaway PostgreSQL (``postgres``),
    logging at WARNING and without an access log, as ``agentstate serve`` does; its URL."""
    python = aegra_python(path)
    port = free_port()
    with postgres() as database, tempfile.TemporaryDirectory() as d:
        spec: dict[str, str] = {}
        for name, ref in graphs.items():
            file, attr = ref.rsplit(":", 1)
            Path(d, f"graph_{name}.py").write_text(_STUB.format(module=f"_{Path(file).stem}", file=file, attr=attr))
            spec[name] = f"./graph_{name}.py:{attr}"
        config = Path(d, "aegra.json")
        config.write_text(json.dumps({"graphs": spec}))
        env = _foreign_env(DATABASE_URL=database, AEGRA_CONFIG=str(config), LOG_LEVEL="WARNING")
        args = [str(python), "-m", "uvicorn", "aegra_api.main:app", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", "--no-access-log"]  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        with process(args, base + "/health", cwd=d, env=env):
            yield base


def version_in(python: str | Path, package: str) -> str | None:
    """``package``'s version in the environment of the interpreter ``python``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                             capture_output=True, text=True, timeout=30, env=_foreign_env())  # fmt: skip
        return out.stdout.strip() or None
    return None
