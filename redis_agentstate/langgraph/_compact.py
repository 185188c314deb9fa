"""The compact stored forms of a checkpoint record, a pending write and a shared value: no I/O.

A checkpoint record was ``msgpack [parent, ck_kind, ck_data, md_kind, md_data]``,
the checkpoint (less its channel values and versions) serialized by the saver's
serde. With LangGraph's own serializer and a checkpoint of plain fields, it is
now ``msgpack [2, parent, v, ts, versions_seen, updated_channels, md_kind, md_data]``:

- a channel in ``versions_seen`` (stored as a flat list ``[node, [channel, version, ...], ...]``) or
  in ``updated_channels`` is its place in the record's list of blob fields, when it is there;

- the checkpoint's ``id`` is not stored: it is the checkpoint's member in the index;
- ``parent`` is 16 bytes for a UUID in its canonical text form (what LangGraph mints);
- ``ts`` is microseconds since the epoch when that gives back the exact text;
- ``md_kind`` is nil for ``msgpack``, and 0 for plain metadata (msgpack's own types) with
  LangGraph's ``source``, ``step`` and ``parents``, stored as ``[source, step, parents, the rest]``.

Anything else (another serde, such as ``EncryptedSerializer``, which must see the whole
record; a field LangGraph may add) keeps the first form, and both are read back.

A pending write was ``msgpack [task, idx, path, channel, kind, data]``; its task and
index are already in its entry's key (``<task>\\0<idx>``, see ``_lg.lua``), so it is
now ``msgpack [path, channel, kind, data]``, and a task id that is a UUID is its 16 bytes in
the key (see ``write_key``). A write or channel value whose stored
form is at least ``SHARE_BYTES`` long (with another serializer than LangGraph's own, longer than
``DEFER_BYTES``) is stored once per thread, under the field
``\\0\\0`` + its 16-byte BLAKE2b digest in the thread's value hash, and referenced:
a channel value as ``R`` + digest, a write as ``R`` + digest + ``msgpack [path, channel]``.
The scripts resolve a reference before replying (a write as ``X<n>:`` + the n bytes of
the shared value + the rest), so a reader sees full values only.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import msgpack

__all__ = [
    "COMPACT",
    "DEFER_BYTES",
    "SHARE_BYTES",
    "SHARE_BYTES_OTHER_SERDE",
    "compact_record",
    "expand_record",
    "pack_write",
    "share_field",
    "task_of_key",
    "unpack_write",
    "write_key",
]

#: The format tag of a compact record (a legacy record starts with its parent: a str or nil).
COMPACT = 2
#: md_kind of a compact record whose metadata is plain: ``[source, step, parents, the rest or nil]``.
PLAIN_METADATA = 0
#: Values (and writes) at least this long are stored once per thread and referenced. Below it a
#: reference and the shared entry's own overhead (about 100 bytes in Redis) cost more than a copy.
SHARE_BYTES = 512
#: ``_lg.lua``'s DEFER_BYTES: a shared value longer than this is named in a script's reply, never
#: copied through it (tests/test_langgraph_storage.py checks the two agree).
DEFER_BYTES = 65536
#: Where a serializer other than LangGraph's own (``EncryptedSerializer``) has its values and writes
#: stored apart and referenced: only past DEFER_BYTES, so that a long one is never copied through a
#: script either. Its equal values encrypt differently, so nothing below that would be shared: a
#: reference and a second entry would only cost bytes.
SHARE_BYTES_OTHER_SERDE = DEFER_BYTES + 1
#: The prefix of a shared value's field: no blob field starts with it (channels are never empty).
SHARED_PREFIX = b"\0\0"
REF = b"R"
RESOLVED = b"X"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
_BODY_KEYS = frozenset({"v", "id", "ts", "versions_seen", "updated_channels"})


def share_field(stored: bytes) -> bytes:
    """The field of the thread's value hash that holds ``stored`` once (see the module docstring)."""
    return SHARED_PREFIX + hashlib.blake2b(stored, digest_size=16).digest()


def _ts_us(ts: object) -> int | None:
    if type(ts) is not str:
        return None
    try:
        dt = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if dt.tzinfo is None or dt.utcoffset() != timedelta(0) or dt.isoformat() != ts:
        return None
    return (dt - _EPOCH) // _US


