"""Targets, the Markdown tables built from a results dict, and the marked blocks of benchmarks/README.md.

Every command of the harness rewrites its own blocks of the README, each between
``<!-- results:NAME:begin ... -->`` and ``<!-- results:NAME:end -->`` and opened by a header line
stating the command, the date (UTC), the commit measured, the machine and its load
(:func:`header`). ``python -m benchmarks.report --from results/X.json`` re-renders the blocks of a
saved run (its header still states that run's date and commit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "README.md")


def begin_marker(name: str) -> str:
    return f"<!-- results:{name}:begin (written by the command on its first line; do not edit by hand) -->"


def end_marker(name: str) -> str:
    return f"<!-- results:{name}:end -->"


#: The header line every block opens with (tests/test_bench_readme.py checks it).
HEADER_RE = re.compile(
    r"^Command: `(?P<command>python -m benchmarks[^`]*)` · date: (?P<date>\d{4}-\d\d-\d\d \d\d:\d\d UTC)"
    r" · commit: (?P<commit>[0-9a-f]{7,40}(?:-dirty)?) · machine: (?P<machine>[^·]+) · load: (?P<load>[^·]+)"
    r"(?: · .+)?$"
)
BLOCK_RE = re.compile(
    r"<!-- results:(?P<name>[\w-]+):begin [^>]*-->\n(?P<body>.*?)\n<!-- results:(?P=name):end -->", re.S
)


def header(meta: dict[str, Any], note: str = "") -> str:
    """``Command: ... · date: ... · commit: ... · machine: ... · load: ... · took N s`` (one line)."""
    g = meta.get("git") or {}
    commit = g.get("commit") or "unknown"
    if g.get("dirty") or (g.get("dirty") is None and g.get("library_uncommitted_changes")):
        commit += "-dirty"
    m = meta.get("machine") or {}
    machine = f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('os') or m.get('platform', '?')}"
    machine += f", Python {m.get('python', '?')}"
    server = (meta.get("versions") or {}).get("redis-server")
    if server:
        kind = (meta.get("server") or {}).get("kind", "private")
        machine += f", {kind} redis-server {server}"
    load = meta.get("load") or {}
    if load.get("start") is None:
        load_s = "not recorded"
    else:
        load_s = f"{load['start']:.2f} at the start"
        if load.get("end") is not None:
            load_s += f", {load['end']:.2f} at the end"
        load_s += " (1-min average; shared machine)"
    line = (
        f"Command: `{meta['command']}` · date: {meta['started']} · commit: {commit} · machine: {machine}"
        f" · load: {load_s}"
    )
    if meta.get("duration_s") is not None:
        line += f" · took {meta['duration_s']:.0f} s"
    if note:
        line += f" · {note}"
    return line


def update_readme(path: str, name: str, body: str) -> None:
    """Replace block ``name`` of the README at ``path`` (appended at the end if the README has no such block)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = f"{begin_marker(name)}\n{body.rstrip()}\n{end_marker(name)}"
    pattern = re.compile(
        re.escape(f"<!-- results:{name}:begin ") + r"[^>]*-->.*?" + re.escape(end_marker(name)), flags=re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _m: new, text, count=1)
    else:
        print(f"[benchmarks] README has no block {name!r}: appended at the end", file=sys.stderr)
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_block(meta: dict[str, Any], name: str, body: str, path: str = README, note: str = "") -> None:
    update_readme(path, name, header(meta, note) + "\n\n" + body)
    print(f"[benchmarks] block {name!r} rewritten in {path}", file=sys.stderr)


def _s(s: dict[str, Any] | None, digits: int = 1, unit: str = "") -> str:
    if not s:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])}{unit} ({f.format(s['p10'])}-{f.format(s['p90'])})"


