"""The key/value seam: the seeds' get/set/delete vocabulary plus batches, keys and count.

Every store test runs four times through ``make``:
{fakeredis, real redis-server} x {KeyValueStore, AsyncKeyValueStore}.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import require_real
from redis.crc import key_slot

from redis_agentstate import InvalidArgument
from redis_agentstate.core import kv as _kv_core
from redis_agentstate.core.kv import KvCore
from redis_agentstate.keys import DEFAULT_SHARDS, LAYOUT_SLOTS, Keys, shard_of
from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore
from redis_agentstate.pool_models import PoolConfig
from redis_agentstate.pools import PoolStore
from redis_agentstate.wire import Batch, Call, Command, Pipe

MIB = 2**20
HOSTILE = ["a", "a:b", "{a}", "}{", "*", "ns:{ns#01}:kv:x", "with space", "new\nline", "ünï©ødé 🎉", "x" * 512]


def namespace_dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace but its layout record (a new namespace's first operation writes it)."""
    record = Keys(ns).layout_key().encode()
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{ns}:*", count=1000)) if k != record}


def same_shard_keys(n: int, shard: int, prefix: str = "k") -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if shard_of(f"{prefix}{i}") == shard:
            out.append(f"{prefix}{i}")
        i += 1
    return out


@pytest.fixture
def kv(make: Callable[..., Any]) -> Any:
    return make(KeyValueStore, AsyncKeyValueStore)


class TestBasics:
    def test_get_set_delete_round_trip(self, kv: Any) -> None:
        assert kv.get("k") is None and kv.exists("k") is False
        kv.set("k", b"v")
        assert kv.get("k") == b"v" and kv.exists("k") is True
        kv.set("k", b"w")
        assert kv.get("k") == b"w"
        kv.delete("k")
        assert kv.get("k") is None and kv.exists("k") is False
        kv.delete("k")  # deleting a missing key is fine
        kv.delete("never-set")

    @pytest.mark.parametrize(
        "value", [b"", b"\x00", bytes(range(256)) * 3, b"\x01\x93not-msgpack", "é".encode(), b"x" * MIB]
    )
    def test_any_bytes_value(self, kv: Any, value: bytes) -> None:
        kv.set("k", value)
        got = kv.get("k")
        assert got == value and type(got) is bytes

    def test_bytearray_and_memoryview_values(self, kv: Any) -> None:
        kv.set("a", bytearray(b"ba"))
        kv.set("m", memoryview(b"mv"))
        assert kv.get_many(["a", "m"]) == [b"ba", b"mv"]

    def test_limits_are_inclusive(self, kv: Any) -> None:
        kv.set("x" * 512, b"v" * (8 * MIB))
        assert len(kv.get("x" * 512)) == 8 * MIB
        kv.set("é" * 256, b"")  # 512 UTF-8 bytes
        assert kv.exists("é" * 256)

    def test_hostile_keys_never_collide_or_escape(self, kv: Any, raw: Any) -> None:
        for i, key in enumerate(HOSTILE):
            kv.set(key, str(i).encode())
        assert [kv.get(k) for k in HOSTILE] == [str(i).encode() for i in range(len(HOSTILE))]
        assert sorted(kv.keys()) == sorted(HOSTILE)
        assert kv.count() == len(HOSTILE)
        # Each value is at exactly the key keys.py names; the rest are the shards' indexes.
        keys = Keys(kv.namespace)
        shards = {shard_of(k) for k in HOSTILE}
        expected = {keys.kv(k) for k in HOSTILE} | {keys.kv_index(s)[0] for s in shards} | {keys.layout_key()}
        assert {k.decode() for k in raw.scan_iter(match=f"{kv.namespace}*", count=1000)} == expected

    def test_namespaces_are_isolated(self, kv: Any, make: Callable[..., Any]) -> None:
        other = make(KeyValueStore, AsyncKeyValueStore, namespace=kv.namespace + "-other")
        kv.set("k", b"mine")
        other.set("k", b"theirs")
        other.set("only-there", b"x")
        assert kv.get("k") == b"mine" and other.get("k") == b"theirs"
        assert list(kv.keys()) == ["k"] and kv.count() == 1
        assert list(other.keys()) == ["k", "only-there"] and other.count() == 2

    def test_shares_a_namespace_with_pools_without_clashing(self, kv: Any, backend: Any) -> None:
        pools = PoolStore(backend.sync_client(), namespace=kv.namespace)
        pools.open("p", PoolConfig())
        kv.set("p", b"kv value")
        kv.set("pools", b"x")
        assert pools.snapshot("p").cursor is not None
        assert sorted(kv.keys()) == ["p", "pools"] and kv.count() == 2