def _uuid_bytes(text: str | None) -> bytes | str | None:
    """The 16 bytes of a UUID in its canonical text form (lowercase 8-4-4-4-12, what ``str(UUID)``
    gives), else ``text`` itself. Without building a ``uuid.UUID``: this runs for every checkpoint
    and pending write."""
    if text is None:
        return None
    if len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-":
        digits = text.replace("-", "")
        # 32 characters left: no other dash; lowercase, and fromhex takes 16 bytes: hex only (it
        # would skip whitespace and yield fewer).
        if len(digits) == 32 and digits == digits.lower():
            try:
                raw = bytes.fromhex(digits)
            except ValueError:
                return text
            if len(raw) == 16:
                return raw
    return text


def _plain_versions(seen: object) -> bool:
    if type(seen) is not dict:
        return False
    for node, versions in seen.items():
        if type(node) is not str or type(versions) is not dict:
            return False
        for ch, v in versions.items():
            if type(ch) is not str or type(v) not in (str, int, float):
                return False
    return True


def _seen_list(seen: dict[str, dict[str, Any]], at: dict[str, int]) -> list[Any]:
    return [
        x
        for node, versions in seen.items()
        for x in (node, [y for ch, v in versions.items() for y in (at.get(ch, ch), v)])
    ]


def _channel_at(ref: object, channels: list[str]) -> str | None:
    if type(ref) is str:
        return ref
    if type(ref) is int and 0 <= ref < len(channels):
        return channels[ref]
    return None


def _seen_dict(flat: object, channels: list[str]) -> dict[str, dict[str, Any]] | None:
    if type(flat) is not list or len(flat) % 2:
        return None
    out: dict[str, dict[str, Any]] = {}
    for node, pairs in zip(flat[::2], flat[1::2], strict=True):
        if type(node) is not str or type(pairs) is not list or len(pairs) % 2:
            return None
        versions: dict[str, Any] = {}
        for ref, v in zip(pairs[::2], pairs[1::2], strict=True):
            ch = _channel_at(ref, channels)
            if ch is None or type(v) not in (str, int, float):
                return None
            versions[ch] = v
        out[node] = versions
    return out


_PLAIN_SCALARS = (str, int, float, bool, type(None))
_MD_KEYS = ("source", "step", "parents")


def _plain(value: object, depth: int = 0) -> bool:
    """True for a value raw msgpack gives back exactly (as LangGraph's serializer would)."""
    if type(value) in _PLAIN_SCALARS:
        return True
    if depth > 32:
        return False
    if type(value) is list:
        return all(_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


def _plain_metadata(md: dict[str, Any]) -> list[Any] | None:
    """``[source, step, parents, the other keys or nil]`` of plain metadata with LangGraph's three keys."""
    if not all(k in md for k in _MD_KEYS) or not _plain(md):
        return None
    rest = {k: v for k, v in md.items() if k not in _MD_KEYS}
    return [md["source"], md["step"], md["parents"], rest or None]


def compact_record(
    parent: str | None,
    cid: str,
    body: dict[str, Any],
    md: dict[str, Any],
    md_typed: Callable[[], tuple[str, bytes]],
    channels: list[str],
) -> bytes | None:
    """The compact record of a checkpoint body (no channel values or versions), or None if it has
    fields this form does not carry exactly (the caller then stores the serde's form).

    ``channels``: the channels of the record's list of blob fields, in its order. A channel name in
    ``versions_seen`` or ``updated_channels`` is stored as its place in that list when it is there.
    ``md_typed``: the serde's ``(kind, data)`` of the metadata, asked for only when it is not plain.
    """
    if not set(body) <= _BODY_KEYS or not {"v", "id", "ts", "versions_seen"} <= set(body):
        return None
    if body["id"] != cid or type(body["v"]) is not int or not _plain_versions(body["versions_seen"]):
        return None
    at = {ch: i for i, ch in enumerate(channels)}
    updated = body.get("updated_channels", False)
    if updated is not None and updated is not False:
        if type(updated) is not list or not all(type(c) is str for c in updated):
            return None
        updated = [at.get(c, c) for c in updated]
    ts_us = _ts_us(body["ts"])
    ts = body["ts"] if ts_us is None else ts_us
    if type(ts) not in (str, int):
        return None
    plain_md = _plain_metadata(md)
    kind: str | int | None
    data: Any
    if plain_md is not None:
        kind, data = PLAIN_METADATA, plain_md
    else:
        md_kind, data = md_typed()
        kind = None if md_kind == "msgpack" else md_kind
    seen = _seen_list(body["versions_seen"], at)
    fields = [COMPACT, _uuid_bytes(parent), body["v"], ts, seen, updated, kind, data]
    return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]


