"""Figure 7 (opt-in, ``--only langgraph``): LangGraph checkpointers on plain Redis, one growing thread.

The workload: a thread whose ``messages`` channel (an ``operator.add``
list) grows by 2 messages of ~90 B per step (the user's, as the input, and the
node's answer), next to 1 KiB of other state, one step per ``invoke``. Each
saver runs a fresh thread of ``STEPS`` invokes per round, the savers in a
shuffled order per round; every invoke is timed. Memory per thread is the
server's ``used_memory`` delta across the thread's first 100 and all 400 steps
(the server runs nothing else; for ``AgentStateSaver`` the ``MEMORY USAGE`` of the
thread's own keys is reported too, and split by key: the checkpoints (their
records and pending writes, one index entry each) and the channel values). Two workloads, each with every contender:

* ``input-once`` (the first table): ``other`` comes in with the first input only;
* ``rewrite``: the node writes ``other`` again at every step, with the same content (what
  a graph that returns its whole state does), so a saver that stores a value once per
  version stores those 1,024 bytes 400 times.

Contenders:

* ``redis_agentstate`` ``AgentStateSaver``;
* ``langgraph-checkpoint-plainredis`` ``RedisSaver`` (plain Redis, no modules);
* ``langgraph-checkpoint-aws`` ``ValkeySaver`` (valkey-glide client; plain Redis works);
* ``langgraph-checkpoint-redis``: needs RedisJSON + RediSearch, reported as not run on a server without them.

A contender whose package is missing is reported in its row.
"""

from __future__ import annotations

import operator
import random
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from ._util import Settings, has_json_and_search, summary

STEPS = 400
#: Reads of one old checkpoint per thread, for its cost (after the history is read).
OLD_READS = 10
#: The long-value thread: a channel of LONG_MIB MiB, unchanged over 3 * LONG_INVOKES checkpoints.
LONG_MIB, LONG_INVOKES = 4, 20
MEMORY_AT = (100, 400)
MESSAGE = 90


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    other: str


OTHER = "o" * 1024
WORKLOADS = ("input-once", "rewrite")
#: A contender's look at its own keys: their ``MEMORY USAGE`` ("total" and by kind), None if unknown.
Own = Callable[[str], "dict[str, int] | None"]


def _answer(state: State) -> dict[str, Any]:
    n = len(state["messages"])
    return {"messages": [f"assistant {n:05d} " + "a" * (MESSAGE - 16)]}


def _answer_and_rewrite(state: State) -> dict[str, Any]:
    return {**_answer(state), "other": OTHER}


def _graph(saver: Any, workload: str = "input-once") -> Any:
    from langgraph.graph import END, START, StateGraph

    b = StateGraph(State)
    b.add_node("answer", _answer_and_rewrite if workload == "rewrite" else _answer)
    b.add_edge(START, "answer")
    b.add_edge("answer", END)
    return b.compile(checkpointer=saver)


def _ours(settings: Settings) -> tuple[Any, Own]:
    from redis_agentstate.keys import Keys
    from redis_agentstate.langgraph import AgentStateSaver

    client = settings.client()
    ns = settings.ns("langgraph")
    saver = AgentStateSaver(client, namespace=ns)

    def own_keys(thread_id: str) -> dict[str, int]:
        keys = Keys(ns).thread(thread_id)
        usage = {key: int(client.memory_usage(key, samples=0) or 0) for key in keys.as_list()}
        # A checkpoint's record and writes are its index entry; the records and writes hashes hold only
        # what an earlier layout stored and writes sent before their checkpoint.
        checkpoints = usage[keys.index] + usage[keys.records] + usage[keys.writes]
        return {
            "total": sum(usage.values()),
            "checkpoints (records and writes)": checkpoints,
            "values": usage[keys.blobs],
        }

    return saver, own_keys


def _plainredis(settings: Settings) -> tuple[Any, Own]:
    from langgraph_checkpoint_plainredis import RedisSaver

    return RedisSaver(settings.client(), prefix=settings.ns("plainredis")), lambda _t: None


def _valkey(settings: Settings) -> tuple[Any, Own]:
    from langgraph_checkpoint_aws import ValkeySaver
    from valkey import Valkey

    client = Valkey.from_url(settings.url)
    return ValkeySaver(client), lambda _t: None


