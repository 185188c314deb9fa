"""The agent-pool data model: the seed's ``AgentPoolStore`` types as dataclasses.

Policies, metadata, payloads and filters are msgpack-serialisable Python
values (dicts, lists, str, bytes, numbers, None), stored opaque to Lua.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Cursor",
    "MessageReceipt",
    "PoolConfig",
    "PoolMember",
    "PoolRecord",
    "PoolRecordKind",
    "PoolSnapshot",
    "RecordPayload",
    "RunMessage",
    "StoredMessage",
    "StoredWake",
    "WakeCondition",
    "WakeRegistration",
]


@dataclass
class PoolConfig:
    """How a pool routes messages and wakes; fixed when the pool is first opened."""

    message_policy: dict[Any, Any] = field(default_factory=dict)
    wake_policy: dict[Any, Any] = field(default_factory=dict)
    policy_refs: list[Any] = field(default_factory=list)


@dataclass
class PoolMember:
    """A run that joined the pool, with the topics it listens to."""

    run_id: str
    topics: list[str] = field(default_factory=list)
    metadata: dict[Any, Any] = field(default_factory=dict)


@dataclass
class RunMessage:
    """A message sent into the pool; ``idempotency_key`` makes re-sends harmless."""

    message_id: str
    idempotency_key: str
    payload: Any = None
    topic: str | None = None
    sender: str | None = None


@dataclass
class MessageReceipt:
    """What the pool did with a message (``message_id`` must be the message's)."""

    message_id: str
    recipients: list[str] = field(default_factory=list)
    metadata: dict[Any, Any] = field(default_factory=dict)


@dataclass
class WakeCondition:
    """A condition that wakes ``run_id``; ``idempotency_key`` makes re-sends harmless."""

    condition_id: str
    idempotency_key: str
    run_id: str
    filter: dict[Any, Any] = field(default_factory=dict)


@dataclass
class WakeRegistration:
    """What the pool recorded for a wake condition (``condition_id`` must be the condition's)."""

    condition_id: str
    metadata: dict[Any, Any] = field(default_factory=dict)


@dataclass
class StoredWake:
    """A recorded wake condition with its compiled filter and registration."""

    condition: WakeCondition
    compiled_filter: Any
    registration: WakeRegistration


@dataclass
class StoredMessage:
    """A recorded message with its receipt."""

    message: RunMessage
    receipt: MessageReceipt


@dataclass(frozen=True, order=True)
class Cursor:
    """A position in a pool's record log: the first record is sequence 1.

    ``watch(pool_id, after=cursor)`` returns the records with a higher
    sequence; ``Cursor(0)`` is the position before the first record.
    """

    sequence: int


class PoolRecordKind(str, enum.Enum):
    """The kind of a pool record; the values are the seed's names."""

    POOL_OPENED = "pool_opened"
    POOL_CREATED = "pool_created"
    MEMBER_JOINED = "member_joined"
    MEMBER_LEFT = "member_left"
    RUN_MESSAGE = "run_message"
    WAKE = "wake"

    def __str__(self) -> str:
        return self.value


#: ``pool_opened`` -> PoolConfig, ``pool_created`` -> None, ``member_joined`` and
#: ``member_left`` -> PoolMember, ``run_message`` -> StoredMessage, ``wake`` -> StoredWake.
RecordPayload = PoolConfig | PoolMember | StoredMessage | StoredWake | None


@dataclass
class PoolRecord:
    """One entry of a pool's append-only record log."""

    pool_id: str
    cursor: Cursor
    kind: PoolRecordKind
    payload: RecordPayload = None


@dataclass
class PoolSnapshot:
    """The pool's state at one moment (read by one script).

    ``members``, ``messages`` and ``wakes`` are ordered by run id, message id
    and condition id (the seed's map order); ``topics`` are the members'
    topics, de-duplicated and sorted; ``cursor`` is the last record's.
    """

    pool_id: str
    created: bool = False
    topics: list[str] = field(default_factory=list)
    members: list[PoolMember] = field(default_factory=list)
    message_policy: dict[Any, Any] = field(default_factory=dict)
    wake_policy: dict[Any, Any] = field(default_factory=dict)
    policy_refs: list[Any] = field(default_factory=list)
    messages: list[StoredMessage] = field(default_factory=list)
    wakes: list[StoredWake] = field(default_factory=list)
    cursor: Cursor | None = None

    @property
    def config(self) -> PoolConfig:
        """The pool's config, as given to ``open``."""
        return PoolConfig(dict(self.message_policy), dict(self.wake_policy), list(self.policy_refs))
