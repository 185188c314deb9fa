"""Each contract between Python and Lua has one source, and the two sides agree.

* The constants the scripts compare with (limits, statuses, the terminal
  rule, the checkpoint hash fields, reply codes) are rendered from Python into
  every script (``scripts.constants_prelude``): evaluated by the server's own
  Lua, they equal the Python values, and no script spells one out itself.
* Each script's header (``KEYS[i] - ...``, ``ARGV[i] - name: ...``) is checked
  against what its Python request builder sends, recorded while real flows run:
  the count of KEYS and ARGV, and (for the checkpoint scripts, whose headers
  name each slot) which value sits in which slot.
* Script calls pipelined as ``EVALSHA`` survive a ``SCRIPT FLUSH``.
* ``CheckpointCore.summaries`` (the CLI's rows) uses the scripts' own check.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

import pytest
from flows import kv_flow, pool_flow

import redis_agentstate.langgraph  # noqa: F401 - registers its scripts with the loader
from redis_agentstate import AsyncCheckpointStore, Checkpoint, CheckpointStore, NotDue
from redis_agentstate import wire as _ops
from redis_agentstate.codec import decode, encode
from redis_agentstate.core import lease as _lease_core
from redis_agentstate.core.checkpoint import ACK_REMEMBER_MS
from redis_agentstate.core.validate import MAX_CLAIM_FROM_REVISION, MAX_CYCLE, MAX_REVISION
from redis_agentstate.keys import Keys
from redis_agentstate.kv import KeyValueStore
from redis_agentstate.models import TERMINAL_STATUSES, AgentStatus
from redis_agentstate.pools import PoolStore
from redis_agentstate.wire import scripts

TOKEN = "tok-contract"
NEXT_TOKEN = "tok-contract-next"
LEASE_MS = 4321
AFTER_MS = 1234
REASON = "contract: ValueError: boom"
STEP_NAME = "contract-step"
STEP_RESULT = ["contract", 1]
DELAY_MS = 60_000
RESUME_MESSAGE = {"answer": "contract"}
STATUS_VALUES = {s.value for s in AgentStatus}


def lua_text(name: str) -> str:
    return scripts.source(name)


# ---- constants: one source, rendered --------------------------------------------------------------


def test_rendered_constants_equal_the_python_ones(raw: Any) -> None:
    """The server's Lua evaluates the rendered prelude to exactly the Python values."""
    names = [f"REPLY_{c.name}" for c in scripts.Reply] + [f"POOL_{c.name}" for c in scripts.PoolReply]
    probe = scripts.constants_prelude() + (
        "local t = {} for s in pairs(TERMINAL) do t[#t + 1] = s end table.sort(t)\n"
        "local st = {} for s in pairs(STATUSES) do st[#st + 1] = s end table.sort(st)\n"
        "local codes = {" + ", ".join(f"string.format('%d', {n})" for n in names) + "}\n"
        "return {string.format('%d', MAX_REVISION), string.format('%d', MAX_CYCLE),\n"
        "  string.format('%d', MAX_CLAIM_FROM_REV), t, st, HASH_FIELDS, codes}\n"
    )
    got = raw.eval(probe, 0)
    text = [[v.decode() for v in x] if isinstance(x, list) else x.decode() for x in got]
    assert text[0] == str(MAX_REVISION) and text[1] == str(MAX_CYCLE) and text[2] == str(MAX_CLAIM_FROM_REVISION)
    assert text[3] == sorted(s.value for s in TERMINAL_STATUSES)
    assert text[4] == sorted(STATUS_VALUES)
    assert tuple(text[5]) == scripts.HASH_FIELDS
    assert [int(v) for v in text[6]] == [c.value for c in (*scripts.Reply, *scripts.PoolReply)]


@pytest.mark.parametrize("enum", [scripts.Reply, scripts.PoolReply])
def test_reply_codes_are_distinct(enum: Any) -> None:
    assert len({c.value for c in enum}) == len(enum)


