"""redis_agentstate.langgraph beyond the conformance suite: real graphs, storage shape, leases, bad input.

Every test runs on fakeredis, a real redis-server and the local Redis Cluster, for the
sync saver and the async one (graphs through ``invoke``/``ainvoke`` respectively).
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import re
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from conftest import require_real
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Interrupt, interrupt

from redis_agentstate import CorruptState, InvalidArgument, LeaseLost
from redis_agentstate.keys import Keys
from redis_agentstate.langgraph import AgentStateSaver, AsyncAgentStateSaver, ThreadBusy


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    count: int
    blob: str


def _step(state: State) -> dict[str, Any]:
    n = state["count"]
    return {"messages": [f"user {n} " + "x" * 80, f"ai {n} " + "y" * 80], "count": n + 1}


def _ask(state: State) -> dict[str, Any]:
    answer = interrupt(f"approve {state['count']}?")
    return {"messages": [f"answer:{answer}"]}


def _graph(saver: BaseCheckpointSaver[Any]) -> Any:
    sub = StateGraph(State)
    sub.add_node("ask", _ask)
    sub.add_edge(START, "ask")
    sub.add_edge("ask", END)
    b = StateGraph(State)
    b.add_node("step", _step)
    b.add_node("review", sub.compile())
    b.add_edge(START, "step")
    b.add_edge("step", "review")
    b.add_edge("review", END)
    return b.compile(checkpointer=saver)


def _plain_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    b = StateGraph(State)
    b.add_node("step", _step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    return b.compile(checkpointer=saver)


class Driver:
    """One face over a graph for both flavors: the async saver's graph is driven with a-methods."""

    def __init__(self, graph: Any, flavor: str, loop: asyncio.AbstractEventLoop) -> None:
        self.graph, self.flavor, self.loop = graph, flavor, loop

    def _go(self, name: str, *args: Any, **kw: Any) -> Any:
        if self.flavor == "sync":
            return getattr(self.graph, name)(*args, **kw)
        return self.loop.run_until_complete(getattr(self.graph, "a" + name)(*args, **kw))

    def invoke(self, *a: Any, **k: Any) -> Any:
        return self._go("invoke", *a, **k)

    def get_state(self, *a: Any, **k: Any) -> Any:
        return self._go("get_state", *a, **k)

    def update_state(self, *a: Any, **k: Any) -> Any:
        return self._go("update_state", *a, **k)

    def history(self, config: Any) -> list[Any]:
        if self.flavor == "sync":
            return list(self.graph.get_state_history(config))

        async def collect() -> list[Any]:
            return [s async for s in self.graph.aget_state_history(config)]

        return self.loop.run_until_complete(collect())


@pytest.fixture
def saver(backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop) -> Any:
    if flavor == "sync":
        return AgentStateSaver(backend.sync_client(), namespace=namespace)

    async def build() -> AsyncAgentStateSaver:
        return AsyncAgentStateSaver(backend.async_client(), namespace=namespace)

    return twin_loop.run_until_complete(build())


def _call(saver: Any, loop: asyncio.AbstractEventLoop, name: str, *a: Any, **k: Any) -> Any:
    """A saver method, sync or (on the async saver) awaited."""
    if isinstance(saver, AsyncAgentStateSaver):
        if name == "list":

            async def collect() -> list[Any]:
                return [t async for t in saver.alist(*a, **k)]

            return loop.run_until_complete(collect())
        return loop.run_until_complete(getattr(saver, "a" + name)(*a, **k))
    result = getattr(saver, name)(*a, **k)
    return list(result) if name == "list" else result


def _scenario(d: Driver) -> list[Any]:
    """invoke, interrupt in a subgraph, resume, update_state, history: everything observable."""
    seen: list[Any] = []
    cfg = {"configurable": {"thread_id": "thread-1"}}
    seen.append(d.invoke({"messages": ["hi"], "count": 0, "blob": "b" * 1024}, cfg))
    state = d.get_state(cfg, subgraphs=True)
    seen.append((state.next, [i.value for i in state.tasks[0].interrupts], state.tasks[0].state.values))
    sub_ns = state.tasks[0].state.config["configurable"]["checkpoint_ns"]
    assert sub_ns.startswith("review:")  # the subgraph's own checkpoints: a non-empty checkpoint_ns
    seen.append(d.invoke(Command(resume="yes"), cfg))
    seen.append(d.get_state(cfg).values)
    d.update_state(cfg, {"messages": ["edited"], "count": 10})
    seen.append(d.get_state(cfg).values)
    seen.append(d.invoke({"messages": ["again"]}, cfg))
    seen.append(d.invoke(Command(resume="no"), cfg))
    history = d.history(cfg)
    seen.append([(h.values, h.next, h.metadata["step"], h.metadata["source"]) for h in history])
    # Each checkpoint's parent is the one listed after it (the chain is linear).
    for newer, older in itertools.pairwise(history):
        assert newer.parent_config["configurable"]["checkpoint_id"] == older.config["configurable"]["checkpoint_id"]
    # Time travel: replay from the first checkpoint after the update.
    updated = next(h for h in history if h.metadata["source"] == "update")
    seen.append(d.invoke(None, updated.config))
    seen.append(d.get_state(cfg).values)
    return seen


