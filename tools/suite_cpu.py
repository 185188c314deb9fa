"""Where the test suite's CPU goes: each test's CPU, its own process's and its reaped children's.

As a pytest plugin it appends one row per test to ``$SUITE_CPU_DIR/<xdist worker>-<pid>.tsv``
(node id, self CPU-s, children CPU-s, wall s)::

    PYTHONPATH=tools SUITE_CPU_DIR=/tmp/suite-cpu AGENTSTATE_FULL_SUITE=1 python -m pytest -p suite_cpu

and ``python tools/suite_cpu.py /tmp/suite-cpu`` sums the rows by file and by backend (the
``[fake…]``, ``[real…]`` and ``[cluster…]`` variants). Children are counted when they are reaped:
a session-scoped server's CPU lands on the test whose teardown stopped it, so read the children
column by file with that in mind. `.ci/run`'s CPU floor (its CPU-s over the two cores) is what
issue 39's closing notes quote against its 15 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import time
from collections import defaultdict
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any, TextIO

import pytest

__all__ = ["Row", "main", "read_rows", "summarize"]

Row = tuple[str, float, float, float]
_out: TextIO | None = None


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    global _out
    if _out is None:
        folder = Path(os.environ.get("SUITE_CPU_DIR", "suite-cpu"))
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.tsv"
        _out = (folder / name).open("a", encoding="utf-8")
    me0, kids0 = _cpu()
    t0 = time.monotonic()
    yield
    me1, kids1 = _cpu()
    _out.write(f"{item.nodeid}\t{me1 - me0:.3f}\t{kids1 - kids0:.3f}\t{time.monotonic() - t0:.3f}\n")
    _out.flush()


def read_rows(folder: Path) -> list[Row]:
    rows: list[Row] = []
    for path in sorted(folder.glob("*.tsv")):
        for line in path.read_text("utf-8").splitlines():
            node, me, kids, wall = line.split("\t")
            rows.append((node, float(me), float(kids), float(wall)))
    return rows


def summarize(rows: Iterable[Row], top: int = 30) -> str:
    """A table of the files with the most CPU, then the totals by backend."""
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    by_backend: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    total = [0.0, 0.0, 0.0, 0]
    for node, me, kids, wall in rows:
        f = by_file[node.split("::")[0]]
        f[0], f[1], f[2], f[3] = f[0] + me, f[1] + kids, f[2] + wall, f[3] + 1
        kind = re.search(r"\[(fake|real|cluster)\b", node)
        b = by_backend[kind.group(1) if kind else "none"]
        b[0], b[1], b[2] = b[0] + me, b[1] + kids, b[2] + 1
        total = [total[0] + me, total[1] + kids, total[2] + wall, total[3] + 1]
    lines = [
        f"{int(total[3])} tests: {total[0]:.0f} CPU-s in the test processes, {total[1]:.0f} in their reaped "
        f"children, {total[2]:.0f} s of test wall time summed over workers",
        "",
        "| file | self CPU-s | children CPU-s | wall s | tests |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    ranked = sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]
    lines += [f"| {name} | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.1f} | {int(v[3])} |" for name, v in ranked]
    lines += ["", "| backend | self CPU-s | children CPU-s | tests |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {k} | {v[0]:.1f} | {v[1]:.1f} | {int(v[2])} |" for k, v in sorted(by_backend.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sum the rows the suite_cpu plugin wrote.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    print(summarize(read_rows(args.folder), args.top))


if __name__ == "__main__":
    main()
