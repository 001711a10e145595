"""An engine whose log is on S3 (``wal="s3://bucket/prefix"``): with ``metadata="s3://..."``
and ``blob="s3://..."`` it keeps nothing but caches in its data directory, and any
coordinator on any machine can take it over from S3 alone.

The rules are those of a replicated engine (engine/takeover.py, engine/data_dir.py): the metadata store and the
blob store must be shared, the data directory's marker names the metadata store, and a
coordinator fenced by a newer one closes its engine, at its next write or within 2 s of its
clock (the log looks for a newer writer's claim, wal/s3_log.py ``watch_takeover``). Opening the log claims it (a new epoch
at the slot after the newest object, wal/s3_log.py), which fences the previous writer.
"""

from __future__ import annotations

from typing import Any

from sediment.engine import takeover
from sediment.engine.data_dir import write_marker
from sediment.errors import MetadataMissing, StorageRecordMismatch
from sediment.wal.s3_log import S3Log


def open_log(engine: Any, wal: str, metadata: object, marker: str | None, s3_endpoint: str | None, *,
             segment_bytes: int, repair: bool, create: bool) -> S3Log:
    """Open (and claim) the engine's log on S3; close the engine when a newer coordinator fences it."""
    if metadata is None:
        raise StorageRecordMismatch(f"{engine.data_dir}: wal={wal!r} needs a metadata store every coordinator can "
                                    "reach, e.g. metadata='s3://bucket/meta'; nothing was created")
    log = S3Log.open(wal, s3_endpoint=s3_endpoint, create=create, segment_bytes=segment_bytes, repair=repair)
    if create and log.end_lsn > 0:
        log.close()
        raise MetadataMissing(f"{engine.data_dir}: the metadata has no storage record, but the log {wal} holds LSNs "
                              f"up to {log.end_lsn - 1}: the metadata was lost or points elsewhere; restore it or "
                              "pass the right metadata= (opening would lose every acknowledged update)")
    takeover.close_when_fenced(engine, log.on_fenced)
    log.watch_takeover(engine.clock)
    if marker is None:
        write_marker(engine.data_dir, takeover.metadata_spec(metadata))
    return log
