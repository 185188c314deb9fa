"""The thread leases' operations: acquire (waiting on the release list), renew, release.

``saver.ThreadLease`` / ``AsyncThreadLease`` drive them; a held lease's token is kept in
``SaverBase.tokens``, so every write of this saver on the thread is fenced by it.
Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..core.lease import monotonic
from ..core.validate import MAX_LEASE_MS, check_int
from ..wire import Call, Command, Op
from ..wire.scripts import Reply
from ._base import SaverBase, _ident
from .errors import ThreadBusy
from .scripts import LG_LEASE, LG_RELEASE, LG_RENEW

__all__ = ["Acquired", "ThreadLeases"]


class Acquired(NamedTuple):
    """What a thread lease's claim answered: the lease's expiry (server ms), and when (on the caller's
    clock) the attempt that claimed it was sent, from which the holder counts its renew deadline."""

    expires_at_ms: int
    sent_at: float


class ThreadLeases:
    """Claiming, renewing and releasing a thread for one writer (a part of ``SaverCore``)."""

    def __init__(self, base: SaverBase) -> None:
        self.base = base

    def acquire(
        self,
        thread_id: str,
        token: str,
        lease_ms: int,
        wait_ms: int,
        slice_ms: int | None,
        now: Callable[[], float] = monotonic,
    ) -> Op[Acquired]:
        """Claim ``thread_id`` for ``token``; returns the lease's expiry and the send time of the attempt that
        claimed it, read from ``now`` (the lease's clock) just before it: after a wait, the last attempt's.

        While it is held by another, waits on the thread's release list (``BLPOP``): woken by
        the holder's release, or at the holder's expiry, whichever is first; ``wait_ms`` is
        counted on the server clock from the first attempt. ``slice_ms`` caps one ``BLPOP``
        (inside the client's read timeout).
        """
        tid = _ident(thread_id, "thread_id")
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        check_int(wait_ms, "wait_ms", 0, MAX_LEASE_MS)
        keys = self.base.thread_keys(tid)
        deadline: int | None = None
        while True:
            sent = now()
            reply = yield Call(LG_LEASE, keys, [token, lease_ms])
            code, expires, server_ms = int(reply[0]), int(reply[1]), int(reply[2])
            if code == Reply.DONE:
                self.base.tokens[tid] = token
                return Acquired(expires, sent)
            if deadline is None:
                deadline = server_ms + wait_ms
            if server_ms >= deadline:
                raise ThreadBusy(
                    f"thread {thread_id!r} is leased by another writer (until server time {expires} ms)"
                    + (f"; waited {wait_ms} ms" if wait_ms else ""),
                    task_id=tid,
                )
            block = max(1, min(deadline, expires) - server_ms)
            if slice_ms is not None:
                block = min(block, slice_ms)
            yield Command(["BLPOP", self.base.thread_key_set(tid).released, f"{block / 1000:.3f}"])

    def renew(self, thread_id: str, token: str, lease_ms: int) -> Op[int | None]:
        reply = yield Call(LG_RENEW, self.base.thread_keys(thread_id), [token, lease_ms])
        return int(reply[1]) if int(reply[0]) == Reply.DONE else None

    def revoke(self, thread_id: str, token: str) -> Op[bool]:
        """Release the lease in Redis but keep its token here: a write still under way with it (another
        thread's) is refused as a lost lease, never written unfenced. ``forget`` drops the token after."""
        reply = yield Call(LG_RELEASE, self.base.thread_keys(thread_id), [token])
        return bool(int(reply))

    def forget(self, thread_id: str, token: str) -> None:
        """Drop a revoked lease's token (its holder's writes are over)."""
        if self.base.tokens.get(thread_id) == token:
            del self.base.tokens[thread_id]

    def release(self, thread_id: str, token: str) -> Op[bool]:
        if self.base.tokens.get(thread_id) == token:
            del self.base.tokens[thread_id]
        reply = yield Call(LG_RELEASE, self.base.thread_keys(thread_id), [token])
        return bool(int(reply))
