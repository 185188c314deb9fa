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
- ``md_kind`` is nil for ``msgpack``.

Anything else (another serde, such as ``EncryptedSerializer``, which must see the whole
record; a field LangGraph may add) keeps the first form, and both are read back.

A pending write was ``msgpack [task, idx, path, channel, kind, data]``; its task and
index are already in its entry's key (``<task>\\0<idx>``, see ``_lg.lua``), so it is
now ``msgpack [path, channel, kind, data]``. A write or channel value whose stored
form is at least ``SHARE_BYTES`` long is stored once per thread, under the field
``\\0\\0`` + its 16-byte BLAKE2b digest in the thread's value hash, and referenced:
a channel value as ``R`` + digest, a write as ``R`` + digest + ``msgpack [path, channel]``.
The scripts resolve a reference before replying (a write as ``X<n>:`` + the n bytes of
the shared value + the rest), so a reader sees full values only.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import msgpack

__all__ = [
    "COMPACT",
    "SHARE_BYTES",
    "compact_record",
    "expand_record",
    "pack_write",
    "share_field",
    "unpack_write",
]

#: The format tag of a compact record (a legacy record starts with its parent: a str or nil).
COMPACT = 2
#: Values (and writes) at least this long are stored once per thread and referenced. Below it a
#: reference and the shared entry's own overhead (about 100 bytes in Redis) cost more than a copy.
SHARE_BYTES = 512
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
    if text is None:
        return None
    try:
        u = uuid.UUID(text)
    except ValueError:
        return text
    return u.bytes if str(u) == text else text


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


def compact_record(
    parent: str | None, cid: str, body: dict[str, Any], md_kind: str, md_data: bytes, channels: list[str]
) -> bytes | None:
    """The compact record of a checkpoint body (no channel values or versions), or None if it has
    fields this form does not carry exactly (the caller then stores the serde's form).

    ``channels``: the channels of the record's list of blob fields, in its order. A channel name in
    ``versions_seen`` or ``updated_channels`` is stored as its place in that list when it is there.
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
    kind = None if md_kind == "msgpack" else md_kind
    seen = _seen_list(body["versions_seen"], at)
    fields = [COMPACT, _uuid_bytes(parent), body["v"], ts, seen, updated, kind, md_data]
    return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]


def expand_record(
    fields: list[Any], cid: str, channels: list[str]
) -> tuple[str | None, dict[str, Any], str, Any] | None:
    """``(parent, checkpoint body, md_kind, md_data)`` of a compact record's fields (``channels``: as
    ``compact_record`` had them), None if malformed."""
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
    if type(ts) is not str or not isinstance(md_kind, (str, type(None))):
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
    return parent, body, "msgpack" if md_kind is None else md_kind, md_data


def pack_write(path: str, channel: str, kind: str, data: bytes, stored_value: bytes | None) -> bytes:
    """A pending write in its compact form; ``stored_value`` (``F`` + msgpack [kind, data]) when it is
    shared: the write is then a reference to it."""
    if stored_value is not None:
        return REF + share_field(stored_value)[len(SHARED_PREFIX) :] + cast(bytes, msgpack.packb([path, channel]))
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
