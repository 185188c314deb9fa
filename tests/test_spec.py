"""StoreSpec: the seed's StateStoreSpec (to_dict/from_dict) building stores from URLs."""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis
from conftest import RealServer, RedisServerProcess, require_real

from redis_agentstate import Checkpoint, InvalidArgument
from redis_agentstate.spec import StoreSpec


def test_round_trip() -> None:
    spec = StoreSpec.redis("rediss://u:p@h:6380/2", namespace="prod", cluster=True)
    assert StoreSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict() == {
        "kind": "redis",
        "location": "rediss://u:p@h:6380/2",
        "namespace": "prod",
        "cluster": True,
    }
    assert StoreSpec.from_dict({"kind": "redis", "location": "redis://h"}).namespace == "agentstate"


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ("redis://h", "must be an object"),
        ({"kind": "sqlite", "location": "x.db"}, "kind must be 'redis'"),
        ({"location": "redis://h"}, "kind must be 'redis'"),
        ({"kind": "redis", "location": ""}, "non-empty"),
        ({"kind": "redis", "location": "   "}, "non-empty"),
        ({"kind": "redis"}, "non-empty"),
        ({"kind": "redis", "location": "http://h"}, r"redis://, rediss://, unix:// or redis\+sentinel://"),
        ({"kind": "redis", "location": "redis://h", "namespace": "a{b}"}, "namespace"),
        ({"kind": "redis", "location": "redis://h", "extra": 1}, "unknown fields"),
        ({"kind": "redis", "location": "unix:///tmp/r.sock", "cluster": True}, "unix"),
        ({"kind": "redis", "location": "redis://h", "cluster": "yes"}, "bool"),
    ],
)
def test_bad_specs(payload: Any, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        StoreSpec.from_dict(payload)


def test_rediss_builds_a_tls_client() -> None:
    client = StoreSpec.redis("rediss://localhost:6380/0").client()
    assert client.connection_pool.connection_class is redis.SSLConnection


def test_build_from_redis_url(real_server: RealServer) -> None:
    url = require_real(real_server)
    store = StoreSpec.redis(url, namespace=f"spec{os.getpid()}").build()
    assert store.create(Checkpoint("s"))
    assert store.load("s").task_id == "s"
    store.delete("s")


def test_build_from_unix_url(tmp_path: Any) -> None:
    sock = str(tmp_path / "redis.sock")
    try:
        server = RedisServerProcess.start("--unixsocket", sock, "--unixsocketperm", "700")
    except FileNotFoundError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        store = StoreSpec.redis(f"unix://{sock}").build()
        assert store.create(Checkpoint("u"))
        cp = store.claim("u", 1, token="w", lease_ms=1000)
        assert cp.revision == 1
    finally:
        server.stop()


async def test_build_async(real_server: RealServer) -> None:
    url = require_real(real_server)
    store = StoreSpec.redis(url, namespace=f"aspec{os.getpid()}").build_async()
    try:
        assert await store.create(Checkpoint("a"))
        assert (await store.load("a")).task_id == "a"
        await store.delete("a")
    finally:
        await store.client.aclose()


@pytest.mark.parametrize(
    "location",
    [
        "rediss://user:s3cr3t-pw@redis:6380/0",
        "redis://:s3cr3t-pw@redis:6379/0",
        "redis://redis:6379/0?password=s3cr3t-pw&db=1",
        "unix:///tmp/r.sock?password=s3cr3t-pw",
    ],
)
def test_repr_and_errors_never_show_the_password(location: str) -> None:
    spec = StoreSpec.redis(location, namespace="prod")
    for text in (repr(spec), str(spec), f"{spec!r} in a list: {[spec]!r}"):
        assert "s3cr3t-pw" not in text and "***" in text
    assert "prod" in repr(spec)
    assert spec.location == location  # the spec itself still holds what it needs to connect
    with pytest.raises(InvalidArgument) as info:
        StoreSpec.redis(location.replace("redis", "http", 1).replace("unix", "http", 1))
    assert "s3cr3t-pw" not in str(info.value)
