"""What a pool stores, checked and encoded: the models' checks, their stored maps, and reading them back.

Configs compare by their bytes in Lua, so they are encoded canonically; a
stored map the library would not have written reads as ``CorruptState``.
Used by ``core.pool`` and ``core.pool_log``; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from ..codec import decode
from ..errors import CorruptState, InvalidArgument
from ..pool_models import (
    MessageReceipt,
    PoolConfig,
    PoolMember,
    RunMessage,
    StoredMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from .validate import check_id

T = TypeVar("T")


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
