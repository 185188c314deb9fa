"""Metrics and traces (``redis_agentstate.telemetry``, the ``[otel]`` extra), read back through the
OpenTelemetry SDK's in-memory metric reader and span exporter, on every backend and both flavors.

No test sets OpenTelemetry's set-once global providers: each gets its own MeterProvider and
TracerProvider, passed to ``instrument()``, and ``uninstrument()`` runs at teardown.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from test_claim_next_blocking import close_waker
from test_parking import lapse

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from redis_agentstate import (
    AgentStatus,
    AlreadyClaimed,
    AsyncCheckpointStore,
    AsyncKeyValueStore,
    AsyncPoolStore,
    Checkpoint,
    CheckpointStore,
    KeyValueStore,
    LeaseLost,
    NotParked,
    PoolConfig,
    PoolStore,
    TaskParked,
    telemetry,
)
from redis_agentstate import wire as _ops
from redis_agentstate.runner import AsyncRunner, Runner, StepResult

SHORT_MS = 150  # a lease short enough to lapse in a test (test_parking's)
LONG_MS = 30_000


@dataclass
class Recorded:
    """What one test's providers recorded."""

    reader: InMemoryMetricReader
    exporter: InMemorySpanExporter
    telemetry: telemetry.Telemetry

    def metrics(self) -> dict[str, dict[frozenset[tuple[str, Any]], Any]]:
        """``{instrument name: {attribute set: data point}}`` (collects, so gauges observe now)."""
        out: dict[str, dict[frozenset[tuple[str, Any]], Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                assert sm.scope.name == telemetry.SCOPE
                for metric in sm.metrics:
                    points = out.setdefault(metric.name, {})
                    for point in metric.data.data_points:
                        points[frozenset(point.attributes.items())] = point
        return out

    def counters(self) -> dict[tuple[str, str, str], int]:
        """``{(counter, namespace, operation): value}`` of every counter that counted."""
        names = {name: key for key, (name, _, _) in telemetry.COUNTERS.items()}
        found: dict[tuple[str, str, str], int] = {}
        for name, points in self.metrics().items():
            if name not in names:
                continue
            for attrs, point in points.items():
                a = dict(attrs)
                if point.value:
                    found[(names[name], a["agentstate.namespace"], a["db.operation.name"])] = point.value
        return found

    def durations(self) -> dict[tuple[str, str | None], int]:
        """``{(operation, error type): count}`` of the duration histogram."""
        points = self.metrics().get(telemetry.DURATION[0], {})
        return {
            (dict(attrs)["db.operation.name"], dict(attrs).get("error.type")): point.count
            for attrs, point in points.items()
        }

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def otel() -> Iterator[Recorded]:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    installed = telemetry.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider)
    try:
        yield Recorded(reader, exporter, installed)
    finally:
        telemetry.uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()
    # Nothing set OpenTelemetry's set-once global providers: they are still the API's proxies.
    assert isinstance(otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider)
    assert type(otel_metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"


def running(task_id: str) -> Checkpoint:
    return Checkpoint(task_id=task_id, status=AgentStatus.RUNNING)


def base_attrs(op: str, namespace: str, store: str = "checkpoint") -> dict[str, Any]:
    return {
        "db.system": "redis",
        "db.system.name": "redis",
        "db.operation.name": op,
        "agentstate.store": store,
        "agentstate.namespace": namespace,
    }


def wait_lapsed(ms: int = 30) -> None:
    """Let a lease of 1 ms lapse on the server clock (sleeping well past it; no timing is asserted)."""
    time.sleep(ms / 1000)


class TestStoreOperations:
    def test_claim_commit_cycle_is_counted_timed_and_traced(self, store: Any, otel: Recorded, namespace: str) -> None:
        assert store.create(running("t1"))
        cp = store.claim("t1", 1, token="w1", lease_ms=30_000)
        cp.cycle_index = 1
        assert store.commit(cp, token="w1", expected_revision=cp.revision)

        assert otel.counters() == {
            ("claims", namespace, "claim"): 1,
            ("commits", namespace, "commit"): 1,
        }
        assert otel.durations() == {("create", None): 1, ("claim", None): 1, ("commit", None): 1}
        hist = otel.metrics()[telemetry.DURATION[0]]
        for attrs, point in hist.items():
            assert dict(attrs)["agentstate.namespace"] == namespace
            assert dict(attrs)["agentstate.store"] == "checkpoint"
            assert dict(attrs)["db.system.name"] == "redis"
            assert point.sum > 0
            assert list(point.explicit_bounds)[:3] == [0.0001, 0.00025, 0.0005]

        spans = otel.spans()
        assert [s.name for s in spans] == [f"create {namespace}", f"claim {namespace}", f"commit {namespace}"]
        for span, op in zip(spans, ("create", "claim", "commit"), strict=True):
            assert span.kind == SpanKind.CLIENT
            assert span.status.status_code == StatusCode.UNSET
            assert span.instrumentation_scope is not None
            assert span.instrumentation_scope.name == telemetry.SCOPE
            assert dict(span.attributes or {}) == {
                **base_attrs(op, namespace),
                "agentstate.task_id": "t1",
                "agentstate.round_trips": 1,
            }

    def test_fenced_writes_are_counted(self, store: Any, otel: Recorded, namespace: str) -> None:
        store.create(running("t1"))
        cp = store.claim("t1", 1, token="w1", lease_ms=30_000)
        cp.cycle_index = 1
        assert not store.commit(cp, token="w1", expected_revision=cp.revision + 1)  # a stale revision
        assert not store.commit(cp, token="intruder", expected_revision=cp.revision)
        assert not store.acknowledge_terminal("t1", expected_revision=cp.revision)  # not terminal
        assert otel.counters() == {
            ("claims", namespace, "claim"): 1,
            ("fenced_writes", namespace, "commit"): 2,
            ("fenced_writes", namespace, "acknowledge_terminal"): 1,
        }

    def test_a_takeover_is_a_claim_after_another_tokens_lease_lapsed(
        self, store: Any, otel: Recorded, namespace: str
    ) -> None:
        store.create(running("t1"))
        store.create(running("t2"))
        store.claim("t1", 1, token="dead-worker", lease_ms=1)
        wait_lapsed()
        taken = store.claim("t1", 1, token="w2", lease_ms=30_000)
        assert taken.claim_token == "w2"
        # The same token claiming again after its own lease lapsed is no takeover.
        store.claim("t2", 1, token="slow", lease_ms=1)
        wait_lapsed()
        assert store.claim("t2", 1, token="slow", lease_ms=30_000).claim_token == "slow"
        assert otel.counters() == {
            ("claims", namespace, "claim"): 4,
            ("takeovers", namespace, "claim"): 1,
        }

    def test_claim_next_takeover_and_its_span_names_the_task_it_got(
        self, store: Any, otel: Recorded, namespace: str
    ) -> None:
        store.create(running("t1"))
        first = store.claim_next(token="dead-worker", lease_ms=1)
        assert first.task_id == "t1"
        wait_lapsed()
        again = store.claim_next(token="w2", lease_ms=30_000)
        assert again is not None and again.task_id == "t1"
        assert store.claim_next(token="w3", lease_ms=30_000) is None
        assert otel.counters() == {
            ("claims", namespace, "claim_next"): 2,
            ("takeovers", namespace, "claim_next"): 1,
        }
        spans = [s for s in otel.spans() if s.name == f"claim_next {namespace}"]
        assert [dict(s.attributes or {}).get("agentstate.task_id") for s in spans] == ["t1", "t1", None]
        # A peek at every shard, then the claim script: two round trips; the empty one only peeks.
        assert [dict(s.attributes or {})["agentstate.round_trips"] for s in spans] == [2, 2, 1]

    def test_commit_and_claim_counts_a_commit_and_a_claim(self, store: Any, otel: Recorded, namespace: str) -> None:
        store.create(running("t1"))
        cp = store.claim("t1", 1, token="w1", lease_ms=30_000)
        cp.cycle_index = 1
        nxt = store.commit_and_claim(cp, token="w1", expected_revision=cp.revision, lease_ms=30_000)
        assert nxt is not None and nxt.claimed_cycle == 2
        assert store.commit_and_claim(cp, token="w1", expected_revision=cp.revision - 1, lease_ms=30_000) is None
        assert otel.counters() == {
            ("claims", namespace, "claim"): 1,
            ("claims", namespace, "commit_and_claim"): 1,
            ("commits", namespace, "commit_and_claim"): 1,
            ("fenced_writes", namespace, "commit_and_claim"): 1,
        }

    def test_errors_are_recorded_on_the_span_and_the_histogram(
        self, store: Any, otel: Recorded, namespace: str
    ) -> None:
        store.create(running("t1"))
        store.claim("t1", 1, token="w1", lease_ms=30_000)
        with pytest.raises(AlreadyClaimed):
            store.claim("t1", 1, token="w2", lease_ms=30_000)
        failed = otel.spans()[-1]
        assert failed.name == f"claim {namespace}"
        assert failed.status.status_code == StatusCode.ERROR
        assert dict(failed.attributes or {}) == {
            **base_attrs("claim", namespace),
            "agentstate.task_id": "t1",
            "agentstate.round_trips": 1,
            "error.type": "AlreadyClaimed",
        }
        assert [e.name for e in failed.events] == ["exception"]
        assert dict(failed.events[0].attributes or {})["exception.type"].endswith("AlreadyClaimed")
        assert otel.durations() == {("create", None): 1, ("claim", None): 1, ("claim", "AlreadyClaimed"): 1}
        assert otel.counters() == {("claims", namespace, "claim"): 1}

    def test_invalid_input_is_an_error_span_with_no_round_trip(self, store: Any, otel: Recorded) -> None:
        with pytest.raises(ValueError):
            store.claim("", 1, token="w1", lease_ms=30_000)
        (span,) = otel.spans()
        assert dict(span.attributes or {})["error.type"] == "InvalidArgument"
        assert dict(span.attributes or {})["agentstate.round_trips"] == 0

    def test_pool_and_kv_operations_are_traced(self, make: Any, otel: Recorded, namespace: str) -> None:
        pools = make(PoolStore, AsyncPoolStore)
        kv = make(KeyValueStore, AsyncKeyValueStore)
        pools.open("p1", PoolConfig())
        kv.set("secret-key", b"v")
        assert kv.get("secret-key") == b"v"
        opened, kv_set, kv_get = otel.spans()
        assert opened.name == f"open {namespace}"
        assert dict(opened.attributes or {}) == {
            **base_attrs("open", namespace, "pool"),
            "agentstate.pool_id": "p1",
            "agentstate.round_trips": 1,
        }
        # Key/value keys may be user data: never recorded.
        for span, op in ((kv_set, "set"), (kv_get, "get")):
            assert dict(span.attributes or {}) == {**base_attrs(op, namespace, "kv"), "agentstate.round_trips": 1}
        assert otel.counters() == {}

    def test_unknown_event(self, otel: Recorded, namespace: str) -> None:
        with pytest.raises(ValueError, match="unknown telemetry event"):
            otel.telemetry.count("nonsense", namespace, "x")

    def test_off_again_records_nothing(self, store: Any, otel: Recorded, namespace: str) -> None:
        store.create(running("t1"))
        before = (otel.counters(), otel.durations(), len(otel.spans()))
        telemetry.uninstrument()
        assert telemetry.active() is None and _ops.TELEMETRY is None
        cp = store.claim("t1", 1, token="w1", lease_ms=30_000)
        cp.cycle_index = 1
        store.commit(cp, token="w1", expected_revision=cp.revision)
        assert (otel.counters(), otel.durations(), len(otel.spans())) == before


class TestTakeovers:
    """A takeover is a claim that finds the claim before it lapsed (parking's ``lapsed_reason``):
    a cycle released, with a failure reason or without, then claimed by another is none."""

    def test_release_then_claim_is_no_takeover_and_a_lapse_is(self, store: Any, otel: Recorded, namespace: str) -> None:
        for tid in ("failed", "handed-back", "lapsed"):
            store.create(running(tid))
        cp = store.claim("failed", 1, token="w1", lease_ms=LONG_MS)
        assert store.release("failed", token="w1", expected_revision=cp.revision, after_ms=1, reason="boom")
        cp = store.claim("handed-back", 1, token="w1", lease_ms=LONG_MS)
        assert store.release("handed-back", token="w1", expected_revision=cp.revision, after_ms=1)
        store.claim("lapsed", 1, token="w1", lease_ms=SHORT_MS)
        for tid in ("failed", "handed-back", "lapsed"):
            lapse(store, tid)
        for tid in ("failed", "handed-back"):
            assert store.claim(tid, 1, token="w2", lease_ms=LONG_MS).claim_token == "w2"
        assert otel.counters() == {("claims", namespace, "claim"): 5}  # no takeover
        assert store.claim("lapsed", 1, token="w2", lease_ms=LONG_MS).claim_token == "w2"
        assert otel.counters() == {("claims", namespace, "claim"): 6, ("takeovers", namespace, "claim"): 1}

    def test_claim_next_after_a_release_is_no_takeover(self, store: Any, otel: Recorded, namespace: str) -> None:
        store.create(running("t1"))
        cp = store.claim_next(token="w1", lease_ms=LONG_MS)
        assert store.release("t1", token="w1", expected_revision=cp.revision, after_ms=1, reason="boom")
        lapse(store, "t1")
        again = store.claim_next(token="w2", lease_ms=LONG_MS)
        assert again is not None and again.claim_token == "w2"
        assert otel.counters() == {("claims", namespace, "claim_next"): 2}


class TestParking:
    """The parked and requeued counters come from the scripts' replies; release, requeue and
    list_parked are operations like the others (a span each, the task id on it)."""

    def test_parked_by_release_then_requeued(self, make: Any, otel: Recorded, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(running("t1"))
        cp = store.claim("t1", 1, token="w1", lease_ms=LONG_MS)
        assert store.release("t1", token="w1", expected_revision=cp.revision, reason="ValueError: bad input")
        assert store.list_parked() == ["t1"]
        with pytest.raises(TaskParked):  # found parked: no parking of its own, not counted again
            store.claim("t1", 1, token="w2", lease_ms=LONG_MS)
        store.requeue("t1")
        with pytest.raises(NotParked):
            store.requeue("t1")
        assert otel.counters() == {
            ("claims", namespace, "claim"): 1,
            ("parked", namespace, "release"): 1,
            ("requeued", namespace, "requeue"): 1,
        }
        spans: dict[str, ReadableSpan] = {}
        for span in otel.spans():
            spans.setdefault(span.name, span)  # the first of each (the second requeue failed)
        for op in ("release", "requeue"):
            attrs = dict(spans[f"{op} {namespace}"].attributes or {})
            assert attrs == {**base_attrs(op, namespace), "agentstate.task_id": "t1", "agentstate.round_trips": 1}
        listed = dict(spans[f"list_parked {namespace}"].attributes or {})
        assert listed["db.system"] == "redis" and listed["agentstate.namespace"] == namespace
        assert "agentstate.task_id" not in listed
        assert otel.durations()[("requeue", "NotParked")] == 1

    def test_parked_by_claim_after_a_lapse(self, make: Any, otel: Recorded, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(running("t1"))
        store.claim("t1", 1, token="dead-worker", lease_ms=SHORT_MS)
        lapse(store, "t1")
        with pytest.raises(TaskParked):  # attempt 2 of 1: parked now, by this claim
            store.claim("t1", 1, token="w2", lease_ms=LONG_MS)
        with pytest.raises(TaskParked):  # parked before: not a parking
            store.claim("t1", 1, token="w3", lease_ms=LONG_MS)
        assert otel.counters() == {("claims", namespace, "claim"): 1, ("parked", namespace, "claim"): 1}

    def test_parked_by_claim_next_after_a_lapse(self, make: Any, otel: Recorded, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(running("poison"))
        store.claim("poison", 1, token="dead-worker", lease_ms=SHORT_MS)
        lapse(store, "poison")
        store.create(running("healthy"))
        got = store.claim_next(token="w2", lease_ms=LONG_MS)  # parks the poison task, goes on to the next
        assert got is not None and got.task_id == "healthy"
        assert store.list_parked() == ["poison"]
        assert otel.counters() == {
            ("claims", namespace, "claim"): 1,
            ("claims", namespace, "claim_next"): 1,
            ("parked", namespace, "claim_next"): 1,
        }


class TestBlockingClaimNext:
    @pytest.fixture(autouse=True)
    def _close_waker(self, store: Any, twin_loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        yield
        close_waker(store, twin_loop)

    def test_a_blocked_claim_next_is_one_operation(self, store: Any, otel: Recorded, namespace: str) -> None:
        # Not due when the call starts (a live lease): it probes, waits for the lease to lapse, probes again.
        # (A second is what a loaded machine may take between two calls: the first probe must find it live.)
        store.create(running("t1"))
        store.claim("t1", 1, token="dead-worker", lease_ms=1_000)
        got = store.claim_next(token="w2", lease_ms=LONG_MS, block_ms=10_000)
        assert got is not None and got.task_id == "t1"
        spans = [s for s in otel.spans() if dict(s.attributes or {})["db.operation.name"] != "claim"]
        assert [s.name for s in spans[1:]] == [f"claim_next {namespace}"]
        attrs = dict(spans[1].attributes or {})
        assert attrs["agentstate.task_id"] == "t1" and attrs["agentstate.blocking"] is True
        assert attrs["agentstate.round_trips"] >= 3  # a peek that found nothing due, then a peek and the claim
        assert otel.counters() == {
            ("claims", namespace, "claim"): 1,
            ("claims", namespace, "claim_next"): 1,
            ("takeovers", namespace, "claim_next"): 1,
        }
        assert otel.durations() == {("create", None): 1, ("claim", None): 1, ("claim_next", None): 1}

    def test_a_blocked_claim_next_that_times_out_is_one_operation(
        self, store: Any, otel: Recorded, namespace: str
    ) -> None:
        assert store.claim_next(token="w1", lease_ms=LONG_MS, block_ms=300) is None
        (span,) = otel.spans()
        assert span.name == f"claim_next {namespace}"
        assert "agentstate.task_id" not in dict(span.attributes or {})
        assert otel.durations() == {("claim_next", None): 1}


class TestLangGraph:
    def test_a_put_refused_by_a_thread_lease_is_a_fenced_write(
        self, backend: Any, flavor: str, namespace: str, twin_loop: asyncio.AbstractEventLoop, otel: Recorded
    ) -> None:
        pytest.importorskip("langgraph.checkpoint.base")
        from test_langgraph import _call, _Holder, _put, _second

        from redis_agentstate.langgraph import ThreadBusy

        holder = _second(backend, flavor, namespace, twin_loop)
        other = _second(backend, flavor, namespace, twin_loop)
        with _Holder(holder, twin_loop, "thread-1"):
            first = _put(holder, twin_loop, "thread-1")
            with pytest.raises(ThreadBusy):
                _put(other, twin_loop, "thread-1", first)
            with pytest.raises(ThreadBusy):
                _call(other, twin_loop, "put_writes", first, [("a", 1)], "task")
        assert otel.counters() == {
            ("fenced_writes", namespace, "put"): 1,
            ("fenced_writes", namespace, "put_writes"): 1,
        }
        puts = [s for s in otel.spans() if dict(s.attributes or {})["db.operation.name"] in ("put", "put_writes")]
        assert [(s.name, s.status.status_code) for s in puts] == [
            (f"put {namespace}", StatusCode.UNSET),
            (f"put {namespace}", StatusCode.ERROR),
            (f"put_writes {namespace}", StatusCode.ERROR),
        ]
        for span in puts:
            attrs = dict(span.attributes or {})
            assert (attrs["agentstate.store"], attrs["agentstate.thread_id"]) == ("langgraph", "thread-1")
        assert [dict(s.attributes or {}).get("error.type") for s in puts] == [None, "ThreadBusy", "ThreadBusy"]


class TestOptions:
    def test_metrics_only_and_traces_only(self, backend: Any, namespace: str) -> None:
        reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        meter_provider = MeterProvider(metric_readers=[reader])
        store = CheckpointStore(backend.sync_client(), namespace=namespace)
        try:
            telemetry.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider, traces=False)
            store.create(running("t1"))
            assert exporter.get_finished_spans() == ()
            assert reader.get_metrics_data() is not None
            telemetry.instrument(meter_provider=MeterProvider(), tracer_provider=tracer_provider, metrics=False)
            store.claim("t1", 1, token="w1", lease_ms=30_000)
            assert [s.name for s in exporter.get_finished_spans()] == [f"claim {namespace}"]
        finally:
            telemetry.uninstrument()
            meter_provider.shutdown()
            tracer_provider.shutdown()


def _lease_lost_by_fence(flavor: str, store: Any, twin_loop: asyncio.AbstractEventLoop) -> None:
    """Claim under a Lease, let an operator overwrite the task, then commit: the fence refuses it."""
    store.create(running("t1"))

    def overwrite(cp: Checkpoint) -> None:
        store.save(Checkpoint(task_id="t1", status=AgentStatus.RUNNING, revision=cp.revision + 10))

    if flavor == "sync":
        with store.lease("t1", 1, lease_ms=30_000) as lease:
            overwrite(lease.checkpoint)
            cp = lease.checkpoint
            cp.cycle_index = 1
            with pytest.raises(LeaseLost):
                lease.commit(cp)
        return

    async def main() -> None:
        # On asyncio the loss also cancels the work: LeaseLost comes out of the ``async with``.
        with pytest.raises(LeaseLost):
            async with store.wrapped.lease("t1", 1, lease_ms=30_000) as lease:
                await store.wrapped.save(
                    Checkpoint(task_id="t1", status=AgentStatus.RUNNING, revision=lease.checkpoint.revision + 10)
                )
                cp = lease.checkpoint
                cp.cycle_index = 1
                await lease.commit(cp)

    twin_loop.run_until_complete(main())


class TestLeases:
    def test_a_lease_lost_to_the_fence_is_counted(
        self, store: Any, flavor: str, otel: Recorded, namespace: str, twin_loop: asyncio.AbstractEventLoop
    ) -> None:
        _lease_lost_by_fence(flavor, store, twin_loop)
        counters = otel.counters()
        assert counters[("leases_lost", namespace, "lease")] == 1
        assert counters[("fenced_writes", namespace, "commit")] == 1
        lost = otel.metrics()[telemetry.COUNTERS["leases_lost"][0]]
        assert [dict(a)["agentstate.fenced"] for a in lost] == [True]

    def test_runner_lease_gauges(
        self, store: Any, flavor: str, otel: Recorded, namespace: str, twin_loop: asyncio.AbstractEventLoop
    ) -> None:
        store.create(running("t1"))
        seen: dict[str, Any] = {}

        def gauges(worker_id: str) -> tuple[float | None, int | None]:
            metrics = otel.metrics()
            key = frozenset({("agentstate.namespace", namespace), ("agentstate.worker_id", worker_id)})
            age = metrics.get(telemetry.LEASE_AGE[0], {}).get(key)
            held = metrics.get(telemetry.LEASES_HELD[0], {}).get(key)
            return (age.value if age else None), (held.value if held else None)

        def finish(cp: Checkpoint) -> StepResult:
            cp.terminal_result = {"ok": True}
            return StepResult(cp, done=True)

        if flavor == "sync":
            release = threading.Event()

            def handler(cp: Checkpoint) -> StepResult:
                seen["during"] = gauges(runner.worker_id)
                time.sleep(0.02)
                seen["later"] = gauges(runner.worker_id)
                release.wait(10)
                return finish(cp)

            runner = Runner(store, handler, handle_signals=False, worker_id="w-sync")
            thread = threading.Thread(target=runner.run, kwargs={"stop_when_idle": True})
            thread.start()
            deadline = time.monotonic() + 30
            while "later" not in seen and time.monotonic() < deadline:
                time.sleep(0.01)
            release.set()
            thread.join(30)
            assert not thread.is_alive()
        else:

            async def ahandler(cp: Checkpoint) -> StepResult:
                seen["during"] = gauges(arunner.worker_id)
                await asyncio.sleep(0.02)
                seen["later"] = gauges(arunner.worker_id)
                return finish(cp)

            arunner = AsyncRunner(store.wrapped, ahandler, handle_signals=False, worker_id="w-async")
            twin_loop.run_until_complete(arunner.run(stop_when_idle=True))
            runner = arunner  # type: ignore[assignment]

        (age1, held1), (age2, held2) = seen["during"], seen["later"]
        assert held1 == held2 == 1
        assert age1 is not None and age2 is not None
        assert 0 <= age1 < age2  # the same lease, older at the second look
        # Done: the runner holds nothing, and the age has no point.
        assert gauges(runner.worker_id) == (None, 0)


class TestDisabled:
    """Off (the default) or without the extra: nothing recorded, OpenTelemetry never imported by us."""

    SCRIPT = textwrap.dedent(
        """
        import sys

        def otel_modules():
            return {m for m, mod in sys.modules.items() if m.split(".")[0] == "opentelemetry" and mod is not None}

        import fakeredis, redis, redis.asyncio
        # redis-py 8 imports opentelemetry itself when it is installed (redis.observability):
        # what we check is that redis_agentstate imports nothing more.
        before = otel_modules()
        from redis_agentstate import AgentStatus, Checkpoint, CheckpointStore, telemetry

        store = CheckpointStore(fakeredis.FakeRedis(), namespace="n")
        store.create(Checkpoint(task_id="t", status=AgentStatus.RUNNING))
        cp = store.claim("t", 1, token="a", lease_ms=30_000)
        cp.cycle_index = 1
        assert store.commit(cp, token="a", expected_revision=cp.revision)
        with store.lease("t", 2) as lease:
            cp = lease.checkpoint
            cp.cycle_index = 2
            lease.commit(cp)
        parking = CheckpointStore(fakeredis.FakeRedis(), namespace="p", max_attempts=1)
        parking.create(Checkpoint(task_id="t", status=AgentStatus.RUNNING))
        cp = parking.claim("t", 1, token="a", lease_ms=30_000)
        parking.release("t", token="a", expected_revision=cp.revision, reason="boom")
        assert parking.list_parked() == ["t"]
        parking.requeue("t")
        assert telemetry.active() is None
        print("imported by redis_agentstate:", sorted(otel_modules() - before))
        """
    )

    def run(self, prelude: str = "", after: str = "") -> subprocess.CompletedProcess[str]:
        code = "\n".join((prelude, self.SCRIPT, textwrap.dedent(after)))
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    def test_off_by_default_and_opentelemetry_not_imported(self) -> None:
        done = self.run()
        assert done.returncode == 0, done.stderr
        assert "imported by redis_agentstate: []" in done.stdout

    def test_without_the_extra_stores_work_and_instrument_says_what_to_install(self) -> None:
        # sys.modules[name] = None makes `import name` fail, as if the extra were not installed.
        prelude = "import sys; sys.modules['opentelemetry'] = None"
        after = """
            try:
                telemetry.instrument()
            except ImportError as exc:
                print("instrument:", exc)
            """
        done = self.run(prelude, after)
        assert done.returncode == 0, done.stderr
        assert "imported by redis_agentstate: []" in done.stdout
        assert "instrument: redis_agentstate.telemetry needs OpenTelemetry: pip install 'redis-agentstate[otel]'" in (
            done.stdout
        )
