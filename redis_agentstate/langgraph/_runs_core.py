"""Everything the LangGraph run queues and workers do that is not I/O: checks, requests, replies.

A run queue lives in a namespace of its own (``RunQueue(client, namespace)``). Each LangGraph
thread that ever had a run has a *task* there (a ``CheckpointStore`` task whose id is the thread
id): claimable while the thread has a run to execute, ``wait_user`` while it has none. A
``GraphWorker`` takes work with the store's woken ``claim_next`` (no polling), so the fleet's
scheduling, leases, takeovers and heartbeats are the checkpoint store's, and one thread runs on
at most one worker at a time. Beside the task, in its slot, the thread's runs (``keys.RunKeys``,
``lua/_lgrun.lua``): the active list (pending and running runs, oldest first: runs of a thread
execute in creation order), the kept history, one hash and one event stream per run.

``create`` is one script with the thread's multitask check (``lua/lg_run_create.lua``), which
also wakes the thread's task when it waits; a worker that puts the task to wait checks again
after (``lg_run_wake.lua``), so a run created meanwhile is never stranded. Every event, and the
end of a run, is fenced by the attempt's token: a worker that lost its thread (frozen, cut off)
writes nothing once another took the run over.

The sync and async queues are shells over ``RunCore``; the workers drive the same ops.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.checkpoint import CheckpointCore
from ..core.replies import text as reply_text
from ..core.validate import check_concurrency_key, check_int
from ..errors import AgentStateError, InvalidArgument, LeaseLost
from ..keys import RunKeys
from ..models import TERMINAL_STATUSES, Checkpoint
from ..wire import Batch, Call, Command, Op, Pipe
from ..wire.scripts import Reply
from . import scripts
from ._base import _ident
from .errors import RunNotFound, RunRejected

__all__ = [
    "FINAL_STATUSES",
    "MULTITASK_STRATEGIES",
    "STREAM_MODES",
    "Begun",
    "EventCursor",
    "Run",
    "RunCore",
    "RunEvent",
    "RunLost",
    "RunNotFound",
    "RunRejected",
]

RunStatus = Literal["pending", "running", "success", "error", "interrupted", "timeout"]
MultitaskStrategy = Literal["reject", "enqueue", "interrupt", "rollback"]
#: LangGraph Platform's run statuses that end a run.
FINAL_STATUSES = frozenset({"success", "error", "interrupted", "timeout"})
#: LangGraph Platform's double-texting strategies.
MULTITASK_STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")
#: The stream modes a run can record: those of ``graph.stream``; ``events``, the events of
#: ``graph.astream_events(version="v2")`` (each event named ``events``); and ``messages-partial``,
#: LangGraph's server's ``messages`` mode (each message as it grows: ``messages/metadata`` once, then
#: ``messages/partial`` or ``messages/complete`` holding it so far).
STREAM_MODES = (
    "values",
    "updates",
    "messages",
    "custom",
    "debug",
    "checkpoints",
    "tasks",
    "events",
    "messages-partial",
)

#: A run's serialized input, command, config and metadata may take this many bytes.
MAX_BODY_BYTES = 16 * 2**20
#: How long an ended run (its record and events) is kept by default: a day.
DEFAULT_RUN_TTL_MS = 24 * 3600 * 1000
#: How much longer an ended run's id entry is kept than its record. The two are keys in two slots,
#: given their TTLs by two scripts: in one round trip, but a NOSCRIPT on the end's script has it
#: re-sent after the entry's (first use, SCRIPT FLUSH), and on a Cluster they are two nodes. An
#: entry that expired first had ``get`` answer "no such run" while ``list`` still listed it; an
#: entry that outlives its record answers "no such run" once the record is gone, as the entry's
#: script documents. 5 s is far above a round trip and the local clocks' skew; the entry is a few bytes.
ID_ENTRY_GRACE_MS = 5_000
#: Events kept per run by default (the oldest go first: XADD MAXLEN).
DEFAULT_MAX_EVENTS = 10_000
#: Runs a thread may have pending or running at once by default (enqueue past it: RunRejected).
DEFAULT_MAX_ACTIVE = 100
#: Events read per round trip by ``stream``.
_EVENT_PAGE = 200
_RUN_ID_BYTES = 200
_KNOWN_THREADS = 10_000
_TERMINAL = frozenset(str(getattr(s, "value", s)) for s in TERMINAL_STATUSES)


class RunLost(LeaseLost):
    """A worker's attempt no longer runs its run (taken over after its lease lapsed, or ended)."""


@dataclass(frozen=True)
class RunEvent:
    """One event of a run's stream: its stream id (resume with ``after=id``), the event name
    (a stream mode, or ``metadata`` / ``end``) and its data."""

    id: str
    event: str
    data: Any


