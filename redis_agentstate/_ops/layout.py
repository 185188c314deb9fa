"""A namespace's layout: how many shards it has and how their hash tags are made, read once per store.

The layout is part of the on-disk format, so every client of a namespace must agree on it: it is
stored in Redis with the namespace (``Keys.layout_key``, a string ``"<layout> <shards>"``) by the
first client that uses the namespace, and every store reads it before its first operation
(``SyncShell._layout`` / ``AsyncShell._layout``, from ``_drive``). A store built with ``shards=N``
that finds another count refuses (``ConfigConflict``) before anything is written; ``shards=None``
takes whatever is stored.

A namespace without a record either is new (it gets slot-aware tags and ``shards`` or 64 of them)
or held data written by 0.2, which knew only 64 shards tagged ``{ns#SS}``: when any of that
layout's indexes exists, the record says ``legacy 64`` and the data stays where it is.
Nothing here does I/O.
"""

from __future__ import annotations

from .. import scripts as S
from ..errors import ConfigConflict, CorruptState
from ..keys import DEFAULT_SHARDS, LAYOUT_LEGACY, LAYOUT_SLOTS, MAX_SHARDS, Keys
from .requests import Call, Op, Pipe

__all__ = ["parse_layout", "resolve_layout"]


def parse_layout(raw: object, key: str) -> tuple[str, int]:
    """A stored layout record -> ``(layout, shards)``; ``CorruptState`` when it is not one we write."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    layout, _, count = text.partition(" ")
    if layout in (LAYOUT_SLOTS, LAYOUT_LEGACY) and count.isdigit() and count == str(int(count)):
        shards = int(count)
        if 1 <= shards <= MAX_SHARDS and (layout == LAYOUT_SLOTS or shards == DEFAULT_SHARDS):
            return layout, shards
    raise CorruptState(f"layout record {key!r} holds {text[:80]!r}, not '<slots|legacy> <shards>'", key=key)


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
        raw = yield Call(S.LAYOUT_INIT, [record], [want])
    layout, shards = parse_layout(raw, record)
    if requested is not None and requested != shards:
        raise ConfigConflict(
            f"namespace {keys.namespace!r} has {shards} shards ({layout} layout, stored in {record!r}), "
            f"not the {requested} asked for: build the store with shards=None (or {shards}); a namespace's "
            "shard count is fixed when it is first used; nothing was written",
            key=record,
        )
    keys.configure(shards, layout)
