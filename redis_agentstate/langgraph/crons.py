"""``CronStore`` and ``AsyncCronStore``: the cron schedules of ``agentstate serve``, in Redis.

A cron is a JSON record (LangGraph's ``Cron`` less its ``next_run_date``) plus its next tick
(``due``, server ms) and the tick it last fired (``last``), in one hash; the namespace's due
index (a sorted set by due ms) is what a ticker reads to find the ticks to fire. All of a
namespace's crons share shard 00's slot (``keys.Keys.crons``), so one script sees a cron and
both indexes. The store does not parse schedules: the caller (``server/_crons.py``, with
croniter) computes each due and the record's times; the store keeps them and moves a cron from a
tick to the next with a compare-and-set (``lua/cron_advance.lua``), so that of any number of
tickers that fired one tick exactly one moves the cron on, and a ticker that crashed before
moving it leaves the tick due for the next one.

``CronCore`` is the I/O-free core (checks, requests, replies); the twins are its shells.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..clients import RedisClient
from ..core.replies import text as reply_text
from ..core.validate import check_id, check_int
from ..errors import CorruptState, InvalidArgument
from ..keys import Keys
from ..wire import DEFAULT_WAIT_TIMEOUT_MS, AsyncShell, Call, Command, Op, Pipe, RetryPolicy, StoreShell, SyncShell
from ..wire.scripts import Reply
from . import scripts

__all__ = ["AsyncCronStore", "Cron", "CronCore", "CronStore"]

#: A cron's JSON record may take this many bytes.
MAX_RECORD_BYTES = 1 << 20
_MAX_MS = 2**53


@dataclass(frozen=True)
class Cron:
    """One stored cron: its id, its JSON record, its next tick (server ms; None: none, disabled or
    ended) and the tick it last fired (None before the first)."""

    cron_id: str
    record: dict[str, Any]
    due_ms: int | None
    last_ms: int | None


def _opt_ms(v: Any) -> int | None:
    s = "" if v is None else reply_text(v)
    return int(s) if s else None


def _ms_arg(value: object, what: str) -> str:
    return str(check_int(value, what, 0, _MAX_MS))


class CronCore:
    """Validation, request building and reply parsing for one namespace's crons."""

    def __init__(self, namespace: str) -> None:
        self.keys = Keys.unresolved(namespace)

    def _keys(self, cron_id: object) -> tuple[str, list[str]]:
        cid = check_id(cron_id, "cron_id")
        return cid, list(self.keys.crons(cid))

    @staticmethod
    def _body(record: object) -> str:
        if not isinstance(record, Mapping):
            raise InvalidArgument(f"a cron's record must be a mapping, got {type(record).__name__}")
        try:
            body = json.dumps(dict(record), sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"a cron's record must be JSON: {exc}") from exc
        if len(body.encode()) > MAX_RECORD_BYTES:
            raise InvalidArgument(f"a cron's record is over {MAX_RECORD_BYTES} bytes")
        return body

    def _cron(self, cid: str, raw: Any, key: str) -> Cron | None:
        if not raw:
            return None
        pairs = raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2], strict=True)
        h = {reply_text(k): v for k, v in pairs}
        try:
            record = json.loads(reply_text(h["body"]))
            if not isinstance(record, dict):
                raise ValueError("not an object")
            return Cron(cid, record, _opt_ms(h.get("due")), _opt_ms(h.get("last")))
        except (KeyError, ValueError) as exc:
            raise CorruptState(f"cron {cid!r} ({key}) is unreadable: {exc}") from exc

    def now_ms(self) -> Op[int]:
        """Redis's clock, in ms (what every due is measured in)."""
        # A pipeline of one: the driver sends every plain read as one (with the seals of the shards it
        # reads; TIME reads none), and answers a pipeline's replies as a list.
        (secs, micros), *_ = yield Pipe([("TIME",)])
        return int(secs) * 1000 + int(micros) // 1000

    def create(self, cron_id: object, record: Mapping[str, Any], *, due_ms: int | None, created_ms: int) -> Op[bool]:
        cid, keys = self._keys(cron_id)
        body = self._body(record)
        due = "" if due_ms is None else _ms_arg(due_ms, "due_ms")
        reply = yield Call(scripts.CRON_PUT, keys, [cid, "create", body, due, _ms_arg(created_ms, "created_ms")])
        return bool(reply[0] != Reply.REFUSED)

    def update(self, cron_id: object, record: Mapping[str, Any], *, due_ms: int | str | None = "keep") -> Op[bool]:
        """False if there is no such cron. ``due_ms``: the next tick, None for none, ``"keep"``."""
        cid, keys = self._keys(cron_id)
        body = self._body(record)
        due = "keep" if due_ms == "keep" else "" if due_ms is None else _ms_arg(due_ms, "due_ms")
        reply = yield Call(scripts.CRON_PUT, keys, [cid, "update", body, due, "0"])
        return bool(reply[0] != Reply.REFUSED)

    def get(self, cron_id: object) -> Op[Cron | None]:
        cid, keys = self._keys(cron_id)
        raw = yield Command(["HGETALL", keys[0]])
        return self._cron(cid, raw, keys[0])

    def every(self) -> Op[list[Cron]]:
        """Every cron, oldest first."""
        index = self.keys.crons("")[2]
        ids = [reply_text(i) for i in (yield Command(["ZRANGE", index, 0, -1]))]
        if not ids:
            return []
        hashes = [self.keys.crons(i)[0] for i in ids]
        raws = yield Pipe([("HGETALL", h) for h in hashes])
        return [c for i, h, raw in zip(ids, hashes, raws, strict=True) if (c := self._cron(i, raw, h)) is not None]

    def due(self, now_ms: int, limit: int = 100) -> Op[list[tuple[str, int]]]:
        """``(cron id, due ms)`` of the crons due at ``now_ms`` (server ms), earliest first."""
        index = self.keys.crons("")[1]
        now = _ms_arg(now_ms, "now_ms")
        limit = check_int(limit, "limit", 1, 10_000)
        raw = yield Command(["ZRANGE", index, "-inf", now, "BYSCORE", "LIMIT", 0, limit, "WITHSCORES"])
        flat = list(raw)
        if flat and isinstance(flat[0], (list, tuple)):  # RESP3 / redis-py's pairs
            return [(reply_text(m), int(float(s))) for m, s in flat]
        return [(reply_text(m), int(float(s))) for m, s in zip(flat[::2], flat[1::2], strict=True)]

    def advance(self, cron_id: object, fired_ms: int, next_ms: int | None) -> Op[bool]:
        """Move the cron from tick ``fired_ms`` to ``next_ms`` (None: it ended). True if it moved
        from that tick (by this call, or another ticker before it), False if it is gone or another
        tick is due (rescheduled)."""
        cid, keys = self._keys(cron_id)
        nxt = "" if next_ms is None else _ms_arg(next_ms, "next_ms")
        reply = yield Call(scripts.CRON_ADVANCE, keys, [cid, _ms_arg(fired_ms, "fired_ms"), nxt])
        return bool(reply[0] != Reply.REFUSED)

    def delete(self, cron_id: object) -> Op[None]:
        cid, keys = self._keys(cron_id)
        yield Call(scripts.CRON_DELETE, keys, [cid])
        return None


