"""A TCP proxy on 127.0.0.1 that loses answers, for gRPC tests: real sockets, bytes passed on
unchanged until a test arms it.

Armed with a marker (bytes of the request it waits for, such as a Flight action's type),
the proxy keeps forwarding the client's bytes, but once a connection's client-to-server
bytes have contained the marker, it withholds every later byte the server sends on that
connection. The request reaches the server, which carries it out and answers into the
void; ``cut()`` (or the server's death) then closes the connection, and the client sees a
call that broke after its request went out: an outcome it cannot know.
"""

from __future__ import annotations

import socket
import threading


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.holding = False
        self.tail = b""

    def close(self) -> None:
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class CutProxy:
    """See the module doc. ``uri`` is where clients connect; set ``upstream`` ("HOST:PORT" or
    "grpc://HOST:PORT") before the first connection."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"grpc://127.0.0.1:{self._listener.getsockname()[1]}"
        self.upstream: str | None = None
        self.triggered = threading.Event()
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self._closed = False
        threading.Thread(target=self._accept, name="cut-proxy", daemon=True).start()

    def arm(self, marker: bytes) -> None:
        """Hold the answers on the next connection whose request bytes contain ``marker``."""
        with self._lock:
            self._marker = marker
            self.triggered.clear()

    def cut(self) -> None:
        """Close every open connection (new ones are forwarded again)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            host, _, port = (self.upstream or "").removeprefix("grpc://").rpartition(":")
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
                upstream.settimeout(None)
            except (OSError, ValueError):
                client.close()  # the server is gone: the client sees a refused call
                continue
            conn = _Conn(client, upstream)
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._pump, args=(conn, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(conn, False), daemon=True).start()

    def _pump(self, conn: _Conn, to_server: bool) -> None:
        src, dst = (conn.client, conn.upstream) if to_server else (conn.upstream, conn.client)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if to_server:
                    self._watch(conn, data)
                elif conn.holding:
                    continue  # the answer is lost
                dst.sendall(data)
        except OSError:
            pass
        conn.close()

    def _watch(self, conn: _Conn, data: bytes) -> None:
        with self._lock:
            marker = self._marker
            if marker is not None and marker in conn.tail + data:
                conn.holding, self._marker = True, None
                self.triggered.set()
            conn.tail = (conn.tail + data)[-64:]
