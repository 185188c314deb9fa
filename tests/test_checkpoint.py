"""The checkpoint store: the seed's rules and docs/design.md's deliberate changes.

Every test here runs six times through the ``store`` fixture:
{fakeredis, real redis-server, local Redis Cluster} x {CheckpointStore, AsyncCheckpointStore}
(the cluster runs are marked ``cluster``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from faults.replies import lose_first_reply

from redis_agentstate import (
    AgentStatus,
    AlreadyClaimed,
    Checkpoint,
    CheckpointTerminal,
    ClaimRejected,
    CycleConflict,
    InvalidArgument,
    NotRunnable,
)

LEASE = 30_000


def scripts_of(store: Any) -> dict[str, Any]:
    inner = getattr(store, "wrapped", store)
    return inner._scripts  # type: ignore[no-any-return]


def server_ms(raw: Any) -> int:
    sec, usec = raw.time()
    return int(sec) * 1000 + int(usec) // 1000


def namespace_dump(raw: Any, ns: str) -> dict[bytes, Any]:
    """Every key of the namespace with its DUMP, to prove nothing changed."""
    return {k: raw.dump(k) for k in sorted(raw.scan_iter(match=f"{ns}:*", count=1000))}


@pytest.fixture
def running(store: Any) -> Checkpoint:
    cp = Checkpoint("task-1", messages=[{"role": "user", "content": "hello"}], shared_state={"step": 0})
    assert store.create(cp)
    return cp


class TestCreateSaveLoad:
    def test_create_then_load_round_trips_every_field(self, store: Any) -> None:
        cp = Checkpoint(
            "t",
            cycle_index=3,
            status=AgentStatus.WAIT_USER,
            messages=[{"role": "user", "content": "hi", "bin": b"\x00\xff"}, "plain"],
            cycles=[{"n": 1}, {"n": 2}, {"n": 3}],
            shared_state={"k": [1, 2.5, None, True], 7: "int key"},
            revision=9,
            budget_usage={"tokens": 1234},
        )
        assert store.create(cp) is True
        assert store.load("t") == cp

    def test_create_refuses_existing_task(self, store: Any, running: Checkpoint) -> None:
        assert store.create(Checkpoint("task-1", cycle_index=7)) is False
        assert store.load("task-1").cycle_index == 0

    def test_load_missing_is_none(self, store: Any) -> None:
        assert store.load("nope") is None

    def test_save_overwrites_unconditionally(self, store: Any, running: Checkpoint) -> None:
        replacement = Checkpoint("task-1", cycle_index=4, messages=["only"], revision=42, claim_token="admin",
                                 claimed_cycle=5, lease_expires_at_ms=123)  # fmt: skip
        store.save(replacement)
        assert store.load("task-1") == replacement

    def test_terminal_result_none_vs_present(self, store: Any) -> None:
        store.create(Checkpoint("a", status=AgentStatus.COMPLETED, terminal_result={"answer": 42}))
        store.create(Checkpoint("b", terminal_result=None))
        assert store.load("a").terminal_result == {"answer": 42}
        assert store.load("b").terminal_result is None

    def test_list_and_delete(self, store: Any) -> None:
        ids = ["b", "a", "c/d", "x:y", "{brace}", "ünï cødé", "sp ace"]
        for t in ids:
            store.create(Checkpoint(t))
        assert store.list() == sorted(ids)
        store.delete("c/d")
        store.delete("never-existed")
        assert store.list() == sorted(set(ids) - {"c/d"})
        assert store.load("c/d") is None


class TestClaim:
    """The seed's check_claim and validate_claim."""

    def test_claim_bumps_revision_and_records_the_lease(self, store: Any, running: Checkpoint, raw: Any) -> None:
        before = server_ms(raw)
        cp = store.claim("task-1", 1, token="w1", lease_ms=LEASE)
        after = server_ms(raw)
        assert cp.revision == 1
        assert (cp.claim_token, cp.claimed_cycle) == ("w1", 1)
        assert before + LEASE <= cp.lease_expires_at_ms <= after + LEASE
        assert cp.messages == running.messages and cp.shared_state == {"step": 0}

    def test_missing_task_gives_none(self, store: Any) -> None:
        assert store.claim("ghost", 1, token="w", lease_ms=LEASE) is None

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"status": AgentStatus.COMPLETED}, CheckpointTerminal),
            ({"status": AgentStatus.FAILED}, CheckpointTerminal),
            ({"status": AgentStatus.MAX_CYCLES}, CheckpointTerminal),
            ({"terminal_result": {"done": True}}, CheckpointTerminal),
            ({"status": AgentStatus.PENDING}, NotRunnable),
            ({"status": AgentStatus.WAIT_USER}, NotRunnable),
            ({"status": AgentStatus.RECONCILIATION_REQUIRED}, NotRunnable),
        ],
    )
    def test_rejections(self, store: Any, kwargs: dict[str, Any], error: type[Exception]) -> None:
        store.create(Checkpoint("t", **kwargs))
        with pytest.raises(error) as info:
            store.claim("t", 1, token="w", lease_ms=LEASE)
        assert isinstance(info.value, ClaimRejected)
        assert info.value.task_id == "t"
        assert store.load("t").revision == 0

    def test_cycle_conflict_names_expected_and_found(self, store: Any) -> None:
        store.create(Checkpoint("t", cycle_index=4))
        with pytest.raises(CycleConflict, match="expected 6, found 4") as info:
            store.claim("t", 7, token="w", lease_ms=LEASE)
        assert (info.value.expected, info.value.found) == (6, 4)
        assert isinstance(info.value, ClaimRejected)

    def test_live_claim_by_another_is_already_claimed(self, store: Any, running: Checkpoint) -> None:
        first = store.claim("task-1", 1, token="w1", lease_ms=LEASE)
        with pytest.raises(AlreadyClaimed) as info:
            store.claim("task-1", 1, token="w2", lease_ms=LEASE)
        assert info.value.lease_expires_at_ms == first.lease_expires_at_ms
        assert store.load("task-1").revision == 1

    def test_resent_claim_with_same_token_returns_that_claim(self, store: Any, running: Checkpoint) -> None:
        first = store.claim("task-1", 1, token="w1", lease_ms=LEASE)
        again = store.claim("task-1", 1, token="w1", lease_ms=LEASE)
        assert again == first
        assert store.load("task-1").revision == 1

    def test_expired_lease_can_be_taken_over(self, store: Any, running: Checkpoint) -> None:
        first = store.claim("task-1", 1, token="w1", lease_ms=50)
        time.sleep(0.12)
        second = store.claim("task-1", 1, token="w2", lease_ms=LEASE)
        assert second.revision == first.revision + 1 and second.claim_token == "w2"
        # The stale worker wakes late: the revision is the fence.
        stale = Checkpoint("task-1", cycle_index=1, messages=[*running.messages, "stale"], revision=first.revision)
        assert store.commit(stale, token="w1", expected_revision=first.revision) is False
        fresh = Checkpoint("task-1", cycle_index=1, messages=[*running.messages, "fresh"])
        assert store.commit(fresh, token="w2", expected_revision=second.revision) is True
        assert store.load("task-1").messages == [*running.messages, "fresh"]


