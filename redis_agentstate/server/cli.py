"""``agentstate serve --graph NAME=MODULE:ATTR [...]``: the app of ``create_app`` under uvicorn.

Imported only when the command runs. Without ``--token`` the server binds loopback only (a
non-loopback ``--host`` is refused) and is read-only; with one, every route but ``/ok`` needs it.
The token and the Redis URL's password are never printed. The port is bound before the start line
is printed, so a taken port is an error, never a "serving" line followed by one.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from typing import Any

from ..commands.common import CliError

__all__ = ["cmd_serve", "loopback"]


def loopback(host: str) -> bool:
    """True for a host that only this machine reaches."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _graphs(specs: list[str]) -> dict[str, Any]:
    from ..langgraph.cli import load_graph

    out: dict[str, Any] = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep or not name or not target:
            raise CliError(f"--graph is NAME=MODULE:ATTR, got {spec!r}", "BadGraph")
        if name in out:
            raise CliError(f"--graph {name!r} given twice", "BadGraph")
        if not name.replace("-", "").replace("_", "").isalnum():
            raise CliError(f"a graph name is letters, digits, '-' and '_', got {name!r}", "BadGraph")
        out[name] = load_graph(target)
    return out


def cmd_serve(args: argparse.Namespace, url: str, cluster: bool) -> int:
    try:
        import uvicorn

        from . import create_app
        from ._app import MAX_STREAMS, POOL_MARGIN
        from ._served import RunOptions
    except ImportError as exc:
        raise CliError(f"agentstate serve needs the serve extra (pip install 'redis-agentstate[serve]'): {exc}",
                       "MissingExtra") from exc  # fmt: skip
    token = args.token or os.environ.get("AGENTSTATE_TOKEN") or None
    if token is None and not loopback(args.host):
        raise CliError(f"--host {args.host} is not loopback: serving beyond this machine needs --token", "Unsafe")
    if args.lease_ms < 1000:
        raise CliError(f"--lease-ms must be at least 1000, got {args.lease_ms}", "BadArgument")
    origins = list(args.cors_origin)
    for origin in origins:
        if origin != "*" and (not origin.startswith(("http://", "https://")) or origin.rstrip("/") != origin):
            raise CliError(f"--cors-origin is '*' or scheme://host[:port] with no path, got {origin!r}", "BadArgument")
    tenant_key, tenant_limit = _tenant_limit(args.tenant_limit)
    options = RunOptions(webhook_allow_private=args.webhook_allow_private, tenant_key=tenant_key,
                         tenant_limit=tenant_limit)  # fmt: skip
    graphs = _graphs(args.graph)
    # redis-py's pool holds 100 connections by default; every open stream may hold one while it waits.
    pool = MAX_STREAMS + POOL_MARGIN
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        client: Any = RedisCluster.from_url(url, max_connections=pool)
    else:
        import redis.asyncio

        # A burst of requests beyond the pool waits for a connection instead of failing.
        client = redis.asyncio.Redis(
            connection_pool=redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=pool)
        )
    app = create_app(graphs, client, namespace=args.namespace or "agentstate", token=token, workers=args.workers,
                     cors_origins=origins, lease_ms=args.lease_ms, options=options)  # fmt: skip
    sock = _bind(args.host, args.port)
    mode = "every route but /ok needs the token" if token else "read-only (no --token)"
    served = f"graphs {', '.join(graphs)}" if graphs else "the dashboard (no --graph)"
    print(f"agentstate serve: http://{args.host}:{args.port} {served}; {mode}",
          file=sys.stderr, flush=True)  # fmt: skip
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _tenant_limit(spec: str | None) -> tuple[str | None, int | None]:
    """``--tenant-limit KEY=N``: the metadata key naming a run's tenant and its limit."""
    if spec is None:
        return None, None
    key, sep, n = spec.rpartition("=")
    if not sep or not key or not key.isprintable() or not n.isdigit() or not 1 <= int(n) <= 1_000_000:
        raise CliError(f"--tenant-limit is KEY=N (a metadata key, N from 1 to 1000000), got {spec!r}", "BadArgument")
    return key, int(n)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a taken port or a bad address is the command's error."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", "BindFailed") from exc
    return sock
