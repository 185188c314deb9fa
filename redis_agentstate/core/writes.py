"""The checkpoint writes: create and save, and the fenced writes (commit, finalize, commit_and_claim).

A fenced write is named by its identity (``write_id``: a digest of everything
it writes, whoever sends it), so a re-send after a lost reply is recognised by
the script and answered as applied; it sends only the history entries added
since what the client knows is stored (``core.history``). Each fenced script's ARGV
is a named contract (``CommitArgv``, ``FinalizeArgv``, ``NextClaim``) that lists
it in the order of the script's header. ``CheckpointWrites`` is the checkpoint
core's part for all of them: it holds the core's state and its limits part
(a limited task's place). Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from ..codec import decode, encode
from ..errors import ClaimRejected, InvalidArgument
from ..models import AgentStatus, Checkpoint
from ..wire import Call, Op, new_nonce, scripts
from ..wire.scripts import Reply
from .checkpoint_base import (
    _STATUS_VALUE,
    CheckpointState,
    check_delay,
    check_lease,
    check_revision,
    check_token,
    encode_body,
    raise_claim_refused,
    validate,
)
from .history import History, committed, hashed
from .limits import ConcurrencyLimits
from .validate import MAX_CLAIM_FROM_REVISION, MAX_CYCLE, MAX_REVISION

__all__ = ["CheckpointWrites", "CommitArgv", "FinalizeArgv", "NextClaim", "Part", "store_argv"]


#: The history part a fenced write sends: its header (epoch, base_m, base_c), then the message and
#: cycle blobs (``CheckpointState.history_part``).
Part: TypeAlias = tuple[list[Any], list[bytes], list[bytes]]


@dataclass(slots=True)
class CommitArgv:
    """commit.lua's contract: what it takes beyond what every fenced write sends (its identity and
    fence, the checkpoint's scalars and body, the history ``Part``), and its ARGV in header order."""

    script: ClassVar[str] = scripts.COMMIT
    kind: ClassVar[str] = "commit"  #: the first field of the write's identity
    ttl_ms: int  #: the store's terminal_ttl_ms (0: none); not part of the identity
    delay_ms: int  #: the next cycle's delay (0: none); part of the identity when set

    def identity_extra(self) -> tuple[Any, ...]:
        return (self.delay_ms,) if self.delay_ms else ()

    def argv(
        self, identity: str, token: str, expected: int, cp: Checkpoint, body: bytes, part: Part, replace: bool
    ) -> list[Any]:
        (epoch, base_m, base_c), blobs_m, blobs_c = part
        return [
            identity, token, expected, int(cp.cycle_index), _STATUS_VALUE[cp.status], _term(cp), body,
            self.ttl_ms, self.delay_ms, int(cp.priority), cp.concurrency_key or "",
            "1" if replace else "0", epoch, base_m, base_c, len(blobs_m), *blobs_m, *blobs_c,
        ]  # fmt: skip


@dataclass(slots=True)
class FinalizeArgv:
    """finalize.lua's contract: no token (it ends the task whoever holds it), and its ARGV in header order."""

    script: ClassVar[str] = scripts.FINALIZE
    kind: ClassVar[str] = "finalize"
    ttl_ms: int  #: the store's terminal_ttl_ms (0: none); not part of the identity

    def identity_extra(self) -> tuple[Any, ...]:
        return ()

    def argv(
        self, identity: str, token: str, expected: int, cp: Checkpoint, body: bytes, part: Part, replace: bool
    ) -> list[Any]:
        (epoch, base_m, base_c), blobs_m, blobs_c = part
        return [
            identity, expected, int(cp.cycle_index), _STATUS_VALUE[cp.status], _term(cp), body, self.ttl_ms,
            "1" if replace else "0", epoch, base_m, base_c, len(blobs_m), *blobs_m, *blobs_c,
        ]  # fmt: skip


