"""Growing a live namespace to more shards: ``CheckpointStore.reshard`` and ``agentstate reshard``.

A namespace of ``n`` shards grows to ``target`` (a multiple of ``n``, up to ``MAX_SHARDS``), one
old shard at a time, while its workers keep claiming and committing::

    check the arguments, read the record (a namespace without one and without data: refused)
    take the lease                                        (reshard_lease.lua: a new generation g)
    read the record again; claim every slot left to write  (reshard_fence.lua: '<prefix>fence' = g)
        each old shard o not moved yet, and each of its new shards
    record 'slots n'  ->  'slots n target 0'              (reshard_record.lua: fenced compare-and-set)
    for each old shard o (in order, from the record's count of moved shards):
        renew the lease
        seal o                                            (reshard_seal.lua: '<prefix o>moved' = sealed)
        copy every key of o to its new shard              (DUMP, then reshard_restore.lua: RESTORE)
            an owner's keys (a task's, a pool's, ...) go whole to the owner's new shard
            crc32(owner) % target, which is o + j * n for some j (so each new shard is fed
            by exactly one old shard); o's indexes are split by member; its epoch counter
            goes to each new shard, its counters to new shard o
        mark o moved, delete its keys                     (reshard_drop.lua)
        record 'slots n target o+1'                       (clients now route o's owners anew)
    record 'slots target', give the lease back

The fenced mover. A reshard is a job like any other this library fences: its lease (in the
record's slot: token, holder, expiry on the server's clock, generation) is taken before anything
is written and renewed as it goes (``LEASE_MS``). A second reshard while the lease is live is
refused (``ConfigConflict`` naming the holder and when its lease ends) and copies nothing. Once
the lease lapsed (the holder was killed, or is frozen), a new reshard takes it: a new generation,
written into the fence of every slot it will write (the record's, and each old and new shard's
not counted moved yet) before it writes anything else. Every reshard script refuses, writing
nothing, when its slot's fence holds another generation, and a fence never goes back: a mover
that was stalled (after its DUMP, say) and wakes after a newer one moved the shard, and workers
committed into the new shard, cannot write its stale copy there, nor seal, drop or record; it
stops with ``ConfigConflict`` ("fenced out"). The old shard is sealed from its seal to its drop,
so whichever mover copies it copies the same data, and its new shards are written by the mover
alone until the record counts it: a mover that takes over copies the whole old shard again. The
fences stay (one small key per shard's slot), so a mover woken any time later stays out.

Every key of the old shard moves, whatever else writes to its slot: on a Cluster the shard's slot
is also a live new shard's (and other namespaces'), so the slot is listed until a listing returns
fewer keys than it asked for (complete), and listed again after the drop until nothing of the
old shard is left. A shard found ``moved`` (a reshard stopped after its first delete batch: every
copy was made before it) has what is left of it deleted, and counted in the report.

What a worker sees while its task moves: every script of a sealed shard refuses
(``_moved.lua``) and every plain read of it finds the seal (``wire/relocation.py``); the driver
re-reads the record and, while the shard is being copied, sends the same request again after a
short wait (2 ms, doubling to 50 ms); once the record counts the shard, it sends the request to
the task's new shard, with the same arguments: a commit keeps its digest and a create its nonce,
and the task's write ring (``applied``) moved with it, so a write whose reply was lost before the
seal is recognised at the new place, and nothing is applied twice. The task's fence (revision,
token, lease expiry in server ms) moves inside its checkpoint hash, unchanged. A worker's call
is paused for about as long as its old shard takes to copy (``ReshardReport.worst_pause_ms``);
no call fails because of it unless a seal outlives ``SEALED_WAIT_S``: the error then says whether
a live reshard holds the namespace and when its lease ends, or that the one that sealed it
stopped (running the reshard again with the same count takes it over and finishes it, from the
shard it stopped at).

Nothing here does I/O; ``reshard`` is an op like any other, driven without relocation (it reads
sealed shards on purpose). Every reshard script is safe to re-send (a lost reply): a re-sent take
or renew of the lease is this token's, a claim of a fence this generation's, a seal answers
'sealed', a copy writes the same values, a drop deletes nothing more, and a record that already
says what the step writes was written by this mover (only it writes while the fence is its).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigConflict, InvalidArgument
from ..keys import (
    CRON_KINDS,
    DEFAULT_SHARDS,
    KEY_TYPES,
    LAYOUT_LEGACY,
    LAYOUT_SLOTS,
    MAX_SHARDS,
    RUN_KINDS,
    STORE_INDEXES,
    STORE_PREFIX_INDEXES,
    Keys,
    check_shards,
    key_slot,
    live_prefixes,
)
from ..wire import Call, Command, Op, Pipe, scripts
from ..wire.layout import parse_layout
from .replies import lenient_text

__all__ = ["ReshardReport", "reshard"]

#: The indexes a shard keeps of what it holds, split by member when the shard moves.
_INDEXES = {"tasks", "ready", "parked", "pools", "kvkeys", "kvttl", "lgthreads", "lgruns", *STORE_INDEXES}
#: A shard's own keys that move whole to the new shard of the same index (shard 00's stay in shard 00).
_HOME_KINDS = {"gen", "counters", "limits", *CRON_KINDS}
#: Keys read (DUMP) per round trip, and written per reshard_restore.lua call (or fewer, by bytes).
_BATCH_KEYS = 256
_BATCH_BYTES = 4 << 20
#: Keys a SCAN call walks (a single server; a Cluster lists the shard's slot instead).
_SCAN_COUNT = 1_000
#: How long a reshard's lease lasts unless renewed (server ms); it is renewed before each old shard
#: and every third of this while one is copied. Shorter than ``SEALED_WAIT_S``: a reshard that died
#: can be taken over before the workers waiting on its seal give up.
LEASE_MS = 20_000


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

    A run's hash and events (``keys.RUN_KINDS``: ``<thread_id>\\0<run_id>``) belong to the thread; a
    cron's hash (``keys.CRON_KINDS``) to shard 00, with the cron indexes."""
    kind, sep, ident = rest.partition(b":")
    if not sep or kind.decode("utf-8", "replace") in CRON_KINDS:
        return None  # a shard's own key; the crons are shard 00's (they stay in the new shard 00)
    if kind.decode("utf-8", "replace") in RUN_KINDS:
        return ident.partition(b"\0")[0]
    return ident


