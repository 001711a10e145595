"""Each relation's sealed frontier as the log holds it, and the FRONTIERS record that
carries them across trimmed segments.

The log knows only frames; what PROGRESS and FRONTIERS records mean is the engine's.
The log calls :meth:`SealedFrontiers.observe` with every record it writes, in log
order, and asks :meth:`SealedFrontiers.record` for the FRONTIERS record it puts at each
segment boundary, so a trim that drops old segments never drops a relation's frontier.
An open rebuilds the book from the records it replays (the first kept record of a
trimmed log is a FRONTIERS record) before handing it to the log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from sediment.wal.record import Record, RecordKind, decode_frontiers, encode_frontiers

_PROGRESS = RecordKind.PROGRESS
_FRONTIERS = RecordKind.FRONTIERS
_SEALING = frozenset((_PROGRESS, _FRONTIERS))


def fold(sealed: dict[int, int], records: Iterable[Record]) -> None:
    """Raise ``sealed`` to every ``close t`` the PROGRESS and FRONTIERS records carry."""
    for r in records:
        kind = r.kind
        if kind == _PROGRESS:
            if r.t_hi > sealed.get(r.relation_id, -1):
                sealed[r.relation_id] = r.t_hi
        elif kind == _FRONTIERS:
            for rel, t in decode_frontiers(bytes(r.body)).items():
                if t > sealed.get(rel, -1):
                    sealed[rel] = t


class SealedFrontiers:
    """The greatest ``close t`` of every live relation id in the log. Implements
    wal.protocol.SegmentPreamble; thread-safe (a log's writer threads call it).

    ``live(relation_id)`` says whether the engine still has the relation: a dropped one's
    frontier is forgotten (:meth:`forget` at the drop; :meth:`record` leaves out, and
    forgets, any other, such as one a replay found in the log or a seal in flight at the
    drop), so neither the book nor the FRONTIERS record at every segment boundary grows with
    every relation ever dropped. Ids are never reused, and replay ignores records of ids the
    catalog does not hold, so nothing reads a dropped relation's frontier."""

    def __init__(self, live: Callable[[int], bool] | None = None) -> None:
        self._lock = threading.Lock()
        self._sealed: dict[int, int] = {}
        self._live = live

    def observe(self, records: Sequence[Record]) -> None:
        if len(records) == 1 and records[0].kind not in _SEALING:  # a lone append: nothing to fold
            return
        with self._lock:
            fold(self._sealed, records)

    def raise_to(self, frontiers: dict[int, int]) -> None:
        """Raise each relation's frontier to at least the one given (an open's replay hands
        over the greatest ``close t`` per relation of many PROGRESS records at once)."""
        with self._lock:
            sealed = self._sealed
            for rel, t in frontiers.items():
                if t > sealed.get(rel, -1):
                    sealed[rel] = t

    def forget(self, relation_id: int) -> None:
        """A dropped relation's frontier is no longer carried."""
        with self._lock:
            self._sealed.pop(relation_id, None)

    def forget_dropped(self) -> None:
        """Forget the frontiers of relations ``live`` says are gone."""
        if self._live is None:
            return
        with self._lock:
            for rel in [r for r in self._sealed if not self._live(r)]:
                del self._sealed[rel]

    def record(self, pending: Sequence[Record] = ()) -> Record:
        """The FRONTIERS record: every live relation's frontier observed, raised by ``pending``
        (records placed before it but not observed yet), without observing them."""
        self.forget_dropped()
        with self._lock:
            sealed = dict(self._sealed)
        fold(sealed, pending)
        if self._live is not None:
            sealed = {rel: t for rel, t in sealed.items() if self._live(rel)}
        return Record(RecordKind.FRONTIERS, count=len(sealed), body=encode_frontiers(sealed))

    def frontiers(self) -> dict[int, int]:
        with self._lock:
            return dict(self._sealed)