@dataclass(slots=True)
class NextClaim:
    """commit_and_claim.lua's contract: the next cycle's claim written beside the commit, and its ARGV in
    header order. The next token is part of the write's identity; the lease is not, so a re-send with
    another lease is still this write."""

    script: ClassVar[str] = scripts.COMMIT_AND_CLAIM
    kind: ClassVar[str] = "commit_and_claim"
    next_token: str
    lease_ms: int
    max_attempts: int
    permit_cap: int  #: the expiry (server ms) of the place taken in its concurrency key (0: none)

    def identity_extra(self) -> tuple[Any, ...]:
        return (self.next_token,)

    def argv(
        self, identity: str, token: str, expected: int, cp: Checkpoint, body: bytes, part: Part, replace: bool
    ) -> list[Any]:
        (epoch, base_m, base_c), blobs_m, blobs_c = part
        return [
            identity, token, expected, int(cp.cycle_index), _STATUS_VALUE[cp.status], _term(cp), body,
            self.next_token, self.lease_ms, self.max_attempts, int(cp.priority), cp.concurrency_key or "",
            self.permit_cap, "1" if replace else "0", epoch, base_m, base_c, len(blobs_m), *blobs_m, *blobs_c,
        ]  # fmt: skip


#: The contract of a fenced write script.
FencedArgv: TypeAlias = CommitArgv | FinalizeArgv | NextClaim


def _term(cp: Checkpoint) -> str:
    return "0" if cp.terminal_result is None else "1"


@dataclass(slots=True)
class _FencedReply:
    """What a fenced write got back: the reply, the cache entry it was sent against (None: full
    lists went), the entry it left in the cache when applied now, and the body it sent."""

    reply: Sequence[Any]
    known: History | None
    entry: History | None
    body: bytes

    @property
    def applied(self) -> bool:
        """Applied now or before (a re-send)."""
        return bool(self.reply[0] in (Reply.DONE, Reply.DONE_BEFORE))


def store_argv(
    cp: Checkpoint, nonce: str, body: bytes, blobs_m: list[bytes], blobs_c: list[bytes], delay_ms: int = 0
) -> list[Any]:
    """ARGV of create.lua and save.lua (their headers give the layout)."""
    claimed = "" if cp.claimed_cycle is None else str(int(cp.claimed_cycle))
    lease = "" if cp.lease_expires_at_ms is None else str(int(cp.lease_expires_at_ms))
    return [
        nonce, cp.claim_token or "", int(cp.revision), int(cp.cycle_index), _STATUS_VALUE[cp.status], _term(cp),
        body, claimed, lease, delay_ms, int(cp.priority), cp.concurrency_key or "", len(blobs_m), *blobs_m,
        *blobs_c,
    ]  # fmt: skip