@dataclass(frozen=True)
class Run:
    """A run of a LangGraph thread, as stored (LangGraph Platform's fields where they exist)."""

    run_id: str
    thread_id: str
    status: RunStatus
    multitask_strategy: MultitaskStrategy
    stream_mode: list[str]
    created_at_ms: int
    updated_at_ms: int
    attempt: int = 0
    worker: str = ""
    error: str = ""
    input: Any = None
    command: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    #: A stop asked of a running run (``interrupt`` or ``rollback``), '' for none.
    cancel: str = ""
    #: Stream the events of subgraphs too (named ``<mode>|<namespace>``, as LangGraph's server does).
    subgraphs: bool = False
    #: Nodes the graph stops before / after (``"*"``: all), as ``graph.stream``'s arguments; None: none.
    interrupt_before: list[str] | str | None = None
    interrupt_after: list[str] | str | None = None
    #: A URL the run's final result is POSTed to when it ends (the server sends it), None for none.
    webhook: str | None = None
    #: Server ms before which the run does not start (``after_ms`` of its create); None: at once.
    not_before_ms: int | None = None

    @property
    def done(self) -> bool:
        """True once the run has a final status."""
        return self.status in FINAL_STATUSES


@dataclass(frozen=True)
class Begun:
    """What ``begin`` handed a worker: a run to execute (``rollback`` False) or one to delete."""

    run: Run
    attempt: int
    #: The run was running before this attempt (a takeover: resume from the last checkpoint).
    resumed: bool
    rollback: bool = False
    #: The thread's next run is not due yet: put the thread off this many ms (``run`` is not to execute).
    later_ms: int = 0


def _ms(v: Any) -> int | None:
    s = reply_text(v) if v is not None else ""
    return int(s) if s else None


@dataclass
class EventCursor:
    """Where a ``stream`` reader is: its run, the last id it got, when it gives up waiting."""

    run_id: str
    after: str
    block_ms: int | None
    thread_id: str | None = None
    #: monotonic seconds of the last event (or the start): ``block_ms`` counts from it.
    last_at: float = field(default_factory=time.monotonic)
    done: bool = False
    #: ``thread_id`` is what this client's own create of the run answered, not read from the run's
    #: id entry: if the run is not found there, the entry is read after all (the id may be another
    #: thread's run by now: deleted, or expired, and created again).
    remembered: bool = False


