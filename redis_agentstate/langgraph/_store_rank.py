"""The LangGraph store's semantic ranking (``AgentStateStore``): InMemoryStore's, over stored vectors.

Each item's vectors are stored at put, one per embedded field, as msgpack ``{field path: [float32
bytes, norm]}``: the float32 vector (compact: 4 bytes a dimension) and its norm, computed then from
the float32 values, so a search computes each candidate's norm never and its dot product once.
Ranking is InMemoryStore's: cosine similarity (0.0 where a norm is 0), an item's best field, best
first with ties in search order, scoreless items (nothing embedded) after, in search order; scores
are InMemoryStore's on the float32-rounded vectors. With numpy importable the dot products are one
matrix product; without it, pure Python; the two agree within float rounding (tests check both).
A search without a filter ranks from the client's cache of the vectors (``_store_cache.py``) and
reads the values of the items it returns alone (``StoreCore._search``).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
from langgraph.store.base import Item

from ..keys import StoreKeys
from ..wire import corrupt_state

try:  # optional: the pure-Python path gives the same ranking
    import numpy as _np  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - exercised by the tests with NUMPY off
    _np = None  # type: ignore[assignment,unused-ignore]

__all__ = ["NUMPY", "Candidate", "decode_vectors", "pack_vectors", "rank", "top", "unpack_vectors"]

#: Whether the dot products run in numpy (tests turn it off to check the pure-Python path).
NUMPY = _np is not None


@dataclass
class Candidate:
    """One item a ranking considers: where it is, its vectors (float32 bytes, norm), its item if read."""

    namespace: tuple[str, ...]
    key: str
    vectors: list[tuple[bytes, float]] = field(default_factory=list)
    item: Item | None = None


def pack_vectors(vectors: dict[str, list[float]]) -> bytes:
    """``{field path: [float32 bytes, norm]}``, the norm from the float32 values (as a search reads them)."""
    table: dict[str, list[Any]] = {}
    for path, vector in vectors.items():
        raw = struct.pack(f"<{len(vector)}f", *vector)
        rounded = struct.unpack(f"<{len(vector)}f", raw)
        table[path] = [raw, sum(a * a for a in rounded) ** 0.5]
    return cast(bytes, msgpack.packb(table))


def unpack_vectors(packed: bytes, dims: int) -> list[tuple[bytes, float]]:
    """The vectors ``pack_vectors`` stored (or the earlier ``{path: float32 bytes}``, norms computed
    here); ``ValueError`` (and msgpack's errors) for anything else."""
    table = msgpack.unpackb(packed, raw=False)
    if not isinstance(table, dict):
        raise ValueError("not a map")
    out: list[tuple[bytes, float]] = []
    for value in table.values():
        if isinstance(value, bytes):  # written before norms were stored
            value = [value, sum(a * a for a in struct.unpack(f"<{len(value) // 4}f", value)) ** 0.5]
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], bytes)):
            raise ValueError("a vector is not [float32 bytes, norm]")
        raw, norm = value
        if len(raw) != 4 * dims or not isinstance(norm, (int, float)) or isinstance(norm, bool):
            raise ValueError(f"a vector of {len(raw)} bytes and norm {norm!r}, for {dims} dimensions")
        out.append((raw, float(norm)))
    return out


def decode_vectors(packed: bytes, dims: int, keys: StoreKeys, key: object) -> list[tuple[bytes, float]]:
    """The vectors lgs_put stored for ``key`` (float32 bytes, norm); ``CorruptState`` for anything else."""
    if not packed:
        return []
    try:
        return unpack_vectors(packed, dims)
    except (ValueError, TypeError, struct.error, msgpack.UnpackException) as exc:
        raise corrupt_state(keys.vectors, [keys.vectors], f"holds vectors of {key!r} we did not write ({exc})") from exc


def _scores(query: Sequence[float], vectors: list[bytes], norms: list[float], dims: int) -> list[float]:
    """Cosine similarity of ``query`` with each float32 vector of known norm (0.0 where a norm is 0)."""
    qnorm = sum(a * a for a in query) ** 0.5
    if NUMPY and _np is not None:
        matrix = _np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), dims)
        dots = matrix.astype(_np.float64) @ _np.asarray(query, dtype=_np.float64)
        norm = _np.asarray(norms, dtype=_np.float64) * qnorm
        out = _np.zeros(len(vectors), dtype=_np.float64)
        _np.divide(dots, norm, out=out, where=norm > 0)
        return cast(list[float], out.tolist())
    unpack = struct.Struct(f"<{dims}f").unpack
    mul = operator.mul
    return [
        sum(map(mul, query, unpack(v))) / (qnorm * n) if qnorm > 0 and n > 0 else 0.0
        for v, n in zip(vectors, norms, strict=True)
    ]


def rank(
    query: Sequence[float], dims: int, candidates: list[Candidate], offset: int, limit: int
) -> list[tuple[float | None, Candidate]]:
    """InMemoryStore's pick: the ``offset``..``offset + limit`` best (by an item's best field, ties in
    candidate order), then scoreless candidates up to ``limit`` in all."""
    owners: list[int] = []
    vectors: list[bytes] = []
    norms: list[float] = []
    scoreless: list[int] = []
    for i, c in enumerate(candidates):
        for raw, norm in c.vectors:
            owners.append(i)
            vectors.append(raw)
            norms.append(norm)
        if not c.vectors:
            scoreless.append(i)
    scores = _scores(query, vectors, norms, dims) if vectors else []
    _, kept = top(scores, owners, scoreless, offset, limit)
    return [(score, candidates[i]) for score, i in kept]


def top(
    scores: Sequence[float],
    owners: Sequence[int],
    scoreless: Sequence[int],
    offset: int,
    limit: int,
    order: Sequence[int] | None = None,
) -> tuple[list[int], list[tuple[float | None, int]]]:
    """InMemoryStore's pick of candidates by their vectors' ``scores`` (``owners``: each vector's
    candidate): the candidates ranked before ``offset``, and the ``offset``..``offset + limit`` best
    (score, candidate), by a candidate's best vector, ties in vector order; then the ``scoreless``
    candidates up to ``limit`` in all. ``order``: the vectors best first, where the caller sorted them."""
    if order is None:
        # sorted(..., reverse=True) is stable: equal scores keep their order, as InMemoryStore's sort.
        order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
    seen: set[int] = set()
    before: list[int] = []
    kept: list[tuple[float | None, int]] = []
    for j in order:
        owner = owners[j]
        if owner in seen:
            continue
        ix = len(seen)
        seen.add(owner)
        if ix >= offset + limit:
            break
        if ix >= offset:
            kept.append((scores[j], owner))
        else:
            before.append(owner)
    if scoreless and len(kept) < limit:
        kept.extend((None, c) for c in scoreless[: limit - len(kept)])
    return before, kept
