"""benchmarks/README.md reads by question: no issue numbers, every table in a block its command wrote.

Each results block opens with the header line of the run that wrote it (command, date, commit,
machine, load), and its body is exactly what the harness renders from the run's saved JSON in
``benchmarks/results/`` (so no table is edited by hand or left behind by a renderer change).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
README = BENCH / "README.md"
ISSUE = re.compile(r"\bissues?[\s#-]*\d+", re.I)
#: Blocks the main harness writes from results/latest.json; every other block NAME has results/NAME.json.
MAIN = {"single", "floor", "history", "payload", "concurrency", "pools", "profile"}


def _blocks() -> dict[str, str]:
    text = README.read_text("utf-8")
    found = [(m["name"], m["body"]) for m in report.BLOCK_RE.finditer(text)]
    names = [n for n, _ in found]
    assert len(names) == len(set(names)), f"a block appears twice: {names}"
    return dict(found)


def test_no_issue_numbers_in_the_benchmark_pages() -> None:
    for page in sorted(BENCH.glob("*.md")):
        hits = [line for line in page.read_text("utf-8").splitlines() if ISSUE.search(line)]
        assert hits == [], f"{page.name} names issue numbers: {hits}"


def test_the_issue_pattern_catches_what_it_should() -> None:
    for text in ("Issue 11 part 3", "issue 13", "(issue-11)", "issues #12", "Issue11"):
        assert ISSUE.search(text), text
    for text in ("no issues here", "tissue 3D", "issued 3 tokens"):
        assert not ISSUE.search(text), text


def test_every_marker_pairs_up_into_a_block() -> None:
    text = README.read_text("utf-8")
    begins = re.findall(r"<!-- results:([\w-]+):begin ", text)
    ends = re.findall(r"<!-- results:([\w-]+):end -->", text)
    assert begins == ends and set(begins) == set(_blocks())
    # The markers of the page before it read by question are gone.
    assert not re.search(r"<!-- (results|langgraph|telemetry):(begin|end)\b", text)


def test_every_block_opens_with_its_command_date_commit_machine_and_load() -> None:
    blocks = _blocks()
    assert MAIN | {"scale", "telemetry", "langgraph", "pool_scale", *report.STANDALONE} <= set(blocks)
    for name, body in blocks.items():
        first = body.splitlines()[0]
        m = report.HEADER_RE.match(first)
        assert m, f"block {name!r} has no header line: {first!r}"


@pytest.mark.parametrize("name", sorted(_blocks()))
def test_each_block_is_what_its_saved_run_renders_to(name: str) -> None:
    body = _blocks()[name]
    source = BENCH / "results" / ("latest.json" if name in MAIN else f"{name}.json")
    results = json.loads(source.read_text("utf-8"))
    first, _, table = body.partition("\n\n")
    header = report.HEADER_RE.match(first)
    assert header, first
    meta = results["meta"]
    assert (header["command"], header["date"]) == (meta["command"], meta["started"]), source.name
    assert header["commit"].removesuffix("-dirty") == meta["git"]["commit"]
    drawn = results.get("plots")
    rendered = report.blocks(results, drawn if isinstance(drawn, list) else [])
    assert table.rstrip() == rendered[name].rstrip(), f"block {name!r} differs from {source.name} rendered"


def test_write_block_replaces_one_block_and_keeps_the_rest(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text(
        "# Page\n\nprose\n\n"
        f"{report.begin_marker('a')}\nold a\n{report.end_marker('a')}\n\nmore prose\n\n"
        f"{report.begin_marker('b')}\nold b\n{report.end_marker('b')}\n",
        "utf-8",
    )
    meta = {
        "command": "python -m benchmarks.thing --readme",
        "started": "2026-12-02 04:00 UTC",
        "git": {"commit": "abc1234", "dirty": True},
        "machine": {"cpu": "CPU", "cores": 2, "os": "Linux 6", "python": "3.11.7"},
        "load": {"start": 1.5, "end": 2.0},
        "duration_s": 12.0,
    }
    report.write_block(meta, "a", "| x |\n| --- |\n| 1 |\n", str(page))
    text = page.read_text("utf-8")
    body = dict((m["name"], m["body"]) for m in report.BLOCK_RE.finditer(text))
    assert body["b"] == "old b" and "more prose" in text and "old a" not in text
    head = report.HEADER_RE.match(body["a"].splitlines()[0])
    assert head and head["commit"] == "abc1234-dirty" and head["date"] == "2026-12-02 04:00 UTC"
    assert head["command"] == "python -m benchmarks.thing --readme" and "1.50 at the start" in head["load"]


def test_report_from_a_standalone_run_rewrites_its_block(tmp_path: Path) -> None:
    """``python -m benchmarks.report --from results/NAME.json`` re-renders a standalone command's block
    (it used to fail on the main harness's ``figures``, which such a run does not have)."""
    copy = tmp_path / "README.md"
    copy.write_text(README.read_text("utf-8"), "utf-8")
    assert report.main(["--from", str(BENCH / "results" / "steps.json"), "--readme", str(copy)]) == 0
    assert copy.read_text("utf-8") == README.read_text("utf-8")
