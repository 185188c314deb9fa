"""Races and scale: exactly one winner per contested claim; list() with 100,000 tasks."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from redis_agentstate import AlreadyClaimed, AsyncCheckpointStore, Checkpoint, CheckpointStore
from redis_agentstate import wire as _ops
from redis_agentstate.wire.scripts import SAVE

LEASE = 60_000


class TestClaimRace:
    ROUNDS = 1000

    def test_two_threads_race_for_each_cycle(self, backend: Any, namespace: str) -> None:
        stores = [CheckpointStore(backend.sync_client(), namespace=namespace) for _ in range(2)]
        stores[0].create(Checkpoint("race"))
        barrier = threading.Barrier(2)
        results: list[list[Any]] = [[None] * self.ROUNDS for _ in range(2)]

        def worker(i: int) -> None:
            store = stores[i]
            for n in range(1, self.ROUNDS + 1):
                barrier.wait()
                try:
                    results[i][n - 1] = store.claim("race", n, token=f"w{i}", lease_ms=LEASE)
                except AlreadyClaimed:
                    results[i][n - 1] = "lost"
                barrier.wait()
                cp = results[i][n - 1]
                if cp != "lost":
                    cp.cycle_index = n
                    cp.messages.append(f"{n}:{i}")
                    assert store.commit(cp, token=f"w{i}", expected_revision=cp.revision)
                barrier.wait()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        winners = [sum(results[i][n] != "lost" for i in range(2)) for n in range(self.ROUNDS)]
        assert winners == [1] * self.ROUNDS
        final = stores[0].load("race")
        assert final.cycle_index == self.ROUNDS and final.revision == 2 * self.ROUNDS
        assert [m.split(":")[0] for m in final.messages] == [str(n) for n in range(1, self.ROUNDS + 1)]

    def test_async_gather_race(self, backend: Any, namespace: str, twin_loop: asyncio.AbstractEventLoop) -> None:
        store = AsyncCheckpointStore(backend.async_client(), namespace=namespace)

        async def race() -> list[int]:
            await store.create(Checkpoint("race"))
            wins = []
            for n in range(1, 201):
                got = await asyncio.gather(
                    *(store.claim("race", n, token=f"w{i}", lease_ms=LEASE) for i in range(4)),
                    return_exceptions=True,
                )
                won = [g for g in got if not isinstance(g, BaseException)]
                assert all(isinstance(g, AlreadyClaimed) for g in got if isinstance(g, BaseException))
                wins.append(len(won))
                cp = won[0]
                cp.cycle_index = n
                assert await store.commit(cp, token=cp.claim_token, expected_revision=cp.revision)
            return wins

        assert twin_loop.run_until_complete(race()) == [1] * 200


class TestListScale:
    def test_list_pages_through_every_shard(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_ops.indexes, "LIST_PAGE", 3)
        ids = [f"task-{i:04d}" for i in range(700)]
        for t in ids:
            store.create(Checkpoint(t))
        assert store.list() == ids

    def test_list_with_100k_tasks(self, backend: Any, namespace: str) -> None:
        """Bulk-load through the store's own save script, pipelined, then list()."""
        store = CheckpointStore(backend.sync_client(), namespace=namespace)
        # fakeredis runs Lua ~50x slower than redis-server, and redis-py's cluster
        # pipeline refuses EVALSHA; the paging test covers the logic there.
        n = 100_000 if backend.kind == "real" else 5_000
        if backend.kind == "cluster":
            for i in range(n):
                store.save(Checkpoint(f"t{i}"))
        else:
            store._layout()  # the namespace's layout, which every operation reads first
            script = store._scripts[SAVE]
            pipe = store.client.pipeline(transaction=False)
            for i in range(n):
                call = next(store._core.save(Checkpoint(f"t{i}")))
                script(keys=call.keys, args=call.args, client=pipe)
                if i % 5000 == 4999:
                    pipe.execute()
            pipe.execute()
        listed = store.list()
        assert len(listed) == n and listed == sorted(f"t{i}" for i in range(n))
        store.delete("t5")
        assert len(store.list()) == n - 1
        # Leave the shared session server small for the tests after this one.
        raw = store.client
        for chunk in _chunks(raw.scan_iter(match=f"{namespace}:*", count=10_000), 10_000):
            pipe = raw.pipeline(transaction=False)
            for key in chunk:  # one key per UNLINK: a cluster refuses them across slots
                pipe.unlink(key)
            pipe.execute()


def _chunks(it: Any, size: int) -> Any:
    batch = []
    for item in it:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
