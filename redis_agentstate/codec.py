"""Versioned msgpack codec for every opaque value the library stores.

Each blob starts with one format byte so a later release can read what this
one wrote (and refuse, loudly, what it cannot). Lua never looks inside a blob:
scalars the scripts compare live in their own hash fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack

from .errors import CorruptState, InvalidArgument

__all__ = ["FORMAT_VERSION", "decode", "encode"]

FORMAT_VERSION = 1
"""The first byte of every msgpack value this library stores (a later format gets a new one)."""
_PREFIX = bytes([FORMAT_VERSION])


#: A packer per thread, reused: ``msgpack.packb`` builds one (and allocates its 1 MiB
#: buffer) on every call, which is most of what packing a small value costs. Per thread,
#: because packing user objects may run Python code (a dict subclass's ``items``) and so
#: let another thread in. The output is ``packb``'s, byte for byte.
_local = threading.local()
#: A packer whose buffer grew past this (a large write) is dropped, not kept for the thread.
_KEEP_PACKER_BYTES = 1 << 20


def encode(value: Any, *, what: str | Callable[[], str]) -> bytes:
    """Serialise ``value`` with the format byte; ``InvalidArgument`` if it cannot be.

    ``what`` names the value in that error; a callable is called only then (the hot
    paths would otherwise format a name per value they send).
    """
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True, datetime=False)
    try:
        # Packed one level down, in a list of one: msgpack packs 1025 levels but reads back only 1024
        # (its unpacker's stack), so a value that deep was written and then never loaded again
        # (CorruptState). The list costs the nesting limit that level; its header (0x91) is dropped.
        packed: bytes = packer.pack([value])  # autoreset: the packer is empty again, also after an error
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        name = what() if callable(what) else what
        raise InvalidArgument(f"{name} is not msgpack-serialisable: {exc}") from exc
    if len(packed) > _KEEP_PACKER_BYTES:
        del _local.packer
    # A slice copies, a memoryview costs more than a small slice: one copy of a large value either way.
    return _PREFIX + (packed[1:] if len(packed) <= 4096 else memoryview(packed)[1:])


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def _frozen_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    return {_freeze(k): v for k, v in pairs}


def decode(blob: bytes, *, key: str, task_id: str | None = None) -> Any:
    """Inverse of :func:`encode`; ``CorruptState`` naming ``key`` on any bad byte."""
    if not blob or blob[0] != FORMAT_VERSION:
        found = blob[0] if blob else None
        raise CorruptState(
            f"value at {key!r} has unknown format byte {found!r} (expected {FORMAT_VERSION})",
            key=key,
            task_id=task_id,
        )
    try:
        try:
            return msgpack.unpackb(blob[1:], raw=False, strict_map_key=False, use_list=True)
        except TypeError:
            # A map key written as a tuple comes back as an (unhashable) list: read it as a tuple.
            return msgpack.unpackb(
                blob[1:], raw=False, strict_map_key=False, use_list=True, object_pairs_hook=_frozen_keys
            )
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CorruptState(f"value at {key!r} does not decode: {exc}", key=key, task_id=task_id) from exc
