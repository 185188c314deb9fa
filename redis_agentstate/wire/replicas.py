"""Replica acknowledgement (``wait_replicas``): the waits that follow a write, and what they must answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis.exceptions as rex

from ..clients import AsyncClient, SyncClient, is_cluster
from ..core.replies import lenient_text
from ..errors import InvalidArgument, ReplicationUnsafe, WriteNotReplicated
from ..keys import describe_key
from . import scripts
from .client_checks import effective_socket_timeout
from .failures import _OWNER_LABELS
from .requests import Batch, Call, Request

__all__ = ["DEFAULT_WAIT_TIMEOUT_MS", "ReplicaAck"]

# ---- replica acknowledgement (wait_replicas) -----------------------------------
#
# A write of a store with ``wait_replicas=n`` goes out as one pipeline: its
# EVALSHA(s), then ``WAIT n timeout`` (and ``WAITAOF 1 0 timeout`` where the
# server has it and the primary's AOF is on) on the same connection, so WAIT
# waits for exactly the replication offset the write reached. On Redis Cluster
# a keyless WAIT would go to a random node: each is sent with ``target_nodes``
# set to the primary owning the write's slot, and redis-py's cluster pipeline
# runs a node's commands in order on one connection. Which requests are writes
# is ``scripts.WRITES``; the rest is sent as before.

#: Default ``wait_timeout_ms``. Replicas on a healthy network acknowledge within a
#: few ms; 1 s absorbs a replica's fork or a GC-like stall without failing the write.
#: WAITAOF does not wait for the next ``everysec`` tick (measured well under 1 ms on
#: Valkey 8.1, see docs/durability.md). Worst case a write
#: blocks 2 s (WAIT, then WAITAOF), inside redis-py's default 5 s read timeout, so the
#: client never gives up on the reply (and re-sends the write) before WAIT answers.
DEFAULT_WAIT_TIMEOUT_MS = 1000

#: The first server version with WAITAOF (Valkey 8 reports redis_version 7.2.4).
_WAITAOF_SINCE = (7, 2)


def _version(text: Any) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in lenient_text(text).split(".")[:2])
    except ValueError:
        return (0,)


class ReplicaAck:
    """A store's ``wait_replicas``/``wait_timeout_ms``, and what its first write learnt of the server.

    The checks are pure (``learn``, ``verify``); the drivers only fetch ``INFO`` and send.
    """

    def __init__(self, client: object, replicas: int, timeout_ms: int) -> None:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InvalidArgument(f"ReplicaAck needs wait_replicas >= 1, got {replicas!r}")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 1:
            # WAIT's timeout 0 blocks forever: never what a worker holding a lease wants.
            raise InvalidArgument(f"wait_timeout_ms must be an int >= 1, got {timeout_ms!r}")
        if type(client).__module__.startswith("fakeredis"):
            raise ReplicationUnsafe(
                f"wait_replicas={replicas} needs a Redis server with replicas; fakeredis has no WAIT or replication"
            )
        socket_timeout = effective_socket_timeout(client)
        if socket_timeout is not None and 2 * timeout_ms >= socket_timeout * 1000:
            raise InvalidArgument(
                f"wait_timeout_ms={timeout_ms} needs the client's socket_timeout above {2 * timeout_ms / 1000:g} s "
                f"(it is {socket_timeout:g} s): a write waits up to twice wait_timeout_ms (WAIT, then WAITAOF), "
                f"and a read timeout first would re-send the write"
            )
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.checked = False
        #: Also ``WAITAOF 1 0``: the server has it and every primary has its AOF on.
        self.aof = False

    def learn(self, infos: dict[str, dict[str, Any]]) -> None:
        """Check the setup from each primary's ``INFO server replication persistence`` (node name -> dict).

        Raises ``ReplicationUnsafe`` (nothing written yet) when a primary could never give
        ``replicas`` acknowledgements: every write would time out.
        """
        if not infos:
            raise ReplicationUnsafe(f"wait_replicas={self.replicas}: the client knows no primary to check")
        aof = True
        for node, info in infos.items():
            role = lenient_text(info.get("role", "?"))
            if role != "master":
                raise ReplicationUnsafe(
                    f"wait_replicas={self.replicas}: {node} is a {role}, not a primary; nothing was written"
                )
            online = sum(
                1
                for name, value in info.items()
                if lenient_text(name).startswith("slave")
                and isinstance(value, dict)
                and lenient_text(value.get("state")) == "online"
            )
            if online < self.replicas:
                raise ReplicationUnsafe(
                    f"wait_replicas={self.replicas}, but {node} has {online} replica(s) online "
                    f"(connected_slaves={info.get('connected_slaves', 0)}): every write would time out waiting "
                    f"for them; nothing was written. Add replicas or lower wait_replicas."
                )
            aof = aof and _version(info.get("redis_version", "0")) >= _WAITAOF_SINCE and info.get("aof_enabled") == 1
        self.aof = aof
        self.checked = True

    def waits(self) -> list[tuple[Any, ...]]:
        """The commands that follow a write on its node."""
        waits: list[tuple[Any, ...]] = [("WAIT", self.replicas, self.timeout_ms)]
        if self.aof:
            waits.append(("WAITAOF", 1, 0, self.timeout_ms))
        return waits

    def routes(self, client: object, calls: Sequence[Call]) -> tuple[list[Any], list[str | None]]:
        """Where the waits go, and each call's node at send time.

        One node: ``[None]``. A cluster: each primary owning a call's slot (one WAIT per node).
        """
        if not is_cluster(client):
            return [None], [None] * len(calls)
        nodes: dict[str, Any] = {}
        owners: list[str | None] = []
        for call in calls:
            node = cast(Any, client).get_node_from_key(call.keys[0])
            nodes.setdefault(node.name, node)
            owners.append(node.name)
        return list(nodes.values()), owners

    def entries(self, routes: list[Any]) -> list[tuple[Sequence[Any], dict[str, Any]]]:
        """The waits that follow a write's EVALSHAs in its pipeline, each with its pipeline options."""
        out: list[tuple[Sequence[Any], dict[str, Any]]] = []
        for node in routes:
            options = {} if node is None else {"target_nodes": node}
            out.extend((wait, options) for wait in self.waits())
        return out

    def verify(
        self, client: object, calls: Sequence[Call], routes: list[Any], owners: list[str | None], replies: list[Any]
    ) -> None:
        """Raise ``WriteNotReplicated`` unless every node acknowledged (``replies``: the waits' replies, in order)."""
        per_node = len(self.waits())
        acknowledged = self.replicas
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        for i in range(len(routes)):
            got = replies[i * per_node : (i + 1) * per_node]
            count = got[0] if isinstance(got[0], int) and not isinstance(got[0], bool) else 0
            if per_node == 2 and not (isinstance(got[1], list) and got[1] and got[1][0] == 1):
                count = 0  # WAITAOF's [local, replicas]: the primary did not fsync in time
            acknowledged = min(acknowledged, count)
        if is_cluster(client):
            for call, owner in zip(calls, owners, strict=True):
                if cast(Any, client).get_node_from_key(call.keys[0]).name != owner:
                    # A redirect (MOVED/ASK) re-sent this write to another node, without its WAIT.
                    acknowledged = 0
        if acknowledged >= self.replicas:
            return
        key = lenient_text(calls[0].keys[0]) if calls and calls[0].keys else None
        kind, ident = describe_key(key)[1:] if key is not None else (None, None)
        what = f"{_OWNER_LABELS[kind]} {ident!r}" if kind is not None and ident is not None else "a write"
        raise WriteNotReplicated(
            f"{what}: {acknowledged} of {self.replicas} replica(s) acknowledged within {self.timeout_ms} ms"
            f"{' (or the AOF fsync did not)' if self.aof else ''}"
            f"{f' (WAIT failed: {failed})' if failed is not None else ''}; the write may still have applied: "
            f"re-send it to learn its outcome",
            acknowledged=acknowledged,
            required=self.replicas,
            task_id=ident if kind == "task" else None,
            key=key,
        )


