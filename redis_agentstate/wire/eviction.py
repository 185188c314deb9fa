"""Whether the server's ``maxmemory-policy`` can evict this library's keys, and the warning it gets.

Eviction is not expiry: under memory pressure a server with an ``allkeys-*``
policy deletes *any* key, a checkpoint hash included, and with it the task's
lease and its fencing revision. A task evicted while a worker holds its cycle
can be created again and claimed by a second worker whose commit the first
one's can no longer be fenced against: the safety this library exists for is
gone. ``volatile-*`` policies evict only keys that carry a TTL: here the
tombstones (a re-sent write after them reports False instead of True), tasks
kept by ``terminal_ttl_ms``, key/value entries set with ``ttl_ms`` and LangGraph
data given a TTL go early; leases and fences carry no TTL and stay safe.
``noeviction`` (writes fail with OOM when memory is full, loudly) is the only
policy under which nothing this library wrote disappears.

The stores check once, after their first operation that succeeds (``wire.shells.StoreShell``;
after, so that a call to a server that does not answer keeps its retry bound), and log
the warning once per server and policy per process; ``agentstate stats``
prints it. The policy is read from ``INFO memory``, not ``CONFIG GET``: INFO is
in the least-privilege ACL already (``wait_replicas`` reads it), while granting
``config|get`` would also hand out ``requirepass`` and ``masterauth``. INFO may
still be refused or say nothing (an ACL without it, a managed Redis that hides
the field, fakeredis): then nothing is known and nothing is said, at debug
level only. On a Cluster every primary is asked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, cast

from ..clients import is_cluster

__all__ = ["check_async", "check_sync", "policies_async", "policies_sync", "reported", "risk", "warning_text"]

logger = logging.getLogger("redis_agentstate")

_lock = threading.Lock()
#: (server, policy) pairs warned about in this process: many stores on one server warn once.
_warned: set[tuple[str, str]] = set()


def risk(policy: str) -> str | None:
    """``"all"`` when ``policy`` may evict any key, ``"volatile"`` keys with a TTL, None when none."""
    if policy.startswith("allkeys-"):
        return "all"
    if policy.startswith("volatile-"):
        return "volatile"
    return None


def warning_text(policy: str, where: str = "the server") -> str | None:
    """The warning for ``policy`` on ``where`` (one line), or None when it evicts nothing of ours."""
    kind = risk(policy)
    if kind == "all":
        return (
            f"maxmemory-policy {policy} on {where} lets Redis evict any key when memory is full, a task's "
            f"checkpoint included: its lease and fencing revision go with it, so two workers can hold one "
            f"cycle and committed state is lost. Set maxmemory-policy noeviction (and size maxmemory)."
        )
    if kind == "volatile":
        return (
            f"maxmemory-policy {policy} on {where} lets Redis evict keys that carry a TTL before they expire: "
            f"tombstones (a re-sent write then reports False), terminal tasks kept by terminal_ttl_ms, "
            f"key/value entries with ttl_ms. Leases and fences carry no TTL. Prefer noeviction."
        )
    return None


def _policy_of(reply: Any) -> str | None:
    """``maxmemory_policy`` from ``INFO memory`` as redis-py parses it (a dict) or raw (text)."""
    if isinstance(reply, Mapping):
        value = reply.get("maxmemory_policy")
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)
    if isinstance(reply, (bytes, str)):
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
        for line in text.splitlines():
            if line.startswith("maxmemory_policy:"):
                return line.partition(":")[2].strip()
    return None


def _server_name(client: Any) -> str:
    try:
        kw = client.connection_pool.connection_kwargs
        if kw.get("path"):
            return str(kw["path"])
        return f"{kw.get('host', '?')}:{kw.get('port', '?')}"
    except AttributeError:
        return f"client {id(client):x}"


def _targets(client: Any) -> list[tuple[str, Any]]:
    """``(name, node or None)`` of each server to ask: every primary of a Cluster, else the one server."""
    if is_cluster(client):
        return [(f"primary {node.name}", node) for node in client.get_primaries()]
    return [(_server_name(client), None)]


def policies_sync(client: Any) -> dict[str, str] | None:
    """``{server: maxmemory-policy}`` of each primary, or None when INFO is refused or does not say."""
    out: dict[str, str] = {}
    try:
        for name, node in _targets(client):
            options = {} if node is None else {"target_nodes": node}
            policy = _policy_of(client.execute_command("INFO", "memory", **options))
            if policy is None:
                return None
            out[name] = policy
    except Exception as exc:  # refused (ACL, managed Redis) or unreachable: nothing is known
        logger.debug("could not read maxmemory-policy: %s", exc)
        return None
    return out


async def policies_async(client: Any) -> dict[str, str] | None:
    """The asyncio twin of :func:`policies_sync`."""
    out: dict[str, str] = {}
    try:
        if is_cluster(client):
            await cast(Any, client).initialize()
        for name, node in _targets(client):
            options = {} if node is None else {"target_nodes": node}
            policy = _policy_of(await client.execute_command("INFO", "memory", **options))
            if policy is None:
                return None
            out[name] = policy
    except Exception as exc:
        logger.debug("could not read maxmemory-policy: %s", exc)
        return None
    return out


def reported(policies: dict[str, str] | None) -> None:
    """Count these policies as warned about: the caller showed the warning itself (``agentstate stats``)."""
    with _lock:
        _warned.update((policies or {}).items())


def _log_once(policies: dict[str, str] | None) -> None:
    for where, policy in (policies or {}).items():
        text = warning_text(policy, where)
        if text is None:
            continue
        with _lock:
            if (where, policy) in _warned:
                continue
            _warned.add((where, policy))
        logger.warning("%s", text)


def check_sync(client: Any) -> None:
    """Log the eviction warning for ``client``'s server(s), once per server and policy per process."""
    _log_once(policies_sync(client))


async def check_async(client: Any) -> None:
    """The asyncio twin of :func:`check_sync`."""
    _log_once(await policies_async(client))
