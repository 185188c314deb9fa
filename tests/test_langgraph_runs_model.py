"""Model-based test of the LangGraph run queue: ``RunQueue`` / ``AsyncRunQueue`` and ``GraphWorker``.

A hypothesis ``RuleBasedStateMachine`` drives two clients on one namespace (A: a sync ``RunQueue``,
B: an ``AsyncRunQueue`` on a loop of its own) and two sync ``GraphWorker``s through double-texting
(``create`` with ``reject``, ``enqueue``, ``interrupt``, ``rollback``), ``cancel`` (interrupt or
rollback), ``delete`` and the workers draining the queue, with the reply of any script of the
package lost along the way (the script applies, its reply is lost, the library re-sends: the Nth
call of a script drawn from all of them, whichever operation makes it). A model says what each
answer must be:

- ``create``: ``RunRejected`` exactly when the strategy is ``reject`` and the thread has a pending
  run; ``interrupt`` and ``rollback`` end every pending run of the thread (``interrupted``; a
  rolled-back one is gone once a worker has passed);
- ``cancel``: True for a pending run, False for an ended one; ``delete``: True for an ended run only;
- a drain (each worker's ``run_once`` until neither finds work): every pending run ends ``success``,
  each thread's in creation order, each run's input applied once.

Checked after every step, by a third client: every run's status is the model's, and each thread's
state holds the inputs of its successful runs, in order, each once (no acknowledged run lost, none
applied twice, whatever reply was lost).

Runs are seeded (``AGENTSTATE_MODEL_SEED``, as tests/test_model.py); hypothesis prints the shrunk
failing sequence of rules. ``AGENTSTATE_FULL_SUITE=1`` runs the long version.
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, TypedDict

import pytest
from conftest import Twin, full_suite
from faults.replies import _script_names, lose_reply
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from langgraph.graph import END, START, StateGraph
from model_support import run_seeded

from redis_agentstate.langgraph import (
    AgentStateSaver,
    AsyncRunQueue,
    GraphWorker,
    RunNotFound,
    RunQueue,
    RunRejected,
)

MODEL_SEED = 41
THREADS = ["t1", "t2"]
STRATEGIES = ["reject", "reject", "enqueue", "enqueue", "interrupt", "rollback"]
#: Every script of the run queue's path a lost reply can hit: the queue's, the saver's, the core's.
LOSABLE = sorted(n for n in set(_script_names().values()) if not n.startswith(("lgs_", "cron_")))


OPS = st.sampled_from(["A", "B"])
#: No loss, a loss in the queue's or the saver's scripts, or in any script (the core's: claims, releases).
LOSS = st.one_of(st.none(), st.sampled_from([n for n in LOSABLE if n.startswith("lg_")]), st.sampled_from(LOSABLE))
#: The scripts a worker's turn sends: its run's (begin, emits, finish), the saver's and its thread lease's.
WORKER_LOSS = st.sampled_from([n for n in LOSABLE if n.startswith(("lg_run_", "lg_put", "lg_lease", "lg_release"))])
#: The actions, weighted (a drain ends every queue: rarer, so that threads hold queues to double-text).
ACTIONS = ["create"] * 4 + ["cancel"] * 2 + ["delete", "drain"]
ACTIONS_ARGS: dict[str, dict[str, Any]] = {
    "create": {"op": OPS, "thread": st.sampled_from(THREADS), "strategy": st.sampled_from(STRATEGIES),
               "which": LOSS, "nth": st.integers(1, 2)},
    "cancel": {"op": OPS, "pick": st.integers(0, 10**6), "action": st.sampled_from(["interrupt", "rollback"]),
               "which": LOSS},
    "delete": {"op": OPS, "pick": st.integers(0, 10**6)},
    "drain": {"first": st.integers(0, 1), "which": st.one_of(st.none(), WORKER_LOSS, LOSS), "nth": st.integers(1, 3)},
}  # fmt: skip


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _echo(state: State) -> dict[str, Any]:
    return {"log": []}


def _graph() -> Any:
    g = StateGraph(State)
    g.add_node("echo", _echo)
    g.add_edge(START, "echo")
    g.add_edge("echo", END)
    return g.compile()


GRAPH = _graph()


@dataclass
class MRun:
    run_id: str
    thread: str
    text: str
    #: 'pending', 'success', 'interrupted', or 'gone' (rolled back: no record once a worker passed).
    status: str = "pending"
    #: A rolled-back run whose cleanup no worker has done yet: its record may still be read.
    rolled_back: bool = False


@dataclass
class Model:
    runs: dict[str, MRun] = field(default_factory=dict)
    log: dict[str, list[str]] = field(default_factory=dict)

    def pending(self, thread: str) -> list[MRun]:
        return [r for r in self.runs.values() if r.thread == thread and r.status == "pending"]


class RunMachine(RuleBasedStateMachine):
    backend: Any = None
    loop: asyncio.AbstractEventLoop | None = None
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        b = cls.backend
        self.ns = f"rm-{uuid.uuid4().hex[:10]}"
        self.queues: dict[str, Any] = {
            "A": RunQueue(b.sync_client(), namespace=self.ns),
            "B": Twin(AsyncRunQueue(b.async_client(), namespace=self.ns), cls.loop),
        }
        self.workers = [self._worker(f"w{i}") for i in range(2)]
        self.reader = RunQueue(b.sync_client(), namespace=self.ns)
        self.state = GRAPH.copy(update={"checkpointer": AgentStateSaver(b.sync_client(), namespace=self.ns)})
        self.model = Model()
        self.texts = iter(range(10**9))
        self.mp = pytest.MonkeyPatch()
        self.loss: Any = None

    def _worker(self, name: str) -> GraphWorker:
        b = type(self).backend
        saver = AgentStateSaver(b.sync_client(), namespace=self.ns)
        return GraphWorker(GRAPH, RunQueue(b.sync_client(), namespace=self.ns), saver, lease_ms=5_000, name=name)

    def teardown(self) -> None:
        self.mp.undo()

    def _lose(self, which: str | None, nth: int) -> None:
        if which is not None:
            self.loss = lose_reply(self.mp, which, nth=nth)

    def _undo(self) -> None:
        """The loss is disarmed; one that hit is counted (the run's summary says which scripts lost one)."""
        self.mp.undo()
        loss, self.loss = self.loss, None
        if loss is not None and loss.lost is not None:
            assert loss.resent is not None or loss.name.startswith("lg_run_emit"), f"{loss.name}: not re-sent"
            type(self).stats[f"reply lost: {loss.name}"] += 1

    # ---- rules ------------------------------------------------------------------------

    # ---- one rule, every action: hypothesis enables a random subset of a machine's rules per example
    # (swarm testing), which left cancel and delete mostly where no create ran; drawn here instead.

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(ACTIONS), label="action")
        draw = ACTIONS_ARGS[kind]
        getattr(self, kind)(**{name: data.draw(strategy, label=name) for name, strategy in draw.items()})

    def create(self, op: str, thread: str, strategy: str, which: str | None, nth: int) -> None:
        text = f"m{next(self.texts)}"
        run_id = str(uuid.uuid4())
        pending = self.model.pending(thread)
        self._lose(which, nth)
        try:
            if strategy == "reject" and pending:
                with pytest.raises(RunRejected):
                    self.queues[op].create(thread, {"log": [text]}, multitask_strategy=strategy, run_id=run_id)
                type(self).stats["create rejected"] += 1
                return
            run = self.queues[op].create(thread, {"log": [text]}, multitask_strategy=strategy, run_id=run_id)
        finally:
            self._undo()
        assert run.run_id == run_id and run.status == "pending", run
        if strategy in ("interrupt", "rollback"):
            for r in pending:
                self._stopped(r, strategy)
        self.model.runs[run_id] = MRun(run_id, thread, text)
        type(self).stats[f"create {strategy}"] += 1

    def _stopped(self, r: MRun, action: str) -> None:
        r.status = "interrupted"
        r.rolled_back = action == "rollback"

    def cancel(self, op: str, pick: int, action: str, which: str | None) -> None:
        if not self.model.runs:
            return
        r = list(self.model.runs.values())[pick % len(self.model.runs)]
        self._lose(which, 1)
        try:
            answered: bool | None = self.queues[op].cancel(r.run_id, action=action)
        except RunNotFound:
            answered = None
        finally:
            self._undo()
        if r.status == "gone":
            assert answered is None, (r, answered)
        elif r.rolled_back:
            assert answered in (None, False), (r, answered)  # its record is gone once a worker passed
        else:
            assert answered == (r.status == "pending"), (r, answered)
        if r.status == "pending":
            self._stopped(r, action)
        type(self).stats[f"cancel {'pending' if answered else 'ended'}"] += 1

    def delete(self, op: str, pick: int) -> None:
        ended = [r for r in self.model.runs.values() if r.status in ("success", "interrupted") and not r.rolled_back]
        if not ended:
            return
        r = ended[pick % len(ended)]
        assert self.queues[op].delete(r.run_id) is True
        r.status = "gone"
        type(self).stats["delete"] += 1

    def drain(self, first: int, which: str | None, nth: int) -> None:
        """The workers take turns until neither finds work: every pending run ends, in its thread's order."""
        self._lose(which, nth)
        try:
            idle = 0
            turn = first
            while idle < 2:
                idle = 0 if self.workers[turn % 2].run_once(block_ms=1) else idle + 1
                turn += 1
        finally:
            self._undo()
        for r in self.model.runs.values():
            if r.status == "pending":
                r.status = "success"
                self.model.log.setdefault(r.thread, []).append(r.text)
            elif r.rolled_back:
                r.status, r.rolled_back = "gone", False
        type(self).stats["drain"] += 1

    # ---- what every step must leave ----------------------------------------------------

    @invariant()
    def runs_and_threads_are_as_the_model_says(self) -> None:
        if not hasattr(self, "model"):
            return
        for r in self.model.runs.values():
            got = self.reader.get(r.run_id)
            if r.status == "gone":
                assert got is None, (r, got)
            elif r.rolled_back:
                # Rolled back, not yet cleaned up by a worker: its record, if still there, has ended.
                assert got is None or got.status == "interrupted", (r, got)
            else:
                assert got is not None and got.status == r.status, (r, got)
        for thread in THREADS:
            # The thread's list: its kept runs, newest first by creation (runs created back to back
            # share a millisecond), a rolled-back one not yet cleaned up listed or not.
            mine = [r for r in self.model.runs.values() if r.thread == thread and r.status != "gone"]
            maybe = {r.run_id for r in mine if r.rolled_back}
            listed = [r.run_id for r in self.reader.list(thread)]
            assert set(listed) <= {r.run_id for r in mine}, (thread, listed)
            assert [i for i in listed if i not in maybe] == [r.run_id for r in mine[::-1] if r.run_id not in maybe]
            values = self.state.get_state({"configurable": {"thread_id": thread}}).values
            assert values.get("log", []) == self.model.log.get(thread, []), (thread, values)


def _run(machine: type[RunMachine], config: pytest.Config, backend: Any) -> None:
    examples, steps = (60, 40) if full_suite(config) else (25, 30)
    if backend.kind != "fake":
        examples = examples * 2 // 5
    run_seeded(machine, examples=examples, steps=steps, default_seed=MODEL_SEED)
    # Every kind of rule ran and met what it is about (hypothesis enables a subset of the rules per example).
    kinds = {"drain", "create enqueue", "create rejected", "create interrupt", "create rollback", "cancel pending"}
    assert kinds <= set(machine.stats), machine.stats
    # The harness loses replies where the library sends them: a driver that bypassed it would show none.
    assert any(k.startswith("reply lost: lg_run_") for k in machine.stats), machine.stats


def test_the_run_queue_behaves_as_its_model(
    backend: Any, twin_loop: asyncio.AbstractEventLoop, pytestconfig: pytest.Config
) -> None:
    class Runs(RunMachine):
        pass

    Runs.backend, Runs.loop = backend, twin_loop
    _run(Runs, pytestconfig, backend)
