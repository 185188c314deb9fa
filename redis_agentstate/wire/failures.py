"""What a failed request means: the library's error for a Redis error, naming data we did not write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.exceptions as rex

from ..core.replies import lenient_text
from ..errors import BackendError, BackendUnavailable, CorruptState
from ..keys import describe_key
from .requests import Batch, Call, Command, Op, Pipe, Request
from .retry import _TRANSIENT

__all__ = ["CORRUPT_REPLY", "corrupt_state", "request_keys"]


def _translate(exc: rex.RedisError) -> BackendError:
    if isinstance(exc, _TRANSIENT):
        return BackendUnavailable(f"Redis unavailable: {exc}")
    return BackendError(f"Redis error: {exc}")


# ---- data under our keys that we did not write ---------------------------------
#
# Two ways to find it, worded the same on every server (Redis, Valkey and
# fakeredis word their own errors differently):
#
# * A script that checks what it reads before it writes answers with the error
#   reply ``AGENTSTATE_CORRUPT <i> <what>``: KEYS[i] holds a malformed
#   ``<what>`` (a field name). An error reply, so it reads the same whatever
#   the script's normal reply is.
# * A command that meets a key of another Redis type fails with WRONGTYPE,
#   which names no key. The driver then asks for the TYPE of every key of the
#   request and names the one that is not what ``keys.KEY_TYPES`` says. Only
#   failed requests pay for that; scripts that write make sure to fail this
#   way before their first write (see the probes in the Lua preludes).

#: The error-reply prefix of a script that found data it did not write (see above).
CORRUPT_REPLY = "AGENTSTATE_CORRUPT"
_OWNER_LABELS = {"task": "task", "pool": "agent pool", "key": "key/value key", "thread": "LangGraph thread",
                 "concurrency key": "concurrency key", "store namespace": "LangGraph store namespace"}  # fmt: skip


class _PipeCommandError(rex.ResponseError):
    """One command of a pipeline failed: keeps which one, so its keys can be named."""

    def __init__(self, command: Sequence[Any], error: rex.ResponseError) -> None:
        super().__init__(str(error))
        self.command = command
        self.error = error


def _command_keys(args: Sequence[Any]) -> list[str]:
    """The keys of one of the commands this library sends (the ACL list in the README is all of them)."""
    name = lenient_text(args[0]).upper()
    if name == "EVALSHA":  # never EVAL: scripts go by SHA (and SCRIPT LOAD after a NOSCRIPT)
        return [lenient_text(k) for k in args[3 : 3 + int(args[2])]]
    if name == "XREAD":
        streams = [lenient_text(a).upper() for a in args].index("STREAMS")
        rest = args[streams + 1 :]
        return [lenient_text(k) for k in rest[: len(rest) // 2]]
    if name in ("TIME", "TYPE") or len(args) < 2:
        return []
    return [lenient_text(args[1])]


def request_keys(req: Request) -> list[str]:
    """Every key ``req`` touches."""
    if isinstance(req, Call):
        return [lenient_text(k) for k in req.keys]
    if isinstance(req, Command):
        return _command_keys(req.args)
    if isinstance(req, Batch):
        return [lenient_text(k) for call in req.calls for k in call.keys]
    return [k for cmd in req.commands for k in _command_keys(cmd)]


def corrupt_state(key: str, keys: Sequence[str], detail: str) -> CorruptState:
    """``CorruptState`` naming ``key`` and the task, pool or key/value key it belongs to.

    A shard-wide key (an index) belongs to nobody: the owner is then taken
    from the other keys of the request, e.g. the task a claim was for.
    """
    owner, task_id = "shard index", None
    for k in (key, *keys):
        _, kind, ident = describe_key(k)
        if kind is not None and ident is not None:
            owner = f"{_OWNER_LABELS[kind]} {ident!r}"
            task_id = ident if kind == "task" else None
            break
    return CorruptState(
        f"{key!r} ({owner}) {detail}: not data redis_agentstate wrote; nothing was written",
        key=key,
        task_id=task_id,
    )


def _explain(req: Request, exc: rex.RedisError) -> Op[BackendError | CorruptState]:
    """The library error for ``exc``, which ``req`` raised; may ask Redis for key types first."""
    if isinstance(exc, _PipeCommandError):
        req, exc = Command(exc.command), exc.error
    message = str(exc)
    if isinstance(exc, rex.ResponseError) and message.startswith(CORRUPT_REPLY + " "):
        _, index, what = message.split(" ", 2)
        keys = request_keys(req)
        return corrupt_state(keys[int(index) - 1], keys, f"holds a malformed {what}")
    if isinstance(exc, rex.ResponseError) and "WRONGTYPE" in message:
        keys = list(dict.fromkeys(request_keys(req)))
        if keys:
            found = yield Pipe([("TYPE", k) for k in keys])
            for key, kind in zip(keys, found, strict=True):
                expected = describe_key(key)[0]
                if expected is not None and lenient_text(kind) not in ("none", expected):
                    return corrupt_state(
                        key, keys, f"is a Redis {lenient_text(kind)} where the library keeps a {expected}"
                    )
    return _translate(exc)