class RunCore:
    """Validation, request building and reply parsing for one run queue's namespace."""

    def __init__(
        self,
        namespace: str,
        serde: SerializerProtocol,
        *,
        run_ttl_ms: int = DEFAULT_RUN_TTL_MS,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_active: int = DEFAULT_MAX_ACTIVE,
    ) -> None:
        # The threads' tasks: built on the same keys, so the run scripts and the task's share one layout.
        self.tasks = CheckpointCore(namespace, max_payload_bytes=2**20, history_cache=0)
        self.keys = self.tasks.keys
        self.serde = serde
        self.run_ttl_ms = check_int(run_ttl_ms, "run_ttl_ms", 0, 100 * 366 * 24 * 3600 * 1000)
        self.entry_ttl_ms = self.run_ttl_ms + ID_ENTRY_GRACE_MS  # an ended run's id entry outlives it
        self.max_events = check_int(max_events, "max_events", 1, 10_000_000)
        self.max_active = check_int(max_active, "max_active", 1, 100_000)
        #: Threads this core saw with a task (an LRU): their runs' creates skip the task's create.
        self._known: OrderedDict[str, None] = OrderedDict()
        self._threads = _RunThreads(self.thread_of)

    def _know(self, tid: str) -> None:
        self._known[tid] = None
        self._known.move_to_end(tid)
        if len(self._known) > _KNOWN_THREADS:
            self._known.popitem(last=False)

    def _dumps(self, value: Any, what: str) -> bytes:
        try:
            kind, data = self.serde.dumps_typed(value)
        except Exception as exc:  # the serializer's own error types vary: name what failed
            raise InvalidArgument(f"{what} cannot be serialized: {type(exc).__name__}: {exc}") from exc
        return kind.encode() + b"\0" + bytes(data)

    def _loads(self, blob: bytes) -> Any:
        kind, _, data = bytes(blob).partition(b"\0")
        return self.serde.loads_typed((kind.decode(), data))

    # ---- reading runs ---------------------------------------------------

    def _run(self, run_id: str, tid: str, raw: Any) -> Run | None:
        if not raw:
            return None
        h = {
            reply_text(k): v
            for k, v in (raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2], strict=True))
        }
        body = self._loads(h["body"]) if h.get("body") else {}
        return Run(
            run_id=run_id, thread_id=tid, status=reply_text(h["status"]),  # type: ignore[arg-type]
            multitask_strategy=reply_text(h.get("strategy", b"reject")),  # type: ignore[arg-type]
            stream_mode=reply_text(h.get("modes", b"values")).split(","),
            created_at_ms=_ms(h.get("created")) or 0, updated_at_ms=_ms(h.get("updated")) or 0,
            attempt=_ms(h.get("attempt")) or 0, worker=reply_text(h.get("worker", b"")),
            error=reply_text(h.get("error", b"")),
            input=body.get("input"), command=body.get("command"), config=body.get("config") or {},
            metadata=body.get("metadata") or {}, started_at_ms=_ms(h.get("started")), ended_at_ms=_ms(h.get("ended")),
            cancel=reply_text(h.get("cancel", b"")), subgraphs=bool(body.get("subgraphs")),
            interrupt_before=body.get("interrupt_before"), interrupt_after=body.get("interrupt_after"),
            webhook=body.get("webhook"), not_before_ms=_ms(h.get("after")),
        )  # fmt: skip

    def thread_of(self, run_id: str) -> Op[str | None]:
        reply = yield Command(["GET", self.keys.run_lookup(run_id)])
        return None if reply is None else reply_text(reply)

    def get(self, run_id: object) -> Op[Run | None]:
        rid = check_run_id(run_id)
        tid = yield from self.thread_of(rid)
        if tid is None:
            return None
        raw = yield Command(["HGETALL", self.keys.runs(tid).run(rid)[0]])
        return self._run(rid, tid, raw)

    def runs_of(self, thread_id: object, limit: int = 100) -> Op[list[Run]]:
        tid = _ident(thread_id, "thread_id")
        limit = check_int(limit, "limit", 1, 10_000)
        keys = self.keys.runs(tid)
        ids = yield Command(["ZRANGE", keys.history, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, limit])
        ids = [reply_text(i) for i in ids]
        if not ids:
            return []
        raws = yield Pipe([("HGETALL", keys.run(i)[0]) for i in ids])
        return [r for i, raw in zip(ids, raws, strict=True) if (r := self._run(i, tid, raw)) is not None]

    # ---- creating and cancelling ----------------------------------------

    def create(
        self,
        thread_id: object,
        input: Any = None,
        *,
        command: Any = None,
        config: Mapping[str, Any] | None = None,
        multitask_strategy: str = "reject",
        stream_mode: str | Sequence[str] = "values",
        metadata: Mapping[str, Any] | None = None,
        subgraphs: bool = False,
        run_id: str | None = None,
        interrupt_before: str | Sequence[str] | None = None,
        interrupt_after: str | Sequence[str] | None = None,
        webhook: str | None = None,
        after_ms: int = 0,
        concurrency_key: str | None = None,
    ) -> Op[Run]:
        tid = _ident(thread_id, "thread_id")
        extra = _run_options(subgraphs, interrupt_before, interrupt_after, webhook)
        after_ms = check_int(after_ms, "after_ms", 0, MAX_AFTER_MS)
        if concurrency_key is not None:
            concurrency_key = check_concurrency_key(concurrency_key)
        # A caller-chosen id makes the create idempotent: sent again, it answers the run it made.
        rid = str(uuid.uuid4()) if run_id is None else check_run_id(run_id)
        strategy = check_strategy(multitask_strategy)
        modes = check_modes(stream_mode)
        conf = _mapping(config, "config")
        md = _mapping(metadata, "metadata")
        if input is not None and command is not None:
            raise InvalidArgument("a run takes an input or a command (Command(resume=...)), not both")
        payload = {"input": input, "command": command, "config": conf, "metadata": md, **extra}
        body = self._dumps(payload, "the run's input, command, config and metadata")
        if len(body) > MAX_BODY_BYTES:
            raise InvalidArgument(f"the run's input, command, config and metadata are {len(body)} bytes, "
                                  f"over {MAX_BODY_BYTES}")  # fmt: skip
        if run_id is not None and (owner := (yield from self.thread_of(rid))) not in (None, tid):
            raise InvalidArgument(f"run {rid!r} is a run of another thread ({owner!r})")
        keys = self.keys.runs(tid)
        run_hash, run_events = keys.run(rid)
        args = [rid, strategy, ",".join(modes), body, self.run_ttl_ms, self.max_events, self.max_active, after_ms]
        # The id's entry first (a run is found as soon as it exists), in the same round trip.
        index = Call(scripts.LG_RUN_INDEX, [self.keys.run_lookup(rid)], [tid, ""])
        for attempt in range(3):
            task = self.keys.task(tid).counted()
            call = Call(scripts.LG_RUN_CREATE, [*task, keys.active, keys.history, run_hash, run_events], args)
            if attempt:
                reply = yield call
            elif tid in self._known:
                reply = (yield Batch([index, call]))[1]
            else:
                # A thread this client has not met: its task is created in the same round trip, before
                # the run (a create of a task that exists answers False and writes nothing).
                making = self.tasks.create(Checkpoint(tid, concurrency_key=concurrency_key))
                first = next(making)
                assert isinstance(first, Call)  # CheckpointCore.create sends one script call
                replies = yield Batch([index, first, call])
                with contextlib.suppress(StopIteration):
                    making.send(replies[1])
                reply = replies[2]
            if reply[0] != Reply.REFUSED or reply_text(reply[1]) != "no-task":
                break
            # The thread's task is gone (deleted around us): create it, claimable now, and send again.
            yield from self.tasks.create(Checkpoint(tid, concurrency_key=concurrency_key))
        self._know(tid)
        if reply[0] == Reply.REFUSED:
            yield Call(scripts.LG_RUN_INDEX, [self.keys.run_lookup(rid)], ["", ""])
            raise _refused(tid, reply, self.max_active, self.keys.namespace)
        self._threads.remember(rid, tid)
        # REPLY_DONE_BEFORE (this very create applied already: its reply was lost, or a reshard's seal
        # made the driver send it again) carries the first execution's answer: the same run, once.
        created = int(reply[1])
        yield from self._forget(tid, reply[3], reply[4])
        return Run(rid, tid, "pending", strategy, modes, created, created, input=input, command=command,  # type: ignore[arg-type]
                   config=conf, metadata=md, subgraphs=subgraphs, interrupt_before=extra.get("interrupt_before"),
                   interrupt_after=extra.get("interrupt_after"), webhook=webhook,
                   not_before_ms=created + after_ms if after_ms else None)  # fmt: skip

    def _forget(self, tid: str, ended: Any = (), deleted: Any = ()) -> Op[None]:
        """Runs of ``tid`` a script ended (or deleted) on its way: their id entries (in their own
        slots, so not the script's to write) expire with them, or go."""
        calls = [Call(scripts.LG_RUN_INDEX, [self.keys.run_lookup(reply_text(r))], ["", ""]) for r in deleted or ()]
        if self.run_ttl_ms:
            calls += [Call(scripts.LG_RUN_INDEX, [self.keys.run_lookup(reply_text(r))], [tid, self.entry_ttl_ms])
                      for r in ended or ()]  # fmt: skip
        if calls:
            yield Batch(calls)
        return None

    def cancel(self, run_id: object, action: str = "interrupt") -> Op[bool]:
        rid = check_run_id(run_id)
        if action not in ("interrupt", "rollback"):
            raise InvalidArgument(f"action must be 'interrupt' or 'rollback', got {action!r}")
        tid = yield from self.thread_of(rid)
        if tid is None:
            raise RunNotFound(rid)
        keys = self.keys.runs(tid)
        h, e = keys.run(rid)
        reply = yield Call(scripts.LG_RUN_CANCEL, [keys.active, keys.history, h, e, keys.stop(rid)],
                           [action, self.run_ttl_ms, self.max_events, rid, uuid.uuid4().hex])  # fmt: skip
        if reply[0] == Reply.REFUSED:
            if reply_text(reply[1]) == "missing":
                raise RunNotFound(rid)
            return False
        if reply_text(reply[1]) == "ended":
            yield from self._forget(tid, *(((), [rid]) if action == "rollback" else ([rid], ())))
        return True

    def delete(self, run_id: object) -> Op[bool]:
        rid = check_run_id(run_id)
        tid = yield from self.thread_of(rid)
        if tid is None:
            raise RunNotFound(rid)
        keys = self.keys.runs(tid)
        h, e = keys.run(rid)
        reply = yield Call(scripts.LG_RUN_DELETE, [keys.history, h, e], [rid, uuid.uuid4().hex])
        if reply[0] == Reply.REFUSED:
            if reply_text(reply[1]) == "missing":
                raise RunNotFound(rid)
            return False
        yield from self._forget(tid, (), [rid])
        return True

    # ---- events -----------------------------------------------------------

    def cursor(self, run_id: object, after: str | None, block_ms: int | None) -> EventCursor:
        rid = check_run_id(run_id)
        if after is not None:
            after = check_stream_id(after)
        if block_ms is not None:
            block_ms = check_int(block_ms, "block_ms", 0, 24 * 3600 * 1000)
        return EventCursor(rid, after or "0-0", block_ms)

    def _event(self, entry: Any) -> RunEvent:
        eid, fields = entry
        f = {
            reply_text(k): v
            for k, v in (fields.items() if isinstance(fields, Mapping) else zip(fields[::2], fields[1::2], strict=True))
        }
        kind, event, data = reply_text(f.get("type", b"")), reply_text(f.get("event", b"")), f.get("data", b"")
        value: Any
        if kind == "json":
            value = json.loads(reply_text(data))
        elif kind == "status":
            status, _, why = reply_text(data).partition(" ")
            value = {"status": status, "error": why}
        else:
            value = self.serde.loads_typed((kind, bytes(data)))
        return RunEvent(reply_text(eid), event, value)

    def events(self, cur: EventCursor, slice_ms: int | None) -> Op[list[RunEvent]]:
        """The next events after ``cur.after`` (waiting for them while the run is active, within
        ``cur.block_ms``); sets ``cur.done`` after the final one, or when there is no run.
        ``slice_ms``: the longest block the client's read timeout allows (``block_slice_ms``)."""
        tid = yield from self._threads.locate(cur)
        h, e = self.keys.runs(tid).run(cur.run_id)
        if cur.after == _MAX_ID:
            cur.done = True  # no id follows it (and Redis refuses an interval that starts past it)
            return []
        status, entries = yield _status_then_events(h, e, cur.after)
        if not entries:
            if status is None and cur.remembered and (yield from self._threads.relocate(cur)):
                return (yield from self.events(cur, slice_ms))
            cur.remembered = False
            if status is None and cur.after == "0-0":
                raise RunNotFound(cur.run_id)
            if status is None or reply_text(status) in FINAL_STATUSES:
                # Ended with its final event read (or trimmed, or the run rolled back meanwhile).
                cur.done = True
                return []
            wait = _wait_ms(cur, slice_ms)
            if wait is None:
                cur.done = True
                return []
            reply = yield Command(["XREAD", "COUNT", _EVENT_PAGE, "BLOCK", wait, "STREAMS", e, cur.after])
            entries = _xread_entries(reply)
        out = [self._event(x) for x in entries]
        if out:
            cur.after = out[-1].id
            cur.last_at = time.monotonic()
            if out[-1].event == "end":
                cur.done = True
        return out

    def join_step(self, cur: EventCursor, slice_ms: int | None, wait_ms: int | None) -> Op[Run | None]:
        """The run if it ended, else None after waiting (a slice, at most ``wait_ms``) for its end
        marker (``lgrd``: one entry once the run ended, so a join wakes once, not at every event)."""
        tid = yield from self._threads.locate(cur)
        keys = self.keys.runs(tid)
        # One round trip per wait: Redis runs a connection's commands in order, so the HGETALL runs
        # when the XREAD returns (at once if the run had ended; else when its end marker lands,
        # written by the same script as its final status, or after the slice) and reads the run as
        # it is then. The two keys share the thread's slot: one node in a Cluster too.
        wait = _slice(slice_ms, wait_ms)
        task = self.keys.task(tid).checkpoint
        _, raw, (status, term) = yield Pipe([
            ("XREAD", "COUNT", 1, "BLOCK", wait, "STREAMS", keys.done(cur.run_id), "0-0"),
            ("HGETALL", keys.run(cur.run_id)[0]), ("HMGET", task, "status", "term")])  # fmt: skip
        run = self._run(cur.run_id, tid, raw)
        if run is None and cur.remembered and (yield from self._threads.relocate(cur)):
            # Not where its create left it (the id was taken by another thread's run since: one slice spent).
            return (yield from self.join_step(cur, slice_ms, wait_ms))
        cur.remembered = False
        if run is None:
            raise RunNotFound(cur.run_id)  # rolled back, or expired
        if not run.done and status is not None and (reply_text(term or b"") == "1" or reply_text(status) in _TERMINAL):
            # The thread's task was cancelled (or ended) after this run was accepted: no worker can
            # ever claim it, so the run would never end. Say so rather than wait for ever.
            raise RunRejected(f"run {cur.run_id} can never run: the task of thread {tid!r} is "
                              f"{reply_text(status)}", thread_id=tid, run_id=cur.run_id)  # fmt: skip
        return run if run.done else None

    # ---- the worker's side -----------------------------------------------

    def begin(
        self, thread_id: str, token: str, worker: str, max_attempts: int, revision: int | None = None
    ) -> Op[Begun | None]:
        """The thread's next run, begun under ``token`` (None: none); ``revision``: of the worker's claim
        of the thread's task, checked in the same script (``RunLost`` if it is not the task's any more)."""
        keys = self.keys.runs(thread_id)
        rkeys = [keys.active, keys.history, keys.hash_prefix, keys.event_prefix]
        args: list[Any] = [token, worker, max_attempts, self.run_ttl_ms, self.max_events]
        if revision is not None:
            rkeys.append(self.keys.task(thread_id).checkpoint)
            args.append(str(revision))
        reply = yield Call(scripts.LG_RUN_BEGIN, rkeys, args)
        yield from self._forget(thread_id, reply[-1])
        if reply[0] == Reply.REFUSED and reply_text(reply[1]) == "lost":
            raise RunLost(f"thread {thread_id!r} is no longer this worker's (its task was claimed since)",
                          task_id=thread_id)  # fmt: skip
        if reply[0] == Reply.REFUSED:
            if reply_text(reply[1]) == "later":
                # The head run was created with a delay: nothing before it starts (runs of a thread go
                # in creation order); the worker puts the thread off until then.
                head = Run(reply_text(reply[2]), thread_id, "pending", "enqueue", [], 0, 0)
                return Begun(head, 0, resumed=False, later_ms=max(1, int(reply[3])))
            return None
        rid = reply_text(reply[2])
        if reply_text(reply[1]) == "rollback":
            raw = yield Command(["HGETALL", keys.run(rid)[0]])
            run = self._run(rid, thread_id, raw)
            assert run is not None
            return Begun(run, run.attempt, resumed=True, rollback=True)
        attempt, body, modes, strategy, created, before = reply[3:9]  # reply[9]: the runs it ended
        payload = self._loads(body) if body else {}
        run = Run(
            rid, thread_id, "running", reply_text(strategy), reply_text(modes).split(","), int(created), int(created),  # type: ignore[arg-type]
            attempt=int(attempt), worker=worker, input=payload.get("input"), command=payload.get("command"),
            config=payload.get("config") or {}, metadata=payload.get("metadata") or {},
            subgraphs=bool(payload.get("subgraphs")), interrupt_before=payload.get("interrupt_before"),
            interrupt_after=payload.get("interrupt_after"), webhook=payload.get("webhook"),
        )  # fmt: skip
        return Begun(run, int(attempt), resumed=reply_text(before) == "running")

    def emit(self, run: Run, token: str, events: Sequence[tuple[str, Any]], *, seq: int) -> Op[str]:
        """Append ``events`` (mode, data) to the run's stream; the stop asked of it ('' for none).
        ``seq``: this emit's number in the attempt (1, 2, ...), so a re-sent emit is not appended twice."""
        seq = check_int(seq, "seq", 1, 2**53)
        h, e = self.keys.runs(run.thread_id).run(run.run_id)
        argv: list[Any] = [token, self.max_events, seq]
        for mode, data in events:
            kind, blob = self._encode(data)
            argv += [mode, kind, blob]
        reply = yield Call(scripts.LG_RUN_EMIT, [h, e], argv)
        if reply[0] == Reply.REFUSED:
            raise RunLost(f"run {run.run_id} of thread {run.thread_id!r} is no longer this worker's",
                          task_id=run.thread_id)  # fmt: skip
        return reply_text(reply[1])

    def _encode(self, data: Any) -> tuple[str, bytes]:
        try:
            kind, blob = self.serde.dumps_typed(data)
        except Exception as exc:  # an event the serializer cannot encode: record that, not crash the run
            return "json", json.dumps({"unserializable": f"{type(exc).__name__}: {exc}"[:500]}).encode()
        return kind, bytes(blob)

    def stop_asked(self, run: Run, slice_ms: int | None) -> Op[str]:  # see stop_asked (the function)
        return (yield from stop_asked(self.keys.runs(run.thread_id), run.run_id, slice_ms))

    def finish(self, run: Run, token: str, status: str, error: str = "", *, gone: bool = False) -> Op[int]:
        """End the run (``status`` final, or ``pending``: handed back); the thread's active runs left."""
        keys = self.keys.runs(run.thread_id)
        h, e = keys.run(run.run_id)
        lookup = self.keys.run_lookup(run.run_id)
        if status == "pending":
            reply = yield Call(scripts.LG_RUN_FINISH, [keys.active, keys.history, h, e],
                               [token, "pending", "", 0, self.max_events, "0", run.run_id])  # fmt: skip
        else:
            end = Call(scripts.LG_RUN_FINISH, [keys.active, keys.history, h, e],
                       [token, status, error[:2000], self.run_ttl_ms, self.max_events, "1" if gone else "0",
                        run.run_id])  # fmt: skip
            # The id's entry expires just after the run (ID_ENTRY_GRACE_MS), or goes with a rolled-back one,
            # in the same round trip: if the end is refused (another worker took the run over), that worker's
            # end sets it again, and until then it only bounds how long the id is found.
            entry = ["", ""] if gone else [run.thread_id, self.entry_ttl_ms]
            if gone or self.run_ttl_ms:
                reply = (yield Batch([end, Call(scripts.LG_RUN_INDEX, [lookup], entry)]))[0]
            else:
                reply = yield end
        if reply[0] == Reply.REFUSED:
            raise RunLost(f"run {run.run_id} of thread {run.thread_id!r} is no longer this worker's",
                          task_id=run.thread_id)  # fmt: skip
        return int(reply[1])

    def wake(self, thread_id: str) -> Op[int]:
        """After the thread's task was put to wait: wake it if a run came meanwhile; active runs."""
        keys = self.keys.runs(thread_id)
        reply = yield Call(scripts.LG_RUN_WAKE, [*self.keys.task(thread_id).counted(), keys.active],
                           ["wake:" + uuid.uuid4().hex])  # fmt: skip
        return int(reply[2])


