"""Lost replies: a script call applies on the server, then the client sees a connection error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.exceptions as rex


def lose_first_reply(
    script: Any,
    monkeypatch: pytest.MonkeyPatch,
    *,
    between: Callable[[], Any] | None = None,
    lose: bool = True,
    any_script: bool = False,
) -> list[list[Any]]:
    """Make the next call of ``script`` (a redis-py ``Script``) apply, then fail as if its reply was lost.

    ``between`` runs after the write applied and before the caller sees the outcome (other
    workers' moves); with ``lose=False`` the reply arrives after ``between`` ran. With
    ``any_script`` the next call of any script counts, not only ``script``'s. Returns the ARGV
    of every counted call (sync and async clients alike).
    """
    original = type(script).__call__
    sent: list[list[Any]] = []

    def apply_then_drop(self_: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        result = original(self_, keys=keys, args=args, client=client)
        if self_ is not script and not any_script:  # another store's script object: leave it alone
            return result
        sent.append(list(args or []))
        if len(sent) > 1:
            return result
        if hasattr(result, "__await__"):

            async def drop() -> Any:
                reply = await result
                if between:
                    between()
                if lose:
                    raise rex.ConnectionError("reply lost (injected)")
                return reply

            return drop()
        if between:
            between()
        if lose:
            raise rex.ConnectionError("reply lost (injected)")
        return result

    monkeypatch.setattr(type(script), "__call__", apply_then_drop)
    return sent
