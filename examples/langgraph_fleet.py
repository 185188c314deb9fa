"""A fleet of two GraphWorkers serving double-texted runs, with a live event tail.

A user texts a conversation three times in quick succession. The client queues each text as a
run (``RunQueue.create``): the second with ``enqueue`` (it waits its turn), the third with
``interrupt`` (it stops the run under way at its next super-step, keeping its progress). Two
workers, each with its own connections as two processes would have, execute the runs: never two
of one thread at once, in creation order. The client tails the first run's events live and
reconnects after a dropped connection from the last event id it saw, missing nothing.

Runs against ``REDIS_URL`` when set, else a private server that is stopped on exit::

    python examples/langgraph_fleet.py
"""

from __future__ import annotations

import operator
import os
import threading
import time
from typing import Annotated, Any, TypedDict

import redis
from langgraph.graph import END, START, StateGraph

from redis_agentstate.embedded import start_embedded
from redis_agentstate.langgraph import AgentStateSaver, GraphWorker, RunQueue


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def think(state: State) -> dict[str, Any]:
    time.sleep(0.2)  # the model thinking
    return {"messages": [f"thinking about {state['messages'][-1]!r}"]}


def answer(state: State) -> dict[str, Any]:
    time.sleep(0.2)
    return {"messages": [f"answer to {state['messages'][-1]!r}"]}


def build() -> Any:
    builder = StateGraph(State)
    builder.add_node("think", think)
    builder.add_node("answer", answer)
    builder.add_edge(START, "think")
    builder.add_edge("think", "answer")
    builder.add_edge("answer", END)
    return builder.compile()


def main(url: str) -> None:
    namespace = f"fleet-example-{os.getpid()}"
    workers = [
        GraphWorker(build(), RunQueue(redis.Redis.from_url(url), namespace=namespace),
                    AgentStateSaver(redis.Redis.from_url(url), namespace=namespace), name=name, block_ms=500)
        for name in ("worker-A", "worker-B")
    ]  # fmt: skip
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()

    queue = RunQueue(redis.Redis.from_url(url), namespace=namespace)
    first = queue.create("chat-1", {"messages": ["book a table"]}, stream_mode=["updates"])
    second = queue.create("chat-1", {"messages": ["for two"]}, multitask_strategy="enqueue")

    print("live tail of the first run (the connection drops after two events):")
    seen = []
    for event in queue.stream(first.run_id):
        seen.append(event)
        print(f"  {event.event}: {event.data}")
        if len(seen) == 2:
            break
    print("  ... reconnecting after", seen[-1].id)
    for event in queue.stream(first.run_id, after=seen[-1].id):
        seen.append(event)
        print(f"  {event.event}: {event.data}")
    print("first run:", queue.join(first.run_id).status, f"({len(seen)} events, none missed or repeated)")

    while queue.get(second.run_id).status != "running":
        time.sleep(0.01)
    third = queue.create("chat-1", {"messages": ["make it three, actually"]}, multitask_strategy="interrupt")
    for run in (second, third):
        done = queue.join(run.run_id, timeout_s=30)
        print(f"{done.input['messages'][0]!r}: {done.status}{' (' + done.error + ')' if done.error else ''}, "
              f"by {done.worker.split(':')[0] if ':' in done.worker else done.worker}")  # fmt: skip

    for w in workers:
        w.stop()
    for t in threads:
        t.join()
    saver = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
    print("conversation:")
    for m in saver.get_tuple({"configurable": {"thread_id": "chat-1"}}).checkpoint["channel_values"]["messages"]:
        print("  -", m)
    print("runs:", [r.status for r in queue.list("chat-1")])  # newest first


if __name__ == "__main__":
    if os.environ.get("REDIS_URL"):
        main(os.environ["REDIS_URL"])
    else:
        with start_embedded() as server:
            print(f"using a private {server.description}")
            main(server.url)
