"""A write's identity is what it writes; reads never share lists; the revision limits agree.

Issue 9, items 2, 3 and the revision bullet of 8. Every test runs through the
``store``/``make`` fixtures: {fakeredis, real redis-server, cluster} x {sync, async}.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
from faults.replies import lose_first_reply

from redis_agentstate import (
    AgentStatus,
    AsyncCheckpointStore,
    BackendUnavailable,
    Checkpoint,
    CheckpointStore,
    ClaimRejected,
    InvalidArgument,
    RetryPolicy,
)
from redis_agentstate.core.validate import MAX_CLAIM_FROM_REVISION, MAX_REVISION, MAX_STORED_REVISION

LEASE = 30_000


def scripts_of(store: Any) -> dict[str, Any]:
    return getattr(store, "wrapped", store)._scripts  # type: ignore[no-any-return]


def task_keys(store: Any, task_id: str) -> Any:
    return getattr(store, "wrapped", store)._core.keys.task(task_id)


def dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace with its DUMP (and TTL presence), to prove nothing changed."""
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{ns}:*", count=1000))}


def lose_reply(store: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Script ``name`` of ``store`` applies on the server, then its reply is lost (once).

    Returns the ARGV of every call of that script, so tests can compare identities.
    """
    return lose_first_reply(scripts_of(store)[name], monkeypatch)


def spy(store: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    script = scripts_of(store)[name]
    original = type(script).__call__
    sent: list[list[Any]] = []

    def record(self_: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if self_ is script:
            sent.append(list(args))
        return original(self_, keys=keys, args=args, client=client)

    monkeypatch.setattr(type(script), "__call__", record)
    return sent


@pytest.fixture
def new_store(make: Callable[..., Any]) -> Callable[..., Any]:
    """Another store on the same backend and namespace (its own history cache)."""
    return lambda **kw: make(CheckpointStore, AsyncCheckpointStore, **kw)


@pytest.fixture
def no_retry(new_store: Callable[..., Any]) -> Any:
    """A store that gives up at the first connection error: the caller sees BackendUnavailable."""
    return new_store(retry=RetryPolicy(attempts=1))


def seeded(store: Any, task_id: str = "t", n: int = 3) -> Checkpoint:
    cp = Checkpoint(task_id, messages=[f"m{i}" for i in range(n)], cycles=[{"c": 0}], shared_state={"s": 0})
    assert store.create(cp)
    return cp


def next_cycle(cp: Checkpoint, *appended: Any, state: Any = 1) -> Checkpoint:
    cp.cycle_index = cp.claimed_cycle or cp.cycle_index + 1
    cp.messages.extend(appended)
    cp.cycles.append({"c": cp.cycle_index})
    cp.shared_state = {"s": state}
    return cp


class TestCallersResend:
    """Item 2: the same write re-sent by the caller (not only by the library) returns True."""

    def test_commit_resent_after_backend_unavailable_is_true_and_writes_nothing(
        self, no_retry: Any, new_store: Callable[..., Any], raw: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seeded(no_retry)
        cp = next_cycle(no_retry.claim("t", 1, token="w", lease_ms=LEASE), "a", "b")
        sent = lose_reply(no_retry, "commit", monkeypatch)
        with pytest.raises(BackendUnavailable):
            no_retry.commit(cp, token="w", expected_revision=cp.revision)
        stored = dump(raw, no_retry.namespace)
        # The caller re-sends: through the same store, then through two others (cold cache;
        # cache moved on by a later read), before and after other workers moved the task on.
        assert no_retry.commit(cp, token="w", expected_revision=cp.revision) is True
        cold = new_store()
        assert cold.commit(cp, token="w", expected_revision=cp.revision) is True
        assert dump(raw, no_retry.namespace) == stored
        other = new_store()
        nxt = next_cycle(other.claim("t", 2, token="o", lease_ms=LEASE), "c")
        assert other.commit(nxt, token="o", expected_revision=nxt.revision)
        moved = new_store()
        assert moved.load("t").revision == cp.revision + 3
        after_others = dump(raw, no_retry.namespace)
        assert moved.commit(cp, token="w", expected_revision=cp.revision) is True
        assert no_retry.commit(cp, token="w", expected_revision=cp.revision) is True
        assert dump(raw, no_retry.namespace) == after_others
        got = moved.load("t")
        assert got.messages == ["m0", "m1", "m2", "a", "b", "c"] and got.cycles == [{"c": 0}, {"c": 1}, {"c": 2}]
        # Every send carried the same identity, whatever the sender's cache held.
        assert len({args[0] for args in sent}) == 1

    def test_identity_is_the_same_from_a_warm_and_a_cold_cache(
        self, store: Any, new_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Stored blobs (hashed by the warm cache) and re-encoded entries (hashed by a cold
        # sender) must agree, whatever the entries hold.
        varied = [{"b": b"\x00\xff", "t": (1, 2), "f": 1.5, 7: None, (1, "k"): [True]}, -(2**63), "ü", 2.0**-1074]
        store.create(Checkpoint("t", messages=[*varied, *range(46)], cycles=[(1.25, b"x")], shared_state={"k": (3,)}))
        cp = next_cycle(store.claim("t", 1, token="w", lease_ms=LEASE), "x")
        warm = spy(store, "commit", monkeypatch)
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        cold_store = new_store()
        cold = spy(cold_store, "commit", monkeypatch)
        assert cold_store.commit(cp, token="w", expected_revision=cp.revision) is True
        assert (
            warm[0][15] == 1 and cold[0][15] == 51
        )  # n_messages (ARGV 16): the warm one sent the delta, the cold one all
        assert warm[0][0] == cold[0][0]
        # A cold sender holding what a read returned (decoded lists) computes it too.
        reread = new_store().load("t")
        assert new_store().commit(dataclasses.replace(reread, revision=cp.revision), token="w",
                                  expected_revision=cp.revision) is True  # fmt: skip

    @pytest.mark.parametrize(
        "change",
        [
            pytest.param(lambda cp: cp.messages.append("one more"), id="extra-message"),
            pytest.param(lambda cp: cp.messages.__setitem__(-2, "other middle"), id="middle-message"),
            pytest.param(lambda cp: cp.cycles.__setitem__(-1, {"c": "other"}), id="cycle-record"),
            pytest.param(lambda cp: cp.shared_state.update(s=2), id="shared-state"),
            pytest.param(lambda cp: setattr(cp, "status", AgentStatus.WAIT_USER), id="status"),
            pytest.param(lambda cp: setattr(cp, "budget_usage", {"tokens": 1}), id="budget"),
        ],
    )
    @pytest.mark.parametrize("via", ["same-store-cache-at-claim", "cold-store"])
    def test_a_different_write_at_the_same_revision_is_false_and_writes_nothing(
        self,
        no_retry: Any,
        new_store: Callable[..., Any],
        raw: Any,
        monkeypatch: pytest.MonkeyPatch,
        change: Callable[[Checkpoint], None],
        via: str,
    ) -> None:
        seeded(no_retry)
        cp = next_cycle(no_retry.claim("t", 1, token="w", lease_ms=LEASE), "a", "b", "c")
        lose_reply(no_retry, "commit", monkeypatch)  # applied, but the cache stays at the claim
        with pytest.raises(BackendUnavailable):
            no_retry.commit(cp, token="w", expected_revision=cp.revision)
        stored = dump(raw, no_retry.namespace)
        other = dataclasses.replace(cp, messages=list(cp.messages), cycles=list(cp.cycles),
                                    shared_state=dict(cp.shared_state))  # fmt: skip
        change(other)
        sender = no_retry if via == "same-store-cache-at-claim" else new_store()
        assert sender.commit(other, token="w", expected_revision=cp.revision) is False
        assert dump(raw, no_retry.namespace) == stored
        assert sender.commit(cp, token="w", expected_revision=cp.revision) is True  # the write that applied

    def test_another_token_or_replace_flag_is_another_write(self, store: Any, raw: Any) -> None:
        seeded(store)
        cp = next_cycle(store.claim("t", 1, token="w", lease_ms=LEASE), "a")
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        stored = dump(raw, store.namespace)
        assert store.commit(cp, token="w2", expected_revision=cp.revision) is False
        assert store.commit(cp, token="w", expected_revision=cp.revision, replace_history=True) is False
        assert dump(raw, store.namespace) == stored
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True

    def test_finalize_resent_by_the_caller(
        self, no_retry: Any, new_store: Callable[..., Any], raw: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seeded(no_retry)
        final = no_retry.load("t")
        final.messages.append("bye")
        final.status, final.terminal_result = AgentStatus.COMPLETED, {"answer": 1}
        lose_reply(no_retry, "finalize", monkeypatch)
        with pytest.raises(BackendUnavailable):
            no_retry.finalize(final, expected_revision=0)
        stored = dump(raw, no_retry.namespace)
        assert no_retry.finalize(final, expected_revision=0) is True
        assert new_store().finalize(final, expected_revision=0) is True
        different = dataclasses.replace(final, terminal_result={"answer": 2})
        assert new_store().finalize(different, expected_revision=0) is False
        assert dump(raw, no_retry.namespace) == stored
        assert no_retry.load("t").messages.count("bye") == 1

    def test_acknowledge_resent_by_the_caller(
        self, no_retry: Any, new_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        no_retry.create(Checkpoint("t", status=AgentStatus.FAILED, terminal_result="x", revision=4))
        lose_reply(no_retry, "acknowledge_terminal", monkeypatch)
        with pytest.raises(BackendUnavailable):
            no_retry.acknowledge_terminal("t", expected_revision=4)
        assert no_retry.load("t") is None
        assert no_retry.acknowledge_terminal("t", expected_revision=4) is True
        assert new_store().acknowledge_terminal("t", expected_revision=4) is True
        assert new_store().acknowledge_terminal("t", expected_revision=5) is False

    def test_acknowledge_deletes_a_recreated_task_terminal_at_the_same_revision(
        self, store: Any, new_store: Callable[..., Any]
    ) -> None:
        store.create(Checkpoint("t", status=AgentStatus.FAILED, terminal_result="first life", revision=4))
        assert store.acknowledge_terminal("t", expected_revision=4)
        # Created again and terminal at the same revision: the old tombstone must not answer for it.
        other = new_store()
        assert other.create(Checkpoint("t", status=AgentStatus.COMPLETED, terminal_result="second life", revision=4))
        assert other.acknowledge_terminal("t", expected_revision=4) is True
        assert store.load("t") is None and other.list() == []
        # And a re-sent acknowledgement of the first life, after a third life that is not terminal, keeps it.
        assert other.create(Checkpoint("t", revision=4))
        assert store.acknowledge_terminal("t", expected_revision=4) is True
        assert other.load("t") is not None

    @pytest.mark.parametrize("write", ["commit", "finalize"])
    def test_terminal_write_resent_by_the_caller_after_acknowledge(
        self, store: Any, new_store: Callable[..., Any], write: str
    ) -> None:
        seeded(store)
        final = store.claim("t", 1, token="w", lease_ms=LEASE) if write == "commit" else store.load("t")
        final = next_cycle(final, "done") if write == "commit" else final
        final.status, final.terminal_result = AgentStatus.COMPLETED, "ok"
        rev = final.revision
        send = (
            (lambda s: s.commit(final, token="w", expected_revision=rev))
            if write == "commit"
            else (lambda s: s.finalize(final, expected_revision=rev))
        )
        assert send(store) is True
        assert store.acknowledge_terminal("t", expected_revision=rev + 1)
        assert send(new_store()) is True  # the tombstone keeps the ring
        # ... even once the task exists again (its new hash has a ring of its own) at a
        # revision that fences the write out. (Where the new life's fence accepts the
        # write, it applies: the fence decides first.)
        assert store.create(Checkpoint("t", revision=7))
        assert send(new_store()) is True
        assert store.load("t").revision == 7

    def test_identical_write_after_the_revision_came_back_is_applied_not_skipped(
        self, store: Any, new_store: Callable[..., Any], raw: Any
    ) -> None:
        seeded(store)
        cp = next_cycle(store.claim("t", 1, token="w", lease_ms=LEASE), "a")
        template = dataclasses.replace(cp, messages=list(cp.messages), cycles=list(cp.cycles))
        assert store.commit(cp, token="w", expected_revision=1)
        # An admin restores the task to before that cycle; the same worker claims it again
        # and sends the very same write: the fence passes, so it must apply (not be taken
        # for a re-send of the first one and leave the claim standing).
        store.save(Checkpoint("t", messages=["m0", "m1", "m2"], cycles=[{"c": 0}], shared_state={"s": 0}))
        again = store.claim("t", 1, token="w", lease_ms=LEASE)
        assert again.revision == 1
        assert new_store().commit(template, token="w", expected_revision=1) is True
        got = store.load("t")
        assert (got.revision, got.claim_token, got.cycle_index) == (2, None, 1)
        assert got.messages == ["m0", "m1", "m2", "a"]

    def test_create_stays_first_wins(self, store: Any, new_store: Callable[..., Any]) -> None:
        """Create is named by a per-call nonce: an identical create by anyone else is refused."""
        cp = Checkpoint("t", messages=["same"])
        assert store.create(cp) is True
        assert new_store().create(dataclasses.replace(cp)) is False
        assert store.create(cp) is False

    def test_resend_after_script_flush(self, store: Any, new_store: Callable[..., Any], raw: Any) -> None:
        seeded(store)
        cp = next_cycle(store.claim("t", 1, token="w", lease_ms=LEASE), "a")
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        raw.script_flush()
        assert new_store().commit(cp, token="w", expected_revision=cp.revision) is True
        raw.script_flush()
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        assert store.load("t").messages.count("a") == 1


class TestReadsOwnTheirLists:
    """Item 3: no two reads of a task through one store share a list object."""

    @pytest.mark.parametrize("order", ["load-then-claim", "claim-then-load"])
    def test_a_preview_append_is_never_committed_by_the_claimant(self, store: Any, order: str) -> None:
        seeded(store)
        if order == "load-then-claim":
            preview = store.load("t")
            cp = store.claim("t", 1, token="w", lease_ms=LEASE)
        else:
            cp = store.claim("t", 1, token="w", lease_ms=LEASE)
            preview = store.load("t")
        preview.messages.append("preview, never committed")
        preview.cycles.append({"preview": True})
        cp = next_cycle(cp, "real")
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        got = store.load("t")
        assert got.messages == ["m0", "m1", "m2", "real"] and got.cycles == [{"c": 0}, {"c": 1}]
        assert preview.messages is not cp.messages and preview.cycles is not cp.cycles

    def test_two_loads_do_not_share(self, store: Any) -> None:
        seeded(store)
        a, b = store.load("t"), store.load("t")
        a.messages.append("only in a")
        a.cycles.append("only in a")
        assert b.messages == ["m0", "m1", "m2"] and b.cycles == [{"c": 0}]
        assert store.load("t").messages == ["m0", "m1", "m2"]

    def test_a_zombie_claimant_never_leaks_into_the_next_claim(self, store: Any) -> None:
        seeded(store)
        zombie = store.claim("t", 1, token="z", lease_ms=1)
        time.sleep(0.05)
        cp = store.claim("t", 1, token="w", lease_ms=LEASE)  # takes over the expired lease
        zombie.messages.append("zombie")  # still working, after the takeover
        cp = next_cycle(cp, "real")
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        assert not store.commit(next_cycle(zombie), token="z", expected_revision=zombie.revision)
        assert store.load("t").messages == ["m0", "m1", "m2", "real"]

    def test_the_next_claim_takes_the_committed_lists_without_a_copy(self, store: Any) -> None:
        """O(delta): a commit hands its lists to the cache and the next claim takes them back."""
        seeded(store)
        cp = next_cycle(store.claim("t", 1, token="w", lease_ms=LEASE), "a")
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        nxt = store.claim("t", 2, token="w", lease_ms=LEASE)
        assert nxt.messages is cp.messages and nxt.cycles is cp.cycles
        # ... unless the committer appended after its commit: then the claim gets a clean copy.
        nxt = next_cycle(nxt, "b")
        assert store.commit(nxt, token="w", expected_revision=nxt.revision)
        nxt.messages.append("appended after the commit")
        third = store.claim("t", 3, token="w", lease_ms=LEASE)
        assert third.messages is not nxt.messages and third.messages == ["m0", "m1", "m2", "a", "b"]


class TestRevisionLimits:
    """Item 8: claim never returns a revision its commit would refuse."""

    def test_commit_accepts_what_a_claim_at_2_pow_52_returns(self, store: Any) -> None:
        store.save(Checkpoint("t", revision=MAX_STORED_REVISION))
        cp = store.claim("t", 1, token="w", lease_ms=LEASE)
        assert cp.revision == MAX_STORED_REVISION + 1
        cp.cycle_index = 1
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        assert store.load("t").revision == MAX_STORED_REVISION + 2

    def set_rev(self, store: Any, raw: Any, rev: int) -> None:
        store.save(Checkpoint("t", messages=["m"]))
        raw.hset(task_keys(store, "t").checkpoint, "rev", str(rev))

    def test_claim_refuses_a_revision_its_commit_could_not_store(self, store: Any, raw: Any) -> None:
        self.set_rev(store, raw, MAX_CLAIM_FROM_REVISION + 1)
        before = dump(raw, store.namespace)
        with pytest.raises(ClaimRejected, match="highest revision") as err:
            store.claim("t", 1, token="w", lease_ms=LEASE)
        assert err.value.task_id == "t" and err.value.revision == MAX_CLAIM_FROM_REVISION + 1
        assert dump(raw, store.namespace) == before
        assert store.claim_next(token="w", lease_ms=LEASE) is None
        assert raw.hget(task_keys(store, "t").checkpoint, "token") == b""

    def test_the_last_claimable_revision_commits_to_max_revision(self, store: Any, raw: Any) -> None:
        self.set_rev(store, raw, MAX_CLAIM_FROM_REVISION)
        cp = store.claim("t", 1, token="w", lease_ms=LEASE)
        assert cp.revision == MAX_REVISION - 1
        cp.cycle_index = 1
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        assert store.load("t").revision == MAX_REVISION

    def test_a_write_past_max_revision_is_invalid_before_any_io(self, store: Any, raw: Any) -> None:
        self.set_rev(store, raw, MAX_REVISION)
        before = dump(raw, store.namespace)
        cp = Checkpoint("t", cycle_index=1, terminal_result="x")
        with pytest.raises(InvalidArgument):
            store.commit(cp, token="w", expected_revision=MAX_REVISION)
        with pytest.raises(InvalidArgument):
            store.finalize(cp, expected_revision=MAX_REVISION)
        with pytest.raises(InvalidArgument):
            store.save(dataclasses.replace(cp, revision=MAX_STORED_REVISION + 1))
        assert dump(raw, store.namespace) == before
