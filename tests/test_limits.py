"""Per-key concurrency limits: at most ``limit`` live leases of the tasks of one ``concurrency_key``
at any moment, fleet-wide; ``claim`` over it raises ``ConcurrencyLimited`` with nothing written,
``claim_next`` serves other keys' tasks and wakes a put-off one when a place frees, a lapsed lease
frees its place by itself; on every backend (the local Cluster puts the limiter in another slot
than the tasks), sync and async, through the store, the Lease, the Runners and the CLI."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis
from faults.replies import lose_first_reply
from flows import ids_in_distinct_shards

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    AsyncRunner,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    ConcurrencyLimited,
    CorruptState,
    InvalidArgument,
    Runner,
    StepResult,
)
from redis_agentstate import cli as cli_mod
from redis_agentstate.core.validate import LIMIT_SKEW_MS, MAX_CONCURRENCY_LIMIT
from redis_agentstate.keys import Keys, shard_of

LONG_MS = 30_000
KEY = "tenant-a"


def scripts_of(store: Any) -> dict[str, Any]:
    return getattr(store, "wrapped", store)._scripts  # type: ignore[no-any-return]


def server_ms(raw: Any) -> int:
    sec, usec = raw.time()
    return int(sec) * 1000 + int(usec) // 1000


def limited(store: Any, n: int, key: str = KEY, prefix: str = "t") -> list[str]:
    """``n`` tasks of concurrency key ``key`` in distinct shards (none in the limiter's shard on a Cluster)."""
    tids = [t for t in ids_in_distinct_shards(n + 1, prefix=prefix) if shard_of(t) != shard_of(key)][:n]
    for tid in tids:
        assert store.create(Checkpoint(tid, concurrency_key=key))
    return tids


def one_place_held(make: Callable[..., Any]) -> tuple[Any, str, str, Checkpoint]:
    """A store whose key KEY has limit 1, two of its tasks ``a`` and ``b``, and ``a`` claimed by lease "A"."""
    store = make(CheckpointStore, AsyncCheckpointStore)
    store.set_concurrency_limit(KEY, 1)
    a, b = limited(store, 2)
    return store, a, b, store.claim(a, 1, token="A", lease_ms=LONG_MS)


def drain(store: Any, token: str = "w") -> list[str]:
    got = []
    while (cp := store.claim_next(token=token, lease_ms=LONG_MS)) is not None:
        got.append(cp.task_id)
    return got


def live(store: Any, key: str = KEY) -> int | None:
    return next((s.live for s in store.concurrency_limits() if s.key == key), None)


def commit(store: Any, cp: Checkpoint, **kw: Any) -> bool:
    cp.cycle_index = cp.claimed_cycle or cp.cycle_index + 1
    return bool(store.commit(cp, token=cp.claim_token, expected_revision=cp.revision, **kw))


class TestLimits:
    """The limit itself, through the store's calls (every backend, sync and async)."""

    def test_a_claim_over_the_limit_is_refused_with_nothing_written(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 2)
        a, b, c = limited(store, 3)
        assert store.claim(a, 1, token="A", lease_ms=LONG_MS).concurrency_key == KEY
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None
        before = dict(raw.hgetall(Keys(namespace).task(c).checkpoint))
        with pytest.raises(ConcurrencyLimited) as refused:
            store.claim(c, 1, token="C", lease_ms=LONG_MS)
        err = refused.value
        assert isinstance(err, ClaimRejected)
        assert (err.task_id, err.concurrency_key, err.live, err.limit) == (c, KEY, 2, 2)
        assert err.retry_at_ms is not None and err.retry_at_ms > 0
        assert dict(raw.hgetall(Keys(namespace).task(c).checkpoint)) == before
        assert live(store) == 2

    def test_a_commit_gives_the_place_back(self, make: Callable[..., Any]) -> None:
        store, _, b, cp = one_place_held(make)
        with pytest.raises(ConcurrencyLimited):
            store.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert commit(store, cp)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None
        assert live(store) == 1

    def test_a_lapsed_lease_frees_its_place_by_itself(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 1)
        a, b = limited(store, 2)
        held = store.claim(a, 1, token="dies", lease_ms=300)
        # The lease is capped by its place: it runs out LIMIT_SKEW_MS before the place does.
        with pytest.raises(ConcurrencyLimited) as refused:
            store.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert refused.value.retry_at_ms >= held.lease_expires_at_ms + LIMIT_SKEW_MS - 5
        time.sleep((300 + LIMIT_SKEW_MS + 100) / 1000)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    def test_claim_next_serves_other_keys_and_never_passes_the_limit(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 2)
        capped = limited(store, 5)
        other = limited(store, 3, key="tenant-b", prefix="o")  # a key without a limit
        store.create(Checkpoint("plain"))
        got = drain(store)
        assert sorted(got) == sorted([*[t for t in got if t in capped], *other, "plain"])
        assert len([t for t in got if t in capped]) == 2
        assert live(store) == 2 and live(store, "tenant-b") is None  # only limited keys are listed

    def test_a_place_given_back_wakes_a_put_off_task_at_once(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store, a, b, cp = one_place_held(make)
        assert store.claim_next(token="W", lease_ms=LONG_MS) is None  # b put off: the key is full
        ready = Keys(namespace).task(b).ready
        assert raw.zscore(ready, b) >= cp.lease_expires_at_ms  # until a's place runs out at the latest
        assert raw.zrange(Keys(namespace).limiter(KEY).waiters, 0, -1) == [b.encode()]
        # Given back (claimable again only in a while, so that the woken one is what claim_next finds).
        assert store.release(a, token="A", expected_revision=cp.revision, after_ms=LONG_MS) is True
        got = store.claim_next(token="W", lease_ms=LONG_MS)  # woken: due now, not at a's lease's end
        assert got is not None and got.task_id == b
        assert raw.zcard(Keys(namespace).limiter(KEY).waiters) == 0

    def test_raising_the_limit_wakes_the_put_off_tasks(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 1)
        tids = limited(store, 4)
        first = drain(store)
        assert len(first) == 1
        store.set_concurrency_limit(KEY, 3)
        assert len(drain(store, token="W2")) == 2
        assert live(store) == 3
        store.set_concurrency_limit(KEY, None)  # no limit: the rest goes, and the key is not listed
        assert len(drain(store, token="W3")) == 1
        assert live(store) is None
        assert len({*first}) == 1 and set(tids) >= set(first)

    def test_lowering_the_limit_keeps_the_live_leases(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 3)
        a, b, c, d = limited(store, 4)
        held = [store.claim(t, 1, token=f"w{t}", lease_ms=LONG_MS) for t in (a, b, c)]
        store.set_concurrency_limit(KEY, 1)
        assert store.renew(a, token=f"w{a}", expected_revision=held[0].revision, lease_ms=LONG_MS)
        assert live(store) == 3
        for cp in held[:2]:
            assert commit(store, cp)
        with pytest.raises(ConcurrencyLimited):  # one live lease, of a limit of one
            store.claim(d, 1, token="D", lease_ms=LONG_MS)
        assert commit(store, held[2])
        assert store.claim(d, 1, token="D", lease_ms=LONG_MS) is not None

    def test_a_resent_claim_holds_one_place(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 2)
        (a,) = limited(store, 1)
        first = store.claim(a, 1, token="A", lease_ms=LONG_MS)
        again = store.claim(a, 1, token="A", lease_ms=LONG_MS)  # a re-send after a lost reply
        assert again.revision == first.revision and live(store) == 1

    def test_commit_and_claim_moves_the_place_to_the_next_cycle(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        store, a, b, cp = one_place_held(make)
        cp.cycle_index = 1
        nxt = store.commit_and_claim(cp, token="A", expected_revision=cp.revision, lease_ms=LONG_MS, next_token="A2")
        assert nxt is not None and nxt.claimed_cycle == 2 and nxt.concurrency_key == KEY
        holders = raw.zrange(Keys(namespace).limiter(KEY).holders, 0, -1, withscores=True)
        assert [h for h, _ in holders] == [f"{a}\0A2".encode()]
        assert nxt.lease_expires_at_ms <= holders[0][1] - LIMIT_SKEW_MS
        with pytest.raises(ConcurrencyLimited):
            store.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert commit(store, nxt)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    def test_a_commit_can_change_or_drop_the_key(self, make: Callable[..., Any]) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 1)
        store.set_concurrency_limit("tenant-b", 1)
        a, b = limited(store, 2)
        cp = store.claim(a, 1, token="A", lease_ms=LONG_MS)
        cp.cycle_index, cp.concurrency_key = 1, "tenant-b"
        nxt = store.commit_and_claim(cp, token="A", expected_revision=cp.revision, lease_ms=LONG_MS)
        assert nxt.concurrency_key == "tenant-b" and store.load(a).concurrency_key == "tenant-b"
        assert (live(store), live(store, "tenant-b")) == (0, 1)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None  # tenant-a's place was given back
        nxt.cycle_index, nxt.concurrency_key = 2, None
        assert store.commit(nxt, token="A", expected_revision=nxt.revision)
        assert live(store, "tenant-b") == 0 and store.load(a).concurrency_key is None
        assert store.claim(a, 3, token="A3", lease_ms=LONG_MS) is not None  # unlimited now

    def test_a_renewal_without_a_known_place_takes_one(self, make: Callable[..., Any]) -> None:
        """A renewal by a store that did not claim (another process of the same worker) moves the place too."""
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 1)
        (a,) = limited(store, 1)
        cp = store.claim(a, 1, token="A", lease_ms=2_000)
        other = make(CheckpointStore, AsyncCheckpointStore)
        assert other.renew(a, token="A", expected_revision=cp.revision, lease_ms=LONG_MS)
        assert live(store) == 1  # the same holder: one place, moved on

    @pytest.mark.parametrize("bad", ["", "x" * 257, "bad\x00key", "\ud800", 5, None])
    def test_a_bad_concurrency_key_is_refused_before_anything_is_written(
        self, make: Callable[..., Any], bad: Any
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        if bad is not None:
            with pytest.raises(InvalidArgument, match="concurrency_key"):
                store.create(Checkpoint("t", concurrency_key=bad))
            assert store.load("t") is None
        with pytest.raises(InvalidArgument, match="key"):
            store.set_concurrency_limit(bad, 1)
        assert store.concurrency_limits() == []

    @pytest.mark.parametrize("bad", [0, -1, MAX_CONCURRENCY_LIMIT + 1, 1.5, True, "2"])
    def test_a_bad_limit_is_refused_and_the_old_one_kept(self, make: Callable[..., Any], bad: Any) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 2)
        with pytest.raises(InvalidArgument, match="limit"):
            store.set_concurrency_limit(KEY, bad)
        assert [(s.key, s.limit) for s in store.concurrency_limits()] == [(KEY, 2)]

    @pytest.mark.parametrize("stored", ["0", "-1", "abc", "1.5", "99999999"])
    def test_a_corrupt_limit_is_corrupt_state(
        self, make: Callable[..., Any], raw: Any, namespace: str, stored: str
    ) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 2)
        (a,) = limited(store, 1)
        raw.set(Keys(namespace).limiter(KEY).limit, stored)
        with pytest.raises(CorruptState):
            store.claim(a, 1, token="A", lease_ms=LONG_MS)
        with pytest.raises(CorruptState):
            store.concurrency_limits()
        assert store.load(a).claim_token is None

    def test_a_corrupt_stored_key_is_corrupt_state(self, make: Callable[..., Any], raw: Any, namespace: str) -> None:
        store = make(CheckpointStore, AsyncCheckpointStore)
        (a,) = limited(store, 1)
        raw.hset(Keys(namespace).task(a).checkpoint, "ckey", "k" * 300)
        with pytest.raises(CorruptState):
            store.load(a)
        with pytest.raises(CorruptState):
            store.claim(a, 1, token="A", lease_ms=LONG_MS)