_U64 = 2**64 - 1
_MAX_ID = f"{_U64}-{_U64}"


class _RunThreads:
    """The thread of each run a core created lately (an LRU): a join or stream of one starts without
    reading its id entry (one round trip less), and reads it if the run is not there."""

    def __init__(self, lookup: Callable[[str], Op[str | None]]) -> None:
        self.lookup = lookup
        self.known: OrderedDict[str, str] = OrderedDict()

    def remember(self, rid: str, tid: str) -> None:
        self.known[rid] = tid
        self.known.move_to_end(rid)
        if len(self.known) > _KNOWN_THREADS:
            self.known.popitem(last=False)

    def locate(self, cur: EventCursor) -> Op[str]:
        """The thread of ``cur``'s run: remembered from the create, else read from its id entry."""
        if cur.thread_id is None:
            cur.thread_id = self.known.get(cur.run_id)
            cur.remembered = cur.thread_id is not None
        if cur.thread_id is None:
            cur.thread_id = yield from self.lookup(cur.run_id)
            if cur.thread_id is None:
                raise RunNotFound(cur.run_id)
        return cur.thread_id

    def relocate(self, cur: EventCursor) -> Op[bool]:
        """The run was not where it was remembered: True if its id entry names another thread (``cur``
        now points there), False if it names the same one, or none."""
        self.known.pop(cur.run_id, None)
        cur.remembered = False
        tid = yield from self.lookup(cur.run_id)
        if tid is None or tid == cur.thread_id:
            return False
        cur.thread_id = tid
        return True


