"""Every Redis key the library touches is built here.

Layout, for namespace ``ns`` (no braces allowed in it)::

    ns:{ns#SS}:cp:<task_id>       hash   scalar fields + opaque msgpack body
    ns:{ns#SS}:msgs:<task_id>     list   one msgpack blob per message (append-only)
    ns:{ns#SS}:cycles:<task_id>   list   one msgpack blob per cycle record
    ns:{ns#SS}:tomb:<task_id>     string the write ring of an acknowledged task (TTL; see _common.lua)
    ns:{ns#SS}:steps:<task_id>    hash   "<cycle>\0<name>" -> result blob of a durable step (Lease.step)
    ns:{ns#SS}:tasks              zset   every task id of shard SS (score 0, lex order)
    ns:{ns#SS}:ready              zset   claimable task ids, score = ms they became claimable
    ns:{ns#SS}:parked             zset   parked (poison) task ids of shard SS (score 0, lex order)
    ns:{ns#SS}:gen                string history-epoch counter of shard SS
    ns:{ns#SS}:counters           hash   claims, commits, takeovers of shard SS (``agentstate stats --watch``)
    ns:{ns#SS}:due                channel (sharded pub/sub, not a key): "a task of shard SS is due"
                                  (_common.lua's notify_due publishes, wire/waker.py listens)

Agent pools (``SS`` is the shard of the pool id)::

    ns:{ns#SS}:pool:<pool_id>                 hash   cfg created created_seq seq evt evtids
    ns:{ns#SS}:pool-members:<pool_id>         hash   run_id -> member blob
    ns:{ns#SS}:pool-msgs:<pool_id>            hash   message_id -> stored message blob
    ns:{ns#SS}:pool-msg-dedupe:<pool_id>      hash   idempotency key -> "<seq>:<receipt blob>"
    ns:{ns#SS}:pool-wakes:<pool_id>           hash   condition_id -> stored wake blob
    ns:{ns#SS}:pool-wake-dedupe:<pool_id>     hash   idempotency key -> "<seq>:<registration blob>"
    ns:{ns#SS}:pool-log:<pool_id>             stream the record log, entry id "<seq>-0"
    ns:{ns#SS}:pool-runs:<pool_id>            hash   run_id -> "<seq>" (joined) or "<seq>:<member blob>" (left)
    ns:{ns#SS}:pool-left:<pool_id>            zset   run ids of the pool's latest leaves, score = seq
    ns:{ns#SS}:pool-msg-order:<pool_id>       zset   retained messages, oldest first (only with a message retention)
    ns:{ns#SS}:pools                          zset   every pool id of shard SS (score 0)

Per-key concurrency limits (``SS`` is the shard of the concurrency key ``<ck>``, so a limiter
lives in another slot than most of its tasks: core/limits.py's protocol spans the two)::

    ns:{ns#SS}:limit:<ck>         string the key's limit (absent: unlimited)
    ns:{ns#SS}:holders:<ck>       zset   "<task_id>\0<token>" -> ms its place expires (a live lease's place)
    ns:{ns#SS}:lwait:<ck>         zset   task ids claim_next put off because the key was full -> ms put off
    ns:{ns#00}:limits             hash   every limited key -> its limit (what ``agentstate stats`` lists)

Cron schedules of ``agentstate serve`` (``langgraph/crons.py``; all in shard 00's slot)::

    ns:{ns#00}:cron:<cron_id>     hash   body (the cron's JSON record), due (its next tick, ms), last (last fired)
    ns:{ns#00}:crondue            zset   cron id -> due ms of its next tick (what a ticker fires)
    ns:{ns#00}:crons              zset   cron id -> created ms (every cron)

Key/value seam (``SS`` is the shard of the key)::

    ns:{ns#SS}:kv:<key>           string the value (PX when set with a TTL)
    ns:{ns#SS}:kvkeys             zset   every key of shard SS (score 0, lex order)
    ns:{ns#SS}:kvttl              zset   keys of shard SS that have a TTL -> expiry (unix ms)

LangGraph threads (``redis_agentstate.langgraph``; ``SS`` is the shard of the thread id;
``<ns>`` is the checkpoint namespace, ``<cid>`` the checkpoint id, fields joined by NUL)::

    ns:{ns#SS}:lgmeta:<thread_id>   hash   holder, exp: the thread's lease (no holder when free);
                                           released: the last release's token (lg_release.lua)
    ns:{ns#SS}:lgcp:<thread_id>     hash   <ns>\0<cid> -> the blob fields it reads + checkpoint record
    ns:{ns#SS}:lgidx:<thread_id>    zset   <ns>\0<cid>, score 0 (lex order = newest last)
    ns:{ns#SS}:lgblob:<thread_id>   hash   <ns>\0<channel>\0<version> -> channel value
    ns:{ns#SS}:lgw:<thread_id>      hash   <ns>\0<cid> -> its pending writes, packed
    ns:{ns#SS}:lgrun:<thread_id>    zset   <run_id>\0<ns>\0<cid>, score 0
    ns:{ns#SS}:lgrel:<thread_id>    list   release notices for lease waiters (BLPOP)
    ns:{ns#SS}:lgthreads            zset   every thread id of shard SS (score 0)
    ns:{ns#SS}:lgruns               zset   <run_id>\0<thread_id> of shard SS (score 0)

LangGraph run queues (``redis_agentstate.langgraph.RunQueue``, in the queue's namespace; ``SS`` is
the shard of the thread id, so a thread's runs share the slot of its task ``cp:<thread_id>``;
``RR`` the shard of the run id)::

    ns:{ns#SS}:lgrq:<thread_id>             list   the thread's active runs, oldest first
    ns:{ns#SS}:lgrh:<thread_id>             zset   its kept runs -> created (server ms)
    ns:{ns#SS}:lgr:<thread_id>\0<run_id>    hash   a run: status, strategy, modes, body, ...
    ns:{ns#SS}:lgre:<thread_id>\0<run_id>   stream its events
    ns:{ns#SS}:lgrd:<thread_id>\0<run_id>   stream its end marker (what a join blocks on)
    ns:{ns#SS}:lgrs:<thread_id>\0<run_id>   stream its stop signal (a cancel's, while it runs)
    ns:{ns#RR}:lgrid:<run_id>               string the thread of the run (the way from a run id to its keys)

LangGraph long-term memory (``redis_agentstate.langgraph.AgentStateStore``; ``SS`` is the shard of
the store namespace's path ``<path>``: its labels joined by NUL, which LangGraph forbids in a label,
so the index's lex order is the labels' tuple order; one namespace's items share one slot)::

    ns:{ns#SS}:lgsi:<path>          hash   key -> "<created>:<updated>:<ttl ms>:<nonce>:" + the value as JSON
    ns:{ns#SS}:lgso:<path>          zset   key -> its insertion number (what a search pages in)
    ns:{ns#SS}:lgsx:<path>          zset   key -> its expiry (server ms), for the items with a TTL
    ns:{ns#SS}:lgsv:<path>          hash   key -> its vectors: msgpack {field path: float32 bytes}
    ns:{ns#SS}:lgsl:<path>          zset   its vector index's inverted lists: a member per vector, score
                                           version * 65536 + list (``_store_ann.py``)
    ns:{ns#SS}:lgsa:<path>          hash   key -> how many vectors it has, where more than one
    ns:{ns#SS}:lgsc:<path>          hash   its vector index: version, centroids (float32), a re-train's move;
                                           and w, its write version (what a client's cache of its vectors checks)
    ns:{ns#SS}:lgse:<path>          string the generation of its listing that ended last (10 minutes,
                                           so a re-sent delete unlists it in its prefixes' shards too)
    ns:{ns#SS}:lgsns                zset   every namespace path with an item whose path, or one of its
                                           prefixes' paths, is in shard SS (score 0, lex order)
    ns:{ns#SS}:lgsng                zset   path -> generation of its listing (the members of lgsns)
    ns:{ns#SS}:lgsnx                zset   path -> expiry of its last item to expire (absent: one never does)

The fleet demo's bookkeeping (``agentstate demo`` only, never the library;
outside the shard tags, so not matched by ``pattern()``)::

    ns:demo:stats                 hash   counters (cycles, done, takeovers, ...)
    ns:demo:busy                  hash   worker id -> "<task_id>:<cycle>" it is working on
    ns:demo:acks                  list   one JSON record per acknowledged commit
    ns:demo:ready                 hash   worker id -> pid, once the worker started

``SS`` is ``crc32(task_id) % shards`` and ``{ns#SS}`` stands for shard SS's hash tag. The hash
tag is the *shard*, not the task id, so that the shard's indexes (``tasks``, ``ready``, ``parked``)
share the slot of every task in it: each script then updates state and index atomically, on a
single node or on Redis Cluster (where a script may only touch one slot).

Layouts. How many shards a namespace has and how their tags are made is its *layout*, part of the
on-disk format, stored with the namespace so every client agrees (``wire/layout.py``)::

    ns:{ns#layout}:layout         string "<layout> <shards>": "slots 64", or "legacy 64"

``slots`` (every namespace that had a layout record from its first use): shard ``s`` of ``n`` has the tag
``ns#<s>/<n>.<6 letters of h..o>``, the letters steered (``steer``) so that the tag lands in slot
``offset + s * 16384 // n`` (``shard_slots``): the shards are evenly spaced round the slot space, so
on a Cluster each primary's contiguous slot range holds its share of them, rounded. ``legacy``:
the fixed tags ``ns#00`` .. ``ns#63``, which fall wherever CRC16 puts them; kept for a namespace that
held data before it had a record. No two layouts (counts) share a tag.

Resharding. A live namespace grows from ``n`` shards to a multiple ``target`` of them
(``core/reshard.py``), one old shard at a time; meanwhile the record says how far it got::

    ns:{ns#layout}:layout         string "<layout> <n> <target> <k>": the first k old shards moved
    ns:{ns#SS}:moved              string the seal of an old shard: "sealed" while it is copied,
                                  "moved" after (kept: a client of the old layout learns from it)
    ns:{ns#SS}:fence              string the generation of the reshard that may write the shard's
                                  slot (old and new shards; kept: a stalled mover stays fenced out)
    ns:{ns#layout}:reshard        hash   the reshard's lease: token, holder, expires, gen
    ns:{ns#layout}:fence          string the generation that may write the layout record

An owner (a task, pool, KV key, thread, concurrency key) whose old shard ``crc32 % n`` is below
``k`` lives in new shard ``crc32 % target``, the others where they were: ``Keys.configure`` with
a target builds the live shards (``live_prefixes``), and ``shard_of`` maps an owner to one of
them, so every loop over ``range(keys.shards)`` reads each live shard once.

The task id comes last and verbatim after a fixed kind segment, and the
namespace holds no braces, so no id (whatever it contains: colons, braces,
slashes, unicode) can collide with or escape into another task's or another
namespace's keys.
"""

