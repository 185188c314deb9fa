"""What every checkpoint operation shares: the core's state, argument checks, and reading replies.

``CheckpointState`` is the one state object the checkpoint core and each of its parts hold
(``core.checkpoint.CheckpointCore`` composes them): one namespace's keys, knobs and history
cache, the parts of a request that reads and writes share (the history delta), and the parser of
``read_checkpoint``'s reply (scripts.py) into a ``Checkpoint``, which fills that cache. The checks
every operation makes on its arguments need no state: they are functions here (``check_token``,
``validate``, ...). Nothing here does I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..codec import decode, encode
from ..errors import (
    AlreadyClaimed,
    CheckpointTerminal,
    ClaimRejected,
    ConcurrencyLimited,
    CorruptState,
    CycleConflict,
    InvalidArgument,
    NotDue,
    NotRunnable,
    TaskParked,
)
from ..keys import Keys, TaskKeys
from ..models import AgentStatus, Checkpoint
from ..wire import scripts
from ..wire.scripts import Reply
from .history import History, HistoryCache, hashed
from .replies import text
from .validate import (
    MAX_CYCLE,
    MAX_DELAY_MS,
    MAX_LEASE_MS,
    MAX_PRIORITY,
    MAX_REVISION,
    MAX_STORED_REVISION,
    MAX_TERMINAL_TTL_MS,
    MIN_PRIORITY,
    check_concurrency_key,
    check_id,
    check_int,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "CheckpointState",
    "WireKeys",
    "check_delay",
    "check_lease",
    "check_revision",
    "check_token",
    "encode_body",
    "raise_claim_refused",
    "validate",
]

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 2**20
_STATUSES = {s.value: s for s in AgentStatus}
#: The statuses a write may give a delay_ms (the timers note in _common.lua).
_SCHEDULABLE = frozenset({AgentStatus.RUNNING, AgentStatus.WAIT_USER})
#: The codes of a claim reply that carries the claimed checkpoint.
_CLAIMED = (Reply.DONE, Reply.TAKEN_OVER, Reply.DONE_BEFORE)
#: A status (an ``AgentStatus`` or its value) -> its value as a plain str: what ``AgentStatus(x).value``
#: gives, without the enum lookup and property on the hot path (the members hash and compare as their values).
_STATUS_VALUE = {s.value: s.value for s in AgentStatus}


def _priority(raw: bytes) -> int:
    """A stored 'prio' ('' for 0), checked as the scripts check it."""
    if not raw:
        return 0
    value = int(raw)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"priority {value} is out of range")
    return value


def _opt_int(raw: bytes) -> int | None:
    return int(raw) if raw else None


#: Fields of read_checkpoint's array before its history counts.
_NF = len(scripts.HASH_FIELDS)


class WireKeys(NamedTuple):
    """A task's KEYS as its scripts take them, UTF-8 encoded once (``TaskKeys``' lists of the same names)."""

    listed: tuple[bytes, ...]  #: ``as_list()``: renew, limit_wake
    parked: tuple[bytes, ...]  #: ``with_parked()``: release
    counted: tuple[bytes, ...]  #: ``counted()``: claim, claim_next
    stepped: tuple[bytes, ...]  #: ``stepped()``: commit, commit_and_claim, finalize


def check_token(token: object) -> str:
    return check_id(token, "token", max_bytes=256)


def check_lease(lease_ms: object) -> int:
    return check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)


def check_delay(delay_ms: object, cp: Checkpoint) -> int:
    """A write's ``delay_ms`` (None: 0): of a running task's next cycle, or a waiting task's deadline."""
    if delay_ms is None:
        return 0
    delay = check_int(delay_ms, "delay_ms", 0, MAX_DELAY_MS)
    if delay and (cp.terminal_result is not None or cp.status not in _SCHEDULABLE):
        raise InvalidArgument(
            f"delay_ms delays a running task's next cycle or sets a waiting (wait_user) task's deadline; "
            f"task {cp.task_id!r} is written with status {_STATUS_VALUE[cp.status]!r}"
            + (" and a terminal_result" if cp.terminal_result is not None else ""),
            task_id=cp.task_id,
        )
    return delay


def check_revision(revision: object, what: str = "expected_revision", *, bumped: bool = False) -> int:
    """``bumped``: the write stores ``revision + 1``, which must stay within MAX_REVISION."""
    return check_int(revision, what, 0, MAX_REVISION - 1 if bumped else MAX_REVISION)