class TestBatches:
    def test_get_many_and_set_many(self, kv: Any) -> None:
        items = {f"k{i}": f"v{i}".encode() for i in range(300)}
        kv.set_many(items)
        wanted = ["k5", "missing", "k299", "k5"]
        assert kv.get_many(wanted) == [b"v5", None, b"v299", b"v5"]
        assert kv.get_many([]) == [] and kv.get_many(iter(["k1"])) == [b"v1"]
        assert kv.count() == 300 and sorted(kv.keys()) == sorted(items)

    def test_set_many_takes_pairs_and_last_duplicate_wins(self, kv: Any) -> None:
        kv.set_many([("a", b"1"), ("b", b"2"), ("a", b"3")])
        kv.set_many([])
        kv.set_many({})
        assert kv.get_many(["a", "b"]) == [b"3", b"2"] and kv.count() == 2

    def test_set_many_with_ttl(self, kv: Any, raw: Any) -> None:
        kv.set_many({"a": b"1", "b": b"2"}, ttl_ms=60_000)
        ttl = raw.pttl(Keys(kv.namespace).kv("a"))
        assert 0 < ttl <= 60_000

    def test_big_batches_are_chunked(self, kv: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_kv_core, "_BATCH_KEYS", 3)
        monkeypatch.setattr(_kv_core, "_BATCH_BYTES", 10)
        items = [(f"k{i}", b"x" * (i % 12)) for i in range(200)]
        kv.set_many(items)
        assert kv.get_many([k for k, _ in items]) == [v for _, v in items]
        assert kv.count() == 200

    def test_batches_are_one_pipeline(self) -> None:
        core = KvCore("ns", max_key_bytes=512, max_value_bytes=MIB)
        core.keys.configure(64, LAYOUT_SLOTS)  # what a store's first operation reads
        op = core.set_many({f"k{i}": b"v" for i in range(1000)})
        req = next(op)
        assert isinstance(req, Batch)
        # One script call (EVALSHA) per shard (and chunk); every call's keys share one slot.
        assert len(req.calls) == DEFAULT_SHARDS
        for call in req.calls:
            assert call.script == "kv_set"
            assert len({key_slot(k.encode()) for k in call.keys}) == 1
        with pytest.raises(StopIteration):
            op.send([1] * DEFAULT_SHARDS)
        op = core.get_many([f"k{i}" for i in range(1000)])
        req = next(op)
        assert isinstance(req, Pipe) and len(req.commands) == 1000

    def test_no_keys_or_scan_command(self) -> None:
        core = KvCore("ns", max_key_bytes=512, max_value_bytes=MIB)
        core.keys.configure(64, LAYOUT_SLOTS)  # what a store's first operation reads
        for op in (core.keys_list(), core.count()):
            req = next(op)
            assert isinstance(req, Batch)
            assert {c.script for c in req.calls} <= {"kv_keys", "kv_count"}
        for op in (core.get("k"), core.exists("k")):
            req = next(op)
            assert isinstance(req, Command) and req.args[0] in ("GET", "EXISTS")
        for op in (core.set("k", b"v"), core.delete("k")):
            req = next(op)
            assert isinstance(req, Call) and len({key_slot(k.encode()) for k in req.keys}) == 1

    def test_keys_and_count_send_no_keys_or_scan(self, real_server: Any, namespace: str) -> None:
        """Counted by the real server (INFO commandstats), so this runs on the real backend only."""
        raw = redis.Redis.from_url(require_real(real_server))
        kv = KeyValueStore(raw, namespace=namespace)
        kv.set_many({f"k{i}": b"v" for i in range(100)})

        def calls() -> dict[str, int]:
            stats = raw.info("commandstats")
            return {n: int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in ("keys", "scan")}

        before = calls()
        assert len(list(kv.keys())) == 100 and kv.count() == 100
        assert calls() == before
        raw.close()


