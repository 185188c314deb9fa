"""Figure 1: one connection, claim + commit of a 1 KiB shared_state, next to the floor and the lock libraries.

Every contender does one "cycle" per call on the same redis-py client (one
connection, used serially). Rounds interleave the contenders in a shuffled
order, so a noisy neighbour slows all of them alike and the per-round ratios
stay honest; the ratios are computed per round and then summarised.
"""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import redis

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.testing import finish, first_call, internals

from ._util import (
    Settings,
    has_json_and_search,
    host_port,
    latency_summary,
    make_state,
    percentile,
    server_modules,
    summary,
    time_batch,
)

STATE_BYTES = 1024
NOT_INSTALLED = "not installed (pip install 'redis-agentstate[bench]')"


@dataclass
class Contender:
    name: str
    label: str
    cycle: Callable[[], Any] | None
    status: str = "ok"
    round_trips: int | None = None
    close: Callable[[], None] | None = None


class AgentCycle:
    """Claim the next cycle, change the state, commit it: what a worker does per cycle."""

    def __init__(self, store: Any, task_id: str, token: str, state: dict[str, Any]) -> None:
        self.store = store
        self.api: Any = store
        self.task_id = task_id
        self.token = token
        store.delete(task_id)
        store.create(Checkpoint(task_id, shared_state=state))
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        cp = self.api.claim(self.task_id, self.n, token=self.token, lease_ms=30_000)
        cp.cycle_index = self.n
        cp.shared_state["step"] = self.n
        if not self.api.commit(cp, token=self.token, expected_revision=cp.revision):
            raise RuntimeError("commit was fenced out in a single-writer benchmark")


class ContinueCycle:
    """A worker going on with its task: ``commit_and_claim`` commits cycle N and claims N + 1.

    The steady state of an agent run: one script per cycle.
    """

    def __init__(self, store: Any, task_id: str, token: str, state: dict[str, Any]) -> None:
        self.store = store
        self.task_id = task_id
        self.token = token
        store.delete(task_id)
        store.create(Checkpoint(task_id, shared_state=state))
        cp = store.claim(task_id, 1, token=token, lease_ms=30_000)
        assert cp is not None
        self.cp = cp

    def __call__(self) -> None:
        cp = self.cp
        cp.cycle_index = cp.claimed_cycle or cp.cycle_index + 1
        cp.shared_state["step"] = cp.cycle_index
        nxt = self.store.commit_and_claim(cp, token=self.token, expected_revision=cp.revision, lease_ms=30_000)
        if nxt is None:
            raise RuntimeError("commit_and_claim was fenced out in a single-writer benchmark")
        self.cp = nxt


def server_us(client: redis.Redis, store: CheckpointStore, state: dict[str, Any], n: int) -> dict[str, float]:
    """Server microseconds per cycle from ``INFO commandstats`` (private server only: it resets the stats).

    Each kind of cycle runs ``n`` times alone between two resets: claim + commit (two
    scripts), commit_and_claim (one), and a no-op EVALSHA for scale.
    """
    kinds: dict[str, Callable[[], Any]] = {
        "claim_commit": AgentCycle(store, "srv-cc", "w-srv", dict(state)),
        "commit_and_claim": ContinueCycle(store, "srv-cac", "w-srv", dict(state)),
        "noop_evalsha": lambda: client.evalsha(noop, 0),
    }
    noop = client.script_load("return 0")
    out: dict[str, float] = {}
    for name, cycle in kinds.items():
        for _ in range(20):
            cycle()
        client.config_resetstat()
        for _ in range(n):
            cycle()
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        out[f"{name}_us"] = round(float(stats.get("usec", 0)) / n, 2)
        out[f"{name}_calls"] = round(float(stats.get("calls", 0)) / n, 2)
    for tid in ("srv-cc", "srv-cac"):
        store.delete(tid)
    return out