@pytest.mark.parametrize("name", sorted(scripts.PRELUDES))
def test_every_script_is_built_from_the_rendered_constants_and_its_preludes(name: str) -> None:
    """Its own file last, after the statements of the constants and its preludes that it uses (all of
    them that run for their effect, such as _moved.lua's check), in their order, verbatim."""
    text = scripts.script_text(name)
    body = scripts._read(name)
    assert text.endswith("\n" + body)
    head = text[: -len(body) - 1]
    reads = f"local SEALED_READS = {'true' if name in scripts.READS else 'false'}\n"
    preludes = [scripts.constants_prelude() + reads, *(scripts._read(p) for p in scripts.PRELUDES.get(name, ()))]
    units = [u for t in preludes for u in scripts._units(t)]
    at = 0
    for names, code in units:
        found = head.find(code, at)
        if not names:  # a statement run for its effect is always there
            assert found >= 0, (name, code[:80])
        if found >= 0:
            at = found + len(code)
    defined = {n for names, code in units if code in head for n in names}
    used = set(re.findall(r"[A-Za-z_]\w*", scripts._strip_comments(body)))
    offered = {n for names, _ in units for n in names}
    assert used & offered <= defined, f"{name} uses prelude names its text lacks: {sorted((used & offered) - defined)}"
    # And nothing it does not use: a kept definition is named by the body or by another kept statement.
    assert len(head) < len("\n".join(preludes))


def lua_sources() -> dict[str, str]:
    return {name: f.read_text("utf-8") for name, f in scripts.lua_files().items()}


@pytest.mark.parametrize(
    "pattern, what",
    [
        (r"4294967295|9007199254740|2\s*\^\s*53", "a numeric limit (rendered from core/validate.py)"),
        (r"'completed'|'max_cycles'|'wait_user'", "a status list (rendered from models.py)"),
        (r"return\s*-?\d\b|\{\s*-?\d+\s*[,}]|table\.insert\(out,\s*1,\s*-?\d\)", "a bare reply code (scripts.Reply)"),
        (r"local function (fmt|server_now_ms|now_ms|corrupt)\b", "a _base.lua helper defined again"),
        (r"ARGV", "a global ARGV read inside a prelude helper"),
    ],
)
def test_no_script_spells_out_what_python_renders(pattern: str, what: str) -> None:
    for name, text in lua_sources().items():
        if name == "_base.lua" and "helper" in what:
            continue
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
        if what.startswith("a global ARGV") and not name.startswith("_"):
            continue  # a script body copies its ARGV into named locals; only the preludes must not read it
        if what.startswith("a bare reply code") and name.startswith(("kv_", "_kv")):
            continue  # kv scripts reply with data, not codes
        assert not re.search(pattern, code), f"{name} holds {what}"


def test_lease_uses_the_python_max_cycle() -> None:
    for module in ("lease.py", "core/lease.py"):
        source = resources.files("redis_agentstate").joinpath(module).read_text("utf-8")
        assert "2**32" not in source and "4294967295" not in source, module
    assert _lease_core.MAX_CYCLE == MAX_CYCLE


# ---- headers against request builders ------------------------------------------------------------

SLOT = re.compile(r"^--\s+(KEYS|ARGV)\[(\d+)(?:(\.\.)(\d*))?\]\s+-\s+(.*)$")


