"""``store.cancel``: a task ends at once with status ``cancelled``, whoever holds it; the holder's next
write is fenced out with nothing written, the task leaves every index and is never claimed again,
a re-sent cancel answers as the first did, and the CLI cancels too."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redis_agentstate import (
    TERMINAL_STATUSES,
    AgentStatus,
    AsyncCheckpointStore,
    AsyncRunner,
    Checkpoint,
    CheckpointStore,
    CheckpointTerminal,
    InvalidArgument,
    LeaseLost,
    Runner,
    StepResult,
    TaskCancelled,
    TaskNotFound,
    current_lease,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.keys import Keys
from redis_agentstate.wire import scripts as S

LONG_MS = 30_000


def in_ready(raw: Any, namespace: str, task_id: str) -> bool:
    return raw.zscore(Keys(namespace).task(task_id).ready, task_id) is not None


def hash_of(raw: Any, namespace: str, task_id: str) -> dict[bytes, bytes]:
    return dict(raw.hgetall(Keys(namespace).task(task_id).checkpoint))


class TestCancel:
    """What a cancel does to the task and to its holder (every backend, sync and async)."""

    def test_an_unclaimed_task_is_cancelled_and_never_claimed(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t", messages=["hello"]))
        assert in_ready(raw, namespace, "t")
        assert store.cancel("t", reason="the user closed the tab") is True
        cp = store.load("t")
        assert cp.status == AgentStatus.CANCELLED and cp.is_terminal
        assert cp.last_failure == "the user closed the tab" and cp.messages == ["hello"]
        assert not in_ready(raw, namespace, "t")
        with pytest.raises(CheckpointTerminal):
            store.claim("t", 1, token="w", lease_ms=LONG_MS)
        assert store.claim_next(token="w", lease_ms=LONG_MS) is None
        assert "t" in store.list()

    def test_the_holders_writes_are_fenced_out_with_nothing_written(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        assert store.cancel("t") is True
        before = hash_of(raw, namespace, "t")
        assert before[b"status"] == b"cancelled" and before[b"token"] == b""
        assert before[b"why"] == b"cancelled (no reason given)"
        cp.cycle_index = 1
        cp.messages.append("late")
        assert store.renew("t", token="w", expected_revision=cp.revision, lease_ms=LONG_MS) is False
        assert store.commit(cp, token="w", expected_revision=cp.revision) is False
        assert store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LONG_MS) is None
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"answer": 1}
        assert store.finalize(cp, expected_revision=cp.revision) is False
        assert hash_of(raw, namespace, "t") == before
        assert store.load("t").messages == []

    def test_a_second_cancel_is_false_and_a_missing_task_is_task_not_found(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        assert store.cancel("t", reason="first") is True
        assert store.cancel("t", reason="second") is False
        assert store.load("t").last_failure == "first"
        with pytest.raises(TaskNotFound) as info:
            store.cancel("nope")
        assert info.value.task_id == "nope"
        assert store.list() == ["t"]

    def test_a_finished_task_is_not_cancelled(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index, cp.status, cp.terminal_result = 1, AgentStatus.COMPLETED, {"ok": True}
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        assert store.cancel("t", reason="too late") is False
        done = store.load("t")
        assert done.status == AgentStatus.COMPLETED and done.terminal_result == {"ok": True}

    def test_a_parked_task_leaves_the_parked_index(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        store.release("t", token="w", expected_revision=cp.revision, reason="boom")
        assert store.list_parked() == ["t"]
        assert store.cancel("t", reason="gave up") is True
        assert store.list_parked() == []
        cp = store.load("t")
        assert (cp.status, cp.parked, cp.last_failure) == (AgentStatus.CANCELLED, False, "gave up")

    def test_a_cancelled_task_can_be_acknowledged(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        store.cancel("t")
        cp = store.load("t")
        assert store.acknowledge_terminal("t", expected_revision=cp.revision) is True
        assert store.load("t") is None

    def test_bad_input_is_refused_before_anything_is_written(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        before = hash_of(raw, namespace, "t")
        with pytest.raises(InvalidArgument):
            store.cancel("t", reason=42)
        with pytest.raises(InvalidArgument):
            store.cancel("")
        assert hash_of(raw, namespace, "t") == before

    @pytest.mark.parametrize("reason", [None, ""])
    def test_no_reason_or_an_empty_one_records_cancelled(
        self, make: Callable[..., Any], raw: Any, namespace: str, reason: str | None
    ) -> None:
        """docs/operations.md: without a reason the task's last_failure is "cancelled (no reason
        given)"; an empty reason is none (it recorded "failed (no reason given)", a release's words)."""
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        store.claim("t", 1, token="w", lease_ms=LONG_MS)
        assert store.cancel("t", reason=reason) is True
        assert store.load("t").last_failure == "cancelled (no reason given)"
        assert hash_of(raw, namespace, "t")[b"why"] == b"cancelled (no reason given)"

    def test_a_huge_or_unencodable_reason_is_kept_cut_and_escaped(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("a"))
        store.create(Checkpoint("b"))
        assert store.cancel("a", reason="x" * 100_000)
        assert store.cancel("b", reason="bad \ud800 name")
        assert len(store.load("a").last_failure.encode()) <= 1024
        assert store.load("b").last_failure == "bad \\ud800 name"

    def test_the_durable_steps_of_a_cancelled_task_are_dropped(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        store.claim("t", 1, token="w", lease_ms=LONG_MS)
        steps = Keys(namespace).task("t").steps
        raw.hset(steps, "1\x00llm", b"a stored result")  # what a recorded durable step leaves
        store.cancel("t")
        assert not raw.exists(steps)

    def test_terminal_ttl_applies_to_a_cancelled_task(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=60_000)
        store.create(Checkpoint("t"))
        store.cancel("t")
        ttl = raw.pttl(Keys(namespace).task("t").checkpoint)
        assert 0 < ttl <= 60_000


def test_cancelled_is_a_terminal_status() -> None:
    assert AgentStatus("cancelled") is AgentStatus.CANCELLED and AgentStatus.CANCELLED in TERMINAL_STATUSES
    assert "cancelled = true" in S.constants_prelude().split("local TERMINAL")[1].splitlines()[0]


def test_a_resent_cancel_answers_as_the_first(backend: Any, namespace: str) -> None:
    """The same cancel call (same nonce) sent twice: the second finds it done, not terminal."""
    store = CheckpointStore(backend.sync_client(), namespace=namespace)
    store.create(Checkpoint("t"))
    call = next(store._core.cancel("t", reason="r"))
    script = store._scripts[S.CANCEL]
    first = script(keys=call.keys, args=call.args, client=store.client)
    again = script(keys=call.keys, args=call.args, client=store.client)
    assert (first[0], again[0]) == (S.Reply.DONE, S.Reply.DONE_BEFORE)
    other = next(store._core.cancel("t"))  # a new call (new nonce): the task is terminal now
    assert script(keys=other.keys, args=other.args, client=store.client)[0] == S.Reply.TERMINAL


def test_the_lease_keeper_tells_the_holder_within_a_renew_interval(
    sync_store: CheckpointStore, monkeypatch: Any
) -> None:
    """Without the announcement (no subscription), the next renewal's refusal says it was a cancel."""
    store = sync_store
    monkeypatch.setattr(store, "_watch_cancel", None)
    store.create(Checkpoint("t"))
    with pytest.raises(LeaseLost) as lost, store.lease("t", 1, lease_ms=1_500, renew_interval_ms=100) as lease:
        other = CheckpointStore(store.client, namespace=store.namespace)
        assert other.cancel("t", reason="stop")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lease.check()  # raises LeaseLost once the keeper's renew is refused
            time.sleep(0.02)
        raise AssertionError("the lease was never reported lost")
    assert lost.value.cancelled and isinstance(lost.value.__cause__, TaskCancelled)
    assert lost.value.__cause__.reason == "stop" and lease.cancelled is lost.value.__cause__
    assert store.load("t").status == AgentStatus.CANCELLED


# A lease this long renews every 7.5 s: a holder that learns of the cancel within DELIVERY_S learnt
# it from the announcement, not from a renewal.
DELIVERY_S = 3.0


class TestCancelDelivery:
    """The holder hears of a cancel at once, through the store's wake-up subscription."""

    def test_a_sync_holder_is_told_before_its_next_renewal(self, sync_store: CheckpointStore) -> None:
        store = sync_store
        for tid in ("t", "bystander"):
            store.create(Checkpoint(tid))
        canceller = CheckpointStore(store.client, namespace=store.namespace)
        with store.lease("bystander", 1, lease_ms=LONG_MS) as bystander:
            with store.lease("t", 1, lease_ms=LONG_MS) as lease:
                time.sleep(0.2)  # the subscription, started in the background, is up
                sent = time.monotonic()
                assert canceller.cancel("t", reason="the user left")
                assert lease.lost_event.wait(DELIVERY_S), "the cancel was not delivered"
                took = time.monotonic() - sent
                assert lease.renewals == 0 and took < DELIVERY_S
                assert lease.cancelled is not None and lease.cancelled.reason == "the user left"
                with pytest.raises(LeaseLost) as lost:
                    lease.check()
                assert lost.value.cancelled and lost.value.__cause__ is lease.cancelled
                cp = lease.checkpoint
                cp.cycle_index = 1
                with pytest.raises(LeaseLost):
                    lease.commit(cp)  # refused before anything is sent
            assert not bystander.lost  # a cancel of another task is not this lease's
            cp = bystander.checkpoint
            cp.cycle_index = 1
            bystander.commit(cp)
        assert store.load("t").status == AgentStatus.CANCELLED and store.load("t").cycle_index == 0
        assert store.load("bystander").cycle_index == 1

    async def test_an_async_holders_body_is_cancelled(self, async_store: AsyncCheckpointStore) -> None:
        store = async_store
        await store.create(Checkpoint("t"))
        canceller = AsyncCheckpointStore(store.client, namespace=store.namespace)
        body_cancelled = False

        async def cancel_soon() -> float:
            await asyncio.sleep(0.2)
            sent = time.monotonic()
            assert await canceller.cancel("t", reason="stop")
            return sent

        canceller_task = asyncio.get_running_loop().create_task(cancel_soon())
        with pytest.raises(LeaseLost) as lost:
            async with store.lease("t", 1, lease_ms=LONG_MS) as lease:
                try:
                    await asyncio.sleep(DELIVERY_S * 3)
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        took = time.monotonic() - await canceller_task
        assert body_cancelled and took < DELIVERY_S and lease.renewals == 0
        assert lost.value.cancelled and lost.value.__cause__.reason == "stop"

    async def test_an_async_runner_cancels_the_handler_and_goes_on(self, async_store: AsyncCheckpointStore) -> None:
        store = async_store
        for tid in ("cancel-me", "other"):
            await store.create(Checkpoint(tid))
        canceller = AsyncCheckpointStore(store.client, namespace=store.namespace)
        started, seen = asyncio.Event(), []

        async def step(cp: Checkpoint) -> StepResult:
            if cp.task_id == "cancel-me":
                started.set()
                try:
                    await asyncio.sleep(DELIVERY_S * 3)
                except asyncio.CancelledError:
                    seen.append(time.monotonic())
                    raise
            cp.messages.append("done")
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"ok": True}
            return StepResult(cp, done=True)

        runner = AsyncRunner(store, step, concurrency=2, lease_ms=LONG_MS, handle_signals=False)
        run = asyncio.get_running_loop().create_task(runner.run(stop_when_idle=True))
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.2)
        sent = time.monotonic()
        assert await canceller.cancel("cancel-me", reason="operator")
        stats = await asyncio.wait_for(run, 30)
        assert seen and seen[0] - sent < DELIVERY_S
        assert (stats.cancelled, stats.lost, stats.finalized) == (1, 1, 1)
        cancelled, other = await store.load("cancel-me"), await store.load("other")
        assert (cancelled.status, cancelled.messages) == (AgentStatus.CANCELLED, [])
        assert other.status == AgentStatus.COMPLETED

    def test_a_sync_runner_drops_the_result_and_counts_it(self, sync_store: CheckpointStore) -> None:
        store = sync_store
        store.create(Checkpoint("t"))
        canceller = CheckpointStore(store.client, namespace=store.namespace)
        told = threading.Event()

        def step(cp: Checkpoint) -> StepResult:
            time.sleep(0.2)
            assert canceller.cancel(cp.task_id, reason="operator")
            lease = current_lease()
            assert lease is not None and lease.lost_event.wait(DELIVERY_S)
            told.set()
            cp.messages.append("late")
            return StepResult(cp)

        stats = Runner(store, step, lease_ms=LONG_MS, handle_signals=False).run(stop_when_idle=True)
        assert told.is_set() and (stats.cancelled, stats.committed) == (1, 0)
        assert store.load("t").messages == [] and store.load("t").status == AgentStatus.CANCELLED


