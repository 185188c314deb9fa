"""The graphs both servers serve for ``tools/js_client_check.py`` (LangChain's JavaScript client).

``steps``: a -> b -> c, each appending its name and writing a custom event. ``slow``: the same
with two seconds in ``b`` (a run to cancel, or to double-text). ``ask``: ``interrupt()``, then
the answer is appended. ``chat``: one node calling a fake chat model whose tokens the
``messages-tuple`` mode streams. ``agent``: the chat of ``tests/test_chat_page.py`` (a ``useStream``
page in Chromium): a fake model streaming ``You said: <text> (reply <n>)`` word by word (``n`` counts
the server process's replies, so a regenerated reply differs), or, for a message starting with
``ask``, an ``interrupt()`` asking to approve it, then ``Approved: <answer>``. Plain LangGraph:
``langgraph dev`` imports this file by path.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk
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


class _WordByWord(GenericFakeChatModel):
    """GenericFakeChatModel with a pause between its chunks: a reply streams over ~0.3 s, long
    enough for a page to show it growing."""

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:  # fmt: skip
        for chunk in super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs):
            time.sleep(0.03)
            yield chunk


_replies = itertools.count(1)


def _text(message: AnyMessage) -> str:
    """A message's text, whether its content is a string or blocks (what chat front ends send)."""
    if isinstance(message.content, str):
        return message.content
    return "".join(b.get("text", "") for b in message.content if isinstance(b, dict))


def _route(state: ChatState) -> str:
    return "confirm" if _text(state["messages"][-1]).startswith("ask") else "reply"


def _reply(state: ChatState) -> dict[str, Any]:
    said = _text(state["messages"][-1])
    model = _WordByWord(messages=iter([AIMessage(content=f"You said: {said} (reply {next(_replies)})")]))
    return {"messages": [model.invoke(state["messages"])]}


def _confirm(state: ChatState) -> dict[str, Any]:
    answer = interrupt({"question": f"Approve: {_text(state['messages'][-1])}?"})
    return {"messages": [AIMessage(content=f"Approved: {answer}")]}


_agent = StateGraph(ChatState)
_agent.add_node("reply", _reply)
_agent.add_node("confirm", _confirm)
_agent.add_conditional_edges(START, _route, ["reply", "confirm"])
_agent.add_edge("reply", END)
_agent.add_edge("confirm", END)
agent = _agent.compile()