class Header:
    """The KEYS/ARGV slots a script's opening comment declares."""

    def __init__(self, name: str) -> None:
        self.fixed: dict[str, list[str | None]] = {"KEYS": [], "ARGV": []}
        self.variadic: dict[str, bool] = {"KEYS": False, "ARGV": False}
        for line in lua_text(name).splitlines():
            if not line.startswith("--"):
                break
            m = SLOT.match(line)
            if not m:
                continue
            kind, first, dots, last, text = m.groups()
            slots = self.fixed[kind]
            assert not self.variadic[kind], f"{name}: {kind} slot after a variadic one"
            assert int(first) == len(slots) + 1, f"{name}: {kind}[{first}] is out of order"
            if dots and not last:
                self.variadic[kind] = True
                continue
            label = re.match(r"(\w+)(?::|$)", text)
            count = int(last) - int(first) + 1 if dots else 1
            slots.extend([label.group(1) if label and count == 1 else None] * count)

    def check(self, name: str, keys: list[Any], args: list[Any]) -> None:
        for kind, sent in (("KEYS", keys), ("ARGV", args)):
            n = len(self.fixed[kind])
            if self.variadic[kind]:
                assert len(sent) >= n, f"{name}: sent {len(sent)} {kind}, the header declares {n} and more"
            else:
                assert len(sent) == n, f"{name}: sent {len(sent)} {kind}, the header declares {n}"


def _int(v: Any) -> int:
    return int(v.decode() if isinstance(v, bytes) else v)


def _digits_or_empty(v: Any) -> bool:
    return v == "" or str(v).isdigit()


#: What the value in a slot named so must look like in the contract flow below
#: (distinct ranges: revisions from 1000, cycles 3..9, histories of 20+ entries).
LIMITED_KEY = "tenant"
NAMED_SLOTS: dict[str, Callable[[Any, list[Any], int], bool]] = {
    "token": lambda v, a, i: v in (TOKEN, NEXT_TOKEN, ""),
    "next_token": lambda v, a, i: v == NEXT_TOKEN,
    "lease_ms": lambda v, a, i: _int(v) == LEASE_MS,
    "ttl_ms": lambda v, a, i: _int(v) >= 0,
    "delay_ms": lambda v, a, i: _int(v) in (0, DELAY_MS),
    "priority": lambda v, a, i: 0 <= _int(v) <= 9,
    "has_message": lambda v, a, i: v in ("0", "1"),
    "message": lambda v, a, i: v == b"" or (isinstance(v, bytes) and decode(v, key="message") == RESUME_MESSAGE),
    "tomb_ms": lambda v, a, i: _int(v) == ACK_REMEMBER_MS,
    "after_ms": lambda v, a, i: _int(v) == AFTER_MS,
    "reason": lambda v, a, i: v == REASON,
    # The contract flow's store parks at the first failed attempt.
    "max_attempts": lambda v, a, i: _int(v) == 1,
    "revision": lambda v, a, i: 1000 <= _int(v) < 1100,
    "expected_revision": lambda v, a, i: 1000 <= _int(v) < 1100,
    "cycle_index": lambda v, a, i: 3 <= _int(v) <= 9,
    "status": lambda v, a, i: v in STATUS_VALUES,
    "term": lambda v, a, i: v in ("0", "1"),
    "replace": lambda v, a, i: v in ("0", "1"),
    "body": lambda v, a, i: isinstance(v, bytes) and len(decode(v, key="body")) == 3,
    "nonce": lambda v, a, i: isinstance(v, str) and len(v) >= 16,
    "identity": lambda v, a, i: isinstance(v, str) and (len(v) == 32 or v.startswith("ack:")),
    "claimed_cycle": lambda v, a, i: _digits_or_empty(v),
    "lease_expires_at_ms": lambda v, a, i: _digits_or_empty(v),
    "epoch": lambda v, a, i: isinstance(v, (bytes, str)),
    "have_epoch": lambda v, a, i: isinstance(v, (bytes, str)),
    "base_m": lambda v, a, i: _int(v) == -1 or 20 <= _int(v) < 100,
    "base_c": lambda v, a, i: _int(v) == -1 or 20 <= _int(v) < 100,
    "have_m": lambda v, a, i: _int(v) == 0 or 20 <= _int(v) < 100,
    "have_c": lambda v, a, i: _int(v) == 0 or 20 <= _int(v) < 100,
    # The blobs follow the fixed slots: as many message blobs as this says, then the cycle blobs.
    "n_messages": lambda v, a, i: 0 <= v <= len(a) - i - 1,
    "name": lambda v, a, i: v == STEP_NAME,
    "result": lambda v, a, i: isinstance(v, bytes) and decode(v, key="result") == STEP_RESULT,
    # The contract flow's limited tasks are l1 and l2, of concurrency key "tenant" (limit 1).
    "concurrency_key": lambda v, a, i: v in ("", LIMITED_KEY),
    "permit_key": lambda v, a, i: v in ("", LIMITED_KEY),
    "permit_cap": lambda v, a, i: _int(v) >= 0,
    "defer_until": lambda v, a, i: _int(v) >= 0,
    "holder": lambda v, a, i: v in (f"l1\0{TOKEN}", f"l2\0{NEXT_TOKEN}", f"l1\0{NEXT_TOKEN}"),
    "replaces": lambda v, a, i: v == "",
    "waiter": lambda v, a, i: v in ("", "l1", "l2"),
    "wake": lambda v, a, i: 1 <= _int(v) <= 1000,
    "since_ms": lambda v, a, i: _int(v) > 10**12,
    "limit": lambda v, a, i: v in ("", "1"),
    # The contract flow's namespace is new: its first operation writes the default layout record.
    "layout": lambda v, a, i: v == "slots 64",
}


