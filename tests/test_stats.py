"""``agentstate stats``: shard counters, the memory estimate, the eviction warning, ``--watch``.

Store tests run on {fakeredis, redis-server, Redis Cluster} x {sync, async}
(``store``/``make``); the CLI runs on the real server and the Cluster (it needs
a URL); the eviction warning on private servers started with the policy under
test (``--maxmemory-policy allkeys-lru`` ...).
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import RedisServerProcess

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    AsyncPoolStore,
    Checkpoint,
    CheckpointStore,
    PoolStore,
    TaskParked,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.commands import stats_view as _stats_view
from redis_agentstate.core.stats import counters, due_head, memory_estimate, parked_tasks, status_counts
from redis_agentstate.keys import Keys
from redis_agentstate.wire import eviction as _eviction

LEASE = 30_000


def totals(store: Any) -> dict[str, int]:
    return dict(store._run(counters(store._core.keys))[1])


def running(tid: str, **kw: Any) -> Checkpoint:
    return Checkpoint(tid, status=AgentStatus.RUNNING, messages=[{"role": "user", "content": f"task {tid}"}], **kw)


def url_and_flags(backend: Any) -> list[str]:
    if backend.kind == "cluster":
        return ["--url", f"redis://127.0.0.1:{backend.cluster.startup[1]}/0", "--cluster"]
    return ["--url", backend.url]


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which servers this process warned about (the warning is once per process)."""
    monkeypatch.setattr(_eviction, "_warned", set())


