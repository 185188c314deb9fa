"""The ASGI app of ``agentstate serve``: LangGraph's server API over ``AsyncRunQueue`` and the saver.

Each served graph (``--graph NAME=MODULE:ATTR``) has its own namespace, ``<namespace>.<NAME>``:
its runs queue there and its threads' checkpoints are stored there, so the app's workers (or a
fleet started with ``agentstate langgraph worker MODULE:ATTR --namespace <namespace>.<NAME>``)
execute them. A thread belongs to the graph of its first run (``metadata["graph_id"]``, as on
LangGraph Platform). Thread records are kept in a ``KeyValueStore`` of ``<namespace>.threads``.

With a token, every route but ``/ok`` needs it, reads included, as ``x-api-key`` or
``Authorization: Bearer``, or the dashboard's session cookie (``_auth.py``); without a token the app
is read-only (writes answer 403). CORS preflights are answered before that check, for the origins
given (``cors_origins``). Request bodies are bounded (``max_body_bytes``), and so is the number of
open event streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import (
    AgentStateError,
    BackendUnavailable,
    InvalidArgument,
    RunNotFound,
    RunRejected,
)
from ..kv import AsyncKeyValueStore
from ..langgraph import AsyncAgentStateSaver, AsyncAgentStateStore, AsyncRunQueue, GraphWorker, Run
from ..langgraph._runs_core import MAX_AFTER_MS, check_interrupt_nodes
from . import _shapes as shapes
from ._answers import RunAnswers, location
from ._assistants import AssistantRoutes
from ._auth import COOKIE, CSRF_HEADER, Sessions, header_token, same_origin
from ._batch import batch_route
from ._crons import CronRoutes
from ._dashboard_routes import DashboardRoutes
from ._feeds import RunFeeds
from ._http import read_body
from ._served import RunOptions, ServedGraph, ThreadBook
from ._shapes import json_response as _json
from ._store import StoreRoutes
from ._thread_stream import thread_stream_route
from ._threads import ThreadRoutes
from ._webhooks import WebhookSender

__all__ = ["RunOptions", "ServedGraph", "create_app"]

#: Routes of LangGraph's server API this app does not serve: a clear 501, not a bare 404.
NOT_SERVED: tuple[str, ...] = ()
_READ_POSTS = ("/search", "/count", "/history", "/state/checkpoint", "/store/namespaces", "/versions")
#: Open event streams at most (SSE: run streams, dashboard frames, pool tails); more answer 503.
MAX_STREAMS = 256
#: The connections beyond ``MAX_STREAMS`` that ``agentstate serve`` gives its client's pool (workers,
#: API reads, the dashboard's sweep).
POOL_MARGIN = 64
_FINAL = ("success", "error", "interrupted", "timeout")
#: How long ``/ok`` waits for Redis's PONG.
OK_PING_S = 2.0
#: What a browser's client may read of an answer across origins (the run a create made; pages of a
#: search). What it may send is any header its preflight asks for, as LangGraph's server allows: the
#: key, the SSE cursor, and the front end's own ``defaultHeaders`` (no cookie rides along: no
#: credentials are allowed).
CORS_EXPOSE_HEADERS = ("Content-Location", "Location", "X-Pagination-Total", "X-Pagination-Next", "X-Request-Id")
#: Reachable without the token: the health check, and the dashboard's login form and its stylesheet
#: (``GET /`` shows the form until a session exists).
PUBLIC = frozenset({("GET", "/ok"), ("GET", "/"), ("POST", "/dashboard/login"),
                    ("GET", "/dashboard/static/dashboard.css")})  # fmt: skip


class _App:
    def __init__(self, client: Any, graphs: Mapping[str, Any], namespace: str, token: str | None,
                 workers: int, max_body_bytes: int, max_streams: int, lease_ms: int,
                 options: RunOptions | None = None) -> None:  # fmt: skip
        self.client, self.token, self.max_body, self.lease_ms = client, token, max_body_bytes, lease_ms
        self.options = options or RunOptions()
        self.sessions = None if token is None else Sessions(token)
        self.graphs: dict[str, ServedGraph] = {}
        #: LangGraph's long-term memory: the store routes' and every served graph's (``get_store()``).
        self.store = AsyncAgentStateStore(client, namespace=f"{namespace}.store")
        for name, graph in graphs.items():
            ns = f"{namespace}.{name}"
            served = ServedGraph(
                name, graph, AsyncRunQueue(client, namespace=ns), AsyncAgentStateSaver(client, namespace=ns)
            )
            served.workers = (
                [
                    GraphWorker(
                        graph,
                        served.queue,
                        served.saver,
                        store=self.store,
                        concurrency=workers,
                        graph_id=name,
                        lease_ms=lease_ms,
                    )
                ]
                if workers
                else []
            )
            self.graphs[name] = served
        self.assistants = AssistantRoutes(self.graphs, max_body_bytes, client, namespace)
        self.store_routes = StoreRoutes(self.store, max_body_bytes)
        self.book = ThreadBook(AsyncKeyValueStore(client, namespace=f"{namespace}.threads"), self.graphs)
        self.threads = ThreadRoutes(self.book, self.graphs, max_body_bytes, lease_ms)
        self.crons = CronRoutes(self, client, namespace, max_body_bytes)
        self.streams = asyncio.Semaphore(max_streams)
        #: One Redis read per followed run, shared by all its SSE clients.
        self.feeds = RunFeeds()
        #: The dashboard: the tasks of ``namespace``, and each graph's threads.
        self.dash = DashboardRoutes(self, [namespace, *(g.queue.queue_namespace for g in self.graphs.values())])
        self._tasks: list[asyncio.Task[None]] = []
        self.answers = RunAnswers(self.book, self.graphs, self.feeds, self.streams)
        self.webhooks = WebhookSender(client, namespace, self.graphs, self.options.webhook_allow_private,
                                      self._values, self._drop_thread)  # fmt: skip
        #: Tenant keys whose limit this server has set (once each).
        self._tenant_keys: set[tuple[str, str]] = set()

    # ---- lifecycle ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Bound to this loop now: a graph's sync node calls the store's sync methods from its thread.
        await self.store.__aenter__()
        for g in self.graphs.values():
            for w in g.workers:
                self._tasks.append(asyncio.create_task(w.arun(), name=f"agentstate-serve-worker-{g.name}"))
        self.crons.start()
        self.webhooks.start()
        try:
            yield
        finally:
            await self.webhooks.stop()
            await self.crons.stop()
            for g in self.graphs.values():
                for w in g.workers:
                    w.stop()
            await self.dash.stop()
            await self.feeds.close()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=10)
            await self.store.__aexit__(None, None, None)

    # ---- who may call ----------------------------------------------------------------------------

    def session_of(self, request: Request) -> str | None:
        """The request's valid dashboard session cookie, or None."""
        value = request.cookies.get(COOKIE)
        return value if self.sessions is not None and self.sessions.valid(value) else None

    def refusal(self, request: Request) -> Response | None:
        """None if the request may go on, else the answer refusing it."""
        if self.sessions is None:
            if _is_write(request):
                return JSONResponse({"detail": "read-only: start agentstate serve with --token to allow writes"},
                                    status_code=403)  # fmt: skip
            return None
        if (request.method, request.url.path) in PUBLIC:
            return None
        given = header_token(request.headers)
        if given is not None:
            if self.sessions.check_token(given):
                return None
            return JSONResponse({"detail": "wrong token"}, status_code=403)
        session = self.session_of(request)
        if session is None:
            return JSONResponse({"detail": "this server needs the token on every route but /ok "
                                 "(x-api-key or Authorization: Bearer)"}, status_code=401)  # fmt: skip
        if request.method not in ("GET", "HEAD") and not (
            same_origin(request) and self.sessions.csrf_ok(session, request.headers.get(CSRF_HEADER))
        ):
            return JSONResponse({"detail": "CSRF check failed: reload the dashboard"}, status_code=403)
        return None

    # ---- runs ------------------------------------------------------------------------------------------

    async def _create(self, tid: str | None, body: Mapping[str, Any], run_id: str | None = None,
                      drop_thread: bool | None = None,
                      later: list[Awaitable[Any]] | None = None) -> tuple[ServedGraph, Run, bool]:  # fmt: skip
        """The run ``body`` asks for, on thread ``tid`` (None: a temporary thread); ``(graph, run, drop)``:
        ``drop``, the caller deletes the thread once the run ended (``drop_thread``, or by default a
        temporary thread's ``on_completion``), unless the run's webhook sender does after reading it.
        ``later``: the thread record's mark of this run (``ThreadBook.touch``) is appended there for the
        caller to await while it waits for the run, instead of awaited here."""
        temporary = tid is None
        if tid is None:
            tid = str(uuid.uuid4())  # a new id: no record to read
        # The thread's record is read while the assistant is: one round trip for both.
        reading = None if temporary else asyncio.ensure_future(self.book.kv.get(tid))
        try:
            g, body = await self.assistants.resolve(body)  # its assistant's config and context applied
            options = await self.run_options(body)  # checked before anything is written
        finally:
            if reading is not None:
                await asyncio.wait((reading,))  # not cancelled halfway: that would cost its connection
        raw = None if reading is None else reading.result()
        rec = None if raw is None else dict(json.loads(raw))
        if rec is None and not temporary and body.get("if_not_exists") != "create":
            raise HTTPException(404, f"no thread {tid!r}")
        owner = None if rec is None else self.book.graph_of(rec)
        if owner is not None and owner is not g:
            raise HTTPException(422, f"thread {tid!r} runs graph {owner.name!r}, not {g.name!r}")
        start = await self._start_from(g, tid, body)
        saving: Any = None  # the record's write, sent beside the run's create (one round trip for both)
        if rec is None:
            rec = {"thread_id": tid, "created_ms": int(time.time() * 1000), "metadata": {"graph_id": g.name}}
            saving, raw = asyncio.ensure_future(self.book.save(rec)), None
        elif owner is None:
            rec["metadata"] = {**(rec.get("metadata") or {}), "graph_id": g.name}
            saving, raw = asyncio.ensure_future(self.book.save(rec)), None
        try:
            return await _create_run(self, g, tid, body, options, raw, start, temporary, run_id, drop_thread, later)
        finally:
            if saving is not None:  # written whatever follows, as when it was awaited before
                await asyncio.wait((saving,))
                if sys.exc_info()[0] is None:
                    saving.result()

    async def _values(self, g: ServedGraph, run: Run) -> Any:
        """The thread's values when the run ended (a webhook's ``values``)."""
        return (await g.stateful.aget_state({"configurable": {"thread_id": run.thread_id}})).values

    async def run_options(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A run's options as ``RunQueue.create`` takes them (``run_options``); a 422 for a bad one."""
        return await run_options(body, self.webhooks)

    async def _start_from(self, g: ServedGraph, tid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The ``configurable`` keys of a run that starts from a checkpoint (``checkpoint`` or
        ``checkpoint_id``: the thread's head, or an earlier one, which forks the thread there), as
        LangGraph's server maps them; 404 for a checkpoint the thread does not have."""
        cp, cid = body.get("checkpoint"), body.get("checkpoint_id")
        if cp is None and cid is None:
            return {}
        if cp is not None and not isinstance(cp, dict):
            raise HTTPException(422, "checkpoint must be an object (checkpoint_id, checkpoint_ns, ...)")
        out: dict[str, Any] = {}
        for k, v in (cp or {}).items():
            if k == "thread_id":
                if v not in (None, tid):
                    raise HTTPException(422, f"checkpoint.thread_id {v!r} is not the run's thread {tid!r}")
            elif k in ("checkpoint_id", "checkpoint_ns"):
                if v is not None and not isinstance(v, str):
                    raise HTTPException(422, f"checkpoint.{k} must be a string")
                if v is not None:
                    out[k] = v
            elif k == "checkpoint_map":
                if v is not None and not isinstance(v, dict):
                    raise HTTPException(422, "checkpoint.checkpoint_map must be an object")
                if v:
                    out[k] = v
            else:
                raise HTTPException(422, f"checkpoint.{k} is not a checkpoint key")
        if cid is not None:
            if not isinstance(cid, str) or not cid:
                raise HTTPException(422, "checkpoint_id must be a string")
            out["checkpoint_id"] = cid
        if out.get("checkpoint_id"):
            at: dict[str, Any] = {k: out[k] for k in ("checkpoint_id", "checkpoint_ns") if k in out}
            found = await g.saver.aget_tuple({"configurable": {"thread_id": tid, **at}})
            if found is None:
                raise HTTPException(404, f"no checkpoint {out['checkpoint_id']!r} in thread {tid!r}")
        return out

    async def runs_create(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        tid = request.path_params.get("tid")
        g, run, _ = await self._create(tid, body)
        return _json(shapes.run_json(run, g.assistant_id), headers=location(run, stateless=tid is None))

    async def _join(self, g: ServedGraph, run_id: str) -> Run:
        return await self.answers.join(g, run_id)

    async def _drop_thread(self, g: ServedGraph, tid: str) -> None:
        await self.answers.drop_thread(g, tid)

    async def runs_wait(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        cancel = _cancel_on_disconnect(body)
        later: list[Awaitable[Any]] = []
        g, run, delete = await self._create(request.path_params.get("tid"), body, later=later)
        marks = asyncio.gather(*later)  # the thread record's mark, while the run runs
        try:
            return await self.answers.answer(g, run, delete=delete, request=request if cancel else None)
        finally:
            await marks

    async def run_join(self, request: Request) -> Response:
        g, run = await self.answers.run_of(request.path_params["tid"], request.path_params["rid"])
        return await self.answers.answer(g, run, orphan_check=True)

    async def run_get(self, request: Request) -> Response:
        g, run = await self.book.run_of(request.path_params["tid"], request.path_params["rid"])
        return _json(shapes.run_json(run, g.assistant_id))

    async def runs_list(self, request: Request) -> Response:
        tid = request.path_params["tid"]
        rec = await self.book.need_record(tid)
        g = self.book.graph_of(rec)
        if g is None:
            return JSONResponse([])
        limit = _int_param(request, "limit", 10, 1, 1000)
        offset = _int_param(request, "offset", 0, 0, 10_000)
        status = request.query_params.get("status")
        runs = await g.queue.list(tid, limit=min(limit + offset, 10_000))
        runs = [r for r in runs if status in (None, r.status)][offset : offset + limit]
        return _json([shapes.run_json(r, g.assistant_id) for r in runs])

    async def run_cancel(self, request: Request) -> Response:
        g, run = await self.book.run_of(request.path_params["tid"], request.path_params["rid"])
        action = request.query_params.get("action", "interrupt")
        if action not in ("interrupt", "rollback"):
            raise HTTPException(422, "action must be 'interrupt' or 'rollback'")
        await g.queue.cancel(run.run_id, action=action)
        if request.query_params.get("wait", "false").lower() in ("1", "true"):
            with contextlib.suppress(RunNotFound):
                await self.answers.join(g, run.run_id)
            return JSONResponse({})  # as LangGraph's server answers a cancel that waited
        return Response(status_code=202 if request.query_params.get("wait") is None else 204)

    async def run_delete(self, request: Request) -> Response:
        g, run = await self.book.run_of(request.path_params["tid"], request.path_params["rid"])
        if not await g.queue.delete(run.run_id):
            raise HTTPException(409, f"run {run.run_id} is {run.status}: cancel it first")
        return Response(status_code=204)

    async def runs_stream(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        cancel = _cancel_on_disconnect(body)
        tid = request.path_params.get("tid")
        g, run, delete = await self._create(tid, body)
        return self.answers.events(g, run, None, None, delete, cancel, stateless=tid is None)

    async def run_stream(self, request: Request) -> Response:
        tid = request.path_params.get("tid")
        if tid is None:  # a stateless stream's Location: its run, wherever its temporary thread is
            g, run = await self.answers.stateless_run(request.path_params["rid"])
        else:
            g, run = await self.answers.run_of(tid, request.path_params["rid"])
        after = request.headers.get("last-event-id") or None
        modes = [m for m in request.query_params.getlist("stream_mode") if m] or None  # None is sent as ''"
        cancel = request.query_params.get("cancel_on_disconnect", "false").lower() in ("1", "true", "yes")
        return self.answers.events(g, run, after, modes, cancel_on_disconnect=cancel, stateless=tid is None)

    async def ok(self, request: Request) -> Response:
        # Healthy means able to serve: a server whose Redis is gone answers 503, so a load balancer
        # sends its clients to another.
        try:
            await asyncio.wait_for(self.client.ping(), OK_PING_S)
        except Exception as exc:  # any failure to reach Redis is "unavailable"
            return JSONResponse({"ok": False, "detail": f"Redis is unavailable ({type(exc).__name__})"},
                                status_code=503)  # fmt: skip
        return JSONResponse({"ok": True})

    async def info(self, request: Request) -> Response:
        from .. import __version__

        return JSONResponse({"version": __version__, "flags": {"assistants": True, "crons": True}, "metadata": {}})

    async def not_served(self, request: Request) -> Response:
        raise HTTPException(501, f"{request.method} {request.url.path} is not served by agentstate serve")


async def _create_run(app: _App, g: ServedGraph, tid: str, body: Mapping[str, Any], options: dict[str, Any],
                  raw: bytes | None, start: dict[str, Any], temporary: bool, run_id: str | None,
                  drop_thread: bool | None,
                  later: list[Awaitable[Any]] | None) -> tuple[ServedGraph, Run, bool]:  # fmt: skip
    """``_create`` once the thread's record is known (``raw``, None if just written): the run's create."""
    modes = _run_modes(body.get("stream_mode") or "values")
    config = body.get("config") or {}
    if not isinstance(config, dict):
        raise HTTPException(422, "config must be an object")
    config = dict(config)
    if body.get("context") or start:
        config["configurable"] = {**(body.get("context") or {}), **(config.get("configurable") or {}), **start}
    meta = {**(body.get("metadata") or {}), "graph_id": g.name, "assistant_id": body["assistant_id"]}
    inputs = body.get("input")
    if body.get("command") is not None and inputs == {}:
        # useStream's submit({}, {command}) (Agent Chat UI's resume): LangGraph's server runs the
        # command and drops the input; an empty one is no input. A non-empty one stays refused.
        inputs = None
    options["concurrency_key"] = await tenant_key(app.options, app._tenant_keys, g, meta)
    drop = temporary and body.get("on_completion", "delete") == "delete" if drop_thread is None else drop_thread
    # A caller's id (a cron's tick, fired again after a crash) may name a run that exists: its
    # webhook is known already (and may have been sent: not again).
    if options.get("webhook") and (run_id is None or await g.queue.get(run_id) is None):
        run_id = run_id or str(uuid.uuid4())
        await app.webhooks.expect(g, run_id, options["webhook"], drop)
    try:
        run = await g.queue.create(tid, inputs, command=body.get("command"), config=config,
                                   multitask_strategy=body.get("multitask_strategy") or "enqueue",
                                   stream_mode=modes, metadata=meta,
                                   subgraphs=bool(body.get("stream_subgraphs")), run_id=run_id,
                                   **options)  # fmt: skip
    except (RunRejected, InvalidArgument) as exc:
        if options.get("webhook") and run_id is not None and await g.queue.get(run_id) is None:
            await app.webhooks.forget(run_id)
        raise HTTPException(409 if isinstance(exc, RunRejected) else 422, str(exc)) from exc
    if raw is not None:  # a record just saved is already marked updated
        if later is None:
            await app.book.touch(tid, raw)
        else:
            later.append(app.book.touch(tid, raw))
    if options.get("webhook"):
        app.webhooks.follow(g, run.run_id)
        drop = False  # the webhook's sender drops the temporary thread once it has read its values
    return g, run, drop


async def run_options(body: Mapping[str, Any], webhooks: WebhookSender) -> dict[str, Any]:
    """A run's ``interrupt_before`` / ``interrupt_after``, ``after_seconds`` and ``webhook`` as
    ``RunQueue.create`` takes them; a 422 for a bad one (a webhook the SSRF guard refuses too)."""
    out: dict[str, Any] = {}
    try:
        for k in ("interrupt_before", "interrupt_after"):
            if body.get(k) is not None:
                out[k] = check_interrupt_nodes(body[k], k)
    except InvalidArgument as exc:
        raise HTTPException(422, str(exc)) from exc
    delay = body.get("after_seconds")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= MAX_AFTER_MS / 1000:
            raise HTTPException(422, f"after_seconds must be a number of seconds, 0..{MAX_AFTER_MS // 1000}")
        out["after_ms"] = int(delay * 1000)
    if body.get("webhook") is not None:
        out["webhook"] = await webhooks.check(body["webhook"])
    return out


async def tenant_key(options: RunOptions, memo: set[tuple[str, str]], g: ServedGraph,
                     meta: Mapping[str, Any]) -> str | None:  # fmt: skip
    """The concurrency key of a run's tenant (``--tenant-limit KEY=N``: its ``metadata[KEY]``), its
    limit set the first time this server meets it; None without one."""
    key = options.tenant_key
    if key is None or meta.get(key) is None:
        return None
    value = meta[key]
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise HTTPException(422, f"metadata.{key} must be a string or an int (it names the run's tenant)")
    ckey = f"tenant:{key}={value}"
    if not str(value) or len(ckey.encode()) > 200 or not ckey.isprintable():
        raise HTTPException(422, f"metadata.{key} must be 1-150 printable characters (it names the run's tenant)")
    if (g.name, ckey) not in memo:
        await g.queue.tasks.set_concurrency_limit(ckey, options.tenant_limit)
        if len(memo) >= 100_000:  # a memo, not a registry: setting a limit again is harmless
            memo.clear()
        memo.add((g.name, ckey))
    return ckey


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise HTTPException(422, f"{name} must be an int") from None
    if not lo <= v <= hi:
        raise HTTPException(422, f"{name} must be in [{lo}, {hi}]")
    return v


def _is_write(request: Request) -> bool:
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return False
    return not (request.method == "POST" and request.url.path.endswith(_READ_POSTS))


def _run_modes(value: Any) -> Any:
    """The run's stream modes in ``RunQueue``'s names: LangGraph's server's ``messages`` (each message
    as it grows) is ``messages-partial``, its ``messages-tuple`` (the graph's own chunks) is ``messages``;
    given both, LangGraph's server sends the tuples only. Anything else goes on to be checked."""
    modes = [value] if isinstance(value, str) else value
    if not isinstance(modes, (list, tuple)):
        return value
    tuples = "messages-tuple" in modes
    out = [{"messages-tuple": "messages", "messages": "messages-partial"}.get(m, m) if isinstance(m, str) else m
           for m in modes if not (tuples and m == "messages")]  # fmt: skip
    return out


def _cancel_on_disconnect(body: Mapping[str, Any]) -> bool:
    """A run's ``on_disconnect``: True for ``cancel``, False for ``continue`` (the default); else 422."""
    mode = body.get("on_disconnect") or "continue"
    if mode not in ("continue", "cancel"):
        raise HTTPException(422, "on_disconnect must be 'continue' or 'cancel'")
    return bool(mode == "cancel")


def create_app(
    graphs: Mapping[str, Any],
    client: Any,
    *,
    namespace: str = "agentstate",
    token: str | None = None,
    workers: int = 1,
    max_body_bytes: int = 1 << 20,
    max_streams: int = MAX_STREAMS,
    cors_origins: Sequence[str] = (),
    lease_ms: int = 30_000,
    options: RunOptions | None = None,
) -> Starlette:
    """The app: ``graphs`` by name, on an ``redis.asyncio`` client; ``workers`` GraphWorker tasks per
    graph run in the app (0: a fleet elsewhere executes the runs). At most ``max_streams`` event streams
    are open at once; each followed run (however many clients follow it) and each pool tail holds one
    of the client's pooled connections while it waits, so give the client a pool that large plus what
    the workers need (``agentstate serve`` does: ``MAX_STREAMS + POOL_MARGIN``). ``cors_origins``: the
    origins a browser may call it from (``"*"``: any; none by default); ``lease_ms``: the workers'
    thread leases (how long a crashed server's runs wait before another takes them over); ``options``: the
    runs' webhook guard and tenant limits (``RunOptions``)."""
    app_state = _App(client, graphs, namespace, token, workers, max_body_bytes, max_streams, lease_ms, options)
    a = app_state
    d, s, st, t, c = a.dash, a.assistants, a.store_routes, a.threads, a.crons

    def guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            refused = a.refusal(request)
            if refused is not None:
                return refused
            try:
                return await handler(request)
            except HTTPException as exc:
                return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
            except RunNotFound as exc:
                return JSONResponse({"detail": str(exc)}, status_code=404)
            except InvalidArgument as exc:
                return JSONResponse({"detail": str(exc)}, status_code=422)
            except BackendUnavailable as exc:
                # Not the error's text: the app never says where its Redis is.
                return JSONResponse({"detail": f"Redis is unavailable ({type(exc).__name__})"}, status_code=503)
            except AgentStateError as exc:
                return JSONResponse({"detail": f"{type(exc).__name__}"}, status_code=500)

        return guarded

    r = [
        ("/ok", a.ok, ["GET"]), ("/info", a.info, ["GET"]), ("/", d.page, ["GET"]),
        ("/dashboard/static/{name}", d.static, ["GET"]), ("/dashboard/api/info", d.dash_info, ["GET"]),
        ("/dashboard/api/frame", d.dash_frame, ["GET"]), ("/dashboard/api/frames", d.dash_frames, ["GET"]),
        ("/dashboard/api/pools", d.dash_pools, ["GET"]), ("/dashboard/api/pools/{pool}", d.dash_pool, ["GET"]),
        ("/dashboard/api/pools/{pool}/tail", d.dash_pool_tail, ["GET"]),
        ("/dashboard/api/threads", d.dash_threads, ["GET"]),
        ("/dashboard/api/tasks/{task}/{action}", d.dash_action, ["POST"]),
        ("/dashboard/login", d.login, ["POST"]), ("/dashboard/logout", d.logout, ["POST"]),
        ("/assistants", s.assistant_create, ["POST"]), ("/assistants/{aid}", s.assistant_patch, ["PATCH"]),
        ("/assistants/{aid}", s.assistant_delete, ["DELETE"]), ("/assistants/{aid}/versions", s.assistant_versions,
        ["POST"]), ("/assistants/{aid}/latest", s.assistant_latest, ["POST"]),
        ("/assistants/search", s.assistants_search, ["POST"]), ("/assistants/count", s.assistants_count, ["POST"]),
        ("/assistants/{aid}", s.assistant_get, ["GET"]), ("/assistants/{aid}/graph", s.assistant_graph, ["GET"]),
        ("/assistants/{aid}/schemas", s.assistant_schemas, ["GET"]),
        ("/assistants/{aid}/subgraphs", s.assistant_subgraphs, ["GET"]),
        ("/assistants/{aid}/subgraphs/{sub:path}", s.assistant_subgraphs, ["GET"]),
        ("/threads", t.thread_create, ["POST"]), ("/threads/search", t.threads_search, ["POST"]),
        ("/threads/count", t.threads_count, ["POST"]), ("/threads/prune", t.threads_prune, ["POST"]),
        ("/threads/{tid}/copy", t.thread_copy, ["POST"]),
        ("/threads/{tid}/stream", thread_stream_route(a), ["GET"]),
        ("/threads/{tid}", t.thread_get, ["GET"]), ("/threads/{tid}", t.thread_patch, ["PATCH"]),
        ("/threads/{tid}", t.thread_delete, ["DELETE"]),
        ("/threads/{tid}/state", t.state_get, ["GET"]), ("/threads/{tid}/state", t.state_update, ["POST"]),
        ("/threads/{tid}/state/checkpoint", t.state_checkpoint, ["POST"]),
        ("/threads/{tid}/state/{cid}", t.state_at, ["GET"]),
        ("/threads/{tid}/history", t.history, ["POST"]),
        ("/threads/{tid}/runs", a.runs_create, ["POST"]), ("/threads/{tid}/runs", a.runs_list, ["GET"]),
        ("/threads/{tid}/runs/wait", a.runs_wait, ["POST"]), ("/threads/{tid}/runs/stream", a.runs_stream, ["POST"]),
        ("/runs", a.runs_create, ["POST"]), ("/runs/wait", a.runs_wait, ["POST"]),
        ("/runs/stream", a.runs_stream, ["POST"]), ("/runs/batch", batch_route(a), ["POST"]),
        ("/threads/{tid}/runs/{rid}", a.run_get, ["GET"]), ("/threads/{tid}/runs/{rid}", a.run_delete, ["DELETE"]),
        ("/threads/{tid}/runs/{rid}/join", a.run_join, ["GET"]),
        ("/threads/{tid}/runs/{rid}/stream", a.run_stream, ["GET"]),
        ("/threads/{tid}/runs/{rid}/cancel", a.run_cancel, ["POST"]),
        ("/store/items", st.put_item, ["PUT"]), ("/store/items", st.get_item, ["GET"]),
        ("/store/items", st.delete_item, ["DELETE"]), ("/store/items/search", st.search_items, ["POST"]),
        ("/store/namespaces", st.list_namespaces, ["POST"]),
        ("/threads/{tid}/runs/crons", c.create, ["POST"]), ("/runs/crons", c.create, ["POST"]),
        ("/runs/crons/search", c.search, ["POST"]), ("/runs/crons/count", c.count, ["POST"]),
        ("/runs/crons/{cid}", c.get, ["GET"]), ("/runs/crons/{cid}", c.patch, ["PATCH"]),
        ("/runs/crons/{cid}", c.delete, ["DELETE"]),
        ("/runs/{rid}/stream", a.run_stream, ["GET"]),  # after /runs/crons/{cid}: a cron named "stream" is one
    ]  # fmt: skip
    routes = [Route(path, guard(fn), methods=methods) for path, fn, methods in r]
    routes += [
        Route(path, guard(a.not_served), methods=["GET", "POST", "PUT", "PATCH", "DELETE"]) for path in NOT_SERVED
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return JSONResponse({"detail": getattr(exc, "detail", "not found")}, status_code=code)

    # Outside the routes, so a preflight (which carries no token: auth is a header) is answered before
    # the token is asked for. No credentials: the API's auth is a header, and the dashboard's cookie
    # is SameSite=Strict, for its own origin only.
    middleware = [
        Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "PUT", "PATCH",
                   "DELETE", "OPTIONS"], allow_headers=["*"],
                   expose_headers=list(CORS_EXPOSE_HEADERS), max_age=600)
    ] if cors_origins else []  # fmt: skip
    app = Starlette(routes=routes, lifespan=a.lifespan, middleware=middleware,
                    exception_handlers={404: not_found, 405: not_found})  # fmt: skip
    app.state.agentstate = a
    return app
