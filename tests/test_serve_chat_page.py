"""A chat front end on ``useStream`` (the React hook of ``@langchain/langgraph-sdk`` that LangChain's
Agent Chat UI is built on) in Chromium, driven by Playwright against ``agentstate serve`` and
LangChain's own server (``langgraph dev``) in one run, with the same expectations.

The page is ``tools/js_client/chat_page/`` (it calls the hook as Agent Chat UI does; the UI's own
source is on GitHub, out of CI's reach), bundled here with the pinned esbuild, React and SDK of
``tools/js_client/package.json`` and served from an origin of its own, so every API call is a
cross-origin one (CORS: ours with ``--cors-origin``). The graph is ``agent`` of
``tools/js_client/graphs.py``: a fake model streaming its reply word by word, and an interrupt for
a message starting with ``ask``.

Each step is checked on the page and on the server (``langgraph-sdk``): connect, a reply (seen
growing while it streams), an interrupt shown and resumed (``Approve``: ``submit({}, {command})``
as the UI's inbox does; ``Answer``: ``submit(undefined, {command})``), a follow-up in the same
thread, a regenerate (``submit`` from the message's parent checkpoint: a fork), the thread list
(``threads.search`` on the graph's id) showing the thread and reopening it, a reload restoring it.
The browser must see no failed request (a CORS refusal is one), no answer of 400 or more from the
API and no console error. Screenshots of each step go to ``.artifacts/`` (``$AGENTSTATE_ARTIFACTS``).

Needs Chromium, node and npm (``tools/js_client``'s packages; ``.ci/run`` installs them) and
``langgraph dev`` (``$AGENTSTATE_LANGGRAPH_DEV`` or ``langgraph`` on ``PATH``): under ``CI=true`` a
missing one is a failure, elsewhere a skip.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from conftest import require_real

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("langgraph_sdk")
pytest.importorskip("playwright.sync_api")

from langgraph_sdk import get_sync_client
from playwright.sync_api import sync_playwright
from test_serve import TOKEN

from benchmarks import servers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import js_client_check

pytestmark = [pytest.mark.slow, pytest.mark.real]

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "tools" / "js_client"
#: Screenshots to look at (CI keeps the folder): .artifacts/ unless set, as the dashboard's tests.
ARTIFACTS = Path(os.environ.get("AGENTSTATE_ARTIFACTS") or ROOT / ".artifacts")
GRAPH = "agent"
REPLY = r"You said: {} \(reply (\d+)\)"
STEP_S = 30.0


def _need(what: str, found: Any) -> Any:
    if not found:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {what} is missing")
        pytest.skip(f"{what} is missing")
    return found


@pytest.fixture(scope="module")
def page_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The page, bundled into a temp dir and served on a port of its own: its origin."""
    _need("node", shutil.which("node"))
    _need("npm", shutil.which("npm"))
    js_client_check.ensure_client()
    out = tmp_path_factory.mktemp("chat_page")
    shutil.copy(JS / "chat_page" / "index.html", out / "index.html")
    subprocess.run([str(JS / "node_modules" / ".bin" / "esbuild"), "chat_page/main.jsx", "--bundle", "--format=esm",
                    "--platform=browser", "--jsx=automatic", '--define:process.env.NODE_ENV="production"',
                    f"--outfile={out / 'main.js'}", "--log-level=warning"], cwd=JS, check=True)  # fmt: skip

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(params=["dev", "ours"])
def server(request: pytest.FixtureRequest, real_server: Any, page_origin: str) -> Iterator[tuple[str, str | None]]:
    """``(url, api key)`` of a fresh server serving ``agent``: ``langgraph dev`` or ours."""
    if request.param == "dev":
        cli = _need("langgraph dev", os.environ.get("AGENTSTATE_LANGGRAPH_DEV") or shutil.which("langgraph"))
        with servers.langgraph_dev(cli, {GRAPH: f"{JS / 'graphs.py'}:{GRAPH}"}, [JS]) as url:
            yield url, None
        return
    graphs, namespace = {GRAPH: f"graphs:{GRAPH}"}, f"chat-page-{uuid.uuid4().hex[:8]}"
    extra = ["--cors-origin", page_origin]
    with servers.agentstate_serve(
        require_real(real_server), graphs, namespace=namespace, token=TOKEN, pythonpath=[JS], extra=extra
    ) as (url, _):
        yield url, TOKEN