# ---- goals ---------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's goals for the main figures, each with what was measured."""
    figs = results["figures"]
    out: list[dict[str, Any]] = []
    single = figs.get("single")
    if single:
        r = single["ratios"]
        cont = r.get("lock_over_continue")
        if cont is not None:
            out.append(
                {
                    "id": "continue_vs_lock",
                    "figure": "single",
                    "what": "redis-py Lock acquire+SET+release / steady commit_and_claim (1 KiB)",
                    "goal": ">= 1.8",
                    "measured": cont,
                    "met": bool(cont["median"] >= 1.8),
                }
            )
        floor1 = r.get("continue_vs_floor1")
        if floor1 is not None:
            out.append(
                {
                    "id": "continue_vs_floor1",
                    "figure": "single",
                    "what": "steady commit_and_claim (1 KiB) / 1 no-op EVALSHA",
                    "goal": "<= 1.6",
                    "measured": floor1,
                    "met": bool(floor1["median"] <= 1.6),
                }
            )
        vs_floor = r.get("agentstate_vs_floor")
        if vs_floor is not None:
            out.append(
                {
                    "id": "single_vs_floor",
                    "figure": "single",
                    "what": "claim + commit (1 KiB) / 2 no-op EVALSHA",
                    "goal": "<= 1.3",
                    "measured": vs_floor,
                    "met": bool(vs_floor["median"] <= 1.3),
                }
            )
        srv = single.get("server_us")
        if srv:
            for key, what, goal in (
                ("claim_commit_us", "server us per claim + commit cycle (both scripts)", 15.0),
                ("commit_and_claim_us", "server us per commit_and_claim", 10.0),
            ):
                v = srv[key]
                out.append(
                    {
                        "id": key,
                        "figure": "single",
                        "what": what,
                        "goal": f"<= {goal:g} us",
                        "measured": {"median": v, "p10": v, "p90": v, "unit": "us"},
                        "met": bool(v <= goal),
                    }
                )
    hist = figs.get("history")
    if hist:
        ratio = hist.get("ratio")
        h = hist.get("ratio_target_history")
        out.append(
            {
                "id": "history_growth",
                "figure": "history",
                "what": f"commit with {h:,} messages stored / with 10 stored",
                "goal": "<= 1.2",
                "measured": ratio,
                "met": bool(ratio and ratio["median"] <= 1.2),
            }
        )
    return out