def test_the_runner_drops_a_cancelled_handlers_result_and_goes_on(sync_store: CheckpointStore) -> None:
    store = sync_store
    for tid in ("cancel-me", "other"):
        store.create(Checkpoint(tid))
    canceller = CheckpointStore(store.client, namespace=store.namespace)

    def step(cp: Checkpoint) -> StepResult:
        if cp.task_id == "cancel-me":
            assert canceller.cancel(cp.task_id, reason="operator")
        cp.messages.append(f"cycle {cp.claimed_cycle}")
        if cp.claimed_cycle >= 2:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"done": True}
            return StepResult(cp, done=True)
        return StepResult(cp)

    Runner(store, step, concurrency=2, lease_ms=LONG_MS).run(stop_when_idle=True)
    cancelled, other = store.load("cancel-me"), store.load("other")
    assert (cancelled.status, cancelled.messages, cancelled.cycle_index) == (AgentStatus.CANCELLED, [], 0)
    assert other.status == AgentStatus.COMPLETED and other.messages == ["cycle 1", "cycle 2"]


def test_cli_cancel(private_server: Any, capsys: Any) -> None:
    url, ns = private_server.url, "cancelcli"
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    store.create(Checkpoint("a"))
    store.create(Checkpoint("<b>"))
    assert cli_mod.main(["cancel", "a", "--reason", "budget spent", "--url", url, "--namespace", ns]) == 0
    assert capsys.readouterr().out.startswith("cancelled a: it will not be claimed again")
    assert cli_mod.main(["cancel", "a", "--url", url, "--namespace", ns, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"task_id": "a", "cancelled": False}
    assert cli_mod.main(["cancel", "nope", "--url", url, "--namespace", ns]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no task 'nope'" in err
    assert cli_mod.main(["list", "--url", url, "--namespace", ns]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["a"].split()[1] == "cancelled" and rows["a"].endswith("reason: budget spent")
    assert rows["<b>"].split()[1] == "running" and "reason" not in rows["<b>"]
    assert store.load("a").last_failure == "budget spent"
    assert store.load("<b>").status == AgentStatus.RUNNING
    store.create(Checkpoint("c"))
    assert cli_mod.main(["cancel", "c", "--reason", "", "--url", url, "--namespace", ns]) == 0
    capsys.readouterr()
    assert store.load("c").last_failure == "cancelled (no reason given)"
    store.client.close()
