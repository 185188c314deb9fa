"""The saver's writes: ``put`` (a checkpoint, and the blobs of the channels it bumped) and ``put_writes``.

A list channel that grew since the version this saver last wrote is sent as its
new items only, a tail naming its base (see ``_core`` and ``_records``); a put the
script refuses because a tail's base is gone is sent again with that value in full.
Nothing here does I/O.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)

from ..core.replies import text as reply_text
from ..errors import InvalidArgument
from ..wire import Call, Op
from ..wire.scripts import Reply
from ._base import SaverBase, _config, _configurable, _ident, _ns, thread_of
from ._compact import REF, SHARED_PREFIX, compact_record, pack_write, share_field, write_key
from ._records import _FULL, _TAIL, SEP, _fields, _Remembered, _same_prefix, _snapshot
from .scripts import LG_PUT, LG_PUT_WRITES

__all__ = ["SaverWrites"]

#: Tails between anchors, and anchors between full copies, of a list channel (see ``_core``).
TAIL_CHAIN = 64
#: Threads x channels whose last written list this saver remembers (to store tails).
TAIL_CACHE = 4096


class SaverWrites:
    """Checking, framing and sending a checkpoint and its pending writes (a part of ``SaverCore``)."""

    def __init__(self, base: SaverBase) -> None:
        self.base = base

    # ---- put ------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Op[RunnableConfig]:
        conf = _configurable(config)
        tid = thread_of(config)
        ns = _ns(conf.get("checkpoint_ns"))
        parent = conf.get("checkpoint_id")
        parent = None if parent is None else _ident(parent, "checkpoint_id")
        if not isinstance(checkpoint, Mapping) or "id" not in checkpoint:
            raise InvalidArgument(f"checkpoint must be a Checkpoint dict with an 'id', got {checkpoint!r:.120}")
        cid = _ident(checkpoint["id"], "checkpoint id")
        values: dict[str, Any] = dict(checkpoint.get("channel_values") or {})
        body = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        versions = dict(checkpoint.get("channel_versions") or {})
        if versions and all(isinstance(v, str) for v in versions.values()):
            # Rebuilt on read from the list of blob fields, which names each channel and version:
            # stored once, not twice (a large share of a checkpoint's bytes).
            del body["channel_versions"]
        md = get_serializable_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        run = "" if run_id is None else _ident(run_id, "metadata run_id")
        record = None
        if self.base.plain_serde:
            record = compact_record(
                parent, cid, body, dict(md), lambda: self.base.typed(md, "the checkpoint metadata"), list(versions)
            )
        if record is None:
            md_kind, md_data = self.base.typed(md, "the checkpoint metadata")
            ck_kind, ck_data = self.base.typed(body, "the checkpoint")
            record = msgpack.packb([parent, ck_kind, ck_data, md_kind, md_data], use_bin_type=True)
        reads = [f"{ns}{SEP}{self._channel(ch)}{SEP}{self._version(v)}" for ch, v in versions.items()]
        blobs: list[tuple[str, bytes, tuple[str, str, str], _Remembered | None]] = []
        for ch, v in new_versions.items():
            version = self._version(v)
            fld = f"{ns}{SEP}{self._channel(ch)}{SEP}{version}"
            if ch not in values:
                # LangGraph's "empty" blob: read back exactly as a missing one (no value), so not stored.
                self._remember((tid, ns, ch), None)
                continue
            value, remembered = self._blob(tid, ns, ch, version, values)
            blobs.append((fld, value, (tid, ns, ch), remembered))
        keys = self.base.thread_keys(tid)
        reads_list = _fields(reads)
        stored = b"%d:" % len(reads_list) + reads_list + record
        parent_member = "" if parent is None else f"{ns}{SEP}{parent}"
        head = [tid, self.base.token_of(tid), self.base.ttl_arg(), f"{ns}{SEP}{cid}", stored, run, parent_member]
        while True:
            reply = yield Call(LG_PUT, keys, [*head, *self._blob_pairs(blobs)])
            if int(reply[0]) == Reply.REFUSED and reply_text(reply[1]) == "base":
                # The base of a tail is gone (pruned, deleted): store those values in full.
                missing = reply_text(reply[2])
                blobs = [self._full_again(b) if b[0] == missing else b for b in blobs]
                continue
            break
        self.base.fenced(reply, tid, "put")
        for _, _, cache_key, remembered in blobs:
            self._remember(cache_key, remembered)
        return _config(tid, ns, cid)

    def _blob_pairs(self, blobs: list[tuple[str, bytes, tuple[str, str, str], _Remembered | None]]) -> list[Any]:
        """The blob field, value pairs of a put: a long full value as a reference, then the shared
        values (each once) the references name."""
        pairs: list[Any] = []
        shared: dict[bytes, bytes] = {}
        share_bytes = self.base.share_bytes
        for fld, value, _, _ in blobs:
            if value[:1] == _FULL and len(value) >= share_bytes:
                f = share_field(value)
                shared[f] = value
                value = REF + f[len(SHARED_PREFIX) :]
            pairs += [fld, value]
        for f, value in shared.items():
            pairs += [f, value]
        return pairs

    @staticmethod
    def _channel(ch: object) -> str:
        if not isinstance(ch, str) or not ch or SEP in ch:
            raise InvalidArgument(f"channel names must be non-empty str without NUL, got {ch!r:.80}")
        return ch

    @staticmethod
    def _version(v: object) -> str:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise InvalidArgument(f"channel versions must be str, int or float, got {v!r:.80}")
        text = str(v)
        if SEP in text or not text:
            raise InvalidArgument(f"channel version {text!r:.80} is empty or contains NUL")
        return text

    def _blob(
        self, tid: str, ns: str, ch: str, version: str, values: Mapping[str, Any]
    ) -> tuple[bytes, _Remembered | None]:
        """The stored form of channel ``ch`` at ``version``: full, or the tail of the list last stored."""
        value = values[ch]
        if type(value) is not list:
            return _FULL + self.base.dumps(value), None
        prev = self.base.lists.get((tid, ns, ch))
        n = 0 if prev is None else len(prev.items)
        if prev is not None and prev.version != version and len(value) >= n and _same_prefix(prev.items, value):
            added = _snapshot(value[n:])
            items = None if added is None else prev.items + added
            if prev.depth + 1 < TAIL_CHAIN:
                tail = self._tail(prev.version, value[n:])
                return tail, None if items is None else _Remembered(
                    version, items, prev.depth + 1, prev.anchor_version, prev.anchor_len, prev.anchors
                )
            if prev.anchors + 1 < TAIL_CHAIN:
                # A new anchor: everything since the previous anchor, so later reads skip the small tails.
                tail = self._tail(prev.anchor_version, value[prev.anchor_len :])
                return tail, None if items is None else _Remembered(
                    version, items, 0, version, len(value), prev.anchors + 1
                )
        snap = _snapshot(value)
        full = _FULL + self.base.dumps(value)
        return full, None if snap is None else _Remembered(version, snap, 0, version, len(value), 0)

    def _tail(self, base: str, items: list[Any]) -> bytes:
        b = base.encode()
        return _TAIL + b"%d:%s" % (len(b), b) + self.base.dumps(items)

    def _full_again(
        self, blob: tuple[str, bytes, tuple[str, str, str], _Remembered | None]
    ) -> tuple[str, bytes, tuple[str, str, str], _Remembered | None]:
        fld, _, cache_key, remembered = blob
        assert remembered is not None  # only tails have a base
        self.base.lists.pop(cache_key, None)
        return (
            fld,
            _FULL + self.base.dumps(remembered.items),
            cache_key,
            _Remembered(remembered.version, remembered.items, 0, remembered.version, len(remembered.items), 0),
        )

    def _remember(self, cache_key: tuple[str, str, str], remembered: _Remembered | None) -> None:
        if remembered is None:
            self.base.lists.pop(cache_key, None)
            return
        self.base.lists[cache_key] = remembered
        self.base.lists.move_to_end(cache_key)
        while len(self.base.lists) > TAIL_CACHE:
            self.base.lists.popitem(last=False)

    # ---- put_writes -----------------------------------------------------

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> Op[None]:
        conf = _configurable(config)
        tid = thread_of(config)
        ns = _ns(conf.get("checkpoint_ns"))
        if conf.get("checkpoint_id") is None:
            raise InvalidArgument("put_writes needs config['configurable']['checkpoint_id']")
        cid = _ident(conf["checkpoint_id"], "checkpoint_id")
        task = _ident(task_id, "task_id")
        if not isinstance(task_path, str):
            raise InvalidArgument(f"task_path must be a str, got {type(task_path).__name__}")
        args: list[Any] = []
        shared: dict[bytes, bytes] = {}
        share_bytes = self.base.share_bytes
        for idx, pair in enumerate(writes):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidArgument(f"each write must be a (channel, value) pair, got {pair!r:.80}")
            channel, value = pair
            self._channel(channel)
            i = WRITES_IDX_MAP.get(channel, idx)
            kind, data = self.base.typed(value, f"the write to channel {channel!r}")
            field = None
            if len(data) + len(kind) + 8 >= share_bytes:
                stored = _FULL + msgpack.packb([kind, data], use_bin_type=True)
                if len(stored) >= share_bytes:
                    field = share_field(stored)  # hashed once: the write names it, the script stores it
                    shared[field] = stored
            payload = pack_write(task_path, channel, kind, data, field)
            # Special writes (errors, interrupts) replace; regular ones keep the first (a resend is a no-op).
            args += [write_key(task, i), "1" if i < 0 else "0", payload]
        if not args:
            return None
        head = [tid, self.base.token_of(tid), self.base.ttl_arg(), f"{ns}{SEP}{cid}", 2 * len(shared)]
        reply = yield Call(
            LG_PUT_WRITES, self.base.thread_keys(tid), [*head, *(x for p in shared.items() for x in p), *args]
        )
        self.base.fenced(reply, tid, "put_writes")
        return None

    @staticmethod
    def next_version(current: str | int | float | None) -> str:
        # A fixed-width counter in an alphabet in ASCII order (so versions sort as strings, which
        # is how LangGraph compares them) and a random suffix (so two writers forking a thread
        # never mint the same version): 12 characters. A version is repeated in every
        # checkpoint's list of blob fields, every blob field and every versions_seen entry, so its
        # length is a large share of a thread's memory. A thread begun with the earlier
        # 21-character form ('<12 digits>.<8 hex>') keeps it: the two forms do not sort together.
        if isinstance(current, str) and _LEGACY_VERSION.fullmatch(current):
            return f"{int(current[:12]) + 1:012d}.{random.getrandbits(32):08x}"
        if current is None:
            n = 0
        elif isinstance(current, (int, float)):
            n = int(current)
        elif isinstance(current, str) and _VERSION.fullmatch(current):
            n = _decode64(current[:VERSION_DIGITS])
        else:
            n = int(str(current).split(".")[0])
        return _encode64(n + 1, VERSION_DIGITS) + _encode64(random.getrandbits(32), VERSION_DIGITS)


#: The digits of a version's counter, and of its random suffix (64**6 > 2**32).
VERSION_DIGITS = 6
#: 64 characters in ASCII order: a fixed-width number written with them sorts as a string.
_ALPHABET64 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
_DIGIT64 = {c: i for i, c in enumerate(_ALPHABET64)}
_VERSION = re.compile(r"[0-9A-Za-z_~]{12}")
_LEGACY_VERSION = re.compile(r"[0-9]{12}\.[0-9a-f]{8}")


def _encode64(n: int, width: int) -> str:
    if n >= 64**width:
        raise InvalidArgument(f"channel version counter {n} does not fit {width} digits")
    out = []
    for _ in range(width):
        n, d = divmod(n, 64)
        out.append(_ALPHABET64[d])
    return "".join(reversed(out))


def _decode64(text: str) -> int:
    n = 0
    for c in text:
        n = n * 64 + _DIGIT64[c]
    return n