def _targets_table(tg: list[dict[str, Any]]) -> list[str]:
    if not tg:
        return []
    lines = [
        "| goal | target | measured: median of per-round values (p10-p90) | quiet-machine estimate | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in tg:
        quiet = (t["measured"] or {}).get("quiet")
        unit = " us" if (t["measured"] or {}).get("unit") == "us" else "x"
        measured = f"{t['measured']['median']:.2f} us" if unit == " us" else _s(t["measured"], 2, unit)
        lines.append(
            f"| {t['what']} | {t['goal']} | {measured} | "
            f"{'-' if quiet is None else f'{quiet:.2f}x'} | {'yes' if t['met'] else '**no**'} |"
        )
    lines += [
        "",
        "'met' is judged on the median. The quiet-machine estimate is the ratio of each side's p10 batch "
        "(its cost when the shared machine left it alone).",
        "",
    ]
    return lines


# ---- one renderer per figure ---------------------------------------------------


def _versions_line(meta: dict[str, Any]) -> str:
    v = meta.get("versions") or {}
    line = "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val and k != "redis-benchmark")
    missing = [k for k, val in v.items() if not val]
    if missing:
        line += "; not installed: " + ", ".join(missing)
    return line + "."


def _single(results: dict[str, Any]) -> list[str]:
    single = results["figures"]["single"]
    lines = [
        f"{single['rounds']} interleaved rounds of {single['cycles_per_round']} cycles per contender; "
        f"state {single['state_bytes']} bytes; median (p10-p90) over rounds, ratios taken within a round.",
        "",
        "| contender | round trips | us per cycle | p99 us | x floor | claim + commit speed-up over it |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in single["rows"]:
        if "us_per_cycle" not in r:
            lines.append(f"| {r['label']} | - | {r['status']} | - | - | - |")
            continue
        lines.append(
            f"| {r['label']} | {r['round_trips'] or '-'} | {_s(r['us_per_cycle'])} | {r['latency_us']['p99']:.0f} "
            f"| {_s(r['vs_floor'], 2)} | {_s(r['speedup_of_agentstate'], 2)} |"
        )
    lines.append("")
    ratios = single["ratios"]
    named = (
        ("lock_over_continue", "redis-py Lock / commit_and_claim"),
        ("lock_over_agentstate", "redis-py Lock / claim + commit"),
        ("claim_commit_over_continue", "claim + commit / commit_and_claim"),
        ("continue_vs_floor", "commit_and_claim / 2 no-op EVALSHA"),
        ("continue_vs_floor1", "commit_and_claim / 1 no-op EVALSHA"),
        ("agentstate_vs_shaped", "claim + commit / shaped floor"),
    )
    said = [f"{label} {_s(ratios[k], 2, 'x')}" for k, label in named if ratios.get(k)]
    if said:
        lines += ["Per-round ratios: " + "; ".join(said) + ".", ""]
    srv = single.get("server_us")
    if srv:
        lines += [
            "Server time per cycle, each kind run alone between two `CONFIG RESETSTAT` (INFO commandstats): "
            f"claim + commit {srv['claim_commit_us']:.2f} us in {srv['claim_commit_calls']:.0f} scripts; "
            f"commit_and_claim {srv['commit_and_claim_us']:.2f} us in {srv['commit_and_claim_calls']:.0f}; "
            f"a no-op EVALSHA {srv['noop_evalsha_us']:.2f} us.",
            "",
        ]
    lines += _targets_table([t for t in results.get("targets") or [] if t.get("figure") == "single"])
    lines += [_versions_line(results["meta"]), ""]
    return lines


def _history(results: dict[str, Any]) -> list[str]:
    hist = results["figures"]["history"]
    lines = [
        f"{hist['rounds']} rounds; {hist['cycles_per_round']} cycles per length per round; messages "
        f"~{hist['message_bytes']} B; {hist['note']}.",
        "",
        "| messages stored | commit us | claim us | commit / 10 stored | task keys (MEMORY USAGE) "
        "| used_memory delta |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in hist["rows"]:
        lines.append(
            f"| {r['history']:,} | {_s(r['commit_us'])} | {_s(r['claim_us'])} "
            f"| {_s(r['commit_vs_smallest'], 2, 'x')} "
            f"| {r['task_keys_bytes']:,} B | {r['used_memory_delta']:,} B |"
        )
    lines.append("")
    lines += _targets_table([t for t in results.get("targets") or [] if t.get("figure") == "history"])
    return lines


def _concurrency(results: dict[str, Any]) -> list[str]:
    conc = results["figures"]["concurrency"]
    lines = [
        f"{conc['window_s']} s window per configuration per round; {conc['network']}. "
        "Modes: `async` = claim + commit, `async_continued` = commit_and_claim, N tasks on one event loop; "
        "`procs` = N sync worker processes. Cores = CPU seconds per second.",
        "",
        "| mode | n | cycles/s | p50 ms | p99 ms | client cores | server cores | other processes | bottleneck |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in conc["rows"]:
        lines.append(
            f"| {r['mode']} | {r['n']} | {_s(r['cycles_per_s'], 0)} | {r['latency_us']['p50'] / 1000:.2f} "
            f"| {r['latency_us']['p99'] / 1000:.2f} | {_s(r['client_cores'], 2)} | {_s(r['server_cores'], 2)} "
            f"| {_s(r['other_cores'], 2)} | {r['bottleneck']} |"
        )
    lines.append("")
    return lines


def _pools(results: dict[str, Any]) -> list[str]:
    pools = results["figures"]["pools"]
    lines = ["| measurement | ops/s or records/s | latency p50 / p99 us | status |", "| --- | --- | --- | --- |"]
    for r in pools["rows"]:
        rate = r.get("ops_per_s") or r.get("records_per_s")
        lat = r.get("latency_us")
        lat_s = f"{lat['p50']:.0f} / {lat['p99']:.0f}" if lat else "-"
        lines.append(f"| {r['name']} | {_s(rate, 0)} | {lat_s} | {r['status']} |")
    lines.append("")
    return lines


def _payload(results: dict[str, Any]) -> list[str]:
    payload = results["figures"]["payload"]
    lines = [
        "| size | cycle us | msgpack enc+dec us | json dumps+loads us | round trip us (cycle - msgpack) "
        "| transport floor us | codec share |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in payload["rows"]:
        lines.append(
            f"| {r['size']} ({r['msgpack_bytes']:,} B msgpack, {r['json_bytes']:,} B json) | {_s(r['cycle_us'])} "
            f"| {r['msgpack_codec_us']:.1f} | {r['json_codec_us']:.1f} | {r['round_trip_us']:.1f} "
            f"| {_s(r['transport_floor_us'])} | {r['codec_share']:.0%} |"
        )
    lines.append("")
    return lines


def _profile(results: dict[str, Any]) -> list[str]:
    prof = results["figures"]["profile"]
    cp = prof["cprofile"]
    lines = [
        f"cProfile over {cp['cycles']} cycles ({cp['python_calls_per_cycle']:.0f} Python calls per cycle; "
        f"profiled time {cp['profiled_us_per_cycle']:.0f} us per cycle, inflated by the profiler):",
        "",
        "| area (own time) | us per cycle, profiled | share |",
        "| --- | --- | --- |",
    ]
    for k, a in cp["areas"].items():
        lines.append(f"| {k} | {a['us_per_cycle']:.1f} | {a['share']:.0%} |")
    lines += ["", "Per-call work priced without profiler or I/O (median of 5 batches):", ""]
    lines += ["| work | us |", "| --- | --- |"]
    for k, val in prof["micro_us"].items():
        lines.append(f"| {k} | {val:.2f} |")
    if prof.get("server"):
        srv = prof["server"]
        lines.append(f"| server: both scripts of a cycle (INFO commandstats) | {srv['scripts_us_per_cycle']:.2f} |")
        lines.append(f"| server: one no-op EVALSHA | {srv['noop_evalsha_us']:.2f} |")
        if srv.get("counters"):
            c = srv["counters"]
            lines.append(
                f"| server: the stats counters' share of a cycle (with {c['with_counters_us_per_cycle']:.2f}, "
                f"without {c['without_counters_us_per_cycle']:.2f}, median of {c['rounds']}) | "
                f"{c['counters_extra_us_per_cycle']:.2f} |"
            )
            lines.append(
                "| server: one counter update (pcall HINCRBY; a cycle makes 2, a takeover 3) | "
                f"{c['counter_statement_us']:.2f} |"
            )
    lines.append("")
    return lines


def _floor(results: dict[str, Any]) -> list[str]:
    floor = results["figures"]["floor"]
    if not floor["rows"]:
        return [floor["status"], ""]
    lines = ["| test | clients | requests/s | p50 ms |", "| --- | --- | --- | --- |"]
    for r in floor["rows"]:
        lines.append(f"| {r['test']} | {r['clients']} | {_s(r['requests_per_s'], 0)} | {_s(r['p50_ms'], 3)} |")
    lines.append("")
    return lines


def _pool_scale(results: dict[str, Any]) -> list[str]:
    from .pool_scale import markdown as scale_markdown

    return scale_markdown(results["figures"]["pool_scale"])[2:]  # without its own title


def _scale(results: dict[str, Any]) -> list[str]:
    from .scale import markdown as scale_paper_markdown

    return scale_paper_markdown(results["figures"]["scale"])[2:]


def _langgraph(results: dict[str, Any]) -> list[str]:
    from .langgraph_savers import markdown as langgraph_markdown
    from .langgraph_savers import targets as langgraph_targets

    fig = results["figures"]["langgraph"]
    return [langgraph_markdown(fig), "", *(f"- {t}" for t in langgraph_targets(fig)), ""]


def _langgraph_store(results: dict[str, Any]) -> list[str]:
    from .langgraph_store import markdown as store_markdown

    return [store_markdown(results["figures"]["langgraph_store"])]


def _telemetry(results: dict[str, Any]) -> list[str]:
    from .otel import markdown as telemetry_markdown

    return [telemetry_markdown(results["figures"]["telemetry"]), ""]


#: figure name -> (heading on stdout, renderer); each figure's README block has the figure's name.
RENDERERS = {
    "single": ("Single connection: one cycle of a 1 KiB shared_state", _single),
    "floor": ("redis-benchmark on the same server (the server's own ceiling, C client)", _floor),
    "history": ("History growth: commit time and memory against stored history", _history),
    "concurrency": ("Concurrency: cycles/s and latency against tasks and workers (1 KiB state)", _concurrency),
    "pools": ("Pools: record_message / watch throughput and watch latency", _pools),
    "payload": ("Payload size: 1 KiB / 64 KiB / 1 MiB shared_state; codec apart from round trip", _payload),
    "profile": ("Hot path of claim + commit (1 KiB shared_state)", _profile),
    "pool_scale": ("Pool scale: the longest single script with records in one pool", _pool_scale),
    "scale": ("Scale on paper: server CPU per cycle, one primary's capacity, the Cluster spread", _scale),
    "langgraph": ("LangGraph checkpointers: one thread growing by 2 messages per invoke", _langgraph),
    "langgraph_store": ("LangGraph stores: put, get, filtered and semantic search, list_namespaces", _langgraph_store),
    "telemetry": ("Telemetry cost per claim + commit cycle", _telemetry),
}


#: Commands of their own (``python -m benchmarks.NAME --readme``): each writes block NAME and results/NAME.json.
STANDALONE = (
    "script_floor", "functions_ab", "blocking", "shard_spread", "shard_count", "reshard", "langgraph_conformance",
    "prelude_ab", "langgraph_store_ann",
)  # fmt: skip


def publish(meta: dict[str, Any], name: str, data: dict[str, Any], params: dict[str, Any]) -> None:
    """A standalone command's results: kept in ``results/NAME.json`` and rendered into block NAME."""
    from ._util import finish_meta

    results = {"schema": 1, "meta": finish_meta(meta), "standalone": {"name": name, "data": data, "params": params}}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    for block, body in blocks(results, []).items():
        write_block(results["meta"], block, body)


def blocks(results: dict[str, Any], images: list[str]) -> dict[str, str]:
    """Each figure's README block body (without the header line), plot included where one was drawn."""
    out: dict[str, str] = {}
    standalone = results.get("standalone")
    if standalone:
        import importlib

        module = importlib.import_module(f"{__package__}.{standalone['name']}")
        out[standalone["name"]] = module.markdown(standalone["data"], standalone["params"]).rstrip() + "\n"
        return out
    for name, fig in results["figures"].items():
        if name not in RENDERERS or fig is None:
            continue
        lines = RENDERERS[name][1](results)
        png = f"{name}.png"
        if png in images:
            lines += [f"![{name}](results/{png})", ""]
        out[name] = "\n".join(lines).rstrip() + "\n"
    return out


def markdown(results: dict[str, Any], images: list[str]) -> str:
    """Every block of a run, with its heading, for stdout."""
    parts = [header(results["meta"]), ""]
    for name, body in blocks(results, images).items():
        parts += [f"#### {RENDERERS[name][0]}", "", body]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Re-render the README blocks of a saved run (``results/*.json``) without measuring again."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    p.add_argument("--from", dest="source", required=True, help="a results JSON written by python -m benchmarks")
    p.add_argument("--readme", default=README)
    p.add_argument("--note", default="", help="appended to each block's header line")
    args = p.parse_args(argv)
    with open(args.source, encoding="utf-8") as f:
        results = json.load(f)
    if "figures" in results:  # the main harness's run (a standalone command's has its own block)
        results.setdefault("targets", targets(results))
    drawn = results.get("plots")
    for name, body in blocks(results, drawn if isinstance(drawn, list) else []).items():
        write_block(results["meta"], name, body, args.readme, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
