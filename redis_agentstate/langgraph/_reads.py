"""The saver's reads: ``get_tuple``, and a stored checkpoint rebuilt as a ``CheckpointTuple``.

A channel value is read back from its blob chain (newest first): a full value, or
a full list plus the tails stored since. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import msgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, writes_sort_key

from ..wire import Call, Command, Op, corrupt_state
from ._base import SaverBase, _config, _configurable, _ident, _ns, thread_of
from ._compact import SHARED_PREFIX, task_of_key, unpack_write
from ._records import _EMPTY, _FULL, _TAIL, SEP, _length_at, _stored_member, _stored_text, _unpack_writes
from .scripts import LG_GET

__all__ = ["READ_TRIES", "SaverReads"]

#: Reads of a checkpoint whose long shared value vanished between its script and its HMGET (a prune
#: or delete ran in between) before the reader calls it corrupt.
READ_TRIES = 5
_DEFERRED_WRITE = b"Y"


def _deferred_field(item: list[Any], key: str) -> bytes:
    """The field of a ``[field, length]`` a chain names instead of a long shared value."""
    if len(item) != 2 or not isinstance(item[0], bytes) or not item[0].startswith(SHARED_PREFIX) or len(item[0]) != 18:
        raise corrupt_state(key, [key], f"names a shared value of the wrong shape: {item!r:.80}")
    return item[0]


class SaverReads:
    """Reading one checkpoint back, with its channel values and pending writes (a part of ``SaverCore``)."""

    def __init__(self, base: SaverBase) -> None:
        self.base = base

    def get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        conf = _configurable(config)
        tid = thread_of(config)
        ns = _ns(conf.get("checkpoint_ns"))
        cid = conf.get("checkpoint_id")
        cid = "" if cid is None else _ident(cid, "checkpoint_id")
        ttl = self.base.ttl_arg() if self.base.refresh_on_read else ""
        reply = yield from self.read_checkpoint(tid, ns, cid, ttl)
        return self.checkpoint_tuple(tid, reply) if reply else None

    def read_checkpoint(self, tid: str, ns: str, cid: str, ttl: str = "") -> Op[Any]:
        """``lg_get``'s reply for one checkpoint (``cid`` '': the newest of ``ns``), its long shared
        values read in (see ``fetch_deferred``), or None if there is no such checkpoint."""
        for _ in range(READ_TRIES):
            reply = yield Call(LG_GET, self.base.thread_keys(tid), [ns, cid, ttl])
            if not reply:
                return None
            if (yield from self.fetch_deferred(tid, [reply])):
                return reply
        keys = self.base.thread_key_set(tid)
        raise corrupt_state(keys.blobs, [keys.blobs], f"lost a shared value under {READ_TRIES} reads in a row")

    def fetch_deferred(self, tid: str, replies: Sequence[Any]) -> Op[bool]:
        """Read in, with one HMGET, the shared values too long to come through a script that checkpoint
        replies name (a chain's ``[field, length]``, a write's ``Y`` + field; see ``_lg.lua``), in
        place; False if one is gone (the thread changed under the read: read it again)."""
        keys = self.base.thread_key_set(tid)
        wanted: dict[bytes, bytes | None] = {}
        writes: list[tuple[Any, list[tuple[bytes, bytes]]]] = []
        for reply in replies:
            if not reply:
                continue
            for chain in reply[2][1::2]:
                if isinstance(chain, list):
                    for item in chain:
                        if isinstance(item, list):
                            wanted[_deferred_field(item, keys.blobs)] = None
            if b"Y" in reply[3]:
                entries = _unpack_writes(reply[3], keys.writes)
                if any(w[:1] == _DEFERRED_WRITE for _, w in entries):
                    writes.append((reply, entries))
                    for _, w in entries:
                        if w[:1] == _DEFERRED_WRITE:
                            wanted[w[1 : 1 + len(SHARED_PREFIX) + 16]] = None
        if not wanted:
            return True
        fields = list(wanted)
        values = yield Command(["HMGET", keys.blobs, *fields])
        if any(v is None for v in values):
            return False
        got = dict(zip(fields, values, strict=True))
        for reply in replies:
            if not reply:
                continue
            for chain in reply[2][1::2]:
                if isinstance(chain, list):
                    chain[:] = [got[item[0]] if isinstance(item, list) else item for item in chain]
        for reply, entries in writes:
            packed = []
            for key, w in entries:
                if w[:1] == _DEFERRED_WRITE:
                    n = 1 + len(SHARED_PREFIX) + 16
                    value = got[w[1:n]]
                    w = b"X%d:%s%s" % (len(value), value, w[n:])
                packed.append(b"%d:%s%d:%s" % (len(key), key, len(w), w))
            reply[3] = b"".join(packed)
        return True

    def checkpoint_tuple(self, tid: str, reply: Sequence[Any]) -> CheckpointTuple:
        keys = self.base.thread_key_set(tid)
        ns, cid = _stored_member(reply[0], keys.index)
        # Where the script found the record and the writes (KEYS indexes: an error names the key).
        at = {2: keys.records, 3: keys.index, 5: keys.writes}
        records = at.get(int(reply[4]), keys.index) if len(reply) > 5 else keys.records
        writes_key = at.get(int(reply[5]), keys.writes) if len(reply) > 5 else keys.writes
        parent, checkpoint, metadata = self.base.record(reply[1], records, cid)
        values: dict[str, Any] = {}
        blobs = reply[2]
        rebuilt: dict[str, str] = {}
        for i in range(0, len(blobs), 2):
            parts = _stored_text(blobs[i], records, "a blob field").split(SEP)
            if len(parts) != 3:
                raise corrupt_state(records, [records], f"reads a malformed blob field {blobs[i]!r:.80}")
            _, ch, version = parts
            rebuilt[ch] = version
            chain = blobs[i + 1]
            if chain:
                value = self._rebuild(chain, keys.blobs)
                if value is not _EMPTY:
                    values[ch] = value
        writes = []
        for entry, raw in _unpack_writes(reply[3], writes_key):
            task_idx = task_of_key(entry)
            if task_idx is None:
                raise corrupt_state(
                    writes_key, [writes_key], f"holds a pending write key of the wrong shape: {entry!r:.80}"
                )
            try:
                write = unpack_write(raw, *task_idx)
            except Exception as exc:
                raise corrupt_state(writes_key, [writes_key], f"holds a malformed pending write: {exc}") from exc
            if write is None:
                raise corrupt_state(writes_key, [writes_key], "holds a pending write of the wrong shape")
            task, idx, path, channel, kind, data = write
            if not (
                isinstance(task, str)
                and isinstance(path, str)
                and isinstance(channel, str)
                and isinstance(idx, int)
                and not isinstance(idx, bool)
            ):
                raise corrupt_state(writes_key, [writes_key], "holds a pending write of the wrong shape")
            if kind is None:
                if not isinstance(data, bytes) or data[:1] != _FULL:
                    raise corrupt_state(keys.blobs, [keys.blobs], "holds a shared value that is not a full value")
                value = self._value(data[1:], keys.blobs)
            else:
                value = self.base.load_value(kind, data, writes_key, "a pending write")
            writes.append((writes_sort_key(path, task, idx), (task, channel, value)))
        writes.sort(key=lambda w: w[0])
        if "channel_versions" not in checkpoint:
            checkpoint["channel_versions"] = rebuilt
        return CheckpointTuple(
            config=_config(tid, ns, cid),
            checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
            metadata=metadata,
            parent_config=_config(tid, ns, parent) if parent else None,
            pending_writes=[w for _, w in writes],
        )

    def _rebuild(self, chain: Sequence[bytes], key: str) -> Any:
        """The value of a blob chain (newest first): a full value, or a full list plus its tails."""
        root = chain[-1]
        if root[:1] != _FULL:
            raise corrupt_state(key, [key], "holds a list tail whose base version is missing")
        value = self._value(root[1:], key)
        if len(chain) == 1:
            return value
        if type(value) is not list:
            raise corrupt_state(key, [key], "holds a list tail on a value that is not a list")
        items = list(value)
        for piece in reversed(chain[:-1]):
            base = _length_at(piece, 1) if piece[:1] == _TAIL else None
            if base is None:
                raise corrupt_state(key, [key], "holds a malformed value in a tail chain")
            tail = self._value(piece[base[1] + base[0] :], key)
            if type(tail) is not list:
                raise corrupt_state(key, [key], "holds a list tail that is not a list")
            items.extend(tail)
        return items

    def _value(self, blob: bytes, key: str) -> Any:
        try:
            kind, data = msgpack.unpackb(blob, raw=False)
        except Exception as exc:
            raise corrupt_state(key, [key], f"holds a value that is not a serialized channel value: {exc}") from exc
        if kind == "empty":
            return _EMPTY
        return self.base.load_value(kind, data, key, "a channel value")
