"""The exceptions raised by redis_agentstate.

Every exception the library raises on purpose derives from one root::

    AgentStateError
    ├── InvalidArgument          (also a ValueError) bad input, nothing was written
    ├── CorruptState             data under our keys that this library did not write
    ├── ClaimRejected            the checkpoint exists but cannot be claimed
    │   ├── CheckpointTerminal   it has a terminal result or a terminal status
    │   ├── NotRunnable          its status is not ``running``
    │   ├── CycleConflict        it is at another cycle than the claim expects
    │   ├── AlreadyClaimed       another token holds a live lease on it
    │   ├── NotDue               its next cycle is delayed (``delay_ms``): not claimable before ``due_at_ms``
    │   ├── ConcurrencyLimited   its concurrency key has ``limit`` live leases already
    │   └── TaskParked           it is parked: too many attempts at its cycle failed
    ├── TaskNotFound             no such task (requeue)
    ├── NotParked                the task is not parked (requeue)
    ├── NotWaiting               the task is not waiting for a person (resume)
    ├── LeaseLost                a lease keeper could not keep its lease
    │   └── RunStopped           (also a GraphBubbleUp) a graph its worker stops: langgraph/errors.py
    ├── TaskCancelled            the task was cancelled (a cancelled lease's LeaseLost.__cause__)
    ├── ThreadBusy               another writer holds the LangGraph thread's lease  ┐ the LangGraph
    ├── RunRejected              a LangGraph run refused by its multitask check     │ integration's,
    ├── RunNotFound              (also a KeyError) no such LangGraph run            ┘ langgraph/errors.py
    ├── CursorExpired            retention trimmed the log past a watch cursor
    ├── PoolNotOpen              the pool was never opened
    ├── ConfigConflict           a pool open with another config; a namespace of another shard count
    ├── NotAMember               the run is not a member of the pool
    ├── ReplicationUnsafe        wait_replicas asks for more replicas than the primary has
    └── BackendError             Redis answered with an error we did not expect
        ├── BackendUnavailable   Redis could not be reached (after bounded retries)
        └── WriteNotReplicated   a write too few replicas acknowledged in time (wait_replicas)

An integration defines its errors in its own package, under this root (``ThreadBusy``,
``RunRejected`` and ``RunNotFound`` in ``redis_agentstate.langgraph.errors``); this module hands
them out by their old path too, importing the integration only when one is asked for.

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
    "ConcurrencyLimited",
    "ConfigConflict",
    "CorruptState",
    "CursorExpired",
    "CycleConflict",
    "InvalidArgument",
    "LeaseLost",
    "NotAMember",
    "NotDue",
    "NotWaiting",
    "NotParked",
    "NotRunnable",
    "PoolNotOpen",
    "TaskCancelled",
    "TaskNotFound",
    "TaskParked",
    "ReplicationUnsafe",
    "WriteNotReplicated",
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


class NotDue(ClaimRejected):
    """The next cycle is delayed (``delay_ms``): not claimable before ``due_at_ms`` (server ms)."""

    def __init__(self, message: str, *, task_id: str | None = None, due_at_ms: int = 0) -> None:
        super().__init__(message, task_id=task_id)
        self.due_at_ms = due_at_ms


class ConcurrencyLimited(ClaimRejected):
    """The task's ``concurrency_key`` has ``live`` live leases, ``limit`` allowed; nothing was written.

    ``retry_at_ms`` (server ms) is when the earliest of those leases runs out if nobody releases it.
    """

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        concurrency_key: str = "",
        limit: int = 0,
        live: int = 0,
        retry_at_ms: int | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id)
        self.concurrency_key = concurrency_key
        self.limit = limit
        self.live = live
        self.retry_at_ms = retry_at_ms


class TaskParked(ClaimRejected):
    """The task is parked (a poison task): ``attempts`` claims of its cycle ended without a commit;
    ``reason`` is the last failure. ``store.requeue(task_id)`` makes it runnable again."""

    def __init__(self, message: str, *, task_id: str | None = None, attempts: int = 0, reason: str = "") -> None:
        super().__init__(message, task_id=task_id)
        self.attempts = attempts
        self.reason = reason


class TaskNotFound(AgentStateError):
    """There is no such task; nothing was written."""


class NotParked(AgentStateError):
    """The task is not parked (``status`` is its status); nothing was written."""

    def __init__(self, message: str, *, task_id: str | None = None, status: str | None = None) -> None:
        super().__init__(message, task_id=task_id)
        self.status = status


class NotWaiting(AgentStateError):
    """The task is not waiting for a person (``status`` is its status): nothing to resume, nothing written."""

    def __init__(self, message: str, *, task_id: str | None = None, status: str | None = None) -> None:
        super().__init__(message, task_id=task_id)
        self.status = status


class LeaseLost(AgentStateError):
    """A lease could not be kept; the work under it must stop (``cancelled``: because of ``store.cancel``)."""

    @property
    def cancelled(self) -> bool:
        """True when the lease was lost because the task was cancelled (``__cause__`` is the TaskCancelled)."""
        return isinstance(self.__cause__, TaskCancelled)


class TaskCancelled(AgentStateError):
    """The task was cancelled (``store.cancel``); ``reason`` is the cancel's. The cause of its lease's LeaseLost."""

    def __init__(self, message: str, *, task_id: str | None = None, reason: str = "") -> None:
        super().__init__(message, task_id=task_id)
        self.reason = reason


class CursorExpired(AgentStateError):
    """Retention trimmed the record log past the cursor being watched."""


class PoolNotOpen(AgentStateError):
    """The agent pool was never opened."""


class ConfigConflict(AgentStateError):
    """The agent pool is already open with a different config, or the namespace has another shard count."""


class NotAMember(AgentStateError):
    """The run is not a member of the agent pool."""


class BackendError(AgentStateError):
    """Redis answered with an error the library did not expect."""


class BackendUnavailable(BackendError):
    """Redis could not be reached, even after the bounded retries."""


class WriteNotReplicated(BackendError):
    """A write the primary answered, but fewer than ``wait_replicas`` replicas acknowledged
    within ``wait_timeout_ms`` (``WAIT``; or the primary did not fsync it to its AOF in time,
    ``WAITAOF``, where the server has it and AOF is on).

    The write **may still have applied**: the primary ran it, and it may reach the replicas
    later, or be lost if the primary fails over first. Its reply is withheld, because a reply
    that a failover can take back is what this option exists to avoid. Re-send the same call
    (same token, same ``expected_revision``, same checkpoint) once replicas are back: every
    write is recognised by its write identity, so a re-send of a write that did apply answers
    as if it were the first: ``commit``/``finalize`` return True, ``claim`` with the same token
    returns the same claim (same revision and lease), ``acknowledge_terminal`` True, a pool
    message or wake with an idempotency key its first receipt, ``open`` with the same config,
    ``join`` and ``leave`` their result; key/value writes and ``delete`` are idempotent. Only
    ``create`` is first-wins: its re-send returns False (load and compare). If the write was
    lost in a failover, the re-send applies it now (or is refused like any fenced write if
    someone else moved the task on meanwhile).

    ``acknowledged`` is how many replicas did acknowledge (the lowest over the nodes the call
    wrote to), ``required`` the store's ``wait_replicas``.
    """

    def __init__(
        self, message: str, *, acknowledged: int, required: int, task_id: str | None = None, key: str | None = None
    ) -> None:
        super().__init__(message, task_id=task_id, key=key)
        self.acknowledged = acknowledged
        self.required = required


class ReplicationUnsafe(AgentStateError):
    """A store was given ``wait_replicas=n`` but its server cannot give n acknowledgements:
    the primary has fewer than n replicas online, the server is a replica, or the client has no
    ``WAIT`` (fakeredis). Raised by the store's first write, before anything is written;
    every write would otherwise time out."""


#: Errors an integration defines, still reachable here by name: name -> the module defining it.
_ELSEWHERE = dict.fromkeys(("ThreadBusy", "RunRejected", "RunNotFound"), "redis_agentstate.langgraph.errors")


def __getattr__(name: str) -> type[AgentStateError]:
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name]), name)  # type: ignore[no-any-return]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
