"""Everything the checkpoint stores do that is not I/O: checks, arguments, replies.

Each public operation is a generator (see ``wire``) that the sync and async
stores drive with their own client. Nothing here blocks or awaits.
``CheckpointCore`` is composed, not inherited: it holds one state object
(``core.checkpoint_base.CheckpointState``: the namespace's keys, knobs and history
cache) and one part per concern, each given that state and called by name:

============== ============================ =============================================
part           module                       operations
============== ============================ =============================================
``limits``     ``core.limits``                  concurrency limits, the places leases hold
``writes``     ``core.writes``        create, save, commit, finalize, commit_and_claim
``scheduling`` ``core.claim_next``              claim_next and its candidates
``releases``   ``core.release``                 release, requeue, list_parked
``lifecycle``  ``core.lifecycle``               cancel, resume
``listing``    ``core.listing``      summaries, list, live, prune
``steps``      ``core.steps``                   step_load, step_record
============== ============================ =============================================

The operations a part owns are the part's own methods, bound on the core when
it is built (a call costs one lookup on the core, no frame of its own); the
single-script operations that need no more (load, claim, renew, delete, ...)
are here. So an operation's path is its part's module, the state's and, for a
limited task, the limits'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import TaskCancelled
from ..models import Checkpoint
from ..wire import Call, Op, scripts
from ..wire.scripts import Reply
from .checkpoint_base import (
    _CLAIMED,
    DEFAULT_MAX_PAYLOAD_BYTES,
    CheckpointState,
    check_lease,
    check_revision,
    check_token,
    raise_claim_refused,
    validate,
)
from .claim_next import MAX_BLOCK_MS, ClaimNextFound, ClaimScheduling
from .history import HistoryCache
from .lifecycle import Lifecycle
from .limits import ConcurrencyLimits
from .listing import CheckpointListing
from .release import Releases
from .replies import text
from .steps import DurableSteps
from .validate import MAX_CYCLE, check_id, check_int
from .writes import CheckpointWrites

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MAX_BLOCK_MS", "CheckpointCore", "ClaimNextFound", "HistoryCache"]

#: How long acknowledge_terminal keeps its tombstone, so a re-send still reports success.
ACK_REMEMBER_MS = 3_600_000


class CheckpointCore:
    """Validation, request building and reply parsing for one namespace: its state and its parts."""

    #: The ``agentstate.store`` attribute of its operations' spans and metrics (telemetry).
    telemetry_store: ClassVar[str] = "checkpoint"

    #: ``core.checkpoint_base.validate``: every field of a checkpoint checked.
    validate = staticmethod(validate)

    def __init__(
        self,
        namespace: str,
        *,
        max_payload_bytes: int,
        history_cache: int,
        max_attempts: int | None = None,
        terminal_ttl_ms: int | None = None,
    ) -> None:
        self.state = state = CheckpointState(
            namespace,
            max_payload_bytes=max_payload_bytes,
            history_cache=history_cache,
            max_attempts=max_attempts,
            terminal_ttl_ms=terminal_ttl_ms,
        )
        self.keys = state.keys
        self.history = state.history
        self.limits = limits = ConcurrencyLimits(state)
        self.writes = writes = CheckpointWrites(state, limits)
        self.scheduling = scheduling = ClaimScheduling(state, limits)
        self.releases = releases = Releases(state, limits)
        self.lifecycle = lifecycle = Lifecycle(state)
        self.listing = listing = CheckpointListing(state)
        self.steps = steps = DurableSteps(state)
        # The operations each part owns, as the shells call them on the core.
        self.set_concurrency_limit = limits.set_concurrency_limit
        self.concurrency_limits = limits.concurrency_limits
        self.create = writes.create
        self.save = writes.save
        self.commit = writes.commit
        self.finalize = writes.finalize
        self.commit_and_claim = writes.commit_and_claim
        self.claim_next = scheduling.claim_next
        self.claim_next_probe = scheduling.claim_next_probe
        self.check_block_ms = scheduling.check_block_ms
        self.announced = scheduling.announced
        self.release = releases.release
        self.requeue = releases.requeue
        self.list_parked = releases.list_parked
        self.cancel = lifecycle.cancel
        self.resume = lifecycle.resume
        self.summaries = listing.summaries
        self.list = listing.list
        self.live = listing.live
        self.prune = listing.prune
        self.step_load = steps.step_load
        self.step_record = steps.step_record

    @property
    def max_attempts(self) -> int:
        """Sent with every claim and release; 0 turns parking off."""
        return self.state.max_attempts

    @property
    def terminal_ttl_ms(self) -> int | None:
        """How long a task that became terminal through this store lives unacknowledged (None: for ever)."""
        return self.state.terminal_ttl_ms

    @property
    def claim_next_candidate_age_s(self) -> float:
        """How long claim_next tries the candidates of one peek before it peeks again (0: always peek)."""
        return self.scheduling.claim_next_candidate_age_s

    @claim_next_candidate_age_s.setter
    def claim_next_candidate_age_s(self, seconds: float) -> None:
        self.scheduling.claim_next_candidate_age_s = seconds

    def claim_args(self, token: object, lease_ms: object, block_ms: object) -> tuple[str, int, int | None]:
        """``claim_next``'s arguments checked, for a shell that blocks before it calls the core:
        the token, the lease and ``block_ms`` (None: do not block)."""
        block = None if block_ms is None else self.scheduling.check_block_ms(block_ms)
        return check_token(token), check_lease(lease_ms), block

    def load(self, task_id: str) -> Op[Checkpoint | None]:
        state = self.state
        tid, keys = state.task(task_id)
        cached, have = state.cached(tid)
        reply = yield Call(scripts.LOAD, keys.as_list(), have)
        if not reply:
            state.history.drop(tid)
            return None
        return state.checkpoint(tid, keys, reply, 0, cached, claim=False)

    def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Op[Checkpoint | None]:
        state, limits = self.state, self.limits
        tid, keys = state.task(task_id)
        cycle_index = check_int(cycle_index, "cycle_index", 1, MAX_CYCLE)
        token = check_token(token)
        lease_ms = check_lease(lease_ms)
        cached, have = state.cached(tid)
        args = [token, cycle_index, lease_ms, *have, state.max_attempts]
        reply = yield Call(scripts.CLAIM, state.wire_keys(tid).counted, [*args, "", 0])
        took = False
        for _ in range(3):
            if reply[0] != Reply.LIMITED:
                break
            # A limited task (the limits note in _common.lua): a place first, then the claim again.
            ckey = text(reply[1])
            took = took or limits.permit(tid, token) is None
            cap, full = yield from limits.take_place(tid, token, ckey, lease_ms)
            if full is not None:
                raise full
            reply = yield Call(scripts.CLAIM, state.wire_keys(tid).counted, [*args, ckey, cap])
        code = reply[0]
        if code in _CLAIMED:
            return state.checkpoint(tid, keys, reply, 1, cached, claim=True)
        if took:
            yield from limits.give_back(tid, token)  # not claimed: the place is not needed
        if code == Reply.REFUSED:
            return None
        raise_claim_refused(tid, cycle_index, code, reply)
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
        state, limits = self.state, self.limits
        tid = check_id(task_id, "task_id")
        token, lease_ms = check_token(token), check_lease(lease_ms)
        args = [token, check_revision(expected_revision), lease_ms]
        ckey = limits.permit(tid, token)
        reply: Sequence[Any] = (Reply.REFUSED,)
        for _ in range(3):
            permit: tuple[str, int | None] = ("", 0)
            if ckey is not None:
                # A limited lease: its place moves on first, so the lease never outlives it.
                cap, full = yield from limits.take_place(tid, token, ckey, lease_ms)
                if full is not None:
                    reply = (Reply.REFUSED,)  # its place is gone and the key is full: the lease is lost
                    break
                permit = (ckey, cap)
            reply = yield Call(scripts.RENEW, state.wire_keys(tid).listed, [*args, *permit])
            if reply[0] != Reply.LIMITED:
                break
            ckey = text(reply[1])
        if reply[0] == Reply.DONE:
            return int(reply[1]), None
        if limits.permits:
            # Not renewed: the lease is over, and so is its place; unless the renewal was only stale.
            yield from limits.refused_write(tid, token, reply, moved=ckey is not None)
        if reply[0] == Reply.TERMINAL:
            reason = text(reply[2])
            return None, TaskCancelled(f"task {tid!r} was cancelled: {reason}", task_id=tid, reason=reason)
        return None, None

    def acknowledge_terminal(self, task_id: str, *, expected_revision: int) -> Op[bool]:
        tid, keys = self.state.task(task_id)
        expected = check_revision(expected_revision)
        # The identity of an acknowledgement is the task and the revision it deletes:
        # a re-send by anyone is recognised (the tombstone), a different revision is not.
        args = [f"ack:{expected}", expected, ACK_REMEMBER_MS]
        reply = yield Call(scripts.ACKNOWLEDGE_TERMINAL, keys.stepped(), args)
        if reply == Reply.DONE:
            self.state.history.drop(tid)
        return bool(reply == Reply.DONE)

    def delete(self, task_id: str) -> Op[None]:
        tid, keys = self.state.task(task_id)
        yield Call(scripts.DELETE, keys.stepped(), [])
        self.state.history.drop(tid)