def _stale_commit(store: Any, a: str, cp: Checkpoint) -> Any:
    return store.commit(replace(cp, cycle_index=1), token="A", expected_revision=cp.revision - 1)


def _wrong_cycle_commit(store: Any, a: str, cp: Checkpoint) -> Any:
    return store.commit(replace(cp, cycle_index=2), token="A", expected_revision=cp.revision)


def _stale_renew(lease_ms: int = LONG_MS) -> Callable[[Any, str, Checkpoint], Any]:
    def write(store: Any, a: str, cp: Checkpoint) -> Any:
        return store.renew(a, token="A", expected_revision=cp.revision - 1, lease_ms=lease_ms)

    return write


def _stale_release(store: Any, a: str, cp: Checkpoint) -> Any:
    return store.release(a, token="A", expected_revision=cp.revision - 1, after_ms=1)


def _stale_commit_and_claim(next_token: str | None, lease_ms: int = LONG_MS) -> Callable[[Any, str, Checkpoint], Any]:
    def write(store: Any, a: str, cp: Checkpoint) -> Any:
        return store.commit_and_claim(replace(cp, cycle_index=1), token="A", expected_revision=cp.revision - 1,
                                      lease_ms=lease_ms, next_token=next_token)  # fmt: skip

    return write


def _finalize_under_the_claim(store: Any, a: str, cp: Checkpoint) -> Any:
    final = replace(cp, cycle_index=1, status=AgentStatus.COMPLETED, terminal_result={"ok": True})
    return store.finalize(final, expected_revision=cp.revision)  # refused: a claim is held (A's)


