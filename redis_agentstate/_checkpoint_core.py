"""Everything the checkpoint stores do that is not I/O: checks, arguments, replies.

Each public operation is a generator (see ``_ops``) that the sync and async
stores drive with their own client. Nothing here blocks or awaits.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import scripts as S
from ._ops import Call, Op, Pipe, list_indexes, member_id, new_nonce
from ._validate import MAX_CYCLE, MAX_LEASE_MS, MAX_REVISION, MAX_STORED_REVISION, check_id, check_int
from .codec import decode, encode
from .errors import (
    AlreadyClaimed,
    CheckpointTerminal,
    CorruptState,
    CycleConflict,
    InvalidArgument,
    NotRunnable,
)
from .keys import SHARDS, Keys, TaskKeys
from .models import AgentStatus, Checkpoint

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "CheckpointCore"]

logger = logging.getLogger("redis_agentstate")

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 2**20
#: How long acknowledge_terminal remembers its nonce, so a re-send still reports success.
ACK_REMEMBER_MS = 3_600_000
_STATUSES = {s.value: s for s in AgentStatus}


class _History(NamedTuple):
    """What this client knows is stored: the first ``n_m``/``n_c`` entries of the lists, at ``epoch``."""

    epoch: bytes
    messages: list[Any]
    cycles: list[Any]
    n_m: int
    n_c: int

    def usable(self) -> bool:
        # Someone shortened a list we handed out: we can no longer vouch for it.
        return len(self.messages) >= self.n_m and len(self.cycles) >= self.n_c


class HistoryCache:
    """Decoded message and cycle histories by task, so reads fetch only new entries.

    The lists are shared, without copying, with the checkpoints a read returns
    and taken, without copying, from the checkpoints a commit stores: a cycle
    then costs what it appends, not what came before. Only the first
    ``n_m``/``n_c`` entries are ever trusted, so entries a caller appends but
    never commits are ignored; the library itself never mutates a cached list.
    The one rule for callers is the append-only contract of ``Checkpoint``.
    """

    def __init__(self, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self._entries: OrderedDict[str, _History] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, task_id: str) -> _History | None:
        if not self.max_tasks:
            return None
        with self._lock:
            entry = self._entries.get(task_id)
            if entry is not None:
                self._entries.move_to_end(task_id)
            return entry

    def put(
        self,
        task_id: str,
        epoch: bytes,
        messages: list[Any],
        cycles: list[Any],
        n_m: int | None = None,
        n_c: int | None = None,
    ) -> None:
        """``n_m``/``n_c``: how many leading entries Redis holds (default: all, measured now)."""
        if not self.max_tasks:
            return
        n_m = len(messages) if n_m is None else n_m
        n_c = len(cycles) if n_c is None else n_c
        with self._lock:
            self._entries[task_id] = _History(epoch, messages, cycles, n_m, n_c)
            self._entries.move_to_end(task_id)
            while len(self._entries) > self.max_tasks:
                self._entries.popitem(last=False)

    def drop(self, task_id: str) -> None:
        with self._lock:
            self._entries.pop(task_id, None)


def _extended(cached: list[Any], stored: int, new: list[Any]) -> list[Any]:
    """The cached list itself when it is exactly what is stored (no copy), else a new one."""
    if not new and len(cached) == stored:
        return cached
    return cached[:stored] + new


def _committed(known: list[Any], stored: int, written: list[Any]) -> list[Any]:
    """What Redis holds after appending ``written[stored:]`` to the ``stored`` entries we knew.

    The caller's list itself when it is the list we handed out (then its
    first entries are ours, by the append-only contract), else a new list, so
    a caller who rebuilt old entries never sees them as stored.
    """
    if written is known:
        return written
    return known[:stored] + written[stored:]


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _opt_int(raw: bytes) -> int | None:
    return int(raw) if raw else None


def _time_ms(reply: Any) -> int:
    """``TIME`` as parsed by redis-py (a pair of ints) or raw (two byte strings), in ms."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def _zset_head(reply: Any, key: str) -> tuple[str, float] | None:
    """``ZRANGE key 0 0 WITHSCORES``: RESP2 ``[member, score]`` or RESP3 ``[[member, score]]``."""
    if not reply:
        return None
    if isinstance(reply[0], (list, tuple)):
        member, score = reply[0]
    else:
        member, score = reply[0], reply[1]
    return member_id(member, key), float(score)


