"""How the saver stores a thread, compactly: shared values, compact records and writes, short versions.

Every test runs on fakeredis, a real redis-server and the local Redis Cluster, for the
sync saver and the async one. Each compares what the graph reads back against
LangGraph's ``InMemorySaver`` fed the same steps, then looks at the stored bytes.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from typing import Any, TypedDict

import msgpack
import pytest
import test_langgraph
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from test_langgraph import (
    Driver,
    State,
    _call,
    _encrypted_saver,
    _every_stored_byte,
    _plain_graph,
    _raw,
)

from redis_agentstate import CorruptState
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph._base import SaverBase
from redis_agentstate.langgraph._compact import DEFER_BYTES, SHARE_BYTES_OTHER_SERDE, SHARED_PREFIX, task_of_key
from redis_agentstate.langgraph._put import SaverWrites
from redis_agentstate.langgraph._reads import SaverReads
from redis_agentstate.langgraph._records import _held_writes, _reads_and_body, _unpack_writes
from redis_agentstate.wire import scripts

saver = test_langgraph.saver  # the fixture, shared with the saver's other tests
BIG = "B" * 1024


def _split_entry(entry: bytes) -> tuple[bytes, bytes]:
    """An index entry's member and stored checkpoint (see _lg.lua)."""
    first = entry.index(b"\0")
    second = entry.index(b"\0", first + 1)
    return entry[:second], entry[second + 1 :]


def _rewrite(i: int) -> dict[str, Any]:
    return {"messages": [f"in {i}"], "count": 0, "blob": ""} if i == 0 else {"messages": [f"in {i}"]}


def _rewriting_step(state: State) -> dict[str, Any]:
    # What a graph that returns its whole state writes: the same 1 KiB again at every step.
    return {"messages": [f"ai {len(state['messages'])}"], "count": state["count"] + 1, "blob": BIG}


def _rewriting_graph(saver: Any) -> Any:
    b = StateGraph(State)
    b.add_node("step", _rewriting_step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    return b.compile(checkpointer=saver)


def _shared(backend: Any, namespace: str, tid: str) -> dict[bytes, bytes]:
    blobs = _raw(backend).hgetall(Keys(namespace).thread(tid).blobs)
    return {f: v for f, v in blobs.items() if f.startswith(SHARED_PREFIX)}


def _history(saver: Any, loop: asyncio.AbstractEventLoop, tid: str) -> list[Any]:
    """Each checkpoint's values and pending writes (channel and value: task ids are drawn from the
    checkpoint ids, which differ between savers), newest first."""
    tuples = _call(saver, loop, "list", {"configurable": {"thread_id": tid}})
    return [(t.checkpoint["channel_values"], sorted(repr(w[1:]) for w in t.pending_writes)) for t in tuples]


def test_a_value_rewritten_at_every_step_is_stored_once(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    memory = InMemorySaver()
    d, ref = Driver(_rewriting_graph(saver), flavor, twin_loop), Driver(_rewriting_graph(memory), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "rw"}}
    for i in range(12):
        assert d.invoke(_rewrite(i), cfg) == ref.invoke(_rewrite(i), cfg)
    assert _history(saver, twin_loop, "rw") == _history(memory, twin_loop, "rw")
    # 12 inputs, 12 * 3 checkpoints, 12 * 2 tasks' writes, all naming one 1 KiB value: one copy of it.
    stored = _every_stored_byte(backend, namespace, "rw")
    assert stored.count(BIG.encode()) == 1
    assert len(stored) < 30_000


def test_prune_keeps_exactly_the_shared_values_still_referenced(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "pr"}}
    for i, blob in enumerate(["a" * 900, "b" * 900, "c" * 900]):
        d.invoke({"messages": [f"in {i}"], "count": 0, "blob": blob}, cfg)
    assert len(_shared(backend, namespace, "pr")) >= 3
    # A pending write on the newest checkpoint names a value no channel holds.
    latest = _call(saver, twin_loop, "get_tuple", cfg)
    _call(saver, twin_loop, "put_writes", latest.config, [("blob", "w" * 900)], "task-1")
    before = _call(saver, twin_loop, "get_tuple", cfg)
    _call(saver, twin_loop, "prune", ["pr"], strategy="keep_latest")
    after = _call(saver, twin_loop, "get_tuple", cfg)
    assert after.checkpoint["channel_values"] == before.checkpoint["channel_values"]
    assert after.pending_writes == before.pending_writes == [("task-1", "blob", "w" * 900)]
    kept = sorted(v for v in _shared(backend, namespace, "pr").values())
    assert [v.count(b"c" * 900) + v.count(b"w" * 900) for v in kept] == [1, 1]
    assert b"a" * 900 not in _every_stored_byte(backend, namespace, "pr")
    _call(saver, twin_loop, "prune", ["pr"], strategy="delete")
    assert _every_stored_byte(backend, namespace, "pr") == b""


