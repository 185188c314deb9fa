"""Everything the pool stores do that is not I/O: checks, arguments, replies.

Each public operation is a generator (see ``wire``) that the sync and async
stores drive with their own client. Nothing here blocks or awaits.

Layout: a pool's state lives in hashes and its record log in a Redis Stream
(key layout in ``keys.py`` and ``lua/_pool.lua``). Every state change and
its record are written by one script, which also numbers the record from a
per-pool counter: sequences 1, 2, 3, ... with no gap, whatever the number of
writers. A stream entry's id is ``<seq>-0``, so ``XRANGE``/``XREAD`` after a
cursor are exact. Retention trims the head of the log only, so the records a
read returns are always consecutive: if the first one is not the one after
the cursor, the records in between were trimmed, and the read raises
``CursorExpired`` instead of skipping them.

No script reads an unbounded range: ``watch`` reads the log ``page_size``
records per script and ``snapshot`` the state hashes ``page_size`` fields per
hash per script (``HSCAN``), so a pool of any size never blocks Redis for
longer than one page (see ``snapshot`` for how pages make one moment).

The checks and stored maps of the records are in ``core.pool_records``, reading the
log (``watch``) in ``core.pool_log`` (``PoolLog``, this class's base); the writes and
the snapshot are here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..codec import encode
from ..errors import ConfigConflict, CorruptState, CursorExpired, InvalidArgument, NotAMember
from ..keys import Keys, PoolKeys
from ..pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecord,
    PoolRecordKind,
    PoolSnapshot,
    RunMessage,
    StoredMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from ..wire import Call, Op, list_indexes, new_nonce, restart
from ..wire.scripts import (
    POOL_GET,
    POOL_JOIN,
    POOL_LEAVE,
    POOL_NEXT_EVENT_SEQUENCE,
    POOL_OPEN,
    POOL_RECORD_CREATED,
    POOL_RECORD_MESSAGE,
    POOL_RECORD_WAKE,
    POOL_SCRIPTS,
    POOL_SNAPSHOT,
    PoolReply,
)
from .pool_log import MAX_WATCH_COUNT, PoolLog
from .pool_records import (
    _canonical,
    _condition_map,
    _config_map,
    _config_of,
    _member_map,
    _member_of,
    _message_map,
    _read,
    _receipt_map,
    _receipt_of,
    _registration_map,
    _registration_of,
    _same,
    _split_seq,
    _stored_message_of,
    _stored_wake_of,
    check_config,
    check_member,
    check_message,
    check_wake,
)
from .replies import text
from .validate import check_id, check_int

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "DEFAULT_PAGE_SIZE", "POOL_SCRIPTS", "PoolCore"]

#: ARGV[1] of pool_get.lua: which of the pool's hashes to read (its KEYS index).
_MESSAGE_DEDUPE, _WAKES, _WAKE_DEDUPE = 4, 5, 6

#: The largest record one write may send (its encoded state and payload).
DEFAULT_MAX_RECORD_BYTES = 8 * 2**20
#: Records (watch) or fields per hash (snapshot) one script reads at most: a
#: page of 500 ~250-byte records costs about a millisecond of server time.
DEFAULT_PAGE_SIZE = 500
#: How many of a pool's latest leaves are remembered, so that a leave re-sent
#: after a lost reply (by the library or the caller) gets the first answer
#: instead of NotAMember. Bounds the pool's ``runs``/``left`` keys.
REMEMBER_LEAVES = 1000
#: Snapshot attempts before giving up when retention trims the records written
#: while the pages were read faster than they can be replayed.
SNAPSHOT_ATTEMPTS = 8
#: A message retention longer than a century is a bug, not a retention.
MAX_MESSAGE_TTL_MS = 100 * 366 * 24 * 3600 * 1000
_NONE_BLOB = encode(None, what="pool_created payload")


@dataclass(frozen=True, slots=True)
class _Page:
    """One page of a snapshot: the state hash's fields and one HSCAN page of each of the three hashes."""

    cfg_blob: Any
    created: bool
    seq: int
    cursors: list[str]
    items: list[list[tuple[bytes, Any]]]