def validate(cp: object, *, stores_revision: bool = True) -> Checkpoint:
    """Check every field of ``cp`` (types and ranges); return it unchanged.

    ``stores_revision``: ``cp.revision`` is written as is (create, save),
    so it must leave room for the claims and commits that bump it; a
    commit or finalize ignores it, and accepts whatever a claim returned.
    """
    if not isinstance(cp, Checkpoint):
        raise InvalidArgument(f"expected a Checkpoint, got {type(cp).__name__}")
    check_id(cp.task_id, "task_id")
    cycle, revision, lease = cp.cycle_index, cp.revision, cp.lease_expires_at_ms
    # Plain ints in range skip check_int (which words the error for the rest).
    if not (type(cycle) is int and 0 <= cycle <= MAX_CYCLE):
        check_int(cycle, "cycle_index", 0, MAX_CYCLE)
    if not isinstance(cp.status, str) or cp.status not in _STATUSES:
        raise InvalidArgument(f"status must be one of {sorted(_STATUSES)}, got {cp.status!r}")
    if not isinstance(cp.messages, list):
        raise InvalidArgument("messages must be a list")
    if not isinstance(cp.cycles, list):
        raise InvalidArgument("cycles must be a list")
    if not isinstance(cp.shared_state, dict):
        raise InvalidArgument("shared_state must be a dict")
    top = MAX_STORED_REVISION if stores_revision else MAX_REVISION
    if not (type(revision) is int and 0 <= revision <= top):
        check_int(revision, "revision", 0, top)
    if cp.claim_token is not None:
        check_token(cp.claim_token)
    claimed = cp.claimed_cycle
    if claimed is not None and not (type(claimed) is int and 1 <= claimed <= MAX_CYCLE):
        check_int(claimed, "claimed_cycle", 1, MAX_CYCLE)
    if lease is not None and not (type(lease) is int and 0 <= lease <= MAX_REVISION):
        check_int(lease, "lease_expires_at_ms", 0, MAX_REVISION)
    if cp.priority != 0 or type(cp.priority) is not int:
        check_int(cp.priority, "priority", MIN_PRIORITY, MAX_PRIORITY)
    if cp.concurrency_key is not None:
        check_concurrency_key(cp.concurrency_key)
    return cp


def encode_body(cp: Checkpoint) -> bytes:
    return encode(
        [cp.shared_state, cp.terminal_result, cp.budget_usage], what=lambda: f"checkpoint {cp.task_id!r} body"
    )


def raise_claim_refused(tid: str, cycle_index: int, code: int, reply: Sequence[Any]) -> None:
    """Raise what a claim of ``cycle_index`` answered by ``code`` (claim.lua's refusals) means."""
    detail = text(reply[1]) if len(reply) > 1 else ""
    if code in (Reply.CYCLE_CONFLICT, Reply.HELD, Reply.REVISION_EXHAUSTED) and not detail.isdigit():
        raise CorruptState(f"checkpoint of task {tid!r} holds a malformed number {detail!r}", task_id=tid)
    if code == Reply.TERMINAL:
        raise CheckpointTerminal(f"checkpoint for task {tid!r} is terminal (status {detail})", task_id=tid)
    if code == Reply.PARKED:
        if not detail.isdigit():
            raise CorruptState(f"checkpoint of task {tid!r} holds a malformed number {detail!r}", task_id=tid)
        reason = text(reply[2]) if len(reply) > 2 else ""
        raise TaskParked(
            f"task {tid!r} is parked after {detail} attempt(s) at cycle {cycle_index} ended without a commit "
            f"(last failure: {reason or 'none recorded'}); requeue it to run it again",
            task_id=tid,
            attempts=int(detail),
            reason=reason,
        )
    if code == Reply.NOT_RUNNING:
        raise NotRunnable(f"checkpoint for task {tid!r} is not running (status {detail})", task_id=tid)
    if code == Reply.NOT_DUE:
        if not detail.isdigit():
            raise CorruptState(f"checkpoint of task {tid!r} holds a malformed number {detail!r}", task_id=tid)
        raise NotDue(
            f"cycle {cycle_index} of task {tid!r} is delayed: not claimable before {detail} (server ms)",
            task_id=tid,
            due_at_ms=int(detail),
        )
    if code == Reply.LIMITED:
        raise ConcurrencyLimited(
            f"task {tid!r} has concurrency key {detail!r} and its place in the key's limiter ran out before "
            f"the claim of cycle {cycle_index} reached the task (nothing was written)",
            task_id=tid,
            concurrency_key=detail,
        )
    if code == Reply.CYCLE_CONFLICT:
        found = int(detail)
        raise CycleConflict(
            f"checkpoint cycle conflict for task {tid!r}: expected {cycle_index - 1}, found {found}",
            task_id=tid,
            expected=cycle_index - 1,
            found=found,
        )
    if code == Reply.REVISION_EXHAUSTED:
        raise ClaimRejected(
            f"checkpoint of task {tid!r} is at revision {detail}: a claim and its commit would run past "
            f"the highest revision {MAX_REVISION} (nothing was written)",
            task_id=tid,
            revision=int(detail),
        )
    if code == Reply.HELD:
        raise AlreadyClaimed(
            f"checkpoint cycle {cycle_index} for task {tid!r} is already claimed",
            task_id=tid,
            lease_expires_at_ms=int(detail),
        )
    raise CorruptState(f"unexpected claim reply {list(reply[:2])!r} for task {tid!r}", task_id=tid)


