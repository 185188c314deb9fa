"""A namespace's layout: how many shards it has and how their hash tags are made, read once per store.

The layout is part of the on-disk format, so every client of a namespace must agree on it: it is
stored in Redis with the namespace (``Keys.layout_key``, a string ``"<layout> <shards>"``) by the
first client that uses the namespace, and every store reads it before its first operation
(``SyncShell._layout`` / ``AsyncShell._layout``, from ``_drive``). A store built with ``shards=N``
that finds another count refuses (``ConfigConflict``) before anything is written; ``shards=None``
takes whatever is stored.

A namespace without a record either is new (it gets slot-aware tags and ``shards`` or 64 of them)
or holds data written before namespaces had a record, on the fixed layout of 64 shards tagged
``{ns#SS}``: when any of that layout's indexes exists, the record says ``legacy 64`` and the data stays where it is.
Nothing here does I/O.
"""

from __future__ import annotations

from ..errors import ConfigConflict, CorruptState
from ..keys import DEFAULT_SHARDS, LAYOUT_LEGACY, LAYOUT_SLOTS, MAX_SHARDS, Keys
from . import scripts
from .requests import Call, Op, Pipe

__all__ = ["parse_layout", "refresh_layout", "resolve_layout"]


def parse_layout(raw: object, key: str) -> tuple[str, int, int, int]:
    """A stored layout record -> ``(layout, shards, target, moved)`` (``target`` 0: not resharding);
    ``CorruptState`` when it is not one we write."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    layout, *fields = text.split(" ")
    if layout in (LAYOUT_SLOTS, LAYOUT_LEGACY) and len(fields) in (1, 3) and all(_decimal(f) for f in fields):
        shards, target, moved = (int(f) for f in (*fields, "0", "0")[:3])
        counted = 1 <= shards <= MAX_SHARDS and (layout == LAYOUT_SLOTS or shards == DEFAULT_SHARDS)
        resharding = shards < target <= MAX_SHARDS and target % shards == 0 and moved <= shards
        if counted and (len(fields) == 1 or resharding):
            return layout, shards, target, moved
    raise CorruptState(
        f"layout record {key!r} holds {text[:80]!r}, not '<slots|legacy> <shards>[ <target> <moved>]'", key=key
    )


def _decimal(field: str) -> bool:
    return field.isdigit() and field.isascii() and field == str(int(field))


def resolve_layout(keys: Keys, requested: int | None) -> Op[None]:
    """Read (or, for a namespace that has none, write) the layout record and configure ``keys`` by it.

    One round trip for a namespace that has a record; a new one costs two more (the legacy
    indexes, then the record written by layout_init.lua, first writer wins)."""
    record = keys.layout_key()
    (raw,) = yield Pipe([("GET", record)])
    if raw is None:
        found = yield Pipe([("EXISTS", *indexes) for indexes in keys.legacy_indexes()])
        if any(int(n) for n in found):
            want = f"{LAYOUT_LEGACY} {DEFAULT_SHARDS}"
        else:
            want = f"{LAYOUT_SLOTS} {requested or DEFAULT_SHARDS}"
        raw = yield Call(scripts.LAYOUT_INIT, [record], [want])
    layout, shards, target, moved = parse_layout(raw, record)
    if requested is not None and requested not in (shards, target):
        raise ConfigConflict(
            f"namespace {keys.namespace!r} has {shards} shards ({layout} layout, stored in {record!r}), "
            f"not the {requested} asked for: build the store with shards=None (or {shards}); a namespace's "
            "shard count is fixed when it is first used; nothing was written",
            key=record,
        )
    keys.configure(shards, layout, target, moved)


def refresh_layout(keys: Keys) -> Op[bool]:
    """Read the layout record again (a request met a shard a reshard moved, or is moving) and
    configure ``keys`` by it; True when it changed. One round trip."""
    record = keys.layout_key()
    (raw,) = yield Pipe([("GET", record)])
    if raw is None:
        raise CorruptState(f"layout record {record!r} is gone while the namespace holds data", key=record)
    layout, shards, target, moved = parse_layout(raw, record)
    if (layout, shards, target, moved) == (keys.layout, keys.count, keys.target, keys.moved):
        return False
    keys.configure(shards, layout, target, moved)
    return True
