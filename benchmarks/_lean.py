"""A PROTOTYPE of the call path proposed in the profiling report -- not the library.

It drives the library's own sans-I/O operations (``CheckpointCore``; same
validation, same Lua scripts, same ARGV, same reply parsing) but sends each
request the short way: one ``execute_command("EVALSHA", ...)`` with no
tenacity ``Retrying`` object built per request on the happy path (retries are
only set up once an error has actually happened) and no ``Script.__call__``
(which rebuilds a keys+args tuple and imports ``Pipeline`` on every call).

Measured next to the real store in the same run, it shows what those two
changes would buy. It relies on private attributes of the store (``_core``,
``_scripts``) and is used only by the benchmarks.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoScriptError

from redis_agentstate._ops import Call, Op, T, run_sync


class LeanDriver:
    """Runs ``CheckpointCore`` operations of ``store`` over ``store.client`` the short way."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.core = store._core
        self.client = store.client
        self.scripts = store._scripts
        self.shas = {name: s.sha for name, s in self.scripts.items()}

    def run(self, op: Op[T]) -> T:
        execute = self.client.execute_command
        try:
            req = next(op)
            while True:
                if not isinstance(req, Call):
                    # Not on the hot path (list pages): hand the rest to the library's driver.
                    return run_sync(self.client, self.scripts, self.store._retry, _resume(req, op))
                keys = req.keys
                try:
                    reply = execute("EVALSHA", self.shas[req.script], len(keys), *keys, *req.args)
                except NoScriptError:
                    self.shas[req.script] = self.client.script_load(self.scripts[req.script].script)
                    continue
                req = op.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()

    def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Any:
        return self.run(self.core.claim(task_id, cycle_index, token=token, lease_ms=lease_ms))

    def commit(self, cp: Any, *, token: str, expected_revision: int) -> bool:
        return bool(self.run(self.core.commit(cp, token=token, expected_revision=expected_revision)))


def first_call(op: Op[Any]) -> Call:
    """The first request of ``op``, which must be a script call (claim, commit, ...)."""
    req = next(op)
    if not isinstance(req, Call):
        raise TypeError(f"expected a script call, got {type(req).__name__}")
    return req


def finish(op: Op[T], reply: Any) -> T:
    """Feed ``op`` the reply of its first (and only) request; its result."""
    try:
        op.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise RuntimeError("operation asked for a second request")


def _resume(first: Any, op: Op[T]) -> Op[T]:
    reply = yield first
    try:
        req = op.send(reply)
        while True:
            reply = yield req
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value
