"""A replica session's connection to one storage node (coordinator side).

Requests are queued synchronously and sent in queue order by one sender task, so a
coordinator can pipeline APPENDs to a node without awaiting each reply and still know
they arrive in LSN order. Replies are matched by request id. Any failure (connection
lost, bad frame, reply timeout) kills the whole connection and fails every call still
outstanding: a half-working connection could otherwise ack out of order.

No sockets here: ``connect(address)`` returns any trio stream (TCP, or a simulated
network in tests); timeouts use trio's clock, so they run on a MockClock in simulations.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from sediment.errors import ReplicaUnavailable
from sediment.wal.replication import wire
from sediment.wal.replication.wire import MsgType, Request, Response

Connect = Callable[[str], Awaitable[trio.abc.Stream]]


async def tcp_connect(address: str) -> trio.abc.Stream:
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    stream.setsockopt(6, 1, 1)  # TCP_NODELAY: replies are small and latency-bound
    return stream


@dataclass(slots=True, eq=False)
class Call:
    """One request in flight; ``on_reply`` (if given) runs in the receiver task."""

    on_reply: Callable[[Call], None] | None
    done: trio.Event = field(default_factory=trio.Event)
    response: Response | None = None
    error: BaseException | None = None

    def _finish(self) -> None:
        self.done.set()
        if self.on_reply is not None:
            self.on_reply(self)


class ReplicaConnection:
    """One live connection to a storage node for one partition and session."""

    _ids = itertools.count(1)

    def __init__(self, address: str, stream: trio.abc.Stream, cluster_key: uuid.UUID, partition: int,
                 timeout: float) -> None:
        self.address = address
        self.stream = stream
        self.cluster_key = cluster_key
        self.partition = partition
        self.timeout = timeout
        self.dead: str = ""
        self._outbox: list[bytes] = []
        self._sending = False
        # A socket is written at once when nothing is queued ahead (no task switch per request).
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._wake = trio.Event()
        self._calls: dict[int, Call] = {}
        self._scope = trio.CancelScope()

    @classmethod
    async def open(cls, nursery: trio.Nursery, address: str, connect: Connect, cluster_key: uuid.UUID,
                   partition: int, timeout: float) -> ReplicaConnection:
        with trio.move_on_after(timeout):
            stream = await connect(address)
            conn = cls(address, stream, cluster_key, partition, timeout)
            nursery.start_soon(conn._run)
            return conn
        raise ReplicaUnavailable(f"storage node {address} did not accept a connection within {timeout}s")

    def request(self, msg_type: MsgType, session: int, arg1: int = 0, arg2: int = 0, payload: bytes = b"",
                on_reply: Callable[[Call], None] | None = None) -> Call:
        """Queue a request now (queue order is send order); the reply arrives on the Call."""
        call = Call(on_reply)
        if self.dead:
            call.error = ReplicaUnavailable(self.dead)
            call._finish()
            return call
        rid = next(self._ids)
        self._calls[rid] = call
        data = wire.encode_request(Request(msg_type, rid, self.cluster_key, self.partition, session, arg1, arg2,
                                           payload))
        if self._fd >= 0 and not self._outbox and not self._sending:
            try:
                data = data[os.write(self._fd, data):]
            except BlockingIOError:
                pass
            except OSError as exc:
                self.kill(f"connection to storage node {self.address} failed: {exc}")
                return call
            if not data:
                return call
        self._outbox.append(data)
        self._wake.set()
        return call

    async def call(self, msg_type: MsgType, session: int, arg1: int = 0, arg2: int = 0,
                   payload: bytes = b"") -> Response:
        """Request and await the reply; ReplicaUnavailable when the connection fails or times out."""
        c = self.request(msg_type, session, arg1, arg2, payload)
        with trio.move_on_after(self.timeout):
            await c.done.wait()
        if not c.done.is_set():
            self.kill(f"storage node {self.address} did not reply to {msg_type.name} within {self.timeout}s")
        if c.error is not None:
            raise c.error
        assert c.response is not None
        return c.response

    def kill(self, why: str) -> None:
        """Fail every outstanding call and drop the connection."""
        if self.dead:
            return
        self.dead = why
        self._fd = -1
        self._scope.cancel()
        calls, self._calls = self._calls, {}
        for c in calls.values():
            c.error = ReplicaUnavailable(why)
            c._finish()

    async def _run(self) -> None:
        with self._scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._sender)
                    await self._receiver()
                    raise ReplicaUnavailable(f"storage node {self.address} closed the connection")
            except* Exception as group:  # any failure ends the connection; a Cancelled (kill, or an
                # outer scope) travels on, so a send error beside it cannot escape this task
                self.kill(f"connection to storage node {self.address} failed: {first_leaf(group)}")
        self.kill(self.dead or f"connection to storage node {self.address} closed")
        await trio.aclose_forcefully(self.stream)

    async def _sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            out, self._outbox = self._outbox, []
            if out:
                self._sending = True
                await self.stream.send_all(b"".join(out))
                self._sending = False

    async def _receiver(self) -> None:
        reader = wire.FrameReader(self.stream)
        while True:
            msg = await reader.next()
            if msg is None:
                return
            if not isinstance(msg, Response):
                raise wire.WireError(f"storage node {self.address} sent a request frame")
            call = self._calls.pop(msg.request_id, None)
            if call is not None:
                call.response = msg
                call._finish()


def first_leaf(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (trio nurseries wrap what their tasks raise)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
