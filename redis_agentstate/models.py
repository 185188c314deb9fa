"""The checkpoint data model shared by the sync and async stores."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TERMINAL_STATUSES", "AgentStatus", "Checkpoint"]


class AgentStatus(str, enum.Enum):
    """Lifecycle status of an agent task; the values are the seed's strings."""

    PENDING = "pending"
    RUNNING = "running"
    WAIT_USER = "wait_user"
    COMPLETED = "completed"
    FAILED = "failed"
    MAX_CYCLES = "max_cycles"
    RECONCILIATION_REQUIRED = "reconciliation_required"
    #: Ended by ``store.cancel`` (not one of the seed's statuses): terminal, its reason in ``last_failure``.
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


TERMINAL_STATUSES = frozenset(
    {AgentStatus.COMPLETED, AgentStatus.FAILED, AgentStatus.MAX_CYCLES, AgentStatus.CANCELLED}
)
"""Statuses after which no cycle can ever be claimed again."""


@dataclass
class Checkpoint:
    """The durable state of one agent task, as the seed's ``Checkpoint``.

    ``messages`` and ``cycles`` are append-only histories: a commit sends only
    the entries added since the checkpoint was loaded or claimed. To rewrite
    history (e.g. compaction) pass ``replace_history=True`` to ``commit``.

    To keep a cycle's cost independent of the history's length, the store
    shares these lists with its cache, without copying: a claim may hand out
    the cached lists themselves, and a successful commit hands its lists over
    to the store (the next claim of the task may return that very list). Each
    read gets lists no other read holds, so appending to a ``load()`` result
    never reaches anyone's commit. Append to them; never edit, reorder or
    remove entries in place, do not pass a commit lists you also use
    elsewhere, and do not append to a list after committing it.

    The last three fields are read-only information the store keeps (writes
    ignore them): ``attempts``, the claims of the current cycle so far (the
    one a claim returns included; a commit resets it); ``parked``, True when
    the task was parked as a poison task after ``max_attempts`` attempts
    (``CheckpointStore(max_attempts=...)``; ``requeue`` clears it);
    ``last_failure``, the last recorded failure of the current cycle (a
    released attempt's reason, or a lapsed lease), or a cancelled task's reason
    (``store.cancel``), None when there is none; ``due_at_ms``, the server time
    before which the next cycle cannot be claimed (``delay_ms`` of the write
    that set it), or the deadline of a task waiting for a person, None when
    there is none.

    ``priority`` (from 0 to 9, 0 by default) is the task's, as the last create, save
    or commit wrote it: among the tasks due when a ``claim_next`` looks, a higher
    priority is served first, fleet-wide; within one priority, the longest-waiting
    first (see the Lifecycle guide for the exact guarantee).

    ``concurrency_key`` (None by default) puts the task under a per-key concurrency limit
    (``store.set_concurrency_limit(key, limit)``: a tenant, an API key): at most ``limit``
    live leases of tasks with that key at any moment, fleet-wide. As ``priority``, it is
    the task's as the last create, save or commit wrote it.
    """

    task_id: str
    cycle_index: int = 0
    status: AgentStatus = AgentStatus.RUNNING
    messages: list[Any] = field(default_factory=list)
    cycles: list[Any] = field(default_factory=list)
    shared_state: dict[Any, Any] = field(default_factory=dict)
    revision: int = 0
    claim_token: str | None = None
    claimed_cycle: int | None = None
    lease_expires_at_ms: int | None = None
    terminal_result: Any = None
    budget_usage: Any = None
    attempts: int = 0
    parked: bool = False
    last_failure: str | None = None
    due_at_ms: int | None = None
    priority: int = 0
    concurrency_key: str | None = None

    @property
    def is_terminal(self) -> bool:
        """True when no further cycle of this task can be claimed."""
        return self.terminal_result is not None or AgentStatus(self.status) in TERMINAL_STATUSES
