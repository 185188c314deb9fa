"""``store.cancel``: a task ends at once with status ``cancelled``, whoever holds it; the holder's next
write is fenced out with nothing written, the task leaves every index and is never claimed again,
a re-sent cancel answers as the first did, and the CLI cancels too."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redis_agentstate import (
    TERMINAL_STATUSES,
    AgentStatus,
    AsyncCheckpointStore,
    Checkpoint,
    CheckpointStore,
    CheckpointTerminal,
    InvalidArgument,
    LeaseLost,
    Runner,
    StepResult,
    TaskNotFound,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate import scripts as S
from redis_agentstate.keys import Keys

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


def test_the_lease_keeper_tells_the_holder_within_a_renew_interval(sync_store: CheckpointStore) -> None:
    store = sync_store
    store.create(Checkpoint("t"))
    with pytest.raises(LeaseLost), store.lease("t", 1, lease_ms=1_500, renew_interval_ms=100) as lease:
        other = CheckpointStore(store.client, namespace=store.namespace)
        assert other.cancel("t", reason="stop")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lease.check()  # raises LeaseLost once the keeper's renew is refused
            time.sleep(0.02)
        raise AssertionError("the lease was never reported lost")
    assert store.load("t").status == AgentStatus.CANCELLED


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
    store.client.close()
