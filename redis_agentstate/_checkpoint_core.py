"""Everything the checkpoint stores do that is not I/O: checks, arguments, replies.

Each public operation is a generator (see ``_ops``) that the sync and async
stores drive with their own client. Nothing here blocks or awaits.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import heapq
import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import scripts as S
from ._history import History, HistoryCache, committed, hashed
from ._ops import Batch, Call, Op, Pipe, corrupt_state, list_indexes, member_id, new_nonce
from ._validate import (
    MAX_CLAIM_FROM_REVISION,
    MAX_CYCLE,
    MAX_LEASE_MS,
    MAX_REVISION,
    MAX_STORED_REVISION,
    MAX_TERMINAL_TTL_MS,
    check_id,
    check_int,
)
from .codec import decode, encode
from .errors import (
    AlreadyClaimed,
    CheckpointTerminal,
    ClaimRejected,
    CorruptState,
    CycleConflict,
    InvalidArgument,
    NotParked,
    NotRunnable,
    TaskNotFound,
    TaskParked,
)
from .keys import SHARDS, Keys, TaskKeys
from .models import AgentStatus, Checkpoint
from .scripts import Reply

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MAX_BLOCK_MS", "CheckpointCore", "ClaimNextFound"]

logger = logging.getLogger("redis_agentstate")

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 2**20
#: How long acknowledge_terminal keeps its tombstone, so a re-send still reports success.
ACK_REMEMBER_MS = 3_600_000
_STATUSES = {s.value: s for s in AgentStatus}
#: The codes of a claim reply that carries the claimed checkpoint.
_CLAIMED = (Reply.DONE, Reply.TAKEN_OVER, Reply.DONE_BEFORE)
#: The codes of a claim_next reply that claimed nothing and may name the shard's head (PARKED: parked now).
_LOST_RACE = (Reply.REFUSED, Reply.PARKED)
#: A status (an ``AgentStatus`` or its value) -> its value as a plain str: what ``AgentStatus(x).value``
#: gives, without the enum lookup and property on the hot path (the members hash and compare as their values).
_STATUS_VALUE = {s.value: s.value for s in AgentStatus}


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _opt_int(raw: bytes) -> int | None:
    return int(raw) if raw else None


def _time_ms(reply: Any) -> int:
    """``TIME`` as parsed by redis-py (a pair of ints) or raw (two byte strings), in ms."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def _zset_entries(reply: Any, key: str) -> list[tuple[str, float]]:
    """``ZRANGE key 0 k WITHSCORES``: RESP2 ``[m1, s1, m2, s2, ...]`` or RESP3 ``[[m1, s1], ...]``."""
    if not reply:
        return []
    if isinstance(reply[0], (list, tuple)):
        return [(member_id(m, key), float(sc)) for m, sc in reply]
    return [(member_id(reply[i], key), float(reply[i + 1])) for i in range(0, len(reply), 2)]


class _Candidates:
    """Due ready entries a peek saw, shared by every caller of one store: the next claim_next tries
    the oldest of them in one round trip instead of peeking at 64 shard heads first.

    An entry stays due until someone claims it (its score only moves on a claim, a commit or a
    release), and the claim script re-checks it anyway, so a stale one costs a refused script,
    which answers with its shard's current head (a fresh candidate). Kept for ``max_age_s`` so the
    longest-waiting-first order is never staler than that.
    """

    def __init__(self, max_age_s: float = 1.0) -> None:
        #: How long the entries of one peek are tried before the next claim_next peeks afresh.
        self.max_age_s = max_age_s
        self._heap: list[tuple[float, str]] = []
        self._queued: set[str] = set()
        self._at = 0.0
        self._lock = threading.Lock()

    def reset(self, entries: Sequence[tuple[str, float]]) -> None:
        with self._lock:
            self._heap = [(score, tid) for tid, score in entries]
            heapq.heapify(self._heap)
            self._queued = {tid for tid, _ in entries}
            self._at = time.monotonic()

    def add(self, tid: str, score: float) -> None:
        with self._lock:
            if tid not in self._queued and time.monotonic() - self._at < self.max_age_s:
                heapq.heappush(self._heap, (score, tid))
                self._queued.add(tid)

    def announce(self, tid: str) -> None:
        """A task announced due now (``notify_due``): a candidate behind those a peek saw."""
        with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                self._heap, self._queued = [], set()
                self._at = time.monotonic()
            if tid not in self._queued:
                heapq.heappush(self._heap, (math.inf, tid))
                self._queued.add(tid)

    def discard(self, tid: str) -> None:
        with self._lock:
            self._queued.discard(tid)  # its heap entry is skipped by take()

    def take(self) -> str | None:
        """The oldest candidate (removed), or None when there is none or they are too old."""
        with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                self._heap, self._queued = [], set()
                return None
            while self._heap:
                _, tid = heapq.heappop(self._heap)
                if tid in self._queued:
                    self._queued.discard(tid)
                    return tid
            return None

    def __bool__(self) -> bool:
        return bool(self._queued) and time.monotonic() - self._at < self.max_age_s


#: Entries per task in a summary.lua reply (its header gives them): a kind, then these fields.
_SUMMARY_FIELDS = (*S.HASH_FIELDS[:7], *S.HASH_FIELDS[9:12])
_SUMMARY_STRIDE = 1 + len(_SUMMARY_FIELDS)
_SUMMARY_NAMES = ("status", "cycle", "rev", "token", "claimed", "lease", "term", "att", "parked", "why")
#: Fields of read_checkpoint's array before its history counts.
_NF = len(S.HASH_FIELDS)
#: The longest failure reason a release sends (release.lua keeps what it is sent).
MAX_REASON_BYTES = 1024


