"""Runner and AsyncRunner: claim_next -> handler -> commit/finalize, failures, lost leases,
logging, and a graceful SIGTERM in a real process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    Checkpoint,
    CheckpointStore,
    InvalidArgument,
    LeaseLost,
)
from redis_agentstate.lease import AsyncLease, Clock, Lease
from redis_agentstate.runner import AsyncRunner, Runner, StepResult, _RunnerBase, current_lease

CYCLES = 3


def step(cp: Checkpoint, who: str = "w") -> StepResult:
    """A simulated agent step: one message per cycle; done after CYCLES."""
    cycle = cp.claimed_cycle
    cp.messages.append({"cycle": cycle, "by": who})
    if cycle == CYCLES:
        cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"cycles": cycle}
        return StepResult(cp, done=True)
    return StepResult(cp)


def assert_all_done(cps: list[Checkpoint]) -> None:
    for cp in cps:
        assert cp.is_terminal and cp.cycle_index == CYCLES, cp
        assert [m["cycle"] for m in cp.messages] == list(range(1, CYCLES + 1))


def test_runner_takes_every_task_to_the_end(sync_store: CheckpointStore) -> None:
    for i in range(6):
        sync_store.create(Checkpoint(f"t{i}"))
    runner = Runner(sync_store, step, concurrency=3, lease_ms=5_000, handle_signals=False, idle_min_ms=5)
    stats = runner.run(stop_when_idle=True)
    assert (stats.claimed, stats.committed, stats.finalized, stats.failed, stats.lost) == (18, 12, 6, 0, 0)
    assert_all_done([sync_store.load(f"t{i}") for i in range(6)])


async def test_async_runner_takes_every_task_to_the_end(async_store: AsyncCheckpointStore) -> None:
    for i in range(6):
        await async_store.create(Checkpoint(f"t{i}"))

    async def handler(cp: Checkpoint) -> StepResult:
        await asyncio.sleep(0.001)
        return step(cp)

    runner = AsyncRunner(async_store, handler, concurrency=3, lease_ms=5_000, handle_signals=False)
    stats = await runner.run(stop_when_idle=True)
    assert (stats.committed, stats.finalized) == (12, 6)
    assert_all_done([await async_store.load(f"t{i}") for i in range(6)])


def test_a_bare_checkpoint_is_done_when_it_has_a_result(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))

    def handler(cp: Checkpoint) -> Checkpoint:
        cp.messages.append(cp.claimed_cycle)
        if cp.claimed_cycle == 2:
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
        return cp

    stats = Runner(sync_store, handler, handle_signals=False).run(stop_when_idle=True)
    assert (stats.committed, stats.finalized) == (1, 1)
    assert sync_store.load("t").messages == [1, 2]


def test_every_cycle_log_line_names_task_cycle_revision_token(
    sync_store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    sync_store.create(Checkpoint("t"))
    caplog.set_level(logging.INFO, logger="redis_agentstate.runner")
    Runner(sync_store, step, handle_signals=False, worker_id="wk").run(stop_when_idle=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "redis_agentstate.runner"]
    assert len(lines) == 2 * CYCLES
    assert lines[0].startswith("task=t cycle=1 revision=1 token=wk:") and "claimed" in lines[0]
    assert lines[1].startswith("task=t cycle=1 revision=1 token=wk:") and "committed; new revision=2" in lines[1]
    assert "finalized" in lines[-1] and lines[-1].startswith("task=t cycle=3 revision=5 ")


def test_a_failing_handler_releases_the_cycle_for_a_retry(
    sync_store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    sync_store.create(Checkpoint("t"))
    calls: list[int] = []

    def flaky(cp: Checkpoint) -> StepResult:
        calls.append(cp.claimed_cycle)
        if len(calls) == 2:
            raise RuntimeError("model timed out")
        return step(cp)

    runner = Runner(sync_store, flaky, handle_signals=False, failure_delay_ms=30, idle_min_ms=5, idle_max_ms=20)
    started = time.monotonic()
    while not sync_store.load("t").is_terminal and time.monotonic() - started < 5:
        runner.run(stop_when_idle=True)  # returns when the released cycle is not due yet; go again
    assert calls == [1, 2, 2, 3]
    assert runner.stats.failed == 1 and runner.stats.finalized == 1
    assert_all_done([sync_store.load("t")])
    assert any("model timed out" in (r.exc_text or "") or r.exc_info for r in caplog.records if r.levelname == "ERROR")


def compacting_step(cp: Checkpoint) -> StepResult:
    """Cycle 1 summarises the whole history into one message (a rewrite); cycle 2 finishes."""
    if cp.claimed_cycle == 1:
        cp.messages = [{"summary": f"{len(cp.messages)} messages"}]
        cp.cycles = [{"compacted": True}]
        return StepResult(cp, replace_history=True)
    cp.messages.append({"cycle": cp.claimed_cycle})
    cp.status, cp.terminal_result = AgentStatus.COMPLETED, "ok"
    return StepResult(cp, done=True, replace_history=False)


def test_a_handler_that_compacts_history_commits_with_replace_history(sync_store: CheckpointStore) -> None:
    # Before: StepResult had no replace_history, so a compacting handler's commit was refused
    # (history shrank) and the cycle was released and retried forever.
    sync_store.create(Checkpoint("t", messages=[{"n": i} for i in range(5)], cycles=[{"c": 0}]))
    stats = Runner(sync_store, compacting_step, handle_signals=False, failure_delay_ms=60_000).run(stop_when_idle=True)
    assert (stats.committed, stats.finalized, stats.failed) == (1, 1, 0)
    cp = sync_store.load("t")
    assert cp.is_terminal and cp.messages == [{"summary": "5 messages"}, {"cycle": 2}]
    assert cp.cycles == [{"compacted": True}]


async def test_async_runner_commits_a_compacted_history(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t", messages=[{"n": i} for i in range(5)]))

    async def handler(cp: Checkpoint) -> StepResult:
        return compacting_step(cp)

    runner = AsyncRunner(async_store, handler, handle_signals=False, failure_delay_ms=60_000)
    stats = await runner.run(stop_when_idle=True)
    assert (stats.committed, stats.finalized, stats.failed) == (1, 1, 0)
    assert (await async_store.load("t")).messages == [{"summary": "5 messages"}, {"cycle": 2}]


def test_a_non_bool_replace_history_fails_the_cycle(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t", messages=["a"]))
    runner = Runner(
        sync_store, lambda cp: StepResult(cp, replace_history="yes"),  # type: ignore[arg-type]
        handle_signals=False, failure_delay_ms=200, failure_delay_max_ms=200,
    )  # fmt: skip
    assert runner.run(stop_when_idle=True).failed == 2  # the cycle and its one awaited retry
    cp = sync_store.load("t")
    assert (cp.cycle_index, cp.messages, cp.attempts) == (0, ["a"], 2)


def test_a_bad_handler_result_fails_the_cycle(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    runner = Runner(sync_store, lambda cp: "nope", handle_signals=False, failure_delay_ms=200, failure_delay_max_ms=200)  # type: ignore[arg-type,return-value]
    stats = runner.run(stop_when_idle=True)
    assert stats.failed == 2 and stats.committed == 0
    assert sync_store.load("t").cycle_index == 0


def test_a_commit_the_store_refuses_is_retried_after_the_failure_delay_not_at_once(
    sync_store: CheckpointStore,
) -> None:
    sync_store.create(Checkpoint("t"))
    calls: list[float] = []

    def unstorable(cp: Checkpoint) -> StepResult:
        calls.append(time.monotonic())
        cp.shared_state["oops"] = {1, 2}  # msgpack cannot encode a set: commit raises InvalidArgument
        return step(cp)

    runner = Runner(sync_store, unstorable, handle_signals=False, failure_delay_ms=500, idle_min_ms=5, idle_max_ms=10)
    runner.run(stop_when_idle=True)  # waits for the one retry it owes, fails again, returns
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.45  # released for 0.5-1 s, not reclaimed in a hot loop
    cp = sync_store.load("t")
    assert runner.stats.failed == 2 and (cp.cycle_index, cp.messages, cp.shared_state) == (0, [], {})


def test_a_lost_lease_is_reported_and_not_committed(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    lost: list[tuple[Any, Any]] = []
    sabotaged: list[bool] = []

    def handler(cp: Checkpoint) -> StepResult:
        if not sabotaged:
            sabotaged.append(True)
            sync_store.save(Checkpoint("t", revision=40))  # an operator resets the task mid-cycle
            lease = current_lease()
            assert lease is not None
            for _ in range(100):
                time.sleep(0.02)
                lease.check()  # raises LeaseLost within one renew interval
        return step(cp)

    runner = Runner(
        sync_store, handler, lease_ms=1_000, handle_signals=False, on_lease_lost=lambda le, cp: lost.append((le, cp))
    )
    stats = runner.run(stop_when_idle=True)
    assert stats.lost == 1 and stats.finalized == 1
    assert len(lost) == 1 and lost[0][0].lost and lost[0][1] is None
    final = sync_store.load("t")
    assert [m["cycle"] for m in final.messages] == [1, 2, 3] and final.revision == 46


async def test_async_lost_lease_cancels_the_handler(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    cancelled: list[bool] = []
    lost: list[Any] = []

    async def handler(cp: Checkpoint) -> StepResult:
        if not cancelled:
            await async_store.save(Checkpoint("t", revision=40))
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        return step(cp)

    runner = AsyncRunner(
        async_store, handler, lease_ms=1_000, handle_signals=False, on_lease_lost=lambda le, cp: lost.append(le)
    )
    started = time.monotonic()
    stats = await runner.run(stop_when_idle=True)
    assert cancelled == [True] and stats.lost == 1 and stats.finalized == 1 and len(lost) == 1
    assert time.monotonic() - started < 5
    assert isinstance(LeaseLost("x"), Exception)


def test_options_are_validated(sync_store: CheckpointStore) -> None:
    for bad in (
        {"concurrency": 0},
        {"idle_min_ms": 100, "idle_max_ms": 50},
        {"lease_ms": 100, "renew_deadline_ms": 100},
        {"failure_delay_ms": 0},
    ):
        with pytest.raises(InvalidArgument):
            Runner(sync_store, step, **bad)
    with pytest.raises(InvalidArgument):
        Runner(sync_store, "not callable")  # type: ignore[arg-type]


# ---- graceful SIGTERM in a real process ---------------------------------------------------------

SLOW_WORKER = textwrap.dedent(
    """
    import logging, sys, time
    import redis
    from redis_agentstate import CheckpointStore
    from redis_agentstate.runner import Runner, StepResult

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s", force=True)
    store = CheckpointStore(redis.Redis.from_url(sys.argv[1]), namespace="graceful")

    def handler(cp):
        print("WORKING", cp.claimed_cycle, flush=True)
        time.sleep(0.8)
        cp.messages.append(cp.claimed_cycle)
        return StepResult(cp)

    stats = Runner(store, handler, lease_ms=5000, worker_id="slow").run()
    print("EXIT", stats.committed, flush=True)
    """
)


@pytest.mark.real
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_cycle_in_flight_then_exits(private_server: Any, sig: int) -> None:
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace="graceful")
    store.create(Checkpoint("t"))
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WORKER, private_server.url], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("WORKING"):
                break
        proc.send_signal(sig)
        lines += [line.strip() for line in proc.stdout]
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert lines[-1] == "EXIT 1", lines
    assert any("finishing in-flight cycles" in line for line in lines)
    assert any(line.startswith("task=t cycle=1 revision=1 token=slow:") and "committed" in line for line in lines)
    cp = store.load("t")
    assert cp.cycle_index == 1 and cp.messages == [1] and cp.claim_token is None


# ---- failure reasons the wire cannot carry as they are (issue 19, item 6) -----------------------

#: What ``os.fsdecode`` makes of a file name that is not UTF-8: a lone surrogate.
SURROGATE = os.fsdecode(b"report-\xff.pdf")
ESCAPED = "report-\\udcff.pdf"


class Formatted(logging.Filter):
    """Formats each record (traceback included) into ``texts`` and drops it.

    The runner's log of these failures holds the surrogates: it is kept out of pytest's captured
    logs, which pytest-xdist cannot send from its workers ("strings must be utf-8 encodable").
    """

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.texts.append(logging.Formatter().format(record))
        return False


@pytest.fixture
def quiet() -> Iterator[tuple[logging.Logger, Formatted]]:
    logger = logging.getLogger(f"test_runner.quiet.{uuid.uuid4().hex}")
    formatted = Formatted()
    logger.addFilter(formatted)
    yield logger, formatted
    logger.removeFilter(formatted)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def test_a_release_reason_with_a_lone_surrogate_is_stored_escaped(make: Callable[..., Any]) -> None:
    # Before: UnicodeEncodeError from the client, the claim left to lapse.
    store = make(CheckpointStore, AsyncCheckpointStore)
    for i, reason in enumerate(("a\ud800b", SURROGATE, "\udcff" * 5000)):
        tid = f"t{i}"
        store.create(Checkpoint(tid))
        cp = store.claim(tid, 1, token="w", lease_ms=30_000)
        assert store.release(tid, token="w", expected_revision=cp.revision, reason=reason)
        got = store.load(tid)
        assert (got.attempts, got.parked) == (1, False)
        if i == 0:
            assert got.last_failure == "a\\ud800b"
        elif i == 1:
            assert got.last_failure == ESCAPED
        else:  # escaped, then cut like any long reason
            assert got.last_failure.startswith("\\udcff\\udcff") and got.last_failure.endswith("...")
            assert len(got.last_failure.encode()) <= 1024


def test_a_lease_released_with_a_surrogate_reason_records_it(sync_store: CheckpointStore) -> None:
    sync_store.create(Checkpoint("t"))
    with sync_store.lease("t", 1, lease_ms=30_000) as lease:
        assert lease.release(reason=f"OSError: {SURROGATE}")
    sync_store.create(Checkpoint("u"))
    with pytest.raises(OSError), sync_store.lease("u", 1, lease_ms=30_000):
        raise OSError(SURROGATE)
    assert sync_store.load("t").last_failure == f"OSError: {ESCAPED}"
    u = sync_store.load("u")
    assert (u.last_failure, u.attempts) == (f"OSError: {ESCAPED}", 1)


async def test_an_async_lease_released_with_a_surrogate_reason_records_it(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    async with async_store.lease("t", 1, lease_ms=30_000) as lease:
        assert await lease.release(reason=f"OSError: {SURROGATE}")
    await async_store.create(Checkpoint("u"))
    with pytest.raises(OSError):
        async with async_store.lease("u", 1, lease_ms=30_000):
            raise OSError(SURROGATE)
    assert (await async_store.load("t")).last_failure == f"OSError: {ESCAPED}"
    u = await async_store.load("u")
    assert (u.last_failure, u.attempts) == (f"OSError: {ESCAPED}", 1)


def raise_bad_messages(cp: Checkpoint) -> StepResult:
    """A handler failing with messages a release must survive: surrogates, an unprintable one, a huge one."""
    if cp.task_id.startswith("fs"):
        raise OSError(f"cannot open {SURROGATE}")
    if cp.task_id == "unprintable":
        raise Unprintable()
    if cp.task_id == "huge":
        raise ValueError(SURROGATE * 200_000)
    return step(cp)


BAD_TASKS = ("fs-0", "fs-1", "fs-2", "fs-3", "unprintable", "huge", "ok")


def assert_failures_recorded(cps: dict[str, Checkpoint]) -> None:
    for tid in ("fs-0", "fs-1", "fs-2", "fs-3"):
        assert cps[tid].last_failure == f"OSError: cannot open {ESCAPED}", cps[tid]
    assert cps["unprintable"].last_failure == f"{Unprintable.__module__}.Unprintable: <unprintable>"
    huge = cps["huge"].last_failure
    assert huge is not None and huge.startswith(f"ValueError: {ESCAPED}") and huge.endswith("...")
    for tid in BAD_TASKS[:-1]:
        assert (cps[tid].parked, cps[tid].attempts, cps[tid].claim_token) == (True, 1, None), cps[tid]
    assert cps["ok"].is_terminal


def assert_failures_logged(texts: list[str]) -> None:
    """Each failure was logged with its traceback, the message as it was (surrogates and all)."""
    failed = [t for t in texts if "handler failed" in t]
    assert len(failed) == 6 and sum(f"OSError: cannot open {SURROGATE}" in t for t in failed) == 4
    assert any("Unprintable" in t for t in failed)


def test_the_runner_survives_handler_messages_the_wire_cannot_carry(
    sync_store: CheckpointStore, quiet: tuple[logging.Logger, Formatted]
) -> None:
    # Before: 3 of 4 worker threads died of UnicodeEncodeError and the tasks' claims lapsed.
    store = CheckpointStore(sync_store.client, namespace=sync_store.namespace, max_attempts=1)
    for tid in BAD_TASKS:
        store.create(Checkpoint(tid))
    runner = Runner(store, raise_bad_messages, concurrency=4, lease_ms=30_000, handle_signals=False, logger=quiet[0])
    stats = runner.run(stop_when_idle=True)
    assert (stats.failed, stats.parked, stats.finalized) == (6, 6, 1)
    assert_failures_recorded({tid: store.load(tid) for tid in BAD_TASKS})
    assert_failures_logged(quiet[1].texts)


async def test_the_async_runner_survives_handler_messages_the_wire_cannot_carry(
    async_store: AsyncCheckpointStore, quiet: tuple[logging.Logger, Formatted]
) -> None:
    # Before: AsyncRunner.run() raised UnicodeEncodeError.
    store = AsyncCheckpointStore(async_store.client, namespace=async_store.namespace, max_attempts=1)
    for tid in BAD_TASKS:
        await store.create(Checkpoint(tid))

    async def handler(cp: Checkpoint) -> StepResult:
        return raise_bad_messages(cp)

    runner = AsyncRunner(store, handler, concurrency=4, lease_ms=30_000, handle_signals=False, logger=quiet[0])
    stats = await runner.run(stop_when_idle=True)
    assert (stats.failed, stats.parked, stats.finalized) == (6, 6, 1)
    assert_failures_recorded({tid: await store.load(tid) for tid in BAD_TASKS})
    assert_failures_logged(quiet[1].texts)


# ---- stop_when_idle waits for the retries it owes (issue 19, item 7) ---------------------------


def fails_once(calls: list[tuple[int, float]]) -> Callable[[Checkpoint], StepResult]:
    """``step``, except that the second call (cycle 2's first attempt) raises."""

    def handler(cp: Checkpoint) -> StepResult:
        calls.append((cp.claimed_cycle, time.monotonic()))
        if len(calls) == 2:
            raise RuntimeError("model timed out")
        return step(cp)

    return handler


def always_fails(calls: list[tuple[int, float]]) -> Callable[[Checkpoint], StepResult]:
    def handler(cp: Checkpoint) -> StepResult:
        calls.append((cp.claimed_cycle, time.monotonic()))
        raise RuntimeError("never works")

    return handler


def test_stop_when_idle_waits_for_the_retry_of_a_failed_cycle(sync_store: CheckpointStore) -> None:
    # Before: run() returned at once after the failure, the retry pending and the task unfinished.
    sync_store.create(Checkpoint("t"))
    calls: list[tuple[int, float]] = []
    runner = Runner(sync_store, fails_once(calls), concurrency=2, handle_signals=False, failure_delay_ms=300,
                    failure_delay_max_ms=300)  # fmt: skip
    stats = runner.run(stop_when_idle=True)
    assert [cycle for cycle, _ in calls] == [1, 2, 2, 3]
    assert calls[2][1] - calls[1][1] >= 0.25  # the retry came after its delay, not sooner
    assert (stats.failed, stats.finalized) == (1, 1)
    assert_all_done([sync_store.load("t")])


async def test_async_stop_when_idle_waits_for_the_retry_of_a_failed_cycle(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    calls: list[tuple[int, float]] = []
    sync_handler = fails_once(calls)

    async def handler(cp: Checkpoint) -> StepResult:
        return sync_handler(cp)

    runner = AsyncRunner(async_store, handler, concurrency=2, handle_signals=False, failure_delay_ms=300,
                         failure_delay_max_ms=300)  # fmt: skip
    stats = await runner.run(stop_when_idle=True)
    assert [cycle for cycle, _ in calls] == [1, 2, 2, 3]
    assert calls[2][1] - calls[1][1] >= 0.25
    assert (stats.failed, stats.finalized) == (1, 1)
    assert_all_done([await async_store.load("t")])


def test_stop_when_idle_waits_once_per_cycle_so_a_task_failing_for_ever_cannot_keep_it_running(
    sync_store: CheckpointStore,
) -> None:
    sync_store.create(Checkpoint("t"))
    calls: list[tuple[int, float]] = []
    runner = Runner(sync_store, always_fails(calls), concurrency=3, handle_signals=False, failure_delay_ms=200,
                    failure_delay_max_ms=200)  # fmt: skip
    stats = runner.run(stop_when_idle=True)
    assert [cycle for cycle, _ in calls] == [1, 1] and stats.failed == 2
    cp = sync_store.load("t")
    assert (cp.attempts, cp.parked, cp.last_failure) == (2, False, "RuntimeError: never works")
    # A later run that claims the cycle owes it one retry again.
    time.sleep(0.3)  # the retry is due (in 200 ms)
    runner.run(stop_when_idle=True)
    assert [cycle for cycle, _ in calls] == [1, 1, 1, 1] and runner.stats.failed == 4


async def test_async_stop_when_idle_waits_once_per_cycle(async_store: AsyncCheckpointStore) -> None:
    await async_store.create(Checkpoint("t"))
    calls: list[tuple[int, float]] = []
    sync_handler = always_fails(calls)

    async def handler(cp: Checkpoint) -> StepResult:
        return sync_handler(cp)

    runner = AsyncRunner(async_store, handler, concurrency=3, handle_signals=False, failure_delay_ms=200,
                         failure_delay_max_ms=200)  # fmt: skip
    stats = await runner.run(stop_when_idle=True)
    assert [cycle for cycle, _ in calls] == [1, 1] and stats.failed == 2


def test_stop_when_idle_stops_waiting_for_a_retry_that_is_gone(sync_store: CheckpointStore) -> None:
    # The task is deleted while its retry is pending: the run looks for it once it is due, then returns.
    sync_store.create(Checkpoint("t"))
    calls: list[tuple[int, float]] = []
    deleted = threading.Event()

    def delete_once_released() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            cp = sync_store.load("t")
            if cp is not None and cp.last_failure is not None:
                sync_store.delete("t")
                deleted.set()
                return
            time.sleep(0.01)

    deleter = threading.Thread(target=delete_once_released)
    deleter.start()
    runner = Runner(sync_store, always_fails(calls), handle_signals=False, failure_delay_ms=1_500,
                    failure_delay_max_ms=1_500)  # fmt: skip
    stats = runner.run(stop_when_idle=True)
    deleter.join()
    assert deleted.is_set() and sync_store.load("t") is None
    assert len(calls) == 1 and stats.failed == 1


def test_a_release_that_raises_does_not_kill_the_worker(
    sync_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Whatever the release raises, the worker logs it and goes on with the next task.
    for tid in ("a", "b"):
        sync_store.create(Checkpoint(tid))

    def broken_release(self: Any, **kw: Any) -> bool:
        raise UnicodeEncodeError("utf-8", "x", 0, 1, "a bug")

    monkeypatch.setattr(Lease, "release", broken_release)
    runner = Runner(sync_store, always_fails([]), lease_ms=1_000, handle_signals=False)
    stats = runner.run(stop_when_idle=True)
    assert (stats.claimed, stats.failed) == (2, 2)
    assert sum("releasing the failed cycle failed" in r.getMessage() for r in caplog.records) == 2


class _Thawed(Clock):
    """The clock of a worker frozen for a minute: what it reads once it runs again."""

    def now(self) -> float:
        return time.monotonic() + 60


def test_a_worker_frozen_right_after_its_claim_starts_no_handler(
    make: Callable[..., Any], flavor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGSTOP can land between a claim and the handler's start, and outlast the lease: another
    worker may run that cycle meanwhile. Thawed, the worker reads its lease as lost and does not
    run the handler (the cycle's effects, a model call or a tool, would happen twice)."""
    store = make(CheckpointStore, AsyncCheckpointStore)
    store.create(Checkpoint("t"))
    ran: list[int] = []
    claimed = _RunnerBase._claimed
    frozen: list[Any] = []

    def claimed_then_frozen(self: Any, lease: Any) -> Any:
        if not frozen:
            frozen.append(lease)
            lease._clock = _Thawed()
        return claimed(self, lease)

    monkeypatch.setattr(_RunnerBase, "_claimed", claimed_then_frozen)
    if flavor == "sync":

        def handler(cp: Checkpoint) -> StepResult:
            ran.append(cp.claimed_cycle)
            return step(cp)

        run = Runner(store, handler, lease_ms=500, handle_signals=False, idle_min_ms=5).run
    else:

        async def ahandler(cp: Checkpoint) -> StepResult:
            ran.append(cp.claimed_cycle)
            return step(cp)

        runner = AsyncRunner(store.wrapped, ahandler, lease_ms=500, handle_signals=False, idle_min_ms=5)

        def run(**kw: Any) -> Any:
            return store._loop.run_until_complete(runner.run(**kw))

    run(stop_when_idle=True)
    while not store.load("t").is_terminal:  # the frozen claim's lease lapses, then the cycle is taken again
        time.sleep(0.1)
        run(stop_when_idle=True)
    assert len(frozen) == 1 and frozen[0].lost
    assert ran == [1, 2, 3]  # cycle 1 ran once: not by the thawed worker
    assert_all_done([store.load("t")])


def test_a_durable_step_is_not_started_by_a_worker_frozen_after_its_lookup(
    make: Callable[..., Any], flavor: str
) -> None:
    """A step's lookup finds the lease current in Redis and no stored result; the worker freezes
    as the reply comes back. Thawed, it must not run the step's function: ``LeaseLost``."""
    store = make(CheckpointStore, AsyncCheckpointStore)
    store.create(Checkpoint("t"))
    called: list[str] = []
    inner = store.wrapped if flavor == "async" else store
    load = inner._step_load
    leases: list[Any] = []

    if flavor == "sync":

        def load_then_freeze(*args: Any, **kwargs: Any) -> Any:
            found = load(*args, **kwargs)
            leases[0]._clock = _Thawed()
            return found

        inner._step_load = load_then_freeze
        lease = Lease.next(store, lease_ms=5_000)
        assert lease is not None
        leases.append(lease)
        with pytest.raises(LeaseLost), lease:
            lease.step("call", called.append, "x")
    else:

        async def aload_then_freeze(*args: Any, **kwargs: Any) -> Any:
            found = await load(*args, **kwargs)
            leases[0]._clock = _Thawed()
            return found

        inner._step_load = aload_then_freeze

        async def go() -> None:
            # Not cancelled by its keeper on the loss: the step's own check is what is tested.
            alease = await AsyncLease.next(inner, lease_ms=5_000, cancel_on_loss=False)
            assert alease is not None
            leases.append(alease)
            with pytest.raises(LeaseLost):
                async with alease:
                    await alease.step("call", called.append, "x")

        store._loop.run_until_complete(go())
    assert called == []
