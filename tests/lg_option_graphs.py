"""Graphs for ``tests/test_serve_run_options.py``, importable as MODULE:ATTR by ``agentstate serve`` and
``langgraph dev``.

``abc``: nodes ``a``, ``b``, ``c`` in a row, each appending its name to ``log`` (sync nodes).
``nap``: one async node that sleeps ``configurable["nap"]`` seconds (0.5 by default) and appends
``nap``; ``NAPPING`` counts, per tenant (``configurable["tenant"]``), the naps going on at once and
``MOST`` the most seen, for a test running the app in its own process.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

#: tenant -> naps going on now / the most at once so far.
NAPPING: dict[str, int] = {}
MOST: dict[str, int] = {}


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _node(name: str) -> Any:
    def node(state: State) -> dict[str, Any]:
        return {"log": [name]}

    return node


def _abc() -> Any:
    b = StateGraph(State)
    for n in "abc":
        b.add_node(n, _node(n))
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", END)
    return b.compile()


abc = _abc()


async def _nap(state: State, config: RunnableConfig) -> dict[str, Any]:
    conf = config.get("configurable") or {}
    tenant = str(conf.get("tenant", ""))
    NAPPING[tenant] = NAPPING.get(tenant, 0) + 1
    MOST[tenant] = max(MOST.get(tenant, 0), NAPPING[tenant])
    try:
        await asyncio.sleep(float(conf.get("nap", 0.5)))
    finally:
        NAPPING[tenant] -= 1
    return {"log": ["nap"]}


def _napper() -> Any:
    b = StateGraph(State)
    b.add_node("nap", _nap)
    b.add_edge(START, "nap")
    b.add_edge("nap", END)
    return b.compile()


nap = _napper()
