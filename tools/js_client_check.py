"""LangChain's JavaScript client against ``agentstate serve`` and ``langgraph dev``, side by side.

Runs ``tools/js_client/check.mjs`` (``@langchain/langgraph-sdk``, the version pinned in
``tools/js_client/package.json``; ``npm install`` there on first use) against both servers,
serving the same graphs (``tools/js_client/graphs.py``), and prints each call's outcome on
each server, then N of M for both. Ours runs on a private redis-server (started on a free port)
or ``--url``; ``langgraph dev`` comes from ``pip install "langgraph-cli[inmem]"`` (``--langgraph``,
``$AGENTSTATE_LANGGRAPH_DEV`` or ``langgraph`` on ``PATH``; ``--ours-only`` skips it).

    python tools/js_client_check.py [--langgraph PATH] [--ours-only] [--json]

Exit status 1 when a call passes on ``langgraph dev`` and fails on ours.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent / "js_client"
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import servers  # noqa: E402  (the repository's root, when this runs as a script)

GRAPHS = ("steps", "slow", "ask", "chat")


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    port = servers.free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d],
            stdout=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                    break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def ensure_client() -> None:
    """``npm install`` in ``tools/js_client`` unless every package of its ``package.json`` is there."""
    wanted = json.loads((HERE / "package.json").read_text())["dependencies"]
    if not all((HERE / "node_modules" / name / "package.json").is_file() for name in wanted):
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True)


def run_check(url: str, token: str = "") -> list[dict[str, object]]:
    done = subprocess.run(["node", "check.mjs", url, token], cwd=HERE, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not rows:
        raise SystemExit(f"check.mjs printed nothing: {done.stderr[-2000:]}")
    return rows


#: Without a token agentstate serve is read-only (loopback, no writes): the check writes.
TOKEN = uuid.uuid4().hex


@contextlib.contextmanager
def ours(redis: str) -> Iterator[str]:
    graphs = {g: f"graphs:{g}" for g in GRAPHS}
    namespace = f"js-{uuid.uuid4().hex[:8]}"
    with servers.agentstate_serve(redis, graphs, namespace=namespace, token=TOKEN, pythonpath=[HERE]) as (url, _):
        yield url


def dev(langgraph: str) -> contextlib.AbstractContextManager[str]:
    """``langgraph dev`` on ``js_client/langgraph.json``'s graphs."""
    spec = json.loads((HERE / "langgraph.json").read_text())
    graphs = {name: str(HERE / ref) for name, ref in spec["graphs"].items()}
    return servers.langgraph_dev(langgraph, graphs, [HERE])


def run_both(redis: str | None, langgraph: str | None) -> dict[str, list[dict[str, object]]]:
    """Each server's rows (``check.mjs``'s lines): ours on ``redis`` (None: a private server), then
    ``langgraph dev`` when ``langgraph`` names its command."""
    ensure_client()
    results: dict[str, list[dict[str, object]]] = {}
    with redis_url(redis) as url_of_redis, ours(url_of_redis) as url:
        results["agentstate serve"] = run_check(url, TOKEN)
    if langgraph:
        with dev(langgraph) as url:
            results["langgraph dev"] = run_check(url)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="Redis URL for agentstate serve (default: a private redis-server)")
    p.add_argument("--langgraph", default=os.environ.get("AGENTSTATE_LANGGRAPH_DEV") or shutil.which("langgraph"))
    p.add_argument("--ours-only", action="store_true", help="do not run langgraph dev")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = p.parse_args(argv)
    if not a.ours_only and not a.langgraph:
        raise SystemExit("langgraph dev not found: --langgraph PATH, or --ours-only")
    results = run_both(a.url, None if a.ours_only else a.langgraph)
    if a.json:
        print(json.dumps(results, indent=1))
    names = [str(r["name"]) for r in results["agentstate serve"]]
    servers = list(results)
    by = {s: {str(r["name"]): r for r in rows} for s, rows in results.items()}
    print("| call | " + " | ".join(servers) + " |")
    print("|---" * (len(servers) + 1) + "|")
    for n in names:
        cells = []
        for s in servers:
            r = by[s].get(n, {})
            cells.append(f"ok {r.get('ms')} ms" if r.get("ok") else f"FAIL: {r.get('error', 'not run')}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    for s in servers:
        print(f"{s}: {sum(1 for r in results[s] if r['ok'])} of {len(results[s])}")
    if "langgraph dev" in by:
        worse = [n for n in names if by["langgraph dev"][n].get("ok") and not by["agentstate serve"][n].get("ok")]
        if worse:
            print("passes on langgraph dev, fails on ours: " + ", ".join(worse))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
