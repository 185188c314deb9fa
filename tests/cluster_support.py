"""A real local Redis Cluster for tests: 3 primaries on free loopback ports.

``LocalCluster.start()`` launches ``redis-server --cluster-enabled yes`` nodes
(each in its own temp dir, with an explicit ``--cluster-port`` so the bus port
is free too), joins them with ``redis-cli --cluster create ... --cluster-yes``
and waits until every node reports ``cluster_state:ok`` and agrees on the slot
map. ``stop()`` kills the nodes and removes the dirs.

The ``redis_cluster`` fixture below is session-scoped: the cluster starts once,
on first use, and is torn down at the end of the session. Tests that need it
and cannot have it (no ``redis-server``/``redis-cli``) skip, except under
``CI=true`` where they fail.

``ClusterBackend`` has the face of ``conftest.Backend`` (``kind``,
``sync_client``, ``async_client``, ``close``), so the shared ``backend``
fixture can grow a ``"cluster"`` param that reuses every store test (see
``cluster_backend``).

This module imports nothing from ``conftest`` so that ``conftest`` may import
it without a cycle.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio.cluster as aiocluster
import redis.cluster
from redis._parsers import AsyncCommandsParser, CommandsParser

__all__ = [
    "ClusterBackend",
    "ClusterNode",
    "LocalCluster",
    "cluster_backend",
    "key_for_slot_owned_by",
    "port_taken",
    "redis_cluster",
    "require_cluster_tools",
]


def _slots(c: redis.Redis) -> list[Any]:
    """Raw ``CLUSTER SLOTS`` from a plain client: ``[start, end, [host, port, id], ...]`` entries."""
    return list(c.execute_command("CLUSTER", "SLOTS"))


def _free_port(exclude: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in exclude:
            exclude.add(port)
            return port


def require_cluster_tools() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-cli``; skip (or fail under CI) without them."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        reason = "redis-server and redis-cli are needed for a local Redis Cluster"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return server, cli


@dataclass
class ClusterNode:
    port: int
    bus_port: int
    dir: str
    proc: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    def restart(self) -> None:
        """Start the node again with its arguments and data dir (its ``nodes.conf``: it rejoins)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kw)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def node_id(self) -> str:
        with self.client() as c:
            return c.execute_command("CLUSTER", "MYID").decode()