from __future__ import annotations

import binascii
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

from .errors import InvalidArgument

__all__ = [
    "DEFAULT_SHARDS",
    "CRON_KINDS",
    "KEY_TYPES",
    "LAYOUT_LEGACY",
    "LAYOUT_SLOTS",
    "MAX_ID_BYTES",
    "MAX_SHARDS",
    "SLOTS",
    "Keys",
    "LimiterKeys",
    "PoolKeys",
    "RUN_KINDS",
    "RunKeys",
    "STORE_INDEXES",
    "STORE_PREFIX_INDEXES",
    "StoreKeys",
    "TaskKeys",
    "ThreadKeys",
    "check_shards",
    "live_prefixes",
    "describe_key",
    "key_slot",
    "shard_of",
    "shard_slots",
    "shard_tags",
    "steer",
    "validate_namespace",
]

#: A new namespace's shard count (``shards=None``), and the only count of a namespace on the fixed (legacy) tags.
DEFAULT_SHARDS = 64
#: Redis Cluster's hash slots; a shard is one slot, so a namespace has at most this many.
SLOTS = 16384
MAX_SHARDS = SLOTS
#: The layouts a namespace's record names: slot-aware tags (every namespace with a record from
#: its first use), and the fixed ``{ns#SS}`` tags (64 shards), kept for a namespace whose data predates its record.
LAYOUT_SLOTS = "slots"
LAYOUT_LEGACY = "legacy"
MAX_ID_BYTES = 1024
MAX_NAMESPACE_CHARS = 128