def stop_asked(keys: RunKeys, run_id: str, slice_ms: int | None) -> Op[str]:
    """The stop a cancel asked of the running run ``run_id`` of the thread of ``keys`` (``interrupt``,
    ``rollback``), ``end`` once the run has ended (its end marker: nothing more to watch), '' if
    neither came within one blocking read (a slice the client's read timeout allows, at most a
    second): a worker blocks on it while its graph runs, so a cancel reaches a run inside a long node
    at once, and the watch's read returns when the run ends (its connection back in the pool)."""
    reply = yield Command(["XREAD", "COUNT", 1, "BLOCK", _slice(slice_ms), "STREAMS", keys.stop(run_id),
                           keys.done(run_id), "0-0", "0-0"])  # fmt: skip
    ended = False
    for stream, entries in _xread_streams(reply):
        if not entries:
            continue
        if "}:lgrs:" not in reply_text(stream):  # the end marker (a reshard may have moved the keys' tags)
            ended = True
            continue
        fields = entries[0][1]
        f = {reply_text(k): v for k, v in (fields.items() if isinstance(fields, Mapping)
                                       else zip(fields[::2], fields[1::2], strict=True))}  # fmt: skip
        return reply_text(f.get("action", b"interrupt")) or "interrupt"
    return "end" if ended else ""


