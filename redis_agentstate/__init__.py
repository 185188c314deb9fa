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
from .models import TERMINAL_STATUSES, AgentStatus, Checkpoint

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "TERMINAL_STATUSES",
    "AgentStateError",
    "AgentStatus",
    "AlreadyClaimed",
    "AsyncCheckpointStore",
    "BackendError",
    "BackendUnavailable",
    "Checkpoint",
    "CheckpointStore",
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
    "RetryPolicy",
    "__version__",
]
