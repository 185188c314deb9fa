"""``agentstate serve``'s ``POST /runs/batch`` (``runs.create_batch``): stateless background runs,
several in one request, judged by the real ``langgraph-sdk`` client, on fakeredis (the app in a
thread) and a real redis-server (the CLI)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from test_serve import Served
from test_serve_assistants import on_fake_and_real, serve


@pytest.fixture
def served(backend: Any, namespace: str) -> Iterator[Served]:
    with serve(backend, namespace) as s:
        yield s


@on_fake_and_real
class TestRunsBatch:
    def test_a_batch_creates_each_run_in_order_on_its_own_thread(self, served: Served) -> None:
        c = served.sync()
        bot = c.assistants.create("configured", context={"model": "m1"})
        runs = c.runs.create_batch([
            {"assistant_id": "steps", "input": {"log": ["one"]}},
            {"assistant_id": "steps", "input": {"log": ["two"]}, "metadata": {"k": 2}},
            {"assistant_id": bot["assistant_id"], "input": {"log": []}},
        ])  # fmt: skip
        assert len(runs) == 3 and len({r["thread_id"] for r in runs}) == 3
        assert [r["assistant_id"] for r in runs] == [c.assistants.get("steps")["assistant_id"]] * 2 + [
            bot["assistant_id"]
        ]
        assert runs[1]["metadata"]["k"] == 2
        assert all(r["status"] in ("pending", "running", "success") for r in runs)
        outs = [c.runs.join(r["thread_id"], r["run_id"]) for r in runs]
        assert outs[0] == {"log": ["one", "a", "b", "c"]} and outs[1] == {"log": ["two", "a", "b", "c"]}
        assert outs[2]["log"][0] == "model:m1"  # the assistant's context applied
        assert [c.runs.get(r["thread_id"], r["run_id"])["status"] for r in runs] == ["success"] * 3

    def test_a_bad_payload_refuses_the_batch_before_any_run_is_created(self, served: Served) -> None:
        c = served.sync()
        before = c.threads.count()
        good = {"assistant_id": "steps", "input": {"log": []}}
        with served.http() as h:
            for body, code, said in [
                ([], 422, "array"),
                ({"assistant_id": "steps"}, 422, "array"),
                ([good] * 101, 422, "array"),
                ([good, 3], 422, "payload 1"),
                ([good, {**good, "thread_id": "t"}], 422, "payload 1"),
                ([good, {**good, "assistant_id": "no-such-assistant"}], 422, "payload 1: Invalid assistant"),
                ([good, {**good, "assistant_id": str(uuid.uuid4())}], 404, "payload 1"),
                ([good, {**good, "config": []}], 422, "payload 1"),
            ]:
                r = h.post("/runs/batch", json=body)
                assert r.status_code == code and said in r.json()["detail"], (body, r.text)
        assert c.threads.count() == before  # no run, so no thread, was created
