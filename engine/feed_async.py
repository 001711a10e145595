"""Feeds read from asyncio: one event loop serves many subscriptions.

Why: a subscriber thread costs a wake-up (a futex hand-off, then a wait for the
interpreter lock) for every batch it reads, and 100 of them woken in turn take about
100 serial hops per update. A subscription read with ``async for`` (or ``await
sub.next_async(timeout)``) instead sleeps as a future of its event loop. The feed wakes
each loop that has sleeping subscriptions once per batch of events (one
``call_soon_threadsafe``: nothing per subscription on the writer's thread), and the loop
resumes all of them itself, in its own thread, each reading the same shared event.

A loop that stops (or closes) without closing its subscriptions holds no one up: the
writer schedules at most one pending resume per loop and forgets a loop that is closed;
its subscriptions stay registered until closed or dropped for lagging (``max_lag``).

The same pieces serve the client's subscriptions over the network (sediment/net/async_reads.py),
where the thread that reads a Flight stream plays the writer's part: :class:`Loops` (a
source's loops and their sleepers), :class:`Seat` (one subscription's place among them) and
:class:`AsyncIterating` (``async for`` over ``next_async``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class LoopWaiters:
    """The subscriptions of one feed asleep in one event loop.

    ``asleep`` is appended to by the loop's thread only; the writer reads it to decide
    whether to schedule :meth:`resume`, and ``scheduled`` keeps that to one pending
    resume at a time. A subscription registers, then looks at the feed again, so an
    event added meanwhile is either seen by that look or followed by a resume."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.asleep: list[asyncio.Future[None]] = []
        self.scheduled = False
        self.users = 0  # subscriptions of the feed reading in this loop

    def sleep(self) -> asyncio.Future[None]:
        """A future the next :meth:`resume` completes (call in the loop's thread). Waits that
        ended by a timeout or a cancellation leave done futures behind until the next resume;
        on a quiet feed they are swept here once they outnumber the subscriptions."""
        if len(self.asleep) > 2 * self.users + 16:
            self.asleep = [f for f in self.asleep if not f.done()]
        fut = self.loop.create_future()
        self.asleep.append(fut)
        return fut

    def poke(self) -> bool:
        """Have the loop resume its sleepers, unless a resume is already pending or none
        sleeps (from any thread). False once the loop is closed: forget it."""
        if self.loop.is_closed():
            return False
        if self.scheduled or not self.asleep:
            return True
        self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self.resume)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def resume(self) -> None:
        """Complete every sleeper's future (run by the loop); a cancelled one is skipped."""
        self.scheduled = False
        woken, self.asleep = self.asleep, []
        for fut in woken:
            if not fut.done():
                fut.set_result(None)


class Loops:
    """The event loops that read the subscriptions of one source (a feed, a client's stream),
    each with its sleepers: the source's thread pokes each once per batch of events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopWaiters] = {}
        self._all: tuple[LoopWaiters, ...] = ()  # replaced whole: the source's thread reads it without the lock

    def seat(self, loop: asyncio.AbstractEventLoop) -> LoopWaiters:
        """The sleepers of ``loop``, for one more subscription read in it."""
        with self._lock:
            waiters = self._by_loop.get(loop)
            if waiters is None:
                waiters = self._by_loop[loop] = LoopWaiters(loop)
                self._all = tuple(self._by_loop.values())
            waiters.users += 1
            return waiters

    def unseat(self, waiters: LoopWaiters) -> None:
        """One subscription fewer read in ``waiters``' loop; its sleepers are woken to look."""
        waiters.poke()
        with self._lock:
            waiters.users -= 1
            if waiters.users <= 0:
                self._drop(waiters)

    def poke(self) -> None:
        """Have every loop with sleepers resume them (the source's thread, after adding an
        event or an error); a closed loop is forgotten."""
        for waiters in self._all:
            if not waiters.poke():
                with self._lock:
                    self._drop(waiters)

    def forget_closed(self) -> None:
        """Let go of loops closed without closing their subscriptions (a poke only finds them
        while someone sleeps in them)."""
        if any(w.loop.is_closed() for w in self._all):
            with self._lock:
                for waiters in [w for w in self._all if w.loop.is_closed()]:
                    self._drop(waiters)

    def _drop(self, waiters: LoopWaiters) -> None:
        if self._by_loop.get(waiters.loop) is waiters:
            del self._by_loop[waiters.loop]
            self._all = tuple(self._by_loop.values())

    def __len__(self) -> int:
        return len(self._all)


class Seat:
    """One subscription's place among a stream's sleepers: taken at its first read from a
    loop (again when read from another loop), given back when it closes."""

    def __init__(self, loops: Loops) -> None:
        self._loops = loops
        self._lock = threading.Lock()  # a close racing the first async read takes or gives back once
        self._waiters: LoopWaiters | None = None
        self._closed = False

    @property
    def current(self) -> LoopWaiters | None:
        """The sleepers of the loop it was last read in, if any."""
        return self._waiters

    def waiters_in(self, loop: asyncio.AbstractEventLoop) -> LoopWaiters:
        """The sleepers of ``loop``, its place among them taken (once per loop)."""
        waiters = self._waiters
        if waiters is not None and waiters.loop is loop:
            return waiters
        with self._lock:
            if self._waiters is not None:
                self._loops.unseat(self._waiters)
                self._waiters = None
            waiters = self._loops.seat(loop)
            if self._closed:  # the caller's next look sees the close
                self._loops.unseat(waiters)
            else:
                self._waiters = waiters
            return waiters

    def poke(self) -> None:
        """Wake its loop's sleepers, if it has a place (from any thread)."""
        waiters = self._waiters
        if waiters is not None:
            waiters.poke()

    def close(self) -> None:
        """Give the place back (from any thread): a task asleep in it wakes to see the close."""
        with self._lock:
            self._closed = True
            if self._waiters is not None:
                self._loops.unseat(self._waiters)
                self._waiters = None


class AsyncIterating:
    """``async for event in sub`` over ``await sub.next_async()``, until it returns None (closed);
    shared by the engine's subscriptions and the client's."""

    async def next_async(self, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterating:
        return self

    async def __anext__(self) -> Any:
        event = await self.next_async()
        if event is None:
            raise StopAsyncIteration
        return event


def expire(fut: asyncio.Future[None]) -> None:
    """End a wait whose timeout passed."""
    if not fut.done():
        fut.set_result(None)


async def doze(fut: asyncio.Future[None], left: float | None) -> None:
    """Await a sleeper's ``fut`` for at most ``left`` seconds (None: no limit); a cancellation
    of the awaiting task cancels ``fut`` (which the next resume skips)."""
    timer = None if left is None else fut.get_loop().call_later(left, expire, fut)
    try:
        await fut
    finally:
        if timer is not None:
            timer.cancel()
