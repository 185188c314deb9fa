"""Two workers, one LangGraph thread: "double texting" handled by ``lease(wait_ms=...)``.

A user sends two messages to the same conversation in quick succession, and two
workers (each with its own saver and Redis connection, as two processes would
have) pick one each. Without a lease both would run the graph from the same
checkpoint and fork the thread. With ``saver.lease(thread_id, wait_ms=...)`` the
second worker waits in line, is woken by the first one's release, and runs on
top of its result; the checkpoint chain stays linear. A worker that will not
wait (``wait_ms=0``) gets ``ThreadBusy`` at once instead.

Runs against ``REDIS_URL`` when set, else a private server that is stopped on exit::

    python examples/langgraph_two_workers.py
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
import time
from typing import Annotated, Any, TypedDict

import redis
from langgraph.graph import END, START, StateGraph

from redis_agentstate.embedded import start_embedded
from redis_agentstate.langgraph import AgentStateSaver, ThreadBusy


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def answer(state: State) -> dict[str, Any]:
    time.sleep(0.3)  # the model thinking
    return {"messages": [f"answer to {state['messages'][-1]!r} (having seen {len(state['messages'])} messages)"]}


def build(saver: AgentStateSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=saver)


def main(url: str) -> None:
    namespace = f"example-{os.getpid()}"
    config = {"configurable": {"thread_id": "conversation-1"}}
    log: list[str] = []

    def worker(name: str, text: str, delay: float) -> None:
        saver = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
        graph = build(saver)
        time.sleep(delay)
        with saver.lease("conversation-1", wait_ms=10_000):
            log.append(f"{name} runs {text!r}")
            graph.invoke({"messages": [text]}, config)

    a = threading.Thread(target=worker, args=("worker A", "book a table for two", 0.0))
    b = threading.Thread(target=worker, args=("worker B", "make it three, actually", 0.1))
    a.start()
    b.start()
    a.join()
    b.join()
    for line in log:
        print(line)

    saver = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
    with saver.lease("conversation-1"):
        impatient = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
        try:
            with impatient.lease("conversation-1", wait_ms=0):
                pass
        except ThreadBusy:
            print("a third worker that will not wait gets ThreadBusy at once")

    graph = build(saver)
    print("final conversation:")
    for m in graph.get_state(config).values["messages"]:
        print("  -", m)
    history = list(saver.list(config))
    linear = all(
        newer.parent_config is not None
        and newer.parent_config["configurable"]["checkpoint_id"] == older.config["configurable"]["checkpoint_id"]
        for newer, older in itertools.pairwise(history)
    )
    print(f"{len(history)} checkpoints, chain linear: {linear}")
    saver.delete_thread("conversation-1")


if __name__ == "__main__":
    if os.environ.get("REDIS_URL"):
        main(os.environ["REDIS_URL"])
    else:
        with start_embedded() as server:
            print(f"using a private {server.description}")
            main(server.url)
