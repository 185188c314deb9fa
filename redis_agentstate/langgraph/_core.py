"""Everything the LangGraph savers do that is not I/O: checks, requests, replies.

Layout (``keys.ThreadKeys``; every key of a thread is in its shard's slot):
a checkpoint is a record (parent id, serialized checkpoint without its channel
values, serialized metadata) under ``<ns>\\0<cid>``, plus the list of blob fields
it reads. Channel values are blobs under ``<ns>\\0<channel>\\0<version>``, written
only by the checkpoint that bumped the version (as langgraph-checkpoint-postgres
does), so a put costs what changed, not the whole state.

A list channel that grew since the version this saver last wrote is stored as
its new items only (a *tail* naming its base version); a read follows the chain
down to a full value and concatenates, so it rebuilds exactly the list LangGraph
wrote. The chain stays short without storing the list again and again: every
``TAIL_CHAIN``-th version is an *anchor*, whose tail reaches back to the previous
anchor (so a read walks at most ``TAIL_CHAIN - 1`` small tails, then anchors), and
only every ``TAIL_CHAIN``-th anchor is a full copy. Each item is thus stored about
twice, and a read follows at most ``2 * TAIL_CHAIN`` links.

The sync and async savers are shells over this class (``_ops.run_sync`` /
``run_async``); nothing here touches Redis or a clock.
"""

from __future__ import annotations

import copy
import random
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import msgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .._ops import Call, Command, Op, Pipe, corrupt_state, list_indexes, member_id
from .._validate import MAX_LEASE_MS, check_id, check_int
from ..errors import CorruptState, InvalidArgument, LeaseLost, ThreadBusy
from ..keys import MAX_ID_BYTES, SHARDS, Keys, ThreadKeys
from ..scripts import (
    LG_DELETE_RUNS,
    LG_DELETE_THREAD,
    LG_DUMP,
    LG_GET,
    LG_IMPORT,
    LG_LEASE,
    LG_LIST,
    LG_PRUNE,
    LG_PUT,
    LG_PUT_WRITES,
    LG_RELEASE,
    LG_RENEW,
    LG_SCRIPTS,
    Reply,
)

__all__ = ["LG_SCRIPTS", "Lister", "SaverCore"]


SEP = "\0"
#: Checkpoints fetched per list round trip.
LIST_PAGE = 100
#: Tails between anchors, and anchors between full copies, of a list channel (see above).
TAIL_CHAIN = 64
#: Threads x channels whose last written list this saver remembers (to store tails).
TAIL_CACHE = 4096
MAX_TTL_S = 100 * 366 * 24 * 3600

_FULL = b"F"
_TAIL = b"T"


def _ident(value: object, what: str) -> str:
    """An id LangGraph hands us (str, int or UUID) as the str we store; no NUL (our field separator)."""
    if isinstance(value, uuid.UUID) or (isinstance(value, int) and not isinstance(value, bool)):
        value = str(value)
    text = check_id(value, what, max_bytes=MAX_ID_BYTES)
    if SEP in text:
        raise InvalidArgument(f"{what} must not contain NUL, got {text!r:.80}")
    return text


