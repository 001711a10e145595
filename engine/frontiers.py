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
from collections.abc import Iterable, Sequence

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
    """The greatest ``close t`` of every relation id in the log (dropped relations too:
    the log's records are kept as they are). Implements wal.protocol.SegmentPreamble;
    thread-safe (a log's writer threads call it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sealed: dict[int, int] = {}

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

    def record(self, pending: Sequence[Record] = ()) -> Record:
        """The FRONTIERS record: every frontier observed, raised by ``pending`` (records
        placed before it but not observed yet), without observing them."""
        with self._lock:
            sealed = dict(self._sealed)
        fold(sealed, pending)
        return Record(RecordKind.FRONTIERS, count=len(sealed), body=encode_frontiers(sealed))

    def frontiers(self) -> dict[int, int]:
        with self._lock:
            return dict(self._sealed)
