"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against both savers.

Base capabilities 5/5 and extended 3/3, on fakeredis, a real redis-server and the
local Redis Cluster, for the sync saver (its ``a``-methods run on the executor)
and the async one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES, EXTENDED_CAPABILITIES

from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_conformance_base_and_extended(backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop):
    async def factory() -> AsyncIterator[Any]:
        if flavor == "sync":
            yield AgentStateSaver(backend.sync_client(), namespace=namespace)
        else:
            yield AsyncAgentStateSaver(backend.async_client(), namespace=namespace)

    registered = checkpointer_test(name=f"AgentStateSaver-{flavor}-{backend.kind}")(factory)
    report = twin_loop.run_until_complete(validate(registered))
    failures = {name: r.failures for name, r in report.results.items() if not r.passed}
    assert not failures, failures
    passed = {name for name, r in report.results.items() if r.passed}
    assert passed == {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    assert report.passed_all_base()
    assert all(r.tests_failed == 0 and r.tests_passed > 0 for r in report.results.values())
