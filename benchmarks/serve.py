"""``agentstate serve``: the HTTP API's overhead, 100 SSE clients on one run, the dashboard in Chromium.

``python -m benchmarks.serve [--quick] [--readme] [--out DIR]``: on one private redis-server, with
``agentstate serve`` as a subprocess (the CLI, one in-process ``GraphWorker`` per graph), side by
side in one run:

1. **API overhead.** A 3-node graph with no I/O (``benchmarks._lg_steps:GRAPH``), each run on a
   fresh thread: ``RunQueue.create`` + ``RunQueue.join`` straight to Redis (A) against
   ``langgraph-sdk``'s ``client.runs.wait`` through the server (B); the server's worker executes
   both. With ``--langgraph-dev CMD`` (default ``$AGENTSTATE_LANGGRAPH_DEV``), the same
   ``runs.wait`` against LangChain's own ``langgraph dev`` on the same graph file (C). Interleaved
   rounds; per round each path's p50 and p99 ms, and the p50 ratios B / A and C / B.
2. **SSE fan-out.** One run streams ``--events`` custom events (``benchmarks.langgraph_runs:EVENTS``)
   while ``--clients`` clients (one asyncio loop, httpx) follow ``GET /threads/{t}/runs/{r}/stream``:
   how many received every event, the event latency (node emits -> client receives) over all
   clients, and the server process's CPU time (``/proc``) over the run.
3. **The dashboard** on a namespace of ``--tasks`` tasks, in the system Chromium (Playwright's
   ``executable_path``): first contentful paint and the first frame rendered (the status table
   filled), then the update latency: a task is created and claimed in Redis, timed until its
   lease row is visible in the page (the page's clock, the same machine's). The slowest command
   Redis ran meanwhile (``SLOWLOG``, every command logged) shows the page's reads stay bounded.

``--readme`` rewrites the ``serve`` block of benchmarks/README.md (and ``results/serve.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.embedded import start_embedded
from redis_agentstate.langgraph import RunQueue

from . import report
from ._util import (
    SERVE_COUNTED,
    command_line,
    count_round_trips,
    counted_trips,
    finish_meta,
    percentile,
    proc_cpu_seconds,
    run_meta,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
NAME = "serve"
MODULE = "benchmarks.serve"
TOKEN = "bench-" + uuid.uuid4().hex


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(url: str, namespace: str, trips: str | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``agentstate serve`` on a free port; with ``trips`` (a file), its round trips counted into it."""
    port = _free_port()
    cli = ["-m", "redis_agentstate"] if trips is None else ["-c", SERVE_COUNTED, trips]
    args = [sys.executable, *cli, "serve", "--url", url, "--namespace", namespace,
            "--port", str(port), "--workers", "1", "--graph", "steps=benchmarks._lg_steps:GRAPH",
            "--graph", "events=benchmarks.langgraph_runs:EVENTS"]  # fmt: skip
    env = {**os.environ, "AGENTSTATE_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    err.seek(0)
                    raise SystemExit(f"agentstate serve exited: {err.read().decode()}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/ok", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit("agentstate serve did not come up")
                time.sleep(0.05)
            yield base, proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def _dev_server(cmd: str) -> Iterator[str]:
    """LangChain's own server (``langgraph dev``, from ``langgraph-cli[inmem]``) on the same graph file."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryFile() as err:
        spec = {"graphs": {"steps": f"{ROOT / 'benchmarks' / '_lg_steps.py'}:GRAPH"}, "dependencies": ["."]}
        Path(d, "langgraph.json").write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.Popen([cmd, "dev", "--no-browser", "--no-reload", "--port", str(port)], cwd=d, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    err.seek(0)
                    raise SystemExit(f"langgraph dev exited: {err.read().decode()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/ok", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit("langgraph dev did not come up")
                time.sleep(0.1)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _version_of(cmd: str, package: str) -> str | None:
    """``package``'s version in the environment of the ``langgraph`` command ``cmd``."""
    py = Path(cmd).parent / "python"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        return out.stdout.strip() or None
    return None


# ---- 1. the API's overhead -------------------------------------------------------------------------


def overhead(url: str, base: str, namespace: str, rounds: int, runs: int, dev: str | None = None,
             dev_runs: int = 10, trips: Callable[[], int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Per round, each path's p50 / p99 ms; with ``dev`` (a ``langgraph dev`` URL) a third path, the same
    ``runs.wait`` against LangChain's own server (``dev_runs`` runs a round: it takes about a second each).
    ``trips``: the round trips to Redis so far (this process's and the server's), counted per run."""
    from langgraph_sdk import get_sync_client

    queue = RunQueue(redis.Redis.from_url(url), namespace=f"{namespace}.steps")
    sdk = get_sync_client(url=base, api_key=TOKEN)
    dev_sdk = None if dev is None else get_sync_client(url=dev, api_key=None)
    want = ["in", "a", "b", "c"]
    seq = iter(range(10**9))

    def direct() -> Callable[[], None]:
        def run() -> None:
            done = queue.join(queue.create(f"q-{next(seq)}", {"log": ["in"]}).run_id, timeout_s=60)
            assert done.status == "success", done

        return run

    def http() -> Callable[[], None]:
        tids = iter([sdk.threads.create()["thread_id"] for _ in range(runs)])  # untimed: the thread exists

        def run() -> None:
            out = sdk.runs.wait(next(tids), "steps", input={"log": ["in"]})
            assert out["log"] == want, out

        return run

    def langgraph_dev() -> Callable[[], None]:
        assert dev_sdk is not None
        tids = iter([dev_sdk.threads.create()["thread_id"] for _ in range(runs)])

        def run() -> None:
            out = dev_sdk.runs.wait(next(tids), "steps", input={"log": ["in"]})
            assert out["log"] == want, out

        return run

    paths: dict[str, Callable[[], Callable[[], None]]] = {"queue": direct, "http": http}
    if dev_sdk is not None:
        paths["dev"] = langgraph_dev
    for make in paths.values():  # warm-up
        fn = make()
        for _ in range(min(5, runs)):
            fn()
    out: dict[str, Any] = {"rounds": []}
    for _ in range(rounds):
        rnd: dict[str, Any] = {}
        for name, make in paths.items():
            fn = make()
            ms: list[float] = []
            before = None if trips is None or name == "dev" else trips()
            for _ in range(dev_runs if name == "dev" else runs):
                t0 = time.perf_counter()
                fn()
                ms.append((time.perf_counter() - t0) * 1000)
            rnd[name] = {"p50": round(percentile(ms, 50), 3), "p99": round(percentile(ms, 99), 3)}
            if before is not None and trips is not None:
                time.sleep(0.05)  # the server's worker puts the thread back after the run's end
                rnd[name]["trips"] = round((trips() - before) / runs, 2)
        rnd["ratio"] = round(rnd["http"]["p50"] / rnd["queue"]["p50"], 3)
        if "dev" in rnd:
            rnd["dev_ratio"] = round(rnd["dev"]["p50"] / rnd["http"]["p50"], 3)
        out["rounds"].append(rnd)
        dev_note = ""
        if "dev" in rnd:
            dev_note = f", langgraph dev p50 {rnd['dev']['p50']:.2f} ms ({rnd['dev_ratio']:.1f}x ours)"
        print(f"overhead round {len(out['rounds'])}: queue p50 {rnd['queue']['p50']:.2f} ms, "
              f"http p50 {rnd['http']['p50']:.2f} ms ({rnd['ratio']:.2f}x){dev_note}", flush=True)  # fmt: skip
    return out


# ---- 2. SSE fan-out --------------------------------------------------------------------------------


def fanout(base: str, pid: int, clients: int, events: int, gap_ms: float) -> dict[str, Any]:
    from langgraph_sdk import get_sync_client

    sdk = get_sync_client(url=base, api_key=TOKEN)
    tid = sdk.threads.create()["thread_id"]
    lead_ms = 1500 + 20 * clients  # every client is following before the first event
    conf = {"configurable": {"events": events, "gap_ms": gap_ms, "lead_ms": lead_ms}}
    run = sdk.runs.create(tid, "events", input={"log": []}, config=conf, stream_mode="custom")
    path = f"/threads/{tid}/runs/{run['run_id']}/stream"

    async def follow(http: httpx.AsyncClient) -> tuple[int, list[float], bool]:
        got, lat, event = 0, [], ""
        async with http.stream("GET", path) as r:
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event.startswith("custom"):
                    now = time.time()
                    got += 1
                    lat.append((now - json.loads(line[6:])["t"]) * 1000)
        ended = r.status_code == 200  # the stream ends with the run (LangGraph's server sends no end event)
        return got, lat, ended

    async def main() -> list[tuple[int, list[float], bool]]:
        limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits, headers={"x-api-key": TOKEN}) as http:
            return await asyncio.gather(*(follow(http) for _ in range(clients)))

    cpu0, t0 = proc_cpu_seconds(pid), time.perf_counter()
    results = asyncio.run(main())
    cpu1, wall = proc_cpu_seconds(pid), time.perf_counter() - t0
    lat = [x for _, ls, _ in results for x in ls]
    return {
        "clients": clients,
        "events": events,
        "every_event": sum(1 for got, _, ended in results if got == events and ended),
        "received": sum(got for got, _, _ in results),
        "latency_ms": {
            "p50": round(percentile(lat, 50), 2),
            "p99": round(percentile(lat, 99), 2),
            "max": round(max(lat), 2),
        }
        if lat
        else None,
        "server_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 3),
        "wall_s": round(wall, 2),
        "lead_ms": lead_ms,
    }


# ---- 3. the dashboard ------------------------------------------------------------------------------


def _fill(url: str, namespace: str, tasks: int) -> float:
    store = CheckpointStore(redis.Redis.from_url(url), namespace=namespace)
    t0 = time.perf_counter()
    for i in range(tasks):
        store.create(Checkpoint(f"agent-{i:06d}"))
    return time.perf_counter() - t0


def dashboard(url: str, base: str, namespace: str, probes: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("AGENTSTATE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no Chromium: install Debian's chromium package (or set AGENTSTATE_CHROMIUM)")
    admin = redis.Redis.from_url(url)
    store = CheckpointStore(redis.Redis.from_url(url), namespace=namespace)
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", 100_000)
    admin.slowlog_reset()
    out: dict[str, Any] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            # The page's CSP forbids eval, which is how Playwright runs its probes: bypassed for them.
            # With a token every read needs it: the key on every request, as an API client sends it
            # (the login form's session is what tests/test_dashboard.py goes through).
            page = browser.new_context(bypass_csp=True, extra_http_headers={"x-api-key": TOKEN}).new_page()
            t0 = time.perf_counter()
            page.goto(base + "/")
            page.wait_for_function("document.querySelectorAll('#by-status tbody tr').length > 0", timeout=60_000)
            out["first_frame_ms"] = round(page.evaluate("performance.now()"), 1)
            out["first_frame_wall_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            fcp = page.evaluate("(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null")
            out["first_paint_ms"] = None if fcp is None else round(fcp, 1)
            lat: list[float] = []
            for i in range(probes):
                task = f"probe-{i}"
                time.sleep(random.uniform(0.2, 1.2))  # anywhere in the collector's 1 s beat
                t = time.time()
                store.create(Checkpoint(task))
                store.claim(task, 1, token="bench", lease_ms=60_000)
                seen = page.wait_for_function(
                    f"[...document.querySelectorAll('#leases tbody tr')].some(r => r.cells[0].textContent === "
                    f"{json.dumps(task)}) && Date.now()", polling="raf", timeout=30_000
                ).json_value()  # fmt: skip
                lat.append(float(seen) - t * 1000)
            out["update_ms"] = {"p50": round(statistics.median(lat), 1), "max": round(max(lat), 1), "n": len(lat)}
        finally:
            browser.close()
    entries = admin.slowlog_get(100_000)
    worst = max(entries, key=lambda e: e["duration"]) if entries else None
    out["commands_logged"] = len(entries)
    out["sweep_every_s"] = (
        httpx.get(f"{base}/dashboard/api/frame?ns={namespace}", timeout=30, headers={"x-api-key": TOKEN})
        .json()
        .get("sweep_every_s")
    )
    out["slowest_us"] = None if worst is None else int(worst["duration"])
    out["slowest_command"] = None if worst is None else _command_name(worst["command"])
    admin.config_set("slowlog-log-slower-than", 10_000)
    return out


def _command_name(command: Any) -> str:
    words = command.decode("utf-8", "replace").split() if isinstance(command, bytes) else str(command).split()
    if words and words[0].upper() == "EVALSHA" and len(words) > 1:
        from redis_agentstate.wire import scripts

        for name in (n for n in dir(scripts) if n.endswith("_SCRIPTS")):  # the script's name, by its sha
            for op in getattr(scripts, name):
                if _sha1(scripts.script_text(op)) == words[1]:
                    return f"EVALSHA {op}"
    return " ".join(words[:1])


def _sha1(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode()).hexdigest()


# ---- the run -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="smoke preset: tiny sizes")
    p.add_argument("--rounds", type=int, help="overhead: interleaved rounds (default 7; --quick 2)")
    p.add_argument("--runs", type=int, help="overhead: runs per path per round (default 50; --quick 10)")
    p.add_argument("--clients", type=int, help="fan-out: SSE clients on one run (default 100; --quick 10)")
    p.add_argument("--events", type=int, help="fan-out: events of the run (default 200; --quick 20)")
    p.add_argument("--gap-ms", type=float, default=10.0, help="fan-out: ms between two events (default 10)")
    p.add_argument("--tasks", type=int, help="dashboard: tasks in the namespace (default 100000; --quick 500)")
    p.add_argument("--probes", type=int, help="dashboard: update-latency probes (default 10; --quick 2)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory of serve.json (default %(default)s)")
    p.add_argument("--readme", action="store_true", help="rewrite the serve block of benchmarks/README.md")
    p.add_argument("--langgraph-dev", default=os.environ.get("AGENTSTATE_LANGGRAPH_DEV"), metavar="CMD",
                   help="overhead: the `langgraph` command of langgraph-cli[inmem], to time runs.wait against "
                   "`langgraph dev` side by side (default $AGENTSTATE_LANGGRAPH_DEV; none: not timed)")  # fmt: skip
    p.add_argument("--dev-runs", type=int, help="overhead: langgraph dev runs per round (default 10; --quick 3)")
    args = p.parse_args(argv)
    q = args.quick
    params: dict[str, Any] = {
        "quick": q,
        "rounds": args.rounds or (2 if q else 7),
        "runs": args.runs or (10 if q else 50),
        "clients": args.clients or (10 if q else 100),
        "events": args.events or (20 if q else 200),
        "gap_ms": args.gap_ms,
        "tasks": args.tasks if args.tasks is not None else (500 if q else 100_000),
        "probes": args.probes or (2 if q else 10),
        "dev_runs": args.dev_runs or (3 if q else 10),
        "langgraph_api": _version_of(args.langgraph_dev, "langgraph-api") if args.langgraph_dev else None,
        "cores": os.cpu_count(),
    }
    server = start_embedded(prefer="redis-server")
    namespace = f"bench-serve-{uuid.uuid4().hex[:6]}"
    data: dict[str, Any] = {}
    try:
        admin = redis.Redis.from_url(server.url)
        meta = run_meta(command_line(f"python -m {MODULE}", argv), admin)
        data["fill_s"] = round(_fill(server.url, namespace, params["tasks"]), 1)
        trips_file = os.path.join(tempfile.mkdtemp(prefix="serve-trips-"), "trips")
        ours = count_round_trips()

        def trips() -> int:  # this process's round trips and the server's (its count, written after now)
            return ours() + counted_trips(trips_file, time.time())

        with contextlib.ExitStack() as stack:
            base, proc = stack.enter_context(_server(server.url, namespace, trips_file))
            dev = stack.enter_context(_dev_server(args.langgraph_dev)) if args.langgraph_dev else None
            sections: dict[str, Callable[[], Any]] = {
                "overhead": lambda: overhead(
                    server.url, base, namespace, params["rounds"], params["runs"], dev, params["dev_runs"], trips
                ),
                "fanout": lambda: fanout(base, proc.pid, params["clients"], params["events"], args.gap_ms),
                "dashboard": lambda: dashboard(server.url, base, namespace, params["probes"]),
            }
            for name, measure in sections.items():
                t0 = time.perf_counter()
                data[name] = measure()
                print(f"[benchmarks] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        server.stop()
    results = {"schema": 1, "meta": finish_meta(meta), "standalone": {"name": NAME, "data": data, "params": params}}
    results = json.loads(json.dumps(results))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{NAME}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(markdown(results["standalone"]["data"], results["standalone"]["params"]))
    print(f"[benchmarks] wrote {path}", file=sys.stderr)
    if args.readme:
        for block, body in report.blocks(results, []).items():
            report.write_block(results["meta"], block, body)
    return 0


# ---- the block -----------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return float(statistics.median(values))


def markdown(data: dict[str, Any], params: dict[str, Any]) -> str:
    o, f, d = data["overhead"], data["fanout"], data["dashboard"]
    rounds = o["rounds"]

    def cell(path: str, key: str) -> str:
        vals = [r[path][key] for r in rounds]
        return f"{_med(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    def trips(path: str) -> str:
        vals = [r[path]["trips"] for r in rounds if "trips" in r[path]]
        return f"{_med(vals):.1f}" if vals else "-"

    ratios = [r["ratio"] for r in rounds]
    ratio = _med(ratios)
    dev_rows: list[str] = []
    dev_notes = ["- C: not run (no `--langgraph-dev`, `$AGENTSTATE_LANGGRAPH_DEV`)."]
    if all("dev" in r for r in rounds):
        version = params.get("langgraph_api") or "?"
        dev_rows = [f"| C: the same `client.runs.wait` through `langgraph dev` (langgraph-api {version}, in memory; "
                    f"{params['dev_runs']} runs a round) | {cell('dev', 'p50')} | {cell('dev', 'p99')} "
                    "| - |"]  # fmt: skip
        dev_ratio = _med([r["dev_ratio"] for r in rounds])
        lo, hi = min(r["dev_ratio"] for r in rounds), max(r["dev_ratio"] for r in rounds)
        dev_notes = [f"- C / B, median of the rounds' p50 ratios: **{dev_ratio:.1f}x** (`agentstate serve` is that "
                     f"many times faster than `langgraph dev` here; min-max {lo:.1f}-{hi:.1f}x)."]  # fmt: skip
    lat = f["latency_ms"] or {}
    cpu = f["server_cpu_s"]
    upd = d["update_ms"]
    cpu_cell = "-" if cpu is None else f"{cpu:.2f} s in {f['wall_s']:.1f} s"
    fp = d["first_paint_ms"]
    lines = [
        "One private redis-server; `agentstate serve` as a subprocess with one in-process `GraphWorker` per "
        "graph; the client, the server and Redis share the machine's "
        f"{params['cores']} cores.",
        "",
        f"**API overhead.** The 3-node graph, each run on a fresh thread; {len(rounds)} interleaved rounds of "
        f"{params['runs']} runs per path; ms per run, median (min-max) over rounds; the server's worker executes "
        "both paths' runs. Round trips: the commands and pipelines written to Redis per run, by the client and "
        "the server (its worker's included), median over rounds.",
        "",
        "| path | p50 ms | p99 ms | round trips per run |",
        "| --- | --- | --- | --- |",
        f"| A: `RunQueue.create` + `RunQueue.join`, straight to Redis | {cell('queue', 'p50')} | "
        f"{cell('queue', 'p99')} | {trips('queue')} |",
        f"| B: `langgraph-sdk` `client.runs.wait` through `agentstate serve` | {cell('http', 'p50')} | "
        f"{cell('http', 'p99')} | {trips('http')} |",
        *dev_rows,
        "",
        f"- B / A, median (p10-p90) of the rounds' p50 ratios: {ratio:.2f}x ({percentile(ratios, 10):.2f}-"
        f"{percentile(ratios, 90):.2f}).",
        *dev_notes,
        "",
        f"**SSE fan-out.** {f['clients']} clients follow one run's stream (`GET /threads/{{t}}/runs/{{r}}/stream`) "
        f"while it emits {f['events']} custom events {params['gap_ms']:g} ms apart.",
        "",
        "| clients with every event, stream closed cleanly | events received | latency p50 / p99 / max, ms | "
        "server CPU over the run |",
        "| --- | --- | --- | --- |",
        f"| {f['every_event']} of {f['clients']} | {f['received']:,} of {f['clients'] * f['events']:,} | "
        f"{lat.get('p50', '-')} / {lat.get('p99', '-')} / {lat.get('max', '-')} | "
        f"{cpu_cell} |",
        "",
        f"**The dashboard** in Chromium, on a namespace of {params['tasks']:,} tasks (created in "
        f"{data['fill_s']:.0f} s before the server started).",
        "",
        "| first contentful paint | first frame rendered (status table filled) | update latency, task claimed "
        "in Redis -> its lease row visible, p50 (max) | slowest command Redis ran meanwhile |",
        "| --- | --- | --- | --- |",
        f"| {'-' if fp is None else f'{fp:.0f} ms'} | {d['first_frame_ms']:.0f} ms | "
        f"{upd['p50']:.0f} ms ({upd['max']:.0f} ms), {upd['n']} probes | "
        f"{d['slowest_us']} µs ({d['slowest_command']}), of {d['commands_logged']:,} logged |",
        "",
        f"- The update latency is bounded by the collector's beat: a frame a second per namespace, however "
        f"many pages watch, and the leases come from its status sweep, which ran every {d['sweep_every_s']} s "
        "here (4 times its own length, at least 1 s: docs/serve.md).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
