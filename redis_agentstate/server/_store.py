"""The store routes of ``agentstate serve`` (``/store/items``, ``/store/items/search``,
``/store/namespaces``): LangGraph server's shapes over an ``AsyncAgentStateStore``.

The served graphs' workers are given the same store, so what a client puts a node reads through
``get_store()``, and what a node writes a client reads. Input is checked here, before the store is
called: a bad namespace, key, value or page is a 422 that says which field is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..langgraph import AsyncAgentStateStore
from ._http import read_body
from ._shapes import json_response as _json

__all__ = ["StoreRoutes"]


def _namespace(value: Any, what: str, *, empty: bool = False) -> tuple[str, ...]:
    """A namespace given as a list of labels; LangGraph's server refuses a label that is empty or
    holds a period (its GET carries the namespace joined by periods)."""
    if not isinstance(value, list):
        raise HTTPException(422, f"{what} must be a list of labels")
    for label in value:
        if not isinstance(label, str) or not label or "." in label:
            raise HTTPException(422, f"{what} label {label!r} must be a non-empty string without periods")
    if not value and not empty:
        raise HTTPException(422, f"{what} must have at least one label")
    return tuple(value)


def _key(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise HTTPException(422, "key must be a non-empty string")
    return value


def _int(body: Mapping[str, Any], name: str, default: int, hi: int) -> int:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= hi:
        raise HTTPException(422, f"{name} must be an int in [0, {hi}]")
    return v


def _flag(value: Any, what: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise HTTPException(422, f"{what} must be true, false or null")
    return value


class StoreRoutes:
    """Put, get, delete and search items, and list namespaces, on ``store``."""

    def __init__(self, store: AsyncAgentStateStore, max_body: int) -> None:
        self.store, self.max_body = store, max_body

    async def put_item(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        namespace = _namespace(body.get("namespace"), "namespace")
        key = _key(body.get("key"))
        value = body.get("value")
        if not isinstance(value, dict):
            raise HTTPException(422, "value must be an object")
        index = body.get("index")
        if not (
            index is None or index is False or (isinstance(index, list) and all(isinstance(f, str) for f in index))
        ):
            raise HTTPException(422, "index must be false, null or a list of field paths")
        ttl = body.get("ttl")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0):
            raise HTTPException(422, "ttl must be a positive number of minutes or null")
        await self.store.aput(namespace, key, value, index=index, ttl=ttl)
        return Response(status_code=204)

    async def get_item(self, request: Request) -> Response:
        params = request.query_params
        # The client joins the labels with periods (a label may hold none).
        namespace = _namespace(params.get("namespace", "").split("."), "namespace")
        key = _key(params.get("key"))
        raw = params.get("refresh_ttl")
        if raw is not None and raw.lower() not in ("true", "false"):
            raise HTTPException(422, "refresh_ttl must be true or false")
        item = await self.store.aget(namespace, key, refresh_ttl=None if raw is None else raw.lower() == "true")
        return _json(None if item is None else item.dict())

    async def delete_item(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        namespace = _namespace(body.get("namespace"), "namespace")
        await self.store.adelete(namespace, _key(body.get("key")))
        return Response(status_code=204)

    async def search_items(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        prefix = _namespace(body.get("namespace_prefix", []), "namespace_prefix", empty=True)
        flt = body.get("filter")
        if flt is not None and not isinstance(flt, dict):
            raise HTTPException(422, "filter must be an object")
        query = body.get("query")
        if query is not None and not isinstance(query, str):
            raise HTTPException(422, "query must be a string")
        items = await self.store.asearch(
            prefix,
            filter=flt or None,
            limit=_int(body, "limit", 10, 1000),
            offset=_int(body, "offset", 0, 100_000),
            query=query or None,
            refresh_ttl=_flag(body.get("refresh_ttl"), "refresh_ttl"),
        )
        return _json({"items": [item.dict() for item in items]})

    async def list_namespaces(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        prefix, suffix = body.get("prefix"), body.get("suffix")
        depth = body.get("max_depth")
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise HTTPException(422, "max_depth must be a positive int or null")
        found = await self.store.alist_namespaces(
            prefix=_namespace(prefix, "prefix") if prefix else None,
            suffix=_namespace(suffix, "suffix") if suffix else None,
            max_depth=depth,
            limit=_int(body, "limit", 100, 1000),
            offset=_int(body, "offset", 0, 100_000),
        )
        return _json({"namespaces": [list(ns) for ns in found]})
