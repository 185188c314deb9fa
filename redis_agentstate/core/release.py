"""Giving a claim up, and the parked tasks that leaves: release, requeue, list_parked.

A release with a reason records a failed attempt (``release.lua`` parks the
task when it was attempt ``max_attempts``); a parked task runs again after
``requeue``. Nothing here does I/O.
"""

from __future__ import annotations

import builtins

from ..errors import CorruptState, InvalidArgument, NotParked, TaskNotFound
from ..wire import Call, Op, list_indexes, new_nonce, restart, scripts
from ..wire.scripts import Reply
from .checkpoint_base import CheckpointState, check_lease, check_revision, check_token
from .limits import ConcurrencyLimits
from .replies import text
from .validate import check_id

__all__ = ["MAX_REASON_BYTES", "Releases", "failure_reason"]

#: The longest failure reason a release sends (release.lua keeps what it is sent).
MAX_REASON_BYTES = 1024


def failure_reason(reason: object) -> str:
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


class Releases:
    """release, requeue and the parked tasks' listing: a part of the checkpoint core."""

    def __init__(self, state: CheckpointState, limits: ConcurrencyLimits) -> None:
        self.state = state
        self.keys = state.keys
        self.limits = limits

    def release(
        self, task_id: str, *, token: str, expected_revision: int, after_ms: int, reason: str | None = None
    ) -> Op[str | None]:
        """Give the claimed cycle up (release.lua): ``"released"``, ``"parked"``, or None when not ours any more.

        With ``reason`` the attempt is recorded as failed (and parks the task if it was attempt
        ``max_attempts``); without, it is given back (a shutdown is no failure).
        """
        tid, token = check_id(task_id, "task_id"), check_token(token)
        args = [token, check_revision(expected_revision), check_lease(after_ms), failure_reason(reason)]
        reply = yield Call(scripts.RELEASE, self.state.wire_keys(tid).parked, [*args, self.state.max_attempts])
        if self.limits.permits:
            # The claim is given up: so is its limiter place. A stale release of a live lease keeps it.
            yield from self.limits.refused_write(tid, token, reply)
        code = reply[0]
        if code in (Reply.DONE, Reply.DONE_BEFORE):
            return "released"
        if code == Reply.PARKED:
            self.state.history.drop(tid)
            return "parked"
        return None

    def requeue(self, task_id: str) -> Op[None]:
        """Make a parked task runnable again at its cycle (requeue.lua), its attempts counted from 0.

        Raises TaskNotFound (no such task) or NotParked (nothing to do); nothing is written then.
        A re-send after a lost reply is recognised by its nonce and succeeds.
        """
        tid, keys = self.state.task(task_id)
        reply = yield Call(scripts.REQUEUE, keys.with_parked(), [new_nonce()])
        code = reply[0]
        if code in (Reply.DONE, Reply.DONE_BEFORE):
            return None
        if code == Reply.REFUSED:
            raise TaskNotFound(f"no task {tid!r} in namespace {self.keys.namespace!r}", task_id=tid)
        if code == Reply.NOT_PARKED:
            status = text(reply[1])
            raise NotParked(f"task {tid!r} is not parked (status {status}): nothing to requeue", task_id=tid,
                            status=status)  # fmt: skip
        raise CorruptState(f"unexpected requeue reply {list(reply[:2])!r} for task {tid!r}", task_id=tid)

    def list_parked(self) -> Op[builtins.list[str]]:
        """Every parked task id, from the per-shard parked indexes, paged (never KEYS or SCAN)."""
        return (yield from restart(lambda: list_indexes([self.keys.shard_parked(s) for s in range(self.keys.shards)])))