class CheckpointState:
    """One namespace's keys, knobs and history cache, shared by the checkpoint core and its parts;
    the history delta a write sends and the parser of the checkpoint a read or claim returns."""

    def __init__(
        self,
        namespace: str,
        *,
        max_payload_bytes: int,
        history_cache: int,
        max_attempts: int | None = None,
        terminal_ttl_ms: int | None = None,
    ) -> None:
        self.keys = Keys.unresolved(namespace)
        #: Sent with every claim and release; 0 (None given) turns parking off.
        self.max_attempts = 0 if max_attempts is None else check_int(max_attempts, "max_attempts", 1, MAX_CYCLE)
        #: How long a task that became terminal through this store lives unacknowledged (None: for ever).
        self.terminal_ttl_ms = (
            None if terminal_ttl_ms is None else check_int(terminal_ttl_ms, "terminal_ttl_ms", 1, MAX_TERMINAL_TTL_MS)
        )
        #: ``TaskKeys`` of a task id. Key strings are rebuilt for every call otherwise; hot tasks are few.
        self.task_keys = functools.lru_cache(maxsize=4096)(self.keys.task)
        #: ``WireKeys`` of a task id (``encode_keys``, cached alike).
        self.wire_keys = functools.lru_cache(maxsize=4096)(self.encode_keys)
        # A reshard moves tasks to other shards: keys built for the old layout are rebuilt.
        self.keys.listeners += [self.task_keys.cache_clear, self.wire_keys.cache_clear]
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 1, 2**31)
        self.history = HistoryCache(check_int(history_cache, "history_cache", 0, 2**31))

    def encode_keys(self, task_id: str) -> WireKeys:
        """The task's KEYS as the scripts take them, UTF-8 encoded once.

        A hot task's calls send the same 7 to 9 keys every time, and redis-py's
        asyncio client encodes each str argument of every command it packs.
        """
        every = tuple(k.encode() for k in self.task_keys(task_id).stepped())
        return WireKeys(every[:7], every[:8], every[:9], every)

    def task(self, task_id: object) -> tuple[str, TaskKeys]:
        """``task_id`` checked, and its keys."""
        tid = check_id(task_id, "task_id")
        return tid, self.task_keys(tid)

    # ---- request building -----------------------------------------------

    def history_part(
        self, cp: Checkpoint, history: History | None, upto: tuple[int, int], body: bytes
    ) -> tuple[list[Any], list[bytes], list[bytes]]:
        """The history header (epoch, base_m, base_c) and the message and cycle blobs to send.

        Only the entries added since ``history`` (what this client knows is
        stored) unless ``history`` is None: then the full lists go and the
        script skips what it already holds.
        """
        tid = cp.task_id
        lim_m, lim_c = upto
        if history is None:
            header: list[Any] = [b"", -1, -1]
            new_m, new_c = cp.messages[:lim_m], cp.cycles[:lim_c]
        else:
            header = [history.epoch, history.n_m, history.n_c]
            new_m, new_c = cp.messages[history.n_m : lim_m], cp.cycles[history.n_c : lim_c]
        blobs_m = [encode(m, what=lambda: f"message of task {tid!r}") for m in new_m]
        blobs_c = [encode(c, what=lambda: f"cycle record of task {tid!r}") for c in new_c]
        size = len(body) + sum(map(len, blobs_m)) + sum(map(len, blobs_c))
        if size > self.max_payload_bytes:
            raise InvalidArgument(
                f"checkpoint {tid!r} write is {size} bytes, over max_payload_bytes={self.max_payload_bytes}"
            )
        return header, blobs_m, blobs_c

    def cached(self, task_id: str) -> tuple[History | None, list[Any]]:
        h = self.history.get(task_id)
        if h is None or not h.usable():
            return None, [b"", 0, 0]
        return h, [h.epoch, h.n_m, h.n_c]

    def checkpoint(
        self, task_id: str, keys: TaskKeys, reply: Sequence[Any], at: int, cached: History | None, *, claim: bool
    ) -> Checkpoint:
        """Parse ``read_checkpoint``'s array starting at ``reply[at]``.

        ``claim``: the reader is the claimant of the next cycle, who may take
        the cached lists themselves when nobody else holds them; any other
        read (``load``) gets lists of its own.
        """
        try:
            # read_checkpoint's array: the HASH_FIELDS (scripts.py), in that order, then the history.
            fields = reply[at : at + _NF]
            status_raw, cycle, rev, token, claimed, lease, term, body, epoch, att, parked, why, _, due, prio, ckey = (
                fields
            )
            n_m, n_c, from_m, from_c, k = (int(x) for x in reply[at + _NF : at + _NF + 5])
            blobs = reply[at + _NF + 5 :]
            shared_state, terminal_result, budget = decode(body, key=keys.checkpoint, task_id=task_id)
            if not isinstance(shared_state, dict):
                raise TypeError("shared_state is not a map")
            cp = Checkpoint(
                task_id=task_id,
                cycle_index=int(cycle),
                status=_STATUSES[text(status_raw)],
                shared_state=shared_state,
                revision=int(rev),
                claim_token=text(token) if token else None,
                claimed_cycle=_opt_int(claimed),
                lease_expires_at_ms=_opt_int(lease),
                terminal_result=terminal_result if term == b"1" else None,
                budget_usage=budget,
                attempts=int(att) if att else 0,
                parked=parked == b"1",
                last_failure=text(why) if why else None,
                due_at_ms=_opt_int(due),
                priority=_priority(prio),
                concurrency_key=text(ckey) if ckey else None,
            )
            if len(blobs) != (n_m - from_m) + (n_c - from_c) or k != n_m - from_m:
                raise ValueError("history reply is inconsistent")
        except CorruptState:
            raise
        except Exception as exc:
            raise CorruptState(
                f"checkpoint of task {task_id!r} at {keys.checkpoint!r} is malformed: {exc!r}",
                task_id=task_id,
                key=keys.checkpoint,
            ) from exc
        blobs_m, blobs_c = blobs[:k], blobs[k:]
        new_m = [decode(b, key=keys.messages, task_id=task_id) for b in blobs_m]
        new_c = [decode(b, key=keys.cycles, task_id=task_id) for b in blobs_c]
        if not (from_m or from_c):
            # Freshly decoded lists: nobody else holds them.
            entry = History(epoch, new_m, new_c, n_m, n_c, cp.revision, hashed(blobs_m), hashed(blobs_c), lent=True)
            self.history.put(task_id, entry)
        else:
            # The script only skips entries when our cached epoch matched.
            if cached is None or cached.epoch != epoch:
                raise CorruptState(f"history reply of task {task_id!r} skips entries we never had", task_id=task_id)
            hash_m, hash_c = hashed(blobs_m, cached.hash_m), hashed(blobs_c, cached.hash_c)
            entry = History(epoch, cached.messages, cached.cycles, n_m, n_c, cp.revision, hash_m, hash_c, lent=True)
            if not (claim and not blobs and cached.intact() and self.history.put(task_id, entry, lend_from=cached)):
                # Lists of this reader's own (references copied, nothing decoded).
                entry.messages = cached.messages[:from_m] + new_m
                entry.cycles = cached.cycles[:from_c] + new_c
                if claim or blobs:
                    self.history.put(task_id, entry)
        cp.messages, cp.cycles = entry.messages, entry.cycles
        return cp