def expand_record(
    fields: list[Any], cid: str, channels: list[str]
) -> tuple[str | None, dict[str, Any], str | None, Any] | None:
    """``(parent, checkpoint body, md_kind, md_data)`` of a compact record's fields (``channels``: as
    ``compact_record`` had them), None if malformed. ``md_kind`` None: ``md_data`` is the metadata."""
    if len(fields) != 8:
        return None
    _, parent, v, ts, flat, updated, md_kind, md_data = fields
    seen = _seen_dict(flat, channels)
    if isinstance(parent, bytes):
        if len(parent) != 16:
            return None
        parent = str(uuid.UUID(bytes=parent))
    if not isinstance(parent, (str, type(None))) or type(v) is not int or seen is None:
        return None
    if type(ts) is int:
        try:
            ts = (_EPOCH + ts * _US).isoformat()
        except OverflowError:
            return None
    if type(ts) is not str:
        return None
    if md_kind == PLAIN_METADATA and type(md_kind) is int:
        if type(md_data) is not list or len(md_data) != 4 or not isinstance(md_data[3], (dict, type(None))):
            return None
        metadata = dict(zip(_MD_KEYS, md_data[:3], strict=True))
        metadata.update(md_data[3] or {})
        md_kind, md_data = None, metadata
    elif isinstance(md_kind, str) or md_kind is None:
        md_kind = "msgpack" if md_kind is None else md_kind
    else:
        return None
    body: dict[str, Any] = {"v": v, "id": cid, "ts": ts, "versions_seen": seen}
    if updated is not False:
        if updated is not None:
            if type(updated) is not list:
                return None
            updated = [_channel_at(c, channels) for c in updated]
            if None in updated:
                return None
        body["updated_channels"] = updated
    return parent, body, md_kind, md_data


def write_key(task: str, idx: int) -> bytes:
    """The key of a write in its checkpoint's packed writes: ``<task>\\0<idx>``, or ``\\0`` + the 16
    bytes of a task id that is a canonical UUID (LangGraph's) + ``\\0<idx>`` (no task id holds a NUL)."""
    raw = _uuid_bytes(task)
    if isinstance(raw, bytes):
        return b"\0" + raw + b"\0%d" % idx
    return b"%s\0%d" % (task.encode(), idx)


def task_of_key(key: bytes) -> tuple[str, int] | None:
    """``(task, idx)`` of a write's key (either form of ``write_key``), None if malformed."""
    if key[:1] == b"\0":
        if len(key) < 19 or key[17:18] != b"\0":
            return None
        task, idx = str(uuid.UUID(bytes=key[1:17])), key[18:]
    else:
        text, sep, idx = key.rpartition(b"\0")
        if not sep:
            return None
        try:
            task = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not idx.lstrip(b"-").isdigit():
        return None
    return task, int(idx)


def pack_write(path: str, channel: str, kind: str, data: bytes, shared: bytes | None) -> bytes:
    """A pending write in its compact form; ``shared`` (the ``share_field`` of its stored value) when it is
    shared: the write is then a reference to it."""
    if shared is not None:
        return REF + shared[len(SHARED_PREFIX) :] + cast(bytes, msgpack.packb([path, channel]))
    return msgpack.packb([path, channel, None if kind == "msgpack" else kind, data], use_bin_type=True)  # type: ignore[no-any-return]


def unpack_write(raw: bytes, key_task: str, key_idx: int) -> tuple[str, int, str, str, Any, Any] | None:
    """``(task, idx, path, channel, kind, data)`` of a stored write (any of its forms, a reference as the
    script resolved it), None if malformed. ``kind`` None: ``data`` is a shared value's stored form."""
    if raw[:1] == RESOLVED:
        colon = raw.find(b":", 1, 12)
        if colon < 2 or not raw[1:colon].isdigit():
            return None
        n = int(raw[1:colon])
        shared, rest = raw[colon + 1 : colon + 1 + n], raw[colon + 1 + n :]
        if len(shared) != n:
            return None
        head = msgpack.unpackb(rest, raw=False)
        if not isinstance(head, list) or len(head) != 2:
            return None
        return key_task, key_idx, head[0], head[1], None, shared
    fields = msgpack.unpackb(raw, raw=False)
    if not isinstance(fields, list):
        return None
    if len(fields) == 6:
        task, idx, path, channel, kind, data = fields
        return task, idx, path, channel, kind, data
    if len(fields) == 4:
        path, channel, kind, data = fields
        return key_task, key_idx, path, channel, "msgpack" if kind is None else kind, data
    return None
