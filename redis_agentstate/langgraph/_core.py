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

``SaverCore`` is the saver's state (``_base.SaverBase``: keys, serializer, ttl,
lease tokens, list-tail cache; caller-input checks, fenced replies, decoding
records) and holds one part per concern, each given that state and called by
name: ``writes`` (``_put``: put, put_writes), ``reads`` (``_reads``: get_tuple),
``listing`` (``_lister``: list), ``maintenance`` (``_maintenance``: delete_thread,
delete_for_runs, copy_thread, prune) and ``leases`` (``_leases``: the thread
leases); ``_records`` holds the stored framing and the list-tail bookkeeping.
The operations a part owns are the part's own methods, bound on the core when it
is built (a call costs one lookup on the core). ``dataclasses.replace`` of a core
(a saver's copy) builds the parts anew over the copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._base import SaverBase, _ident, thread_of
from ._leases import ThreadLeases
from ._lister import Lister, Listing
from ._maintenance import ThreadMaintenance
from ._put import SaverWrites
from ._reads import SaverReads
from .scripts import LG_SCRIPTS

__all__ = ["LG_SCRIPTS", "Lister", "SaverCore", "_ident", "thread_of"]


@dataclass
class SaverCore(SaverBase):
    """Validation, request building and reply parsing for both savers: the state, and its parts."""

    #: The ``agentstate.store`` attribute of its operations' spans and metrics (telemetry).
    telemetry_store: ClassVar[str] = "langgraph"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.writes = writes = SaverWrites(self)
        self.reads = reads = SaverReads(self)
        self.listing = listing = Listing(reads)
        self.maintenance = maintenance = ThreadMaintenance(self)
        self.leases = leases = ThreadLeases(self)
        # The operations each part owns, as the savers call them on the core.
        self.put = writes.put
        self.put_writes = writes.put_writes
        self.get_tuple = reads.get_tuple
        self.lister = listing.lister
        self.delete_thread = maintenance.delete_thread
        self.delete_for_runs = maintenance.delete_for_runs
        self.copy_thread = maintenance.copy_thread
        self.prune = maintenance.prune
        self.acquire = leases.acquire
        self.renew = leases.renew
        self.revoke = leases.revoke
        self.forget = leases.forget
        self.release = leases.release

    @staticmethod
    def next_version(current: str | int | float | None) -> str:
        """``SaverWrites.next_version``: the channel version after ``current``."""
        return SaverWrites.next_version(current)