def _redis_checkpoint(settings: Settings) -> tuple[Any, Own]:
    if not has_json_and_search(settings.client()):
        raise RuntimeError("needs RedisJSON+RediSearch (server has none)")
    from langgraph.checkpoint.redis import RedisSaver

    saver = RedisSaver(redis_url=settings.url)
    saver.setup()
    return saver, lambda _t: None


CONTENDERS: dict[str, Callable[[Settings], tuple[Any, Own]]] = {
    "redis_agentstate AgentStateSaver": _ours,
    "langgraph-checkpoint-plainredis RedisSaver": _plainredis,
    "langgraph-checkpoint-aws ValkeySaver": _valkey,
    "langgraph-checkpoint-redis RedisSaver": _redis_checkpoint,
}
VERSIONS = {
    "redis_agentstate AgentStateSaver": "redis-agentstate",
    "langgraph-checkpoint-plainredis RedisSaver": "langgraph-checkpoint-plainredis",
    "langgraph-checkpoint-aws ValkeySaver": "langgraph-checkpoint-aws",
    "langgraph-checkpoint-redis RedisSaver": "langgraph-checkpoint-redis",
}


#: The long-value table's extra row: our saver with LangGraph's EncryptedSerializer (AES).
ENCRYPTED = "redis_agentstate AgentStateSaver, EncryptedSerializer (AES)"


def _encrypted_ours(settings: Settings) -> Any:
    import os

    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    from redis_agentstate.langgraph import AgentStateSaver

    serde = EncryptedSerializer.from_pycryptodome_aes(key=os.urandom(16))
    return AgentStateSaver(settings.client(), namespace=settings.ns("langgraph-aes"), serde=serde)


class LongState(TypedDict):
    big: str
    n: int


def _count(state: LongState) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def _long_graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    b = StateGraph(LongState)
    b.add_node("count", _count)
    b.add_edge(START, "count")
    b.add_edge("count", END)
    return b.compile(checkpointer=saver)


def _long_value(saver: Any, client: Any, thread_id: str, mib: int, invokes: int) -> dict[str, Any]:
    """A thread whose ``mib`` MiB channel is unchanged over ``3 * invokes`` checkpoints: reading its
    history, the longest command and the longest script the server ran (SLOWLOG at threshold 0; the
    server runs nothing else), the time, and the checkpoints returned."""
    graph = _long_graph(saver)
    config = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"big": "x" * (mib << 20), "n": 0}, config)
    for _ in range(invokes - 1):
        graph.invoke({"n": 0}, config)
    old = client.config_get("slowlog-*")
    client.config_set("slowlog-max-len", 100_000)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        t0 = time.perf_counter()
        history = list(graph.get_state_history(config))
        ms = (time.perf_counter() - t0) * 1000
        log = client.slowlog_get(100_000)
    finally:
        client.config_set("slowlog-log-slower-than", old["slowlog-log-slower-than"])
        client.config_set("slowlog-max-len", old["slowlog-max-len"])
    scripts = [e["duration"] for e in log if e["command"][:4].upper() in (b"EVAL", b"FCAL")]
    assert all(len(h.values.get("big", "")) == mib << 20 for h in history[:-1])
    return {
        "history_ms": ms,
        "checkpoints": len(history),
        "longest_command_ms": max((e["duration"] for e in log), default=0) / 1000,
        "longest_script_ms": max(scripts, default=0) / 1000,
        "scripts": len(scripts),
    }


def step_input(step: int) -> dict[str, Any]:
    """The input of invoke ``step`` (from 1) of the workload: the user's message, and with the first
    one the 1 KiB ``other``."""
    payload: dict[str, Any] = {"messages": [f"user {step:05d} " + "u" * (MESSAGE - 11)]}
    if step == 1:
        payload["other"] = OTHER
    return payload


