"""``agentstate serve``'s assistants, kept in Redis: create, get, update (a new version), delete,
search, count, versions, ``set_latest``, a created assistant's graph and schemas, and runs on it
with its config and context applied; judged by the real ``langgraph-sdk`` client.

They survive a restart of the server and two servers on one Redis see the same ones. On fakeredis
the app runs in a thread of this process; on a real redis-server it is the CLI in a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import fakeredis
import httpx
import pytest
from conftest import free_port
from fork_support import popen_python
from serve_support import app_in_thread

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from test_serve import TESTS, TOKEN, Served, _wait_up

#: The graphs served here: a configurable one, and two of the run tests' (one with a subgraph).
GRAPHS = {"configured": "lg_assistant_graphs:configured", "steps": "lg_run_graphs:steps",
          "nested": "lg_run_graphs:nested"}  # fmt: skip

on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip


@contextlib.contextmanager
def serve(backend: Any, namespace: str, graphs: dict[str, str] = GRAPHS) -> Iterator[Served]:
    """``agentstate serve`` of ``graphs`` on the backend (fakeredis: the app in a thread; a real
    server: the CLI), with the token."""
    if backend.kind == "fake":
        import importlib

        from redis_agentstate.server import create_app

        loaded = {}
        for name, target in graphs.items():
            module, _, attr = target.partition(":")
            loaded[name] = getattr(importlib.import_module(module), attr)
        client = fakeredis.FakeAsyncRedis(server=backend.server, max_connections=320)
        with app_in_thread(create_app(loaded, client, namespace=namespace, token=TOKEN, workers=1)) as url:
            yield Served(url, TOKEN)
        return
    port = free_port()
    if backend.kind == "cluster":
        host, first = backend.cluster.startup
        target = ["--url", f"redis://{host}:{first}", "--cluster"]
    else:
        target = ["--url", backend.url]
    args = [sys.executable, "-m", "redis_agentstate", "serve", *target, "--namespace", namespace,
            "--port", str(port), "--workers", "1"]  # fmt: skip
    for name, target in graphs.items():
        args += ["--graph", f"{name}={target}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "AGENTSTATE_TOKEN": TOKEN}  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen_python(args[1:], env=env, stdout=out, stderr=err)  # forked: tests/fork_support.py
        try:
            _wait_up(f"http://127.0.0.1:{port}", proc, err)
            yield Served(f"http://127.0.0.1:{port}", TOKEN, proc, (out, err))
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def served(backend: Any, namespace: str) -> Iterator[Served]:
    with serve(backend, namespace) as s:
        yield s


def status_of(call: Any) -> int:
    with pytest.raises(httpx.HTTPStatusError) as err:
        call()
    return int(err.value.response.status_code)


@on_fake_and_real
class TestAssistants:
    def test_create_get_search_count_and_the_defaults_stay(self, served: Served) -> None:
        c = served.sync()
        a = c.assistants.create("configured", context={"model": "m1"}, metadata={"team": "a"}, name="Bot One",
                                description="first")  # fmt: skip
        assert a["graph_id"] == "configured" and a["version"] == 1 and a["name"] == "Bot One"
        assert a["context"] == {"model": "m1"} and a["config"] == {"configurable": {"model": "m1"}}  # kept in step
        assert a["metadata"] == {"team": "a"} and a["description"] == "first"
        assert {"created_at", "updated_at"} <= set(a)
        assert c.assistants.get(a["assistant_id"]) == a
        # The default assistants of the served graphs are still there, by id and by graph name.
        assert c.assistants.get("steps")["metadata"] == {"created_by": "system"}
        everyone = c.assistants.search(limit=100)
        assert {x["assistant_id"] for x in everyone} >= {a["assistant_id"], c.assistants.get("steps")["assistant_id"]}
        assert everyone[0]["assistant_id"] == a["assistant_id"]  # newest first, as LangGraph sorts by default
        assert [x["assistant_id"] for x in c.assistants.search(metadata={"team": "a"})] == [a["assistant_id"]]
        assert [x["assistant_id"] for x in c.assistants.search(name="bot")] == [a["assistant_id"]]
        assert len(c.assistants.search(graph_id="configured")) == 2  # the default one and ours
        assert c.assistants.count(graph_id="configured") == 2 and c.assistants.count(metadata={"team": "a"}) == 1
        assert c.assistants.count() == 4
        b = c.assistants.create("steps", name="Another", metadata={"team": "b"})
        page = c.assistants.search(sort_by="name", sort_order="asc", limit=2, response_format="object")
        assert [x["name"] for x in page["assistants"]] == ["Another", "Bot One"] and page["next"] == "2"
        assert c.assistants.search(select=["assistant_id", "name"], metadata={"team": "b"}) == [
            {"assistant_id": b["assistant_id"], "name": "Another"}
        ]
        # if_exists: raise (409) or do_nothing (the existing one).
        assert status_of(lambda: c.assistants.create("steps", assistant_id=b["assistant_id"])) == 409
        same = c.assistants.create("configured", assistant_id=b["assistant_id"], if_exists="do_nothing")
        assert same == c.assistants.get(b["assistant_id"])

    def test_update_makes_versions_and_set_latest_goes_back(self, served: Served) -> None:
        c = served.sync()
        a = c.assistants.create("configured", context={"model": "m1"}, metadata={"team": "a"}, name="v1")
        aid = a["assistant_id"]
        b = c.assistants.update(aid, context={"model": "m2"}, metadata={"stage": "two"}, name="v2")
        assert b["version"] == 2 and b["context"] == {"model": "m2"} and b["name"] == "v2"
        assert b["metadata"] == {"team": "a", "stage": "two"}  # merged
        assert b["config"] == {"configurable": {"model": "m2"}}
        versions = c.assistants.get_versions(aid)
        assert [v["version"] for v in versions] == [2, 1]
        assert versions[1]["context"] == {"model": "m1"} and versions[1]["name"] == "v1"
        assert {"assistant_id", "graph_id", "config", "context", "metadata", "created_at", "name"} <= set(versions[0])
        assert [v["version"] for v in c.assistants.get_versions(aid, metadata={"stage": "two"})] == [2]
        back = c.assistants.set_latest(aid, 1)
        assert back["version"] == 1 and back["context"] == {"model": "m1"} and back["name"] == "v1"
        assert c.assistants.get(aid)["version"] == 1
        again = c.assistants.update(aid, name="v3")
        assert again["version"] == 3 and again["context"] == {"model": "m1"}  # from the current one: version 1
        assert status_of(lambda: c.assistants.set_latest(aid, 9)) == 404
        # Config and context as langgraph dev keeps them: a config without configurable replaces the
        # config and keeps the context; a configurable is the context.
        tags = c.assistants.update(aid, config={"tags": ["x"]})
        assert tags["config"] == {"tags": ["x"]} and tags["context"] == {"model": "m1"}
        conf = c.assistants.update(aid, config={"configurable": {"model": "m3"}})
        assert conf["config"] == {"configurable": {"model": "m3"}} and conf["context"] == {"model": "m3"}
        # A served graph's default assistant gets versions too.
        d = c.assistants.update("steps", metadata={"owner": "ops"})
        assert d["version"] == 2 and d["metadata"] == {"created_by": "system", "owner": "ops"}
        assert [v["version"] for v in c.assistants.get_versions("steps")] == [2, 1]

    def test_delete_and_unknown_ids_are_404(self, served: Served) -> None:
        c = served.sync()
        a = c.assistants.create("steps")
        c.assistants.delete(a["assistant_id"])
        missing = str(uuid.uuid4())
        for aid in (a["assistant_id"], missing):
            assert status_of(lambda aid=aid: c.assistants.get(aid)) == 404
            assert status_of(lambda aid=aid: c.assistants.update(aid, name="x")) == 404
            assert status_of(lambda aid=aid: c.assistants.delete(aid)) == 404
            assert status_of(lambda aid=aid: c.assistants.get_versions(aid)) == 404
            assert status_of(lambda aid=aid: c.assistants.set_latest(aid, 1)) == 404
            assert status_of(lambda aid=aid: c.assistants.get_graph(aid)) == 404
        assert status_of(lambda: c.assistants.create("no-such-graph")) == 404
        assert status_of(lambda: c.assistants.search(graph_id="no-such-graph")) == 404
        assert status_of(lambda: c.assistants.delete("steps")) == 409  # a served graph's own stays
        kept = c.assistants.create("steps")["assistant_id"]
        assert status_of(lambda: c.assistants.delete(kept, delete_threads=True)) == 422  # refused, not ignored
        assert c.assistants.get(kept)["assistant_id"] == kept
        tid = c.threads.create()["thread_id"]
        assert status_of(lambda: c.runs.wait(tid, a["assistant_id"], input={"log": []})) == 404
        assert status_of(lambda: c.runs.wait(tid, "no-such-graph", input={"log": []})) == 422  # as langgraph dev

    def test_bad_input_is_422_saying_what_and_nothing_is_written(self, served: Served) -> None:
        c = served.sync()
        before = c.assistants.count()
        with served.http() as h:
            for body, said in [
                ({}, "graph_id"),
                ({"graph_id": "steps", "assistant_id": "not-a-uuid"}, "UUID"),
                ({"graph_id": "steps", "config": []}, "config"),
                ({"graph_id": "steps", "config": {"recursion_limit": "x"}}, "recursion_limit"),
                ({"graph_id": "steps", "config": {"tags": "a"}}, "tags"),
                ({"graph_id": "steps", "context": "x"}, "context"),
                ({"graph_id": "steps", "metadata": 3}, "metadata"),
                ({"graph_id": "steps", "name": 3}, "name"),
                ({"graph_id": "steps", "if_exists": "replace"}, "if_exists"),
            ]:
                r = h.post("/assistants", json=body)
                assert r.status_code == 422 and said in r.json()["detail"], (body, r.text)
            both = h.post("/assistants", json={"graph_id": "steps", "context": {"a": 1},
                                               "config": {"configurable": {"a": 2}}})  # fmt: skip
            assert both.status_code == 400 and "both configurable and context" in both.json()["detail"]
            for body in ({"limit": 0}, {"sort_by": "color"}, {"sort_order": "up"}, {"select": ["nope"]},
                         {"metadata": "x"}):  # fmt: skip
                assert h.post("/assistants/search", json=body).status_code == 422, body
            assert h.patch("/assistants/steps", json={"config": {"tags": 1}}).status_code == 422
            assert h.post("/assistants/steps/latest", json={"version": "1"}).status_code == 422
        assert c.assistants.count() == before and c.assistants.get("steps")["version"] == 1

    def test_a_run_on_a_created_assistant_gets_its_config_and_context(self, served: Served) -> None:
        c = served.sync()
        a = c.assistants.create("configured", context={"model": "m1", "tone": "dry"}, config={"tags": ["t1"]})
        tid = c.threads.create()["thread_id"]
        out = c.runs.wait(tid, a["assistant_id"], input={"log": []})
        assert out["log"] == ["model:m1", "tone:dry", "tags:['t1']"]
        # The run's context over the assistant's, key by key.
        out = c.runs.wait(tid, a["assistant_id"], input={"log": []}, context={"tone": "warm"})
        assert out["log"][-3:] == ["model:m1", "tone:warm", "tags:['t1']"]
        runs = c.runs.list(tid)
        assert {r["assistant_id"] for r in runs} == {a["assistant_id"]}
        # A new version is what the next run gets; the graph's default assistant has none of it.
        # (An update's context is its whole config, as LangGraph's server keeps them: the tags go.)
        c.assistants.update(a["assistant_id"], context={"model": "m2"})
        assert c.runs.wait(None, a["assistant_id"], input={"log": []})["log"] == ["model:m2", "tone:None", "tags:[]"]
        assert c.runs.wait(None, "configured", input={"log": []})["log"] == ["model:None", "tone:None", "tags:[]"]
        # Its graph and schemas, as the default assistant's.
        assert {n["id"] for n in c.assistants.get_graph(a["assistant_id"])["nodes"]} >= {"say"}
        schemas = c.assistants.get_schemas(a["assistant_id"])
        assert schemas["graph_id"] == "configured"
        # The state channel by channel, as LangGraph's server builds it: State is a typing.TypedDict,
        # which pydantic refuses before Python 3.12 (the input schema is null there; this is not).
        assert schemas["state_schema"]["properties"]["log"]["type"] == "array"
        n = c.assistants.create("nested")
        assert set(c.assistants.get_subgraphs(n["assistant_id"])) == {"inner"}


#: The Redis Cluster too (the CLI, ``--cluster``), for what two servers share.
on_every_backend = pytest.mark.parametrize(
    "backend",
    [pytest.param("fake", marks=pytest.mark.fakeredis), "real", pytest.param("cluster", marks=pytest.mark.cluster)],
    indirect=True,
)


@on_every_backend
class TestShared:
    def test_assistants_survive_a_restart_and_two_servers_share_them(self, backend: Any, namespace: str) -> None:
        with serve(backend, namespace) as one:
            a = one.sync().assistants.create("configured", context={"model": "m1"}, name="kept")
            with serve(backend, namespace) as two:
                c2 = two.sync()
                assert c2.assistants.get(a["assistant_id"]) == a
                # A served graph's default assistant too: the same one, created once.
                default = one.sync().assistants.get("steps")
                assert c2.assistants.get("steps") == default
                b = c2.assistants.update(a["assistant_id"], context={"model": "m2"})
                assert one.sync().assistants.get(a["assistant_id"]) == b
                assert one.sync().runs.wait(None, a["assistant_id"], input={"log": []})["log"][0] == "model:m2"
        with serve(backend, namespace) as again:
            c = again.sync()
            assert c.assistants.get(a["assistant_id"])["version"] == 2
            assert c.assistants.get("steps") == default
            assert [v["version"] for v in c.assistants.get_versions(a["assistant_id"])] == [2, 1]
        # A server that does not serve the assistant's graph does not show it.
        with serve(backend, namespace, {"steps": GRAPHS["steps"]}) as other:
            c = other.sync()
            assert status_of(lambda: c.assistants.get(a["assistant_id"])) == 404
            assert {x["graph_id"] for x in c.assistants.search(limit=100)} == {"steps"}

    def test_concurrent_updates_from_two_servers_lose_no_version(self, backend: Any, namespace: str) -> None:
        import concurrent.futures

        with serve(backend, namespace) as one, serve(backend, namespace) as two:
            aid = one.sync().assistants.create("steps")["assistant_id"]
            clients = [one.sync(), two.sync()]

            def bump(i: int) -> int:
                return int(clients[i % 2].assistants.update(aid, metadata={f"k{i}": i})["version"])

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                got = sorted(pool.map(bump, range(24)))
            assert got == list(range(2, 26))  # each update its own version
            final = one.sync().assistants.get(aid)
            assert final["version"] == 25 and all(final["metadata"][f"k{i}"] == i for i in range(24))
