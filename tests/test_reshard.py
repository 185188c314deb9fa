"""Growing a live namespace to more shards (``CheckpointStore.reshard``, ``agentstate reshard``).

On every backend (fakeredis, a real redis-server, the local Cluster), sync and async: tasks,
pools, KV keys and LangGraph threads move with their fences, TTLs and indexes; a lease held
across the move commits once (its re-send is recognised at the new place); a client that read
the layout before the reshard follows it; a reshard that stopped half-way is finished by running
it again; bad counts are refused before anything is written. Then, on a real server, workers
claim and commit throughout a reshard and every commit applies exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from flows import ids_on_every_shard
from redis.exceptions import ConnectionError as ConnectionError_

from redis_agentstate import (
    AsyncCheckpointStore,
    AsyncKeyValueStore,
    AsyncPoolStore,
    BackendUnavailable,
    Checkpoint,
    CheckpointStore,
    ConfigConflict,
    InvalidArgument,
    KeyValueStore,
    PoolStore,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.keys import Keys, key_slot
from redis_agentstate.pool_models import Cursor, MessageReceipt, PoolConfig, PoolMember, RunMessage
from redis_agentstate.wire import Command, relocation


def _record(raw: Any, namespace: str) -> bytes | None:
    value: bytes | None = raw.get(Keys(namespace).layout_key())
    return value


def _ns_keys(raw: Any, namespace: str) -> list[bytes]:
    return sorted(raw.scan_iter(match=Keys(namespace).pattern() + "*", count=1000))


def _state(store: Any, kv: Any, pools: Any, tids: list[str]) -> dict[str, Any]:
    """What a user reads back: every task's fields, the KV values, the pool's members and messages."""
    tasks = {}
    for tid in tids:
        cp = store.load(tid)
        tasks[tid] = None if cp is None else (cp.revision, cp.status, cp.cycle_index, len(cp.messages), cp.attempts)
    return {
        "tasks": tasks,
        "list": store.list(),
        "parked": store.list_parked(),
        "kv": {k: kv.get(k) for k in kv.keys()},  # noqa: SIM118 - a store, not a dict
        "kv_count": kv.count(),
        "pools": pools.list(),
        "records": [(r.cursor.sequence, r.kind) for r in pools.watch("pool-1", Cursor(0))],
    }


@pytest.mark.usefixtures("backend")
class TestReshard:
    """Every owner kind moves whole; nothing is lost, nothing applies twice."""

    def _fill(self, make: Callable[..., Any], shards: int = 4) -> tuple[Any, Any, Any, list[str]]:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=shards, max_attempts=1)
        kv = make(KeyValueStore, AsyncKeyValueStore)
        pools = make(PoolStore, AsyncPoolStore)
        tids = ids_on_every_shard(Keys("x", 16), per_shard=3, prefix="task")
        for tid in tids:
            assert store.create(Checkpoint(tid))
        for i in range(40):
            kv.set(f"key-{i}", b"value-%d" % i)
        kv.set("short-lived", b"v", ttl_ms=600_000)
        pools.open("pool-1", PoolConfig())
        pools.join("pool-1", PoolMember("run-1", topics=["work"]))
        pools.join("pool-1", PoolMember("run-2", topics=["work"]))
        message = RunMessage("m-1", "idem-1", payload={"x": 1}, topic="work", sender="run-1")
        pools.record_message("pool-1", message, MessageReceipt("m-1", recipients=["run-2"]))
        return store, kv, pools, tids

    def test_everything_moves_and_reads_back_the_same(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store, kv, pools, tids = self._fill(make)
        held = store.claim_next(token="w1", lease_ms=600_000)
        parked = store.claim_next(token="w2", lease_ms=600_000)
        assert held is not None and parked is not None
        assert store.release(parked.task_id, token="w2", expected_revision=parked.revision, reason="boom")
        assert store.list_parked() == [parked.task_id]  # max_attempts=1: a failed attempt parks it
        before = _state(store, kv, pools, tids)
        ttl_before = raw.pttl(Keys(namespace, 4).kv("short-lived"))
        report = store.reshard(16)
        assert (report.from_shards, report.to_shards, report.moved, report.unknown) == (4, 16, 4, 0)
        assert report.keys > len(tids) and report.worst_pause_ms > 0
        assert _record(raw, namespace) == b"slots 16"
        assert store.shards == 16
        # A client of the new layout, and the stores that moved it, read the same.
        fresh = make(CheckpointStore, AsyncCheckpointStore)
        for reader in (store, fresh):
            assert _state(reader, kv, pools, tids) == before
        assert fresh.shards == 16
        new = Keys(namespace, 16)
        assert all(raw.exists(new.task(t).checkpoint) for t in tids)
        assert 599_000 - 5_000 < raw.pttl(new.kv("short-lived")) <= ttl_before
        # Nothing is left under the old tags but their seals and fences (a stalled mover stays out).
        old = {p for p in Keys(namespace, 4)._shard_prefixes}
        left = [k for k in _ns_keys(raw, namespace) if any(k.decode().startswith(p) for p in old)]
        assert sorted(left) == sorted(p.encode() + end for p in old for end in (b"fence", b"moved"))
        moved = store.load(held.task_id)
        assert moved is not None and (moved.claim_token, moved.lease_expires_at_ms) == ("w1", held.lease_expires_at_ms)

    def test_a_lease_held_across_the_move_commits_once(self, make: Callable[..., Any]) -> None:
        store, _, _, _ = self._fill(make)
        cp = store.claim_next(token="w1", lease_ms=600_000)
        assert cp is not None
        store.reshard(16)
        msg = {"role": "assistant", "content": "after"}
        done = dataclasses.replace(cp, cycle_index=cp.claimed_cycle, messages=[*cp.messages, msg])
        assert store.commit(done, token="w1", expected_revision=cp.revision) is True
        after = store.load(cp.task_id)
        assert after is not None and after.revision == cp.revision + 1
        # The same commit re-sent (its reply lost, say) is recognised at the new place: applied once.
        assert store.commit(done, token="w1", expected_revision=cp.revision) is True
        again = store.load(cp.task_id)
        assert again is not None and again.revision == after.revision and len(again.messages) == len(after.messages)
        # The fence moved too: a stale token is still refused.
        assert store.commit(done, token="w9", expected_revision=cp.revision) is False

    def test_a_client_that_read_the_old_layout_follows_it(self, make: Callable[..., Any], namespace: str) -> None:
        store, _, pools, tids = self._fill(make)
        stale = make(CheckpointStore, AsyncCheckpointStore)
        stale_kv = make(KeyValueStore, AsyncKeyValueStore)
        stale_pools = make(PoolStore, AsyncPoolStore)
        before = _state(stale, stale_kv, stale_pools, tids)  # all three read the 4-shard layout now
        make(CheckpointStore, AsyncCheckpointStore).reshard(16)
        assert stale_kv.get("key-3") == b"value-3"  # a plain read finds the seal, and follows
        assert _state(stale, stale_kv, stale_pools, tids) == before
        assert stale.shards == 16
        cp = stale.claim_next(token="w", lease_ms=60_000)
        assert cp is not None and cp.task_id in tids
        assert stale.create(Checkpoint("new-task"))
        assert store.load("new-task") is not None
        message = RunMessage("m-2", "idem-2", payload={}, topic="work", sender="run-2")
        stale_pools.record_message("pool-1", message, MessageReceipt("m-2", recipients=["run-1"]))
        assert pools.message_receipt("pool-1", "idem-2") == MessageReceipt("m-2", recipients=["run-1"])
        assert len(pools.watch("pool-1", Cursor(0))) == len(before["records"]) + 1

    def test_bad_counts_are_refused_before_anything_is_written(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store, _, _, _ = self._fill(make)
        before = {k: raw.dump(k) for k in _ns_keys(raw, namespace)}
        for bad in (6, 2, 3, 0, 16385, "8", None):
            with pytest.raises(InvalidArgument):
                store.reshard(bad)
        assert {k: raw.dump(k) for k in _ns_keys(raw, namespace)} == before
        report = store.reshard(4)  # its own count: nothing to do
        assert report.moved == 0 and _record(raw, namespace) == b"slots 4"

    def test_a_reshard_that_stopped_half_way_is_finished_by_running_it_again(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store, kv, pools, tids = self._fill(make)
        before = _state(store, kv, pools, tids)

        def stop_after_two(moved: int, of: int) -> None:
            if moved == 2:
                raise KeyboardInterrupt  # the operator's ^C, or a crash, between two shards

        with pytest.raises(KeyboardInterrupt):
            store.reshard(16, progress=stop_after_two)
        assert _record(raw, namespace) == b"slots 4 16 2"
        # Half moved: every client works across both layouts meanwhile.
        mid = make(CheckpointStore, AsyncCheckpointStore)
        assert _state(mid, kv, pools, tids) == before
        assert mid.create(Checkpoint("made-mid-way"))
        with pytest.raises(ConfigConflict, match="being resharded from 4 to 16"):
            mid.reshard(32)
        report = mid.reshard(16)
        assert (report.moved, _record(raw, namespace)) == (2, b"slots 16")
        assert store.load("made-mid-way") is not None
        assert _state(store, kv, pools, tids)["tasks"] == before["tasks"]

    def test_after_script_flush_the_reshard_loads_its_scripts(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store, kv, pools, tids = self._fill(make)
        before = _state(store, kv, pools, tids)
        for node in getattr(raw, "get_primaries", lambda: [None])():
            (raw.get_redis_connection(node) if node is not None else raw).script_flush()
        assert store.reshard(8).moved == 4
        assert _state(store, kv, pools, tids) == before

    def test_a_sealed_shard_holds_calls_until_it_moves(
        self, make: Callable[..., Any], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=4)
        assert store.create(Checkpoint("t"))
        keys = Keys(namespace, 4)
        seal = keys.moved_marker(keys.shard_of("t"))
        raw.set(seal, "sealed")
        # Reads go on: a sealed shard's data is whole and current until it is marked moved.
        started = time.monotonic()
        assert store.load("t") is not None and store.list() == ["t"]
        # The seal goes only once the timer below starts, so reads that returned did not wait for it;
        # a read that did wait would fail after SEALED_WAIT_S (30 s), not finish late.
        assert time.monotonic() - started < 5
        unsealing = time.monotonic()
        threading.Timer(0.3, raw.delete, [seal]).start()
        cp = store.claim("t", 1, token="w", lease_ms=60_000)  # a write waits for the seal to go
        assert cp is not None and time.monotonic() - unsealing >= 0.25
        raw.set(seal, "sealed")
        monkeypatch.setattr(relocation, "SEALED_WAIT_S", 0.2)
        with pytest.raises(BackendUnavailable, match="sealed"):
            store.renew("t", token="w", expected_revision=cp.revision, lease_ms=60_000)
        raw.delete(seal)


@pytest.mark.usefixtures("backend")
class TestBlockedCallers:
    """A claim_next blocked through a reshard hears of work in the new shards (its waker resubscribes)."""

    def test_a_blocked_claim_next_is_woken_by_a_task_of_the_new_layout(
        self, make: Callable[..., Any], backend: Any
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=4)
        assert store.create(Checkpoint("first"))
        assert store.claim_next(token="w", lease_ms=60_000) is not None  # the layout read, nothing else due
        other = CheckpointStore(backend.sync_client(), namespace=store.namespace)
        created: list[float] = []

        def grow_then_create() -> None:
            time.sleep(0.3)  # the caller is blocked by now
            other.reshard(16)
            time.sleep(1.5)  # past the listener's check of the layout: it subscribed to the new channels
            created.append(time.monotonic())
            assert other.create(Checkpoint("after"))

        if hasattr(store, "wrapped"):
            inner = store.wrapped

            async def both() -> Any:
                blocked = inner.claim_next(token="w", lease_ms=60_000, block_ms=8_000)
                got, _ = await asyncio.gather(blocked, asyncio.to_thread(grow_then_create))
                return got

            got = store._loop.run_until_complete(both())
        else:
            mover = threading.Thread(target=grow_then_create)
            mover.start()
            got = store.claim_next(token="w", lease_ms=60_000, block_ms=8_000)
            mover.join(10)
        assert got is not None and got.task_id == "after"
        assert time.monotonic() - created[0] < 3.0


@pytest.mark.usefixtures("backend")
class TestLangGraphThreads:
    """A LangGraph thread's checkpoints, writes and lease move with it."""

    def test_threads_read_back_after_a_reshard(self, backend: Any, namespace: str) -> None:
        from langgraph.checkpoint.conformance.test_utils import (
            generate_checkpoint,
            generate_config,
            generate_metadata,
        )

        from redis_agentstate.langgraph import AgentStateSaver

        saver = AgentStateSaver(backend.sync_client(), namespace=namespace, shards=4)
        configs = {}
        for i in range(12):
            cfg = saver.put(generate_config(f"thread-{i}"), generate_checkpoint(), generate_metadata(), {})
            saver.put_writes(cfg, [("channel", f"value-{i}")], f"task-{i}")
            configs[i] = cfg
        before = {i: saver.get_tuple(cfg) for i, cfg in configs.items()}
        CheckpointStore(backend.sync_client(), namespace=namespace).reshard(8)
        after = {i: saver.get_tuple(cfg) for i, cfg in configs.items()}
        assert {i: (t.checkpoint, t.pending_writes) for i, t in after.items()} == {
            i: (t.checkpoint, t.pending_writes) for i, t in before.items()
        }
        assert len(list(saver.list(None))) == 12
        saver.delete_thread("thread-0")
        assert saver.get_tuple(configs[0]) is None


