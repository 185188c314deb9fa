"""Least privilege, TLS and tenant isolation.

* **ACL**: ``ACL_COMMANDS`` is the exact list of commands the library sends
  (checked against the source: every ``redis.call`` in ``lua/``, every command
  the Python code pipelines, plus ``EVALSHA`` and ``SCRIPT LOAD`` that redis-py's
  ``Script`` sends). A user limited to those commands and to the namespace's
  keys runs every store's whole flow on a private server with an empty
  ``ACL LOG``; anything outside the namespace, and any other command, is
  refused. ``acl_setuser_line`` is the line the README quotes.
* **TLS**: a private ``redis-server --tls-port`` with a throwaway CA and server
  certificate made by ``openssl``; the stores run over ``rediss://`` with
  certificate *and* host name verification on, and a client that does not
  trust the CA is refused.
* **Tenant isolation**: two namespaces holding the same hostile ids (colons,
  braces, glob characters, the other tenant's shard tag, unicode) never see
  or clobber each other's data, with and without ACLs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions as rex
from conftest import RedisServerProcess, Twin, free_port
from flows import HOSTILE_IDS, checkpoint_flow, claim_next_flow, kv_flow, pool_flow

import redis_agentstate
from redis_agentstate import (
    AgentStateError,
    AgentStatus,
    AsyncCheckpointStore,
    BackendError,
    BackendUnavailable,
    Checkpoint,
    CheckpointStore,
    RetryPolicy,
)
from redis_agentstate.keys import Keys
from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore
from redis_agentstate.pool_models import Cursor, PoolConfig
from redis_agentstate.pools import AsyncPoolStore, PoolStore

pytestmark = pytest.mark.real

#: Every command the library sends, by the client or from its Lua scripts
#: (Redis checks ACLs inside scripts too). Sorted; lower case as ACL rules read.
ACL_COMMANDS = (
    "blpop", "del", "evalsha", "exists", "get", "hdel", "hexists", "hget", "hgetall", "hincrby", "hkeys",
    "hlen", "hmget", "hrandfield", "hscan", "hset", "hstrlen", "incr", "info", "lindex", "llen", "lpop", "lrange",
    "lrem",
    "memory|usage",
    "persist", "pexpire", "pexpireat", "pexpiretime", "rpush", "script|load", "set", "spublish", "ssubscribe",
    "time", "type", "wait",
    "xadd", "xlen", "xrange", "xread", "zadd", "zcard", "zcount", "zlexcount", "zpopmin", "zrange", "zrangebylex",
    "zrangebyscore", "zrem", "zremrangebyscore", "zrevrangebylex", "zscan", "zscore",
)  # fmt: skip
#: What ``agentstate reshard`` sends besides (an operator's command, not a worker's: ``SCAN`` walks the
#: whole keyspace, so it is not in the workers' line); on a Cluster ``CLUSTER COUNTKEYSINSLOT`` and
#: ``CLUSTER GETKEYSINSLOT`` instead of ``SCAN``.
RESHARD_COMMANDS = ("dump", "pttl", "restore", "scan", "unlink")


def key_pattern(namespace: str) -> str:
    """The tightest glob of a namespace's keys: ``ns:{ns#*``.

    Not ``ns:*``: namespaces may contain ':', so ``~acme:*`` would also match
    every key of a tenant named ``acme:evil`` (``acme:evil:{acme:evil#..}``).
    """
    pattern = Keys(namespace).pattern()
    assert pattern == f"{namespace}:{{{namespace}#*"
    return pattern


def acl_rules(namespace: str, password: str) -> list[str]:
    return [
        "reset", "on", f">{password}", "resetkeys", f"~{key_pattern(namespace)}", "resetchannels",
        f"&{key_pattern(namespace)}", "-@all",
        *(f"+{c}" for c in ACL_COMMANDS),
    ]  # fmt: skip


def acl_setuser_line(user: str = "agentstate", namespace: str = "agentstate", password: str = "<password>") -> str:
    """The ``ACL SETUSER`` line the README quotes."""
    return " ".join(["ACL", "SETUSER", user, *acl_rules(namespace, password)])


# ---- the command list is the code's --------------------------------------------

_PKG = Path(redis_agentstate.__file__).parent


def commands_in_code(is_command: Callable[[str], bool]) -> set[str]:
    """Commands named in the package source: Lua ``redis.call`` and Python command tuples/lists.

    A Python candidate is any upper-case string literal opening a tuple or list
    (``("ZRANGEBYLEX", ...)``, ``["XREAD", ...]``); ``is_command`` keeps the
    ones the server knows as commands (not ``"COUNT"``, ``"BLOCK"``, type vars).
    """
    found: set[str] = set()
    for lua in _PKG.rglob("*.lua"):
        found |= {c.lower() for c in re.findall(r"redis\.p?call\(\s*['\"]([A-Z]+)['\"]", lua.read_text())}
    for py in _PKG.rglob("*.py"):  # every subpackage: wire/, langgraph/, fleet/
        found |= {c.lower() for c in re.findall(r"[(\[]\s*\"([A-Z]+)\"", py.read_text()) if is_command(c)}
    # MEMORY is sent as MEMORY USAGE only (agentstate stats), and granted so: not MEMORY PURGE.
    if "memory" in found:
        found = (found - {"memory"}) | {"memory|usage"}
    # redis-py's Script: EVALSHA, and SCRIPT LOAD after a NOSCRIPT; its PubSub.ssubscribe (wire/waker.py).
    return found | {"evalsha", "script|load", "ssubscribe"}


def test_acl_command_list_is_exactly_what_the_code_sends(admin: redis.Redis) -> None:
    known = {(c.decode() if isinstance(c, bytes) else c).upper() for c in admin.command_list()}
    in_code = commands_in_code(known.__contains__) - set(RESHARD_COMMANDS)
    assert set(RESHARD_COMMANDS) <= commands_in_code(known.__contains__)
    assert in_code == set(ACL_COMMANDS), (
        "the README's ACL line is out of date: "
        f"missing {sorted(in_code - set(ACL_COMMANDS))}, unused {sorted(set(ACL_COMMANDS) - in_code)}"
    )
    assert list(ACL_COMMANDS) == sorted(ACL_COMMANDS)


def test_readme_line() -> None:
    line = acl_setuser_line()
    assert line.startswith("ACL SETUSER agentstate reset on ><password> resetkeys ~agentstate:{agentstate#* ")
    assert "resetchannels &agentstate:{agentstate#* -@all +blpop +del +evalsha" in line


# ---- ACL: least privilege ----------------------------------------------------


@pytest.fixture(scope="module")
def private_server() -> Iterator[RedisServerProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH")
    server = RedisServerProcess.start()
    yield server
    server.stop()


@pytest.fixture
def admin(private_server: RedisServerProcess) -> Iterator[redis.Redis]:
    client = redis.Redis(port=private_server.port)
    yield client
    client.close()


class AclTenant:
    def __init__(self, server: RedisServerProcess, admin: redis.Redis, namespace: str, loop: Any) -> None:
        self.namespace = namespace
        self.user = f"u-{uuid.uuid4().hex[:8]}"
        self.password = uuid.uuid4().hex
        admin.execute_command("ACL", "SETUSER", self.user, *acl_rules(namespace, self.password))
        self.kw = {"port": server.port, "username": self.user, "password": self.password}
        self.sync = redis.Redis(**self.kw)
        self.aio = aioredis.Redis(**self.kw)
        self.loop = loop

    def store(self, sync_cls: type, async_cls: type, flavor: str, namespace: str | None = None) -> Any:
        ns = namespace or self.namespace
        if flavor == "sync":
            return sync_cls(self.sync, namespace=ns)
        return Twin(async_cls(self.aio, namespace=ns), self.loop)

    def close(self) -> None:
        self.sync.close()
        self.loop.run_until_complete(self.aio.aclose())


@pytest.fixture
def tenant(private_server: RedisServerProcess, admin: redis.Redis, twin_loop: Any) -> Iterator[AclTenant]:
    t = AclTenant(private_server, admin, f"acl-{uuid.uuid4().hex[:6]}", twin_loop)
    admin.execute_command("ACL", "LOG", "RESET")
    yield t
    t.close()


def acl_log(admin: redis.Redis) -> list[Any]:
    return list(admin.execute_command("ACL", "LOG"))


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_least_privilege_user_runs_every_flow(tenant: AclTenant, admin: redis.Redis, flavor: str) -> None:
    store = tenant.store(CheckpointStore, AsyncCheckpointStore, flavor)
    admin.script_flush()  # the user's first calls must load the scripts themselves (SCRIPT LOAD)
    checkpoint_flow(store, ["t1", *HOSTILE_IDS])
    claim_next_flow(store, [f"n{i}" for i in range(20)])
    if flavor == "sync":
        store.create(Checkpoint("leased"))
        with store.lease("leased", 1, lease_ms=3000) as lease:
            cp = lease.checkpoint
            cp.cycle_index = lease.cycle_index
            lease.commit(cp)
        assert store.load("leased").cycle_index == 1
    pools = tenant.store(PoolStore, AsyncPoolStore, flavor)
    pool_flow(pools, "p1")
    end = pools.snapshot("p1").cursor
    assert pools.watch("p1", end, block_ms=50) == []  # XREAD BLOCK as the user
    kv = tenant.store(KeyValueStore, AsyncKeyValueStore, flavor)
    kv_flow(kv)
    assert acl_log(admin) == [], "the library sent something the least-privilege user may not"


def test_an_operator_with_the_reshard_commands_grows_the_namespace(
    tenant: AclTenant, admin: redis.Redis, twin_loop: Any
) -> None:
    """The workers' user cannot reshard (no SCAN, DUMP, RESTORE); with RESHARD_COMMANDS it can, and the
    workers' user keeps working across it."""
    worker = CheckpointStore(tenant.sync, namespace=tenant.namespace, shards=4)
    for i in range(20):
        assert worker.create(Checkpoint(f"r{i}"))
    with pytest.raises(AgentStateError):
        worker.reshard(8)
    assert admin.get(Keys(tenant.namespace).layout_key()) == b"slots 4"
    admin.execute_command("ACL", "LOG", "RESET")
    operator = f"op-{uuid.uuid4().hex[:6]}"
    admin.execute_command("ACL", "SETUSER", operator, *acl_rules(tenant.namespace, "pw"),
                          *(f"+{c}" for c in RESHARD_COMMANDS))  # fmt: skip
    with redis.Redis(**{**tenant.kw, "username": operator, "password": "pw"}) as client:
        assert CheckpointStore(client, namespace=tenant.namespace).reshard(8).moved == 4
    assert sorted(worker.list()) == sorted(f"r{i}" for i in range(20))
    assert worker.claim_next(token="w", lease_ms=10_000) is not None
    assert acl_log(admin) == []


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_least_privilege_user_blocks_in_claim_next(tenant: AclTenant, admin: redis.Redis, flavor: str) -> None:
    """claim_next(block_ms) as the README's user: subscribed to its channels, woken by a create."""
    store = tenant.store(CheckpointStore, AsyncCheckpointStore, flavor)
    producer = CheckpointStore(redis.Redis(**tenant.kw), namespace=tenant.namespace)
    timer = threading.Timer(0.3, lambda: producer.create(Checkpoint("late", status=AgentStatus.RUNNING)))
    timer.start()
    cp = store.claim_next(token="w", lease_ms=30_000, block_ms=20_000)
    timer.join()
    assert cp is not None and cp.task_id == "late"
    assert store.claim_next(token="w2", lease_ms=30_000, block_ms=200) is None
    waker = store._waker if flavor == "sync" else store.wrapped._waker
    assert waker.state.subscribed
    assert acl_log(admin) == [], "the library sent something the least-privilege user may not"
    producer.client.close()
    if flavor == "async":
        tenant.loop.run_until_complete(waker.aclose())
    else:
        waker.close()


def test_user_without_the_channels_still_writes_and_blocked_callers_poll(
    private_server: RedisServerProcess, admin: redis.Redis
) -> None:
    """An ACL from before the channel rule: notify_due is refused inside the scripts (redis.pcall),
    every write still applies, and a blocked claim_next polls instead of being woken."""
    namespace = f"acl-{uuid.uuid4().hex[:6]}"
    user, password = f"u-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rules = [r for r in acl_rules(namespace, password) if not r.startswith("&")]
    admin.execute_command("ACL", "SETUSER", user, *rules)
    client = redis.Redis(port=private_server.port, username=user, password=password)
    store = CheckpointStore(client, namespace=namespace)
    assert store.create(Checkpoint("t1", status=AgentStatus.RUNNING))
    held = store.claim_next(token="w1", lease_ms=60_000)
    assert held is not None
    done = Checkpoint("t1", cycle_index=1, status=AgentStatus.RUNNING)
    assert store.commit(done, token="w1", expected_revision=held.revision)
    cp = store.claim_next(token="w2", lease_ms=60_000, block_ms=5_000)
    assert cp is not None and cp.claimed_cycle == 2
    timer = threading.Timer(0.3, lambda: store.create(Checkpoint("t2", status=AgentStatus.RUNNING)))
    timer.start()
    cp = store.claim_next(token="w3", lease_ms=60_000, block_ms=20_000)
    timer.join()
    assert cp is not None and cp.task_id == "t2"
    assert not store._waker.state.subscribed  # SSUBSCRIBE refused: it polled
    client.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_least_privilege_user_gets_corrupt_state_for_foreign_keys(
    tenant: AclTenant, admin: redis.Redis, flavor: str
) -> None:
    """The WRONGTYPE diagnosis (TYPE) and the scripts' probes (HLEN, XLEN) are in the user's command list."""
    from redis_agentstate import CorruptState

    store = tenant.store(CheckpointStore, AsyncCheckpointStore, flavor)
    store.create(Checkpoint("t"))
    keys = Keys(tenant.namespace)
    admin.delete(keys.task("t").messages)
    admin.set(keys.task("t").messages, "not a list")
    with pytest.raises(CorruptState) as info:
        store.claim("t", 1, token="w", lease_ms=1000)
    assert info.value.key == keys.task("t").messages
    pools = tenant.store(PoolStore, AsyncPoolStore, flavor)
    pools.open("p", PoolConfig())
    admin.delete(keys.pool("p").log)
    admin.set(keys.pool("p").log, "not a stream")
    with pytest.raises(CorruptState) as info:
        pools.watch("p")
    assert info.value.key == keys.pool("p").log
    assert acl_log(admin) == []


def test_least_privilege_user_is_refused_outside_its_namespace(
    tenant: AclTenant, admin: redis.Redis, private_server: RedisServerProcess
) -> None:
    victim_ns = f"victim-{uuid.uuid4().hex[:6]}"
    victim = CheckpointStore(admin, namespace=victim_ns)
    victim.create(Checkpoint("t", messages=["secret"]))
    victim_key = Keys(victim_ns).task("t").checkpoint
    admin.set("plain-key", "x")
    r = tenant.sync
    for attempt in (
        lambda: r.get("plain-key"),
        lambda: r.hgetall(victim_key),
        lambda: r.set("plain-key", "pwned"),
        lambda: r.delete(victim_key),
        lambda: r.keys("*"),
        lambda: r.flushall(),
        lambda: r.config_get("*"),
        lambda: r.execute_command("ACL", "WHOAMI"),
        lambda: r.script_flush(),
        # EVAL is allowed, but the script is held to the same rules:
        lambda: r.eval("return redis.call('GET', KEYS[1])", 1, "plain-key"),
        lambda: r.eval("return redis.call('SET', 'plain-key', 'pwned')", 0),
        lambda: r.eval("return redis.call('FLUSHALL')", 0),
    ):
        with pytest.raises(rex.ResponseError, match=r"(?i)noperm|permission|can't access|can't run"):
            attempt()
    # The stores turn the refusal into a BackendError, and nothing was touched.
    with pytest.raises(BackendError) as info:
        CheckpointStore(r, namespace=victim_ns).load("t")
    assert "NOPERM" in str(info.value).upper() or "PERMISSION" in str(info.value).upper()
    assert admin.get("plain-key") == b"x"
    assert victim.load("t").messages == ["secret"]
    assert sum(int(e[b"count"]) for e in acl_log(admin)) >= 13  # every refusal was logged


#: What a RedisCluster client needs on top: its slot map (CLUSTER SLOTS) and the
#: command table it uses to find keys (COMMAND).
CLUSTER_CLIENT_COMMANDS = ("cluster|slots", "command")


@pytest.mark.cluster
def test_least_privilege_user_on_redis_cluster(redis_cluster: Any) -> None:
    """The same user on every primary, plus the cluster client's two commands, runs every flow."""
    from redis.cluster import RedisCluster

    ns = f"aclc-{uuid.uuid4().hex[:6]}"
    user, password = f"u-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admins = [node.client() for node in redis_cluster.nodes]
    for a in admins:
        a.execute_command("ACL", "SETUSER", user, *acl_rules(ns, password), *(f"+{c}" for c in CLUSTER_CLIENT_COMMANDS))
        a.execute_command("ACL", "LOG", "RESET")
    host, port = redis_cluster.startup
    client = RedisCluster(host=host, port=port, username=user, password=password)
    try:
        checkpoint_flow(CheckpointStore(client, namespace=ns), ["t1", *HOSTILE_IDS])
        claim_next_flow(CheckpointStore(client, namespace=ns), [f"n{i}" for i in range(20)])
        pool_flow(PoolStore(client, namespace=ns), "p1")
        kv_flow(KeyValueStore(client, namespace=ns))
        assert all(acl_log(a) == [] for a in admins), "the library sent something the user may not"
        with pytest.raises(rex.ResponseError, match=r"(?i)noperm|permission|can't access"):
            client.get("outside-the-namespace")
    finally:
        client.close()
        for a in admins:
            a.execute_command("ACL", "DELUSER", user)
            a.close()


def test_namespace_prefix_of_another_is_isolated_only_by_the_tight_pattern(
    admin: redis.Redis, private_server: RedisServerProcess, twin_loop: Any
) -> None:
    """Tenant ``acme`` with ``~acme:{acme#*`` cannot touch tenant ``acme:evil``; ``~acme:*`` could."""
    base = f"acme{uuid.uuid4().hex[:4]}"
    other = f"{base}:evil"
    CheckpointStore(admin, namespace=other).create(Checkpoint("t", messages=["other tenant"]))
    other_key = Keys(other).task("t").checkpoint
    tight = AclTenant(private_server, admin, base, twin_loop)
    try:
        with pytest.raises(rex.NoPermissionError):
            tight.sync.hgetall(other_key)
        with pytest.raises(BackendError):
            CheckpointStore(tight.sync, namespace=other).load("t")
        assert CheckpointStore(tight.sync, namespace=base).load("t") is None
    finally:
        tight.close()
    # Why the pattern must not be "ns:*": the looser rule lets acme read acme:evil.
    loose_user = f"loose-{uuid.uuid4().hex[:6]}"
    admin.execute_command("ACL", "SETUSER", loose_user, "on", ">pw", f"~{base}:*", "+hgetall")
    loose = redis.Redis(port=private_server.port, username=loose_user, password="pw")
    try:
        assert loose.hgetall(other_key)
    finally:
        loose.close()
        admin.execute_command("ACL", "DELUSER", loose_user)


# ---- TLS -------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


# Python 3.13's default context verifies with VERIFY_X509_STRICT: a CA needs its key usage and a
# leaf its authority key identifier, as a real CA's certificates have them.
CA_EXTENSIONS = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
SERVER_EXTENSIONS = """\
subjectAltName=DNS:localhost,IP:127.0.0.1
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
"""


def make_certs(d: Path) -> dict[str, Path]:
    """A throwaway CA, and a server certificate it signed for localhost / 127.0.0.1."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "1", "-subj", "/CN=agentstate test CA", *CA_EXTENSIONS, cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=d)  # fmt: skip
    (d / "server.cnf").write_text(SERVER_EXTENSIONS)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "1", "-extfile", "server.cnf", cwd=d)  # fmt: skip
    # A second, unrelated CA: a client trusting only it must be refused.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.crt",
             "-days", "1", "-subj", "/CN=rogue CA", *CA_EXTENSIONS, cwd=d)  # fmt: skip
    return {name: d / f"{name}.crt" for name in ("ca", "server", "rogue")} | {"key": d / "server.key"}


class TlsServer:
    def __init__(self, server: RedisServerProcess, tls_port: int, certs: dict[str, Path]) -> None:
        self.server = server
        self.port = tls_port
        self.certs = certs

    def url(self, host: str = "localhost") -> str:
        return f"rediss://{host}:{self.port}/0"

    def kw(self) -> dict[str, Any]:
        return {"ssl_ca_certs": str(self.certs["ca"]), "ssl_cert_reqs": "required", "ssl_check_hostname": True}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("redis-server and openssl are needed for the TLS test")
    d = tmp_path_factory.mktemp("tls")
    certs = make_certs(d)
    tls_port = free_port()
    try:
        server = RedisServerProcess.start(
            "--tls-port", str(tls_port), "--tls-cert-file", str(certs["server"]),
            "--tls-key-file", str(certs["key"]), "--tls-ca-cert-file", str(certs["ca"]),
            "--tls-auth-clients", "no", "--bind", "127.0.0.1", "127.0.0.2",
        )  # fmt: skip
    except RuntimeError as exc:
        log = Path(str(exc).rsplit("see ", 1)[-1])
        text = log.read_text() if log.exists() else str(exc)
        if "TLS" in text and ("not supported" in text or "Unrecognized" in text or "Bad directive" in text):
            pytest.skip(f"this redis-server build has no TLS support: {text.strip().splitlines()[-1]}")
        raise
    yield TlsServer(server, tls_port, certs)
    server.stop()


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_stores_over_verified_tls(tls_server: TlsServer, flavor: str, twin_loop: Any) -> None:
    ns = f"tls-{uuid.uuid4().hex[:6]}"
    if flavor == "sync":
        client: Any = redis.Redis.from_url(tls_server.url(), **tls_server.kw())
        assert client.connection_pool.connection_class is redis.SSLConnection

        def build(sync_cls: type, async_cls: type) -> Any:
            return sync_cls(client, namespace=ns)
    else:
        client = aioredis.Redis.from_url(tls_server.url(), **tls_server.kw())
        assert client.connection_pool.connection_class is aioredis.SSLConnection

        def build(sync_cls: type, async_cls: type) -> Any:
            return Twin(async_cls(client, namespace=ns), twin_loop)

    try:
        store = build(CheckpointStore, AsyncCheckpointStore)
        checkpoint_flow(store, ["a", "b:c", "ü"])
        claim_next_flow(store, ["x", "y"])
        pools = build(PoolStore, AsyncPoolStore)
        pool_flow(pools, "p")
        kv_flow(build(KeyValueStore, AsyncKeyValueStore))
    finally:
        if flavor == "sync":
            client.close()
        else:
            twin_loop.run_until_complete(client.aclose())
    # Really encrypted: the plain-text port did not carry it, the TLS port did.
    with redis.Redis(port=tls_server.server.port) as plain:
        assert plain.exists(Keys(ns).task("a").checkpoint) == 0  # (acknowledged/deleted by the flow)
        assert PoolStore(plain, namespace=ns).snapshot("p").pool_id == "p"


def test_tls_refuses_an_untrusted_certificate_and_a_wrong_host(tls_server: TlsServer) -> None:
    rogue = redis.Redis.from_url(
        tls_server.url(), ssl_ca_certs=str(tls_server.certs["rogue"]), ssl_cert_reqs="required", retry=None
    )
    with pytest.raises(BackendUnavailable, match=r"(?i)certificate verify failed") as info:
        CheckpointStore(rogue, namespace="tls-x", retry=RetryPolicy(attempts=1)).list()
    assert isinstance(info.value.__cause__, rex.ConnectionError)
    rogue.close()
    # 127.0.0.2 reaches the same server, but the certificate names only localhost and 127.0.0.1.
    wrong_host = redis.Redis(
        host="127.0.0.2", port=tls_server.port, ssl=True, **tls_server.kw(), socket_connect_timeout=2, retry=None
    )
    with pytest.raises(rex.ConnectionError, match=r"(?i)certificate verify failed.*mismatch"):
        wrong_host.ping()
    wrong_host.close()
    # And TLS is not optional on that port: plain text gets nowhere.
    plain = redis.Redis(port=tls_server.port, socket_timeout=2, retry=None)
    with pytest.raises((rex.ConnectionError, rex.TimeoutError)):
        plain.ping()
    plain.close()


# ---- tenant isolation ------------------------------------------------------------


def _scan(raw: Any, pattern: str) -> list[bytes]:
    return sorted(raw.scan_iter(match=pattern, count=1000))


@pytest.fixture
def two_tenants(make: Callable[..., Any], namespace: str) -> tuple[Any, Any, str, str]:
    a_ns, b_ns = f"{namespace}-a", f"{namespace}-b"
    return (make(CheckpointStore, AsyncCheckpointStore, namespace=a_ns),
            make(CheckpointStore, AsyncCheckpointStore, namespace=b_ns), a_ns, b_ns)  # fmt: skip


def test_two_namespaces_cannot_read_or_clobber_each_other(two_tenants: tuple[Any, Any, str, str], raw: Any) -> None:
    a, b, a_ns, b_ns = two_tenants
    # Ids that try to reach the other tenant's keys through separators, tags or globs.
    evil = [*HOSTILE_IDS, f"{{{b_ns}#00}}:cp:t", f"}}:cp:x:{b_ns}", f"x}}{{{b_ns}#01}}", "t", f"../{b_ns}"]
    for tid in evil:
        assert a.create(Checkpoint(tid, messages=[f"A:{tid}"], shared_state={"owner": "A"}))
    assert b.list() == []
    for tid in evil:
        assert b.load(tid) is None
        assert b.claim(tid, 1, token="b", lease_ms=10_000) is None
        b.delete(tid)
        assert not b.acknowledge_terminal(tid, expected_revision=0)
    for tid in evil:
        assert b.create(Checkpoint(tid, messages=[f"B:{tid}"], shared_state={"owner": "B"}))
        cp = b.claim(tid, 1, token="b", lease_ms=10_000)
        cp.cycle_index = 1
        assert b.commit(cp, token="b", expected_revision=cp.revision)
    for tid in evil:
        cp = a.load(tid)
        assert cp.messages == [f"A:{tid}"] and cp.shared_state == {"owner": "A"} and cp.revision == 0
        assert a.claim(tid, 1, token="a", lease_ms=10_000).revision == 1  # B's claim/commit did not touch A
    assert a.list() == b.list() == sorted(evil)
    for tid in evil:
        a.delete(tid)
    assert a.list() == [] and b.list() == sorted(evil)
    # Every key each tenant wrote carries its own prefix: nothing leaked into the other's.
    # (A keeps only its per-shard history-epoch and claim/commit counters, which outlive deletes by design.)
    # And its layout record (the namespace's shard count, tests/test_layout.py).
    assert all(k.endswith((b"}:gen", b"}:counters", b"#layout}:layout")) for k in _scan(raw, f"{a_ns}:*"))
    b_keys = _scan(raw, f"{b_ns}:*")
    assert b_keys and all(k.startswith(f"{b_ns}:{{{b_ns}#".encode()) for k in b_keys)


def test_pool_and_kv_namespaces_are_isolated(make: Callable[..., Any], namespace: str) -> None:
    a_ns, b_ns = f"{namespace}-a", f"{namespace}-b"
    pa = make(PoolStore, AsyncPoolStore, namespace=a_ns)
    pb = make(PoolStore, AsyncPoolStore, namespace=b_ns)
    ka = make(KeyValueStore, AsyncKeyValueStore, namespace=a_ns)
    kb = make(KeyValueStore, AsyncKeyValueStore, namespace=b_ns)
    ids = [h[:200] for h in HOSTILE_IDS]
    for pid in ids:
        pa.open(pid, PoolConfig(message_policy={"owner": "A"}))
        ka.set(pid, b"A")
    assert pb.list() == [] and list(kb.keys()) == [] and kb.count() == 0
    for pid in ids:
        assert kb.get(pid) is None
        kb.set(pid, b"B")
        pb.open(pid, PoolConfig(message_policy={"owner": "B"}))
        assert pb.watch(pid, Cursor(0))[0].payload.message_policy == {"owner": "B"}
    for pid in ids:
        assert ka.get(pid) == b"A"
        assert pa.snapshot(pid).message_policy == {"owner": "A"}


def test_least_privilege_user_runs_the_langgraph_savers(tenant: AclTenant, admin: redis.Redis) -> None:
    """LangGraph's conformance suite (every saver method, list(None), delete_for_runs' pipeline) and a
    lease with a wait (BLPOP) as the least-privilege user: nothing refused."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver, ThreadBusy

    admin.script_flush()

    async def factory() -> Any:
        yield AsyncAgentStateSaver(tenant.aio, namespace=tenant.namespace)

    report = tenant.loop.run_until_complete(validate(checkpointer_test(name="acl")(factory)))
    assert all(r.passed for r in report.results.values()), {n: r.failures for n, r in report.results.items()}
    saver = AgentStateSaver(tenant.sync, namespace=tenant.namespace)
    assert list(saver.list(None, limit=1))
    other = AgentStateSaver(tenant.sync, namespace=tenant.namespace)
    with saver.lease("leased", lease_ms=3000), pytest.raises(ThreadBusy), other.lease("leased", wait_ms=100):
        pass
    assert acl_log(admin) == [], "the LangGraph savers sent something the least-privilege user may not"