class _Crons(StoreShell[CronCore]):
    def __init__(
        self,
        client: RedisClient,
        namespace: str = "agentstate",
        *,
        retry: RetryPolicy | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        shards: int | None = None,
    ) -> None:
        super().__init__(
            client, CronCore(namespace), scripts.CRON_SCRIPTS, retry, wait_replicas, wait_timeout_ms, shards
        )


class CronStore(_Crons, SyncShell[CronCore]):
    """Cron schedules on a ``redis.Redis`` / ``RedisCluster`` client (see the module's docstring)."""

    def now_ms(self) -> int:
        """Redis's clock, in ms."""
        return self._run(self._core.now_ms())

    def create(self, cron_id: str, record: Mapping[str, Any], *, due_ms: int | None, created_ms: int) -> bool:
        """A new cron; False if another with that id exists (True again for this very create re-sent)."""
        return self._run(self._core.create(cron_id, record, due_ms=due_ms, created_ms=created_ms))

    def update(self, cron_id: str, record: Mapping[str, Any], *, due_ms: int | str | None = "keep") -> bool:
        """Replace the cron's record (and its next tick unless ``"keep"``); False if there is no such cron."""
        return self._run(self._core.update(cron_id, record, due_ms=due_ms))

    def get(self, cron_id: str) -> Cron | None:
        return self._run(self._core.get(cron_id))

    def every(self) -> list[Cron]:
        """Every cron, oldest first."""
        return self._run(self._core.every())

    def due(self, now_ms: int, limit: int = 100) -> list[tuple[str, int]]:
        """``(cron id, due ms)`` of the crons due at ``now_ms``, earliest first."""
        return self._run(self._core.due(now_ms, limit))

    def advance(self, cron_id: str, fired_ms: int, next_ms: int | None) -> bool:
        """Move the cron from tick ``fired_ms`` to ``next_ms`` if no one did (see ``CronCore.advance``)."""
        return self._run(self._core.advance(cron_id, fired_ms, next_ms))

    def delete(self, cron_id: str) -> None:
        """Delete the cron (nothing if there is none)."""
        self._run(self._core.delete(cron_id))


class AsyncCronStore(_Crons, AsyncShell[CronCore]):
    """The asyncio twin of :class:`CronStore` (a ``redis.asyncio`` client)."""

    async def now_ms(self) -> int:
        return await self._run(self._core.now_ms())

    async def create(self, cron_id: str, record: Mapping[str, Any], *, due_ms: int | None, created_ms: int) -> bool:
        return await self._run(self._core.create(cron_id, record, due_ms=due_ms, created_ms=created_ms))

    async def update(self, cron_id: str, record: Mapping[str, Any], *, due_ms: int | str | None = "keep") -> bool:
        return await self._run(self._core.update(cron_id, record, due_ms=due_ms))

    async def get(self, cron_id: str) -> Cron | None:
        return await self._run(self._core.get(cron_id))

    async def every(self) -> list[Cron]:
        return await self._run(self._core.every())

    async def due(self, now_ms: int, limit: int = 100) -> list[tuple[str, int]]:
        return await self._run(self._core.due(now_ms, limit))

    async def advance(self, cron_id: str, fired_ms: int, next_ms: int | None) -> bool:
        return await self._run(self._core.advance(cron_id, fired_ms, next_ms))

    async def delete(self, cron_id: str) -> None:
        await self._run(self._core.delete(cron_id))