def test_delete_for_runs_drops_the_shared_values_only_those_runs_referenced(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    for run, blob in (("run-1", "x" * 900), ("run-2", "y" * 900)):
        cfg = {"configurable": {"thread_id": "dr"}, "metadata": {"run_id": run}}
        d.invoke({"messages": [run], "count": 0, "blob": blob}, cfg)
    _call(saver, twin_loop, "delete_for_runs", ["run-2"])
    cfg = {"configurable": {"thread_id": "dr"}}
    assert d.get_state(cfg).values["blob"] == "x" * 900
    stored = _every_stored_byte(backend, namespace, "dr")
    # Run 1's value stays (in its input, and shared by its channel and its write); run 2's is gone.
    assert b"x" * 900 in stored and b"y" * 900 not in stored
    shared = list(_shared(backend, namespace, "dr").values())
    assert any(b"x" * 900 in v for v in shared) and not any(b"y" * 900 in v for v in shared)


def test_copy_thread_carries_the_shared_values(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_rewriting_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "cs"}}
    for i in range(3):
        d.invoke(_rewrite(i), cfg)
    _call(saver, twin_loop, "copy_thread", "cs", "cs-copy")
    assert _history(saver, twin_loop, "cs-copy") == _history(saver, twin_loop, "cs")
    _call(saver, twin_loop, "delete_thread", "cs")
    assert d.get_state({"configurable": {"thread_id": "cs-copy"}}).values["blob"] == BIG


def test_a_missing_shared_value_is_corrupt_state_naming_the_key(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_rewriting_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "gone"}}
    d.invoke(_rewrite(0), cfg)
    key = Keys(namespace).thread("gone").blobs
    _raw(backend).hdel(key, *_shared(backend, namespace, "gone"))
    with pytest.raises(CorruptState) as err:
        _call(saver, twin_loop, "get_tuple", cfg)
    assert err.value.key == key


def test_records_and_writes_are_compact_and_versions_short(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "cr"}}
    for i in range(3):
        d.invoke({"messages": [f"in {i}"], "count": 0, "blob": "b"} if i == 0 else {"messages": [f"in {i}"]}, cfg)
    raw = _raw(backend)
    k = Keys(namespace).thread("cr")
    entries = [_split_entry(e) for e in raw.zrange(k.index, 0, -1)]
    assert entries and not raw.exists(k.records) and not raw.exists(k.writes)  # one index entry each
    held = [w for _, stored in entries for w in _unpack_writes(_held_writes(stored, k.index)[0], k.index)]
    assert len(held) >= 6  # 3 invokes, 2 tasks' writes each, held in their checkpoints' entries
    for member, stored in entries:
        fields, body = _reads_and_body(stored, k.index)
        record = msgpack.unpackb(body, raw=False)
        assert record[0] == 2  # the compact form
        cid = member.split(b"\0")[1]
        assert cid not in body  # the id is the member's, not stored again
        assert all(re.fullmatch(rb"[0-9A-Za-z_~]{12}", f.split(b"\0")[2]) for f in fields)
    for _, stored in entries:
        for entry, write in _unpack_writes(_held_writes(stored, k.index)[0], k.index):
            # LangGraph's task ids are UUIDs: their 16 bytes in the entry's key, not stored again.
            task, _ = task_of_key(entry)
            assert entry[:1] == b"\0" and len(entry) == 19 and uuid.UUID(task).bytes == entry[1:17]
            assert task.encode() not in write and entry[1:17] not in write
    tup = _call(saver, twin_loop, "get_tuple", cfg)
    assert tup.checkpoint["id"] == tup.config["configurable"]["checkpoint_id"]
    assert set(tup.checkpoint) >= {"v", "id", "ts", "channel_values", "channel_versions", "versions_seen"}


