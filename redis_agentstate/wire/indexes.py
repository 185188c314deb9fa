"""Reading the per-shard indexes: every member, paged, and the ids they hold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .failures import corrupt_state
from .requests import Op, Pipe

__all__ = ["LIST_PAGE", "list_indexes", "member_id", "zset_entries"]


def member_id(member: Any, key: str) -> str:
    """An id read from index ``key``; every id the library stores is UTF-8, so anything else is corrupt."""
    if not isinstance(member, bytes):
        return str(member)
    try:
        return member.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise corrupt_state(key, [key], f"holds an id that is not UTF-8: {member!r:.80}") from exc


#: Members fetched per index and round trip by ``list_indexes``.
LIST_PAGE = 5000


def list_indexes(index_keys: Sequence[str]) -> Op[list[str]]:
    """Every member of the lex-ordered zsets ``index_keys``, sorted, paged (one pipeline per page)."""
    found: list[str] = []
    pending = {key: b"-" for key in index_keys}
    while pending:
        keys = list(pending)
        replies = yield Pipe([("ZRANGEBYLEX", key, pending[key], b"+", "LIMIT", 0, LIST_PAGE) for key in keys])
        pending = {}
        for key, page in zip(keys, replies, strict=True):
            found.extend(member_id(m, key) for m in page)
            if len(page) == LIST_PAGE:
                pending[key] = b"(" + page[-1]
    found.sort()
    return found


def zset_entries(reply: Any, key: str) -> list[tuple[str, float]]:
    """``ZRANGE key 0 k WITHSCORES``: RESP2 ``[m1, s1, m2, s2, ...]`` or RESP3 ``[[m1, s1], ...]``."""
    if not reply:
        return []
    if isinstance(reply[0], (list, tuple)):
        return [(member_id(m, key), float(sc)) for m, sc in reply]
    return [(member_id(reply[i], key), float(reply[i + 1])) for i in range(0, len(reply), 2)]