def noop_evalsha(client: redis.Redis, n: int = 2) -> Callable[[], Any]:
    """``n`` no-op EVALSHA through redis-py, one after the other on the same connection."""
    sha = client.script_load("return 0")
    execute = client.execute_command

    def two() -> None:
        execute("EVALSHA", sha, 0)
        execute("EVALSHA", sha, 0)

    def one() -> None:
        execute("EVALSHA", sha, 0)

    return two if n == 2 else one


def raw_socket_evalsha(url: str, client: redis.Redis) -> tuple[Callable[[], Any], Callable[[], None]]:
    """Two pre-encoded no-op EVALSHAs over a bare socket: the wire + server floor, no client library."""
    sha = client.script_load("return 0").encode()
    host, port = host_port(url)
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    auth = client.connection_pool.connection_kwargs.get("password")
    if auth:
        sock.sendall(_resp(b"AUTH", str(auth).encode()))
        sock.recv(1024)
    cmd = _resp(b"EVALSHA", sha, b"0")

    def cycle() -> None:
        for _ in range(2):
            sock.sendall(cmd)
            reply = sock.recv(64)
            if reply != b":0\r\n":
                raise RuntimeError(f"unexpected raw reply {reply!r}")

    return cycle, sock.close


def _lua_literal(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        value = value.encode()
    return "'" + "".join(chr(b) if chr(b).isascii() and chr(b).isalpha() else f"\\{b:03d}" for b in value) + "'"


def shaped_floor(client: redis.Redis, store: CheckpointStore, state: dict[str, Any]) -> Callable[[], Any]:
    """The cycle's exact wire traffic with no Lua work and no library logic.

    Two EVALSHAs through redis-py carrying the same KEYS and ARGV as a real
    claim and a real commit, of scripts that only return constant replies of
    the same shape as the real ones. So ``agentstate - shaped`` is the
    library's own Python plus the scripts' server work, and ``shaped - floor``
    is what the traffic's size and shape cost redis-py and the wire.
    """
    inside = internals(store)
    core = inside.core
    task_id = "task-shape"
    store.delete(task_id)
    store.create(Checkpoint(task_id, shared_state=dict(state)))
    claim_op = core.claim(task_id, 1, token="w-shape", lease_ms=30_000)
    claim_req = first_call(claim_op)
    claim_reply = inside.scripts[claim_req.script](keys=claim_req.keys, args=claim_req.args, client=client)
    cp = finish(claim_op, claim_reply)
    assert cp is not None
    cp.cycle_index = 1
    commit_op = core.commit(cp, token="w-shape", expected_revision=cp.revision)
    commit_req = first_call(commit_op)
    commit_op.close()
    claim_sha = client.script_load("return {" + ",".join(_lua_literal(v) for v in claim_reply) + "}")
    commit_sha = client.script_load("return {1, '1'}")
    if client.evalsha(claim_sha, 0) != claim_reply:
        raise RuntimeError("the shaped claim script does not reproduce the real claim reply")
    claim_argv = ("EVALSHA", claim_sha, len(claim_req.keys), *claim_req.keys, *claim_req.args)
    commit_argv = ("EVALSHA", commit_sha, len(commit_req.keys), *commit_req.keys, *commit_req.args)
    execute = client.execute_command

    def cycle() -> None:
        execute(*claim_argv)
        execute(*commit_argv)

    return cycle


def _resp(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


def lock_contenders(client: redis.Redis, ns: str, blob: bytes) -> list[Contender]:
    """acquire -> SET 1 KiB state -> release, for each lock library (objects built once: their best case)."""
    out: list[Contender] = []
    state_key = f"{ns}:state"

    lock = client.lock(f"{ns}:redis-py-lock", timeout=30)

    def redis_py_lock() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py Lock not acquired")
        client.set(state_key, blob)
        lock.release()

    out.append(Contender("redis_py_lock", "redis-py Lock: acquire + SET 1 KiB + release", redis_py_lock, round_trips=3))

    try:
        import redis_lock
    except ImportError as exc:
        out.append(_missing("python_redis_lock", "python-redis-lock: acquire + SET 1 KiB + release", exc))
    else:
        prl = redis_lock.Lock(client, f"{ns}:python-redis-lock", expire=30)

        def python_redis_lock() -> None:
            if not prl.acquire(blocking=False):
                raise RuntimeError("python-redis-lock not acquired")
            client.set(state_key, blob)
            prl.release()

        out.append(
            Contender(
                "python_redis_lock",
                "python-redis-lock: acquire + SET 1 KiB + release",
                python_redis_lock,
                round_trips=3,
            )
        )

    try:
        from pottery import Redlock
    except ImportError as exc:
        out.append(_missing("pottery_redlock", "pottery Redlock (1 master): acquire + SET 1 KiB + release", exc))
    else:
        rl = Redlock(key=f"{ns}:pottery", masters={client}, auto_release_time=30)

        def pottery_redlock() -> None:
            if not rl.acquire(blocking=False):
                raise RuntimeError("pottery Redlock not acquired")
            client.set(state_key, blob)
            rl.release()

        out.append(
            Contender(
                "pottery_redlock",
                "pottery Redlock (1 master): acquire + SET 1 KiB + release",
                pottery_redlock,
                round_trips=3,
            )
        )
    return out


def _missing(name: str, label: str, exc: BaseException) -> Contender:
    return Contender(name, label, None, status=f"{NOT_INSTALLED}: {exc}")


LANGGRAPH_LABEL = "langgraph-checkpoint-redis: put + get of a 1 KiB checkpoint"


def langgraph_contender(settings: Settings, client: redis.Redis, state: dict[str, Any]) -> Contender:
    if not has_json_and_search(client):
        mods = {m.lower() for m in server_modules(client)}
        have = ", ".join(sorted(mods)) if mods else "none"
        return Contender(
            "langgraph_redis", LANGGRAPH_LABEL, None, status=f"not run: needs RedisJSON+RediSearch (server has {have})"
        )
    try:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.redis import RedisSaver
    except ImportError as exc:
        return _missing("langgraph_redis", LANGGRAPH_LABEL, exc)
    try:  # pragma: no cover - only on a server with the modules
        saver = RedisSaver(redis_client=client)
        saver.setup()
        thread = f"{settings.ns('langgraph')}-{uuid.uuid4().hex[:6]}"
        config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        step = [0]

        def put_get() -> None:
            step[0] += 1
            cp = empty_checkpoint()
            cp["channel_values"] = {"state": state}
            cp["channel_versions"] = {"state": step[0]}
            saver.put(config, cp, {"source": "loop", "step": step[0], "parents": {}}, {"state": step[0]})  # type: ignore[arg-type,typeddict-item,unused-ignore]
            if saver.get_tuple(config) is None:  # type: ignore[arg-type]
                raise RuntimeError("langgraph get_tuple returned None")

        put_get()
        return Contender("langgraph_redis", LANGGRAPH_LABEL, put_get)
    except Exception as exc:  # pragma: no cover
        return Contender("langgraph_redis", LANGGRAPH_LABEL, None, status=f"failed: {exc!r}")


def run(settings: Settings) -> dict[str, Any]:
    client = settings.client()
    ns = settings.ns("single")
    state = make_state(STATE_BYTES)
    blob = msgpack.packb(state)
    store = CheckpointStore(client, namespace=ns)
    raw_cycle, raw_close = raw_socket_evalsha(settings.url, client)
    contenders = [
        Contender(
            "floor_evalsha", "floor: 2 no-op EVALSHA, redis-py, same connection", noop_evalsha(client), round_trips=2
        ),
        Contender(
            "floor_raw_socket",
            "wire floor: 2 no-op EVALSHA, bare socket (no client library)",
            raw_cycle,
            round_trips=2,
            close=raw_close,
        ),
        Contender(
            "floor_shaped",
            "shaped floor: the same 2 EVALSHAs (keys, args, reply shape), scripts do no work",
            shaped_floor(client, store, state),
            round_trips=2,
        ),
        Contender(
            "agentstate",
            "redis_agentstate: claim + commit, 1 KiB shared_state",
            AgentCycle(store, "task-1", "w1", dict(state)),
            round_trips=2,
        ),
        Contender(
            "agentstate_continue",
            "redis_agentstate: commit_and_claim (commit N + claim N+1), 1 KiB shared_state",
            ContinueCycle(store, "task-3", "w3", dict(state)),
            round_trips=1,
        ),
        Contender(
            "floor_evalsha1",
            "floor of a steady cycle: 1 no-op EVALSHA, redis-py",
            noop_evalsha(client, 1),
            round_trips=1,
        ),
        *lock_contenders(client, ns, blob),
        langgraph_contender(settings, client, state),
    ]
    runnable = [c for c in contenders if c.cycle is not None]
    # Many short rounds: on a shared machine the load changes within seconds, and a
    # ratio is only fair between batches run moments apart.
    # Rounds of 10 cycles (a few ms) in a shuffled order are near-simultaneous for
    # every contender.
    cycles = 10
    rounds = settings.rounds * (6 if settings.quick else 40)
    rng = random.Random(settings.seed)
    for c in runnable:  # warm up: scripts loaded, connections open, caches filled
        time_batch(c.cycle, 10 if settings.quick else 100)  # type: ignore[arg-type]
    means: dict[str, list[float]] = {c.name: [] for c in runnable}
    per_cycle: dict[str, list[float]] = {c.name: [] for c in runnable}
    for _ in range(rounds):
        order = list(runnable)
        rng.shuffle(order)
        for c in order:
            mean, per = time_batch(c.cycle, cycles)  # type: ignore[arg-type]
            means[c.name].append(mean)
            per_cycle[c.name].extend(per)
    for c in contenders:
        if c.close:
            c.close()
    server = server_us(client, store, state, 200 if settings.quick else 3000) if settings.private else None

    def ratio(a: str, b: str) -> dict[str, Any] | None:
        """Per-round ratios summarised, plus ``quiet``: the ratio of the two p10 batches.

        The p10 batch of each contender is its cost when the shared machine
        happened to leave it alone (like timeit's minimum, but less jumpy).
        """
        if a not in means or b not in means:
            return None
        out = summary([x / y for x, y in zip(means[a], means[b], strict=True)], 3)
        out["quiet"] = round(percentile(means[a], 10) / percentile(means[b], 10), 3)
        return out

    rows = []
    for c in contenders:
        row: dict[str, Any] = {"name": c.name, "label": c.label, "status": c.status, "round_trips": c.round_trips}
        if c.name in means:
            row["us_per_cycle"] = summary(means[c.name], 1)
            row["latency_us"] = latency_summary(per_cycle[c.name])
            row["vs_floor"] = ratio(c.name, "floor_evalsha")
            row["speedup_of_agentstate"] = ratio(c.name, "agentstate")
        rows.append(row)
    client.close()
    return {
        "title": "Single connection: one claim + commit cycle of a 1 KiB shared_state",
        "unit": "us per cycle (mean of a batch; median and p10/p90 over rounds)",
        "rounds": rounds,
        "cycles_per_round": cycles,
        "state_bytes": len(blob),
        "rows": rows,
        "server_us": server,
        "ratios": {
            "agentstate_vs_floor": ratio("agentstate", "floor_evalsha"),
            "lock_over_agentstate": ratio("redis_py_lock", "agentstate"),
            "lock_over_continue": ratio("redis_py_lock", "agentstate_continue"),
            "continue_vs_floor": ratio("agentstate_continue", "floor_evalsha"),
            "claim_commit_over_continue": ratio("agentstate", "agentstate_continue"),
            "continue_vs_floor1": ratio("agentstate_continue", "floor_evalsha1"),
            "redis_py_floor_vs_raw": ratio("floor_evalsha", "floor_raw_socket"),
            "shaped_vs_floor": ratio("floor_shaped", "floor_evalsha"),
            "agentstate_vs_shaped": ratio("agentstate", "floor_shaped"),
        },
    }