class TestCommit:
    """The seed's claim_matches and clear_claim."""

    def test_commit_sets_revision_plus_one_and_clears_claim(self, store: Any, running: Checkpoint) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.shared_state["step"] = 1
        cp.messages.append({"role": "assistant", "content": "done 1"})
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        got = store.load("task-1")
        assert got.revision == cp.revision + 1
        assert (got.claim_token, got.claimed_cycle, got.lease_expires_at_ms) == (None, None, None)
        assert got.shared_state == {"step": 1} and got.messages == cp.messages and got.cycle_index == 1

    @pytest.mark.parametrize("wrong", ["token", "revision", "cycle"])
    def test_commit_is_fenced(self, store: Any, running: Checkpoint, wrong: str) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 2 if wrong == "cycle" else 1
        token = "other" if wrong == "token" else "w"
        revision = cp.revision + (5 if wrong == "revision" else 0)
        assert store.commit(cp, token=token, expected_revision=revision) is False
        assert store.load("task-1").revision == 1 and store.load("task-1").claim_token == "w"

    def test_commit_without_claim_is_rejected(self, store: Any, running: Checkpoint) -> None:
        assert store.commit(Checkpoint("task-1", cycle_index=1), token="w", expected_revision=0) is False
        assert store.commit(Checkpoint("ghost", cycle_index=1), token="w", expected_revision=0) is False

    def test_commit_after_expiry_holds_when_nobody_claimed_since(self, store: Any, running: Checkpoint) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=30)
        time.sleep(0.08)
        cp.cycle_index = 1
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True

    def test_many_cycles(self, store: Any, running: Checkpoint) -> None:
        for n in range(1, 21):
            cp = store.claim("task-1", n, token=f"w{n}", lease_ms=LEASE)
            cp.cycle_index = n
            cp.messages.append(f"m{n}")
            cp.cycles.append({"cycle": n})
            assert store.commit(cp, token=f"w{n}", expected_revision=cp.revision)
        got = store.load("task-1")
        assert got.cycle_index == 20 and got.revision == 40
        assert got.messages[1:] == [f"m{n}" for n in range(1, 21)]
        assert got.cycles == [{"cycle": n} for n in range(1, 21)]


