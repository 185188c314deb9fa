"""``agentstate serve``'s thread routes beyond create/get/search: ``copy`` and ``prune``
(``delete``, ``keep_latest``), judged by the real ``langgraph-sdk`` client, on fakeredis (the app in
a thread) and a real redis-server (the CLI)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from test_serve import Served
from test_serve_assistants import on_fake_and_real, serve, status_of


@pytest.fixture
def served(backend: Any, namespace: str) -> Iterator[Served]:
    with serve(backend, namespace) as s:
        yield s


@on_fake_and_real
class TestThreadsApi:
    def test_copy_makes_a_new_thread_with_the_state_and_history(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create(metadata={"team": "a"})["thread_id"]
        c.runs.wait(tid, "steps", input={"log": ["x"]})
        copy = c.threads.copy(tid)
        new = copy["thread_id"]
        assert new != tid and copy["metadata"] == {"team": "a", "graph_id": "steps"} and copy["status"] == "idle"
        assert copy["values"] == {"log": ["x", "a", "b", "c"]}
        assert c.threads.get_state(new)["values"] == c.threads.get_state(tid)["values"]
        assert len(c.threads.get_history(new, limit=100)) == len(c.threads.get_history(tid, limit=100)) > 1
        assert c.runs.list(new) == []  # the runs stay with the source
        # Each goes on on its own.
        c.runs.wait(new, "steps", input={"log": ["y"]})
        assert c.threads.get_state(tid)["values"] == {"log": ["x", "a", "b", "c"]}
        assert c.threads.get_state(new)["values"]["log"][-4:] == ["y", "a", "b", "c"]
        # A thread with no run yet: its record only.
        empty = c.threads.create(metadata={"k": 1})["thread_id"]
        blank = c.threads.copy(empty)
        assert blank["metadata"] == {"k": 1} and blank["values"] is None
        assert status_of(lambda: c.threads.copy("no-such-thread")) == 409  # as langgraph dev answers

    def test_prune_deletes_the_threads_given(self, served: Served) -> None:
        c = served.sync()
        tids = [c.threads.create()["thread_id"] for _ in range(2)]
        keep = c.threads.create()["thread_id"]
        for tid in [*tids, keep]:
            c.runs.wait(tid, "steps", input={"log": []})
        assert c.threads.prune([*tids, "no-such-thread"]) == {"pruned_count": 2}
        for tid in tids:
            assert status_of(lambda tid=tid: c.threads.get(tid)) == 404
            assert status_of(lambda tid=tid: c.threads.get_state(tid)) == 404
        assert c.threads.get_state(keep)["values"] == {"log": ["a", "b", "c"]}
        assert c.threads.prune([]) == {"pruned_count": 0}

    def test_prune_keep_latest_keeps_each_thread_at_its_head(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        c.runs.wait(tid, "steps", input={"log": ["1"]})
        c.runs.wait(tid, "steps", input={"log": ["2"]})
        head = c.threads.get_state(tid)
        assert len(c.threads.get_history(tid, limit=100)) > 2
        assert c.threads.prune([tid], strategy="keep_latest") == {"pruned_count": 1}
        after = c.threads.get_state(tid)
        assert after["values"] == head["values"] and after["checkpoint"] == head["checkpoint"]
        assert len(c.threads.get_history(tid, limit=100)) == 1
        assert c.threads.get(tid)["metadata"]["graph_id"] == "steps"
        assert c.runs.wait(tid, "steps", input={"log": ["3"]})["log"][-4:] == ["3", "a", "b", "c"]

    def test_bad_prune_input_is_422_and_nothing_is_deleted(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        with served.http() as h:
            bad = [({"thread_ids": [tid], "strategy": "shred"}, "strategy"), ({"thread_ids": tid}, "thread_ids"),
                   ({"thread_ids": [tid, 3]}, "thread_ids")]  # fmt: skip
            for body, said in bad:
                r = h.post("/threads/prune", json=body)
                assert r.status_code == 422 and said in r.json()["detail"], (body, r.text)
        assert c.threads.get(tid)["thread_id"] == tid
        with httpx.Client(base_url=served.url) as anonymous:
            assert anonymous.post("/threads/prune", json={"thread_ids": [tid]}).status_code == 401
            assert anonymous.post(f"/threads/{tid}/copy").status_code == 401
        assert c.threads.get(tid)["thread_id"] == tid


@on_fake_and_real
class TestThreadStream:
    def test_a_thread_stream_sends_every_later_run_with_its_end(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        c.runs.wait(tid, "steps", input={"log": ["before"]})  # ended before the stream: not sent
        with served.http() as h, h.stream("GET", f"/threads/{tid}/stream", timeout=30) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            runs = [c.runs.create(tid, "steps", input={"log": [str(i)]}, multitask_strategy="enqueue")
                    for i in range(2)]  # fmt: skip
            events: list[tuple[str, Any]] = []
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[len("event: ") :]
                elif line.startswith("data: "):
                    events.append((str(name), json.loads(line[len("data: ") :])))
                    if sum(1 for n, d in events if n == "metadata" and d.get("status") == "run_done") == 2:
                        break
        done = [d["run_id"] for n, d in events if n == "metadata" and d.get("status") == "run_done"]
        assert done == [run["run_id"] for run in runs]
        finals = [d for n, d in events if n == "values" and d["log"][-1] == "c"]
        assert [f["log"][-4:] for f in finals] == [["0", "a", "b", "c"], ["1", "a", "b", "c"]]
        assert not any(x == "before" for f in finals[:1] for x in f["log"][-4:])

    def test_join_stream_of_the_sdk_reads_it(self, served: Served) -> None:
        c = served.sync()
        tid = c.threads.create()["thread_id"]
        parts: list[Any] = []
        opened = threading.Event()

        def read() -> None:
            for part in served.sync().threads.join_stream(tid):
                opened.set()
                parts.append(part)
                if part.event == "metadata" and part.data.get("status") == "run_done":
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while reader.is_alive() and time.monotonic() < deadline:  # runs until the reader has seen one end
            c.runs.wait(tid, "steps", input={"log": []})
            reader.join(0.3)
        assert not reader.is_alive()
        assert {p.event for p in parts} >= {"metadata", "values"}
        with served.http() as h:
            assert h.get("/threads/no-such-thread/stream").status_code == 404
            assert h.get(f"/threads/{tid}/stream", params={"stream_mode": "nope"}).status_code == 422
            assert h.get(f"/threads/{tid}/stream", headers={"Last-Event-ID": "1-0"}).status_code == 422
