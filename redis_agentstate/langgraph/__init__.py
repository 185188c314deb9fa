"""LangGraph checkpointers on plain Redis (or Redis Cluster), with one fenced writer per thread.

Needs the ``langgraph`` extra (``pip install 'redis-agentstate[langgraph]'``); the
rest of ``redis_agentstate`` never imports LangGraph.

::

    saver = AgentStateSaver(redis.Redis())
    graph = builder.compile(checkpointer=saver)
    with saver.lease("thread-1", wait_ms=5_000):     # optional: this saver is the thread's one writer
        graph.invoke(inputs, {"configurable": {"thread_id": "thread-1"}})
"""

from __future__ import annotations

from ..errors import LeaseLost, ThreadBusy
from .saver import AgentStateSaver, AsyncAgentStateSaver, AsyncThreadLease, ThreadLease

__all__ = ["AgentStateSaver", "AsyncAgentStateSaver", "AsyncThreadLease", "LeaseLost", "ThreadBusy", "ThreadLease"]
