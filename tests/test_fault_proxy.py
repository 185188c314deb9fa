"""``FaultProxy.isolate_source``: one peer address cut off, the others untouched.

The cluster split-brain nemesis (``test_failover_chaos.ClusterSplitFleet``) relies on it: every
node opens its bus links from its own loopback address, and the proxies in front of the other
nodes drop what comes from the victim's. Checked here against a plain echo server.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Iterator

import pytest
from faults import FaultProxy


@pytest.fixture
def echo() -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the proxy resets its upstream side on healing
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield int(listener.getsockname()[1])
    listener.close()


def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=0.5, source_address=(source, 0))


def _echoes(s: socket.socket, payload: bytes) -> bool:
    s.sendall(payload)
    try:
        return s.recv(4096) == payload
    except TimeoutError:
        return False


def test_isolate_source_cuts_only_that_address_both_live_and_new_connections(echo: int) -> None:
    victim = f"127.{random.randint(2, 254)}.{random.randint(0, 254)}.11"  # all of 127/8 is loopback on Linux
    with FaultProxy(echo) as proxy:
        live, other = _connect(proxy.port, victim), _connect(proxy.port, "127.0.0.1")
        assert _echoes(live, b"before") and _echoes(other, b"before")

        proxy.isolate_source(victim)
        fresh = _connect(proxy.port, victim)
        assert not _echoes(live, b"cut")  # a live connection goes silent
        assert not _echoes(fresh, b"cut")  # and so does a new one (accepted, then nothing forwarded)
        assert _echoes(other, b"still there")  # another source is untouched
        assert proxy.stats["chunks_blackholed"] >= 2

        proxy.heal_source(victim)
        # The blackholed connections are reset, as a healed partition's timed-out sessions would be.
        for s in (live, fresh):
            with pytest.raises(OSError):
                s.sendall(b"x")
                if not s.recv(4096):
                    raise ConnectionResetError("closed")
        assert proxy.stats["reset_after_isolation"] == 2
        again = _connect(proxy.port, victim)
        assert _echoes(again, b"healed")
        assert _echoes(other, b"untouched")
        for s in (live, fresh, other, again):
            s.close()