class TestKeysAndTtl:
    def test_keys_are_sorted_and_paged(self, kv: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_kv_core, "_KEYS_PAGE", 3)
        keys = [f"key-{i:03d}" for i in range(150)] + same_shard_keys(20, 5, prefix="s")
        kv.set_many({k: b"v" for k in keys})
        got = kv.keys()
        assert iter(got) is got  # an iterator, as docs/design.md says
        assert list(got) == sorted(keys)

    def test_keys_page_walks_every_key_once_in_bounded_pages(self, kv: Any) -> None:
        keys = [f"key-{i:03d}" for i in range(150)] + same_shard_keys(40, 5, prefix="s") + HOSTILE
        kv.set_many({k: b"v" for k in keys})
        kv.set_many({f"gone{i}": b"x" for i in range(30)}, ttl_ms=1)
        time.sleep(0.05)
        seen: list[str] = []
        after: str | None = None
        pages = 0
        while True:
            page, after = kv.keys_page(after, limit=7)
            assert len(page) <= 7 and page == sorted(page)
            seen += page
            pages += 1
            if after is None:
                break
        assert seen == sorted(keys) and pages >= len(keys) // 7
        assert kv.keys_page(limit=1000) == (sorted(keys), None)
        assert kv.keys_page(sorted(keys)[-1]) == ([], None)
        for bad in (0, 1001, "7"):
            with pytest.raises(InvalidArgument, match="limit"):
                kv.keys_page(limit=bad)
        with pytest.raises(InvalidArgument, match="key"):
            kv.keys_page(b"bytes-not-str")

    def test_deleted_keys_leave_the_index(self, kv: Any) -> None:
        kv.set_many({"a": b"1", "b": b"2", "c": b"3"})
        kv.delete("b")
        assert list(kv.keys()) == ["a", "c"] and kv.count() == 2

    def test_expired_keys_are_never_reported(self, kv: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_kv_core, "_KEYS_PAGE", 2)
        kv.set_many({f"live{i}": b"v" for i in range(5)})
        # 1 s, not less: on a loaded 2-core CI (nox sessions side by side) the writes and the
        # paged count below took longer than 150 ms and the short keys expired before it.
        kv.set("short", b"x", ttl_ms=1000)
        kv.set_many({f"short{i}": b"x" for i in range(5)}, ttl_ms=1000)
        kv.set("long", b"y", ttl_ms=60_000)
        assert kv.count() == 12 and len(list(kv.keys())) == 12 and kv.get("short") == b"x"
        time.sleep(1.2)
        assert kv.get("short") is None and kv.exists("short") is False
        assert sorted(kv.keys()) == sorted([*(f"live{i}" for i in range(5)), "long"])
        assert kv.count() == 6

    def test_set_without_ttl_removes_the_ttl(self, kv: Any, raw: Any) -> None:
        kv.set("k", b"1", ttl_ms=100)
        kv.set("k", b"2")
        assert raw.pttl(Keys(kv.namespace).kv("k")) == -1
        time.sleep(0.2)
        assert kv.get("k") == b"2" and list(kv.keys()) == ["k"] and kv.count() == 1

    def test_ttl_can_be_renewed_by_a_new_set(self, kv: Any) -> None:
        kv.set("k", b"1", ttl_ms=100)
        kv.set("k", b"2", ttl_ms=60_000)
        time.sleep(0.2)
        assert kv.get("k") == b"2" and kv.count() == 1

    def test_writes_prune_expired_index_entries(self, kv: Any, raw: Any) -> None:
        shard = 7
        doomed = same_shard_keys(30, shard, prefix="d")
        kv.set_many({k: b"x" for k in doomed}, ttl_ms=50)
        kvkeys, kvttl = Keys(kv.namespace).kv_index(shard)
        assert raw.zcard(kvkeys) == 30 and raw.zcard(kvttl) == 30
        time.sleep(0.15)
        assert kv.count() == 0  # exact even before pruning
        kv.set(same_shard_keys(1, shard, prefix="fresh")[0], b"v")
        assert raw.zcard(kvkeys) == 1 and raw.zcard(kvttl) == 0


