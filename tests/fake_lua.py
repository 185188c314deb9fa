"""fakeredis compiles a script's Lua source on every EVAL/EVALSHA; here each source compiles once.

fakeredis (``commands_mixins/scripting_mixin.py``) runs every script call as
``LuaRuntime.execute(source)``: lupa parses and compiles the whole source, then calls the chunk.
Our scripts are 4-23 KB with their preludes, 0.2-0.9 ms of compiling a call on this machine's
cores, on every fakeredis call the suite makes. ``install()`` gives fakeredis a ``LuaRuntime``
whose ``execute`` compiles a source once per runtime (one runtime per ``FakeServer``) and calls the
compiled chunk after that. A chunk's top-level locals are made anew on each call, as Redis does
for each EVAL, so a script sees nothing of its previous run; errors are raised where they were (a
syntax error on the compile, inside fakeredis' own ``try``). Only the suite's fakeredis backend
is touched; a real server runs the scripts as it always does.
"""

from __future__ import annotations

from typing import Any

from fakeredis.commands_mixins import scripting_mixin

__all__ = ["install"]


class _LuaModule:
    """fakeredis' Lua module (``LUA_MODULE``, lupa's ``lua51``) with the caching runtime in it."""

    def __init__(self, module: Any) -> None:
        self._module = module

        class CompilingOnce(module.LuaRuntime):  # type: ignore[misc, name-defined]
            def execute(self, lua_code: Any, *args: Any) -> Any:
                chunks = self.__dict__.setdefault("_chunks", {})
                chunk = chunks.get(lua_code)
                if chunk is None:
                    chunk = chunks[lua_code] = self.compile(lua_code)
                return chunk(*args)

        self.LuaRuntime = CompilingOnce

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def install() -> None:
    """Make fakeredis compile each script source once per server (idempotent)."""
    if not isinstance(scripting_mixin.LUA_MODULE, _LuaModule):
        scripting_mixin.LUA_MODULE = _LuaModule(scripting_mixin.LUA_MODULE)
