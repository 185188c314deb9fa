"""What the serve tests share: an app under uvicorn in a thread, ``langgraph dev`` beside it.

``app_in_thread``: ``agentstate serve``'s app (``create_app``) in this process, so a test can
freeze or patch what it runs. ``langgraph_dev``: LangChain's own server on the same graphs (started by
``benchmarks/servers.py``, which the benchmarks and the JavaScript-client check share), the
external judge (``$AGENTSTATE_LANGGRAPH_DEV`` names its ``langgraph`` command; ``.ci/run``
installs it; ``langgraph_dev_cli`` fails under ``CI=true`` when it is missing, skips elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port

from benchmarks import servers

TESTS = Path(__file__).parent


def ok(url: str) -> bool:
    """Whether the server at ``url`` answers ``/ok`` with 200."""
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/ok", timeout=3).status_code == 200
    return False


def until(cond: Callable[[], Any], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@contextlib.contextmanager
def app_in_thread(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a free port in a thread of this process; its URL."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: ok(url), 30)
        yield url
    finally:
        srv.should_exit = True
        thread.join(20)


def langgraph_dev_cli() -> str:
    """``$AGENTSTATE_LANGGRAPH_DEV``; a failure under ``CI=true`` without it, a skip elsewhere."""
    cli = os.environ.get("AGENTSTATE_LANGGRAPH_DEV")
    if not cli:
        why = "AGENTSTATE_LANGGRAPH_DEV (langgraph-cli[inmem]'s `langgraph`, which .ci/run installs) not set"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return cli


@contextlib.contextmanager
def langgraph_dev(cli: str, module: str, names: tuple[str, ...], **config: Any) -> Iterator[str]:
    """``langgraph dev`` serving graphs ``names`` of ``tests/<module>.py``; its URL. ``config``: more keys
    of its ``langgraph.json`` (e.g. ``webhooks``)."""
    graphs = {n: f"{TESTS / (module + '.py')}:{n}" for n in names}
    with servers.langgraph_dev(cli, graphs, [TESTS], **config) as url:
        yield url


#: Before Python 3.11 asyncio cannot hand a task a context (``create_task(context=)``), so LangGraph
#: cannot give an async run's nodes, their models and subgraphs its config (``get_config``,
#: ``get_store``, callbacks): what needs it fails there, as the docs say (docs/langgraph-runs.md).
NEEDS_311 = "LangGraph's async context needs Python 3.11"
needs_311 = pytest.mark.xfail(sys.version_info < (3, 11), reason=NEEDS_311, strict=True)


def ours_need_311(request: pytest.FixtureRequest) -> None:
    """In a fixture serving ``agentstate serve`` (not ``langgraph dev``, which runs on its own Python):
    the test is expected to fail before Python 3.11."""
    if sys.version_info < (3, 11):
        request.applymarker(pytest.mark.xfail(reason=NEEDS_311, strict=True))
