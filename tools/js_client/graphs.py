"""The graphs both servers serve for ``tools/js_client_check.py`` (LangChain's JavaScript client).

``steps``: a -> b -> c, each appending its name and writing a custom event. ``slow``: the same
with two seconds in ``b`` (a run to cancel, or to double-text). ``ask``: ``interrupt()``, then
the answer is appended. ``chat``: one node calling a fake chat model whose tokens the
``messages-tuple`` mode streams. Plain LangGraph: ``langgraph dev`` imports this file by path.
"""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import StreamWriter, interrupt


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _node(name: str, sleep: float = 0.0) -> Any:
    def run(state: State, writer: StreamWriter) -> dict[str, Any]:
        if sleep:
            time.sleep(sleep)
        writer({"node": name})
        return {"log": [name]}

    return run


def _chain(sleep_b: float = 0.0) -> Any:
    b = StateGraph(State)
    for n in "abc":
        b.add_node(n, _node(n, sleep_b if n == "b" else 0.0))
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", END)
    return b.compile()


steps = _chain()
slow = _chain(2.0)


def _ask(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "go on?"})
    return {"log": [f"answer:{answer}"]}


_ab = StateGraph(State)
_ab.add_node("ask", _ask)
_ab.add_edge(START, "ask")
_ab.add_edge("ask", END)
ask = _ab.compile()


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
