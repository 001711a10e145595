"""Fencing a replaced coordinator in the metadata, where data becomes visible or is deleted.

Claiming the log fences an old coordinator's log writes only. Its trace commits and
catalog writes are compare-and-sets in the metadata store, which the claim never
touches; left alone, a commit the old coordinator makes after the new one loaded the
traces (and swept the batches no state named) would point at deleted objects.

So a coordinator taking over rewrites, after its claim and before its sweep, every
catalog entry and every relation's trace state once by compare-and-set, with the value
it holds (:func:`rewrite_all`; a relation with no trace state yet gets an empty one, unless
its catalog entry says the state was written at its add: then it was lost, and the open
refuses, trace/store.py ``load_many``).
From then on every compare-and-set the old coordinator makes from a version it read
earlier fails, and a commit that won the race against the rewrite is in the value the
new coordinator loads. The old coordinator's store turns that failure into
CoordinatorSuperseded through its :class:`Fence`, which also tells the engine to close.

A key the old coordinator creates (a new relation's catalog entry) has no earlier
version to fail on; the catalog confirms each creation by a compare-and-set of the
``engine/epoch`` key, which every open bumps after its claim (engine/catalog.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from sediment.errors import CoordinatorSuperseded, MetadataConflict, MetadataUnavailable
from sediment.metadata.protocol import MetadataStore, Versioned

REWRITE_ROUNDS = 64  # conflicts in a row on one key before a rewrite gives up
REWRITE_THREADS = 16  # keys rewritten at once: each is a round trip or more to ZooKeeper or S3


class Fence:
    """What a coordinator's metadata writers do when a write shows that another coordinator
    took over: one CoordinatorSuperseded, and the listeners (the engine's close) told once."""

    def __init__(self, *, shared: bool = True) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Callable[[BaseException], None]] = []
        self.replaced: CoordinatorSuperseded | None = None
        self.shared = shared  # False: a local engine, which no other coordinator can replace

    def on_replaced(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback`` with the error once a write finds this coordinator replaced."""
        with self._lock:
            self._listeners.append(callback)

    def refuse(self, what: str) -> CoordinatorSuperseded | MetadataConflict:
        """The error for a refused write of ``what`` (to raise); the listeners hear of the first.
        Not shared: a plain MetadataConflict, nothing fenced (a local engine's key can only
        change under a write of its own, e.g. a drop racing a merge; the engine goes on)."""
        if not self.shared:
            return MetadataConflict(f"{what} was refused: the metadata key changed under this engine's own write "
                                    "(no other coordinator can exist here); nothing was committed: reopen the engine "
                                    "to load the metadata again")
        err = CoordinatorSuperseded(
            f"{what} was refused: another coordinator took over this engine's metadata (it rewrote the key when "
            "it opened), so this coordinator was replaced and writes nothing more: stop it, the new coordinator "
            "serves the data")
        with self._lock:
            first = self.replaced is None
            if first:
                self.replaced = err
            listeners = list(self._listeners) if first else []
        for callback in listeners:
            callback(err)
        return err


def rewrite(store: MetadataStore, key: str, absent: bytes | None = None) -> Versioned | None:
    """Write ``key``'s value again by compare-and-set (``absent``: create the key with it
    when missing), re-reading after each conflict; the value and version written, or None
    for a missing key without ``absent``. Any write made from an earlier version fails after."""
    for _ in range(REWRITE_ROUNDS):
        got = store.get(key)
        if got is None and absent is None:
            return None
        value = got.value if got is not None else absent
        try:
            return Versioned(value, store.compare_and_set(key, value, got.version if got is not None else None))
        except MetadataConflict:
            continue
    raise MetadataUnavailable(f"metadata key {key!r} changed under {REWRITE_ROUNDS} rewrites in a row while taking "
                              "over the engine: another coordinator is still writing it; stop it and open again")


def rewrite_all(store: MetadataStore, keys: Sequence[str], absent: Callable[[str], bytes | None] | None = None,
                *, threads: int = REWRITE_THREADS) -> list[Versioned | None]:
    """:func:`rewrite` of each key (``absent(key)``: what to create a missing one with), a
    few at once; the results in the order of ``keys``."""
    def one(key: str) -> Versioned | None:
        return rewrite(store, key, absent(key) if absent is not None else None)

    if len(keys) <= 1:
        return [one(k) for k in keys]
    with ThreadPoolExecutor(max_workers=min(threads, len(keys)), thread_name_prefix="fence") as pool:
        return list(pool.map(one, keys))