def _summary_row(tid: str, entry: Sequence[Any], now: int) -> dict[str, Any] | None:
    """One row of ``CheckpointCore.summaries`` from a task's entries of a summary.lua reply."""
    kind = _s(entry[0])
    if kind == "missing":
        return None
    try:
        if kind != "ok":
            raise ValueError(_s(entry[1]))
        values = (v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in entry[1:])
        f = dict(zip(_SUMMARY_FIELDS, values, strict=True))
        status, cycle, rev, token, claimed, lease, term, att, parked, why = (f[name] for name in _SUMMARY_NAMES)
    except (ValueError, UnicodeDecodeError) as exc:
        return {
            "task_id": tid, "status": "corrupt", "corrupt": str(exc), "cycle_index": None, "revision": None,
            "terminal": False, "claim_token": None, "claimed_cycle": None, "lease_expires_at_ms": None,
            "lease_state": None, "lease_remaining_ms": None, "attempts": None, "parked": False,
            "last_failure": None,
        }  # fmt: skip
    lease_ms = int(lease) if lease else None
    return {
        "task_id": tid,
        "status": status,
        "cycle_index": int(cycle),
        "revision": int(rev),
        "terminal": term == "1",
        "claim_token": token or None,
        "claimed_cycle": int(claimed) if claimed else None,
        "lease_expires_at_ms": lease_ms,
        "lease_state": None if not token else ("live" if lease_ms and lease_ms > now else "expired"),
        "lease_remaining_ms": (lease_ms - now) if token and lease_ms else None,
        "attempts": int(att) if att else 0,
        "parked": parked == "1",
        "last_failure": why or None,
    }


@dataclass(slots=True)
class _Written:
    """What a fenced write got back: the reply, the cache entry it was sent against (None: full
    lists went), the entry it left in the cache when applied now, and the body it sent."""

    reply: Sequence[Any]
    known: History | None
    entry: History | None
    body: bytes

    @property
    def applied(self) -> bool:
        """Applied now or before (a re-send)."""
        return bool(self.reply[0] in (Reply.DONE, Reply.DONE_BEFORE))


#: The longest ``block_ms`` of ``claim_next`` (a day; a Runner loops shorter blocks anyway).
MAX_BLOCK_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class ClaimNextFound:
    """One claim_next attempt, for a blocked caller: the claim (or None), the ms until the
    earliest ready entry not yet due (None: the index is empty), and whether more was due."""

    checkpoint: Checkpoint | None
    wait_ms: int | None
    more_due: bool


