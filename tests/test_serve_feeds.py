"""``server/_feeds.py``: every SSE client of a run is served from one read of its stream."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import lg_run_graphs as graphs
import pytest
from test_langgraph_runs import worker

from redis_agentstate.errors import RunNotFound
from redis_agentstate.langgraph import AsyncRunQueue

pytest.importorskip("starlette")

from redis_agentstate.server._feeds import RunFeeds


@pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"], indirect=True)
class TestRunFeeds:
    def test_followers_of_one_run_share_one_read_and_each_gets_every_event(self, backend: Any, namespace: str) -> None:
        async def main() -> None:
            client = backend.new_async_client()
            try:
                q = AsyncRunQueue(client, namespace=namespace)
                reads = 0
                stream = q.stream

                def counted(*args: Any, **kw: Any) -> Any:
                    nonlocal reads
                    reads += 1
                    return stream(*args, **kw)

                q.stream = counted  # type: ignore[method-assign]
                feeds = RunFeeds()

                async def follow(run_id: str, after: str | None = None) -> list[Any]:
                    return [ev async for ev in feeds.follow(q, run_id, after)]

                run = await q.create("t", {"log": []}, stream_mode=["updates", "custom"])
                everyone = await asyncio.gather(*(follow(run.run_id) for _ in range(50)))
                assert reads == 1 and len(feeds) == 0  # one read; dropped when the last follower left
                direct = [ev async for ev in stream(run.run_id)]
                assert [ev.event for ev in direct].count("custom") == 5 and direct[-1].event == "end"
                assert all(got == direct for got in everyone)
                # A follower resuming after any event (Last-Event-ID) gets exactly the rest.
                for cut in (0, 3, len(direct) - 2):
                    assert await follow(run.run_id, direct[cut].id) == direct[cut + 1 :]
                # One that leaves early stops the read once it was the last.
                gen = feeds.follow(q, run.run_id)
                async with contextlib.aclosing(gen):
                    assert (await gen.__anext__()) == direct[0]
                assert len(feeds) == 0
                with pytest.raises(RunNotFound):
                    await follow("no-such-run")
                assert len(feeds) == 0
            finally:
                await client.aclose()

        with worker(backend, namespace, graphs.slow):
            asyncio.run(main())