class TestRenew:
    def test_renew_extends_a_live_lease(self, store: Any, running: Checkpoint) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=1000)
        assert store.renew("task-1", token="w", expected_revision=cp.revision, lease_ms=60_000) is True
        assert store.load("task-1").lease_expires_at_ms >= cp.lease_expires_at_ms + 50_000

    def test_renew_fails_on_wrong_token_revision_or_missing(self, store: Any, running: Checkpoint) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        assert store.renew("task-1", token="x", expected_revision=cp.revision, lease_ms=LEASE) is False
        assert store.renew("task-1", token="w", expected_revision=cp.revision + 1, lease_ms=LEASE) is False
        assert store.renew("ghost", token="w", expected_revision=0, lease_ms=LEASE) is False
        assert store.load("task-1").lease_expires_at_ms == cp.lease_expires_at_ms

    def test_renew_does_not_revive_an_expired_lease(self, store: Any, running: Checkpoint) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=30)
        time.sleep(0.08)
        assert store.renew("task-1", token="w", expected_revision=cp.revision, lease_ms=LEASE) is False


class TestFinalize:
    """The seed's finalize_checkpoint and acknowledge_terminal."""

    def _committed(self, store: Any) -> Checkpoint:
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        return store.load("task-1")

    def test_finalize_requires_terminal_result(self, store: Any, running: Checkpoint) -> None:
        with pytest.raises(InvalidArgument, match="terminal_result"):
            store.finalize(Checkpoint("task-1"), expected_revision=0)

    def test_finalize_then_acknowledge(self, store: Any, running: Checkpoint) -> None:
        cp = self._committed(store)
        cp.status = AgentStatus.COMPLETED
        cp.terminal_result = {"answer": "42"}
        assert store.finalize(cp, expected_revision=cp.revision) is True
        done = store.load("task-1")
        assert done.revision == cp.revision + 1 and done.terminal_result == {"answer": "42"}
        with pytest.raises(CheckpointTerminal):
            store.claim("task-1", 2, token="w", lease_ms=LEASE)
        # Already terminal: a second finalize is refused.
        assert store.finalize(done, expected_revision=done.revision) is False
        assert store.acknowledge_terminal("task-1", expected_revision=done.revision - 1) is False
        assert store.acknowledge_terminal("task-1", expected_revision=done.revision) is True
        assert store.load("task-1") is None and "task-1" not in store.list()

    def test_finalize_refused_under_a_claim_or_wrong_revision(self, store: Any, running: Checkpoint) -> None:
        claimed = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        final = Checkpoint("task-1", status=AgentStatus.FAILED, terminal_result="boom")
        assert store.finalize(final, expected_revision=claimed.revision) is False
        assert store.finalize(final, expected_revision=0) is False
        assert store.finalize(Checkpoint("ghost", terminal_result=1), expected_revision=0) is False
        assert store.load("task-1").terminal_result is None

    def test_acknowledge_only_terminal(self, store: Any, running: Checkpoint) -> None:
        assert store.acknowledge_terminal("task-1", expected_revision=0) is False
        assert store.acknowledge_terminal("ghost", expected_revision=0) is False
        assert store.load("task-1") is not None