class _Mover:
    """The copy of one old shard: what it read and where each piece goes."""

    def __init__(self, old_prefix: str, new_prefixes: list[str], o: int, n: int = 1) -> None:
        self.old = old_prefix.encode()
        self.new = [p.encode() for p in new_prefixes]
        self.o = o
        self.n = n  # the old shard count

    def child(self, owner: bytes) -> bytes:
        return self.new[zlib.crc32(owner) % len(self.new)]

    def prefix_children(self, path: bytes) -> set[bytes]:
        """The new shards of a store index member (``keys.STORE_PREFIX_INDEXES``): the new shard of each
        prefix of the path (itself included) whose old shard is this one; none for a stray member."""
        labels = path.split(b"\0")
        prefixes = (b"\0".join(labels[:k]) for k in range(1, len(labels) + 1))
        return {self.child(p) for p in prefixes if zlib.crc32(p) % self.n == self.o}

    def home(self) -> bytes:
        """New shard ``o``: where the old shard's counters (and shard 0's limits registry) go."""
        return self.new[self.o]


class _Holder:
    """This reshard's hold on the namespace: its lease (token, holder, generation) and when it was last
    renewed; every write it makes carries its generation, which the slot's fence must hold."""

    def __init__(self, keys: Keys) -> None:
        self.namespace = keys.namespace
        record = keys.layout_key()
        self.record = record
        self.lease = record.removesuffix("layout") + "reshard"
        self.fence = record.removesuffix("layout") + "fence"
        self.token = uuid.uuid4().hex
        self.holder = f"{socket.gethostname()} pid {os.getpid()}"
        self.gen = 0
        self.renewed = 0.0

    def take(self) -> Op[None]:
        """The lease, or ``ConfigConflict`` naming the live holder and when its lease ends."""
        granted, gen, holder, expires, now = yield Call(
            scripts.RESHARD_LEASE, [self.lease, self.fence], ["take", self.token, self.holder, LEASE_MS]
        )
        if not int(granted):
            raise ConfigConflict(
                f"namespace {self.namespace!r} is being resharded by {lenient_text(holder)} (generation {int(gen)}), "
                f"whose lease runs {(int(expires) - int(now)) / 1000:.1f} s more (to server time {int(expires)} ms): "
                "nothing was written; wait for it to finish, or, should it have stopped, run this again once "
                "its lease lapsed: that reshard takes it over and finishes it",
                key=self.lease,
            )
        self.gen = int(gen)
        self.renewed = time.monotonic()

    def renew(self, *, every: float | None = None) -> Op[None]:
        """Extend the lease (when ``every`` seconds passed since the last renewal, if given)."""
        if every is not None and time.monotonic() - self.renewed < every:
            return
        granted, gen, holder, _, _ = yield Call(
            scripts.RESHARD_LEASE, [self.lease, self.fence], ["renew", self.token, self.holder, LEASE_MS]
        )
        if not int(granted):
            raise self.fenced_out(f"its lease was taken over by {lenient_text(holder)} (generation {int(gen)})")
        self.renewed = time.monotonic()

    def release(self) -> Op[None]:
        yield Call(scripts.RESHARD_LEASE, [self.lease, self.fence], ["release", self.token, self.holder, LEASE_MS])

    def claim(self, prefix: bytes) -> Op[None]:
        """Write this generation into the fence of ``prefix``'s slot (refused when a newer one is there)."""
        stored = yield Call(scripts.RESHARD_FENCE, [prefix + b"fence"], [self.gen])
        if int(stored) != self.gen:
            raise self.fenced_out(f"generation {int(stored)} claimed {prefix.decode()!r}")

    def fenced_out(self, why: str) -> ConfigConflict:
        return ConfigConflict(
            f"this reshard of namespace {self.namespace!r} (generation {self.gen}) was fenced out: {why}; "
            "it wrote nothing after that, and the newer reshard finishes the move",
            key=self.lease,
        )