# ---- checks (no state: the run queue's arguments) -----------------------


def check_run_id(value: object) -> str:
    """A run id: a non-empty id of at most ``_RUN_ID_BYTES`` bytes of UTF-8."""
    text = _ident(value, "run_id")
    if len(text.encode()) > _RUN_ID_BYTES:
        raise InvalidArgument(f"run_id is over {_RUN_ID_BYTES} bytes: {text!r:.80}")
    return text


#: The longest ``after_ms`` a run may be delayed by: a year.
MAX_AFTER_MS = 366 * 24 * 3600 * 1000


def check_interrupt_nodes(value: object, what: str) -> list[str] | str | None:
    """``interrupt_before`` / ``interrupt_after``: None, ``"*"`` (every node) or node names."""
    if value is None or value == "*":
        return value
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgument(f"{what} must be '*' or a list of node names, got {value!r:.80}")
    return list(names)


def _refused(tid: str, reply: Any, max_active: int, namespace: str) -> AgentStateError:
    """The error of a create ``lg_run_create.lua`` refused."""
    why = reply_text(reply[1])
    if why == "reject":
        other = reply_text(reply[2])
        return RunRejected(
            f"thread {tid!r} has an active run ({other}); multitask_strategy='reject' refuses another",
            thread_id=tid, run_id=other,
        )  # fmt: skip
    if why == "full":
        return RunRejected(f"thread {tid!r} has {reply_text(reply[2])} active runs, the most it may queue "
                          f"(max_active={max_active})", thread_id=tid)  # fmt: skip
    if why == "terminal":
        # Accepting it would leave a run pending for ever: no worker can claim a terminal task.
        return RunRejected(f"thread {tid!r} can run nothing: its task in {namespace!r} is "
                          f"{reply_text(reply[2])} (delete the task to start the thread afresh)",
                          thread_id=tid)  # fmt: skip
    return AgentStateError(f"creating a run on thread {tid!r} was refused: {why}")


