"""A run's ``webhook``: its final result POSTed to a URL when it ends, as LangGraph's server does.

The URL passes an SSRF guard (LangChain's: a scheme of ``http``/``https``, and no loopback,
private, shared (CGN) or link-local address unless ``allow_private``; multicast, reserved and
unspecified addresses never), checked when the run is created (a 422) and again when sending, on
the addresses the name resolves to then: the request connects to the address that was checked
(its ``Host`` and TLS server name kept), so a name that resolves elsewhere meanwhile gains nothing.

Delivery is claimed in Redis, so a run's webhook is sent by one server however many serve the
namespace: each run with a webhook has an entry in a ``KeyValueStore`` of ``<namespace>.webhooks``
(written before the run is created), which a sender takes by compare-and-set (``pending`` to
``claimed`` by it until a deadline) before it POSTs, and deletes once the receiver answered 2xx
(or the retries ran out). The server that created the run follows it and sends at once when it
ends; every server sweeps the entries every few seconds, so a run whose server died is sent by
another once it ends, and a claim whose sender died is taken over after its deadline. A sender
that dies after the receiver's 2xx and before the delete is the one case of a second delivery
(its claim lapses, another sends again).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from starlette.exceptions import HTTPException

from ..kv import AsyncKeyValueStore
from . import _shapes as shapes

if TYPE_CHECKING:
    from ..langgraph import Run
    from ._served import ServedGraph

__all__ = ["WebhookSender", "payload_of"]

log = logging.getLogger("redis_agentstate.serve.webhooks")

MAX_URL = 4096
#: Attempts at one delivery, and the waits between them (doubling from the first).
ATTEMPTS, FIRST_WAIT_S = 5, 0.5
#: How long a claim holds a delivery: the whole of its attempts and then some. A claim older than
#: this is a dead sender's, and taken over.
CLAIM_MS = 120_000
#: Seconds between two sweeps of the entries.
SWEEP_S = 2.0
#: An entry whose run does not exist after this long (never created, expired) is dropped.
ORPHAN_MS = 60_000
_HTTP_TIMEOUT_S = 10.0
#: Shared address space (RFC 6598), not ``is_private`` in every Python.
_CGN = ipaddress.ip_network("100.64.0.0/10")


class Refused(Exception):
    """The SSRF guard refused a webhook URL (the reason is the message)."""


def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified or (ip.is_reserved and not ip.is_private):
        return f"address {ip} is not a unicast host"
    private = ip.is_loopback or ip.is_link_local or ip.is_private or (ip.version == 4 and ip in _CGN)
    if private and not allow_private:
        return f"address {ip} is loopback, private or link-local (agentstate serve --webhook-allow-private)"
    return None


def _split(url: Any) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a webhook URL, or ``Refused``."""
    if not isinstance(url, str) or not url:
        raise Refused("webhook must be an absolute http(s) URL")
    if len(url) > MAX_URL:
        raise Refused("Webhook URL too long")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise Refused(f"scheme {scheme!r} not allowed (http or https)")
    host = parts.hostname or ""
    if not host:
        raise Refused("missing hostname")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise Refused("bad port") from None
    return scheme, host, port


