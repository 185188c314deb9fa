"""``list()``: the listing's state (``Lister``), one page of matches per step, and its checks.

Nothing here does I/O: the savers drive ``Lister.next_page`` until it returns None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from ..errors import CorruptState, InvalidArgument
from ..wire import Call, Command, Op, Pipe, list_indexes, restartable
from ._base import _configurable, _ident, _ns, thread_of
from ._reads import READ_TRIES, SaverReads
from ._records import SEP, _entry_member, _foreign_id, _stored_id, _stored_member, _stored_text
from .scripts import LG_LIST

__all__ = ["LIST_BYTES", "LIST_PAGE", "Lister", "Listing"]

#: Checkpoints fetched per list round trip.
LIST_PAGE = 100
#: A whole-checkpoint page ends once its checkpoints carry this many bytes (after one at least):
#: no ``list()`` call makes Redis read, or send, more than about this much (plus one checkpoint).
LIST_BYTES = 1 << 20


class Listing:
    """Checking a ``list()`` call's arguments into a ``Lister`` (a part of ``SaverCore``, over its reads)."""

    def __init__(self, reads: SaverReads) -> None:
        self.reads = reads

    def lister(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Lister:
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise InvalidArgument(f"limit must be an int or None, got {limit!r}")
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidArgument(f"filter must be a dict or None, got {type(filter).__name__}")
        before_id = None
        if before is not None:
            b = _configurable(before).get("checkpoint_id")
            before_id = None if b is None else _ident(b, "before checkpoint_id")
        threads: list[str] | None = None
        ns: str | None = None
        cid: str | None = None
        if config is not None:
            conf = _configurable(config)
            threads = [thread_of(config)]
            if conf.get("checkpoint_ns") is not None:  # None or absent: every namespace, as InMemorySaver
                ns = _ns(conf.get("checkpoint_ns"))
            c = conf.get("checkpoint_id")
            cid = None if c is None else _ident(c, "checkpoint_id")
        return Lister(self.reads, threads, ns, cid, dict(filter or {}), before_id, limit)


class Lister:
    """The state of one ``list()``: threads to visit, the page cursor, the matches left.

    Without a namespace a thread is listed namespace by namespace, as ``InMemorySaver`` does:
    in the order they were first written to (their oldest checkpoint id: LangGraph's ids grow
    with time), newest checkpoint first within each.
    """

    def __init__(
        self,
        reads: SaverReads,
        threads: list[str] | None,
        ns: str | None,
        cid: str | None,
        filter: dict[str, Any],
        before: str | None,
        limit: int | None,
    ) -> None:
        self.reads = reads
        self.threads = threads
        self.ns = ns
        self.cid = cid
        self.filter = filter
        self.before = before
        self.left = limit
        self.thread_index = 0
        #: The namespaces of the current thread still to list (None: not read yet).
        self.spaces: list[str] | None = None
        self.hi: str | None = None
        #: The blob chains the last checkpoint of the previous page read (field -> chain): the next
        #: page of the same namespace is not sent them again (``lg_list.lua``, ARGV[7..]).
        self.carried: dict[Any, Any] = {}
        self.done = limit is not None and limit <= 0

    def _bounds(self, ns: str) -> tuple[str, str]:
        if self.cid is not None:
            # The member alone (a record of the earlier layout) or its entry '<member>\0<stored>'.
            member = f"{ns}{SEP}{self.cid}"
            return f"({member}\x01", f"[{member}"
        if self.before is not None:
            return f"({ns}{SEP}{self.before}", f"[{ns}{SEP}"
        return f"({ns}\x01", f"[{ns}{SEP}"

    def _namespaces(self, index: str) -> Op[list[str]]:
        """The namespaces of a thread's index, oldest first: one lex jump per namespace."""
        found: list[tuple[str, str]] = []
        lo = "-"
        while True:
            first = yield Command(["ZRANGEBYLEX", index, lo, "+", "LIMIT", 0, 1])
            if not first:
                break
            ns, cid = _stored_member(_entry_member(first[0]), index)
            found.append((cid, ns))
            lo = f"[{ns}\x01"  # past every member of ns (ids hold no byte below \x01)
        return [ns for _, ns in sorted(found)]

    def _next_thread(self) -> None:
        self.thread_index += 1
        self.spaces = None
        self.hi = None

    @restartable
    def next_page(self) -> Op[list[CheckpointTuple] | None]:
        """The next matches (possibly none), or None when the listing is over."""
        if self.done:
            return None
        if self.threads is None:
            shards = [self.reads.base.keys.shard_threads(s) for s in range(self.reads.base.keys.shards)]
            found = yield from list_indexes(shards)
            for t in found:
                if _foreign_id(t):  # named with the shard index that holds it
                    held = yield Pipe([("ZSCORE", key, t.encode()) for key in shards])
                    _stored_id(t, next((k for k, h in zip(shards, held, strict=True) if h is not None), shards[0]))
            self.threads = found
        if self.thread_index >= len(self.threads):
            self.done = True
            return None
        tid = self.threads[self.thread_index]
        keys = self.reads.base.thread_key_set(tid)
        if self.ns is not None:
            ns = self.ns
        else:
            if self.spaces is None:
                self.spaces = yield from self._namespaces(keys.index)
                if not self.spaces:
                    # No checkpoint at all: lg_list drops a thread that expired from the shard indexes.
                    yield Call(LG_LIST, keys.as_list(), ["-", "-", 1, "0", tid])
                    self._next_thread()
                    return []
            ns = self.spaces[0]
        hi, lo = self._bounds(ns)
        # Without a metadata filter every checkpoint of the page is read: whole, in the same round trip.
        whole = not self.filter
        page = self.page_size(whole)
        bounds = [self.hi or hi, lo, page]
        held = list(self.carried) if whole and self.hi else []
        for _ in range(READ_TRIES):
            reply = yield Call(LG_LIST, keys.as_list(),
                               [*bounds, "1" if whole else "0", tid, LIST_BYTES if whole else 0, *held])  # fmt: skip
            if not whole or (yield from self.reads.fetch_deferred(tid, reply[1])):
                break
        else:
            raise CorruptState(f"a shared value of thread {tid!r} vanished under {READ_TRIES} listings in a row")
        members, items = reply[0], reply[1]
        cut = whole and len(reply) > 2 and int(reply[2]) == 1
        if whole:
            self.carried = _share_chains(items, self.carried if held else {})
        if len(members) < page and not cut:
            self.hi = None
            if self.spaces:
                del self.spaces[0]
            if not self.spaces:
                self._next_thread()
        else:
            self.hi = "(" + _stored_text(members[-1], keys.index, "a checkpoint member")
        out: list[CheckpointTuple] = []
        where = reply[2] if not whole and len(reply) > 2 else [2] * len(members)
        for m, item, at in zip(members, items, where, strict=True):
            if item is None:
                continue  # deleted under the index (not by this library's scripts, which do both)
            ns, cid = _stored_member(m, keys.index)
            if self.cid is not None and cid != self.cid:
                continue
            if self.before is not None and cid >= self.before:
                continue
            if whole:
                got = item
            else:
                md = self.reads.base.metadata(item, keys.index if int(at) == 3 else keys.records)
                if not all(md.get(k) == v for k, v in self.filter.items()):
                    continue
                got = yield from self.reads.read_checkpoint(tid, ns, cid)
                if not got:
                    continue  # deleted between the page and this read
            out.append(self.reads.checkpoint_tuple(tid, got))
            if self.left is not None:
                self.left -= 1
                if self.left <= 0:
                    self.done = True
                    break
        return out

    def page_size(self, whole: bool) -> int:
        """Checkpoints per round trip: no more than the listing still needs when they are read whole."""
        if whole and self.left is not None:
            return max(1, min(LIST_PAGE, self.left))
        return LIST_PAGE


def _share_chains(items: list[Any], held: dict[Any, Any]) -> dict[Any, Any]:
    """Put back the chains a page sent once (``lg_list.lua``: 1 for "as earlier in this reply, or
    in ``held``", the chains of the previous page's last checkpoint); the chains of this page's
    last checkpoint, for the next page."""
    seen = dict(held)
    last: dict[Any, Any] = {}
    for item in items:
        if not item:
            continue
        blobs = item[2]
        last = {}
        for i in range(0, len(blobs), 2):
            chain = blobs[i + 1]
            if isinstance(chain, int) and not isinstance(chain, bool):
                if blobs[i] not in seen:
                    raise CorruptState(
                        f"a listed checkpoint refers to a value the page did not carry: {blobs[i]!r:.80}"
                    )
                blobs[i + 1] = chain = seen[blobs[i]]
            else:
                seen[blobs[i]] = chain
            last[blobs[i]] = chain
    return last or held