def _plain(value: Any) -> Any:
    """``value`` with each Interrupt reduced to its payload (their ids hash time-based checkpoint ids)."""
    if isinstance(value, Interrupt):
        return ("interrupt", value.value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def test_state_graph_matches_the_in_memory_saver(
    saver: Any, flavor: str, twin_loop: asyncio.AbstractEventLoop, request: pytest.FixtureRequest
):
    # LangGraph's interrupt() reads its config from a contextvar that asyncio hands to the node's
    # task only from Python 3.11 on, so before 3.11 an async graph that interrupts fails inside
    # LangGraph ("Called get_config outside of a runnable context"), whatever the checkpointer.
    request.applymarker(
        pytest.mark.xfail(
            flavor == "async" and sys.version_info < (3, 11),
            reason="LangGraph: interrupt() in an async graph needs Python 3.11",
            raises=RuntimeError,
            strict=True,
        )
    )
    ours = _plain(_scenario(Driver(_graph(saver), flavor, twin_loop)))
    reference = _plain(_scenario(Driver(_graph(InMemorySaver()), flavor, twin_loop)))
    assert ours == reference
    assert ours[3]["messages"][-1] == "answer:yes"
    # The subgraph's checkpoints are stored under their namespace.
    namespaces = {
        t.config["configurable"]["checkpoint_ns"]
        for t in _call(saver, twin_loop, "list", {"configurable": {"thread_id": "thread-1"}})
    }
    assert "" in namespaces and any(ns.startswith("review:") for ns in namespaces)


def _raw(backend: Any) -> Any:
    return backend.sync_client()


def test_list_channel_is_stored_as_tails_and_rebuilt_exactly(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    ref = Driver(_plain_graph(InMemorySaver()), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "long"}}
    first = {"messages": [], "count": 0, "blob": "z" * 1024}
    for i in range(80):
        assert d.invoke(first if i == 0 else {"messages": []}, cfg) == ref.invoke(
            first if i == 0 else {"messages": []}, cfg
        )
    ours = [(h.values, h.metadata["step"]) for h in d.history(cfg)]
    assert ours == [(h.values, h.metadata["step"]) for h in ref.history(cfg)]
    assert len(ours[0][0]["messages"]) == 160
    blobs = _raw(backend).hgetall(Keys(namespace).thread("long").blobs)
    messages = {f: v for f, v in blobs.items() if f.split(b"\0")[1] == b"messages"}
    tails = [v for v in messages.values() if v[:1] == b"T"]
    fulls = [v for v in messages.values() if v[:1] == b"F"]
    # Every version of the list is stored, as its new items only (small tails, and anchors that reach
    # back to the previous anchor), never in full again: about twice the list in all, not once per step.
    assert len(tails) >= 150 and len(fulls) == 1
    final = len(saver.serde.dumps_typed(ours[0][0]["messages"])[1])
    assert sum(len(v) for v in messages.values()) < 3 * final
    # The 1 KiB channel that never changes is stored once, not once per checkpoint.
    assert sum(1 for f in blobs if f.split(b"\0")[1] == b"blob") == 1


def test_tail_whose_base_is_gone_is_stored_in_full(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop
):
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    ref = Driver(_plain_graph(InMemorySaver()), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "p"}}
    for driver in (d, ref):
        driver.invoke({"messages": ["a"], "count": 0, "blob": ""}, cfg)
        driver.invoke({"messages": ["b"]}, cfg)
    # Another saver deletes the thread: this one still remembers the list it last wrote.
    _call(_second(backend, flavor, namespace, twin_loop), twin_loop, "delete_thread", "p")
    ref = Driver(_plain_graph(InMemorySaver()), flavor, twin_loop)
    for driver in (d, ref):
        # The same list again: a tail of the deleted version would be a dangling base.
        driver.invoke({"messages": ["a", "user 0 " + "x" * 80, "ai 0 " + "y" * 80, "b"], "count": 1, "blob": ""}, cfg)
    assert d.get_state(cfg).values == ref.get_state(cfg).values
    assert [h.values for h in d.history(cfg)] == [h.values for h in ref.history(cfg)]


def test_prune_keep_latest_keeps_the_tail_chain(saver: Any, flavor: str, twin_loop: asyncio.AbstractEventLoop):
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "k"}}
    for i in range(5):
        d.invoke({"messages": [f"in{i}"], "count": i, "blob": ""} if i == 0 else {"messages": [f"in{i}"]}, cfg)
    before = d.get_state(cfg).values
    _call(saver, twin_loop, "prune", ["k"], strategy="keep_latest")
    assert len(d.history(cfg)) == 1
    assert d.get_state(cfg).values == before
    d.invoke({"messages": ["after"]}, cfg)  # and the thread goes on from there
    assert d.get_state(cfg).values["messages"][: len(before["messages"])] == before["messages"]


def test_put_is_one_round_trip_and_stores_only_new_versions(saver: Any, backend: Any, namespace: str, twin_loop):
    cfg1 = _call(
        saver,
        twin_loop,
        "put",
        generate_config("t"),
        generate_checkpoint(channel_values={"a": "x", "b": "y"}, channel_versions={"a": 1, "b": 1}),
        generate_metadata(),
        {"a": 1, "b": 1},
    )
    cfg = generate_config("t")
    cfg["configurable"]["checkpoint_id"] = cfg1["configurable"]["checkpoint_id"]
    _call(
        saver,
        twin_loop,
        "put",
        cfg,
        generate_checkpoint(channel_values={"a": "x2", "b": "y"}, channel_versions={"a": 2, "b": 1}),
        generate_metadata(step=1),
        {"a": 2},
    )
    assert _raw(backend).hlen(Keys(namespace).thread("t").blobs) == 3


def test_list_across_threads_pages_through_the_shard_indexes(saver: Any, twin_loop: asyncio.AbstractEventLoop):
    for t in range(5):
        parent = None
        for _ in range(3 if t else 130):  # one thread longer than a page
            cfg = generate_config(f"thread-{t}")
            if parent:
                cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            parent = _call(saver, twin_loop, "put", cfg, generate_checkpoint(), generate_metadata(), {})
    every = _call(saver, twin_loop, "list", None)
    assert len(every) == 130 + 4 * 3
    assert {t.config["configurable"]["thread_id"] for t in every} == {f"thread-{t}" for t in range(5)}
    long = [t.checkpoint["id"] for t in every if t.config["configurable"]["thread_id"] == "thread-0"]
    assert long == sorted(long, reverse=True)
    assert len(_call(saver, twin_loop, "list", None, limit=7)) == 7
    assert len(_call(saver, twin_loop, "list", None, filter={"source": "input"})) == 0


