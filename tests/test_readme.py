"""Every ```python block of README.md runs as written, twice, against a private server; its
commands parse, its links resolve, and it stays a newcomer's page. So the README cannot rot.
(The operator commands live in the docs, where ``tests/test_docs.py`` runs them.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import redis
from fork_support import run_python

from redis_agentstate.cli import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[a-z]*)\n(?P<body>.*?)^(?P=indent)```$", re.M | re.S)


def blocks(lang: str, path: Path = README) -> list[tuple[str, str]]:
    """``(id, code)`` of every ``lang`` block of ``path``, the id naming the section it sits in."""
    text = path.read_text("utf-8")
    found = []
    for m in FENCE.finditer(text):
        if m.group("lang") != lang:
            continue
        heading = re.findall(r"^#+ (.+)$", text[: m.start()], re.M)
        section = re.sub(r"[^a-z0-9]+", "-", (heading[-1] if heading else "top").lower()).strip("-")
        found.append((f"{section}@{text[: m.start()].count(chr(10)) + 1}", m.group("body")))
    return found


PYTHON_BLOCKS = blocks("python")


def test_the_readme_has_the_blocks_this_file_runs() -> None:
    # Catches a block whose fence stopped matching (it would silently stop being run).
    assert len(PYTHON_BLOCKS) == README.read_text("utf-8").count("```python") >= 4


def run_block(code: str, tmp_path: Path, url: str | None, *, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """``python block.py`` in ``tmp_path``: a process of its own, forked from a zygote that imported the
    package once (tests/fork_support.py), or a new interpreter with ``fresh``."""
    script = tmp_path / "block.py"
    script.write_text(code, "utf-8")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if url is not None:
        env["REDIS_URL"] = url
    return run_python([str(script)], timeout=120, env=env, cwd=tmp_path, fresh=fresh)


@pytest.mark.real
@pytest.mark.parametrize("code", [pytest.param(code, id=name) for name, code in PYTHON_BLOCKS])
def test_python_block_runs_twice(code: str, private_server: Any, tmp_path: Path) -> None:
    for run in (1, 2):
        proc = run_block(code, tmp_path, private_server.url)
        assert proc.returncode == 0, f"run {run}:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.real
def test_python_blocks_without_redis_url_use_a_private_server_and_stop_it(private_server: Any, tmp_path: Path) -> None:
    # The block that writes most (the checkpoint one), with no REDIS_URL: it must not touch a Redis
    # the reader runs (here: the private server stands in for it), and must stop its own server.
    witness = redis.Redis.from_url(private_server.url)
    code = next(code for name, code in PYTHON_BLOCKS if name.startswith("checkpoints@"))
    # A new interpreter, as a reader's run: the embedded server's start, and its stop at exit.
    code += "\nfrom redis_agentstate.embedded import env_or_private_url as f\nprint(f())\n"
    proc = run_block(code, tmp_path, None, fresh=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    used = proc.stdout.splitlines()[-1]
    assert used.startswith("redis://127.0.0.1:") and used != private_server.url
    assert witness.dbsize() == 0
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(used, socket_connect_timeout=1).ping()  # stopped at exit


def cli_commands(path: Path = README) -> list[str]:
    """Every ``agentstate ...`` invocation of ``path``'s ```sh blocks (``.venv/bin/agentstate demo`` at
    the end of a ``&&`` chain too), comments dropped."""
    commands = []
    for _, body in blocks("sh", path):
        for line in body.splitlines():
            for part in line.split("#", 1)[0].split("&&"):
                m = re.match(r"^(?:\S*/)?(agentstate\s.*)$", part.strip())
                if m:
                    commands.append(m.group(1).strip())
    return commands


def test_the_readmes_commands_parse() -> None:
    commands = cli_commands()
    assert "agentstate demo" in commands  # the first of the two commands
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])  # SystemExit(2) on an unknown flag or command
        assert callable(args.func), command


def test_the_readme_is_a_newcomers_page() -> None:
    # What it is, the two commands, one example per store, links: the rest lives in docs/.
    size = len(README.read_bytes())
    assert size < 14_000, f"README.md is {size} bytes: move the details into the docs site (docs/)"
    sections = {name.split("@")[0] for name, _ in PYTHON_BLOCKS}
    assert {"checkpoints", "leases-and-the-runner", "pools", "key-value", "langgraph-checkpointer"} <= sections
    text = README.read_text("utf-8")
    test_command = ".venv/bin/python -m pytest"
    assert text.count(test_command) == 1, "the test command is stated once, in 'The two commands'"


def _slugs(page: Path) -> set[str]:
    """The heading ids of a docs page, as Markdown's toc extension makes them (or ``{#id}``); written
    out here because the test extra does not install Markdown."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text("utf-8"), re.M):
        explicit = re.search(r"\{#([\w-]+)\}\s*$", heading)
        text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
        slug = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())
        found.add(explicit.group(1) if explicit else slug)
    return found


def test_every_link_of_the_readme_resolves() -> None:
    text = README.read_text("utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 10
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = README.parent / path
        assert target.is_file(), f"README links to a missing file: {link}"
        if anchor:
            assert anchor in _slugs(target), f"README links to a missing heading: {link}"
