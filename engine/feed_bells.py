"""A thread that sleeps on several feeds at once, woken by their writers directly.

Why: a server's shared feed stream is one thread serving many subscriptions of one client;
it sleeps until any of them has an event, or a subscription joins, or the poll interval
passes. Sleeping in an event loop for that (each feed completing a future of the loop)
cost the stream's thread about 80 us of CPU per event, most of it the loop's own turns
(docs/benchmarks.md, "Feed latency", session 26): once per event and stream, beside the writer, on the
interpreter the writer needs too. A :class:`Bell` is a lock the sleeping thread waits
on; each feed it hangs on releases it (one futex wake) when it adds events, as does a join
or a close. Spurious rings are allowed: the sleeper looks and sleeps again.
"""

from __future__ import annotations

import threading


class Bell:
    """One sleeping thread's wake-up. :meth:`arm` before it hangs on the feeds and looks at
    them again (an event added meanwhile is seen by that look or rings the bell), then
    :meth:`wait`. :meth:`ring` from any thread."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def arm(self) -> None:
        """Forget a ring that came before (a late one of an earlier wait)."""
        self._lock.acquire(blocking=False)

    def ring(self) -> None:
        """Wake the sleeper (or its next wait, if it is not asleep yet)."""
        try:
            self._lock.release()
        except RuntimeError:  # rung already
            pass

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or ``timeout`` seconds pass; whether it was rung."""
        return self._lock.acquire(timeout=timeout)


class Bells:
    """The bells hung on one feed: its writer rings each once, at the next batch of events
    (or a close or drop), then lets them go; a sleeper hangs its bell again before each wait.
    A bell is hung at most once (a quiet feed does not pile up the waits of a sleeper that
    other feeds woke)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hung: dict[Bell, None] = {}

    def hang(self, bell: Bell) -> None:
        """Ring ``bell`` at this feed's next events."""
        with self._lock:
            self._hung[bell] = None

    def __bool__(self) -> bool:
        return bool(self._hung)

    def ring(self) -> None:
        """Ring every bell hung here and let them go (the feed's writer, after adding events)."""
        with self._lock:
            hung, self._hung = self._hung, {}
        for bell in hung:
            bell.ring()
