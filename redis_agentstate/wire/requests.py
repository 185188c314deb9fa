"""What an operation yields: the four kinds of request, and the nonce that names a write.

An operation is a generator (``Op``) that yields requests and is sent their
replies; the drivers (``drivers.py``) are the only code that turns them into I/O.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Batch", "Call", "Command", "Op", "Pipe", "Request", "new_nonce"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One ``EVALSHA`` of a registered script.

    ``keys`` may be str or (encoded once, for a hot task) UTF-8 bytes: Redis sees the same key.
    """

    script: str
    keys: Sequence[str | bytes]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Pipe:
    """Independent read commands sent in one pipeline (one round trip per node).

    Reads only: every write is a script, declared in ``scripts.WRITES``.
    ``wrongtype_ok``: a command that meets a key of another Redis type answers
    its ``redis.ResponseError`` in place instead of failing the request (for a
    reader that can skip that key, as claim_next skips a corrupt shard index).
    """

    commands: Sequence[Sequence[Any]]
    wrongtype_ok: bool = False
    #: Reads of shard indexes that a stale view only delays (claim_next's peek): checked against the
    #: layout record, one command, instead of each shard's seal (``relocation.py``).
    by_record: bool = False


@dataclass(frozen=True, slots=True)
class Batch:
    """Independent script calls sent in one pipeline, as ``EVALSHA``; the reply is the list of their replies.

    A script the server does not hold (NOSCRIPT: a ``SCRIPT FLUSH``, a
    fail-over to a fresh node) is loaded and only the calls that missed it
    are sent again, as redis-py's ``Script`` does for one call.
    """

    calls: Sequence[Call]


@dataclass(frozen=True, slots=True)
class Command:
    """One plain read command sent on its own, e.g. a blocking ``XREAD`` (never pipelined)."""

    args: Sequence[Any]


Request = Call | Batch | Pipe | Command
Op = Generator[Request, Any, T]


class _NonceSource:
    """Unique per-call identities: a random per-process prefix and a counter.

    Cheaper than ``os.urandom`` per call; the prefix is drawn again in a forked
    child so two processes never share one.
    """

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


#: A per-call identity that makes a re-sent write recognisable (not a secret).
new_nonce = _NonceSource()
os.register_at_fork(after_in_child=new_nonce.reseed)
