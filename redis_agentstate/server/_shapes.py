"""The LangGraph server API's JSON shapes, built from ours: no I/O.

Assistants, threads, runs and thread states are the dicts ``langgraph_sdk.schema`` declares
(``Assistant``, ``Thread``, ``Run``, ``ThreadState``); events are server-sent events whose
``data`` is JSON and whose ``id`` is the run stream's entry id (what a client sends back as
``Last-Event-ID``).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from ..langgraph import Run

__all__ = [
    "assistant",
    "assistant_id",
    "checkpoint_json",
    "dumps",
    "iso",
    "json_response",
    "run_json",
    "sse",
    "state_json",
    "thread_interrupts",
    "thread_json",
]

#: Assistant ids of the graphs served, as LangGraph's server derives them (uuid5 of the graph name).
_ASSISTANT_NS = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


def assistant_id(graph_id: str) -> str:
    return str(uuid.uuid5(_ASSISTANT_NS, graph_id))


def iso(ms: int | float | None) -> str | None:
    """An ISO-8601 UTC time from epoch milliseconds."""
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


def _default(obj: Any) -> Any:
    """JSON for what graphs put in their state and events: messages (pydantic), dataclasses
    (``Interrupt``, ``Send``), sets, bytes, times; else its ``repr`` (an event is never dropped)."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump()
    to_json = getattr(obj, "to_json", None)
    if callable(to_json) and not isinstance(obj, type):
        return to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, (bytes, bytearray)):
        return base64.b64encode(bytes(obj)).decode()
    if isinstance(obj, (dt.datetime, dt.date)):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    return repr(obj)


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_default, ensure_ascii=False, separators=(",", ":"))


def json_response(data: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """``data`` as JSON by ``dumps`` (the API's datetimes, bytes and dataclasses)."""
    return Response(dumps(data), status_code=status_code, media_type="application/json", headers=headers)


def sse(event: str, data: Any, event_id: str | None = None) -> bytes:
    """One server-sent event: ``event:``, ``data:`` (JSON, one line) and ``id:`` when given."""
    head = f"event: {event}\n"
    if event_id is not None:
        head = f"id: {event_id}\n" + head
    return (head + f"data: {dumps(data)}\n\n").encode()


def assistant(graph_id: str, created_ms: int) -> dict[str, Any]:
    when = iso(created_ms)
    return {
        "assistant_id": assistant_id(graph_id),
        "graph_id": graph_id,
        "name": graph_id,
        "description": None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": when,
        "updated_at": when,
    }


def thread_json(record: Mapping[str, Any], status: str, values: Any = None,
                interrupts: Mapping[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "thread_id": record["thread_id"],
        "created_at": iso(record["created_ms"]),
        "updated_at": iso(record.get("updated_ms", record["created_ms"])),
        "metadata": record.get("metadata") or {},
        "status": status,
        "values": values,
        "interrupts": dict(interrupts or {}),
    }


def thread_interrupts(snapshot: Any) -> dict[str, list[dict[str, Any]]]:
    """A ``Thread``'s ``interrupts``: the pending ones by the id of the task that raised them, as
    LangGraph's server lists them (a task without any is left out)."""
    return {t.id: [_interrupt(i) for i in t.interrupts] for t in snapshot.tasks if t.interrupts}


def run_json(run: Run, assistant: str | None) -> dict[str, Any]:
    meta = dict(run.metadata)
    return {
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "assistant_id": meta.get("assistant_id") or assistant,  # the run's assistant: a created one too
        "created_at": iso(run.created_at_ms),
        "updated_at": iso(run.updated_at_ms),
        "status": run.status,
        "metadata": meta,
        "multitask_strategy": run.multitask_strategy,
        "kwargs": {"input": run.input, "command": run.command, "config": run.config, "stream_mode": run.stream_mode},
    }


def checkpoint_json(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A ``Checkpoint`` of LangGraph's server from a config: none without a thread and checkpoint
    id; ``checkpoint_ns`` and ``checkpoint_map`` only when the config has them (front ends send a
    state's checkpoint back as a run's ``checkpoint``, as they got it)."""
    conf = (config or {}).get("configurable") or {}
    if not conf.get("thread_id") or not conf.get("checkpoint_id"):
        return None
    out = {"checkpoint_id": conf["checkpoint_id"], "thread_id": conf["thread_id"]}
    if "checkpoint_ns" in conf:
        out["checkpoint_ns"] = conf["checkpoint_ns"] or ""
    if "checkpoint_map" in conf:
        out["checkpoint_map"] = conf["checkpoint_map"]
    return out


def _interrupt(i: Any) -> dict[str, Any]:
    return {"value": getattr(i, "value", i), "id": getattr(i, "id", None)}


def state_json(snapshot: Any) -> dict[str, Any]:
    """A ``ThreadState`` from LangGraph's ``StateSnapshot``."""
    tasks = [
        {
            "id": t.id,
            "name": t.name,
            "path": list(t.path) if getattr(t, "path", None) else [],
            "error": None if t.error is None else str(t.error),
            "interrupts": [_interrupt(i) for i in t.interrupts],
            "checkpoint": None,
            "state": None,
            "result": getattr(t, "result", None),
        }
        for t in snapshot.tasks
    ]
    checkpoint, parent = checkpoint_json(snapshot.config), checkpoint_json(snapshot.parent_config)
    return {
        "values": snapshot.values,
        "next": list(snapshot.next),
        "checkpoint": checkpoint,
        "metadata": snapshot.metadata,
        "created_at": snapshot.created_at,
        "parent_checkpoint": parent,
        "tasks": tasks,
        "interrupts": [_interrupt(i) for i in getattr(snapshot, "interrupts", ())],
        # LangGraph's server still sends the ids on their own (clients of older SDKs read them).
        "checkpoint_id": checkpoint and checkpoint["checkpoint_id"],
        "parent_checkpoint_id": parent and parent["checkpoint_id"],
    }
