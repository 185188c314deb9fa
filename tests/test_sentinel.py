"""``redis+sentinel://`` locations: StoreSpec and the CLI reach a Sentinel-managed primary.

A real setup is started for the module (1 primary, 1 replica, 1 sentinel, all
private redis-server processes on free loopback ports). Every store runs its
flows through the client ``StoreSpec`` builds, sync and async; the CLI takes the
same URL; and after ``SENTINEL FAILOVER`` the *same* store follows the new
primary. The failover test runs last: it changes the topology.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from conftest import RedisServerProcess, Twin
from flows import checkpoint_flow, kv_flow, pool_flow
from replication_support import start_sentinel

from redis_agentstate import AsyncKeyValueStore, Checkpoint, InvalidArgument, KeyValueStore
from redis_agentstate.keys import Keys
from redis_agentstate.pools import AsyncPoolStore, PoolStore
from redis_agentstate.spec import StoreSpec, parse_sentinel_url

SERVICE = "agentstate-primary"


# ---- parsing (no server) ------------------------------------------------------------------------


def test_a_sentinel_url_names_sentinels_service_db_and_credentials() -> None:
    parsed = parse_sentinel_url(
        "redis+sentinel://app:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:26381/mymaster/3"
        "?sentinel_password=spw&socket_timeout=0.5&min_other_sentinels=1"
    )
    assert parsed.sentinels == [("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 26381)]
    assert (parsed.service_name, parsed.db, parsed.username, parsed.password) == ("mymaster", 3, "app", "s@cret")
    assert parsed.options == {"sentinel_password": "spw", "socket_timeout": 0.5, "min_other_sentinels": 1}
    assert parse_sentinel_url("redis+sentinel://h/m").db == 0


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h:26379",  # no service name
        "redis+sentinel://h:26379/m/x",  # db not a number
        "redis+sentinel://h:26379/m/0/extra",
        "redis+sentinel://h:port/m",
        "redis+sentinel://:26379/m",
        "redis+sentinel://h/m?ssl_ca=x",  # unknown option
        "redis+sentinel://h/m?socket_timeout=soon",
    ],
)
def test_a_bad_sentinel_url_is_invalid_argument_before_any_connection(url: str) -> None:
    with pytest.raises(InvalidArgument):
        StoreSpec.redis(url)


def test_a_sentinel_spec_round_trips_hides_its_password_and_is_never_a_cluster() -> None:
    spec = StoreSpec.redis("redis+sentinel://:pw@h:26379/m/0", namespace="prod")
    assert StoreSpec.from_dict(spec.to_dict()) == spec
    assert "pw" not in repr(spec)
    with pytest.raises(InvalidArgument):
        StoreSpec.redis("redis+sentinel://h:26379/m", cluster=True)


# ---- a real Sentinel setup ----------------------------------------------------------------------


@dataclass
class SentinelSetup:
    primary: RedisServerProcess
    replica: RedisServerProcess
    sentinel_port: int
    sentinel: subprocess.Popen[bytes]
    dir: str

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}/0"

    def ask(self, *command: Any) -> Any:
        with redis.Redis(port=self.sentinel_port, socket_timeout=2) as s:
            return s.execute_command(*command)

    def primary_port(self) -> int:
        return int(self.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])


def _wait(what: str, ok: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def sentinel_setup() -> Iterator[SentinelSetup]:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but redis-server is not on PATH")
        pytest.skip("redis-server not on PATH")
    primary = RedisServerProcess.start()
    replica = RedisServerProcess.start("--replicaof", "127.0.0.1", str(primary.port))
    folder = tempfile.mkdtemp(prefix="agentstate-sentinel-")
    port, proc = start_sentinel(folder, SERVICE, primary.port)
    setup = SentinelSetup(primary, replica, port, proc, folder)
    try:
        _wait("the sentinel to see the replica", lambda: len(setup.ask("SENTINEL", "REPLICAS", SERVICE)) == 1)
        yield setup
    finally:
        proc.terminate()
        proc.wait(10)
        replica.stop()
        primary.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sync", "async"])
def spec_flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _stores(spec: StoreSpec, flavor: str, loop: asyncio.AbstractEventLoop) -> tuple[Any, Any, Any]:
    if flavor == "sync":
        client = spec.client()
        return (
            spec.build(),
            PoolStore(client, namespace=spec.namespace),
            KeyValueStore(client, namespace=spec.namespace),
        )
    client = spec.async_client()
    return (
        Twin(spec.build_async(), loop),
        Twin(AsyncPoolStore(client, namespace=spec.namespace), loop),
        Twin(AsyncKeyValueStore(client, namespace=spec.namespace), loop),
    )


def test_every_flow_through_a_sentinel_location(
    sentinel_setup: SentinelSetup, spec_flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
) -> None:
    spec = StoreSpec.redis(sentinel_setup.url, namespace=namespace)
    store, pools, kv = _stores(spec, spec_flavor, twin_loop)
    checkpoint_flow(store, ["t1", "a:b", "{x}"])
    pool_flow(pools)
    kv_flow(kv)
    # It really went to the primary the sentinel named.
    with redis.Redis(port=sentinel_setup.primary_port()) as primary:
        assert primary.exists(Keys(namespace).pool("pool-1").log)


def test_the_cli_takes_a_sentinel_url(sentinel_setup: SentinelSetup, namespace: str) -> None:
    store = StoreSpec.redis(sentinel_setup.url, namespace=namespace).build()
    assert store.create(Checkpoint("cli-task"))
    cli = [sys.executable, "-m", "redis_agentstate", "--url", sentinel_setup.url, "--namespace", namespace]
    out = subprocess.run([*cli, "--json", "list"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [row["task_id"] for row in json.loads(out.stdout)] == ["cli-task"]
    bad = subprocess.run([*cli[:4], "redis+sentinel://127.0.0.1:1/", "list"], capture_output=True, text=True)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_the_demo_runs_on_a_sentinel_url(sentinel_setup: SentinelSetup) -> None:
    demo = [sys.executable, "-m", "redis_agentstate", "demo", "--url", sentinel_setup.url, "--json", "--no-chaos"]
    out = subprocess.run([*demo, "--workers", "2", "--tasks", "4", "--cycles", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["double_applied"] == 0 and report["lost_commits"] == 0, report


def test_the_same_store_follows_a_failover(sentinel_setup: SentinelSetup, namespace: str) -> None:
    """Last in the module: after SENTINEL FAILOVER the replica is the primary, and the store writes there."""
    store = StoreSpec.redis(sentinel_setup.url, namespace=namespace).build()
    assert store.create(Checkpoint("survivor", messages=["m0"]))
    cp = store.claim("survivor", 1, token="w1", lease_ms=60_000)
    cp.cycle_index = 1
    cp.messages.append("m1")
    assert store.commit(cp, token="w1", expected_revision=cp.revision)
    old = sentinel_setup.primary_port()
    with redis.Redis(port=old) as primary:
        assert primary.execute_command("WAIT", 1, 5000) == 1  # replicated before we fail over
    sentinel_setup.ask("SENTINEL", "FAILOVER", SERVICE)
    _wait("the failover", lambda: sentinel_setup.primary_port() != old)
    new = sentinel_setup.primary_port()
    assert new == sentinel_setup.replica.port
    _wait("the new primary to accept writes", lambda: redis.Redis(port=new).execute_command("ROLE")[0] == b"master")

    def claims() -> bool:
        # The first call after a failover may meet a connection to the demoted primary: it is closed and
        # redis-py's Sentinel pool asks for the new address (READONLY is a ConnectionError there).
        try:
            return store.claim("survivor", 2, token="w2", lease_ms=60_000) is not None
        except Exception:
            return False

    _wait("a claim on the new primary", claims)
    loaded = store.load("survivor")
    assert loaded.messages == ["m0", "m1"] and loaded.claimed_cycle == 2 and loaded.revision == 3
