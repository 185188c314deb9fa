"""Reading a pool's record log: pages of records after a cursor, gaps as ``CursorExpired``, ``watch``.

A record's stream id is ``<seq>-0`` and retention trims the head only, so the
records a read returns are consecutive, and a first record that is not the
one after the cursor means the ones between were trimmed. ``PoolLog`` is the
base of ``core.pool.PoolCore``; nothing here does I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from ..errors import CorruptState, CursorExpired, PoolNotOpen
from ..keys import Keys, PoolKeys
from ..pool_models import Cursor, PoolRecord, PoolRecordKind, RecordPayload
from ..wire import Call, Command, Op
from ..wire.scripts import POOL_WATCH, PoolReply
from .pool_records import _check_type, _config_of, _member_of, _read, _stored_message_of, _stored_wake_of
from .replies import text
from .validate import MAX_REVISION, check_id, check_int

__all__ = ["MAX_BLOCK_MS", "MAX_WATCH_COUNT", "PoolLog"]

#: block_ms is capped at a day: a watch that waits longer is a bug, not a watch.
MAX_BLOCK_MS = 24 * 3600 * 1000
MAX_WATCH_COUNT = 1_000_000
_KINDS = {k.value: k for k in PoolRecordKind}


def _xread_entries(reply: Any) -> list[tuple[bytes, bytes, bytes]]:
    """``(seq, kind, blob)`` of an ``XREAD`` of one stream, as parsed by redis-py on RESP2 or RESP3."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [s[1] for s in reply]
    out = []
    for entries in streams:
        # redis-py's RESP3 parser wraps a stream's entry list in one more list.
        if entries and isinstance(entries[0], list) and entries[0] and isinstance(entries[0][0], (list, tuple)):
            entries = [e for sub in entries for e in sub]
        for entry_id, fields in entries:
            f = fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=False))
            out.append((entry_id.split(b"-", 1)[0], f.get(b"k", b""), f.get(b"p", b"")))
    return out


def _entries(reply: Sequence[Any]) -> list[tuple[Any, Any, Any]]:
    """``(seq, kind, blob)`` triples of a ``pool_watch`` reply."""
    return [(reply[i], reply[i + 1], reply[i + 2]) for i in range(2, len(reply) - 2, 3)]


