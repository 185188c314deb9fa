"""``agentstate langgraph ...``: run a GraphWorker, and look at and steer a run queue's runs.

Imported by ``redis_agentstate.cli`` only when one of these commands runs (the rest of the CLI
never imports LangGraph). ``worker MODULE:ATTR`` imports a compiled graph (or a builder with
``compile``) and executes the queue's runs on asyncio until SIGTERM / Ctrl-C, which hand the
current runs back at their next boundary; ``--namespace <ns>.<NAME>`` serves the runs of
``agentstate serve --graph NAME=...`` (its queue, saver, store and graph id, see ``worker_names``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from collections.abc import Callable
from typing import Any

from ..commands.common import CliError, esc
from ..commands.common import dump as _dump

__all__ = ["cmd_cancel", "cmd_runs", "cmd_tail", "cmd_worker", "load_graph", "queue_namespace_of", "worker_names"]


def load_graph(target: str) -> Any:
    """The graph ``MODULE:ATTR`` names (a compiled graph; a StateGraph is compiled)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"the graph is MODULE:ATTR (e.g. myapp.graphs:agent), got {target!r}", "BadGraph")
    if "" not in sys.path:
        sys.path.insert(0, "")  # as `python -m` does: the working directory's modules import
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}", "BadGraph") from exc
    graph: Any = module
    for part in attr.split("."):
        if not hasattr(graph, part):
            raise CliError(f"{module_name!r} has no attribute {attr!r}", "BadGraph")
        graph = getattr(graph, part)
    what = "a compiled LangGraph graph, a StateGraph, or a function of no arguments returning one"
    if isinstance(graph, type):  # a class (a state schema, a node's class) is never called as a factory
        raise CliError(f"{target} is the class {graph.__name__}, not a graph: it must be {what}", "BadGraph")
    if callable(graph) and not hasattr(graph, "stream") and not hasattr(graph, "compile"):
        try:
            graph = graph()  # a factory
        except Exception as exc:
            raise CliError(f"{target} is not a graph, and calling it as a factory failed "
                           f"({type(exc).__name__}: {exc}): it must be {what}", "BadGraph") from exc  # fmt: skip
    if hasattr(graph, "compile") and not hasattr(graph, "stream"):
        try:
            graph = graph.compile()
        except Exception as exc:
            raise CliError(f"{target} does not compile: {type(exc).__name__}: {exc}", "BadGraph") from exc
    if not hasattr(graph, "stream") or not hasattr(graph, "copy"):
        raise CliError(f"{target} is not a graph (a {type(graph).__name__}): it must be {what}", "BadGraph")
    return graph


def queue_namespace_of(args: argparse.Namespace) -> str:
    """The RunQueue's namespace: ``--queue-namespace``, else ``--namespace`` (as ``agentstate serve``
    names a graph's: ``<ns>.<NAME>``), else ``agentstate``."""
    return str(args.queue_namespace or args.namespace or "agentstate")


def _queue(args: argparse.Namespace, client: Any) -> Any:
    from .runs import RunQueue

    return RunQueue(client, namespace=queue_namespace_of(args))


def worker_names(args: argparse.Namespace) -> tuple[str, str, str | None, str]:
    """``(queue namespace, saver namespace, store namespace or None, graph id)`` of a worker, as
    ``agentstate serve`` derives them for its graph NAME from ``--namespace <ns>.<NAME>``: the queue
    and the saver in ``<ns>.<NAME>``, the store in ``<ns>.store``, the graph id ``NAME``. Each has
    its own flag; without ``--namespace`` they are ``agentstate``, no store, and ATTR."""
    ns = args.namespace
    head, dot, name = (ns or "").rpartition(".")
    store = args.store_namespace or (f"{head}.store" if dot else None)
    graph_id = args.graph_id or (name if dot else args.graph.partition(":")[2])
    return queue_namespace_of(args), str(args.saver_namespace or ns or "agentstate"), store, graph_id


def cmd_worker(args: argparse.Namespace, client: Callable[[], Any]) -> int:
    """``langgraph worker MODULE:ATTR``: execute the queue's runs until SIGTERM or Ctrl-C, on asyncio
    (``graph.astream``: async nodes run, sync ones in threads), as ``agentstate serve``'s workers do."""
    import os

    from ..spec import StoreSpec

    graph = load_graph(args.graph)
    client().close()  # the URL checked as every command checks it (its errors never show the password)
    url = args.url or os.environ.get("REDIS_URL") or ""
    return asyncio.run(_awork(args, graph, StoreSpec.redis(url, cluster=bool(args.cluster)).async_client()))


