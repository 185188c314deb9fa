"""Lost replies: a script call applies on the server, then the client sees a connection error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.exceptions as rex


def on_script_calls(
    monkeypatch: pytest.MonkeyPatch, classes: tuple[type, ...], after: Callable[[Any, list[Any], list[Any], Any], Any]
) -> None:
    """Call ``after(script, keys, args, reply)`` each time the server ran a call of a script of
    ``classes`` (redis-py's ``Script``, ``AsyncScript``, or both), before the caller sees the reply;
    what ``after`` returns is what the caller gets, and what it raises the caller meets.

    The call is caught where it is sent, whichever way that is: redis-py's ``Script.__call__``
    (fakeredis, Cluster, any client a lane does not serve), or a lane's own send
    (``wire/lanes.py``, a plain client), which stays in use: the lanes take this wrapper of
    ``Script.__call__`` for redis-py's own (``lanes._SCRIPT_CALL``) as long as nothing but such
    wrappers was put on it, so the lane path users run is the one tested. ``script`` is the
    ``Script`` object called, ``keys`` and ``args`` are as the wire sends them (bytes: a call
    compares equal to its re-send whichever way each went). A call whose reply is an error
    (``NOSCRIPT`` before its script is loaded again, ``WRONGTYPE``) is not counted: ``after`` sees
    the calls the server ran to the end.
    """
    from redis.commands.core import AsyncScript

    from redis_agentstate.wire import lanes

    for cls in classes:
        is_async = issubclass(cls, AsyncScript)
        accepted = "_ASYNC_SCRIPT_CALL" if is_async else "_SCRIPT_CALL"
        original = cls.__call__

        def call(self_: Any, keys: Any = None, args: Any = None, client: Any = None, _original: Any = original) -> Any:
            result = _original(self_, keys=keys, args=args, client=client)
            wire_keys, wire_args = [_b(k) for k in keys or []], [_b(a) for a in args or []]
            if hasattr(result, "__await__"):

                async def later() -> Any:
                    return after(self_, wire_keys, wire_args, await result)

                return later()
            return after(self_, wire_keys, wire_args, result)

        if original is getattr(lanes, accepted):
            # Only wrappers of this kind on the call so far: the lanes may keep their own way (a spy of
            # another kind, put on it before, still sends every call through ``Script.__call__``).
            monkeypatch.setattr(lanes, accepted, call)
        monkeypatch.setattr(cls, "__call__", call)
        lane_cls = lanes.AsyncLane if is_async else lanes.SyncLane
        sent = lane_cls._send
        if is_async:

            async def send_async(self_: Any, packed: bytes, _sent: Any = sent) -> Any:
                reply = await _sent(self_, packed)
                return after(*_lane_call(self_, packed), reply)

            monkeypatch.setattr(lane_cls, "_send", send_async)
        else:

            def send_sync(self_: Any, packed: bytes, _sent: Any = sent) -> Any:
                reply = _sent(self_, packed)
                return after(*_lane_call(self_, packed), reply)

            monkeypatch.setattr(lane_cls, "_send", send_sync)


def _lane_call(lane: Any, packed: bytes) -> tuple[Any, list[bytes], list[bytes]]:
    """The script object, keys and args of the ``EVALSHA`` a lane packed (``lanes.pack_evalsha``)."""
    parts: list[bytes] = []
    end = packed.index(b"\r\n")
    count, pos = int(packed[1:end]), end + 2
    for _ in range(count):
        end = packed.index(b"\r\n", pos)
        size = int(packed[pos + 1 : end])
        parts.append(packed[end + 2 : end + 2 + size])
        pos = end + 2 + size + 2
    assert parts[0] == b"EVALSHA" and pos == len(packed), packed
    sha, nkeys = parts[1].decode(), int(parts[2])
    script = next(s for s in lane.scripts.values() if s.sha == sha)
    return script, parts[3 : 3 + nkeys], parts[3 + nkeys :]


def lose_first_reply(
    script: Any,
    monkeypatch: pytest.MonkeyPatch,
    *,
    between: Callable[[], Any] | None = None,
    lose: bool = True,
    any_script: bool = False,
    when: Callable[[list[Any]], bool] | None = None,
) -> list[list[Any]]:
    """Make the next call of ``script`` (a redis-py ``Script``) apply, then fail as if its reply was lost.

    ``between`` runs after the write applied and before the caller sees the outcome (other
    workers' moves); with ``lose=False`` the reply arrives after ``between`` ran. With
    ``any_script`` the next call of any script counts, not only ``script``'s; with ``when``, the
    first call whose ARGV it picks (the calls before it go through untouched and are not counted).
    Returns the ARGV of every counted call, as the wire sends it (bytes; sync and async clients,
    lane or ``Script.__call__``, alike: ``on_script_calls``).
    """
    sent: list[list[Any]] = []

    def apply_then_drop(self_: Any, keys: list[Any], args: list[Any], reply: Any) -> Any:
        if self_ is not script and not any_script:  # another store's script object: leave it alone
            return reply
        if not sent and when is not None and not when(args):
            return reply
        sent.append(args)
        if len(sent) > 1:
            return reply
        if between:
            between()
        if lose:
            raise rex.ConnectionError("reply lost (injected)")
        return reply

    on_script_calls(monkeypatch, (type(script),), apply_then_drop)
    return sent


# ---- by script name: a single call or a pipelined batch, any store, the Nth call -------------------


def _script_names() -> dict[str, str]:
    """SHA -> script name, for every script the package ships (the SHA redis-py computes)."""
    import hashlib

    import redis_agentstate.langgraph  # noqa: F401 - registers its scripts
    from redis_agentstate.wire import scripts

    names = [name[: -len(".lua")] for name in scripts.lua_files() if not name.startswith("_")]
    return {hashlib.sha1(scripts.script_text(n).encode()).hexdigest(): n for n in names}


class ReplyLoss:
    """What ``lose_reply`` saw: the call whose reply it lost, and the library's re-send of it.

    ``calls``: the (keys, args) of every call of the script while armed, in order;
    ``lost``/``resent``: the (keys, args) of the lost call and of its re-send (the first later
    call with the same keys and args); ``lost_reply``/``resent_reply``: the server's replies to
    them; ``after_lost``/``after_resent``: ``snapshot()`` taken right after the server ran each
    (for a batch, after the whole pipeline ran).
    """

    def __init__(self, name: str, nth: int, snapshot: Callable[[], Any] | None) -> None:
        self.name, self.nth, self.snapshot = name, nth, snapshot
        self.calls: list[tuple[list[Any], list[Any]]] = []
        self.lost: tuple[list[Any], list[Any]] | None = None
        self.resent: tuple[list[Any], list[Any]] | None = None
        self.lost_reply: Any = None
        self.resent_reply: Any = None
        self.after_lost: Any = None
        self.after_resent: Any = None
        self.by_sha = _script_names()

    def _seen(self, keys: Any, args: Any) -> str:
        """Count one call of the script: 'lose' (the nth), 'resent' (its re-send) or ''."""
        call = ([_b(k) for k in keys or []], [_b(a) for a in args or []])
        self.calls.append(call)
        if self.lost is None and len(self.calls) == self.nth:
            self.lost = call
            return "lose"
        if self.lost is not None and self.resent is None and call == self.lost and len(self.calls) > self.nth:
            self.resent = call
            return "resent"
        return ""

    def _after(self, what: str, reply: Any) -> None:
        shot = self.snapshot() if self.snapshot else None
        if what == "lose":
            self.lost_reply, self.after_lost = reply, shot
        else:
            self.resent_reply, self.after_resent = reply, shot

    def _batch(self, entries: Any) -> list[tuple[int, str]]:
        """Count the calls of the script in a pipeline: (entry index, what) for each."""
        marks = []
        for i, (cmd, _options) in enumerate(entries):
            if cmd and cmd[0] == "EVALSHA" and self.by_sha.get(cmd[1]) == self.name:
                nkeys = int(cmd[2])
                marks.append((i, self._seen(cmd[3 : 3 + nkeys], cmd[3 + nkeys :])))
        return marks

    def _unsee(self, marks: list[tuple[int, str]]) -> None:
        """Forget the last ``len(marks)`` calls counted (a pipeline's calls that met NOSCRIPT)."""
        for _i, what in reversed(marks):
            self.calls.pop()
            if what == "lose":
                self.lost = None
            elif what == "resent":
                self.resent = None


def _b(v: Any) -> Any:
    """A key or argument as the wire sends it (str and bytes alike), so a re-send compares equal."""
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(v).encode()
    return v


def lose_reply(
    monkeypatch: pytest.MonkeyPatch, name: str, *, nth: int = 1, snapshot: Callable[[], Any] | None = None
) -> ReplyLoss:
    """Lose the reply of the ``nth`` call of script ``name`` (from now on, by any store, sync or async,
    alone or in a pipelined batch) after the server ran it: the caller sees a ``ConnectionError``,
    as on a connection that dropped before the reply came. A batch's whole reply is lost (the
    pipeline ran, every call of it). ``snapshot`` is called right after the server ran the lost
    call and right after it ran its re-send (``ReplyLoss``)."""
    from redis.commands.core import AsyncScript, Script

    from redis_agentstate.wire import pipelines

    loss = ReplyLoss(name, nth, snapshot)
    if name not in loss.by_sha.values():
        raise ValueError(f"no script {name!r} in the package")

    def apply_then_drop(self_: Any, keys: list[Any], args: list[Any], reply: Any) -> Any:
        what = loss._seen(keys, args) if loss.by_sha.get(self_.sha) == name else ""
        if what:
            loss._after(what, reply)
        if what == "lose":
            raise rex.ConnectionError("reply lost (injected)")
        return reply

    on_script_calls(monkeypatch, (Script, AsyncScript), apply_then_drop)
    sync_pipeline, async_pipeline = pipelines._pipeline_sync, pipelines._pipeline_async

    def batch_sync(client: Any, entries: Any) -> list[Any]:
        marks = loss._batch(entries)
        replies = sync_pipeline(client, entries)
        return _batch_done(loss, marks, replies)

    async def batch_async(client: Any, entries: Any) -> list[Any]:
        marks = loss._batch(entries)
        replies = await async_pipeline(client, entries)
        return _batch_done(loss, marks, replies)

    monkeypatch.setattr(pipelines, "_pipeline_sync", batch_sync)
    monkeypatch.setattr(pipelines, "_pipeline_async", batch_async)
    return loss


def _batch_done(loss: ReplyLoss, marks: list[tuple[int, str]], replies: list[Any]) -> list[Any]:
    if any(isinstance(replies[i], rex.NoScriptError) for i, _ in marks):
        # Calls that met NOSCRIPT did not run: the batch sends them again once their script is
        # loaded, and those are the calls counted (a batch holds one script's calls all loaded or none).
        loss._unsee(marks)
        return replies
    for i, what in marks:
        if what:
            loss._after(what, replies[i])
    if any(what == "lose" for _, what in marks):
        raise rex.ConnectionError("reply lost (injected)")
    return replies
