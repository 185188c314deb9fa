"""Durable steps (``Lease.step``): the name check, the idempotency key, and step_load/step_record.

A step's result is stored in the task's ``steps`` hash (keys.py) under
``<cycle>\\0<name>``, read and written only by the lease that holds the cycle,
live on the server clock (``step_load.lua``, ``step_record.lua``). A commit,
finalize, acknowledgement or deletion of the task drops the hash
(``_common.lua``'s KEYS[10]), and the field carries the cycle, so no result is
read by another cycle. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..codec import decode, encode
from ..errors import InvalidArgument
from ..wire import Call, Op, scripts
from ..wire.scripts import Reply
from .checkpoint_base import CheckpointState, check_revision, check_token
from .validate import MAX_CYCLE, check_id, check_int

__all__ = ["MAX_STEP_NAME_BYTES", "DurableSteps", "check_step_name", "step_key"]

#: The longest step name, in UTF-8 bytes (it is part of a hash field and of the idempotency key's input).
MAX_STEP_NAME_BYTES = 256


def check_step_name(name: object) -> str:
    """``name`` if it can name a step: a non-empty str of at most MAX_STEP_NAME_BYTES of UTF-8, no NUL."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a step name must be a non-empty str, got {name!r:.80}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"step name {name!r:.80} is not valid UTF-8: {exc}") from exc
    if size > MAX_STEP_NAME_BYTES:
        raise InvalidArgument(f"step name is {size} bytes of UTF-8, over {MAX_STEP_NAME_BYTES}")
    if "\0" in name:
        # NUL separates the cycle from the name in the stored field.
        raise InvalidArgument(f"step name {name!r:.80} contains NUL")
    return name


def step_key(namespace: str, task_id: str, cycle_index: int, name: str) -> str:
    """The idempotency key of step ``name`` of ``cycle_index`` of a task: the same for every attempt.

    A digest (unambiguous whatever the ids contain, and short enough for any downstream API) of
    the namespace, the task, the cycle and the name; never of the token or the revision, which
    change with each attempt.
    """
    head = encode([namespace, task_id, int(cycle_index), name], what="step key")
    return "agentstate-step-" + hashlib.blake2b(head, digest_size=16).hexdigest()


class DurableSteps:
    """step_load and step_record: a durable step's result, fenced by the lease that holds the cycle
    (a part of the checkpoint core)."""

    def __init__(self, state: CheckpointState) -> None:
        self.state = state

    @staticmethod
    def _step_argv(token: str, expected_revision: int, cycle_index: int, name: str) -> list[Any]:
        return [
            check_token(token),
            check_revision(expected_revision),
            check_int(cycle_index, "cycle_index", 1, MAX_CYCLE),
            check_step_name(name),
        ]

    def step_load(
        self, task_id: str, *, token: str, expected_revision: int, cycle_index: int, name: str
    ) -> Op[tuple[bool, Any] | None]:
        """``(True, result)`` stored, ``(False, None)`` not stored; None: the lease is not current
        (another holder, a later revision, or lapsed on the server clock)."""
        tid = check_id(task_id, "task_id")
        keys = self.state.task_keys(tid)
        reply = yield Call(
            scripts.STEP_LOAD, keys.for_steps(), self._step_argv(token, expected_revision, cycle_index, name)
        )
        if reply[0] != Reply.DONE:
            return None
        if len(reply) < 2:
            return False, None
        return True, decode(reply[1], key=keys.steps, task_id=tid)

    def step_record(
        self, task_id: str, result: Any, *, token: str, expected_revision: int, cycle_index: int, name: str
    ) -> Op[tuple[bool, Any]]:
        """``(applied, result as it reads back)``; not applied: the lease is not current, nothing written.

        ``InvalidArgument`` before anything is sent when ``result`` does not encode or is over
        ``max_payload_bytes``.
        """
        tid = check_id(task_id, "task_id")
        keys = self.state.task_keys(tid)
        argv = self._step_argv(token, expected_revision, cycle_index, name)
        blob = encode(result, what=lambda: f"result of step {name!r}")
        if len(blob) > self.state.max_payload_bytes:
            raise InvalidArgument(
                f"result of step {name!r} is {len(blob)} bytes encoded, over max_payload_bytes="
                f"{self.state.max_payload_bytes} (nothing was recorded)",
                task_id=tid,
            )
        reply = yield Call(scripts.STEP_RECORD, keys.for_steps(), [*argv, blob])
        # Read back from the bytes stored, so a replay returns what the first run returned.
        return reply[0] == Reply.DONE, decode(blob, key=keys.steps, task_id=tid)
