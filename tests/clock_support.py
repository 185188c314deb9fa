"""A keeper clock for tests: fake time that moves only when the test says so (``lease.Clock``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable

from redis_agentstate.lease import Clock

__all__ = ["FakeClock", "wait_for"]


class FakeClock(Clock):
    """A keeper clock that moves only when the test says so; both waits end when what they wait
    for came, or when ``advance`` has carried the fake time past their timeout."""

    def __init__(self) -> None:
        self.t = 1_000.0
        self._cond = threading.Condition()
        self.waiting = 0

    def now(self) -> float:
        with self._cond:
            return self.t

    def wait(self, event: threading.Event, timeout: float) -> bool:
        with self._cond:
            until = self.t + timeout
            self.waiting += 1
            try:
                while not event.is_set() and self.t < until:
                    self._cond.wait(0.005)
            finally:
                self.waiting -= 1
            return event.is_set()

    async def wait_async(self, wait: Callable[[float], Awaitable[bool]], timeout: float) -> bool:
        with self._cond:
            until = self.t + timeout
            self.waiting += 1
        try:
            while True:
                if await wait(0.005):
                    return True
                with self._cond:
                    if self.t >= until:
                        return False
        finally:
            with self._cond:
                self.waiting -= 1

    def advance(self, seconds: float) -> None:
        with self._cond:
            self.t += seconds
            self._cond.notify_all()


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Real-time wait for the keeper to act; generous, since only scheduling is waited on."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
