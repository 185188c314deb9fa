"""Graphs for the run-queue tests, importable as MODULE:ATTR by ``agentstate langgraph worker``.

``steps``: three nodes a -> b -> c, each appending its name (and writing a custom event).
``slow``: five nodes, each sleeping ``SLOW_S`` (so a double-text lands mid-run).
``crashy``: a -> b -> c where ``b`` SIGKILLs its own process on the run's first attempt, and every
node counts its executions in Redis (``$AGENTSTATE_LG_URL``, key ``<thread>:ran:<node>``).
``ask``: a human-in-the-loop graph: ``interrupt()``, then the answer is appended.
``chat``: one node calling a (fake) chat model, whose tokens the ``messages`` mode streams.
``memory``: one (sync) node that reads ``("prefs",) / "lang"`` from the graph's store (``get_store()``)
and writes ``("seen", <thread>) / "last"`` there.
``nested``: a parent whose node ``inner`` is the ``ask`` graph (a subgraph, interrupting inside).
"""

from __future__ import annotations

import itertools
import operator
import os
import signal
import time
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.types import StreamWriter, interrupt

SLOW_S = float(os.environ.get("AGENTSTATE_LG_SLOW_S", "0.15"))


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _node(name: str, sleep: float = 0.0) -> Any:
    # The writer comes in as a parameter, not from get_stream_writer(). Before Python 3.11 that
    # helps only while "custom" is not streamed: under astream, LangGraph's writer calls
    # get_config() itself, and there it finds nothing (docs/langgraph-runs.md, "Asyncio").
    def run(state: State, writer: StreamWriter) -> dict[str, Any]:
        if sleep:
            time.sleep(sleep)
        writer({"node": name})
        return {"log": [name]}

    return run


def _chain(names: str, sleep: float = 0.0, node: Any = None) -> Any:
    """The nodes ``names`` one after another; each is ``_node`` (or ``node(name)``, if given)."""
    b = StateGraph(State)
    for n in names:
        b.add_node(n, node(n) if node else _node(n, sleep))
    b.add_edge(START, names[0])
    for x, y in itertools.pairwise(names):
        b.add_edge(x, y)
    b.add_edge(names[-1], END)
    return b.compile()


steps = _chain("abc")
slow = _chain("abcde", SLOW_S)


def _counted(name: str, crash: bool = False) -> Any:
    def run(state: State, config: RunnableConfig) -> dict[str, Any]:
        import redis

        tid = config["configurable"]["thread_id"]
        r = redis.Redis.from_url(os.environ["AGENTSTATE_LG_URL"])
        n = r.incr(f"{tid}:ran:{name}")
        if crash and n == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"log": [name]}

    return run


def _crashy() -> Any:
    b = StateGraph(State)
    b.add_node("a", _counted("a"))
    b.add_node("b", _counted("b", crash=True))
    b.add_node("c", _counted("c"))
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", END)
    return b.compile()


crashy = _crashy()


def _ask_node(state: State) -> dict[str, Any]:
    answer = interrupt("approve?")
    return {"log": [f"answer:{answer}"]}


def _ask() -> Any:
    b = StateGraph(State)
    b.add_node("a", _node("a"))
    b.add_node("ask", _ask_node)
    b.add_edge(START, "a")
    b.add_edge("a", "ask")
    b.add_edge("ask", END)
    return b.compile()


ask = _ask()


def _chat_node(state: State) -> dict[str, Any]:
    # A chat model inside a node: LangGraph's "messages" mode streams its tokens.
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    model = GenericFakeChatModel(messages=iter([AIMessage(content="hello there friend")]))
    return {"log": [str(model.invoke("hi").content)]}


def _chat() -> Any:
    b = StateGraph(State)
    b.add_node("talk", _chat_node)
    b.add_edge(START, "talk")
    b.add_edge("talk", END)
    return b.compile()


chat = _chat()


def _memory_node(state: State, config: RunnableConfig) -> dict[str, Any]:
    store = get_store()
    found = store.get(("prefs",), "lang")
    lang = None if found is None else found.value.get("lang")
    store.put(("seen", config["configurable"]["thread_id"]), "last", {"lang": lang})
    return {"log": [f"lang:{lang}"]}


def _memory() -> Any:
    b = StateGraph(State)
    b.add_node("remember", _memory_node)
    b.add_edge(START, "remember")
    b.add_edge("remember", END)
    return b.compile()


memory = _memory()


def _nested() -> Any:
    b = StateGraph(State)
    b.add_node("inner", _ask())
    b.add_edge(START, "inner")
    b.add_edge("inner", END)
    return b.compile()


nested = _nested()
