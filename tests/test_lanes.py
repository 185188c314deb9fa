"""The short way of a script call (``wire/lanes.py``): what it sends, and what it does when a call fails.

A lane serves a plain redis-py client (the real-server variants); fakeredis and Cluster clients take
redis-py's own path, so their variants check that the same operations behave the same without one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions as rex
from faults.replies import lose_first_reply, lose_reply

from redis_agentstate import Checkpoint, CorruptState
from redis_agentstate.keys import Keys
from redis_agentstate.wire import lanes
from redis_agentstate.wire.lanes import AsyncLane, SyncLane, pack_evalsha

LEASE = 30_000


def _inner(store: Any) -> Any:
    return getattr(store, "wrapped", store)


def _lane(store: Any) -> Any:
    return getattr(_inner(store)._scripts, "lane", None)


def _raw(backend: Any) -> Any:
    return backend.sync_client()


def _running(store: Any, tid: str = "t") -> Checkpoint:
    store.create(Checkpoint(tid, shared_state={"n": 0}))
    cp = store.claim(tid, 1, token="w", lease_ms=LEASE)
    assert cp is not None
    return cp


def _step(store: Any, cp: Checkpoint) -> Checkpoint:
    cp.cycle_index = cp.claimed_cycle
    cp.shared_state["n"] += 1
    nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
    assert nxt is not None
    return nxt


def test_a_lane_serves_plain_clients_only(store: Any, backend: Any, flavor: str) -> None:
    lane = _lane(store)
    if backend.kind == "real":
        assert isinstance(lane, SyncLane if flavor == "sync" else AsyncLane)
    else:
        assert lane is None  # fakeredis, Cluster: redis-py's own path
    cp = _step(store, _running(store))
    assert cp.shared_state == {"n": 1} and cp.claimed_cycle == 2


def test_script_flush_is_invisible(store: Any, backend: Any) -> None:
    cp = _running(store)
    for _ in range(3):
        _raw(backend).script_flush()
        cp = _step(store, cp)
    assert store.load("t").shared_state == {"n": 3}
    assert store.renew("t", token="w", expected_revision=cp.revision, lease_ms=LEASE) is True


def test_a_dropped_connection_is_sent_again(store: Any, backend: Any) -> None:
    if backend.kind != "real":
        pytest.skip("killing the store's connection needs a real server")
    cp = _step(store, _running(store))
    raw = _raw(backend)
    me = raw.client_id()
    killed = 0
    for c in raw.client_list():
        if int(c["id"]) != me:
            killed += raw.client_kill_filter(_id=c["id"])
    assert killed >= 1
    cp = _step(store, cp)  # the lane's connection is gone: the driver sends again, applied once
    assert store.load("t").shared_state == {"n": 2} and cp.claimed_cycle == 3


def test_an_error_reply_keeps_the_connection(store: Any, backend: Any, namespace: str) -> None:
    cp = _step(store, _running(store))
    raw = _raw(backend)
    key = Keys(namespace).task("bad").checkpoint
    raw.set(key, "not a hash")
    with pytest.raises(CorruptState):
        store.load("bad")
    lane = _lane(store)
    if lane is not None:
        kept = list(lane.free)
        assert kept  # the error reply was read whole: its connection went back to the lane
    _step(store, cp)
    if lane is not None:
        assert lane.free == kept


def test_stores_on_one_client_share_its_kept_connections(backend: Any, namespace: str) -> None:
    """Stores that come and go on one client leave it at most MAX_IDLE kept connections, not one each."""
    from redis_agentstate import CheckpointStore

    client = backend.sync_client()
    for i in range(3 * lanes.MAX_IDLE):
        store = CheckpointStore(client, namespace=f"{namespace}-{i}")
        assert store.create(Checkpoint("t"))
        if backend.kind == "real":
            assert _lane(store).free is _lane(CheckpointStore(client, namespace=namespace)).free
    if backend.kind == "real":
        assert 1 <= len(client.connection_pool._in_use_connections) <= lanes.MAX_IDLE


def test_a_wrapped_script_call_sees_every_request(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = _running(store)
    seen: list[str] = []
    scripts = _inner(store)._scripts
    names = {id(s): n for n, s in scripts.items()}
    cls = type(scripts["commit_and_claim"])
    original = cls.__call__

    def spy(self_: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        seen.append(names.get(id(self_), "?"))
        return original(self_, keys=keys, args=args, client=client)

    monkeypatch.setattr(cls, "__call__", spy)
    _step(store, cp)
    store.load("t")
    assert seen == ["commit_and_claim", "load"]


def _lane_sends(monkeypatch: pytest.MonkeyPatch, script: Any) -> list[bytes]:
    """Every send of ``script`` that goes the lane's way, NOSCRIPT ones too: put on the lanes' send
    before a lost-reply harness is, so beneath it."""
    sends: list[bytes] = []
    sha = script.sha.encode()
    for cls in (SyncLane, AsyncLane):
        original = cls._send
        if cls is SyncLane:

            def send(self_: Any, packed: bytes, _o: Any = original) -> Any:
                if sha in packed:
                    sends.append(packed)
                return _o(self_, packed)

        else:

            async def send(self_: Any, packed: bytes, _o: Any = original) -> Any:
                if sha in packed:
                    sends.append(packed)
                return await _o(self_, packed)

        monkeypatch.setattr(cls, "_send", send)
    return sends


@pytest.mark.parametrize("harness", ["lose_reply", "lose_first_reply"])
def test_a_lost_reply_is_lost_and_sent_again_on_the_lane(
    store: Any, backend: Any, monkeypatch: pytest.MonkeyPatch, harness: str
) -> None:
    """The lost-reply harness (``tests/faults/replies.py``) keeps the lane in use: the call whose reply
    it loses and the driver's re-send of it both go the way a plain client's calls go."""
    cp = _running(store)
    script = _inner(store)._scripts["commit_and_claim"]
    if backend.kind == "real":
        # Loaded before the count starts: a SCRIPT FLUSH by an earlier test on this worker's server
        # would add a NOSCRIPT send (test_a_lost_reply_meets_noscript_on_the_lane counts those).
        _raw(backend).script_load(script.script)
    sends = _lane_sends(monkeypatch, script)
    if harness == "lose_reply":
        loss = lose_reply(monkeypatch, "commit_and_claim")
        cp = _step(store, cp)
        assert loss.lost is not None and loss.resent == loss.lost and len(loss.calls) == 2
        sent = [args for _keys, args in loss.calls]
    else:
        sent = lose_first_reply(script, monkeypatch)
        cp = _step(store, cp)
        assert len(sent) == 2 and sent[0] == sent[1]
    assert store.load("t").shared_state == {"n": 1} and cp.claimed_cycle == 2  # applied once
    if backend.kind == "real":
        assert _lane(store) is not None
        assert len(sends) == 2 and sends[0] == sends[1]  # lost and re-sent, both by the lane
        assert all(
            packed.endswith(b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args))
            for packed, args in zip(sends, sent, strict=True)
        )
    else:
        assert _lane(store) is None and sends == []  # redis-py's Script path, lost and re-sent there


@pytest.mark.parametrize("flush", ["before", "between"])
def test_a_lost_reply_meets_noscript_on_the_lane(
    store: Any, backend: Any, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    """A SCRIPT FLUSH before the lost call, or between it and its re-send: the lane loads the script
    again and sends the call; the harness counts the calls the server ran, not the NOSCRIPT ones."""
    cp = _running(store)
    raw = _raw(backend)
    script = _inner(store)._scripts["commit_and_claim"]
    raw.script_load(script.script)  # so the flush below makes the only NOSCRIPT, whoever ran before
    sends = _lane_sends(monkeypatch, script)
    if flush == "before":
        raw.script_flush()
        sent = lose_first_reply(script, monkeypatch)
    else:
        sent = lose_first_reply(script, monkeypatch, between=raw.script_flush)
    cp = _step(store, cp)
    assert len(sent) == 2 and sent[0] == sent[1]
    assert store.load("t").shared_state == {"n": 1} and cp.claimed_cycle == 2
    if backend.kind == "real":
        assert len(sends) == 3 and len(set(sends)) == 1  # NOSCRIPT, lost, re-sent (in the flush's order)
    else:
        assert sends == []


def test_a_cancelled_call_drops_its_connection(backend: Any, namespace: str, twin_loop: Any) -> None:
    if backend.kind != "real":
        pytest.skip("pausing the server needs a real one")
    from redis_agentstate import AsyncCheckpointStore

    raw = _raw(backend)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(backend.url)
        store = AsyncCheckpointStore(client, namespace=namespace)
        lane = _lane(store)
        assert isinstance(lane, AsyncLane)
        await store.create(Checkpoint("t", shared_state={"n": 0}))
        cp = await store.claim("t", 1, token="w", lease_ms=LEASE)
        assert cp is not None
        raw.client_pause(300)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(store.load("t"), 0.05)
        assert lane.free == []  # the reply it did not read stays off every kept connection
        await asyncio.sleep(0.35)
        got = await store.load("t")
        assert got is not None and got.revision == cp.revision and got.claim_token == "w"
        await client.aclose()

    twin_loop.run_until_complete(scenario())


@pytest.mark.parametrize(
    "args",
    [
        ["tok", 0, -17, 2**62, b"\x00\xff", "é\u2603", ""],
        [1.5, b"x" * (lanes._COPY_BELOW + 5), "y" * 3],
        [],
    ],
)
def test_a_packed_call_is_what_redis_py_sends(args: list[Any]) -> None:
    conn = redis.Connection()
    keys = ["ns:{ns#00}:cp:t", b"ns:{ns#00}:raw"]
    sha = "a" * 40
    head_parts: list[bytes] = []
    encoder = conn.encoder
    lanes._bulk(head_parts, ["EVALSHA", sha, len(keys), *keys], "utf-8", "strict", encoder)
    packed = pack_evalsha(b"".join(head_parts), 3 + len(keys), args, "utf-8", "strict", encoder)
    want = b"".join(conn.pack_command("EVALSHA", sha, len(keys), *keys, *args))
    assert packed == want


def test_what_redis_py_refuses_a_lane_refuses() -> None:
    conn = redis.Connection()
    for bad in (True, None, object()):
        with pytest.raises(rex.DataError):
            pack_evalsha(b"", 0, [bad], "utf-8", "strict", conn.encoder)