def _thread(graph: Any, client: Any, thread_id: str, steps: int, own: Own) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread_id}}
    times_ms: list[float] = []
    memory: dict[int, dict[str, int | None]] = {}
    before = int(client.info("memory")["used_memory"])
    for step in range(1, steps + 1):
        payload = step_input(step)
        t0 = time.perf_counter()
        graph.invoke(payload, config)
        times_ms.append((time.perf_counter() - t0) * 1000)
        if step in MEMORY_AT or step == steps:
            mine = own(thread_id)
            memory[step] = {
                "used_memory_delta": int(client.info("memory")["used_memory"]) - before,
                "own_keys": None if mine is None else mine["total"],
                "own_by_key": None if mine is None else {k: v for k, v in mine.items() if k != "total"},
            }
    values = graph.get_state(config).values
    assert len(values["messages"]) == 2 * steps and values["other"] == OTHER
    # Reads of the whole thread: its history (every checkpoint, with its values and writes), then one
    # old checkpoint (the 30th from the start: about step 10) read again and again.
    t0 = time.perf_counter()
    history = list(graph.get_state_history(config))
    history_ms = (time.perf_counter() - t0) * 1000
    old = history[-min(30, len(history))]
    old_ms = []
    for _ in range(OLD_READS):
        t0 = time.perf_counter()
        snap = graph.get_state(old.config)
        old_ms.append((time.perf_counter() - t0) * 1000)
    assert snap.values == old.values
    # A saver whose list() misses checkpoints shows it here (LangGraph writes 3 per invoke).
    return {"times_ms": times_ms, "memory": memory, "history_ms": history_ms, "history_len": len(history),
            "old_get_ms": old_ms}  # fmt: skip


