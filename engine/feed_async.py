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
"""

from __future__ import annotations

import asyncio


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


def expire(fut: asyncio.Future[None]) -> None:
    """End a wait whose timeout passed."""
    if not fut.done():
        fut.set_result(None)
