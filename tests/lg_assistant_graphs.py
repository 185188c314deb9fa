"""A graph for the assistant tests of ``agentstate serve``, importable as MODULE:ATTR.

``configured``: one node writing what its run's config says (``model``, ``tone`` of its
``configurable``, where the run's and its assistant's ``context`` land too) and its ``tags``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from lg_run_graphs import State


def _configured_node(state: State, config: RunnableConfig) -> dict[str, Any]:
    conf = config.get("configurable") or {}
    tags = sorted(config.get("tags") or [])
    return {"log": [f"model:{conf.get('model')}", f"tone:{conf.get('tone')}", f"tags:{tags}"]}


def _configured() -> Any:
    b = StateGraph(State)
    b.add_node("say", _configured_node)
    b.add_edge(START, "say")
    b.add_edge("say", END)
    return b.compile()


configured = _configured()