#: The INFO sections ``ReplicaAck.learn`` reads.
_INFO = ("INFO", "server", "replication", "persistence")


def _info_targets(client: object) -> list[Any]:
    return list(cast(Any, client).get_primaries()) if is_cluster(client) else [None]


def _learn_sync(client: SyncClient, ack: ReplicaAck) -> None:
    infos: dict[str, dict[str, Any]] = {}
    try:
        for node in _info_targets(client):
            options = {} if node is None else {"target_nodes": node}
            infos["the primary" if node is None else f"primary {node.name}"] = cast(Any, client).execute_command(
                *_INFO, **options
            )
    except rex.ResponseError as exc:
        raise ReplicationUnsafe(
            f"wait_replicas={ack.replicas}: could not read the server's replication state ({exc}); "
            f"the client needs the INFO command; nothing was written"
        ) from exc
    ack.learn(infos)


async def _learn_async(client: AsyncClient, ack: ReplicaAck) -> None:
    infos: dict[str, dict[str, Any]] = {}
    if is_cluster(client):
        # An asyncio RedisCluster learns its nodes on first use; the routing of WAITs needs them now.
        await cast(Any, client).initialize()
    try:
        for node in _info_targets(client):
            options = {} if node is None else {"target_nodes": node}
            infos["the primary" if node is None else f"primary {node.name}"] = await cast(Any, client).execute_command(
                *_INFO, **options
            )
    except rex.ResponseError as exc:
        raise ReplicationUnsafe(
            f"wait_replicas={ack.replicas}: could not read the server's replication state ({exc}); "
            f"the client needs the INFO command; nothing was written"
        ) from exc
    ack.learn(infos)


def _write_calls(req: Request) -> list[Call] | None:
    """The script calls of ``req`` if it is a write (``scripts.WRITES``), else None."""
    if isinstance(req, Call):
        return [req] if req.script in scripts.WRITES else None
    if isinstance(req, Batch) and any(call.script in scripts.WRITES for call in req.calls):
        return list(req.calls)
    return None
