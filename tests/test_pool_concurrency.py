"""Many processes, one pool: atomic dedupe, gap-free sequences, and live tails.

Eight writer processes record 500 messages each into one pool, and every
message is sent twice under one idempotency key, by two different processes
at about the same moment. Two watcher processes (one sync, one asyncio) tail
the log with ``block_ms`` while the writers run.

A fakeredis server cannot be shared between processes, so these tests run on
the real redis-server and on fakeredis' TCP server (one ``FakeServer`` behind
a socket, which processes can share).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from conftest import RealServer, require_real

from redis_agentstate.pool_models import Cursor, MessageReceipt, PoolConfig, RunMessage
from redis_agentstate.pools import AsyncPoolStore, PoolStore

N_PROC = 8
PER_PROC = 500
POOL = "fleet"
TOTAL = 1 + N_PROC * PER_PROC  # pool_opened + one run_message per distinct message
WATCH_COUNT = 250
WATCH_BLOCK_MS = 2_000
#: The watchers' clients time out reads after 1 s, shorter than their 2 s blocks.
WATCHER_SOCKET_TIMEOUT = 1.0


def message(k: int, sender: int) -> tuple[RunMessage, MessageReceipt]:
    m = RunMessage(f"m{k}", f"idem-{k}", payload={"k": k, "by": sender}, topic="t", sender=f"w{sender}")
    return m, MessageReceipt(f"m{k}", recipients=[f"r{k % 7}"], metadata={"by": sender})


def writer(url: str, ns: str, p: int, barrier: Any, out: Any) -> None:
    """Process ``p`` sends its own messages and those of process ``p - 1``, interleaved."""
    try:
        store = PoolStore(redis.Redis.from_url(url), namespace=ns)
        results = []
        barrier.wait(60)
        for i in range(PER_PROC):
            for owner in (p, (p - 1) % N_PROC):
                k = owner * PER_PROC + i
                results.append((k, store.record_message(POOL, *message(k, p)).sequence))
        out.put(("writer", p, results, time.monotonic()))
    except BaseException as exc:  # report, never hang the parent
        out.put(("error", f"writer {p}", repr(exc), time.monotonic()))


def _record_view(rec: Any) -> tuple[int, str, str | None]:
    mid = rec.payload.message.message_id if rec.kind == "run_message" else None
    return rec.cursor.sequence, rec.kind.value, mid


def watcher_sync(url: str, ns: str, ready: Any, out: Any) -> None:
    try:
        store = PoolStore(redis.Redis.from_url(url, socket_timeout=WATCHER_SOCKET_TIMEOUT), namespace=ns)
        seen: list[tuple[int, str, str | None]] = []
        batches: list[tuple[float, int, int]] = []
        after = Cursor(0)
        ready.set()
        deadline = time.monotonic() + 300
        while after.sequence < TOTAL and time.monotonic() < deadline:
            records = store.watch(POOL, after, count=WATCH_COUNT, block_ms=WATCH_BLOCK_MS)
            if records:
                batches.append((time.monotonic(), len(records), records[-1].cursor.sequence))
                seen.extend(_record_view(r) for r in records)
                after = records[-1].cursor
        out.put(("watcher", "sync", seen, batches))
    except BaseException as exc:
        out.put(("error", "sync watcher", repr(exc), time.monotonic()))


def watcher_async(url: str, ns: str, ready: Any, out: Any) -> None:
    async def tail() -> tuple[list[tuple[int, str, str | None]], list[tuple[float, int, int]]]:
        client = aioredis.Redis.from_url(url, socket_timeout=WATCHER_SOCKET_TIMEOUT)
        store = AsyncPoolStore(client, namespace=ns)
        seen: list[tuple[int, str, str | None]] = []
        batches: list[tuple[float, int, int]] = []
        after = Cursor(0)
        ready.set()
        deadline = time.monotonic() + 300
        while after.sequence < TOTAL and time.monotonic() < deadline:
            records = await store.watch(POOL, after, count=WATCH_COUNT, block_ms=WATCH_BLOCK_MS)
            if records:
                batches.append((time.monotonic(), len(records), records[-1].cursor.sequence))
                seen.extend(_record_view(r) for r in records)
                after = records[-1].cursor
        await client.aclose()
        return seen, batches

    try:
        seen, batches = asyncio.run(tail())
        out.put(("watcher", "async", seen, batches))
    except BaseException as exc:
        out.put(("error", "async watcher", repr(exc), time.monotonic()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["real", "fake-tcp"])
def shared_url(request: pytest.FixtureRequest, real_server: RealServer) -> Iterator[str]:
    """A Redis URL every process can reach."""
    if request.param == "real":
        yield require_real(real_server)
        return
    from fakeredis import TcpFakeServer

    port = _free_port()
    server = TcpFakeServer(("127.0.0.1", port), server_version=(7, 0))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.shutdown()
        server.server_close()


def test_eight_processes_each_message_twice(shared_url: str, namespace: str) -> None:
    store = PoolStore(redis.Redis.from_url(shared_url), namespace=namespace)
    store.open(POOL, PoolConfig(message_policy={"fanout": "topic"}))

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    barrier = ctx.Barrier(N_PROC)
    readies = [ctx.Event(), ctx.Event()]
    watchers = [
        ctx.Process(target=watcher_sync, args=(shared_url, namespace, readies[0], out)),
        ctx.Process(target=watcher_async, args=(shared_url, namespace, readies[1], out)),
    ]
    writers = [ctx.Process(target=writer, args=(shared_url, namespace, p, barrier, out)) for p in range(N_PROC)]
    procs = watchers + writers
    try:
        for w in watchers:
            w.start()
        for ready in readies:
            assert ready.wait(60), "a watcher did not start"
        t0 = time.monotonic()
        for w in writers:
            w.start()
        reports = [out.get(timeout=300) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    errors = [r for r in reports if r[0] == "error"]
    assert not errors, errors

    # ---- writers: every message got one cursor, the same from both senders ----
    writes = [r for r in reports if r[0] == "writer"]
    assert len(writes) == N_PROC
    writers_done = max(r[3] for r in writes)
    by_message: dict[int, set[int]] = {}
    calls = 0
    for _, _, results, _ in writes:
        for k, seq in results:
            by_message.setdefault(k, set()).add(seq)
            calls += 1
    assert calls == 2 * N_PROC * PER_PROC
    assert sorted(by_message) == list(range(N_PROC * PER_PROC))
    assert all(len(seqs) == 1 for seqs in by_message.values()), "a re-send got another cursor"

    # ---- the log: exactly 4,000 run_message records, sequences 1..N, no gap, no repeat ----
    log = store.watch(POOL)
    assert [r.cursor.sequence for r in log] == list(range(1, TOTAL + 1))
    kinds = Counter(r.kind.value for r in log)
    assert kinds == {"pool_opened": 1, "run_message": N_PROC * PER_PROC}
    seq_of = {r.payload.message.message_id: r.cursor.sequence for r in log[1:]}
    assert len(seq_of) == N_PROC * PER_PROC
    for k, seqs in by_message.items():
        assert seqs == {seq_of[f"m{k}"]}

    # ---- every receipt readable, and it is the first one recorded ----
    stored = {r.payload.message.message_id: r.payload.receipt for r in log[1:]}
    senders: Counter[bool] = Counter()
    for k in range(N_PROC * PER_PROC):
        receipt = store.message_receipt(POOL, f"idem-{k}")
        assert receipt is not None and receipt == stored[f"m{k}"]
        owner = k // PER_PROC
        assert receipt.metadata["by"] in (owner, (owner + 1) % N_PROC)
        senders[receipt.metadata["by"] == owner] += 1
    snap = store.snapshot(POOL)
    assert len(snap.messages) == N_PROC * PER_PROC and snap.cursor == Cursor(TOTAL)

    # ---- both watchers saw every record exactly once, in order, while writers ran ----
    expected = [_record_view(r) for r in log]
    for _, flavor, seen, batches in (r for r in reports if r[0] == "watcher"):
        assert seen == expected, f"{flavor} watcher"
        assert len(batches) > 1, f"{flavor} watcher got everything in one read: it did not tail"
        live = [b for b in batches if b[0] < writers_done and b[2] > 1]
        assert live, f"{flavor} watcher saw no message before the writers finished: it did not tail"

    elapsed = writers_done - t0
    print(
        f"\n[{namespace}] {calls} record_message calls from {N_PROC} processes in {elapsed:.2f}s "
        f"({calls / elapsed:.0f}/s); first sender won {senders[True]}, second {senders[False]}; "
        f"watcher batches: {[len(r[3]) for r in reports if r[0] == 'watcher']}"
    )
