"""Targets and the Markdown tables built from a results dict (and copied into benchmarks/README.md)."""

from __future__ import annotations

import re
from typing import Any

BEGIN = "<!-- results:begin (written by python -m benchmarks; do not edit by hand) -->"
END = "<!-- results:end -->"
#: The LangGraph figure is opt-in (``--only langgraph``): its table has a block of its own.
LANGGRAPH_BEGIN = "<!-- langgraph:begin (written by python -m benchmarks --only langgraph; do not edit by hand) -->"
LANGGRAPH_END = "<!-- langgraph:end -->"
#: The telemetry figure is opt-in too (``--only telemetry``).
TELEMETRY_BEGIN = "<!-- telemetry:begin (written by python -m benchmarks --only telemetry; do not edit by hand) -->"
TELEMETRY_END = "<!-- telemetry:end -->"


def _s(s: dict[str, Any] | None, digits: int = 1, unit: str = "") -> str:
    if not s:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])}{unit} ({f.format(s['p10'])}-{f.format(s['p90'])})"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    figs = results["figures"]
    out: list[dict[str, Any]] = []
    single = figs.get("single")
    if single:
        r = single["ratios"]
        vs_floor = r.get("agentstate_vs_floor")
        speedup = r.get("lock_over_agentstate")
        out.append(
            {
                "id": "single_vs_floor",
                "what": "claim + commit (1 KiB) / 2 no-op EVALSHA, one connection",
                "goal": "<= 1.2",
                "measured": vs_floor,
                "met": bool(vs_floor and vs_floor["median"] <= 1.2),
            }
        )
        out.append(
            {
                "id": "single_vs_lock",
                "what": "redis-py Lock acquire+SET+release / claim + commit",
                "goal": ">= 1.25",
                "measured": speedup,
                "met": bool(speedup and speedup["median"] >= 1.25),
            }
        )
        cont = r.get("lock_over_continue")
        if cont is not None:
            out.append(
                {
                    "id": "continue_vs_lock",
                    "what": "redis-py Lock acquire+SET+release / commit_and_claim (steady loop, 1 KiB)",
                    "goal": ">= 1.6",
                    "measured": cont,
                    "met": bool(cont["median"] >= 1.6),
                }
            )
        if vs_floor is not None:
            out.append(
                {
                    "id": "single_vs_floor_issue11",
                    "what": "claim + commit (1 KiB) / 2 no-op EVALSHA (issue 11: 1.3; moonshot 1.2)",
                    "goal": "<= 1.3",
                    "measured": vs_floor,
                    "met": bool(vs_floor["median"] <= 1.3),
                }
            )
        srv = single.get("server_us")
        if srv:
            for key, what, goal in (
                ("claim_commit_us", "server us per claim + commit cycle (both scripts, INFO commandstats)", 15.0),
                ("commit_and_claim_us", "server us per commit_and_claim (INFO commandstats)", 10.0),
            ):
                v = srv[key]
                out.append(
                    {
                        "id": key,
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
                "what": f"commit with {h:,} messages stored / with 10 stored",
                "goal": "<= 1.2",
                "measured": ratio,
                "met": bool(ratio and ratio["median"] <= 1.2),
            }
        )
    return out