#: Every write a holder can make that is refused with nothing written (issue 38, item 3).
REFUSED_WRITES: dict[str, Callable[[Any, str, Checkpoint], Any]] = {
    "commit-stale-revision": _stale_commit,
    "commit-wrong-cycle": _wrong_cycle_commit,
    "renew-stale-revision": _stale_renew(),
    "renew-stale-revision-shorter-lease": _stale_renew(1_000),  # the place it moved on must outlast the lease
    "release-stale-revision": _stale_release,
    "commit_and_claim-same-token": _stale_commit_and_claim(None),
    "commit_and_claim-next-token": _stale_commit_and_claim("A2"),
    "commit_and_claim-shorter-lease": _stale_commit_and_claim(None, 1_000),
    "commit_and_claim-next-token-shorter-lease": _stale_commit_and_claim("A2", 1_000),
    "finalize-under-the-claim": _finalize_under_the_claim,
}
#: The script each refused write sends (its lost-reply case loses that script's reply).
REFUSED_SCRIPT = {"commit": "commit", "renew": "renew", "release": "release",
                  "commit_and_claim": "commit_and_claim", "finalize": "finalize"}  # fmt: skip


def place_of(raw: Any, namespace: str, task_id: str, token: str) -> float | None:
    """The expiry (server ms) of the limiter place lease ``token`` of ``task_id`` holds, if any."""
    score = raw.zscore(Keys(namespace).limiter(KEY).holders, f"{task_id}\0{token}")
    return None if score is None else float(score)


