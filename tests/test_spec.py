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
    spec = StoreSpec.redis("rediss://u:p@h:6380/0", namespace="prod", cluster=True)
    assert StoreSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict() == {
        "kind": "redis",
        "location": "rediss://u:p@h:6380/0",
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


# ---- every bad location is InvalidArgument when the spec is made (issue 19, item 6) -------------


@pytest.mark.parametrize(
    ("location", "match"),
    [
        # Before: raw ValueError from int() or urlsplit.
        ("redis+sentinel://h:²/svc", "sentinel's port must be a number from 1 to 65535, got '²'"),
        ("redis+sentinel://h/svc/²", "db of a Sentinel URL must be a number from 0 to 2147483647, got '²'"),
        ("redis+sentinel://[::1/svc", "Invalid IPv6 URL"),
        ("redis+sentinel://[::1]x/svc", "bad address"),
        ("redis+sentinel://h:0/svc", "port"),
        ("redis+sentinel://h:70000/svc", "port"),
        ("redis+sentinel://h/svc/99999999999999999999", "db"),
        ("redis+sentinel://h/svc?socket_timeout=nan", "above 0"),
        ("redis+sentinel://h/svc?socket_timeout=-1", "above 0"),
        ("redis+sentinel://h/svc?min_other_sentinels=²", "min_other_sentinels"),
        # Before: accepted, then a raw ValueError from redis-py at build() (or misread: db ignored, port 0 = 6379).
        ("redis://h:²/0", "port must be a number from 1 to 65535, got '²'"),
        ("redis://h:70000/0", "port"),
        ("redis://h:port/0", "port"),
        ("redis://h:-1/0", "port"),
        ("redis://h:0/0", "port"),
        ("rediss://h:1e3/0", "port"),
        ("redis://[::1/0", "Invalid IPv6 URL"),
        ("redis://[::1]:x/0", "port"),
        ("redis://h/x", "db"),
        ("redis://h/²", "db"),
        ("redis://h/-1", "db"),
        ("redis://h/0/1", "db"),
        ("redis://h/3000000000", "db"),
        ("redis://h/0?db=x", "db option"),
        ("redis://h/0?db=-2", "db option"),
        ("unix:///tmp/r.sock?db=²", "db option"),
        ("unix://", "socket's path"),
        ("redis://h/0?socket_timeout=soon", "socket_timeout"),
        ("unix:///tmp/r.sock?health_check_interval=x", "health_check_interval"),
        ("redis://h/ 1", "spaces or control characters"),
        (" redis://h/0", "spaces or control characters"),
        ("redis://h:6379\x00/0", "spaces or control characters"),
    ],
)
def test_a_bad_location_is_invalid_argument_when_the_spec_is_made(location: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        StoreSpec.redis(location)
    with pytest.raises(InvalidArgument, match=match):
        StoreSpec.from_dict({"kind": "redis", "location": location})


def test_a_cluster_location_names_db_0_only() -> None:
    for location in ("redis://h:7000/2", "redis://h:7000/0?db=1"):
        with pytest.raises(InvalidArgument, match="only db 0"):
            StoreSpec.redis(location, cluster=True)
    assert StoreSpec.redis("redis://h:7000/0", cluster=True).cluster


@pytest.mark.parametrize(
    "location",
    ["redis://", "redis://h", "redis://h:/", "redis://h:6379/15", "redis://[::1]:6379/0", "rediss://u:p@h:6380/0",
     "redis://h/0?db=2&socket_timeout=1.5", "unix:///tmp/r.sock?db=3", "redis+sentinel://[::1],h:26380/m/0"],
)  # fmt: skip
def test_good_locations_are_accepted(location: str) -> None:
    assert StoreSpec.redis(location).location == location


def test_schemes_are_case_insensitive_and_build_works(real_server: RealServer) -> None:
    # Before: REDIS+SENTINEL:// was accepted but build() raised redis-py's ValueError; REDIS:// likewise.
    url = require_real(real_server)
    upper = "REDIS" + url[len("redis") :]
    spec = StoreSpec.redis(upper, namespace=f"case{os.getpid()}")
    assert spec.location == upper and StoreSpec.from_dict(spec.to_dict()) == spec
    store = spec.build()
    assert store.create(Checkpoint("c"))
    assert store.load("c").task_id == "c"
    store.delete("c")
    tls = StoreSpec.redis("Rediss://localhost:6380/0").client()
    assert tls.connection_pool.connection_class is redis.SSLConnection
    sentinel = StoreSpec.redis("REDIS+SENTINEL://h1:26380,h2/mymaster/2").client()
    pool = sentinel.connection_pool
    assert type(pool).__name__ == "SentinelConnectionPool" and pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 2


async def test_schemes_are_case_insensitive_for_async_clients(real_server: RealServer) -> None:
    url = require_real(real_server)
    store = StoreSpec.redis("ReDiS" + url[len("redis") :], namespace=f"acase{os.getpid()}").build_async()
    try:
        assert await store.create(Checkpoint("a"))
        await store.delete("a")
    finally:
        await store.client.aclose()
    sentinel = StoreSpec.redis("Redis+Sentinel://h/mymaster").async_client()
    assert type(sentinel.connection_pool).__name__ == "SentinelConnectionPool"


def test_a_sentinel_password_in_the_query_is_never_shown() -> None:
    spec = StoreSpec.redis("redis+sentinel://h/m?sentinel_password=s3cr3t-pw&socket_timeout=1")
    assert "s3cr3t-pw" not in repr(spec) and "sentinel_password=***" in repr(spec)
    with pytest.raises(InvalidArgument) as info:
        StoreSpec.redis("redis+sentinel://h:99999/m?sentinel_password=s3cr3t-pw")
    assert "s3cr3t-pw" not in str(info.value)
    assert "unix:///tmp/r.sock" in repr(StoreSpec.redis("unix:///tmp/r.sock"))  # not unix:/tmp/r.sock