class TestRetrySafety:
    """docs/design.md 3: a reply lost on the wire must not turn success into failure."""

    def lose_first_reply(
        self, store: Any, name: str, monkeypatch: pytest.MonkeyPatch, between: Any = None, lose: bool = True
    ) -> list[list[Any]]:
        """Make script ``name`` apply on the server, then fail as if the reply was lost.

        ``between`` runs after the write applied and before the re-send (other workers' moves);
        with ``lose=False`` the reply arrives after ``between`` ran (moves made while in flight).
        """
        return lose_first_reply(scripts_of(store)[name], monkeypatch, between=between, lose=lose)

    def test_commit_resent_after_lost_reply_returns_true_once(
        self, store: Any, running: Checkpoint, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("applied once")
        calls = self.lose_first_reply(store, "commit", monkeypatch)
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        assert len(calls) == 2
        got = store.load("task-1")
        assert got.revision == cp.revision + 1 and got.messages.count("applied once") == 1

    def test_commit_resent_after_others_claimed_and_committed_is_still_true(
        self, store: Any, running: Checkpoint, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from redis_agentstate import CheckpointStore

        other = CheckpointStore(backend.sync_client(), namespace=namespace)

        def others_move_on() -> None:
            for n in (2, 3):
                nxt = other.claim("task-1", n, token=f"o{n}", lease_ms=LEASE)
                nxt.cycle_index = n
                nxt.messages.append(f"other {n}")
                assert other.commit(nxt, token=f"o{n}", expected_revision=nxt.revision)

        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("mine")
        calls = self.lose_first_reply(store, "commit", monkeypatch, between=others_move_on)
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        assert len(calls) == 2
        final = other.load("task-1")
        assert final.messages[1:] == ["mine", "other 2", "other 3"] and final.cycle_index == 3

    def test_resent_commit_after_another_worker_compacted_history(
        self, store: Any, running: Checkpoint, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from redis_agentstate import CheckpointStore

        other = CheckpointStore(backend.sync_client(), namespace=namespace)

        def other_compacts() -> None:
            nxt = other.claim("task-1", 2, token="o", lease_ms=LEASE)
            nxt.cycle_index = 2
            nxt.messages = ["summary"]
            assert other.commit(nxt, token="o", expected_revision=nxt.revision, replace_history=True)

        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("mine")
        self.lose_first_reply(store, "commit", monkeypatch, between=other_compacts)
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        nxt = other.claim("task-1", 3, token="o3", lease_ms=LEASE)
        nxt.cycle_index = 3
        nxt.messages.append("after")
        assert other.commit(nxt, token="o3", expected_revision=nxt.revision)
        assert store.load("task-1").messages == other.load("task-1").messages == ["summary", "after"]

    def test_entries_appended_while_a_commit_is_in_flight_are_not_taken_as_stored(
        self, store: Any, running: Checkpoint, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from redis_agentstate import CheckpointStore

        other = CheckpointStore(backend.sync_client(), namespace=namespace)
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("sent")
        self.lose_first_reply(
            store, "commit", monkeypatch, between=lambda: cp.messages.append("draft, never sent"), lose=False
        )
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        nxt = other.claim("task-1", 2, token="o", lease_ms=LEASE)
        nxt.cycle_index = 2
        nxt.messages.append("other")
        assert other.commit(nxt, token="o", expected_revision=nxt.revision)
        assert store.load("task-1").messages == [*running.messages, "sent", "other"]

    @pytest.mark.parametrize("write", ["commit", "finalize"])
    def test_terminal_write_resent_after_acknowledge_is_still_true(
        self, store: Any, running: Checkpoint, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, write: str
    ) -> None:
        from redis_agentstate import CheckpointStore

        consumer = CheckpointStore(backend.sync_client(), namespace=namespace)

        def consumer_acknowledges() -> None:
            done = consumer.load("task-1")
            assert consumer.acknowledge_terminal("task-1", expected_revision=done.revision)

        final = Checkpoint(
            "task-1", messages=list(running.messages), status=AgentStatus.COMPLETED, terminal_result={"answer": 1}
        )
        self.lose_first_reply(store, write, monkeypatch, between=consumer_acknowledges)
        if write == "commit":
            cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
            final.cycle_index = 1
            assert store.commit(final, token="w", expected_revision=cp.revision) is True
        else:
            assert store.finalize(final, expected_revision=0) is True
        assert store.load("task-1") is None

    def test_acknowledge_resent_after_the_task_was_created_again(
        self, store: Any, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from redis_agentstate import CheckpointStore

        other = CheckpointStore(backend.sync_client(), namespace=namespace)
        store.create(Checkpoint("t", status=AgentStatus.FAILED, terminal_result="x"))
        self.lose_first_reply(
            store, "acknowledge_terminal", monkeypatch, between=lambda: other.create(Checkpoint("t", cycle_index=9))
        )
        assert store.acknowledge_terminal("t", expected_revision=0) is True
        assert other.load("t").cycle_index == 9

    def test_resent_save_does_not_clobber_later_writes(
        self, store: Any, running: Checkpoint, backend: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from redis_agentstate import CheckpointStore

        other = CheckpointStore(backend.sync_client(), namespace=namespace)

        def others_move_on() -> None:
            nxt = other.claim("task-1", 1, token="o", lease_ms=LEASE)
            nxt.cycle_index = 1
            assert other.commit(nxt, token="o", expected_revision=nxt.revision)

        calls = self.lose_first_reply(store, "save", monkeypatch, between=others_move_on)
        store.save(Checkpoint("task-1", messages=["imported"]))
        assert len(calls) == 2
        got = other.load("task-1")
        assert (got.cycle_index, got.revision, got.messages) == (1, 2, ["imported"])

    def test_finalize_resent_after_lost_reply_returns_true(
        self, store: Any, running: Checkpoint, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls = self.lose_first_reply(store, "finalize", monkeypatch)
        final = Checkpoint(
            "task-1", status=AgentStatus.COMPLETED, terminal_result="ok", messages=[*running.messages, "bye"]
        )
        assert store.finalize(final, expected_revision=0) is True
        assert len(calls) == 2 and store.load("task-1").messages.count("bye") == 1

    def test_create_and_acknowledge_resent_after_lost_reply(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        calls = self.lose_first_reply(store, "create", monkeypatch)
        assert store.create(Checkpoint("c", status=AgentStatus.FAILED, terminal_result="x")) is True
        assert len(calls) == 2
        calls = self.lose_first_reply(store, "acknowledge_terminal", monkeypatch)
        assert store.acknowledge_terminal("c", expected_revision=0) is True
        assert len(calls) == 2 and store.load("c") is None

    def test_claim_resent_after_lost_reply_returns_the_claim(
        self, store: Any, running: Checkpoint, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls = self.lose_first_reply(store, "claim", monkeypatch)
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        assert len(calls) == 2 and cp.revision == 1 and cp.claim_token == "w"

    def test_a_second_distinct_commit_is_fenced(self, store: Any, running: Checkpoint) -> None:
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("x")
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        # The same write again is recognised (True, nothing written); a different one is fenced.
        assert store.commit(cp, token="w", expected_revision=cp.revision) is True
        cp.messages.append("y")
        assert store.commit(cp, token="w", expected_revision=cp.revision) is False
        got = store.load("task-1")
        assert got.messages.count("x") == 1 and "y" not in got.messages and got.revision == cp.revision + 1


class TestHistory:
    """docs/design.md 5: cost grows with the change, not the history."""

    def spy(self, store: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
        script = scripts_of(store)[name]
        original = type(script).__call__
        seen: list[list[Any]] = []

        def record(self_: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
            seen.append(list(args))
            return original(self_, keys=keys, args=args, client=client)

        monkeypatch.setattr(type(script), "__call__", record)
        return seen

    def test_commit_sends_only_new_messages(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        store.create(Checkpoint("h", messages=[f"old {i}" for i in range(500)]))
        cp = store.claim("h", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages += ["new a", "new b"]
        sent = self.spy(store, "commit", monkeypatch)
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        assert len(sent) == 1 and sent[0][15] == 2 and len(sent[0]) == 18  # commit.lua: 16 slots + 2 blobs
        assert store.load("h").messages == [f"old {i}" for i in range(500)] + ["new a", "new b"]

    def test_claim_fetches_only_new_history(self, store: Any, monkeypatch: pytest.MonkeyPatch, raw: Any) -> None:
        store.create(Checkpoint("h", messages=["m"] * 300))
        store.load("h")
        cp = store.claim("h", 1, token="w", lease_ms=LEASE)
        assert len(cp.messages) == 300
        # Another process appends; our next read fetches exactly the tail.
        other_cp = Checkpoint("h", cycle_index=1, messages=[*cp.messages, "tail"])
        key = next(iter(raw.scan_iter(match=f"{store.namespace}:*:msgs:h")))
        assert store.commit(other_cp, token="w", expected_revision=cp.revision)
        assert raw.llen(key) == 301
        assert store.load("h").messages[-2:] == ["m", "tail"]

    def test_stale_cache_is_detected(self, store: Any, make: Any) -> None:
        from redis_agentstate import AsyncCheckpointStore, CheckpointStore

        other = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("h", messages=["a"]))
        assert store.load("h").messages == ["a"]
        # Another client rewrites history behind our cache's back.
        other.save(Checkpoint("h", messages=["x", "y", "z"]))
        cp = store.claim("h", 1, token="w", lease_ms=LEASE)
        assert cp.messages == ["x", "y", "z"]
        # And appends behind it (keeping our claim); our commit must not double- or mis-append.
        other.save(Checkpoint("h", messages=["x", "y", "z", "w"], revision=cp.revision, claim_token="w",
                              claimed_cycle=1, lease_expires_at_ms=cp.lease_expires_at_ms))  # fmt: skip
        cp.cycle_index = 1
        cp.messages = ["x", "y", "z", "w", "mine"]
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        assert other.load("h").messages == ["x", "y", "z", "w", "mine"]

    def test_history_without_cache(self, make: Any) -> None:
        from redis_agentstate import AsyncCheckpointStore, CheckpointStore

        nocache = make(CheckpointStore, AsyncCheckpointStore, history_cache=0)
        nocache.create(Checkpoint("h", messages=["a", "b"], cycles=[1]))
        cp = nocache.claim("h", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("c")
        cp.cycles.append(2)
        assert nocache.commit(cp, token="w", expected_revision=cp.revision)
        got = nocache.load("h")
        assert (got.messages, got.cycles) == (["a", "b", "c"], [1, 2])

    def test_uncommitted_appends_never_leak_into_a_later_read(self, store: Any) -> None:
        store.create(Checkpoint("h", messages=["a"]))
        cp = store.claim("h", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages.append("b")
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        cp.messages.append("never committed")  # the caller keeps using the old object
        nxt = store.claim("h", 2, token="w", lease_ms=LEASE)
        assert nxt.messages == ["a", "b"]
        nxt.cycle_index = 2
        nxt.messages.append("fenced")
        assert not store.commit(nxt, token="someone else", expected_revision=nxt.revision)
        again = store.load("h")
        assert again.messages == ["a", "b"]
        assert cp.messages == ["a", "b", "never committed"]  # the library never edits a caller's list

    def test_two_clients_alternating_see_each_others_appends(self, store: Any, make: Any) -> None:
        from redis_agentstate import AsyncCheckpointStore, CheckpointStore

        other = make(CheckpointStore, AsyncCheckpointStore)
        store.create(Checkpoint("h"))
        for n in range(1, 9):
            s = store if n % 2 else other
            cp = s.claim("h", n, token=f"w{n}", lease_ms=LEASE)
            assert cp.messages == [f"m{i}" for i in range(1, n)]
            cp.cycle_index = n
            cp.messages.append(f"m{n}")
            assert s.commit(cp, token=f"w{n}", expected_revision=cp.revision)
        assert store.load("h").messages == other.load("h").messages == [f"m{i}" for i in range(1, 9)]

    def test_a_template_shared_by_many_creates_is_never_touched(self, store: Any) -> None:
        import dataclasses

        template = Checkpoint("template", messages=["system prompt"])
        for t in ("x", "y"):
            store.create(dataclasses.replace(template, task_id=t))
        for t in ("x", "y"):
            cp = store.claim(t, 1, token="w", lease_ms=LEASE)
            cp.cycle_index = 1
            cp.messages.append(f"reply {t}")
            assert store.commit(cp, token="w", expected_revision=cp.revision)
        assert template.messages == ["system prompt"]
        assert store.load("x").messages == ["system prompt", "reply x"]
        assert store.load("y").messages == ["system prompt", "reply y"]

    def test_shrinking_history_needs_replace(self, store: Any, raw: Any) -> None:
        store.create(Checkpoint("h", messages=["a", "b", "c"]))
        cp = store.claim("h", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        cp.messages = ["summary"]
        before = namespace_dump(raw, store.namespace)
        with pytest.raises(InvalidArgument, match="append-only"):
            store.commit(cp, token="w", expected_revision=cp.revision)
        assert namespace_dump(raw, store.namespace) == before
        assert store.commit(cp, token="w", expected_revision=cp.revision, replace_history=True)
        assert store.load("h").messages == ["summary"]


class TestServerClock:
    """docs/design.md 1: leases come from Redis TIME; a worker's clock is irrelevant."""

    def test_client_clock_hours_off_changes_nothing(
        self, store: Any, running: Checkpoint, raw: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 6 * 3600)
        monkeypatch.setattr(time, "time_ns", lambda: int((real_time() + 6 * 3600) * 1e9))
        cp = store.claim("task-1", 1, token="skewed", lease_ms=LEASE)
        assert abs(cp.lease_expires_at_ms - (server_ms(raw) + LEASE)) < 5_000
        with pytest.raises(AlreadyClaimed):
            store.claim("task-1", 1, token="honest", lease_ms=LEASE)


class TestScripts:
    def test_noscript_after_script_flush(self, store: Any, running: Checkpoint, raw: Any) -> None:
        store.load("task-1")
        raw.script_flush()
        cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
        raw.script_flush()
        cp.cycle_index = 1
        assert store.commit(cp, token="w", expected_revision=cp.revision)
        raw.script_flush()
        assert store.load("task-1").revision == 2

    def test_one_round_trip_per_operation(self, store: Any, running: Checkpoint) -> None:
        # Warm-up: NOSCRIPT + SCRIPT LOAD happen once per script and connection pool.
        store.create(Checkpoint("warm"))
        w = store.claim("warm", 1, token="w", lease_ms=LEASE)
        store.renew("warm", token="w", expected_revision=w.revision, lease_ms=LEASE)
        w.cycle_index = 1
        store.commit(w, token="w", expected_revision=w.revision)
        store.load("warm")
        inner = getattr(store, "wrapped", store)
        check = getattr(inner, "_eviction_check", None)
        if check is not None:  # an asyncio store's one-off INFO runs beside its first caller: not counted
            store._loop.run_until_complete(check)
        client = inner.client
        sent: list[str] = []
        original = client.execute_command

        def count(*args: Any, **kw: Any) -> Any:
            sent.append(str(args[0]))
            return original(*args, **kw)

        client.execute_command = count
        try:
            cp = store.claim("task-1", 1, token="w", lease_ms=LEASE)
            cp.cycle_index = 1
            store.renew("task-1", token="w", expected_revision=cp.revision, lease_ms=LEASE)
            store.commit(cp, token="w", expected_revision=cp.revision)
            store.load("task-1")
        finally:
            del client.execute_command
        assert sent == ["EVALSHA"] * 4


class TestBadInput:
    """docs/design.md 7: InvalidArgument before anything is written; nothing stored is lost."""

    @pytest.mark.parametrize(
        "call",
        [
            lambda s: s.claim("task-1", 0, token="w", lease_ms=LEASE),
            lambda s: s.claim("task-1", 2**32, token="w", lease_ms=LEASE),
            lambda s: s.claim("task-1", True, token="w", lease_ms=LEASE),
            lambda s: s.claim("task-1", "1", token="w", lease_ms=LEASE),
            lambda s: s.claim("task-1", 1, token="", lease_ms=LEASE),
            lambda s: s.claim("task-1", 1, token=None, lease_ms=LEASE),
            lambda s: s.claim("task-1", 1, token="w", lease_ms=0),
            lambda s: s.claim("task-1", 1, token="w", lease_ms=-5),
            lambda s: s.claim("task-1", 1, token="w", lease_ms=1.5),
            lambda s: s.claim("", 1, token="w", lease_ms=LEASE),
            lambda s: s.claim(b"task-1", 1, token="w", lease_ms=LEASE),
            lambda s: s.claim("x" * 1025, 1, token="w", lease_ms=LEASE),
            lambda s: s.renew("task-1", token="w", expected_revision=-1, lease_ms=LEASE),
            lambda s: s.renew("task-1", token="w", expected_revision=0, lease_ms=0),
            lambda s: s.commit(Checkpoint("task-1", cycle_index=1), token="", expected_revision=0),
            lambda s: s.commit(Checkpoint("task-1", cycle_index=1), token="w", expected_revision=2**53),
            lambda s: s.commit("not a checkpoint", token="w", expected_revision=0),
            lambda s: s.save(Checkpoint("task-1", messages=[{1, 2}])),
            lambda s: s.save(Checkpoint("task-1", shared_state={"x": object()})),
            lambda s: s.save(Checkpoint("task-1", shared_state={"big": 2**70})),
            lambda s: s.save(Checkpoint("task-1", status="bogus")),
            lambda s: s.save(Checkpoint("task-1", messages="not a list")),
            lambda s: s.save(Checkpoint("task-1", shared_state=[1])),
            lambda s: s.save(Checkpoint("task-1", cycle_index=-1)),
            lambda s: s.save(Checkpoint("task-1", revision=2**53)),
            lambda s: s.create(Checkpoint("new", revision=2**52 + 1)),  # no room left to bump
            lambda s: s.save(Checkpoint("task-1", claimed_cycle=0)),
            lambda s: s.save(Checkpoint("\ud800")),
            lambda s: s.create(Checkpoint("new", cycles=[b"x" * 1024] * 80)),
            lambda s: s.acknowledge_terminal("task-1", expected_revision="0"),
            lambda s: s.load(None),
            lambda s: s.delete(""),
        ],
    )
    def test_rejected_before_any_write(self, make: Any, raw: Any, call: Any) -> None:
        from redis_agentstate import AsyncCheckpointStore, CheckpointStore

        s = make(CheckpointStore, AsyncCheckpointStore, max_payload_bytes=64 * 1024)
        s.create(Checkpoint("task-1", messages=["keep me"], shared_state={"keep": True}))
        before = namespace_dump(raw, s.namespace)
        with pytest.raises(InvalidArgument) as info:
            call(s)
        assert isinstance(info.value, ValueError)
        assert namespace_dump(raw, s.namespace) == before
        assert s.load("task-1").messages == ["keep me"]

    def test_int_subclasses_are_stored_as_plain_ints(self, store: Any, raw: Any) -> None:
        import enum

        class Step(enum.IntEnum):
            START = 3

        store.create(Checkpoint("e", cycle_index=Step.START, revision=Step.START))
        got = store.claim("e", Step.START + 1, token="w", lease_ms=LEASE)
        assert (got.cycle_index, got.revision) == (3, 4)
        assert type(got.cycle_index) is int

    def test_tuple_map_keys_round_trip(self, store: Any) -> None:
        state = {("row", 3): "seen", "plain": {(1, (2, 3)): [1]}}
        store.create(Checkpoint("k", shared_state=state, messages=[{(1, 2): "m"}]))
        got = store.claim("k", 1, token="w", lease_ms=LEASE)
        assert got.shared_state == state and got.messages == [{(1, 2): "m"}]

    def test_longest_id_is_accepted(self, store: Any) -> None:
        tid = "é" * 512  # 1024 UTF-8 bytes
        assert store.create(Checkpoint(tid))
        assert store.load(tid).task_id == tid

    def test_decode_responses_client_is_refused(self, backend: Any) -> None:
        from redis_agentstate import CheckpointStore

        with pytest.raises(InvalidArgument, match="decode_responses"):
            CheckpointStore(backend.sync_client(decode_responses=True))

    def test_a_client_of_the_other_flavor_is_refused_at_construction(self, backend: Any) -> None:
        # Before: the sync store accepted an asyncio client and failed later with a misleading
        # CorruptState or a raw TypeError, and the async store accepted a sync client.
        from redis_agentstate import (
            AsyncCheckpointStore,
            AsyncKeyValueStore,
            AsyncPoolStore,
            CheckpointStore,
            KeyValueStore,
            PoolStore,
        )

        sync_client, async_client = backend.sync_client(), backend.async_client()
        for sync_cls, async_cls in (
            (CheckpointStore, AsyncCheckpointStore),
            (PoolStore, AsyncPoolStore),
            (KeyValueStore, AsyncKeyValueStore),
        ):
            with pytest.raises(InvalidArgument, match="sync store needs a sync client"):
                sync_cls(async_client)
            with pytest.raises(InvalidArgument, match=r"async store needs a redis\.asyncio client"):
                async_cls(sync_client)
            sync_cls(sync_client)  # the right flavors still work
            async_cls(async_client)

    @pytest.mark.parametrize("ns", ["", "a{b}", "has*star", "back\\slash", 5, "x" * 200, "new\nline"])
    def test_bad_namespace(self, backend: Any, ns: Any) -> None:
        from redis_agentstate import CheckpointStore

        with pytest.raises(InvalidArgument):
            CheckpointStore(backend.sync_client(), namespace=ns)


class TestCorruptState:
    def _key(self, raw: Any, ns: str, kind: str, tid: str) -> bytes:
        return next(iter(raw.scan_iter(match=f"{ns}:*:{kind}:{tid}")))

    @pytest.mark.parametrize(
        ("kind", "field", "value"),
        [
            ("cp", "body", b"\x01\xc1garbage"),
            ("cp", "body", b"\x07future format"),
            ("cp", "body", b""),
            ("cp", "status", b"exploded"),
            ("cp", "rev", b"NaN-ish"),
            ("msgs", None, b"\x01\xc1"),
        ],
    )
    def test_undecodable_bytes_name_task_and_key(
        self, store: Any, raw: Any, kind: str, field: Any, value: bytes
    ) -> None:
        from redis_agentstate import CorruptState

        store.create(Checkpoint("bad", messages=["a", "b"]))
        key = self._key(raw, store.namespace, kind, "bad")
        if field is None:
            raw.lset(key, 1, value)
        else:
            raw.hset(key, field, value)
        # Forget our cached history so the corrupted entry is read from Redis.
        getattr(store, "wrapped", store)._core.history.drop("bad")
        with pytest.raises(CorruptState) as info:
            store.load("bad")
        assert info.value.task_id == "bad"
        assert info.value.key == key.decode()


class TestKeys:
    def test_hostile_ids_never_collide(self, store: Any) -> None:
        ids = ["a", "a:b", "a}:cp:b", "{a}", "a:msgs:b", "*", "?", "a b", "a/b", "../a", "ü", "a\x00b", "}{", ":"]
        for i, t in enumerate(ids):
            assert store.create(Checkpoint(t, cycle_index=i, messages=[t]))
        for i, t in enumerate(ids):
            got = store.load(t)
            assert (got.task_id, got.cycle_index, got.messages) == (t, i, [t])
        assert store.list() == sorted(ids)

    def test_namespaces_are_isolated(self, make: Any) -> None:
        from redis_agentstate import AsyncCheckpointStore, CheckpointStore

        a = make(CheckpointStore, AsyncCheckpointStore, namespace="tenant")
        b = make(CheckpointStore, AsyncCheckpointStore, namespace="tenant:cp")
        a.create(Checkpoint("x", cycle_index=1))
        b.create(Checkpoint("x", cycle_index=2))
        assert (a.load("x").cycle_index, b.load("x").cycle_index) == (1, 2)
        b.delete("x")
        assert a.load("x") is not None and a.list() == ["x"] and b.list() == []

    def test_every_key_of_a_task_shares_one_slot(self) -> None:
        from redis.crc import key_slot

        from redis_agentstate.keys import Keys

        keys = Keys("ns")
        for tid in ["a", "{x}", "}", "ü/ü", "a" * 1000]:
            slots = {key_slot(k.encode()) for k in keys.task(tid).as_list()}
            assert len(slots) == 1, tid


class TestProtocols:
    @pytest.mark.parametrize("protocol", [2, 3])
    def test_resp2_and_resp3(self, backend: Any, namespace: str, protocol: int) -> None:
        from redis_agentstate import CheckpointStore

        s = CheckpointStore(backend.sync_client(protocol=protocol), namespace=namespace)
        s.create(Checkpoint("p", messages=["m"]))
        cp = s.claim("p", 1, token="w", lease_ms=LEASE)
        cp.cycle_index = 1
        assert s.commit(cp, token="w", expected_revision=cp.revision)
        assert s.load("p").revision == 2 and s.list() == ["p"]
        with pytest.raises(CycleConflict):
            s.claim("p", 5, token="w", lease_ms=LEASE)