async def resolve(url: Any, allow_private: bool) -> tuple[str, str]:
    """``(host, address)``: the URL's host and the address to connect to, every address the host
    resolves to having passed the guard; else ``Refused``."""
    _, host, port = _split(url)
    try:
        literal: Any = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addrs = [str(literal)]
    else:
        try:
            infos = await asyncio.to_thread(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise Refused(f"cannot resolve {host!r}") from None
        addrs = [str(i[4][0]) for i in infos]
        if not addrs:
            raise Refused(f"{host!r} resolves to nothing")
    for a in addrs:
        why = _refusal(ipaddress.ip_address(a.split("%")[0]), allow_private)
        if why:
            raise Refused(why)
    return host, addrs[0]


class _PinnedTransport(httpx.AsyncBaseTransport):
    """Connects each request to the address its host was checked at (guard again at send time):
    the URL carries the address, the ``Host`` header and the TLS server name the name."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host, addr = await resolve(str(request.url), self.allow_private)
        if host != addr:
            request.url = request.url.copy_with(host=addr)
            request.extensions = {**request.extensions, "sni_hostname": host}
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def payload_of(run: Run, assistant: str | None, values: Any) -> dict[str, Any]:
    """What LangGraph's server POSTs: the run, its status, when it started and ended, when the
    webhook was sent, the thread's values, and the ``error`` of a run that failed."""
    out = {
        **shapes.run_json(run, assistant),
        "status": run.status,
        "run_started_at": shapes.iso(run.started_at_ms or run.created_at_ms),
        "run_ended_at": shapes.iso(run.ended_at_ms or run.updated_at_ms),
        "webhook_sent_at": shapes.iso(time.time() * 1000),
        "values": values,
    }
    if run.status == "error":
        kind, _, message = run.error.partition(": ")
        out["error"] = {"error": kind or "Error", "message": message or run.error}
    return out


class WebhookSender:
    """The webhooks of an app's runs: checks, entries, claims, deliveries."""

    def __init__(self, client: Any, namespace: str, graphs: dict[str, ServedGraph], allow_private: bool,
                 values: Callable[[ServedGraph, Run], Awaitable[Any]],
                 drop: Callable[[ServedGraph, str], Awaitable[None]]) -> None:  # fmt: skip
        self.kv = AsyncKeyValueStore(client, namespace=f"{namespace}.webhooks")
        self.graphs, self.allow_private = graphs, allow_private
        self.values, self.drop = values, drop
        self.me = uuid.uuid4().hex
        self._tasks: set[asyncio.Future[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    async def check(self, url: Any) -> str:
        """``url`` if the guard lets it through now; else a 422 saying why."""
        try:
            await resolve(url, self.allow_private)
        except Refused as exc:
            raise HTTPException(422, f"Webhook host blocked: {exc}") from None
        return str(url)

    async def expect(self, g: ServedGraph, run_id: str, url: str, drop_thread: bool) -> None:
        """Record that run ``run_id`` (not created yet) has a webhook: before the run exists, so that no
        run ends with a webhook nobody knows of."""
        rec = {"graph": g.name, "run_id": run_id, "state": "pending", "since_ms": _now_ms(), "drop": drop_thread}
        await self.kv.set(run_id, json.dumps(rec).encode())

    def follow(self, g: ServedGraph, run_id: str) -> None:
        """Send the run's webhook as soon as it ends (this server created it)."""
        self._spawn(self._follow(g, run_id))

    async def forget(self, run_id: str) -> None:
        """The run was not created after all (refused): its entry goes."""
        await self.kv.delete(run_id)

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="agentstate-serve-webhooks")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._http is not None:
            await self._http.aclose()

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _follow(self, g: ServedGraph, run_id: str) -> None:
        while True:
            try:
                await g.queue.join(run_id, timeout_s=30)
                break
            except TimeoutError:
                continue
            except Exception:  # gone, or the thread can never run it: the sweep decides
                return
        await self.deliver(run_id)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception as exc:  # Redis away: the next sweep tries again
                log.warning("webhook sweep failed: %s", type(exc).__name__)

    async def sweep(self) -> None:
        """Deliver every entry whose run ended and nobody holds (a dead server's too); drop orphans."""
        after: str | None = None
        while True:
            ids, after = await self.kv.keys_page(after, limit=100)
            for rid in ids:
                await self.deliver(rid)
            if after is None:
                return

    async def deliver(self, run_id: str) -> bool:
        """Claim the run's delivery and send it, if its run ended and no live claim holds it; True if
        this call delivered it."""
        raw = await self.kv.get(run_id)
        if raw is None:
            return False
        rec = json.loads(raw)
        if not rec:  # a delivered entry on its way out
            return False
        now = _now_ms()
        if rec["state"] == "claimed" and rec["until_ms"] > now:
            return False
        g = self.graphs.get(rec["graph"])
        run = None if g is None else await g.queue.get(run_id)
        if g is None or run is None:
            if now - rec["since_ms"] > ORPHAN_MS and await self.kv.swap(run_id, raw, b"{}"):
                await self.kv.delete(run_id)
            return False
        if not run.done or not run.webhook:
            return False
        claimed = {**rec, "state": "claimed", "by": self.me, "until_ms": now + CLAIM_MS}
        mine = json.dumps(claimed).encode()
        if not await self.kv.swap(run_id, raw, mine):
            return False  # another sender took it first
        sent = await self._send(g, run)
        if rec.get("drop"):
            with contextlib.suppress(Exception):
                await self.drop(g, run.thread_id)
        if await self.kv.swap(run_id, mine, b"{}"):
            await self.kv.delete(run_id)
        return sent

    async def _send(self, g: ServedGraph, run: Run) -> bool:
        try:
            values = await self.values(g, run)
        except Exception:  # the thread is gone: LangGraph sends None without a checkpoint
            values = None
        body = shapes.dumps(payload_of(run, g.assistant_id, values)).encode()
        if self._http is None:
            self._http = httpx.AsyncClient(transport=_PinnedTransport(self.allow_private), timeout=_HTTP_TIMEOUT_S)
        wait = FIRST_WAIT_S
        for attempt in range(1, ATTEMPTS + 1):
            try:
                r = await self._http.post(str(run.webhook), content=body, headers={"Content-Type": "application/json"})
                if r.status_code < 300:
                    return True
                why = f"HTTP {r.status_code}"
            except Refused as exc:
                log.warning("webhook of run %s refused by the SSRF guard: %s", run.run_id, exc)
                return False
            except httpx.HTTPError as exc:
                why = type(exc).__name__
            if attempt < ATTEMPTS:
                await asyncio.sleep(wait)
                wait *= 2
        log.warning("webhook of run %s not delivered after %d attempts (%s)", run.run_id, ATTEMPTS, why)
        return False


def _now_ms() -> int:
    return int(time.time() * 1000)
