"""Pipelined appends: one client keeps several appends in flight on one append stream.

Why: a client's ``append`` is durable on return, so a client with one thread has one append
in flight, and each append waits for a whole round trip (its encoding, the network both ways,
the server's decode, the acknowledgement) beside the group commit it joins. On 2 cores shared
with the server that round trip is about as long as the group commit itself, so a served
client fed the group commit half as often as a thread in the server's process. Here the
client sends the next appends while the earlier ones are being made durable, on a stream
that asks the server to queue them (``"queue": true``): the server queues each plain append
on the log as it reads it, so one stream's appends share group commits, and acknowledges
them in order once durable (sediment/net/append_stream.py).

The promise per append is the one of ``Client.append``: all or nothing, and applied in the
order sent (the server queues a stream's appends on the log in the order it reads them). What changes is when
the caller hears of the outcome: :meth:`PipelinedAppends.append` returns once the append is
sent; a refused append's typed error is raised by a later call (the ``append`` that needs its
room in the window, after sending its own table; ``flush`` or ``close``, after collecting
every other acknowledgement), and the appends sent after it are still applied.
``flush`` returns once every append sent is durable. If the stream breaks with appends not
yet acknowledged, their outcome is unknown, as with a broken ``append``
(:class:`~sediment.errors.OutcomeUnknown` says how many); if the server ended the stream
cleanly (it stops: an OK status), the ones it did not acknowledge were not applied and are sent again, in
order, through ``Client.append``; if that is refused too (a stopping server refuses it),
the error is raised and the appends not yet answered were not applied. ``sent`` counts the
appends sent, ``acknowledged`` those the server answered (applied, or refused with their
error raised): after an error that ends the stream, the ``sent - acknowledged`` last ones
were not applied, or for ``OutcomeUnknown`` are in doubt.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager

import pyarrow as pa
import pyarrow.flight as flight

from sediment.errors import CallCancelled, InvalidArgument, OutcomeUnknown
from sediment.net.append_stream import PLAIN, AppendStream, append_batches

WINDOW = 8  # appends in flight per stream by default


class PipelinedAppends:
    """Plain appends to one relation with up to ``window`` in flight; made by
    ``Client.pipelined``. Not thread-safe (one per thread); close it (or use it as a context
    manager) to wait for the last acknowledgements and give the stream back."""

    def __init__(self, name: str, window: int, chunk_bytes: int, *,
                 take: Callable[[str, pa.Schema], tuple[AppendStream, bool]], give: Callable[[AppendStream], None],
                 resend: Callable[[pa.Table], None],
                 remote: Callable[[], AbstractContextManager[None]]) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise InvalidArgument(f"window must be a whole number of appends >= 1, not {window!r}")
        self.name = name
        self._window = window
        self._chunk = chunk_bytes
        self._take, self._give, self._resend, self._remote = take, give, resend, remote
        self._stream: AppendStream | None = None
        self._flight: deque[pa.Table] = deque()  # sent, not yet acknowledged, oldest first
        self.sent = 0
        self.acknowledged = 0

    def append(self, table: pa.Table) -> None:
        """Send ``table`` (columns plus ``time`` and ``diff``); returns once it is sent, after
        collecting the oldest acknowledgement when the window is full. If that (earlier) append
        was refused, its typed error is raised after ``table`` has been sent: the call that
        raises an earlier append's refusal still sends its own table (``sent`` counts it)."""
        with self._remote():
            refused = None
            stream = self._stream
            if stream is not None and stream.key[1] != table.schema:
                refused = self._settled(self._drain)
                if self._stream is not None:
                    self._give(self._stream)
                self._stream = stream = None
            if stream is None:
                stream, _fresh = self._take(self.name, table.schema)
                self._stream = stream
            if len(self._flight) >= self._window:
                later = self._settled(self._collect)  # always collect: the window needs the room
                refused = refused or later
                stream = self._stream
                if stream is None:  # the server ended the stream: the rest went through append
                    self._resend(table)
                    self.sent += 1
                    self.acknowledged += 1
                    self._raise(refused)
                    return
            self._flight.append(table)
            self.sent += 1
            if not stream.send(append_batches(table, self._chunk), PLAIN):
                later = self._settled(self._drain)  # the acknowledgements up to the end say what the server took
                refused = refused or later
            self._raise(refused)

    def flush(self) -> None:
        """Wait until every append sent is durable (raising the first refusal's typed error)."""
        with self._remote():
            self._drain()

    def close(self) -> None:
        """Flush, then give the stream back to the client's pool."""
        try:
            self.flush()
        finally:
            stream, self._stream = self._stream, None
            if stream is not None and not self._flight:
                self._give(stream)
            elif stream is not None:
                stream.close()

    def _drain(self) -> None:
        """Collect every acknowledgement; the first refusal is raised once all are in (so that
        ``sent - acknowledged`` stays exactly the appends whose outcome is not known)."""
        refused = None
        while self._flight:
            left = len(self._flight)
            later = self._settled(self._collect)  # every one, even after a refusal
            if later is not None and len(self._flight) >= left:
                raise later  # not an answer to an append: collecting again would not end
            refused = refused or later
        self._raise(refused)

    @staticmethod
    def _settled(step: Callable[[], None]) -> Exception | None:
        """Run ``step``; a refusal it raises is returned instead (a broken stream still raises)."""
        try:
            step()
        except OutcomeUnknown:
            raise
        except Exception as exc:  # noqa: BLE001 - a typed refusal, raised by the caller later
            return exc
        return None

    @staticmethod
    def _raise(refused: Exception | None) -> None:
        if refused is not None:
            raise refused

    def _collect(self) -> None:
        """Read the oldest acknowledgement; its refusal is raised here (the append is done with)."""
        stream = self._stream
        assert stream is not None
        try:
            done = stream.receive()
        except flight.FlightError as exc:
            raise self._broken() from exc
        except Exception:
            self._flight.popleft()
            self.acknowledged += 1
            raise
        if not done:
            self._ended()
            return
        self._flight.popleft()
        self.acknowledged += 1

    def _ended(self) -> None:
        """The server ended the stream cleanly: what it did not acknowledge was not applied."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        pending, self._flight = list(self._flight), deque()
        for table in pending:
            self._resend(table)
            self.acknowledged += 1

    def _broken(self) -> OutcomeUnknown:
        """The stream broke (or the client's close cancelled it: CallCancelled): forget the
        appends in flight, and the error that says so."""
        stream, self._stream = self._stream, None
        lost = len(self._flight)
        self._flight.clear()
        if stream is not None:
            stream.close()
            if stream.cancelled:
                return CallCancelled(f"the client was closed with {lost} appends to {self.name!r} sent and not "
                                     "acknowledged: they may or may not be applied; read the relation to find out, "
                                     "or use keyed appends (append_once) to retry safely")
        return OutcomeUnknown(f"the append stream to {self.name!r} broke with {lost} appends sent and not "
                             "acknowledged: they may or may not be applied; read the relation to find out, or "
                             "use keyed appends (append_once) to retry safely")

    def __enter__(self) -> PipelinedAppends:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
