"""The assistant routes of ``agentstate serve``: create, get, update (a new version), delete,
search, count, versions, ``latest``, and each one's graph, schemas and subgraphs, over the
registry in Redis (``_assistant_book.AssistantBook``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..kv import AsyncKeyValueStore
from ._assistant_book import AssistantBook, public
from ._http import read_body
from ._shapes import json_response as _json

if TYPE_CHECKING:
    from ._served import ServedGraph

__all__ = ["AssistantRoutes"]


class AssistantRoutes:
    """The assistant routes; ``resolve`` gives a run its graph and its assistant's settings."""

    def __init__(self, graphs: Mapping[str, ServedGraph], max_body: int, client: Any, namespace: str) -> None:
        self.graphs, self.max_body = graphs, max_body
        self.by_assistant = {g.assistant_id: g for g in graphs.values()}
        self.book = AssistantBook(AsyncKeyValueStore(client, namespace=f"{namespace}.assistants"), graphs)

    def find(self, assistant: Any) -> ServedGraph:
        """The served graph of a default assistant (its id, or the graph's name); ``resolve`` also
        knows the created ones."""
        if isinstance(assistant, str):
            g = self.graphs.get(assistant) or self.by_assistant.get(assistant)
            if g is not None:
                return g
        raise HTTPException(404, f"no assistant {assistant!r} (served: {sorted(self.graphs)})")

    async def resolve(self, body: Mapping[str, Any]) -> tuple[ServedGraph, dict[str, Any]]:
        """A run's graph and its body with its assistant's config and context applied (see
        ``AssistantBook.resolve``)."""
        return await self.book.resolve(body)

    async def _graph(self, request: Request) -> tuple[ServedGraph, Any]:
        """The served graph of the path's assistant, and the graph configured with its config."""
        rec = await self.book.get(request.path_params["aid"])
        g = self.graphs[rec["graph_id"]]
        return g, g.graph.with_config(rec["config"]) if rec["config"] else g.graph

    # ---- the registry ----------------------------------------------------------------------------

    async def assistant_create(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        return _json(public(await self.book.create(body)))

    async def assistants_search(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        found, total = await self.book.search(body)
        offset = body.get("offset") or 0
        headers = {"X-Pagination-Total": str(total)}
        if total > offset + len(found):
            headers["X-Pagination-Next"] = str(offset + len(found))
        return _json(found, headers=headers)

    async def assistants_count(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        return JSONResponse((await self.book.search(body, paged=False))[1])

    async def assistant_get(self, request: Request) -> Response:
        return _json(public(await self.book.get(request.path_params["aid"])))

    async def assistant_patch(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        return _json(public(await self.book.update(request.path_params["aid"], body)))

    async def assistant_delete(self, request: Request) -> Response:
        if request.query_params.get("delete_threads", "").lower() in ("1", "true"):
            # A thread's runs do not record their assistant here: refused, not ignored.
            raise HTTPException(422, "delete_threads is not supported by agentstate serve")
        await self.book.delete(request.path_params["aid"])
        return Response(status_code=204)

    async def assistant_versions(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        return _json(await self.book.versions(request.path_params["aid"], body))

    async def assistant_latest(self, request: Request) -> Response:
        body = await read_body(request, self.max_body)
        return _json(public(await self.book.set_latest(request.path_params["aid"], body)))

    # ---- the graph ---------------------------------------------------------------------------------

    async def assistant_graph(self, request: Request) -> Response:
        _, graph = await self._graph(request)
        xray = request.query_params.get("xray", "false").lower() in ("1", "true")
        return _json(graph.get_graph(xray=xray).to_json())

    async def assistant_schemas(self, request: Request) -> Response:
        g, graph = await self._graph(request)
        return _json({"graph_id": g.name, **_schemas(graph)})

    async def assistant_subgraphs(self, request: Request) -> Response:
        """The graph's subgraphs by namespace (``parent_node``, ``a|b`` when nested), each with its
        schemas, as LangGraph's server answers (``recurse``: subgraphs of subgraphs too;
        ``/subgraphs/{namespace}``: that one only)."""
        _, graph = await self._graph(request)
        recurse = request.query_params.get("recurse", "false").lower() in ("1", "true")
        namespace = request.path_params.get("sub") or None
        found = {ns: _schemas(sub) for ns, sub in graph.get_subgraphs(namespace=namespace, recurse=recurse)}
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
        "state_schema": schema(lambda: _state_schema(graph)),
        "config_schema": None,
        "context_schema": schema(lambda: graph.get_context_jsonschema()),
    }


def _state_schema(graph: Any) -> dict[str, Any]:
    """The graph's state: one property per channel it streams, typed by what the channel takes.

    Built channel by channel, as LangGraph's server builds it, so that one type pydantic cannot
    describe (a ``typing.TypedDict`` before Python 3.12, say) is ``Any`` rather than the whole
    schema null; the input schema, built from the state class at once, has no such fallback."""
    from pydantic import create_model

    fields: dict[str, Any] = {}
    for name in graph.stream_channels_list:
        kind = graph.channels[name].UpdateType
        try:
            create_model(name, value=(kind, None)).model_json_schema()
        except Exception:
            kind = Any
        fields[name] = (kind, None)
    schema: dict[str, Any] = create_model(graph.get_name("State"), **fields).model_json_schema()
    return schema