def test_ttl_is_set_on_every_data_key_by_each_write(backend: Any, flavor: str, namespace: str, twin_loop):
    if flavor == "sync":
        saver: Any = AgentStateSaver(backend.sync_client(), namespace=namespace, ttl=60)
    else:

        async def build() -> Any:
            return AsyncAgentStateSaver(backend.async_client(), namespace=namespace, ttl=60)

        saver = twin_loop.run_until_complete(build())
    stored = _call(
        saver,
        twin_loop,
        "put",
        generate_config("t", checkpoint_ns=""),
        generate_checkpoint(channel_values={"a": [1]}, channel_versions={"a": 1}),
        generate_metadata(run_id="r1"),
        {"a": 1},
    )
    _call(saver, twin_loop, "put_writes", stored, [("a", 2)], "task-1")
    raw = _raw(backend)
    k = Keys(namespace).thread("t")
    # The checkpoint and its writes are one index entry; the records and writes hashes hold only what
    # earlier versions stored (or writes sent before their checkpoint), and expire alike.
    for key in (k.index, k.blobs, k.runs):
        assert 0 < raw.pttl(key) <= 60_000, key
    assert not raw.exists(k.records) and not raw.exists(k.writes)


def test_bad_input_raises_typed_errors_and_writes_nothing(saver: Any, backend: Any, namespace: str, twin_loop):
    raw = _raw(backend)
    with pytest.raises(InvalidArgument, match="thread_id"):
        _call(saver, twin_loop, "put", {"configurable": {}}, generate_checkpoint(), generate_metadata(), {})
    with pytest.raises(InvalidArgument):
        _call(saver, twin_loop, "get_tuple", {"configurable": {"thread_id": "a\0b"}})
    with pytest.raises(InvalidArgument):
        _call(saver, twin_loop, "prune", ["t"], strategy="everything")
    k = Keys(namespace).thread("t")
    assert [key for key in k.as_list() if raw.exists(key)] == []  # (KEYS would see one cluster node only)
    # Data of another Redis type under one of the thread's keys: CorruptState naming it, nothing written.
    raw.set(k.blobs, "not a hash")
    with pytest.raises(CorruptState) as err:
        _call(
            saver,
            twin_loop,
            "put",
            generate_config("t"),
            generate_checkpoint(channel_values={"a": 1}, channel_versions={"a": 1}),
            generate_metadata(),
            {"a": 1},
        )
    assert err.value.key == k.blobs and "LangGraph thread 't'" in str(err.value)
    assert [key for key in k.as_list() if raw.exists(key)] == [k.blobs]


# ---- one writer per thread --------------------------------------------------


def _put(saver: Any, loop: Any, tid: str, parent: Any = None) -> Any:
    cfg = generate_config(tid)
    if parent:
        cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return _call(saver, loop, "put", cfg, generate_checkpoint(), generate_metadata(), {})


def _count(saver: Any, loop: Any, tid: str) -> int:
    return len(_call(saver, loop, "list", generate_config(tid)))


class _Holder:
    """Enter/exit a saver's lease whatever its flavor."""

    def __init__(self, saver: Any, loop: asyncio.AbstractEventLoop, tid: str, **kw: Any) -> None:
        self.lease = saver.lease(tid, **kw)
        self.loop = loop

    def __enter__(self) -> Any:
        if hasattr(self.lease, "__aenter__"):
            return self.loop.run_until_complete(self.lease.__aenter__())
        return self.lease.__enter__()

    def __exit__(self, *exc: object) -> None:
        if hasattr(self.lease, "__aexit__"):
            self.loop.run_until_complete(self.lease.__aexit__(*exc))
        else:
            self.lease.__exit__(*exc)


def _second(backend: Any, flavor: str, namespace: str, loop: asyncio.AbstractEventLoop) -> Any:
    if flavor == "sync":
        return AgentStateSaver(backend.sync_client(), namespace=namespace)

    async def build() -> Any:
        return AsyncAgentStateSaver(backend.async_client(), namespace=namespace)

    return loop.run_until_complete(build())


def test_a_leased_thread_refuses_every_other_writer(saver: Any, backend: Any, flavor: str, namespace: str, twin_loop):
    other = _second(backend, flavor, namespace, twin_loop)
    _put(other, twin_loop, "free")  # a thread never leased: written as any saver would
    with _Holder(saver, twin_loop, "t"):
        first = _put(saver, twin_loop, "t")
        with pytest.raises(ThreadBusy):
            _put(other, twin_loop, "t", first)
        with pytest.raises(ThreadBusy):
            _call(other, twin_loop, "put_writes", first, [("a", 1)], "task")
        with pytest.raises(ThreadBusy):
            _call(other, twin_loop, "delete_thread", "t")
        with pytest.raises(ThreadBusy), _Holder(other, twin_loop, "t", wait_ms=0):
            pass
        _call(other, twin_loop, "prune", ["t"], strategy="delete")  # left alone: it is leased
        assert _count(saver, twin_loop, "t") == 1
        _put(saver, twin_loop, "t", first)
        assert _call(saver, twin_loop, "get_tuple", first).pending_writes == []
    assert _count(saver, twin_loop, "t") == 2
    _put(other, twin_loop, "t")  # released: anyone writes again
    assert _count(other, twin_loop, "t") == 3


def test_a_holder_taken_over_after_expiry_writes_nothing(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop
):
    other = _second(backend, flavor, namespace, twin_loop)
    first = _put(saver, twin_loop, "t")
    # A holder that froze: its lease (300 ms) runs out and nobody renews it.
    _call_op(saver, twin_loop, saver._core.acquire("t", "frozen-token", 300, 0, None))
    time.sleep(0.4)
    with _Holder(other, twin_loop, "t"):
        with pytest.raises(LeaseLost):
            _put(saver, twin_loop, "t", first)
        with pytest.raises(LeaseLost):
            _call(saver, twin_loop, "put_writes", first, [("a", 1)], "task")
        _put(other, twin_loop, "t", first)
    assert _count(saver, twin_loop, "t") == 2


