"""Private replicated setups for tests: a primary with replicas, all on free loopback ports.

Every server is a ``conftest.RedisServerProcess`` started here and stopped by
``stop()``. Shared by tests/test_replication.py and the failover chaos test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from conftest import RedisServerProcess, free_port


def wait_until(what: str, ok: Callable[[], Any], timeout: float = 20.0) -> None:
    """Poll ``ok`` (Redis errors count as not yet) until true, or raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def online_replicas(port: int) -> int:
    """How many replicas the server on ``port`` sees in state ``online``."""
    with redis.Redis(port=port, socket_timeout=2) as c:
        info = c.info("replication")
    return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v["state"] == "online")


def caught_up(port: int) -> bool:
    """Every online replica of the primary at ``port`` acknowledged its whole replication stream."""
    client = redis.Redis(port=port)
    try:
        info = client.info("replication")
    finally:
        client.close()
    replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return all(r.get("state") == "online" and int(r["offset"]) >= int(info["master_repl_offset"]) for r in replicas)


@dataclass
class Replicated:
    """One primary and its replicas (``--replicaof``), started by ``start``."""

    primary: RedisServerProcess
    replicas: list[RedisServerProcess] = field(default_factory=list)

    @classmethod
    def start(
        cls, replicas: int = 1, *extra: str, primary_extra: tuple[str, ...] = (), binary: str | None = None
    ) -> Replicated:
        """``extra``: arguments of every server; ``primary_extra``: of the primary only."""
        extra = ("--repl-diskless-sync-delay", "0", *extra)  # a replica syncs at once, not after 5 s
        setup = cls(RedisServerProcess.start(*extra, *primary_extra, binary=binary))
        try:
            for _ in range(replicas):
                setup.replicas.append(
                    RedisServerProcess.start("--replicaof", "127.0.0.1", str(setup.primary.port), *extra, binary=binary)
                )
            wait_until(f"{replicas} replica(s) online", lambda: online_replicas(setup.primary.port) == replicas)
        except BaseException:
            setup.stop()
            raise
        return setup

    @contextmanager
    def frozen(self, replica: RedisServerProcess) -> Iterator[None]:
        """``replica`` stopped with SIGSTOP (alive, connected, silent) for the block; resumed after,
        and caught up: what the block wrote is acknowledged (a re-send then meets a live replica,
        not one still replaying its backlog on a loaded machine)."""
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
            wait_until("the resumed replica acknowledged the primary's writes", lambda: caught_up(self.primary.port))

    def stop(self) -> None:
        for server in (*self.replicas, self.primary):
            server.stop()


def start_sentinel(
    folder: str,
    service: str,
    primary_port: int,
    *,
    quorum: int = 1,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    parallel_syncs: int = 1,
) -> tuple[int, subprocess.Popen[bytes]]:
    """A private Sentinel monitoring ``service`` at ``primary_port``; its port and process.

    Sentinel rewrites its config file, so it lives in ``folder`` (a temp dir the caller removes).
    """
    port = free_port()
    conf = os.path.join(folder, "sentinel.conf")
    with open(conf, "w") as f:
        f.write(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder}/sentinel.log\n"
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} {parallel_syncs}\n"
        )
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not on PATH")
    proc = subprocess.Popen([binary, conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return port, proc
