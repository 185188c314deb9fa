"""KV writes re-sent by the caller (issue 9, item 8): they are idempotent by nature, no identity needed.

``set``/``set_many`` write a value (the same value again is the same state) and ``delete`` removes one
(removing it again finds nothing): a re-send after ``BackendUnavailable`` returns what the first call
returned and changes nothing. Runs on {fakeredis, real, cluster} x {sync, async}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore


def namespace_dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace with its DUMP and, for the index zsets, their members and scores."""
    out: dict[bytes, Any] = {}
    for k in sorted(raw.scan_iter(match=f"{ns}:*", count=1000)):
        out[k] = (raw.dump(k), raw.zrange(k, 0, -1, withscores=True) if raw.type(k) == b"zset" else None)
    return out


@pytest.fixture
def kv(make: Callable[..., Any]) -> Any:
    return make(KeyValueStore, AsyncKeyValueStore)


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda kv: kv.set("a", b"1"), id="set"),
        pytest.param(lambda kv: kv.set_many({"a": b"1", "b": b"2", "c": b""}), id="set_many"),
        pytest.param(lambda kv: kv.delete("keep"), id="delete"),
        pytest.param(lambda kv: kv.delete("never-set"), id="delete-missing"),
    ],
)
def test_a_resent_write_returns_the_same_and_changes_nothing(kv: Any, raw: Any, write: Any) -> None:
    kv.set("keep", b"x")
    kv.set("other", b"y", ttl_ms=3_600_000)
    first = write(kv)
    after_first = namespace_dump(raw, kv.namespace)
    values = kv.get_many(["a", "b", "c", "keep", "other"])
    assert write(kv) == first
    assert namespace_dump(raw, kv.namespace) == after_first
    assert kv.get_many(["a", "b", "c", "keep", "other"]) == values
    assert kv.count() == len([v for v in values if v is not None])


def test_a_resent_set_with_a_ttl_keeps_the_value_and_restarts_the_ttl(kv: Any) -> None:
    """The one visible difference: a TTL counts from the write that landed last (as SET PX does)."""
    kv.set("t", b"v", ttl_ms=60_000)
    kv.set("t", b"v", ttl_ms=60_000)
    assert kv.get("t") == b"v" and kv.exists("t") and kv.count() == 1