class CheckpointCore:
    """Validation, request building and reply parsing for one namespace."""

    def __init__(
        self,
        namespace: str,
        *,
        max_payload_bytes: int,
        history_cache: int,
        max_attempts: int | None = None,
        terminal_ttl_ms: int | None = None,
    ) -> None:
        self.keys = Keys(namespace)
        #: Sent with every claim and release; 0 (None given) turns parking off.
        self.max_attempts = 0 if max_attempts is None else check_int(max_attempts, "max_attempts", 1, MAX_CYCLE)
        #: How long a task that became terminal through this store lives unacknowledged (None: for ever).
        self.terminal_ttl_ms = (
            None if terminal_ttl_ms is None else check_int(terminal_ttl_ms, "terminal_ttl_ms", 1, MAX_TERMINAL_TTL_MS)
        )
        # Key strings are rebuilt for every call otherwise; hot tasks are few.
        self._task_keys = functools.lru_cache(maxsize=4096)(self.keys.task)
        self._wire_keys = functools.lru_cache(maxsize=4096)(self._encode_keys)
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 1, 2**31)
        self.history = HistoryCache(check_int(history_cache, "history_cache", 0, 2**31))
        self._corrupt_logged: set[str] = set()
        self._candidates = _Candidates()

    def _encode_keys(self, task_id: str) -> tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]]:
        """The task's KEYS as the scripts take them, UTF-8 encoded once: ``as_list()``, ``with_parked()``,
        ``counted()``.

        A hot task's calls send the same 7 to 9 keys every time, and redis-py's
        asyncio client encodes each str argument of every command it packs.
        """
        every = tuple(k.encode() for k in self._task_keys(task_id).counted())
        return every[:7], every[:8], every

    # ---- checks ---------------------------------------------------------

    def _task(self, task_id: object) -> tuple[str, TaskKeys]:
        tid = check_id(task_id, "task_id")
        return tid, self._task_keys(tid)

    @staticmethod
    def _token(token: object) -> str:
        return check_id(token, "token", max_bytes=256)

    @staticmethod
    def _lease(lease_ms: object) -> int:
        return check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)

    @staticmethod
    def _revision(revision: object, what: str = "expected_revision", *, bumped: bool = False) -> int:
        """``bumped``: the write stores ``revision + 1``, which must stay within MAX_REVISION."""
        return check_int(revision, what, 0, MAX_REVISION - 1 if bumped else MAX_REVISION)

    def validate(self, cp: object, *, stores_revision: bool = True) -> Checkpoint:
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
            self._token(cp.claim_token)
        claimed = cp.claimed_cycle
        if claimed is not None and not (type(claimed) is int and 1 <= claimed <= MAX_CYCLE):
            check_int(claimed, "claimed_cycle", 1, MAX_CYCLE)
        if lease is not None and not (type(lease) is int and 0 <= lease <= MAX_REVISION):
            check_int(lease, "lease_expires_at_ms", 0, MAX_REVISION)
        return cp

    # ---- request building -----------------------------------------------

    def _body(self, cp: Checkpoint) -> bytes:
        return encode(
            [cp.shared_state, cp.terminal_result, cp.budget_usage], what=lambda: f"checkpoint {cp.task_id!r} body"
        )

    def _history_part(
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

    @staticmethod
    def _store_argv(cp: Checkpoint, nonce: str, body: bytes, blobs_m: list[bytes], blobs_c: list[bytes]) -> list[Any]:
        """ARGV of create.lua and save.lua (their headers give the layout)."""
        term = "0" if cp.terminal_result is None else "1"
        claimed = "" if cp.claimed_cycle is None else str(int(cp.claimed_cycle))
        lease = "" if cp.lease_expires_at_ms is None else str(int(cp.lease_expires_at_ms))
        return [
            nonce, cp.claim_token or "", int(cp.revision), int(cp.cycle_index), _STATUS_VALUE[cp.status], term,
            body, claimed, lease, len(blobs_m), *blobs_m, *blobs_c,
        ]  # fmt: skip

    @staticmethod
    def _fenced_argv(
        script: str,
        cp: Checkpoint,
        identity: str,
        token: str,
        expected: int,
        body: bytes,
        part: tuple[list[Any], list[bytes], list[bytes]],
        replace: bool,
        claim: tuple[Any, ...] = (),
        ttl_ms: int = 0,
    ) -> list[Any]:
        """ARGV of commit.lua, finalize.lua (which takes no token) or commit_and_claim.lua (``claim``:
        its next_token and lease_ms): their headers give the layout. ``ttl_ms``: the ttl_ms slot of
        commit.lua and finalize.lua (terminal_ttl_ms, 0 for none)."""
        (epoch, base_m, base_c), blobs_m, blobs_c = part
        head = [identity] if script == S.FINALIZE else [identity, token]
        term = "0" if cp.terminal_result is None else "1"
        extra = claim if script == S.COMMIT_AND_CLAIM else (ttl_ms,)
        return [
            *head, int(expected), int(cp.cycle_index), _STATUS_VALUE[cp.status], term, body, *extra,
            "1" if replace else "0", epoch, base_m, base_c, len(blobs_m), *blobs_m, *blobs_c,
        ]  # fmt: skip

    @staticmethod
    def _write_id(
        kind: str,
        cp: Checkpoint,
        token: str,
        expected: int,
        replace: bool,
        body: bytes,
        upto: tuple[int, int],
        hash_m: Any,
        hash_c: Any,
        claim: tuple[Any, ...] = (),
    ) -> str:
        """The identity of a fenced write: a digest of everything it writes, whoever sends it.

        Token, expected revision, cycle, status, terminal flag, body, replace
        flag, the message and cycle counts and a digest of the whole resulting
        history (``hash_m``/``hash_c``: the stored prefix from the cache, at
        O(delta) cost, or the caller's full lists). The same write re-sent by
        anyone (another store, after the cache moved on) has the same identity;
        a different write at the same revision a different one. ``claim``
        (commit_and_claim: the next token) is part of what it writes; its lease
        is not, so a re-send with another lease is still this write.
        """
        head = [kind, token, expected, int(cp.cycle_index), _STATUS_VALUE[cp.status],
                cp.terminal_result is not None, replace, *upto, len(body), *claim]  # fmt: skip
        d = hashlib.blake2b(encode(head, what="write identity"), digest_size=16)
        d.update(hash_m.digest())
        d.update(hash_c.digest())
        d.update(body)
        return d.hexdigest()

    def _cached(self, task_id: str) -> tuple[History | None, list[Any]]:
        h = self.history.get(task_id)
        if h is None or not h.usable():
            return None, [b"", 0, 0]
        return h, [h.epoch, h.n_m, h.n_c]

    # ---- reply parsing --------------------------------------------------

    def _checkpoint(
        self, task_id: str, keys: TaskKeys, reply: Sequence[Any], at: int, cached: History | None, *, claim: bool
    ) -> Checkpoint:
        """Parse ``read_checkpoint``'s array starting at ``reply[at]``.

        ``claim``: the reader is the claimant of the next cycle, who may take
        the cached lists themselves when nobody else holds them; any other
        read (``load``) gets lists of its own.
        """
        try:
            # read_checkpoint's array: the HASH_FIELDS (scripts.py), in that order, then the history.
            status_raw, cycle, rev, token, claimed, lease, term, body, epoch, att, parked, why, _ = reply[at : at + _NF]
            n_m, n_c, from_m, from_c, k = (int(x) for x in reply[at + _NF : at + _NF + 5])
            blobs = reply[at + _NF + 5 :]
            shared_state, terminal_result, budget = decode(body, key=keys.checkpoint, task_id=task_id)
            if not isinstance(shared_state, dict):
                raise TypeError("shared_state is not a map")
            cp = Checkpoint(
                task_id=task_id,
                cycle_index=int(cycle),
                status=_STATUSES[_s(status_raw)],
                shared_state=shared_state,
                revision=int(rev),
                claim_token=_s(token) if token else None,
                claimed_cycle=_opt_int(claimed),
                lease_expires_at_ms=_opt_int(lease),
                terminal_result=terminal_result if term == b"1" else None,
                budget_usage=budget,
                attempts=int(att) if att else 0,
                parked=parked == b"1",
                last_failure=_s(why) if why else None,
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

    # ---- operations -----------------------------------------------------

    def create(self, cp: Checkpoint) -> Op[bool]:
        """A per-call nonce, not the content, names a create: "False if it exists" stays first-wins."""
        # A generator of its own (not _store's), so telemetry names the operation "create".
        return (yield from self._store(S.CREATE, cp))

    def save(self, cp: Checkpoint) -> Op[None]:
        yield from self._store(S.SAVE, cp)
        return None

    def _store(self, script: str, cp: Checkpoint) -> Op[bool]:
        self.validate(cp)
        keys = self._task_keys(cp.task_id)
        messages, cycles = list(cp.messages), list(cp.cycles)  # exactly what this write sends
        body = self._body(cp)
        _, blobs_m, blobs_c = self._history_part(cp, None, (len(messages), len(cycles)), body)
        args = self._store_argv(cp, new_nonce(), body, blobs_m, blobs_c)
        # A save replaces a parked task too: it takes the parked index to take the task out of it.
        reply = yield Call(script, keys.with_parked() if script == S.SAVE else keys.as_list(), args)
        if reply[0] == Reply.REFUSED:
            return False
        if reply[0] == Reply.DONE_BEFORE:
            # A re-send: reply[1] is the epoch now, which may name a history written since.
            self.history.drop(cp.task_id)
            return True
        entry = History(reply[1], messages, cycles, len(messages), len(cycles), int(cp.revision),
                         hashed(blobs_m), hashed(blobs_c))  # fmt: skip
        self.history.put(cp.task_id, entry)
        return True

    def load(self, task_id: str) -> Op[Checkpoint | None]:
        tid, keys = self._task(task_id)
        cached, have = self._cached(tid)
        reply = yield Call(S.LOAD, keys.as_list(), have)
        if not reply:
            self.history.drop(tid)
            return None
        return self._checkpoint(tid, keys, reply, 0, cached, claim=False)

    def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        tid, keys = self._task(task_id)
        cycle_index = check_int(cycle_index, "cycle_index", 1, MAX_CYCLE)
        token = self._token(token)
        lease_ms = self._lease(lease_ms)
        cached, have = self._cached(tid)
        reply = yield Call(S.CLAIM, self._wire_keys(tid)[2], [token, cycle_index, lease_ms, *have, self.max_attempts])
        code = reply[0]
        if code in _CLAIMED:
            return self._checkpoint(tid, keys, reply, 1, cached, claim=True)
        if code == Reply.REFUSED:
            return None
        self._claim_refused(tid, cycle_index, code, reply)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _claim_refused(tid: str, cycle_index: int, code: int, reply: Sequence[Any]) -> None:
        """Raise what a claim of ``cycle_index`` answered by ``code`` (claim.lua's refusals) means."""
        detail = _s(reply[1]) if len(reply) > 1 else ""
        if code in (Reply.CYCLE_CONFLICT, Reply.HELD, Reply.REVISION_EXHAUSTED) and not detail.isdigit():
            raise CorruptState(f"checkpoint of task {tid!r} holds a malformed number {detail!r}", task_id=tid)
        if code == Reply.TERMINAL:
            raise CheckpointTerminal(f"checkpoint for task {tid!r} is terminal (status {detail})", task_id=tid)
        if code == Reply.PARKED:
            if not detail.isdigit():
                raise CorruptState(f"checkpoint of task {tid!r} holds a malformed number {detail!r}", task_id=tid)
            reason = _s(reply[2]) if len(reply) > 2 else ""
            raise TaskParked(
                f"task {tid!r} is parked after {detail} attempt(s) at cycle {cycle_index} ended without a commit "
                f"(last failure: {reason or 'none recorded'}); requeue it to run it again",
                task_id=tid,
                attempts=int(detail),
                reason=reason,
            )
        if code == Reply.NOT_RUNNING:
            raise NotRunnable(f"checkpoint for task {tid!r} is not running (status {detail})", task_id=tid)
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

    #: How many successive heads of one shard claim_next tries after losing races there.
    CLAIM_NEXT_TRIES_PER_SHARD = 4

    def claim_next(self, *, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        """Claim the next cycle of any claimable task, or return None when none is due.

        One pipelined peek reads the server clock and the head (oldest score) of
        every shard's ready index; the due heads are tried oldest first, so the
        task that has waited longest fleet-wide goes first (a task that just
        committed re-enters at the back: FIFO, fair per task, not per shard).
        The claim itself is one script on the candidate's keys, which re-checks
        the checkpoint and, when another worker won the race, answers with the
        shard's new head so the next try costs one more script, not a new peek;
        after a round of lost races a fresh peek follows, and None means a peek
        found nothing due. The other due entries a peek saw (up to
        ``CLAIM_NEXT_PEEK`` per shard) and the tasks the store's wake-up
        subscription announced are candidates: while under a second old, the
        store's next calls claim the oldest of them in one script, without a peek.
        """
        token = self._token(token)
        lease_ms = self._lease(lease_ms)
        found = yield from self.claim_next_probe(token, lease_ms)
        return found.checkpoint

    def check_block_ms(self, block_ms: object) -> int:
        """``claim_next``'s ``block_ms``: an int of ms, 0 (do not block) up to ``MAX_BLOCK_MS``."""
        return check_int(block_ms, "block_ms", 0, MAX_BLOCK_MS)

    #: Ready entries per shard a peek reads: the head decides, the rest are candidates for later calls.
    CLAIM_NEXT_PEEK = 4
    #: Candidates a claim_next tries (one script each) before it peeks.
    CLAIM_NEXT_FAST_TRIES = 3

    def _claim_next_call(self, tid: str, token: str, lease_ms: int, have: list[Any]) -> Call:
        return Call(S.CLAIM_NEXT, self._wire_keys(tid)[2], [token, lease_ms, *have, self.max_attempts])

    def _claim_candidates(self, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        """The fast path: claim the oldest candidate an earlier peek left (one script, one round trip)."""
        for _ in range(self.CLAIM_NEXT_FAST_TRIES):
            tid = self._candidates.take()
            if tid is None:
                return None
            keys = self._task_keys(tid)
            cached, have = self._cached(tid)
            try:
                reply = yield self._claim_next_call(tid, token, lease_ms, have)
            except CorruptState:
                continue  # the peek path meets it again, and skips or raises it there
            code = reply[0]
            if code in _CLAIMED:
                return self._checkpoint(tid, keys, reply, 1, cached, claim=True)
            if code not in _LOST_RACE:
                raise CorruptState(f"unexpected claim_next reply {reply[:2]!r} for task {tid!r}", task_id=tid)
            if len(reply) >= 4 and float(reply[3]) <= int(reply[1]):
                self._candidates.add(member_id(reply[2], keys.ready), float(reply[3]))
        return None

    @property
    def claim_next_candidate_age_s(self) -> float:
        """How long claim_next tries the candidates of one peek before it peeks again (0: always peek)."""
        return self._candidates.max_age_s

    @claim_next_candidate_age_s.setter
    def claim_next_candidate_age_s(self, seconds: float) -> None:
        self._candidates.max_age_s = seconds

    def announced(self, task_id: str) -> None:
        """``task_id`` was announced due (the store's wake-up subscription): the next claim tries it first."""
        self._candidates.announce(task_id)

    def claim_next_probe(self, token: str, lease_ms: int) -> Op[ClaimNextFound]:
        """``claim_next`` (arguments checked already), also reporting what a blocked caller times itself by."""
        if self._candidates:
            cp = yield from self._claim_candidates(token, lease_ms)
            if cp is not None:
                return ClaimNextFound(cp, None, bool(self._candidates))
        peek = self.CLAIM_NEXT_PEEK - 1
        heads = [("ZRANGE", self.keys.shard_ready(s), 0, peek, "WITHSCORES") for s in range(SHARDS)]
        wait_ms: int | None = None
        for _round in range(self.CLAIM_NEXT_ROUNDS):
            replies = yield Pipe([("TIME",), *heads], wrongtype_ok=True)
            now = _time_ms(replies[0])
            entries, broken = self._shard_heads(heads, replies[1:])
            heads_read = [shard[0] if shard else None for shard in entries]
            due = [head for head in heads_read if head is not None and head[1] <= now]
            # Every due entry seen is a candidate for the next calls, but the heads tried below.
            self._candidates.reset([e for shard in entries for e in shard[1:] if e[1] <= now])
            later = [head[1] for head in heads_read if head is not None and head[1] > now]
            # The earliest head not yet due: a lapsing lease or a delayed release, which publish nothing.
            wait_ms = max(1, int(min(later) - now)) if later else None
            if not due:
                if broken is not None:
                    raise broken  # nothing else to claim: a corrupt index is never silently hidden
                return ClaimNextFound(None, wait_ms, False)
            # Oldest first fleet-wide (FIFO across shards too); shuffle only the few oldest to spread a fleet.
            due.sort(key=lambda head: head[1])
            spread = due[: self.CLAIM_NEXT_SPREAD]
            random.shuffle(spread)
            due[: self.CLAIM_NEXT_SPREAD] = spread
            cp = yield from self._claim_due(due, now, token, lease_ms)
            if cp is not None:
                return ClaimNextFound(cp, wait_ms, len(due) > 1 or bool(self._candidates))
        # Others won every race: there was work, so a blocked caller tries again at once.
        return ClaimNextFound(None, 0, True)

    def _shard_heads(
        self, heads: list[tuple[Any, ...]], replies: Sequence[Any]
    ) -> tuple[list[list[tuple[str, float]]], CorruptState | None]:
        """The peeked entries of every shard, and the first shard index found corrupt (skipped).

        A ready index of another Redis type (no script leaves one; an operator's
        mistake) must not stall the whole fleet: its shard is skipped, logged
        once, and its ``CorruptState`` raised only when nothing else is due.
        """
        entries: list[list[tuple[str, float]]] = []
        broken: CorruptState | None = None
        for cmd, reply in zip(heads, replies, strict=True):
            if isinstance(reply, Exception):
                exc = corrupt_state(cmd[1], [cmd[1]], f"is not the zset the library keeps ({reply})")
                self._skipped_corrupt(exc)
                broken = broken or exc
                entries.append([])
            else:
                entries.append(_zset_entries(reply, cmd[1]))
        return entries, broken

    #: Fresh peeks claim_next makes before answering None while others keep winning the races.
    CLAIM_NEXT_ROUNDS = 8
    #: How many of the oldest due shard heads are tried in random order.
    CLAIM_NEXT_SPREAD = 1

    def _claim_due(self, due: list[tuple[str, float]], now: int, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        """Claim the first of ``due`` that can be claimed; None when others won every race.

        A task holding data we did not write is skipped (logged once), so one
        corrupt task cannot stall a fleet; its ``CorruptState`` is raised only
        when nothing else could be claimed, so it is never silently hidden.
        """
        corrupt: CorruptState | None = None
        skipped: set[str] = set()
        for i, (head, _score) in enumerate(due):
            tid: str | None = head
            for _ in range(self.CLAIM_NEXT_TRIES_PER_SHARD):
                if tid is None:
                    break
                keys = self._task_keys(tid)
                try:
                    cached, have = self._cached(tid)
                    reply = yield self._claim_next_call(tid, token, lease_ms, have)
                    code = reply[0]
                    if code in _CLAIMED:
                        for other, score in due[i + 1 :]:
                            self._candidates.add(other, score)  # heads not tried: candidates of the next calls
                        return self._checkpoint(tid, keys, reply, 1, cached, claim=True)
                    if code not in _LOST_RACE:
                        raise CorruptState(f"unexpected claim_next reply {reply[:2]!r} for task {tid!r}", task_id=tid)
                except CorruptState as exc:
                    self._skipped_corrupt(exc)
                    corrupt = corrupt or exc
                    skipped.add(tid)
                    # The rest of the shard queues behind the corrupt task: look past the skipped ones.
                    (page,) = yield Pipe([("ZRANGEBYSCORE", keys.ready, "-inf", now, "LIMIT", 0, len(skipped) + 1)])
                    tid = next((m for m in (member_id(r, keys.ready) for r in page) if m not in skipped), None)
                    continue
                if len(reply) < 4 or float(reply[3]) > int(reply[1]):
                    break  # nothing else due in this shard
                tid = member_id(reply[2], keys.ready)
                self._candidates.discard(tid)
        if corrupt is not None:
            raise corrupt
        return None

    def _skipped_corrupt(self, exc: CorruptState) -> None:
        # Once per task per store: claim_next meets the same corrupt head on every call.
        ident = exc.task_id or exc.key or str(exc)
        if ident in self._corrupt_logged or len(self._corrupt_logged) >= 1024:
            return
        self._corrupt_logged.add(ident)
        logger.warning("claim_next skips corrupt data (fix or delete it; `agentstate list` shows tasks): %s", exc)

    def commit(self, cp: Checkpoint, *, token: str, expected_revision: int, replace_history: bool = False) -> Op[bool]:
        self.validate(cp, stores_revision=False)
        token = self._token(token)
        expected = self._revision(expected_revision, bumped=True)
        written = yield from self._fenced_write("commit", S.COMMIT, cp, token, expected, replace_history)
        return written.applied

    def finalize(self, cp: Checkpoint, *, expected_revision: int, replace_history: bool = False) -> Op[bool]:
        self.validate(cp, stores_revision=False)
        if cp.terminal_result is None:
            raise InvalidArgument("finalized checkpoint must include terminal_result", task_id=cp.task_id)
        expected = self._revision(expected_revision, bumped=True)
        written = yield from self._fenced_write("finalize", S.FINALIZE, cp, "", expected, replace_history)
        return written.applied

    def commit_and_claim(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        lease_ms: int,
        next_token: str | None = None,
        replace_history: bool = False,
    ) -> Op[Checkpoint | None]:
        """Commit the claimed cycle ``cp.cycle_index`` and claim the next one, in one script.

        Returns the new claim (as ``claim`` would), or None when fenced out
        (nothing written). Before anything is sent: InvalidArgument unless
        ``cp`` is runnable (status running, no terminal_result) and its next
        cycle is within MAX_CYCLE; ClaimRejected when the new claim's commit
        could not be stored (the revision limit, as ``claim``). A ClaimRejected
        subclass from Redis means a re-send (after a lost reply) whose commit
        had applied but whose claim another worker has taken since.
        """
        self.validate(cp, stores_revision=False)
        tid = cp.task_id
        if cp.status != AgentStatus.RUNNING or cp.terminal_result is not None:
            raise InvalidArgument(
                f"commit_and_claim continues a runnable task: status must be running without terminal_result "
                f"(got status {_STATUS_VALUE[cp.status]!r}); use commit or finalize",
                task_id=tid,
            )
        if cp.cycle_index >= MAX_CYCLE:
            raise InvalidArgument(f"cycle {cp.cycle_index} is the last one: use commit", task_id=tid)
        token = self._token(token)
        next_token = token if next_token is None else self._token(next_token)
        lease_ms = self._lease(lease_ms)
        expected = self._revision(expected_revision, bumped=True)
        if expected + 1 > MAX_CLAIM_FROM_REVISION:
            raise ClaimRejected(
                f"checkpoint of task {tid!r} would be at revision {expected + 1}: a claim and its commit would "
                f"run past the highest revision {MAX_REVISION} (nothing was written; commit instead)",
                task_id=tid,
                revision=expected + 1,
            )
        w = yield from self._fenced_write(
            "commit_and_claim", S.COMMIT_AND_CLAIM, cp, token, expected, replace_history,
            (next_token, lease_ms, self.max_attempts), claim_revision=expected + 2,
        )  # fmt: skip
        reply, code = w.reply, w.reply[0]
        keys = self._task_keys(tid)
        if code == Reply.DONE and w.entry is None:
            # Full lists were appended: the claim came back whole (commit_and_claim.lua).
            return self._checkpoint(tid, keys, reply, 1, None, claim=True)
        if code == Reply.DONE:
            assert w.entry is not None
            return self._continued(cp, w.entry, w.body, next_token, reply)
        if code == Reply.DONE_BEFORE:
            return self._checkpoint(tid, keys, reply, 1, w.known, claim=True)
        if code == Reply.REFUSED:
            return None
        self._claim_refused(tid, cp.cycle_index + 1, code, reply)
        raise AssertionError("unreachable")  # pragma: no cover

    def _continued(self, cp: Checkpoint, claim: History, body: bytes, token: str, reply: Sequence[Any]) -> Checkpoint:
        """The claim a commit_and_claim made, from what the client wrote and the reply's epoch and lease.

        The state is decoded from the very body sent (objects of the claimant's
        own, as a claim's); the history lists are those of ``claim``, the cache
        entry ``_fenced_write`` left for the new claim (``_claimed_entry``).
        """
        tid = cp.task_id
        shared_state, _terminal, budget = decode(body, key=self._task_keys(tid).checkpoint, task_id=tid)
        return Checkpoint(
            task_id=tid,
            cycle_index=cp.cycle_index,
            status=AgentStatus.RUNNING,
            shared_state=shared_state,
            revision=claim.revision,
            claim_token=token,
            claimed_cycle=cp.cycle_index + 1,
            lease_expires_at_ms=int(reply[2]),
            budget_usage=budget,
            attempts=1,
            messages=claim.messages,
            cycles=claim.cycles,
        )

    def _claimed_entry(self, task_id: str, entry: History, revision: int) -> History:
        """Cache, for the claim a commit_and_claim made at ``revision``, the history ``entry`` its commit wrote.

        In one step what a commit then a claim of the task through this store
        would leave: the committed lists pass to the claimant (lent), as a claim
        takes them from the cache when nobody else holds them; copies when the
        caller appended past them since, or when the cache is off.
        """
        claim = History(entry.epoch, entry.messages, entry.cycles, entry.n_m, entry.n_c, revision,
                        entry.hash_m, entry.hash_c, lent=True)  # fmt: skip
        if not (entry.intact() and self.history.max_tasks):
            claim.messages, claim.cycles = entry.messages[: entry.n_m], entry.cycles[: entry.n_c]
        self.history.put(task_id, claim)
        return claim

    def _fenced_write(
        self,
        kind: str,
        script: str,
        cp: Checkpoint,
        token: str,
        expected: int,
        replace: bool,
        claim: tuple[Any, ...] = (),
        claim_revision: int | None = None,
    ) -> Op[_Written]:
        """``claim_revision`` (commit_and_claim): the entry an applied write leaves in the cache is the claim's
        (``_claimed_entry``), and ``written.entry`` is that."""
        # finalize may close a parked task (the parked index); commit and commit_and_claim count what they
        # apply (the parked index, then the shard's counters: commit_and_claim's re-send may park a task).
        keys = self._wire_keys(cp.task_id)[1 if script == S.FINALIZE else 2]
        ttl_ms = self.terminal_ttl_ms or 0  # not part of the write's identity: a re-send by any store is this write
        upto = n_m, n_c = len(cp.messages), len(cp.cycles)  # this write's extent, fixed before any I/O
        body = self._body(cp)
        known = self.history.get(cp.task_id)
        # Only the delta goes when the cache was read at this very revision: its
        # entries are then exactly the history this write extends (claims do not
        # touch history, commits move the revision on), so the digest of cached
        # prefix + delta is what anyone sending this write computes. Otherwise
        # (and for a shorter checkpoint: the script decides, after fencing,
        # whether that is a forbidden shrink) the full lists go.
        if (
            replace
            or known is None
            or not known.usable()
            or known.revision != expected
            or n_m < known.n_m
            or n_c < known.n_c
        ):
            known = None

        def request(h: History | None) -> tuple[Call, Any, Any]:
            part = self._history_part(cp, h, upto, body)
            _, blobs_m, blobs_c = part
            hash_m = hashed(blobs_m, None if h is None else h.hash_m)
            hash_c = hashed(blobs_c, None if h is None else h.hash_c)
            identity = self._write_id(kind, cp, token, expected, replace, body, upto, hash_m, hash_c, claim[:1])
            args = self._fenced_argv(script, cp, identity, token, expected, body, part, replace, claim, ttl_ms)
            return Call(script, keys, args), hash_m, hash_c

        call, hash_m, hash_c = request(known)
        reply = yield call
        if reply[0] == Reply.RESEND_HISTORY:
            # Our cached view of the history was stale: send it whole; the script skips what it holds.
            # Nothing was written, so this send may carry the identity of the full lists.
            known = None
            call, hash_m, hash_c = request(None)
            reply = yield call
        if reply[0] == Reply.SHRINK:
            raise InvalidArgument(
                f"checkpoint {cp.task_id!r} has fewer messages or cycles than are stored; "
                "history is append-only (pass replace_history=True to rewrite it)",
                task_id=cp.task_id,
                revision=expected,
            )
        written = _Written(reply, known, None, body)
        if reply[0] == Reply.DONE_BEFORE:
            # Applied already (a re-send): reply[1] is the epoch now, which may name a history rewritten since.
            self.history.drop(cp.task_id)
        elif reply[0] != Reply.DONE:
            pass
        elif replace or known is not None:
            if replace:
                messages, cycles = cp.messages[:n_m], cp.cycles[:n_c]
            else:
                # Redis kept its own first n entries and appended ours after them. The
                # committed lists pass to the cache: the claimant is done with them, so
                # the next claim may take them without a copy.
                assert known is not None
                messages = committed(known.messages, known.n_m, cp.messages)
                cycles = committed(known.cycles, known.n_c, cp.cycles)
            entry = History(reply[1], messages, cycles, n_m, n_c, expected + 1, hash_m, hash_c)
            if claim_revision is None:
                self.history.put(cp.task_id, entry)
                written.entry = entry
            else:
                written.entry = self._claimed_entry(cp.task_id, entry, claim_revision)
        else:
            # Full lists went: the script kept what it held, which we have not seen.
            self.history.drop(cp.task_id)
        return written

    def renew(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> Op[int | None]:
        """Returns the new ``lease_expires_at_ms`` (server clock), or None if not renewed."""
        tid = check_id(task_id, "task_id")
        args = [self._token(token), self._revision(expected_revision), self._lease(lease_ms)]
        reply = yield Call(S.RENEW, self._wire_keys(tid)[0], args)
        return int(reply[1]) if reply[0] == Reply.DONE else None

    @staticmethod
    def _reason(reason: object) -> str:
        """A failure reason as release.lua stores it: '' for none, else at most MAX_REASON_BYTES of UTF-8.

        Too long a reason is cut, not refused, and what UTF-8 cannot carry is escaped
        (``'\\ud800'``): a release must never fail for its message.
        """
        if reason is None:
            return ""
        if not isinstance(reason, str):
            raise InvalidArgument(f"reason must be a str or None, got {type(reason).__name__}")
        # Only the head can be kept: a longer one need not be encoded whole (each char is 1+ bytes).
        reason = reason[: MAX_REASON_BYTES + 1]
        # A lone surrogate (os.fsdecode of a non-UTF-8 file name) has no UTF-8 form: sent as it
        # is, the client's encoding raised and the claim was left to lapse. It is stored escaped.
        raw = reason.encode("utf-8", "backslashreplace")
        if len(raw) > MAX_REASON_BYTES:
            reason = raw[: MAX_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."
        else:
            reason = raw.decode("utf-8")
        # An empty reason would read as "no failure" (release.lua gives the attempt back).
        return reason if reason else "failed (no reason given)"

    def release(
        self, task_id: str, *, token: str, expected_revision: int, after_ms: int, reason: str | None = None
    ) -> Op[str | None]:
        """Give the claimed cycle up (release.lua): ``"released"``, ``"parked"``, or None when not ours any more.

        With ``reason`` the attempt is recorded as failed (and parks the task if it was attempt
        ``max_attempts``); without, it is given back (a shutdown is no failure).
        """
        tid = check_id(task_id, "task_id")
        args = [self._token(token), self._revision(expected_revision), self._lease(after_ms), self._reason(reason)]
        reply = yield Call(S.RELEASE, self._wire_keys(tid)[1], [*args, self.max_attempts])
        code = reply[0]
        if code in (Reply.DONE, Reply.DONE_BEFORE):
            return "released"
        if code == Reply.PARKED:
            self.history.drop(tid)
            return "parked"
        return None

    def requeue(self, task_id: str) -> Op[None]:
        """Make a parked task runnable again at its cycle (requeue.lua), its attempts counted from 0.

        Raises TaskNotFound (no such task) or NotParked (nothing to do); nothing is written then.
        A re-send after a lost reply is recognised by its nonce and succeeds.
        """
        tid, keys = self._task(task_id)
        reply = yield Call(S.REQUEUE, keys.with_parked(), [new_nonce()])
        code = reply[0]
        if code in (Reply.DONE, Reply.DONE_BEFORE):
            return None
        if code == Reply.REFUSED:
            raise TaskNotFound(f"no task {tid!r} in namespace {self.keys.namespace!r}", task_id=tid)
        if code == Reply.NOT_PARKED:
            status = _s(reply[1])
            raise NotParked(f"task {tid!r} is not parked (status {status}): nothing to requeue", task_id=tid,
                            status=status)  # fmt: skip
        raise CorruptState(f"unexpected requeue reply {list(reply[:2])!r} for task {tid!r}", task_id=tid)

    def list_parked(self) -> Op[builtins.list[str]]:
        """Every parked task id, from the per-shard parked indexes, paged (never KEYS or SCAN)."""
        return (yield from list_indexes([self.keys.shard_parked(s) for s in range(SHARDS)]))

    def acknowledge_terminal(self, task_id: str, *, expected_revision: int) -> Op[bool]:
        tid, keys = self._task(task_id)
        expected = self._revision(expected_revision)
        # The identity of an acknowledgement is the task and the revision it deletes:
        # a re-send by anyone is recognised (the tombstone), a different revision is not.
        args = [f"ack:{expected}", expected, ACK_REMEMBER_MS]
        reply = yield Call(S.ACKNOWLEDGE_TERMINAL, keys.as_list(), args)
        if reply == Reply.DONE:
            self.history.drop(tid)
        return bool(reply == Reply.DONE)

    def delete(self, task_id: str) -> Op[None]:
        tid, keys = self._task(task_id)
        yield Call(S.DELETE, keys.with_parked(), [])
        self.history.drop(tid)

    #: Tasks per summary.lua call (one call per shard and chunk, all in one pipeline).
    SUMMARY_CHUNK = 500

    def summaries(self, task_ids: Sequence[str]) -> Op[tuple[int, builtins.list[dict[str, Any]]]]:
        """Server time (ms) and one row of scalar fields per task, in ``task_ids`` order (no histories).

        For operator tooling (``agentstate list``/``stats``). One pipeline of
        ``summary.lua`` calls, one per shard (and chunk). A task whose fields
        this library would not have written, or whose key is not a hash, is a
        row with status ``corrupt`` and a ``corrupt`` reason (the scripts' own
        check, ``bad_field``): one bad task does not hide the others. A task
        deleted since it was listed has no row.
        """
        ids = [check_id(t, "task_id") for t in task_ids]
        by_shard: dict[int, builtins.list[int]] = {}
        for i, tid in enumerate(ids):
            by_shard.setdefault(Keys.shard_of(tid), []).append(i)
        chunks = [
            idx[j : j + self.SUMMARY_CHUNK] for idx in by_shard.values() for j in range(0, len(idx), self.SUMMARY_CHUNK)
        ]
        calls = [Call(S.SUMMARY, [self._task_keys(ids[i]).checkpoint for i in chunk], []) for chunk in chunks]
        if not calls:
            (reply,) = yield Pipe([("TIME",)])
            return _time_ms(reply), []
        replies = yield Batch(calls)
        now = int(replies[0][0])
        rows: dict[int, dict[str, Any]] = {}
        missing: builtins.list[str] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            for n, i in enumerate(chunk):
                row = _summary_row(ids[i], reply[1 + n * _SUMMARY_STRIDE : 1 + (n + 1) * _SUMMARY_STRIDE], now)
                if row is not None:
                    rows[i] = row
                else:
                    missing.append(ids[i])
        yield from self.prune(missing)
        return now, [rows[i] for i in sorted(rows)]

    #: Task ids per EXISTS pipeline of ``list`` (and per prune.lua call).
    LIST_CHECK_CHUNK = 1000

    def list(self) -> Op[list[str]]:
        """Every task id, from the per-shard indexes, paged (never KEYS or SCAN).

        An index entry whose checkpoint is gone (it expired: ``terminal_ttl_ms``)
        is left out and dropped from the indexes (``prune``): one pipelined
        ``EXISTS`` per id, by pages, so the cost stays that of the listing.
        """
        ids = yield from list_indexes([self.keys.shard_tasks(s) for s in range(SHARDS)])
        return (yield from self.live(ids))

    def live(self, ids: Sequence[str]) -> Op[builtins.list[str]]:
        """``ids`` (indexed task ids) whose checkpoint exists, in order; the others are pruned."""
        out: builtins.list[str] = []
        missing: builtins.list[str] = []
        step = self.LIST_CHECK_CHUNK
        for j in range(0, len(ids), step):
            page = ids[j : j + step]
            found = yield Pipe([("EXISTS", self._task_keys(tid).checkpoint) for tid in page])
            for tid, n in zip(page, found, strict=True):
                (out if int(n) else missing).append(tid)
        yield from self.prune(missing)
        return out

    def prune(self, missing: Sequence[str]) -> Op[int]:
        """Drop the index entries of tasks a reader found without a checkpoint (prune.lua, by shard)."""
        if not missing:
            return 0
        by_shard: dict[int, builtins.list[str]] = {}
        for tid in missing:
            by_shard.setdefault(Keys.shard_of(tid), []).append(tid)
        step = self.LIST_CHECK_CHUNK
        calls = [
            Call(S.PRUNE, [self.keys.shard_tasks(s), self.keys.shard_ready(s), self.keys.shard_parked(s),
                           *(self._task_keys(t).checkpoint for t in tids[j : j + step])], [])
            for s, tids in by_shard.items()
            for j in range(0, len(tids), step)
        ]  # fmt: skip
        replies = yield Batch(calls)
        return sum(int(r) for r in replies)
