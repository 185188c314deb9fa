"""The dashboard of ``agentstate serve``, in a real Chromium (Playwright): the login form (with a
token), live views, the actions (the session's cookie and CSRF token), and ids and reasons holding
HTML shown as text.

The server is the CLI in a subprocess over a private redis-server (``test_serve._cli``); the data
is written with the library, as a fleet would.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from test_serve import TOKEN, Served, _cli

from redis_agentstate import AgentStatus, Checkpoint, CheckpointStore

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("AGENTSTATE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
XSS = '<img src=x onerror="window.__pwned=1">'
SCRIPT_ID = "<script>window.__pwned=2</script>"
#: A thread id holds no "/" (the API puts it in the path as it is): HTML all the same.
THREAD_ID = "<b onmouseover=window.__pwned=3>t<b>"


def _chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no Chromium: install Debian's chromium package (or set AGENTSTATE_CHROMIUM)")
        pytest.skip("no Chromium on this machine")
    return CHROMIUM


@pytest.fixture
def fleet(real_url: str, namespace: str) -> Iterator[dict[str, Any]]:
    """A namespace holding a parked task, a task waiting for a person, a live lease, and ids with HTML."""
    client = redis.Redis.from_url(real_url)
    store = CheckpointStore(client, namespace=namespace, max_attempts=1)
    store.create(Checkpoint("poison"))
    cp = store.claim("poison", 1, token="w1", lease_ms=60_000)
    store.release("poison", token="w1", expected_revision=cp.revision, reason=f"ValueError: {XSS}")
    store.create(Checkpoint(SCRIPT_ID))
    held = store.claim(SCRIPT_ID, 1, token="worker-7", lease_ms=120_000)
    store.create(Checkpoint("asks"))
    asks = store.claim("asks", 1, token="w2", lease_ms=60_000)
    rev = asks.revision
    asks.cycle_index, asks.status = 1, AgentStatus.WAIT_USER
    assert store.commit(asks, token="w2", expected_revision=rev)
    yield {"store": store, "held": held}
    client.close()


@pytest.fixture
def real_url(real_server: Any) -> str:
    from conftest import require_real

    return require_real(real_server)


#: Screenshots the tests take, to look at (CI keeps the folder as an artifact): .artifacts/ unless set.
ARTIFACTS = Path(os.environ.get("AGENTSTATE_ARTIFACTS") or Path(__file__).resolve().parent.parent / ".artifacts")


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def _page(served: Served) -> Any:
    # Chromium is looked for before Playwright starts: its sync API marks an event loop as running in
    # this thread until stop(), so a skip (or any failure) after start() and before the test's own
    # try/finally left it marked, and every later asyncio test of the xdist worker failed ("Cannot run
    # the event loop while another loop is running": 2,000 errors on a machine without Chromium).
    executable = _chromium()
    pw = playwright_api.sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        # The page's CSP is bypassed for the test's own probes (Playwright evaluates them as strings), which
        # also means an inline handler slipped in through an id would run: the escaping is what is tested.
        page = browser.new_context(bypass_csp=True).new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
        page.goto(served.url + "/")
        if served.token is not None:
            _login(page, served.token)
    except BaseException:
        pw.stop()
        raise
    return pw, browser, page, dialogs


def _login(page: Any, token: str) -> None:
    """Through the login form, as a person does: a wrong token first, then the right one."""
    page.wait_for_selector("form#login", timeout=20_000)
    assert page.query_selector("#conn") is None  # nothing of the dashboard before the login
    page.fill("#token", "not-the-token")
    page.click("#login-button")
    page.wait_for_selector("text=wrong token", timeout=20_000)
    _shot(page, "login")
    page.fill("#token", token)
    page.click("#login-button")
    page.wait_for_selector("#conn", timeout=20_000)
    # The session is an HttpOnly cookie: the page's script cannot read it (nor the token, never kept).
    assert page.evaluate("document.cookie") == ""
    cookies = page.context.cookies()
    assert [(c["httpOnly"], c["sameSite"]) for c in cookies] == [(True, "Strict")]
    assert token not in cookies[0]["value"]


def _rows(page: Any, table: str) -> list[list[str]]:
    cells = "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    return page.eval_on_selector_all(f"#{table} tbody tr", cells)


class TestDashboard:
    def test_live_views_and_html_shown_as_text(self, fleet: dict[str, Any], real_url: str, namespace: str) -> None:
        with _cli(real_url, namespace, TOKEN) as served:
            pw, browser, page, dialogs = _page(served)
            try:
                page.wait_for_selector("#conn.ok", timeout=20_000)
                page.wait_for_function("document.querySelectorAll('#parked tbody tr').length === 1", timeout=20_000)
                parked = _rows(page, "parked")
                assert parked[0][0] == "poison" and parked[0][2] == f"ValueError: {XSS}"
                leases = _rows(page, "leases")
                assert [r[0] for r in leases] == [SCRIPT_ID] and leases[0][1] == "worker-7"
                assert _rows(page, "waiting")[0][0] == "asks"
                statuses = dict((r[0], r[1]) for r in _rows(page, "by-status"))
                assert statuses == {"running": "2", "wait_user": "1"}
                # The markup arrived as text: no element was made of it, no script ran.
                assert page.evaluate("window.__pwned") is None and dialogs == []
                assert page.query_selector("#parked img") is None and page.query_selector("#leases script") is None
                # Live: a commit made now shows up without a reload.
                store, held = fleet["store"], fleet["held"]
                rev = held.revision
                held.cycle_index = 1
                assert store.commit(held, token="worker-7", expected_revision=rev)
                page.wait_for_function("document.querySelectorAll('#leases tbody tr').length === 0", timeout=20_000)
                # An action the page's session cookie alone would make (no CSRF token): refused.
                forged = page.evaluate(
                    "fetch('/dashboard/api/tasks/poison/requeue?ns=' + encodeURIComponent(state.ns),"
                    " {method: 'POST', body: '{}'}).then(r => r.status)"
                )
                assert forged == 403
                page.click("#parked tbody button")
                page.wait_for_function("document.querySelectorAll('#parked tbody tr').length === 0", timeout=20_000)
                page.fill("#waiting tbody input", '"approved"')
                page.click("#waiting tbody button")
                page.wait_for_function("document.querySelectorAll('#waiting tbody tr').length === 0", timeout=20_000)
                # A task created and claimed now appears live; its cancel button (confirmed) ends it.
                store.create(Checkpoint("fresh"))
                store.claim("fresh", 1, token="w9", lease_ms=60_000)
                page.wait_for_function("[...document.querySelectorAll('#leases tbody tr')]"
                                       ".some(r => r.cells[0].textContent === 'fresh')", timeout=20_000)  # fmt: skip
                _shot(page, "live")
                page.click("#leases tbody tr button")
                page.wait_for_function("document.querySelectorAll('#leases tbody tr').length === 0", timeout=20_000)
                assert store.load("fresh").status == "cancelled" and dialogs == ["cancel task fresh?"]
                assert store.load("asks").status == "running" and store.load("poison").status == "running"
                page.wait_for_function("document.getElementById('chart').dataset !== undefined")
                # Log out: the session ends, and the page is the login form again.
                page.click("#logout")
                page.wait_for_selector("form#login", timeout=20_000)
                assert page.context.cookies() == []
            finally:
                browser.close()
                pw.stop()

    def test_threads_and_a_runs_events(self, real_url: str, namespace: str) -> None:
        with _cli(real_url, namespace, TOKEN) as served:
            c = served.sync()
            tid = c.threads.create(thread_id=THREAD_ID)["thread_id"]
            run = c.runs.create(tid, "steps", input={"log": [XSS]}, stream_mode=["values", "updates"])
            c.runs.join(tid, run["run_id"])
            pw, browser, page, dialogs = _page(served)
            try:
                page.wait_for_function("document.querySelectorAll('#threads tbody tr').length === 1", timeout=20_000)
                assert _rows(page, "threads")[0][:2] == [THREAD_ID, "steps"]
                page.click("#threads tbody button")
                page.wait_for_function("document.getElementById('run-events').textContent.includes('updates')",
                                       timeout=20_000)  # fmt: skip
                # The run ended: once its stream closed, the log holds its events alone (the stream's
                # own close, an "error" event without data, printed "error undefined" at the end).
                page.wait_for_function("state.runEvents && state.runEvents.readyState === 2", timeout=20_000)
                text = page.text_content("#run-events")
                assert "metadata" in text and XSS.replace('"', '\\"') in text
                assert "undefined" not in text and text.rstrip().splitlines()[-1].startswith("values ")
                _shot(page, "run-events")
                assert page.evaluate("window.__pwned") is None and dialogs == []
            finally:
                browser.close()
                pw.stop()

    def test_read_only_server_disables_the_buttons(self, fleet: dict[str, Any], real_url: str, namespace: str) -> None:
        with _cli(real_url, namespace, None) as served:
            pw, browser, page, _ = _page(served)
            try:
                page.wait_for_function("document.querySelectorAll('#parked tbody tr').length === 1", timeout=20_000)
                assert page.is_disabled("#parked tbody button") and page.is_hidden("#logout")
                assert page.text_content("#mode") == "read-only"
                r = httpx.post(served.url + f"/dashboard/api/tasks/poison/requeue?ns={namespace}", json={})
                assert r.status_code == 403
            finally:
                browser.close()
                pw.stop()

    def test_the_page_sends_a_strict_content_security_policy(self, real_url: str, namespace: str) -> None:
        with _cli(real_url, namespace, None) as served:
            r = httpx.get(served.url + "/")
            assert "script-src 'self'" in r.headers["content-security-policy"] and "<script src=" in r.text
            assert httpx.get(served.url + "/dashboard/static/../_app.py").status_code == 404
            t0 = time.monotonic()
            assert httpx.get(served.url + f"/dashboard/api/frame?ns={namespace}").json()["namespace"] == namespace
            assert time.monotonic() - t0 < 30