class CheckpointWrites:
    """Building, identifying and reading back the checkpoint writes (a part of the checkpoint core)."""

    def __init__(self, state: CheckpointState, limits: ConcurrencyLimits) -> None:
        self.state = state
        self.history = state.history
        self.limits = limits

    @staticmethod
    def write_id(
        kind: str,
        cp: Checkpoint,
        token: str,
        expected: int,
        replace: bool,
        body: bytes,
        upto: tuple[int, int],
        hash_m: Any,
        hash_c: Any,
        extra: tuple[Any, ...] = (),
    ) -> str:
        """The identity of a fenced write: a digest of everything it writes, whoever sends it.

        Token, expected revision, cycle, status, priority, terminal flag, body, replace
        flag, the message and cycle counts and a digest of the whole resulting
        history (``hash_m``/``hash_c``: the stored prefix from the cache, at
        O(delta) cost, or the caller's full lists). The same write re-sent by
        anyone (another store, after the cache moved on) has the same identity;
        a different write at the same revision a different one. ``extra``
        (commit_and_claim: the next token; commit: a delay) is part of what it writes;
        the next lease is not, so a re-send with another lease is still this write.
        """
        head = [kind, token, expected, int(cp.cycle_index), _STATUS_VALUE[cp.status],
                cp.terminal_result is not None, replace, *upto, len(body), int(cp.priority), *extra]  # fmt: skip
        if cp.concurrency_key is not None:
            head.append(cp.concurrency_key)  # unlimited writes keep the identities they had before limits
        d = hashlib.blake2b(encode(head, what="write identity"), digest_size=16)
        d.update(hash_m.digest())
        d.update(hash_c.digest())
        d.update(body)
        return d.hexdigest()

    def create(self, cp: Checkpoint, *, delay_ms: int | None = None) -> Op[bool]:
        """A per-call nonce, not the content, names a create: "False if it exists" stays first-wins.
        ``delay_ms``: the first cycle is not claimable before that long from now (server clock)."""
        # A generator of its own (not _store's), so telemetry names the operation "create".
        return (yield from self._store(scripts.CREATE, cp, check_delay(delay_ms, cp)))

    def save(self, cp: Checkpoint) -> Op[None]:
        yield from self._store(scripts.SAVE, cp)
        return None

    def _store(self, script: str, cp: Checkpoint, delay_ms: int = 0) -> Op[bool]:
        validate(cp)
        keys = self.state.task_keys(cp.task_id)
        messages, cycles = list(cp.messages), list(cp.cycles)  # exactly what this write sends
        body = encode_body(cp)
        _, blobs_m, blobs_c = self.state.history_part(cp, None, (len(messages), len(cycles)), body)
        args = store_argv(cp, new_nonce(), body, blobs_m, blobs_c, delay_ms)
        # A save replaces a parked task too: it takes the parked index to take the task out of it, and
        # drops the durable steps' results (KEYS[10]) with the rest of what the task held.
        reply = yield Call(script, keys.stepped() if script == scripts.SAVE else keys.as_list(), args)
        if reply[0] == Reply.REFUSED:
            return False
        if reply[0] == Reply.DONE_BEFORE:
            # A re-send: reply[1] is the epoch now, which may name a history written since.
            self.history.drop(cp.task_id)
            return True
        entry = History(reply[1], messages, cycles, len(messages), len(cycles), int(cp.revision),
                         hashed(blobs_m), hashed(blobs_c))  # fmt: skip
        self.history.put(cp.task_id, entry)
        return True

    def commit(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        replace_history: bool = False,
        delay_ms: int | None = None,
    ) -> Op[bool]:
        validate(cp, stores_revision=False)
        delay = check_delay(delay_ms, cp)
        token = check_token(token)
        expected = check_revision(expected_revision, bumped=True)
        argv = CommitArgv(self.state.terminal_ttl_ms or 0, delay)
        written = yield from self._fenced_write(argv, cp, token, expected, replace_history)
        if self.limits.permits:
            # The cycle is over (or the lease was): its place too. A stale write of a live lease keeps it.
            yield from self.limits.refused_write(cp.task_id, token, written.reply)
        return written.applied

    def finalize(self, cp: Checkpoint, *, expected_revision: int, replace_history: bool = False) -> Op[bool]:
        validate(cp, stores_revision=False)
        if cp.terminal_result is None:
            raise InvalidArgument("finalized checkpoint must include terminal_result", task_id=cp.task_id)
        expected = check_revision(expected_revision, bumped=True)
        argv = FinalizeArgv(self.state.terminal_ttl_ms or 0)
        written = yield from self._fenced_write(argv, cp, "", expected, replace_history)
        if self.limits.permits and cp.claim_token is not None:
            # Applied: nobody held a claim. Refused while cp's own claim is live: its place stays.
            yield from self.limits.refused_write(cp.task_id, cp.claim_token, written.reply)
        return written.applied

    def commit_and_claim(
        self,
        cp: Checkpoint,
        *,
        token: str,
        expected_revision: int,
        lease_ms: int,
        next_token: str | None = None,
        replace_history: bool = False,
    ) -> Op[Checkpoint | None]:
        """Commit the claimed cycle ``cp.cycle_index`` and claim the next one, in one script.

        Returns the new claim (as ``claim`` would), or None when fenced out
        (nothing written). Before anything is sent: InvalidArgument unless
        ``cp`` is runnable (status running, no terminal_result) and its next
        cycle is within MAX_CYCLE; ClaimRejected when the new claim's commit
        could not be stored (the revision limit, as ``claim``). A ClaimRejected
        subclass from Redis means a re-send (after a lost reply) whose commit
        had applied but whose claim another worker has taken since.
        """
        validate(cp, stores_revision=False)
        tid = cp.task_id
        if cp.status != AgentStatus.RUNNING or cp.terminal_result is not None:
            raise InvalidArgument(
                f"commit_and_claim continues a runnable task: status must be running without terminal_result "
                f"(got status {_STATUS_VALUE[cp.status]!r}); use commit or finalize",
                task_id=tid,
            )
        if cp.cycle_index >= MAX_CYCLE:
            raise InvalidArgument(f"cycle {cp.cycle_index} is the last one: use commit", task_id=tid)
        token = check_token(token)
        next_token = token if next_token is None else check_token(next_token)
        lease_ms = check_lease(lease_ms)
        expected = check_revision(expected_revision, bumped=True)
        if expected + 1 > MAX_CLAIM_FROM_REVISION:
            raise ClaimRejected(
                f"checkpoint of task {tid!r} would be at revision {expected + 1}: a claim and its commit would "
                f"run past the highest revision {MAX_REVISION} (nothing was written; commit instead)",
                task_id=tid,
                revision=expected + 1,
            )
        limits = self.limits
        ckey, cap = cp.concurrency_key, 0
        old = limits.permit(tid, token)
        if ckey is not None:
            # The next cycle's lease takes the committed one's place (the limits note in _common.lua).
            got, full = yield from limits.take_place(
                tid, next_token, ckey, lease_ms, replaces=token if old == ckey else ""
            )
            if full is not None:
                raise full
            assert got is not None
            cap = got
        argv = NextClaim(next_token, lease_ms, self.state.max_attempts, cap)
        w = yield from self._fenced_write(argv, cp, token, expected, replace_history, claim_revision=expected + 2)
        reply, code = w.reply, w.reply[0]
        if limits.permits:
            left = None if code in (Reply.DONE, Reply.DONE_BEFORE) else limits.lease_left(reply, token)
            if left is not None:
                # Fenced out while token's lease goes on: it keeps (or gets back) its place.
                yield from self._keep_place(tid, token, next_token, old, ckey, left)
            else:
                if old is not None and old != ckey:
                    yield from limits.give_back(tid, token, old)  # the key changed (or went): the old place too
                if code not in (Reply.DONE, Reply.DONE_BEFORE):
                    yield from limits.give_back(tid, next_token)
                    yield from limits.give_back(tid, token)
        if code == Reply.DONE and w.entry is None:
            # Full lists were appended: the claim came back whole (commit_and_claim.lua).
            return self.state.checkpoint(tid, self.state.task_keys(tid), reply, 1, None, claim=True)
        if code == Reply.DONE:
            assert w.entry is not None
            return self._next_claim(cp, w.entry, w.body, next_token, reply)
        if code == Reply.DONE_BEFORE:
            return self.state.checkpoint(tid, self.state.task_keys(tid), reply, 1, w.known, claim=True)
        if code == Reply.REFUSED:
            return None
        raise_claim_refused(tid, cp.cycle_index + 1, code, reply)
        raise AssertionError("unreachable")  # pragma: no cover

    def _keep_place(
        self, tid: str, token: str, next_token: str, old: str | None, ckey: str | None, left: int
    ) -> Op[None]:
        """A commit_and_claim refused while ``token``'s lease stays live (``left`` ms more): the place taken for
        the next claim (``next_token``'s, in ``ckey``'s limiter) goes back to that lease, or goes when the lease
        holds its own elsewhere (``old``, another key's); the lease's place must outlast it."""
        if ckey is None:
            return None  # no place was taken: the lease's own (old's, if any) was not touched
        if old == ckey or (old is None and next_token == token):
            # The lease's place was moved to next_token (or, the same holder, its expiry to the new lease's):
            # move it back and past the lease's end. A place of token's unknown to this core is kept alike.
            got, _ = yield from self.limits.take_place(
                tid, token, ckey, left, replaces="" if next_token == token else next_token
            )
            if got is None and next_token != token:
                yield from self.limits.give_back(tid, next_token, ckey)
            return None
        yield from self.limits.give_back(tid, next_token, ckey)
        if old is not None:
            self.limits.permits[(tid, token)] = old  # the give back forgot token's own place when next_token == token
        return None

    def _next_claim(self, cp: Checkpoint, claim: History, body: bytes, token: str, reply: Sequence[Any]) -> Checkpoint:
        """The claim a commit_and_claim made, from what the client wrote and the reply's epoch and lease.

        The state is decoded from the very body sent (objects of the claimant's
        own, as a claim's); the history lists are those of ``claim``, the cache
        entry ``_fenced_write`` left for the new claim (``_claimed_entry``).
        """
        tid = cp.task_id
        shared_state, _terminal, budget = decode(body, key=self.state.task_keys(tid).checkpoint, task_id=tid)
        return Checkpoint(
            task_id=tid,
            cycle_index=cp.cycle_index,
            status=AgentStatus.RUNNING,
            shared_state=shared_state,
            revision=claim.revision,
            claim_token=token,
            claimed_cycle=cp.cycle_index + 1,
            lease_expires_at_ms=int(reply[2]),
            budget_usage=budget,
            attempts=1,
            messages=claim.messages,
            cycles=claim.cycles,
            priority=cp.priority,
            concurrency_key=cp.concurrency_key,
        )

    def _claimed_entry(self, task_id: str, entry: History, revision: int) -> History:
        """Cache, for the claim a commit_and_claim made at ``revision``, the history ``entry`` its commit wrote.

        In one step what a commit then a claim of the task through this store
        would leave: the committed lists pass to the claimant (lent), as a claim
        takes them from the cache when nobody else holds them; copies when the
        caller appended past them since, or when the cache is off.
        """
        claim = History(entry.epoch, entry.messages, entry.cycles, entry.n_m, entry.n_c, revision,
                        entry.hash_m, entry.hash_c, lent=True)  # fmt: skip
        if not (entry.intact() and self.history.max_tasks):
            claim.messages, claim.cycles = entry.messages[: entry.n_m], entry.cycles[: entry.n_c]
        self.history.put(task_id, claim)
        return claim

    def _fenced_write(
        self,
        argv: FencedArgv,
        cp: Checkpoint,
        token: str,
        expected: int,
        replace: bool,
        claim_revision: int | None = None,
    ) -> Op[_FencedReply]:
        """Send ``argv``'s script (its contract: which script, its own ARGV, what of it the identity takes).
        ``claim_revision`` (commit_and_claim): the entry an applied write leaves in the cache is the claim's
        (``_claimed_entry``), and ``written.entry`` is that."""
        # finalize may close a parked task (the parked index); commit and commit_and_claim count what they
        # apply (the parked index, then the shard's counters: commit_and_claim's re-send may park a task);
        # all three drop the cycle's durable step results (KEYS[10]).
        state = self.state
        keys = state.wire_keys(cp.task_id).stepped
        upto = n_m, n_c = len(cp.messages), len(cp.cycles)  # this write's extent, fixed before any I/O
        body = encode_body(cp)
        script, extra = argv.script, argv.identity_extra()
        known = self.history.get(cp.task_id)
        # Only the delta goes when the cache was read at this very revision: its
        # entries are then exactly the history this write extends (claims do not
        # touch history, commits move the revision on), so the digest of cached
        # prefix + delta is what anyone sending this write computes. Otherwise
        # (and for a shorter checkpoint: the script decides, after fencing,
        # whether that is a forbidden shrink) the full lists go.
        if (
            replace
            or known is None
            or not known.usable()
            or known.revision != expected
            or n_m < known.n_m
            or n_c < known.n_c
        ):
            known = None

        def request(h: History | None) -> tuple[Call, Any, Any]:
            part = state.history_part(cp, h, upto, body)
            _, blobs_m, blobs_c = part
            hash_m = hashed(blobs_m, None if h is None else h.hash_m)
            hash_c = hashed(blobs_c, None if h is None else h.hash_c)
            identity = self.write_id(argv.kind, cp, token, expected, replace, body, upto, hash_m, hash_c, extra)
            args = argv.argv(identity, token, expected, cp, body, part, replace)
            return Call(script, keys, args), hash_m, hash_c

        call, hash_m, hash_c = request(known)
        reply = yield call
        if reply[0] == Reply.RESEND_HISTORY:
            # Our cached view of the history was stale: send it whole; the script skips what it holds.
            # Nothing was written, so this send may carry the identity of the full lists.
            known = None
            call, hash_m, hash_c = request(None)
            reply = yield call
        if reply[0] == Reply.SHRINK:
            raise InvalidArgument(
                f"checkpoint {cp.task_id!r} has fewer messages or cycles than are stored; "
                "history is append-only (pass replace_history=True to rewrite it)",
                task_id=cp.task_id,
                revision=expected,
            )
        written = _FencedReply(reply, known, None, body)
        if reply[0] == Reply.DONE_BEFORE:
            # Applied already (a re-send): reply[1] is the epoch now, which may name a history rewritten since.
            self.history.drop(cp.task_id)
        elif reply[0] != Reply.DONE:
            pass
        elif replace or known is not None:
            if replace:
                messages, cycles = cp.messages[:n_m], cp.cycles[:n_c]
            else:
                # Redis kept its own first n entries and appended ours after them. The
                # committed lists pass to the cache: the claimant is done with them, so
                # the next claim may take them without a copy.
                assert known is not None
                messages = committed(known.messages, known.n_m, cp.messages)
                cycles = committed(known.cycles, known.n_c, cp.cycles)
            entry = History(reply[1], messages, cycles, n_m, n_c, expected + 1, hash_m, hash_c)
            if claim_revision is None:
                self.history.put(cp.task_id, entry)
                written.entry = entry
            else:
                written.entry = self._claimed_entry(cp.task_id, entry, claim_revision)
        else:
            # Full lists went: the script kept what it held, which we have not seen.
            self.history.drop(cp.task_id)
        return written
