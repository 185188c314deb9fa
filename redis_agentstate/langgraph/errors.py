"""The LangGraph integration's errors, under the library's one root (``errors.py``)::

    AgentStateError
    ├── LeaseLost       (errors.py)
    │   └── RunStopped  (also LangGraph's GraphBubbleUp) a graph its worker stops: not the run's any more
    ├── ThreadBusy      another writer holds the LangGraph thread's lease
    ├── RunRejected     a LangGraph run refused by its thread's multitask check (reject)
    └── RunNotFound     (also a KeyError) no such LangGraph run

``redis_agentstate.langgraph`` exports them; ``redis_agentstate.errors`` hands them out by name too.
"""

from __future__ import annotations

from langgraph.errors import GraphBubbleUp

from ..errors import AgentStateError, LeaseLost

__all__ = ["RunNotFound", "RunRejected", "RunStopped", "ThreadBusy"]


class ThreadBusy(AgentStateError):
    """Another writer holds the lease on this LangGraph thread (``task_id`` names the thread);
    nothing was written."""


class RunStopped(LeaseLost, GraphBubbleUp):
    """Raised in a graph, as a node or a model, tool or retriever call starts, by a worker whose run
    is not its own any more (its lease lapsed, or a cancel stopped it); ``task_id`` names the thread.

    A ``GraphBubbleUp``, as LangGraph's own early exits are: no retry policy retries it, no
    ``ToolNode`` turns it into a message, and no error is saved for the node."""


class RunRejected(AgentStateError):
    """The thread has a pending or running run, and the new run's strategy is ``reject``."""

    def __init__(self, message: str, *, thread_id: str, run_id: str | None = None) -> None:
        super().__init__(message, task_id=thread_id)
        self.thread_id = thread_id
        #: The active run that made the new one rejected.
        self.run_id = run_id


class RunNotFound(AgentStateError, KeyError):
    """No such run (never created, rolled back, or expired after it ended)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}")
        self.run_id = run_id

    def __str__(self) -> str:  # KeyError quotes its argument; say it plainly
        return f"no run {self.run_id!r}"
