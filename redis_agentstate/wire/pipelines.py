"""Pipelined requests: script batches (re-sent after NOSCRIPT) with their replica waits, and their errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis.exceptions as rex

from ..clients import AsyncClient, SyncClient
from .failures import _PipeCommandError
from .replicas import ReplicaAck
from .requests import Batch, Call


def _raise_first_error(commands: Sequence[Sequence[Any]], replies: list[Any], wrongtype_ok: bool = False) -> list[Any]:
    for cmd, reply in zip(commands, replies, strict=True):
        if wrongtype_ok and isinstance(reply, rex.ResponseError) and str(reply).startswith("WRONGTYPE"):
            continue
        if isinstance(reply, rex.ResponseError):
            raise _PipeCommandError(cmd, reply)
        if isinstance(reply, Exception):
            raise reply
    return replies


def _evalsha(scripts: dict[str, Any], call: Call) -> tuple[Any, ...]:
    return ("EVALSHA", scripts[call.script].sha, len(call.keys), *call.keys, *call.args)


def _missed(req: Batch, replies: list[Any]) -> list[int]:
    """Indexes of the calls of ``req`` that met NOSCRIPT."""
    return [i for i, reply in enumerate(replies) if isinstance(reply, rex.NoScriptError)]


def _pipeline_sync(client: SyncClient, entries: Sequence[tuple[Sequence[Any], dict[str, Any]]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for cmd, options in entries:
        pipe.execute_command(*cmd, **options)
    return cast(list[Any], pipe.execute(raise_on_error=False))


async def _pipeline_async(client: AsyncClient, entries: Sequence[tuple[Sequence[Any], dict[str, Any]]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for cmd, options in entries:
        pipe.execute_command(*cmd, **options)
    return cast(list[Any], await pipe.execute(raise_on_error=False))


def _send_batch_sync(
    client: SyncClient, scripts: dict[str, Any], req: Batch, ack: ReplicaAck | None = None
) -> tuple[list[Any], list[Any]]:
    """The replies of ``req``'s calls, and of the waits ``ack`` adds after them (see ``ReplicaAck``)."""
    commands = [_evalsha(scripts, call) for call in req.calls]
    routes, owners = ack.routes(client, req.calls) if ack else ([], [])
    waits = ack.entries(routes) if ack else []
    replies = _pipeline_sync(client, [*((cmd, {}) for cmd in commands), *waits])
    replies, waited = replies[: len(commands)], replies[len(commands) :]
    missed = _missed(req, replies)
    if missed:
        for name in dict.fromkeys(req.calls[i].script for i in missed):
            scripts[name].sha = client.script_load(scripts[name].script)
        for i in missed:
            commands[i] = _evalsha(scripts, req.calls[i])
        if ack and len(missed) < len(commands):
            # The calls that ran the first time were waited for by that pipeline's waits
            # (the re-send may use another connection, whose WAIT would not cover them).
            ack.verify(client, req.calls, routes, owners, waited)
        again = _pipeline_sync(client, [*((commands[i], {}) for i in missed), *waits])
        for i, reply in zip(missed, again, strict=False):
            replies[i] = reply
        waited = again[len(missed) :]
    replies = _raise_first_error(commands, replies)
    if ack:
        ack.verify(client, req.calls, routes, owners, waited)
    return replies, waited


async def _send_batch_async(
    client: AsyncClient, scripts: dict[str, Any], req: Batch, ack: ReplicaAck | None = None
) -> tuple[list[Any], list[Any]]:
    commands = [_evalsha(scripts, call) for call in req.calls]
    routes, owners = ack.routes(client, req.calls) if ack else ([], [])
    waits = ack.entries(routes) if ack else []
    replies = await _pipeline_async(client, [*((cmd, {}) for cmd in commands), *waits])
    replies, waited = replies[: len(commands)], replies[len(commands) :]
    missed = _missed(req, replies)
    if missed:
        for name in dict.fromkeys(req.calls[i].script for i in missed):
            scripts[name].sha = await client.script_load(scripts[name].script)
        for i in missed:
            commands[i] = _evalsha(scripts, req.calls[i])
        if ack and len(missed) < len(commands):
            # The calls that ran the first time were waited for by that pipeline's waits
            # (the re-send may use another connection, whose WAIT would not cover them).
            ack.verify(client, req.calls, routes, owners, waited)
        again = await _pipeline_async(client, [*((commands[i], {}) for i in missed), *waits])
        for i, reply in zip(missed, again, strict=False):
            replies[i] = reply
        waited = again[len(missed) :]
    replies = _raise_first_error(commands, replies)
    if ack:
        ack.verify(client, req.calls, routes, owners, waited)
    return replies, waited