def test_versions_sort_as_strings_and_an_earlier_thread_keeps_its_form():
    v, seen = None, []
    for _ in range(200):
        v = SaverWrites.next_version(v)
        seen.append(v)
    assert seen == sorted(seen) and len(set(seen)) == 200 and all(len(x) == 12 for x in seen)
    counters = [random.randrange(64**6 - 1) for _ in range(500)]
    minted = [SaverWrites.next_version(SaverWrites.next_version(n)) for n in counters]
    assert sorted(minted) == [m for _, m in sorted(zip(counters, minted, strict=True))]
    # A thread begun with the 21-character form goes on in it (the two forms do not sort together).
    legacy = SaverWrites.next_version("000000000041.0a1b2c3d")
    assert re.fullmatch(r"000000000042\.[0-9a-f]{8}", legacy)
    assert SaverWrites.next_version(7)[:6] == "000008"


def _legacy_next_version(current: Any) -> str:
    n = 0 if current is None else int(str(current).split(".")[0])
    return f"{n + 1:012d}.{random.getrandbits(32):08x}"


def test_a_thread_stored_in_the_earlier_forms_reads_back_and_goes_on(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    """A thread 0.3 wrote (serde records, 6-field writes, 21-character versions, no shared values)."""
    memory = InMemorySaver()
    d, ref = Driver(_rewriting_graph(saver), flavor, twin_loop), Driver(_rewriting_graph(memory), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "old"}}
    with monkeypatch.context() as m:
        m.setattr(SaverBase, "plain_serde", property(lambda self: False))
        m.setattr(SaverWrites, "next_version", staticmethod(_legacy_next_version))
        for i in range(4):
            assert d.invoke(_rewrite(i), cfg) == ref.invoke(_rewrite(i), cfg)
    raw = _raw(backend)
    k = Keys(namespace).thread("old")
    # 0.3's layout: records in the records hash, plain members in the index, the writes (packed as
    # [task, idx, path, channel, kind, data]) in the writes hash.
    for entry in raw.zrange(k.index, 0, -1):
        member, stored = _split_entry(entry)
        held, body_at = _held_writes(stored, k.index)
        reads_end = body_at - (len(stored) - len(stored[body_at:])) if not held else None
        plain = stored[: stored.index(b":") + 1 + int(stored[: stored.index(b":")])] + stored[body_at:]
        assert reads_end is None or plain == stored
        raw.zrem(k.index, entry)
        raw.zadd(k.index, {member: 0})
        raw.hset(k.records, member, plain)
        entries = []
        for key, write in _unpack_writes(held, k.index):
            task, idx = task_of_key(key)
            path, channel, kind, data = msgpack.unpackb(write, raw=False)
            old = msgpack.packb([task, idx, path, channel, kind or "msgpack", data], use_bin_type=True)
            text_key = f"{task}\0{idx}".encode()
            entries.append(b"%d:%s%d:%s" % (len(text_key), text_key, len(old), old))
        if entries:
            raw.hset(k.writes, member, b"".join(entries))
    assert not _shared(backend, namespace, "old") and raw.hlen(k.writes) > 0
    assert all(msgpack.unpackb(_reads_and_body(v, k.records)[1])[0] != 2 for v in raw.hvals(k.records))
    assert _history(saver, twin_loop, "old") == _history(memory, twin_loop, "old")
    for i in range(4, 8):  # and the thread goes on, in the new forms where they keep its order
        assert d.invoke(_rewrite(i), cfg) == ref.invoke(_rewrite(i), cfg)
    assert _history(saver, twin_loop, "old") == _history(memory, twin_loop, "old")
    versions = _call(saver, twin_loop, "get_tuple", cfg).checkpoint["channel_versions"]
    assert all(re.fullmatch(r"\d{12}\.[0-9a-f]{8}", v) for v in versions.values())


def test_an_encrypted_thread_is_stored_whole_and_shares_no_short_value(
    backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    """Its values encrypt differently each time: nothing up to DEFER_BYTES is stored apart."""
    saver = _encrypted_saver(backend, flavor, namespace, twin_loop)
    d = Driver(_rewriting_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "enc"}}
    for i in range(3):
        d.invoke(_rewrite(i), cfg)
    assert d.get_state(cfg).values["blob"] == BIG
    assert not _shared(backend, namespace, "enc")
    stored = _every_stored_byte(backend, namespace, "enc")
    assert BIG.encode() not in stored and b"versions_seen" not in stored


