"""Thread maintenance: ``delete_thread``, ``delete_for_runs``, ``copy_thread`` and ``prune``.

Each is fenced by the thread's lease (a leased thread is the leaseholder's to change)
and checks what it reads before its script writes. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidArgument
from ..wire import Call, Command, Op, Pipe, corrupt_state, member_id, restart
from ..wire.scripts import Reply
from ._base import SaverBase, _ident
from ._records import SEP, _entry_member, _held_writes, _reads_and_body, _stored_id, _stored_member, _unpack_writes
from .scripts import LG_DELETE_RUNS, LG_DELETE_THREAD, LG_DUMP, LG_IMPORT, LG_PRUNE

__all__ = ["ThreadMaintenance"]


class ThreadMaintenance:
    """Deleting, copying and pruning whole threads (or a run's checkpoints in them): a part of ``SaverCore``."""

    def __init__(self, base: SaverBase) -> None:
        self.base = base

    def delete_thread(self, thread_id: str) -> Op[None]:
        tid = _ident(thread_id, "thread_id")
        reply = yield Call(LG_DELETE_THREAD, self.base.thread_keys(tid), [tid, self.base.token_of(tid)])
        self.base.fenced(reply, tid, "delete_thread")
        self._forget(tid)
        return None

    def _forget(self, tid: str) -> None:
        for key in [k for k in self.base.lists if k[0] == tid]:
            del self.base.lists[key]

    def delete_for_runs(self, run_ids: Sequence[str]) -> Op[None]:
        if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Iterable):
            raise InvalidArgument(f"run_ids must be a sequence of str, got {type(run_ids).__name__}")
        runs = sorted({_ident(r, "run_id") for r in run_ids})
        if not runs:
            return None
        threads = yield from restart(lambda: self._threads_of_runs(runs))
        for tid in sorted(threads):
            reply = yield Call(LG_DELETE_RUNS, self.base.thread_keys(tid), [tid, self.base.token_of(tid), *runs])
            self.base.fenced(reply, tid, "delete_for_runs")
            self._forget(tid)
        return None

    def _threads_of_runs(self, runs: list[str]) -> Op[set[str]]:
        commands = [
            ("ZRANGEBYLEX", self.base.keys.shard_runs(s), f"[{r}{SEP}".encode(), f"({r}\x01".encode())
            for r in runs
            for s in range(self.base.keys.shards)
        ]
        replies = yield Pipe(commands)
        threads: set[str] = set()
        for cmd, members in zip(commands, replies, strict=True):
            for m in members:
                # Every member is checked before the first thread is touched: nothing is written on corrupt data.
                threads.add(_stored_id(member_id(m, cmd[1]).partition(SEP)[2], cmd[1]))
        return threads

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> Op[None]:
        src = _ident(source_thread_id, "source_thread_id")
        dst = _ident(target_thread_id, "target_thread_id")
        if src == dst:
            raise InvalidArgument("copy_thread needs two different threads")
        dump = yield Call(LG_DUMP, self.base.thread_keys(src), [])
        records, blobs, writes, _runs, where = dump
        if not records:
            return None
        keys = self.base.thread_key_set(src)
        # The target's script indexes the records' members: checked here, before it writes, with the
        # framing of what it copies (a corrupt thread is reported, not duplicated).
        for member, stored, at in zip(records[::2], records[1::2], where, strict=True):
            key = keys.index if int(at) == 3 else keys.records
            _stored_member(member, keys.index)
            _reads_and_body(stored, key)
            _unpack_writes(_held_writes(stored, key)[0], key)
        for packed in writes[1::2]:
            _unpack_writes(packed, keys.writes)
        # The copy is a thread of its own: its checkpoints do not join the source's runs, so
        # delete_for_runs (a run's rollback) deletes in the thread the run wrote, never in its copies.
        args = [dst, self.base.token_of(dst), self.base.ttl_arg(), len(records), len(blobs), len(writes), 0]
        reply = yield Call(LG_IMPORT, self.base.thread_keys(dst), [*args, *records, *blobs, *writes])
        self.base.fenced(reply, dst, "copy_thread")
        return None

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> Op[list[str]]:
        """Prune each thread; returns the threads skipped because they are leased."""
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgument(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        if isinstance(thread_ids, (str, bytes)) or not isinstance(thread_ids, Iterable):
            raise InvalidArgument(f"thread_ids must be a sequence of str, got {type(thread_ids).__name__}")
        tids = [_ident(t, "thread_id") for t in thread_ids]
        skipped = []
        for tid in tids:
            keep = (yield from self._delta_ancestors(tid)) if strategy == "keep_latest" else []
            reply = yield Call(LG_PRUNE, self.base.thread_keys(tid), [tid, strategy, *keep])
            if int(reply[0]) == Reply.REFUSED:
                skipped.append(tid)
            else:
                self._forget(tid)
        return skipped

    def _delta_ancestors(self, tid: str) -> Op[list[str]]:
        """The ancestors keep_latest must keep so the kept checkpoints' DeltaChannels rebuild.

        A DeltaChannel stores a sentinel and is replayed from its ancestors' writes back to
        the last snapshot; the kept checkpoint's metadata counts the supersteps since then
        (``counters_since_delta_snapshot``), so that many parents are kept with their writes.
        """
        keys = self.base.thread_key_set(tid)
        entries = yield Command(["ZRANGE", keys.index, 0, -1])
        members = [_stored_member(_entry_member(e), keys.index) for e in entries]
        # The stored checkpoints the index entries carry; one of the earlier layout is in the hash.
        inline = {}
        for e in entries:
            member = _entry_member(e)
            if len(member) < len(e):
                inline[member] = e[len(member) + 1 :]

        def stored_of(member: str) -> Op[tuple[Any, str]]:
            raw = inline.get(member.encode())
            if raw is not None:
                return raw, keys.index
            return (yield Command(["HGET", keys.records, member])), keys.records

        latest: dict[str, str] = {}
        for ns, cid in members:  # lex order: the last member of a namespace is its newest checkpoint
            latest[ns] = cid
        keep: list[str] = []
        for ns, cid in latest.items():
            member = f"{ns}{SEP}{cid}"
            raw, where = yield from stored_of(member)
            if raw is None:
                continue
            parent, md = self._parent_and_metadata(raw, where)
            counters = md.get("counters_since_delta_snapshot") or {}
            if not isinstance(counters, Mapping):
                raise corrupt_state(where, [where], "holds malformed DeltaChannel counters")
            depth = 0
            for c in counters.values():
                if isinstance(c, (list, tuple)) and len(c) == 2:
                    if not isinstance(c[1], int) or isinstance(c[1], bool) or c[1] < 0:
                        raise corrupt_state(where, [where], "holds malformed DeltaChannel counters")
                    depth = max(depth, c[1])
            # A count read from Redis: no more ancestors than the thread has, and a parent chain that
            # comes back to a checkpoint it passed is corrupt (ids only grow), not a walk for ever.
            depth = min(depth, len(members))
            seen = {cid}
            while depth > 0 and parent:
                if parent in seen:
                    raise corrupt_state(where, [where], "holds a parent chain that loops")
                seen.add(parent)
                member = f"{ns}{SEP}{parent}"
                raw, where = yield from stored_of(member)
                if raw is None:
                    break
                keep.append(member)
                parent, _ = self._parent_and_metadata(raw, where)
                depth -= 1
        return keep

    def _parent_and_metadata(self, raw: bytes, key: str) -> tuple[str | None, Any]:
        parent, _, _, _, md_kind, md_data = self.base.unpack_record(raw, key)
        return parent, self.base.metadata_of(md_kind, md_data, key)
