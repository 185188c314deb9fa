"""``agentstate serve``'s crons (issue 41, "Not served today"): create for a thread or stateless,
get, search, count, update, delete, judged by the real ``langgraph-sdk`` client; and the ticker:
each tick makes exactly one run, whatever number of servers fire it and wherever one crashes.

The apps run in threads of this process (uvicorn), on fakeredis or a real redis-server, so that a
test can hold the tickers' clock (``CronRoutes.frozen_ms``) at a cron's own ``next_run_date``:
ticks come without waiting for real minutes, and no assertion reads the wall clock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import free_port

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")
pytest.importorskip("croniter")

from test_serve import TOKEN, Served, _wait_up
from test_serve_parity import LANGGRAPH as PARITY_LANGGRAPH
from test_serve_parity import servers as parity_servers

from redis_agentstate.server._crons import tick_ids

on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip
MINUTE = 60_000
#: The fields of langgraph_sdk.schema.Cron.
CRON_FIELDS = {"cron_id", "assistant_id", "thread_id", "on_run_completed", "end_time", "schedule", "timezone",
               "created_at", "updated_at", "payload", "user_id", "next_run_date", "metadata", "enabled"}  # fmt: skip


@contextlib.contextmanager
def serve(backend: Any, namespace: str, poll_s: float = 0.01) -> Iterator[tuple[Served, Any]]:
    """An app serving ``steps`` on the backend, in a thread; yields it and its cron routes (ticker)."""
    import uvicorn
    from lg_run_graphs import steps

    from redis_agentstate.server import create_app

    client = backend.new_async_client(max_connections=320)
    app = create_app({"steps": steps}, client, namespace=namespace, token=TOKEN, workers=1)
    crons = app.state.agentstate.crons
    crons.poll_s = poll_s
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        _wait_up(f"http://127.0.0.1:{port}")
        yield Served(f"http://127.0.0.1:{port}", TOKEN), crons
    finally:
        srv.should_exit = True
        thread.join(20)
        assert not thread.is_alive(), "the app did not stop (its ticker outlived the lifespan)"


def ms(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso).timestamp() * 1000)


def iso(at_ms: int) -> str:
    return dt.datetime.fromtimestamp(at_ms / 1000, tz=dt.timezone.utc).isoformat()


def wait_for(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("timed out")


def run_ids(c: Any, thread_id: str) -> list[str]:
    return sorted(r["run_id"] for r in c.runs.list(thread_id, limit=100))


def status_of(call: Callable[[], Any]) -> int:
    with pytest.raises(httpx.HTTPStatusError) as err:
        call()
    return int(err.value.response.status_code)


@pytest.fixture
def served(backend: Any, namespace: str) -> Iterator[tuple[Served, Any]]:
    with serve(backend, namespace) as s:
        yield s


@on_fake_and_real
class TestCrud:
    def test_create_get_search_count_update_delete_through_the_client(self, served: tuple[Served, Any]) -> None:
        s, crons = served
        crons.frozen_ms = 0  # no tick fires in this test
        c = s.sync()
        t = c.threads.create()["thread_id"]
        made = c.crons.create_for_thread(t, "steps", schedule="*/5 * * * *", input={"log": []},
                                         metadata={"team": "a"})  # fmt: skip
        assert set(made) >= CRON_FIELDS
        assert made["thread_id"] == t and made["schedule"] == "*/5 * * * *" and made["enabled"] is True
        assert made["assistant_id"] == c.assistants.get("steps")["assistant_id"]
        assert made["metadata"] == {"team": "a"} and made["on_run_completed"] is None
        assert made["payload"]["input"] == {"log": []}
        assert made["payload"]["config"]["configurable"]["cron_id"] == made["cron_id"]
        assert ms(made["next_run_date"]) % (5 * MINUTE) == 0  # on a */5 boundary, UTC
        stateless = c.crons.create("steps", schedule="0 9 * * 1", timezone="America/New_York", on_run_completed="keep")
        assert stateless["thread_id"] is None and stateless["on_run_completed"] == "keep"
        nine = dt.datetime.fromisoformat(stateless["next_run_date"]).astimezone(dt.timezone(dt.timedelta(hours=-5)))
        assert (nine.hour, nine.minute, nine.weekday()) in {(9, 0, 0), (10, 0, 0)}  # 9:00 New York (EST/EDT)
        assert c.http.get(f"/runs/crons/{made['cron_id']}") == made

        ids = {x["cron_id"] for x in c.crons.search(limit=100)}
        assert ids == {made["cron_id"], stateless["cron_id"]}
        assert [x["cron_id"] for x in c.crons.search(thread_id=t)] == [made["cron_id"]]
        assert [x["cron_id"] for x in c.crons.search(metadata={"team": "a"})] == [made["cron_id"]]
        assert len(c.crons.search(assistant_id="steps", limit=100)) == 2
        assert c.crons.count() == 2 and c.crons.count(thread_id=t) == 1 and c.crons.count(metadata={"team": "b"}) == 0
        assert [x["cron_id"] for x in c.crons.search(limit=1, sort_by="created_at", sort_order="asc")] == [
            made["cron_id"]
        ]

        up = c.crons.update(made["cron_id"], schedule="0 * * * *", metadata={"more": 1}, input={"log": ["x"]})
        assert up["schedule"] == "0 * * * *" and ms(up["next_run_date"]) % (60 * MINUTE) == 0
        assert up["metadata"] == {"team": "a", "more": 1} and up["payload"]["input"] == {"log": ["x"]}
        assert up["payload"]["config"]["configurable"]["cron_id"] == made["cron_id"]
        off = c.crons.update(made["cron_id"], enabled=False)
        assert off["enabled"] is False and ms(off["next_run_date"]) % (60 * MINUTE) == 0  # shown, not fired
        assert c.crons.search(enabled=False)[0]["cron_id"] == made["cron_id"]
        on = c.crons.update(made["cron_id"], enabled=True)
        assert ms(on["next_run_date"]) % (60 * MINUTE) == 0

        c.crons.delete(made["cron_id"])
        assert [x["cron_id"] for x in c.crons.search(limit=100)] == [stateless["cron_id"]]
        assert status_of(lambda: c.crons.delete(made["cron_id"])) == 404
        assert status_of(lambda: c.crons.update(made["cron_id"], enabled=False)) == 404

    def test_bad_input_is_refused_before_anything_is_written(self, served: tuple[Served, Any]) -> None:
        s, crons = served
        crons.frozen_ms = 0
        c = s.sync()
        t = c.threads.create()["thread_id"]
        every_minute = {"assistant_id": "steps", "schedule": "* * * * *"}
        bad: list[tuple[Callable[[], Any], int]] = [
            (lambda: c.crons.create("steps", schedule="every minute"), 422),
            (lambda: c.crons.create("steps", schedule="61 * * * *"), 422),
            (lambda: c.crons.create("steps", schedule="* * * * *", timezone="Mars/Olympus"), 422),
            (lambda: c.http.post("/runs/crons", json={**every_minute, "end_time": "soon"}), 422),
            (lambda: c.crons.create("nope", schedule="* * * * *"), 422),  # neither a UUID nor a served graph
            (lambda: c.crons.create("00000000-0000-4000-8000-000000000000", schedule="* * * * *"), 404),
            (lambda: c.crons.create_for_thread("no-such-thread", "steps", schedule="* * * * *"), 404),
            (lambda: c.crons.create_for_thread(t, "steps", schedule="* * * * *", multitask_strategy="shout"), 422),
            (lambda: c.crons.create("steps", schedule="* * * * *", webhook="http://10.0.0.1/hook"), 422),
        ]
        for call, code in bad:
            assert status_of(call) == code
        assert c.crons.count() == 0
        made = c.crons.create("steps", schedule="* * * * *")
        assert status_of(lambda: c.crons.update(made["cron_id"], schedule="nope")) == 422
        assert c.crons.search()[0]["schedule"] == "* * * * *"


@on_fake_and_real
class TestTicks:
    def test_each_tick_makes_one_run_and_end_time_ends_the_cron(self, served: tuple[Served, Any]) -> None:
        s, crons = served
        crons.frozen_ms = 0
        c = s.sync()
        t = c.threads.create()["thread_id"]
        first = ms(c.crons.create_for_thread(t, "steps", schedule="* * * * *", input={"log": []},
                                             multitask_strategy="enqueue")["next_run_date"])  # fmt: skip
        # It ends 90 s after its first tick: two ticks (first, first + 1 min), then none.
        end = dt.datetime.fromtimestamp((first + 90_000) / 1000, dt.timezone.utc)
        cron = c.crons.create_for_thread(t, "steps", schedule="* * * * *", input={"log": []}, end_time=end)
        assert ms(cron["next_run_date"]) == first
        every = c.crons.search(thread_id=t, sort_by="created_at", sort_order="asc")[0]["cron_id"]
        expected: set[str] = set()
        for k in range(3):
            crons.frozen_ms = first + k * MINUTE
            if k < 2:
                expected |= {tick_ids(every, first + k * MINUTE)[0], tick_ids(cron["cron_id"], first + k * MINUTE)[0]}
            else:
                expected.add(tick_ids(every, first + k * MINUTE)[0])
            wait_for(lambda want=set(expected): set(run_ids(c, t)) == want)
            wait_for(lambda k=k: ms(c.http.get(f"/runs/crons/{every}")["next_run_date"]) == first + (k + 1) * MINUTE)
        time.sleep(0.3)  # many more looks at the due crons: nothing more
        assert set(run_ids(c, t)) == expected and len(expected) == 5
        assert c.http.get(f"/runs/crons/{cron['cron_id']}")["next_run_date"] is None  # ended
        # Each run ran once: the thread's log has each node's name once per run.
        wait_for(lambda: all(r["status"] == "success" for r in c.runs.list(t, limit=100)))
        assert c.threads.get_state(t)["values"] == {"log": ["a", "b", "c"] * 5}

    def test_delete_stops_the_ticks(self, served: tuple[Served, Any]) -> None:
        s, crons = served
        crons.frozen_ms = 0
        c = s.sync()
        t = c.threads.create()["thread_id"]
        made = c.crons.create_for_thread(t, "steps", schedule="* * * * *", input={"log": []})
        first = ms(made["next_run_date"])
        crons.frozen_ms = first
        wait_for(lambda: run_ids(c, t) == [tick_ids(made["cron_id"], first)[0]])
        c.crons.delete(made["cron_id"])
        crons.frozen_ms = first + 10 * MINUTE
        time.sleep(0.3)
        assert run_ids(c, t) == [tick_ids(made["cron_id"], first)[0]]

    def test_a_stateless_cron_runs_each_tick_on_a_new_thread(self, served: tuple[Served, Any]) -> None:
        s, crons = served
        crons.frozen_ms = 0
        c = s.sync()
        kept = c.crons.create("steps", schedule="* * * * *", input={"log": []}, on_run_completed="keep",
                              metadata={"cron_note": "kept"})  # fmt: skip
        dropped = c.crons.create("steps", schedule="* * * * *", input={"log": []})
        first = ms(kept["next_run_date"])
        assert ms(dropped["next_run_date"]) == first
        crons.frozen_ms = first
        run, thread = tick_ids(kept["cron_id"], first)
        wait_for(lambda: run_ids(c, thread) == [run] if _exists(c, thread) else False)
        assert c.runs.join(thread, run) == {"log": ["a", "b", "c"]}
        assert c.runs.get(thread, run)["metadata"]["cron_note"] == "kept"  # the cron's metadata, on its runs
        gone = tick_ids(dropped["cron_id"], first)[1]
        wait_for(lambda: not _exists(c, gone) and ms(c.http.get(f"/runs/crons/{dropped['cron_id']}")
                                                   ["next_run_date"]) == first + MINUTE)  # fmt: skip
        assert _exists(c, thread)  # "keep": its thread stays


def _exists(c: Any, thread_id: str) -> bool:
    try:
        c.threads.get(thread_id)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            return False
        raise
    return True


@on_fake_and_real
class TestExactlyOnce:
    def test_two_servers_racing_over_n_ticks_make_n_runs(self, backend: Any, namespace: str) -> None:
        n = 6
        with serve(backend, namespace, poll_s=0.005) as (one, crons1), serve(backend, namespace, poll_s=0.005) as pair:
            crons2 = pair[1]
            crons1.frozen_ms = crons2.frozen_ms = 0
            c = one.sync()
            t = c.threads.create()["thread_id"]
            made = c.crons.create_for_thread(t, "steps", schedule="* * * * *", input={"log": []})
            first = ms(made["next_run_date"])
            for k in range(n):
                crons1.frozen_ms = crons2.frozen_ms = first + k * MINUTE
                wait_for(lambda k=k: len(run_ids(c, t)) >= k + 1)
                wait_for(lambda k=k: ms(c.http.get(f"/runs/crons/{made['cron_id']}")["next_run_date"])
                         == first + (k + 1) * MINUTE)  # fmt: skip
            time.sleep(0.3)
            assert run_ids(c, t) == sorted(tick_ids(made["cron_id"], first + k * MINUTE)[0] for k in range(n))

    def test_a_crash_between_the_run_and_the_advance_neither_skips_nor_doubles(
        self, served: tuple[Served, Any]
    ) -> None:
        s, crons = served
        crons.frozen_ms = 0
        c = s.sync()
        t = c.threads.create()["thread_id"]
        made = c.crons.create_for_thread(t, "steps", schedule="* * * * *", input={"log": []})
        first = ms(made["next_run_date"])
        real_advance, crashes = crons.store.advance, []

        async def crashing(cron_id: str, fired_ms: int, next_ms: int | None) -> bool:
            if not crashes:  # the tick's run exists; the process dies before the cron moves on
                crashes.append(fired_ms)
                raise RuntimeError("crashed mid-tick")
            return bool(await real_advance(cron_id, fired_ms, next_ms))

        crons.store.advance = crashing
        crons.frozen_ms = first
        wait_for(lambda: ms(c.http.get(f"/runs/crons/{made['cron_id']}")["next_run_date"]) == first + MINUTE)
        assert crashes == [first]
        assert run_ids(c, t) == [tick_ids(made["cron_id"], first)[0]]  # fired again after the crash: one run
        crons.frozen_ms = first + MINUTE
        wait_for(lambda: len(run_ids(c, t)) == 2)
        time.sleep(0.2)
        assert run_ids(c, t) == sorted(tick_ids(made["cron_id"], first + k * MINUTE)[0] for k in range(2))


class TestCronStore:
    """The store the routes keep crons in, on every backend (a Redis Cluster too)."""

    def test_a_tick_moves_once_and_only_from_the_tick_fired(self, backend: Any, namespace: str) -> None:
        from redis_agentstate.langgraph.crons import CronStore

        store = CronStore(backend.sync_client(), namespace=namespace)
        now = store.now_ms()
        assert store.create("c1", {"schedule": "* * * * *"}, due_ms=now - 5, created_ms=now)
        assert not store.create("c1", {"schedule": "0 * * * *"}, due_ms=now, created_ms=now)  # another cron, same id
        assert store.create("c2", {"schedule": "* * * * *"}, due_ms=now + MINUTE, created_ms=now + 1)
        assert store.due(now) == [("c1", now - 5)]
        # Two tickers fired the tick: one moves it, the other is told it moved (both True); a stale
        # tick (an update rescheduled the cron meanwhile) moves nothing.
        assert store.advance("c1", now - 5, now + MINUTE) and store.advance("c1", now - 5, now + 2 * MINUTE)
        cron = store.get("c1")
        assert cron is not None and (cron.due_ms, cron.last_ms) == (now + MINUTE, now - 5)
        assert not store.advance("c1", now + 7, now + 3 * MINUTE)
        assert store.due(now) == [] and [c for c, _ in store.due(now + MINUTE)] == ["c1", "c2"]
        assert store.update("c1", {"schedule": "0 * * * *"}, due_ms=None)  # disabled: no tick
        assert [c for c, _ in store.due(now + MINUTE)] == ["c2"]
        assert not store.update("nope", {})
        store.delete("c2")
        assert [c.cron_id for c in store.every()] == ["c1"] and store.get("c2") is None
        assert not store.advance("c2", now + MINUTE, None)

    def test_a_reshard_keeps_the_crons_in_one_slot(self, backend: Any, namespace: str) -> None:
        from redis_agentstate import CheckpointStore
        from redis_agentstate.langgraph.crons import CronStore

        store = CronStore(backend.sync_client(), namespace=namespace)
        now = store.now_ms()
        for i in range(12):
            assert store.create(f"c{i}", {"n": i}, due_ms=now - i, created_ms=now + i)
        report = CheckpointStore(backend.sync_client(), namespace=namespace).reshard(128)
        assert report.unknown == 0
        fresh = CronStore(backend.sync_client(), namespace=namespace)
        assert [c.cron_id for c in fresh.every()] == [f"c{i}" for i in range(12)]
        assert len(fresh.due(now)) == 12
        assert store.advance("c3", now - 3, now + MINUTE)  # a store made before the reshard follows it
        moved = fresh.get("c3")
        assert moved is not None and moved.due_ms == now + MINUTE

    def test_a_run_created_twice_with_one_id_is_one_run(self, backend: Any, namespace: str) -> None:
        # What a tick fired again (a second ticker, or after a crash) relies on.
        from redis_agentstate import InvalidArgument
        from redis_agentstate.langgraph import RunQueue

        queue = RunQueue(backend.sync_client(), namespace=namespace)
        first = queue.create("t1", {"log": []}, run_id="tick-1")
        again = queue.create("t1", {"log": ["other"]}, run_id="tick-1", multitask_strategy="reject")
        assert first.run_id == again.run_id == "tick-1"
        assert [r.run_id for r in queue.list("t1")] == ["tick-1"]
        got = queue.get("tick-1")
        assert got is not None and got.input == {"log": []}  # the first create's, untouched
        with pytest.raises(InvalidArgument):
            queue.create("t2", run_id="tick-1")  # another thread's run
        with pytest.raises(InvalidArgument):
            queue.create("t1", run_id="")
        assert queue.list("t2") == []


def _crons(c: Any, h: httpx.Client) -> dict[str, Any]:
    from test_serve_parity import call, shape

    out: dict[str, Any] = {}
    t = c.threads.create()["thread_id"]
    made = c.crons.create_for_thread(t, "steps", schedule="*/5 * * * *", input={"log": []}, metadata={"k": 1})
    fields = ("schedule", "metadata", "enabled", "end_time", "on_run_completed", "timezone", "user_id")
    out["create for thread"] = (shape(made), {k: made[k] for k in fields})
    out["payload"] = {k: v for k, v in made["payload"].items() if k not in ("assistant_id", "config")}
    free = c.crons.create("steps", schedule="0 9 * * *", timezone="Europe/Paris")
    out["create stateless"] = (shape(free), free["on_run_completed"], free["timezone"], free["thread_id"])
    out["get"] = shape(h.get(f"/runs/crons/{made['cron_id']}").json())
    out["search"] = sorted(x["schedule"] for x in c.crons.search(limit=100))
    out["search by thread"] = [x["schedule"] for x in c.crons.search(thread_id=t)]
    out["search by metadata"] = [x["schedule"] for x in c.crons.search(metadata={"k": 1})]
    out["search select"] = c.crons.search(thread_id=t, select=["schedule", "enabled"])
    out["count"] = (c.crons.count(), c.crons.count(thread_id=t), c.crons.count(metadata={"k": 2}))
    up = c.crons.update(made["cron_id"], schedule="0 * * * *", metadata={"m": 2}, enabled=False)
    out["update"] = (shape(up), {k: up[k] for k in ("schedule", "metadata", "enabled")})
    missing = str(uuid.uuid4())
    for name, fn in [("bad schedule", lambda: c.crons.create("steps", schedule="nope")),
                     ("bad timezone", lambda: c.crons.create("steps", schedule="* * * * *", timezone="Mars/X")),
                     ("no assistant", lambda: c.crons.create(missing, schedule="* * * * *")),
                     ("no thread", lambda: c.crons.create_for_thread(missing, "steps", schedule="* * * * *")),
                     ("update missing", lambda: c.crons.update(missing, enabled=True)),
                     ("delete missing", lambda: c.crons.delete(missing))]:  # fmt: skip
        out[f"{name}: status"] = call(fn)[0]
    out["delete"] = call(lambda: c.crons.delete(made["cron_id"]))
    out["after delete"] = c.crons.count(thread_id=t)
    c.crons.delete(free["cron_id"])
    return out


#: langgraph dev and ours side by side (skipped where langgraph dev is not installed).
servers = parity_servers


@pytest.mark.skipif(PARITY_LANGGRAPH is None, reason="langgraph dev is not installed (AGENTSTATE_LANGGRAPH_DEV)")
def test_crons_answer_as_langgraph_dev(servers: dict[str, tuple[str, str | None]]) -> None:
    from test_serve_parity import both

    dev, ours = both(servers, _crons)
    assert ours == dev