class TestCounters:
    def test_claims_commits_and_takeovers_are_counted(self, store: Any) -> None:
        assert totals(store) == {"claims": 0, "commits": 0, "takeovers": 0}
        for tid in ("a", "b", "c"):
            store.create(running(tid))
        a = store.claim("a", 1, token="wa", lease_ms=LEASE)
        assert totals(store) == {"claims": 1, "commits": 0, "takeovers": 0}
        assert store.claim("a", 1, token="wa", lease_ms=LEASE) is not None  # a re-send: not counted again
        assert totals(store)["claims"] == 1
        a.cycle_index = 1
        assert store.commit(a, token="wa", expected_revision=a.revision)
        assert not store.commit(a, token="wa", expected_revision=a.revision + 7)  # fenced: not counted
        assert totals(store) == {"claims": 1, "commits": 1, "takeovers": 0}
        b = store.claim("b", 1, token="wb", lease_ms=LEASE)
        b.cycle_index = 1
        assert store.commit_and_claim(b, token="wb", expected_revision=b.revision, lease_ms=LEASE) is not None
        assert totals(store) == {"claims": 3, "commits": 2, "takeovers": 0}
        # A lease that lapsed uncommitted, taken by another worker: a takeover.
        assert store.claim("c", 1, token="slow", lease_ms=50) is not None
        time.sleep(0.2)
        assert store.claim("c", 1, token="fast", lease_ms=LEASE) is not None
        assert totals(store) == {"claims": 5, "commits": 2, "takeovers": 1}
        # The same token coming back after its own lease lapsed (nobody claimed since) is neither a new
        # claim nor a takeover: the same attempt, as parking counts attempts (_common.lua).
        store.create(running("d"))
        assert store.claim("d", 1, token="same", lease_ms=50) is not None
        time.sleep(0.2)
        assert store.claim("d", 1, token="same", lease_ms=LEASE) is not None
        assert totals(store) == {"claims": 6, "commits": 2, "takeovers": 1}

    def test_a_released_cycle_claimed_by_another_is_not_a_takeover_a_lapse_is(self, store: Any) -> None:
        """A takeover is a claim that finds the attempt before it lapsed (no commit, no release):
        _common.lua's lapsed_reason. A release, with a reason (a failure) or without (a shutdown),
        hands the cycle over: the next worker's claim is a claim, not a takeover."""
        store.create(running("r"))
        a = store.claim("r", 1, token="wa", lease_ms=LEASE)
        assert store.release("r", token="wa", expected_revision=a.revision, after_ms=1, reason="ValueError: bad")
        time.sleep(0.05)
        b = store.claim("r", 1, token="wb", lease_ms=LEASE)
        assert b is not None
        assert totals(store) == {"claims": 2, "commits": 0, "takeovers": 0}
        assert store.release("r", token="wb", expected_revision=b.revision, after_ms=1)  # no reason: a shutdown
        time.sleep(0.05)
        assert store.claim_next(token="wc", lease_ms=50) is not None
        assert totals(store) == {"claims": 3, "commits": 0, "takeovers": 0}
        time.sleep(0.2)  # wc's lease lapses: no commit, no release (a SIGKILLed worker)
        d = store.claim_next(token="wd", lease_ms=LEASE)
        assert d is not None and d.last_failure is not None and "expired without a commit" in d.last_failure
        assert totals(store) == {"claims": 4, "commits": 0, "takeovers": 1}
        d.cycle_index = 1
        assert store.commit(d, token="wd", expected_revision=d.revision)
        assert totals(store) == {"claims": 4, "commits": 1, "takeovers": 1}

    def test_a_claim_that_parks_the_task_counts_nothing(self, make: Callable[..., Any]) -> None:
        """With max_attempts, the claim that would be one attempt too many parks the task instead:
        nobody holds the cycle, so it is neither a claim nor a takeover (``parked`` counts it)."""
        store = make(CheckpointStore, AsyncCheckpointStore, max_attempts=1)
        store.create(running("p"))
        assert store.claim("p", 1, token="w1", lease_ms=50) is not None
        time.sleep(0.2)
        with pytest.raises(TaskParked):
            store.claim("p", 1, token="w2", lease_ms=LEASE)
        assert store.claim_next(token="w3", lease_ms=LEASE) is None
        assert totals(store) == {"claims": 1, "commits": 0, "takeovers": 0}
        assert store._run(parked_tasks(store._core)).count == 1

    def test_claim_next_counts_and_spreads_over_shards(self, store: Any, raw: Any) -> None:
        ids = [f"t{i}" for i in range(12)]
        for tid in ids:
            store.create(running(tid))
        for i in range(12):
            cp = store.claim_next(token=f"w{i}", lease_ms=LEASE)
            cp.cycle_index = cp.claimed_cycle
            assert store.commit(cp, token=f"w{i}", expected_revision=cp.revision)
        assert totals(store) == {"claims": 12, "commits": 12, "takeovers": 0}
        keys = Keys(store.namespace)
        shards = {keys.shard_of(t) for t in ids}
        per_shard = [raw.hget(keys.shard_counters(s), "claims") for s in shards]
        assert sum(int(v) for v in per_shard) == 12  # one counter hash per shard, each its own slot

    def test_a_counter_key_of_another_type_never_fails_a_write(self, store: Any, raw: Any) -> None:
        store.create(running("x"))
        raw.set(Keys(store.namespace).task("x").counters, "not a hash")
        cp = store.claim("x", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        assert store.commit(cp, token="w", expected_revision=cp.revision)


class TestStatusPages:
    def test_counts_come_page_by_page_and_expired_entries_are_pruned(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore, terminal_ttl_ms=500)
        keys = Keys(store.namespace)
        same = [t for t in (f"p{i}" for i in range(400)) if keys.shard_of(t) == keys.shard_of("p0")][:7]
        for tid in same:
            store.create(running(tid))
        done = store.claim(same[0], 1, token="w", lease_ms=LEASE)
        done.cycle_index, done.status, done.terminal_result = 1, AgentStatus.COMPLETED, {"ok": 1}
        assert store.commit(done, token="w", expected_revision=done.revision)
        assert store.claim(same[1], 1, token="w", lease_ms=LEASE) is not None
        counts = store._run(status_counts(store._core, page=2))  # 7 tasks of one shard: 4 pages
        assert counts.tasks == 7 and counts.by_status == {"running": 6, "completed": 1}
        assert counts.live_leases == 1 and counts.claimable == 5
        deadline = time.monotonic() + 15
        while raw.exists(keys.task(same[0]).checkpoint) and time.monotonic() < deadline:
            time.sleep(0.05)
        counts = store._run(status_counts(store._core, page=2))
        assert counts.tasks == 6 and counts.by_status == {"running": 6}
        assert raw.zscore(keys.task(same[0]).tasks, same[0]) is None

    def test_cli_list_and_stats_skip_and_prune_expired_tasks(
        self, backend: Any, namespace: str, raw: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        if backend.kind == "fake":
            pytest.skip("the CLI needs a Redis URL")
        store = CheckpointStore(backend.sync_client(), namespace=namespace, terminal_ttl_ms=300)
        for tid in ("keep", "drop"):
            store.create(running(tid))
        cp = store.claim("drop", 1, token="w", lease_ms=LEASE)
        cp.cycle_index, cp.status, cp.terminal_result = 1, AgentStatus.FAILED, {"e": "x"}
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        keys = Keys(namespace).task("drop")
        deadline = time.monotonic() + 15
        while raw.exists(keys.checkpoint) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert raw.zscore(keys.tasks, "drop") is not None  # dangling until a reader meets it
        assert cli_mod.main(["stats", *url_and_flags(backend), "--namespace", namespace, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["tasks"] == 1 and data["by_status"] == {"running": 1}
        assert raw.zscore(keys.tasks, "drop") is None
        assert cli_mod.main(["list", *url_and_flags(backend), "--namespace", namespace, "--json"]) == 0
        assert [r["task_id"] for r in json.loads(capsys.readouterr().out)] == ["keep"]

    def test_due_head_is_the_longest_waiting(self, store: Any) -> None:
        store.create(running("first"))
        time.sleep(0.05)
        store.create(running("second"))
        _now, due, oldest = store._run(due_head(store._core.keys))
        assert due == 2 and oldest is not None and oldest[0] == "first" and oldest[1] >= 0


class TestMemory:
    def test_estimate_from_a_sample(self, store: Any, raw: Any, backend: Any) -> None:
        for i in range(40):
            store.create(running(f"m{i}", shared_state={"blob": "x" * 500}))
        est = store._run(memory_estimate(store._core.keys, 8))
        if backend.kind == "fake":
            # fakeredis has no MEMORY USAGE: no estimate, and the reason why.
            assert est.bytes is None and "MEMORY USAGE" in (est.unavailable or "")
            return
        assert est.unavailable is None
        assert est.kinds["tasks"]["count"] == 40 and 1 <= est.kinds["tasks"]["sampled"] <= 8
        keys = Keys(store.namespace)
        actual = sum(
            int(raw.memory_usage(k) or 0)
            for i in range(40)
            for k in (keys.task(f"m{i}").checkpoint, keys.task(f"m{i}").messages)
        )
        tasks_estimate = est.kinds["tasks"]["count"] * est.kinds["tasks"]["mean_bytes"]
        assert actual / 2 <= tasks_estimate <= actual * 2  # equal-sized tasks: the sample is close
        assert est.bytes is not None and est.bytes >= tasks_estimate + est.shard_bytes - 1

    def test_cli_prints_the_memory_line_labelled_as_an_estimate(
        self, backend: Any, namespace: str, store: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        if backend.kind == "fake":
            pytest.skip("the CLI needs a Redis URL")
        for i in range(10):
            store.create(running(f"c{i}"))
        assert cli_mod.main(["stats", *url_and_flags(backend), "--namespace", namespace]) == 0
        out = capsys.readouterr().out
        line = next(ln for ln in out.splitlines() if ln.startswith("memory: ~"))
        assert "estimate" in line and "not a full scan" in line and "10 tasks" in line
        assert cli_mod.main(["stats", *url_and_flags(backend), "--namespace", namespace, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["memory"]["estimated"] is True and data["memory"]["estimate_bytes"] > 0
        assert data["memory"]["kinds"]["tasks"]["count"] == 10


# ---- the eviction warning --------------------------------------------------------------------------


@pytest.fixture(params=["allkeys-lru", "volatile-lru"])
def evicting_server(request: pytest.FixtureRequest) -> Iterator[tuple[RedisServerProcess, str]]:
    try:
        server = RedisServerProcess.start("--maxmemory-policy", request.param)
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        pytest.skip(f"no redis-server: {exc}")
    yield server, str(request.param)
    server.stop()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "maxmemory-policy" in r.getMessage()
    ]


class TestEvictionWarning:
    def test_stores_log_it_once_at_first_use(
        self, evicting_server: tuple[RedisServerProcess, str], fresh_warnings: None,
        caplog: pytest.LogCaptureFixture, twin_loop: Any,
    ) -> None:  # fmt: skip
        import redis
        import redis.asyncio as aioredis

        server, policy = evicting_server
        caplog.set_level(logging.WARNING, logger="redis_agentstate")
        client = redis.Redis.from_url(server.url)
        store = CheckpointStore(client, namespace="ev")
        assert _warnings(caplog) == []  # not at construction: at first use
        store.create(running("a"))
        store.load("a")
        PoolStore(client, namespace="ev").list()
        CheckpointStore(client, namespace="other").list()
        aclient = aioredis.Redis.from_url(server.url)
        astore = AsyncCheckpointStore(aclient, namespace="ev")
        twin_loop.run_until_complete(astore.load("a"))
        twin_loop.run_until_complete(astore._eviction_check)  # it runs beside the caller
        twin_loop.run_until_complete(aclient.aclose())
        client.close()
        logged = _warnings(caplog)
        assert len(logged) == 1, logged
        assert policy in logged[0]
        if policy.startswith("allkeys"):
            assert "fencing revision" in logged[0]
        else:
            assert "TTL" in logged[0] and "Leases and fences carry no TTL" in logged[0]

    def test_async_store_logs_it_too(
        self, evicting_server: tuple[RedisServerProcess, str], fresh_warnings: None,
        caplog: pytest.LogCaptureFixture, twin_loop: Any,
    ) -> None:  # fmt: skip
        import redis.asyncio as aioredis

        server, policy = evicting_server
        caplog.set_level(logging.WARNING, logger="redis_agentstate")
        aclient = aioredis.Redis.from_url(server.url)
        pools = AsyncPoolStore(aclient, namespace="ev")
        twin_loop.run_until_complete(pools.list())
        assert pools._eviction_check is not None
        twin_loop.run_until_complete(pools._eviction_check)  # beside the caller: never delays its result
        twin_loop.run_until_complete(pools.list())
        assert len(_warnings(caplog)) == 1  # once
        twin_loop.run_until_complete(aclient.aclose())
        assert len(_warnings(caplog)) == 1 and policy in _warnings(caplog)[0]

    def test_cli_prints_it_and_the_json_names_the_policy(
        self, evicting_server: tuple[RedisServerProcess, str], fresh_warnings: None,
        capsys: pytest.CaptureFixture[str],
    ) -> None:  # fmt: skip
        server, policy = evicting_server
        assert cli_mod.main(["stats", "--url", server.url, "--namespace", "ev"]) == 0
        out, err = capsys.readouterr()
        assert f"WARNING: maxmemory-policy {policy}" in out
        assert "maxmemory-policy" not in err  # printed once, not logged again by the store
        assert cli_mod.main(["stats", "--url", server.url, "--namespace", "ev", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert list(data["eviction"]["policies"].values()) == [policy]
        assert len(data["eviction"]["warnings"]) == 1

    def test_quiet_where_nothing_can_be_evicted_or_nothing_is_known(
        self, backend: Any, fresh_warnings: None, caplog: pytest.LogCaptureFixture, store: Any
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="redis_agentstate")
        store.create(running("q"))
        assert _warnings(caplog) == []
        policies = _eviction.policies_sync(backend.sync_client())
        if backend.kind == "fake":
            assert policies is None  # fakeredis answers no INFO: nothing known, nothing said
        elif backend.kind == "cluster":
            assert len(policies or {}) == 3 and set((policies or {}).values()) == {"noeviction"}  # every primary
        else:
            assert list((policies or {}).values()) == ["noeviction"]

    def test_a_refused_info_is_quiet(
        self, private_server: Any, fresh_warnings: None, caplog: pytest.LogCaptureFixture
    ) -> None:
        import redis

        admin = redis.Redis.from_url(private_server.url)
        admin.config_set("maxmemory-policy", "allkeys-lru")
        admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "+@all", "-info")
        client = redis.Redis(host="127.0.0.1", port=private_server.port, username="noinfo", password="pw")
        caplog.set_level(logging.WARNING, logger="redis_agentstate")
        store = CheckpointStore(client, namespace="acl")
        store.create(running("a"))
        assert store.load("a") is not None
        assert _warnings(caplog) == []
        client.close()
        admin.close()


# ---- stats --watch -------------------------------------------------------------------------------


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestWatch:
    @pytest.fixture
    def sync_store(self, backend: Any, namespace: str) -> CheckpointStore:
        return CheckpointStore(backend.sync_client(), namespace=namespace)

    def _work(self, store: CheckpointStore, n: int) -> Callable[[float], None]:
        """A ``sleep`` for ``watch`` that claims and commits ``n`` tasks between frames."""

        def sleep(_seconds: float) -> None:
            for _ in range(n):
                cp = store.claim_next(token="w", lease_ms=LEASE)
                if cp is None:
                    return
                cp.cycle_index = cp.claimed_cycle
                assert store.commit(cp, token="w", expected_revision=cp.revision)
            time.sleep(0.05)

        return sleep

    def test_plain_frames_are_appended_when_not_a_tty(self, sync_store: CheckpointStore) -> None:
        for i in range(6):
            sync_store.create(running(f"w{i}"))
        out = io.StringIO()
        assert _stats_view.watch(sync_store, interval=0.01, iterations=3, as_json=False, out=out,
                                 sleep=self._work(sync_store, 2)) == 0  # fmt: skip
        text = out.getvalue()
        assert "\x1b" not in text
        frames = [f for f in text.split("\n\n") if f.strip()]
        assert len(frames) == 3
        assert all(f.startswith("agentstate stats --watch: namespace") for f in frames)
        assert "tasks      6: running 6" in frames[0]
        assert "per second claims -" in frames[0]
        second = frames[1].splitlines()
        rate = next(ln for ln in second if ln.startswith("per second"))
        assert float(rate.split()[3]) > 0  # claims/s from the counters, between two frames
        assert "totals     claims 4  commits 4  takeovers 0" in frames[2]
        assert "due now    6; oldest w" in frames[0]
        assert "\nparked     0\n" in frames[0]

    def test_json_lines(self, sync_store: CheckpointStore) -> None:
        for i in range(3):
            sync_store.create(running(f"j{i}"))
        out = io.StringIO()
        _stats_view.watch(
            sync_store, interval=0.01, iterations=2, as_json=True, out=out, sleep=self._work(sync_store, 1)
        )
        frames = [json.loads(line) for line in out.getvalue().splitlines()]
        assert len(frames) == 2
        assert frames[0]["per_second"] == {"claims": None, "commits": None, "takeovers": None}
        assert frames[1]["per_second"]["claims"] > 0 and frames[1]["counters"]["commits"] == 1
        assert frames[0]["by_status"] == {"running": 3} and frames[0]["due_now"] == 3
        assert frames[0]["oldest_due"]["task_id"] in {"j0", "j1", "j2"}
        assert frames[0]["parked"] == 0 and frames[0]["parked_tasks"] == []

    def test_parked_tasks_are_counted_and_named(self, sync_store: CheckpointStore, backend: Any) -> None:
        """The live view reads the shards' parked indexes: how many, and the first few with their
        attempts and last failure; a parked task is neither claimable nor due."""
        poison = CheckpointStore(backend.sync_client(), namespace=sync_store.namespace, max_attempts=1)
        for tid in ("ok", "poison-a", "poison-b"):
            poison.create(running(tid))
        a = poison.claim("poison-a", 1, token="w", lease_ms=LEASE)
        assert poison.release("poison-a", token="w", expected_revision=a.revision, reason="ValueError: bad input")
        assert poison.claim("poison-b", 1, token="w", lease_ms=50) is not None
        time.sleep(0.2)
        with pytest.raises(TaskParked):  # attempt 2 of max 1: parked, the lapse recorded
            poison.claim("poison-b", 1, token="w2", lease_ms=LEASE)
        assert poison.list_parked() == ["poison-a", "poison-b"]
        counts = sync_store._run(status_counts(sync_store._core))
        assert counts.parked == 2 and counts.claimable == 1 and counts.tasks == 3
        out = io.StringIO()
        _stats_view.watch(sync_store, interval=0.01, iterations=1, as_json=True, out=out, sleep=lambda s: None)
        frame = json.loads(out.getvalue())
        assert frame["parked"] == 2 and frame["claimable_now"] == 1 and frame["due_now"] == 1
        assert frame["parked_tasks"][0] == {
            "task_id": "poison-a", "at_cycle": 1, "attempts": 1, "last_failure": "ValueError: bad input"
        }  # fmt: skip
        assert frame["parked_tasks"][1]["task_id"] == "poison-b" and frame["parked_tasks"][1]["attempts"] == 1
        assert "expired without a commit" in frame["parked_tasks"][1]["last_failure"]
        out = io.StringIO()
        _stats_view.watch(sync_store, interval=0.01, iterations=1, as_json=False, out=out, sleep=lambda s: None)
        text = out.getvalue()
        assert "\nparked     2   (`agentstate list --parked`; `requeue TASK`)\n" in text
        assert "\n  poison-a: cycle 1, 1 attempt(s), last failure: ValueError: bad input\n" in text
        assert "\n  poison-b: cycle 1, 1 attempt(s), last failure: lease of w on cycle 1 expired" in text
        poison.requeue("poison-a")
        parked = sync_store._run(parked_tasks(sync_store._core, show=1))
        assert parked.count == 1 and [r["task_id"] for r in parked.first] == ["poison-b"]

    def test_a_tty_gets_the_screen_cleared_per_frame(self, sync_store: CheckpointStore) -> None:
        out = Tty()
        _stats_view.watch(sync_store, interval=0.01, iterations=2, as_json=False, out=out, sleep=lambda s: None)
        assert out.getvalue().count(_stats_view.CLEAR) == 2 and out.getvalue().startswith(_stats_view.CLEAR)

    def test_ctrl_c_ends_it_cleanly(self, sync_store: CheckpointStore) -> None:
        def interrupt(_seconds: float) -> None:
            raise KeyboardInterrupt

        out = io.StringIO()
        assert _stats_view.watch(sync_store, interval=1, iterations=None, as_json=False, out=out, sleep=interrupt) == 0
        assert out.getvalue().count("agentstate stats --watch") == 1

    def test_cli(self, backend: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        if backend.kind == "fake":
            pytest.skip("the CLI needs a Redis URL")
        store = CheckpointStore(backend.sync_client(), namespace=namespace)
        store.create(running("cli"))
        base = ["stats", *url_and_flags(backend), "--namespace", namespace, "--watch", "--interval", "0.05"]
        assert cli_mod.main([*base, "--iterations", "2"]) == 0
        out = capsys.readouterr().out
        assert out.count("agentstate stats --watch: namespace") == 2 and "\x1b" not in out
        assert cli_mod.main([*base, "--iterations", "2", "--json"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [json.loads(line)["tasks"] for line in lines] == [1, 1]

    @pytest.mark.parametrize("bad", [["--interval", "0"], ["--interval", "x"], ["--iterations", "0"]])
    def test_bad_options_are_usage_errors(self, bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exc:
            cli_mod.main(["stats", "--url", "redis://unused", "--watch", *bad])
        assert exc.value.code == 2
