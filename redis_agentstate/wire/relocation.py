"""Following a namespace's shards through a live reshard: what the drivers do when a shard moved.

A reshard (``core/reshard.py``) seals each old shard before it copies it (``<prefix>moved`` =
``sealed``), marks it ``moved`` once copied, then counts it in the layout record. So:

* every script of a shard's data checks the seal first (``_moved.lua``) and answers
  ``AGENTSTATE_MOVED <sealed|moved>`` without touching anything;
* every plain read (``Pipe``, ``Command``) gets the seal of each shard it reads appended
  (``checked``): read after the data, so data read from a shard not yet marked ``moved`` was that
  shard's current data (a reshard seals before it copies, and deletes only after it marked the
  shard moved); reads, plain or by a script of ``scripts.READS``, go on while a shard is sealed.

Either way the driver re-reads the layout record (``refresh_layout``): when it moved on, the
request is rewritten for where its keys live now (``rewrite``: the owner's shard, the same
arguments, so a re-sent write keeps its nonce and its digest, and the write ring that moved
with the task recognises it); when it did not (the shard is being copied), the driver waits a
little and sends it again (``Backoff``), up to ``SEALED_WAIT_S``. A request that reads a shard's
own keys (an index: moving a shard splits it) cannot be rewritten: ``ShardMoved`` is thrown into
its op, which starts over from the new layout (``restart``). Nothing here does I/O.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

import redis.exceptions as rex

from ..core.replies import lenient_text
from ..errors import BackendUnavailable
from ..keys import Keys
from .failures import _command_keys, _PipeCommandError, request_keys
from .requests import Batch, Call, Command, Op, Pipe, Request, T

__all__ = [
    "MOVED_REPLY",
    "SEALED_WAIT_S",
    "Backoff",
    "Relocation",
    "ShardMoved",
    "restart",
    "restartable",
    "sealed_too_long",
]

P = ParamSpec("P")

#: The error-reply prefix of a script that met a sealed shard (``_moved.lua``).
MOVED_REPLY = "AGENTSTATE_MOVED"
#: How long a request waits for a sealed shard to be copied before it fails (a reshard copies
#: one shard in milliseconds to a few seconds; a seal this old means the reshard stopped half-way).
SEALED_WAIT_S = 30.0


class ShardMoved(BackendUnavailable):
    """A shard a request read was moved by a reshard: the operation starts over on the new layout."""


def restart(factory: Callable[[], Op[T]]) -> Op[T]:
    """``factory()``'s op, started over whenever a shard it reads moves under it (``ShardMoved``):
    for the operations that read shard indexes (listings, counts, claim_next's peek)."""
    while True:
        try:
            return (yield from factory())
        except ShardMoved:
            continue


def is_moved(exc: BaseException) -> bool:
    """``exc`` is a script's (or a pipelined script's) refusal of a sealed shard."""
    error = exc.error if isinstance(exc, _PipeCommandError) else exc
    return isinstance(error, rex.ResponseError) and str(error).startswith(MOVED_REPLY)


def _prefix(key: str) -> str | None:
    head, sep, _ = key.partition("}:")
    return head + sep if sep else None


class Backoff:
    """The waits of one request for a sealed shard: 2 ms, doubling to 50 ms, for ``SEALED_WAIT_S``."""

    def __init__(self) -> None:
        self.delay = 0.002
        self.deadline = time.monotonic() + SEALED_WAIT_S

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def next(self, what: str) -> float:
        if self.expired():
            raise BackendUnavailable(
                f"{what} stayed sealed for {SEALED_WAIT_S:.0f} s: a reshard stopped half-way? "
                "`agentstate reshard --shards N` with the same N finishes it"
            )
        delay, self.delay = self.delay, min(0.05, self.delay * 2)
        return delay


def sealed_too_long(keys: Keys, what: str) -> Op[BackendUnavailable]:
    """The error for a request whose shard stayed sealed past ``SEALED_WAIT_S``: whether a live
    reshard holds the namespace (its lease, ``core/reshard.py``) and when its lease ends, or that the
    one that sealed it stopped and a rerun takes it over. One round trip."""
    lease = keys.layout_key().removesuffix("layout") + "reshard"
    (holder, expires, gen), now = yield Pipe([("HMGET", lease, "holder", "expires", "gen"), ("TIME",)])
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    head = f"{what} stayed sealed for {SEALED_WAIT_S:.0f} s"
    if holder is None or expires is None:
        return BackendUnavailable(
            f"{head}: a reshard stopped half-way? `agentstate reshard --shards N` with the same N finishes it"
        )
    who = f"a reshard by {lenient_text(holder)} (generation {lenient_text(gen)})"
    left = (int(expires) - now_ms) / 1000
    if left > 0:
        return BackendUnavailable(
            f"{head}: {who} holds the namespace, its lease live for {left:.1f} s more: it is still moving "
            "it (a large shard, or a slow link); send the call again later, and do not start another reshard"
        )
    return BackendUnavailable(
        f"{head}: {who} sealed it and stopped, its lease ran out {-left:.1f} s ago: "
        "`agentstate reshard --shards N` with the same N takes it over and finishes it"
    )


class Relocation:
    """A store's view of its namespace's shards for the drivers: the seals to check, the rewrites."""

    __slots__ = ("keys", "own")

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        #: The namespace's key prefix: keys outside it are not checked.
        self.own = f"{keys.namespace}:{{"

    def checked(self, req: Pipe | Command) -> tuple[Pipe, int]:
        """``req`` as a pipeline followed by the seal of every shard it reads, and how many seals."""
        commands = [req.args] if isinstance(req, Command) else list(req.commands)
        if isinstance(req, Pipe) and req.by_record:
            return Pipe([*commands, ("GET", self.keys.layout_key())], req.wrongtype_ok), 1
        seals: dict[str, None] = {}
        own = self.own
        for cmd in commands:
            for key in _command_keys(cmd):
                if key.startswith(own):
                    prefix = _prefix(key)
                    if prefix is not None:
                        seals[prefix + "moved"] = None
        wrongtype_ok = isinstance(req, Pipe) and req.wrongtype_ok
        return Pipe([*commands, *(("GET", seal) for seal in seals)], wrongtype_ok), len(seals)

    def unsealed(self, req: Request, reply: list[Any], seals: int) -> Any:
        """The reply of ``req`` from the reply of ``checked(req)``; the error a script would answer
        (``MOVED_REPLY``) when a shard it read was moved (or, for ``by_record``, the layout changed)."""
        if isinstance(req, Pipe) and req.by_record:
            record = reply[-1]
            if record is None or lenient_text(record) != self.keys.record():
                raise rex.ResponseError(f"{MOVED_REPLY} layout")
            return reply[:-1]
        # A sealed shard's data is whole and current (nothing writes it, nothing is deleted before
        # it is marked moved, and the seal was read after the data): only a moved one is followed.
        if any(m is not None and lenient_text(m) == "moved" for m in reply[len(reply) - seals :]):
            raise rex.ResponseError(f"{MOVED_REPLY} moved")
        data = reply[: len(reply) - seals]
        return data[0] if isinstance(req, Command) else data

    def next_request(self, req: Request) -> Request:
        """What to send after ``req`` met a sealed shard and the layout was read again: ``req`` itself
        (the shard is still being copied: wait and send it again), or ``req`` at its keys' new shard;
        ``ShardMoved`` when it reads a shard's own keys and that shard moved."""
        new = self.rewrite(req)
        if new is None:
            ns = self.keys.namespace
            raise ShardMoved(f"{self.describe(req)} moved to other shards (namespace {ns!r} resharded)")
        return req if request_keys(new) == request_keys(req) else new

    def describe(self, req: Request) -> str:
        keys = request_keys(req)
        return f"shard of {keys[0]!r}" if keys else "a shard"

    def rewrite(self, req: Request) -> Request | None:
        """``req`` for where its keys live now (the layout was refreshed since it was built), or None
        when a key is a shard's own (an index) whose shard moved; ``req`` itself when nothing moved."""
        if isinstance(req, Call):
            keys = self._call_keys(req.keys)
            return None if keys is None else Call(req.script, keys, req.args)
        if isinstance(req, Batch):
            calls = []
            for call in req.calls:
                keys = self._call_keys(call.keys)
                if keys is None:
                    return None
                calls.append(Call(call.script, keys, call.args))
            return Batch(calls)
        commands = [req.args] if isinstance(req, Command) else list(req.commands)
        out: list[Sequence[Any]] = []
        for cmd in commands:
            keys = _command_keys(cmd)
            if not keys or not any(k.startswith(self.own) for k in keys):
                out.append(cmd)
                continue
            if len(keys) != 1 or lenient_text(cmd[0]).upper() == "XREAD":
                moved = self._call_keys(keys)
                if moved is None:
                    return None
                if lenient_text(cmd[0]).upper() == "XREAD":
                    at = [lenient_text(a).upper() for a in cmd].index("STREAMS") + 1
                    out.append([*cmd[:at], *moved, *cmd[at + len(moved) :]])
                    continue
                return None  # pragma: no cover - every multi-key command we send is an XREAD
            new = self._call_keys(keys)
            if new is None:
                return None
            out.append([cmd[0], new[0], *cmd[2:]])
        if isinstance(req, Command):
            return Command(out[0])
        return Pipe(out, req.wrongtype_ok, req.by_record)

    def _call_keys(self, keys: Sequence[str | bytes]) -> list[str] | None:
        """The keys of one script call (one slot: one shard) at the owner's shard now; None when
        the call names no owner, or owners now in different shards (a chunk of a split shard)."""
        texts = [lenient_text(k) for k in keys]
        own = [k for k in texts if k.startswith(self.own)]
        if not own:
            return texts
        prefixes = set()
        for key in own:
            moved = self.keys.relocated(key)
            if moved is not None:
                prefixes.add(_prefix(moved))
        if len(prefixes) != 1:
            return None
        (prefix,) = prefixes
        assert prefix is not None
        return [prefix + k[len(_prefix(k) or "") :] if k.startswith(self.own) else k for k in texts]


def restartable(fn: Callable[P, Op[T]]) -> Callable[P, Op[T]]:
    """``fn``'s ops started over when a shard they read moves (``restart``): only for operations whose
    arguments can be used twice (no iterator), which read before they write."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Op[T]:
        return (yield from restart(lambda: fn(*args, **kwargs)))

    return wrapper
