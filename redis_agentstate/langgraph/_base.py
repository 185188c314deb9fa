"""What every LangGraph saver operation shares: the core's state, caller-input checks, fenced replies.

``SaverBase`` holds one namespace's keys, the serializer and ttl, the lease tokens
and the list-tail cache; it checks what LangGraph hands the saver (ids, namespaces,
configs: ``InvalidArgument`` before anything is sent), turns a fenced script's
refusal into the error it stands for, and decodes a stored checkpoint record.
The concerns built on it each have a module of their own (``_put``, ``_reads``,
``_lister``, ``_maintenance``, ``_leases``); ``_core.SaverCore`` composes them.
Nothing here does I/O.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import msgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ..core.replies import text as reply_text
from ..core.validate import check_id
from ..errors import CorruptState, InvalidArgument, LeaseLost
from ..keys import MAX_ID_BYTES, Keys, ThreadKeys
from ..wire import corrupt_state
from ..wire.scripts import Reply
from ._compact import COMPACT, SHARE_BYTES, SHARE_BYTES_OTHER_SERDE, expand_record
from ._records import SEP, _reads_and_body, _Remembered
from .errors import ThreadBusy

__all__ = ["SaverBase", "thread_of"]

MAX_TTL_S = 100 * 366 * 24 * 3600
#: Threads whose built keys a saver keeps (see ``SaverBase._built``).
THREAD_KEYS_CACHE = 4096


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


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


@dataclass
class SaverBase:
    """The state and the checks every saver operation shares (``SaverCore`` composes the operations)."""

    namespace: str
    serde: SerializerProtocol
    ttl: float | timedelta | None = None
    refresh_on_read: bool = False
    keys: Keys = field(init=False)
    #: thread id -> token of the lease this saver holds on it (set by the lease shells).
    tokens: dict[str, str] = field(default_factory=dict)
    lists: OrderedDict[tuple[str, str, str], _Remembered] = field(default_factory=OrderedDict)
    #: thread id -> (``keys.version`` they were built in, its keys, their list): every operation names its
    #: thread's nine keys, and building them (CRC of the id, nine concatenations) was a tenth of a put's
    #: client time. A reshard bumps the version, so keys of an older layout are never reused.
    _thread_keys: dict[str, tuple[int, ThreadKeys, list[str]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.keys = Keys.unresolved(self.namespace)
        self.ttl_ms = _ttl_ms(self.ttl)
        if not isinstance(self.refresh_on_read, bool):
            raise InvalidArgument(f"refresh_on_read must be a bool, got {self.refresh_on_read!r}")

    # ---- helpers --------------------------------------------------------

    def thread_keys(self, thread_id: str) -> list[str]:
        """The thread's keys in the order every ``lg_*`` script takes them (shared: not to be changed)."""
        return self._built(thread_id)[2]

    def thread_key_set(self, thread_id: str) -> ThreadKeys:
        return self._built(thread_id)[1]

    def _built(self, thread_id: str) -> tuple[int, ThreadKeys, list[str]]:
        version = self.keys.version
        hit = self._thread_keys.get(thread_id)
        if hit is not None and hit[0] == version:
            return hit
        keys = self.keys.thread(thread_id)
        if len(self._thread_keys) >= THREAD_KEYS_CACHE:
            self._thread_keys.clear()  # a saver touching this many threads rebuilds them; no LRU bookkeeping per call
        built = self._thread_keys[thread_id] = (version, keys, keys.as_list())
        return built

    def ttl_arg(self) -> str:
        return "" if self.ttl_ms is None else str(self.ttl_ms)

    def token_of(self, thread_id: str) -> str:
        return self.tokens.get(thread_id, "")

    def fenced(self, reply: Any, thread_id: str, what: str) -> Any:
        """``reply`` of a fenced script, or the error it stands for (nothing was written then)."""
        if int(reply[0]) == Reply.DONE:
            return reply
        why = reply_text(reply[1])
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
            member = reply_text(reply[2])
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

    def typed(self, value: Any, what: str) -> tuple[str, bytes]:
        """``serde.dumps_typed(value)``; a value it cannot encode is the caller's: ``InvalidArgument``,
        raised before anything is sent."""
        try:
            return self.serde.dumps_typed(value)
        except Exception as exc:
            raise InvalidArgument(
                f"{what} cannot be serialized by {type(self.serde).__name__}: {type(exc).__name__}: {exc}"
            ) from exc

    def dumps(self, value: Any, what: str = "a channel value") -> bytes:
        kind, data = self.typed(value, what)
        return cast(bytes, msgpack.packb([kind, data], use_bin_type=True))

    def load_value(self, kind: Any, data: Any, key: str, what: str) -> Any:
        """``serde.loads_typed`` of a value read from ``key``: one it cannot read is corrupt data, not a crash."""
        try:
            return self.serde.loads_typed((kind, data))
        except Exception as exc:
            raise corrupt_state(key, [key], f"holds {what} its serializer cannot read ({exc!r:.160})") from exc

    @property
    def plain_serde(self) -> bool:
        """True for LangGraph's own serializer: records are then stored compact and long values shared
        (see ``_compact``); another one (``EncryptedSerializer``) must see every record whole."""
        return isinstance(self.serde, JsonPlusSerializer)

    @property
    def share_bytes(self) -> int:
        """The stored length from which a channel value or pending write is stored apart and referenced
        (``_compact``): every serializer's values past DEFER_BYTES, so that no script copies a long one."""
        return SHARE_BYTES if self.plain_serde else SHARE_BYTES_OTHER_SERDE

    def unpack_record(self, raw: bytes, key: str, cid: str = "") -> tuple[Any, ...]:
        """``(parent, checkpoint body or None, ck_kind, ck_data, md_kind, md_data)`` of a stored record:
        a compact one comes with its body decoded, a serde one with its kind and data."""
        try:
            reads, packed = _reads_and_body(raw, key)
            fields = msgpack.unpackb(packed, raw=False)
        except CorruptState:
            raise
        except Exception as exc:
            raise corrupt_state(key, [key], f"holds a malformed checkpoint record: {exc}") from exc
        if isinstance(fields, list) and fields and fields[0] == COMPACT and type(fields[0]) is int:
            channels = [f.split(b"\0")[1].decode("utf-8", "replace") if f.count(b"\0") == 2 else "" for f in reads]
            expanded = expand_record(fields, cid, channels)
            if expanded is None:
                raise corrupt_state(key, [key], "holds a compact checkpoint record of the wrong shape")
            parent, body, md_kind, md_data = expanded
            return parent, body, None, None, md_kind, md_data
        if not isinstance(fields, list) or len(fields) != 5 or not isinstance(fields[0], (str, type(None))):
            raise corrupt_state(key, [key], "holds a checkpoint record of the wrong shape")
        parent, ck_kind, ck_data, md_kind, md_data = fields
        return parent, None, ck_kind, ck_data, md_kind, md_data

    def record(self, raw: bytes, key: str, cid: str) -> tuple[str | None, Any, Any]:
        parent, checkpoint, ck_kind, ck_data, md_kind, md_data = self.unpack_record(raw, key, cid)
        if checkpoint is None:
            checkpoint = self.load_value(ck_kind, ck_data, key, "a checkpoint")
        if not isinstance(checkpoint, dict):
            raise corrupt_state(key, [key], "holds a checkpoint that is not a dict")
        return parent, checkpoint, self.metadata_of(md_kind, md_data, key)

    def metadata(self, raw: bytes, key: str) -> Any:
        md_kind, md_data = self.unpack_record(raw, key)[4:]
        return self.metadata_of(md_kind, md_data, key)

    def metadata_of(self, kind: Any, data: Any, key: str) -> Any:
        # kind None: a compact record's plain metadata, already decoded.
        metadata = data if kind is None else self.load_value(kind, data, key, "checkpoint metadata")
        if not isinstance(metadata, dict):
            raise corrupt_state(key, [key], "holds checkpoint metadata that is not a dict")
        return metadata
