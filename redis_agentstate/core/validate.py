"""Argument checks shared by every store; each raises ``InvalidArgument`` before any I/O."""

from __future__ import annotations

from ..errors import InvalidArgument
from ..keys import MAX_ID_BYTES

__all__ = [
    "MAX_CYCLE",
    "MAX_CLAIM_FROM_REVISION",
    "MAX_LEASE_MS",
    "MAX_REVISION",
    "MAX_STORED_REVISION",
    "MAX_TERMINAL_TTL_MS",
    "TERMINAL_TOMB_MS",
    "MAX_CONCURRENCY_KEY_BYTES",
    "MAX_CONCURRENCY_LIMIT",
    "LIMIT_SKEW_MS",
    "check_concurrency_key",
    "check_id",
    "check_int",
]

MAX_CYCLE = 2**32 - 1
#: Revisions and times are compared in Lua, whose numbers are doubles: exact below 2**53.
MAX_REVISION = 2**53 - 1
#: The highest revision create/save may store: every claim and write bumps
#: it, and it must never run past MAX_REVISION.
MAX_STORED_REVISION = 2**52
#: The highest revision a claim starts from (``MAX_CLAIM_FROM_REV`` in
#: _common.lua): it returns revision + 1, and the commit of that claim, which
#: accepts any expected revision up to MAX_REVISION - 1, stores revision + 2.
MAX_CLAIM_FROM_REVISION = MAX_REVISION - 2
#: A lease longer than a year is a bug, not a lease.
MAX_LEASE_MS = 366 * 24 * 3600 * 1000
#: The longest delay of a cycle (``delay_ms``), or a wait's deadline: a year, as a lease.
MAX_DELAY_MS = MAX_LEASE_MS
#: ``Checkpoint.priority``: from MIN_PRIORITY to MAX_PRIORITY, higher first (0 by default, the
#: lowest: a claim_next peek looks past a shard's first entries into the lower priorities only
#: when a higher one is there, so the plain path pays nothing for priorities).
MIN_PRIORITY, MAX_PRIORITY = 0, 9
#: The ready index scores a task of priority p claimable at t as t - p * PRIORITY_BAND_MS: one
#: band of about 70 years per priority, so the index sorts by priority, then by time, and a
#: score's priority is round((now - score) / band) for every time within 35 years of now.
PRIORITY_BAND_MS = 2**41
#: ``Checkpoint.concurrency_key``: a non-empty UTF-8 string of at most this many bytes (it names
#: the limiter's keys and sits in every limited task's hash).
MAX_CONCURRENCY_KEY_BYTES = 256
#: ``set_concurrency_limit``: from 1 (0 would stop the key's tasks for good: cancel or park them
#: instead) to this many live leases per key.
MAX_CONCURRENCY_LIMIT = 1_000_000
#: A limited lease's place in its limiter outlives the lease by this much (``LIMIT_SKEW`` in the
#: scripts): the lease is capped at the place's expiry minus this, so a lease can never outlive
#: its place, on one server exactly and on a Cluster as long as the clocks of the limiter's node
#: and the task's node differ by less than this.
LIMIT_SKEW_MS = 250
#: ``terminal_ttl_ms`` longer than ten years is a bug, not a retention.
MAX_TERMINAL_TTL_MS = 10 * 366 * 24 * 3600 * 1000
#: How long, at most, a task that expired (``terminal_ttl_ms``) is remembered after
#: it went (``TOMB_MS`` in _common.lua): its tombstone lives ``min(ttl, this)`` longer
#: than the task, so a re-sent finalize or a late acknowledge still gets True.
TERMINAL_TOMB_MS = 3_600_000


def check_id(value: object, what: str, *, max_bytes: int = MAX_ID_BYTES) -> str:
    """A non-empty ``str`` of at most ``max_bytes`` UTF-8 bytes."""
    # Fast path, the usual case: ASCII (an O(1) flag check) has one byte per character and no surrogates.
    if type(value) is str and value.isascii() and 0 < len(value) <= max_bytes:
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must be a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid unicode (lone surrogate?)") from exc
    if size > max_bytes:
        raise InvalidArgument(f"{what} is {size} bytes, over the limit of {max_bytes}")
    return value


def check_int(value: object, what: str, lo: int, hi: int) -> int:
    """An ``int`` (``bool`` excluded) within ``[lo, hi]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InvalidArgument(f"{what} must be between {lo} and {hi}, got {value}")
    # A plain int: redis-py encodes ints with repr(), which for an IntEnum is '<E.X: 3>'.
    return int(value)


def check_concurrency_key(value: object, what: str = "concurrency_key") -> str:
    """A concurrency key: a non-empty, printable UTF-8 ``str`` of at most MAX_CONCURRENCY_KEY_BYTES."""
    key = check_id(value, what, max_bytes=MAX_CONCURRENCY_KEY_BYTES)
    if not key.isprintable():
        raise InvalidArgument(f"{what} must be printable (it is shown by agentstate stats), got {key!r}")
    return key