#: Records, in the page, every text an AI message showed (a streamed reply grows word by word).
SEEN_SCRIPT = """
window.__seen = [];
new MutationObserver(() => {
  for (const el of document.querySelectorAll('.msg[data-type="ai"] .content')) {
    const t = el.textContent;
    if (window.__seen[window.__seen.length - 1] !== t) window.__seen.push(t);
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


class Chat:
    """The page in Chromium, with what went wrong in the browser: failed requests, API answers of
    400 or more, console errors."""

    def __init__(self, page: Any, api: str, name: str) -> None:
        self.page, self.api, self.name = page, api, name
        self.problems: list[str] = []
        #: Requests answered: the hook aborts a run's stream once it read its end (ERR_ABORTED after the answer).
        self.answered: dict[int, Any] = {}
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))

    def _response(self, r: Any) -> None:
        self.answered[id(r.request)] = r.request
        if r.url.startswith(self.api) and r.status >= 400:
            self.problems.append(f"{r.status}: {r.request.method} {r.url}")

    def _failed(self, r: Any) -> None:
        if not (r.failure == "net::ERR_ABORTED" and self.answered.get(id(r)) is r):
            self.problems.append(f"failed: {r.method} {r.url} {r.failure}")

    def shot(self, step: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"chat-page-{self.name}-{step}.png"), full_page=True)
        assert not self.problems, self.problems

    def messages(self) -> list[tuple[str, str]]:
        js = "els => els.map(e => [e.dataset.type, e.querySelector('.content').textContent])"
        return [tuple(m) for m in self.page.eval_on_selector_all("#messages .msg", js)]

    def idle(self) -> None:
        self.page.wait_for_selector("#app[data-loading=false]", timeout=STEP_S * 1000)

    def until_messages(self, n: int, last: str) -> list[tuple[str, str]]:
        """Waits until the page shows ``n`` messages, the last an AI one matching ``last``, no run going."""
        deadline = time.monotonic() + STEP_S
        while True:
            shown = self.messages()
            done = self.page.get_attribute("#app", "data-loading") == "false"
            if done and len(shown) == n and shown[-1][0] == "ai" and re.fullmatch(last, shown[-1][1]):
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: wanted {n} messages ending {last!r}, shown {shown}; {self.problems}"
                )
            time.sleep(0.05)

    def send(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.click("#send")

    def thread_id(self) -> str | None:
        ids = parse_qs(urlparse(self.page.url).query).get("threadId")
        return ids[0] if ids else None


@contextlib.contextmanager
def chat_page(origin: str, api: str, key: str | None, name: str) -> Iterator[Chat]:
    executable = _need("Chromium", os.environ.get("AGENTSTATE_CHROMIUM") or shutil.which("chromium")
                       or shutil.which("chromium-browser"))  # fmt: skip
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1000, "height": 700})
        if key:  # where Agent Chat UI keeps the API key
            context.add_init_script(f"window.localStorage.setItem('lg:chat:apiKey', {json.dumps(key)})")
        context.add_init_script(SEEN_SCRIPT)
        page = context.new_page()
        chat = Chat(page, api, name)
        page.goto(f"{origin}/index.html?{urlencode({'apiUrl': api, 'assistantId': GRAPH})}")
        yield chat
        browser.close()
    finally:
        pw.stop()


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else " ".join(b["text"] for b in content if b.get("type") == "text")


def _stored(client: Any, tid: str) -> list[tuple[str, str]]:
    """The thread's messages at its head, as the page shows them."""
    return [(m["type"], _text(m)) for m in client.threads.get_state(tid)["values"]["messages"]]


