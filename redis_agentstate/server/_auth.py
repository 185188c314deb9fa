"""Who may call ``agentstate serve``: the token (a header, for API clients) and the dashboard's session
(a cookie, for a browser that typed the token once into the login form).

With a token every route but ``/ok`` (and the login form with its stylesheet) needs it, reads
included. A session cookie never holds the token: it is ``<issued>.<nonce>.<mac>``, the mac an
HMAC-SHA256 keyed by the token, so the server keeps no session table (any server of a fleet that
shares the token checks it) and a new token ends every session. A request that a cookie
authenticates and that changes something (any method but GET and HEAD) must also carry the
session's CSRF token (``x-csrf-token``, another HMAC of the same session, which the page reads from
``/dashboard/api/info``) and, when the browser sends one, an ``Origin`` equal to the server's own.
The cookie is ``HttpOnly`` (no script reads it) and ``SameSite=Strict`` (no other site's page
sends it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

from starlette.requests import Request

__all__ = ["COOKIE", "CSRF_HEADER", "SESSION_S", "Sessions", "header_token", "same_origin"]

COOKIE = "agentstate_session"
CSRF_HEADER = "x-csrf-token"
#: A session lasts 12 hours; then the login form again.
SESSION_S = 12 * 3600


def header_token(headers: Mapping[str, str]) -> str | None:
    """The token an API client sent (``x-api-key``, else ``Authorization: Bearer``), or None."""
    given = headers.get("x-api-key")
    if given:
        return given
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    return None


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin (``Origin``), else True."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host") or ""
    return origin in (f"{request.url.scheme}://{host}", f"http://{host}", f"https://{host}")


class Sessions:
    """Session cookies and their CSRF tokens, derived from ``token`` (never stored, never shown)."""

    def __init__(self, token: str) -> None:
        self._key = hashlib.sha256(b"agentstate-serve-session\x00" + token.encode()).digest()
        self._token = token.encode()

    def check_token(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def _mac(self, purpose: str, issued: int, nonce: str) -> str:
        return hmac.new(self._key, f"{purpose}:{issued}:{nonce}".encode(), hashlib.sha256).hexdigest()

    def new(self, now_s: float | None = None) -> str:
        """A fresh session cookie value."""
        issued, nonce = int(time.time() if now_s is None else now_s), secrets.token_urlsafe(18)
        return f"{issued}.{nonce}.{self._mac('session', issued, nonce)}"

    def _parts(self, value: str | None, now_s: float | None = None) -> tuple[int, str] | None:
        if not value or value.count(".") != 2:
            return None
        raw_issued, nonce, mac = value.split(".")
        if not raw_issued.isascii() or not raw_issued.isdigit() or raw_issued != str(int(raw_issued)):
            return None  # one spelling per session: the one it was issued with
        issued = int(raw_issued)
        now = time.time() if now_s is None else now_s
        if not 0 <= now - issued <= SESSION_S:
            return None
        return (issued, nonce) if hmac.compare_digest(mac, self._mac("session", issued, nonce)) else None

    def valid(self, value: str | None, now_s: float | None = None) -> bool:
        return self._parts(value, now_s) is not None

    def csrf(self, value: str | None) -> str | None:
        """The CSRF token of the session ``value`` (None if it is not a valid session)."""
        parts = self._parts(value)
        return None if parts is None else self._mac("csrf", *parts)

    def csrf_ok(self, value: str | None, given: str | None) -> bool:
        want = self.csrf(value)
        return want is not None and given is not None and hmac.compare_digest(want, given)
