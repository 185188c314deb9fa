"""Loads the Lua scripts shipped in ``redis_agentstate/lua`` (one file per operation).

The file name, the constant below and the store method share one name. The
text sent to Redis for a script is, in this order: the constants rendered
here from the Python side (``constants_prelude``: limits, statuses, reply
codes, the checkpoint hash fields, so Python is their single source), the
preludes ``PRELUDES`` lists for it (``_base.lua``, then its family's own:
helpers and the key layout), and the script's own file. Its SHA is computed
over that text; redis-py's ``Script`` objects handle NOSCRIPT by loading the
text once and retrying, and so do the driver for a pipeline of script calls
(``wire.Batch``) and the short way of a call (``wire/lanes.py``), so a
``SCRIPT FLUSH`` or a fail-over to a fresh node is invisible to callers.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.abc import Traversable

    from ..clients import RedisClient

from ..core.validate import (
    LIMIT_SKEW_MS,
    MAX_CLAIM_FROM_REVISION,
    MAX_CONCURRENCY_KEY_BYTES,
    MAX_CONCURRENCY_LIMIT,
    MAX_CYCLE,
    MAX_PRIORITY,
    MAX_REVISION,
    MIN_PRIORITY,
    PRIORITY_BAND_MS,
    TERMINAL_TOMB_MS,
)
from ..models import TERMINAL_STATUSES, AgentStatus

__all__ = [
    "ACKNOWLEDGE_TERMINAL",
    "CHECKPOINT_SCRIPTS",
    "CLAIM",
    "CLAIM_NEXT",
    "COMMIT",
    "COMMIT_AND_CLAIM",
    "CREATE",
    "DELETE",
    "FINALIZE",
    "HASH_FIELDS",
    "KV_SCRIPTS",
    "LIMIT_ACQUIRE",
    "LIMIT_REGISTER",
    "LIMIT_RELEASE",
    "LAYOUT_INIT",
    "LAYOUT_SCRIPTS",
    "RESHARD_DROP",
    "RESHARD_FENCE",
    "RESHARD_LEASE",
    "RESHARD_RECORD",
    "RESHARD_RESTORE",
    "RESHARD_SCRIPTS",
    "RESHARD_SEAL",
    "LIMIT_SCRIPTS",
    "LIMIT_SET",
    "LIMIT_WAKE",
    "LOAD",
    "POOL_SCRIPTS",
    "PRELUDES",
    "PRUNE",
    "PoolReply",
    "READS",
    "RELEASE",
    "RENEW",
    "REQUEUE",
    "RESUME",
    "CANCEL",
    "SAVE",
    "STEP_LOAD",
    "STEP_RECORD",
    "SUMMARY",
    "Reply",
    "ScriptFamily",
    "WRITES",
    "constants_prelude",
    "register",
    "register_family",
    "REPLY_EVENTS",
    "source",
    "lua_files",
    "script_text",
]

CREATE = "create"
SAVE = "save"
LOAD = "load"
CLAIM = "claim"
CLAIM_NEXT = "claim_next"
COMMIT = "commit"
COMMIT_AND_CLAIM = "commit_and_claim"
RENEW = "renew"
FINALIZE = "finalize"
ACKNOWLEDGE_TERMINAL = "acknowledge_terminal"
DELETE = "delete"
SUMMARY = "summary"
RELEASE = "release"
REQUEUE = "requeue"
CANCEL = "cancel"
RESUME = "resume"
PRUNE = "prune"
STEP_LOAD = "step_load"
STEP_RECORD = "step_record"
LIMIT_WAKE = "limit_wake"

CHECKPOINT_SCRIPTS = (
    CREATE, SAVE, LOAD, CLAIM, CLAIM_NEXT, COMMIT, COMMIT_AND_CLAIM, RENEW, FINALIZE, ACKNOWLEDGE_TERMINAL,
    DELETE, SUMMARY, RELEASE, REQUEUE, PRUNE, STEP_LOAD, STEP_RECORD, CANCEL, RESUME, LIMIT_WAKE,
)  # fmt: skip

#: The limiters of per-key concurrency limits (``core/limits.py``): each takes one concurrency key's
#: keys (``keys.LimiterKeys``), in another slot than the tasks it limits; limit_register takes
#: the namespace's registry (``Keys.limits``).
LIMIT_ACQUIRE = "limit_acquire"
LIMIT_RELEASE = "limit_release"
LIMIT_SET = "limit_set"
LIMIT_REGISTER = "limit_register"
LIMIT_SCRIPTS = (LIMIT_ACQUIRE, LIMIT_RELEASE, LIMIT_SET, LIMIT_REGISTER)

#: A namespace's layout record (``wire/layout.py``): every store registers it with its own scripts.
LAYOUT_INIT = "layout_init"
LAYOUT_SCRIPTS = (LAYOUT_INIT,)

#: Growing a live namespace to more shards (``core/reshard.py``): the only scripts that write a sealed
#: shard, so they are built without the seal check (``_moved.lua``).
RESHARD_SEAL = "reshard_seal"
RESHARD_RESTORE = "reshard_restore"
RESHARD_DROP = "reshard_drop"
RESHARD_RECORD = "reshard_record"
RESHARD_LEASE = "reshard_lease"
RESHARD_FENCE = "reshard_fence"
RESHARD_SCRIPTS = (RESHARD_SEAL, RESHARD_RESTORE, RESHARD_DROP, RESHARD_RECORD, RESHARD_LEASE, RESHARD_FENCE)

KV_SET = "kv_set"
KV_DELETE = "kv_delete"
KV_KEYS = "kv_keys"
KV_COUNT = "kv_count"
KV_SWAP = "kv_swap"
KV_SCRIPTS = (KV_SET, KV_DELETE, KV_KEYS, KV_COUNT, KV_SWAP)

POOL_OPEN = "pool_open"
POOL_SNAPSHOT = "pool_snapshot"
POOL_RECORD_CREATED = "pool_record_created"
POOL_JOIN = "pool_join"
POOL_LEAVE = "pool_leave"
POOL_RECORD_MESSAGE = "pool_record_message"
POOL_RECORD_WAKE = "pool_record_wake"
POOL_NEXT_EVENT_SEQUENCE = "pool_next_event_sequence"
POOL_WATCH = "pool_watch"
POOL_GET = "pool_get"
POOL_SCRIPTS = (
    POOL_OPEN, POOL_SNAPSHOT, POOL_RECORD_CREATED, POOL_JOIN, POOL_LEAVE,
    POOL_RECORD_MESSAGE, POOL_RECORD_WAKE, POOL_NEXT_EVENT_SEQUENCE, POOL_WATCH, POOL_GET,
)  # fmt: skip

#: The scripts that change state a caller relies on: the one place that says which
#: requests are writes. A store with ``wait_replicas`` follows each call of one of
#: these with ``WAIT`` (and ``WAITAOF``) in the same round trip; reads are sent as
#: they are. Every script is in exactly one of ``WRITES`` and ``READS``
#: (tests/test_replication.py checks it, so a new script must be declared here, or in its
#: integration's ``ScriptFamily``: ``register_family`` adds a family's names to both sets).
#: kv_keys/kv_count drop index entries of expired keys (housekeeping the next
#: read redoes), so they count as reads. Plain commands (``wire.Pipe``,
#: ``wire.Command``) are reads only: every write is a script.
WRITES = {
    CREATE, SAVE, CLAIM, CLAIM_NEXT, COMMIT, COMMIT_AND_CLAIM, RENEW, FINALIZE, ACKNOWLEDGE_TERMINAL, DELETE,
    RELEASE, REQUEUE, PRUNE, STEP_RECORD, CANCEL, RESUME, LIMIT_WAKE,
    LIMIT_ACQUIRE, LIMIT_RELEASE, LIMIT_SET, LIMIT_REGISTER, LAYOUT_INIT, *RESHARD_SCRIPTS,
    KV_SET, KV_DELETE, KV_SWAP,
    POOL_OPEN, POOL_RECORD_CREATED, POOL_JOIN, POOL_LEAVE, POOL_RECORD_MESSAGE, POOL_RECORD_WAKE,
    POOL_NEXT_EVENT_SEQUENCE,
}  # fmt: skip
#: The scripts that only read (see ``WRITES``).
READS = {LOAD, SUMMARY, STEP_LOAD, KV_KEYS, KV_COUNT, POOL_SNAPSHOT, POOL_WATCH, POOL_GET}

#: The preludes each script is built on, in order (after the rendered constants).
PRELUDES: dict[str, tuple[str, ...]] = {
    **{name: ("_base", "_moved", "_common") for name in CHECKPOINT_SCRIPTS},
    **{name: ("_base", "_moved", "_kv") for name in KV_SCRIPTS},
    **{name: ("_base", "_moved", "_limit") for name in LIMIT_SCRIPTS},
    **{name: ("_base",) for name in LAYOUT_SCRIPTS + RESHARD_SCRIPTS},
    **{name: ("_base", "_moved", "_pool") for name in POOL_SCRIPTS},
}

#: The scalar fields of a checkpoint hash (``KEYS[1]`` of a checkpoint script),
#: in the order ``read_checkpoint`` returns them. Besides these the hash holds
#: 'applied' (the write ring, see ``_common.lua``), which is never returned.
#: Then the attempts at the current cycle, the parked flag, the last failure and
#: the revision of the claim whose release recorded it (see the attempts note in
#: ``_common.lua``), and 'due': the server ms before which the next cycle may not
#: be claimed (a delayed cycle), or a waiting task's deadline (see the timers note
#: in ``_common.lua``), 'prio': the task's priority (the priorities note in
#: ``_common.lua``), and 'ckey': its concurrency key (the limits note there). Data written
#: before they existed lacks them.
HASH_FIELDS = (
    "status", "cycle", "rev", "token", "claimed", "lease", "term", "body", "epoch",
    "att", "parked", "why", "failrev", "due", "prio", "ckey",
)  # fmt: skip


class Reply(enum.IntEnum):
    """The code a script's reply starts with (the prelude has each as ``REPLY_<NAME>``).

    Not every script uses every code; each script's header says which it returns.
    """

    #: Applied: created, saved, claimed, committed, renewed.
    DONE = 1
    #: This very request applied already (a re-send after a lost reply).
    DONE_BEFORE = 2
    #: Not applied: missing, exists already, fenced out, a lost race.
    REFUSED = 0
    #: The task is terminal.
    TERMINAL = -1
    #: The task is not running (pending, wait_user, reconciliation_required).
    NOT_RUNNING = -2
    #: The task is not at the cycle before the one claimed.
    CYCLE_CONFLICT = -3
    #: Another live token holds the claim.
    HELD = -4
    #: The client's view of the history is stale: send the full lists.
    RESEND_HISTORY = -5
    #: A full list shorter than what is stored, without replace_history.
    SHRINK = -6
    #: The revision is too high for a claim's commit to be stored.
    REVISION_EXHAUSTED = -7
    #: The task is parked (a poison task: too many attempts at its cycle), or was parked now.
    PARKED = -8
    #: requeue: the task is not parked.
    NOT_PARKED = -9
    #: resume: the task is not waiting for a person (its status follows).
    NOT_WAITING = -10
    #: The next cycle is delayed: not claimable before the due time that follows (server ms).
    NOT_DUE = -11
    #: The task has a concurrency key and the claim (or renewal) came without a live place in its
    #: limiter: the key follows (``core/limits.py`` takes a place and sends it again); nothing written.
    LIMITED = -12
    #: Claimed (as DONE), from another token whose lease had lapsed without a commit: a takeover.
    TAKEN_OVER = 3
    #: lgs_put: the store namespace's vector index moved to another version since the client chose
    #: its vectors' lists (the version follows): nothing written, the client chooses them again.
    INDEX_MOVED = -13


class PoolReply(enum.IntEnum):
    """The code a pool script's reply starts with (the prelude has each as ``POOL_<NAME>``)."""

    #: Applied now: opened, joined, left, recorded; or found (pool_get), read (snapshot, watch).
    DONE = 1
    #: It was so already, nothing written: opened with this config, this member joined, this run
    #: left, this idempotency key (or pool_created) recorded.
    DONE_BEFORE = 2
    #: pool_get: no such field.
    ABSENT = 0
    #: The pool was never opened.
    NOT_OPEN = -1
    #: pool_leave: the run is not a member.
    NOT_A_MEMBER = -2
    #: A dedupe entry is not '<seq>:<blob>' (data this library did not write).
    MALFORMED_ENTRY = -3
    #: pool_open: the pool is open with other config bytes.
    CONFIG_CONFLICT = -4