def _call_op(saver: Any, loop: asyncio.AbstractEventLoop, op: Any) -> Any:
    if isinstance(saver, AsyncAgentStateSaver):
        return loop.run_until_complete(saver._run(op))
    return saver._run(op)


def test_a_waiter_is_woken_by_the_release(backend: Any, namespace: str):
    holder = AgentStateSaver(backend.sync_client(), namespace=namespace)
    waiter = AgentStateSaver(backend.sync_client(), namespace=namespace)
    got: list[float] = []
    with holder.lease("t", lease_ms=30_000):

        def wait() -> None:
            with waiter.lease("t", wait_ms=10_000):
                got.append(time.monotonic())

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        assert not got
        released = time.monotonic()
    t.join(10)
    # Woken by the release, long before the holder's 30 s lease would have run out.
    assert got and got[0] - released < 2.0
    with holder.lease("t"), pytest.raises(ThreadBusy), waiter.lease("t", wait_ms=200):
        pass


async def test_async_waiter_is_woken_by_the_release(backend: Any, namespace: str):
    holder = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    waiter = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    try:
        async with holder.lease("t"):

            async def wait() -> float:
                async with waiter.lease("t", wait_ms=10_000):
                    return time.monotonic()

            task = asyncio.create_task(wait())
            await asyncio.sleep(0.3)
            assert not task.done()
            released = time.monotonic()
        assert await asyncio.wait_for(task, 10) - released < 2.0
    finally:
        await holder.client.aclose()
        await waiter.client.aclose()


async def test_losing_an_async_thread_lease_cancels_the_work(backend: Any, namespace: str):
    holder = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    thief = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    reached_end = False
    try:
        with pytest.raises(LeaseLost, match="work cancelled"):
            async with holder.lease("t", lease_ms=400) as lease:
                # Someone releases the claim under the holder's token (an operator, a bug): the next
                # renewal is refused, and the body must be stopped, not left to run on unfenced.
                assert await thief._run(thief._core.release("t", lease.token))
                await asyncio.sleep(3)
                reached_end = True
        assert not reached_end
        assert lease.lost
        async with thief.lease("t", wait_ms=0):  # nobody holds it any more
            pass
    finally:
        await holder.client.aclose()
        await thief.client.aclose()


async def test_an_async_thread_lease_body_cancelled_from_outside_stays_cancelled(backend: Any, namespace: str):
    holder = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    try:

        async def work() -> None:
            async with holder.lease("t", lease_ms=2_000):
                await asyncio.sleep(30)

        task = asyncio.create_task(work())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with holder.lease("t", wait_ms=0):  # released on the way out
            pass
    finally:
        await holder.client.aclose()


# ---- retention and serialization ------------------------------------------


