"""Everything the pool stores do that is not I/O: checks, arguments, replies.

Each public operation is a generator (see ``_ops``) that the sync and async
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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from ._ops import Call, Command, Op, list_indexes
from ._validate import MAX_REVISION, check_id, check_int
from .codec import decode, encode
from .errors import ConfigConflict, CorruptState, CursorExpired, InvalidArgument, NotAMember, PoolNotOpen
from .keys import SHARDS, Keys, PoolKeys
from .pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecord,
    PoolRecordKind,
    PoolSnapshot,
    RecordPayload,
    RunMessage,
    StoredMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from .scripts import (
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
    POOL_WATCH,
    PoolReply,
)

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
#: block_ms is capped at a day: a watch that waits longer is a bug, not a watch.
MAX_BLOCK_MS = 24 * 3600 * 1000
#: A message retention longer than a century is a bug, not a retention.
MAX_MESSAGE_TTL_MS = 100 * 366 * 24 * 3600 * 1000
MAX_WATCH_COUNT = 1_000_000
_KINDS = {k.value: k for k in PoolRecordKind}
_NONE_BLOB = encode(None, what="pool_created payload")

T = TypeVar("T")


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# ---- canonical encoding (configs compare by their bytes in Lua) -----------


#: How deep a pool config may nest (msgpack allows 511; walking and comparing one that
#: deep recurses past Python's stack limit). A config that contains itself ends up here too.
MAX_CONFIG_DEPTH = 128


def _canonical_at(value: Any, depth: int) -> Any:
    if depth > MAX_CONFIG_DEPTH:
        raise InvalidArgument(f"pool config nests deeper than {MAX_CONFIG_DEPTH} levels (or contains itself)")
    if isinstance(value, dict):
        try:
            items = sorted(((msgpack.packb(k, use_bin_type=True), k, v) for k, v in value.items()), key=lambda t: t[0])
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"pool config is not msgpack-serialisable: {exc}") from exc
        out: dict[Any, Any] = {}
        for _, k, v in items:  # a loop, not a comprehension: one stack frame per level
            out[k] = _canonical_at(v, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        seq = []
        for v in value:
            seq.append(_canonical_at(v, depth + 1))
        return seq
    return value


def _canonical(value: Any) -> Any:
    """``value`` with every map's items in one order, so equal configs encode to equal bytes.

    ``InvalidArgument`` for a config nested deeper than ``MAX_CONFIG_DEPTH`` or containing itself.
    """
    try:
        return _canonical_at(value, 0)
    except RecursionError as exc:
        raise InvalidArgument(f"pool config nests too deeply to encode: {exc}") from exc


# ---- checks -----------------------------------------------------------------


def _check_type(value: object, cls: type[T], what: str) -> T:
    if not isinstance(value, cls):
        raise InvalidArgument(f"{what} must be a {cls.__name__}, got {type(value).__name__}")
    return value


def _check_dict(value: object, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a dict, got {type(value).__name__}")
    return value


def _check_list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidArgument(f"{what} must be a list, got {type(value).__name__}")
    return value


def _check_str_list(value: object, what: str) -> list[str]:
    for item in _check_list(value, what):
        check_id(item, f"each of {what}")
    return value  # type: ignore[return-value]


def _opt_id(value: object, what: str) -> str | None:
    return None if value is None else check_id(value, what)


def check_config(config: object) -> PoolConfig:
    c = _check_type(config, PoolConfig, "config")
    _check_dict(c.message_policy, "config.message_policy")
    _check_dict(c.wake_policy, "config.wake_policy")
    _check_list(c.policy_refs, "config.policy_refs")
    return c


def check_member(member: object) -> PoolMember:
    m = _check_type(member, PoolMember, "member")
    check_id(m.run_id, "member.run_id")
    _check_str_list(m.topics, "member.topics")
    _check_dict(m.metadata, "member.metadata")
    return m


def check_message(message: object, receipt: object) -> tuple[RunMessage, MessageReceipt]:
    m = _check_type(message, RunMessage, "message")
    check_id(m.message_id, "message.message_id")
    check_id(m.idempotency_key, "message.idempotency_key")
    _opt_id(m.topic, "message.topic")
    _opt_id(m.sender, "message.sender")
    r = _check_type(receipt, MessageReceipt, "receipt")
    check_id(r.message_id, "receipt.message_id")
    if r.message_id != m.message_id:
        raise InvalidArgument(f"receipt.message_id {r.message_id!r} is not the message's {m.message_id!r}")
    _check_str_list(r.recipients, "receipt.recipients")
    _check_dict(r.metadata, "receipt.metadata")
    return m, r


def check_wake(condition: object, registration: object) -> tuple[WakeCondition, WakeRegistration]:
    c = _check_type(condition, WakeCondition, "condition")
    check_id(c.condition_id, "condition.condition_id")
    check_id(c.idempotency_key, "condition.idempotency_key")
    check_id(c.run_id, "condition.run_id")
    _check_dict(c.filter, "condition.filter")
    r = _check_type(registration, WakeRegistration, "registration")
    check_id(r.condition_id, "registration.condition_id")
    if r.condition_id != c.condition_id:
        raise InvalidArgument(f"registration.condition_id {r.condition_id!r} is not the condition's {c.condition_id!r}")
    _check_dict(r.metadata, "registration.metadata")
    return c, r


# ---- to and from stored maps --------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: ``True`` is not ``1`` (Python says it is), ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _config_map(c: PoolConfig) -> dict[str, Any]:
    return {"message_policy": c.message_policy, "wake_policy": c.wake_policy, "policy_refs": c.policy_refs}


def _member_map(m: PoolMember) -> dict[str, Any]:
    return {"run_id": m.run_id, "topics": m.topics, "metadata": m.metadata}


def _message_map(m: RunMessage) -> dict[str, Any]:
    return {
        "message_id": m.message_id,
        "idempotency_key": m.idempotency_key,
        "payload": m.payload,
        "topic": m.topic,
        "sender": m.sender,
    }


def _receipt_map(r: MessageReceipt) -> dict[str, Any]:
    return {"message_id": r.message_id, "recipients": r.recipients, "metadata": r.metadata}


def _condition_map(c: WakeCondition) -> dict[str, Any]:
    return {
        "condition_id": c.condition_id,
        "idempotency_key": c.idempotency_key,
        "run_id": c.run_id,
        "filter": c.filter,
    }


def _registration_map(r: WakeRegistration) -> dict[str, Any]:
    return {"condition_id": r.condition_id, "metadata": r.metadata}


class _Shape(Exception):
    """A decoded value does not have the shape this library writes."""


def _field(m: Any, name: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if not isinstance(m, dict) or name not in m:
        raise _Shape(f"missing field {name!r}")
    value = m[name]
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        raise _Shape(f"field {name!r} is {type(value).__name__}")
    return value


def _config_of(m: Any) -> PoolConfig:
    return PoolConfig(_field(m, "message_policy", dict), _field(m, "wake_policy", dict), _field(m, "policy_refs", list))


def _member_of(m: Any) -> PoolMember:
    return PoolMember(_field(m, "run_id", str), _field(m, "topics", list), _field(m, "metadata", dict))


def _message_of(m: Any) -> RunMessage:
    if not isinstance(m, dict) or "payload" not in m:
        raise _Shape("missing field 'payload'")
    return RunMessage(
        _field(m, "message_id", str),
        _field(m, "idempotency_key", str),
        m["payload"],
        _field(m, "topic", str, optional=True),
        _field(m, "sender", str, optional=True),
    )


def _receipt_of(m: Any) -> MessageReceipt:
    return MessageReceipt(_field(m, "message_id", str), _field(m, "recipients", list), _field(m, "metadata", dict))


def _stored_message_of(m: Any) -> StoredMessage:
    return StoredMessage(_message_of(_field(m, "message", dict)), _receipt_of(_field(m, "receipt", dict)))


def _condition_of(m: Any) -> WakeCondition:
    return WakeCondition(
        _field(m, "condition_id", str),
        _field(m, "idempotency_key", str),
        _field(m, "run_id", str),
        _field(m, "filter", dict),
    )


def _registration_of(m: Any) -> WakeRegistration:
    return WakeRegistration(_field(m, "condition_id", str), _field(m, "metadata", dict))


def _stored_wake_of(m: Any) -> StoredWake:
    if not isinstance(m, dict) or "compiled_filter" not in m:
        raise _Shape("missing field 'compiled_filter'")
    return StoredWake(
        _condition_of(_field(m, "condition", dict)),
        m["compiled_filter"],
        _registration_of(_field(m, "registration", dict)),
    )


def _read(blob: Any, key: str, what: str, build: Callable[[Any], T]) -> T:
    """Decode ``blob`` (stored at ``key``) and build a model from it; ``CorruptState`` naming the key."""
    if not isinstance(blob, bytes):
        raise CorruptState(f"{what} at {key!r} is not a blob: {blob!r}", key=key)
    value = decode(blob, key=key)
    try:
        return build(value)
    except _Shape as exc:
        raise CorruptState(f"{what} at {key!r} is malformed: {exc}", key=key) from exc


def _split_seq(raw: Any, key: str) -> tuple[int, bytes]:
    """``b"<seq>:<blob>"`` -> (seq, blob)."""
    try:
        head, _, blob = raw.partition(b":")
        return int(head), blob
    except (AttributeError, ValueError) as exc:
        raise CorruptState(f"dedupe entry at {key!r} is malformed: {raw!r}", key=key) from exc


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


@dataclass(frozen=True, slots=True)
class _Page:
    """One page of a snapshot: the state hash's fields and one HSCAN page of each of the three hashes."""

    cfg_blob: Any
    created: bool
    seq: int
    cursors: list[str]
    items: list[list[tuple[bytes, Any]]]


class PoolCore:
    """Validation, request building and reply parsing for the pools of one namespace."""

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
        self.keys = Keys(namespace)
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

    def _pool(self, pool_id: object) -> tuple[str, PoolKeys]:
        pid = check_id(pool_id, "pool_id")
        return pid, self.keys.pool(pid)

    def _encode(self, value: Any, what: str) -> bytes:
        blob = encode(value, what=what)
        if len(blob) > self.max_record_bytes:
            raise InvalidArgument(f"{what} is {len(blob)} bytes, over max_record_bytes={self.max_record_bytes}")
        return blob

    @staticmethod
    def _not_open(pid: str) -> PoolNotOpen:
        return PoolNotOpen(f"agent pool {pid!r} is not open")

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
                cursor, n = _s(reply[pos]), int(reply[pos + 1])
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
                kind = _KINDS[_s(kind_raw)]
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
        reply = yield Call(POOL_NEXT_EVENT_SEQUENCE, keys.as_list(), [])
        return self._cursor(reply, pid).sequence

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

    def list(self) -> Op[list[str]]:
        """Every pool id of the namespace, from the per-shard indexes, paged (never KEYS or SCAN)."""
        return (yield from list_indexes([self.keys.shard_pools(s) for s in range(SHARDS)]))