#: The Redis type the library keeps under each kind of key (the segment after the shard tag).
KEY_TYPES = {
    "cp": "hash", "msgs": "list", "cycles": "list", "tomb": "string", "steps": "hash",
    "tasks": "zset", "ready": "zset", "gen": "string", "parked": "zset", "counters": "hash",
    "pool": "hash", "pool-members": "hash", "pool-msgs": "hash", "pool-msg-dedupe": "hash",
    "pool-wakes": "hash", "pool-wake-dedupe": "hash", "pool-log": "stream", "pool-runs": "hash",
    "pool-left": "zset", "pool-msg-order": "zset", "pools": "zset", "kv": "string", "kvkeys": "zset", "kvttl": "zset",
    "lgmeta": "hash", "lgcp": "hash", "lgidx": "zset", "lgblob": "hash", "lgw": "hash",
    "lgrun": "zset", "lgrel": "list", "lgthreads": "zset", "lgruns": "zset",
    "lgrq": "list", "lgrh": "zset", "lgr": "hash", "lgre": "stream", "lgrd": "stream", "lgrs": "stream",
    "lgrid": "string",
    "limit": "string", "holders": "zset", "lwait": "zset", "limits": "hash", "layout": "string",
    "cron": "hash", "crondue": "zset", "crons": "zset",
    "moved": "string", "fence": "string", "reshard": "hash",
    "lgsi": "hash", "lgso": "zset", "lgsx": "zset", "lgsv": "hash", "lgsns": "zset", "lgsnx": "zset",
    "lgsng": "zset", "lgse": "string", "lgsl": "zset", "lgsa": "hash", "lgsc": "hash",
}  # fmt: skip
#: The kinds of the cron schedules' keys: all in shard 00 (a reshard keeps them there, as the limits registry).
CRON_KINDS = frozenset({"cron", "crondue", "crons"})
#: The kinds of a LangGraph store namespace (owned by its path; they move whole with it in a reshard).
_STORE_KINDS = {"lgsi", "lgso", "lgsx", "lgsv", "lgse", "lgsl", "lgsa", "lgsc"}
#: A shard's indexes of the LangGraph store, split by member (the namespace path) when the shard moves.
STORE_INDEXES = frozenset({"lgsns", "lgsnx", "lgsng"})
#: The store indexes whose members are listed in the shard of each prefix of theirs (a prefix search
#: reads one shard): a reshard sends a member to the new shard of each of its prefixes of the old one.
STORE_PREFIX_INDEXES = frozenset({"lgsns", "lgsng"})
_THREAD_KINDS = {"lgmeta", "lgcp", "lgidx", "lgblob", "lgw", "lgrun", "lgrel", "lgrq", "lgrh"}
#: Kinds whose id is ``<thread_id>\0<run_id>``: owned by the thread (they move with it in a reshard).
RUN_KINDS = frozenset({"lgr", "lgre", "lgrd", "lgrs"})
_TASK_KINDS = {"cp", "msgs", "cycles", "tomb", "steps"}
_LIMIT_KINDS = {"limit", "holders", "lwait"}
#: The keys of the fleet demo (``Keys.demo``).
DEMO_KEYS = ("stats", "busy", "acks", "ready")