@pytest.mark.real
class TestUnderLoad:
    """Workers claim and commit through a whole reshard: every commit lands once, none is lost."""

    def test_workers_keep_committing_while_the_namespace_grows(self, real_server: Any) -> None:
        import redis
        from conftest import require_real

        url = require_real(real_server)
        namespace = f"load-{time.monotonic_ns()}"
        make = lambda: CheckpointStore(redis.Redis.from_url(url), namespace=namespace)  # noqa: E731
        seed = CheckpointStore(redis.Redis.from_url(url), namespace=namespace, shards=8)
        tids = [f"agent-{i}" for i in range(400)]
        for tid in tids:
            assert seed.create(Checkpoint(tid))
        acked: dict[str, int] = {t: 0 for t in tids}
        lock = threading.Lock()
        stop = threading.Event()
        errors: list[BaseException] = []
        pauses: list[float] = []

        def worker(n: int) -> None:
            store = make()
            try:
                while not stop.is_set():
                    cp = store.claim_next(token=f"w{n}", lease_ms=30_000)
                    if cp is None:
                        continue
                    msg = {"role": "assistant", "content": f"{cp.task_id}:{cp.revision}"}
                    started = time.monotonic()
                    done = dataclasses.replace(cp, cycle_index=cp.claimed_cycle, messages=[*cp.messages, msg])
                    ok = store.commit(done, token=f"w{n}", expected_revision=cp.revision)
                    with lock:
                        pauses.append(time.monotonic() - started)
                        if ok:
                            acked[cp.task_id] += 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        report = make().reshard(64)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert report.moved == 8
        check = make()
        for tid in tids:
            cp = check.load(tid)
            assert cp is not None
            # Each acknowledged commit appended exactly one message: none lost, none applied twice.
            assert len(cp.messages) == acked[tid] == cp.cycle_index, (tid, len(cp.messages), acked[tid], cp.cycle_index)
        assert check.shards == 64
        assert sum(acked.values()) > 100
        assert max(pauses) * 1000 < report.worst_pause_ms + 1000


