"""``POST /runs/batch`` of ``agentstate serve``: stateless background runs, several in one request,
as LangGraph's server creates them (``runs.create_batch``): each one as ``POST /runs`` creates it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from . import _shapes as shapes
from ._http import read_json

if TYPE_CHECKING:
    from ._served import App

__all__ = ["MAX_BATCH", "batch_route", "runs_batch"]

#: Runs one batch creates at most.
MAX_BATCH = 100


async def runs_batch(app: App, request: Request) -> Response:
    """The runs of a JSON array of stateless run payloads, in its order. Every payload is checked
    (an object, whose assistant this server serves, without a ``thread_id``) before the first
    run is created: a bad one is a 422 (an unknown assistant a 404) saying which, and nothing is
    created."""
    payloads = await read_json(request, app.max_body)
    if not isinstance(payloads, list) or not 1 <= len(payloads) <= MAX_BATCH:
        raise HTTPException(422, f"the body must be a JSON array of 1 to {MAX_BATCH} run payloads")
    for i, payload in enumerate(payloads):
        if not isinstance(payload, dict):
            raise HTTPException(422, f"payload {i} must be an object")
        if payload.get("thread_id") is not None:
            raise HTTPException(422, f"payload {i}: a batch's runs are stateless (no thread_id)")
        try:
            await app.assistants.resolve(payload)
        except HTTPException as exc:
            raise HTTPException(exc.status_code, f"payload {i}: {exc.detail}") from exc
    out: list[dict[str, Any]] = []
    for payload in payloads:
        g, run, _ = await app._create(None, payload)
        out.append(shapes.run_json(run, g.assistant_id))
    return shapes.json_response(out)


def batch_route(app: App) -> Callable[[Request], Awaitable[Response]]:
    """The route's handler, on ``app``."""

    async def handler(request: Request) -> Response:
        return await runs_batch(app, request)

    return handler