def _run_options(subgraphs: object, before: object, after: object, webhook: object) -> dict[str, Any]:
    """A run's optional body entries (those set only): ``subgraphs``, ``interrupt_before`` /
    ``interrupt_after`` and ``webhook``, checked."""
    if not isinstance(subgraphs, bool):
        raise InvalidArgument(f"subgraphs must be a bool, got {type(subgraphs).__name__}")
    if webhook is not None and (not isinstance(webhook, str) or not webhook):
        raise InvalidArgument(f"webhook must be a URL or None, got {webhook!r:.80}")
    out: dict[str, Any] = {"subgraphs": True} if subgraphs else {}
    nodes = {k: check_interrupt_nodes(v, k) for k, v in (("interrupt_before", before), ("interrupt_after", after))}
    for k, v in (*nodes.items(), ("webhook", webhook)):
        if v is not None:
            out[k] = v
    return out


def check_strategy(value: object) -> str:
    """A multitask strategy: one of LangGraph's double-texting ones."""
    if value not in MULTITASK_STRATEGIES:
        raise InvalidArgument(f"multitask_strategy must be one of {', '.join(MULTITASK_STRATEGIES)}, got {value!r}")
    return str(value)


def check_modes(value: object) -> list[str]:
    """A stream mode or a non-empty list of them, as a list without repeats, in order."""
    modes = [value] if isinstance(value, str) else value
    if not isinstance(modes, (list, tuple)) or not modes:
        raise InvalidArgument(f"stream_mode must be a stream mode or a non-empty list of them, got {value!r}")
    out: list[str] = []
    for m in modes:
        if m not in STREAM_MODES:
            raise InvalidArgument(f"stream_mode {m!r} is not one of {', '.join(STREAM_MODES)}")
        if m not in out:
            out.append(str(m))
    return out


