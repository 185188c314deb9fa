"""Timers and waiting for a person: ``delay_ms`` on create, commit and ``StepResult`` (the next cycle is not
claimable before it, on the server's clock), ``wait_user`` with or without a deadline, and ``store.resume``
(the person's answer appended, the task due now, a blocked ``claim_next`` woken); through the store, the
``Lease``, the ``Runner`` and the CLI, on every backend, sync and async."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    AsyncRunner,
    Checkpoint,
    CheckpointStore,
    CorruptState,
    InvalidArgument,
    NotDue,
    NotRunnable,
    NotWaiting,
    Runner,
    StepResult,
    TaskNotFound,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.keys import Keys
from redis_agentstate.wire import scripts as S

LONG_MS = 30_000
DELAY_MS = 400


def server_ms(raw: Any) -> int:
    """The server's clock in ms, from a client (or from what an async client's TIME returned)."""
    sec, usec = raw if isinstance(raw, (list, tuple)) else raw.time()
    return int(sec) * 1000 + int(usec) // 1000


def ready_score(raw: Any, namespace: str, task_id: str) -> float | None:
    score = raw.zscore(Keys(namespace).task(task_id).ready, task_id)
    return None if score is None else float(score)


def nested(depth: int) -> list[Any]:
    """A list ``depth`` levels deep: ``[[[...]]]``."""
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def depth(value: Any) -> int:
    """How many levels of single-item lists ``value`` is (``nested``'s inverse; no recursion: == of two
    values this deep raises RecursionError)."""
    n = 0
    while isinstance(value, list):
        n += 1
        value = value[0] if value else None
    return n


class TestDeepValues:
    """A value nested deeper than the codec reads back is InvalidArgument before anything is written, in
    every place a store takes one (issue 38, item 9); one level less is stored and loads back."""

    def test_shared_state_messages_and_results(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        # The body packs [shared_state, ...]: 1,024 levels of state are 1,025 of body. Written on main,
        # and every load since raised CorruptState.
        for cp in (Checkpoint("a", shared_state={"x": nested(1023)}), Checkpoint("m", messages=[nested(1025)]),
                   Checkpoint("r", status=AgentStatus.COMPLETED, terminal_result=nested(1024)),
                   Checkpoint("d", shared_state={"x": nested(30_000)})):  # fmt: skip
            with pytest.raises(InvalidArgument, match="not msgpack-serialisable"):
                store.create(cp)
            assert store.load(cp.task_id) is None
        assert [k for k in raw.scan_iter(match=f"{namespace}:*") if b"#layout}" not in k] == []
        assert store.create(Checkpoint("a", shared_state={"x": nested(1022)}, messages=[nested(1024)]))
        loaded = store.load("a")
        assert depth(loaded.shared_state["x"]) == 1022 and [depth(m) for m in loaded.messages] == [1024]
        cp = store.claim("a", 1, token="w", lease_ms=LONG_MS)
        before = dict(raw.hgetall(Keys(namespace).task("a").checkpoint))
        cp.cycle_index = 1
        for state, messages in (({"x": nested(1023)}, []), ({}, [nested(1025)])):
            cp.shared_state, cp.messages = state, [*cp.messages, *messages]
            with pytest.raises(InvalidArgument, match="not msgpack-serialisable"):
                store.commit(cp, token="w", expected_revision=cp.revision)
            cp.messages = cp.messages[:1]
        assert dict(raw.hgetall(Keys(namespace).task("a").checkpoint)) == before
        cp.shared_state = {"ok": 1}
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        assert store.load("a").shared_state == {"ok": 1}


def wait_until(raw: Any, at_ms: int) -> None:
    """Sleep until the server's clock has passed ``at_ms``."""
    while server_ms(raw) <= at_ms:
        time.sleep(0.02)


