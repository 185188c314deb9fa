"""Figure 8 (opt-in, ``--only telemetry``): what telemetry costs a claim + commit cycle.

Four contenders on one connection, interleaved in shuffled rounds as in figure 1
(so a noisy neighbour slows all alike and per-round ratios stay honest), each a
claim + commit of a 1 KiB shared_state on its own task:

* ``no_hook``: the call path without the telemetry hook (``_run`` drives the
  operation directly, as before ``redis_agentstate.telemetry`` existed): the baseline;
* ``off``: a plain store with telemetry off. The extra not installed and not
  enabled are the same code path (``wire.TELEMETRY is None``: one global read and
  compare; tests/test_telemetry.py ``TestDisabled`` checks nothing of
  OpenTelemetry is imported then);
* ``metrics``: ``instrument(traces=False)`` with the SDK's MeterProvider and an
  InMemoryMetricReader (counters and the duration histogram recorded per operation);
* ``metrics_traces``: metrics plus a span per operation, SDK TracerProvider with a
  SimpleSpanProcessor into an InMemorySpanExporter (cleared between rounds).

Ratios are per round against ``no_hook``; ``quiet`` is the ratio of the p10 batches.
"""

from __future__ import annotations

import random
from typing import Any, TypeVar

from redis_agentstate import CheckpointStore, telemetry
from redis_agentstate.wire import Op

from ._util import Settings, latency_summary, make_state, percentile, summary, time_batch
from .single import STATE_BYTES, AgentCycle

T = TypeVar("T")

LABELS = {
    "no_hook": "no telemetry hook (the call path before it): baseline",
    "off": "telemetry off: extra not installed, or installed and not enabled",
    "metrics": "instrument(traces=False): SDK metrics, in-memory reader",
    "metrics_traces": "instrument(): SDK metrics + spans, in-memory reader and exporter",
}


class NoHookStore(CheckpointStore):
    """A store whose operations skip the telemetry check: the call path before the hook."""

    def _run(self, op: Op[T]) -> T:
        return self._drive(op)


def _sdk() -> tuple[Any, Any, Any, Any] | str:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError as exc:
        return f"not installed (pip install 'redis-agentstate[otel]' opentelemetry-sdk): {exc}"
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    return meter_provider, tracer_provider, reader, exporter


def run(settings: Settings) -> dict[str, Any]:
    client = settings.client()
    ns = settings.ns("telemetry")
    state = make_state(STATE_BYTES)
    telemetry.uninstrument()
    sdk = _sdk()
    installs: dict[str, telemetry.Telemetry | None] = {"no_hook": None, "off": None}
    status = {name: "ok" for name in LABELS}
    exporter = reader = None
    if isinstance(sdk, str):
        status["metrics"] = status["metrics_traces"] = sdk
    else:
        meter_provider, tracer_provider, reader, exporter = sdk
        installs["metrics"] = telemetry.Telemetry(meter_provider=meter_provider, traces=False)
        installs["metrics_traces"] = telemetry.Telemetry(meter_provider=meter_provider, tracer_provider=tracer_provider)
    cycles = {
        name: AgentCycle(
            (NoHookStore if name == "no_hook" else CheckpointStore)(client, namespace=ns),
            f"task-{name}",
            f"w-{name}",
            dict(state),
        )
        for name in installs
    }

    def use(name: str) -> None:
        chosen = installs[name]
        if chosen is None:
            telemetry.uninstrument()
        else:
            chosen.install()

    n_cycles = 10
    rounds = settings.rounds * (6 if settings.quick else 40)
    rng = random.Random(settings.seed)
    means: dict[str, list[float]] = {name: [] for name in installs}
    per_cycle: dict[str, list[float]] = {name: [] for name in installs}
    try:
        for name, cycle in cycles.items():  # warm up
            use(name)
            time_batch(cycle, 10 if settings.quick else 100)
        for _ in range(rounds):
            order = list(cycles)
            rng.shuffle(order)
            for name in order:
                use(name)
                mean, per = time_batch(cycles[name], n_cycles)
                means[name].append(mean)
                per_cycle[name].extend(per)
            if exporter is not None:
                exporter.clear()
        recorded = _recorded(reader, ns)
    finally:
        telemetry.uninstrument()
        for name, cycle in cycles.items():
            cycle.store.delete(f"task-{name}")

    def ratio(a: str) -> dict[str, Any]:
        out = summary([x / y for x, y in zip(means[a], means["no_hook"], strict=True)], 3)
        out["quiet"] = round(percentile(means[a], 10) / percentile(means["no_hook"], 10), 3)
        return out

    rows = []
    for name, label in LABELS.items():
        row: dict[str, Any] = {"name": name, "label": label, "status": status[name]}
        if name in means:
            row["us_per_cycle"] = summary(means[name], 1)
            row["latency_us"] = latency_summary(per_cycle[name])
            row["vs_no_hook"] = ratio(name)
            row["overhead_us"] = round(percentile(means[name], 50) - percentile(means["no_hook"], 50), 1)
        rows.append(row)
    return {
        "title": "telemetry cost per claim + commit cycle (1 KiB shared_state, one connection)",
        "cycles_per_batch": n_cycles,
        "rounds": rounds,
        "rows": rows,
        "recorded": recorded,
    }


def _recorded(reader: Any, ns: str) -> dict[str, int]:
    """What the metrics contenders recorded (proof they measured the real thing): counter totals."""
    if reader is None:
        return {}
    out: dict[str, int] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    if point.attributes.get("agentstate.namespace") != ns:
                        continue
                    value = getattr(point, "value", None)
                    if value is None:
                        value = getattr(point, "count", 0)
                    out[metric.name] = out.get(metric.name, 0) + int(value)
    return out


def _s(s: dict[str, Any] | None, digits: int = 1) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['p10']:.{digits}f}-{s['p90']:.{digits}f})"


def markdown(fig: dict[str, Any]) -> str:
    lines = [
        f"{fig['rounds']} interleaved rounds of {fig['cycles_per_batch']} cycles per contender; "
        "median (p10-p90) over rounds; ratios per round against the baseline.",
        "",
        "| contender | us/cycle | / baseline | / baseline, quiet | + us/cycle |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in fig["rows"]:
        if "us_per_cycle" not in r:
            lines.append(f"| {r['label']} | {r['status']} | - | - | - |")
            continue
        quiet = r["vs_no_hook"]["quiet"]
        lines.append(
            f"| {r['label']} | {_s(r['us_per_cycle'])} | {_s(r['vs_no_hook'], 3)} | {quiet:.3f} | {r['overhead_us']} |"
        )
    if fig.get("recorded"):
        counted = ", ".join(f"{k} {v}" for k, v in sorted(fig["recorded"].items()))
        lines += ["", f"Recorded by the metrics contenders (all rounds): {counted}."]
    return "\n".join(lines)
