"""The lifecycle decisions made from outside a task's worker: cancel and resume.

``cancel`` ends a task whoever holds it (cancel.lua); ``resume`` runs a task that waits for a
person (status ``wait_user``) again, with their message appended (resume.lua). Both bump the
revision, so a holder's write is fenced out, and both are named by a per-call nonce, so a
re-send after a lost reply answers as the first did. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from ..codec import encode
from ..errors import CorruptState, InvalidArgument, NotWaiting, TaskNotFound
from ..wire import Call, Op, new_nonce, scripts
from ..wire.scripts import Reply
from .checkpoint_base import CheckpointState
from .release import failure_reason
from .replies import text

__all__ = ["Lifecycle"]


class Lifecycle:
    """cancel and resume, a part of the checkpoint core (a release's reason rules, ``failure_reason``,
    apply to a cancel's reason)."""

    def __init__(self, state: CheckpointState) -> None:
        self.state = state
        self.keys = state.keys

    def cancel(self, task_id: str, *, reason: str | None = None) -> Op[bool]:
        """End the task at once, status ``cancelled`` (cancel.lua): True, or False if it was terminal already.

        The revision is bumped and the claim cleared, so the holder's next write is fenced out; the
        reason (cut and escaped as a release's) is kept as ``last_failure``, "cancelled (no reason
        given)" when it is None or "" (an empty ``--reason`` is no reason). Raises TaskNotFound
        when there is no such task. A re-send after a lost reply is recognised by its nonce and
        answers True, as the first did.
        """
        tid, keys = self.state.task(task_id)
        # "" is no reason, as None: failure_reason would record it as a failure with no reason ("failed ...").
        why = "cancelled (no reason given)" if reason is None or reason == "" else failure_reason(reason)
        reply = yield Call(scripts.CANCEL, keys.stepped(), [new_nonce(), why, self.state.terminal_ttl_ms or 0])
        code = reply[0]
        if code in (Reply.DONE, Reply.DONE_BEFORE):
            self.state.history.drop(tid)
            return True
        if code == Reply.TERMINAL:
            return False
        if code == Reply.REFUSED:
            raise TaskNotFound(f"no task {tid!r} in namespace {self.keys.namespace!r}", task_id=tid)
        raise CorruptState(f"unexpected cancel reply {list(reply[:2])!r} for task {tid!r}", task_id=tid)

    def _message_blob(self, tid: str, message: Any) -> bytes:
        blob = encode(message, what=lambda: f"resume message of task {tid!r}")
        if len(blob) > self.state.max_payload_bytes:
            raise InvalidArgument(
                f"resume message of task {tid!r} is {len(blob)} bytes, over max_payload_bytes="
                f"{self.state.max_payload_bytes}",
                task_id=tid,
            )
        return blob

    def resume(self, task_id: str, *, message: Any = None) -> Op[bool]:
        """Run a task waiting for a person again (resume.lua): status ``running``, due now, ``message``
        (unless None) appended to its messages. True once resumed (a re-send after a lost reply answers
        True, as the first did). Raises TaskNotFound (no such task) or NotWaiting (its status is not
        ``wait_user``: running, terminal, ...); nothing is written then. A worker holding the task
        (handling the wait's deadline) is fenced out: the answer wins over the timeout."""
        tid, keys = self.state.task(task_id)
        args: list[Any] = (
            [new_nonce(), "0", b""] if message is None else [new_nonce(), "1", self._message_blob(tid, message)]
        )
        reply = yield Call(scripts.RESUME, keys.counted(), args)
        code = reply[0]
        if code in (Reply.DONE, Reply.DONE_BEFORE):
            # The messages grew and the revision moved on: the next read fetches them.
            self.state.history.drop(tid)
            return True
        if code == Reply.REFUSED:
            raise TaskNotFound(f"no task {tid!r} in namespace {self.keys.namespace!r}", task_id=tid)
        if code == Reply.NOT_WAITING:
            status = text(reply[1])
            raise NotWaiting(
                f"task {tid!r} is not waiting for a person (status {status}): nothing to resume",
                task_id=tid,
                status=status,
            )
        raise CorruptState(f"unexpected resume reply {list(reply[:2])!r} for task {tid!r}", task_id=tid)
