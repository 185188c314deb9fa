"""``tools/redisstore_conformance.py``: the operations it runs on ``InMemoryStore``, ``AgentStateStore``
and the official ``RedisStore`` answer on ours exactly as on ``InMemoryStore`` (fake, real, Cluster;
sync and async). RedisStore's column needs Redis Stack: the slow test runs the whole tool.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.memory import InMemoryStore

from redis_agentstate.langgraph import AgentStateStore, AsyncAgentStateStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import redisstore_conformance as conformance


class _Sync:
    """The async twin under the sync vocabulary the tool's operations use."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, "a" + name)


def test_ours_answers_every_operation_as_in_memory(make: Callable[..., Any], flavor: str) -> None:
    store = make(AgentStateStore, AsyncAgentStateStore, index=conformance.INDEX)
    ours = conformance.answers(conformance.fill(store if flavor == "sync" else _Sync(store)))
    reference = conformance.answers(conformance.fill(InMemoryStore(index=conformance.INDEX)))
    assert conformance.compare(reference, ours) == {name: "same" for name in reference}


@pytest.mark.slow
def test_the_tool_reports_redisstore_beside_ours(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on PATH")
    pytest.importorskip("langgraph.store.redis")
    assert conformance.main([]) == 0
    table = capsys.readouterr().out
    assert "| AgentStateStore |" in table and len(table.splitlines()) == len(conformance.OPERATIONS) + 2
