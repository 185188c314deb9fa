"""The dashboard's routes of ``agentstate serve``: the page, its static files, its JSON and SSE
reads and its three task actions (requeue, cancel, resume). Every read is bounded as the CLI's
are (``KEEP`` rows, pages of the listing scripts); the collectors (``_dashboard.py``) do the
reading, once per namespace however many pages watch. With a token, the page is the login form
until the browser has a session (``_auth.py``): the token is typed once, never kept by the page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse

from ..checkpoint import AsyncCheckpointStore
from ..errors import NotParked, NotWaiting, TaskNotFound
from ..pool_models import Cursor
from ..pools import AsyncPoolStore
from ._auth import COOKIE, SESSION_S, header_token, same_origin
from ._dashboard import KEEP, Collector
from ._http import read_body
from ._shapes import json_response, sse

if TYPE_CHECKING:
    from ._served import App

__all__ = ["DashboardRoutes"]

_STATIC = Path(__file__).parent / "static"
_STATIC_FILES = frozenset({"dashboard.js", "dashboard.css"})
#: The page runs only its own script and style, and nothing may frame it.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it a browser sends "Origin: null" on the page's own POSTs (the login
    # form, the buttons), and the Origin check could not tell them from another site's. same-origin
    # still sends nothing to any other site.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: The login form posts to its own origin; nothing else differs.
_LOGIN_HEADERS = {**_PAGE_HEADERS, "Content-Security-Policy": _PAGE_HEADERS["Content-Security-Policy"].replace(
    "form-action 'none'", "form-action 'self'")}  # fmt: skip
#: A login form is a few dozen bytes.
_LOGIN_BODY = 4096


class DashboardRoutes:
    """The dashboard's handlers over the namespaces it shows (one collector each)."""

    def __init__(self, app: App, namespaces: list[str]) -> None:
        self.app, self.namespaces = app, namespaces
        client = app.client
        self.stores = {ns: AsyncCheckpointStore(client, namespace=ns) for ns in namespaces}
        self.pools = {ns: AsyncPoolStore(client, namespace=ns) for ns in namespaces}
        self.collectors = {ns: Collector(store) for ns, store in self.stores.items()}

    async def stop(self) -> None:
        for c in self.collectors.values():
            await c.stop()

    def _ns(self, request: Request) -> str:
        ns = request.query_params.get("ns") or self.namespaces[0]
        if ns not in self.stores:
            raise HTTPException(404, f"namespace {ns!r} is not shown here (shown: {self.namespaces})")
        return ns

    async def page(self, request: Request) -> Response:
        sessions = self.app.sessions
        if sessions is None or self.app.session_of(request) or sessions.check_token(header_token(request.headers)):
            return FileResponse(_STATIC / "dashboard.html", headers=_PAGE_HEADERS)
        return self._login_form(200, "")

    def _login_form(self, status: int, error: str) -> Response:
        html = (_STATIC / "login.html").read_text("utf-8").replace("<!--error-->", error)
        return Response(html, status_code=status, media_type="text/html", headers=_LOGIN_HEADERS)

    async def login(self, request: Request) -> Response:
        """The login form's POST (``token=...``): a session cookie and back to the page, or the form again."""
        sessions = self.app.sessions
        if sessions is None:  # the guard answered it (read-only): kept for the type checker
            raise HTTPException(403, "read-only")
        if not same_origin(request):
            raise HTTPException(403, "the login form posts from this server's own page")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > _LOGIN_BODY:
                raise HTTPException(413, "login form over 4096 bytes")
        given = next(iter(parse_qs(raw.decode("utf-8", "replace")).get("token") or []), None)
        if not sessions.check_token(given):
            # A fixed text: nothing of the request reaches the page.
            return self._login_form(401, '<p class="error" role="alert">wrong token</p>')
        out = Response(status_code=303, headers={"Location": "/", "Cache-Control": "no-store"})
        out.set_cookie(COOKIE, sessions.new(), max_age=SESSION_S, path="/", httponly=True, samesite="strict",
                       secure=request.url.scheme == "https")  # fmt: skip
        return out

    async def logout(self, request: Request) -> Response:
        out = JSONResponse({"ok": True})
        out.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return out

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC_FILES:
            raise HTTPException(404, "no such file")
        return FileResponse(_STATIC / name, headers=_PAGE_HEADERS)

    async def dash_info(self, request: Request) -> Response:
        sessions, session = self.app.sessions, self.app.session_of(request)
        return JSONResponse({"namespaces": self.namespaces, "graphs": sorted(self.app.graphs),
                             "read_only": self.app.token is None, "session": session is not None,
                             "csrf": None if sessions is None or session is None else sessions.csrf(session)},
                            headers={"Cache-Control": "no-store"})  # fmt: skip

    async def dash_frame(self, request: Request) -> Response:
        c = self.collectors[self._ns(request)]
        _, frame = await c.next_frame(0)
        return json_response(frame)

    async def dash_frames(self, request: Request) -> Response:
        c = self.collectors[self._ns(request)]
        if self.app.streams.locked():
            raise HTTPException(503, "too many open event streams")

        async def body() -> AsyncIterator[bytes]:
            async with self.app.streams:
                seen, first = 0, True
                while True:
                    version, frame = await c.next_frame(seen)
                    if frame is None or version == seen:
                        yield b": idle\n\n"  # a heartbeat: a dead page's connection fails here and ends
                        continue
                    seen = version
                    out = frame if first else {**frame, "history": frame["history"][-1:]}
                    first = False
                    yield sse("frame", out, str(version))

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def dash_pools(self, request: Request) -> Response:
        ids = await self.pools[self._ns(request)].list()
        return json_response({"count": len(ids), "pools": ids[: KEEP * 2]})

    async def dash_pool(self, request: Request) -> Response:
        snap = await self.pools[self._ns(request)].snapshot(request.path_params["pool"])
        return json_response({"pool_id": snap.pool_id, "created": snap.created, "topics": snap.topics[:KEEP],
                      "members": len(snap.members), "messages": len(snap.messages), "wakes": len(snap.wakes),
                      "first_members": snap.members[:KEEP]})  # fmt: skip

    async def dash_pool_tail(self, request: Request) -> Response:
        pools, pool_id = self.pools[self._ns(request)], request.path_params["pool"]
        raw = request.headers.get("last-event-id") or request.query_params.get("after")
        try:
            after = None if raw is None else Cursor(int(raw))
        except ValueError:
            raise HTTPException(422, "after / Last-Event-ID is a record sequence number") from None
        if self.app.streams.locked():
            raise HTTPException(503, "too many open event streams")

        async def body() -> AsyncIterator[bytes]:
            nonlocal after
            async with self.app.streams:
                while True:
                    records = await pools.watch(pool_id, after, count=100, block_ms=10_000)
                    if not records:
                        yield b": idle\n\n"
                    for rec in records:
                        after = rec.cursor
                        data = {"sequence": rec.cursor.sequence, "kind": str(rec.kind), "payload": rec.payload}
                        yield sse("record", data, str(rec.cursor.sequence))

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def dash_threads(self, request: Request) -> Response:
        kv = self.app.book.kv
        first, _ = await kv.keys_page(limit=KEEP)
        out = []
        for tid in first:
            rec = await self.app.book.record(tid)
            if rec is None:
                continue
            g = self.app.book.graph_of(rec)
            runs = [] if g is None else await g.queue.list(tid, limit=5)
            out.append({"thread_id": tid, "graph_id": None if g is None else g.name,
                        "metadata": rec.get("metadata") or {},
                        "runs": [{"run_id": r.run_id, "status": r.status, "attempt": r.attempt, "worker": r.worker,
                                  "error": r.error, "created_at_ms": r.created_at_ms} for r in runs]})  # fmt: skip
        return json_response({"count": await kv.count(), "threads": out})

    async def dash_action(self, request: Request) -> Response:
        ns, task, action = self._ns(request), request.path_params["task"], request.path_params["action"]
        store = self.stores[ns]
        body = await read_body(request, self.app.max_body)
        try:
            if action == "requeue":
                await store.requeue(task)
            elif action == "cancel":
                reason = body.get("reason")
                await store.cancel(
                    task, reason=reason if isinstance(reason, str) and reason else "cancelled from the dashboard"
                )
            elif action == "resume":
                await store.resume(task, message=body.get("message"))
            else:
                raise HTTPException(404, f"no action {action!r}")
        except TaskNotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        except (NotParked, NotWaiting) as exc:
            raise HTTPException(409, str(exc)) from exc
        self.collectors[ns].refresh_soon()
        return JSONResponse({"ok": True, "task_id": task, "action": action})
