"""``agentstate serve``'s crons: LangGraph's cron routes, and the ticker that fires their ticks.

A cron is kept in Redis (``langgraph.crons.AsyncCronStore``, namespace ``<namespace>.crons``) with
its next tick (``due``, Redis's clock). Its schedule is parsed by croniter (in the cron's
``timezone``, UTC by default). Every serve process runs a ticker: every ``poll_s`` it reads the
crons that are due and fires each tick, exactly once across any number of processes:

1. the tick's run is created with an id made from the cron and the tick (``tick_ids``: uuid5), and
   for a stateless cron on a thread whose id is made the same way: a second ticker firing the same
   tick, or this one again after a crash, gets the run that exists (``lg_run_create.lua`` answers a
   run id that exists with that run), never a second one;
2. then the cron is moved to its next tick with a compare-and-set on the tick fired
   (``cron_advance.lua``): a crash between 1 and 2 leaves the tick due, and the next poll (of any
   process) fires it again, which 1 makes harmless.

A tick its run cannot be made for (its thread was deleted, its strategy refused it on a busy
thread, its assistant is gone) is passed over, as LangGraph's scheduler does; an error reaching
Redis leaves the tick due. A stateless cron's thread is deleted when its run ends
(``on_run_completed="delete"``, the default; best effort: a server that stops first leaves it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import AgentStateError, InvalidArgument
from ..langgraph._runs_core import MULTITASK_STRATEGIES
from ..langgraph.crons import AsyncCronStore, Cron
from . import _shapes as shapes
from ._http import read_body
from ._shapes import json_response as _json

if TYPE_CHECKING:
    from ._served import App

__all__ = ["CronRoutes", "next_due_ms", "tick_ids"]

log = logging.getLogger("redis_agentstate.serve.crons")

#: The namespace of the ids a tick's run and (stateless) thread get.
TICK_NAMESPACE = uuid.UUID("6f0c3b1e-5a57-4c1b-9d2b-8c1e0a4f2d11")
#: Seconds between two looks at the due index.
POLL_S = 1.0
#: Ticks fired per look at most (the rest on the next).
BATCH = 100
_SORTS = ("cron_id", "assistant_id", "thread_id", "next_run_date", "end_time", "created_at", "updated_at")
#: The fields of a patch that change when the next tick is.
_RESCHEDULE = ("schedule", "timezone", "enabled", "end_time")
#: The payload's keys that are the cron's, not its runs'.
_CRON_ONLY = ("schedule", "end_time", "enabled", "timezone", "on_run_completed")


def tick_ids(cron_id: str, due_ms: int) -> tuple[str, str]:
    """``(run id, thread id)`` of a cron's tick (the thread: a stateless cron's new thread)."""
    run = uuid.uuid5(TICK_NAMESPACE, f"{cron_id}:{due_ms}")
    return str(run), str(uuid.uuid5(TICK_NAMESPACE, f"{cron_id}:{due_ms}:thread"))


def _zone(name: Any) -> dt.tzinfo:
    if name is None:
        return dt.timezone.utc
    if not isinstance(name, str) or not name:
        raise HTTPException(422, "timezone must be an IANA name, e.g. 'America/New_York'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise HTTPException(422, f"Invalid timezone: {name!r}") from None


def _check_schedule(schedule: Any) -> str:
    if not isinstance(schedule, str) or not croniter.is_valid(schedule):
        raise HTTPException(422, f"Invalid cron schedule: {schedule!r}. Use the standard cron format "
                            "(minute hour day_of_month month day_of_week), e.g. '*/5 * * * *'")  # fmt: skip
    return schedule


def _end_ms(end_time: Any) -> int | None:
    if end_time is None:
        return None
    if not isinstance(end_time, str):
        raise HTTPException(422, "end_time must be an ISO 8601 date-time")
    try:
        when = dt.datetime.fromisoformat(end_time)
    except ValueError:
        raise HTTPException(422, f"end_time is not an ISO 8601 date-time: {end_time!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


def next_due_ms(rec: Mapping[str, Any], after_ms: int) -> int | None:
    """The cron's first tick after ``after_ms`` (ms since the epoch), None if it has none: disabled,
    or past its ``end_time``."""
    if not rec.get("enabled", True):
        return None
    zone = _zone(rec.get("timezone"))
    start = dt.datetime.fromtimestamp(after_ms / 1000, tz=dt.timezone.utc).astimezone(zone)
    nxt = croniter(rec["schedule"], start).get_next(dt.datetime)
    due = int(nxt.timestamp() * 1000)
    end = _end_ms(rec.get("end_time"))
    return None if end is not None and due > end else due


def _shown_due(rec: Mapping[str, Any], due_ms: int | None) -> int | None:
    """The ``next_run_date`` a cron shows: its next tick; for a disabled one, the tick it would
    have (as LangGraph shows it), from its last update."""
    if due_ms is not None or rec.get("enabled", True):
        return due_ms
    updated = dt.datetime.fromisoformat(rec["updated_at"])
    return next_due_ms({**rec, "enabled": True}, int(updated.timestamp() * 1000))


class CronRoutes:
    """The cron routes of one app, and its ticker (``start`` / ``stop``)."""

    def __init__(self, app: App, client: Any, namespace: str, max_body: int) -> None:
        self.app, self.max_body = app, max_body
        self.store = AsyncCronStore(client, namespace=f"{namespace}.crons")
        #: Seconds between looks at the due index; a clock (ms) to use instead of Redis's (tests).
        self.poll_s = POLL_S
        self.frozen_ms: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._cleanups: set[asyncio.Task[None]] = set()

    # ---- the routes --------------------------------------------------------------------------------

    def out(self, cron: Cron) -> dict[str, Any]:
        return {**cron.record, "next_run_date": shapes.iso(_shown_due(cron.record, cron.due_ms))}

    async def _need(self, cron_id: str) -> Cron:
        cron = await self.store.get(cron_id)
        if cron is None:
            raise HTTPException(404, f"Cron '{cron_id}' not found")
        return cron

    async def _payload(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The run payload of a cron's ticks, checked as a run's would be (its assistant resolved)."""
        await self.app.run_options(body)  # interrupt_before/after, after_seconds, webhook: as a run checks them
        strategy = body.get("multitask_strategy")
        if strategy is not None and strategy not in MULTITASK_STRATEGIES:
            raise HTTPException(422, f"multitask_strategy must be one of {', '.join(MULTITASK_STRATEGIES)}")
        for name in ("metadata", "config", "context"):
            if body.get(name) is not None and not isinstance(body[name], dict):
                raise HTTPException(422, f"{name} must be an object")
        _, resolved = await self.app.assistants.resolve(body)
        # The body as given, as LangGraph keeps it (its schedule fields too: a tick leaves them out).
        return {**body, "assistant_id": resolved["assistant_id"]}

    async def create(self, request: Request) -> Response:
        tid = request.path_params.get("tid")
        body = await read_body(request, self.max_body)
        schedule = _check_schedule(body.get("schedule"))
        _zone(body.get("timezone"))
        _end_ms(body.get("end_time"))
        enabled = body.get("enabled", True)
        if not isinstance(enabled, bool):
            raise HTTPException(422, "enabled must be a boolean")
        done = body.get("on_run_completed")
        if tid is not None:
            if done is not None:
                raise HTTPException(422, "on_run_completed is for stateless crons only")
            await self.app.book.need_record(tid)
        elif done not in (None, "delete", "keep"):
            raise HTTPException(422, "on_run_completed must be 'delete' or 'keep'")
        payload = await self._payload(body)
        cron_id = str(uuid.uuid4())
        payload["config"] = dict(payload.get("config") or {})
        payload["config"]["configurable"] = {**(payload["config"].get("configurable") or {}), "cron_id": cron_id}
        now = await self.store.now_ms()
        stamp = shapes.iso(now)
        rec = {"cron_id": cron_id, "assistant_id": payload["assistant_id"], "thread_id": tid, "user_id": "",
               "on_run_completed": None if tid is not None else (done or "delete"), "end_time": body.get("end_time"),
               "schedule": schedule, "timezone": body.get("timezone"), "created_at": stamp, "updated_at": stamp,
               "payload": payload, "metadata": body.get("metadata") or {}, "enabled": enabled}  # fmt: skip
        due = next_due_ms(rec, now)
        await self.store.create(cron_id, rec, due_ms=due, created_ms=now)
        return _json({**rec, "next_run_date": shapes.iso(due)})

    async def get(self, request: Request) -> Response:
        return _json(self.out(await self._need(request.path_params["cid"])))

    async def patch(self, request: Request) -> Response:
        cron = await self._need(request.path_params["cid"])
        body = await read_body(request, self.max_body)
        if not body:
            raise HTTPException(400, "Request body cannot be empty")
        rec = dict(cron.record)
        if "schedule" in body:
            rec["schedule"] = _check_schedule(body["schedule"])
        if "timezone" in body:
            _zone(body["timezone"])
        if "end_time" in body:
            _end_ms(body["end_time"])
        if "enabled" in body and not isinstance(body["enabled"], bool):
            raise HTTPException(422, "enabled must be a boolean")
        if body.get("on_run_completed") not in (None, "delete", "keep"):
            raise HTTPException(422, "on_run_completed must be 'delete' or 'keep'")
        if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
            raise HTTPException(422, "metadata must be an object")
        for name in ("timezone", "end_time", "enabled"):
            if name in body:
                rec[name] = body[name]
        if body.get("on_run_completed") is not None and rec.get("thread_id") is None:
            rec["on_run_completed"] = body["on_run_completed"]
        if body.get("metadata") is not None:
            rec["metadata"] = {**(rec.get("metadata") or {}), **body["metadata"]}
        # The patch merged into the payload, shallowly, as LangGraph does (its assistant and cron id kept).
        payload = {**rec["payload"], **{k: v for k, v in body.items() if v is not None}}
        payload = await self._payload({**payload, "assistant_id": rec["payload"]["assistant_id"]})
        conf = dict(payload.get("config") or {})
        conf["configurable"] = {**(conf.get("configurable") or {}), "cron_id": cron.cron_id}
        rec["payload"] = {**payload, "config": conf}
        now = await self.store.now_ms()
        rec["updated_at"] = shapes.iso(now)
        due: int | str | None = "keep"
        if any(k in body for k in _RESCHEDULE):
            due = next_due_ms(rec, await self.now_ms())
        if not await self.store.update(cron.cron_id, rec, due_ms=due):
            raise HTTPException(404, f"Cron '{cron.cron_id}' not found")
        shown = cron.due_ms if due == "keep" else due
        return _json({**rec, "next_run_date": shapes.iso(_shown_due(rec, shown))})  # type: ignore[arg-type]

    async def delete(self, request: Request) -> Response:
        cron = await self._need(request.path_params["cid"])
        await self.store.delete(cron.cron_id)
        return Response(status_code=204)

    def _matches(self, cron: Cron, body: Mapping[str, Any]) -> bool:
        rec = cron.record
        aid = body.get("assistant_id")
        if aid is not None and aid != rec.get("assistant_id"):
            graph = self.app.graphs.get(aid) if isinstance(aid, str) else None
            if graph is None or graph.assistant_id != rec.get("assistant_id"):
                return False
        if body.get("thread_id") is not None and body["thread_id"] != rec.get("thread_id"):
            return False
        if body.get("enabled") is not None and body["enabled"] != rec.get("enabled"):
            return False
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise HTTPException(422, "metadata must be an object")
        have = rec.get("metadata") or {}
        return all(k in have and have[k] == v for k, v in meta.items())

    async def search(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        limit, offset = body.get("limit", 10), body.get("offset", 0)
        if not isinstance(limit, int) or not isinstance(offset, int) or limit < 1 or offset < 0:
            raise HTTPException(422, "limit must be an int >= 1 and offset an int >= 0")
        sort_by, order = body.get("sort_by") or "created_at", body.get("sort_order") or "desc"
        if sort_by not in _SORTS or order not in ("asc", "desc"):
            raise HTTPException(422, f"sort_by must be one of {', '.join(_SORTS)}; sort_order asc or desc")
        found = [self.out(c) for c in await self.store.every() if self._matches(c, body)]
        found.sort(key=lambda c: (c.get(sort_by) is None, str(c.get(sort_by) or "")), reverse=order == "desc")
        page = found[offset : offset + limit]
        select = body.get("select")
        if select:
            page = [{k: c.get(k) for k in select} for c in page]
        headers = {"X-Pagination-Total": str(len(found))}
        if len(found) > offset + len(page):
            headers["X-Pagination-Next"] = str(offset + len(page))
        return _json(page, headers=headers)

    async def count(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        return JSONResponse(sum(1 for c in await self.store.every() if self._matches(c, body)))

    # ---- the ticker ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._loop(), name="agentstate-serve-crons")

    async def stop(self) -> None:
        # A flag as well as the cancel: a cancel that lands in a Redis call may come out as that
        # call's error (BackendUnavailable), which the loop outlives.
        self._stopping = True
        tasks = [*([self._task] if self._task else []), *self._cleanups]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except Exception:  # Redis away: the ticks stay due, the next look fires them
                if self._stopping:
                    return
                log.exception("cron ticker: a look at the due crons failed")
            await asyncio.sleep(self.poll_s)

    async def now_ms(self) -> int:
        """The ticker's clock: Redis's (every server reads the same one), or ``frozen_ms`` if set."""
        return self.frozen_ms if self.frozen_ms is not None else await self.store.now_ms()

    async def tick(self) -> int:
        """Fire every due tick (once each, whoever else fires it); how many this call moved on."""
        now = await self.now_ms()
        moved = 0
        for cron_id, due in await self.store.due(now, BATCH):
            cron = await self.store.get(cron_id)
            if cron is None or cron.due_ms != due:
                continue  # deleted or moved since the index was read
            fired, drop = await self.fire(cron, due)
            if fired and await self.store.advance(cron_id, due, next_due_ms(cron.record, max(due, now))):
                moved += 1
                if drop is not None:
                    # Only once the tick is past: a tick fired again (after a crash) must find its
                    # thread, and its run, where it left them.
                    task = asyncio.create_task(self._drop_after(*drop))
                    self._cleanups.add(task)
                    task.add_done_callback(self._cleanups.discard)
        return moved

    async def fire(self, cron: Cron, due: int) -> tuple[bool, tuple[Any, str, str] | None]:
        """Create the tick's run (idempotent: its id is the tick's): False to leave the tick due; and
        what to delete when the run ends (a stateless cron's thread), if anything."""
        rec = cron.record
        run_id, thread_id = tick_ids(cron.cron_id, due)
        body = {k: v for k, v in rec["payload"].items() if k not in _CRON_ONLY}
        # The cron's metadata under the payload's, on each run (as LangGraph's scheduler does).
        body["metadata"] = {**(rec.get("metadata") or {}), **(body.get("metadata") or {})}
        if (end := _end_ms(rec.get("end_time"))) is not None and due > end:
            return True, None  # past its end: moved to no tick
        stateless = rec.get("thread_id") is None
        if stateless:
            body["if_not_exists"] = "create"
        else:
            body.setdefault("multitask_strategy", "enqueue")
        tid = thread_id if stateless else rec["thread_id"]
        drop_thread = stateless and rec.get("on_run_completed", "delete") == "delete"
        try:
            g, run, drop = await self.app._create(tid, body, run_id=run_id, drop_thread=drop_thread)
        except HTTPException as exc:
            log.warning("cron %s: the tick at %s made no run (%s: %s)", cron.cron_id, due, exc.status_code, exc.detail)
            return True, None
        except InvalidArgument as exc:
            log.warning("cron %s: the tick at %s made no run (%s)", cron.cron_id, due, exc)
            return True, None
        except AgentStateError:
            log.exception("cron %s: the tick at %s failed; it stays due", cron.cron_id, due)
            return False, None
        # A run with a webhook: its sender deletes the thread once it has read its values.
        return True, ((g, run.run_id, tid) if drop else None)

    async def _drop_after(self, g: Any, run_id: str, tid: str) -> None:
        with contextlib.suppress(Exception):
            await self.app._join(g, run_id)
            await self.app._drop_thread(g, tid)
