"""The assistants of ``agentstate serve``: one per served graph (LangGraph's ids: uuid5 of its name)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import _shapes as shapes
from ._http import page_of, read_body
from ._shapes import json_response as _json

if TYPE_CHECKING:
    from ._app import ServedGraph

__all__ = ["AssistantRoutes"]


class AssistantRoutes:
    """Search, count and get the assistants, and each one's graph, schemas and subgraphs."""

    def __init__(self, graphs: Mapping[str, ServedGraph], max_body: int) -> None:
        self.graphs, self.max_body = graphs, max_body
        self.by_assistant = {g.assistant_id: g for g in graphs.values()}
        self.started_ms = int(time.time() * 1000)

    def find(self, assistant: Any) -> ServedGraph:
        if isinstance(assistant, str):
            g = self.graphs.get(assistant) or self.by_assistant.get(assistant)
            if g is not None:
                return g
        raise HTTPException(404, f"no assistant {assistant!r} (served: {sorted(self.graphs)})")

    async def assistants_search(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        wanted = body.get("graph_id")
        out = [shapes.assistant(n, self.started_ms) for n in self.graphs if wanted in (None, n)]
        offset, limit = page_of(body)
        return JSONResponse(out[offset : offset + limit])

    async def assistants_count(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        wanted = body.get("graph_id")
        return JSONResponse(sum(1 for n in self.graphs if wanted in (None, n)))

    async def assistant_get(self, request: Request) -> Response:
        g = self.find(request.path_params["aid"])
        return JSONResponse(shapes.assistant(g.name, self.started_ms))

    async def assistant_graph(self, request: Request) -> Response:
        g = self.find(request.path_params["aid"])
        xray = request.query_params.get("xray", "false").lower() in ("1", "true")
        return _json(g.graph.get_graph(xray=xray).to_json())

    async def assistant_schemas(self, request: Request) -> Response:
        g = self.find(request.path_params["aid"])
        return _json({"graph_id": g.name, **_schemas(g.graph)})

    async def assistant_subgraphs(self, request: Request) -> Response:
        """The graph's subgraphs by namespace (``parent_node``, ``a|b`` when nested), each with its
        schemas, as LangGraph's server answers (``recurse``: subgraphs of subgraphs too;
        ``/subgraphs/{namespace}``: that one only)."""
        g = self.find(request.path_params["aid"])
        recurse = request.query_params.get("recurse", "false").lower() in ("1", "true")
        namespace = request.path_params.get("sub") or None
        found = {ns: _schemas(sub) for ns, sub in g.graph.get_subgraphs(namespace=namespace, recurse=recurse)}
        return _json(found)


def _schemas(graph: Any) -> dict[str, Any]:
    """A graph's JSON schemas; one LangGraph cannot build is null, as LangGraph's server answers it."""

    def schema(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:
            return None

    return {
        "input_schema": schema(lambda: graph.get_input_jsonschema()),
        "output_schema": schema(lambda: graph.get_output_jsonschema()),
        "state_schema": schema(lambda: graph.get_input_jsonschema()),
        "config_schema": None,
        "context_schema": schema(lambda: graph.get_context_jsonschema()),
    }
