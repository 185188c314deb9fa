"""Figure 5: payload size -- 1 KiB, 64 KiB and 1 MiB checkpoints; codec cost apart from round-trip cost.

Per size: a claim + commit cycle of a task whose shared_state encodes to that
many msgpack bytes (many small fields, like real agent state). A cycle
decodes the state once (claim reply) and encodes it once (commit), so the
codec cost per cycle is one ``encode`` + one ``decode`` of the checkpoint
body with the library's codec (msgpack), measured apart; the same for
``json`` shows what a JSON codec would cost instead. ``round trip`` is the
cycle minus the msgpack codec share. The transport floor is one EVALSHA
carrying the payload + one GET returning it, through redis-py.
"""

from __future__ import annotations

import functools
import json
import random
from typing import Any

from redis_agentstate import Checkpoint, CheckpointStore
from redis_agentstate.codec import decode, encode

from ._util import Settings, make_state, micro, summary, time_batch

SIZES = {"1 KiB": 1024, "64 KiB": 64 * 1024, "1 MiB": 1024 * 1024}


def run(settings: Settings) -> dict[str, Any]:
    client = settings.client()
    store = CheckpointStore(client, namespace=settings.ns("payload"))
    sizes = dict(list(SIZES.items())[:2]) if settings.quick else SIZES
    noop = client.script_load("return 0")
    rows = []
    cycles_by: dict[str, list[float]] = {k: [] for k in sizes}
    floor_by: dict[str, list[float]] = {k: [] for k in sizes}
    runners = {}
    for label, nbytes in sizes.items():
        state = make_state(nbytes)
        tid = f"payload-{nbytes}"
        store.delete(tid)
        store.create(Checkpoint(tid, shared_state=state))
        counter = [0]
        blob = encode([state, None, None], what="state")
        key = f"{settings.ns('payload')}:blob-{nbytes}"
        client.set(key, blob)

        def cycle(tid: str = tid, counter: list[int] = counter) -> None:
            counter[0] += 1
            cp = store.claim(tid, counter[0], token="w", lease_ms=30_000)
            assert cp is not None
            cp.cycle_index = counter[0]
            if not store.commit(cp, token="w", expected_revision=cp.revision):
                raise RuntimeError("commit fenced out")

        def floor(blob: bytes = blob, key: str = key) -> None:
            client.execute_command("EVALSHA", noop, 0, blob)
            client.get(key)

        n_cycles = max(3, int((20 if settings.quick else 200) * min(1.0, 65536 / nbytes)))
        runners[label] = (cycle, floor, n_cycles, state, blob)
        time_batch(cycle, 3)
    rng = random.Random(settings.seed + 5)
    for _ in range(settings.rounds if settings.quick else max(3, settings.rounds // 2)):
        order = list(sizes)
        rng.shuffle(order)
        for label in order:
            cycle, floor, n_cycles, _, _ = runners[label]
            cycles_by[label].append(time_batch(cycle, n_cycles)[0])
            floor_by[label].append(time_batch(floor, n_cycles)[0])
    for label, nbytes in sizes.items():
        _, _, n_cycles, state, blob = runners[label]
        body = [state, None, None]
        reps = max(3, n_cycles)
        text = json.dumps(body)
        enc = micro(functools.partial(encode, body, what="state"), reps)
        dec = micro(functools.partial(decode, blob, key="k"), reps)
        jenc = micro(functools.partial(json.dumps, body), reps)
        jdec = micro(functools.partial(json.loads, text), reps)
        cyc = summary(cycles_by[label], 1)
        rows.append(
            {
                "size": label,
                "msgpack_bytes": len(blob),
                "json_bytes": len(text.encode()),
                "cycle_us": cyc,
                "msgpack_codec_us": round(enc + dec, 1),
                "msgpack_encode_us": round(enc, 1),
                "msgpack_decode_us": round(dec, 1),
                "json_codec_us": round(jenc + jdec, 1),
                "round_trip_us": round(cyc["median"] - (enc + dec), 1),
                "transport_floor_us": summary(floor_by[label], 1),
                "codec_share": round((enc + dec) / cyc["median"], 3),
            }
        )
        store.delete(f"payload-{nbytes}")
        client.delete(f"{settings.ns('payload')}:blob-{nbytes}")
    client.close()
    return {
        "title": "Payload size: claim + commit of 1 KiB / 64 KiB / 1 MiB shared_state; codec apart from round trip",
        "unit": "us per cycle",
        "rows": rows,
    }