def reshard(
    keys: Keys, target: int, *, cluster: bool, progress: Callable[[int, int], None] | None = None
) -> Op[ReshardReport]:
    """Grow ``keys.namespace`` to ``target`` shards (see the module docstring). ``keys`` is the
    caller's, unresolved (configured here by the record as it stands, and as shards move);
    ``cluster``: list a shard's keys by slot (``CLUSTER GETKEYSINSLOT``) rather than ``SCAN``;
    ``progress(moved, of)`` after each old shard. Every argument is checked, and the namespace is
    found, before anything is written."""
    started = time.monotonic()
    check_shards(target)
    if progress is not None and not callable(progress):
        raise InvalidArgument(f"progress must be a callable (moved, of) or None, got {progress!r}")
    record_key = keys.layout_key()
    (raw,) = yield Pipe([("GET", record_key)])
    if raw is None:
        found = yield Pipe([("EXISTS", *indexes) for indexes in keys.legacy_indexes()])
        if not any(int(n) for n in found):
            raise InvalidArgument(
                f"namespace {keys.namespace!r} does not exist (no layout record {record_key!r}, no data): "
                "nothing to reshard, nothing was written; is the name right?"
            )
        raw = yield Call(scripts.LAYOUT_INIT, [record_key], [f"{LAYOUT_LEGACY} {DEFAULT_SHARDS}"])
    layout, n, to, moved = parse_layout(raw, record_key)
    keys.configure(n, layout, to, moved)
    if not to:
        target = check_target(n, target)
        if target == n:
            return ReshardReport(keys.namespace, n, n, 0, 0, time.monotonic() - started, 0.0)
    elif to != target:
        raise ConfigConflict(
            f"namespace {keys.namespace!r} is being resharded from {n} to {to} shards ({moved} of {n} moved): "
            f"finish that (reshard to {to}) before another",
            key=record_key,
        )
    hold = _Holder(keys)
    yield from hold.take()
    try:
        return (yield from _fenced(keys, hold, target, cluster, progress, started))
    except GeneratorExit:
        raise
    except BaseException:
        # This mover writes nothing more: the next reshard need not wait for its lease to lapse.
        with contextlib.suppress(Exception):  # the error that stopped it is the one to report
            yield from hold.release()
        raise


