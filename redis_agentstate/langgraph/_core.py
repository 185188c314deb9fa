"""Everything the LangGraph savers do that is not I/O: checks, requests, replies.

Layout (``keys.ThreadKeys``; every key of a thread is in its shard's slot):
a checkpoint is a record (parent id, serialized checkpoint without its channel
values, serialized metadata) under ``<ns>\\0<cid>``, plus the list of blob fields
it reads. Channel values are blobs under ``<ns>\\0<channel>\\0<version>``, written
only by the checkpoint that bumped the version (as langgraph-checkpoint-postgres
does), so a put costs what changed, not the whole state.

A list channel that grew since the version this saver last wrote is stored as
its new items only (a *tail* naming its base version); a read follows the chain
down to a full value and concatenates, so it rebuilds exactly the list LangGraph
wrote. The chain stays short without storing the list again and again: every
``TAIL_CHAIN``-th version is an *anchor*, whose tail reaches back to the previous
anchor (so a read walks at most ``TAIL_CHAIN - 1`` small tails, then anchors), and
only every ``TAIL_CHAIN``-th anchor is a full copy. Each item is thus stored about
twice, and a read follows at most ``2 * TAIL_CHAIN`` links.

The sync and async savers are shells over this class (``wire.run_sync`` /
``run_async``); nothing here touches Redis or a clock.

``SaverCore`` composes one module per concern: ``_base`` (state, caller-input
checks, fenced replies, decoding records), ``_records`` (the stored framing and
the list-tail bookkeeping), ``_put`` (put, put_writes), ``_reads`` (get_tuple),
``_lister`` (list), ``_maintenance`` (delete_thread, delete_for_runs, copy_thread,
prune) and ``_leases`` (the thread leases). They are mixins of one class, not
helper objects, so a hot call resolves its methods as one class would.
"""

from __future__ import annotations

from typing import ClassVar

from ._base import _ident, thread_of
from ._leases import ThreadLeases
from ._lister import Lister, Listing
from ._maintenance import ThreadMaintenance
from ._put import SaverWrites
from .scripts import LG_SCRIPTS

__all__ = ["LG_SCRIPTS", "Lister", "SaverCore", "_ident", "thread_of"]


class SaverCore(SaverWrites, Listing, ThreadMaintenance, ThreadLeases):
    """Validation, request building and reply parsing for both savers."""

    #: The ``agentstate.store`` attribute of its operations' spans and metrics (telemetry).
    telemetry_store: ClassVar[str] = "langgraph"
