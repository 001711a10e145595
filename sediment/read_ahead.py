"""Work on the next few pieces of a read while the current one is used, results in order.

Why: a replay is a chain of Arrow kernels (a row group's Parquet decode, its sort by
time, a window's gather) that each release the interpreter lock, but one thread runs
them one after another and leaves the machine's other cores idle, while the peer every
reader is measured against (``pq.read_table``) decodes row groups on all of them. Here
the next pieces are worked on by a small pool shared by every read of the process, at
most ``ahead`` at once per read, and a read of wide rows takes fewer (:func:`pieces_in_flight`),
so memory stays bounded by :data:`AHEAD_BYTES` beyond the piece being used.

``fn`` must not wait on the pool itself (no nesting): every task is a leaf, so reads
sharing the pool can slow each other but never block each other. Closing the iterator
early (the consumer stopped, an error) cancels the pieces not yet started and waits for
the running ones, so no task touches a file after its reader has closed it.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None  # made at first use; dropped in a forked child


AHEAD_BYTES = 64 << 20  # decoded data one read may have in flight beyond the piece it is on


def pieces_in_flight(piece_bytes: int, most: int | None = None) -> int:
    """How many pieces of about ``piece_bytes`` each a read works on ahead: ``most``
    (default: twice the pool's workers), fewer when they would pass :data:`AHEAD_BYTES`, 0
    (one piece at a time, in the caller's thread) when one piece alone would."""
    most = 2 * pool_workers() if most is None else most
    return max(0, min(most, AHEAD_BYTES // max(1, piece_bytes)))


def pool_workers() -> int:
    """How many pieces run at once in the whole process: the cores, at most 4 (a decode
    past that is bound by memory bandwidth here, not by cores)."""
    return max(1, min(4, os.cpu_count() or 1))


def _shared_pool() -> ThreadPoolExecutor:
    """The process's pool, made at first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(pool_workers(), thread_name_prefix="sediment-read")
        return _pool


def _after_fork_in_child() -> None:
    """Threads do not fork: a child gets a pool of its own. The lock too, since a child
    forked while another thread held it would wait on it forever."""
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


os.register_at_fork(after_in_child=_after_fork_in_child)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, ahead: int | None = None) -> Iterator[R]:
    """``fn`` of each of ``items``, in ``items``' order, with up to ``ahead`` (default: twice
    the pool's workers) submitted before the caller takes the first result. ``items`` is
    iterated in the caller's thread. With one core, or ``ahead=0``, it is plain ``map``."""
    ahead = 2 * pool_workers() if ahead is None else ahead
    if ahead <= 0 or pool_workers() == 1:
        yield from map(fn, items)
        return
    pool = _shared_pool()
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        wait(pending)