def _fenced(
    keys: Keys, hold: _Holder, target: int, cluster: bool, progress: Callable[[int, int], None] | None, started: float
) -> Op[ReshardReport]:
    """The reshard once ``hold`` has the lease: the record read again (it may have moved on while
    the lease was taken), every slot left to write claimed, then the shards moved."""
    record_key = hold.record
    (raw,) = yield Pipe([("GET", record_key)])
    layout, n, to, moved = parse_layout(raw, record_key)
    keys.configure(n, layout, to, moved)
    if not to:
        target = check_target(n, target)
        if target == n:  # another reshard finished it meanwhile
            yield from hold.release()
            return ReshardReport(keys.namespace, n, n, 0, 0, time.monotonic() - started, 0.0)
    elif to != target:
        raise ConfigConflict(
            f"namespace {keys.namespace!r} is being resharded to {to} shards, not {target}", key=record_key
        )
    else:
        target = to
    old_prefixes = live_prefixes(keys.namespace, n, layout)
    new_all = live_prefixes(keys.namespace, target, LAYOUT_SLOTS)
    # Before anything moves, this generation takes every slot it may write: a mover it took over
    # from (stalled, not dead) is refused from here on, wherever it was.
    for o in range(moved, n):
        yield from hold.claim(old_prefixes[o].encode())
        for j in range(target // n):
            yield from hold.claim(new_all[o + j * n].encode())
    yield from _probe(keys, hold, cluster)
    if not to:
        yield from _record(hold, f"{layout} {n}", f"{layout} {n} {target} 0")
        to = target
    copied, pauses, unknown, first = 0, [0.0], 0, moved
    for o in range(moved, n):
        yield from hold.renew()
        keys.configure(n, layout, to, o)
        children = [new_all[o + j * n] for j in range(to // n)]
        sealed_at = time.monotonic()
        mover = _Mover(old_prefixes[o], new_all, o, n)
        got, strange = yield from _move_shard(mover, children, cluster, hold)
        copied += got
        unknown += strange
        yield from _record(hold, f"{layout} {n} {to} {o}", f"{layout} {n} {to} {o + 1}")
        pauses.append((time.monotonic() - sealed_at) * 1000)
        if progress is not None:
            progress(o + 1, n)
    yield from _record(hold, f"{layout} {n} {to} {n}", f"{LAYOUT_SLOTS} {to}")
    yield from hold.release()
    keys.configure(to, LAYOUT_SLOTS)
    return ReshardReport(keys.namespace, n, to, n - first, copied, time.monotonic() - started, max(pauses), unknown)


def _probe(keys: Keys, hold: _Holder, cluster: bool) -> Op[None]:
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
    probe = record.removesuffix("layout") + "reshard-probe"
    written = yield Call(scripts.RESHARD_RESTORE, [hold.fence, probe], [hold.gen, "r", 2, expires, payload])
    if lenient_text(written) == "fenced":
        raise hold.fenced_out("another generation holds the layout record")


def _record(hold: _Holder, expect: str, write: str) -> Op[None]:
    status, stored = yield Call(scripts.RESHARD_RECORD, [hold.record, hold.fence], [hold.gen, expect, write])
    if lenient_text(status) == "fenced":
        raise hold.fenced_out(f"another generation holds the layout record, which says {lenient_text(stored)!r}")
    if lenient_text(status) != "ok":
        raise ConfigConflict(
            f"layout record {hold.record!r} holds {lenient_text(stored)!r}, not {expect!r}: nothing was written",
            key=hold.record,
        )


def _shard_keys(mover: _Mover, cluster: bool) -> Op[list[bytes]]:
    """Every key of the old shard (it is sealed: no key appears in it any more). On a Cluster the
    slot is listed whole: other keys of the slot (a live new shard's, other namespaces') come and
    go meanwhile, so a listing counts only when it returned fewer keys than it asked for."""
    prefix = mover.old
    found: list[bytes] = []
    if cluster:
        tag = prefix[prefix.index(b"{") + 1 : prefix.index(b"}")]
        slot = key_slot(tag)
        count = int((yield Command(["CLUSTER COUNTKEYSINSLOT", slot])))
        ask = 2 * count + 128
        while True:
            got = yield Command(["CLUSTER GETKEYSINSLOT", slot, ask])
            if len(got) < ask:
                break
            ask *= 2  # the slot grew past the window: list again, wider
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


def _move_shard(mover: _Mover, children: list[str], cluster: bool, hold: _Holder) -> Op[tuple[int, int]]:
    """Seal, copy and drop one old shard; ``(keys copied or deleted, unknown keys left)``.

    Listed again after each drop until a listing finds nothing of the shard to move: on a Cluster
    that is the check that no key was missed. A shard found 'moved' (a reshard stopped after it
    began the drop, so every copy was made) has what is left of it deleted."""
    seal = mover.old + b"moved"
    fence = mover.old + b"fence"
    state = lenient_text((yield Call(scripts.RESHARD_SEAL, [fence, seal], [hold.gen])))
    if state == "fenced":
        raise hold.fenced_out(f"another generation holds {mover.old.decode()!r}")
    copy = state != "moved"
    done, unknown = 0, 0
    while True:
        every = yield from _shard_keys(mover, cluster)
        dropped, unknown, writes = _plan(mover, children, every)
        if not dropped:
            return done, unknown
        if copy:
            yield from _copy(mover, writes, dropped, hold)
        due = mover.old + b"due"
        for i in range(0, len(dropped), _BATCH_KEYS):
            yield from hold.renew(every=LEASE_MS / 3000)
            gone = yield Call(scripts.RESHARD_DROP, [fence, seal, *dropped[i : i + _BATCH_KEYS]], [hold.gen, due])
            if lenient_text(gone) == "fenced":
                raise hold.fenced_out(f"another generation holds {mover.old.decode()!r}")
        done += len(dropped)
        if not cluster:
            return done, unknown  # SCAN lists every key present throughout, and the shard is sealed


def _plan(mover: _Mover, children: list[str], every: list[bytes]) -> tuple[list[bytes], int, list[Any]]:
    """What to do with the old shard's keys ``every``: the keys to drop once copied, how many are not
    ours, and the copies (``(old, new)`` whole, ``(old index, kind)`` split, epoch counters)."""
    whole: list[tuple[bytes, bytes]] = []  # (old key, new key) copied with DUMP/RESTORE
    split: list[tuple[bytes, bytes]] = []  # (old index, its kind) split by member
    gens: list[bytes] = []  # the epoch counter: one copy per new shard (epochs never repeat)
    unknown = 0
    for key in every:
        rest = key[len(mover.old) :]
        kind = rest.partition(b":")[0].decode("utf-8", "replace")
        owner = _owner(rest)
        if rest in (b"moved", b"fence"):
            continue  # the shard's own bookkeeping: kept
        if kind not in KEY_TYPES or (owner is None and kind not in _INDEXES | _HOME_KINDS):
            unknown += 1  # not ours to move (nor to delete)
        elif owner is None and kind in _INDEXES:
            split.append((key, rest))
        elif rest == b"gen":
            gens.append(key)
        elif owner is None:
            whole.append((key, mover.home() + rest))  # counters, and shard 0's limits registry and crons
        else:
            whole.append((key, mover.child(owner) + rest))
    dropped = [old for old, _ in whole] + [old for old, _ in split] + gens
    whole += [(key, child.encode() + b"gen") for key in gens for child in children]
    return dropped, unknown, [whole, split]


def _copy(mover: _Mover, plan: list[Any], dropped: list[bytes], hold: _Holder) -> Op[None]:
    """Write the copies ``plan`` (``_plan``) to the new shards, each call fenced by its slot."""
    whole, split = plan
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
            if rest.decode() in STORE_PREFIX_INDEXES:
                targets = mover.prefix_children(member)
            else:
                targets = {mover.child(member.partition(b"\0")[2] if rest == b"lgruns" else member)}
            for child in targets:
                by_child.setdefault(child, []).extend((repr(float(score)), member))
        for child, pairs in by_child.items():
            writes.setdefault(child, []).append((child + rest, ["z", len(pairs), *pairs]))
    for child, entries in sorted(writes.items()):
        call_keys: list[bytes] = []
        args: list[Any] = []
        size = 0
        for new, part in entries:
            if call_keys and (len(call_keys) >= _BATCH_KEYS or size > _BATCH_BYTES):
                yield from _restore(child, call_keys, args, hold)
                call_keys, args, size = [], [], 0
            call_keys.append(new)
            args += part
            size += sum(len(a) for a in part if isinstance(a, bytes))
        yield from _restore(child, call_keys, args, hold)


def _restore(child: bytes, call_keys: list[bytes], args: list[Any], hold: _Holder) -> Op[None]:
    yield from hold.renew(every=LEASE_MS / 3000)
    written = yield Call(scripts.RESHARD_RESTORE, [child + b"fence", *call_keys], [hold.gen, *args])
    if lenient_text(written) == "fenced":
        raise hold.fenced_out(f"another generation holds {child.decode()!r}")
