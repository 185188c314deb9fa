"""The stored forms of a LangGraph thread, framed and read back: no I/O, no serializer.

A stored checkpoint is ``<n>:`` + n bytes (its list of blob fields, each ``<m>:`` + m
bytes) + its msgpack record; a checkpoint's pending writes are packed the same way
(see ``_lg.lua``); a blob is ``F`` + a full value or ``T<n>:<base version>`` + a list
tail. Every length read back from Redis is checked before it is used, and a stored
value that breaks the framing is ``CorruptState`` naming its key. ``_Remembered`` is
what the saver keeps of the last list it stored, to write the next one as a tail.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import MAX_ID_BYTES
from ..wire import corrupt_state

SEP = "\0"

_FULL = b"F"
_TAIL = b"T"


def _fields(fields: Iterable[str]) -> bytes:
    return b"".join(b"%d:%s" % (len(f.encode()), f.encode()) for f in fields)


def _length_at(data: bytes, i: int) -> tuple[int, int] | None:
    """``(n, start)`` for the '<n>:' at ``data[i]`` (``start``: after its colon), or None.

    None unless n is decimal digits whose n bytes are all in ``data``: every length read
    from Redis is checked before use, so a corrupt one (``-3:``) cannot make a parser
    step back and loop.
    """
    colon = data.find(b":", i, i + 11)
    if colon <= i or not data[i:colon].isdigit():
        return None
    n = int(data[i:colon])
    return (n, colon + 1) if colon + 1 + n <= len(data) else None


def _unpack_writes(packed: bytes, key: str) -> list[tuple[bytes, bytes]]:
    """The (entry key, write) pairs of a checkpoint's packed value: '<n>:<task_id>\\0<idx><m>:<write>'
    each (see _lg.lua)."""
    if not isinstance(packed, bytes):
        raise corrupt_state(key, [key], "holds malformed pending writes")
    out: list[tuple[bytes, bytes]] = []
    i = 0
    while i < len(packed):
        head = _length_at(packed, i)
        write = head and _length_at(packed, head[1] + head[0])
        if not head or not write:
            raise corrupt_state(key, [key], f"holds malformed pending writes (at byte {i})")
        n, start = write
        out.append((packed[head[1] : head[1] + head[0]], packed[start : start + n]))
        i = start + n
    return out


def _held_writes(stored: bytes, key: str) -> tuple[bytes, int]:
    """The packed pending writes a stored checkpoint holds (b"" if none) and where its record starts:
    after its list of blob fields comes 'W<k>:' + k bytes of writes, in a checkpoint stored in the
    index (see _lg.lua). A record is msgpack, so it never starts with 'W'."""
    head = _length_at(stored, 0) if isinstance(stored, bytes) else None
    if head is None:
        raise corrupt_state(key, [key], "holds a malformed checkpoint (its list of blob fields)")
    at = head[1] + head[0]
    if stored[at : at + 1] != b"W":
        return b"", at
    held = _length_at(stored, at + 1)
    if held is None:
        raise corrupt_state(key, [key], "holds a malformed checkpoint (the pending writes it holds)")
    return stored[held[1] : held[1] + held[0]], held[1] + held[0]


def _reads_and_body(stored: bytes, key: str) -> tuple[list[bytes], bytes]:
    """The blob fields a stored checkpoint reads and its msgpack record (see _lg.lua)."""
    head = _length_at(stored, 0) if isinstance(stored, bytes) else None
    if head is None:
        raise corrupt_state(key, [key], "holds a malformed checkpoint (its list of blob fields)")
    n, start = head
    body_at = _held_writes(stored, key)[1]
    reads, body, fields, i = stored[start : start + n], stored[body_at:], [], 0
    while i < len(reads):
        one = _length_at(reads, i)
        if one is None:
            raise corrupt_state(key, [key], "holds a malformed checkpoint (its list of blob fields)")
        fields.append(reads[one[1] : one[1] + one[0]])
        i = one[1] + one[0]
    return fields, body


def _stored_text(value: Any, key: str, what: str) -> str:
    """An id or field name read from ``key``: UTF-8, as every one the library stores."""
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise corrupt_state(key, [key], f"holds {what} that is not UTF-8: {value!r:.80}") from exc


def _entry_member(value: Any) -> Any:
    """The member of an index entry: '<ns>\\0<cid>', before the stored checkpoint an entry of this
    version's layout goes on with (see _lg.lua)."""
    if isinstance(value, bytes):
        first = value.find(b"\0")
        second = value.find(b"\0", first + 1) if first >= 0 else -1
        return value if second < 0 else value[:second]
    return value


def _stored_member(value: Any, key: str) -> tuple[str, str]:
    """The (ns, checkpoint id) of a member '<ns>\\0<cid>' read from ``key``."""
    ns, sep, cid = _stored_text(value, key, "a checkpoint member").partition(SEP)
    if not sep or not cid or SEP in cid:
        raise corrupt_state(key, [key], f"holds a checkpoint member that is not '<ns>\\0<id>': {value!r:.80}")
    return ns, cid


def _foreign_id(text: str) -> bool:
    """True for an id the library never stores (``_ident`` refuses it)."""
    return not text or SEP in text or len(text.encode()) > MAX_ID_BYTES


def _stored_id(value: Any, key: str) -> str:
    """A thread id read from shard index ``key``: one the library could have stored."""
    text = _stored_text(value, key, "an id")
    if _foreign_id(text):
        raise corrupt_state(key, [key], f"holds an id the library does not store: {value!r:.80}")
    return text


_IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None)})


def _snapshot(items: Sequence[Any]) -> list[Any] | None:
    """Copies of ``items`` that a later in-place change of the graph's objects cannot reach (None: not copyable)."""
    try:
        return [x if type(x) in _IMMUTABLE else copy.deepcopy(x) for x in items]
    except Exception:
        return None


def _same_prefix(snapshot: list[Any], value: list[Any]) -> bool:
    """True if ``value`` starts with exactly the items of ``snapshot``.

    Compared by value against the snapshot, not by identity: a node that changed an old
    message in place must get a full copy stored, or the stored history would miss it.
    """
    for a, b in zip(snapshot, value):  # noqa: B905 - value is at least as long
        if a is b and type(a) in _IMMUTABLE:
            continue
        try:
            if not bool(a == b):
                return False
        except Exception:  # e.g. arrays without a truth value: store the value in full
            return False
    return True


@dataclass
class _Remembered:
    """The last list this saver stored for one channel of one thread, for the next tail."""

    version: str
    items: list[Any]
    #: Tails since the last anchor (0: this version is an anchor or a full value).
    depth: int
    #: The last anchor (or full value): its version and how many items it holds.
    anchor_version: str
    anchor_len: int
    #: Anchors since the last full value.
    anchors: int


class _Empty:
    """A channel listed in new_versions without a value (LangGraph's 'empty' blob)."""


_EMPTY = _Empty()