class PoolLog:
    """The record log of the pools of one namespace: paged reads and ``watch``."""

    #: Set by ``PoolCore.__init__``.
    keys: Keys
    page_size: int

    def _pool(self, pool_id: object) -> tuple[str, PoolKeys]:
        pid = check_id(pool_id, "pool_id")
        return pid, self.keys.pool(pid)

    @staticmethod
    def _not_open(pid: str) -> PoolNotOpen:
        return PoolNotOpen(f"agent pool {pid!r} is not open")

    def _range(self, pid: str, keys: PoolKeys, start: int, end: int) -> Op[list[PoolRecord]]:
        """Records ``start + 1 .. end``, page by page; ``CursorExpired`` if any was trimmed."""
        out: list[PoolRecord] = []
        seq = start
        while seq < end:
            reply = yield Call(POOL_WATCH, keys.as_list(), [f"{seq + 1}-0", min(self.page_size, end - seq)])
            if reply[0] == PoolReply.NOT_OPEN:
                raise self._not_open(pid)
            head = int(reply[1])
            if head < end:
                raise CursorExpired(f"the log of agent pool {pid!r} went back from {end} to {head}", key=keys.log)
            got = self._records(pid, keys, seq, head, _entries(reply))
            out.extend(got)
            seq = got[-1].cursor.sequence
        return out

    def _records(
        self,
        pid: str,
        keys: PoolKeys,
        after: int,
        head: int | None,
        entries: list[tuple[Any, Any, Any]],
        *,
        oldest: bool = False,
    ) -> list[PoolRecord]:
        """Records from ``(seq, kind, blob)`` entries read after ``after``; ``CursorExpired`` on a gap.

        ``oldest``: the read had no cursor and starts at the oldest record kept, wherever that is.
        """
        if not entries:
            if head is not None and head > after:
                raise CursorExpired(
                    f"records of pool {pid!r} after sequence {after} were trimmed by retention", key=keys.log
                )
            return []
        expect = after + 1
        out: list[PoolRecord] = []
        for seq_raw, kind_raw, blob in entries:
            try:
                seq = int(seq_raw)
                kind = _KINDS[text(kind_raw)]
            except (ValueError, KeyError, UnicodeDecodeError) as exc:
                raise CorruptState(
                    f"record {seq_raw!r} of pool {pid!r} at {keys.log!r} is malformed", key=keys.log
                ) from exc
            if oldest and not out and seq > expect:
                expect = seq
            if seq != expect:
                if not out and seq > expect:
                    raise CursorExpired(
                        f"records {expect}..{seq - 1} of pool {pid!r} were trimmed by retention "
                        f"(oldest kept: {seq}); cursor {after} has expired",
                        key=keys.log,
                    )
                raise CorruptState(
                    f"record log of pool {pid!r} at {keys.log!r} skips from {expect} to {seq}", key=keys.log
                )
            out.append(PoolRecord(pid, Cursor(seq), kind, self._payload(kind, blob, keys.log)))
            expect += 1
        return out

    @staticmethod
    def _payload(kind: PoolRecordKind, blob: Any, key: str) -> RecordPayload:
        if kind is PoolRecordKind.POOL_OPENED:
            return _read(blob, key, "pool_opened record", _config_of)
        if kind is PoolRecordKind.POOL_CREATED:
            return None
        if kind in (PoolRecordKind.MEMBER_JOINED, PoolRecordKind.MEMBER_LEFT):
            return _read(blob, key, f"{kind.value} record", _member_of)
        if kind is PoolRecordKind.RUN_MESSAGE:
            return _read(blob, key, "run_message record", _stored_message_of)
        return _read(blob, key, "wake record", _stored_wake_of)

    def watch(
        self,
        pool_id: str,
        after: Cursor | None = None,
        *,
        count: int | None = None,
        block_ms: int | None = None,
        slice_ms: int | None = None,
    ) -> Op[list[PoolRecord]]:
        """Records after ``after`` (from the oldest kept if None), at most ``count`` (None: up to the head).

        Read ``page_size`` records per script. With ``block_ms`` and nothing
        new, waits with ``XREAD BLOCK`` in slices of at most ``slice_ms`` (the
        shell sets it from the client's read timeout, so a long wait never
        trips it) and returns the records that woke it and any behind them.
        """
        pid, keys = self._pool(pool_id)
        if after is None:
            seq = 0
        else:
            seq = check_int(_check_type(after, Cursor, "after").sequence, "after.sequence", 0, MAX_REVISION)
        limit = None if count is None else check_int(count, "count", 1, MAX_WATCH_COUNT)
        wait = 0 if block_ms is None else check_int(block_ms, "block_ms", 0, MAX_BLOCK_MS)
        out = yield from self._pages(pid, keys, seq, limit, oldest=after is None)
        if out or not wait:
            return out
        deadline = time.monotonic() + wait / 1000
        n = self.page_size if limit is None else min(limit, self.page_size)
        while True:
            left = math.ceil((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return []
            block = min(left, slice_ms) if slice_ms else left
            raw = yield Command(["XREAD", "COUNT", n, "BLOCK", block, "STREAMS", keys.log, f"{seq}-0"])
            found = _xread_entries(raw)
            if found:
                out = self._records(pid, keys, seq, None, found)
                break
        if len(found) == n and (limit is None or limit > n):
            # A burst filled the page: read the rest the way a non-blocking call would.
            try:
                more = yield from self._pages(pid, keys, out[-1].cursor.sequence, limit and limit - n)
            except CursorExpired:
                more = []  # trimmed meanwhile: the next watch from out[-1] says so
            out.extend(more)
        return out

    def _pages(
        self, pid: str, keys: PoolKeys, seq: int, limit: int | None, *, oldest: bool = False
    ) -> Op[list[PoolRecord]]:
        """Records after ``seq``, ``page_size`` per script, until ``limit`` or the head seen by the first page.

        Stopping at that head keeps a reader from chasing a writer forever. If
        retention trims records between two pages, the records read so far
        are returned (they are consecutive) and the next read from the last
        of them raises ``CursorExpired``: nothing is skipped silently.
        """
        out: list[PoolRecord] = []
        end: int | None = None
        while True:
            n = self.page_size if limit is None else min(self.page_size, limit - len(out))
            if end is not None:
                n = min(n, end - seq)
            reply = yield Call(POOL_WATCH, keys.as_list(), [f"{seq + 1}-0", n])
            if reply[0] == PoolReply.NOT_OPEN:
                raise self._not_open(pid)
            head = int(reply[1])
            if seq > head and out:
                return out  # the log went back under us: the next read from out[-1] says so
            if seq > head:
                # A cursor from the future: the log lost records (a restart without
                # persistence, a failover to a lagging replica) or the cursor is another
                # pool's. Waiting for record seq + 1 would silently skip the ones between.
                raise CursorExpired(
                    f"cursor {seq} of agent pool {pid!r} is ahead of its log (last record {head}): "
                    "records were lost or the cursor belongs elsewhere; resync from snapshot()",
                    key=keys.log,
                )
            entries = _entries(reply)
            try:
                got = self._records(pid, keys, seq, head, entries, oldest=oldest and not out)
            except CursorExpired:
                if out:
                    return out
                raise
            out.extend(got)
            end = head if end is None else end
            if len(entries) < n or not got:
                return out
            seq = got[-1].cursor.sequence
            if seq >= end or (limit is not None and len(out) >= limit):
                return out