def describe_key(key: str) -> tuple[str | None, str | None, str | None]:
    """``(redis type, owner kind, owner id)`` of a key built here, e.g. ``("hash", "task", "t1")``.

    The owner kind is ``"task"``, ``"pool"``, ``"key"`` (a key/value key), ``"thread"`` (a LangGraph thread),
    ``"concurrency key"`` (a limiter's) or
    None for a shard's own keys (its indexes, its epoch counter); an unknown
    key gives ``(None, None, None)``. Used to name what corrupt data belongs to.
    """
    # The namespace holds no braces: the first '}' closes the shard tag.
    _, tag, rest = key.partition("}:")
    if not tag:
        return None, None, None
    kind, _, ident = rest.partition(":")
    if kind not in KEY_TYPES:
        return None, None, None
    if kind in _TASK_KINDS:
        return KEY_TYPES[kind], "task", ident
    if kind.startswith("pool") and kind != "pools":
        return KEY_TYPES[kind], "pool", ident
    if kind == "kv":
        return KEY_TYPES[kind], "key", ident
    if kind in _THREAD_KINDS:
        return KEY_TYPES[kind], "thread", ident
    if kind in RUN_KINDS:
        return KEY_TYPES[kind], "thread", ident.partition("\0")[0]
    if kind == "lgrid":
        return KEY_TYPES[kind], "run", ident
    if kind in _STORE_KINDS:
        return KEY_TYPES[kind], "store namespace", ident
    if kind in _LIMIT_KINDS:
        return KEY_TYPES[kind], "concurrency key", ident
    return KEY_TYPES[kind], None, None


def validate_namespace(namespace: object) -> str:
    """Return ``namespace`` if usable as a key prefix, else raise ``InvalidArgument``."""
    if not isinstance(namespace, str) or not namespace:
        raise InvalidArgument(f"namespace must be a non-empty string, got {namespace!r}")
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise InvalidArgument(f"namespace longer than {MAX_NAMESPACE_CHARS} characters")
    # No glob metacharacters (a backslash included): pattern() goes into ACL rules verbatim.
    if any(c in namespace for c in "{}*?[]\\") or not namespace.isprintable():
        raise InvalidArgument(f"namespace {namespace!r} must be printable and contain none of {{ }} * ? [ ] \\")
    return namespace


@dataclass(frozen=True, slots=True)
class TaskKeys:
    """The keys of one task, in the order every checkpoint script takes them."""

    checkpoint: str
    messages: str
    cycles: str
    ready: str
    tasks: str
    gen: str
    tomb: str
    parked: str
    #: The shard's counter hash: KEYS[9] of the scripts that count (claim, claim_next, commit,
    #: commit_and_claim), after ``with_parked()``'s eight (``counted()``).
    counters: str
    #: The task's durable step results: KEYS[10] of the scripts that end a cycle or the task
    #: (``stepped()``), KEYS[2] of step_load.lua and step_record.lua (``for_steps()``).
    steps: str

    def as_list(self) -> list[str]:
        return [self.checkpoint, self.messages, self.cycles, self.ready, self.tasks, self.gen, self.tomb]

    def with_parked(self) -> list[str]:
        """``as_list()`` and the shard's parked index: the KEYS of the scripts that park or unpark."""
        return [self.checkpoint, self.messages, self.cycles, self.ready, self.tasks, self.gen, self.tomb, self.parked]

    def counted(self) -> list[str]:
        """``with_parked()`` and the shard's counters: the KEYS of a script that counts what it applied
        (claim, claim_next, commit, commit_and_claim)."""
        return [self.checkpoint, self.messages, self.cycles, self.ready, self.tasks, self.gen, self.tomb, self.parked,
                self.counters]  # fmt: skip

    def stepped(self) -> list[str]:
        """``counted()`` and the task's step results: the KEYS of the scripts that drop them (commit,
        commit_and_claim, finalize, acknowledge_terminal, delete, save)."""
        return [*self.counted(), self.steps]

    def for_steps(self) -> list[str]:
        """The checkpoint hash and the step results: the KEYS of step_load.lua and step_record.lua."""
        return [self.checkpoint, self.steps]


@dataclass(frozen=True, slots=True)
class LimiterKeys:
    """The keys of one concurrency key's limiter, in the order every ``limit_*`` script takes them."""

    limit: str
    holders: str
    waiters: str

    def as_list(self) -> list[str]:
        return [self.limit, self.holders, self.waiters]