class CheckpointCore:
    """Validation, request building and reply parsing for one namespace."""

    def __init__(self, namespace: str, *, max_payload_bytes: int, history_cache: int) -> None:
        self.keys = Keys(namespace)
        # Key strings are rebuilt for every call otherwise; hot tasks are few.
        self._task_keys = functools.lru_cache(maxsize=4096)(self.keys.task)
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 1, 2**31)
        self.history = HistoryCache(check_int(history_cache, "history_cache", 0, 2**31))
        self._corrupt_logged: set[str] = set()

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
    def _revision(revision: object, what: str = "expected_revision") -> int:
        return check_int(revision, what, 0, MAX_REVISION)

    def validate(self, cp: object) -> Checkpoint:
        """Check every field of ``cp`` (types and ranges); return it unchanged."""
        if not isinstance(cp, Checkpoint):
            raise InvalidArgument(f"expected a Checkpoint, got {type(cp).__name__}")
        check_id(cp.task_id, "task_id")
        check_int(cp.cycle_index, "cycle_index", 0, MAX_CYCLE)
        if not isinstance(cp.status, str) or cp.status not in _STATUSES:
            raise InvalidArgument(f"status must be one of {sorted(_STATUSES)}, got {cp.status!r}")
        if not isinstance(cp.messages, list):
            raise InvalidArgument("messages must be a list")
        if not isinstance(cp.cycles, list):
            raise InvalidArgument("cycles must be a list")
        if not isinstance(cp.shared_state, dict):
            raise InvalidArgument("shared_state must be a dict")
        check_int(cp.revision, "revision", 0, MAX_STORED_REVISION)
        if cp.claim_token is not None:
            self._token(cp.claim_token)
        if cp.claimed_cycle is not None:
            check_int(cp.claimed_cycle, "claimed_cycle", 1, MAX_CYCLE)
        if cp.lease_expires_at_ms is not None:
            check_int(cp.lease_expires_at_ms, "lease_expires_at_ms", 0, MAX_REVISION)
        return cp

    # ---- request building -----------------------------------------------

    def _write_args(
        self,
        cp: Checkpoint,
        *,
        nonce: str,
        token: str,
        revision: int,
        claimed: str,
        lease: str,
        history: _History | None,
        replace: bool,
        upto: tuple[int, int] | None = None,
    ) -> list[Any]:
        """ARGV for create/save/commit/finalize (layout in ``_common.lua``).

        Sends only the history entries added since ``history`` (what this client
        knows is stored) unless ``history`` is None, in which case the full lists
        go and the script skips what it already holds.
        """
        tid = cp.task_id
        body = encode([cp.shared_state, cp.terminal_result, cp.budget_usage], what=f"checkpoint {tid!r} body")
        # A checkpoint shorter than our cached view goes whole: the script decides
        # (after fencing) whether that is a forbidden shrink.
        lim_m, lim_c = upto if upto is not None else (len(cp.messages), len(cp.cycles))
        if history is None or replace or lim_m < history.n_m or lim_c < history.n_c:
            base_m = base_c = -1
            epoch = b""
            new_m, new_c = cp.messages[:lim_m], cp.cycles[:lim_c]
        else:
            base_m, base_c = history.n_m, history.n_c
            epoch = history.epoch
            new_m, new_c = cp.messages[base_m:lim_m], cp.cycles[base_c:lim_c]
        blobs = [encode(m, what=f"message of task {tid!r}") for m in new_m]
        blobs += [encode(c, what=f"cycle record of task {tid!r}") for c in new_c]
        size = len(body) + sum(map(len, blobs))
        if size > self.max_payload_bytes:
            raise InvalidArgument(
                f"checkpoint {tid!r} write is {size} bytes, over max_payload_bytes={self.max_payload_bytes}"
            )
        status = AgentStatus(cp.status).value
        term = "0" if cp.terminal_result is None else "1"
        return [
            nonce, token, int(revision), int(cp.cycle_index), status, term, body,
            epoch, base_m, base_c, "1" if replace else "0", claimed, lease, len(new_m), *blobs,
        ]  # fmt: skip

    def _cached(self, task_id: str) -> tuple[_History | None, list[Any]]:
        h = self.history.get(task_id)
        if h is None or not h.usable():
            return None, [b"", 0, 0]
        return h, [h.epoch, h.n_m, h.n_c]

    # ---- reply parsing --------------------------------------------------

    def _checkpoint(
        self, task_id: str, keys: TaskKeys, reply: Sequence[Any], at: int, cached: _History | None
    ) -> Checkpoint:
        """Parse ``read_checkpoint``'s array starting at ``reply[at]``."""
        try:
            status_raw, cycle, rev, token, claimed, lease, term, body, epoch = reply[at : at + 9]
            n_m, n_c, from_m, from_c, k = (int(x) for x in reply[at + 9 : at + 14])
            blobs = reply[at + 14 :]
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
        new_m = [decode(b, key=keys.messages, task_id=task_id) for b in blobs[:k]]
        new_c = [decode(b, key=keys.cycles, task_id=task_id) for b in blobs[k:]]
        if not (from_m or from_c):
            messages, cycles = new_m, new_c
        else:
            # The script only skips entries when our cached epoch matched.
            if cached is None or cached.epoch != epoch:
                raise CorruptState(f"history reply of task {task_id!r} skips entries we never had", task_id=task_id)
            messages = _extended(cached.messages, from_m, new_m)
            cycles = _extended(cached.cycles, from_c, new_c)
        self.history.put(task_id, epoch, messages, cycles, n_m, n_c)
        cp.messages, cp.cycles = messages, cycles
        return cp

    # ---- operations -----------------------------------------------------

    def create(self, cp: Checkpoint) -> Op[bool]:
        return self._store(S.CREATE, cp)

    def save(self, cp: Checkpoint) -> Op[None]:
        yield from self._store(S.SAVE, cp)
        return None

    def _store(self, script: str, cp: Checkpoint) -> Op[bool]:
        self.validate(cp)
        keys = self._task_keys(cp.task_id)
        messages, cycles = list(cp.messages), list(cp.cycles)  # exactly what this write sends
        args = self._write_args(
            cp,
            nonce=new_nonce(),
            token=cp.claim_token or "",
            revision=cp.revision,
            claimed="" if cp.claimed_cycle is None else str(int(cp.claimed_cycle)),
            lease="" if cp.lease_expires_at_ms is None else str(int(cp.lease_expires_at_ms)),
            history=None,
            replace=True,
        )
        reply = yield Call(script, keys.as_list(), args)
        if reply[0] == 0:
            return False
        if reply[0] == 2:
            # A re-send: reply[1] is the epoch now, which may name a history written since.
            self.history.drop(cp.task_id)
            return True
        self.history.put(cp.task_id, reply[1], messages, cycles)
        return True

    def load(self, task_id: str) -> Op[Checkpoint | None]:
        tid, keys = self._task(task_id)
        cached, have = self._cached(tid)
        reply = yield Call(S.LOAD, keys.as_list(), have)
        if not reply:
            self.history.drop(tid)
            return None
        return self._checkpoint(tid, keys, reply, 0, cached)

    def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        tid, keys = self._task(task_id)
        cycle_index = check_int(cycle_index, "cycle_index", 1, MAX_CYCLE)
        token = self._token(token)
        lease_ms = self._lease(lease_ms)
        cached, have = self._cached(tid)
        reply = yield Call(S.CLAIM, keys.as_list(), [token, cycle_index, lease_ms, *have])
        code = reply[0]
        if code in (1, 2):
            return self._checkpoint(tid, keys, reply, 1, cached)
        if code == 0:
            return None
        detail = _s(reply[1])
        if code in (-3, -4) and not detail.isdigit():
            raise CorruptState(f"checkpoint of task {tid!r} holds a malformed number {detail!r}", task_id=tid)
        if code == -1:
            raise CheckpointTerminal(f"checkpoint for task {tid!r} is terminal (status {detail})", task_id=tid)
        if code == -2:
            raise NotRunnable(f"checkpoint for task {tid!r} is not running (status {detail})", task_id=tid)
        if code == -3:
            found = int(detail)
            raise CycleConflict(
                f"checkpoint cycle conflict for task {tid!r}: expected {cycle_index - 1}, found {found}",
                task_id=tid,
                expected=cycle_index - 1,
                found=found,
            )
        if code == -4:
            raise AlreadyClaimed(
                f"checkpoint cycle {cycle_index} for task {tid!r} is already claimed",
                task_id=tid,
                lease_expires_at_ms=int(detail),
            )
        raise CorruptState(f"unexpected claim reply {reply[:2]!r} for task {tid!r}", task_id=tid)

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
        found nothing due.
        """
        token = self._token(token)
        lease_ms = self._lease(lease_ms)
        heads = [("ZRANGE", self.keys.shard_ready(s), 0, 0, "WITHSCORES") for s in range(SHARDS)]
        for _round in range(self.CLAIM_NEXT_ROUNDS):
            replies = yield Pipe([("TIME",), *heads])
            now = _time_ms(replies[0])
            heads_read = (_zset_head(reply, cmd[1]) for cmd, reply in zip(heads, replies[1:], strict=True))
            due = [head for head in heads_read if head is not None and head[1] <= now]
            if not due:
                return None
            # Oldest first fleet-wide (FIFO across shards too); shuffle only the few oldest to spread a fleet.
            due.sort(key=lambda head: head[1])
            spread = due[: self.CLAIM_NEXT_SPREAD]
            random.shuffle(spread)
            due[: self.CLAIM_NEXT_SPREAD] = spread
            cp = yield from self._claim_due(due, now, token, lease_ms)
            if cp is not None:
                return cp
        return None

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
        for head, _score in due:
            tid: str | None = head
            for _ in range(self.CLAIM_NEXT_TRIES_PER_SHARD):
                if tid is None:
                    break
                keys = self._task_keys(tid)
                try:
                    cached, have = self._cached(tid)
                    reply = yield Call(S.CLAIM_NEXT, keys.as_list(), [token, lease_ms, *have])
                    code = reply[0]
                    if code in (1, 2):
                        return self._checkpoint(tid, keys, reply, 1, cached)
                    if code != 0:
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
        if corrupt is not None:
            raise corrupt
        return None

    def _skipped_corrupt(self, exc: CorruptState) -> None:
        # Once per task per store: claim_next meets the same corrupt head on every call.
        ident = exc.task_id or exc.key or str(exc)
        if ident in self._corrupt_logged or len(self._corrupt_logged) >= 1024:
            return
        self._corrupt_logged.add(ident)
        logger.warning("claim_next skips a corrupt task (fix or delete it; `agentstate list` shows it): %s", exc)

    def commit(self, cp: Checkpoint, *, token: str, expected_revision: int, replace_history: bool = False) -> Op[bool]:
        self.validate(cp)
        token = self._token(token)
        expected = self._revision(expected_revision)
        return self._fenced_write(S.COMMIT, cp, token, expected, replace_history)

    def finalize(self, cp: Checkpoint, *, expected_revision: int, replace_history: bool = False) -> Op[bool]:
        self.validate(cp)
        if cp.terminal_result is None:
            raise InvalidArgument("finalized checkpoint must include terminal_result", task_id=cp.task_id)
        expected = self._revision(expected_revision)
        return self._fenced_write(S.FINALIZE, cp, "", expected, replace_history)

    def _fenced_write(self, script: str, cp: Checkpoint, token: str, expected: int, replace: bool) -> Op[bool]:
        keys = self._task_keys(cp.task_id).as_list()
        nonce = new_nonce()
        n_m, n_c = len(cp.messages), len(cp.cycles)  # this write's extent, fixed before any I/O
        known = self.history.get(cp.task_id)
        if replace or known is None or not known.usable():
            known = None

        def args(h: _History | None) -> list[Any]:
            return self._write_args(
                cp,
                nonce=nonce,
                token=token,
                revision=expected,
                claimed="",
                lease="",
                history=h,
                replace=replace,
                upto=(n_m, n_c),
            )

        reply = yield Call(script, keys, args(known))
        if reply[0] == -5:
            # Our cached view of the history was stale: send it whole; the script skips what it holds.
            known = None
            reply = yield Call(script, keys, args(None))
        if reply[0] == -6:
            raise InvalidArgument(
                f"checkpoint {cp.task_id!r} has fewer messages or cycles than are stored; "
                "history is append-only (pass replace_history=True to rewrite it)",
                task_id=cp.task_id,
                revision=expected,
            )
        if reply[0] not in (1, 2):
            return False
        if reply[0] == 2:
            # A re-send: reply[1] is the epoch now, which may name a history rewritten since.
            self.history.drop(cp.task_id)
        elif replace:
            self.history.put(cp.task_id, reply[1], cp.messages[:n_m], cp.cycles[:n_c])
        elif known is not None and n_m >= known.n_m and n_c >= known.n_c:
            # Redis kept its own first n entries and appended ours after them.
            messages = _committed(known.messages, known.n_m, cp.messages)
            cycles = _committed(known.cycles, known.n_c, cp.cycles)
            self.history.put(cp.task_id, reply[1], messages, cycles, n_m, n_c)
        else:
            # Full lists went: the script kept what it held, which we have not seen.
            self.history.drop(cp.task_id)
        return True

    def renew(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> Op[int | None]:
        """Returns the new ``lease_expires_at_ms`` (server clock), or None if not renewed."""
        _, keys = self._task(task_id)
        args = [self._token(token), self._revision(expected_revision), self._lease(lease_ms)]
        reply = yield Call(S.RENEW, keys.as_list(), args)
        return int(reply[1]) if reply[0] == 1 else None

    def acknowledge_terminal(self, task_id: str, *, expected_revision: int) -> Op[bool]:
        tid, keys = self._task(task_id)
        args = [new_nonce(), self._revision(expected_revision), ACK_REMEMBER_MS]
        reply = yield Call(S.ACKNOWLEDGE_TERMINAL, keys.as_list(), args)
        if reply == 1:
            self.history.drop(tid)
        return bool(reply == 1)

    def delete(self, task_id: str) -> Op[None]:
        tid, keys = self._task(task_id)
        yield Call(S.DELETE, keys.as_list(), [])
        self.history.drop(tid)

    def list(self) -> Op[list[str]]:
        """Every task id, from the per-shard indexes, paged (never KEYS or SCAN)."""
        return (yield from list_indexes([self.keys.shard_tasks(s) for s in range(SHARDS)]))