def _ns(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(f"checkpoint_ns must be a str, got {type(value).__name__}")
    if SEP in value:
        raise InvalidArgument(f"checkpoint_ns must not contain NUL, got {value!r:.80}")
    return value


def _configurable(config: object) -> Mapping[str, Any]:
    conf = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(conf, Mapping):
        raise InvalidArgument(f"config must be a dict with a 'configurable' dict, got {config!r:.120}")
    return conf


def thread_of(config: object) -> str:
    conf = _configurable(config)
    if conf.get("thread_id") is None:
        raise InvalidArgument("config['configurable'] has no 'thread_id': the saver needs one to store state")
    return _ident(conf["thread_id"], "thread_id")


def _ttl_ms(ttl: object) -> int | None:
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds <= MAX_TTL_S:
        raise InvalidArgument(f"ttl must be a positive number of seconds or a timedelta, got {ttl!r}")
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


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


def _unpack_writes(packed: bytes, key: str) -> list[bytes]:
    """The writes of a checkpoint's packed value: '<n>:<task_id>\\0<idx><m>:<write>' each (see _lg.lua)."""
    if not isinstance(packed, bytes):
        raise corrupt_state(key, [key], "holds malformed pending writes")
    out: list[bytes] = []
    i = 0
    while i < len(packed):
        head = _length_at(packed, i)
        write = head and _length_at(packed, head[1] + head[0])
        if not write:
            raise corrupt_state(key, [key], f"holds malformed pending writes (at byte {i})")
        n, start = write
        out.append(packed[start : start + n])
        i = start + n
    return out


def _reads_and_body(stored: bytes, key: str) -> tuple[list[bytes], bytes]:
    """The blob fields a stored checkpoint reads and its msgpack record (see _lg.lua)."""
    head = _length_at(stored, 0) if isinstance(stored, bytes) else None
    if head is None:
        raise corrupt_state(key, [key], "holds a malformed checkpoint (its list of blob fields)")
    n, start = head
    reads, body, fields, i = stored[start : start + n], stored[start + n :], [], 0
    while i < len(reads):
        one = _length_at(reads, i)
        if one is None:
            raise corrupt_state(key, [key], "holds a malformed checkpoint (its list of blob fields)")
        fields.append(reads[one[1] : one[1] + one[0]])
        i = one[1] + one[0]
    return fields, body


def _record_body(stored: bytes, key: str) -> bytes:
    """The msgpack record of a stored checkpoint, after its '<n>:' + n bytes list of blob fields."""
    return _reads_and_body(stored, key)[1]


def _stored_text(value: Any, key: str, what: str) -> str:
    """An id or field name read from ``key``: UTF-8, as every one the library stores."""
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise corrupt_state(key, [key], f"holds {what} that is not UTF-8: {value!r:.80}") from exc


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


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


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


@dataclass
class SaverCore:
    """Validation, request building and reply parsing for both savers."""

    namespace: str
    serde: SerializerProtocol
    ttl: float | timedelta | None = None
    refresh_on_read: bool = False
    keys: Keys = field(init=False)
    #: thread id -> token of the lease this saver holds on it (set by the lease shells).
    tokens: dict[str, str] = field(default_factory=dict)
    lists: OrderedDict[tuple[str, str, str], _Remembered] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.keys = Keys(self.namespace)
        self.ttl_ms = _ttl_ms(self.ttl)
        if not isinstance(self.refresh_on_read, bool):
            raise InvalidArgument(f"refresh_on_read must be a bool, got {self.refresh_on_read!r}")

    # ---- helpers --------------------------------------------------------

    def thread_keys(self, thread_id: str) -> list[str]:
        return self.thread_key_set(thread_id).as_list()

    def thread_key_set(self, thread_id: str) -> ThreadKeys:
        return self.keys.thread(thread_id)

    def _ttl_arg(self) -> str:
        return "" if self.ttl_ms is None else str(self.ttl_ms)

    def _token(self, thread_id: str) -> str:
        return self.tokens.get(thread_id, "")

    def _fenced(self, reply: Any, thread_id: str, what: str) -> Any:
        """``reply`` of a fenced script, or the error it stands for (nothing was written then)."""
        if int(reply[0]) == Reply.DONE:
            return reply
        why = _text(reply[1])
        if why == "busy":
            raise ThreadBusy(
                f"{what} refused: thread {thread_id!r} is leased by another writer; nothing was written",
                task_id=thread_id,
            )
        if why == "lost":
            # The token stays until the lease block ends: every later write of this saver is refused the same way.
            raise LeaseLost(
                f"{what} refused: this saver's lease on thread {thread_id!r} is no longer live (it expired on the "
                "server clock, or another writer took the thread over); nothing was written",
                task_id=thread_id,
            )
        if why == "gone":
            member = _text(reply[2])
            raise InvalidArgument(
                f"{what} refused: its parent checkpoint {member.partition(SEP)[2]!r} is not in thread {thread_id!r} "
                "(the thread was deleted, or the checkpoint pruned, under this writer); nothing was written"
            )
        if why == "exists":
            raise InvalidArgument(
                f"{what} refused: thread {thread_id!r} already has checkpoints (a copy never merges two "
                "histories: delete the target first); nothing was written"
            )
        raise AssertionError(f"unexpected reply {reply!r}")  # pragma: no cover

    def _typed(self, value: Any, what: str) -> tuple[str, bytes]:
        """``serde.dumps_typed(value)``; a value it cannot encode is the caller's: ``InvalidArgument``,
        raised before anything is sent."""
        try:
            return self.serde.dumps_typed(value)
        except Exception as exc:
            raise InvalidArgument(
                f"{what} cannot be serialized by {type(self.serde).__name__}: {type(exc).__name__}: {exc}"
            ) from exc

    def _dumps(self, value: Any, what: str = "a channel value") -> bytes:
        kind, data = self._typed(value, what)
        return cast(bytes, msgpack.packb([kind, data], use_bin_type=True))

    def _loads(self, blob: bytes, key: str) -> Any:
        try:
            kind, data = msgpack.unpackb(blob, raw=False)
        except Exception as exc:
            raise corrupt_state(key, [key], f"holds a value that is not a serialized channel value: {exc}") from exc
        return self._load(kind, data, key, "a channel value")

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
        ck_kind, ck_data = self._typed(body, "the checkpoint")
        md_kind, md_data = self._typed(md, "the checkpoint metadata")
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
        keys = self.thread_keys(tid)
        reads_list = _fields(reads)
        stored = b"%d:" % len(reads_list) + reads_list + record
        parent_member = "" if parent is None else f"{ns}{SEP}{parent}"
        head = [tid, self._token(tid), self._ttl_arg(), f"{ns}{SEP}{cid}", stored, run, parent_member]
        while True:
            reply = yield Call(LG_PUT, keys, [*head, *(x for b in blobs for x in b[:2])])
            if int(reply[0]) == Reply.REFUSED and _text(reply[1]) == "base":
                # The base of a tail is gone (pruned, deleted): store those values in full.
                missing = _text(reply[2])
                blobs = [self._full_again(b) if b[0] == missing else b for b in blobs]
                continue
            break
        self._fenced(reply, tid, "put")
        for _, _, cache_key, remembered in blobs:
            self._remember(cache_key, remembered)
        return _config(tid, ns, cid)

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
            return _FULL + self._dumps(value), None
        prev = self.lists.get((tid, ns, ch))
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
        full = _FULL + self._dumps(value)
        return full, None if snap is None else _Remembered(version, snap, 0, version, len(value), 0)

    def _tail(self, base: str, items: list[Any]) -> bytes:
        b = base.encode()
        return _TAIL + b"%d:%s" % (len(b), b) + self._dumps(items)

    def _full_again(
        self, blob: tuple[str, bytes, tuple[str, str, str], _Remembered | None]
    ) -> tuple[str, bytes, tuple[str, str, str], _Remembered | None]:
        fld, _, cache_key, remembered = blob
        assert remembered is not None  # only tails have a base
        self.lists.pop(cache_key, None)
        return (
            fld,
            _FULL + self._dumps(remembered.items),
            cache_key,
            _Remembered(remembered.version, remembered.items, 0, remembered.version, len(remembered.items), 0),
        )

    def _remember(self, cache_key: tuple[str, str, str], remembered: _Remembered | None) -> None:
        if remembered is None:
            self.lists.pop(cache_key, None)
            return
        self.lists[cache_key] = remembered
        self.lists.move_to_end(cache_key)
        while len(self.lists) > TAIL_CACHE:
            self.lists.popitem(last=False)

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
        args: list[Any] = [tid, self._token(tid), self._ttl_arg(), f"{ns}{SEP}{cid}"]
        for idx, pair in enumerate(writes):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidArgument(f"each write must be a (channel, value) pair, got {pair!r:.80}")
            channel, value = pair
            self._channel(channel)
            i = WRITES_IDX_MAP.get(channel, idx)
            kind, data = self._typed(value, f"the write to channel {channel!r}")
            payload = msgpack.packb([task, i, task_path, channel, kind, data], use_bin_type=True)
            # Special writes (errors, interrupts) replace; regular ones keep the first (a resend is a no-op).
            args += [f"{task}{SEP}{i}", "1" if i < 0 else "0", payload]
        if len(args) == 4:
            return None
        reply = yield Call(LG_PUT_WRITES, self.thread_keys(tid), args)
        self._fenced(reply, tid, "put_writes")
        return None

    # ---- reads ----------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        conf = _configurable(config)
        tid = thread_of(config)
        ns = _ns(conf.get("checkpoint_ns"))
        cid = conf.get("checkpoint_id")
        cid = "" if cid is None else _ident(cid, "checkpoint_id")
        ttl = self._ttl_arg() if self.refresh_on_read else ""
        reply = yield Call(LG_GET, self.thread_keys(tid), [ns, cid, ttl])
        return self._tuple(tid, reply) if reply else None

    def _tuple(self, tid: str, reply: Sequence[Any]) -> CheckpointTuple:
        keys = self.thread_key_set(tid)
        ns, cid = _stored_member(reply[0], keys.index)
        parent, checkpoint, metadata = self._record(reply[1], keys.records)
        values: dict[str, Any] = {}
        blobs = reply[2]
        rebuilt: dict[str, str] = {}
        for i in range(0, len(blobs), 2):
            parts = _stored_text(blobs[i], keys.records, "a blob field").split(SEP)
            if len(parts) != 3:
                raise corrupt_state(keys.records, [keys.records], f"reads a malformed blob field {blobs[i]!r:.80}")
            _, ch, version = parts
            rebuilt[ch] = version
            chain = blobs[i + 1]
            if chain:
                value = self._rebuild(chain, keys.blobs)
                if value is not _EMPTY:
                    values[ch] = value
        writes = []
        for raw in _unpack_writes(reply[3], keys.writes):
            try:
                task, idx, path, channel, kind, data = msgpack.unpackb(raw, raw=False)
            except Exception as exc:
                raise corrupt_state(keys.writes, [keys.writes], f"holds a malformed pending write: {exc}") from exc
            if not (
                isinstance(task, str)
                and isinstance(path, str)
                and isinstance(channel, str)
                and isinstance(idx, int)
                and not isinstance(idx, bool)
            ):
                raise corrupt_state(keys.writes, [keys.writes], "holds a pending write of the wrong shape")
            value = self._load(kind, data, keys.writes, "a pending write")
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

    def _load(self, kind: Any, data: Any, key: str, what: str) -> Any:
        """``serde.loads_typed`` of a value read from ``key``: one it cannot read is corrupt data, not a crash."""
        try:
            return self.serde.loads_typed((kind, data))
        except Exception as exc:
            raise corrupt_state(key, [key], f"holds {what} its serializer cannot read ({exc!r:.160})") from exc

    def _unpack_record(self, raw: bytes, key: str) -> tuple[Any, ...]:
        try:
            fields = msgpack.unpackb(_record_body(raw, key), raw=False)
        except CorruptState:
            raise
        except Exception as exc:
            raise corrupt_state(key, [key], f"holds a malformed checkpoint record: {exc}") from exc
        if not isinstance(fields, list) or len(fields) != 5 or not isinstance(fields[0], (str, type(None))):
            raise corrupt_state(key, [key], "holds a checkpoint record of the wrong shape")
        return tuple(fields)

    def _record(self, raw: bytes, key: str) -> tuple[str | None, Any, Any]:
        parent, ck_kind, ck_data, md_kind, md_data = self._unpack_record(raw, key)
        checkpoint = self._load(ck_kind, ck_data, key, "a checkpoint")
        if not isinstance(checkpoint, dict):
            raise corrupt_state(key, [key], "holds a checkpoint that is not a dict")
        return parent, checkpoint, self._metadata_of(md_kind, md_data, key)

    def _metadata(self, raw: bytes, key: str) -> Any:
        _, _, _, md_kind, md_data = self._unpack_record(raw, key)
        return self._metadata_of(md_kind, md_data, key)

    def _metadata_of(self, kind: Any, data: Any, key: str) -> Any:
        metadata = self._load(kind, data, key, "checkpoint metadata")
        if not isinstance(metadata, dict):
            raise corrupt_state(key, [key], "holds checkpoint metadata that is not a dict")
        return metadata

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
        return self._load(kind, data, key, "a channel value")

    def lister(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Lister:
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise InvalidArgument(f"limit must be an int or None, got {limit!r}")
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidArgument(f"filter must be a dict or None, got {type(filter).__name__}")
        before_id = None
        if before is not None:
            b = _configurable(before).get("checkpoint_id")
            before_id = None if b is None else _ident(b, "before checkpoint_id")
        threads: list[str] | None = None
        ns: str | None = None
        cid: str | None = None
        if config is not None:
            conf = _configurable(config)
            threads = [thread_of(config)]
            if conf.get("checkpoint_ns") is not None:  # None or absent: every namespace, as InMemorySaver
                ns = _ns(conf.get("checkpoint_ns"))
            c = conf.get("checkpoint_id")
            cid = None if c is None else _ident(c, "checkpoint_id")
        return Lister(self, threads, ns, cid, dict(filter or {}), before_id, limit)

    # ---- deletes, copies, prunes ----------------------------------------

    def delete_thread(self, thread_id: str) -> Op[None]:
        tid = _ident(thread_id, "thread_id")
        reply = yield Call(LG_DELETE_THREAD, self.thread_keys(tid), [tid, self._token(tid)])
        self._fenced(reply, tid, "delete_thread")
        self._forget(tid)
        return None

    def _forget(self, tid: str) -> None:
        for key in [k for k in self.lists if k[0] == tid]:
            del self.lists[key]

    def delete_for_runs(self, run_ids: Sequence[str]) -> Op[None]:
        if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Iterable):
            raise InvalidArgument(f"run_ids must be a sequence of str, got {type(run_ids).__name__}")
        runs = sorted({_ident(r, "run_id") for r in run_ids})
        if not runs:
            return None
        commands = [
            ("ZRANGEBYLEX", self.keys.shard_runs(s), f"[{r}{SEP}".encode(), f"({r}\x01".encode())
            for r in runs
            for s in range(SHARDS)
        ]
        replies = yield Pipe(commands)
        threads: set[str] = set()
        for cmd, members in zip(commands, replies, strict=True):
            for m in members:
                # Every member is checked before the first thread is touched: nothing is written on corrupt data.
                threads.add(_stored_id(member_id(m, cmd[1]).partition(SEP)[2], cmd[1]))
        for tid in sorted(threads):
            reply = yield Call(LG_DELETE_RUNS, self.thread_keys(tid), [tid, self._token(tid), *runs])
            self._fenced(reply, tid, "delete_for_runs")
            self._forget(tid)
        return None

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> Op[None]:
        src = _ident(source_thread_id, "source_thread_id")
        dst = _ident(target_thread_id, "target_thread_id")
        if src == dst:
            raise InvalidArgument("copy_thread needs two different threads")
        dump = yield Call(LG_DUMP, self.thread_keys(src), [])
        records, blobs, writes, _runs = dump
        if not records:
            return None
        keys = self.thread_key_set(src)
        # The target's script indexes the records' members: checked here, before it writes, with the
        # framing of what it copies (a corrupt thread is reported, not duplicated).
        for member, stored in zip(records[::2], records[1::2], strict=True):
            _stored_member(member, keys.records)
            _reads_and_body(stored, keys.records)
        for packed in writes[1::2]:
            _unpack_writes(packed, keys.writes)
        # The copy is a thread of its own: its checkpoints do not join the source's runs, so
        # delete_for_runs (a run's rollback) deletes in the thread the run wrote, never in its copies.
        args = [dst, self._token(dst), self._ttl_arg(), len(records), len(blobs), len(writes), 0]
        reply = yield Call(LG_IMPORT, self.thread_keys(dst), [*args, *records, *blobs, *writes])
        self._fenced(reply, dst, "copy_thread")
        return None

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> Op[list[str]]:
        """Prune each thread; returns the threads skipped because they are leased."""
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgument(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        if isinstance(thread_ids, (str, bytes)) or not isinstance(thread_ids, Iterable):
            raise InvalidArgument(f"thread_ids must be a sequence of str, got {type(thread_ids).__name__}")
        tids = [_ident(t, "thread_id") for t in thread_ids]
        skipped = []
        for tid in tids:
            keep = (yield from self._delta_ancestors(tid)) if strategy == "keep_latest" else []
            reply = yield Call(LG_PRUNE, self.thread_keys(tid), [tid, strategy, *keep])
            if int(reply[0]) == Reply.REFUSED:
                skipped.append(tid)
            else:
                self._forget(tid)
        return skipped

    def _delta_ancestors(self, tid: str) -> Op[list[str]]:
        """The ancestors keep_latest must keep so the kept checkpoints' DeltaChannels rebuild.

        A DeltaChannel stores a sentinel and is replayed from its ancestors' writes back to
        the last snapshot; the kept checkpoint's metadata counts the supersteps since then
        (``counters_since_delta_snapshot``), so that many parents are kept with their writes.
        """
        keys = self.thread_key_set(tid)
        members = [_stored_member(m, keys.index) for m in (yield Command(["ZRANGE", keys.index, 0, -1]))]
        latest: dict[str, str] = {}
        for ns, cid in members:  # lex order: the last member of a namespace is its newest checkpoint
            latest[ns] = cid
        keep: list[str] = []
        for ns, cid in latest.items():
            member = f"{ns}{SEP}{cid}"
            raw = yield Command(["HGET", keys.records, member])
            if raw is None:
                continue
            parent, md = self._parent_and_metadata(raw, keys.records)
            counters = md.get("counters_since_delta_snapshot") or {}
            if not isinstance(counters, Mapping):
                raise corrupt_state(keys.records, [keys.records], "holds malformed DeltaChannel counters")
            depth = 0
            for c in counters.values():
                if isinstance(c, (list, tuple)) and len(c) == 2:
                    if not isinstance(c[1], int) or isinstance(c[1], bool) or c[1] < 0:
                        raise corrupt_state(keys.records, [keys.records], "holds malformed DeltaChannel counters")
                    depth = max(depth, c[1])
            # A count read from Redis: no more ancestors than the thread has, and a parent chain that
            # comes back to a checkpoint it passed is corrupt (ids only grow), not a walk for ever.
            depth = min(depth, len(members))
            seen = {cid}
            while depth > 0 and parent:
                if parent in seen:
                    raise corrupt_state(keys.records, [keys.records], "holds a parent chain that loops")
                seen.add(parent)
                member = f"{ns}{SEP}{parent}"
                raw = yield Command(["HGET", keys.records, member])
                if raw is None:
                    break
                keep.append(member)
                parent, _ = self._parent_and_metadata(raw, keys.records)
                depth -= 1
        return keep

    def _parent_and_metadata(self, raw: bytes, key: str) -> tuple[str | None, Any]:
        parent, _, _, md_kind, md_data = self._unpack_record(raw, key)
        return parent, self._metadata_of(md_kind, md_data, key)

    # ---- leases -----------------------------------------------------------

    def acquire(self, thread_id: str, token: str, lease_ms: int, wait_ms: int, slice_ms: int | None) -> Op[int]:
        """Claim ``thread_id`` for ``token``; returns the lease's expiry (server ms).

        While it is held by another, waits on the thread's release list (``BLPOP``): woken by
        the holder's release, or at the holder's expiry, whichever is first; ``wait_ms`` is
        counted on the server clock from the first attempt. ``slice_ms`` caps one ``BLPOP``
        (inside the client's read timeout).
        """
        tid = _ident(thread_id, "thread_id")
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        check_int(wait_ms, "wait_ms", 0, MAX_LEASE_MS)
        keys = self.thread_keys(tid)
        deadline: int | None = None
        while True:
            reply = yield Call(LG_LEASE, keys, [token, lease_ms])
            code, expires, now = int(reply[0]), int(reply[1]), int(reply[2])
            if code == Reply.DONE:
                self.tokens[tid] = token
                return expires
            if deadline is None:
                deadline = now + wait_ms
            if now >= deadline:
                raise ThreadBusy(
                    f"thread {thread_id!r} is leased by another writer (until server time {expires} ms)"
                    + (f"; waited {wait_ms} ms" if wait_ms else ""),
                    task_id=tid,
                )
            block = max(1, min(deadline, expires) - now)
            if slice_ms is not None:
                block = min(block, slice_ms)
            yield Command(["BLPOP", self.thread_key_set(tid).released, f"{block / 1000:.3f}"])

    def renew(self, thread_id: str, token: str, lease_ms: int) -> Op[int | None]:
        reply = yield Call(LG_RENEW, self.thread_keys(thread_id), [token, lease_ms])
        return int(reply[1]) if int(reply[0]) == Reply.DONE else None

    def release(self, thread_id: str, token: str) -> Op[bool]:
        if self.tokens.get(thread_id) == token:
            del self.tokens[thread_id]
        reply = yield Call(LG_RELEASE, self.thread_keys(thread_id), [token])
        return bool(int(reply))

    @staticmethod
    def next_version(current: str | int | float | None) -> str:
        # As the postgres saver: a zero-padded counter (so versions sort as strings) and a
        # random suffix (so two writers forking a thread never mint the same version), but
        # 21 characters, not 49: a version is repeated in every checkpoint, blob field and
        # versions_seen entry, so its length is a large share of a thread's memory.
        if current is None:
            n = 0
        elif isinstance(current, (int, float)):
            n = int(current)
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:012d}.{random.getrandbits(32):08x}"


class _Empty:
    """A channel listed in new_versions without a value (LangGraph's 'empty' blob)."""


_EMPTY = _Empty()


class Lister:
    """The state of one ``list()``: threads to visit, the page cursor, the matches left.

    Without a namespace a thread is listed namespace by namespace, as ``InMemorySaver`` does:
    in the order they were first written to (their oldest checkpoint id: LangGraph's ids grow
    with time), newest checkpoint first within each.
    """

    def __init__(
        self,
        core: SaverCore,
        threads: list[str] | None,
        ns: str | None,
        cid: str | None,
        filter: dict[str, Any],
        before: str | None,
        limit: int | None,
    ) -> None:
        self.core = core
        self.threads = threads
        self.ns = ns
        self.cid = cid
        self.filter = filter
        self.before = before
        self.left = limit
        self.thread_index = 0
        #: The namespaces of the current thread still to list (None: not read yet).
        self.spaces: list[str] | None = None
        self.hi: str | None = None
        self.done = limit is not None and limit <= 0

    def _bounds(self, ns: str) -> tuple[str, str]:
        if self.cid is not None:
            member = f"{ns}{SEP}{self.cid}"
            return f"[{member}", f"[{member}"
        if self.before is not None:
            return f"({ns}{SEP}{self.before}", f"[{ns}{SEP}"
        return f"({ns}\x01", f"[{ns}{SEP}"

    def _namespaces(self, index: str) -> Op[list[str]]:
        """The namespaces of a thread's index, oldest first: one lex jump per namespace."""
        found: list[tuple[str, str]] = []
        lo = "-"
        while True:
            first = yield Command(["ZRANGEBYLEX", index, lo, "+", "LIMIT", 0, 1])
            if not first:
                break
            ns, cid = _stored_member(first[0], index)
            found.append((cid, ns))
            lo = f"[{ns}\x01"  # past every member of ns (ids hold no byte below \x01)
        return [ns for _, ns in sorted(found)]

    def _next_thread(self) -> None:
        self.thread_index += 1
        self.spaces = None
        self.hi = None

    def next_page(self) -> Op[list[CheckpointTuple] | None]:
        """The next matches (possibly none), or None when the listing is over."""
        if self.done:
            return None
        if self.threads is None:
            shards = [self.core.keys.shard_threads(s) for s in range(SHARDS)]
            found = yield from list_indexes(shards)
            for t in found:
                if _foreign_id(t):  # named with the shard index that holds it
                    held = yield Pipe([("ZSCORE", key, t.encode()) for key in shards])
                    _stored_id(t, next((k for k, h in zip(shards, held, strict=True) if h is not None), shards[0]))
            self.threads = found
        if self.thread_index >= len(self.threads):
            self.done = True
            return None
        tid = self.threads[self.thread_index]
        keys = self.core.thread_key_set(tid)
        if self.ns is not None:
            ns = self.ns
        else:
            if self.spaces is None:
                self.spaces = yield from self._namespaces(keys.index)
                if not self.spaces:
                    # No checkpoint at all: lg_list drops a thread that expired from the shard indexes.
                    yield Call(LG_LIST, keys.as_list(), ["-", "-", 1, "0", tid])
                    self._next_thread()
                    return []
            ns = self.spaces[0]
        hi, lo = self._bounds(ns)
        # Without a metadata filter every checkpoint of the page is read: whole, in the same round trip.
        whole = not self.filter
        page = self.page_size(whole)
        reply = yield Call(LG_LIST, keys.as_list(), [self.hi or hi, lo, page, "1" if whole else "0", tid])
        members, items = reply
        if len(members) < page:
            self.hi = None
            if self.spaces:
                del self.spaces[0]
            if not self.spaces:
                self._next_thread()
        else:
            self.hi = "(" + _stored_text(members[-1], keys.index, "a checkpoint member")
        out: list[CheckpointTuple] = []
        for m, item in zip(members, items, strict=True):
            if item is None:
                continue  # deleted under the index (not by this library's scripts, which do both)
            ns, cid = _stored_member(m, keys.index)
            if self.cid is not None and cid != self.cid:
                continue
            if self.before is not None and cid >= self.before:
                continue
            if whole:
                got = item
            else:
                md = self.core._metadata(item, keys.records)
                if not all(md.get(k) == v for k, v in self.filter.items()):
                    continue
                got = yield Call(LG_GET, keys.as_list(), [ns, cid, ""])
                if not got:
                    continue  # deleted between the page and this read
            out.append(self.core._tuple(tid, got))
            if self.left is not None:
                self.left -= 1
                if self.left <= 0:
                    self.done = True
                    break
        return out

    def page_size(self, whole: bool) -> int:
        """Checkpoints per round trip: no more than the listing still needs when they are read whole."""
        if whole and self.left is not None:
            return max(1, min(LIST_PAGE, self.left))
        return LIST_PAGE