def _lua_int(n: int) -> str:
    # Lua 5.1 numbers are doubles: every constant rendered here must be exact in one.
    if not -(2**53) <= n <= 2**53:
        raise ValueError(f"{n} is not exact in a Lua number")
    return str(int(n))


def _lua_str(s: str) -> str:
    if not all(c.isalnum() or c == "_" for c in s):
        raise ValueError(f"{s!r} is not a plain identifier")
    return f"'{s}'"


def constants_prelude() -> str:
    """The Lua ``local`` constants every script starts with, rendered from their Python source."""
    statuses = ", ".join(f"{s.value} = true" for s in AgentStatus)
    terminal = ", ".join(f"{s.value} = true" for s in sorted(TERMINAL_STATUSES, key=lambda s: s.value))
    lines = [
        "-- Rendered by scripts.py from core/validate.py, models.py and scripts.Reply: Python is their",
        "-- only source (tests/test_contracts.py checks the rendering).",
        f"local MAX_REVISION = {_lua_int(MAX_REVISION)}",
        f"local MAX_CYCLE = {_lua_int(MAX_CYCLE)}",
        "-- The highest revision a claim may start from: it returns rev + 1 and the",
        "-- commit of that claim stores rev + 2, which must not pass MAX_REVISION.",
        f"local MAX_CLAIM_FROM_REV = {_lua_int(MAX_CLAIM_FROM_REVISION)}",
        f"local STATUSES = {{ {statuses} }}",
        f"local TERMINAL = {{ {terminal} }}",
        f"local WAIT_USER = {_lua_str(AgentStatus.WAIT_USER.value)}",
        f"local TOMB_MS = {_lua_int(TERMINAL_TOMB_MS)}",
        f"local MIN_PRIORITY, MAX_PRIORITY = {_lua_int(MIN_PRIORITY)}, {_lua_int(MAX_PRIORITY)}",
        f"local PRIORITY_BAND = {_lua_int(PRIORITY_BAND_MS)}",
        f"local MAX_CKEY_BYTES, MAX_LIMIT = {_lua_int(MAX_CONCURRENCY_KEY_BYTES)}, {_lua_int(MAX_CONCURRENCY_LIMIT)}",
        f"local LIMIT_SKEW = {_lua_int(LIMIT_SKEW_MS)}",
        f"local HASH_FIELDS = {{ {', '.join(_lua_str(f) for f in HASH_FIELDS)} }}",
        *(f"local REPLY_{code.name} = {_lua_int(code.value)}" for code in Reply),
        *(f"local POOL_{code.name} = {_lua_int(code.value)}" for code in PoolReply),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ScriptFamily:
    """An integration's scripts, plugged into the loader: where their Lua lives, what each is built
    on, which write, and what their replies count (telemetry)."""

    #: The package whose ``lua/`` folder holds the family's scripts and its own preludes (the core's
    #: preludes, ``_base``, ``_moved``, ``_common``..., are found in this package's ``lua/``).
    package: str
    #: Each script of the family, with the preludes it is built on, in order.
    preludes: Mapping[str, tuple[str, ...]]
    #: The family's scripts that write (see ``WRITES``); the others only read.
    writes: frozenset[str]
    #: Script name -> the counter keys its reply says happened (``telemetry.REPLY_EVENTS``'s kind).
    events: Mapping[str, Callable[[Any], Sequence[str]]] = field(default_factory=dict)


#: Where a script's or prelude's file lives when it is not in this package: name -> package.
_HOMES: dict[str, str] = {}
#: What the integrations' scripts' replies count, by script (the core's are in ``telemetry``).
REPLY_EVENTS: dict[str, Callable[[Any], Sequence[str]]] = {}


def register_family(family: ScriptFamily) -> None:
    """Plug an integration's scripts in: each one's preludes, its place in ``WRITES`` or ``READS``,
    its file's folder and its reply events. Done once, when the integration is imported; names
    must not clash with another family's."""
    clash = [name for name in family.preludes if name in PRELUDES and _HOMES.get(name) != family.package]
    if clash:
        raise ValueError(f"script names already taken: {', '.join(sorted(clash))}")
    if not family.writes <= family.preludes.keys():
        raise ValueError("a family's writes must be among its scripts")
    PRELUDES.update(family.preludes)
    WRITES.update(family.writes)
    READS.update(family.preludes.keys() - family.writes)
    for name, preludes in family.preludes.items():
        _HOMES[name] = family.package
        for prelude in preludes:
            if resources.files(family.package).joinpath("lua").joinpath(f"{prelude}.lua").is_file():
                _HOMES[prelude] = family.package
    REPLY_EVENTS.update(family.events)
    script_text.cache_clear()


def source(name: str) -> str:
    """The text of ``<name>.lua`` (a script or a prelude), from the folder of its family."""
    return resources.files(_HOMES.get(name, __package__)).joinpath("lua").joinpath(f"{name}.lua").read_text("utf-8")


_read = source


def lua_files() -> dict[str, Traversable]:
    """Every ``.lua`` file of the core and of each family registered so far, by file name."""
    packages = dict.fromkeys([__package__, *_HOMES.values()])
    return {
        f.name: f
        for package in packages
        for f in sorted(resources.files(package).joinpath("lua").iterdir(), key=lambda f: f.name)
        if f.name.endswith(".lua")
    }


_TOP_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*=)")
_NAME = re.compile(r"[A-Za-z_]\w*")


