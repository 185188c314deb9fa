"""The drivers: ``run_sync`` and ``run_async`` send an operation's requests and feed it the replies.

The only two places that talk to Redis, so the sync and async stores are
shells and no rule can drift between them; retries (``retry.py``), batches
(``pipelines.py``) and replica waits (``replicas.py``) happen here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.exceptions as rex

from ..clients import AsyncClient, SyncClient
from ..errors import AgentStateError
from .failures import _explain, _translate
from .lanes import LanedScripts
from .layout import refresh_layout
from .pipelines import _raise_first_error, _send_batch_async, _send_batch_sync
from .relocation import Backoff, Relocation, ShardMoved, is_moved, sealed_too_long
from .replicas import ReplicaAck, _learn_async, _learn_sync, _write_calls
from .requests import Batch, Call, Command, Op, Request, T
from .retry import NO_RETRY, RetryPolicy

__all__ = ["run_async", "run_sync"]


def _send_acked_sync(client: SyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck) -> Any:
    calls = _write_calls(req)
    if calls is None:
        return _send_sync(client, scripts, req)
    if not ack.checked:
        _learn_sync(client, ack)
    replies, _ = _send_batch_sync(client, scripts, Batch(calls), ack)
    return replies[0] if isinstance(req, Call) else replies


async def _send_acked_async(client: AsyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck) -> Any:
    calls = _write_calls(req)
    if calls is None:
        return await _send_async(client, scripts, req)
    if not ack.checked:
        await _learn_async(client, ack)
    replies, _ = await _send_batch_async(client, scripts, Batch(calls), ack)
    return replies[0] if isinstance(req, Call) else replies


def _send_sync(client: SyncClient, scripts: dict[str, Any], req: Request) -> Any:
    if isinstance(req, Call):
        if type(scripts) is LanedScripts:
            return scripts.lane.call(req.script, req.keys, req.args)  # the short way (lanes.py)
        return scripts[req.script](keys=req.keys, args=req.args, client=client)
    if isinstance(req, Batch):
        return _send_batch_sync(client, scripts, req)[0]
    if isinstance(req, Command):
        return client.execute_command(*req.args)
    pipe = client.pipeline(transaction=False)
    for cmd in req.commands:
        pipe.execute_command(*cmd)
    return _raise_first_error(req.commands, pipe.execute(raise_on_error=False), req.wrongtype_ok)


async def _send_async(client: AsyncClient, scripts: dict[str, Any], req: Request) -> Any:
    if isinstance(req, Call):
        if type(scripts) is LanedScripts:
            return await scripts.lane.call(req.script, req.keys, req.args)
        return await scripts[req.script](keys=req.keys, args=req.args, client=client)
    if isinstance(req, Batch):
        return (await _send_batch_async(client, scripts, req))[0]
    if isinstance(req, Command):
        return await client.execute_command(*req.args)
    pipe = client.pipeline(transaction=False)
    for cmd in req.commands:
        pipe.execute_command(*cmd)
    return _raise_first_error(req.commands, await pipe.execute(raise_on_error=False), req.wrongtype_ok)


def _send_one_sync(client: SyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck | None) -> Any:
    return _send_sync(client, scripts, req) if ack is None else _send_acked_sync(client, scripts, req, ack)


async def _send_one_async(client: AsyncClient, scripts: dict[str, Any], req: Request, ack: ReplicaAck | None) -> Any:
    return await (_send_async(client, scripts, req) if ack is None else _send_acked_async(client, scripts, req, ack))


def _retry_sync(
    client: SyncClient,
    scripts: dict[str, Any],
    retry: RetryPolicy,
    req: Request,
    ack: ReplicaAck | None,
    started: float,
    failed: BaseException | None,
) -> Any:
    """Re-send ``req`` after its first try (begun at ``started``) failed with ``failed``, per ``retry``."""
    for attempt in retry.sync(started):
        with attempt:
            if failed is not None:
                # tenacity's attempt 1 is the failure above: it decides from there whether to wait and re-send.
                first, failed = failed, None
                raise first
            return _send_one_sync(client, scripts, req, ack)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def run_sync(
    client: SyncClient,
    scripts: dict[str, Any],
    retry: RetryPolicy,
    op: Op[T],
    ack: ReplicaAck | None = None,
    moves: Relocation | None = None,
) -> T:
    """Drive ``op`` to completion with blocking I/O; ``ack``: wait for replicas after each write;
    ``moves``: follow the namespace's shards through a reshard (``relocation.py``)."""
    try:
        req = next(op)
        backoff: Backoff | None = None
        while True:
            # The first try runs outside tenacity, so the happy path pays no retry bookkeeping;
            # the deadline counts from its start all the same (redis-py's own retries and
            # connect timeouts inside it are within max_delay_s, not on top of it).
            started = time.monotonic()
            sent, seals = req, 0
            if moves is not None and type(req) is not Call and type(req) is not Batch:
                sent, seals = moves.checked(req)  # type: ignore[arg-type]
            try:
                try:
                    if ack is None:
                        reply = _send_sync(client, scripts, sent)
                    else:
                        reply = _send_acked_sync(client, scripts, sent, ack)
                except retry.retry_on as exc:
                    reply = _retry_sync(client, scripts, retry, sent, ack, started, exc)
                if seals:
                    reply = moves.unsealed(req, reply, seals)  # type: ignore[union-attr]
            except rex.RedisError as exc:
                if moves is not None and is_moved(exc):
                    backoff = backoff or Backoff()
                    try:
                        req = _relocate_sync(client, scripts, retry, moves, req, backoff)
                    except ShardMoved as moved:
                        req, backoff = op.throw(moved), None
                    continue
                # Thrown into the op, which may recover (claim_next skips a corrupt task).
                req = op.throw(_caused(_error_sync(client, scripts, req, exc), exc))
                continue
            backoff = None
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


