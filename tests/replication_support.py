"""Private replicated setups for tests: a primary with replicas, all on free loopback ports.

Every server is a ``conftest.RedisServerProcess`` started here and stopped by
``stop()``. Shared by tests/test_replication.py and the failover chaos test.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from conftest import RedisServerProcess


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
        """``replica`` stopped with SIGSTOP (alive, connected, silent) for the block; resumed after."""
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        for server in (*self.replicas, self.primary):
            server.stop()
