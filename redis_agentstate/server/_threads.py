"""The thread routes of ``agentstate serve``: threads (create, get, patch, delete, search, count),
their state (read, at a checkpoint, update) and history, over the app's thread records
(``ThreadBook``) and each graph's saver."""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..langgraph.errors import RunNotFound, ThreadBusy
from . import _shapes as shapes
from ._http import page_of, read_body
from ._shapes import json_response as _json

if TYPE_CHECKING:
    from ._served import ServedGraph, ThreadBook

__all__ = ["SEARCH_SCAN", "ThreadRoutes"]

_THREAD_ID = re.compile(r"[^/?#\x00-\x1f\x7f]{1,256}")
#: Threads a search examines past its ``offset`` at most (a search with filters on a larger namespace
#: sees its first threads in id order only, and sorts those).
SEARCH_SCAN = 10_000
#: A search's ``sort_by`` and the record field it sorts on; LangGraph's default is ``updated_at``,
#: newest first (a thread list shows the threads last used on top).
_SORTS = {"thread_id": "thread_id", "created_at": "created_ms", "updated_at": "updated_ms"}


class ThreadRoutes:
    """The thread and thread-state routes (``_app.create_app`` wires them)."""

    def __init__(self, book: ThreadBook, graphs: Mapping[str, ServedGraph], max_body: int, lease_ms: int) -> None:
        self.book, self.graphs, self.max_body, self.lease_ms = book, graphs, max_body, lease_ms

    # ---- threads ---------------------------------------------------------------------------------

    async def thread_create(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        tid = body.get("thread_id") or str(uuid.uuid4())
        if not isinstance(tid, str) or not _THREAD_ID.fullmatch(tid):
            # A "/" (or "?", "#") would make the thread's own routes unreachable: clients put the id in
            # the path as it is.
            raise HTTPException(422, "thread_id must be a string of 1-256 characters without / ? # or control ones")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise HTTPException(422, "metadata must be an object")
        rec = await self.book.record(tid)
        if rec is not None:
            if body.get("if_exists") == "do_nothing":
                return JSONResponse(await self.book.out(rec))
            raise HTTPException(409, f"thread {tid!r} exists")
        now = int(time.time() * 1000)
        rec = {"thread_id": tid, "created_ms": now, "metadata": meta}
        await self.book.save(rec)
        return JSONResponse(shapes.thread_json(rec, "idle"))

    async def thread_get(self, request: Request) -> Response:
        rec = await self.book.need_record(request.path_params["tid"])
        return _json(await self.book.out(rec))

    async def thread_patch(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        rec = await self.book.need_record(request.path_params["tid"])
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise HTTPException(422, "metadata must be an object")
        if "graph_id" in meta and meta["graph_id"] != (rec.get("metadata") or {}).get("graph_id"):
            raise HTTPException(422, "a thread's graph_id is set by its first run")
        rec["metadata"] = {**(rec.get("metadata") or {}), **meta}
        await self.book.save(rec)
        return _json(await self.book.out(rec))

    async def thread_delete(self, request: Request) -> Response:
        tid = request.path_params["tid"]
        await self._drop(tid, await self.book.need_record(tid))
        return Response(status_code=204)

    async def _drop(self, tid: str, rec: Mapping[str, Any]) -> None:
        """Delete a thread: its runs cancelled, its checkpoints, its record."""
        g = self.book.graph_of(rec)
        if g is not None:
            for run in await g.queue.list(tid, limit=100):
                if not run.done:
                    with contextlib.suppress(RunNotFound):
                        await g.queue.cancel(run.run_id, action="interrupt")
            await g.saver.adelete_thread(tid)
        await self.book.kv.delete(tid)

    async def thread_copy(self, request: Request) -> Response:
        """A new thread (a random id) with the thread's metadata and every checkpoint of it, as
        LangGraph's server copies one (not its runs). The checkpoints are copied before the record
        is written, so the copy is never seen without its state. A thread that does not exist is a
        409, as LangGraph's server answers it."""
        tid = request.path_params["tid"]
        rec = await self.book.record(tid)
        if rec is None:
            raise HTTPException(409, f"no thread {tid!r} to copy")
        new = str(uuid.uuid4())
        g = self.book.graph_of(rec)
        if g is not None:
            await g.saver.acopy_thread(tid, new)
        copied = {"thread_id": new, "created_ms": int(time.time() * 1000),
                  "metadata": json.loads(json.dumps(rec.get("metadata") or {}))}  # fmt: skip
        await self.book.save(copied)
        return _json(await self.book.out(copied))

    async def threads_prune(self, request: Request) -> Response:
        """``thread_ids`` pruned by ``strategy``: ``delete`` (the default) deletes each thread as
        ``DELETE /threads/{id}`` does; ``keep_latest`` keeps each thread and its latest checkpoint
        and drops the older ones (a thread a run holds is left alone). Ids of no thread are skipped;
        ``pruned_count`` counts the threads pruned."""
        body = await read_body(request, self.max_body)
        ids, strategy = body.get("thread_ids", []), body.get("strategy", "delete")
        if not isinstance(ids, list) or len(ids) > 1000 or not all(isinstance(i, str) for i in ids):
            raise HTTPException(422, "thread_ids must be a list of at most 1000 thread ids")
        if strategy not in ("delete", "keep_latest"):
            raise HTTPException(422, f"Invalid strategy: {strategy}. Expected 'delete' or 'keep_latest'.")
        pruned = 0
        for tid in dict.fromkeys(ids):
            rec = await self.book.record(tid)
            if rec is None:
                continue
            if strategy == "delete":
                await self._drop(tid, rec)
            elif (g := self.book.graph_of(rec)) is not None:
                await g.saver.aprune([tid], strategy="keep_latest")
            pruned += 1
        return JSONResponse({"pruned_count": pruned})

    async def _matching(self, ids: list[str] | None, most: int, body: Mapping[str, Any], shown: bool = True,
                        sort: tuple[str, bool] | None = None) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
        """The threads (as the API shows them; with ``shown=False`` their records, when no filter needs
        more) of ``ids``, or of the first ``most``, that pass the filters; ``sort``: (the record field,
        descending), the records sorted before any thread's state is read."""
        meta, values, status = _thread_filter(body)
        records: Any = self._thread_records(ids, most)
        if sort is not None:
            field, desc = sort
            kept = [r async for r in records if all((r.get("metadata") or {}).get(k) == v for k, v in meta.items())]
            kept.sort(key=lambda r: (r.get(field, r["created_ms"]), r["thread_id"]), reverse=desc)
            records = _each(kept)
        async for rec in records:
            if any((rec.get("metadata") or {}).get(k) != v for k, v in meta.items()):
                continue
            if not shown and status is None and not values:
                yield rec
                continue
            item = await self.book.out(rec)
            if status is not None and item["status"] != status:
                continue
            held = item["values"] if isinstance(item["values"], dict) else {}
            if any(k not in held or held[k] != v for k, v in values.items()):
                continue
            yield item

    async def threads_search(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        offset, limit = page_of(body)
        ids = body.get("ids")
        listed = isinstance(ids, list) and len(ids) <= 1000 and all(isinstance(i, str) for i in ids)
        if ids is not None and not listed:
            raise HTTPException(422, "ids must be a list of at most 1000 thread ids")
        sort_by, order = body.get("sort_by") or "updated_at", body.get("sort_order") or "desc"
        if sort_by not in _SORTS:
            raise HTTPException(422, f"sort_by must be one of {', '.join(_SORTS)}")
        if not isinstance(order, str) or order.lower() not in ("asc", "desc"):
            raise HTTPException(422, "sort_order must be 'asc' or 'desc'")
        out: list[dict[str, Any]] = []
        skipped = 0
        sort = (_SORTS[sort_by], order.lower() == "desc")
        async for item in self._matching(ids, offset + SEARCH_SCAN, body, sort=sort):
            if skipped < offset:
                skipped += 1
                continue
            out.append(item)
            if len(out) >= limit:
                break
        return _json(out)

    async def _thread_records(self, ids: list[str] | None, most: int) -> AsyncIterator[dict[str, Any]]:
        """The records of ``ids``, or of the first ``most`` threads in id order: pages of 100, each one
        bounded read of the index and one ``get_many``, so a search never reads a namespace whole."""
        kv = self.book.kv
        after: str | None = None
        while ids or (ids is None and most > 0):
            if ids is not None:
                page, ids = ids[:100], ids[100:]
            else:
                page, after = await kv.keys_page(after, limit=min(100, most))
                most = most - len(page) if after is not None else 0
            for raw in await kv.get_many(page) if page else []:
                if raw is not None:
                    yield dict(json.loads(raw))

    async def threads_count(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        if not any(body.get(k) for k in ("metadata", "values", "status")):
            _thread_filter(body)
            return JSONResponse(await self.book.kv.count())
        # As a search counts: the threads among the first SEARCH_SCAN (in id order) that pass.
        return JSONResponse(sum([1 async for _ in self._matching(None, SEARCH_SCAN, body, shown=False)]))

    # ---- thread state ------------------------------------------------------------------------------

    async def _state(self, tid: str, checkpoint: Mapping[str, Any] | None = None) -> dict[str, Any]:
        rec = await self.book.need_record(tid)
        g = self.book.graph_of(rec)
        if g is None:
            return {"values": {}, "next": [], "checkpoint": None, "metadata": None, "created_at": None,
                    "parent_checkpoint": None, "tasks": [], "interrupts": [], "checkpoint_id": None,
                    "parent_checkpoint_id": None}  # fmt: skip
        conf: dict[str, Any] = {"thread_id": tid}
        for k in ("checkpoint_id", "checkpoint_ns"):
            if checkpoint and checkpoint.get(k) is not None:
                conf[k] = checkpoint[k]
        snap = await g.stateful.aget_state({"configurable": conf})
        if checkpoint and checkpoint.get("checkpoint_id") and snap.config is None:
            raise HTTPException(404, f"no checkpoint {checkpoint['checkpoint_id']!r} in thread {tid!r}")
        return shapes.state_json(snap)

    async def state_get(self, request: Request) -> Response:
        return _json(await self._state(request.path_params["tid"]))

    async def state_at(self, request: Request) -> Response:
        return _json(await self._state(request.path_params["tid"], {"checkpoint_id": request.path_params["cid"]}))

    async def state_checkpoint(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        cp = body.get("checkpoint") or {}
        return _json(await self._state(request.path_params["tid"], cp if isinstance(cp, dict) else {}))

    async def state_update(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        tid = request.path_params["tid"]
        rec = await self.book.need_record(tid)
        g = self.book.graph_of(rec) or (next(iter(self.graphs.values())) if len(self.graphs) == 1 else None)
        if g is None:
            raise HTTPException(422, f"thread {tid!r} has no graph yet (no run); several graphs are served")
        if self.book.graph_of(rec) is None:
            rec["metadata"] = {**(rec.get("metadata") or {}), "graph_id": g.name}
            await self.book.save(rec)
        conf: dict[str, Any] = {"thread_id": tid}
        cp = body.get("checkpoint") or {}
        if body.get("checkpoint_id"):
            conf["checkpoint_id"] = body["checkpoint_id"]
        elif isinstance(cp, dict) and cp.get("checkpoint_id"):
            conf["checkpoint_id"] = cp["checkpoint_id"]
        try:
            # The thread's one writer while it writes: a running run holds the lease, so this waits
            # for the run's end (or answers 409 after the wait).
            async with g.saver.lease(tid, lease_ms=self.lease_ms, wait_ms=10_000):
                out = await g.stateful.aupdate_state({"configurable": conf}, body.get("values"),
                                                     as_node=body.get("as_node"))  # fmt: skip
        except ThreadBusy as exc:
            raise HTTPException(409, f"thread {tid!r} is busy (a run holds it): {exc}") from exc
        checkpoint = shapes.checkpoint_json(out)
        # As LangGraph's server answers: the checkpoint, again as a config's ``configurable``, and its id.
        return _json({"checkpoint": checkpoint, "configurable": checkpoint,
                      "checkpoint_id": checkpoint and checkpoint["checkpoint_id"]})  # fmt: skip

    async def history(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        tid = request.path_params["tid"]
        rec = await self.book.need_record(tid)
        g = self.book.graph_of(rec)
        if g is None:
            return JSONResponse([])
        limit = body.get("limit", 10)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise HTTPException(422, "limit must be an int in [1, 1000]")
        conf: dict[str, Any] = {"thread_id": tid}
        cp = body.get("checkpoint") or {}
        if isinstance(cp, dict) and cp.get("checkpoint_id"):
            conf["checkpoint_id"] = cp["checkpoint_id"]
        before = body.get("before")
        if isinstance(before, dict):
            before = {"configurable": {"thread_id": tid, **before}}
        elif isinstance(before, str):
            before = {"configurable": {"thread_id": tid, "checkpoint_id": before}}
        out = []
        async for snap in g.stateful.aget_state_history({"configurable": conf}, limit=limit, before=before,
                                                        filter=body.get("metadata") or None):  # fmt: skip
            out.append(shapes.state_json(snap))
        return _json(out)


async def _each(items: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item


def _thread_filter(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """A search's or count's filters: ``metadata`` and ``values`` (top-level keys equal), ``status``."""
    meta, values, status = body.get("metadata") or {}, body.get("values") or {}, body.get("status")
    if not isinstance(meta, dict):
        raise HTTPException(422, "metadata must be an object")
    if not isinstance(values, dict):
        raise HTTPException(422, "values must be an object")
    if status is not None and status not in ("idle", "busy", "interrupted", "error"):
        raise HTTPException(422, "status must be one of idle, busy, interrupted, error")
    return meta, values, status
