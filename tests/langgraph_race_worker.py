"""One worker process of tests/test_langgraph_race.py: run one graph step on a shared thread.

argv: url namespace thread_id name mode(lease|nolease|together: no lease, racers meet in the step) lease_ms sleep_s
Prints ``RAN <name>`` when its step starts, ``BUSY``, ``LEASE_LOST`` or ``DONE`` (flushing each line).
"""

from __future__ import annotations

import operator
import sys
import time
from typing import Annotated, Any, TypedDict

import redis
from langgraph.graph import END, START, StateGraph

from redis_agentstate.errors import LeaseLost
from redis_agentstate.langgraph import AgentStateSaver, ThreadBusy


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def main() -> int:
    url, namespace, thread_id, name, mode, lease_ms, sleep_s = sys.argv[1:8]

    def step(state: State) -> dict[str, Any]:
        print(f"RAN {name}", flush=True)
        if mode == "together":
            # No lease, and the racers meet here: each has read the thread before either writes, whatever
            # the machine's load (a 1 s step did not overlap under CI's load: one ran after the other).
            r = redis.Redis.from_url(url)
            r.incr(f"{namespace}:race-barrier")
            deadline = time.monotonic() + 60
            while int(r.get(f"{namespace}:race-barrier") or 0) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        time.sleep(float(sleep_s))
        return {"messages": [f"by {name} after {len(state['messages'])}"]}

    saver = AgentStateSaver(redis.Redis.from_url(url), namespace=namespace)
    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread_id}}
    try:
        if mode == "lease":
            with saver.lease(thread_id, lease_ms=int(lease_ms), wait_ms=0):
                graph.invoke({"messages": [f"from {name}"]}, config)
        else:
            graph.invoke({"messages": [f"from {name}"]}, config)
    except ThreadBusy:
        print("BUSY", flush=True)
        return 0
    except LeaseLost:
        print("LEASE_LOST", flush=True)
        return 0
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
