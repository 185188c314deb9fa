"""The short way to send a script call: ``EVALSHA`` packed here, on a connection the lane keeps.

A script call through redis-py's ``Script.__call__`` and ``execute_command`` takes a connection
from the pool (a lock, a poll of the socket for stray data, the pool's metrics), wraps the send
in the client's ``Retry``, records its duration, encodes every argument through the client's
``Encoder`` and looks up a reply callback; measured on a loopback server, that is a third of a
cycle's client time (``benchmarks/client_ab.py``). A lane does what is left: it packs the
command itself (the ``EVALSHA`` head with the script's SHA and the call's keys encoded once per
key list and kept), writes it on a connection it keeps from the client's pool, and reads the
reply with that connection's parser (so ``decode_responses`` and RESP3 are the client's).

What stays as it was:

- ``NOSCRIPT`` (a ``SCRIPT FLUSH``, a fail-over to a fresh node): the script is loaded and the
  call sent again, as ``Script.__call__`` does;
- a connection error or timeout: the connection is dropped and the error raised to the driver,
  whose ``RetryPolicy`` re-sends (redis-py's own way, with the client's ``Retry``), as after any
  attempt (every request is safe to re-send: docs/design.md, "Retry-safe"); so an attempt is
  still one connection's worth, and the bound of a call no longer;
- an error reply (``WRONGTYPE``, ``AGENTSTATE_CORRUPT``): raised as redis-py raises it, and the
  connection, whose reply was read whole, kept.

A lane is taken only where it sends exactly what redis-py would: a plain ``redis.Redis`` or
``redis.asyncio.Redis`` (not a Cluster, not a single-connection client, not a fake) on a plain
``ConnectionPool`` of redis-py's own connection classes with no client-side cache. And each call
goes the long way while anything has wrapped redis-py's script call or the client's
``execute_command`` (instrumentation such as OpenTelemetry's, or a test's spy): what wraps them
sees every request, as before. A wrapper that catches the lanes' own sends as well (``_send``)
says so by setting ``_SCRIPT_CALL`` (``_ASYNC_SCRIPT_CALL``) to itself, and the lanes stay in use
under it: so ``tests/faults/replies.py`` loses a reply on the path users run. The check reads
that global as it always did: nothing is added to a call.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.connection as aconn
import redis.commands.core as rcore
import redis.connection as sconn
import redis.exceptions as rex

__all__ = ["AsyncLane", "LanedScripts", "SyncLane", "async_lane", "laned", "pack_evalsha", "sync_lane"]

#: Connections a lane keeps idle beyond those in use; more go back to the pool.
MAX_IDLE = 8
#: Arguments shorter than this are framed in one copy; longer ones are joined once, at the end.
_COPY_BELOW = 8192
#: Key lists whose packed head a lane keeps (a store's hot tasks); past it the cache starts over.
MAX_HEADS = 4096

_SYNC_CONNECTIONS = (sconn.Connection, sconn.SSLConnection, sconn.UnixDomainSocketConnection)
_ASYNC_CONNECTIONS = (aconn.Connection, aconn.SSLConnection, aconn.UnixDomainSocketConnection)
#: redis-py's script call, or a wrapper that also wraps the lanes' sends (see the module).
_SCRIPT_CALL = rcore.Script.__call__
_ASYNC_SCRIPT_CALL = rcore.AsyncScript.__call__
_EXECUTE = redis.Redis.execute_command
_ASYNC_EXECUTE = aioredis.Redis.execute_command


def _encoder(pool: Any) -> tuple[str, str, Any]:
    kw = pool.connection_kwargs
    enc = pool.get_encoder()
    return kw.get("encoding", "utf-8"), kw.get("encoding_errors", "strict"), enc


def _bulk(parts: list[bytes], items: Sequence[Any], encoding: str, errors: str, encoder: Any) -> None:
    """Append each item of ``items`` to ``parts`` as a RESP bulk string, encoded as redis-py's
    ``Encoder`` encodes it (bytes as they are, str in the client's encoding, int in decimal; any
    other type through the client's encoder itself, which refuses what redis-py refuses)."""
    for item in items:
        t = type(item)
        if t is bytes:
            b = item
        elif t is str:
            b = item.encode(encoding, errors)
        elif t is int:
            b = b"%d" % item
        else:
            b = encoder.encode(item)
        if len(b) < _COPY_BELOW:
            parts.append(b"$%d\r\n%b\r\n" % (len(b), b))
        else:
            parts.append(b"$%d\r\n" % len(b))
            parts.append(b)
            parts.append(b"\r\n")


def pack_evalsha(head: bytes, n_head: int, args: Sequence[Any], encoding: str, errors: str, encoder: Any) -> bytes:
    """The RESP command ``EVALSHA sha numkeys *keys *args``, given ``head``: its first ``n_head``
    bulk strings (command, SHA, key count and keys) packed already."""
    parts = [b"*%d\r\n" % (n_head + len(args)), head]
    _bulk(parts, args, encoding, errors, encoder)
    return b"".join(parts)


class _Lane:
    """What both lanes share: the scripts, the encoding and the packed heads by (script, keys)."""

    def __init__(self, client: Any, scripts: dict[str, Any]) -> None:
        self.client = client
        self.pool = client.connection_pool
        self.scripts = scripts
        self.encoding, self.errors, self.encoder = _encoder(self.pool)
        self.heads: dict[tuple[str, tuple[Any, ...]], bytes] = {}
        #: The client's kept connections, shared by every store's lane on that client.
        self.free: list[Any] = _kept(client)

    def head(self, script: str, keys: Sequence[Any]) -> tuple[bytes, int]:
        """The packed ``EVALSHA sha numkeys *keys`` of ``script`` and ``keys``, and its bulk count."""
        tkeys = keys if type(keys) is tuple else tuple(keys)
        cached = self.heads.get((script, tkeys))
        if cached is None:
            parts: list[bytes] = []
            _bulk(
                parts,
                ("EVALSHA", self.scripts[script].sha, len(tkeys), *tkeys),
                self.encoding,
                self.errors,
                self.encoder,
            )
            cached = b"".join(parts)
            if len(self.heads) >= MAX_HEADS:
                self.heads.clear()
            self.heads[(script, tkeys)] = cached
        return cached, 3 + len(tkeys)

    def pack(self, script: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        head, n = self.head(script, keys)
        return pack_evalsha(head, n, args, self.encoding, self.errors, self.encoder)

    def reloaded(self, script: str) -> None:
        """Forget the heads of ``script`` (its SHA was loaded again: the same text, so the same SHA;
        dropped all the same, so a head never names a SHA the script object no longer has)."""
        for k in [k for k in list(self.heads) if k[0] == script]:
            self.heads.pop(k, None)


#: Each client's kept connections, one list per client whatever the number of stores on it (so the
#: connections a client's pool counts as in use stay at most MAX_IDLE idle ones, however many stores
#: come and go); gone with the client.
_KEPT: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def _kept(client: Any) -> list[Any]:
    with _KEPT_LOCK:
        free = _KEPT.get(client)
        if free is None:
            free = _KEPT[client] = []
        return free


def _forget_after_fork() -> None:
    # A child must not share its parent's sockets: the pool starts over in the child (redis-py's
    # own pid check), and so do the kept connections (and the lock, which a thread of the parent
    # may have held at the fork).
    global _KEPT_LOCK
    _KEPT_LOCK = threading.Lock()
    for free in list(_KEPT.values()):
        free.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class SyncLane(_Lane):
    """The short way for a sync ``redis.Redis`` client (see the module)."""

    def call(self, script: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        client = self.client
        obj = self.scripts[script]
        if type(obj).__call__ is not _SCRIPT_CALL or "execute_command" in client.__dict__:
            return obj(keys=keys, args=args, client=client)  # something wraps the call: it sees it
        if type(client).execute_command is not _EXECUTE:
            return obj(keys=keys, args=args, client=client)
        packed = self.pack(script, keys, args)
        try:
            return self._send(packed)
        except rex.NoScriptError:
            obj.sha = client.script_load(obj.script)
            self.reloaded(script)
            return self._send(self.pack(script, keys, args))

    def _send(self, packed: bytes) -> Any:
        free = self.free
        try:
            conn = free.pop()
        except IndexError:
            conn = self.pool.get_connection()
        try:
            conn.send_packed_command((packed,))
            reply = conn.read_response()
        except rex.ResponseError:
            self._put_back(conn)  # an error reply, read whole: the connection is sound
            raise
        except BaseException:
            conn.disconnect()
            self.pool.release(conn)
            raise
        self._put_back(conn)
        return reply

    def _put_back(self, conn: Any) -> None:
        if len(self.free) < MAX_IDLE:
            self.free.append(conn)
        else:
            self.pool.release(conn)


class AsyncLane(_Lane):
    """The short way for a ``redis.asyncio.Redis`` client (see the module)."""

    async def call(self, script: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        client = self.client
        obj = self.scripts[script]
        if type(obj).__call__ is not _ASYNC_SCRIPT_CALL or "execute_command" in client.__dict__:
            return await obj(keys=keys, args=args, client=client)
        if type(client).execute_command is not _ASYNC_EXECUTE:
            return await obj(keys=keys, args=args, client=client)
        packed = self.pack(script, keys, args)
        try:
            return await self._send(packed)
        except rex.NoScriptError:
            obj.sha = await client.script_load(obj.script)
            self.reloaded(script)
            return await self._send(self.pack(script, keys, args))

    async def _send(self, packed: bytes) -> Any:
        free = self.free
        try:
            conn = free.pop()
        except IndexError:
            conn = await self.pool.get_connection()
        try:
            await conn.send_packed_command((packed,))
            reply = await conn.read_response()
        except rex.ResponseError:
            await self._put_back(conn)
            raise
        except BaseException:
            # A cancel or a timeout mid-reply leaves bytes on the socket: the connection goes.
            await conn.disconnect(nowait=True)
            await self.pool.release(conn)
            raise
        await self._put_back(conn)
        return reply

    async def _put_back(self, conn: Any) -> None:
        if len(self.free) < MAX_IDLE:
            self.free.append(conn)
        else:
            await self.pool.release(conn)


def _plain(client: Any, client_type: type, connections: tuple[type, ...]) -> bool:
    pool = getattr(client, "connection_pool", None)
    return (
        type(client) is client_type
        and getattr(client, "connection", None) is None
        and pool is not None
        and type(pool) is (sconn.ConnectionPool if client_type is redis.Redis else aconn.ConnectionPool)
        and pool.connection_class in connections
        and getattr(pool, "cache", None) is None
    )


def sync_lane(client: Any, scripts: dict[str, Any]) -> SyncLane | None:
    """A lane for ``client`` if it is one a lane serves exactly (see the module), else None."""
    return SyncLane(client, scripts) if _plain(client, redis.Redis, _SYNC_CONNECTIONS) else None


def async_lane(client: Any, scripts: dict[str, Any]) -> AsyncLane | None:
    """The asyncio twin of :func:`sync_lane`."""
    return AsyncLane(client, scripts) if _plain(client, aioredis.Redis, _ASYNC_CONNECTIONS) else None


class LanedScripts(dict[str, Any]):
    """A store's registered scripts (name -> redis-py ``Script``) with the lane that sends them; the
    drivers take the short way for a mapping of this type, and redis-py's for any other."""

    lane: Any


def laned(client: Any, registered: dict[str, Any], *, asyncio: bool) -> dict[str, Any]:
    """``registered`` with a lane for ``client`` (``LanedScripts``), or as it is where none serves it."""
    out = LanedScripts(registered)
    lane = async_lane(client, out) if asyncio else sync_lane(client, out)
    if lane is None:
        return registered
    out.lane = lane
    return out
