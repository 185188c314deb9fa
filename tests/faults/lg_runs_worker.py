"""One GraphWorker process of the LangGraph runs chaos test (``tests/test_langgraph_runs_chaos.py``;
never run by hand)::

    python lg_runs_worker.py URL NAMESPACE HISTORY WORKER SEED [async]

Executes the queue's runs with a chain of ``NODES`` nodes. Each execution of a node appends
``<run_id>:<node>:<exec id>`` to the thread's ``log`` channel (what the checkpoints keep tells
which executions were saved) and records its start and end (``time.monotonic``: one clock for
every process of the machine) as JSON lines in HISTORY, flushed before the node returns, so a
SIGKILL loses at most the end of the execution it interrupted. With ``async`` the worker runs on
asyncio (``AsyncRunQueue``, ``AsyncAgentStateSaver``, ``graph.astream``) beside the sync ones.
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
import os
import random
import sys
import time
import uuid
from typing import Annotated, Any, TypedDict

import redis
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver, AsyncRunQueue, GraphWorker, RunQueue

NODES = "abcd"
LEASE_MS = 1500


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def main() -> None:
    url, namespace, history, worker, seed = sys.argv[1:6]
    rng = random.Random(int(seed))
    logging.basicConfig(level=logging.CRITICAL)
    out = open(history, "a", encoding="utf-8")  # noqa: SIM115 - the process's whole life

    def record(**fields: Any) -> None:
        out.write(json.dumps({"worker": worker, "pid": os.getpid(), **fields}) + "\n")
        out.flush()

    def node(name: str) -> Any:
        def run(state: State, config: RunnableConfig) -> dict[str, Any]:
            conf = config  # a parameter, not get_config(): before 3.11 that fails under asyncio
            run_id = conf["metadata"]["run_id"]
            exec_id = uuid.uuid4().hex[:10]
            record(kind="start", run=run_id, thread=conf["configurable"]["thread_id"], node=name, exec=exec_id,
                   t=time.monotonic())  # fmt: skip
            time.sleep(rng.uniform(0.02, 0.12))  # a model call: a kill or a freeze lands here
            record(kind="end", run=run_id, node=name, exec=exec_id, t=time.monotonic())
            return {"log": [f"{run_id}:{name}:{exec_id}"]}

        return run

    b = StateGraph(State)
    for n in NODES:
        b.add_node(n, node(n))
    b.add_edge(START, NODES[0])
    for x, y in itertools.pairwise(NODES):
        b.add_edge(x, y)
    b.add_edge(NODES[-1], END)
    options: dict[str, Any] = {"concurrency": 2, "lease_ms": LEASE_MS, "block_ms": 500, "name": worker}
    if sys.argv[6:7] == ["async"]:
        import asyncio

        import redis.asyncio as aredis

        async def run() -> None:
            queue = AsyncRunQueue(aredis.Redis.from_url(url, socket_timeout=5), namespace=namespace)
            saver = AsyncAgentStateSaver(aredis.Redis.from_url(url, socket_timeout=5), namespace=namespace)
            await GraphWorker(b.compile(), queue, saver, **options).arun()

        asyncio.run(run())
        return
    queue = RunQueue(redis.Redis.from_url(url, socket_timeout=5), namespace=namespace)
    saver = AgentStateSaver(redis.Redis.from_url(url, socket_timeout=5), namespace=namespace)
    GraphWorker(b.compile(), queue, saver, **options).run()


if __name__ == "__main__":
    main()
