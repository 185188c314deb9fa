"""The server's own ceiling: ``redis-benchmark`` (the C client that ships with Redis) on the same server."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any
from urllib.parse import urlparse

import redis

from ._util import Settings, summary

_LINE = re.compile(r"^\s*(?P<name>.+?): (?P<rps>[\d.]+) requests per second(?:, p50=(?P<p50>[\d.]+) msec)?")


def parse(output: str) -> dict[str, dict[str, float | None]]:
    """``-q`` output -> {test: {rps, p50_ms}} (progress lines end in \\r and are skipped)."""
    found: dict[str, dict[str, float | None]] = {}
    for chunk in re.split(r"[\r\n]+", output):
        m = _LINE.match(chunk)
        if m:
            p50 = m.group("p50")
            found[m.group("name").strip()] = {"rps": float(m.group("rps")), "p50_ms": float(p50) if p50 else None}
    return found


def run(settings: Settings) -> dict[str, Any]:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"title": "redis-benchmark", "status": "not run: redis-benchmark not on PATH", "rows": []}
    u = urlparse(settings.url)
    base = [binary, "-h", u.hostname or "127.0.0.1", "-p", str(u.port or 6379), "-q"]
    if u.password:
        base += ["-a", u.password]
        if u.username:
            base += ["--user", u.username]
    with redis.Redis.from_url(settings.url) as client:
        sha = client.script_load("return 0")
    n1 = 2_000 if settings.quick else 30_000
    n50 = 10_000 if settings.quick else 200_000
    runs = [
        ("ping, set", 1, [*base, "-n", str(n1), "-c", "1", "-t", "ping,set"]),
        ("no-op EVALSHA", 1, [*base, "-n", str(n1), "-c", "1", "EVALSHA", sha, "0"]),
        ("ping, set", 50, [*base, "-n", str(n50), "-c", "50", "-t", "ping,set"]),
        ("no-op EVALSHA", 50, [*base, "-n", str(n50), "-c", "50", "EVALSHA", sha, "0"]),
    ]
    rounds = 1 if settings.quick else 3
    samples: dict[tuple[str, int], dict[str, list[float]]] = {}
    errors = []
    for _ in range(rounds):
        for _label, clients, argv in runs:
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(repr(exc))
                continue
            for test, found in parse(out).items():
                name = "EVALSHA (no-op)" if test.upper().startswith("EVALSHA") else test
                slot = samples.setdefault((name, clients), {"rps": [], "p50_ms": []})
                slot["rps"].append(float(found["rps"] or 0))
                if found["p50_ms"] is not None:
                    slot["p50_ms"].append(float(found["p50_ms"]))
    rows = []
    for (name, clients), vals in samples.items():
        rows.append(
            {
                "test": name,
                "clients": clients,
                "requests_per_s": summary(vals["rps"], 0),
                "p50_ms": summary(vals["p50_ms"], 3) if vals["p50_ms"] else None,
            }
        )
    return {
        "title": "redis-benchmark on the same server (the server's own ceiling, C client)",
        "status": "ok" if rows else f"failed: {errors[:1]}",
        "rounds": rounds,
        "rows": rows,
    }
