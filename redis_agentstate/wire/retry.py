"""The retry policy: bounded, jittered re-sends of connection errors, within a deadline."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as rex
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from ..errors import InvalidArgument

__all__ = ["NO_RETRY", "RetryPolicy"]

#: Errors after which the request may or may not have applied. Every request
#: this library sends is safe to re-send (see docs/design.md, "Retry-safe").
_TRANSIENT = (rex.ConnectionError, rex.TimeoutError, rex.TryAgainError, rex.ClusterDownError)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded, jittered retries of transient connection errors.

    ``attempts`` counts the first try; waits are full-jitter exponential between 0
    and ``max_wait_s``. ``max_delay_s`` is a deadline counted from the start of the
    call: no wait ends, and no attempt starts, after it. So a call returns or raises
    within ``max_delay_s`` plus the duration of one attempt, and one attempt is one
    redis-py call, bounded by the client's own settings: its ``Retry`` (redis-py 8
    retries 10 times by default, with backoff up to 1 s) and its
    ``socket_connect_timeout``/``socket_timeout`` (5 s by default). Build the client
    with ``retry=Retry(NoBackoff(), 0)`` and explicit timeouts to make the bound
    ``max_delay_s + socket_connect_timeout + socket_timeout`` (see :ref:`retries`).
    """

    attempts: int = 3
    max_wait_s: float = 0.5
    max_delay_s: float = 5.0
    multiplier_s: float = 0.05
    retry_on: tuple[type[BaseException], ...] = field(default=_TRANSIENT)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise InvalidArgument(f"RetryPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("max_wait_s", "max_delay_s", "multiplier_s"):
            value = getattr(self, name)
            # bool is an int, and NaN compares False with everything: both would slip past `< 0`.
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"RetryPolicy.{name} must be a finite number >= 0, got {value!r}")
        retry_on = self.retry_on
        if not isinstance(retry_on, tuple) or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in retry_on
        ):
            raise InvalidArgument(f"RetryPolicy.retry_on must be a tuple of exception classes, got {retry_on!r}")

    def _kwargs(self, started: float | None) -> dict[str, Any]:
        deadline = (time.monotonic() if started is None else started) + self.max_delay_s
        return {
            "stop": stop_after_attempt(self.attempts) | _StopBeforeDeadline(deadline),
            "wait": wait_random_exponential(multiplier=self.multiplier_s, max=self.max_wait_s),
            "retry": retry_if_exception_type(self.retry_on),
            "reraise": True,
        }

    def sync(self, started: float | None = None) -> Retrying:
        """The tenacity retrier of one call that began at ``started`` (``time.monotonic()``; default now)."""
        return Retrying(**self._kwargs(started))

    def asyncio(self, started: float | None = None) -> AsyncRetrying:
        """The asyncio twin of :meth:`sync`."""
        return AsyncRetrying(**self._kwargs(started))


class _StopBeforeDeadline(stop_base):
    """Stop when the next attempt would start at or after ``deadline`` (a ``time.monotonic()`` reading).

    tenacity's own ``stop_before_delay`` counts from its first attempt; ours counts
    from the call's start, so the first try (run outside tenacity) is inside it.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return time.monotonic() + retry_state.upcoming_sleep >= self.deadline


NO_RETRY = RetryPolicy(attempts=1)