def test_a_use_stream_chat_page_works_as_on_langgraph_dev(server: tuple[str, str | None], page_origin: str,
                                                          request: pytest.FixtureRequest) -> None:  # fmt: skip
    api, key = server
    name = request.node.callspec.params["server"]
    assert urlparse(api).port != urlparse(page_origin).port  # another origin: the page's calls are CORS ones
    client = get_sync_client(url=api, api_key=key)
    with chat_page(page_origin, api, key, name) as chat:
        page = chat.page
        # Connect: the page's /info (with the key, from another origin) answered.
        page.wait_for_selector("#conn[data-state=ok]", timeout=STEP_S * 1000)
        chat.idle()
        assert chat.messages() == [] and chat.thread_id() is None
        assert client.threads.search(metadata={"graph_id": GRAPH}) == []
        chat.shot("1-connect")

        # A reply: the hook makes the thread (onThreadId puts it in the URL) and streams the run.
        chat.send("hello")
        shown = chat.until_messages(2, REPLY.format("hello"))
        first_reply = shown[1][1]
        assert shown[0] == ("human", "hello")
        tid = chat.thread_id()
        assert tid is not None and page.text_content("#thread-id") == tid
        seen = page.evaluate("window.__seen")
        assert any(first_reply.startswith(s) and len(s) < len(first_reply) for s in seen if s), seen  # streamed
        assert _stored(client, tid) == shown
        thread = client.threads.get(tid)
        assert thread["status"] == "idle" and thread["metadata"]["graph_id"] == GRAPH
        assert [r["status"] for r in client.runs.list(tid)] == ["success"]
        chat.shot("2-reply")

        # An interrupt, shown and approved as the UI's inbox resumes: submit({}, {command}).
        chat.send("ask to ship")
        page.wait_for_selector("#interrupt", timeout=STEP_S * 1000)
        assert page.text_content("#interrupt .question") == "Approve: ask to ship?"
        assert chat.messages() == [*shown, ("human", "ask to ship")]
        state = client.threads.get_state(tid)
        assert state["next"] == ["confirm"]
        assert [i["value"] for t in state["tasks"] for i in t["interrupts"]] == [{"question": "Approve: ask to ship?"}]
        assert client.threads.get(tid)["status"] == "interrupted"
        chat.shot("3-interrupt")
        page.click("#approve")
        shown = chat.until_messages(4, "Approved: yes")
        assert page.query_selector("#interrupt") is None
        assert _stored(client, tid) == shown and client.threads.get(tid)["status"] == "idle"
        chat.shot("4-approved")

        # Another, answered as useStream's docs resume: submit(undefined, {command}).
        chat.send("ask again")
        page.wait_for_selector("#interrupt", timeout=STEP_S * 1000)
        assert page.text_content("#interrupt .question") == "Approve: ask again?"
        page.fill("#answer", "after lunch")
        page.click("#answer-send")
        shown = chat.until_messages(6, "Approved: after lunch")
        assert page.query_selector("#interrupt") is None
        assert _stored(client, tid) == shown and client.threads.get(tid)["status"] == "idle"
        chat.shot("5-answered")

        # A follow-up in the same thread.
        chat.send("how are you")
        shown = chat.until_messages(8, REPLY.format("how are you"))
        assert chat.thread_id() == tid
        assert _stored(client, tid) == shown
        assert [r["status"] for r in client.runs.list(tid)] == ["success"] * 6
        chat.shot("6-follow-up")

        # A regenerate of the last reply: a run from the checkpoint before it, a fork of the thread.
        old = shown[-1][1]
        page.locator("#messages .msg[data-type=ai] .regenerate").last.click()
        deadline = time.monotonic() + STEP_S
        while (now := chat.messages())[-1][1] == old or page.get_attribute("#app", "data-loading") != "false":
            assert time.monotonic() < deadline, (now, chat.problems)
            time.sleep(0.05)
        regenerated = chat.until_messages(8, REPLY.format("how are you"))
        assert regenerated[:-1] == shown[:-1] and regenerated[-1][1] != old
        assert _stored(client, tid) == regenerated
        history = client.threads.get_history(tid, limit=100)
        head = history[0]
        assert head["values"]["messages"][-1]["content"] == regenerated[-1][1]
        # The replaced reply is still in the thread's history, on a branch the head does not descend from.
        old_states = [s for s in history if any(_text(m) == old for m in s["values"].get("messages", []))]
        assert old_states
        by_id = {s["checkpoint"]["checkpoint_id"]: s for s in history}
        ancestors, at = set(), head
        while at is not None and at.get("parent_checkpoint"):
            ancestors.add(at["parent_checkpoint"]["checkpoint_id"])
            at = by_id.get(at["parent_checkpoint"]["checkpoint_id"])
        assert not ancestors & {s["checkpoint"]["checkpoint_id"] for s in old_states}
        assert [r["status"] for r in client.runs.list(tid)] == ["success"] * 7
        chat.shot("7-regenerated")

        # The thread list: a new thread empties the page, the list holds ours, a click reopens it.
        page.click("#new-thread")
        page.wait_for_function("document.querySelectorAll('#messages .msg').length === 0", timeout=STEP_S * 1000)
        assert chat.thread_id() is None
        item = page.locator(f'#threads button.thread[data-thread-id="{tid}"]')
        item.wait_for(timeout=STEP_S * 1000)
        assert item.text_content() == "hello"
        assert [t["thread_id"] for t in client.threads.search(metadata={"graph_id": GRAPH}, limit=100)] == [tid]
        chat.shot("8-thread-list")
        item.click()
        assert chat.until_messages(8, re.escape(regenerated[-1][1])) == regenerated
        assert chat.thread_id() == tid
        chat.shot("9-reopened")

        # A reload restores the thread from the URL, and starts no run.
        page.reload()
        page.wait_for_selector("#conn[data-state=ok]", timeout=STEP_S * 1000)
        assert chat.until_messages(8, re.escape(regenerated[-1][1])) == regenerated
        assert page.query_selector("#interrupt") is None
        assert len(client.runs.list(tid)) == 7
        chat.shot("10-reloaded")
