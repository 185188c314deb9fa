"""Graphs for ``tests/test_serve_stream_modes.py``, served by ``agentstate serve`` and by ``langgraph
dev`` (which imports this file by path: plain LangGraph, nothing of ours).

``steps``: a -> b, each appending its name. ``chat``: one node calling a fake chat model that streams
"hello there friend" token by token. ``said``: one node returning a whole ``AIMessage`` (no model,
so LangGraph's ``messages`` mode sees it complete).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _a(state: State) -> dict[str, Any]:
    return {"log": ["a"]}


def _b(state: State) -> dict[str, Any]:
    return {"log": ["b"]}


_sb = StateGraph(State)
_sb.add_node("a", _a)
_sb.add_node("b", _b)
_sb.add_edge(START, "a")
_sb.add_edge("a", "b")
_sb.add_edge("b", END)
steps = _sb.compile()


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _talk(state: ChatState) -> dict[str, Any]:
    model = GenericFakeChatModel(messages=iter([AIMessage(content="hello there friend")]))
    return {"messages": [model.invoke(state["messages"])]}


_cb = StateGraph(ChatState)
_cb.add_node("talk", _talk)
_cb.add_edge(START, "talk")
_cb.add_edge("talk", END)
chat = _cb.compile()


def _say(state: ChatState) -> dict[str, Any]:
    return {"messages": [AIMessage(content="all done", id="said-1")]}


_db = StateGraph(ChatState)
_db.add_node("say", _say)
_db.add_edge(START, "say")
_db.add_edge("say", END)
said = _db.compile()
