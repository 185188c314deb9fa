"""Growing a live namespace to more shards: ``CheckpointStore.reshard`` and ``agentstate reshard``.

A namespace of ``n`` shards grows to ``target`` (a multiple of ``n``, up to ``MAX_SHARDS``), one
old shard at a time, while its workers keep claiming and committing::

    record 'slots n'  ->  'slots n target 0'              (reshard_record.lua: compare-and-set)
    for each old shard o (in order, from the record's count of moved shards):
        seal o                                            (reshard_seal.lua: '<prefix o>moved' = sealed)
        copy every key of o to its new shard              (DUMP, then reshard_restore.lua: RESTORE)
            an owner's keys (a task's, a pool's, ...) go whole to the owner's new shard
            crc32(owner) % target, which is o + j * n for some j (so each new shard is fed
            by exactly one old shard); o's indexes are split by member; its epoch counter
            goes to each new shard, its counters to new shard o
        mark o moved, delete its keys                     (reshard_drop.lua)
        record 'slots n target o+1'                       (clients now route o's owners anew)
    record 'slots target'

What a worker sees while its task moves: every script of a sealed shard refuses
(``_moved.lua``) and every plain read of it finds the seal (``_ops/relocation.py``); the driver
re-reads the record and, while the shard is being copied, sends the same request again after a
short wait (2 ms, doubling to 50 ms); once the record counts the shard, it sends the request to
the task's new shard, with the same arguments: a commit keeps its digest and a create its nonce,
and the task's write ring (``applied``) moved with it, so a write whose reply was lost before the
seal is recognised at the new place, and nothing is applied twice. The task's fence (revision,
token, lease expiry in server ms) moves inside its checkpoint hash, unchanged. A worker's call
is paused for about as long as its old shard takes to copy (``ReshardReport.worst_pause_ms``);
no call fails because of it unless a seal outlives ``SEALED_WAIT_S`` (a reshard that stopped
half-way: running it again with the same count finishes it, from the shard it stopped at).

Nothing here does I/O; ``reshard`` is an op like any other, driven without relocation (it reads
sealed shards on purpose).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import scripts as S
from ._ops import Call, Command, Op, Pipe
from ._ops.layout import parse_layout
from .errors import ConfigConflict, InvalidArgument
from .keys import KEY_TYPES, LAYOUT_SLOTS, MAX_SHARDS, RUN_KINDS, Keys, check_shards, key_slot, live_prefixes

__all__ = ["ReshardReport", "reshard"]

#: The indexes a shard keeps of what it holds, split by member when the shard moves.
_INDEXES = {"tasks", "ready", "parked", "pools", "kvkeys", "kvttl", "lgthreads", "lgruns"}
#: Keys read (DUMP) per round trip, and written per reshard_restore.lua call (or fewer, by bytes).
_BATCH_KEYS = 256
_BATCH_BYTES = 4 << 20
#: Keys a SCAN call walks (a single server; a Cluster lists the shard's slot instead).
_SCAN_COUNT = 1_000


@dataclass(frozen=True, slots=True)
class ReshardReport:
    """What a reshard did: ``from_shards`` to ``to_shards``, how many old shards it moved now
    (``moved``; 0 when the namespace had that count already), the keys it copied, and the
    longest any old shard stayed sealed (``worst_pause_ms``: what a worker's call waited at most)."""

    namespace: str
    from_shards: int
    to_shards: int
    moved: int
    keys: int
    seconds: float
    worst_pause_ms: float
    #: Keys under an old shard's tag that no kind of this library's explains (left where they are).
    unknown: int = 0


def check_target(current: int, target: object) -> int:
    """A reshard's ``shards``: more than ``current``, a multiple of it, at most ``MAX_SHARDS``."""
    shards = check_shards(target)
    if shards < current or shards % current:
        raise InvalidArgument(
            f"a namespace of {current} shards grows to a multiple of {current} (up to {MAX_SHARDS}), "
            f"not {shards}: each new shard is fed by one old shard"
        )
    return shards


def _owner(rest: bytes) -> bytes | None:
    """The owner id of a key (its part after the shard prefix), or None for a shard's own key.

    A run's hash and events (``keys.RUN_KINDS``: ``<thread_id>\\0<run_id>``) belong to the thread."""
    kind, sep, ident = rest.partition(b":")
    if not sep:
        return None
    if kind.decode("utf-8", "replace") in RUN_KINDS:
        return ident.partition(b"\0")[0]
    return ident


class _Mover:
    """The copy of one old shard: what it read and where each piece goes."""

    def __init__(self, old_prefix: str, new_prefixes: list[str], o: int) -> None:
        self.old = old_prefix.encode()
        self.new = [p.encode() for p in new_prefixes]
        self.o = o

    def child(self, owner: bytes) -> bytes:
        return self.new[zlib.crc32(owner) % len(self.new)]

    def home(self) -> bytes:
        """New shard ``o``: where the old shard's counters (and shard 0's limits registry) go."""
        return self.new[self.o]


def reshard(
    keys: Keys, target: int, *, cluster: bool, progress: Callable[[int, int], None] | None = None
) -> Op[ReshardReport]:
    """Grow ``keys.namespace`` to ``target`` shards (see the module docstring). ``keys`` is the
    caller's, configured by the record as it stands (it is reconfigured as shards move);
    ``cluster``: list a shard's keys by slot (``CLUSTER GETKEYSINSLOT``) rather than ``SCAN``;
    ``progress(moved, of)`` after each old shard."""
    started = time.monotonic()
    record_key = keys.layout_key()
    (raw,) = yield Pipe([("GET", record_key)])
    if raw is None:
        raise InvalidArgument(f"namespace {keys.namespace!r} has no layout record: nothing to reshard")
    layout, n, to, moved = parse_layout(raw, record_key)
    if not to:
        target = check_target(n, target)
        if target == n:
            keys.configure(n, layout)
            return ReshardReport(keys.namespace, n, n, 0, 0, time.monotonic() - started, 0.0)
        yield from _probe(keys, cluster)
        yield from _record(record_key, f"{layout} {n}", f"{layout} {n} {target} 0")
        to, moved = target, 0
    elif to != check_shards(target):
        raise ConfigConflict(
            f"namespace {keys.namespace!r} is being resharded from {n} to {to} shards ({moved} of {n} moved): "
            f"finish that (reshard to {to}) before another",
            key=record_key,
        )
    old_prefixes = live_prefixes(keys.namespace, n, layout)
    new_all = live_prefixes(keys.namespace, to, LAYOUT_SLOTS)
    copied, pauses, unknown, first = 0, [0.0], 0, moved
    for o in range(moved, n):
        keys.configure(n, layout, to, o)
        children = [new_all[o + j * n] for j in range(to // n)]
        sealed_at = time.monotonic()
        mover = _Mover(old_prefixes[o], new_all, o)
        got, strange = yield from _move_shard(mover, children, cluster)
        copied += got
        unknown += strange
        yield from _record(record_key, f"{layout} {n} {to} {o}", f"{layout} {n} {to} {o + 1}")
        pauses.append((time.monotonic() - sealed_at) * 1000)
        if progress is not None:
            progress(o + 1, n)
    yield from _record(record_key, f"{layout} {n} {to} {n}", f"{LAYOUT_SLOTS} {to}")
    keys.configure(to, LAYOUT_SLOTS)
    return ReshardReport(keys.namespace, n, to, n - first, copied, time.monotonic() - started, max(pauses), unknown)


def _probe(keys: Keys, cluster: bool) -> Op[None]:
    """Every command a reshard sends, tried before the first seal, so that a client not allowed them
    (an ACL without ``RESHARD_COMMANDS``, see docs/operations.md) fails with nothing sealed: a read of
    the keyspace, a DUMP and PTTL of the record, and a RESTORE of it to a probe key beside it that
    expires in a second."""
    record = keys.layout_key()
    tag = record[record.index("{") + 1 : record.index("}")]
    if cluster:
        yield Command(["CLUSTER COUNTKEYSINSLOT", key_slot(tag.encode())])
    else:
        yield Command(["SCAN", 0, "MATCH", record, "COUNT", 1])
    payload, _ = yield Pipe([("DUMP", record), ("PTTL", record)])
    (now,) = yield Pipe([("TIME",)])
    expires = int(now[0]) * 1000 + int(now[1]) // 1000 + 1000
    yield Call(S.RESHARD_RESTORE, [record.removesuffix("layout") + "reshard-probe"], ["r", 2, expires, payload])


def _record(key: str, expect: str, write: str) -> Op[None]:
    stored = yield Call(S.RESHARD_RECORD, [key], [expect, write])
    text = stored.decode() if isinstance(stored, bytes) else str(stored)
    if text != write:
        raise ConfigConflict(
            f"layout record {key!r} holds {text!r}, not {expect!r}: another reshard of the namespace is running",
            key=key,
        )


def _shard_keys(mover: _Mover, cluster: bool) -> Op[list[bytes]]:
    """Every key of the old shard (it is sealed: no key appears in it any more)."""
    prefix = mover.old
    found: list[bytes] = []
    if cluster:
        tag = prefix[prefix.index(b"{") + 1 : prefix.index(b"}")]
        slot = key_slot(tag)
        count = yield Command(["CLUSTER COUNTKEYSINSLOT", slot])
        if int(count):
            got = yield Command(["CLUSTER GETKEYSINSLOT", slot, int(count)])
            # redis-py's cluster client decodes this reply (keys are UTF-8: the ids are)
            found = [k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in got]
    else:
        cursor: Any = 0
        pattern = prefix + b"*"  # the namespace and the tag hold no glob characters
        while True:
            cursor, page = yield Command(["SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT])
            found.extend(bytes(k) for k in page)
            if int(cursor) == 0:
                break
    return sorted({k for k in found if k.startswith(prefix)})


def _pairs(reply: Any) -> list[tuple[bytes, Any]]:
    """``ZRANGE ... WITHSCORES`` as ``(member, score)``: RESP2 flat, or RESP3 pairs."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(bytes(m), sc) for m, sc in reply]
    return [(bytes(reply[i]), reply[i + 1]) for i in range(0, len(reply), 2)]


def _move_shard(mover: _Mover, children: list[str], cluster: bool) -> Op[tuple[int, int]]:
    """Seal, copy and drop one old shard; ``(keys copied, unknown keys left)``."""
    seal = mover.old + b"moved"
    state = yield Call(S.RESHARD_SEAL, [seal], [])
    if state in (b"moved", "moved"):
        return 0, 0  # copied and dropped by a reshard that stopped before counting it
    every = yield from _shard_keys(mover, cluster)
    whole: list[tuple[bytes, bytes]] = []  # (old key, new key) copied with DUMP/RESTORE
    split: list[tuple[bytes, bytes]] = []  # (old index, its kind) split by member
    gens: list[bytes] = []  # the epoch counter: one copy per new shard (epochs never repeat)
    unknown = 0
    for key in every:
        rest = key[len(mover.old) :]
        kind = rest.partition(b":")[0].decode("utf-8", "replace")
        owner = _owner(rest)
        if rest == b"moved":
            continue
        if kind not in KEY_TYPES or (owner is None and kind not in _INDEXES | {"gen", "counters", "limits"}):
            unknown += 1  # not ours to move (nor to delete)
        elif owner is None and kind in _INDEXES:
            split.append((key, rest))
        elif rest == b"gen":
            gens.append(key)
        elif owner is None:
            whole.append((key, mover.home() + rest))  # counters, and shard 0's limits registry
        else:
            whole.append((key, mover.child(owner) + rest))
    dropped = [old for old, _ in whole] + [old for old, _ in split] + gens
    whole += [(key, child.encode() + b"gen") for key in gens for child in children]
    writes: dict[bytes, list[tuple[bytes, list[Any]]]] = {}  # new shard prefix -> (new key, its ARGV)
    for i in range(0, len(whole), _BATCH_KEYS):
        batch = whole[i : i + _BATCH_KEYS]
        cmds: list[tuple[Any, ...]] = [("TIME",)]
        for old, _ in batch:
            cmds += [("DUMP", old), ("PTTL", old)]
        replies = yield Pipe(cmds)
        now = int(replies[0][0]) * 1000 + int(replies[0][1]) // 1000
        for j, (_, new) in enumerate(batch):
            payload, ttl = replies[1 + 2 * j], int(replies[2 + 2 * j])
            if payload is None:
                continue  # expired since it was listed
            expires = now + ttl if ttl > 0 else 0
            writes.setdefault(new[: new.index(b"}:") + 2], []).append((new, ["r", 2, expires, payload]))
    for old, rest in split:
        (members,) = yield Pipe([("ZRANGE", old, 0, -1, "WITHSCORES")])
        by_child: dict[bytes, list[Any]] = {}
        for member, score in _pairs(members):
            owner = member.partition(b"\0")[2] if rest == b"lgruns" else member
            by_child.setdefault(mover.child(owner), []).extend((repr(float(score)), member))
        for child, pairs in by_child.items():
            writes.setdefault(child, []).append((child + rest, ["z", len(pairs), *pairs]))
    for _child, entries in sorted(writes.items()):
        call_keys: list[bytes] = []
        args: list[Any] = []
        size = 0
        for new, part in entries:
            if call_keys and (len(call_keys) >= _BATCH_KEYS or size > _BATCH_BYTES):
                yield Call(S.RESHARD_RESTORE, call_keys, args)
                call_keys, args, size = [], [], 0
            call_keys.append(new)
            args += part
            size += sum(len(a) for a in part if isinstance(a, bytes))
        yield Call(S.RESHARD_RESTORE, call_keys, args)
    due = mover.old + b"due"
    for i in range(0, max(1, len(dropped)), _BATCH_KEYS):
        yield Call(S.RESHARD_DROP, [seal, *dropped[i : i + _BATCH_KEYS]], [due])
    return len(dropped), unknown
