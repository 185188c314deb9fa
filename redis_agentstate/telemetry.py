"""Metrics and traces through OpenTelemetry (the ``[otel]`` extra: ``pip install 'redis-agentstate[otel]'``).

::

    from redis_agentstate import telemetry

    telemetry.instrument()        # the global MeterProvider and TracerProvider (or pass your own)
    ...
    telemetry.uninstrument()

Off until :func:`instrument` is called: the library never imports OpenTelemetry
by itself, and a store operation then pays one global read and compare
(``wire.shells.TELEMETRY is None``; benchmarks/README.md measures it). Once on, every
store operation (checkpoint, pool, key/value, LangGraph saver) goes through one
wrapper (``StoreShell._run``), which:

* opens a ``CLIENT`` span named ``"<operation> <namespace>"`` (one per public call: a
  ``claim_next(block_ms=...)`` that probes again at each wake-up is one operation,
  its histogram sample marked ``agentstate.blocking``) with
  ``db.system`` / ``db.system.name`` = ``redis``, ``db.operation.name``,
  ``agentstate.store`` (``checkpoint``, ``pool``, ``kv``, ``langgraph``),
  ``agentstate.namespace`` and, when the operation concerns one task, pool or
  LangGraph thread, ``agentstate.task_id`` / ``agentstate.pool_id`` /
  ``agentstate.thread_id`` (key/value keys are never recorded: they may be user
  data); ``agentstate.round_trips`` counts its requests. An exception is recorded
  on the span, which gets status ERROR and ``error.type``;
* records its duration in the histogram ``agentstate.operation.duration``
  (seconds; attributes: the operation, store, namespace, and ``error.type`` on
  failure);
* counts what the scripts' replies say happened (see ``REPLY_EVENTS``).

The counters (``agentstate.<name>``, attributes ``agentstate.namespace`` and
``db.operation.name``; Prometheus shows them as ``agentstate_<name>_total``):

* ``claims``: cycles claimed (claim, claim_next, commit_and_claim), re-sends included;
* ``commits``: fenced writes of a cycle that applied (commit, ``Lease.commit``/``finalize``,
  commit_and_claim, finalize);
* ``fenced_writes``: writes the fence refused (commit, finalize, commit_and_claim,
  acknowledge_terminal, LangGraph puts refused by a thread lease);
* ``takeovers``: claims that took a cycle from another token whose lease had lapsed
  without a commit (a worker that died, stalled or was cut off); a cycle released
  (with or without a failure reason) and then claimed by another is no takeover;
* ``leases_lost``: leases a ``Lease`` or ``Runner`` lost (``agentstate.fenced``: the fence said so);
* ``parked``: tasks parked after too many attempts (by ``claim``, ``claim_next`` or
  ``release``: the script that parked it says so in its reply);
* ``requeued``: parked tasks made runnable again by ``requeue``;
* ``cancels``: tasks ended by ``cancel`` (a re-send whose first reply was lost included);
* ``resumes``: waiting tasks resumed by ``resume`` (the same).

The Runner's gauges, observed at each collection over every live
:class:`~redis_agentstate.runner.Runner` / ``AsyncRunner`` (attributes
``agentstate.namespace`` and ``agentstate.worker_id``):
``agentstate.lease.age`` (seconds since its oldest live lease was claimed; no
point while it holds none) and ``agentstate.leases.held``.

Providers are taken when :func:`instrument` is called; pass
``meter_provider``/``tracer_provider`` to avoid OpenTelemetry's set-once global
providers (tests do). ``metrics=False`` or ``traces=False`` leaves one out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, TypeVar

from .keys import describe_key
from .wire import Batch, Call, Op, Request, request_keys, scripts, shells
from .wire.scripts import Reply

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from .wire import AsyncShell, StoreShell, SyncShell, Watch

__all__ = [
    "COUNTERS",
    "DURATION",
    "LEASE_AGE",
    "LEASES_HELD",
    "REPLY_EVENTS",
    "SCOPE",
    "Telemetry",
    "active",
    "instrument",
    "uninstrument",
]

T = TypeVar("T")

#: The instrumentation scope (meter and tracer name).
SCOPE = "redis_agentstate"

#: Counter key -> (instrument name, unit, description).
COUNTERS: dict[str, tuple[str, str, str]] = {
    "claims": ("agentstate.claims", "{claim}", "Cycles claimed (claim, claim_next, commit_and_claim)"),
    "commits": ("agentstate.commits", "{commit}", "Fenced writes of a cycle that applied"),
    "fenced_writes": ("agentstate.fenced_writes", "{write}", "Writes refused by the fence (nothing written)"),
    "takeovers": ("agentstate.takeovers", "{claim}", "Claims of a cycle whose holder's lease had lapsed"),
    "leases_lost": ("agentstate.leases_lost", "{lease}", "Leases lost by a Lease or Runner"),
    "parked": ("agentstate.parked", "{task}", "Tasks parked after too many attempts"),
    "requeued": ("agentstate.requeued", "{task}", "Parked tasks made runnable again"),
    "cancels": ("agentstate.cancels", "{task}", "Tasks ended by cancel"),
    "resumes": ("agentstate.resumes", "{task}", "Waiting tasks resumed"),
}
#: The histogram of every store operation's duration.
DURATION = ("agentstate.operation.duration", "s", "Duration of agentstate store operations (all round trips)")
#: The Runner gauges.
LEASE_AGE = ("agentstate.lease.age", "s", "Seconds since the runner's oldest live lease was claimed")
LEASES_HELD = ("agentstate.leases.held", "{lease}", "Leases the runner holds now")

#: Seconds; the semantic conventions' advice for database client durations, with 0.1-5 ms added:
#: most operations here take well under a millisecond on a local network.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Core generators whose name is not the shell method's.
_OP_NAMES = {"keys_list": "keys", "next_page": "list"}
_OWNER_ATTRS = {"task": "agentstate.task_id", "pool": "agentstate.pool_id", "thread": "agentstate.thread_id"}

_APPLIED = (Reply.DONE, Reply.TAKEN_OVER, Reply.DONE_BEFORE)


def _code(reply: Any) -> Any:
    return reply[0] if isinstance(reply, (list, tuple)) and reply else reply


def _claim_events(reply: Any) -> Sequence[str]:
    code = _code(reply)
    if code == Reply.TAKEN_OVER:
        return ("claims", "takeovers")
    if code == Reply.PARKED:
        # claim.lua marks a parking of its own with a 4th entry (a task parked before answers 3).
        return ("parked",) if len(reply) > 3 else ()
    return ("claims",) if code in _APPLIED else ()


def _claim_next_events(reply: Any) -> Sequence[str]:
    # claim_next.lua answers PARKED only when it parked the candidate now (a lost race otherwise).
    return ("parked",) if _code(reply) == Reply.PARKED else _claim_events(reply)


def _release_events(reply: Any) -> Sequence[str]:
    # PARKED: parked now, or a re-send's answer (its first reply, the one that parked it, was lost).
    return ("parked",) if _code(reply) == Reply.PARKED else ()


def _requeue_events(reply: Any) -> Sequence[str]:
    # DONE_BEFORE: a re-send whose first reply was lost; that requeue applied.
    return ("requeued",) if _code(reply) in (Reply.DONE, Reply.DONE_BEFORE) else ()


def _cancel_events(reply: Any) -> Sequence[str]:
    # DONE_BEFORE: a re-send whose first reply was lost; that cancel applied.
    return ("cancels",) if _code(reply) in (Reply.DONE, Reply.DONE_BEFORE) else ()


def _resume_events(reply: Any) -> Sequence[str]:
    return ("resumes",) if _code(reply) in (Reply.DONE, Reply.DONE_BEFORE) else ()


def _commit_events(reply: Any) -> Sequence[str]:
    code = _code(reply)
    if code in _APPLIED:
        return ("commits",)
    return ("fenced_writes",) if code == Reply.REFUSED else ()


def _commit_and_claim_events(reply: Any) -> Sequence[str]:
    code = _code(reply)
    if code in _APPLIED:
        return ("commits", "claims")
    if code == Reply.REFUSED:
        return ("fenced_writes",)
    # TERMINAL/HELD/...: a re-send whose commit had applied, the claim taken since.
    if code == Reply.PARKED:
        return ("commits", "parked") if len(reply) > 3 else ("commits",)
    return ("commits",) if code in (Reply.TERMINAL, Reply.NOT_RUNNING, Reply.CYCLE_CONFLICT, Reply.HELD) else ()


def _acknowledge_events(reply: Any) -> Sequence[str]:
    return ("fenced_writes",) if _code(reply) == Reply.REFUSED else ()


#: Script name -> what its reply says happened (counter keys).
REPLY_EVENTS: dict[str, Callable[[Any], Sequence[str]]] = {
    scripts.CLAIM: _claim_events,
    scripts.CLAIM_NEXT: _claim_next_events,
    scripts.RELEASE: _release_events,
    scripts.REQUEUE: _requeue_events,
    scripts.CANCEL: _cancel_events,
    scripts.RESUME: _resume_events,
    scripts.COMMIT: _commit_events,
    scripts.FINALIZE: _commit_events,
    scripts.COMMIT_AND_CLAIM: _commit_and_claim_events,
    scripts.ACKNOWLEDGE_TERMINAL: _acknowledge_events,
}


class _Operation:
    """One store operation under way: its names, what its requests touched, what their replies said."""

    __slots__ = ("attrs", "name", "namespace", "owners", "result", "round_trips", "telemetry")

    def __init__(self, telemetry: Telemetry, shell: Any, op: Op[Any] | None, name: str | None = None) -> None:
        if name is None:
            code = getattr(op, "gi_code", None)
            raw = code.co_name if code is not None else "operation"
            name = _OP_NAMES.get(raw, raw)
        self.name = name
        #: The last result of an operation made of several ops (``Telemetry.operation``).
        self.result: Any = None
        self.namespace: str = shell.namespace
        self.telemetry = telemetry
        self.attrs: dict[str, Any] = {
            "db.system.name": "redis",
            "db.operation.name": self.name,
            "agentstate.store": shell.telemetry_store,
            "agentstate.namespace": self.namespace,
        }
        self.owners: set[tuple[str, str]] = set()
        self.round_trips = 0

    def watch_all(self, op: Op[T]) -> Op[T]:
        """``watch``, keeping the op's result as the operation's (the last one wins)."""
        result = yield from self.watch(op)
        # A blocked claim_next's probes answer ClaimNextFound: the span names the task it claimed.
        self.result = getattr(result, "checkpoint", result)
        return result

    def watch(self, op: Op[T]) -> Op[T]:
        """``op``, passing every request and reply by :meth:`seen` (throws and closes forwarded)."""
        try:
            req = next(op)
            while True:
                try:
                    reply = yield req
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    self.round_trips += 1
                    req = op.throw(exc)
                    continue
                self.seen(req, reply)
                req = op.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()

    def seen(self, req: Request, reply: Any) -> None:
        self.round_trips += 1
        calls: Iterable[tuple[Call, Any]] = ()
        if isinstance(req, Call):
            calls = ((req, reply),)
            self._owner(req.keys[0] if req.keys else None)
        elif isinstance(req, Batch):
            calls = zip(req.calls, reply if isinstance(reply, list) else (), strict=False)
            for call in req.calls:
                self._owner(call.keys[0] if call.keys else None)
        else:
            keys = request_keys(req)
            self._owner(keys[0] if len(keys) == 1 else None)
        for call, answer in calls:
            events = REPLY_EVENTS.get(call.script) or scripts.REPLY_EVENTS.get(call.script)
            if events is not None:
                for event in events(answer):
                    self.telemetry.count(event, self.namespace, self.name)

    def _owner(self, key: Any) -> None:
        if key is None:
            return
        _, kind, ident = describe_key(key.decode() if isinstance(key, bytes) else str(key))
        if kind in _OWNER_ATTRS and ident is not None:
            self.owners.add((_OWNER_ATTRS[kind], ident))

    def finish(self, span: Span | None, result: Any) -> None:
        if span is None:
            return
        task_id = getattr(result, "task_id", None)
        if isinstance(task_id, str) and getattr(result, "claim_token", None) is not None:
            # A claim: the task it got, whatever else it tried on the way (claim_next).
            span.set_attribute("agentstate.task_id", task_id)
        elif len(self.owners) == 1:
            attr, ident = next(iter(self.owners))
            span.set_attribute(attr, ident)
        span.set_attribute("agentstate.round_trips", self.round_trips)


class Telemetry:
    """The instruments, and the wrapper :func:`instrument` installs around every store operation."""

    def __init__(
        self,
        *,
        meter_provider: MeterProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        metrics: bool = True,
        traces: bool = True,
    ) -> None:
        try:
            from opentelemetry import metrics as otel_metrics
            from opentelemetry import trace as otel_trace
        except ImportError as exc:  # pragma: no cover - exercised in a subprocess without the extra
            raise ImportError(
                "redis_agentstate.telemetry needs OpenTelemetry: pip install 'redis-agentstate[otel]'"
            ) from exc
        try:
            version = metadata.version("redis-agentstate")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without metadata
            version = "0"
        self._trace = otel_trace
        self._span_kind = otel_trace.SpanKind.CLIENT
        self._tracer = otel_trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider) if traces else None
        self._counters: dict[str, Any] = {}
        self._duration: Any = None
        self._active = False
        if metrics:
            meter = otel_metrics.get_meter(SCOPE, version, meter_provider=meter_provider)
            for key, (name, unit, description) in COUNTERS.items():
                self._counters[key] = meter.create_counter(name, unit=unit, description=description)
            name, unit, description = DURATION
            self._duration = meter.create_histogram(
                name, unit=unit, description=description, explicit_bucket_boundaries_advisory=_BUCKETS
            )
            meter.create_observable_gauge(
                LEASE_AGE[0], callbacks=[self._observe_age], unit=LEASE_AGE[1], description=LEASE_AGE[2]
            )
            meter.create_observable_gauge(
                LEASES_HELD[0], callbacks=[self._observe_held], unit=LEASES_HELD[1], description=LEASES_HELD[2]
            )

    def install(self) -> Telemetry:
        """Make this the process's telemetry (what :func:`instrument` does with a new one); returns self."""
        with _lock:
            previous = shells.TELEMETRY
            if isinstance(previous, Telemetry):
                previous._active = False
            self._active = True
            shells.TELEMETRY = self
        return self

    # ---- events -------------------------------------------------------------------

    def count(self, event: str, namespace: str, operation: str, amount: int = 1, **attributes: Any) -> None:
        """Add ``amount`` to the counter ``event`` (a key of ``COUNTERS``)."""
        counter = self._counters.get(event)
        if counter is None:
            if event not in COUNTERS:
                raise ValueError(f"unknown telemetry event {event!r}; one of {sorted(COUNTERS)}")
            return  # metrics=False
        counter.add(amount, {"agentstate.namespace": namespace, "db.operation.name": operation, **attributes})

    def lease_lost(self, namespace: str, *, fenced: bool) -> None:
        """A Lease (or the Runner's) was lost; ``fenced``: Redis refused its write."""
        self.count("leases_lost", namespace, "lease", **{"agentstate.fenced": fenced})

    # ---- the operation wrapper ------------------------------------------------------

    def run_sync(self, shell: SyncShell[Any], op: Op[T]) -> T:
        """Run ``op`` through ``shell`` inside a span, timed, its replies counted."""
        operation = _Operation(self, shell, op)
        with self._span(operation) as span:
            started = time.perf_counter()
            try:
                result = shell._drive(operation.watch(op))
            except BaseException as exc:
                self._failed(operation, span, exc, started)
                raise
            self._done(operation, span, result, started)
            return result

    async def run_async(self, shell: AsyncShell[Any], op: Op[T]) -> T:
        """The asyncio twin of :meth:`run_sync`."""
        operation = _Operation(self, shell, op)
        with self._span(operation) as span:
            started = time.perf_counter()
            try:
                result = await shell._drive(operation.watch(op))
            except BaseException as exc:
                self._failed(operation, span, exc, started)
                raise
            self._done(operation, span, result, started)
            return result

    @contextlib.contextmanager
    def operation(self, shell: StoreShell[Any], name: str) -> Iterator[Watch]:
        """One operation ``name`` made of the ops the caller runs through the yielded ``watch``
        (``StoreShell._operation``): a blocked ``claim_next`` probes again at each wake-up, and
        that is still one call: one span and one duration sample (``agentstate.blocking``: it
        includes the wait), its replies counted as they come."""
        operation = _Operation(self, shell, None, name)
        operation.attrs["agentstate.blocking"] = True
        with self._span(operation) as span:
            started = time.perf_counter()
            try:
                yield operation.watch_all
            except BaseException as exc:
                self._failed(operation, span, exc, started)
                raise
            self._done(operation, span, operation.result, started)

    def _span(self, operation: _Operation) -> Any:
        if self._tracer is None:
            return _NoSpan()
        attributes = {"db.system": "redis", **operation.attrs}
        # start_as_current_span records an escaping exception and sets status ERROR.
        return self._tracer.start_as_current_span(
            f"{operation.name} {operation.namespace}", kind=self._span_kind, attributes=attributes
        )

    def _done(self, operation: _Operation, span: Span | None, result: Any, started: float) -> None:
        if self._duration is not None:
            self._duration.record(time.perf_counter() - started, operation.attrs)
        operation.finish(span, result)

    def _failed(self, operation: _Operation, span: Span | None, exc: BaseException, started: float) -> None:
        error_type = type(exc).__qualname__
        if self._duration is not None:
            self._duration.record(time.perf_counter() - started, {**operation.attrs, "error.type": error_type})
        if span is not None:
            span.set_attribute("error.type", error_type)
        operation.finish(span, None)

    # ---- the Runner gauges -----------------------------------------------------------

    def _runner_leases(self) -> Iterator[tuple[dict[str, Any], list[float]]]:
        if not self._active:
            return
        from .runner import RUNNERS

        for runner in list(RUNNERS):
            attrs = {"agentstate.namespace": runner.store.namespace, "agentstate.worker_id": runner.worker_id}
            yield attrs, [lease.age_s() for lease in runner.live_leases()]

    def _observe_age(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(max(ages), attrs) for attrs, ages in self._runner_leases() if ages]

    def _observe_held(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(len(ages), attrs) for attrs, ages in self._runner_leases()]


class _NoSpan:
    """``traces=False``: the span context of no span."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_lock = threading.Lock()


def instrument(
    *,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    metrics: bool = True,
    traces: bool = True,
) -> Telemetry:
    """Turn metrics and traces on for every store in this process; returns what was installed.

    ``meter_provider`` / ``tracer_provider``: default OpenTelemetry's global
    ones (a proxy until the application sets them). Calling it again replaces
    the previous instrumentation. Raises ``ImportError`` without the ``[otel]`` extra.
    """
    telemetry = Telemetry(
        meter_provider=meter_provider, tracer_provider=tracer_provider, metrics=metrics, traces=traces
    )
    return telemetry.install()


def uninstrument() -> None:
    """Turn telemetry off again (stores then pay one compare per operation); a no-op when off."""
    with _lock:
        previous = shells.TELEMETRY
        if isinstance(previous, Telemetry):
            previous._active = False  # its gauges observe nothing from now on
        shells.TELEMETRY = None


def active() -> Telemetry | None:
    """The installed :class:`Telemetry`, or None when telemetry is off."""
    observer = shells.TELEMETRY
    return observer if isinstance(observer, Telemetry) else None