def _delta_reducer(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class DeltaState(TypedDict):
    items: Annotated[list[Any], DeltaChannel(_delta_reducer, snapshot_frequency=3)]


def _delta_step(state: DeltaState) -> dict[str, Any]:
    return {"items": [len(state["items"])]}


def test_prune_keep_latest_keeps_what_a_delta_channel_replays(saver: Any, flavor: str, twin_loop):
    b = StateGraph(DeltaState)
    b.add_node("step", _delta_step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    d = Driver(b.compile(checkpointer=saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "delta"}}
    for _ in range(4):
        d.invoke({"items": ["in"]}, cfg)
    before = d.get_state(cfg).values
    assert before["items"] == ["in", 1, "in", 3, "in", 5, "in", 7]
    _call(saver, twin_loop, "prune", ["delta"], strategy="keep_latest")
    # A naive keep_latest rebuilds the channel as [] (the base class's warning).
    assert d.get_state(cfg).values == before
    assert 1 < len(d.history(cfg)) < 4 * 3 + 1  # ancestors back to the snapshot only


class _XorCipher:
    """A stand-in for AES in tests (EncryptedSerializer only needs encrypt/decrypt)."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def _encrypted_saver(backend: Any, flavor: str, namespace: str, loop: asyncio.AbstractEventLoop) -> Any:
    """A saver of either flavor whose serde is EncryptedSerializer (with the XOR stand-in)."""
    serde = EncryptedSerializer(_XorCipher())
    if flavor == "sync":
        return AgentStateSaver(backend.sync_client(), namespace=namespace, serde=serde)

    async def build() -> Any:
        return AsyncAgentStateSaver(backend.async_client(), namespace=namespace, serde=serde)

    return loop.run_until_complete(build())


def test_encrypted_serializer(backend: Any, flavor: str, namespace: str, twin_loop):
    saver = _encrypted_saver(backend, flavor, namespace, twin_loop)
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "secret"}}
    for i in range(3):
        d.invoke({"messages": ["top secret"], "count": 0, "blob": "classified"} if i == 0 else {"messages": []}, cfg)
    assert d.get_state(cfg).values["messages"][0] == "top secret"
    assert len(d.get_state(cfg).values["messages"]) == 7
    stored = _every_stored_byte(backend, namespace, "secret")
    assert b"top secret" not in stored and b"classified" not in stored
    assert b"+xor" in stored
    records = b"".join(_raw(backend).zrange(Keys(namespace).thread("secret").index, 0, -1))
    assert records.count(b"+xor") >= 7  # each checkpoint's record is the serializer's, encrypted whole


def test_the_keeper_renews_the_lease(backend: Any, namespace: str):
    holder = AgentStateSaver(backend.sync_client(), namespace=namespace)
    other = AgentStateSaver(backend.sync_client(), namespace=namespace)
    # The keeper must confirm a renewal within 2/3 of the lease: 800 ms here, not the 267 ms of a
    # 400 ms lease, which a loaded nox session's renewal could miss (see test_chaos' clock-skew test).
    with holder.lease("t", lease_ms=1_200) as lease:
        time.sleep(3.6)  # three leases long: only renewals keep it
        assert not lease.lost
        with pytest.raises(ThreadBusy):
            _put(other, None, "t")
        _put(holder, None, "t")
    _put(other, None, "t")


class Note(TypedDict):
    notes: Annotated[list[dict[str, Any]], operator.add]


def test_an_old_item_changed_in_place_is_not_lost_to_a_tail(saver: Any, flavor: str, twin_loop):
    """A node that edits an earlier list item in place: the stored list must carry the edit."""

    def add(state: Note) -> dict[str, Any]:
        return {"notes": [{"text": f"note {len(state['notes'])}"}]}

    def edit(state: Note) -> dict[str, Any]:
        state["notes"][0]["text"] = f"edited at {len(state['notes'])}"  # the object the last checkpoint holds
        return {"notes": [{"text": "edit"}]}

    def build(s: Any) -> Any:
        b = StateGraph(Note)
        b.add_node("add", add)
        b.add_node("edit", edit)
        b.add_edge(START, "add")
        b.add_edge("add", "edit")
        b.add_edge("edit", END)
        return b.compile(checkpointer=s)

    ours, ref = Driver(build(saver), flavor, twin_loop), Driver(build(InMemorySaver()), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "inplace"}}
    # durability="sync": each checkpoint is stored before the next step runs. (With LangGraph's default
    # "async", a put still in flight can see the next node's in-place edit, whatever the saver.)
    for _ in range(3):
        assert ours.invoke({"notes": []}, cfg, durability="sync") == ref.invoke({"notes": []}, cfg, durability="sync")
    assert ours.get_state(cfg).values["notes"][0]["text"] == "edited at 5"
    assert [h.values for h in ours.history(cfg)] == [h.values for h in ref.history(cfg)]


def test_refresh_on_read_extends_the_ttl(backend: Any, namespace: str):
    raw = _raw(backend)
    keys = Keys(namespace).thread("t")
    plain = AgentStateSaver(backend.sync_client(), namespace=namespace, ttl=60)
    refreshing = AgentStateSaver(backend.sync_client(), namespace=namespace, ttl=60, refresh_on_read=True)
    stored = _put(plain, None, "t")
    raw.pexpire(keys.index, 5_000)
    plain.get_tuple(stored)
    assert raw.pttl(keys.index) <= 5_000  # a read leaves the expiry alone by default
    refreshing.get_tuple(stored)
    assert raw.pttl(keys.index) > 50_000
    with pytest.raises(InvalidArgument):
        AgentStateSaver(backend.sync_client(), namespace=namespace, ttl=-1)


def test_anchors_and_full_copies_rebuild_exactly(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop, monkeypatch: pytest.MonkeyPatch
):
    import redis_agentstate.langgraph._put as put

    monkeypatch.setattr(put, "TAIL_CHAIN", 3)  # an anchor every 3rd version, a full copy every 3rd anchor
    d = Driver(_plain_graph(saver), flavor, twin_loop)
    ref = Driver(_plain_graph(InMemorySaver()), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "anchors"}}
    for i in range(15):
        payload = {"messages": [f"in {i}"], "count": 0, "blob": ""} if i == 0 else {"messages": [f"in {i}"]}
        assert d.invoke(payload, cfg) == ref.invoke(payload, cfg)
    assert [h.values for h in d.history(cfg)] == [h.values for h in ref.history(cfg)]
    blobs = _raw(backend).hgetall(Keys(namespace).thread("anchors").blobs)
    kinds = [v[:1] for f, v in blobs.items() if f.split(b"\0")[1] == b"messages"]
    # A full copy of 512 bytes or more is a reference to the thread's one shared copy ("R").
    assert kinds.count(b"F") + kinds.count(b"R") >= 2 and kinds.count(b"T") >= 20
    _call(saver, twin_loop, "prune", ["anchors"], strategy="keep_latest")  # keeps the chain the head reads
    assert d.get_state(cfg).values == ref.get_state(cfg).values


def test_the_compiled_graph_uses_the_allowlisted_serde_and_shares_leases(backend: Any, namespace: str):
    serde = JsonPlusSerializer(allowed_msgpack_modules=[("collections", "OrderedDict")])
    saver = AgentStateSaver(backend.sync_client(), namespace=namespace, serde=serde)
    clone = saver.with_allowlist({("tests", "test_langgraph", "State")})  # what StateGraph.compile may ask
    assert clone is not saver and clone.serde is not saver.serde
    assert clone._core.serde is clone.serde and clone._core.tokens is saver._core.tokens
    graph = _plain_graph(clone)
    cfg = {"configurable": {"thread_id": "shared"}}
    other = AgentStateSaver(backend.sync_client(), namespace=namespace)
    with saver.lease("shared"):  # leased on the saver: the clone's writes carry its token
        graph.invoke({"messages": ["a"], "count": 0, "blob": ""}, cfg)
        with pytest.raises(ThreadBusy):
            _plain_graph(other).invoke({"messages": ["b"]}, cfg)
    assert graph.get_state(cfg).values["messages"][0] == "a"


def test_list_by_checkpoint_id_without_a_namespace(saver: Any, twin_loop):
    first = _put(saver, twin_loop, "t")
    _put(saver, twin_loop, "t", first)
    cid = first["configurable"]["checkpoint_id"]
    found = _call(saver, twin_loop, "list", {"configurable": {"thread_id": "t", "checkpoint_id": cid}})
    assert [t.checkpoint["id"] for t in found] == [cid]
    assert len(_call(saver, twin_loop, "list", {"configurable": {"thread_id": "t"}}, limit=1)) == 1


def test_a_tail_chain_that_loops_is_corrupt_state(saver: Any, backend: Any, namespace: str, twin_loop):
    stored = _call(
        saver,
        twin_loop,
        "put",
        generate_config("loop"),
        generate_checkpoint(channel_values={"a": [1]}, channel_versions={"a": "v1"}),
        generate_metadata(),
        {"a": "v1"},
    )
    k = Keys(namespace).thread("loop")
    _raw(backend).hset(k.blobs, "\0a\0v1", b"T2:v1" + b"\x92\xa4json\xc4\x02[]")  # its own base
    with pytest.raises(CorruptState) as err:
        _call(saver, twin_loop, "get_tuple", stored)
    assert err.value.key == k.blobs


# ---- lease edges --------------------------------------------------------------


def _stored_keys(backend: Any, namespace: str, tid: str) -> list[str]:
    raw = _raw(backend)
    return [key for key in Keys(namespace).thread(tid).as_list()[:7] if raw.exists(key)]


def test_a_lease_on_an_int_thread_id_is_released(saver: Any, backend: Any, flavor: str, namespace: str, twin_loop):
    other = _second(backend, flavor, namespace, twin_loop)
    with _Holder(saver, twin_loop, 7) as lease:
        assert lease.thread_id == "7"
        first = _put(saver, twin_loop, 7)  # an int thread id, as put and get accept it
        with pytest.raises(ThreadBusy):
            _put(other, twin_loop, 7, first)
    with _Holder(other, twin_loop, 7, wait_ms=0):  # released: free at once
        _put(other, twin_loop, 7, first)
    _put(saver, twin_loop, 7)  # and the first saver kept no stale token
    assert _count(saver, twin_loop, "7") == 3
    # A thread id that cannot be one is refused before anything is sent.
    for bad in ("a\0b", 1.5, None, ["t"]):
        with pytest.raises(InvalidArgument):
            saver.lease(bad)
    assert _stored_keys(backend, namespace, "a\0b") == []


def test_a_write_under_an_expired_lease_is_refused_even_if_nobody_took_it(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop
):
    other = _second(backend, flavor, namespace, twin_loop)
    first = _put(saver, twin_loop, "t")
    # A holder that froze past its 300 ms lease, nobody renewing it.
    _call_op(saver, twin_loop, saver._core.acquire("t", "frozen-token", 300, 0, None))
    time.sleep(0.4)
    # Nobody else took the lease: the holder's late writes are refused all the same.
    with pytest.raises(LeaseLost, match="no longer live"):
        _put(saver, twin_loop, "t", first)
    with pytest.raises(LeaseLost):
        _call(saver, twin_loop, "put_writes", first, [("a", 1)], "task")
    assert _count(saver, twin_loop, "t") == 1
    # An unleased writer writes meanwhile (the lease expired): the holder must not fork the chain.
    _put(other, twin_loop, "t", first)
    with pytest.raises(LeaseLost):
        _put(saver, twin_loop, "t", first)
    assert _count(saver, twin_loop, "t") == 2
    assert _call(saver, twin_loop, "get_tuple", first).pending_writes == []


def test_a_crashed_holders_lease_key_expires(saver: Any, backend: Any, namespace: str, twin_loop):
    _call_op(saver, twin_loop, saver._core.acquire("t", "crashed", 200, 0, None))
    meta = Keys(namespace).thread("t").meta
    assert 0 < _raw(backend).pttl(meta) <= 200
    time.sleep(0.35)
    assert not _raw(backend).exists(meta)


@pytest.mark.parametrize("exp", ["inf", "nan", "-inf", "1e400", "0x10", "12abc", ""])
def test_a_lease_whose_expiry_is_unreadable_holds_nothing(
    saver: Any, backend: Any, namespace: str, twin_loop, exp: str
):
    """A lease key this library did not write (a hand-edited ``exp``, no TTL) is no lease: it must
    neither hold the thread for ever (``inf`` read as a live lease) nor fail every call on it."""
    meta = Keys(namespace).thread("t").meta
    _raw(backend).hset(meta, mapping={"holder": "ghost", "exp": exp})
    _call_op(saver, twin_loop, saver._core.acquire("t", "mine", 5_000, 0, None))
    assert _raw(backend).hget(meta, "holder") in (b"mine", "mine")
    assert 0 < _raw(backend).pttl(meta) <= 5_000


async def test_losing_an_async_thread_lease_cancels_a_running_ainvoke(backend: Any, namespace: str):
    """The loop blocked past the lease, then ainvoke: its first Redis command completes in the same loop
    iteration as the keeper's cancel, which Python 3.11's asyncio.wait_for (in redis-py) swallows."""
    saver = AsyncAgentStateSaver(backend.new_async_client(), namespace=namespace)
    reached: list[str] = []

    async def slow(state: State) -> dict[str, Any]:
        await asyncio.sleep(3)
        reached.append("end of node")
        return {"count": 1}

    b = StateGraph(State)
    b.add_node("slow", slow)
    b.add_edge(START, "slow")
    b.add_edge("slow", END)
    graph = b.compile(checkpointer=saver)
    try:
        started = time.monotonic()
        with pytest.raises(LeaseLost, match="work cancelled"):
            async with saver.lease("t", lease_ms=1_000):
                time.sleep(1.5)  # the event loop blocked: the keeper cannot renew
                await graph.ainvoke({"messages": [], "count": 0, "blob": ""}, {"configurable": {"thread_id": "t"}})
        await asyncio.sleep(0.1)
        assert reached == []
        assert time.monotonic() - started < 3.0  # stopped at the node's await, not at its end
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # every cancel of ours taken back
        async with saver.lease("t", wait_ms=0):  # released on the way out
            pass
    finally:
        await saver.client.aclose()


def test_delete_thread_racing_an_unleased_writer_leaves_no_half_thread(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop
):
    writer = _second(backend, flavor, namespace, twin_loop)
    cfg = generate_config("race")
    first = _call(
        writer,
        twin_loop,
        "put",
        cfg,
        generate_checkpoint(channel_values={"a": "x", "b": "y"}, channel_versions={"a": "1", "b": "1"}),
        generate_metadata(run_id="run-1"),
        {"a": "1", "b": "1"},
    )
    _call(saver, twin_loop, "delete_thread", "race")  # between two steps of the writer's run
    nxt = generate_config("race")
    nxt["configurable"]["checkpoint_id"] = first["configurable"]["checkpoint_id"]
    # The writer's next checkpoint reads b at the version the deleted one wrote: storing it would
    # resurrect the thread as an orphan whose channel b reads back missing.
    with pytest.raises(InvalidArgument, match="not in thread 'race'"):
        _call(
            writer,
            twin_loop,
            "put",
            nxt,
            generate_checkpoint(channel_values={"a": "x2", "b": "y"}, channel_versions={"a": "2", "b": "1"}),
            generate_metadata(run_id="run-1"),
            {"a": "2"},
        )
    assert _call(saver, twin_loop, "get_tuple", generate_config("race")) is None
    assert _call(saver, twin_loop, "list", generate_config("race")) == []
    assert "race" not in {t.config["configurable"]["thread_id"] for t in _call(saver, twin_loop, "list", None)}
    assert _stored_keys(backend, namespace, "race") == []
    # A new run on the same thread id starts afresh.
    _put(writer, twin_loop, "race")
    assert _count(saver, twin_loop, "race") == 1


# ---- the serializer -------------------------------------------------------------


def _every_stored_byte(backend: Any, namespace: str, tid: str) -> bytes:
    raw = _raw(backend)
    k = Keys(namespace).thread(tid)
    hashes = b"".join(f + v for key in (k.records, k.blobs, k.writes) for f, v in raw.hgetall(key).items())
    return hashes + b"".join(raw.zrange(k.index, 0, -1))


def test_a_serializer_assigned_after_construction_is_used(
    saver: Any, backend: Any, flavor: str, namespace: str, twin_loop
):
    # LangGraph's own docs and tests set the serializer this way, after building the saver.
    saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)
    d = Driver(_plain_graph(saver), flavor, twin_loop)  # compile copies the saver (with_allowlist)
    cfg = {"configurable": {"thread_id": "secret"}}
    for i in range(3):
        d.invoke(
            {"messages": ["PLAINTEXT-MARKER"], "count": 0, "blob": "CLASSIFIED"} if i == 0 else {"messages": []}, cfg
        )
    _call(saver, twin_loop, "put_writes", d.get_state(cfg).config, [("blob", "WRITE-MARKER")], "task")
    assert d.get_state(cfg).values["messages"][0] == "PLAINTEXT-MARKER"
    assert _call(saver, twin_loop, "get_tuple", cfg).pending_writes[0][2] == "WRITE-MARKER"
    stored = _every_stored_byte(backend, namespace, "secret")
    assert b"MARKER" not in stored and b"CLASSIFIED" not in stored
    assert b"+aes" in stored
    # The plain saver next to it still reads its own plaintext: only this saver changed.
    plain = _second(backend, flavor, namespace, twin_loop)
    with pytest.raises(Exception):  # noqa: B017 - what the wrong serializer raises is LangGraph's
        _call(plain, twin_loop, "get_tuple", cfg)


def test_a_value_the_serializer_cannot_encode_is_invalid_argument(saver: Any, backend: Any, namespace: str, twin_loop):
    first = _put(saver, twin_loop, "t")
    before = {key: _raw(backend).dump(key) for key in _stored_keys(backend, namespace, "t")}
    nxt = generate_config("t")
    nxt["configurable"]["checkpoint_id"] = first["configurable"]["checkpoint_id"]
    with pytest.raises(InvalidArgument, match="cannot be serialized"):
        _call(
            saver,
            twin_loop,
            "put",
            nxt,
            generate_checkpoint(channel_values={"a": threading.Lock()}, channel_versions={"a": "1"}),
            generate_metadata(),
            {"a": "1"},
        )
    with pytest.raises(InvalidArgument, match="cannot be serialized"):
        _call(saver, twin_loop, "put", nxt, generate_checkpoint(), generate_metadata(extra=object()), {})
    with pytest.raises(InvalidArgument, match="channel 'a'"):
        _call(saver, twin_loop, "put_writes", first, [("a", object())], "task")
    assert {key: _raw(backend).dump(key) for key in _stored_keys(backend, namespace, "t")} == before


# ---- semantics shared with LangGraph's savers -------------------------------------


def test_list_without_a_namespace_matches_the_in_memory_saver(saver: Any, twin_loop):
    ref = InMemorySaver()
    parents: dict[str, Any] = {}
    # Interleaved puts in three namespaces (the root first, as a graph with subgraphs writes them).
    for step, ns in enumerate(["", "sub:b", "", "sub:a", "sub:b", "", "sub:a", "sub:b"]):
        cfg = generate_config("t", checkpoint_ns=ns)
        if ns in parents:
            cfg["configurable"]["checkpoint_id"] = parents[ns]
        cp = generate_checkpoint()
        md = generate_metadata(step=step, source="loop" if step % 2 else "input")
        ours = _call(saver, twin_loop, "put", cfg, cp, md, {})
        theirs = ref.put(cfg, cp, md, {})
        assert ours == theirs
        parents[ns] = cp["id"]

    def ids(got: list[Any]) -> list[tuple[str, str]]:
        return [(t.config["configurable"]["checkpoint_ns"], t.checkpoint["id"]) for t in got]

    middle = {"configurable": {"checkpoint_id": parents["sub:a"]}}
    for config, kw in [
        ({"configurable": {"thread_id": "t", "checkpoint_ns": None}}, {}),
        ({"configurable": {"thread_id": "t"}}, {}),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": None}}, {"limit": 5}),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": None}}, {"filter": {"source": "loop"}}),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": None}}, {"before": middle}),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": "sub:b"}}, {}),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, {}),
    ]:
        expected = ids(list(ref.list(config, **kw)))
        assert ids(_call(saver, twin_loop, "list", config, **kw)) == expected, (config, kw)
    assert len(ids(_call(saver, twin_loop, "list", {"configurable": {"thread_id": "t", "checkpoint_ns": None}}))) == 8


def test_copy_thread_never_merges_and_runs_stay_with_their_thread(saver: Any, backend: Any, namespace: str, twin_loop):
    first = _call(
        saver, twin_loop, "put", generate_config("src"), generate_checkpoint(), generate_metadata(run_id="r1"), {}
    )
    _put(saver, twin_loop, "dst")
    before = _call(saver, twin_loop, "list", generate_config("dst"))
    # Onto a thread with checkpoints: refused, nothing written (the target's head stays its own).
    with pytest.raises(InvalidArgument, match="already has checkpoints"):
        _call(saver, twin_loop, "copy_thread", "src", "dst")
    assert [t.checkpoint["id"] for t in _call(saver, twin_loop, "list", generate_config("dst"))] == [
        t.checkpoint["id"] for t in before
    ]
    # Onto a new thread: a fork. Deleting the run that wrote the source's checkpoint rolls the
    # source back, not its copies.
    _call(saver, twin_loop, "copy_thread", "src", "fork")
    _call(saver, twin_loop, "delete_for_runs", ["r1"])
    assert _call(saver, twin_loop, "get_tuple", first) is None
    fork = _call(saver, twin_loop, "list", generate_config("fork"))
    assert [t.checkpoint["id"] for t in fork] == [first["configurable"]["checkpoint_id"]]
    assert fork[0].metadata["run_id"] == "r1"


def test_expired_threads_leave_the_shard_indexes(backend: Any, flavor: str, namespace: str, twin_loop):
    if flavor == "sync":
        saver: Any = AgentStateSaver(backend.sync_client(), namespace=namespace, ttl=0.3)
    else:

        async def build() -> Any:
            return AsyncAgentStateSaver(backend.async_client(), namespace=namespace, ttl=0.3)

        saver = twin_loop.run_until_complete(build())
    raw = _raw(backend)
    for tid in ("gone-1", "gone-2"):
        first = _call(
            saver,
            twin_loop,
            "put",
            generate_config(tid),
            generate_checkpoint(),
            generate_metadata(run_id=f"r-{tid}"),
            {},
        )
        nxt = generate_config(tid, checkpoint_ns="sub")
        _call(saver, twin_loop, "put", nxt, generate_checkpoint(), generate_metadata(run_id="r-shared"), {})
    assert first is not None
    k = Keys(namespace).thread("gone-1")
    assert raw.zscore(k.shard_threads, "gone-1") is not None
    time.sleep(0.5)  # every data key expired; the shard indexes still name the threads
    assert _call(saver, twin_loop, "list", None) == []
    for tid in ("gone-1", "gone-2"):
        t = Keys(namespace).thread(tid)
        assert raw.zscore(t.shard_threads, tid) is None
        assert [m for m in raw.zrange(t.shard_runs, 0, -1) if m.endswith(b"\0" + tid.encode())] == []


def test_from_conn_string_setup_and_context_managers(real_server: Any, namespace: str):
    url = require_real(real_server)
    with AgentStateSaver.from_conn_string(url, namespace=namespace) as saver:
        saver.setup()
        with saver as same:
            assert same is saver
            stored = _put(saver, None, "t")
        assert saver.get_tuple(stored) is not None
    with pytest.raises(InvalidArgument), AgentStateSaver.from_conn_string("http://nowhere", namespace=namespace):
        pass

    async def run() -> None:
        async with AsyncAgentStateSaver.from_conn_string(url, namespace=namespace) as asaver:
            await asaver.asetup()
            async with asaver as same:
                assert same is asaver
                assert (await asaver.aget_tuple(stored)) is not None

    asyncio.run(run())


def test_the_langgraph_extra_installs_langgraph():
    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    extra = re.search(r"^langgraph = \[(.*)\]$", text, re.M)
    assert extra is not None
    names = {re.split(r"[<>=!~ ;\[]", r.strip().strip('"'))[0] for r in extra.group(1).split(",")}
    # The README's LangGraph example imports langgraph.graph (StateGraph): the extra alone must run it.
    assert {"langgraph", "langgraph-checkpoint"} <= names


class BigState(TypedDict):
    big: str
    n: int
    log: Annotated[list[str], operator.add]


def _big_step(state: BigState) -> dict[str, Any]:
    n = state["n"] + 1
    out: dict[str, Any] = {"n": n, "log": [f"step {n}"]}
    if n % 7 == 0:
        out["big"] = f"v{n}:" + "z" * 200_000  # a new version now and then
    return out


def test_history_pages_by_bytes_and_carries_an_unchanged_value_once(
    saver: Any, flavor: str, twin_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every checkpoint reads the large channel; pages end by bytes (a small LIST_BYTES here), and
    a value the reader holds from the previous page is not sent again: the history is whole."""
    from redis_agentstate.langgraph import _lister

    monkeypatch.setattr(_lister, "LIST_BYTES", 300_000)
    b = StateGraph(BigState)
    b.add_node("step", _big_step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    graph = Driver(b.compile(checkpointer=saver), flavor, twin_loop)
    cfg = {"configurable": {"thread_id": "big"}}
    graph.invoke({"big": "v0:" + "y" * 500_000, "n": 0, "log": []}, cfg)
    for _ in range(24):
        graph.invoke({"log": []}, cfg)
    calls: list[Any] = []
    real = _lister.Call

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(_lister, "Call", counting)
    history = graph.history(cfg)
    assert len(history) == 75  # three checkpoints per invoke (input, start, step), 25 invokes
    for snap in history[:-1]:  # the very first checkpoint (before the input) holds nothing
        n = snap.values["n"]
        assert snap.values["big"].startswith(f"v{n - n % 7}:"), n
        assert len(snap.values["log"]) == n
    pages = calls.count("lg_list")
    assert 4 <= pages <= 12, pages  # 300 KB pages: one new 200 KB version every 14 checkpoints
    # And against get_tuple, one checkpoint at a time.
    for snap in history[::9]:
        assert graph.get_state(snap.config).values == snap.values
