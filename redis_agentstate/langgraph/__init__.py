"""LangGraph checkpointers on plain Redis (or Redis Cluster), with one fenced writer per thread.

Needs the ``langgraph`` extra (``pip install 'redis-agentstate[langgraph]'``); the
rest of ``redis_agentstate`` never imports LangGraph.

::

    saver = AgentStateSaver(redis.Redis())
    graph = builder.compile(checkpointer=saver)
    with saver.lease("thread-1", wait_ms=5_000):     # optional: this saver is the thread's one writer
        graph.invoke(inputs, {"configurable": {"thread_id": "thread-1"}})

Runs across a fleet: ``RunQueue`` / ``AsyncRunQueue`` queue runs of threads (LangGraph Platform's
statuses and double-texting strategies, resumable event streams), ``GraphWorker`` executes them::

    queue = RunQueue(redis.Redis())
    GraphWorker(graph, queue, saver, concurrency=4).run()     # on every worker machine
    run = queue.create("thread-1", inputs, multitask_strategy="enqueue")
    for event in queue.stream(run.run_id): ...
"""

from __future__ import annotations

from ..errors import LeaseLost
from ._runs_core import Run, RunEvent
from .errors import RunNotFound, RunRejected, RunStopped, ThreadBusy
from .runs import AsyncRunQueue, RunQueue
from .saver import AgentStateSaver, AsyncAgentStateSaver, AsyncThreadLease, ThreadLease
from .store import AgentStateStore, AsyncAgentStateStore
from .worker import GraphWorker

__all__ = [
    "AgentStateSaver",
    "AgentStateStore",
    "AsyncAgentStateSaver",
    "AsyncAgentStateStore",
    "AsyncRunQueue",
    "AsyncThreadLease",
    "GraphWorker",
    "LeaseLost",
    "Run",
    "RunEvent",
    "RunNotFound",
    "RunStopped",
    "RunQueue",
    "RunRejected",
    "ThreadBusy",
    "ThreadLease",
]
