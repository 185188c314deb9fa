"""Every ```python block of README.md runs as written, twice, against a private server; and the
operator commands of its ```sh CLI block parse and run. So the README cannot rot."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_agentstate import Checkpoint, CheckpointStore
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


def run_block(code: str, tmp_path: Path, url: str | None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "block.py"
    script.write_text(code, "utf-8")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if url is not None:
        env["REDIS_URL"] = url
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )


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
    proc = run_block(
        code + "\nfrom redis_agentstate.embedded import env_or_private_url as f\nprint(f())\n", tmp_path, None
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    used = proc.stdout.splitlines()[-1]
    assert used.startswith("redis://127.0.0.1:") and used != private_server.url
    assert witness.dbsize() == 0
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(used, socket_connect_timeout=1).ping()  # stopped at exit


def cli_commands() -> list[str]:
    """The ``agentstate ...`` lines of the README's ```sh blocks, comments dropped."""
    commands = []
    for _, body in blocks("sh"):
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("agentstate "):
                commands.append(line)
    return commands


def test_every_cli_command_in_the_readme_parses() -> None:
    commands = cli_commands()
    assert len(commands) >= 4
    for command in commands:
        argv = shlex.split(command)[1:]
        args = build_parser().parse_args(argv)  # SystemExit(2) on an unknown flag or command
        assert callable(args.func), command


@pytest.mark.real
def test_every_cli_command_in_the_readme_runs(private_server: Any) -> None:
    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace="agentstate", max_attempts=1)
    store.create(Checkpoint("TASK"))
    # Parked, so `list --parked` has a row and `requeue TASK` something to requeue.
    claim = store.claim("TASK", 1, token="readme", lease_ms=30_000)
    store.release("TASK", token="readme", expected_revision=claim.revision, reason="ValueError: readme")
    from redis_agentstate.pool_models import PoolConfig
    from redis_agentstate.pools import PoolStore

    pools = PoolStore(client, namespace="agentstate")
    pools.open("POOL", PoolConfig())
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    for command in cli_commands():
        argv = shlex.split(command.replace("redis://host:6379/0", private_server.url))[1:]
        argv = [private_server.url if a == "..." else a for a in argv]
        if "watch" in argv:
            argv += ["--once"]  # the README's watch follows forever; print what is there and stop
            argv[argv.index("--from") + 1] = "0"
        proc = subprocess.run(
            [sys.executable, "-m", "redis_agentstate", *argv], capture_output=True, text=True, timeout=60, env=env
        )
        assert proc.returncode == 0, f"{command}: {proc.stdout}{proc.stderr}"
