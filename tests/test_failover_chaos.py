"""Chaos across failover: what ``wait_replicas`` changes when the primary goes away.

Every server is private, on loopback, started here. Worker processes
(``faults/chaos_worker.py``) run the Runner with ``wait_replicas`` 0 or 1; every
``FAILOVER_EVERY_S`` the nemesis strikes. At the end the history checker
(``faults/checker.py``) holds what the workers were told against the final state, and
``classify`` sorts its violations into acknowledged commits lost, acknowledged pool messages
lost, claims rolled back, cycles applied twice, stale claims or commits that won. The gap
between the last acknowledged commit before each strike and the first after it is the
failover time the workers saw. Four setups (``setup``):

* ``sentinel``: 1 primary and 2 replicas with ``min-replicas-to-write 1``, 3 Sentinels
  (quorum 2), workers on a Sentinel client; the nemesis ``kill -9``s the primary, waits for
  the promotion, and brings the old primary back (same port, no data) as a replica.
* ``split``: the same servers, each behind two fault proxies (one for Sentinels and
  replicas, one for clients); the nemesis cuts the primary off from Sentinels and replicas
  for ``ISOLATE_S`` while workers still reach it: split brain (see ``SplitFleet``).
* ``cluster``: a local Redis Cluster of 3 primaries with a replica each; the nemesis kills
  one primary per round (in turn), the cluster promotes its replica, and the old primary
  restarts on its data dir (``nodes.conf``) and rejoins as a replica.
* ``cluster-split``: the same cluster shape, each node on its own loopback address behind
  proxies for its client and bus ports; the nemesis cuts one primary (in turn) off from the
  other nodes' bus and from its replica for ``ISOLATE_S`` while workers still reach it: split
  brain on the cluster (see ``ClusterSplitFleet``).

* ``test_failover_bounded`` (normal suite, ~25-35 s per setup and setting): failovers every 5 s
  for 14 s; with ``wait_replicas=1`` nothing acknowledged may be lost or applied twice.
* ``test_failover_long`` (markers ``chaos`` and ``benchmark``: only with ``--benchmarks``): ``FAILOVER_RUNS`` runs of
  ``FAILOVER_SECONDS`` each per setting, figures printed and written to ``$FAILOVER_REPORT``
  (see docs/durability.md for the commands and the figures).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster
from conftest import PortTaken, RedisServerProcess, free_port
from faults.checker import FinalTask, check, read_histories
from replication_support import Replicated, online_replicas, start_sentinel, wait_until

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.keys import Keys
from redis_agentstate.pool_models import Cursor, PoolConfig, StoredMessage
from redis_agentstate.pools import PoolStore

WORKER = Path(__file__).parent / "faults" / "chaos_worker.py"
SERVICE = "agentstate-failover"
SERVER_ARGS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
LEASE_MS = 1000
WAIT_TIMEOUT_MS = 500
#: How long the split-brain nemesis keeps the old primary cut off from Sentinels and replicas.
ISOLATE_S = 6.0
#: Sentinel's ``down-after-milliseconds``. Not 1000: Sentinel pings every
#: min(down-after, 1 s), and its fresh link to a just-promoted primary sends the first PING
#: 1 s after the switch, so with down-after 1000 that primary is reported down about 1 s after
#: its promotion whenever the PONG misses the next 100 ms tick. Two Sentinels agreeing on that
#: is a second, spurious failover of a healthy primary (seen once in ~25 runs; it lost 45
#: acknowledged commits with ``wait_replicas=1``: see docs/durability.md). 2000 leaves the PONG 1 s.
DOWN_AFTER_MS = 2000


@dataclass
class SentinelFleet:
    dir: Path
    ns: str
    wait_replicas: int
    servers: dict[int, RedisServerProcess]
    sentinel_ports: list[int] = field(default_factory=list)
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    failovers: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, base: Path, wait_replicas: int) -> SentinelFleet:
        setup = Replicated.start(2, *SERVER_ARGS)
        servers = {s.port: s for s in (setup.primary, *setup.replicas)}
        fleet = cls(base, f"failover-{uuid.uuid4().hex[:6]}", wait_replicas, servers)
        try:
            for i in range(3):
                folder = base / f"sentinel-{i}"
                folder.mkdir()
                port, proc = start_sentinel(
                    str(folder),
                    SERVICE,
                    setup.primary.port,
                    quorum=2,
                    down_after_ms=DOWN_AFTER_MS,
                    failover_timeout_ms=4000,
                    parallel_syncs=2,
                )
                fleet.sentinel_ports.append(port)
                fleet.sentinels.append(proc)
            for port in fleet.sentinel_ports:
                wait_until("the sentinels to know each other and both replicas", lambda p=port: fleet._sees(p))
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def ask(self, *command: Any, port: int | None = None) -> Any:
        with redis.Redis(port=port or self.sentinel_ports[0], socket_timeout=2) as s:
            return s.execute_command(*command)

    def _sees(self, port: int) -> bool:
        return (
            len(self.ask("SENTINEL", "SENTINELS", SERVICE, port=port)) == 2
            and len(self.ask("SENTINEL", "REPLICAS", SERVICE, port=port)) >= 2
        )

    def primary_port(self) -> int:
        return int(self.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])

    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.primary_port(), socket_timeout=10)

    def spawn(self, i: int) -> None:
        args = [
            sys.executable, str(WORKER), "--sentinels", ",".join(map(str, self.sentinel_ports)),
            "--service", SERVICE, "--namespace", self.ns, "--history", str(self.dir / f"history-{i}.jsonl"),
            "--worker", f"w{i}", "--lease-ms", str(LEASE_MS), "--seed", str(i),
            "--wait-replicas", str(self.wait_replicas), "--wait-timeout-ms", str(WAIT_TIMEOUT_MS),
        ]  # fmt: skip
        log = open(self.dir / f"worker-{i}.log", "ab")  # noqa: SIM115 - handed to the child
        self.workers.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def fail_over(self) -> dict[str, float]:
        """kill -9 the primary, wait for the promotion, bring the old primary back as a replica."""
        old = self.primary_port()
        killed_at = time.monotonic()
        self.servers[old].proc.send_signal(signal.SIGKILL)
        self.servers[old].proc.wait()
        wait_until("a promotion", lambda: self.primary_port() != old, timeout=30)
        new = self.primary_port()
        with redis.Redis(port=new, socket_timeout=2) as c:
            wait_until("the new primary", lambda: c.execute_command("ROLE")[0] == b"master", timeout=30)
        promoted_at = time.monotonic()
        self.servers[old].stop()
        self.servers[old] = RedisServerProcess.start(
            "--repl-diskless-sync-delay", "0", *SERVER_ARGS, "--replicaof", "127.0.0.1", str(new), port=old
        )
        wait_until("both replicas online again", lambda: online_replicas(new) == 2, timeout=30)
        event = {"killed_at": killed_at, "promotion_s": promoted_at - killed_at, "old": old, "new": new}
        self.failovers.append(event)
        return event

    def promotions(self) -> int:
        """How often the first Sentinel saw the primary change: the nemesis's strikes, unless Sentinel
        failed over on its own as well (a spurious failover, see ``DOWN_AFTER_MS``)."""
        log = self.dir / "sentinel-0" / "sentinel.log"
        return log.read_text(errors="replace").count("+switch-master") if log.exists() else 0

    def stop(self) -> None:
        for p in (*self.workers, *self.sentinels):
            if p.poll() is None:
                p.kill()
                p.wait()
        for s in self.servers.values():
            s.stop()


@dataclass
class SplitFleet(SentinelFleet):
    """The split-brain nemesis: the primary cut off from Sentinels and replicas, still serving clients.

    Each server sits behind two fault proxies: one the Sentinels and the replicas use (servers
    announce it with ``replica-announce-port``, so Sentinel names it), one the workers use (they
    remap the port Sentinel names to it, ``chaos_worker --remap``). ``fail_over`` blackholes the
    primary's first proxy for ``ISOLATE_S``: the Sentinels promote a replica, while workers still
    connected to the old primary keep writing there (it accepts writes until ``min-replicas-max-lag``
    after its replicas left). Healing lets the Sentinels turn it into a replica of the new primary,
    which discards what it took meanwhile.
    """

    inner: dict[int, Any] = field(default_factory=dict)  # announced port -> proxy for sentinels/replicas
    outer: dict[int, Any] = field(default_factory=dict)  # announced port -> proxy for clients

    @classmethod
    def start(cls, base: Path, wait_replicas: int) -> SplitFleet:
        from faults import FaultProxy

        ports = [free_port() for _ in range(3)]
        inner = {p: FaultProxy(p) for p in ports}
        announced = {p: inner[p].port for p in ports}
        fleet = cls(base, f"split-{uuid.uuid4().hex[:6]}", wait_replicas, {})
        fleet.inner = {announced[p]: inner[p] for p in ports}
        fleet.outer = {announced[p]: FaultProxy(p) for p in ports}
        try:
            common = ("--repl-diskless-sync-delay", "0", *SERVER_ARGS, "--replica-announce-ip", "127.0.0.1")
            primary = ports[0]
            for p in ports:
                role = () if p == primary else ("--replicaof", "127.0.0.1", str(announced[primary]))
                fleet.servers[p] = RedisServerProcess.start(
                    *common, "--replica-announce-port", str(announced[p]), *role, port=p
                )
            wait_until("2 replicas online", lambda: online_replicas(primary) == 2)
            for i in range(3):
                folder = base / f"sentinel-{i}"
                folder.mkdir()
                port, proc = start_sentinel(
                    str(folder),
                    SERVICE,
                    announced[primary],
                    quorum=2,
                    down_after_ms=DOWN_AFTER_MS,
                    failover_timeout_ms=4000,
                    parallel_syncs=2,
                )
                fleet.sentinel_ports.append(port)
                fleet.sentinels.append(proc)
            for port in fleet.sentinel_ports:
                wait_until("the sentinels to know each other and both replicas", lambda p=port: fleet._sees(p))
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def real_port(self, announced: int) -> int:
        return int(self.inner[announced].target[1])

    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.real_port(self.primary_port()), socket_timeout=10)

    def spawn(self, i: int) -> None:
        remap = ",".join(f"{a}:{proxy.port}" for a, proxy in self.outer.items())
        args = [
            sys.executable, str(WORKER), "--sentinels", ",".join(map(str, self.sentinel_ports)),
            "--service", SERVICE, "--namespace", self.ns, "--history", str(self.dir / f"history-{i}.jsonl"),
            "--worker", f"w{i}", "--lease-ms", str(LEASE_MS), "--seed", str(i), "--remap", remap,
            "--wait-replicas", str(self.wait_replicas), "--wait-timeout-ms", str(WAIT_TIMEOUT_MS),
        ]  # fmt: skip
        log = open(self.dir / f"worker-{i}.log", "ab")  # noqa: SIM115 - handed to the child
        self.workers.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def fail_over(self) -> dict[str, Any]:
        old = self.primary_port()
        killed_at = time.monotonic()
        self.inner[old].set_mode("blackhole")
        try:
            wait_until("a promotion", lambda: self.primary_port() != old, timeout=30)
            promoted_at = time.monotonic()
            time.sleep(max(0.0, ISOLATE_S - (promoted_at - killed_at)))
        finally:
            self.inner[old].set_mode("pass")
        new = self.primary_port()
        wait_until("the old primary back as a replica", lambda: online_replicas(self.real_port(new)) == 2, timeout=60)
        event = {"killed_at": killed_at, "promotion_s": promoted_at - killed_at, "old": old, "new": new}
        self.failovers.append(event)
        return event

    def stop(self) -> None:
        super().stop()
        for proxy in (*self.inner.values(), *self.outer.values()):
            proxy.stop()


@dataclass
class ClusterFleet:
    """3 primaries with a replica each; ``fail_over`` kills a primary and lets its replica take over."""

    dir: Path
    ns: str
    wait_replicas: int
    cluster: Any
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    failovers: list[dict[str, Any]] = field(default_factory=list)
    _victim: int = 0

    @classmethod
    def start(cls, base: Path, wait_replicas: int) -> ClusterFleet:
        from cluster_support import LocalCluster

        cluster = LocalCluster.start(3, replicas=1, extra=("--repl-diskless-sync-delay", "0", *SERVER_ARGS))
        fleet = cls(base, f"failover-{uuid.uuid4().hex[:6]}", wait_replicas, cluster)
        try:
            fleet.settle()
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def live(self) -> list[Any]:
        return [n for n in self.cluster.nodes if n.proc.poll() is None]

    def primaries(self) -> list[Any]:
        out = []
        for n in self.live():
            try:
                with n.client() as c:
                    if c.execute_command("ROLE")[0] == b"master":
                        out.append(n)
            except redis.RedisError:
                pass
        return out

    def settle(self) -> None:
        """Until 3 primaries each have their replica online and acknowledging a write."""
        wait_until("3 primaries", lambda: len(self.primaries()) == 3, timeout=30)
        for node in self.primaries():
            wait_until(f"the replica of {node.port}", lambda node=node: online_replicas(node.port) == 1, timeout=30)

    def admin(self) -> Any:
        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.live()[0].port, socket_timeout=10)

    def spawn(self, i: int) -> None:
        node = self.live()[i % len(self.live())]
        args = [
            sys.executable, str(WORKER), "--cluster-port", str(node.port),
            "--namespace", self.ns, "--history", str(self.dir / f"history-{i}.jsonl"),
            "--worker", f"w{i}", "--lease-ms", str(LEASE_MS), "--seed", str(i),
            "--wait-replicas", str(self.wait_replicas), "--wait-timeout-ms", str(WAIT_TIMEOUT_MS),
        ]  # fmt: skip
        log = open(self.dir / f"worker-{i}.log", "ab")  # noqa: SIM115 - handed to the child
        self.workers.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def _owner_of(self, slot: int, via: Any) -> int:
        with via.client() as c:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(primary[1])
        return -1

    def fail_over(self) -> dict[str, float]:
        primaries = sorted(self.primaries(), key=lambda n: n.port)
        victim = primaries[self._victim % len(primaries)]
        self._victim += 1
        with victim.client() as c:
            ranges = [
                (int(e[0]), int(e[1])) for e in c.execute_command("CLUSTER", "SLOTS") if int(e[2][1]) == victim.port
            ]
        slot = ranges[0][0]
        witness = next(n for n in primaries if n is not victim)
        killed_at = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        wait_until(
            "the replica's promotion", lambda: self._owner_of(slot, witness) not in (victim.port, -1), timeout=30
        )
        new = self._owner_of(slot, witness)
        promoted_at = time.monotonic()
        victim.restart()  # its nodes.conf makes it rejoin; the cluster makes it a replica of `new`
        wait_until("the old primary back as a replica", lambda: online_replicas(new) == 1, timeout=30)
        event = {"killed_at": killed_at, "promotion_s": promoted_at - killed_at, "old": victim.port, "new": new,
                 "ranges": ranges}  # fmt: skip
        self.failovers.append(event)
        return event

    def stop(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.cluster.stop()


def _free_port_on(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _online_on(host: str, port: int) -> int:
    """How many replicas the server at ``host``:``port`` sees in state ``online``."""
    with redis.Redis(host=host, port=port, socket_timeout=2) as c:
        info = c.info("replication")
    return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v["state"] == "online")


@dataclass
class SplitNode:
    """One cluster node on its own loopback address, and the three proxies in front of it."""

    ip: str
    port: int
    bus_port: int
    dir: str
    proc: subprocess.Popen[bytes]
    inner: Any  # client port, as announced to the cluster: replication goes through it
    inner_bus: Any  # bus port, as announced: every other node's bus links to this node
    outer: Any  # client port for the workers (address_remap from ``inner``)

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.ip, port=self.port, socket_timeout=5)

    @property
    def announced(self) -> int:
        return int(self.inner.port)


@dataclass
class ClusterSplitFleet:
    """Split brain on a Redis Cluster: a primary cut off from the other nodes and its replica, still serving clients.

    3 primaries with a replica each. Every node has its own loopback address (``--bind`` and
    ``--bind-source-addr``: the connections it opens carry that source address) and sits behind
    an inner proxy for its client port and one for its bus port, which it announces
    (``cluster-announce-ip/port/bus-port``): every bus link and every replication link runs
    through a proxy, and a proxy can tell which node opened a connection by its source address.
    Workers reach the nodes through outer proxies (``RedisCluster(address_remap=...)``).

    ``fail_over`` isolates a primary for ``ISOLATE_S``: its own inner proxies blackhole everything
    (the others' bus links to it, its replica's replication link), and every other node's inner
    bus proxy blackholes what comes from its address (its own bus links out). Redis 7 counts data
    received on either link of a pair before it flags a node PFAIL, so cutting one direction is not
    enough. The others flag it FAIL and elect its replica; workers connected to it keep writing
    there until it finds itself in the minority (CLUSTERDOWN after ``cluster-node-timeout``) or
    ``min-replicas-max-lag`` runs out. Healing resets the blackholed links; the old primary sees the
    newer config epoch of its slots and turns into a replica of the promoted one, dropping what it took.
    """

    dir: Path
    ns: str
    wait_replicas: int
    nodes: list[SplitNode] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    failovers: list[dict[str, Any]] = field(default_factory=list)
    _victim: int = 0

    @classmethod
    def start(cls, base: Path, wait_replicas: int) -> ClusterSplitFleet:
        from faults import FaultProxy

        server = shutil.which("redis-server")
        if server is None:
            raise FileNotFoundError("redis-server not on PATH")
        fleet = cls(base, f"csplit-{uuid.uuid4().hex[:6]}", wait_replicas)
        # A random 127.x.y.0/24 of our own: no clash with another run's addresses (all of 127/8 is local).
        prefix = f"127.{random.randint(2, 254)}.{random.randint(0, 254)}"
        try:
            for i in range(6):
                ip = f"{prefix}.{11 + i}"
                port, bus = _free_port_on(ip), _free_port_on(ip)
                inner, inner_bus, outer = FaultProxy(port, ip), FaultProxy(bus, ip), FaultProxy(port, ip)
                d = tempfile.mkdtemp(prefix="agentstate-csplit-", dir=base)
                args = [
                    server, "--port", str(port), "--bind", ip, "--bind-source-addr", ip, "--dir", d,
                    "--cluster-enabled", "yes", "--cluster-port", str(bus), "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000", "--cluster-announce-ip", "127.0.0.1",
                    "--cluster-announce-port", str(inner.port), "--cluster-announce-bus-port", str(inner_bus.port),
                    "--save", "", "--appendonly", "no", "--logfile", os.path.join(d, "redis.log"),
                    "--repl-diskless-sync-delay", "0", *SERVER_ARGS,
                ]  # fmt: skip
                proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                fleet.nodes.append(SplitNode(ip, port, bus, d, proc, inner, inner_bus, outer))
            fleet._form()
            fleet.settle()
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def _form(self) -> None:
        """What ``redis-cli --cluster create`` does, but meeting at the announced (proxied) addresses."""
        for n in self.nodes:
            wait_until(f"node {n.ip}:{n.port}", lambda n=n: n.client().ping())
        primaries, replicas = self.nodes[:3], self.nodes[3:]
        bounds = [(0, 5460), (5461, 10922), (10923, 16383)]
        for epoch, n in enumerate(self.nodes, start=1):
            with n.client() as c:
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for n, (lo, hi) in zip(primaries, bounds, strict=True):
            with n.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        first = self.nodes[0]
        for n in self.nodes[1:]:
            with n.client() as c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", first.inner.port, first.inner_bus.port)

        def all_known() -> bool:
            for n in self.nodes:
                with n.client() as c:
                    lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
                if len(lines) != 6 or any("handshake" in line or "noaddr" in line for line in lines):
                    return False
            return True

        wait_until("6 nodes that know each other", all_known, timeout=30)
        for r, p in zip(replicas, primaries, strict=True):
            with p.client() as c:
                primary_id = c.execute_command("CLUSTER", "MYID").decode()
            with r.client() as c:
                c.execute_command("CLUSTER", "REPLICATE", primary_id)

    def node(self, announced: int) -> SplitNode:
        return next(n for n in self.nodes if n.announced == announced)

    def primaries(self) -> list[SplitNode]:
        out = []
        for n in self.nodes:
            try:
                with n.client() as c:
                    if c.execute_command("ROLE")[0] == b"master":
                        out.append(n)
            except redis.RedisError:
                pass
        return out

    def settle(self) -> None:
        """Until every node says ``cluster_state:ok`` and 3 primaries each have their replica online."""

        def ok() -> bool:
            for n in self.nodes:
                with n.client() as c:
                    if b"cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                        return False
            primaries = self.primaries()
            return len(primaries) == 3 and all(_online_on(p.ip, p.port) == 1 for p in primaries)

        wait_until("cluster_state ok, 3 primaries with a replica each", ok, timeout=60)

    def _direct(self, addr: tuple[str, int]) -> tuple[str, int]:
        n = next((n for n in self.nodes if n.announced == int(addr[1])), None)
        return (n.ip, n.port) if n is not None else addr

    def admin(self) -> Any:
        first = self.nodes[0]
        return redis.cluster.RedisCluster(host=first.ip, port=first.port, socket_timeout=10, address_remap=self._direct)

    def spawn(self, i: int) -> None:
        remap = ",".join(f"{n.announced}:{n.outer.port}" for n in self.nodes)
        args = [
            sys.executable, str(WORKER), "--cluster-port", str(self.nodes[i % 3].outer.port), "--remap", remap,
            "--namespace", self.ns, "--history", str(self.dir / f"history-{i}.jsonl"),
            "--worker", f"w{i}", "--lease-ms", str(LEASE_MS), "--seed", str(i),
            "--wait-replicas", str(self.wait_replicas), "--wait-timeout-ms", str(WAIT_TIMEOUT_MS),
        ]  # fmt: skip
        log = open(self.dir / f"worker-{i}.log", "ab")  # noqa: SIM115 - handed to the child
        self.workers.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def _owner_of(self, slot: int, via: SplitNode) -> int:
        """The announced port of ``slot``'s primary, as ``via`` sees it."""
        with via.client() as c:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(primary[1])
        return -1

    def _cut(self, victim: SplitNode, cut: bool) -> None:
        for proxy in (victim.inner, victim.inner_bus):
            proxy.set_mode("blackhole" if cut else "pass")
        for n in self.nodes:
            if n is not victim:
                if cut:
                    n.inner_bus.isolate_source(victim.ip)
                else:
                    n.inner_bus.heal_source(victim.ip)

    def fail_over(self) -> dict[str, Any]:
        primaries = sorted(self.primaries(), key=lambda n: n.ip)
        victim = primaries[self._victim % len(primaries)]
        self._victim += 1
        with victim.client() as c:
            ranges = [
                (int(e[0]), int(e[1]))
                for e in c.execute_command("CLUSTER", "SLOTS")
                if int(e[2][1]) == victim.announced
            ]
        slot = ranges[0][0]
        witness = next(n for n in primaries if n is not victim)
        killed_at = time.monotonic()
        self._cut(victim, True)
        try:
            wait_until(
                "the replica's promotion",
                lambda: self._owner_of(slot, witness) not in (victim.announced, -1),
                timeout=30,
            )
            promoted_at = time.monotonic()
            time.sleep(max(0.0, ISOLATE_S - (promoted_at - killed_at)))
        finally:
            self._cut(victim, False)
        new = self.node(self._owner_of(slot, witness))

        def rejoined() -> bool:
            with victim.client() as c:
                role = c.execute_command("ROLE")
            return role[0] == b"slave" and int(role[2]) == new.announced and _online_on(new.ip, new.port) == 1

        wait_until("the old primary back as a replica", rejoined, timeout=60)
        self.settle()
        event = {"killed_at": killed_at, "promotion_s": promoted_at - killed_at, "old": victim.announced,
                 "new": new.announced, "ranges": ranges}  # fmt: skip
        self.failovers.append(event)
        return event

    def stop(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.kill()
                p.wait()
        for n in self.nodes:
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
            for proxy in (n.inner, n.inner_bus, n.outer):
                proxy.stop()
            shutil.rmtree(n.dir, ignore_errors=True)


def _final_state(client: Any, ns: str, tids: list[str]) -> tuple[dict[str, FinalTask], list[str]]:
    store = CheckpointStore(client, namespace=ns)
    final = {}
    for tid in tids:
        cp = store.load(tid)
        if cp is None:  # the task's creation itself was lost: every commit of it then counts as lost
            final[tid] = FinalTask(tid, 0, 0, [], False)
            continue
        final[tid] = FinalTask(tid, cp.cycle_index, cp.revision, cp.messages, cp.terminal_result is not None)
    records = PoolStore(client, namespace=ns).watch("chaos-pool", Cursor(0))
    keys = [r.payload.message.idempotency_key for r in records if isinstance(r.payload, StoredMessage)]
    return final, keys


def classify(violations: list[str]) -> dict[str, int]:
    """The checker's violations, by what they mean after a failover.

    ``lost_acknowledged``: a commit that returned True is not in the final state;
    ``lost_pool_messages``: the same for an acknowledged pool message; ``lost_claims``: a
    granted claim's revision is above the task's final one (the claim was rolled back);
    ``applied_twice``: a cycle committed, or a pool message recorded, more than once;
    ``stale_won``: two claims granted the same revision, a later claim granted a lower one,
    or a commit reported fenced out is present.
    """
    out = dict.fromkeys(
        ("lost_acknowledged", "lost_pool_messages", "lost_claims", "applied_twice", "stale_won", "other"), 0
    )
    for v in violations:
        if "acknowledged commit" in v and "missing" in v:
            out["lost_acknowledged"] += 1
        elif "acknowledged pool message" in v and "missing" in v:
            out["lost_pool_messages"] += 1
        elif "a claim saw revision" in v:
            out["lost_claims"] += 1
        elif "more than once" in v or "times" in v:
            out["applied_twice"] += 1
        elif "granted to more than one claim" in v or "finished before" in v or "rejected commit" in v:
            out["stale_won"] += 1
        else:
            out["other"] += 1
    return out


def failover_gaps(history: list[dict[str, Any]], failovers: list[dict[str, Any]], ns: str) -> list[float]:
    """Per failover: first acknowledged commit after the kill minus the last one before it (s).

    On a cluster only the commits of tasks in the killed primary's slots (``ranges``) count:
    the other primaries' tasks go on meanwhile.
    """
    keys = Keys(ns)
    gaps = []
    for f in failovers:
        ranges = f.get("ranges")

        def owned(tid: str, ranges: Any = ranges) -> bool:
            slot = redis.cluster.key_slot(keys.task(tid).checkpoint.encode())
            return ranges is None or any(lo <= slot <= hi for lo, hi in ranges)

        oks = sorted(e["t"] for e in history if e.get("op") == "commit" and e.get("type") == "ok" and owned(e["task"]))
        before = [t for t in oks if t <= f["killed_at"]]
        after = [t for t in oks if t > f["killed_at"]]
        if before and after:
            gaps.append(round(after[0] - before[-1], 2))
    return gaps


def run_once(
    wait_replicas: int,
    seconds: float,
    every_s: float,
    workers: int = 4,
    setup: str = "sentinel",
    settle_s: float = 0.0,
) -> dict[str, Any]:
    """One run: the figures of ``classify`` and ``failover_gaps``, and the checker's own.

    ``settle_s``: after the window, keep the workers running up to this long until a commit
    is acknowledged after the last failover (a split with ``wait_replicas=1`` stalls writes
    about 16 s, until the old primary rejoins: see docs/durability.md).
    """
    kinds = {"sentinel": SentinelFleet, "split": SplitFleet, "cluster": ClusterFleet,
             "cluster-split": ClusterSplitFleet}  # fmt: skip
    # A fleet picks its ports before it starts its servers (it announces them to proxies and
    # Sentinels), so a port another xdist worker bound meanwhile means a whole new fleet.
    for attempt in range(3):
        base = Path(tempfile.mkdtemp(prefix="agentstate-failover-"))
        try:
            fleet: Any = kinds[setup].start(base, wait_replicas)
            break
        except PortTaken:
            shutil.rmtree(base, ignore_errors=True)
            if attempt == 2:
                raise
    ok = False
    try:
        with fleet.admin() as admin:
            store = CheckpointStore(admin, namespace=fleet.ns)
            tids = [f"long-{i:02d}" for i in range(24)] + [f"short-{i:02d}" for i in range(8)]
            for tid in tids:
                assert store.create(Checkpoint(tid))
            PoolStore(admin, namespace=fleet.ns).open("chaos-pool", PoolConfig())
        time.sleep(0.5)  # replicated (loopback) before the first kill
        for i in range(workers):
            fleet.spawn(i)
        t0 = time.monotonic()
        next_at = t0 + every_s
        while time.monotonic() < t0 + seconds:
            if time.monotonic() >= next_at:
                fleet.fail_over()
                next_at = time.monotonic() + every_s
            time.sleep(0.05)
        settle_until = time.monotonic() + settle_s
        while fleet.failovers and time.monotonic() < settle_until:
            seen = read_histories(sorted(base.glob("history-*.jsonl")))
            if len(failover_gaps(seen, fleet.failovers[-1:], fleet.ns)) == 1:
                break
            time.sleep(0.2)
        for p in fleet.workers:
            p.send_signal(signal.SIGTERM)
        for p in fleet.workers:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        elapsed = time.monotonic() - t0
        with fleet.admin() as admin:
            final, pool_keys = _final_state(admin, fleet.ns, tids)
        history = read_histories(sorted(base.glob("history-*.jsonl")))
        report = check(history, final, pool_keys)
        figures: dict[str, Any] = {
            "setup": setup,
            "wait_replicas": wait_replicas,
            "seconds": round(elapsed, 1),
            "failovers": len(fleet.failovers),
            **({"promotions": fleet.promotions()} if hasattr(fleet, "promotions") else {}),
            "promotion_s": [round(f["promotion_s"], 2) for f in fleet.failovers],
            "gap_s": failover_gaps(history, fleet.failovers, fleet.ns),
            **classify(report.violations),
            "acknowledged_commits": report.figures()["acknowledged_commits"],
            "unknown_commits": report.figures()["unknown_commits"],
            "not_replicated_errors": sum(1 for e in history if e.get("error") == "WriteNotReplicated"),
            "violation_kinds": dict(Counter(re.sub(r"[0-9a-f]{12}|\d+|'[^']*'", "#", v) for v in report.violations)),
        }
        # AGENTSTATE_KEEP_FAILOVER=1 keeps every run's folder (servers' logs, histories) to read.
        ok = not os.environ.get("AGENTSTATE_KEEP_FAILOVER")
        return figures
    finally:
        fleet.stop()
        if ok:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"failover run kept for inspection in {base}")


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (setup, wait_replicas) over the runs: sums of the counts, medians of the times."""
    rows = []
    for key in sorted({(r["setup"], r["wait_replicas"]) for r in results}):
        runs = [r for r in results if (r["setup"], r["wait_replicas"]) == key]
        promotions = sorted(x for r in runs for x in r["promotion_s"])
        gaps = sorted(x for r in runs for x in r["gap_s"])
        row: dict[str, Any] = {"setup": key[0], "wait_replicas": key[1], "runs": len(runs)}
        for name in ("failovers", "acknowledged_commits", "lost_acknowledged", "lost_pool_messages", "lost_claims",
                     "applied_twice", "stale_won", "other", "not_replicated_errors", "unknown_commits"):  # fmt: skip
            row[name] = sum(r[name] for r in runs)
        row["min_failovers_per_run"] = min(r["failovers"] for r in runs)
        row["runs_with_loss"] = sum(1 for r in runs if r["lost_acknowledged"] or r["applied_twice"])
        row["promotion_s_median"] = promotions[len(promotions) // 2] if promotions else None
        row["gap_s_median"] = gaps[len(gaps) // 2] if gaps else None
        row["gap_s_max"] = gaps[-1] if gaps else None
        rows.append(row)
    return rows


def _need_redis() -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but redis-server is not on PATH")
        pytest.skip("redis-server not on PATH")


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("wait_replicas", [0, 1])
@pytest.mark.parametrize(
    "setup",
    [
        "sentinel",
        "split",
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("cluster-split", marks=pytest.mark.cluster),
    ],
)
def test_failover_bounded(setup: str, wait_replicas: int) -> None:
    _need_redis()
    figures = run_once(wait_replicas, seconds=14.0, every_s=5.0, setup=setup, settle_s=30.0)
    print("\nFAILOVER REPORT " + json.dumps(figures, sort_keys=True))
    assert figures["failovers"] >= 1 and figures["gap_s"], figures  # a failover happened, work went on after
    assert figures["acknowledged_commits"] > 20, figures
    assert figures["other"] == 0, figures
    if wait_replicas:
        assert figures["lost_acknowledged"] == 0 and figures["applied_twice"] == 0, figures


@pytest.mark.benchmark  # a measurement of many minutes: opt-in with --benchmarks, as the benchmarks are
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.real
@pytest.mark.parametrize(
    "setup",
    [
        "sentinel",
        "split",
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("cluster-split", marks=pytest.mark.cluster),
    ],
)
def test_failover_long(setup: str) -> None:
    _need_redis()
    runs = int(os.environ.get("FAILOVER_RUNS", "10"))
    seconds = float(os.environ.get("FAILOVER_SECONDS", "60"))
    every = float(os.environ.get("FAILOVER_EVERY_S", "15"))
    results = []
    for _ in range(runs):
        for w in (0, 1):
            results.append(run_once(w, seconds, every, setup=setup))
            if os.environ.get("FAILOVER_REPORT"):  # after every run: a long series interrupted keeps its figures
                Path(os.environ["FAILOVER_REPORT"]).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print("\nFAILOVER REPORT " + json.dumps(results, indent=1, sort_keys=True))
    print("FAILOVER SUMMARY " + json.dumps(summarise(results), indent=1))
    for r in results:
        assert r["failovers"] >= 1 and r["other"] == 0, r