def markdown(results: dict[str, Any], images: list[str]) -> str:
    meta = results["meta"]
    figs = results["figures"]
    v = meta["versions"]
    m = meta["machine"]
    lines: list[str] = []
    add = lines.append
    add(
        f"Run of {meta['started']} ({'quick smoke preset' if meta['quick'] else 'full run'}, "
        f"{meta['rounds']} rounds, {meta['duration_s']:.0f} s):"
    )
    add("")
    add(f"- command: `{meta['command']}`")
    g = meta.get("git") or {}
    if g.get("commit"):
        dirty = " plus uncommitted changes to redis_agentstate/" if g.get("library_uncommitted_changes") else ""
        add(f"- code measured: commit {g['commit']}{dirty}")
    add(f"- machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; shared with other work, so every figure")
    add("  interleaves its contenders round by round and ratios are taken within a round")
    add(
        f"- server: {meta['server']['kind']} redis-server {v.get('redis-server')}, modules: "
        f"{', '.join(meta['server']['modules']) or 'none'}"
    )
    add("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val and k != "redis-benchmark"))
    missing = [k for k, val in v.items() if not val]
    if missing:
        add("- not installed: " + ", ".join(missing))
    add("")
    add("Numbers are medians with the p10-p90 spread over rounds in brackets.")
    add("")
    tg = results.get("targets") or []
    if tg:
        add("#### Targets")
        add("")
        add("| target | goal | measured: median of per-round ratios (p10-p90) | quiet-machine estimate | met |")
        add("| --- | --- | --- | --- | --- |")
        for t in tg:
            quiet = (t["measured"] or {}).get("quiet")
            unit = " us" if (t["measured"] or {}).get("unit") == "us" else "x"
            add(
                f"| {t['what']} | {t['goal']} | {_s(t['measured'], 2, unit)} | "
                f"{'-' if quiet is None else f'{quiet:.2f}x'} | {'yes' if t['met'] else '**no**'} |"
            )
        add("")
        add(
            "'met' is judged on the median. The quiet-machine estimate is the ratio of each side's p10 batch "
            "(its cost when the shared machine left it alone)."
        )
        add("")

    single = figs.get("single")
    if single:
        add(f"#### 1. {single['title']}")
        add("")
        add(
            f"{single['rounds']} rounds of {single['cycles_per_round']} cycles per contender; "
            f"state {single['state_bytes']} bytes."
        )
        add("")
        add("| contender | round trips | us per cycle | p99 us | x floor | agentstate speed-up over it |")
        add("| --- | --- | --- | --- | --- | --- |")
        for r in single["rows"]:
            if "us_per_cycle" not in r:
                add(f"| {r['label']} | - | {r['status']} | - | - | - |")
                continue
            add(
                f"| {r['label']} | {r['round_trips'] or '-'} | {_s(r['us_per_cycle'])} | {r['latency_us']['p99']:.0f} "
                f"| {_s(r['vs_floor'], 2)} | {_s(r['speedup_of_agentstate'], 2)} |"
            )
        add("")
        srv = single.get("server_us")
        if srv:
            add(
                "Server time per cycle, each kind run alone between two `CONFIG RESETSTAT` (INFO commandstats, "
                f"private server): claim + commit {srv['claim_commit_us']:.2f} us in "
                f"{srv['claim_commit_calls']:.0f} scripts; commit_and_claim {srv['commit_and_claim_us']:.2f} us in "
                f"{srv['commit_and_claim_calls']:.0f}; a no-op EVALSHA {srv['noop_evalsha_us']:.2f} us."
            )
            add("")
    hist = figs.get("history")
    if hist:
        add(f"#### 2. {hist['title']}")
        add("")
        add(
            f"{hist['cycles_per_round']} cycles per length per round; messages ~{hist['message_bytes']} B; "
            f"{hist['note']}."
        )
        add("")
        add(
            "| messages stored | commit us | claim us | commit / 10 stored "
            "| task keys (MEMORY USAGE) | used_memory delta |"
        )
        add("| --- | --- | --- | --- | --- | --- |")
        for r in hist["rows"]:
            add(
                f"| {r['history']:,} | {_s(r['commit_us'])} | {_s(r['claim_us'])} "
                f"| {_s(r['commit_vs_smallest'], 2, 'x')} "
                f"| {r['task_keys_bytes']:,} B | {r['used_memory_delta']:,} B |"
            )
        add("")
    conc = figs.get("concurrency")
    if conc:
        add(f"#### 3. {conc['title']}")
        add("")
        add(
            f"{conc['window_s']} s window per configuration per round; {conc['network']}. "
            "Cores = CPU seconds per second."
        )
        add("")
        add("| mode | n | cycles/s | p50 ms | p99 ms | client cores | server cores | other processes | bottleneck |")
        add("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in conc["rows"]:
            add(
                f"| {r['mode']} | {r['n']} | {_s(r['cycles_per_s'], 0)} | {r['latency_us']['p50'] / 1000:.2f} "
                f"| {r['latency_us']['p99'] / 1000:.2f} | {_s(r['client_cores'], 2)} | {_s(r['server_cores'], 2)} "
                f"| {_s(r['other_cores'], 2)} | {r['bottleneck']} |"
            )
        add("")
    pools = figs.get("pools")
    if pools:
        add(f"#### 4. {pools['title']}")
        add("")
        add("| measurement | ops/s or records/s | latency p50 / p99 us | status |")
        add("| --- | --- | --- | --- |")
        for r in pools["rows"]:
            rate = r.get("ops_per_s") or r.get("records_per_s")
            lat = r.get("latency_us")
            lat_s = f"{lat['p50']:.0f} / {lat['p99']:.0f}" if lat else "-"
            add(f"| {r['name']} | {_s(rate, 0)} | {lat_s} | {r['status']} |")
        add("")
    scale = figs.get("pool_scale")
    if scale:
        from .pool_scale import markdown as scale_markdown

        lines.extend(scale_markdown(scale))
    scale = figs.get("scale")
    if scale:
        from .scale import markdown as scale_paper_markdown

        lines.extend(scale_paper_markdown(scale))
    payload = figs.get("payload")
    if payload:
        add(f"#### 5. {payload['title']}")
        add("")
        add(
            "| size | cycle us | msgpack enc+dec us | json dumps+loads us | round trip us (cycle - msgpack) "
            "| transport floor us | codec share |"
        )
        add("| --- | --- | --- | --- | --- | --- | --- |")
        for r in payload["rows"]:
            add(
                f"| {r['size']} ({r['msgpack_bytes']:,} B msgpack, {r['json_bytes']:,} B json) | {_s(r['cycle_us'])} "
                f"| {r['msgpack_codec_us']:.1f} | {r['json_codec_us']:.1f} | {r['round_trip_us']:.1f} "
                f"| {_s(r['transport_floor_us'])} | {r['codec_share']:.0%} |"
            )
        add("")
    prof = figs.get("profile")
    if prof:
        cp = prof["cprofile"]
        add(f"#### 6. {prof['title']}")
        add("")
        add(
            f"cProfile over {cp['cycles']} cycles ({cp['python_calls_per_cycle']:.0f} Python calls per cycle; "
            f"profiled time {cp['profiled_us_per_cycle']:.0f} us per cycle, inflated by the profiler):"
        )
        add("")
        add("| area (own time) | us per cycle, profiled | share |")
        add("| --- | --- | --- |")
        for k, a in cp["areas"].items():
            add(f"| {k} | {a['us_per_cycle']:.1f} | {a['share']:.0%} |")
        add("")
        add("Per-call work priced without profiler or I/O (median of 5 batches):")
        add("")
        add("| work | us |")
        add("| --- | --- |")
        for k, val in prof["micro_us"].items():
            add(f"| {k} | {val:.2f} |")
        if prof.get("server"):
            srv = prof["server"]
            add(f"| server: both scripts of a cycle (INFO commandstats) | {srv['scripts_us_per_cycle']:.2f} |")
            add(f"| server: one no-op EVALSHA | {srv['noop_evalsha_us']:.2f} |")
            if srv.get("counters"):
                c = srv["counters"]
                add(f"| server: the stats counters' share of a cycle (with {c['with_counters_us_per_cycle']:.2f}, "
                    f"without {c['without_counters_us_per_cycle']:.2f}, median of {c['rounds']}) | "
                    f"{c['counters_extra_us_per_cycle']:.2f} |")  # fmt: skip
                add(f"| server: one counter update (pcall HINCRBY; a cycle makes 2, a takeover 3) | "
                    f"{c['counter_statement_us']:.2f} |")  # fmt: skip
        add("")
    floor = figs.get("floor")
    if floor:
        add(f"#### Floor: {floor['title']}")
        add("")
        if floor["rows"]:
            add("| test | clients | requests/s | p50 ms |")
            add("| --- | --- | --- | --- |")
            for r in floor["rows"]:
                add(f"| {r['test']} | {r['clients']} | {_s(r['requests_per_s'], 0)} | {_s(r['p50_ms'], 3)} |")
        else:
            add(floor["status"])
        add("")
    lg = figs.get("langgraph")
    if lg:
        from .langgraph_savers import markdown as langgraph_markdown

        add("#### 7. LangGraph checkpointers on plain Redis: one thread growing by 2 messages per invoke")
        add("")
        add(langgraph_markdown(lg))
        add("")
    tel = figs.get("telemetry")
    if tel:
        from .otel import markdown as telemetry_markdown

        add(f"#### 8. {tel['title']}")
        add("")
        add(telemetry_markdown(tel))
        add("")
    if images:
        add("#### Plots")
        add("")
        for name in images:
            add(f"![{name[:-4]}](results/{name})")
        add("")
    return "\n".join(lines)


def update_readme(path: str, block: str, begin: str = BEGIN, end: str = END) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = f"{begin}\n{block}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _m: new, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
