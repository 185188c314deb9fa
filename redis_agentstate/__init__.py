"""Durable, fenced state for fleets of AI-agent workers on Redis."""

from __future__ import annotations

from .checkpoint import AsyncCheckpointStore, CheckpointStore
from .codec import FORMAT_VERSION
from .core.reshard import ReshardReport
from .errors import (
    AgentStateError,
    AlreadyClaimed,
    BackendError,
    BackendUnavailable,
    CheckpointTerminal,
    ClaimRejected,
    ConcurrencyLimited,
    ConfigConflict,
    CorruptState,
    CursorExpired,
    CycleConflict,
    InvalidArgument,
    LeaseLost,
    NotAMember,
    NotDue,
    NotParked,
    NotRunnable,
    NotWaiting,
    PoolNotOpen,
    ReplicationUnsafe,
    TaskCancelled,
    TaskNotFound,
    TaskParked,
    WriteNotReplicated,
)
from .kv import AsyncKeyValueStore, KeyValueStore
from .lease import AsyncLease, Lease, LeaseTiming
from .models import TERMINAL_STATUSES, AgentStatus, Checkpoint
from .pool_models import (
    Cursor,
    MessageReceipt,
    PoolConfig,
    PoolMember,
    PoolRecord,
    PoolRecordKind,
    PoolSnapshot,
    RunMessage,
    StoredMessage,
    StoredWake,
    WakeCondition,
    WakeRegistration,
)
from .pools import AsyncPoolStore, PoolStore
from .runner import AsyncCycle, AsyncRunner, Cycle, Runner, RunnerStats, StepResult, current_lease
from .spec import StoreSpec
from .wire import RetryPolicy

__version__ = "0.1.0"
"""The package version."""

__all__ = [
    "ReshardReport",
    "FORMAT_VERSION",
    "TERMINAL_STATUSES",
    "AgentStateError",
    "AgentStatus",
    "AlreadyClaimed",
    "AsyncCheckpointStore",
    "AsyncCycle",
    "AsyncKeyValueStore",
    "AsyncLease",
    "AsyncPoolStore",
    "AsyncRunner",
    "BackendError",
    "BackendUnavailable",
    "Checkpoint",
    "CheckpointStore",
    "CheckpointTerminal",
    "ClaimRejected",
    "ConfigConflict",
    "CorruptState",
    "Cursor",
    "CursorExpired",
    "Cycle",
    "CycleConflict",
    "InvalidArgument",
    "KeyValueStore",
    "Lease",
    "LeaseLost",
    "LeaseTiming",
    "MessageReceipt",
    "NotAMember",
    "NotDue",
    "ConcurrencyLimited",
    "NotParked",
    "NotRunnable",
    "NotWaiting",
    "PoolConfig",
    "PoolMember",
    "PoolNotOpen",
    "PoolRecord",
    "PoolRecordKind",
    "PoolSnapshot",
    "PoolStore",
    "ReplicationUnsafe",
    "RetryPolicy",
    "RunMessage",
    "Runner",
    "RunnerStats",
    "StepResult",
    "StoreSpec",
    "StoredMessage",
    "StoredWake",
    "TaskCancelled",
    "TaskNotFound",
    "TaskParked",
    "WakeCondition",
    "WakeRegistration",
    "WriteNotReplicated",
    "__version__",
    "current_lease",
]
