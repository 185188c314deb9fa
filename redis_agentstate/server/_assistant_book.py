"""The assistants of ``agentstate serve``, kept in Redis: each served graph's default one (LangGraph's
id: uuid5 of the graph's name), and those clients create, each with its versions.

Each assistant is one JSON record in an
``AsyncKeyValueStore`` of ``<namespace>.assistants``, under its id: the current assistant and
every version of it. Every write is a compare-and-set of that record (``KeyValueStore.swap``,
``lua/kv_swap.lua``): read, compute, write if nobody wrote in between, else read again. So two
servers on one Redis see the same assistants, and a version is never lost to a concurrent update.
A served graph's default assistant is stored when a server serving the graph first reads it (so
every server shows the same one, with the same ``created_at``). Assistants of a graph this server
does not serve are hidden from it (404, left out of searches), as LangGraph's server scopes them.

Input is checked here before anything is written: a bad field is a 422 naming it; an unknown
assistant or graph a 404, as ``langgraph dev`` answers.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException

from . import _shapes as shapes

if TYPE_CHECKING:
    from ..kv import AsyncKeyValueStore
    from ._served import ServedGraph

__all__ = ["FIELDS", "AssistantBook", "contains"]

#: The fields of an assistant (what ``select`` may name), as LangGraph's server lists them.
FIELDS = ("assistant_id", "graph_id", "name", "description", "config", "context", "created_at",
          "updated_at", "metadata", "version")  # fmt: skip
_SORTS = ("assistant_id", "created_at", "updated_at", "name", "graph_id")
#: Compare-and-set rounds a write tries before answering 409 (each lost one means another writer won).
_ROUNDS = 50
#: Versions kept per assistant at most (the record holds them all; the oldest go first).
MAX_VERSIONS = 1000
#: Assistants a search or count reads at most (the registry is configuration: a few per graph).
SCAN = 10_000
_CONFIG_KEYS = {"tags": list, "recursion_limit": int, "configurable": dict}


def contains(superset: Any, subset: Any) -> bool:
    """Postgres' ``@>`` on JSON, as LangGraph's servers filter metadata: every key of ``subset``
    is in ``superset`` with a value that contains it (equal, for anything but an object)."""
    if isinstance(subset, dict):
        return isinstance(superset, dict) and all(k in superset and contains(superset[k], v)
                                                  for k, v in subset.items())  # fmt: skip
    return bool(superset == subset)


def _object(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    v = body.get(name)
    if v is not None and not isinstance(v, dict):
        raise HTTPException(422, f"{name} must be an object")
    return v


def _string(body: Mapping[str, Any], name: str, nullable: bool = False) -> str | None:
    v = body.get(name)
    if v is None or isinstance(v, str):
        if v is None and name in body and not nullable:
            raise HTTPException(422, f"{name} must be a string")
        return v
    raise HTTPException(422, f"{name} must be a string{' or null' if nullable else ''}")


def _config(body: Mapping[str, Any]) -> dict[str, Any] | None:
    config = _object(body, "config")
    for k, kind in _CONFIG_KEYS.items():
        v = (config or {}).get(k)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            raise HTTPException(422, f"config.{k} must be {'an integer' if kind is int else 'an ' + kind.__name__}")
    if config and "tags" in config and not all(isinstance(t, str) for t in config["tags"]):
        raise HTTPException(422, "config.tags must be a list of strings")
    return config


def _int(body: Mapping[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if v is None:
        v = default
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise HTTPException(422, f"{name} must be an int in [{lo}, {hi}]")
    return v


def _settings(config: dict[str, Any] | None, context: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config, context)`` kept in step, as LangGraph's server keeps them: the context is the
    config's ``configurable``; both given is LangGraph's 400."""
    config = dict(config or {})
    if config.get("configurable") and context:
        raise HTTPException(400, "Cannot specify both configurable and context. Prefer setting context alone. "
                            "Context was introduced in LangGraph 0.6.0 and is the long term planned replacement "
                            "for configurable.")  # fmt: skip
    if config.get("configurable"):
        context = dict(config["configurable"])
    elif context:
        config["configurable"] = dict(context)
    return config, dict(context or {})