@dataclass
class LocalCluster:
    """A running local Redis Cluster; ``stop()`` removes every trace of it."""

    nodes: list[ClusterNode]
    cli: str
    _clients: list[Any] = field(default_factory=list)
    # The nodes' COMMAND table, which every new RedisCluster client fetches and parses
    # (about 2,000 entries: 0.1-0.3 s a client, the bulk of a cluster test's cost). The
    # table is fixed for a given server binary, so each flavour reads it from the nodes
    # once and later clients start from a copy; everything else they fetch as usual.
    _sync_commands: dict[str, Any] | None = None
    _async_commands: dict[str, Any] = field(default_factory=dict)

    # ---- lifecycle ------------------------------------------------------

    @classmethod
    def start(
        cls,
        primaries: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 2000,
        timeout: float = 30.0,
        extra: tuple[str, ...] = (),
    ) -> LocalCluster:
        """``primaries`` primaries, each with ``replicas`` replicas (``redis-cli --cluster-replicas``);
        ``extra``: more arguments for every node."""
        # A free port is only free when asked: another xdist worker may bind it first. Such a
        # node exits at once, and the whole cluster is started again on other ports.
        for attempt in range(3):
            try:
                return cls._start_once(primaries, replicas, node_timeout_ms, timeout, extra)
            except _PortTaken:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(
        cls, primaries: int, replicas: int, node_timeout_ms: int, timeout: float, extra: tuple[str, ...]
    ) -> LocalCluster:
        server, cli = require_cluster_tools()
        used: set[int] = set()
        nodes: list[ClusterNode] = []
        cluster = cls(nodes=nodes, cli=cli)
        try:
            for _ in range(primaries * (1 + replicas)):
                port, bus = _free_port(used), _free_port(used)
                d = tempfile.mkdtemp(prefix="agentstate-cluster-")
                args = [
                    server, "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                    "--cluster-enabled", "yes", "--cluster-port", str(bus),
                    "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(node_timeout_ms),
                    "--save", "", "--appendonly", "no", "--logfile", os.path.join(d, "redis.log"), *extra,
                ]  # fmt: skip
                proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                nodes.append(ClusterNode(port=port, bus_port=bus, dir=d, proc=proc, args=args))
            for node in nodes:
                cluster._wait_ping(node, timeout)
            addrs = [n.addr for n in nodes]
            out = subprocess.run(
                [cli, "--cluster", "create", *addrs, "--cluster-replicas", str(replicas), "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}\n{out.stderr}")
            cluster.wait_ok(timeout)
        except BaseException as exc:
            taken = isinstance(exc, RuntimeError) and any(port_taken(n.dir) for n in nodes)
            cluster.stop()
            if taken:
                raise _PortTaken(str(exc)) from exc
            raise
        return cluster

    @staticmethod
    def _wait_ping(node: ClusterNode, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(f"cluster node exited with {node.proc.returncode}; see {node.dir}/redis.log")
            try:
                with node.client(socket_connect_timeout=0.5) as c:
                    # The node answering must be this one, not a server that took the port first.
                    if c.info("server")["process_id"] == node.proc.pid:
                        return
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"cluster node on port {node.port} did not answer PING")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok`` and all agree on the slot map."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                states, maps = [], []
                for node in self.nodes:
                    with node.client() as c:
                        info = c.execute_command("CLUSTER", "INFO").decode()
                        states.append("cluster_state:ok" in info)
                        maps.append(sorted((int(s[0]), int(s[1]), int(s[2][1])) for s in _slots(c)))
                if all(states) and all(m == maps[0] for m in maps) and sum(e - b + 1 for b, e, _ in maps[0]) == 16384:
                    return
                last = f"states={states}"
            except (redis.RedisError, AttributeError) as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise TimeoutError(f"Redis Cluster not ok after {timeout}s: {last}")

    def stop(self) -> None:
        loop: asyncio.AbstractEventLoop | None = None
        for c in self._clients:
            try:
                if isinstance(c, aiocluster.RedisCluster):
                    loop = loop or asyncio.new_event_loop()
                    loop.run_until_complete(c.aclose())
                else:
                    c.close()
            except Exception:
                pass
        if loop is not None:
            loop.close()
        self._clients.clear()
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
            shutil.rmtree(node.dir, ignore_errors=True)

    # ---- clients --------------------------------------------------------

    @property
    def startup(self) -> tuple[str, int]:
        return "127.0.0.1", self.nodes[0].port

    def sync_client(self, **kw: Any) -> redis.cluster.RedisCluster:
        """A ``redis.cluster.RedisCluster`` (binary replies) on this cluster."""
        host, port = self.startup
        kw.setdefault("socket_timeout", 5)
        if self._sync_commands is None:
            client = redis.cluster.RedisCluster(host=host, port=port, **kw)
            self._sync_commands = client.commands_parser.commands
            return client
        with _parser_swap:  # the client builds its parser from this module global in __init__
            redis.cluster.CommandsParser = _known_sync_commands(self._sync_commands)  # type: ignore[misc]
            try:
                return redis.cluster.RedisCluster(host=host, port=port, **kw)
            finally:
                redis.cluster.CommandsParser = CommandsParser  # type: ignore[misc]

    def async_client(self, **kw: Any) -> aiocluster.RedisCluster:
        """A ``redis.asyncio.cluster.RedisCluster`` on this cluster (initialises on first use)."""
        host, port = self.startup
        kw.setdefault("socket_timeout", 5)
        client = aiocluster.RedisCluster(host=host, port=port, **kw)
        client.commands_parser = _KnownAsyncCommands(self._async_commands)
        return client

    # ---- inspection and slot moves ---------------------------------------

    def node_by_port(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == port)

    def owner_of_slot(self, slot: int) -> ClusterNode:
        with self.nodes[0].client() as c:
            for start, end, primary, *_ in _slots(c):
                if int(start) <= slot <= int(end):
                    return self.node_by_port(int(primary[1]))
        raise LookupError(f"slot {slot} is not served")

    def slots_of(self, node: ClusterNode) -> list[int]:
        """The slots ``node`` serves, ascending."""
        with node.client() as c:
            ranges = [(int(e[0]), int(e[1])) for e in _slots(c) if int(e[2][1]) == node.port]
        return [s for b, e in sorted(ranges) for s in range(b, e + 1)]

    def error_stats(self) -> Counter[str]:
        """Error replies sent by all nodes since start, by kind (``INFO errorstats``: MOVED, ASK, ...)."""
        total: Counter[str] = Counter()
        for node in self.nodes:
            with node.client() as c:
                for name, value in c.info("errorstats").items():
                    if name.startswith("errorstat_"):
                        total[name[len("errorstat_") :]] += int(value["count"])
        return total

    def move_slot(self, slot: int, target: ClusterNode, *, batch: int = 10, pause_s: float = 0.0) -> int:
        """Move ``slot`` to ``target`` live, the way ``redis-cli --cluster reshard`` does.

        IMPORTING on the target, MIGRATING on the source, MIGRATE keys in
        batches (clients get ASK redirections meanwhile), then SETSLOT NODE on
        every node. ``pause_s`` sleeps between batches so a concurrent workload
        sees the slot half-moved. Returns how many keys moved.
        """
        source = self.owner_of_slot(slot)
        if source.port == target.port:
            return 0
        src_id, dst_id = source.node_id(), target.node_id()
        moved = 0
        with source.client() as src, target.client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                if pause_s:
                    time.sleep(pause_s)
            # Target first, then source, then the others (the order redis-cli uses).
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for node in self.nodes:
            if node.port not in (source.port, target.port):
                with node.client() as c:
                    if c.execute_command("ROLE")[0] != b"master":
                        continue  # a replica takes the slot map from the primaries (and refuses SETSLOT)
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self.wait_ok()
        return moved

    def reshard(self, source: ClusterNode, target: ClusterNode, slots: int) -> str:
        """``redis-cli --cluster reshard`` of ``slots`` slots from ``source`` to ``target``."""
        out = subprocess.run(
            [
                self.cli, "--cluster", "reshard", self.nodes[0].addr,
                "--cluster-from", source.node_id(), "--cluster-to", target.node_id(),
                "--cluster-slots", str(slots), "--cluster-yes", "--cluster-pipeline", "10",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster reshard failed: {out.stdout[-2000:]}\n{out.stderr}")
        self.wait_ok()
        return out.stdout


_parser_swap = threading.Lock()


class _PortTaken(RuntimeError):
    """A node exited because another process bound its port first."""


def port_taken(dir: str) -> bool:
    """Whether the server logged in ``dir`` (its ``redis.log``) exited because its port was bound already."""
    try:
        with open(os.path.join(dir, "redis.log"), encoding="utf-8", errors="replace") as log:
            return "Address already in use" in log.read()
    except OSError:
        return False


def _known_sync_commands(table: dict[str, Any]) -> Any:
    """A ``CommandsParser`` factory whose parsers start from ``table`` instead of sending COMMAND."""

    class KnownCommands(CommandsParser):
        def initialize(self, r: Any) -> None:
            self.commands = dict(table)

    return KnownCommands


class _KnownAsyncCommands(AsyncCommandsParser):
    """An ``AsyncCommandsParser`` that sends COMMAND only while ``table`` (shared per cluster) is empty."""

    def __init__(self, table: dict[str, Any]) -> None:
        super().__init__()
        self._table = table

    async def initialize(self, node: Any = None) -> None:
        if node:
            self.node = node
        if not self._table:
            await super().initialize()
            self._table.update(self.commands)
        self.commands = dict(self._table)


def key_for_slot_owned_by(prefix_keys: list[str], owner_port: int, cluster: LocalCluster) -> str | None:
    """The first of ``prefix_keys`` whose slot ``owner_port`` serves (or None)."""
    for k in prefix_keys:
        if cluster.owner_of_slot(redis.cluster.key_slot(k.encode())).port == owner_port:
            return k
    return None


@dataclass
class ClusterBackend:
    """Client factories on a :class:`LocalCluster`, shaped like ``conftest.Backend``."""

    cluster: LocalCluster
    kind: str = "cluster"
    url: str | None = None
    server: Any = None
    _sync: list[Any] = field(default_factory=list)
    _async: list[Any] = field(default_factory=list)

    def sync_client(self, **kw: Any) -> redis.cluster.RedisCluster:
        client = self.cluster.sync_client(**kw)
        self._sync.append(client)
        return client

    def async_client(self, **kw: Any) -> aiocluster.RedisCluster:
        client = self.new_async_client(**kw)
        self._async.append(client)
        return client

    def new_async_client(self, **kw: Any) -> aiocluster.RedisCluster:
        """An asyncio cluster client the caller closes."""
        return self.cluster.async_client(**kw)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        for c in self._sync:
            c.close()
        for c in self._async:
            loop.run_until_complete(c.aclose())


def cluster_backend(cluster: LocalCluster) -> ClusterBackend:
    """A ``conftest.Backend`` look-alike whose clients are ``RedisCluster`` (sync and asyncio)."""
    return ClusterBackend(cluster)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """One 3-primary local Redis Cluster for the whole session."""
    try:
        cluster = LocalCluster.start()
    except (FileNotFoundError, RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the local Redis Cluster did not start: {exc}")
        pytest.skip(f"local Redis Cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
