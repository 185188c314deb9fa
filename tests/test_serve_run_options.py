"""Run options of ``agentstate serve`` (issue 41): ``interrupt_before`` / ``interrupt_after``,
``after_seconds``, ``webhook`` (with the SSRF guard, retries and one delivery however many servers),
and per-tenant limits (``--tenant-limit``).

Each client-facing check runs the same ``langgraph-sdk`` calls against ``agentstate serve`` (an app
under uvicorn in a thread, on fakeredis and on a real redis-server) and, where it is installed
(``$AGENTSTATE_LANGGRAPH_DEV``), against LangChain's own ``langgraph dev`` on the same graphs in the
same test, and asserts the two answered alike. Per-tenant limits are ours alone (``langgraph dev``
has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import lg_option_graphs as graphs
import pytest
from serve_support import app_in_thread, langgraph_dev, until

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_sync_client

from redis_agentstate.server import RunOptions, create_app

TOKEN = "s3cret-token-for-tests"
GRAPHS = ("abc", "nap")
on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip


@contextlib.contextmanager
def _served(backend: Any, namespace: str, workers: int = 2, **options: Any) -> Iterator[str]:
    client = backend.new_async_client(max_connections=320)
    app = create_app({n: getattr(graphs, n) for n in GRAPHS}, client, namespace=namespace, token=TOKEN,
                     workers=workers, options=RunOptions(**options))  # fmt: skip
    with app_in_thread(app) as url:
        _APPS[url] = app.state.agentstate
        yield url


#: The app served at each URL (a test may hold its cron ticker's clock, or its webhooks' sender).
_APPS: dict[str, Any] = {}


def _app_of(url: str) -> Any:
    return _APPS[url]


@pytest.fixture(scope="module")
def dev() -> Iterator[str | None]:
    """``langgraph dev`` on the same graphs (loopback webhooks allowed, as our tests allow them), or None
    where it is not installed (a failure under ``CI=true``)."""
    cli = os.environ.get("AGENTSTATE_LANGGRAPH_DEV")
    if not cli:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("AGENTSTATE_LANGGRAPH_DEV (langgraph-cli[inmem]'s `langgraph`) not set")
        yield None
        return
    with langgraph_dev(
        cli, "lg_option_graphs", GRAPHS, webhooks={"url": {"disable_loopback": False, "require_https": False}}
    ) as url:
        yield url


@pytest.fixture
def ours(backend: Any, namespace: str) -> Iterator[str]:
    with _served(backend, namespace, webhook_allow_private=True) as url:
        yield url


def _both(ours: str, dev: str | None, scenario: Callable[[Any], Any]) -> Any:
    """``scenario(client)`` on ours, and on ``langgraph dev`` when there is one: they must agree."""
    got = scenario(get_sync_client(url=ours, api_key=TOKEN))
    if dev is not None:
        theirs = scenario(get_sync_client(url=dev, api_key=None))
        assert got == theirs, f"agentstate serve and langgraph dev differ:\nours: {got}\ndev:  {theirs}"
    return got


def _status(call: Callable[[], Any]) -> int:
    try:
        call()
    except httpx.HTTPStatusError as exc:
        return int(exc.response.status_code)
    return 200


# ---- interrupt_before / interrupt_after -----------------------------------------------------------


def _interrupts(c: Any) -> list[Any]:
    seen: list[Any] = []
    inp = {"log": []}
    for kw in ({"interrupt_before": ["b"]}, {"interrupt_after": ["a", "b"]}, {"interrupt_before": "*"},
               {"interrupt_after": "*"}):  # fmt: skip
        t = c.threads.create()["thread_id"]
        seen.append(("first", kw, c.runs.wait(t, "abc", input=inp, **kw)))
        for _ in range(3):
            state = c.threads.get_state(t)
            seen.append(("state", state["values"], state["next"], c.threads.get(t)["status"]))
            if not state["next"]:
                break
            seen.append(("resumed", c.runs.wait(t, "abc", input=None, **kw)))
    # A run (not a wait) stops alike: it ends 'success', its thread is 'interrupted'.
    t = c.threads.create()["thread_id"]
    run = c.runs.create(t, "abc", input=inp, interrupt_before=["c"])
    c.runs.join(t, run["run_id"])
    seen.append(("run", c.runs.get(t, run["run_id"])["status"], c.threads.get(t)["status"],
                 c.threads.get_state(t)["next"]))  # fmt: skip
    # A streamed one: the same stop, in its events.
    t = c.threads.create()["thread_id"]
    parts = list(c.runs.stream(t, "abc", input=inp, stream_mode="updates", interrupt_after=["a"]))
    seen.append(("stream", [(p.event, p.data) for p in parts if p.event != "metadata"]))
    # Stateless: the run's result is where it stopped.
    seen.append(("stateless", c.runs.wait(None, "abc", input=inp, interrupt_before=["c"])))
    return seen


@on_fake_and_real
def test_interrupt_before_and_after_stop_the_run_as_langgraph_dev_does(ours: str, dev: str | None) -> None:
    seen = _both(ours, dev, _interrupts)
    a, ab, abc = {"log": ["a"]}, {"log": ["a", "b"]}, {"log": ["a", "b", "c"]}
    assert seen == [
        ("first", {"interrupt_before": ["b"]}, a), ("state", a, ["b"], "interrupted"),
        ("resumed", abc), ("state", abc, [], "idle"),
        ("first", {"interrupt_after": ["a", "b"]}, a), ("state", a, ["b"], "interrupted"),
        ("resumed", ab), ("state", ab, ["c"], "interrupted"), ("resumed", abc), ("state", abc, [], "idle"),
        ("first", {"interrupt_before": "*"}, {"log": []}), ("state", {"log": []}, ["a"], "interrupted"),
        ("resumed", a), ("state", a, ["b"], "interrupted"), ("resumed", ab), ("state", ab, ["c"], "interrupted"),
        ("resumed", abc),
        ("first", {"interrupt_after": "*"}, a), ("state", a, ["b"], "interrupted"),
        ("resumed", ab), ("state", ab, ["c"], "interrupted"), ("resumed", abc), ("state", abc, [], "idle"),
        ("run", "success", "interrupted", ["c"]),
        ("stream", [("updates", {"a": a}), ("updates", {"__interrupt__": []})]),
        ("stateless", ab),
    ]  # fmt: skip
    # Ours checks the option when the run is created (langgraph dev accepts it and fails the run).
    c = get_sync_client(url=ours, api_key=TOKEN)
    assert _status(lambda: c.runs.wait(None, "abc", input={"log": []}, interrupt_before=7)) == 422


@on_fake_and_real
def test_a_cron_with_interrupt_before_stops_its_ticks_run(backend: Any, namespace: str) -> None:
    with _served(backend, namespace) as url:
        c = get_sync_client(url=url, api_key=TOKEN)
        t = c.threads.create()["thread_id"]
        made = c.crons.create_for_thread(t, "abc", schedule="* * * * *", input={"log": []}, interrupt_before=["b"])
        assert made["payload"]["interrupt_before"] == ["b"]
        assert _status(lambda: c.crons.create("abc", schedule="* * * * *", interrupt_after=5)) == 422
        # Fire its tick now: the ticker's clock held at the cron's next tick.
        from test_serve_crons import ms

        crons = _app_of(url).crons
        crons.frozen_ms = ms(made["next_run_date"])
        until(lambda: c.threads.get(t)["status"] == "interrupted", 20)
        assert c.threads.get_state(t)["next"] == ["b"]
        assert c.threads.get_state(t)["values"] == {"log": ["a"]}


# ---- after_seconds ------------------------------------------------------------------------------


def _delayed(c: Any) -> list[Any]:
    seen: list[Any] = []
    t = c.threads.create()["thread_id"]
    t0 = time.monotonic()
    run = c.runs.create(t, "abc", input={"log": []}, after_seconds=2)
    seen.append(("created", run["status"], round(time.monotonic() - t0) == 0))
    time.sleep(0.8)
    seen.append(("before", c.runs.get(t, run["run_id"])["status"], c.threads.get(t)["status"],
                 c.threads.get_state(t)["values"]))  # fmt: skip
    c.runs.join(t, run["run_id"])
    took = time.monotonic() - t0
    seen.append(("after", c.runs.get(t, run["run_id"])["status"], took >= 1.9, took < 8))
    # A stateless wait with a delay answers once it ran.
    t0 = time.monotonic()
    seen.append(("stateless", c.runs.wait(None, "abc", input={"log": []}, after_seconds=1)))
    seen.append(("waited", time.monotonic() - t0 >= 0.9))
    seen.append(("bad", _status(lambda: c.runs.create(None, "abc", input={}, after_seconds="soon"))))
    return seen


@on_fake_and_real
def test_after_seconds_creates_the_run_now_and_starts_it_no_earlier(ours: str, dev: str | None) -> None:
    seen = _both(ours, dev, _delayed)
    assert seen == [
        ("created", "pending", True),
        ("before", "pending", "busy", {}),
        ("after", "success", True, True),
        ("stateless", {"log": ["a", "b", "c"]}),
        ("waited", True),
        ("bad", 422),
    ]


@on_fake_and_real
def test_a_delayed_run_holds_the_runs_behind_it_and_a_cancel_frees_them(ours: str) -> None:
    c = get_sync_client(url=ours, api_key=TOKEN)
    t = c.threads.create()["thread_id"]
    late = c.runs.create(t, "abc", input={"log": []}, after_seconds=60)
    nxt = c.runs.create(t, "abc", input={"log": []}, multitask_strategy="enqueue")
    time.sleep(0.5)
    assert c.runs.get(t, nxt["run_id"])["status"] == "pending"  # runs of a thread go in creation order
    c.runs.cancel(t, late["run_id"])
    assert c.runs.get(t, late["run_id"])["status"] == "interrupted"


# ---- webhooks -------------------------------------------------------------------------------------


class Receiver:
    """A local HTTP server that records the webhooks POSTed to it; answers ``fail_first`` 500s first."""

    def __init__(self, fail_first: int = 0) -> None:
        self.posts: list[dict[str, Any]] = []
        self.answered_ok = 0
        self.fail_first = fail_first
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    fail = receiver.fail_first > 0
                    receiver.fail_first -= 1
                    if not fail:
                        receiver.posts.append(json.loads(body))
                        receiver.answered_ok += 1
                self.send_response(500 if fail else 200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _shape(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [_shape(v) for v in x[:1]]
    return type(x).__name__


def _hooked(receiver: Receiver) -> Callable[[Any], Any]:
    def scenario(c: Any) -> Any:
        receiver.posts.clear()
        t = c.threads.create()["thread_id"]
        out = c.runs.wait(t, "abc", input={"log": []}, webhook=receiver.url)
        until(lambda: len(receiver.posts) >= 1, 20)
        time.sleep(0.5)  # a second delivery would be here by now
        got = list(receiver.posts)
        post = got[0]
        keys = {"run_id", "thread_id", "assistant_id", "status", "metadata", "run_started_at", "run_ended_at",
                "webhook_sent_at", "values", "created_at", "updated_at", "multitask_strategy", "kwargs"}  # fmt: skip
        return (
            out,
            len(got),
            post["status"],
            post["values"],
            post["thread_id"] == t,
            sorted(keys - set(post)),
            {k: _shape(post[k]) for k in ("run_started_at", "run_ended_at", "webhook_sent_at", "values")},
        )

    return scenario


@on_fake_and_real
def test_webhook_posts_the_runs_result_once_as_langgraph_dev_does(ours: str, dev: str | None,
                                                                  receiver: Receiver) -> None:  # fmt: skip
    out, n, status, values, same_thread, missing, _ = _both(ours, dev, _hooked(receiver))
    assert (out, n, status, values, same_thread, missing) == ({"log": ["a", "b", "c"]}, 1, "success",
                                                              {"log": ["a", "b", "c"]}, True, [])  # fmt: skip


@on_fake_and_real
def test_webhook_of_a_stateless_run_carries_its_values(ours: str, receiver: Receiver) -> None:
    c = get_sync_client(url=ours, api_key=TOKEN)
    c.runs.wait(None, "abc", input={"log": []}, webhook=receiver.url)
    until(lambda: len(receiver.posts) == 1, 20)
    assert receiver.posts[0]["values"] == {"log": ["a", "b", "c"]}
    assert receiver.posts[0]["status"] == "success"


@on_fake_and_real
def test_the_ssrf_guard_refuses_private_addresses_without_the_flag(backend: Any, namespace: str,
                                                                   receiver: Receiver) -> None:  # fmt: skip
    with _served(backend, namespace) as url:
        c = get_sync_client(url=url, api_key=TOKEN)
        t = c.threads.create()["thread_id"]
        for hook in (receiver.url, "http://localhost:9/x", "http://10.1.2.3/x", "http://192.168.0.1/x",
                     "http://169.254.169.254/latest/meta-data", "http://[::1]:9/x", "http://[fe80::1]/x",
                     "http://[::ffff:127.0.0.1]/x", "http://100.64.0.1/x", "ftp://example.com/x", "not a url",
                     "http://224.0.0.1/x"):  # fmt: skip
            assert _status(lambda h=hook: c.runs.create(t, "abc", input={"log": []}, webhook=h)) == 422, hook
            assert _status(lambda h=hook: c.crons.create("abc", schedule="* * * * *", webhook=h)) == 422, hook
        assert c.runs.list(t) == []  # nothing was created
        assert c.crons.count() == 0
    assert receiver.posts == []


def _sender(backend: Any, namespace: str, allow: bool) -> Any:
    """Another server's webhook sender on the namespace (its own client, on the caller's loop)."""
    from redis_agentstate.langgraph import AsyncAgentStateSaver, AsyncRunQueue
    from redis_agentstate.server import ServedGraph
    from redis_agentstate.server._webhooks import WebhookSender

    client = backend.new_async_client()
    served = {n: ServedGraph(n, getattr(graphs, n), AsyncRunQueue(client, namespace=f"{namespace}.{n}"),
                             AsyncAgentStateSaver(client, namespace=f"{namespace}.{n}")) for n in GRAPHS}  # fmt: skip

    async def values(g: Any, run: Any) -> Any:
        return (await g.stateful.aget_state({"configurable": {"thread_id": run.thread_id}})).values

    async def drop(g: Any, tid: str) -> None:
        return None

    return WebhookSender(client, namespace, served, allow, values, drop)


@on_fake_and_real
def test_one_delivery_across_senders_a_dead_senders_claim_taken_over_and_retries(backend: Any, namespace: str) -> None:
    """Eight senders (eight servers' worth) race for each ended run's delivery: one POST each. A
    receiver that fails twice gets the run at the third attempt; a claim whose sender died is taken
    over once it lapses; a sender whose guard refuses the address when sending sends nothing."""
    from redis_agentstate.server import _webhooks as W

    r = Receiver(fail_first=2)
    try:
        with _served(backend, namespace, workers=2, webhook_allow_private=True) as url:
            app = _app_of(url)
            c = get_sync_client(url=url, api_key=TOKEN)

            async def race(rid: str, senders: list[Any]) -> list[bool]:
                return list(await asyncio.gather(*(s.deliver(rid) for s in senders)))

            async def main() -> None:
                senders = [_sender(backend, namespace, True) for _ in range(8)]
                # Runs created by a server that neither follows nor sweeps (it "died"): the senders race.
                app.webhooks.follow = lambda g, rid: None

                async def no_sweep() -> None:
                    return None

                app.webhooks.sweep = no_sweep
                runs = [c.runs.create(None, "abc", input={"log": []}, webhook=r.url, on_completion="keep")
                        for _ in range(3)]  # fmt: skip
                for run in runs:
                    c.runs.join(run["thread_id"], run["run_id"])
                results = [await race(run["run_id"], senders) for run in runs]
                assert [sum(x) for x in results] == [1, 1, 1]
                assert r.answered_ok == 3 and r.fail_first < 0  # two 500s, then retried
                assert sorted(p["run_id"] for p in r.posts) == sorted(run["run_id"] for run in runs)
                # A claim whose sender died: taken over once it lapsed.
                run = c.runs.create(None, "abc", input={"log": []}, webhook=r.url, on_completion="keep")
                c.runs.join(run["thread_id"], run["run_id"])
                raw = await senders[0].kv.get(run["run_id"])
                rec = json.loads(raw)
                dead = {**rec, "state": "claimed", "by": "dead", "until_ms": W._now_ms() + 60_000}
                assert await senders[0].kv.swap(run["run_id"], raw, json.dumps(dead).encode())
                assert await race(run["run_id"], senders) == [False] * 8  # its claim holds
                lapsed = {**dead, "until_ms": W._now_ms() - 1}
                assert await senders[0].kv.swap(run["run_id"], json.dumps(dead).encode(), json.dumps(lapsed).encode())
                assert sum(await race(run["run_id"], senders)) == 1
                assert r.answered_ok == 4
                # Checked again when sending: a sender refusing loopback sends nothing.
                run = c.runs.create(None, "abc", input={"log": []}, webhook=r.url, on_completion="keep")
                c.runs.join(run["thread_id"], run["run_id"])
                strict = _sender(backend, namespace, False)
                assert await strict.deliver(run["run_id"]) is False
                assert r.answered_ok == 4
                assert await strict.kv.get(run["run_id"]) is None  # given up: not sent again by anyone
                for s in [*senders, strict]:
                    await s.stop()

            asyncio.run(main())
    finally:
        r.close()


@on_fake_and_real
def test_the_sweep_sends_a_dead_servers_webhook(backend: Any, namespace: str, receiver: Receiver) -> None:
    with _served(backend, namespace, webhook_allow_private=True) as url:
        app = _app_of(url)
        app.webhooks.follow = lambda g, rid: None  # the creating server never follows its run
        c = get_sync_client(url=url, api_key=TOKEN)
        t = c.threads.create()["thread_id"]
        c.runs.wait(t, "abc", input={"log": []}, webhook=receiver.url)
        until(lambda: len(receiver.posts) == 1, 20)  # every server's sweep (here this one's) sent it
        time.sleep(2.5)
        assert len(receiver.posts) == 1


# ---- per-tenant limits ----------------------------------------------------------------------------


@on_fake_and_real
def test_tenant_limit_keeps_one_tenant_from_taking_the_fleet(backend: Any, namespace: str) -> None:
    graphs.NAPPING.clear()
    graphs.MOST.clear()
    with _served(backend, namespace, workers=6, tenant_key="user_id", tenant_limit=2) as url:
        c = get_sync_client(url=url, api_key=TOKEN)

        def start(user: str) -> dict[str, Any]:
            conf = {"configurable": {"tenant": user, "nap": 0.6}}
            return c.runs.create(None, "nap", input={"log": []}, metadata={"user_id": user}, config=conf,
                                 on_completion="keep")  # fmt: skip

        greedy = [start("alice") for _ in range(6)]
        time.sleep(0.2)
        other = start("bob")
        t0 = time.monotonic()
        c.runs.join(other["thread_id"], other["run_id"])
        bob_took = time.monotonic() - t0
        for run in greedy:
            c.runs.join(run["thread_id"], run["run_id"])
        assert all(c.runs.get(r["thread_id"], r["run_id"])["status"] == "success" for r in [*greedy, other])
        assert graphs.MOST["alice"] == 2  # at most her limit at once, with six workers free
        assert bob_took < 1.5  # bob's run did not wait behind alice's six
        assert _status(lambda: c.runs.create(None, "nap", input={}, metadata={"user_id": {"x": 1}})) == 422


@on_fake_and_real
def test_a_crons_tick_sends_its_webhook_once_even_fired_again(backend: Any, namespace: str,
                                                              receiver: Receiver) -> None:  # fmt: skip
    """A tick fired again after a crash (its run exists, its webhook sent) sends nothing more; a stateless
    cron's webhook carries its run's values (its thread is deleted after the webhook read them)."""
    from test_serve_crons import MINUTE, ms

    with _served(backend, namespace, webhook_allow_private=True) as url:
        crons = _app_of(url).crons
        crons.frozen_ms = 0
        c = get_sync_client(url=url, api_key=TOKEN)
        t = c.threads.create()["thread_id"]
        made = c.crons.create_for_thread(t, "abc", schedule="* * * * *", input={"log": []}, webhook=receiver.url)
        first = ms(made["next_run_date"])
        real_advance, crashes = crons.store.advance, []

        async def crashing(cron_id: str, fired_ms: int, next_ms: int | None) -> bool:
            if not crashes:  # the tick's run ended and its webhook went out; the process dies now
                while not receiver.posts:
                    await asyncio.sleep(0.02)
                crashes.append(fired_ms)
                raise RuntimeError("crashed mid-tick")
            return bool(await real_advance(cron_id, fired_ms, next_ms))

        crons.store.advance = crashing
        crons.frozen_ms = first
        until(lambda: ms(c.http.get(f"/runs/crons/{made['cron_id']}")["next_run_date"]) == first + MINUTE)
        assert crashes == [first]
        time.sleep(2.5)  # a sweep or two
        assert len(receiver.posts) == 1 and receiver.posts[0]["values"] == {"log": ["a", "b", "c"]}
        # Stateless: a new thread per tick, deleted after its webhook.
        stateless = c.crons.create("abc", schedule="* * * * *", input={"log": []}, webhook=receiver.url)
        crons.frozen_ms = ms(stateless["next_run_date"])
        until(lambda: any(p["thread_id"] != t for p in receiver.posts))
        post = next(p for p in receiver.posts if p["thread_id"] != t)
        assert post["values"] == {"log": ["a", "b", "c"]} and post["status"] == "success"
        until(lambda: _status(lambda: c.threads.get(post["thread_id"])) == 404)


def test_the_serve_flags_are_parsed_and_checked() -> None:
    from redis_agentstate.cli import build_parser
    from redis_agentstate.commands.common import CliError
    from redis_agentstate.server.cli import _tenant_limit

    args = build_parser().parse_args(["serve", "--tenant-limit", "user_id=4", "--webhook-allow-private"])
    assert (args.tenant_limit, args.webhook_allow_private) == ("user_id=4", True)
    assert build_parser().parse_args(["serve"]).webhook_allow_private is False
    assert _tenant_limit("user_id=4") == ("user_id", 4) and _tenant_limit("org=id=2") == ("org=id", 2)
    assert _tenant_limit(None) == (None, None)
    for bad in ("user_id", "=4", "user_id=0", "user_id=x", "user_id=-1", "user_id=10000000"):
        with pytest.raises(CliError):
            _tenant_limit(bad)