def check_named(name: str, header: Header, args: list[Any]) -> None:
    for i, label in enumerate(header.fixed["ARGV"]):
        assert label is not None, f"{name}: ARGV[{i + 1}] has no name in the header ('- name: ...')"
        assert label in NAMED_SLOTS, f"{name}: ARGV[{i + 1}] named {label!r}, which the test does not know"
        assert NAMED_SLOTS[label](args[i], args, i), f"{name}: ARGV[{i + 1}] ({label}) holds {args[i]!r:.60}"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_ops.Call]]:
    """Every script call the sync driver sends, alone or in a Batch."""
    seen: list[_ops.Call] = []
    send = _ops.drivers._send_sync

    def record(client: Any, scripts_: dict[str, Any], req: Any) -> Any:
        if isinstance(req, _ops.Call):
            seen.append(req)
        elif isinstance(req, _ops.Batch):
            seen.extend(req.calls)
        return send(client, scripts_, req)

    monkeypatch.setattr(_ops.drivers, "_send_sync", record)
    yield seen


def checkpoint_contract_flow(store: CheckpointStore) -> None:
    history = {"messages": [f"m{i}" for i in range(20)], "cycles": [{"c": i} for i in range(20)]}
    for tid in ("a", "b"):
        assert store.create(Checkpoint(tid, cycle_index=3, revision=1000, **history))  # type: ignore[arg-type]
    store.save(Checkpoint("s", cycle_index=3, revision=1000, claim_token=TOKEN, claimed_cycle=4,
                          lease_expires_at_ms=10**12, **history))  # type: ignore[arg-type]  # fmt: skip
    cp = store.claim("a", 4, token=TOKEN, lease_ms=LEASE_MS)
    assert cp is not None
    assert store.renew("a", token=TOKEN, expected_revision=cp.revision, lease_ms=LEASE_MS)
    held = {"token": TOKEN, "expected_revision": cp.revision, "cycle_index": 4, "name": STEP_NAME}
    assert store._step_load("a", **held) == (False, None)
    assert store._step_record("a", STEP_RESULT, **held) == (True, STEP_RESULT)
    assert store._step_load("a", **held) == (True, STEP_RESULT)
    cp.cycle_index = 4
    cp.messages.append("new")
    cp = store.commit_and_claim(cp, token=TOKEN, expected_revision=cp.revision, lease_ms=LEASE_MS,
                                next_token=NEXT_TOKEN)  # fmt: skip
    assert cp is not None
    cp.cycle_index = 5
    cp.messages.append("newer")
    assert store.commit(cp, token=NEXT_TOKEN, expected_revision=cp.revision)
    nxt = store.claim_next(token=TOKEN, lease_ms=LEASE_MS)
    assert nxt is not None
    nxt.cycle_index += 1
    assert store.commit(nxt, token=TOKEN, expected_revision=nxt.revision, replace_history=True)
    loaded = store.load("b")
    assert loaded is not None
    loaded.status = AgentStatus.COMPLETED
    loaded.terminal_result = {"ok": True}
    assert store.finalize(loaded, expected_revision=loaded.revision)
    assert store.acknowledge_terminal("b", expected_revision=loaded.revision + 1)
    _, rows = store._summaries(["a", "s", "b"])
    assert [r["task_id"] for r in rows] == ["a", "s"]
    store.delete("a")
    # A failed attempt released with its reason parks the task (max_attempts=1); requeue runs it again.
    assert store.create(Checkpoint("p", cycle_index=3, revision=1000, **history))  # type: ignore[arg-type]
    cp = store.claim("p", 4, token=TOKEN, lease_ms=LEASE_MS)
    assert cp is not None
    assert store.release("p", token=TOKEN, expected_revision=cp.revision, after_ms=AFTER_MS, reason=REASON)
    assert store.list_parked() == ["p"]
    store.requeue("p")
    assert store.list_parked() == []
    # Cancelled (parked or not, held or not): terminal at once.
    assert store.cancel("p", reason=REASON)
    # Waiting for a person with a deadline, resumed with their answer; a delayed start.
    assert store.create(Checkpoint("w", cycle_index=3, revision=1000, **history), delay_ms=DELAY_MS)  # type: ignore[arg-type]
    with pytest.raises(NotDue):
        store.claim("w", 4, token=TOKEN, lease_ms=LEASE_MS)
    store.save(Checkpoint("w", cycle_index=3, revision=1000, **history))  # type: ignore[arg-type]
    cp = store.claim("w", 4, token=TOKEN, lease_ms=LEASE_MS)
    assert cp is not None
    cp.cycle_index, cp.status = 4, AgentStatus.WAIT_USER
    assert store.commit(cp, token=TOKEN, expected_revision=cp.revision, delay_ms=DELAY_MS)
    assert store.resume("w", message=RESUME_MESSAGE)
    # Per-key concurrency limits: a place taken, one task put off while the key is full, the place
    # given back (waking the put-off task), the limit lifted.
    store.set_concurrency_limit(LIMITED_KEY, 1)
    for tid in ("l1", "l2"):
        assert store.create(Checkpoint(tid, cycle_index=3, revision=1000, concurrency_key=LIMITED_KEY, **history))  # type: ignore[arg-type]
    cp = store.claim("l1", 4, token=TOKEN, lease_ms=LEASE_MS)
    assert cp is not None
    served = iter(lambda: store.claim_next(token=NEXT_TOKEN, lease_ms=LEASE_MS), None)
    assert "l2" not in [c.task_id for c in served]  # put off: its key is full
    cp.cycle_index = 4
    assert store.commit(cp, token=TOKEN, expected_revision=cp.revision)
    store.set_concurrency_limit(LIMITED_KEY, None)