class PoolCore(PoolLog):
    """Validation, request building and reply parsing for the pools of one namespace."""

    #: The ``agentstate.store`` attribute of its operations' spans and metrics (telemetry).
    telemetry_store: ClassVar[str] = "pool"

    def __init__(
        self,
        namespace: str,
        *,
        max_records: int | None,
        max_record_bytes: int,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_messages: int | None = None,
        message_ttl_ms: int | None = None,
    ) -> None:
        self.keys = Keys.unresolved(namespace)
        self.max_records = None if max_records is None else check_int(max_records, "max_records", 1, 2**53)
        #: Message retention (pool_record_message.lua): how many messages, and for how long, each pool keeps.
        self.max_messages = None if max_messages is None else check_int(max_messages, "max_messages", 1, 2**53)
        self.message_ttl_ms = (
            None if message_ttl_ms is None else check_int(message_ttl_ms, "message_ttl_ms", 1, MAX_MESSAGE_TTL_MS)
        )
        self.max_record_bytes = check_int(max_record_bytes, "max_record_bytes", 1, 2**31)
        self.page_size = check_int(page_size, "page_size", 1, MAX_WATCH_COUNT)
        self.remember_leaves = REMEMBER_LEAVES
        self._maxlen = self.max_records or 0

    # ---- helpers ------------------------------------------------------

    def _encode(self, value: Any, what: str) -> bytes:
        blob = encode(value, what=what)
        if len(blob) > self.max_record_bytes:
            raise InvalidArgument(f"{what} is {len(blob)} bytes, over max_record_bytes={self.max_record_bytes}")
        return blob

    def _cursor(self, reply: Sequence[Any], pid: str) -> Cursor:
        if reply[0] == PoolReply.NOT_OPEN:
            raise self._not_open(pid)
        try:
            return Cursor(int(reply[1]))
        except (ValueError, TypeError, IndexError) as exc:
            raise CorruptState(f"agent pool {pid!r}: malformed cursor in reply {list(reply)!r}") from exc

    def _page(self, pid: str, keys: PoolKeys, reply: Sequence[Any], at: int) -> _Page:
        """Parse one snapshot page (layout in ``_pool.lua``) starting at ``reply[at]``."""
        try:
            cfg_blob, created, seq = reply[at : at + 3]
            pos = at + 3
            cursors: list[str] = []
            items: list[list[tuple[bytes, Any]]] = []
            for _ in range(3):
                cursor, n = text(reply[pos]), int(reply[pos + 1])
                flat = list(reply[pos + 2 : pos + 2 + n])
                if len(flat) != n or n % 2:
                    raise ValueError(f"section of {n} items holds {len(flat)}")
                cursors.append(cursor)
                items.append(list(zip(flat[::2], flat[1::2], strict=True)))
                pos += 2 + n
            return _Page(cfg_blob, created == b"1", int(seq), cursors, items)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise CorruptState(f"snapshot of pool {pid!r} at {keys.state!r} is malformed", key=keys.state) from exc

    @staticmethod
    def _take(state: list[dict[bytes, Any]], page: _Page, keys: PoolKeys) -> None:
        """Add a page's hash fields to ``state`` (members, messages, wakes by field)."""
        for field, blob in page.items[0]:
            state[0][field] = _read(blob, keys.members, "member", _member_of)
        for field, blob in page.items[1]:
            state[1][field] = _read(blob, keys.messages, "stored message", _stored_message_of)
        for field, blob in page.items[2]:
            state[2][field] = _read(blob, keys.wakes, "stored wake", _stored_wake_of)

    def _assemble(self, pid: str, keys: PoolKeys, first: Sequence[Any], at: int) -> Op[PoolSnapshot]:
        """The snapshot whose first page is ``first[at:]``: page on, then replay the log over the pages.

        The pages are separate scripts, so writes land between them and a page
        may hold a field as it was before or after such a write. Every write
        to the three hashes appends its record in the same script, so: a
        field no record between the first page's sequence S0 and the last
        page's S1 touched held one value (or was absent) all along, and HSCAN
        returns every field present for the whole scan; every other field is
        set (or removed) by replaying records S0+1..S1 in order, which ends
        with its value at S1. The result is the state exactly at S1. If
        retention trimmed those records meanwhile, start again.
        """
        reply, pos = first, at
        for _ in range(SNAPSHOT_ATTEMPTS):
            page = self._page(pid, keys, reply, pos)
            config = _read(page.cfg_blob, keys.state, "config", _config_of)
            start = page.seq
            state: list[dict[bytes, Any]] = [{}, {}, {}]
            self._take(state, page, keys)
            while any(page.cursors):
                reply = yield Call(POOL_SNAPSHOT, keys.as_list(), [*page.cursors, self.page_size])
                if reply[0] == PoolReply.NOT_OPEN:
                    raise self._not_open(pid)
                page = self._page(pid, keys, reply, 1)
                self._take(state, page, keys)
            created = page.created
            replay: list[PoolRecord] | None = []
            if page.seq != start:
                try:
                    replay = yield from self._range(pid, keys, start, page.seq)
                except CursorExpired:
                    replay = None
            if replay is None:
                reply = yield Call(POOL_SNAPSHOT, keys.as_list(), ["0", "0", "0", self.page_size])
                if reply[0] == PoolReply.NOT_OPEN:
                    raise self._not_open(pid)
                pos = 1
                continue
            for rec in replay:
                p = rec.payload
                if isinstance(p, PoolMember):
                    if rec.kind is PoolRecordKind.MEMBER_LEFT:
                        state[0].pop(p.run_id.encode("utf-8"), None)
                    else:
                        state[0][p.run_id.encode("utf-8")] = p
                elif isinstance(p, StoredMessage):
                    state[1][p.message.message_id.encode("utf-8")] = p
                elif isinstance(p, StoredWake):
                    state[2][p.condition.condition_id.encode("utf-8")] = p
                elif rec.kind is PoolRecordKind.POOL_CREATED:
                    created = True
            members = sorted(state[0].values(), key=lambda m: m.run_id)
            return PoolSnapshot(
                pool_id=pid,
                created=created,
                topics=sorted({t for m in members for t in m.topics if isinstance(t, str)}),
                members=members,
                message_policy=config.message_policy,
                wake_policy=config.wake_policy,
                policy_refs=config.policy_refs,
                messages=sorted(state[1].values(), key=lambda m: m.message.message_id),
                wakes=sorted(state[2].values(), key=lambda w: w.condition.condition_id),
                cursor=Cursor(page.seq) if page.seq else None,
            )
        raise CursorExpired(
            f"agent pool {pid!r} changed faster than retention (max_records={self.max_records}) keeps its "
            f"records: {SNAPSHOT_ATTEMPTS} snapshots in a row could not replay the writes made while they read",
            key=keys.log,
        )

    # ---- operations ----------------------------------------------------

    def open(self, pool_id: str, config: PoolConfig) -> Op[PoolSnapshot]:
        pid, keys = self._pool(pool_id)
        c = check_config(config)
        blob = self._encode(_canonical(_config_map(c)), f"config of pool {pid!r}")
        reply = yield Call(POOL_OPEN, keys.as_list(), [pid, blob, self._maxlen, self.page_size])
        if reply[0] != PoolReply.CONFIG_CONFLICT:
            return (yield from self._assemble(pid, keys, reply, 1))
        stored = _read(reply[1], keys.state, "config", _config_of)
        if not _same(_config_map(stored), _config_map(c)):
            raise ConfigConflict(f"agent pool {pid!r} is open with a different config", key=keys.state)
        # Equal values, other bytes (e.g. 1 and 1.0): the stored config rules.
        return (yield from self.snapshot(pid))

    def snapshot(self, pool_id: str) -> Op[PoolSnapshot]:
        pid, keys = self._pool(pool_id)
        reply = yield Call(POOL_SNAPSHOT, keys.as_list(), ["0", "0", "0", self.page_size])
        if reply[0] == PoolReply.NOT_OPEN:
            raise self._not_open(pid)
        return (yield from self._assemble(pid, keys, reply, 1))

    def record_created(self, pool_id: str) -> Op[Cursor]:
        pid, keys = self._pool(pool_id)
        reply = yield Call(POOL_RECORD_CREATED, keys.as_list(), [self._maxlen, _NONE_BLOB])
        return self._cursor(reply, pid)

    def join(self, pool_id: str, member: PoolMember) -> Op[Cursor]:
        pid, keys = self._pool(pool_id)
        m = check_member(member)
        blob = self._encode(_member_map(m), f"member {m.run_id!r}")
        reply = yield Call(POOL_JOIN, keys.as_list(), [self._maxlen, m.run_id, blob])
        return self._cursor(reply, pid)

    def leave(self, pool_id: str, run_id: str) -> Op[tuple[PoolMember, Cursor]]:
        pid, keys = self._pool(pool_id)
        rid = check_id(run_id, "run_id")
        reply = yield Call(POOL_LEAVE, keys.as_list(), [self._maxlen, self.remember_leaves, rid])
        if reply[0] == PoolReply.NOT_A_MEMBER:
            raise NotAMember(f"run {rid!r} is not a member of agent pool {pid!r}", key=keys.members)
        cursor = self._cursor(reply, pid)
        return _read(reply[2], keys.members, "member", _member_of), cursor

    def message_receipt(self, pool_id: str, idempotency_key: str) -> Op[MessageReceipt | None]:
        pid, keys = self._pool(pool_id)
        key = check_id(idempotency_key, "idempotency_key")
        found = yield from self._get(pid, keys, _MESSAGE_DEDUPE, key)
        if found is None:
            return None
        return _read(_split_seq(found, keys.message_dedupe)[1], keys.message_dedupe, "receipt", _receipt_of)

    def wake_registration(self, pool_id: str, idempotency_key: str) -> Op[WakeRegistration | None]:
        pid, keys = self._pool(pool_id)
        key = check_id(idempotency_key, "idempotency_key")
        found = yield from self._get(pid, keys, _WAKE_DEDUPE, key)
        if found is None:
            return None
        return _read(_split_seq(found, keys.wake_dedupe)[1], keys.wake_dedupe, "registration", _registration_of)

    def wake(self, pool_id: str, condition_id: str) -> Op[StoredWake | None]:
        pid, keys = self._pool(pool_id)
        cid = check_id(condition_id, "condition_id")
        found = yield from self._get(pid, keys, _WAKES, cid)
        return None if found is None else _read(found, keys.wakes, "stored wake", _stored_wake_of)

    def _get(self, pid: str, keys: PoolKeys, which: int, field: str) -> Op[bytes | None]:
        reply = yield Call(POOL_GET, keys.as_list(), [which, field])
        if reply[0] == PoolReply.NOT_OPEN:
            raise self._not_open(pid)
        return reply[1] if reply[0] == PoolReply.DONE else None

    def record_message(self, pool_id: str, message: RunMessage, receipt: MessageReceipt) -> Op[Cursor]:
        pid, keys = self._pool(pool_id)
        m, r = check_message(message, receipt)
        receipt_map = _receipt_map(r)
        receipt_blob = encode(receipt_map, what=f"receipt of message {m.message_id!r}")
        stored = self._encode({"message": _message_map(m), "receipt": receipt_map}, f"message {m.message_id!r}")
        retention = [self.max_messages or 0, self.message_ttl_ms or 0]
        args = [self._maxlen, m.message_id, m.idempotency_key, receipt_blob, stored, *retention]
        reply = yield Call(POOL_RECORD_MESSAGE, keys.with_order(), args)
        if reply[0] == PoolReply.MALFORMED_ENTRY:
            raise CorruptState(
                f"dedupe entry {m.idempotency_key!r} at {keys.message_dedupe!r} is malformed", key=keys.message_dedupe
            )
        return self._cursor(reply, pid)

    def record_wake(
        self, pool_id: str, condition: WakeCondition, compiled_filter: Any, registration: WakeRegistration
    ) -> Op[Cursor]:
        pid, keys = self._pool(pool_id)
        c, r = check_wake(condition, registration)
        reg_map = _registration_map(r)
        reg_blob = encode(reg_map, what=f"registration of wake {c.condition_id!r}")
        stored = self._encode(
            {"condition": _condition_map(c), "compiled_filter": compiled_filter, "registration": reg_map},
            f"wake {c.condition_id!r}",
        )
        args = [self._maxlen, c.condition_id, c.idempotency_key, reg_blob, stored]
        reply = yield Call(POOL_RECORD_WAKE, keys.as_list(), args)
        if reply[0] == PoolReply.MALFORMED_ENTRY:
            raise CorruptState(
                f"dedupe entry {c.idempotency_key!r} at {keys.wake_dedupe!r} is malformed", key=keys.wake_dedupe
            )
        return self._cursor(reply, pid)

    def next_event_sequence(self, pool_id: str) -> Op[int]:
        pid, keys = self._pool(pool_id)
        # The nonce makes a re-send after a lost reply get the same number (the script remembers it).
        reply = yield Call(POOL_NEXT_EVENT_SEQUENCE, keys.as_list(), [new_nonce()])
        return self._cursor(reply, pid).sequence

    def list(self) -> Op[list[str]]:
        """Every pool id of the namespace, from the per-shard indexes, paged (never KEYS or SCAN)."""
        return (yield from restart(lambda: list_indexes([self.keys.shard_pools(s) for s in range(self.keys.shards)])))
