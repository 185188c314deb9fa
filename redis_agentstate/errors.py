"""The exceptions raised by redis_agentstate.

Every exception the library raises on purpose derives from one root::

    AgentStateError
    ├── InvalidArgument          (also a ValueError) bad input, nothing was written
    ├── CorruptState             data under our keys that this library did not write
    ├── ClaimRejected            the checkpoint exists but cannot be claimed
    │   ├── CheckpointTerminal   it has a terminal result or a terminal status
    │   ├── NotRunnable          its status is not ``running``
    │   ├── CycleConflict        it is at another cycle than the claim expects
    │   └── AlreadyClaimed       another token holds a live lease on it
    ├── LeaseLost                a lease keeper could not keep its lease
    ├── ThreadBusy               another writer holds the LangGraph thread's lease
    ├── CursorExpired            retention trimmed the log past a watch cursor
    ├── PoolNotOpen              the pool was never opened
    ├── ConfigConflict           the pool is open with a different config
    ├── NotAMember               the run is not a member of the pool
    └── BackendError             Redis answered with an error we did not expect
        └── BackendUnavailable   Redis could not be reached (after bounded retries)

Errors from redis-py are translated where the library calls Redis and chained
(``raise ... from exc``), so the original is always in ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "AgentStateError",
    "AlreadyClaimed",
    "BackendError",
    "BackendUnavailable",
    "CheckpointTerminal",
    "ClaimRejected",
    "ConfigConflict",
    "CorruptState",
    "CursorExpired",
    "CycleConflict",
    "InvalidArgument",
    "LeaseLost",
    "NotAMember",
    "NotRunnable",
    "PoolNotOpen",
    "ThreadBusy",
]


class AgentStateError(Exception):
    """Root of every error redis_agentstate raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        key: str | None = None,
        revision: int | None = None,
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.key = key
        self.revision = revision


class InvalidArgument(AgentStateError, ValueError):
    """An argument is malformed; raised before anything is sent to Redis."""


class CorruptState(AgentStateError):
    """Data under the library's keys that it did not write: bytes that do not decode, a number or
    status it would not store, a key of another Redis type. ``key`` names the key and ``task_id``
    the task (a pool or key/value key is named in the message); nothing was written."""


class ClaimRejected(AgentStateError):
    """The checkpoint exists but this claim cannot be granted."""


class CheckpointTerminal(ClaimRejected):
    """The checkpoint has a terminal result or a terminal status."""


class NotRunnable(ClaimRejected):
    """The checkpoint's status is not ``running`` (pending, wait_user, ...)."""


class CycleConflict(ClaimRejected):
    """The checkpoint is at another cycle than the claim expects."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        expected: int | None = None,
        found: int | None = None,
        revision: int | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, revision=revision)
        self.expected = expected
        self.found = found


class AlreadyClaimed(ClaimRejected):
    """Another token holds a live lease on this cycle."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        lease_expires_at_ms: int | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id)
        self.lease_expires_at_ms = lease_expires_at_ms


class LeaseLost(AgentStateError):
    """A lease could not be kept; the work under it must stop."""


class ThreadBusy(AgentStateError):
    """Another writer holds the lease on this LangGraph thread (``task_id`` names the thread);
    nothing was written."""


class CursorExpired(AgentStateError):
    """Retention trimmed the record log past the cursor being watched."""


class PoolNotOpen(AgentStateError):
    """The agent pool was never opened."""


class ConfigConflict(AgentStateError):
    """The agent pool is already open with a different config."""


class NotAMember(AgentStateError):
    """The run is not a member of the agent pool."""


class BackendError(AgentStateError):
    """Redis answered with an error the library did not expect."""


class BackendUnavailable(BackendError):
    """Redis could not be reached, even after the bounded retries."""
