"""``commit_and_claim``: commit cycle N and claim N + 1 of the same task in one script (issue 11, section 1).

Every test runs through the ``store``/``make`` fixtures: {fakeredis, real redis-server,
cluster} x {sync, async}.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from test_write_identity import dump, lose_reply, next_cycle, seeded, spy

from redis_agentstate import (
    AgentStatus,
    AlreadyClaimed,
    AsyncCheckpointStore,
    BackendUnavailable,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    CorruptState,
    InvalidArgument,
    RetryPolicy,
)
from redis_agentstate.core.validate import MAX_CLAIM_FROM_REVISION, MAX_CYCLE
from redis_agentstate.keys import Keys

LEASE = 30_000


@pytest.fixture
def new_store(make: Callable[..., Any]) -> Callable[..., Any]:
    return lambda **kw: make(CheckpointStore, AsyncCheckpointStore, **kw)


@pytest.fixture
def no_retry(new_store: Callable[..., Any]) -> Any:
    return new_store(retry=RetryPolicy(attempts=1))


def claimed(store: Any, task_id: str = "t", token: str = "w", lease_ms: int = LEASE) -> Checkpoint:
    seeded(store, task_id)
    cp = store.claim(task_id, 1, token=token, lease_ms=lease_ms)
    assert cp is not None
    return cp


def same_claim(a: Checkpoint, b: Checkpoint) -> None:
    for f in ("task_id", "cycle_index", "status", "messages", "cycles", "shared_state", "revision", "claim_token",
              "claimed_cycle", "lease_expires_at_ms", "terminal_result", "budget_usage"):  # fmt: skip
        assert getattr(a, f) == getattr(b, f), f


class TestCommitAndClaim:
    def test_commits_n_and_returns_the_claim_of_n_plus_1(self, store: Any, new_store: Callable[..., Any]) -> None:
        cp = next_cycle(claimed(store), "a", "b", state=7)
        before_ms = int(time.time() * 1000)
        nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        assert nxt is not None
        assert (nxt.cycle_index, nxt.claimed_cycle, nxt.claim_token) == (1, 2, "w")
        assert nxt.revision == cp.revision + 2 and nxt.status == AgentStatus.RUNNING
        assert nxt.messages == ["m0", "m1", "m2", "a", "b"] and nxt.cycles == [{"c": 0}, {"c": 1}]
        assert nxt.shared_state == {"s": 7} and nxt.shared_state is not cp.shared_state
        assert before_ms + LEASE - 5_000 < nxt.lease_expires_at_ms < before_ms + LEASE + 5_000
        # What another client reads is exactly that claim.
        same_claim(new_store().load("t"), nxt)
        # The claim holds: nobody else can take cycle 2, and it commits as any claim does.
        with pytest.raises(AlreadyClaimed):
            new_store().claim("t", 2, token="other", lease_ms=LEASE)
        assert store.renew("t", token="w", expected_revision=nxt.revision, lease_ms=LEASE)
        nxt = next_cycle(nxt, "c")
        assert store.commit(nxt, token="w", expected_revision=nxt.revision)
        got = new_store().load("t")
        assert got.cycle_index == 2 and got.messages[-1] == "c" and got.claim_token is None

    def test_next_token_names_the_new_claim(self, store: Any) -> None:
        cp = next_cycle(claimed(store), "a")
        nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE, next_token="w2")
        assert nxt.claim_token == "w2"
        assert store.renew("t", token="w", expected_revision=nxt.revision, lease_ms=LEASE) is False
        assert store.renew("t", token="w2", expected_revision=nxt.revision, lease_ms=LEASE) is True

    def test_a_steady_loop_sends_only_the_delta(
        self, store: Any, new_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cp = claimed(store)
        sent = spy(store, "commit_and_claim", monkeypatch)
        for i in range(6):
            cp = next_cycle(cp, f"x{i}", state=i)
            cp = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        # Each send: 18 fixed slots, one message blob and one cycle blob (base_m grows by one).
        assert [len(a) for a in sent] == [20] * 6
        assert [int(a[15]) for a in sent] == [3 + i for i in range(6)]
        got = new_store().load("t")
        assert got.messages == ["m0", "m1", "m2", *(f"x{i}" for i in range(6))]
        assert got.cycle_index == 6 and got.claimed_cycle == 7 and got.revision == 1 + 2 * 6
        assert cp.messages == got.messages and cp.cycles == got.cycles

    def test_a_cold_cache_sends_full_lists_and_gets_the_whole_claim(
        self, store: Any, new_store: Callable[..., Any]
    ) -> None:
        cp = next_cycle(claimed(store), "a")
        cold = new_store()
        nxt = cold.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        same_claim(nxt, new_store().load("t"))
        assert nxt.messages == ["m0", "m1", "m2", "a"]
        nxt = next_cycle(nxt, "b")  # and the cold store's cache now serves the delta
        nxt = cold.commit_and_claim(nxt, token="w", expected_revision=nxt.revision, lease_ms=LEASE)
        assert new_store().load("t").messages == ["m0", "m1", "m2", "a", "b"] == nxt.messages

    def test_replace_history(self, store: Any, new_store: Callable[..., Any]) -> None:
        cp = next_cycle(claimed(store), "a")
        cp.messages = ["summary"]
        cp.cycles = [{"c": "all"}]
        nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE,
                                     replace_history=True)  # fmt: skip
        same_claim(nxt, new_store().load("t"))
        assert nxt.messages == ["summary"]


class TestFencing:
    def test_a_stale_holder_writes_nothing(self, store: Any, new_store: Callable[..., Any], raw: Any) -> None:
        cp = next_cycle(claimed(store, lease_ms=200), "stale")
        time.sleep(0.3)
        other = new_store()
        taken = other.claim("t", 1, token="o", lease_ms=LEASE)
        assert taken is not None
        before = dump(raw, store.namespace)
        assert store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE) is None
        assert dump(raw, store.namespace) == before
        # The new holder goes on.
        taken = next_cycle(taken, "fresh")
        nxt = other.commit_and_claim(taken, token="o", expected_revision=taken.revision, lease_ms=LEASE)
        assert nxt is not None and nxt.messages[-1] == "fresh" and "stale" not in nxt.messages

    def test_a_wrong_token_or_revision_writes_nothing(self, store: Any, raw: Any) -> None:
        cp = next_cycle(claimed(store), "a")
        before = dump(raw, store.namespace)
        assert store.commit_and_claim(cp, token="x", expected_revision=cp.revision, lease_ms=LEASE) is None
        assert store.commit_and_claim(cp, token="w", expected_revision=cp.revision - 1, lease_ms=LEASE) is None
        assert dump(raw, store.namespace) == before

    @pytest.mark.parametrize(
        "change",
        [
            pytest.param(lambda cp: setattr(cp, "status", AgentStatus.WAIT_USER), id="wait_user"),
            pytest.param(lambda cp: setattr(cp, "status", AgentStatus.COMPLETED), id="completed"),
            pytest.param(lambda cp: setattr(cp, "terminal_result", {"r": 1}), id="terminal_result"),
            pytest.param(lambda cp: setattr(cp, "cycle_index", MAX_CYCLE), id="last-cycle"),
        ],
    )
    def test_not_runnable_is_invalid_before_any_write(
        self, store: Any, raw: Any, change: Callable[[Checkpoint], None]
    ) -> None:
        cp = next_cycle(claimed(store), "a")
        change(cp)
        before = dump(raw, store.namespace)
        with pytest.raises(InvalidArgument):
            store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        assert dump(raw, store.namespace) == before

    def test_bad_arguments(self, store: Any) -> None:
        cp = next_cycle(claimed(store), "a")
        for kw in ({"lease_ms": 0}, {"next_token": ""}, {"expected_revision": -1}):
            args = {"token": "w", "expected_revision": cp.revision, "lease_ms": LEASE, **kw}
            with pytest.raises(InvalidArgument):
                store.commit_and_claim(cp, **args)

    def test_the_revision_limit_of_a_claim(self, store: Any, raw: Any) -> None:
        # A claim from here returns MAX_CLAIM_FROM_REVISION, whose commit stores one more: then
        # claiming again would pass the limit, so commit_and_claim refuses before writing.
        assert store.create(Checkpoint("t"))
        raw.hset(Keys(store.namespace).task("t").checkpoint, "rev", str(MAX_CLAIM_FROM_REVISION - 1))
        cp = next_cycle(store.claim("t", 1, token="w", lease_ms=LEASE), "a")
        assert cp.revision == MAX_CLAIM_FROM_REVISION
        before = dump(raw, store.namespace)
        with pytest.raises(ClaimRejected):
            store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        assert dump(raw, store.namespace) == before
        assert store.commit(cp, token="w", expected_revision=cp.revision)  # a plain commit still fits

    def test_corrupt_data_is_reported_before_any_write(self, store: Any, raw: Any) -> None:
        cp = next_cycle(claimed(store), "a")
        key = Keys(store.namespace).task("t").checkpoint
        raw.hset(key, "rev", "1e400")
        before = dump(raw, store.namespace)
        with pytest.raises(CorruptState) as err:
            store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        assert err.value.task_id == "t"
        assert dump(raw, store.namespace) == before


class TestResend:
    def test_the_library_resends_after_a_lost_reply_and_gets_the_same_claim(
        self, store: Any, new_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cp = next_cycle(claimed(store), "a")
        sent = lose_reply(store, "commit_and_claim", monkeypatch)
        nxt = store.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        assert len(sent) == 2 and sent[0] == sent[1]
        stored = new_store().load("t")
        same_claim(nxt, stored)
        assert stored.revision == cp.revision + 2 and stored.messages == ["m0", "m1", "m2", "a"]

    def test_the_caller_resends_through_any_store_and_gets_the_same_claim(
        self, no_retry: Any, new_store: Callable[..., Any], raw: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cp = next_cycle(claimed(no_retry), "a")
        lose_reply(no_retry, "commit_and_claim", monkeypatch)
        with pytest.raises(BackendUnavailable):
            no_retry.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE, next_token="n")
        stored = dump(raw, no_retry.namespace)
        first = no_retry.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE,
                                          next_token="n")  # fmt: skip
        cold = new_store().commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE,
                                            next_token="n")  # fmt: skip
        assert dump(raw, no_retry.namespace) == stored
        loaded = new_store().load("t")
        same_claim(first, loaded)
        same_claim(cold, loaded)
        # Another write at that revision is not this one: fenced out.
        other = next_cycle(Checkpoint("t", messages=list(cp.messages), cycles=list(cp.cycles)), "b")
        other.cycle_index = 1
        assert no_retry.commit_and_claim(other, token="w", expected_revision=cp.revision, lease_ms=LEASE) is None
        assert dump(raw, no_retry.namespace) == stored

    def test_a_resend_whose_claim_was_taken_since_raises_and_writes_nothing(
        self, no_retry: Any, new_store: Callable[..., Any], raw: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cp = next_cycle(claimed(no_retry), "a")
        lose_reply(no_retry, "commit_and_claim", monkeypatch)
        with pytest.raises(BackendUnavailable):
            no_retry.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=200)
        time.sleep(0.3)
        taken = new_store().claim("t", 2, token="o", lease_ms=LEASE)
        assert taken is not None and taken.messages[-1] == "a"
        before = dump(raw, no_retry.namespace)
        with pytest.raises(AlreadyClaimed):
            no_retry.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=200)
        assert dump(raw, no_retry.namespace) == before

    def test_a_resend_after_the_lease_lapsed_unclaimed_claims_again(
        self, no_retry: Any, new_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cp = next_cycle(claimed(no_retry), "a")
        lose_reply(no_retry, "commit_and_claim", monkeypatch)
        with pytest.raises(BackendUnavailable):
            no_retry.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=200)
        time.sleep(0.3)
        again = no_retry.commit_and_claim(cp, token="w", expected_revision=cp.revision, lease_ms=LEASE)
        assert again.claim_token == "w" and again.claimed_cycle == 2 and again.revision == cp.revision + 3
        same_claim(again, new_store().load("t"))


def test_ring_push_keeps_whole_identities_within_its_bound(raw: Any) -> None:
    """The write ring's trim (a byte scan since issue 11) is the old pattern trim: whole identities, newest first."""
    import random

    from redis_agentstate.wire import scripts

    prelude = scripts.constants_prelude() + scripts._read("_base") + scripts._read("_common")
    sha = raw.script_load(prelude + "\nreturn ring_push(ARGV[1] ~= '' and ARGV[1] or nil, ARGV[2])")
    rng = random.Random(11)
    ring = ""
    for i in range(200):
        ident = rng.choice([f"{rng.getrandbits(128):032x}", f"ack:{i}", f"nonce-{rng.getrandbits(64):x}"])
        want = " " + ident + (ring or " ")
        if len(want) > 840:
            want = want[:840]
            want = want[: want.rfind(" ") + 1]
        got = raw.evalsha(sha, 0, ring, ident).decode()
        assert got == want and len(got) <= 840 and got.startswith(f" {ident} ")
        ring = got
