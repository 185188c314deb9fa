"""Durable, fenced state for fleets of AI-agent workers on Redis."""

from __future__ import annotations

from ._ops import RetryPolicy
from .checkpoint import AsyncCheckpointStore, CheckpointStore
from .codec import FORMAT_VERSION
from .errors import (
    AgentStateError,
    AlreadyClaimed,
    BackendError,
    BackendUnavailable,
    CheckpointTerminal,
    ClaimRejected,
    ConfigConflict,
    CorruptState,
    CursorExpired,
    CycleConflict,
    InvalidArgument,
    LeaseLost,
    NotAMember,
    NotRunnable,
    PoolNotOpen,
)
from .kv import AsyncKeyValueStore, KeyValueStore
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
from .spec import StoreSpec

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "TERMINAL_STATUSES",
    "AgentStateError",
    "AgentStatus",
    "AlreadyClaimed",
    "AsyncCheckpointStore",
    "AsyncKeyValueStore",
    "AsyncPoolStore",
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
    "CycleConflict",
    "InvalidArgument",
    "KeyValueStore",
    "LeaseLost",
    "MessageReceipt",
    "NotAMember",
    "NotRunnable",
    "PoolConfig",
    "PoolMember",
    "PoolNotOpen",
    "PoolRecord",
    "PoolRecordKind",
    "PoolSnapshot",
    "PoolStore",
    "RetryPolicy",
    "RunMessage",
    "StoreSpec",
    "StoredMessage",
    "StoredWake",
    "WakeCondition",
    "WakeRegistration",
    "__version__",
]