class TestFencedOutWrites:
    """Only a lease that ended gives its limiter place back (issue 38, item 3): a write that is refused
    while its lease stays live (stale revision, wrong cycle, a claim held) keeps the place, so the key
    never has more live leases than its limit; one refused because the lease is over (taken over,
    gone, cancelled) gives it back at once."""

    @pytest.mark.parametrize("write", list(REFUSED_WRITES))
    def test_a_refused_write_of_a_live_lease_keeps_its_place(
        self, make: Callable[..., Any], raw: Any, namespace: str, write: str
    ) -> None:
        store, a, b, cp = one_place_held(make)
        before = dict(raw.hgetall(Keys(namespace).task(a).checkpoint))
        assert not REFUSED_WRITES[write](store, a, cp)
        assert dict(raw.hgetall(Keys(namespace).task(a).checkpoint)) == before  # nothing written
        # A's lease is live: its place must be too, and last at least as long as the lease.
        expiry = place_of(raw, namespace, a, "A")
        assert expiry is not None and expiry >= cp.lease_expires_at_ms + LIMIT_SKEW_MS
        assert live(store) == 1
        with pytest.raises(ConcurrencyLimited):
            store.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert commit(store, cp)  # A's own commit still frees the place
        assert live(store) == 0 and place_of(raw, namespace, a, "A") is None
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    @pytest.mark.parametrize("write", list(REFUSED_WRITES))
    def test_a_refused_write_whose_reply_was_lost_keeps_its_place(
        self, make: Callable[..., Any], raw: Any, namespace: str, write: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store, a, b, cp = one_place_held(make)
        calls = lose_first_reply(scripts_of(store)[REFUSED_SCRIPT[write.split("-")[0]]], monkeypatch)
        assert not REFUSED_WRITES[write](store, a, cp)
        assert len(calls) == 2  # the refusal was lost, the re-send refused again
        assert live(store) == 1
        with pytest.raises(ConcurrencyLimited):
            store.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert commit(store, cp)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    @pytest.mark.parametrize("write", ["commit", "release", "commit_and_claim"])
    def test_an_applied_write_whose_reply_was_lost_ends_the_lease_once(
        self, make: Callable[..., Any], raw: Any, namespace: str, write: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The re-send is answered "applied before": the lease ended, its place goes (commit_and_claim:
        moves to the next cycle's lease, which a commit then frees)."""
        store, a, b, cp = one_place_held(make)
        calls = lose_first_reply(scripts_of(store)[write], monkeypatch)
        if write == "commit":
            assert commit(store, cp)
        elif write == "release":
            assert store.release(a, token="A", expected_revision=cp.revision, after_ms=LONG_MS)
        else:
            nxt = store.commit_and_claim(replace(cp, cycle_index=1), token="A", expected_revision=cp.revision,
                                         lease_ms=LONG_MS, next_token="A2")  # fmt: skip
            assert nxt is not None and nxt.claim_token == "A2"
            assert place_of(raw, namespace, a, "A") is None and place_of(raw, namespace, a, "A2") is not None
            with pytest.raises(ConcurrencyLimited):
                store.claim(b, 1, token="B", lease_ms=LONG_MS)
            assert commit(store, nxt)
        assert len(calls) == 2
        assert live(store) == 0
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    def test_a_renewal_whose_reply_was_lost_keeps_its_place(
        self, make: Callable[..., Any], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store, a, b, cp = one_place_held(make)
        calls = lose_first_reply(scripts_of(store)["renew"], monkeypatch)
        assert store.renew(a, token="A", expected_revision=cp.revision, lease_ms=LONG_MS)
        assert len(calls) == 2 and live(store) == 1
        with pytest.raises(ConcurrencyLimited):
            store.claim(b, 1, token="B", lease_ms=LONG_MS)

    @pytest.mark.parametrize("next_token", [None, "A2"])
    def test_a_commit_and_claim_whose_new_place_ran_out_keeps_the_live_leases_place(
        self, make: Callable[..., Any], raw: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, next_token: Any
    ) -> None:
        """The fence passed but the place taken for the next claim had run out when the script ran
        (LIMITED, nothing written; a stall of a lease's length in between, made here by a permit that
        says so): A's lease goes on, and so does its place."""
        store, a, b, cp = one_place_held(make)
        core = getattr(store, "wrapped", store)._core
        take = core.limits.take_place

        def run_out(*args: Any, **kw: Any) -> Any:
            got, full = yield from take(*args, **kw)
            return (None if got is None else 1), full  # a permit that expired long ago

        monkeypatch.setattr(core.limits, "take_place", run_out)
        with pytest.raises(ConcurrencyLimited):
            store.commit_and_claim(replace(cp, cycle_index=1), token="A", expected_revision=cp.revision,
                                   lease_ms=1_000, next_token=next_token)  # fmt: skip
        monkeypatch.undo()
        expiry = place_of(raw, namespace, a, "A")
        assert expiry is not None and expiry >= cp.lease_expires_at_ms + LIMIT_SKEW_MS
        assert live(store) == 1 and store.load(a).revision == cp.revision
        with pytest.raises(ConcurrencyLimited):
            store.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert commit(store, cp)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    def test_a_stale_commit_and_claim_from_another_store_keeps_the_place(
        self, make: Callable[..., Any], raw: Any, namespace: str
    ) -> None:
        """A store that did not take A's place (another process of the same worker) moves it with the
        next claim's lease; refused, it puts it back past A's lease, and never gives it back."""
        store, a, b, cp = one_place_held(make)
        other = make(CheckpointStore, AsyncCheckpointStore)
        assert _stale_commit_and_claim(None, 1_000)(other, a, cp) is None
        expiry = place_of(raw, namespace, a, "A")
        assert expiry is not None and expiry >= cp.lease_expires_at_ms + LIMIT_SKEW_MS
        with pytest.raises(ConcurrencyLimited):
            other.claim(b, 1, token="B", lease_ms=LONG_MS)
        assert commit(store, cp)
        assert other.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    @pytest.mark.parametrize("write", list(REFUSED_WRITES))
    def test_a_write_refused_after_a_takeover_gives_the_place_back_at_once(
        self, make: Callable[..., Any], raw: Any, namespace: str, write: str
    ) -> None:
        """The positive control: A's lease lapsed and B took the task over. A's place would free itself
        LIMIT_SKEW_MS after A's lease (the place is pushed further out here, as a place renewed just
        before its lapse or a slow limiter clock leaves it); A's refused write shows A holds no lease of
        the task any more, so it gives the place back at once."""
        store = make(CheckpointStore, AsyncCheckpointStore)
        store.set_concurrency_limit(KEY, 2)
        a, c = limited(store, 2)
        cp = store.claim(a, 1, token="A", lease_ms=200)
        while server_ms(raw) <= cp.lease_expires_at_ms:
            time.sleep(0.05)
        took = store.claim(a, 1, token="B", lease_ms=LONG_MS)  # a takeover
        assert took is not None and took.claim_token == "B"
        raw.zadd(Keys(namespace).limiter(KEY).holders, {f"{a}\0A": server_ms(raw) + LONG_MS})
        assert live(store) == 2
        assert not REFUSED_WRITES[write](store, a, cp)
        assert place_of(raw, namespace, a, "A") is None
        assert live(store) == 1  # B's
        assert store.claim(c, 1, token="C", lease_ms=LONG_MS) is not None

    @pytest.mark.parametrize("end", ["deleted", "cancelled"])
    def test_a_write_refused_for_a_task_gone_or_cancelled_gives_the_place_back(
        self, make: Callable[..., Any], raw: Any, namespace: str, end: str
    ) -> None:
        store, a, b, cp = one_place_held(make)
        if end == "deleted":
            store.delete(a)
        else:
            assert store.cancel(a, reason="stop")
        assert not commit(store, cp)
        assert place_of(raw, namespace, a, "A") is None and live(store) == 0
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None


class TestLimitsThroughLeasesAndRunners:
    """The user's paths: ``with store.lease(...)``, the Runners, the CLI."""

    def test_a_held_lease_keeps_its_place_through_renewals(self, sync_store: CheckpointStore) -> None:
        store = sync_store
        store.set_concurrency_limit(KEY, 1)
        a, b = limited(store, 2)
        # A renewal may wait long on a loaded box: 1,200 ms leases give it 800 (600 ms leases lost one).
        with store.lease(a, 1, lease_ms=1_200) as lease:
            deadline = time.monotonic() + 2.6  # more than two leases: the place moved with each renewal
            while time.monotonic() < deadline:
                with pytest.raises(ConcurrencyLimited):
                    store.claim(b, 1, token="B", lease_ms=LONG_MS)
                time.sleep(0.1)
            assert lease.renewals >= 2 and not lease.lost
            cp = lease.checkpoint
            cp.cycle_index = 1
            lease.commit(cp)
        assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    def test_a_cancelled_holder_gives_its_place_back(self, sync_store: CheckpointStore) -> None:
        store = sync_store
        store.set_concurrency_limit(KEY, 1)
        a, b = limited(store, 2)
        with store.lease(a, 1, lease_ms=LONG_MS) as lease:
            time.sleep(0.2)
            assert CheckpointStore(store.client, namespace=store.namespace).cancel(a, reason="stop")
            assert lease.lost_event.wait(5)
            deadline = time.monotonic() + 5
            while live(store) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert live(store) == 0
            assert store.claim(b, 1, token="B", lease_ms=LONG_MS) is not None

    def test_sync_runners_in_threads_never_pass_the_limit(self, sync_store: CheckpointStore) -> None:
        store = sync_store
        store.set_concurrency_limit(KEY, 2)
        tids = limited(store, 8)
        busy, peak, lock, cycles = [0], [0], threading.Lock(), []

        def step(cp: Checkpoint) -> StepResult:
            with lock:
                busy[0] += 1
                peak[0] = max(peak[0], busy[0])
            time.sleep(0.03)
            with lock:
                busy[0] -= 1
                cycles.append(cp.task_id)
            cp.messages.append(cp.cycle_index)
            if cp.cycle_index + 1 >= 2:
                cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"ok": True}
                return StepResult(cp, done=True)
            return StepResult(cp)

        # Four workers of their own; they run until every task is done (a worker that finds only a
        # full key's tasks is idle, not finished: stop_when_idle would end it too soon).
        runners = [Runner(CheckpointStore(store.client, namespace=store.namespace), step, lease_ms=LONG_MS,
                          handle_signals=False) for _ in range(4)]  # fmt: skip
        threads = [threading.Thread(target=r.run) for r in runners]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(cycles) < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        for r in runners:
            r.stop()
        for t in threads:
            t.join(30)
        for tid in tids:
            cp = store.load(tid)
            assert cp.status == AgentStatus.COMPLETED and cp.messages == [0, 1], tid
        assert peak[0] == 2 and len(cycles) == 16 and live(store) == 0

    async def test_an_async_runner_never_passes_the_limit(self, async_store: AsyncCheckpointStore) -> None:
        store = async_store
        await store.set_concurrency_limit(KEY, 3)
        tids = [t for t in ids_in_distinct_shards(13, prefix="a") if shard_of(t) != shard_of(KEY)][:12]
        for tid in tids:
            await store.create(Checkpoint(tid, concurrency_key=KEY))
        busy, peak = [0], [0]

        async def step(cp: Checkpoint) -> StepResult:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
            await asyncio.sleep(0.1)
            busy[0] -= 1
            cp.status, cp.terminal_result = AgentStatus.COMPLETED, {"ok": True}
            return StepResult(cp, done=True)

        runner = AsyncRunner(store, step, concurrency=8, lease_ms=LONG_MS, handle_signals=False)
        run = asyncio.get_running_loop().create_task(runner.run())
        deadline = time.monotonic() + 60
        while runner.stats.finalized < 12 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        runner.stop()
        stats = await asyncio.wait_for(run, 30)
        assert stats.finalized == 12 and peak[0] == 3
        assert [s.live for s in await store.concurrency_limits()] == [0]


def test_cli_limit_and_stats(private_server: Any, capsys: Any) -> None:
    url, ns = private_server.url, "limitcli"
    client = redis.Redis.from_url(url)
    store = CheckpointStore(client, namespace=ns)
    base = ["--url", url, "--namespace", ns]
    assert cli_mod.main(["limit", KEY, "2", *base]) == 0
    assert "at most 2 live lease(s); 0 live now" in capsys.readouterr().out
    a, b = limited(store, 2)
    store.claim(a, 1, token="A", lease_ms=LONG_MS)
    assert cli_mod.main(["stats", *base]) == 0
    out = capsys.readouterr().out
    assert "concurrency limits (1 key(s)): live/limit" in out and f"{KEY}  1/2" in out
    store.claim(b, 1, token="B", lease_ms=LONG_MS)
    assert cli_mod.main(["stats", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out)["concurrency_limits"] == [{"key": KEY, "live": 2, "limit": 2}]
    assert cli_mod.main(["stats", *base]) == 0
    assert "2/2   (full: claims of this key wait)" in capsys.readouterr().out
    assert cli_mod.main(["stats", "--watch", "--iterations", "1", *base]) == 0
    assert f"{KEY}  2/2" in capsys.readouterr().out
    assert cli_mod.main(["show", a, *base]) == 0
    assert f'concurrency_key: "{KEY}"' in capsys.readouterr().out
    assert cli_mod.main(["limit", KEY, "0", *base]) == 1
    assert "limit must be between 1" in capsys.readouterr().err
    assert cli_mod.main(["limit", KEY, "none", "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out) == {"key": KEY, "limit": None}
    assert cli_mod.main(["stats", *base]) == 0
    assert "concurrency limits" not in capsys.readouterr().out
    client.close()
