"""A client's blocking calls, which its ``close()`` ends.

Why: Arrow's gRPC transport cannot cancel the calls under way (``FlightClient.close()``
does nothing to them), and a Flight call without a deadline to a server that stopped
answering (paused, cut off behind a firewall that drops packets) never returns. A client
closed by one thread must not leave its other threads blocked for good. So each blocking
call runs on a worker thread, and its caller waits for either the answer or the client's
close: closing raises :class:`~sediment.errors.CallCancelled` in every waiting caller at
once (the request may have reached the server: its outcome is unknown), and cancels the
open do_get readers (a snapshot or replay still streaming). A worker left in a call ends
when gRPC does (the server answers, dies, or the deadline passes); its answer is dropped.

The gate carries actions, do_get calls, do_put stage calls and appends over 1 MiB. A thread
hop costs tens of microseconds, a tenth or less of such a call's round trip, but about two
context switches per call, as many as a plain append on a pooled append stream costs in all
(tests/net/test_grpc_setup.py): smaller appends therefore wait on the caller's own thread,
and the close ends them by cancelling their streams, which are exchanges
(sediment/net/append_stream.py); a larger one may wait in a write that gRPC's flow control
holds, which no cancel ends, so it waits here. The
workers are daemon threads of the gate's own, not ``concurrent.futures``' (whose exit hook
joins its workers: a process would not exit while one waits on a paused server).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, wait
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

from sediment.errors import CallCancelled, EngineClosed
from sediment.interrupts import wait_slices

T = TypeVar("T")

WORKER_IDLE_SECONDS = 30.0  # a worker with no call this long ends


class CallGate:
    """Runs a client's calls (:meth:`run`) so that :meth:`close` can end their waits."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: set[Future[Any]] = set()
        self._readers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._workers = Workers()

    def run(self, call: Callable[[], T]) -> T:
        """``call()``'s result or error, carried out on a worker thread; CallCancelled when
        the client closes first, EngineClosed when it was closed already."""
        answer: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise self.closed_error()
            self._waiting.add(answer)
        self._workers.submit(lambda: _carry_out(call, answer))
        try:
            for timeout in wait_slices(None):  # the main thread waits in slices: Ctrl-C ends the wait
                if wait([answer], timeout).done:
                    return answer.result()  # its own error raised, a TimeoutError included
            raise AssertionError("unreachable: wait_slices(None) never ends")
        finally:
            with self._lock:
                self._waiting.discard(answer)

    def track(self, reader: Any) -> Any:
        """Cancel ``reader`` (a do_get stream, with ``cancel()``) when the client closes; it, as is."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._readers.add(reader)
        if closed:
            reader.cancel()
        return reader

    def close(self) -> None:
        """End every wait under way with CallCancelled and cancel the tracked readers; later
        calls raise EngineClosed. Returns at once: workers still in a call end with it."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), set()
            readers = list(self._readers)
        self._workers.close()
        for answer in waiting:
            try:
                answer.set_exception(CallCancelled(
                    f"the client of {self.uri} was closed while this call waited for the server's answer: it may "
                    "or may not have been carried out; connect again and read back before writing again"))
            except InvalidStateError:  # answered meanwhile
                pass
        for reader in readers:
            try:
                reader.cancel()
            except Exception:  # noqa: BLE001 - a reader that ended already
                pass

    def closed_error(self) -> EngineClosed:
        return EngineClosed(f"the client of {self.uri} is closed; connect again")


def _carry_out(call: Callable[[], T], answer: Future[T]) -> None:
    try:
        result = call()
    except BaseException as exc:  # noqa: BLE001 - handed to the caller
        try:
            answer.set_exception(exc)
        except InvalidStateError:  # the client closed meanwhile: nobody waits for it
            pass
        return
    try:
        answer.set_result(result)
    except InvalidStateError:
        pass


class Workers:
    """Daemon threads that run jobs, one each at a time; a new one starts when none is free,
    and one ends after :data:`WORKER_IDLE_SECONDS` without a job, or at once when it is free
    after :meth:`close` (a process that connects and closes clients often would otherwise
    hold every closed client's workers for that long)."""

    def __init__(self) -> None:
        self._jobs: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0  # workers waiting for a job that no submitted job has claimed
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            start = self._free == 0
            if not start:
                self._free -= 1
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._work, name="sediment-call", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=WORKER_IDLE_SECONDS)
            except Empty:
                with self._lock:
                    if self._free > 0:  # unclaimed: end (else a job is on its way to some worker)
                        self._free -= 1
                        return
                continue
            if job is None:  # close(): a free worker ends
                return
            job()
            with self._lock:
                if self._closed:
                    return
                self._free += 1

    def close(self) -> None:
        """End the free workers now, and each busy one once its job is done. A job submitted
        later still runs (on a worker that then ends)."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, 0
        for _ in range(free):
            self._jobs.put(None)
