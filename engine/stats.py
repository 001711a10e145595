"""What an engine holds, as one plain dictionary: ``Engine.stats()``, ``sediment stats`` and the
state gauges of ``/metrics`` all read it, so the three can never disagree.

Read under the engine lock, from the in-memory view only: no I/O but listing the WAL
directory, so a scrape every few seconds costs next to nothing.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from sediment.engine.view import RelationView


def _relation_stats(rel: Any, now: float) -> dict[str, Any]:
    t = rel.trace
    refs = (*t.batches, *t.pending)
    with rel.feed.changed:
        cursors = list(rel.feed.cursors.values())
        lag = rel.feed.next_seq - min(cursors) if cursors else 0
    return {
        "rows": sum(b.rows for b in refs),
        "batches": len(t.batches),
        "pending": len(t.pending),
        "stored_bytes": sum(b.bytes for b in refs),
        "since": rel.entry.since,
        "sealed": rel.sealed_durable,
        "trace_upper": t.upper,
        "tail_records": len(rel.tail),
        "tail_bytes": sum(e.bytes for e in rel.tail),
        "compaction_lag": max(0, rel.sealed_durable + 1 - t.upper),
        "seconds_since_last_batch": None if rel.trace_changed_at is None else round(now - rel.trace_changed_at, 3),
        "subscribers": len(cursors),
        "subscriber_lag": lag,
    }


def _wal_files(log: Any) -> tuple[int | None, int | None, int | None]:
    """(segments, bytes on disk, trimmed files kept for reuse) of a log kept in a directory
    of segment files; None otherwise. The bytes count the kept files too: they hold disk."""
    directory = getattr(log, "dir", None)
    if not isinstance(directory, str) or not os.path.isdir(directory):
        return None, None, None
    segments = size = kept = 0
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.endswith((".seg", ".idx", ".recycled")):
                segments += entry.name.endswith(".seg")
                kept += entry.name.endswith(".recycled")
                with contextlib.suppress(FileNotFoundError):  # trimmed meanwhile
                    size += entry.stat().st_blocks * 512  # allocated, not apparent: segments are preallocated
    return segments, size, kept


def engine_stats(view: RelationView, log: Any, now: float, *, compaction: dict[str, Any],
                 storage: dict[str, Any]) -> dict[str, Any]:
    """See :meth:`Engine.stats`: the view and the log as they are now (``now`` on the engine's
    clock), with the engine's compaction settings and storage locations as given."""
    with view.lock:
        view.check_open()
        relations = {name: _relation_stats(rel, now) for name, rel in sorted(view.relations.items())}
        txn_entries = view.txns.entries()
        open_txns = len(view.txns)
        start, end, finished = log.start_lsn, log.end_lsn, log.finished_lsn
        backlog = (view.backlog.bytes, view.backlog.bound, view.backlog.waiting)
    segments, size, kept = _wal_files(log)
    kind = {"FileLog": "file", "DeviceLog": "device", "ReplicatedLog": "replicated",
            "S3Log": "s3"}.get(type(log).__name__, type(log).__name__)
    return {
        "wal": {
            "kind": kind,
            "start_lsn": start,
            "end_lsn": end,
            "finished_lsn": finished,
            "segments": segments,
            "bytes": size,
            "recycled_files": kept,
            "backlog_records": sum(r["tail_records"] for r in relations.values()) + len(txn_entries),
            "backlog_bytes": backlog[0],
            "backlog_bound_bytes": backlog[1],
            "backlog_waiting_appends": backlog[2],
            "open_transactions": open_txns,
        },
        "compaction": compaction,
        "storage": storage,
        "relations": relations,
        "replicas": log.replica_lag() if hasattr(log, "replica_lag") else None,
    }