class TestCli:
    """``agentstate reshard --shards N`` in a pipe."""

    def test_reshard_prints_what_it_moved(
        self, backend: Any, namespace: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        if backend.kind == "fake":
            pytest.skip("the CLI connects by URL")
        store = CheckpointStore(backend.sync_client(), namespace=namespace, shards=2)
        for i in range(30):
            assert store.create(Checkpoint(f"c{i}"))
        if backend.kind == "cluster":
            host, port = backend.cluster.startup
            target = ["--url", f"redis://{host}:{port}", "--cluster"]
        else:
            target = ["--url", backend.url]

        def stop_after_one(moved: int, of: int) -> None:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            store.reshard(8, progress=stop_after_one)
        assert cli_mod.main(["stats", *target, "--namespace", namespace, "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert (stats["tasks"], stats["shards"], stats["resharding"]) == (30, 2, {"to": 8, "moved": 1}), stats
        assert cli_mod.main(["stats", *target, "--namespace", namespace]) == 0
        assert "2 shards (slots layout); resharding to 8: 1 of 2 moved" in capsys.readouterr().out
        assert cli_mod.main(["reshard", *target, "--namespace", namespace, "--shards", "8", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert (data["from_shards"], data["to_shards"], data["moved_shards"]) == (2, 8, 1)
        assert cli_mod.main(["reshard", *target, "--namespace", namespace, "--shards", "8"]) == 0
        assert "has 8 shards already" in capsys.readouterr().out
        assert cli_mod.main(["reshard", *target, "--namespace", namespace, "--shards", "12"]) == 1
        assert "multiple of 8" in capsys.readouterr().err
        # A typo'd namespace: refused, exit 1, and no key of it is created.
        typo = namespace + "-typo"
        assert cli_mod.main(["reshard", *target, "--namespace", typo, "--shards", "128"]) == 1
        assert "does not exist" in capsys.readouterr().err
        assert _ns_keys(backend.sync_client(), typo) == []
        assert sorted(CheckpointStore(backend.sync_client(), namespace=namespace).list()) == sorted(
            f"c{i}" for i in range(30)
        )


# ---- the fenced mover (issue 38: items 1, 2, 7, 8) ------------------------------------------


def _watched(
    op: Any, before: Callable[[Any], None] | None = None, after: Callable[[Any, Any], None] | None = None
) -> Any:
    """``op`` with ``before(request)`` run before each request is sent and ``after(request, reply)``
    once its reply came: a deterministic place between two of the reshard's sans-I/O steps."""
    try:
        req = next(op)
    except StopIteration as stop:
        return stop.value
    while True:
        if before is not None:
            before(req)
        try:
            reply = yield req
        except BaseException as exc:  # the driver's error, thrown into the op as the driver would
            try:
                req = op.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        if after is not None:
            after(req, reply)
        try:
            req = op.send(reply)
        except StopIteration as stop:
            return stop.value


def _hooked_reshard(store: Any, target: int, **hooks: Any) -> Any:
    from redis_agentstate.core.reshard import reshard

    return store._reshard(lambda keys, cluster: _watched(reshard(keys, target, cluster=cluster), **hooks))


def _script(req: Any) -> str | None:
    return getattr(req, "script", None)


def _is_probe(req: Any) -> bool:
    return any(b"reshard-probe" in (k if isinstance(k, bytes) else str(k).encode()) for k in req.keys)


def _lease_key(namespace: str) -> str:
    return f"{namespace}:{{{namespace}#layout}}:reshard"


def _snapshot(raw: Any, namespace: str) -> dict[bytes, Any]:
    return {k: raw.dump(k) for k in _ns_keys(raw, namespace)}


def _old_leftovers(raw: Any, namespace: str, shards: int) -> list[bytes]:
    """Keys under an old layout's tags other than their seals and fences."""
    old = [p.encode() for p in Keys(namespace, shards)._shard_prefixes]
    return [
        k
        for k in _ns_keys(raw, namespace)
        if any(k.startswith(p) for p in old) and not k.endswith((b"}:moved", b"}:fence"))
    ]


@pytest.mark.usefixtures("backend")
class TestFencedMover:
    """A second reshard, or one stalled and woken after another finished, never writes (item 1); a
    rerun finishes a begun drop (item 7); bad arguments and unknown namespaces write nothing (item 8)."""

    def _tasks(self, make: Callable[..., Any], shards: int = 4) -> tuple[Any, list[str]]:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=shards)
        tids = ids_on_every_shard(Keys("x", 16), per_shard=2, prefix="task")
        for tid in tids:
            assert store.create(Checkpoint(tid))
        return store, tids

    def test_a_stalled_mover_woken_after_another_finished_writes_nothing(
        self, make: Callable[..., Any], raw: Any, namespace: str, backend: Any
    ) -> None:
        store, tids = self._tasks(make)
        victim = next(t for t in tids if Keys(namespace, 4).shard_of(t) == 0)
        seen: dict[str, Any] = {}

        def stall(req: Any) -> None:
            # B sealed and read (DUMP) old shard 0 and is about to write its copy: it stalls here.
            if _script(req) == "reshard_restore" and not _is_probe(req) and "committed" not in seen:
                raw.hset(_lease_key(namespace), "expires", 0)  # its lease lapses while it is stalled
                # (the other actors are sync stores: the hook runs inside an async store's loop)
                assert CheckpointStore(backend.sync_client(), namespace=namespace).reshard(16).to_shards == 16
                worker = CheckpointStore(backend.sync_client(), namespace=namespace)
                cp = worker.claim(victim, 1, token="w", lease_ms=60_000)
                assert cp is not None
                msg = {"role": "assistant", "content": "after the move"}
                done = dataclasses.replace(cp, cycle_index=cp.claimed_cycle, messages=[*cp.messages, msg])
                assert worker.commit(done, token="w", expected_revision=cp.revision) is True
                seen["committed"] = worker.load(victim)
                seen["snapshot"] = _snapshot(raw, namespace)

        with pytest.raises(ConfigConflict):
            _hooked_reshard(store, 16, before=stall)
        after = make(CheckpointStore, AsyncCheckpointStore).load(victim)
        assert after == seen["committed"] and after is not None and after.cycle_index == 1, after
        assert _snapshot(raw, namespace) == seen["snapshot"]  # the stalled mover wrote nothing at all
        assert _record(raw, namespace) == b"slots 16" and not _old_leftovers(raw, namespace, 4)

    def test_a_second_reshard_while_the_first_holds_its_lease_copies_nothing(
        self, make: Callable[..., Any], raw: Any, namespace: str, backend: Any
    ) -> None:
        store, tids = self._tasks(make)
        refused: list[str] = []

        def second(req: Any) -> None:
            if _script(req) == "reshard_seal" and not refused:
                before = _snapshot(raw, namespace)
                with pytest.raises(ConfigConflict, match=r"being resharded by .* lease runs [0-9.]+ s more") as info:
                    CheckpointStore(backend.sync_client(), namespace=namespace).reshard(16)
                refused.append(str(info.value))
                assert _snapshot(raw, namespace) == before

        report = _hooked_reshard(store, 16, before=second)
        assert refused and report.moved == 4 and _record(raw, namespace) == b"slots 16"
        fresh = make(CheckpointStore, AsyncCheckpointStore)
        assert sorted(fresh.list()) == sorted(tids) and all(fresh.load(t) is not None for t in tids)
        # Its lease was given back when it finished: the next reshard need not wait for it.
        assert fresh.reshard(32).moved == 16

    def test_a_rerun_finishes_a_drop_that_was_begun(
        self, make: Callable[..., Any], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from redis_agentstate.core import reshard as _reshard

        monkeypatch.setattr(_reshard, "_BATCH_KEYS", 4)
        store, tids = self._tasks(make)
        old_keys = len(_old_leftovers(raw, namespace, 4))

        def killed(req: Any, reply: Any) -> None:
            if _script(req) == "reshard_drop":
                raise KeyboardInterrupt  # killed right after its first delete batch

        with pytest.raises(KeyboardInterrupt):
            _hooked_reshard(store, 16, after=killed)
        left = len(_old_leftovers(raw, namespace, 4))
        assert 0 < left < old_keys
        raw.hset(_lease_key(namespace), "expires", 0)  # the killed mover's lease lapsed
        report = make(CheckpointStore, AsyncCheckpointStore).reshard(16)
        assert report.moved == 4 and report.keys == old_keys - 4, report  # shard 0's leftovers: deleted, counted
        assert not _old_leftovers(raw, namespace, 4)
        fresh = make(CheckpointStore, AsyncCheckpointStore)
        assert sorted(fresh.list()) == sorted(tids) and all(fresh.load(t) is not None for t in tids)

    def test_bad_arguments_are_refused_before_the_first_seal(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store, _ = self._tasks(make, shards=2)
        before = _snapshot(raw, namespace)
        for bad in ({"progress": 1}, {"progress": "print"}, {"progress": object()}):
            with pytest.raises(InvalidArgument, match="progress"):
                store.reshard(4, **bad)
        assert _snapshot(raw, namespace) == before and _record(raw, namespace) == b"slots 2"

    def test_a_namespace_that_never_existed_is_refused_and_gets_no_keys(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        with pytest.raises(InvalidArgument, match="does not exist"):
            make(CheckpointStore, AsyncCheckpointStore).reshard(128)
        assert _ns_keys(raw, namespace) == []

    def test_a_seal_that_outlives_the_wait_says_who_holds_it_and_until_when(
        self, make: Callable[..., Any], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, shards=4)
        assert store.create(Checkpoint("t"))
        keys = Keys(namespace, 4)
        seal = keys.moved_marker(keys.shard_of("t"))
        monkeypatch.setattr(relocation, "SEALED_WAIT_S", 0.2)
        raw.set(seal, "sealed")
        far = int(raw.time()[0]) * 1000 + 600_000
        raw.hset(_lease_key(namespace), mapping={"holder": "ops-host pid 7", "expires": far, "gen": 3})
        with pytest.raises(BackendUnavailable, match=r"ops-host pid 7 \(generation 3\) holds the namespace, its lease"):
            store.claim("t", 1, token="w", lease_ms=60_000)
        raw.hset(_lease_key(namespace), "expires", 1)
        with pytest.raises(BackendUnavailable, match=r"sealed it and stopped, its lease ran out .* takes it over"):
            store.claim("t", 1, token="w", lease_ms=60_000)
        raw.delete(seal)
        assert store.claim("t", 1, token="w", lease_ms=60_000) is not None


def _lose_reply_of(name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first call of script ``name`` (any client, sync or async) applies, then its reply is lost:
    the library's retry sends it again. Returns one entry per call of it."""
    from redis.commands.core import AsyncScript, Script

    from redis_agentstate.wire import scripts

    text = scripts.script_text(name)
    calls: list[int] = []
    for cls in (Script, AsyncScript):
        original = cls.__call__

        def apply_then_drop(
            self_: Any, keys: Any = None, args: Any = None, client: Any = None, _o: Any = original
        ) -> Any:
            result = _o(self_, keys=keys, args=args, client=client)
            if self_.script != text:
                return result
            calls.append(1)
            if len(calls) > 1:
                return result
            if hasattr(result, "__await__"):

                async def drop() -> Any:
                    await result
                    raise ConnectionError_("reply lost (injected)")

                return drop()
            raise ConnectionError_("reply lost (injected)")

        monkeypatch.setattr(cls, "__call__", apply_then_drop)
    return calls


@pytest.mark.usefixtures("backend")
class TestReshardResend:
    """Every reshard script re-sent after its reply was lost: the result is one execution's."""

    @pytest.mark.parametrize(
        "script",
        ["reshard_lease", "reshard_fence", "reshard_seal", "reshard_restore", "reshard_drop", "reshard_record"],
    )
    def test_a_lost_reply_is_sent_again_to_the_same_end(
        self, make: Callable[..., Any], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, script: str
    ) -> None:
        from redis_agentstate.wire import scripts

        assert set(scripts.RESHARD_SCRIPTS) == {
            "reshard_lease", "reshard_fence", "reshard_seal", "reshard_restore", "reshard_drop", "reshard_record"
        }  # fmt: skip
        store = make(CheckpointStore, AsyncCheckpointStore, shards=4)
        tids = ids_on_every_shard(Keys("x", 16), per_shard=2, prefix="task")
        for tid in tids:
            assert store.create(Checkpoint(tid))
        held = store.claim_next(token="w", lease_ms=600_000)
        assert held is not None
        before = {t: store.load(t) for t in tids}
        old_keys = len(_old_leftovers(raw, namespace, 4))
        calls = _lose_reply_of(script, monkeypatch)
        report = make(CheckpointStore, AsyncCheckpointStore).reshard(16)
        assert len(calls) >= 2  # lost once, sent again
        assert (report.moved, report.keys, report.unknown) == (4, old_keys, 0)
        assert _record(raw, namespace) == b"slots 16" and not _old_leftovers(raw, namespace, 4)
        fresh = make(CheckpointStore, AsyncCheckpointStore)
        assert {t: fresh.load(t) for t in tids} == before and sorted(fresh.list()) == sorted(tids)
        lease = raw.hgetall(_lease_key(namespace))
        assert (lease[b"gen"], lease[b"expires"]) == (b"1", b"0")  # one generation, given back
        # The fence moved with the task: its holder commits once, a re-send is recognised.
        done = dataclasses.replace(held, cycle_index=held.claimed_cycle)
        assert fresh.commit(done, token="w", expected_revision=held.revision) is True
        assert fresh.commit(done, token="w", expected_revision=held.revision) is True
        again = fresh.load(held.task_id)
        assert again is not None and again.revision == held.revision + 1


@pytest.mark.cluster
class TestClusterListing:
    """On a Cluster an old shard's slot is shared (a live new shard's, other namespaces'): keys written
    into it while the mover lists it never hide an old key from the move (item 2)."""

    def test_every_key_moves_while_the_slot_fills_with_others(self, redis_cluster: Any, namespace: str) -> None:
        from cluster_support import cluster_backend

        b = cluster_backend(redis_cluster)
        try:
            raw = b.sync_client()
            store = CheckpointStore(b.sync_client(), namespace=namespace, shards=4)
            tids = [f"agent-{i}" for i in range(160)]
            for tid in tids:
                assert store.create(Checkpoint(tid))
            worker = CheckpointStore(b.sync_client(), namespace=namespace)
            acked: dict[str, int] = dict.fromkeys(tids, 0)
            for _ in range(40):  # messages and cycles keys too, not only checkpoints
                cp = worker.claim_next(token="w", lease_ms=60_000)
                assert cp is not None
                msg = {"role": "assistant", "content": cp.task_id}
                done = dataclasses.replace(cp, cycle_index=cp.claimed_cycle, messages=[*cp.messages, msg])
                assert worker.commit(done, token="w", expected_revision=cp.revision)
                acked[cp.task_id] += 1
            old_keys = len(_old_leftovers(raw, namespace, 4))
            tags = {
                key_slot(p[p.index("{") + 1 : p.index("}")].encode()): p[p.index("{") + 1 : p.index("}")]
                for p in Keys(namespace, 4)._shard_prefixes
            }
            stop = threading.Event()
            errors: list[BaseException] = []

            def live_writer() -> None:
                # Commits into the new shards as they go live (one of them shares each old shard's slot).
                w = CheckpointStore(b.sync_client(), namespace=namespace)
                try:
                    while not stop.is_set():
                        cp = w.claim_next(token="live", lease_ms=60_000)
                        if cp is None:
                            continue
                        msg = {"role": "assistant", "content": cp.task_id}
                        done = dataclasses.replace(cp, cycle_index=cp.claimed_cycle, messages=[*cp.messages, msg])
                        if w.commit(done, token="live", expected_revision=cp.revision):
                            acked[cp.task_id] += 1
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            flooded = [0]

            def flood(req: Any) -> None:
                # Between the mover's count and its listing, another namespace writes into the slot.
                if isinstance(req, Command) and str(req.args[0]).upper() == "CLUSTER GETKEYSINSLOT":
                    tag = tags.get(int(req.args[1]))
                    if tag is not None:
                        pipe = raw.pipeline(transaction=False)
                        for _ in range(300):
                            flooded[0] += 1
                            pipe.set(f"other-{namespace}:{{{tag}}}:junk-{flooded[0]}", b"x")
                        pipe.execute()

            writer = threading.Thread(target=live_writer, daemon=True)
            writer.start()
            report = _hooked_reshard(store, 16, before=flood)
            stop.set()
            writer.join(60)
            assert not errors, errors
            # (the live writer may add keys to a shard before it is sealed: at least those there before)
            assert flooded[0] >= 1200 and report.keys >= old_keys, (flooded, report, old_keys)
            assert not _old_leftovers(raw, namespace, 4)
            fresh = CheckpointStore(b.sync_client(), namespace=namespace)
            assert sorted(fresh.list()) == sorted(tids)
            for tid in tids:
                cp = fresh.load(tid)
                assert cp is not None and len(cp.messages) == acked[tid] == cp.cycle_index, (tid, cp, acked[tid])
        finally:
            for client in b._sync:
                client.close()