def run(settings: Settings) -> dict[str, Any]:
    """The ``input-once`` workload's figures at the top level, the ``rewrite`` workload's under "rewrite"."""
    from importlib import metadata

    steps = 20 if settings.quick else STEPS
    rounds = 1 if settings.quick else max(1, min(settings.rounds, 3))
    rng = random.Random(settings.seed + 7)
    client = settings.client()
    built: dict[tuple[str, str], tuple[Any, Own]] = {}
    status: dict[str, str] = {}
    for name, factory in CONTENDERS.items():
        try:
            saver, own = factory(settings)
            for workload in WORKLOADS:
                built[(workload, name)] = (_graph(saver, workload), own)
            status[name] = "ok"
        except Exception as exc:  # a missing package or module: reported in its row
            status[name] = f"not run: {type(exc).__name__}: {exc}"
    savers = {}
    for (workload, name), (graph, own) in built.items():
        savers[name] = graph.checkpointer
        # Warm-up: scripts loaded, connections open, so the memory figures count the thread only.
        _thread(graph, client, f"bench-warmup-{settings.run_id}-{workload}", 2, own)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in built}
    for r in range(rounds):
        order = list(built)
        rng.shuffle(order)
        for workload, name in order:
            graph, own = built[(workload, name)]
            thread = f"bench-thread-{settings.run_id}-{workload}-{r}"
            runs[(workload, name)].append(_thread(graph, client, thread, steps, own))
    long_mib, long_invokes = (1, 4) if settings.quick else (LONG_MIB, LONG_INVOKES)
    long_value: dict[str, Any] = {}
    for name in CONTENDERS:
        if name in savers:
            try:
                long_value[name] = _long_value(
                    savers[name], client, f"bench-long-{settings.run_id}", long_mib, long_invokes
                )
            except Exception as exc:  # a saver that cannot hold the value: reported in its row
                long_value[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    try:  # ours with EncryptedSerializer too: its values are not shared, only its long ones named
        long_value[ENCRYPTED] = _long_value(
            _encrypted_ours(settings), client, f"bench-long-aes-{settings.run_id}", long_mib, long_invokes
        )
    except Exception as exc:  # no pycryptodome: reported in its row
        long_value[ENCRYPTED] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    versions: dict[str, str | None] = {}
    for name in CONTENDERS:
        try:
            versions[name] = metadata.version(VERSIONS[name])
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions[ENCRYPTED] = versions["redis_agentstate AgentStateSaver"]
    by_workload = {
        workload: {name: _row(status[name], versions[name], runs.get((workload, name))) for name in CONTENDERS}
        for workload in WORKLOADS
    }
    head = {"steps": steps, "rounds": rounds, "message_bytes": MESSAGE}
    return {**head, "workload": "input-once", "contenders": by_workload["input-once"],
            "rewrite": {**head, "workload": "rewrite", "contenders": by_workload["rewrite"]},
            "long_value": {"mib": long_mib, "invokes": long_invokes, "versions": versions,
                           "contenders": long_value}}  # fmt: skip


def _row(status: str, version: str | None, threads: list[dict[str, Any]] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"status": status, "version": version}
    if not threads:
        return row
    first = [sum(t["times_ms"][:10]) / 10 for t in threads]
    last = [sum(t["times_ms"][-10:]) / 10 for t in threads]
    row["ms_first10"] = summary(first)
    row["ms_last10"] = summary(last)
    row["last_over_first"] = summary([b / a for a, b in zip(first, last, strict=True)])
    if all("history_ms" in t for t in threads):
        row["history_ms"] = summary([t["history_ms"] for t in threads])
        row["old_get_ms"] = summary([sorted(t["old_get_ms"])[len(t["old_get_ms"]) // 2] for t in threads])
        row["history_len"] = min(t["history_len"] for t in threads)
    row["memory"] = {
        str(step): {
            "used_memory_delta": summary([float(t["memory"][step]["used_memory_delta"] or 0) for t in threads], 0),
            "own_keys": threads[0]["memory"][step]["own_keys"],
            "own_by_key": threads[0]["memory"][step]["own_by_key"],
        }
        for step in sorted(threads[0]["memory"])
    }
    return row


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 / 10 else f"{n / 1024:.0f} KiB"


def markdown(fig: dict[str, Any]) -> str:
    """Both workloads' tables (a figure from before the ``rewrite`` workload has only the first)."""
    parts = [_table(fig, "input-once: `other` comes with the first input only")]
    if "rewrite" in fig:
        parts.append(_table(fig["rewrite"], "rewrite: the node writes the same 1 KiB `other` again at every step"))
    if "long_value" in fig:
        parts.append(_long_table(fig["long_value"]))
    return "\n\n".join(parts)


def _long_table(fig: dict[str, Any]) -> str:
    lines = [
        f"**long value: a {fig['mib']} MiB channel unchanged over {3 * fig['invokes']} checkpoints.** "
        "Reading the thread's whole history once; the longest command and the longest script the "
        "server ran meanwhile (SLOWLOG at threshold 0; the server runs nothing else).",
        "",
        "| saver | history, ms | checkpoints it returned | longest script, ms | longest command, ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in fig["contenders"].items():
        version = fig["versions"].get(name)
        label = f"{name} {version}" if version else name
        if "error" in row:
            lines.append(f"| {label} | {row['error']} | - | - | - |")
            continue
        script = f"{row['longest_script_ms']:.2f} ({row['scripts']} scripts)" if row["scripts"] else "none"
        lines.append(
            f"| {label} | {row['history_ms']:.0f} | {row['checkpoints']} | {script} | {row['longest_command_ms']:.2f} |"
        )
    return "\n".join(lines)


def _table(fig: dict[str, Any], title: str) -> str:
    steps = fig["steps"]
    marks = [str(s) for s in (100, steps) if s <= steps]
    lines = [
        f"**{title}.** "
        f"{fig['rounds']} round(s) of one fresh thread of {steps} invokes per saver; "
        f"messages ~{fig['message_bytes']} B, "
        "2 per step, 1 KiB of other state. Memory: the server's used_memory delta over the thread "
        "(own keys' MEMORY USAGE in brackets where the saver's keys are known).",
        "",
        "| saver | ms/invoke, steps 1-10 | ms/invoke, last 10 steps | last / first | "
        + " | ".join(f"memory per thread, {m} steps" for m in marks)
        + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in marks) + " |",
    ]
    for name, row in fig["contenders"].items():
        label = f"{name} {row['version']}" if row.get("version") else name
        if row["status"] != "ok":
            lines.append(f"| {label} | {row['status']} | - | - | " + " | ".join("-" for _ in marks) + " |")
            continue
        mem = []
        for m in marks:
            entry = row["memory"].get(m)
            if entry is None:
                mem.append("-")
                continue
            cell = _mib(entry["used_memory_delta"]["median"])
            if entry["own_keys"]:
                cell += f" ({_mib(entry['own_keys'])})"
            mem.append(cell)
        f, last, ratio = row["ms_first10"], row["ms_last10"], row["last_over_first"]
        lines.append(
            f"| {label} | {f['median']:.2f} ({f['p10']:.2f}-{f['p90']:.2f}) | "
            f"{last['median']:.2f} ({last['p10']:.2f}-{last['p90']:.2f}) | {ratio['median']:.2f}x | "
            + " | ".join(mem)
            + " |"
        )
    reads = [(n, r) for n, r in fig["contenders"].items() if r["status"] == "ok" and "history_ms" in r]
    if reads:
        lines += [
            "",
            f"Reads after the {steps} steps (medians over rounds): the whole history "
            f"(`get_state_history`: {3 * steps:,} checkpoints, 3 per invoke), and `get_state` of an old checkpoint "
            f"(the 30th from the start, read {OLD_READS} times per thread).",
            "",
            "| saver | history, ms | checkpoints it returned | get_state of an old checkpoint, ms |",
            "| --- | --- | --- | --- |",
        ]
        for name, row in reads:
            label = f"{name} {row['version']}" if row.get("version") else name
            h, g = row["history_ms"], row["old_get_ms"]
            lines.append(
                f"| {label} | {h['median']:.1f} ({h['p10']:.1f}-{h['p90']:.1f}) | {row['history_len']:,} | "
                f"{g['median']:.2f} ({g['p10']:.2f}-{g['p90']:.2f}) |"
            )
    ours = fig["contenders"].get("redis_agentstate AgentStateSaver", {})
    split = ours.get("memory", {}).get(str(steps), {}).get("own_by_key")
    if split:
        lines += ["", f"AgentStateSaver's keys after {steps} steps: " + ", ".join(
            f"{kind} {_mib(n)}" for kind, n in split.items()
        ) + "."]  # fmt: skip
    return "\n".join(lines)


def targets(fig: dict[str, Any]) -> list[str]:
    """The saver's goals, each with its measured figure (medians over rounds), for each workload."""
    out = _targets(fig)
    if "rewrite" in fig:
        out += [f"rewrite: {line}" for line in _targets(fig["rewrite"])]
    for name, label in (("redis_agentstate AgentStateSaver", "long value"), (ENCRYPTED, "long value, encrypted")):
        ours = fig.get("long_value", {}).get("contenders", {}).get(name)
        if ours and "error" not in ours:
            out.append(
                f"{label}: longest script while reading the history {ours['longest_script_ms']:.2f} ms (target: at "
                f"most 10 ms), {ours['checkpoints']} of {3 * fig['long_value']['invokes']} checkpoints returned"
            )
    return out


def _targets(fig: dict[str, Any]) -> list[str]:
    rows = fig["contenders"]
    ours = rows.get("redis_agentstate AgentStateSaver")
    if not ours or ours["status"] != "ok":
        return ["our saver did not run"]
    steps = str(fig["steps"])
    peers = {n: r for n, r in rows.items() if r is not ours and r["status"] == "ok"}
    out = []
    mem = ours["memory"][steps]["used_memory_delta"]["median"]
    own = ours["memory"][steps].get("own_keys")
    own_text = "" if not own else f", {own / 2**20:.2f} MiB by its keys' MEMORY USAGE"
    out.append(
        f"memory per thread after {steps} steps: {mem / 2**20:.2f} MiB of used_memory{own_text} "
        "(target: at most 1 MiB, both)"
    )
    if peers:
        best = min(r["memory"][steps]["used_memory_delta"]["median"] for r in peers.values())
        out.append(f"memory, best peer / ours: {best / max(mem, 1):.0f}x (target: at least 50x)")
    ratio = ours["last_over_first"]["median"]
    out.append(f"ms per invoke, last 10 steps / steps 1-10: {ratio:.2f}x (target: at most 1.2x)")
    for n, r in peers.items():
        first = r["ms_first10"]["median"] / ours["ms_first10"]["median"]
        last = r["ms_last10"]["median"] / ours["ms_last10"]["median"]
        out.append(
            f"{n} / ours, ms per invoke: {first:.2f}x at steps 1-10, {last:.2f}x at the last 10 (target: above 1)"
        )
        if "history_ms" in r and "history_ms" in ours:
            hist = r["history_ms"]["median"] / ours["history_ms"]["median"]
            old = r["old_get_ms"]["median"] / ours["old_get_ms"]["median"]
            out.append(f"{n} / ours, reads: {hist:.2f}x for the history, {old:.2f}x for an old checkpoint")
    return out
