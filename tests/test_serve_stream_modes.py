"""``stream_mode="events"`` and ``stream_mode="messages"`` on ``agentstate serve``, judged by
``langgraph-sdk`` against what ``langgraph dev`` sends (issue 41, item 3).

``events``: ``events`` parts whose data are ``astream_events`` v2 events (the graph's and its nodes'
``on_chain_start`` / ``on_chain_stream`` / ``on_chain_end``, a chat model's ``on_chat_model_*``),
with the other modes asked beside it interleaved. ``messages`` (LangGraph's server's, not
``messages-tuple``): ``messages/metadata`` the first time a message is seen, then
``messages/partial`` with the message accumulated so far while it streams, ``messages/complete`` for
a whole one. The expected values below are what ``langgraph dev`` 0.16.7 answers: with
``AGENTSTATE_LANGGRAPH_DEV`` set (its ``langgraph``), each check also runs against it (under
``CI=true`` a missing one fails); our server runs on fakeredis and on a real redis-server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import lg_stream_graphs as graphs
import pytest
from conftest import Backend, require_real
from serve_support import app_in_thread, langgraph_dev, langgraph_dev_cli, needs_311, ours_need_311

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")

from langgraph_sdk import get_sync_client

from redis_agentstate.langgraph import AgentStateSaver, GraphWorker, RunQueue

TESTS = Path(__file__).parent
TOKEN = "s3cret-token-for-tests"
GRAPHS = ("steps", "chat", "said")
HI = {"messages": [{"role": "user", "content": "hi"}]}
TOKENS = ["hello", " ", "there", " ", "friend"]


@contextlib.contextmanager
def _ours(backend: Backend, namespace: str) -> Iterator[str]:
    """``agentstate serve``'s app under uvicorn in a thread of this process."""
    from redis_agentstate.server import create_app

    app = create_app({n: getattr(graphs, n) for n in GRAPHS}, backend.new_async_client(max_connections=64),
                     namespace=namespace, token=TOKEN, workers=2)  # fmt: skip
    with app_in_thread(app) as url:
        yield url


#: Ours streams a model's tokens from an async node: LangGraph needs Python 3.11 for that.
_NEED_311 = {"test_a_chat_models_tokens", "test_a_streamed_message_grows"}


@pytest.fixture(params=[pytest.param("fake", marks=pytest.mark.fakeredis), "real", "langgraph_dev"])
def server_url(request: pytest.FixtureRequest, real_server: Any, namespace: str) -> Iterator[str]:
    if request.param == "langgraph_dev":
        with langgraph_dev(langgraph_dev_cli(), "lg_stream_graphs", GRAPHS) as url:
            yield url
        return
    if request.node.originalname in _NEED_311:
        ours_need_311(request)
    if request.param == "fake":
        backend = Backend("fake", server=fakeredis.FakeServer())
    else:
        backend = Backend("real", url=require_real(real_server))
    with _ours(backend, namespace) as url:
        yield url


def _parts(url: str, graph: str, inp: Any, mode: Any) -> list[Any]:
    c = get_sync_client(url=url, api_key=TOKEN)
    tid = c.threads.create()["thread_id"]
    return list(c.runs.stream(tid, graph, input=inp, stream_mode=mode))


def _shape(part: Any) -> tuple[Any, ...]:
    """An ``events`` part as (event, name, depth, tags); any other as (event, data)."""
    if part.event == "events":
        d = part.data
        return ("events", d["event"], d["name"], len(d["parent_ids"]), d["tags"])
    return (part.event, part.data)


def _chain(name: str, depth: int, step: int) -> list[tuple[Any, ...]]:
    tags = [f"graph:step:{step}"]
    return [("events", f"on_chain_{k}", name, depth, tags) for k in ("start", "stream", "end")]


class TestEvents:
    def test_the_graph_and_its_nodes_events_with_the_updates_between(self, server_url: str) -> None:
        parts = _parts(server_url, "steps", {"log": []}, ["events", "updates"])
        assert parts[0].event == "metadata"
        seen = [_shape(p) for p in parts[1:]]
        assert seen == [
            ("events", "on_chain_start", "steps", 0, []),
            *_chain("a", 1, 1),
            ("updates", {"a": {"log": ["a"]}}),
            *_chain("b", 1, 2),
            ("updates", {"b": {"log": ["b"]}}),
            ("events", "on_chain_end", "steps", 0, []),
        ]
        run_id = parts[0].data["run_id"]
        root_start, root_end = parts[1].data, parts[-1].data
        assert root_start["run_id"] == root_end["run_id"] == run_id  # the graph's run is the run
        assert root_start["data"] == {"input": {"log": []}} and root_end["data"] == {"output": {"log": ["a", "b"]}}
        node_end = parts[4].data
        assert node_end["data"] == {"output": {"log": ["a"]}, "input": {"log": []}}
        assert node_end["parent_ids"] == [run_id] and node_end["metadata"]["langgraph_node"] == "a"

    def test_a_chat_models_tokens(self, server_url: str) -> None:
        parts = _parts(server_url, "chat", HI, "events")
        assert [p.event for p in parts] == ["metadata"] + ["events"] * 12
        seen = [(p.data["event"], p.data["name"]) for p in parts[1:]]
        model = "GenericFakeChatModel"
        assert seen == [("on_chain_start", "chat"), ("on_chain_start", "talk"), ("on_chat_model_start", model),
                        *[("on_chat_model_stream", model)] * 5, ("on_chat_model_end", model),
                        ("on_chain_stream", "talk"), ("on_chain_end", "talk"), ("on_chain_end", "chat")]  # fmt: skip
        chunks = [p.data["data"]["chunk"] for p in parts[1:] if p.data["event"] == "on_chat_model_stream"]
        assert [(c["type"], c["content"]) for c in chunks] == [("AIMessageChunk", t) for t in TOKENS]
        end = parts[-4].data["data"]["output"]
        assert (end["type"], end["content"], end["id"]) == ("ai", "hello there friend", chunks[0]["id"])