def langgraph_contract_flow(client: Any, namespace: str) -> None:
    """Every LangGraph saver script once: put, writes, get, list, copy, prune, delete, lease/renew/release."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from redis_agentstate.langgraph import AgentStateSaver

    saver = AgentStateSaver(client, namespace=namespace)
    # 1 s, not less: a 300 ms lease was lost to a stall of a loaded two-core CI run.
    with saver.lease("lg-t", lease_ms=1000) as lease:
        cfg = saver.put(generate_config("lg-t"), generate_checkpoint(), generate_metadata(run_id="r1"), {})
        saver.put_writes(cfg, [("channel", 1)], "task-1")
        time.sleep(1.1)  # longer than the lease: only the keeper's renewals keep it
        assert not lease.lost
    assert saver.get_tuple(cfg) is not None
    assert list(saver.list(generate_config("lg-t")))
    saver.copy_thread("lg-t", "lg-copy")
    saver.prune(["lg-copy"], strategy="keep_latest")
    saver.delete_for_runs(["r1"])
    saver.delete_thread("lg-copy")


def run_queue_contract_flow(client: Any, namespace: str) -> None:
    """Every LangGraph run-queue script once: index, create, begin, emit, finish, cancel, wake."""
    from redis_agentstate.langgraph import RunQueue

    queue = RunQueue(client, namespace=namespace)
    run = queue.create("rq-t", {"x": 1}, stream_mode=["values", "custom"])
    core = queue._core
    # As a worker begins it: under its claim of the thread's task, checked in the same script.
    claimed = queue.tasks.claim_next(token=TOKEN, lease_ms=LEASE_MS)
    assert claimed is not None
    begun = queue._run(core.begin("rq-t", TOKEN, "w", 3, revision=claimed.revision))
    assert begun is not None and begun.run.run_id == run.run_id
    assert queue._run(core.emit(begun.run, TOKEN, [("values", {"x": 2})], seq=1)) == ""
    assert queue._run(core.finish(begun.run, TOKEN, "success")) == 0
    assert queue.delete(run.run_id) is True
    other = queue.create("rq-t", {"x": 3})
    assert queue.cancel(other.run_id, action="rollback")
    assert queue._run(core.wake("rq-t")) == 0


def store_contract_flow(client: Any, namespace: str) -> None:
    """Every LangGraph store script once: put, get (refreshing a TTL), search, list, delete, sweep."""
    from redis_agentstate.langgraph import AgentStateStore

    store = AgentStateStore(client, namespace, ttl={"default_ttl": 10})
    store.put(("u", "1"), "k", {"v": 1})
    assert store.get(("u", "1"), "k") is not None
    assert len(store.search(("u",), filter={"v": 1})) == 1
    assert store.list_namespaces(prefix=("u",)) == [("u", "1")]
    store.delete(("u", "1"), "k")
    assert store.sweep() == 0
    # The vector index: a put that trains it (and moves the items), a search above the exact limit.
    index: Any = {"dims": 2, "embed": lambda texts: [[1.0, float(len(t))] for t in texts], "fields": ["t"]}
    indexed = AgentStateStore(client, namespace + ".ann", index=index)
    indexed._core.ann.index_at = 3
    indexed._core.max_exact = 2
    for i in range(3):
        indexed.put(("d",), f"k{i}", {"t": "x" * (i + 1)})
    assert len(indexed.search(("d",), query="xx")) == 3
    # The exact ranking from the client's vector cache: a first search scans, a second picks.
    cached = AgentStateStore(client, namespace + ".exact", index=index)
    for i in range(2):
        cached.put(("e",), f"k{i}", {"t": "x" * (i + 1)})
    assert [len(cached.search(("e",), query="xx")) for _ in range(2)] == [2, 2]


def cron_contract_flow(client: Any, namespace: str) -> None:
    """Every cron script once: put (create, update), advance, delete."""
    from redis_agentstate.langgraph.crons import CronStore

    crons = CronStore(client, namespace=namespace + ".crons")
    now = crons.now_ms()
    assert crons.create("c1", {"schedule": "* * * * *"}, due_ms=now - 5, created_ms=now)
    assert crons.update("c1", {"schedule": "*/5 * * * *"})
    assert crons.advance("c1", now - 5, now + 60_000)
    crons.delete("c1")
    assert crons.get("c1") is None


def test_every_script_header_matches_what_its_builder_sends(
    backend: Any, namespace: str, recorded: list[_ops.Call]
) -> None:
    store = CheckpointStore(backend.sync_client(), namespace=namespace, max_attempts=1)
    checkpoint_contract_flow(store)
    checkpoint_calls = list(recorded)
    pools = PoolStore(backend.sync_client(), namespace=namespace)
    pool_flow(pools)
    pools.next_event_sequence("pool-1")
    kv_flow(KeyValueStore(backend.sync_client(), namespace=namespace))
    langgraph_contract_flow(backend.sync_client(), namespace)
    run_queue_contract_flow(backend.sync_client(), namespace)
    store_contract_flow(backend.sync_client(), namespace)
    cron_contract_flow(backend.sync_client(), namespace)
    grown = CheckpointStore(backend.sync_client(), namespace=namespace + "-grown", shards=1)
    assert grown.create(Checkpoint("g"))
    assert grown.reshard(2).moved == 1
    sent = {call.script for call in recorded}
    assert sent == set(scripts.PRELUDES), f"not exercised: {set(scripts.PRELUDES) - sent}"
    headers = {name: Header(name) for name in scripts.PRELUDES}
    for call in recorded:
        headers[call.script].check(call.script, list(call.keys), list(call.args))
    for call in checkpoint_calls:
        if headers[call.script].fixed["ARGV"]:
            check_named(call.script, headers[call.script], list(call.args))


def test_header_check_catches_a_builder_out_of_step() -> None:
    """The check itself fails for one slot too many, too few, or two slots swapped."""
    header = Header("commit")
    body = encode([{}, None, None], what="body")
    good = ["0" * 32, TOKEN, 1000, 4, "running", "0", body, 0, 0, 0, "", "0", b"e", 20, 20, 1, b"m"]
    header.check("commit", ["k"] * 10, good)
    check_named("commit", header, good)
    with pytest.raises(AssertionError):
        header.check("commit", ["k"] * 10, good[:15])
    with pytest.raises(AssertionError):
        header.check("commit", ["k"] * 9, good)
    swapped = [good[0], good[2], good[1], *good[3:]]
    with pytest.raises(AssertionError):
        check_named("commit", header, swapped)


# ---- pipelined EVALSHA survives SCRIPT FLUSH -----------------------------------------------------


class TestBatch:
    def test_a_pipeline_after_script_flush_still_works(self, make: Callable[..., Any], raw: Any) -> None:
        from redis_agentstate.kv import AsyncKeyValueStore

        kv = make(KeyValueStore, AsyncKeyValueStore)
        kv.set_many({f"k{i}": b"v" for i in range(50)})  # scripts loaded
        raw.script_flush()
        kv.set_many({f"j{i}": b"w" for i in range(50)})  # every call of the pipeline meets NOSCRIPT
        raw.script_flush()
        assert kv.count() == 100
        raw.script_flush()
        assert len(list(kv.keys())) == 100

    def test_kv_batches_are_evalsha_not_eval(self, real_server: Any, namespace: str) -> None:
        """Counted by the real server (INFO commandstats): the script text is not sent per call."""
        import redis
        from conftest import require_real

        client = redis.Redis.from_url(require_real(real_server))
        kv = KeyValueStore(client, namespace=namespace)
        kv.set_many({"warm": b"up"})
        before = client.info("commandstats")
        kv.set_many({f"k{i}": b"v" for i in range(200)})
        kv.count()
        after = client.info("commandstats")

        def calls(cmd: str, stats: dict[str, Any]) -> int:
            return int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0))

        assert calls("eval", after) == calls("eval", before)
        assert calls("evalsha", after) - calls("evalsha", before) >= 64
        kv.delete("warm")
        client.close()


# ---- the CLI's rows come from a core operation ----------------------------------------------------


class TestSummaries:
    def test_rows_in_order_with_corrupt_and_missing_tasks(self, make: Callable[..., Any], raw: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        keys = Keys(store.namespace)
        ids = [f"t{i}" for i in range(30)]
        for tid in ids:
            assert store.create(Checkpoint(tid, cycle_index=2, revision=7))
        cp = store.claim("t3", 3, token=TOKEN, lease_ms=60_000)
        raw.hset(keys.task("t5").checkpoint, "rev", "1e400")
        raw.hset(keys.task("t6").checkpoint, "term", "2")
        raw.delete(keys.task("t7").checkpoint)
        raw.set(keys.task("t7").checkpoint, "not a hash")
        raw.delete(keys.task("t8").checkpoint)  # deleted since it was listed
        now, rows = store._summaries(ids)
        assert [r["task_id"] for r in rows] == [t for t in ids if t != "t8"]
        by_id = {r["task_id"]: r for r in rows}
        assert by_id["t0"] == {
            "task_id": "t0", "status": "running", "cycle_index": 2, "revision": 7, "terminal": False,
            "claim_token": None, "claimed_cycle": None, "lease_expires_at_ms": None, "lease_state": None,
            "lease_remaining_ms": None, "attempts": 0, "parked": False, "last_failure": None,
            "due_at_ms": None, "due_in_ms": None, "priority": 0,
        }  # fmt: skip
        t3 = by_id["t3"]
        assert (t3["claim_token"], t3["claimed_cycle"], t3["lease_state"]) == (TOKEN, 3, "live")
        assert t3["lease_expires_at_ms"] == cp.lease_expires_at_ms and 0 < t3["lease_remaining_ms"] <= 60_000
        assert abs(now + t3["lease_remaining_ms"] - cp.lease_expires_at_ms) == 0
        assert "rev" in by_id["t5"]["corrupt"] and "term" in by_id["t6"]["corrupt"]
        assert "WRONGTYPE" in by_id["t7"]["corrupt"].upper()
        for tid in ("t5", "t6", "t7"):
            assert by_id[tid]["status"] == "corrupt"

    def test_no_tasks(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        now, rows = store._summaries([])
        assert rows == [] and now > 0


# ---- one name per meaning, every key built in keys.py --------------------------------------------


def test_one_name_per_meaning() -> None:
    from redis_agentstate.lease import Lease

    # Lease.finalize (a fenced commit under the claim) and CheckpointStore.finalize (no claim) keep
    # their public names; each docstring points at the other.
    assert "CheckpointStore.finalize" in (Lease.finalize.__doc__ or "")
    assert "Lease.finalize" in (CheckpointStore.finalize.__doc__ or "")


def test_demo_keys_are_built_in_keys_py() -> None:
    source = resources.files("redis_agentstate").joinpath("fleet", "demo.py").read_text("utf-8")
    assert ":demo:" not in source and "{ns}:" not in source
    from redis_agentstate.fleet.demo import _keys

    assert _keys("d-1") == {name: f"d-1:demo:{name}" for name in ("stats", "busy", "acks", "ready")}


def test_history_cache_has_its_own_module() -> None:
    from redis_agentstate.core import checkpoint as _checkpoint_core
    from redis_agentstate.core import history as _history

    assert _checkpoint_core.HistoryCache is _history.HistoryCache
    assert _history.HistoryCache.__module__ == "redis_agentstate.core.history"
    source = resources.files("redis_agentstate").joinpath("core/checkpoint.py").read_text("utf-8")
    assert "class HistoryCache" not in source and "class History" not in source


def _call_args(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose '(' is at ``start``."""
    depth, args, cur = 0, [], ""
    for ch in text[start:]:
        if ch in "({":
            depth += 1
            if depth == 1:
                continue
        elif ch in ")}":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return args
        if ch == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    raise AssertionError("unclosed call")


def test_checkpoint_scripts_use_only_the_hash_fields_python_knows() -> None:
    """Every field read or written on a checkpoint hash is in scripts.HASH_FIELDS (or is the write ring)."""
    known = {*scripts.HASH_FIELDS, "applied"}
    seen: set[str] = set()
    for name in [*scripts.CHECKPOINT_SCRIPTS, "_common"]:
        text = lua_text(name)
        for m in re.finditer(r"redis\.p?call\(", text):
            args = _call_args(text, m.end() - 1)
            if args[0].strip("'") not in ("HMGET", "HSET", "HGET") or args[1] not in ("KEYS[1]", "keys[1]"):
                continue
            fields = args[2:] if args[0] != "'HSET'" else args[2::2]
            for f in fields:
                if f.startswith("'"):
                    seen.add(f.strip("'"))
                else:
                    assert f.startswith("unpack(HASH_FIELDS"), f"{name}: field {f} is not a literal"
    assert seen and seen <= known, f"fields the scripts use that Python does not know: {seen - known}"
