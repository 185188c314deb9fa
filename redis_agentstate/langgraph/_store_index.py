"""The LangGraph store's namespace index (``AgentStateStore``; ``_store_core.py`` is the rest).

A namespace's items live in the shard of its path (its labels joined by NUL), and so that a search or
a listing of a namespace prefix reads one shard, not all of them, each shard's index (``lgsns``)
lists every path whose own path, or one of whose proper prefixes' paths, falls in the shard: the
shard of ``("memories",)`` lists every ``("memories", user)``. The own shard lists a path in the
same script that writes its items (lgs_put.lua); the shards of its proper prefixes, which are other
slots on a Cluster, right after (lgs_index.lua), with the *generation* of the listing lgs_put gave
it (from the shard's epoch counter: a listing that begins later has a greater one). A namespace
that lgs_put empties is unlisted there with the generation of the listing that ended, so a late
unlisting never removes a listing that began since, and a late listing never lowers a later one: a
path with an item is always listed in every prefix's shard once the put that listed it returned.

A search of prefix P: one lgs_prefix call in P's shard returns the paths under P and the first page
of P's own items; each other path is then read in its own shard (lgs_search). A listing checks the
paths of other shards in their own (lgs_namespaces with paths: whether every item of one expired is
known there). A search of the root reads every shard's index, keeping each path from its own shard.
A reshard sends each listed path to the new shard of each of its prefixes the old shard held
(``core/reshard.py``, ``keys.STORE_PREFIX_INDEXES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.replies import text as reply_text
from ..errors import InvalidArgument
from ..keys import MAX_ID_BYTES, Keys, StoreKeys
from ..wire import Batch, Call, Op, member_id, restart, restartable
from .scripts import LGS_INDEX, LGS_NAMESPACES, LGS_PREFIX, LGS_SEARCH

__all__ = ["NS_PAGE", "PAGE", "SEP", "WINDOW", "StoreIndex"]

#: Items one lgs_search call scans; namespaces one list call scans.
PAGE = 500
NS_PAGE = 1000
#: Items one lgs_search call returns with their vectors (mode '1': a filtered ranking): fewer, since
#: each carries its vectors out of the script (6 KiB at 1536 dimensions) and a script stays short.
VECTOR_PAGE = 100
#: Namespaces whose pages go out in one round trip.
WINDOW = 32
#: Listings one lgs_index call makes or ends (a bigger batch is several calls).
INDEX_GROUPS = 200
#: Listings (path -> generation) a store remembers having made in its prefixes' shards.
LISTINGS = 65536
SEP = "\0"


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} {text!r:.80} is not valid UTF-8 text ({exc.reason})") from exc


def _path(namespace: tuple[str, ...]) -> str:
    path = SEP.join(namespace)
    if len(_utf8(path, "namespace")) > MAX_ID_BYTES:
        raise InvalidArgument(f"namespace {namespace!r:.80} is longer than {MAX_ID_BYTES} bytes")
    return path


def _page(mode: str) -> int:
    """Items an lgs_search (or lgs_prefix) call of ``mode`` scans."""
    return VECTOR_PAGE if mode == "1" else PAGE


def _range(prefix: tuple[str, ...]) -> tuple[str, str]:
    """The lex range of the paths of ``prefix`` and every namespace under it."""
    if not prefix:
        return "-", "+"
    path = SEP.join(prefix)
    # A path starts with ``path`` and then ends or goes on with NUL: exactly the paths below path + "\x01".
    return "[" + path, "(" + path + "\x01"


#: A page of a namespace's items as lgs_search returns them: (key, item, packed vectors), and the
#: insertion number to read on after ('' when the namespace is done).
_Page = tuple[list[tuple[str, bytes, bytes]], str]


def _entries(page: Sequence[Any], keys: StoreKeys, mode: str) -> _Page:
    """An lgs_search reply (or lgs_prefix's items part) as a ``_Page``."""
    body = page[1:]
    out: list[tuple[str, bytes, bytes]] = []
    if mode == "1":
        for j in range(0, len(body), 3):
            out.append((member_id(body[j], keys.order), bytes(body[j + 1]), bytes(body[j + 2])))
    else:
        for j in range(0, len(body), 2):
            out.append((member_id(body[j], keys.order), bytes(body[j + 1]), b""))
    return out, reply_text(page[0]) if page[0] else ""


class StoreIndex:
    """Reads of the namespace index and of namespaces' pages, and the listings in prefixes' shards."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        #: path -> the generation this store listed it with in its prefixes' shards.
        self._listing: dict[str, str] = {}

    @restartable
    def prefix_read(
        self, prefix: tuple[str, ...], mode: str, *, items: bool = True
    ) -> Op[tuple[list[str], dict[str, _Page]]]:
        """The paths under ``prefix`` (its shard's index lists them all) and the first page of the prefix's
        own items (``items=False``: none): one script, in the prefix's slot (and more pages of paths, if any)."""
        path = _path(prefix)
        keys = self.keys.store(path)
        start, stop = _range(prefix)
        reply = yield Call(LGS_PREFIX, keys.as_list(), [start, stop, NS_PAGE, _page(mode) if items else 0, mode])
        n = int(reply[1])
        paths = [member_id(p, keys.namespaces) for p in reply[2 : 2 + n]]
        more = reply[0]
        while more:
            after = "(" + member_id(more, keys.namespaces)
            page = yield Call(LGS_NAMESPACES, [keys.namespaces, keys.namespace_expiry], [after, stop, NS_PAGE, "0"])
            paths.extend(member_id(p, keys.namespaces) for p in page[1:])
            more = page[0]
        return paths, {path: _entries(reply[2 + n :], keys, mode)} if items else {}

    def read_window(
        self, window: list[str], mode: str, first: dict[str, _Page]
    ) -> Op[list[list[tuple[str, bytes, bytes]]]]:
        """Every live item of each namespace of ``window``, page by page, all namespaces in each round trip
        (from the page ``first`` holds of a namespace, if it holds one)."""
        out: list[list[tuple[str, bytes, bytes]]] = [[] for _ in window]
        after: dict[int, str] = {}
        for i, path in enumerate(window):
            if path in first:
                out[i] = list(first[path][0])
                if first[path][1]:
                    after[i] = first[path][1]
            else:
                after[i] = ""
        while after:
            order = list(after)
            keys = [self.keys.store(window[i]) for i in order]
            replies = yield Batch(
                [Call(LGS_SEARCH, k.as_list(), [after[i], _page(mode), mode]) for i, k in zip(order, keys, strict=True)]
            )
            after = {}
            for i, k, page in zip(order, keys, replies, strict=True):
                entries, more = _entries(page, k, mode)
                out[i].extend(entries)
                if more:
                    after[i] = more
        return out

    @restartable
    def listed(self, prefix: tuple[str, ...]) -> Op[list[str]]:
        """The live namespace paths under ``prefix``, sorted: its shard's index lists them all; those of
        other shards are checked in their own (whose index knows when every item of one expired)."""
        if not prefix:
            return (yield from self.paths("-", "+", everything=False))
        keys = self.keys.store(_path(prefix))
        index = [keys.namespaces, keys.namespace_expiry]
        start, stop = _range(prefix)
        found: list[str] = []
        while True:
            page = yield Call(LGS_NAMESPACES, index, [start, stop, NS_PAGE, "0"])
            found.extend(member_id(p, keys.namespaces) for p in page[1:])
            if not page[0]:
                break
            start = "(" + member_id(page[0], keys.namespaces)
        foreign: dict[str, tuple[StoreKeys, list[str]]] = {}
        for p in found:
            own = self.keys.store(p)
            if own.namespaces != keys.namespaces:
                foreign.setdefault(own.namespaces, (own, []))[1].append(p)
        if not foreign:
            return found
        calls = [
            Call(LGS_NAMESPACES, [own.namespaces, own.namespace_expiry], ["-", "+", 0, "0", *ps[i : i + NS_PAGE]])
            for own, ps in foreign.values()
            for i in range(0, len(ps), NS_PAGE)
        ]
        replies = yield Batch(calls)
        live = {member_id(p, str(call.keys[0])) for call, page in zip(calls, replies, strict=True) for p in page[1:]}
        return [p for p in found if p in live or self.keys.store(p).namespaces == keys.namespaces]

    @restartable
    def paths(self, start: str, stop: str, *, everything: bool) -> Op[list[str]]:
        """Every namespace path of the range, from every shard, sorted: pages of one bounded read per shard,
        each path from its own shard (the others list it as a prefix's)."""
        found: list[str] = []
        pending = {s: start for s in range(self.keys.shards)}
        flag = "1" if everything else "0"
        while pending:
            shards = list(pending)
            replies = yield Batch(
                [
                    Call(LGS_NAMESPACES, list(self.keys.store_index(s)), [pending[s], stop, NS_PAGE, flag])
                    for s in shards
                ]
            )
            pending = {}
            for shard, page in zip(shards, replies, strict=True):
                index = self.keys.store_index(shard)[0]
                paths = (member_id(p, index) for p in page[1:])
                found.extend(p for p in paths if self.keys.store(p).namespaces == index)
                if page[0]:
                    pending[shard] = "(" + member_id(page[0], index)
        found.sort()
        return found

    def relist(self, paths: list[str], replies: list[Any]) -> Op[None]:
        """List each path lgs_put listed (unlist each it emptied) in the shards of its proper prefixes
        (lgs_index.lua), where this store has not listed that generation yet."""
        changes: list[tuple[str, str, str]] = []
        for path, reply in zip(paths, replies, strict=True):
            listed, ended = reply_text(reply[2]), reply_text(reply[3])
            if ended:
                changes.append(("-", path, ended))
            if listed and self._listing.get(path) != listed:
                changes.append(("+", path, listed))
        if not changes:
            return None

        def send() -> Op[None]:
            by_shard: dict[str, tuple[StoreKeys, list[str]]] = {}
            for change in changes:
                for shard in self.ancestors(change[1]):
                    by_shard.setdefault(shard.namespaces, (shard, []))[1].extend(change)
            calls = [
                Call(LGS_INDEX, [k.namespaces, k.generations], args[i : i + 3 * INDEX_GROUPS])
                for k, args in by_shard.values()
                for i in range(0, len(args), 3 * INDEX_GROUPS)
            ]
            if calls:
                yield Batch(calls)
            return None

        yield from restart(send)
        if len(self._listing) > LISTINGS:
            self._listing.clear()
        for op, path, gen in changes:
            if op == "+":
                self._listing[path] = gen
            else:
                self._listing.pop(path, None)
        return None

    def ancestors(self, path: str) -> list[StoreKeys]:
        """The keys of the shards of ``path``'s proper prefixes, but its own shard's (lgs_put lists it there)."""
        labels = path.split(SEP)
        own = self.keys.store(path).namespaces
        out: dict[str, StoreKeys] = {}
        for k in range(1, len(labels)):
            keys = self.keys.store(SEP.join(labels[:k]))
            if keys.namespaces != own:
                out.setdefault(keys.namespaces, keys)
        return list(out.values())