@dataclass(frozen=True, slots=True)
class PoolKeys:
    """The keys of one agent pool, in the order every pool script takes them."""

    state: str
    members: str
    messages: str
    message_dedupe: str
    wakes: str
    wake_dedupe: str
    log: str
    pools: str
    runs: str
    left: str
    #: The order of the retained messages: KEYS[11] of pool_record_message.lua only (``with_order()``).
    message_order: str

    def as_list(self) -> list[str]:
        return [self.state, self.members, self.messages, self.message_dedupe,
                self.wakes, self.wake_dedupe, self.log, self.pools, self.runs, self.left]  # fmt: skip

    def with_order(self) -> list[str]:
        """``as_list()`` and the message order: the keys of pool_record_message.lua."""
        return [*self.as_list(), self.message_order]


@dataclass(frozen=True, slots=True)
class StoreKeys:
    """The keys of one LangGraph store namespace, in the order every ``lgs_*`` script takes them."""

    items: str
    order: str
    expiry: str
    vectors: str
    namespaces: str
    namespace_expiry: str
    generations: str
    gen: str
    ended: str
    lists: str
    assigned: str
    centroids: str

    def as_list(self) -> list[str]:
        return [
            self.items, self.order, self.expiry, self.vectors, self.namespaces, self.namespace_expiry,
            self.generations, self.gen, self.ended, self.lists, self.assigned, self.centroids,
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ThreadKeys:
    """The keys of one LangGraph thread, in the order every ``lg_*`` script takes them."""

    meta: str
    records: str
    index: str
    blobs: str
    writes: str
    runs: str
    released: str
    shard_threads: str
    shard_runs: str

    def as_list(self) -> list[str]:
        return [self.meta, self.records, self.index, self.blobs, self.writes,
                self.runs, self.released, self.shard_threads, self.shard_runs]  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunKeys:
    """The keys of one LangGraph thread's runs (``lg_run_*`` scripts); a run's own keys are
    ``hash_prefix + run_id`` and ``event_prefix + run_id``."""

    active: str
    history: str
    hash_prefix: str
    event_prefix: str
    done_prefix: str
    stop_prefix: str

    def run(self, run_id: str) -> tuple[str, str]:
        """The run's hash and event stream."""
        return self.hash_prefix + run_id, self.event_prefix + run_id

    def done(self, run_id: str) -> str:
        """The run's end marker (a stream of one entry once it ended)."""
        return self.done_prefix + run_id

    def stop(self, run_id: str) -> str:
        """The run's stop signal (a stream of one entry once a cancel asked the running run to stop:
        what its worker blocks on while the graph runs)."""
        return self.stop_prefix + run_id


def key_slot(tag: bytes) -> int:
    """The Redis Cluster slot of a key whose hash tag is ``tag`` (CRC16/XMODEM, as redis-py's ``key_slot``)."""
    return binascii.crc_hqx(tag, 0) & (SLOTS - 1)


# ---- slot-aware shard tags ------------------------------------------------------------
#
# CRC16 is linear over GF(2): for strings of one length, crc(P + A) ^ crc(P + B) == crc(0s + A ^ B)
# == crc(A ^ B) (the register starts at 0 and zeros keep it there). So a tag "<prefix><6 letters>"
# can be steered to any slot: each letter is 'h' (0x68) with its low 3 bits free ('h'..'o'), and
# the 18 free bits map linearly onto the slot's 14. _PIVOTS is that map's inverse, reduced once
# at import (checked: rank 14, so every slot is reachable); a tag costs two crc_hqx calls.
_FREE_LETTERS = 6
_LETTER = 0x68


def _pivots() -> dict[int, tuple[int, int]]:
    pivots: dict[int, tuple[int, int]] = {}  # leading bit -> (slot bits, the free bits giving them)
    for j in range(3 * _FREE_LETTERS):
        delta = bytearray(_FREE_LETTERS)
        delta[j // 3] = 1 << (j % 3)
        vec, mask = binascii.crc_hqx(bytes(delta), 0) & (SLOTS - 1), 1 << j
        while vec:
            top = vec.bit_length() - 1
            if top not in pivots:
                pivots[top] = (vec, mask)
                break
            pvec, pmask = pivots[top]
            vec, mask = vec ^ pvec, mask ^ pmask
    if len(pivots) != SLOTS.bit_length() - 1:  # pragma: no cover - a property of CRC16, fixed
        raise AssertionError("the free letters of a shard tag do not reach every slot")
    return pivots


_PIVOTS = _pivots()


def steer(prefix: str, slot: int) -> str:
    """``prefix`` and 6 letters of 'h'..'o' such that the result, as a hash tag, lands in ``slot``."""
    base = (prefix + chr(_LETTER) * _FREE_LETTERS).encode("utf-8")
    want, mask = key_slot(base) ^ slot, 0
    while want:
        pvec, pmask = _PIVOTS[want.bit_length() - 1]
        want, mask = want ^ pvec, mask ^ pmask
    return prefix + "".join(chr(_LETTER | (mask >> (3 * i)) & 7) for i in range(_FREE_LETTERS))


def shard_slots(namespace: str, shards: int) -> list[int]:
    """The slot of each of ``shards`` slot-aware shards of ``namespace``: evenly spaced round the
    16,384 slots, from an offset of the namespace's own (so namespaces do not all start at slot 0:
    with fewer shards than primaries, or counts that do not divide evenly, the primaries that get
    one more shard differ from namespace to namespace)."""
    offset = key_slot(namespace.encode("utf-8"))
    return [(offset + s * SLOTS // shards) % SLOTS for s in range(shards)]


def shard_tags(namespace: str, shards: int, layout: str = LAYOUT_SLOTS) -> list[str]:
    """The hash tag (what goes between the braces) of each shard of ``namespace``."""
    if layout == LAYOUT_LEGACY:
        return [f"{namespace}#{s:02d}" for s in range(shards)]
    # The count is in the tag: no shard of one count shares its keys with a shard of another, so a
    # namespace growing from one count to the next moves every shard to keys of their own.
    return [steer(f"{namespace}#{s}/{shards}.", slot) for s, slot in enumerate(shard_slots(namespace, shards))]


def shard_of(ident: str, shards: int = DEFAULT_SHARDS) -> int:
    """The shard of a task, pool, KV key, thread or concurrency key ``ident`` among ``shards``."""
    return zlib.crc32(ident.encode("utf-8")) % shards


def live_prefixes(namespace: str, shards: int, layout: str, target: int = 0, moved: int = 0) -> list[str]:
    """The key prefix of every live shard: the ``shards`` of ``layout``, or, while resharding to
    ``target``, the old shards not moved yet and the new shards of those moved (``Keys.shard_of``):
    index ``o < shards`` is old shard ``o`` (new shard ``o`` once moved), and new shard
    ``j * shards + o`` (``j >= 1``, ``o < moved``) comes after them, at ``shards + (j - 1) * moved + o``."""
    old = [f"{namespace}:{{{tag}}}:" for tag in shard_tags(namespace, shards, layout)]
    if not target:
        return old
    new = [f"{namespace}:{{{tag}}}:" for tag in shard_tags(namespace, target, LAYOUT_SLOTS)]
    live = [new[o] if o < moved else old[o] for o in range(shards)]
    live += [new[j * shards + o] for j in range(1, target // shards) for o in range(moved)]
    return live


def check_shards(shards: object) -> int:
    """A shard count as the stores' ``shards=`` takes it: an int from 1 to MAX_SHARDS."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise InvalidArgument(f"shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}")
    return shards


class _Unresolved(Sequence[str]):
    """The shard prefixes of a store's keys before its first operation read the namespace's layout."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def __len__(self) -> int:
        return 0

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: Any) -> Any:
        raise RuntimeError(
            f"namespace {self.namespace!r}: a key was built before the store read the namespace's layout "
            "(every operation reads it first; this is a bug of redis_agentstate)"
        )


class Keys:
    """Key builder for one namespace, in one layout (its shard count and tags), or between two
    while the namespace is resharded (``configure``'s ``target`` and ``moved``)."""

    __slots__ = ("_live", "_route", "_shard_prefixes", "count", "layout", "listeners", "moved", "namespace", "shards",
                 "target", "version")  # fmt: skip

    def __init__(self, namespace: str, shards: int | None = DEFAULT_SHARDS, layout: str = LAYOUT_SLOTS) -> None:
        """``shards=None``: the layout is not known yet (``unresolved``)."""
        self.namespace = validate_namespace(namespace)
        #: ``shards``: how many shards are live (what loops over the shards range over); ``count``: the
        #: namespace's shard count (the old one while resharding, to ``target``, ``moved`` old shards moved).
        self.shards, self.count, self.target, self.moved, self.layout = 0, 0, 0, 0, ""
        #: Bumped by every ``configure``: what caches of built keys (and the waker's channels) compare.
        self.version = 0
        #: Called after every ``configure`` (caches of built keys clear themselves).
        self.listeners: list[Callable[[], None]] = []
        self._live: frozenset[str] = frozenset()
        self._shard_prefixes: Sequence[str] = _Unresolved(namespace)
        #: (live prefixes, old count while resharding else 0, old shards moved, target): replaced whole by
        #: ``configure``, so a thread building an owner's key reads one layout, never half of two.
        self._route: tuple[Sequence[str], int, int, int] = (self._shard_prefixes, 0, 0, 0)
        if shards is not None:
            self.configure(shards, layout)

    @classmethod
    def unresolved(cls, namespace: str) -> Keys:
        """Keys whose layout is not known yet: ``configure`` sets it (a store's first operation)."""
        return cls(namespace, None)

    @property
    def resolved(self) -> bool:
        return self.shards > 0

    def configure(self, shards: int, layout: str, target: int = 0, moved: int = 0) -> None:
        """Set the layout: ``shards`` shards, ``layout`` (LAYOUT_SLOTS or LAYOUT_LEGACY) tags; with a
        ``target``, the namespace is being resharded to ``target`` slot-aware shards and the first
        ``moved`` old shards have moved (keys.py, "Resharding")."""
        check_shards(shards)
        if layout not in (LAYOUT_SLOTS, LAYOUT_LEGACY):
            raise InvalidArgument(f"unknown shard layout {layout!r}")
        if layout == LAYOUT_LEGACY and shards != DEFAULT_SHARDS:
            raise InvalidArgument(f"the legacy layout has {DEFAULT_SHARDS} shards, not {shards}")
        if target and (check_shards(target) <= shards or target % shards or not 0 <= moved <= shards):
            raise InvalidArgument(f"no reshard from {shards} to {target} shards with {moved} moved")
        if self.shards and (layout, shards, target, moved) == (self.layout, self.count, self.target, self.moved):
            return  # the same layout (callers that read the record at once): built keys stay valid
        prefixes = live_prefixes(self.namespace, shards, layout, target, moved)
        self._route = (prefixes, shards if target else 0, moved, target)
        self._shard_prefixes = prefixes
        self._live = frozenset(prefixes)
        self.layout, self.count, self.target, self.moved = layout, shards, target, moved
        self.version += 1
        # Count last: a thread that sees the count sees the prefixes.
        self.shards = len(self._shard_prefixes)
        for listener in self.listeners:
            listener()

    def record(self) -> str:
        """The layout record this configuration stands for (``wire/layout.py`` parses it)."""
        if self.target:
            return f"{self.layout} {self.count} {self.target} {self.moved}"
        return f"{self.layout} {self.count}"

    def relocated(self, key: str) -> str | None:
        """Where ``key`` (built by any earlier configuration of these keys) lives now: its owner's
        shard prefix and the rest of it; None for a shard's own key (an index: moving a shard splits it)."""
        head, sep, rest = key.partition("}:")
        if not sep or not head.startswith(self.namespace + ":{"):
            return None
        if head + sep in self._live:
            return key
        if rest == "limits" or rest.partition(":")[0] in CRON_KINDS:
            return self._shard_prefixes[0] + rest
        _, _, owner = describe_key(key)
        if owner is None:
            return None
        return self._prefix_of(owner) + rest

    def layout_key(self) -> str:
        """The namespace's layout record (a string ``"<layout> <shards>"``), in a slot of its own."""
        return f"{self.namespace}:{{{self.namespace}#layout}}:layout"

    def legacy_indexes(self) -> list[list[str]]:
        """Per shard of the legacy layout, the indexes that list what it holds (tasks, parked tasks,
        pools, KV keys, LangGraph threads), and in shard 00 the limits registry: a namespace with
        any of them held data before it had a layout record."""
        prefixes = [f"{self.namespace}:{{{tag}}}:" for tag in shard_tags(self.namespace, DEFAULT_SHARDS, LAYOUT_LEGACY)]
        out = [[p + "tasks", p + "parked", p + "pools", p + "kvkeys", p + "lgthreads"] for p in prefixes]
        out[0].append(prefixes[0] + "limits")
        return out

    def shard_of(self, ident: str) -> int:
        """The live shard (an index into the live shards) of a task, pool, KV key, thread or concurrency key."""
        return self._index(self._route, ident)

    def _prefix_of(self, ident: str) -> str:
        """The key prefix of ``ident``'s live shard, from one reading of the layout."""
        route = self._route
        return route[0][self._index(route, ident)]

    @staticmethod
    def _index(route: tuple[Sequence[str], int, int, int], ident: str) -> int:
        prefixes, old, moved, target = route
        if not len(prefixes):
            prefixes[0]  # raises: the layout was not read yet
        h = zlib.crc32(ident.encode("utf-8"))
        if not old:
            return h % len(prefixes)
        o = h % old
        if o >= moved:
            return o
        n = h % target
        return n if n < old else old + (n // old - 1) * moved + o

    def moved_marker(self, shard: int) -> str:
        """The seal of live shard ``shard``: set while and after a reshard moves it (_moved.lua)."""
        return self._shard_prefixes[shard] + "moved"

    def shard_prefix(self, shard: int) -> str:
        return self._shard_prefixes[shard]

    def shard_tasks(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "tasks"

    def shard_ready(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "ready"

    def shard_due(self, shard: int) -> str:
        """The sharded pub/sub channel that announces work due in shard ``shard`` (same slot as its keys)."""
        return self._shard_prefixes[shard] + "due"

    def shard_parked(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "parked"

    def shard_counters(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "counters"

    def shard_gen(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "gen"

    def task(self, task_id: str) -> TaskKeys:
        p = self._prefix_of(task_id)
        return TaskKeys(
            checkpoint=p + "cp:" + task_id,
            messages=p + "msgs:" + task_id,
            cycles=p + "cycles:" + task_id,
            ready=p + "ready",
            tasks=p + "tasks",
            gen=p + "gen",
            tomb=p + "tomb:" + task_id,
            parked=p + "parked",
            counters=p + "counters",
            steps=p + "steps:" + task_id,
        )

    def limiter(self, concurrency_key: str) -> LimiterKeys:
        p = self._prefix_of(concurrency_key)
        return LimiterKeys(limit=p + "limit:" + concurrency_key, holders=p + "holders:" + concurrency_key,
                           waiters=p + "lwait:" + concurrency_key)  # fmt: skip

    def limits(self) -> str:
        """The namespace's registry of limited keys (shard 00's slot)."""
        return self._shard_prefixes[0] + "limits"

    def crons(self, cron_id: str) -> tuple[str, str, str]:
        """``(cron:<cron_id>, crondue, crons)``: a cron schedule's hash, the namespace's due index and
        its index of every cron, all in shard 00's slot (``lua/cron_put.lua``)."""
        p = self._shard_prefixes[0]
        return p + "cron:" + cron_id, p + "crondue", p + "crons"

    def pool(self, pool_id: str) -> PoolKeys:
        p = self._prefix_of(pool_id)
        return PoolKeys(
            state=p + "pool:" + pool_id,
            members=p + "pool-members:" + pool_id,
            messages=p + "pool-msgs:" + pool_id,
            message_dedupe=p + "pool-msg-dedupe:" + pool_id,
            wakes=p + "pool-wakes:" + pool_id,
            wake_dedupe=p + "pool-wake-dedupe:" + pool_id,
            log=p + "pool-log:" + pool_id,
            pools=p + "pools",
            runs=p + "pool-runs:" + pool_id,
            left=p + "pool-left:" + pool_id,
            message_order=p + "pool-msg-order:" + pool_id,
        )

    def thread(self, thread_id: str) -> ThreadKeys:
        p = self._prefix_of(thread_id)
        return ThreadKeys(
            meta=p + "lgmeta:" + thread_id,
            records=p + "lgcp:" + thread_id,
            index=p + "lgidx:" + thread_id,
            blobs=p + "lgblob:" + thread_id,
            writes=p + "lgw:" + thread_id,
            runs=p + "lgrun:" + thread_id,
            released=p + "lgrel:" + thread_id,
            shard_threads=p + "lgthreads",
            shard_runs=p + "lgruns",
        )

    def runs(self, thread_id: str) -> RunKeys:
        p = self._prefix_of(thread_id)
        return RunKeys(
            active=p + "lgrq:" + thread_id,
            history=p + "lgrh:" + thread_id,
            hash_prefix=p + "lgr:" + thread_id + "\0",
            event_prefix=p + "lgre:" + thread_id + "\0",
            done_prefix=p + "lgrd:" + thread_id + "\0",
            stop_prefix=p + "lgrs:" + thread_id + "\0",
        )

    def run_lookup(self, run_id: str) -> str:
        return self._prefix_of(run_id) + "lgrid:" + run_id

    def store(self, path: str) -> StoreKeys:
        """The keys of LangGraph store namespace ``path`` (its labels joined by NUL) and its shard's indexes."""
        p = self._prefix_of(path)
        return StoreKeys(
            items=p + "lgsi:" + path,
            order=p + "lgso:" + path,
            expiry=p + "lgsx:" + path,
            vectors=p + "lgsv:" + path,
            namespaces=p + "lgsns",
            namespace_expiry=p + "lgsnx",
            generations=p + "lgsng",
            gen=p + "gen",
            ended=p + "lgse:" + path,
            lists=p + "lgsl:" + path,
            assigned=p + "lgsa:" + path,
            centroids=p + "lgsc:" + path,
        )

    def store_index(self, shard: int) -> tuple[str, str]:
        """``(lgsns, lgsnx)``: shard ``shard``'s index of LangGraph store namespaces and their expiry."""
        p = self._shard_prefixes[shard]
        return p + "lgsns", p + "lgsnx"

    def shard_threads(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "lgthreads"

    def shard_runs(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "lgruns"

    def shard_pools(self, shard: int) -> str:
        return self._shard_prefixes[shard] + "pools"

    def kv(self, key: str) -> str:
        """The string key holding the value of KV key ``key``."""
        return self._prefix_of(key) + "kv:" + key

    def kv_keys(self, key: str) -> tuple[str, str, str]:
        """``(kvkeys, kvttl, kv:<key>)`` of KV key ``key``: its shard's indexes and its value key."""
        p = self._prefix_of(key)
        return p + "kvkeys", p + "kvttl", p + "kv:" + key

    def kv_index(self, shard: int) -> tuple[str, str]:
        """``(kvkeys, kvttl)``: shard ``shard``'s key index and its expiry index."""
        p = self._shard_prefixes[shard]
        return p + "kvkeys", p + "kvttl"

    def demo(self, name: str) -> str:
        """A key of the fleet demo's bookkeeping, e.g. ``demo("stats")`` (see the layout above)."""
        if name not in DEMO_KEYS:
            raise InvalidArgument(f"unknown demo key {name!r}; one of {DEMO_KEYS}")
        return f"{self.namespace}:demo:{name}"

    def pattern(self) -> str:
        """A glob matching every key of this namespace and no other (for ACL rules and tooling), its
        layout record included.

        Not ``ns:*``: namespaces may contain ``:``, and ``acme:*`` would also
        match every key of a tenant called ``acme:evil``.
        """
        return f"{self.namespace}:{{{self.namespace}#*"
