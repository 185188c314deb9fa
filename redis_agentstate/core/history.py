"""What a checkpoint client knows of the histories it read or wrote: a cache of decoded entries.

``HistoryCache`` holds, per task, the message and cycle lists a store last
read or wrote and how many of their entries are stored in Redis, so a read
fetches only the entries added since and a commit sends only its own. Used by
the checkpoint core (``core.checkpoint_base``, ``core.writes``); nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["History", "HistoryCache", "committed", "hashed"]


@dataclass(slots=True)
class History:
    """What this client knows is stored: the first ``n_m``/``n_c`` entries of the lists, at ``epoch``.

    ``revision`` is the checkpoint's revision when those counts were read or
    written; ``hash_m``/``hash_c`` are blake2b states over the stored blobs of
    exactly those entries (never updated in place: copied, then extended), so
    a write's identity digests its whole history at O(delta) cost.
    ``lent``: the lists are held by a reader who may still append to them, so
    the next read must not hand them out again.
    """

    epoch: bytes
    messages: list[Any]
    cycles: list[Any]
    n_m: int
    n_c: int
    revision: int
    hash_m: Any
    hash_c: Any
    lent: bool = False

    def usable(self) -> bool:
        # Someone shortened a list we handed out: we can no longer vouch for it.
        return len(self.messages) >= self.n_m and len(self.cycles) >= self.n_c

    def intact(self) -> bool:
        """Holds exactly the stored entries (nobody appended to the lists since)."""
        return len(self.messages) == self.n_m and len(self.cycles) == self.n_c


class HistoryCache:
    """Decoded message and cycle histories by task, so reads fetch only new entries.

    Each read hands out list objects that no other read holds: ``load`` always
    a new list (a copy of references, no decoding), a claim the cached lists
    themselves when nobody else holds them (the previous claimant committed
    and so handed them over), else a copy. A commit adopts, without copying,
    the lists of the claim it commits. A cycle then costs what it appends, not
    what came before, and one reader's uncommitted appends never reach
    another's commit. Only the first ``n_m``/``n_c`` entries are ever trusted,
    so entries a caller appends but never commits are ignored; the library
    itself never mutates a cached list. The one rule for callers is the
    append-only contract of ``Checkpoint``.
    """

    def __init__(self, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self._entries: OrderedDict[str, History] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, task_id: str) -> History | None:
        if not self.max_tasks:
            return None
        with self._lock:
            entry = self._entries.get(task_id)
            if entry is not None:
                self._entries.move_to_end(task_id)
            return entry

    def put(self, task_id: str, entry: History, *, lend_from: History | None = None) -> bool:
        """Store ``entry``; with ``lend_from``, only if that is still current and not lent (then marked lent).

        Returns whether ``entry`` was stored. The check and the store are one
        step, so two threads claiming through one store never both take the
        same lists.
        """
        if not self.max_tasks:
            return lend_from is None
        with self._lock:
            if lend_from is not None:
                if self._entries.get(task_id) is not lend_from or lend_from.lent:
                    return False
                lend_from.lent = True
            self._entries[task_id] = entry
            self._entries.move_to_end(task_id)
            while len(self._entries) > self.max_tasks:
                self._entries.popitem(last=False)
            return True

    def drop(self, task_id: str) -> None:
        with self._lock:
            self._entries.pop(task_id, None)


def hashed(blobs: Sequence[bytes], base: Any = None) -> Any:
    """A blake2b state over ``base``'s input followed by ``blobs`` (``base`` itself is never changed).

    The blobs are whole msgpack values, each self-delimiting, so their
    concatenation names the sequence unambiguously.
    """
    if base is not None and not blobs:
        return base
    h = hashlib.blake2b(digest_size=16) if base is None else base.copy()
    if blobs:
        h.update(b"".join(blobs))
    return h


def committed(known: list[Any], stored: int, written: list[Any]) -> list[Any]:
    """What Redis holds after appending ``written[stored:]`` to the ``stored`` entries we knew.

    The caller's list itself when it is the list we handed out (then its
    first entries are ours, by the append-only contract), else a new list, so
    a caller who rebuilt old entries never sees them as stored.
    """
    if written is known:
        return written
    return known[:stored] + written[stored:]