def public(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The API's ``Assistant`` of a record."""
    return {
        "assistant_id": rec["assistant_id"],
        "graph_id": rec["graph_id"],
        "config": rec["config"],
        "context": rec["context"],
        "metadata": rec["metadata"],
        "name": rec["name"],
        "description": rec.get("description"),
        "version": rec["version"],
        "created_at": shapes.iso(rec["created_ms"]),
        "updated_at": shapes.iso(rec["updated_ms"]),
    }


def _version_json(aid: str, v: Mapping[str, Any]) -> dict[str, Any]:
    return {"assistant_id": aid, "version": v["version"], "graph_id": v["graph_id"], "config": v["config"],
            "context": v["context"], "metadata": v["metadata"], "created_at": shapes.iso(v["created_ms"]),
            "name": v["name"], "description": v.get("description")}  # fmt: skip


def _version_of(rec: Mapping[str, Any], ms: int) -> dict[str, Any]:
    keys = ("version", "graph_id", "config", "context", "metadata", "name", "description")
    return {**{k: rec.get(k) for k in keys}, "created_ms": ms}


class AssistantBook:
    """The registry: reads, the writes (each a compare-and-set loop) and a run's assistant."""

    def __init__(self, kv: AsyncKeyValueStore, graphs: Mapping[str, ServedGraph]) -> None:
        self.kv, self.graphs = kv, graphs
        #: When this server started: a default assistant it stores was created then, as LangGraph's
        #: server creates them at its start.
        self.started_ms = int(time.time() * 1000)
        self.defaults = {g.assistant_id: g for g in graphs.values()}

    # ---- reading -------------------------------------------------------------------------------

    def default(self, g: ServedGraph) -> dict[str, Any]:
        """A served graph's default assistant as it is first stored (version 1)."""
        ms = self.started_ms
        rec: dict[str, Any] = {"assistant_id": g.assistant_id, "graph_id": g.name, "config": {}, "context": {},
               "metadata": {"created_by": "system"}, "name": g.name, "description": None, "version": 1,
               "created_ms": ms, "updated_ms": ms}  # fmt: skip
        rec["versions"] = [_version_of(rec, ms)]
        return rec

    def assistant_id(self, aid: Any) -> str:
        """The id an assistant is stored under: a served graph's name stands for its default one."""
        if not isinstance(aid, str) or not aid:
            raise HTTPException(422, "assistant_id must be a string (an assistant's id or a served graph's name)")
        g = self.graphs.get(aid)
        return g.assistant_id if g is not None else aid

    async def _read(self, aid: str) -> tuple[bytes | None, dict[str, Any] | None]:
        """The stored bytes of ``aid`` and its record (None, None when there is none). A served
        graph's default assistant is stored the first time it is read (the first server to read
        it writes it, compare-and-set), so every server, and this one after a restart, shows the
        same one."""
        raw = await self.kv.get(aid)
        g = self.defaults.get(aid)
        if raw is None and g is not None:
            rec = self.default(g)
            data = shapes.dumps(rec).encode()
            if await self.kv.swap(aid, None, data):
                return data, rec
            raw = await self.kv.get(aid)  # another server stored it first
        return (None, None) if raw is None else (raw, dict(json.loads(raw)))

    async def get(self, aid_or_graph: Any) -> dict[str, Any]:
        """The record of an assistant this server serves (its graph is served), else 404."""
        aid = self.assistant_id(aid_or_graph)
        _, rec = await self._read(aid)
        if rec is None or rec["graph_id"] not in self.graphs:
            raise HTTPException(404, f"Assistant {aid_or_graph} not found")
        return rec

    async def every(self) -> list[dict[str, Any]]:
        """Every assistant this server serves (its own defaults stored first if they are not yet)."""
        found: dict[str, dict[str, Any]] = {}
        after: str | None = None
        while len(found) < SCAN:
            page, after = await self.kv.keys_page(after, limit=100)
            for raw in await self.kv.get_many(page) if page else []:
                if raw is not None:
                    rec = dict(json.loads(raw))
                    found[rec["assistant_id"]] = rec
            if after is None:
                break
        for aid in self.defaults:
            if aid not in found:
                _, default = await self._read(aid)
                if default is not None:
                    found[aid] = default
        return [r for r in found.values() if r["graph_id"] in self.graphs]

    async def search(self, body: Mapping[str, Any], paged: bool = True) -> tuple[list[dict[str, Any]], int]:
        """The assistants ``body`` filters (``graph_id``, ``name`` substring, ``metadata``), sorted and
        paged as LangGraph's server does, and how many matched."""
        graph_id, name = _string(body, "graph_id"), _string(body, "name")
        meta = _object(body, "metadata") or {}
        if graph_id is not None and graph_id not in self.graphs:
            raise HTTPException(404, f"Graph '{graph_id}' not found. Expected one of: {sorted(self.graphs)}")
        limit, offset = _int(body, "limit", 10, 1, 1000), _int(body, "offset", 0, 0, 1_000_000)
        sort_by, order = body.get("sort_by"), body.get("sort_order")
        if sort_by is not None and sort_by not in _SORTS:
            raise HTTPException(422, f"sort_by must be one of {', '.join(_SORTS)}")
        if order is not None and order not in ("asc", "desc"):
            raise HTTPException(422, "sort_order must be 'asc' or 'desc'")
        select = body.get("select")
        if select is not None and (not isinstance(select, list) or any(f not in FIELDS for f in select)):
            raise HTTPException(422, f"select must be a list of fields among {', '.join(FIELDS)}")
        out = [
            r for r in await self.every()
            if graph_id in (None, r["graph_id"]) and (not name or name.lower() in r["name"].lower())
            and contains(r["metadata"], meta)
        ]  # fmt: skip
        field = {"created_at": "created_ms", "updated_at": "updated_ms"}.get(sort_by or "created_at", sort_by or "")
        if field in ("name", "graph_id"):
            out.sort(key=lambda r: str(r[field]).lower(), reverse=order != "asc")
        else:
            out.sort(key=lambda r: (r[field], r["assistant_id"]), reverse=order != "asc")
        total = len(out)
        if paged:
            out = out[offset : offset + limit]
        shown = [public(r) for r in out]
        if select:
            shown = [{k: a[k] for k in select} for a in shown]
        return shown, total

    async def versions(self, aid: str, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        rec = await self.get(aid)
        meta = _object(body, "metadata") or {}
        limit, offset = _int(body, "limit", 10, 1, 1000), _int(body, "offset", 0, 0, 1_000_000)
        found = [v for v in rec["versions"] if contains(v["metadata"], meta)]
        found.sort(key=lambda v: v["version"], reverse=True)
        return [_version_json(rec["assistant_id"], v) for v in found[offset : offset + limit]]

    # ---- writing ----------------------------------------------------------------------------------

    async def _swap(self, aid: str, old: bytes | None, rec: Mapping[str, Any]) -> bool:
        return await self.kv.swap(aid, old, shapes.dumps(rec).encode())

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        graph_id = body.get("graph_id")
        if not isinstance(graph_id, str):
            raise HTTPException(422, "graph_id is required: the name of a served graph")
        aid = body.get("assistant_id") or str(uuid.uuid4())
        try:
            uuid.UUID(str(aid))
        except ValueError:
            raise HTTPException(422, "Invalid assistant ID: must be a UUID") from None
        aid = str(aid)
        if_exists = body.get("if_exists") or "raise"
        if if_exists not in ("raise", "do_nothing"):
            raise HTTPException(422, "if_exists must be 'raise' or 'do_nothing'")
        config, context = _settings(_config(body), _object(body, "context"))
        meta = _object(body, "metadata") or {}
        name = _string(body, "name") or "Untitled"
        description = _string(body, "description", nullable=True)
        if graph_id not in self.graphs:
            raise HTTPException(404, f"Graph '{graph_id}' not found. Expected one of: {sorted(self.graphs)}")
        for _ in range(_ROUNDS):
            raw, found = await self._read(aid)
            if found is not None:
                if if_exists == "do_nothing":
                    return found
                raise HTTPException(409, f"Assistant {aid} already exists")
            now = int(time.time() * 1000)
            rec: dict[str, Any] = {"assistant_id": aid, "graph_id": graph_id, "config": config, "context": context,
                   "metadata": meta, "name": name, "description": description, "version": 1,
                   "created_ms": now, "updated_ms": now}  # fmt: skip
            rec["versions"] = [_version_of(rec, now)]
            if await self._swap(aid, raw, rec):
                return rec
        raise HTTPException(409, f"assistant {aid} is being written by others: try again")

    async def update(self, aid_or_graph: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A new version from ``body`` (unset fields kept, ``metadata`` merged), made the current one."""
        graph_id = _string(body, "graph_id")
        config_in, context_in = _config(body), _object(body, "context")
        config, context = _settings(config_in, context_in)
        given_configurable = bool((config_in or {}).get("configurable"))
        meta = _object(body, "metadata") or {}
        name, description = _string(body, "name"), _string(body, "description", nullable=True)
        if graph_id is not None and graph_id not in self.graphs:
            raise HTTPException(404, f"Graph '{graph_id}' not found. Expected one of: {sorted(self.graphs)}")
        aid = self.assistant_id(aid_or_graph)
        for _ in range(_ROUNDS):
            raw, rec = await self._read(aid)
            if rec is None or rec["graph_id"] not in self.graphs:
                raise HTTPException(404, f"Assistant {aid} not found")
            now = int(time.time() * 1000)
            new = {
                **rec,
                "graph_id": graph_id or rec["graph_id"],
                "config": config if config else rec["config"],
                # As LangGraph's server: the context given (or the config's configurable), else the old one.
                "context": context if context_in is not None or given_configurable else rec["context"],
                "metadata": {**rec["metadata"], **meta},
                "name": name if name is not None else rec["name"],
                "description": description if description is not None else rec.get("description"),
                "version": max(v["version"] for v in rec["versions"]) + 1,
                "updated_ms": now,
            }
            new["versions"] = [*rec["versions"], _version_of(new, now)][-MAX_VERSIONS:]
            if await self._swap(aid, raw, new):
                return new
        raise HTTPException(409, f"assistant {aid} is being written by others: try again")

    async def set_latest(self, aid_or_graph: str, body: Mapping[str, Any]) -> dict[str, Any]:
        version = body.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise HTTPException(422, "version must be an integer")
        aid = self.assistant_id(aid_or_graph)
        for _ in range(_ROUNDS):
            raw, rec = await self._read(aid)
            if rec is None or rec["graph_id"] not in self.graphs:
                raise HTTPException(404, f"Assistant {aid} not found")
            at = next((v for v in rec["versions"] if v["version"] == version), None)
            if at is None:
                raise HTTPException(404, f"Version {version} not found for assistant {aid}")
            if at["graph_id"] not in self.graphs:
                raise HTTPException(409, f"version {version} runs graph {at['graph_id']!r}, not served here")
            keep = ("graph_id", "config", "context", "metadata", "name", "description", "version")
            new = {**rec, **{k: at.get(k) for k in keep}, "updated_ms": int(time.time() * 1000)}
            if await self._swap(aid, raw, new):
                return new
        raise HTTPException(409, f"assistant {aid} is being written by others: try again")

    async def delete(self, aid_or_graph: str) -> None:
        aid = self.assistant_id(aid_or_graph)
        rec = await self.get(aid)
        if aid in self.defaults:
            raise HTTPException(409, f"assistant {aid} is the default one of served graph {rec['graph_id']!r}: "
                                "it is not deleted (update it instead)")  # fmt: skip
        await self.kv.delete(aid)

    # ---- runs -------------------------------------------------------------------------------------

    async def resolve(self, body: Mapping[str, Any]) -> tuple[ServedGraph, dict[str, Any]]:
        """The served graph a run's ``assistant_id`` names (an assistant's id, or a graph's name) and
        the run's body with the assistant's settings applied under the run's own, as LangGraph's
        server merges them: ``config`` (its ``configurable`` key by key), ``context``, ``metadata``;
        ``assistant_id`` becomes the assistant's id. 404 for an assistant this server does not serve,
        422 for an id that is neither a UUID nor a served graph's name (as LangGraph's server answers)."""
        aid = body.get("assistant_id")
        if isinstance(aid, str) and aid not in self.graphs:
            try:
                uuid.UUID(aid)
            except ValueError:
                raise HTTPException(422, f"Invalid assistant: {aid!r}. Must be either a valid assistant UUID, or "
                                    f"one of the served graphs: {sorted(self.graphs)}") from None  # fmt: skip
        rec = await self.get(aid)
        out = dict(body)
        config = body.get("config")
        if config is not None and not isinstance(config, dict):
            raise HTTPException(422, "config must be an object")
        context = body.get("context")
        if context is not None and not isinstance(context, dict):
            raise HTTPException(422, "context must be an object")
        config = config or {}
        merged = {**rec["config"], **config}
        # The run's context over the assistant's (which is also its configurable), the run's
        # configurable over both.
        conf = {**(rec["config"].get("configurable") or {}), **(context or {}), **(config.get("configurable") or {})}
        if conf:
            merged["configurable"] = conf
        if merged:
            out["config"] = merged
        if rec["context"] or context:
            out["context"] = {**rec["context"], **(context or {})}
        out["assistant_id"] = rec["assistant_id"]
        return self.graphs[rec["graph_id"]], out