class Big(TypedDict):
    big: str
    n: int


def _count_step(state: Big) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def _big_graph(saver: Any) -> Any:
    b = StateGraph(Big)
    b.add_node("step", _count_step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    return b.compile(checkpointer=saver)


@pytest.mark.parametrize("serde", ["langgraph", "encrypted"])
def test_a_long_value_never_comes_through_a_script(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch, serde: str,
):  # fmt: skip
    """A value longer than the scripts carry (here 300 KB, unchanged over 30 checkpoints, and a
    pending write of another) is named in their replies and read with one HMGET: with LangGraph's
    serializer and with EncryptedSerializer alike (whose long values were copied through every
    script that read them: a 4 MiB channel's history took a 42 ms script)."""
    if serde == "encrypted":
        saver = _encrypted_saver(backend, flavor, namespace, twin_loop)
    memory = InMemorySaver()
    d, ref = Driver(_big_graph(saver), flavor, twin_loop), Driver(_big_graph(memory), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "long"}}
    for i in range(10):
        first = {"big": "L" * 300_000, "n": 0}
        assert d.invoke(first if i == 0 else {"n": 0}, cfg) == ref.invoke(first if i == 0 else {"n": 0}, cfg)
    for s in (saver, memory):
        _call(s, twin_loop, "put_writes", _call(s, twin_loop, "get_tuple", cfg).config, [("big", "W" * 200_000)], "t")
    seen: list[int] = []
    real = SaverReads.fetch_deferred

    def watching(self: Any, tid: str, replies: Any) -> Any:
        for reply in replies:
            if reply:
                items = [x for chain in reply[2][1::2] if isinstance(chain, list) for x in chain]
                assert all(isinstance(x, list) or len(x) < 70_000 for x in items)
                assert len(reply[3]) < 70_000
                seen.append(sum(isinstance(x, list) for x in items) + reply[3].count(b"Y\0\0"))
        return (yield from real(self, tid, replies))

    monkeypatch.setattr(SaverReads, "fetch_deferred", watching)
    assert _history(saver, twin_loop, "long") == _history(memory, twin_loop, "long")
    got = _call(saver, twin_loop, "get_tuple", cfg)
    assert (
        got.pending_writes == [("t", "big", "W" * 200_000)] and got.checkpoint["channel_values"]["big"] == "L" * 300_000
    )
    assert max(seen) >= 2  # the value and the write, each named instead of sent


def test_a_read_that_loses_a_long_value_under_it_reads_again(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    d = Driver(_big_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "race"}}
    d.invoke({"big": "R" * 100_000, "n": 0}, cfg)
    raw, key = _raw(backend), Keys(namespace).thread("race").blobs
    shared = _shared(backend, namespace, "race")  # the input's and the channel's: both long
    calls: list[bool] = []
    real = SaverReads.fetch_deferred

    def racing(self: Any, tid: str, replies: Any) -> Any:
        # The first read's HMGET runs while another client has the values away (a prune between).
        if not calls:
            raw.hdel(key, *shared)
        got = yield from real(self, tid, replies)
        if not calls:
            raw.hset(key, mapping=shared)
        calls.append(got)
        return got

    monkeypatch.setattr(SaverReads, "fetch_deferred", racing)
    assert _call(saver, twin_loop, "get_tuple", cfg).checkpoint["channel_values"]["big"] == "R" * 100_000
    assert calls == [False, True]
    # Gone for good while a blob still names it: the script itself reports the thread corrupt.
    calls.clear()
    monkeypatch.setattr(SaverReads, "fetch_deferred", real)
    raw.hdel(key, *shared)
    with pytest.raises(CorruptState) as err:
        _call(saver, twin_loop, "get_tuple", cfg)
    assert err.value.key == key


def test_the_deferral_threshold_is_the_scripts_own() -> None:
    """What the saver stores apart for another serializer is exactly what the scripts name, not copy."""
    lua = scripts.source("_lg")
    m = re.search(r"^local DEFER_BYTES = (\d+)$", lua, re.M)
    assert m is not None and int(m.group(1)) == DEFER_BYTES == SHARE_BYTES_OTHER_SERDE - 1