async def _awork(args: argparse.Namespace, graph: Any, aclient: Any) -> int:
    from .runs import AsyncRunQueue
    from .saver import AsyncAgentStateSaver
    from .store import AsyncAgentStateStore
    from .worker import GraphWorker

    queue_ns, saver_ns, store_ns, graph_id = worker_names(args)
    store = None if store_ns is None else AsyncAgentStateStore(aclient, namespace=store_ns)
    try:
        if store is not None:
            await store.__aenter__()  # bound to this loop: a sync node calls the store from its thread
        worker = GraphWorker(graph, AsyncRunQueue(aclient, namespace=queue_ns),
                             AsyncAgentStateSaver(aclient, namespace=saver_ns), concurrency=args.concurrency,
                             lease_ms=args.lease_ms, graph_id=graph_id, store=store)  # fmt: skip
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        print(f"graph worker {esc(worker.name)}: {esc(args.graph)} as graph {esc(graph_id)}, queue {esc(queue_ns)}, "
              f"concurrency {args.concurrency}", file=sys.stderr, flush=True)  # fmt: skip
        await worker.arun()
        print(f"graph worker {esc(worker.name)} stopped: {worker.finished}", file=sys.stderr, flush=True)
        return 0
    finally:
        if store is not None:
            await store.__aexit__(None, None, None)
        await aclient.aclose()


def _run_dict(run: Any) -> dict[str, Any]:
    return {"run_id": run.run_id, "thread_id": run.thread_id, "status": run.status,
            "multitask_strategy": run.multitask_strategy, "stream_mode": run.stream_mode,
            "created_at_ms": run.created_at_ms, "updated_at_ms": run.updated_at_ms, "attempt": run.attempt,
            "worker": run.worker, "error": run.error}  # fmt: skip


def cmd_runs(args: argparse.Namespace, client: Callable[[], Any]) -> int:
    """``langgraph runs THREAD``: the thread's kept runs, newest first."""
    runs = _queue(args, client()).list(args.thread, limit=args.limit)
    if args.json:
        print(_dump([_run_dict(r) for r in runs]))
        return 0
    if not runs:
        print(f"no runs kept for thread {esc(args.thread)}")
    for r in runs:
        why = f"  {esc(r.error)}" if r.error else ""
        print(f"{r.run_id}  {r.status:<11} attempt {r.attempt}  {esc(r.multitask_strategy):<9} "
              f"{esc(r.worker) or '-'}{why}")  # fmt: skip
    return 0


def cmd_tail(args: argparse.Namespace, client: Callable[[], Any]) -> int:
    """``langgraph tail RUN``: the run's events, live until it ends (one line each)."""
    from ..errors import InvalidArgument
    from ._runs_core import check_stream_id

    if args.after is not None:
        try:  # checked before Redis is reached: a bad id is the caller's mistake, said as one
            check_stream_id(args.after, "--after")
        except InvalidArgument as exc:
            raise CliError(str(exc), "InvalidArgument") from exc
    queue = _queue(args, client())
    try:
        for event in queue.stream(args.run, after=args.after):
            if args.json:
                print(_dump({"id": event.id, "event": event.event, "data": _plain(event.data)}), flush=True)
            else:
                print(f"{event.id}  {esc(event.event):<10} {esc(_dump(_plain(event.data)))}", flush=True)
    except KeyboardInterrupt:
        return 0
    return 0


def cmd_cancel(args: argparse.Namespace, client: Callable[[], Any]) -> int:
    """``langgraph cancel RUN [--rollback]``: stop a run wherever it is."""
    action = "rollback" if args.rollback else "interrupt"
    done = _queue(args, client()).cancel(args.run, action=action)
    if args.json:
        print(_dump({"run_id": args.run, "cancelled": done, "action": action}))
    elif done:
        print(
            f"{action} asked of run {esc(args.run)}: a pending run ends now, a running one at once "
            "(an asyncio worker's) or at its next boundary"
        )
    else:
        print(f"run {esc(args.run)} had ended already: nothing changed")
    return 0


def _plain(value: Any) -> Any:
    """Event data as JSON can show it (messages and other objects by their dict or repr)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for attr in ("model_dump", "dict"):
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                return _plain(fn())
            except Exception:
                continue
    return repr(value)