class TestMessages:
    def test_a_streamed_message_grows(self, server_url: str) -> None:
        parts = _parts(server_url, "chat", HI, "messages")
        assert [p.event for p in parts] == ["metadata", "messages/metadata"] + ["messages/partial"] * 5
        (mid, meta), = parts[1].data.items()  # fmt: skip
        assert meta["metadata"]["langgraph_node"] == "talk" and meta["metadata"]["graph_id"] == "chat"
        grown = [p.data for p in parts[2:]]
        assert all(len(g) == 1 and g[0]["id"] == mid and g[0]["type"] == "ai" for g in grown)
        assert [g[0]["content"] for g in grown] == ["hello", "hello ", "hello there", "hello there ",
                                                    "hello there friend"]  # fmt: skip

    def test_a_whole_message_is_complete(self, server_url: str) -> None:
        parts = _parts(server_url, "said", HI, "messages")
        assert [p.event for p in parts] == ["metadata", "messages/metadata", "messages/complete"]
        assert list(parts[1].data) == ["said-1"] and parts[1].data["said-1"]["metadata"]["langgraph_node"] == "say"
        (msg,) = parts[2].data
        assert (msg["type"], msg["content"], msg["id"]) == ("ai", "all done", "said-1")
        # Asked beside messages-tuple, LangGraph's server sends the tuples alone.
        parts = _parts(server_url, "said", HI, ["messages", "messages-tuple"])
        assert [p.event for p in parts] == ["metadata", "messages"]
        msg, meta = parts[1].data
        assert (msg["content"], meta["langgraph_node"]) == ("all done", "say")


# ---- ours only: the stored events replayed (join_stream, Last-Event-ID) and the library's modes ----------

on_fake_and_real = pytest.mark.parametrize("backend", [pytest.param("fake", marks=pytest.mark.fakeredis), "real"],
                                           indirect=True)  # fmt: skip


@on_fake_and_real
@needs_311
def test_a_joined_stream_replays_the_grown_messages_and_resumes(backend: Any, namespace: str) -> None:
    with _ours(backend, namespace) as url:
        c = get_sync_client(url=url, api_key=TOKEN)
        tid = c.threads.create()["thread_id"]
        run = c.runs.create(tid, "chat", input=HI, stream_mode=["messages", "events"])
        c.runs.join(tid, run["run_id"])
        every = list(c.runs.join_stream(tid, run["run_id"]))
        assert [p.event for p in every].count("events") == 12
        grown = [p for p in c.runs.join_stream(tid, run["run_id"], stream_mode="messages")]
        assert [p.event for p in grown] == ["metadata", "messages/metadata"] + ["messages/partial"] * 5
        assert all(p.id for p in grown)
        rest = list(c.runs.join_stream(tid, run["run_id"], stream_mode="messages", last_event_id=grown[3].id))
        assert [p.data[0]["content"] for p in rest] == ["hello there", "hello there ", "hello there friend"]
        only_events = list(c.runs.join_stream(tid, run["run_id"], stream_mode="events"))
        assert [p.event for p in only_events] == ["metadata"] + ["events"] * 12


@on_fake_and_real
@needs_311
def test_the_sync_worker_records_events_and_grown_messages(backend: Any, namespace: str) -> None:
    q = RunQueue(backend.sync_client(), namespace=namespace)
    w = GraphWorker(graphs.chat, RunQueue(backend.sync_client(), namespace=namespace),
                    AgentStateSaver(backend.sync_client(), namespace=namespace), block_ms=200)  # fmt: skip
    run = q.create("t", HI, stream_mode=["events", "messages-partial", "values"])
    assert w.run_once(block_ms=2_000)
    assert q.join(run.run_id, timeout_s=10).status == "success"
    evs = list(q.stream(run.run_id))
    names = [e.event for e in evs]
    assert names[0] == "metadata" and names[-1] == "end"
    assert names.count("events") == 12 and names.count("values") == 2
    assert names.count("messages/metadata") == 1 and names.count("messages/partial") == 5
    partial = [e.data[0].content for e in evs if e.event == "messages/partial"]
    assert partial[-1] == "hello there friend"
    stream = [e.data["data"]["chunk"].content for e in evs if e.event == "events"
              and e.data["event"] == "on_chat_model_stream"]  # fmt: skip
    assert stream == TOKENS
    # An unnamed graph keeps LangChain's name here: no graph_id given.
    assert next(e.data["name"] for e in evs if e.event == "events") == "LangGraph"