def _units(text: str) -> list[tuple[frozenset[str], str]]:
    """The top-level statements of a prelude, each with the names it defines (none: it runs for its
    effect, as ``_moved.lua``'s check does, and is always kept). A statement runs from a line that
    starts in column 0 up to the next one; a ``local function`` up to its ``end`` in column 0.
    Comments are dropped (they never reach a statement)."""
    units: list[tuple[frozenset[str], str]] = []
    lines: list[str] = []
    names: frozenset[str] = frozenset()
    in_function = False

    def close() -> None:
        if lines:
            units.append((names, "\n".join(lines)))

    for line in text.splitlines():
        top = bool(line) and not line[0].isspace()
        if in_function:
            lines.append(line)
            if line.rstrip() == "end":
                in_function = False
            continue
        if not top or line.startswith("--"):
            if lines and line and not line.lstrip().startswith("--"):
                lines.append(line)  # a statement's continuation (a table over several lines)
            continue
        if line.rstrip() in ("end", "}"):
            lines.append(line)
            continue
        close()
        lines = [line]
        m = _TOP_DEFINES.match(line)
        if m and m.group(1):
            names, in_function = frozenset({m.group(1)}), not line.rstrip().endswith(" end")
        elif m:
            names = frozenset(n.strip() for n in m.group(2).split(","))
        else:
            names = frozenset()
    close()
    return units


