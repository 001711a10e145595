"""A replicated engine as a real deployment: what any coordinator needs to take over.

Three rules, all checked before anything is created:

* Batches must live where every coordinator can reach them: ``blob="s3://..."``, or a
  ``file://`` path given explicitly (a shared mount). The default ``<data-dir>/blobs``
  is refused, since a coordinator replacing this one on another machine (or another
  data directory) would find the trace's batches missing.
* The storage record (log kind, replicas, cluster key, blob URI) lives in the metadata
  store (the engine's ``engine/storage`` key), so ``metadata=`` alone opens the engine.
* The data directory says it belongs to a replicated engine: a small durable marker
  file, ``REPLICATED``, names the metadata store. Opening the directory without
  ``metadata=`` opens that store (so later opens and CLI commands need not repeat it),
  never an empty local engine; a marker naming a store object given in Python
  (``<ClassName>``) cannot be reopened from its name and is refused (StorageRecordMismatch).
  The marker is engine/data_dir.py's; format in docs/formats.md ("Replicated data directory marker").

A coordinator fenced by a newer one closes its engine (:func:`close_when_fenced`); the
reason is kept in ``engine.superseded`` and ``sediment serve`` exits non-zero with it.

An engine whose log is on S3 (``wal="s3://bucket/prefix"``, :func:`open_s3_log`) follows
the same rules: with ``metadata="s3://..."`` and ``blob="s3://..."`` it keeps nothing but
caches in its data directory, so any coordinator can take it over from S3 alone. Opening
the log claims it (a new epoch past the newest object, ahead of a writer still appending:
wal/s3_claim.py), which fences the previous writer; that one closes at its next write or within 2 s of its clock
(wal/s3_log.py ``watch_takeover``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sediment.engine.data_dir import write_marker
from sediment.errors import CoordinatorSuperseded, MetadataMissing, StorageRecordMismatch

if TYPE_CHECKING:
    from sediment.wal.s3_log import S3Log

log = logging.getLogger(__name__)


def metadata_spec(metadata: object) -> str:
    """How to name the metadata store in the marker."""
    if isinstance(metadata, str):
        return metadata
    hosts, root = getattr(metadata, "hosts", None), getattr(metadata, "root", None)
    if hosts and root:
        return f"zk://{hosts}{root}"
    return f"<{type(metadata).__name__}>"


def owner_name(data_dir: str) -> str:
    """How this coordinator is named in the partition metadata: what the one it replaces
    reports as the new owner (host, process id, data directory)."""
    return f"{socket.gethostname()} pid {os.getpid()} {data_dir}"


def require_shared_blob(blob: object, data_dir: str, what: str = "a replicated engine") -> None:
    """Replicated mode (or the log on S3, ``what`` saying which): the batches must be reachable
    by every coordinator, so the blob store must be named (given now, or recorded when the
    engine was created)."""
    if isinstance(blob, str) and (blob.startswith("s3://") or blob.startswith("file://")):
        return
    if blob is not None and not isinstance(blob, str):
        return  # a store object: the caller built it, and vouches for where it lives
    raise StorageRecordMismatch(
        f"{data_dir}: {what} needs a blob store every coordinator can reach, not "
        f"{blob or 'the local default ' + os.path.join(data_dir, 'blobs')!r}: pass blob='s3://bucket/prefix' "
        "(with s3_endpoint= if not AWS) or blob='file:///shared/mount/path' on storage all coordinators share")


def close_when_fenced(engine: Any, on_fenced: Callable[[Callable[[BaseException], None]], None]) -> None:
    """When the log is fenced by a newer coordinator, close the engine (in a thread of its own,
    as the log's thread must not wait for itself) and tell ``engine.superseded_listeners``.
    While the engine is still opening nothing is closed from here (its parts are half made,
    and the open releases them itself): the open sees ``engine.superseded`` and fails with it,
    before it writes a storage record if the fence came by then (:func:`opened`)."""

    def fenced(err: BaseException) -> None:
        with engine.fence_lock:
            engine.superseded = CoordinatorSuperseded(
                f"the coordinator on {engine.data_dir} was superseded ({err}); its engine was closed: stop this "
                "process, the new coordinator serves the data")
            opening = engine.opening
        (log.info if engine.takeover_expected else log.error)("%s", engine.superseded)
        if opening:
            return

        def close_and_tell() -> None:
            try:
                engine.close()
            finally:
                for callback in list(engine.superseded_listeners):
                    callback(engine.superseded)

        threading.Thread(target=close_and_tell, name="close-superseded", daemon=True).start()

    on_fenced(fenced)


def refuse_if_superseded(engine: Any) -> None:
    """Raise the fence that came during the open so far (a creating open checks before it
    writes its storage record: a coordinator fenced by then must not record the deployment)."""
    with engine.fence_lock:
        superseded = engine.superseded
    if superseded is not None:
        raise superseded


def opened(engine: Any) -> None:
    """The open is done: from now on a fence closes the engine from the log's side. A fence
    that came during the open is raised instead (the open then releases what it holds)."""
    with engine.fence_lock:
        engine.opening = False
        superseded = engine.superseded
    if superseded is not None:
        raise superseded


def _refuse_a_log_with_records(engine: Any, wal: str, end_lsn: int) -> None:
    if end_lsn > 0:
        raise MetadataMissing(f"{engine.data_dir}: the metadata has no storage record, but the log {wal} holds LSNs "
                              f"up to {end_lsn - 1}: the metadata was lost or points elsewhere; restore it or "
                              "pass the right metadata= (opening would lose every acknowledged update)")


def open_s3_log(engine: Any, wal: str, metadata: object, marker: str | None, s3_endpoint: str | None, *,
                segment_bytes: int, repair: bool, create: bool) -> S3Log:
    """Open (and claim) the engine's log on S3; close the engine when a newer coordinator fences it."""
    from sediment.wal.s3_log import S3Log, peek_end

    if metadata is None:
        raise StorageRecordMismatch(f"{engine.data_dir}: wal={wal!r} needs a metadata store every coordinator can "
                                    "reach, e.g. metadata='s3://bucket/meta'; nothing was created")
    if create:  # read-only first: a refused open must not claim (and so fence) the log
        _refuse_a_log_with_records(engine, wal, peek_end(wal, s3_endpoint))
    log_ = S3Log.open(wal, s3_endpoint=s3_endpoint, create=create, segment_bytes=segment_bytes, repair=repair)
    if create and log_.end_lsn > 0:  # records written between the look and the claim
        log_.close()
        _refuse_a_log_with_records(engine, wal, log_.end_lsn)
    close_when_fenced(engine, log_.on_fenced)
    log_.watch_takeover(engine.clock)
    if marker is None:
        write_marker(engine.data_dir, metadata_spec(metadata))
    return log_
