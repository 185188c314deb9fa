"""A small TCP proxy that injects network faults between Redis clients and a server.

Modes (switch at any time with ``set_mode``):

``pass``
    bytes flow both ways untouched.
``reset``
    every live connection is reset (RST, not FIN) and new ones are accepted
    and reset at once: the client sees ``ConnectionError``.
``blackhole``
    connections stay open but nothing is forwarded either way: the client
    sees ``TimeoutError``. Leaving the mode resets the connections that were
    blackholed (as a healed partition whose TCP sessions timed out would).
``delay``
    every chunk is forwarded ``delay_s`` late, in order.

Per source address, whatever the mode: ``isolate_source(ip)`` blackholes every
connection, live or new, whose peer address is ``ip`` (a process that binds its
outgoing sockets to its own loopback address, e.g. ``redis-server
--bind-source-addr 127.0.0.12``, is told apart from the others that way);
``heal_source(ip)`` forwards again and resets the connections that were
blackholed, as leaving ``blackhole`` does.

And one targeted fault, the one that makes retries dangerous:
``lose_next_reply(match)`` lets the next request containing ``match`` reach
the server, waits until the server's reply arrives, then throws the reply
away and resets the client's connection. The write *has applied*; the
client only sees a connection error.

Everything runs in daemon threads of the calling process; ``stats`` counts
what happened (connections, resets, replies lost, requests seen by pattern)
so a test can assert that each fault really fired.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

__all__ = ["MODES", "FaultProxy"]

MODES = ("pass", "reset", "blackhole", "delay")
_CHUNK = 65536


def _rst(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset.

    SO_LINGER 0 turns the final close into a RST; SHUT_RD first wakes the pump
    thread blocked in ``recv`` on it (it holds the socket open until it returns),
    without sending a FIN.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class _Conn:
    def __init__(self, client: socket.socket, server: socket.socket, source: str = "") -> None:
        self.client = client
        self.server = server
        self.source = source
        self.lose_reply = False
        self.then: Callable[[], object] | None = None
        self.blackholed = False
        self.closed = False
        self.lock = threading.Lock()

    def kill(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        _rst(self.client)
        _rst(self.server)


class FaultProxy:
    """Listens on 127.0.0.1:``port`` and forwards to ``target_host``:``target_port``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(256)
        self.port: int = self._listener.getsockname()[1]
        self.mode = "pass"
        self.delay_s = 0.0
        self.stats: Counter[str] = Counter()
        self._watch: dict[bytes, int] = {}
        self._lose: list[tuple[bytes | None, Callable[[], object] | None]] = []
        self._conns: set[_Conn] = set()
        self._isolated: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    # ---- control ----------------------------------------------------------

    def set_mode(self, mode: str, *, delay_s: float | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        with self._lock:
            previous, self.mode = self.mode, mode
            if delay_s is not None:
                self.delay_s = delay_s
            conns = list(self._conns)
        self.stats[f"mode_{mode}"] += 1
        if mode == "reset":
            for c in conns:
                self._kill(c, "reset")
        elif previous == "blackhole" and mode != "blackhole":
            for c in conns:
                if c.blackholed:
                    self._kill(c, "reset_after_blackhole")

    def isolate_source(self, ip: str) -> None:
        """Forward nothing, either way, on connections from ``ip`` (live and new) until ``heal_source``."""
        with self._lock:
            self._isolated.add(ip)
        self.stats["isolate_source"] += 1

    def heal_source(self, ip: str) -> None:
        """Forward ``ip``'s connections again; those that were blackholed are reset (their peers reconnect)."""
        with self._lock:
            self._isolated.discard(ip)
            conns = [c for c in self._conns if c.source == ip and c.blackholed]
        for c in conns:
            self._kill(c, "reset_after_isolation")

    @contextlib.contextmanager
    def fault(self, mode: str, *, delay_s: float | None = None) -> Iterator[FaultProxy]:
        """``with proxy.fault("blackhole"): ...`` then back to ``pass``."""
        self.set_mode(mode, delay_s=delay_s)
        try:
            yield self
        finally:
            self.set_mode("pass")

    def lose_next_reply(self, match: bytes | None = None, *, then: Callable[[], object] | None = None) -> None:
        """Arm: the next request containing ``match`` (any, if None) is applied and its reply lost.

        ``then`` runs after the reply was thrown away and *before* the client's
        connection is reset: whatever it does happens between the write and the
        client's re-send (e.g. another worker claiming the task).
        """
        with self._lock:
            self._lose.append((match, then))

    @property
    def armed(self) -> int:
        with self._lock:
            return len(self._lose)

    def watch(self, pattern: bytes) -> None:
        """Count client chunks containing ``pattern`` into ``seen(pattern)``."""
        with self._lock:
            self._watch.setdefault(pattern, 0)

    def seen(self, pattern: bytes) -> int:
        with self._lock:
            return self._watch.get(pattern, 0)

    def reset_all(self) -> int:
        """Reset every live connection now (mode unchanged); returns how many."""
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            self._kill(c, "reset")
        return len(conns)

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.kill()
        self._thread.join(2)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- machinery ----------------------------------------------------------

    def _kill(self, conn: _Conn, why: str) -> None:
        if not conn.closed:
            self.stats[why] += 1
        conn.kill()
        with self._lock:
            self._conns.discard(conn)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, peer = self._listener.accept()
            except OSError:
                return
            self.stats["connections"] += 1
            if self.mode == "reset":
                self.stats["reset"] += 1
                _rst(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=2)
                server.settimeout(None)
            except OSError:
                self.stats["upstream_refused"] += 1
                _rst(client)
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, server, str(peer[0]))
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._upstream, args=(conn,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(conn,), daemon=True).start()

    def _gate(self, conn: _Conn) -> bool:
        """Apply the current mode to a chunk: True to forward it."""
        mode, delay = self.mode, self.delay_s
        if mode == "blackhole" or conn.source in self._isolated:
            conn.blackholed = True
            self.stats["chunks_blackholed"] += 1
            return False
        if mode == "delay" and delay > 0:
            self.stats["chunks_delayed"] += 1
            time.sleep(delay)
        return True

    def _upstream(self, conn: _Conn) -> None:
        """Client to server."""
        try:
            while True:
                data = conn.client.recv(_CHUNK)
                if not data:
                    break
                with self._lock:
                    for pattern in self._watch:
                        if pattern in data:
                            self._watch[pattern] += 1
                    for i, (match, then) in enumerate(self._lose):
                        if match is None or match in data:
                            del self._lose[i]
                            conn.lose_reply, conn.then = True, then
                            break
                if not self._gate(conn):
                    continue
                conn.server.sendall(data)
        except OSError:
            pass
        finally:
            self._kill(conn, "closed_by_client")

    def _downstream(self, conn: _Conn) -> None:
        """Server to client."""
        try:
            while True:
                data = conn.server.recv(_CHUNK)
                if not data:
                    break
                if conn.lose_reply:
                    conn.lose_reply = False
                    if conn.then is not None:
                        try:
                            conn.then()
                        except Exception:
                            self.stats["then_failed"] += 1
                    self._kill(conn, "replies_lost")
                    return
                if not self._gate(conn):
                    continue
                conn.client.sendall(data)
        except OSError:
            pass
        finally:
            self._kill(conn, "closed_by_server")
