"""The 3-node graph of ``benchmarks.serve``'s API overhead, importable by LangGraph alone (no redis, no
redis_agentstate): ``agentstate serve`` and ``langgraph dev`` load this one file, so both run the same
graph. Nodes ``a``, ``b``, ``c`` in a row, each appending its name to ``log``, no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

__all__ = ["GRAPH", "State", "chain"]


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _append(name: str) -> Callable[[State], dict[str, Any]]:
    def node(state: State) -> dict[str, Any]:
        return {"log": [name]}

    return node


def chain(node: Callable[[str], Any] = _append) -> Any:
    """``a -> b -> c``, each node ``node(name)``."""
    b: Any = StateGraph(State)
    for n in "abc":
        b.add_node(n, node(n))
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", END)
    return b.compile()


GRAPH = chain()
