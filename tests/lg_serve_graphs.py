"""Graphs for ``tests/test_serve_runs_fixes.py``, importable as MODULE:ATTR by ``agentstate serve``
and ``agentstate langgraph worker``.

``long_sync`` / ``long_async``: ``a`` then ``long``, which sleeps ``configurable["sleep"]`` seconds
(``LONG_S`` by default; ``time.sleep`` / ``asyncio.sleep``) and appends ``long``. ``EVENTS`` records,
per thread, what the async node went through (``started``, ``cancelled``, ``ended``), for a test
running the app in its own process.
``parent``: a node ``child`` that is a subgraph (``x`` writing a custom event, then ``y``).
``quick_async``: one async node appending ``q``.
"""

from __future__ import annotations

import asyncio
import operator
import time
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import StreamWriter

LONG_S = 3.0
#: thread id -> what the async long node went through, in order.
EVENTS: dict[str, list[str]] = {}


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _a(state: State) -> dict[str, Any]:
    return {"log": ["a"]}


def _sleep_of(config: RunnableConfig) -> float:
    return float((config.get("configurable") or {}).get("sleep", LONG_S))


def _long_sync(state: State, config: RunnableConfig) -> dict[str, Any]:
    EVENTS.setdefault(config["configurable"]["thread_id"], []).append("started")
    time.sleep(_sleep_of(config))
    EVENTS[config["configurable"]["thread_id"]].append("ended")
    return {"log": ["long"]}


async def _long_async(state: State, config: RunnableConfig) -> dict[str, Any]:
    seen = EVENTS.setdefault(config["configurable"]["thread_id"], [])
    seen.append("started")
    try:
        await asyncio.sleep(_sleep_of(config))
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    seen.append("ended")
    return {"log": ["long"]}


def _two(node: Any) -> Any:
    b = StateGraph(State)
    b.add_node("a", _a)
    b.add_node("long", node)
    b.add_edge(START, "a")
    b.add_edge("a", "long")
    b.add_edge("long", END)
    return b.compile()


long_sync = _two(_long_sync)
long_async = _two(_long_async)


def _x(state: State, writer: StreamWriter) -> dict[str, Any]:
    writer({"in": "x"})
    return {"log": ["x"]}


def _y(state: State) -> dict[str, Any]:
    return {"log": ["y"]}


def _parent() -> Any:
    c = StateGraph(State)
    c.add_node("x", _x)
    c.add_node("y", _y)
    c.add_edge(START, "x")
    c.add_edge("x", "y")
    c.add_edge("y", END)
    p = StateGraph(State)
    p.add_node("child", c.compile())
    p.add_edge(START, "child")
    p.add_edge("child", END)
    return p.compile()


parent = _parent()


async def _q(state: State) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"log": ["q"]}


def _quick() -> Any:
    b = StateGraph(State)
    b.add_node("q", _q)
    b.add_edge(START, "q")
    b.add_edge("q", END)
    return b.compile()


quick_async = _quick()