class TestBadInput:
    @pytest.mark.parametrize(
        "call",
        [
            lambda s: s.set("", b"v"),
            lambda s: s.set("x" * 513, b"v"),
            lambda s: s.set("é" * 257, b"v"),
            lambda s: s.set("\ud800", b"v"),
            lambda s: s.set(b"bytes-key", b"v"),
            lambda s: s.set(None, b"v"),
            lambda s: s.set("k", "a str"),
            lambda s: s.set("k", None),
            lambda s: s.set("k", b"v" * (8 * MIB + 1)),
            lambda s: s.set("k", b"v", ttl_ms=0),
            lambda s: s.set("k", b"v", ttl_ms=-5),
            lambda s: s.set("k", b"v", ttl_ms="100"),
            lambda s: s.set("k", b"v", ttl_ms=True),
            lambda s: s.set("k", b"v", ttl_ms=1.5),
            lambda s: s.get(""),
            lambda s: s.get(1),
            lambda s: s.exists(""),
            lambda s: s.delete(""),
            lambda s: s.delete("x" * 513),
            lambda s: s.get_many("abc"),
            lambda s: s.get_many(["ok", ""]),
            lambda s: s.get_many(None),
            lambda s: s.set_many({"ok": b"v", "": b"v"}),
            lambda s: s.set_many({"ok": b"v", "bad": "str"}),
            lambda s: s.set_many([("ok", b"v"), ("only-key",)]),
            lambda s: s.set_many([("ok", b"v"), "ab"]),
            lambda s: s.set_many("ab"),
            lambda s: s.set_many(42),
            lambda s: s.set_many({"ok": b"v", "big": b"x" * (8 * MIB + 1)}),
            lambda s: s.set_many({"ok": b"v"}, ttl_ms=0),
        ],
    )
    def test_rejected_before_anything_is_sent(self, kv: Any, raw: Any, call: Any) -> None:
        kv.set("keep", b"me")
        before = namespace_dump(raw, kv.namespace)
        with pytest.raises(InvalidArgument) as info:
            call(kv)
        assert isinstance(info.value, ValueError)
        assert namespace_dump(raw, kv.namespace) == before
        assert list(kv.keys()) == ["keep"]

    def test_custom_limits(self, make: Callable[..., Any]) -> None:
        small = make(KeyValueStore, AsyncKeyValueStore, max_key_bytes=4, max_value_bytes=3)
        small.set("abcd", b"xyz")
        with pytest.raises(InvalidArgument):
            small.set("abcde", b"x")
        with pytest.raises(InvalidArgument):
            small.set("a", b"wxyz")
        assert small.get("abcd") == b"xyz"

    @pytest.mark.parametrize(
        "kw", [{"max_key_bytes": 0}, {"max_value_bytes": -1}, {"max_key_bytes": "512"}, {"namespace": ""}]
    )
    def test_bad_store_arguments(self, make: Callable[..., Any], kw: dict[str, Any]) -> None:
        with pytest.raises(InvalidArgument):
            make(KeyValueStore, AsyncKeyValueStore, **kw)

    def test_decode_responses_client_is_refused(self, backend: Any) -> None:
        with pytest.raises(InvalidArgument):
            KeyValueStore(backend.sync_client(decode_responses=True))


class TestResilience:
    def test_noscript_after_script_flush(self, kv: Any, raw: Any) -> None:
        kv.set("a", b"1")
        raw.script_flush()
        kv.set("b", b"2")
        raw.script_flush()
        kv.delete("a")
        raw.script_flush()
        kv.set_many({"c": b"3"})
        raw.script_flush()
        assert list(kv.keys()) == ["b", "c"] and kv.count() == 2

    def test_both_protocols(self, backend: Any, namespace: str) -> None:
        for protocol in (2, 3):
            s = KeyValueStore(backend.sync_client(protocol=protocol), namespace=f"{namespace}-{protocol}")
            s.set_many({"a": b"1", "b": b"2"}, ttl_ms=60_000)
            assert s.get_many(["a", "b", "c"]) == [b"1", b"2", None]
            assert list(s.keys()) == ["a", "b"] and s.count() == 2 and s.exists("a")
