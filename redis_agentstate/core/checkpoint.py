"""Everything the checkpoint stores do that is not I/O: checks, arguments, replies.

Each public operation is a generator (see ``wire``) that the sync and async
stores drive with their own client. Nothing here blocks or awaits.
``CheckpointCore`` composes one module per concern: ``core.checkpoint_base``
(state, checks, reply parsing), ``core.writes`` (the write identity and
the fenced writes), ``core.claim_next`` (scheduling), ``core.release`` (release,
requeue, parking), ``core.lifecycle`` (cancel, resume),
``core.listing`` (what operators read) and ``core.steps`` (durable
steps' results); the
single-script operations that need no more (load, claim, renew, delete, ...)
are here. They are mixins of one class, not helper objects, so a hot call
resolves its methods as one class would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import TaskCancelled
from ..models import Checkpoint
from ..wire import Call, Op
from ..wire import scripts as S
from ..wire.scripts import Reply
from .checkpoint_base import _CLAIMED, DEFAULT_MAX_PAYLOAD_BYTES, _s
from .claim_next import MAX_BLOCK_MS, ClaimNextFound, ClaimScheduling
from .history import HistoryCache
from .lifecycle import Lifecycle
from .listing import CheckpointListing
from .steps import DurableSteps
from .validate import MAX_CYCLE, check_id, check_int
from .writes import CheckpointWrites

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MAX_BLOCK_MS", "CheckpointCore", "ClaimNextFound", "HistoryCache"]

#: How long acknowledge_terminal keeps its tombstone, so a re-send still reports success.
ACK_REMEMBER_MS = 3_600_000


class CheckpointCore(CheckpointWrites, ClaimScheduling, Lifecycle, CheckpointListing, DurableSteps):
    """Validation, request building and reply parsing for one namespace."""

    #: The ``agentstate.store`` attribute of its operations' spans and metrics (telemetry).
    telemetry_store: ClassVar[str] = "checkpoint"

    def __init__(
        self,
        namespace: str,
        *,
        max_payload_bytes: int,
        history_cache: int,
        max_attempts: int | None = None,
        terminal_ttl_ms: int | None = None,
    ) -> None:
        super().__init__(
            namespace,
            max_payload_bytes=max_payload_bytes,
            history_cache=history_cache,
            max_attempts=max_attempts,
            terminal_ttl_ms=terminal_ttl_ms,
        )
        self._init_scheduling()

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
        args = [token, cycle_index, lease_ms, *have, self.max_attempts]
        reply = yield Call(S.CLAIM, self._wire_keys(tid).counted, [*args, "", 0])
        took = False
        for _ in range(3):
            if reply[0] != Reply.LIMITED:
                break
            # A limited task (the limits note in _common.lua): a place first, then the claim again.
            ckey = _s(reply[1])
            took = took or self._permit(tid, token) is None
            cap, full = yield from self._take_place(tid, token, ckey, lease_ms)
            if full is not None:
                raise full
            reply = yield Call(S.CLAIM, self._wire_keys(tid).counted, [*args, ckey, cap])
        code = reply[0]
        if code in _CLAIMED:
            return self._checkpoint(tid, keys, reply, 1, cached, claim=True)
        if took:
            yield from self._give_back(tid, token)  # not claimed: the place is not needed
        if code == Reply.REFUSED:
            return None
        self._claim_refused(tid, cycle_index, code, reply)
        raise AssertionError("unreachable")  # pragma: no cover

    def renew(self, task_id: str, *, token: str, expected_revision: int, lease_ms: int) -> Op[int | None]:
        """Returns the new ``lease_expires_at_ms`` (server clock), or None if not renewed."""
        expires, _ = yield from self.lease_renew(task_id, token=token, expected_revision=expected_revision,
                                                 lease_ms=lease_ms)  # fmt: skip
        return expires

    def lease_renew(
        self, task_id: str, *, token: str, expected_revision: int, lease_ms: int
    ) -> Op[tuple[int | None, TaskCancelled | None]]:
        """A lease keeper's renewal: ``(new lease_expires_at_ms, None)``, ``(None, None)`` if not
        renewed, or ``(None, TaskCancelled)`` if not renewed because the task was cancelled."""
        tid = check_id(task_id, "task_id")
        token, lease_ms = self._token(token), self._lease(lease_ms)
        args = [token, self._revision(expected_revision), lease_ms]
        ckey = self._permit(tid, token)
        reply: Sequence[Any] = (Reply.REFUSED,)
        for _ in range(3):
            permit: tuple[str, int | None] = ("", 0)
            if ckey is not None:
                # A limited lease: its place moves on first, so the lease never outlives it.
                cap, full = yield from self._take_place(tid, token, ckey, lease_ms)
                if full is not None:
                    reply = (Reply.REFUSED,)  # its place is gone and the key is full: the lease is lost
                    break
                permit = (ckey, cap)
            reply = yield Call(S.RENEW, self._wire_keys(tid).listed, [*args, *permit])
            if reply[0] != Reply.LIMITED:
                break
            ckey = _s(reply[1])
        if reply[0] == Reply.DONE:
            return int(reply[1]), None
        if self._permits:
            # Not renewed: the lease is over, and so is its place; unless the renewal was only stale.
            yield from self._refused_write(tid, token, reply, moved=ckey is not None)
        if reply[0] == Reply.TERMINAL:
            reason = _s(reply[2])
            return None, TaskCancelled(f"task {tid!r} was cancelled: {reason}", task_id=tid, reason=reason)
        return None, None

    def acknowledge_terminal(self, task_id: str, *, expected_revision: int) -> Op[bool]:
        tid, keys = self._task(task_id)
        expected = self._revision(expected_revision)
        # The identity of an acknowledgement is the task and the revision it deletes:
        # a re-send by anyone is recognised (the tombstone), a different revision is not.
        args = [f"ack:{expected}", expected, ACK_REMEMBER_MS]
        reply = yield Call(S.ACKNOWLEDGE_TERMINAL, keys.stepped(), args)
        if reply == Reply.DONE:
            self.history.drop(tid)
        return bool(reply == Reply.DONE)

    def delete(self, task_id: str) -> Op[None]:
        tid, keys = self._task(task_id)
        yield Call(S.DELETE, keys.stepped(), [])
        self.history.drop(tid)
