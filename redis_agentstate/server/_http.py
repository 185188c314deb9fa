"""Reading a request of ``agentstate serve``: its body, bounded."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

__all__ = ["page_of", "read_body", "read_json"]


async def read_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read up to ``limit`` bytes (413 past it, 422 when it is not one)."""
    data = await read_json(request, limit)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HTTPException(422, "request body must be a JSON object")
    return data


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON, read up to ``limit`` bytes (413 past it, 422 when it is not JSON); None
    for an empty body."""
    size = 0
    chunks = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"request body over {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise HTTPException(422, f"request body is not JSON: {exc}") from exc


def page_of(body: Mapping[str, Any]) -> tuple[int, int]:
    """``(offset, limit)`` of a search body (LangGraph's defaults 0 and 10); 422 out of bounds."""
    limit, offset = body.get("limit", 10), body.get("offset", 0)
    for name, v, hi in (("limit", limit, 1000), ("offset", offset, 100_000)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > hi:
            raise HTTPException(422, f"{name} must be an int in [0, {hi}]")
    return offset, limit
