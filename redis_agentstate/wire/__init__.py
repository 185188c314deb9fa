"""Sans-I/O plumbing: an operation is a generator that yields requests and returns a result.

Stores never hold logic of their own. A core method (e.g.
``CheckpointCore.commit``) is a generator: it validates, builds one request,
yields it, receives the raw reply, and either returns the parsed result or
yields a follow-up request. A request that fails is thrown into the op at
its ``yield`` as the library's error (``BackendError``, ``CorruptState``, ...),
so an op may recover from it; most let it propagate. ``run_sync`` and
``run_async`` are the only two places that talk to Redis, so the sync and async stores are three-line shells
and no rule can drift between them.

One module per part, each importing only those listed before it:

* ``requests``: the requests an op yields (``Call``, ``Pipe``, ``Batch``, ``Command``) and ``new_nonce``.
* ``retry``: ``RetryPolicy``, bounded re-sends of connection errors.
* ``failures``: the library's error for a Redis error, naming data we did not write (``corrupt_state``).
* ``indexes``: reading the per-shard indexes (``list_indexes``, ``member_id``).
* ``client_checks``: the client's flavor, ``decode_responses`` and read timeout (``block_slice_ms``).
* ``replicas``: ``wait_replicas`` (``ReplicaAck``).
* ``pipelines``: script batches and pipelined reads.
* ``layout``: the namespace's layout record (``resolve_layout``, ``refresh_layout``).
* ``relocation``: following the shards through a reshard (``Relocation``, ``ShardMoved``, ``restartable``).
* ``drivers``: ``run_sync`` and ``run_async``.
* ``shells``: ``StoreShell``, ``SyncShell``, ``AsyncShell`` and the telemetry hook (``TELEMETRY``).

This package re-exports what the rest of the library imports from it. To patch a
module-level name for a test (``LIST_PAGE``, ``_send_sync``), patch it in the module
that reads it (``wire.indexes``, ``wire.drivers``).
"""

from __future__ import annotations

from typing import Any

from . import shells
from .client_checks import block_slice_ms, check_client, effective_socket_timeout, is_asyncio_client
from .drivers import run_async, run_sync
from .failures import CORRUPT_REPLY, corrupt_state, request_keys
from .indexes import list_indexes, member_id
from .relocation import ShardMoved, restart, restartable
from .replicas import DEFAULT_WAIT_TIMEOUT_MS, ReplicaAck
from .requests import Batch, Call, Command, Op, Pipe, Request, T, new_nonce
from .retry import NO_RETRY, RetryPolicy
from .shells import AsyncShell, C, Observer, StoreShell, SyncShell, Watch

__all__ = [
    "CORRUPT_REPLY",
    "DEFAULT_WAIT_TIMEOUT_MS",
    "NO_RETRY",
    "TELEMETRY",
    "AsyncShell",
    "Batch",
    "C",
    "Call",
    "Command",
    "Observer",
    "Op",
    "Pipe",
    "ReplicaAck",
    "Request",
    "RetryPolicy",
    "ShardMoved",
    "StoreShell",
    "SyncShell",
    "T",
    "Watch",
    "block_slice_ms",
    "check_client",
    "corrupt_state",
    "effective_socket_timeout",
    "is_asyncio_client",
    "list_indexes",
    "member_id",
    "new_nonce",
    "request_keys",
    "restart",
    "restartable",
    "run_async",
    "run_sync",
]


def __getattr__(name: str) -> Any:
    # The installed observer lives in ``shells`` (its ``_run`` reads it as a global, the cheapest
    # read there is); ``wire.TELEMETRY`` reads it there. ``telemetry.instrument()`` sets it there.
    if name == "TELEMETRY":
        return shells.TELEMETRY
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