def _strip_comments(code: str) -> str:
    """``code`` less its ``--`` comments (a ``--`` inside a quoted string is not one)."""
    out = []
    for line in code.splitlines():
        quote, i = "", 0
        while i < len(line):
            c = line[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif line.startswith("--", i):
                line = line[:i]
                break
            i += 1
        out.append(line)
    return "\n".join(out)


def _shaken(preludes: list[str], body: str) -> str:
    """The preludes less every definition nothing kept uses: every EVALSHA runs its whole text
    again (each ``local function`` is a new closure per call), so an unused helper is a cost on
    every call of every script (benchmarks/README.md, "What does the server pay?")."""
    units = [u for text in preludes for u in _units(text)]
    used = set(_NAME.findall(_strip_comments(body)))
    keep = [not names for names, _ in units]
    for i, (_, code) in enumerate(units):
        if keep[i]:
            used |= set(_NAME.findall(_strip_comments(code)))
    changed = True
    while changed:
        changed = False
        for i, (names, code) in enumerate(units):
            if not keep[i] and names & used:
                keep[i] = changed = True
                used |= set(_NAME.findall(_strip_comments(code)))
    return "\n".join(code for (_, code), k in zip(units, keep, strict=True) if k)


@cache
def script_text(name: str) -> str:
    """The full text sent to Redis for operation ``name``: the constants and preludes it uses, and
    its own file."""
    # _moved.lua lets the scripts that only read run on a sealed shard (its data is whole until it moved).
    reads = f"local SEALED_READS = {'true' if name in READS else 'false'}\n"
    preludes = [constants_prelude() + reads, *(_read(p) for p in PRELUDES.get(name, ()))]
    body = _read(name)
    return _shaken(preludes, body) + "\n" + body


def register(client: RedisClient, names: tuple[str, ...]) -> dict[str, Any]:
    """``Script`` objects (or ``AsyncScript`` for an asyncio client) bound to ``client``."""
    return {name: client.register_script(script_text(name)) for name in names}
