"""The library's call path minus redis-py's ``Script.__call__``: a comparison driver for ``single.py``.

The profiling report proposed two cuts to the hot path: build no tenacity
``Retrying`` object per request while nothing has failed, and send each
script as one ``execute_command("EVALSHA", ...)`` instead of through
``Script.__call__`` (which rebuilds a keys+args tuple and imports ``Pipeline``
on every call). The library took the first (``wire.run_sync``
tries once outside tenacity). This driver does the second as well: the same
core, validation, scripts, ARGV and reply parsing, so ``agentstate_lean``
next to ``agentstate`` in the same rounds prices what the remaining cut would
buy. A request that is not a script call, or a script the server does not
have, is handled the long way. It reaches the store through the supported
hook, :func:`redis_agentstate.testing.internals`.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoScriptError

from redis_agentstate.testing import Call, Op, internals


class LeanDriver:
    """Runs ``CheckpointCore`` operations of ``store`` over its client the short way."""

    def __init__(self, store: Any) -> None:
        self.store = store
        inside = internals(store)
        self.core = inside.core
        self.client = inside.client
        self.scripts = inside.scripts
        self.fallback = inside.run
        self.shas = {name: s.sha for name, s in self.scripts.items()}

    def run(self, op: Op[Any]) -> Any:
        execute = self.client.execute_command
        try:
            req = next(op)
            while True:
                if not isinstance(req, Call):
                    # Not on the hot path (list pages): hand the rest to the store's own driver.
                    return self.fallback(_resume(req, op))
                keys = req.keys
                try:
                    reply = execute("EVALSHA", self.shas[req.script], len(keys), *keys, *req.args)
                except NoScriptError:
                    self.shas[req.script] = self.client.script_load(self.scripts[req.script].script)
                    continue
                req = op.send(reply)
        except StopIteration as stop:
            return stop.value
        finally:
            op.close()

    def claim(self, task_id: str, cycle_index: int, *, token: str, lease_ms: int) -> Any:
        return self.run(self.core.claim(task_id, cycle_index, token=token, lease_ms=lease_ms))

    def commit(self, cp: Any, *, token: str, expected_revision: int) -> bool:
        return bool(self.run(self.core.commit(cp, token=token, expected_revision=expected_revision)))


def _resume(first: Any, op: Op[Any]) -> Op[Any]:
    reply = yield first
    try:
        req = op.send(reply)
        while True:
            reply = yield req
            req = op.send(reply)
    except StopIteration as stop:
        return stop.value