def _mapping(value: object, what: str) -> dict[str, Any]:
    """A dict copy of ``value`` (None: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be a dict or None, got {type(value).__name__}")
    return dict(value)


def _stream_id(s: str) -> bool:
    """``s`` is a stream id Redis takes: '<ms>-<seq>', each ASCII digits within 0..2**64-1
    (``str.isdigit`` alone takes '²' and the Arabic-Indic digits, which Redis refuses)."""
    ms, sep, seq = s.partition("-")
    return bool(sep) and all(p.isascii() and p.isdigit() and int(p) <= _U64 for p in (ms, seq))


def check_stream_id(value: object, what: str = "after") -> str:
    """``value`` as a stream id ('<ms>-<seq>'), or ``InvalidArgument`` (the queue's ``stream`` and
    ``agentstate langgraph tail --after`` check alike)."""
    if not isinstance(value, str) or not _stream_id(value):
        raise InvalidArgument(f"{what} must be an event id ('<ms>-<seq>', ASCII digits, each at most {_U64}), "
                              f"got {value!r:.80}")  # fmt: skip
    return value


#: The longest a join may be asked to wait: a year (a longer wait is a mistake, not a plan).
MAX_JOIN_S = 366 * 24 * 3600


def check_timeout_s(value: object, what: str = "timeout_s") -> float | None:
    """A join's timeout: None (no limit) or a finite number of seconds, 0..MAX_JOIN_S."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{what} must be a number of seconds or None, got {type(value).__name__} {value!r:.80}")
    # An int is compared as is: float(10**400) would overflow before any check.
    if (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= MAX_JOIN_S:
        raise InvalidArgument(f"{what} must be a finite number of seconds, 0..{MAX_JOIN_S}, got {value!r:.80}")
    return float(value)


def _xread_streams(reply: Any) -> list[tuple[Any, list[Any]]]:
    """``(stream, entries)`` of each stream of an XREAD reply, RESP2 (a list) or RESP3 (a map)."""
    if not reply:
        return []
    if isinstance(reply, Mapping):  # redis-py's RESP3 parser: {stream: [entries]}
        return [(k, list(v[0]) if v else []) for k, v in reply.items()]
    return [(s, list(entries)) for s, entries in reply]


def _status_then_events(h: str, e: str, after: str) -> Pipe:
    """A run's status, then its events after ``after``, in one round trip. In this order: a pipeline is
    not atomic, and a finish (its end event and final status in one script) that ran between an
    XRANGE and a later HGET ended the stream without its end event; read status first, a final
    status means the XRANGE saw every event there is."""
    return Pipe([("HGET", h, "status"), ("XRANGE", e, "(" + after, "+", "COUNT", _EVENT_PAGE)])


def _xread_entries(reply: Any) -> list[Any]:
    """The entries of a one-stream XREAD reply, RESP2 (a list) or RESP3 (a map)."""
    if not reply:
        return []
    if isinstance(reply, Mapping):  # redis-py's RESP3 parser: {stream: [entries]}
        return list(next(iter(reply.values()))[0])
    return list(reply[0][1])


def _wait_ms(cur: EventCursor, slice_ms: int | None) -> int | None:
    """How long the next blocking read of ``cur`` waits: a slice the client's read timeout allows (at
    most a second, so a run that ends without a final event, rolled back, is noticed), within
    ``block_ms`` of the last event; None once ``block_ms`` passed."""
    slice_ms = _slice(slice_ms)
    if cur.block_ms is None:
        return slice_ms
    left = cur.block_ms - int((time.monotonic() - cur.last_at) * 1000)
    return None if left <= 0 else min(left, slice_ms)


def _slice(slice_ms: int | None, limit_ms: int | None = None) -> int:
    """One blocking read's wait: within the client's read timeout (``slice_ms``, None: none) and
    ``limit_ms``, and at most a second, so a run that ends without a final event (rolled back) is noticed."""
    return max(1, min(slice_ms or 1000, 1000, 1000 if limit_ms is None else limit_ms))
