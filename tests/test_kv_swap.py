"""``KeyValueStore.swap``: compare-and-set of one key (``lua/kv_swap.lua``), what a registry of
records that several servers update (``agentstate serve``'s assistants) writes with.

Runs through ``make``: {fakeredis, real redis-server} x {KeyValueStore, AsyncKeyValueStore}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from redis_agentstate import InvalidArgument


@pytest.fixture
def kv(make: Callable[..., Any]) -> Any:
    from redis_agentstate.kv import AsyncKeyValueStore, KeyValueStore

    return make(KeyValueStore, AsyncKeyValueStore)


def test_swap_sets_only_from_the_value_expected(kv: Any) -> None:
    assert kv.swap("a", None, b"1") is True  # absent, as expected
    assert kv.get("a") == b"1" and list(kv.keys()) == ["a"] and kv.count() == 1
    assert kv.swap("a", None, b"2") is False  # it exists now
    assert kv.swap("a", b"0", b"2") is False  # not what it holds
    assert kv.get("a") == b"1"
    assert kv.swap("a", b"1", b"2") is True
    assert kv.get("a") == b"2"
    assert kv.swap("b", b"x", b"3") is False  # a value expected where there is none
    assert kv.get("b") is None and kv.count() == 1


def test_a_swap_sent_twice_reports_the_value_it_set(kv: Any) -> None:
    assert kv.swap("a", None, b"1") is True
    assert kv.swap("a", None, b"1") is True  # its re-send: the key holds the value, nothing else done
    assert kv.swap("a", b"1", b"2") is True and kv.swap("a", b"1", b"2") is True
    assert kv.get("a") == b"2"


def test_a_swap_clears_a_ttl_and_keeps_the_index(kv: Any) -> None:
    kv.set("t", b"x", ttl_ms=50)
    assert kv.swap("t", b"x", b"y") is True
    import time

    time.sleep(0.1)
    assert kv.get("t") == b"y" and list(kv.keys()) == ["t"]


def test_bad_input_is_refused_before_a_write(kv: Any) -> None:
    with pytest.raises(InvalidArgument):
        kv.swap("", None, b"1")
    with pytest.raises(InvalidArgument):
        kv.swap("a", None, "not bytes")  # type: ignore[arg-type]
    assert kv.count() == 0