class TestTimers:
    """``delay_ms``: not claimable before it (``NotDue``), skipped by claim_next, claimable after."""

    def test_a_delayed_start_is_not_due_before_its_time(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        before = server_ms(raw)
        assert store.create(Checkpoint("t"), delay_ms=DELAY_MS)
        due = store.load("t").due_at_ms
        assert due is not None and before + DELAY_MS <= due <= server_ms(raw) + DELAY_MS
        assert ready_score(raw, namespace, "t") == due
        with pytest.raises(NotDue) as not_due:
            store.claim("t", 1, token="w", lease_ms=LONG_MS)
        assert not_due.value.due_at_ms == due and not_due.value.task_id == "t"
        assert store.claim_next(token="w", lease_ms=LONG_MS) is None
        wait_until(raw, due)
        cp = store.claim_next(token="w", lease_ms=LONG_MS)
        assert cp is not None and cp.task_id == "t" and cp.claimed_cycle == 1

    def test_a_committed_delay_holds_the_next_cycle(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index = 1
        cp.messages.append("look again later")
        assert store.commit(cp, token="w", expected_revision=cp.revision, delay_ms=DELAY_MS)
        stored = store.load("t")
        assert stored.due_at_ms is not None and ready_score(raw, namespace, "t") == stored.due_at_ms
        with pytest.raises(NotDue):
            store.claim("t", 2, token="w", lease_ms=LONG_MS)
        wait_until(raw, stored.due_at_ms)
        nxt = store.claim("t", 2, token="w", lease_ms=LONG_MS)
        assert nxt.messages == ["look again later"] and nxt.due_at_ms == stored.due_at_ms
        nxt.cycle_index = 2
        assert store.commit(nxt, token="w", expected_revision=nxt.revision)
        assert store.load("t").due_at_ms is None  # a commit without a delay: due now

    def test_a_blocked_claim_next_wakes_when_it_falls_due_never_before(
        self, make: Callable[..., Any], raw: Any
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        assert store.claim_next(token="w", lease_ms=LONG_MS, block_ms=50) is None  # the subscription is up
        store.create(Checkpoint("t"), delay_ms=DELAY_MS)
        due = store.load("t").due_at_ms
        started = time.monotonic()
        cp = store.claim_next(token="w", lease_ms=LONG_MS, block_ms=10_000)
        assert cp is not None and cp.task_id == "t"
        assert cp.lease_expires_at_ms - LONG_MS >= due  # claimed on the server at or after the due time
        assert time.monotonic() - started < 5  # woken by its timer, not at the end of the block

    def test_a_save_makes_a_delayed_task_due_now(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"), delay_ms=LONG_MS)
        store.save(Checkpoint("t"))
        assert store.load("t").due_at_ms is None
        assert store.claim("t", 1, token="w", lease_ms=LONG_MS) is not None

    @pytest.mark.parametrize("bad", [-1, 1.5, math.nan, True, "10", 10**13])
    def test_bad_delays_are_refused_before_anything_is_written(self, make: Callable[..., Any], bad: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        with pytest.raises(InvalidArgument):
            store.create(Checkpoint("t"), delay_ms=bad)
        assert store.load("t") is None
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index = 1
        with pytest.raises(InvalidArgument):
            store.commit(cp, token="w", expected_revision=cp.revision, delay_ms=bad)
        assert store.load("t").revision == cp.revision  # nothing written: still claimed

    def test_a_delay_needs_a_next_cycle(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index, cp.status, cp.terminal_result = 1, AgentStatus.COMPLETED, {"ok": True}
        with pytest.raises(InvalidArgument, match="delay_ms"):
            store.commit(cp, token="w", expected_revision=cp.revision, delay_ms=1000)
        with pytest.raises(InvalidArgument, match="delay_ms"):
            store.create(Checkpoint("p", status=AgentStatus.PENDING), delay_ms=1000)
        assert store.load("p") is None
        assert store.commit(cp, token="w", expected_revision=cp.revision, delay_ms=0)  # 0: no delay

    def test_a_corrupt_due_time_is_corrupt_state(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        raw.hset(Keys(namespace).task("t").checkpoint, "due", "soon")
        before = dict(raw.hgetall(Keys(namespace).task("t").checkpoint))
        with pytest.raises(CorruptState):
            store.load("t")
        with pytest.raises(CorruptState):
            store.claim("t", 1, token="w", lease_ms=LONG_MS)
        with pytest.raises(CorruptState):
            store.resume("t")
        assert dict(raw.hgetall(Keys(namespace).task("t").checkpoint)) == before
        row = store._summaries(["t"])[1][0]
        assert row["status"] == "corrupt" and "due" in row["corrupt"]


class TestWaitForAPerson:
    """``wait_user`` leaves the ready index; ``resume`` runs the task again with the person's answer."""

    def _waiting(self, store: Any, delay_ms: int | None = None) -> Checkpoint:
        store.create(Checkpoint("t", messages=["question?"]))
        cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index, cp.status = 1, AgentStatus.WAIT_USER
        assert store.commit(cp, token="w", expected_revision=cp.revision, delay_ms=delay_ms)
        return store.load("t")

    def test_a_waiting_task_is_never_served_until_resumed(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        waiting = self._waiting(store)
        assert waiting.status == AgentStatus.WAIT_USER and waiting.due_at_ms is None
        assert ready_score(raw, namespace, "t") is None
        assert store.claim_next(token="w", lease_ms=LONG_MS) is None
        with pytest.raises(NotRunnable):
            store.claim("t", 2, token="w", lease_ms=LONG_MS)
        assert store.resume("t", message={"role": "user", "content": "yes, book it"}) is True
        resumed = store.load("t")
        assert resumed.status == AgentStatus.RUNNING and resumed.revision == waiting.revision + 1
        assert resumed.messages == ["question?", {"role": "user", "content": "yes, book it"}]
        cp = store.claim_next(token="w", lease_ms=LONG_MS)
        assert cp is not None and cp.claimed_cycle == 2 and cp.messages[-1]["content"] == "yes, book it"

    def test_resume_refuses_what_is_not_waiting(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        with pytest.raises(TaskNotFound):
            store.resume("nope")
        store.create(Checkpoint("running"))
        with pytest.raises(NotWaiting) as not_waiting:
            store.resume("running", message="hi")
        assert not_waiting.value.status == "running"
        store.create(Checkpoint("done", status=AgentStatus.COMPLETED, terminal_result={"ok": 1}))
        with pytest.raises(NotWaiting):
            store.resume("done")
        store.create(Checkpoint("gone"))
        store.cancel("gone")
        with pytest.raises(NotWaiting) as cancelled:
            store.resume("gone")
        assert cancelled.value.status == "cancelled"
        assert store.load("running").messages == [] and store.load("running").revision == 0

    def test_a_bad_message_is_refused_before_anything_is_written(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_payload_bytes=1024)
        waiting = self._waiting(store)
        with pytest.raises(InvalidArgument):
            store.resume("t", message="x" * 2048)
        with pytest.raises(InvalidArgument):
            store.resume("t", message=object())
        assert store.load("t").revision == waiting.revision and store.load("t").status == AgentStatus.WAIT_USER

    @pytest.mark.parametrize("levels", [1025, 30_000])
    def test_a_message_nested_too_deeply_is_refused_before_anything_is_written(
        self, make: Callable[..., Any], raw: Any, namespace: str, levels: int
    ) -> None:
        """InvalidArgument, never a raw RecursionError or ValueError. 1,025 levels: msgpack packed them but
        reads back only 1,024, so the task was written and could never be loaded again (CorruptState)."""
        store = make(CheckpointStore, AsyncCheckpointStore)
        waiting = self._waiting(store)
        before = dict(raw.hgetall(Keys(namespace).task("t").checkpoint))
        with pytest.raises(InvalidArgument, match="not msgpack-serialisable"):
            store.resume("t", message=nested(levels))
        assert dict(raw.hgetall(Keys(namespace).task("t").checkpoint)) == before
        assert store.load("t").messages == waiting.messages == ["question?"]
        assert store.resume("t", message=nested(1024)) is True  # as deep as msgpack reads back
        assert depth(store.load("t").messages[-1]) == 1024

    def test_a_deadline_makes_the_task_due_by_itself_as_a_timeout(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        waiting = self._waiting(store, delay_ms=DELAY_MS)
        assert waiting.due_at_ms is not None
        with pytest.raises(NotRunnable):  # before its deadline it waits for the person
            store.claim("t", 2, token="w", lease_ms=LONG_MS)
        assert store.claim_next(token="w", lease_ms=LONG_MS) is None
        wait_until(raw, waiting.due_at_ms)
        timeout = store.claim_next(token="w", lease_ms=LONG_MS)
        assert timeout is not None and timeout.status == AgentStatus.WAIT_USER  # the handler sees a timeout
        timeout.cycle_index, timeout.status = 2, AgentStatus.RUNNING
        timeout.messages.append("no answer: cancelled the booking")
        assert store.commit(timeout, token="w", expected_revision=timeout.revision)
        assert store.load("t").status == AgentStatus.RUNNING

    def test_an_answer_at_the_deadline_wins_over_the_timeout(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        waiting = self._waiting(store, delay_ms=DELAY_MS)
        wait_until(raw, waiting.due_at_ms)
        timeout = store.claim("t", 2, token="w", lease_ms=LONG_MS)
        assert timeout.status == AgentStatus.WAIT_USER
        assert store.resume("t", message="yes")  # the person answered while the timeout was handled
        timeout.cycle_index, timeout.status = 2, AgentStatus.RUNNING
        assert not store.commit(timeout, token="w", expected_revision=timeout.revision)  # fenced out
        cp = store.claim("t", 2, token="w2", lease_ms=LONG_MS)
        assert cp.status == AgentStatus.RUNNING and cp.messages[-1] == "yes"

    def test_a_resume_wakes_a_blocked_claim_next(self, make: Callable[..., Any], backend: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        self._waiting(store)
        other = CheckpointStore(backend.sync_client(), namespace=namespace)
        assert store.claim_next(token="w", lease_ms=LONG_MS, block_ms=50) is None  # the subscription is up
        timer = threading.Timer(0.3, lambda: other.resume("t", message="go"))
        timer.start()
        try:
            started = time.monotonic()
            cp = store.claim_next(token="w", lease_ms=LONG_MS, block_ms=20_000)
            took = time.monotonic() - started
        finally:
            timer.join()
        assert cp is not None and cp.messages[-1] == "go" and took < 10

    def test_the_lease_commits_a_wait_with_a_deadline(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("t"))
        if isinstance(store, CheckpointStore):
            with store.lease("t", 1, lease_ms=LONG_MS) as lease:
                cp = lease.checkpoint
                cp.cycle_index, cp.status = 1, AgentStatus.WAIT_USER
                lease.commit(cp, delay_ms=LONG_MS)
        else:
            loop = store._loop

            async def body() -> None:
                async with store.wrapped.lease("t", 1, lease_ms=LONG_MS) as lease:
                    cp = lease.checkpoint
                    cp.cycle_index, cp.status = 1, AgentStatus.WAIT_USER
                    await lease.commit(cp, delay_ms=LONG_MS)

            loop.run_until_complete(body())
        stored = store.load("t")
        assert stored.status == AgentStatus.WAIT_USER and stored.due_at_ms is not None


def test_a_resent_resume_answers_as_the_first(backend: Any, namespace: str) -> None:
    """The same resume call (same nonce) sent twice: the message is appended once, the second finds it done."""
    store = CheckpointStore(backend.sync_client(), namespace=namespace)
    store.create(Checkpoint("t"))
    cp = store.claim("t", 1, token="w", lease_ms=LONG_MS)
    cp.cycle_index, cp.status = 1, AgentStatus.WAIT_USER
    store.commit(cp, token="w", expected_revision=cp.revision)
    call = next(store._core.resume("t", message="once"))
    script = store._scripts[S.RESUME]
    first = script(keys=call.keys, args=call.args, client=store.client)
    again = script(keys=call.keys, args=call.args, client=store.client)
    assert (first[0], again[0]) == (S.Reply.DONE, S.Reply.DONE_BEFORE)
    assert store.load("t").messages == ["once"]
    other = next(store._core.resume("t"))  # a new call: the task runs already
    assert script(keys=other.keys, args=other.args, client=store.client)[0] == S.Reply.NOT_WAITING


def test_the_runner_waits_for_a_person_and_goes_on_with_the_answer(sync_store: CheckpointStore) -> None:
    store = sync_store
    store.create(Checkpoint("trip"))
    seen: list[Any] = []

    def step(cp: Checkpoint) -> StepResult:
        seen.append((cp.claimed_cycle, cp.status, list(cp.messages)))
        if cp.claimed_cycle == 1:
            cp.messages.append("which date?")
            cp.status = AgentStatus.WAIT_USER
            return StepResult(cp)
        if cp.claimed_cycle == 2:
            cp.messages.append("booked; I will check the price again shortly")
            return StepResult(cp, delay_ms=DELAY_MS)
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"booked": cp.messages[1]}
        return StepResult(cp, done=True)

    runner = Runner(store, step, lease_ms=LONG_MS, handle_signals=False)
    assert runner.run(stop_when_idle=True).committed == 1  # then it waits for the person: idle
    assert store.load("trip").status == AgentStatus.WAIT_USER
    assert store.resume("trip", message="the 4th")
    assert runner.run(stop_when_idle=True).committed == 2  # cycle 2; cycle 3 is not due yet
    delayed = store.load("trip")
    assert delayed.cycle_index == 2 and delayed.due_at_ms is not None
    wait_until(store.client, delayed.due_at_ms)
    assert runner.run(stop_when_idle=True).finalized == 1
    assert [s[:2] for s in seen] == [(1, AgentStatus.RUNNING), (2, AgentStatus.RUNNING), (3, AgentStatus.RUNNING)]
    assert seen[1][2] == ["which date?", "the 4th"]
    assert store.load("trip").terminal_result == {"booked": "the 4th"}


def test_a_done_step_result_cannot_be_delayed(sync_store: CheckpointStore) -> None:
    store = sync_store
    store.create(Checkpoint("t"))

    def step(cp: Checkpoint) -> StepResult:
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"ok": True}
        return StepResult(cp, done=True, delay_ms=1000)

    stats = Runner(store, step, lease_ms=LONG_MS, handle_signals=False, failure_delay_ms=50).run(stop_when_idle=True)
    assert stats.failed >= 1 and store.load("t").status == AgentStatus.RUNNING


def test_cli_resume_and_list_waiting(private_server: Any, capsys: Any) -> None:
    url, ns = private_server.url, "resumecli"
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    for tid, delay in (("ask", None), ("timed", LONG_MS)):
        store.create(Checkpoint(tid))
        cp = store.claim(tid, 1, token="w", lease_ms=LONG_MS)
        cp.cycle_index, cp.status = 1, AgentStatus.WAIT_USER
        store.commit(cp, token="w", expected_revision=cp.revision, delay_ms=delay)
    store.create(Checkpoint("busy"))
    base = ["--url", url, "--namespace", ns]
    assert cli_mod.main(["list", "--waiting", *base]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line and not line.startswith("(")}
    assert set(rows) == {"ask", "timed"}
    assert "none (waits for `agentstate resume`)" in rows["ask"] and " in " in rows["timed"]
    assert cli_mod.main(["list", "--waiting", "--json", *base]) == 0
    assert {r["task_id"] for r in json.loads(capsys.readouterr().out)} == {"ask", "timed"}
    assert cli_mod.main(["show", "timed", *base]) == 0
    shown = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in capsys.readouterr().out.splitlines())}
    assert shown["status"] == '"wait_user"' and int(shown["due_at_ms"]) == store.load("timed").due_at_ms
    assert cli_mod.main(["resume", "ask", "--message", '{"answer": 4}', *base]) == 0
    assert capsys.readouterr().out.startswith("resumed ask: due now, the message appended")
    assert store.load("ask").messages == [{"answer": 4}] and store.load("ask").status == AgentStatus.RUNNING
    assert cli_mod.main(["resume", "ask", *base]) == 1  # running now
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "not waiting" in err
    assert cli_mod.main(["resume", "timed", "--message", "{not json", *base]) == 1
    assert "not JSON" in capsys.readouterr().err
    assert store.load("timed").status == AgentStatus.WAIT_USER
    assert cli_mod.main(["resume", "timed", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out) == {"task_id": "timed", "resumed": True}
    assert cli_mod.main(["list", *base]) == 0
    listed = capsys.readouterr().out
    assert "wait_user" not in listed
    store.client.close()


async def test_the_async_runner_delays_a_cycle_and_serves_it_when_due(async_store: AsyncCheckpointStore) -> None:
    store = async_store
    await store.create(Checkpoint("t"))
    seen: list[tuple[int, int | None]] = []

    async def step(cp: Checkpoint) -> StepResult:
        seen.append((cp.claimed_cycle or 0, cp.due_at_ms))
        if cp.claimed_cycle == 1:
            return StepResult(cp, delay_ms=DELAY_MS)
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"ok": True}
        return StepResult(cp, done=True)

    runner = AsyncRunner(store, step, lease_ms=LONG_MS, handle_signals=False)
    assert (await runner.run(stop_when_idle=True)).committed == 1  # cycle 2 is not due yet
    due = (await store.load("t")).due_at_ms
    assert due is not None
    with pytest.raises(NotDue):
        await store.claim("t", 2, token="x", lease_ms=LONG_MS)
    while server_ms(await store.client.time()) <= due:
        await asyncio.sleep(0.02)
    assert (await runner.run(stop_when_idle=True)).finalized == 1
    assert seen == [(1, None), (2, due)]
