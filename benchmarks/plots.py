"""PNG plots of a results dict (matplotlib is optional: without it no plots are drawn)."""

from __future__ import annotations

import os
from typing import Any


def available() -> str | None:
    """None if matplotlib imports, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except Exception as exc:
        return f"no plots: matplotlib not importable ({exc}); pip install 'redis-agentstate[bench]'"
    return None


def _err(s: dict[str, Any]) -> tuple[float, float]:
    return max(s["median"] - s["p10"], 0.0), max(s["p90"] - s["median"], 0.0)


def draw(results: dict[str, Any], out_dir: str) -> list[str]:
    """Draw every figure present in ``results``; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = results["figures"]
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        written.append(name)

    single = figs.get("single")
    if single:
        rows = [r for r in single["rows"] if "us_per_cycle" in r]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        names = [r["name"] for r in rows]
        med = [r["us_per_cycle"]["median"] for r in rows]
        errs = list(zip(*[_err(r["us_per_cycle"]) for r in rows], strict=True))
        colors = [
            "#888888" if n.startswith("floor") else "#1f77b4" if n.startswith("agentstate") else "#ff7f0e"
            for n in names
        ]
        ax.barh(names, med, xerr=errs, color=colors, capsize=3)
        ax.invert_yaxis()
        ax.set_xlabel("us per cycle (median, p10-p90 over rounds)")
        ax.set_title("One connection: claim + commit (1 KiB) vs floor and lock libraries")
        save(fig, "single.png")

    hist = figs.get("history")
    if hist:
        rows = hist["rows"]
        h = [r["history"] for r in rows]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for key, label in (("commit_us", "commit"), ("claim_us", "claim")):
            med = [r[key]["median"] for r in rows]
            errs = list(zip(*[_err(r[key]) for r in rows], strict=True))
            a1.errorbar(h, med, yerr=errs, marker="o", capsize=3, label=label)
        a1.set_xscale("log")
        a1.set_ylim(bottom=0)
        a1.set_xlabel("messages already stored")
        a1.set_ylabel("us per call")
        a1.set_title("Time per call (2 new messages per commit)")
        a1.legend()
        a2.plot(h, [r["task_keys_bytes"] for r in rows], marker="o", label="MEMORY USAGE of the task's keys")
        a2.plot(h, [max(r["used_memory_delta"], 1) for r in rows], marker="x", label="used_memory delta")
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set_xlabel("messages stored")
        a2.set_ylabel("bytes")
        a2.set_title("Redis memory")
        a2.legend()
        save(fig, "history.png")

    conc = figs.get("concurrency")
    if conc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for mode, label in (("async", "async tasks, one loop"), ("procs", "sync worker processes")):
            rows = [r for r in conc["rows"] if r["mode"] == mode]
            if not rows:
                continue
            n = [r["n"] for r in rows]
            med = [r["cycles_per_s"]["median"] for r in rows]
            errs = list(zip(*[_err(r["cycles_per_s"]) for r in rows], strict=True))
            a1.errorbar(n, med, yerr=errs, marker="o", capsize=3, label=label)
            a2.plot(n, [r["latency_us"]["p50"] / 1000 for r in rows], marker="o", label=f"{label} p50")
            a2.plot(n, [r["latency_us"]["p99"] / 1000 for r in rows], marker="x", linestyle="--", label=f"{label} p99")
        levels = sorted({r["n"] for r in conc["rows"]})
        for a in (a1, a2):
            a.set_xscale("log", base=2)
            a.set_xticks(levels, [str(n) for n in levels])
            a.set_xlabel("concurrent tasks (async) / worker processes (sync)")
        a1.set_ylabel("cycles/s")
        a1.set_ylim(bottom=0)
        a1.set_title("Throughput")
        a1.legend(loc="lower left")
        a2.set_yscale("log")
        a2.set_ylabel("ms per cycle")
        a2.set_title("Latency")
        a2.legend(fontsize=7)
        save(fig, "concurrency.png")

    pools = figs.get("pools")
    if pools:
        rows = [r for r in pools["rows"] if r.get("latency_us")]
        if rows:
            fig, ax = plt.subplots(figsize=(8, 3.5))
            names = [r["name"] for r in rows]
            ax.barh(names, [r["latency_us"]["p50"] for r in rows], label="p50")
            ax.barh(
                names,
                [r["latency_us"]["p99"] - r["latency_us"]["p50"] for r in rows],
                left=[r["latency_us"]["p50"] for r in rows],
                alpha=0.5,
                label="p50..p99",
            )
            ax.invert_yaxis()
            ax.set_xlabel("us")
            ax.set_title("Pools: latency" + ("" if pools.get("available") else " (pools not available: floor only)"))
            ax.legend()
            save(fig, "pools.png")

    payload = figs.get("payload")
    if payload:
        rows = payload["rows"]
        fig, ax = plt.subplots(figsize=(8, 4))
        x = list(range(len(rows)))
        codec = [r["msgpack_codec_us"] / 1000 for r in rows]
        rt = [max(r["round_trip_us"], 0) / 1000 for r in rows]
        ax.bar(x, rt, width=0.35, label="round trip (cycle - msgpack codec)")
        ax.bar(x, codec, width=0.35, bottom=rt, label="msgpack encode + decode")
        ax.bar(
            [i + 0.37 for i in x],
            [r["json_codec_us"] / 1000 for r in rows],
            width=0.35,
            label="json dumps + loads (same state)",
        )
        ax.set_xticks([i + 0.18 for i in x], [r["size"] for r in rows])
        ax.set_yscale("log")
        ax.set_ylabel("ms per cycle")
        ax.set_title("Payload size: claim + commit")
        ax.legend(fontsize=8)
        save(fig, "payload.png")
    return written
