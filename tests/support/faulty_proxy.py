"""A fault-injecting HTTP proxy for S3 tests: real sockets on 127.0.0.1, in front of moto.

It forwards every request to the upstream endpoint unchanged, except the ones it has
been told to sabotage: answer with a 5xx, stall without answering, forward but lose the
answer, cut the response body short, or hold a request until the test releases it.
Faults apply to the next N requests that match an optional predicate, so a test can,
say, fail only multipart part uploads.

moto checks a conditional write's condition and then writes without a lock, so two
racing ``If-None-Match: *`` PUTs can both win there. With ``serialize_conditional`` the
proxy forwards conditional requests (``If-None-Match`` / ``If-Match``) one at a time per
object, as S3 does, so race tests through it are meaningful. ``delay`` adds that many
seconds to every request (S3's latency, for bench/s3_wal.py). ``window`` sabotages every
request for a while instead of the next N (an outage, for bench/nemesis_s3.py).
"""

from __future__ import annotations

import http.client
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Match = Callable[[str, str], bool]
"""Predicate on (method, path-with-query) choosing which requests a fault applies to."""

HOLD_LIMIT = 60.0  # seconds a held request waits for its release at most
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}
_S3_CODES = {500: "InternalError", 502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


@dataclass
class _Fault:
    kind: str
    remaining: int
    match: Match | None
    status: int = 503
    code: str = ""
    seconds: float = 0.0
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    answer: int = 0  # a hold's status to answer with instead of forwarding (0: forward)


@dataclass
class Hold:
    """A held request: ``reached`` is set when it arrives at the proxy; set ``release`` to forward it,
    or call :meth:`fail` to answer it with an S3 error instead."""

    reached: threading.Event
    release: threading.Event
    fault: _Fault

    def fail(self, status: int, code: str) -> None:
        """Answer the held requests with ``status`` and S3 error ``code`` (``404``, ``NoSuchKey``:
        the object is gone, as if deleted while the request was held), without forwarding."""
        self.fault.answer, self.fault.code = status, code
        self.release.set()


@dataclass
class ProxyLog:
    """What the proxy saw: every request, and the ones it sabotaged, as (method, path, fault kind)."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    faults: list[tuple[str, str, str]] = field(default_factory=list)


class FaultyProxy:
    """Threaded HTTP/1.1 proxy on 127.0.0.1 with scripted faults. Use as a context manager or call close()."""

    def __init__(self, upstream: str, serialize_conditional: bool = False, delay: float = 0.0) -> None:
        target = urlsplit(upstream)
        if target.scheme != "http" or not target.hostname or not target.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host: str = target.hostname
        self.upstream_port: int = target.port
        self.log = ProxyLog()
        self._faults: list[_Fault] = []
        self._windows: list[tuple[str, float, int]] = []  # (kind, monotonic end, status)
        self._window_count = 0
        self._lock = threading.Lock()
        self.serialize_conditional = serialize_conditional
        self.delay = delay  # seconds added to every request (S3's latency, for benchmarks)
        self._key_locks: dict[str, threading.Lock] = {}
        self._release = threading.Event()
        self._sockets: set[socket.socket] = set()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = False
        self._server.block_on_close = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="faulty-proxy", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- scripting faults -------------------------------------------------------------------

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def fail_next(self, n: int, status: int = 503, match: Match | None = None, code: str = "") -> None:
        """Answer the next ``n`` matching requests with ``status`` and an S3 XML error, without forwarding."""
        code = code or _S3_CODES.get(status, "InternalError")
        self._add(_Fault("fail", n, match, status=status, code=code))

    def stall_next(self, n: int, seconds: float = 5.0, match: Match | None = None) -> None:
        """Hold the next ``n`` matching requests for ``seconds`` (or until close); never forward or answer."""
        self._add(_Fault("stall", n, match, seconds=seconds))

    def drop_response_next(self, n: int, match: Match | None = None) -> None:
        """Forward the next ``n`` matching requests, then close the connection instead of answering."""
        self._add(_Fault("drop", n, match))

    def truncate_body_next(self, n: int, match: Match | None = None) -> None:
        """Forward, then send the full headers but only half the body before closing the connection."""
        self._add(_Fault("truncate", n, match))

    def hold_next(self, n: int = 1, match: Match | None = None) -> Hold:
        """Hold the next ``n`` matching requests until ``release`` is set, then forward them normally.

        A writer can so be stalled between reading and writing while others go on; the
        client's read timeout must outlast the hold, or botocore resends the request.
        """
        fault = _Fault("hold", n, match)
        self._add(fault)
        return Hold(fault.reached, fault.release, fault)

    def window(self, kind: str, seconds: float, status: int = 503) -> None:
        """For the next ``seconds``, every request: ``stall`` (held unanswered until the window
        ends, then its connection closed), ``reset`` (its connection reset: every other one
        before it is forwarded, the others after, their answer lost) or ``fail`` (answered
        ``status`` with an S3 error, not forwarded)."""
        if kind not in ("stall", "reset", "fail"):
            raise ValueError(f"window kind must be stall, reset or fail, not {kind!r}")
        with self._lock:
            self._windows.append((kind, time.monotonic() + seconds, status))

    def key_lock(self, path: str) -> threading.Lock:
        """The lock conditional requests on the object at ``path`` (no query) are forwarded under."""
        with self._lock:
            return self._key_locks.setdefault(path, threading.Lock())

    def pending(self) -> int:
        """Faults scripted but not yet triggered."""
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def clear(self) -> None:
        """Drop the faults not yet triggered and end every window."""
        with self._lock:
            self._faults.clear()
            self._windows.clear()

    def _take(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            self.log.requests.append((method, path))
            now = time.monotonic()
            self._windows = [w for w in self._windows if w[1] > now]
            if self._windows:
                kind, end, status = self._windows[0]
                self._window_count += 1
                if kind == "reset" and self._window_count % 2:
                    kind = "reset_after"
                self.log.faults.append((method, path, kind))
                return _Fault(kind, 0, None, status=status, code=_S3_CODES.get(status, "InternalError"),
                              seconds=end - now)
            for fault in self._faults:
                if fault.remaining > 0 and (fault.match is None or fault.match(method, path)):
                    fault.remaining -= 1
                    self.log.faults.append((method, path, fault.kind))
                    return fault
            return None

    # --- lifecycle --------------------------------------------------------------------------

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._sockets.add if add else self._sockets.discard)(sock)

    def close(self) -> None:
        """Stop serving, release stalled handlers, cut idle keep-alive connections, join every thread."""
        self._release.set()
        with self._lock:
            for fault in self._faults:
                fault.release.set()
        self._server.shutdown()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that reset its connection (a coordinator killed mid-request) is no error of the proxy's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultyProxy

    def setup(self) -> None:
        super().setup()
        self.owner._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.owner._track(self.connection, False)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._read_body()
        if self.owner.delay:
            time.sleep(self.owner.delay)
        fault = self.owner._take(self.command, self.path)
        if fault is not None and fault.kind == "fail":
            self._send_error(fault)
            return
        if fault is not None and fault.kind == "stall":
            self.owner._release.wait(fault.seconds)
            self.close_connection = True
            return
        if fault is not None and fault.kind == "reset":
            self._reset()
            return
        if fault is not None and fault.kind == "hold":
            fault.reached.set()
            fault.release.wait(HOLD_LIMIT)  # bounded: a test that fails while holding cannot hang the proxy
            if fault.answer:
                self._send_error(fault, fault.answer)
                return
        status, reason, headers, payload = self._forward_in_order(body)
        if fault is not None and fault.kind == "drop":
            self.close_connection = True
            return
        if fault is not None and fault.kind == "reset_after":
            self._reset()
            return
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", len(payload)))
        self.send_header("Content-Length", str(length if self.command == "HEAD" else len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault is not None and fault.kind == "truncate":
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(payload)

    def _reset(self) -> None:
        """Close the connection with a TCP reset (SO_LINGER 0), as a dead peer or middlebox does."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _forward_in_order(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conditional = "If-None-Match" in self.headers or "If-Match" in self.headers
        if not (conditional and self.owner.serialize_conditional):
            return self._forward(body)
        with self.owner.key_lock(self.path.split("?", 1)[0]):
            return self._forward(body)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.owner.upstream_host, self.owner.upstream_port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            return response.status, response.reason, response.getheaders(), payload
        finally:
            conn.close()

    def _send_error(self, fault: _Fault, status: int = 0) -> None:
        payload = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{fault.code}</Code><Message>injected by the faulty proxy</Message>"
            "<RequestId>faulty-proxy</RequestId></Error>"
        ).encode()
        self.send_response_only(status or fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
