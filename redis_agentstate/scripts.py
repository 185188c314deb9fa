"""Loads the Lua scripts shipped in ``redis_agentstate/lua`` (one file per operation).

The file name, the constant below and the store method share one name. Each
checkpoint script is prefixed with ``_common.lua`` (helpers and the key
layout) before its SHA is computed; redis-py's ``Script`` objects handle
NOSCRIPT by loading the text once and retrying, so a ``SCRIPT FLUSH`` or a
fail-over to a fresh node is invisible to callers.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clients import RedisClient

__all__ = [
    "ACKNOWLEDGE_TERMINAL",
    "CHECKPOINT_SCRIPTS",
    "CLAIM",
    "CLAIM_NEXT",
    "COMMIT",
    "CREATE",
    "DELETE",
    "FINALIZE",
    "LOAD",
    "RENEW",
    "SAVE",
    "register",
    "script_text",
]

CREATE = "create"
SAVE = "save"
LOAD = "load"
CLAIM = "claim"
CLAIM_NEXT = "claim_next"
COMMIT = "commit"
RENEW = "renew"
FINALIZE = "finalize"
ACKNOWLEDGE_TERMINAL = "acknowledge_terminal"
DELETE = "delete"

CHECKPOINT_SCRIPTS = (
    CREATE, SAVE, LOAD, CLAIM, CLAIM_NEXT, COMMIT, RENEW, FINALIZE, ACKNOWLEDGE_TERMINAL, DELETE,
)  # fmt: skip

#: Which prelude each script family is built on.
_PRELUDES = {name: "_common" for name in CHECKPOINT_SCRIPTS}


def _read(name: str) -> str:
    return resources.files("redis_agentstate").joinpath("lua").joinpath(f"{name}.lua").read_text("utf-8")


@cache
def script_text(name: str) -> str:
    """The full text sent to Redis for operation ``name`` (prelude included)."""
    prelude = _PRELUDES.get(name)
    body = _read(name)
    return f"{_read(prelude)}\n{body}" if prelude else body


def add_prelude(names: tuple[str, ...], prelude: str) -> None:
    """Declare that scripts ``names`` are built on ``prelude`` (for other script families)."""
    for name in names:
        _PRELUDES[name] = prelude
    script_text.cache_clear()


def register(client: RedisClient, names: tuple[str, ...]) -> dict[str, Any]:
    """``Script`` objects (or ``AsyncScript`` for an asyncio client) bound to ``client``."""
    return {name: client.register_script(script_text(name)) for name in names}
