"""A storage node connection's outgoing replies (see :class:`Replies`): kept apart from the
node's request handling in storage_node.py, as it is the one part that several threads share."""

from __future__ import annotations

import os
import threading
from contextlib import suppress

import trio

from sediment.wal.replication import wire
from sediment.wal.replication.wire import Response


class Replies:
    """One connection's outgoing replies, put by the trio thread or a partition's writer thread.

    A reply is written to the socket there and then when nothing is queued or being sent
    ahead of it: no task switch, and from a writer thread no trip through the trio thread
    either. Otherwise (the socket buffer is full, a send is in progress, or the stream is
    not a socket) it is queued and the sender task writes everything queued with one
    send_all. The lock makes the two exclusive, so frames never interleave, and keeps a
    writer thread off the file descriptor once the connection is closed (its number could
    be reused). A write error is left to send_all to raise: that ends the connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._queued: list[bytes] = []
        self._sending = False
        self._closed = False
        self._ended = False  # the peer sent its last request
        self._wake = trio.Event()
        self.received = 0  # requests received (trio thread)
        self._replied = 0

    def put(self, resp: Response) -> None:
        data = wire.encode_response(resp)
        with self._lock:
            self._replied += 1
            if self._closed:
                return
            if self._fd >= 0 and not self._queued and not self._sending:
                try:
                    sent = os.write(self._fd, data)
                except OSError:  # full, or broken: send_all waits, or reports it
                    sent = 0
                if sent == len(data) and not (self._ended and self._replied == self.received):
                    return
                data = data[sent:]
            if data:
                self._queued.append(data)
        if threading.get_ident() == self._trio_thread:
            self._wake_sender()
        else:
            with suppress(trio.RunFinishedError):  # the node stopped: nobody is left to send to
                self._token.run_sync_soon(self._wake_sender, idempotent=True)

    def _wake_sender(self) -> None:
        self._wake.set()

    def end_of_requests(self) -> None:
        """The peer sent everything it will: the sender stops once every reply is out."""
        self._ended = True
        self._wake.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True

    async def sender(self) -> None:
        while True:
            with self._lock:
                data = b"".join(self._queued) if self._queued else b""
                self._queued = []
                self._sending = bool(data)
                finished = not data and self._ended and self._replied == self.received
                if not data and not finished:
                    self._wake = trio.Event()
            if data:
                await self.stream.send_all(data)
            elif finished:
                return
            else:
                await self._wake.wait()
