"""What the server's routes share: the served graphs, the thread records, the run options, and
``App``, what a route module asks of the app (``_app.py`` builds it; a protocol here, so no route
module imports the app that mounts it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..kv import AsyncKeyValueStore
from ..langgraph import AsyncAgentStateSaver, AsyncRunQueue, GraphWorker, Run
from . import _shapes as shapes

if TYPE_CHECKING:
    from ._auth import Sessions
    from ._feeds import RunFeeds

__all__ = ["App", "Assistants", "RunOptions", "ServedGraph", "ThreadBook"]


@dataclass(frozen=True)
class RunOptions:
    """What ``agentstate serve`` lets runs do beyond the defaults.

    ``webhook_allow_private``: webhooks may go to loopback, private and link-local addresses (refused
    by default, LangChain's SSRF guard). ``tenant_key`` / ``tenant_limit``: a run whose
    ``metadata[tenant_key]`` is set runs its thread under the concurrency key of that value, at most
    ``tenant_limit`` of a tenant's threads running at once fleet-wide (``--tenant-limit KEY=N``)."""

    webhook_allow_private: bool = False
    tenant_key: str | None = None
    tenant_limit: int | None = None


@dataclass
class ServedGraph:
    """One graph the app serves: its queue and saver (namespace ``<namespace>.<name>``)."""

    name: str
    graph: Any
    queue: AsyncRunQueue
    saver: AsyncAgentStateSaver
    stateful: Any = None
    workers: list[GraphWorker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stateful = self.graph.copy(update={"checkpointer": self.saver})
        self.assistant_id = shapes.assistant_id(self.name)


class ThreadBook:
    """The served threads' records (a ``KeyValueStore`` of ``<namespace>.threads``, one JSON record
    each) and what a thread's graph says about it: its status, values and runs."""

    def __init__(self, kv: AsyncKeyValueStore, graphs: Mapping[str, ServedGraph]) -> None:
        self.kv, self.graphs = kv, graphs

    async def record(self, thread_id: str) -> dict[str, Any] | None:
        raw = await self.kv.get(thread_id)
        return None if raw is None else dict(json.loads(raw))

    async def need_record(self, thread_id: str) -> dict[str, Any]:
        rec = await self.record(thread_id)
        if rec is None:
            raise HTTPException(404, f"no thread {thread_id!r}")
        return rec

    async def save(self, rec: dict[str, Any]) -> None:
        rec["updated_ms"] = int(time.time() * 1000)
        await self.kv.set(rec["thread_id"], shapes.dumps(rec).encode())

    async def touch(self, thread_id: str, raw: bytes) -> None:
        """The thread updated now (a run on it), as LangGraph's server marks it: thread lists are
        newest first. A compare-and-set on the record read as ``raw``: if another request rewrote it
        meanwhile, that write set ``updated_ms`` itself, and a deleted thread stays deleted."""
        rec = dict(json.loads(raw))
        rec["updated_ms"] = int(time.time() * 1000)
        await self.kv.swap(thread_id, raw, shapes.dumps(rec).encode())

    def graph_of(self, rec: Mapping[str, Any]) -> ServedGraph | None:
        name = (rec.get("metadata") or {}).get("graph_id")
        return self.graphs.get(name) if isinstance(name, str) else None

    async def status(self, rec: Mapping[str, Any], snap: Any = None) -> str:
        g = self.graph_of(rec)
        if g is None:
            return "idle"
        runs = await g.queue.list(rec["thread_id"], limit=1)
        if runs and runs[0].status in ("pending", "running"):
            return "busy"
        if runs and runs[0].status == "error":
            return "error"
        if snap is None:
            snap = await g.stateful.aget_state({"configurable": {"thread_id": rec["thread_id"]}})
        # As LangGraph's server: a thread whose head has nodes to run next (an interrupt(), or a stop
        # before / after a node) is interrupted.
        return "interrupted" if getattr(snap, "interrupts", ()) or getattr(snap, "next", ()) else "idle"

    async def out(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        g = self.graph_of(rec)
        if g is None:
            return shapes.thread_json(rec, "idle")
        snap = await g.stateful.aget_state({"configurable": {"thread_id": rec["thread_id"]}})
        return shapes.thread_json(rec, await self.status(rec, snap), snap.values, shapes.thread_interrupts(snap))

    async def run_of(self, thread_id: str, run_id: str) -> tuple[ServedGraph, Run]:
        rec = await self.need_record(thread_id)
        g = self.graph_of(rec)
        run = None if g is None else await g.queue.get(run_id)
        if g is None or run is None or run.thread_id != thread_id:
            raise HTTPException(404, f"no run {run_id!r} in thread {thread_id!r}")
        return g, run


class Assistants(Protocol):
    """What the routes use of the app's assistants (``_assistants.AssistantRoutes``)."""

    async def resolve(self, body: Mapping[str, Any]) -> tuple[ServedGraph, dict[str, Any]]: ...


class App(Protocol):
    """What the route modules use of the app (``_app._App``)."""

    @property
    def client(self) -> Any: ...

    @property
    def token(self) -> str | None: ...

    @property
    def max_body(self) -> int: ...

    @property
    def sessions(self) -> Sessions | None: ...

    @property
    def graphs(self) -> dict[str, ServedGraph]: ...

    @property
    def assistants(self) -> Assistants: ...

    @property
    def book(self) -> ThreadBook: ...

    @property
    def streams(self) -> asyncio.Semaphore: ...

    @property
    def feeds(self) -> RunFeeds: ...

    def session_of(self, request: Request) -> str | None: ...

    async def run_options(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def _create(
        self, tid: str | None, body: Mapping[str, Any], run_id: str | None = None, drop_thread: bool | None = None
    ) -> tuple[ServedGraph, Run, bool]: ...

    async def _join(self, g: ServedGraph, run_id: str) -> Run: ...

    async def _drop_thread(self, g: ServedGraph, tid: str) -> None: ...