def _relocate_sync(
    client: SyncClient, scripts: dict[str, Any], retry: RetryPolicy, moves: Relocation, req: Request, backoff: Backoff
) -> Request:
    """``req`` after it met a sealed shard: rewritten for the layout read again, or, while the shard is
    still being copied, the same request after a short wait (``relocation.py``)."""
    run_sync(client, scripts, retry, refresh_layout(moves.keys))
    new = moves.next_request(req)
    if new is req and backoff.expired():
        raise run_sync(client, scripts, retry, sealed_too_long(moves.keys, moves.describe(req)))
    if new is req:
        time.sleep(backoff.next(moves.describe(req)))
    return new


async def _relocate_async(
    client: AsyncClient, scripts: dict[str, Any], retry: RetryPolicy, moves: Relocation, req: Request, backoff: Backoff
) -> Request:
    """The asyncio twin of :func:`_relocate_sync`."""
    await run_async(client, scripts, retry, refresh_layout(moves.keys))
    new = moves.next_request(req)
    if new is req and backoff.expired():
        raise await run_async(client, scripts, retry, sealed_too_long(moves.keys, moves.describe(req)))
    if new is req:
        await asyncio.sleep(backoff.next(moves.describe(req)))
    return new


def _caused(error: AgentStateError, cause: rex.RedisError) -> AgentStateError:
    """``error`` as if raised ``from cause`` (it is thrown into the op, not raised here)."""
    error.__cause__ = cause
    return error


def _error_sync(client: SyncClient, scripts: dict[str, Any], req: Request, exc: rex.RedisError) -> AgentStateError:
    try:
        return run_sync(client, scripts, NO_RETRY, _explain(req, exc))
    except AgentStateError:
        return _translate(exc)  # Redis failed again while we looked: report the first error


async def _error_async(
    client: AsyncClient, scripts: dict[str, Any], req: Request, exc: rex.RedisError
) -> AgentStateError:
    try:
        return await run_async(client, scripts, NO_RETRY, _explain(req, exc))
    except AgentStateError:
        return _translate(exc)


async def _retry_async(
    client: AsyncClient,
    scripts: dict[str, Any],
    retry: RetryPolicy,
    req: Request,
    ack: ReplicaAck | None,
    started: float,
    failed: BaseException | None,
) -> Any:
    """The asyncio twin of :func:`_retry_sync`."""
    async for attempt in retry.asyncio(started):
        with attempt:
            if failed is not None:
                first, failed = failed, None
                raise first
            return await _send_one_async(client, scripts, req, ack)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


async def run_async(
    client: AsyncClient,
    scripts: dict[str, Any],
    retry: RetryPolicy,
    op: Op[T],
    ack: ReplicaAck | None = None,
    moves: Relocation | None = None,
) -> T:
    """Drive ``op`` to completion on the running event loop; ``ack``: wait for replicas after each write;
    ``moves``: follow the namespace's shards through a reshard (``relocation.py``).

    A cancel of the calling task that a round trip swallowed (redis-py's asyncio read returns normally
    from some reads cancelled mid-way, fakeredis too) is raised after that round trip: otherwise a
    task looping over store calls (a TTL sweeper, a worker) never ends, and ``asyncio.timeout``
    never fires. Python 3.10 does not count cancels, so there the loop relies on redis-py alone.
    """
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    baseline = cancelling() if cancelling is not None else 0
    try:
        req = next(op)
        backoff: Backoff | None = None
        while True:
            started = time.monotonic()  # as run_sync: the first try outside tenacity
            sent, seals = req, 0
            if moves is not None and type(req) is not Call and type(req) is not Batch:
                sent, seals = moves.checked(req)  # type: ignore[arg-type]
            try:
                try:
                    if ack is None and type(req) is Call:
                        # The hot path, inlined: one coroutine fewer per script call than via _send_async.
                        if type(scripts) is LanedScripts:
                            reply = await scripts.lane.call(req.script, req.keys, req.args)
                        else:
                            reply = await scripts[req.script](keys=req.keys, args=req.args, client=client)
                    elif ack is None:
                        reply = await _send_async(client, scripts, sent)
                    else:
                        reply = await _send_acked_async(client, scripts, sent, ack)
                except retry.retry_on as exc:
                    reply = await _retry_async(client, scripts, retry, sent, ack, started, exc)
                if seals:
                    reply = moves.unsealed(req, reply, seals)  # type: ignore[union-attr]
            except rex.RedisError as exc:
                if moves is not None and is_moved(exc):
                    backoff = backoff or Backoff()
                    try:
                        req = await _relocate_async(client, scripts, retry, moves, req, backoff)
                    except ShardMoved as moved:
                        req, backoff = op.throw(moved), None
                    continue
                req = op.throw(_caused(await _error_async(client, scripts, req, exc), exc))
                continue
            backoff = None
            if cancelling is not None and cancelling() > baseline:
                raise asyncio.CancelledError()
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()
